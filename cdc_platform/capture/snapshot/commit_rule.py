"""The deferred chunk commit rule (ARCHITECTURE section 4), as pure functions over GTID sets.

The seed algorithm (DBLog, read-only variant) reads a chunk between a low and a high watermark
while the stream is paused, then removes from the chunk every key an event inside the window
touched and emits the rest when the window closes. Here chunks are read elsewhere and arrive at
any time, so the window is not a span of the stream but a condition checked at the engine's
current point Q:

* ``Wait`` until ``processed ⊇ after``: an event the chunk already reflects must not be
  processed after the chunk, or its older image would overwrite the chunk's row.
* ``Reject`` a chunk that cannot be made exact: its ``low_watermark`` misses transactions the
  touched-key log does not cover (those before the session opened or pruned from the log,
  see ``TouchedKeyLog``),
  DDL on the table outside the low watermark was processed (the chunk predates it: a TRUNCATE
  has no row events, a column change alters every row), or its columns differ from the binlog
  schema at Q. The reader re-selects it.
* ``Commit``: every chunk row whose key no processed transaction outside ``low_watermark``
  touched has, at Q, the value the chunk read; a touched key's newest state is already in the
  stream. So emit the untouched rows, drop the touched ones, and assert that untouched keys of
  the range missing from the chunk do not exist.

Both flavours use only ``contains_gtid`` and ``issuperset``: MySQL sets are exact sets (any
number of server UUIDs and tags, gaps allowed); MariaDB positions are per-domain high-water
marks, exact under gtid_strict_mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cdc_platform.capture.gtid import Gtid, GtidSet
from cdc_platform.capture.keys import Key
from cdc_platform.capture.snapshot.chunks import Chunk

# One transaction's touches of one table beyond this many are logged as one table-wide touch
# (``ALL_KEYS``): a 5M-row UPDATE of a table under snapshot keeps one entry, not 5M.
TABLE_WIDE_TOUCHES = 100_000
# The key a table-wide touch is logged under (no real key is empty): every key was touched.
ALL_KEYS: Key = ()


@dataclass(frozen=True, slots=True)
class Touch:
    """A processed transaction wrote key K of the table: its GTID and the changelog position
    of the record it wrote for K."""

    gtid: Gtid
    position: int


class TouchedKeyLog:
    """The touched-key log of one snapshot session, pruned in generations so that its size
    stays bounded for as long as the session lasts, without changing any decision.

    Why pruning is exact: ``decide_chunk_commit`` rejects a chunk whose low watermark does not
    contain ``horizon``; for every other chunk a transaction of the horizon is inside the low
    watermark, and touches inside the low watermark decide nothing (neither dropped keys nor
    the assertion's threshold). So touches of transactions in the horizon can go, once the
    horizon holds only transactions the engine has processed (their touches are all logged).

    Why generations: moving the horizon to the engine's current position would reject every
    chunk read before that instant, pending ones included. Instead, each pruning point
    remembers the processed position (``mark``) and moves the horizon to the mark of the
    *previous* pruning point: only chunks read before that older point are rejected (and read
    again), and a chunk survives at least one whole generation. The log then holds about the
    touches of the last generation: bounded by how often the caller prunes.

    Why table-wide touches: a transaction that writes more than ``table_wide_after`` keys
    of the table is logged once under ``ALL_KEYS`` (at its first position) instead of per key,
    so the log's size does not grow with a transaction's. ``decide_chunk_commit`` rejects a
    chunk whose low watermark lacks such a transaction (the chunk is read again after it);
    the keys it logged before passing the bound stay, and decide nothing more.
    """

    __slots__ = ("horizon", "mark", "touches", "size", "generation_started",
                 "table_wide_after", "_gtid", "_count", "_first")

    def __init__(self, horizon: GtidSet, now: float = 0.0,
                 table_wide_after: int = TABLE_WIDE_TOUCHES) -> None:
        self.horizon = horizon
        self.mark = horizon  # processed at the last pruning point (the opening at first)
        self.touches: dict[Key, list[Touch]] = {}
        self.size = 0  # touches held
        self.generation_started = now
        self.table_wide_after = table_wide_after
        self._gtid: Gtid | None = None  # the transaction being recorded, and its touches
        self._count = 0
        self._first = 0

    def record(self, key: Key, gtid: Gtid, position: int) -> None:
        """A processed transaction wrote ``key`` (the engine's hot path)."""
        if gtid is not self._gtid and gtid != self._gtid:
            self._gtid, self._count, self._first = gtid, 0, position
        self._count += 1
        if self._count > self.table_wide_after:
            if self._count == self.table_wide_after + 1:
                self._add(ALL_KEYS, gtid, self._first)
            return
        self._add(key, gtid, position)

    def _add(self, key: Key, gtid: Gtid, position: int) -> None:
        touches = self.touches.get(key)
        if touches is None:
            self.touches[key] = [Touch(gtid, position)]
        else:
            touches.append(Touch(gtid, position))
        self.size += 1

    def prune(self, processed: GtidSet, now: float = 0.0) -> int:
        """Start a new generation at ``processed`` (every transaction in it is processed and
        logged): the horizon moves to the previous generation's mark and the touches of its
        transactions go. Returns how many touches were dropped."""
        # The mark contains the horizon, so the horizon only grows: the first mark is the
        # horizon itself, and each later one is a processed position, which contains every
        # earlier one (``processed`` only grows).
        horizon = self.mark
        self.horizon, self.mark, self.generation_started = horizon, processed, now
        if not self.size:
            return 0
        kept: dict[Key, list[Touch]] = {}
        size = 0
        for key, touches in self.touches.items():
            left = [t for t in touches if not horizon.contains_gtid(t.gtid)]
            if left:
                kept[key] = left
                size += len(left)
        dropped, self.touches, self.size = self.size - size, kept, size
        return dropped


@dataclass(frozen=True)
class Wait:
    """Not yet: ``processed`` lacks part of the chunk's ``after``. Try again after more events
    (or a heartbeat proving the engine is caught up)."""

    reason: str


@dataclass(frozen=True)
class Reject:
    """The chunk can never be committed exactly; discard it and re-select the same range."""

    reason: str


@dataclass(frozen=True)
class RangeAssertion:
    """Keys of ``(range_low, range_high]`` that the chunk lacks and nothing touched since its
    low watermark do not exist.

    The lake applies it without GTIDs: delete every target key in the range whose latest record
    position is below :meth:`threshold` (``keep_from_pos``, or the commit's first position when
    nothing outside the low watermark touched the table). Why that is exact, for a target key K
    in the range that is not a row of this commit:

    * K is absent from the chunk, so it did not exist at the chunk's read view.
    * If a processed transaction outside the low watermark touched K, it wrote a record for K at
      or after ``keep_from_pos`` (the smallest such position of the table): K is kept, and its
      latest record, a full after-image or a tombstone written since, is its state at Q.
    * Otherwise K does not exist at Q either (every transaction of the low watermark is
      processed, none outside it touched K). Its latest record is either below the threshold and
      K is deleted, or at or after it and then written by a low-watermark transaction: the last
      of those left K absent, so that record is already a tombstone.

    Chunk rows of this commit sit at or after the commit position and are kept. Since only
    "latest position below threshold" matters, the lake may fold records by position first and
    apply assertions afterwards, in any order.

    Keys compare lexicographically, NULL first, as in the source's ORDER BY; range assertions
    are only made for keys whose landed type sorts that way (``capture.keys.range_ordered``).
    """

    table_id: str
    range_low: Key | None  # exclusive; None: from the first key
    range_high: Key | None  # inclusive; None: to the last key
    keep_from_pos: int | None

    def threshold(self, commit_position: int) -> int:
        """Delete keys in the range whose latest record position is below this."""
        return commit_position if self.keep_from_pos is None else self.keep_from_pos


@dataclass(frozen=True)
class Commit:
    """Emit ``rows_to_emit`` (then ``assertion``, if any) at the engine's current point."""

    rows_to_emit: tuple[tuple, ...]
    dropped_keys: frozenset[Key]
    assertion: RangeAssertion | None


Decision = Wait | Reject | Commit


@dataclass(frozen=True)
class SnapshotSweep:
    """At the end of an unfiltered snapshot: target keys whose latest record position is below
    ``before_pos`` (the changelog position when the session opened) do not exist.

    Why: the chunks tiled the key space up to the maximum key read after the session opened.
    An existing key untouched since the opening was read by its chunk (whose low watermark
    contains the opening) and emitted at a later position; a touched one has a stream record
    since the opening; a key above the maximum was inserted after the opening. So every key
    that exists has a record at or after ``before_pos``. Unlike range assertions this needs no
    key comparison, so it also covers keys whose landing form sorts differently from the source.
    """

    table_id: str
    before_pos: int


def decide_chunk_commit(
    chunk: Chunk,
    processed: GtidSet,
    session_opening: GtidSet,
    log_horizon: GtidSet,
    touched: Mapping[Key, Sequence[Touch]],
    binlog_schema_fingerprint: str,
    table_ddl: Iterable[Gtid] = (),
) -> Decision:
    """Decide what to do with a pending chunk at the engine's current point Q.

    ``processed``: every transaction the engine has fully processed. ``session_opening``: the
    processed set when the table's snapshot session opened (the touched-key log starts there).
    ``log_horizon``: transactions whose log entries were pruned (empty if none were).
    ``touched``: for each key of the chunk's table, the processed transactions since the
    opening that wrote it. ``binlog_schema_fingerprint``: the table's binlog schema at Q
    (``chunks.schema_fingerprint``). ``table_ddl``: GTIDs of DDL on the table processed since
    the opening.

    Wait and Reject never look at ``chunk.rows``: the engine decides them from the chunk's
    manifest and reads the rows only for a chunk that commits.
    """
    lw = chunk.low_watermark
    where = f"chunk ({_show(chunk.range_low)}, {_show(chunk.range_high)}] of {chunk.table_id}"
    if not lw.issuperset(session_opening):
        return Reject(f"{where}: low watermark {lw} does not contain the session's opening "
                      f"position {session_opening}; re-select it")
    if not lw.issuperset(log_horizon):
        return Reject(f"{where}: low watermark {lw} does not contain the touched-key log's "
                      f"pruning horizon {log_horizon}; re-select it")
    late_ddl = [g for g in table_ddl if not lw.contains_gtid(g)]
    if late_ddl:
        return Reject(f"{where}: DDL at GTID {late_ddl[0]} changed the table after the chunk's "
                      "read view; re-select it")
    # A table-wide touch outside lw: any row may be stale, and dropping them all would leave
    # keys it did not write unemitted (and the range assertion would delete them).
    wide = [t.gtid for t in touched.get(ALL_KEYS, ()) if not lw.contains_gtid(t.gtid)]
    if wide:
        return Reject(f"{where}: transaction {wide[0]} wrote too many keys of the table to log "
                      "each (a table-wide touch) after the chunk's read view; re-select it")
    if not processed.issuperset(chunk.after):
        return Wait(f"{where}: processed {processed} does not yet contain {chunk.after}")
    if chunk.schema_fingerprint != binlog_schema_fingerprint:
        return Reject(f"{where}: read with columns {chunk.schema_fingerprint}, but the binlog "
                      f"schema is {binlog_schema_fingerprint}; re-read the schema and re-select")
    touched_outside = set()
    keep_from_pos: int | None = None
    for key, touches in touched.items():
        for touch in touches:
            if not lw.contains_gtid(touch.gtid):
                touched_outside.add(key)
                if keep_from_pos is None or touch.position < keep_from_pos:
                    keep_from_pos = touch.position
    rows: list[tuple] = []
    dropped: set[Key] = set()
    if touched_outside:
        indexes = chunk.table.key_indexes
        for row in chunk.rows:
            key = tuple(row[i] for i in indexes)
            if key in touched_outside:
                dropped.add(key)
            else:
                rows.append(tuple(row))
    else:
        rows = [tuple(row) for row in chunk.rows]
    assertion = None
    if chunk.table.range_assertions_allowed:
        assertion = RangeAssertion(chunk.table_id, chunk.range_low, chunk.range_high,
                                   keep_from_pos)
    return Commit(tuple(rows), frozenset(dropped), assertion)


def sweep_after_snapshot(chunk_table_id: str, opening_changelog_pos: int,
                         filtered: bool) -> SnapshotSweep | None:
    """The end-of-snapshot sweep of an unfiltered snapshot whose chunks all committed."""
    if filtered:
        return None  # a filtered snapshot says nothing about rows it did not select
    return SnapshotSweep(chunk_table_id, opening_changelog_pos)


def _show(key: Key | None) -> str:
    if key is None:
        return "…"
    return ", ".join(repr(v) for v in key)
