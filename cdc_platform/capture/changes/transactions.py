"""Binlog event groups -> committed transactions: the transaction buffer (pure, no I/O).

A binlog holds event groups, each opened by a GTID event. What a group's rows become depends
on how it ends, and only the buffer decides that:

* ``COMMIT`` / XID: committed; emitted under the group's GTID.
* ``ROLLBACK``: never happened (a non-transactional table's rows may be logged and rolled
  back); ``ROLLBACK TO SAVEPOINT s`` drops the rows after ``SAVEPOINT s``.
* a statement outside BEGIN (DDL ...): completes the group when the group is a single
  statement: MariaDB flags such GTIDs FL_STANDALONE; MySQL does not say, but a group that goes
  on after its first statement (CREATE TABLE ... SELECT) ends that statement with
  ``START TRANSACTION``. Otherwise the rows that follow (CTAS) belong to the group and it ends
  at its XID; completing it early would let a stop mid-group lose them.
* XA PREPARE (the XA prepare event): the group's GTID is complete, but its rows become visible
  only at a later ``XA COMMIT`` in another group, under that group's GTID (``XA ROLLBACK``
  drops them). ``XA COMMIT ... ONE PHASE`` is a prepare event with ``one_phase`` set (MySQL) or
  an ordinary transaction (MariaDB): committed at once.
* a new GTID event before the end: the group is abandoned (it cannot have committed).

The buffer's records are opaque (the engine's landing tuples). They are kept in a
``RecordLog``: in memory up to a byte budget, then in spilled parts the engine writes
(``Spill``), so a transaction of any size fits in bounded memory.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cdc_platform.capture.events import (
    Begin,
    EngineError,
    Event,
    Query,
    XaPrepare,
    Xid,
    xa_id,
)

Record = Any


class SpilledPart(Protocol):
    """Records the engine built as one block (an Arrow table of one schema): written out of
    memory (``in_memory`` False), or still held in memory (the column-wise decoder's rows,
    spilled like a tail of records when the budget is reached). The buffer only counts, cuts
    and spills them."""

    count: int
    in_memory: bool

    def truncate(self, keep: int) -> SpilledPart:
        """The part holding only its first ``keep`` records (0 < keep < count)."""

    def remove(self) -> None:
        """Delete what backs the part (after it landed, or when its records are dropped)."""


# Writes consecutive parts held in memory (lists of records, blocks held in memory) out of
# memory, in order: spilled parts holding the same records.
Spill = Callable[[list[list[Record] | SpilledPart]], list[SpilledPart]]


def _size(part: list[Record] | SpilledPart) -> int:
    return len(part) if isinstance(part, list) else part.count


def _held(part: list[Record] | SpilledPart) -> bool:
    """True for a part in memory (records, or a block held in memory)."""
    return isinstance(part, list) or part.in_memory


class RecordLog:
    """One transaction's records in order: an in-memory tail of at most ``memory_bytes``
    (estimated) and, before it, parts spilled by ``spill``."""

    def __init__(self, memory_bytes: int = 0, spill: Spill | None = None) -> None:
        self.memory_bytes = memory_bytes
        self._spill = spill
        self.parts: list[list[Record] | SpilledPart] = []
        # The estimated bytes of each part in memory (0 for spilled parts), as ``parts``.
        self.part_bytes: list[int] = []
        self._count = 0
        self._memory = 0

    def __len__(self) -> int:
        return self._count

    @property
    def spilled(self) -> bool:
        return not all(_held(p) for p in self.parts)

    def extend(self, records: Sequence[Record], size: int) -> None:
        """Append records that take about ``size`` bytes in memory."""
        if not records:
            return
        if not self.parts or not isinstance(self.parts[-1], list):
            self.parts.append([])
            self.part_bytes.append(0)
        tail = self.parts[-1]
        assert isinstance(tail, list)
        tail.extend(records)
        self.part_bytes[-1] += size
        self._grown(len(records), size)

    def append_block(self, block: SpilledPart, size: int) -> None:
        """Append a block of records held in memory (``in_memory``), about ``size`` bytes."""
        if not block.count:
            return
        self.parts.append(block)
        self.part_bytes.append(size)
        self._grown(block.count, size)

    def _grown(self, count: int, size: int) -> None:
        self._count += count
        self._memory += size
        if self._spill is not None and self.memory_bytes and self._memory > self.memory_bytes:
            self.spill()

    def spill(self) -> None:
        """Move every part held in memory into spilled parts, in order."""
        if self._spill is None or not any(_held(p) for p in self.parts):
            return
        parts: list[list[Record] | SpilledPart] = []
        part_bytes: list[int] = []
        held: list[list[Record] | SpilledPart] = []
        for part, size in [*zip(self.parts, self.part_bytes, strict=True), (None, 0)]:
            if part is not None and _held(part):
                if _size(part):  # (not an empty tail)
                    held.append(part)
                continue
            if held:  # consecutive held parts together: as few files as their records need
                spilled = self._spill(held)
                parts.extend(spilled)
                part_bytes.extend(0 for _ in spilled)
                held = []
            if part is not None:
                parts.append(part)
                part_bytes.append(size)
        self.parts, self.part_bytes = parts, part_bytes
        self._memory = 0

    def truncate(self, keep: int) -> None:
        """Keep the first ``keep`` records (ROLLBACK TO SAVEPOINT)."""
        if keep >= self._count:
            return
        kept: list[list[Record] | SpilledPart] = []
        kept_bytes: list[int] = []
        seen = 0
        for part, part_bytes in zip(self.parts, self.part_bytes, strict=True):
            size = _size(part)
            if seen + size <= keep:
                kept.append(part)
                kept_bytes.append(part_bytes)
            elif seen >= keep:
                if not isinstance(part, list):
                    part.remove()
            else:
                kept.append(part[:keep - seen] if isinstance(part, list)
                            else part.truncate(keep - seen))
                kept_bytes.append(int(part_bytes * (keep - seen) / size))
            seen += size
        self.parts = kept
        self.part_bytes = kept_bytes
        self._memory = sum(kept_bytes)
        self._count = keep

    def __iter__(self) -> Iterator[list[Record] | SpilledPart]:
        """The parts in order: lists of records, or spilled parts."""
        return iter(self.parts)

    def restore(self, parts: Sequence[SpilledPart]) -> None:
        """Take spilled parts written by an earlier engine (a prepared XA transaction)."""
        self.parts = list(parts)
        self.part_bytes = [0] * len(self.parts)
        self._count = sum(part.count for part in parts)
        self._memory = 0

    def records(self) -> Iterator[Record]:
        """Every record, for logs of records only (tests, small transactions)."""
        for part in self.parts:
            if not isinstance(part, list):
                raise ValueError("records() of a log with blocks: iterate its parts")
            yield from part

    def discard(self) -> None:
        """Drop every record, deleting spilled parts."""
        for part in self.parts:
            if not isinstance(part, list):
                part.remove()
        self.parts = []
        self.part_bytes = []
        self._count = 0
        self._memory = 0


# -- what the buffer reports ----------------------------------------------------------------


@dataclass(frozen=True)
class Committed:
    """A committed transaction: its records become visible at ``gtid`` (for an XA
    transaction, the XA COMMIT's GTID). The engine owns ``records`` from here (and removes
    their spilled parts once landed)."""

    gtid: str
    timestamp: int
    records: RecordLog
    xid: str | None = None


@dataclass(frozen=True)
class Statement:
    """A statement that is not transaction control (DDL ...), for the engine to track. It
    comes before the ``Committed`` of its group."""

    gtid: str
    text: str
    database: str


@dataclass(frozen=True)
class RolledBack:
    gtid: str
    records: int
    reason: str
    xid: str | None = None  # an XA transaction dropped at XA ROLLBACK
    abandoned: bool = False  # a GTID event came before its end (it cannot have committed)

    @property
    def unusual(self) -> bool:
        """A group abandoned with rows (a binlog cut short by a server crash, or a stream the
        engine misread): worth a warning, though nothing committed."""
        return self.abandoned and bool(self.records)

    def describe(self) -> str:
        return (f"transaction {self.gtid or '?'}: {self.records} record(s) dropped "
                f"({self.reason}); nothing emitted")


@dataclass(frozen=True)
class Prepared:
    """An XA transaction's first phase: ``gtid`` is complete, its records wait for XA COMMIT."""

    gtid: str
    xid: str
    records: int

    def describe(self) -> str:
        return (f"XA transaction {self.xid}: prepared at GTID {self.gtid} with "
                f"{self.records} record(s); they land at its XA COMMIT")


Outcome = Committed | Statement | RolledBack | Prepared


@dataclass
class PreparedXa:
    """A prepared XA transaction: the GTID of its prepare, and its records."""

    gtid: str
    records: RecordLog
    persisted: bool = False  # the engine wrote it to the landing zone


@dataclass
class _Group:
    gtid: str
    timestamp: int
    standalone: bool | None
    records: RecordLog
    explicit: bool = False  # BEGIN / XA START seen: only COMMIT/XID/ROLLBACK/XA PREPARE end it
    savepoints: dict[str, int] = field(default_factory=dict)


# -- statement classification ---------------------------------------------------------------

_NAME = r"(`(?:[^`]|``)+`|[^\s`;]+)"
_BEGIN = re.compile(r"^\s*(BEGIN(\s+WORK)?|START\s+TRANSACTION\b.*)\s*$", re.I | re.S)
_COMMIT = re.compile(r"^\s*COMMIT(\s+WORK)?\s*$", re.I)
_ROLLBACK = re.compile(r"^\s*ROLLBACK(\s+WORK)?\s*$", re.I)
_SAVEPOINT = re.compile(rf"^\s*SAVEPOINT\s+{_NAME}\s*$", re.I)
_ROLLBACK_TO = re.compile(rf"^\s*ROLLBACK\s+(WORK\s+)?TO\s+(SAVEPOINT\s+)?{_NAME}\s*$", re.I)
_RELEASE = re.compile(rf"^\s*RELEASE\s+SAVEPOINT\s+{_NAME}\s*$", re.I)
_XA_START = re.compile(r"^\s*XA\s+(START|BEGIN)\b", re.I)
_XA_END = re.compile(r"^\s*XA\s+END\b", re.I)
_XA_FINISH = re.compile(
    r"^\s*XA\s+(COMMIT|ROLLBACK)\s+X'([0-9A-Fa-f]*)'\s*(?:,\s*X'([0-9A-Fa-f]*)'\s*"
    r"(?:,\s*(\d+))?)?\s*(ONE\s+PHASE)?\s*$", re.I)
_XA_ANY_FINISH = re.compile(r"^\s*XA\s+(COMMIT|ROLLBACK)\b", re.I)
# MySQL's CREATE TABLE ... SELECT: the CREATE statement opens the group's transaction.
_OPENS_TRANSACTION = re.compile(r"\bSTART\s+TRANSACTION\s*$", re.I)


def _savepoint_name(text: str) -> str:
    """A savepoint's name as the server compares it: unquoted, case-insensitive."""
    if text.startswith("`") and text.endswith("`") and len(text) > 1:
        text = text[1:-1].replace("``", "`")
    return text.casefold()


def parse_xa_finish(text: str) -> tuple[str, str, bool] | None:
    """``XA COMMIT X'..',X'..',n [ONE PHASE]`` -> ("COMMIT"|"ROLLBACK", xa id, one phase)."""
    match = _XA_FINISH.match(text)
    if match is None:
        return None
    verb, gtrid, bqual, format_id, one_phase = match.groups()
    xid = xa_id(int(format_id or 1), bytes.fromhex(gtrid), bytes.fromhex(bqual or ""))
    return verb.upper(), xid, one_phase is not None


class TransactionBuffer:
    """Feed it the binlog's events in order; it says what committed (``feed``)."""

    def __init__(self, new_log: Callable[[], RecordLog] = RecordLog) -> None:
        self._new_log = new_log
        self._group: _Group | None = None
        self.prepared: dict[str, PreparedXa] = {}

    @property
    def open_gtid(self) -> str | None:
        """The GTID of the group being read (None between groups)."""
        return self._group.gtid if self._group is not None else None

    @property
    def in_group(self) -> bool:
        return self._group is not None

    def add(self, records: Sequence[Record], size: int) -> None:
        """Rows of the current group (records the engine built from one rows event)."""
        if self._group is None:  # rows outside a GTID group: no GTID mode; keep the old form
            self._group = _Group("", 0, None, self._new_log())
        self._group.records.extend(records, size)

    def add_block(self, block: SpilledPart, size: int) -> None:
        """``add`` for rows the engine built as one block held in memory."""
        if self._group is None:
            self._group = _Group("", 0, None, self._new_log())
        self._group.records.append_block(block, size)

    def discard_open(self) -> str | None:
        """Forget the group being read (stop, reconnect: it is read again); its GTID."""
        group, self._group = self._group, None
        if group is None:
            return None
        group.records.discard()
        return group.gtid

    def feed(self, event: Event) -> list[Outcome]:
        """Apply one event; rows come through ``add``; events that do not concern
        transactions are ignored."""
        if isinstance(event, Begin):
            return self._begin(event)
        if isinstance(event, Query):
            return self._query(event)
        if isinstance(event, Xid):
            return self._commit(event.timestamp)
        if isinstance(event, XaPrepare):
            return self._xa_prepare(event)
        return []

    def _begin(self, event: Begin) -> list[Outcome]:
        out: list[Outcome] = []
        if self._group is not None:
            group = self._group
            out.append(RolledBack(group.gtid, len(group.records),
                                  f"no commit before GTID {event.gtid}", abandoned=True))
            group.records.discard()
        self._group = _Group(event.gtid, event.timestamp, event.standalone, self._new_log())
        return out

    def _ensure_group(self, timestamp: int) -> _Group:
        if self._group is None:
            self._group = _Group("", timestamp, None, self._new_log())
        return self._group

    def _query(self, event: Query) -> list[Outcome]:
        text = event.text
        if _BEGIN.match(text) or _XA_START.match(text):
            self._ensure_group(event.timestamp).explicit = True
            return []
        if _XA_END.match(text):
            return []
        if _COMMIT.match(text):
            return self._commit(event.timestamp)
        if _ROLLBACK.match(text):
            group, self._group = self._group, None
            if group is None:
                return []
            count = len(group.records)
            group.records.discard()
            return [RolledBack(group.gtid, count, "ROLLBACK in the binlog")]
        savepoint = _SAVEPOINT.match(text)
        if savepoint:
            group = self._ensure_group(event.timestamp)
            group.savepoints[_savepoint_name(savepoint.group(1))] = len(group.records)
            return []
        rollback_to = _ROLLBACK_TO.match(text)
        if rollback_to:
            group = self._ensure_group(event.timestamp)
            name = _savepoint_name(rollback_to.group(3))
            if name not in group.savepoints:
                raise EngineError(
                    f"GTID {group.gtid or '?'}: {text.strip()!r} names a savepoint this "
                    "transaction never set in the binlog, so which of its rows were rolled "
                    "back is unknown; the engine stops rather than emit them. Report this "
                    "binlog (mysqlbinlog of the GTID); to go on, re-snapshot the tables the "
                    "transaction wrote and move the checkpoint past this GTID")
            keep = group.savepoints[name]
            group.records.truncate(keep)
            # Savepoints set after this one are gone with the rows.
            group.savepoints = {k: v for k, v in group.savepoints.items() if v <= keep}
            return []
        release = _RELEASE.match(text)
        if release:
            if self._group is not None:
                self._group.savepoints.pop(_savepoint_name(release.group(1)), None)
            return []
        if _XA_ANY_FINISH.match(text):
            return self._xa_finish(event)
        group = self._group
        gtid = group.gtid if group is not None else ""
        out: list[Outcome] = [Statement(gtid, text, event.database)]
        if group is not None and not group.explicit and self._statement_ends_group(group, text):
            out += self._commit(event.timestamp)
        return out

    @staticmethod
    def _statement_ends_group(group: _Group, text: str) -> bool:
        if group.standalone is not None:
            return group.standalone
        return not _OPENS_TRANSACTION.search(text)

    def _commit(self, timestamp: int, xid: str | None = None) -> list[Outcome]:
        group, self._group = self._group, None
        if group is None:
            return []
        return [Committed(group.gtid, timestamp or group.timestamp, group.records, xid)]

    def _xa_prepare(self, event: XaPrepare) -> list[Outcome]:
        if event.one_phase:
            return self._commit(event.timestamp, event.xid)
        group, self._group = self._group, None
        if group is None:
            return []
        self.prepared[event.xid] = PreparedXa(group.gtid, group.records)
        return [Prepared(group.gtid, event.xid, len(group.records))]

    def forget_prepared(self, txn: Committed) -> None:
        """The engine applied ``txn``: when it is the XA COMMIT of a prepared transaction (its
        records are queued under the commit's GTID), that one is no longer prepared."""
        prepared = self.prepared.get(txn.xid) if txn.xid is not None else None
        if prepared is not None and prepared.records is txn.records:
            del self.prepared[txn.xid]

    def _xa_finish(self, event: Query) -> list[Outcome]:
        parsed = parse_xa_finish(event.text)
        group = self._ensure_group(event.timestamp)
        if parsed is None:
            raise EngineError(
                f"GTID {group.gtid or '?'}: cannot read the XA id of {event.text!r}, so the "
                "XA transaction's rows cannot be matched: report this binlog statement")
        verb, xid, one_phase = parsed
        if one_phase:  # a one-phase commit logged as a statement: its rows are in this group
            return self._commit(event.timestamp, xid)
        # An XA COMMIT's transaction stays prepared until the engine applied its records
        # (``forget_prepared``): a checkpoint written in between must still name it.
        prepared = self.prepared.pop(xid, None) if verb == "ROLLBACK" else self.prepared.get(xid)
        out: list[Outcome] = []
        if verb == "ROLLBACK":
            if prepared is not None:
                out.append(RolledBack(prepared.gtid, len(prepared.records),
                                      f"XA ROLLBACK at GTID {group.gtid}", xid))
                prepared.records.discard()
            self._group = None
            out.append(Committed(group.gtid, event.timestamp, group.records))
            return out
        if prepared is None:
            raise EngineError(
                f"GTID {group.gtid or '?'}: XA COMMIT of XA transaction {xid} whose XA PREPARE "
                "this engine never read (it was prepared before the engine's start position), "
                "so its rows cannot be emitted. Start the engine from a position before the "
                "prepare (capture.initial_position on a fresh landing zone), or re-snapshot "
                "the tables that transaction wrote and move the checkpoint past this GTID")
        self._group = None
        group.records.discard()
        return [Committed(group.gtid, event.timestamp, prepared.records, xid)]
