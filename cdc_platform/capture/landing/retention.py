"""Landing-zone retention: delete what no reader needs any more, and compact the small
segments nobody reads, so that the landing zone stays bounded (docs/landing-zone.md,
"Retention").

The lake applier calls ``sweep`` every minute with every target's consumed mark. The rules
are pure functions (``horizon``, ``covered_segments``, ``expired_segments``,
``compaction_runs``, ``chunk_deletions``), property-tested; ``sweep`` lists, applies them and
deletes. Why each is safe:

* A table's **horizon** is the highest changelog position no reader of its segments needs:
  its target's consumed mark (inclusive), everything committed for a table without a target
  (``unread``), nothing for a table whose target consumed nothing or that the caller does not
  name (a target may exist that it does not know of). Never at or past the checkpoint's
  ``next_pos``: files there belong to the flush being written or to a crash's left-overs,
  which the engine deletes at its next start and replays with the same positions. The engine
  itself never reads a segment again (it resumes from the checkpoint's GTID set), and a reader
  reads only records after its target's mark (``lake.changelog.TableChangelog.segments``).
  Where publishers are required (change topics), never past what each published through
  (``capture.landing.published``): a change is published before its segment goes.
* A segment **expires** when it ends at or below the horizon, its file is older than the
  retention, and it is not the table's newest committed segment. Age is the file's
  modification time (when it landed; a compacted segment takes its newest input's), not its
  records' commit time: an engine catching up lands hours-old commits that a reader listed a
  second ago. The newest committed segment stays because three readers ask "does a segment
  end past position P?" (the lake's drop of a column the source dropped, a stale marker's
  resolved position, and the newest columns of a table) and the newest one answers it as the
  whole changelog would: deleting a consumed prefix changes none of their answers.
* **Compaction** rewrites consecutive committed segments below the horizon that are small
  (< ``SMALL_SEGMENT_BYTES``), landed in the same closed ``COMPACTION_WINDOW_SECONDS``
  window, have the same Parquet schema (columns and ``cdc.*`` metadata, so snapshot records
  stay in segments with the snapshot columns) and no column-rename record between them
  (``docs/landing-zone.md``: a rename's position is never inside a segment), as one segment
  named by the first's first and the last's last position, holding exactly their records in
  order. Order: the output is written durably and counted, then the inputs are deleted. A
  crash in between leaves the output and some inputs: duplicate records, but only below the
  horizon where no reader with its target's mark reads; every sweep first deletes the
  segments whose range lies inside another's (``covered_segments``: only compaction makes
  them; the engine's segments of one table never overlap). Segments above the horizon are
  never compacted: there is no atomic swap of N files for one, so a merge listing the table
  meanwhile would read records twice (wrong counts) or lose a file it listed.
* **Snapshot chunks** (``capture.snapshot.protocol`` writes them; this module reads only what
  it needs of that layout, which floor rules keep above ``landing/``: the tests check the two
  agree): rows files of chunks the checkpoint records as committed or rejected are never read
  again (the engine decides only undecided chunks, and its committed list only grows), so they
  go at once; their manifests stay while the session may still run (a resuming reader numbers
  its chunks from them). A session's whole directory goes once the session ended (``done``,
  ``stopped``, ``restart``) or was replaced (the checkpoint and ``request.json`` both name
  another session), and nothing in it changed for ``FINISHED_SESSION_GRACE_SECONDS`` (a
  replaced reader still writing notices and ends): manifests first, so no manifest is ever
  without its rows file.
* **Spill files** are the engine's: it deletes them once the checkpoint that no longer names
  them is durable, and a start deletes every file its checkpoint does not name (those a
  killed engine left). A sweep cannot tell a running engine's open transaction from an
  orphan, so it only counts them.
* Never touched: ``checkpoint.json``, ``tables.json``, publishers' records (``published/``), column-rename records, stale markers
  (the lake deletes them once applied), snapshot requests, controls and locks.

Every deletion is of one file, and every prefix of a sweep's deletions leaves a zone in
which every reader finds what it needs: a sweep killed at any moment (kill -9) is safe, and
the next one finishes its work. One sweep runs at a time per landing folder (an ``flock`` on
``retention.lock``; on object storage the lease ``retention.lease``; a second one returns at
once, ``skipped``).

On object storage (an ``s3://`` landing zone) segments and snapshot chunks are deleted by the
same rules, through the same code, with sizes and ages from the listing
(``FileStore.list_files``: an object's age is its upload time), and small segments are
compacted as locally; there a compacted segment's age is its upload's (object times cannot be
set), so it stays up to one retention longer than its inputs would have. There are no
temporary files there (a PUT is whole).
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import logging
import os
import re
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_platform.capture.landing.published import hold as publishers_hold
from cdc_platform.capture.landing.session_records import SessionState, SnapshotRequest
from cdc_platform.capture.landing.zone import (
    CHANGELOG_DIR,
    SEGMENT_NAME,
    SNAPSHOT_CHUNKS_DIR,
    SNAPSHOT_REQUEST_FILE,
    SNAPSHOTS_DIR,
    Checkpoint,
    LandingZone,
    changelog_parts,
    segment_name,
    segment_write_options,
    table_of_parts,
    table_parts,
)
from cdc_platform.capture.names import table_id
from cdc_platform.capture.store.lease import Lease, process_holder
from cdc_platform.capture.store.storage import FileInfo, FileStore, fsync_directory

log = logging.getLogger(__name__)

# Segments landed within one window of this many seconds (by file time) are compacted
# together once the window closed. Measured on a day of 0.5 s flushes with retention 1 h
# (cdc_platform_tests/capture/landing/test_retention.py, ``test_a_day_of_streaming``): one
# busy table keeps at most ~7,300 segments without compaction, ~190 with it.
COMPACTION_WINDOW_SECONDS = 60.0
# Only segments below this size are compacted (larger ones are not "small"), into files of
# at most COMPACTED_MAX_BYTES of input; written a row group per COMPACTED_ROW_GROUP_ROWS rows,
# one input read at a time, so memory stays bounded.
SMALL_SEGMENT_BYTES = 4 * 1024 * 1024
COMPACTED_MAX_BYTES = 64 * 1024 * 1024
COMPACTED_ROW_GROUP_ROWS = 128 * 1024
# Segments compacted into one output at most (each is held open until the output is written).
MAX_COMPACTED_INPUTS = 512
# A finished snapshot session's directory goes once nothing in it changed for this long.
FINISHED_SESSION_GRACE_SECONDS = 300.0
# Temporary files (``.<name>.tmp-<pid>-<thread>``) of a writer that died: a write takes
# seconds; the engine also removes its own at start.
TEMPORARY_MAX_AGE_SECONDS = 3600.0

# What the report counts, by kind of file.
SEGMENTS, CHUNKS, SPILL, TEMPORARY, OTHER = "segments", "chunks", "spill", "temporary", "other"
KINDS = (SEGMENTS, CHUNKS, SPILL, TEMPORARY, OTHER)

SPILL_DIR = "spill"
SWEEP_LOCK_FILE = "retention.lock"
# On object storage one sweep at a time holds this lease (a sweep lasts seconds; a killed
# sweeper's lease blocks the next for at most this long).
SWEEP_LEASE_FILE = "retention.lease"
SWEEP_LEASE_TTL_SECONDS = 600.0
_CHUNK_FILE = re.compile(r"^(\d{8})\.(json|arrow|parquet)$")


# ---- the rules (pure) ------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class SegmentFile:
    """One changelog segment as listed: its name's positions, size and modification time."""

    first_pos: int
    last_pos: int
    name: str
    size: int = 0
    mtime: float = 0.0


def horizon(table: str, consumed: Mapping[str, int | None], unread: Collection[str],
            next_pos: int, published: int | None = None) -> int:
    """The highest position no reader of ``table``'s segments needs (0: none): its target's
    consumed mark; everything committed if it has no target; never past what the publishers
    published (``published``: ``capture.landing.published.hold``, None when none holds the
    table); never ``next_pos`` or past it."""
    if table in consumed:
        mark = consumed[table]
        free = 0 if mark is None else mark
    elif table in unread:
        free = next_pos - 1
    else:
        free = 0
    if published is not None:
        free = min(free, published)
    return max(0, min(free, next_pos - 1))


def covered_segments(segments: Sequence[SegmentFile]) -> list[SegmentFile]:
    """Segments whose position range lies inside another segment's: inputs of a compaction
    killed after its output landed (the output holds their records)."""
    ordered = sorted(segments, key=lambda s: (s.first_pos, -s.last_pos))
    covered, reach = [], None
    for segment in ordered:
        if reach is not None and segment.last_pos <= reach:
            covered.append(segment)
        else:
            reach = segment.last_pos if reach is None else max(reach, segment.last_pos)
    return covered


def expired_segments(segments: Sequence[SegmentFile], free_through: int, next_pos: int,
                     retention_seconds: float, now: float) -> list[SegmentFile]:
    """Segments to delete, oldest first: ending at or below ``free_through`` (the horizon),
    older than the retention, and not the newest committed segment of the table."""
    committed = [s for s in segments if s.last_pos < next_pos]
    newest = max(committed, key=lambda s: s.last_pos, default=None)
    return sorted(s for s in committed if s is not newest and s.last_pos <= free_through
                  and now - s.mtime >= retention_seconds)


def compaction_runs(segments: Sequence[SegmentFile], free_through: int, breaks: Sequence[int],
                    now: float, window: float = COMPACTION_WINDOW_SECONDS,
                    small_bytes: int = SMALL_SEGMENT_BYTES,
                    max_bytes: int = COMPACTED_MAX_BYTES) -> list[list[SegmentFile]]:
    """Runs of two or more segments to rewrite as one (before their schemas are compared):
    consecutive in position order among all ``segments``, each ending at or below
    ``free_through``, smaller than ``small_bytes``, landed in the same window that has
    closed, with no position of ``breaks`` (column-rename records) between the run's first
    and last position, and at most ``max_bytes`` together."""
    ordered = sorted(segments)
    cuts = sorted(breaks)
    runs: list[list[SegmentFile]] = []
    run: list[SegmentFile] = []

    def close() -> None:
        if len(run) >= 2:
            runs.append(list(run))
        run.clear()

    for segment in ordered:
        slot = int(segment.mtime // window)
        eligible = (segment.last_pos <= free_through and segment.size < small_bytes
                    and (slot + 1) * window <= now)
        if not eligible:
            close()
            continue
        if run and (int(run[0].mtime // window) != slot
                    or _break_between(cuts, run[-1].last_pos, segment.first_pos)
                    or sum(s.size for s in run) + segment.size > max_bytes):
            close()
        run.append(segment)
    close()
    return runs


def _break_between(cuts: Sequence[int], after: int, before: int) -> bool:
    index = bisect.bisect_right(cuts, after)
    return index < len(cuts) and cuts[index] < before


@dataclass(frozen=True)
class EngineSession:
    """What the checkpoint says of a table's snapshot session: its id, state and the chunks
    the engine decided (committed or rejected: never read again)."""

    session_id: str
    state: SessionState
    decided: frozenset[int]

    @property
    def ended(self) -> bool:
        """Done, stopped or restarted: the engine no longer tracks it."""
        return not self.state.tracked


def engine_session(checkpoint: Checkpoint, table: str) -> EngineSession | None:
    """The table's session as the checkpoint records it (read by ``Checkpoint.snapshot_session``,
    the engine's own parser), or None; ValueError when the record does not read (the table's
    chunk files are then left alone)."""
    try:
        session = checkpoint.snapshot_session(table)
        if session is None:
            return None
        decided = frozenset(int(seq) for seq in [*session.committed, *session.rejected])
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"snapshot session of {table} in the checkpoint: {error!r}") from error
    return EngineSession(session.session_id, session.state, decided)


def chunk_deletions(session_id: str, names: Collection[str], engine: EngineSession | None,
                    requested: str | None, quiet_seconds: float,
                    grace_seconds: float = FINISHED_SESSION_GRACE_SECONDS
                    ) -> tuple[list[str], bool]:
    """The files of ``chunks/<session_id>/`` to delete, in order, and whether the directory
    goes. ``engine``: the table's session in the checkpoint; ``requested``: the session
    ``request.json`` names (None: no request); ``quiet_seconds``: since anything in the
    directory last changed."""
    own = engine is not None and engine.session_id == session_id
    finished = (own and engine.ended) or (not own and requested != session_id)
    if finished and quiet_seconds >= grace_seconds:
        def order(name: str) -> tuple[int, str]:
            match = _CHUNK_FILE.match(name)
            rank = 2 if match is None else 0 if match.group(2) == "json" else 1
            return rank, name
        return sorted(names, key=order), True
    if not own:
        return [], False
    assert engine is not None
    return sorted(name for name in names if (match := _CHUNK_FILE.match(name))
                  and match.group(2) != "json" and int(match.group(1)) in engine.decided), False


# ---- the report -------------------------------------------------------------------------------


@dataclass
class RetentionReport:
    """What one sweep did: files and bytes deleted and kept, by kind (``KINDS``), and the
    segments compacted. Deleted segments include compaction's duplicates a killed sweep left."""

    deleted_files: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    deleted_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    kept_files: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    kept_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    compacted_segments: int = 0  # inputs rewritten (and deleted)
    compacted_into: int = 0  # segments written by compaction
    compacted_bytes_in: int = 0
    compacted_bytes_out: int = 0
    errors: list[str] = field(default_factory=list)
    skipped: str = ""  # why nothing was done (another sweep held the lock)
    seconds: float = 0.0

    def deleted(self, kind: str, size: int) -> None:
        self.deleted_files[kind] += 1
        self.deleted_bytes[kind] += size

    def metadata(self) -> dict[str, int | float | str]:
        """Flat numbers for Dagster metadata."""
        data: dict[str, int | float | str] = {}
        for kind in KINDS:
            data[f"deleted_{kind}_files"] = self.deleted_files[kind]
            data[f"deleted_{kind}_bytes"] = self.deleted_bytes[kind]
            data[f"kept_{kind}_files"] = self.kept_files[kind]
            data[f"kept_{kind}_bytes"] = self.kept_bytes[kind]
        data.update(compacted_segments=self.compacted_segments,
                    compacted_into=self.compacted_into,
                    compacted_bytes_in=self.compacted_bytes_in,
                    compacted_bytes_out=self.compacted_bytes_out,
                    errors=len(self.errors), seconds=round(self.seconds, 3))
        if self.errors:
            data["first_error"] = self.errors[0]
        if self.skipped:
            data["skipped"] = self.skipped
        return data

    def __str__(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        deleted = sum(self.deleted_files.values())
        kept = sum(self.kept_files.values())
        text = (f"deleted {deleted} files ({sum(self.deleted_bytes.values()):,} bytes: "
                f"{self.deleted_files[SEGMENTS]} segments, {self.deleted_files[CHUNKS]} "
                f"chunk files), compacted {self.compacted_segments} segments into "
                f"{self.compacted_into}, kept {kept} files "
                f"({sum(self.kept_bytes.values()):,} bytes: {self.kept_files[SEGMENTS]} "
                f"segments) in {self.seconds:.2f} s")
        if self.errors:
            text += f"; {len(self.errors)} error(s), the first: {self.errors[0]}"
        return text


# ---- the sweep (I/O) ----------------------------------------------------------------------------


def sweep(landing: LandingZone, consumed: Mapping[str, int | None], unread: Collection[str],
          retention_seconds: float, now: float | None = None, *,
          compact: bool = True, publishers: Collection[str] = ()) -> RetentionReport:
    """Delete what no reader needs any more, compact small segments nobody reads; report.

    ``consumed``: table id (``capture.names.table_id``) -> the changelog position its target
    consumed through (its mark, inclusive), None when it consumed nothing yet. ``unread``:
    tables without a target (their segments go by age alone). Tables in neither keep all of
    their segments. ``retention_seconds``: how long a consumed segment stays after it landed.
    ``publishers``: the publishers that must have published a segment before it goes
    (``capture.landing.published``; one that wrote no record yet holds everything).
    ``now``: the time ages are measured at (default: the clock). A table whose files cannot be
    handled is reported in ``errors`` and the sweep goes on.
    """
    started = time.monotonic()
    now = time.time() if now is None else now
    report = RetentionReport()
    if landing.is_local and not landing.root.is_dir():
        return report
    with _sweep_lock(landing) as held:
        if not held:
            report.skipped = "another sweep of this landing zone is running"
            return report
        checkpoint = landing.read_checkpoint()
        if checkpoint is not None:
            unread = set(unread)
            # (read after the checkpoint: a publisher's record only grows, so an older read
            # holds back more, never less)
            marks = {name: landing.read_published(name) for name in publishers}
            for database, table in landing.changelog_tables():
                name = table_id(database, table)
                try:
                    _sweep_table(landing, database, table, horizon(
                        name, consumed, unread, checkpoint.next_pos, publishers_hold(marks, name)),
                        checkpoint.next_pos, retention_seconds, now, compact, report)
                except (OSError, pa.ArrowException, ValueError) as error:
                    _failed(report, f"changelog of {table_id(database, table)}", error)
            _sweep_chunks(landing, now, report)
        _count_kept(landing, report)
    report.seconds = time.monotonic() - started
    return report


@contextlib.contextmanager
def _sweep_lock(landing: LandingZone) -> Iterator[bool]:
    """One sweep at a time per landing folder (two compacting the same segments at once could
    leave overlapping outputs); True when held. Released with its process, however it ends (on
    object storage: a lease, released when the sweep ends, or expiring after
    ``SWEEP_LEASE_TTL_SECONDS``)."""
    if not landing.is_local:
        lease = Lease(landing.store, SWEEP_LEASE_FILE)
        if not lease.acquire(process_holder(), SWEEP_LEASE_TTL_SECONDS):
            yield False
            return
        try:
            yield True
        finally:
            lease.release()
        return
    with open(landing.root / SWEEP_LOCK_FILE, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def _failed(report: RetentionReport, what: str, error: BaseException) -> None:
    message = f"{what}: {type(error).__name__}: {error}"
    report.errors.append(message)
    log.warning(f"landing-zone retention: {message}; left as it is until the next sweep")


def _listed_segments(landing: LandingZone, database: str, table: str) -> list[SegmentFile]:
    """A table's segments with sizes and times (locally a ``stat`` each: one deleted meanwhile,
    by another sweep or an engine start, is left out; on object storage from the listing)."""
    found = []
    for info in landing.store.list_files(*changelog_parts(database, table)):
        match = SEGMENT_NAME.match(info.name)
        if match:
            found.append(SegmentFile(int(match.group(1)), int(match.group(2)), info.name,
                                     info.size, info.mtime))
    return sorted(found, key=lambda s: (s.first_pos, s.last_pos, s.name))


def _sweep_table(landing: LandingZone, database: str, table: str, free_through: int,
                 next_pos: int, retention_seconds: float, now: float, compact: bool,
                 report: RetentionReport) -> None:
    parts = changelog_parts(database, table)
    segments = _listed_segments(landing, database, table)
    for segment in covered_segments(segments):
        landing.store.delete(*parts, segment.name)
        report.deleted(SEGMENTS, segment.size)
    segments = _listed_segments(landing, database, table)
    expired = expired_segments(segments, free_through, next_pos, retention_seconds, now)
    for segment in expired:
        landing.store.delete(*parts, segment.name)
        report.deleted(SEGMENTS, segment.size)
    for name in landing.store.list_names(*parts) if landing.is_local else ():
        if name.startswith(".") and ".tmp-" in name:
            path = landing.store.path(*parts, name)
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                if now - stat.st_mtime >= TEMPORARY_MAX_AGE_SECONDS:
                    path.unlink(missing_ok=True)
                    report.deleted(TEMPORARY, stat.st_size)
    if not compact:
        return
    gone = {s.name for s in expired}
    left = [s for s in segments if s.name not in gone]
    breaks = [position for position, _ in landing.column_renames_names(database, table)]
    for run in compaction_runs(left, free_through, breaks, now):
        _compact_run(landing, database, table, run, report)


def _compact_run(landing: LandingZone, database: str, table: str, run: list[SegmentFile],
                 report: RetentionReport) -> None:
    """Compact ``run`` as consecutive segments of one Parquet schema each (columns and
    ``cdc.*`` metadata), reading each segment once: its schema decides where a run is cut,
    and its rows go to the output (schemas read first, then the rows, was two opens and two
    footers a segment: with a thousand tables, tens of thousands of small segments a
    minute). A stretch of one segment is left as it is."""
    start = 0
    while start < len(run):
        start += _compact(landing, database, table, run[start:], report)


class _SchemaChanged(Exception):
    """The next segment of a run has another schema: the output ends before it."""


def _compact(landing: LandingZone, database: str, table: str, run: list[SegmentFile],
             report: RetentionReport) -> int:
    """Rewrite the longest prefix of ``run`` in one schema as one segment, durably, then
    delete its inputs (see the module's docstring); how many segments the prefix held (one:
    nothing was written). Through the zone's store: locally the output is renamed into
    place, fsynced and takes its newest input's time; on object storage it appears with its
    upload (one PUT, or a multipart upload completed at once), and its age starts then."""
    store = landing.store
    parts = changelog_parts(database, table)
    opened = [_open_segment(store, parts, run[0])]
    schema = opened[0][1].schema_arrow
    for segment in run[1:MAX_COMPACTED_INPUTS]:  # (the prefix's end: footers only, each
        # file opened once)
        handle, source = _open_segment(store, parts, segment)
        if not source.schema_arrow.equals(schema, check_metadata=True):
            handle.close()
            break
        opened.append((handle, source))
    taken = run[:len(opened)]
    if len(taken) < 2:
        for handle, _ in opened:
            handle.close()
        return 1
    name = segment_name(taken[0].first_pos, taken[-1].last_pos)
    rows = 0
    local = store.local_root is not None
    try:
        # (locally the directory is synced once, below, after the output's time is set)
        with store.atomic_output(*parts, name, **({"sync_dir": False} if local else {})) \
                as sink, pq.ParquetWriter(sink, schema,
                                          **segment_write_options(schema.names)) as writer:
            held: list[pa.Table] = []
            for _, source in opened:
                piece = source.read()
                held.append(piece)
                rows += piece.num_rows
                if sum(t.num_rows for t in held) >= COMPACTED_ROW_GROUP_ROWS:
                    writer.write_table(pa.concat_tables(held))
                    held = []
            if held:
                writer.write_table(pa.concat_tables(held))
    finally:
        for handle, _ in opened:
            handle.close()
    run = taken
    if local:
        output = store.local_root.joinpath(*parts, name)  # type: ignore[union-attr]
        newest = max(s.mtime for s in run)
        os.utime(output, (newest, newest))  # its age is its newest input's
        fsync_directory(output.parent)  # durable before any input goes
    filesystem, path = store.arrow(*parts, name)
    if pq.read_metadata(path, filesystem=filesystem).num_rows != rows:  # (a broken disk, a bug)
        store.delete(*parts, name)
        raise ValueError(f"compacted segment {store.uri_of(*parts, name)} does not hold the "
                         f"{rows} records of its {len(run)} inputs; removed, the inputs are kept")
    for segment in run:
        store.delete(*parts, segment.name)
    report.compacted_segments += len(run)
    report.compacted_into += 1
    report.compacted_bytes_in += sum(s.size for s in run)
    report.compacted_bytes_out += filesystem.get_file_info(path).size
    return len(run)


def _open_segment(store: FileStore, parts: tuple[str, ...], segment: SegmentFile
                  ) -> tuple[Any, pq.ParquetFile]:
    """A segment's file, open, and its Parquet reader (the footer read)."""
    filesystem, path = store.arrow(*parts, segment.name)
    handle = filesystem.open_input_file(path)
    try:
        return handle, pq.ParquetFile(handle)
    except BaseException:
        handle.close()
        raise


def _sweep_chunks(landing: LandingZone, now: float, report: RetentionReport) -> None:
    """Chunk files the engine decided, and directories of finished sessions (module doc)."""
    listed: list[tuple[str, str, str, list[FileInfo]]] = []  # (db dir, table dir, session, files)
    for db_dir in landing.store.list_names(SNAPSHOTS_DIR):
        for table_dir in landing.store.list_names(SNAPSHOTS_DIR, db_dir):
            for session_id in landing.store.list_names(SNAPSHOTS_DIR, db_dir, table_dir,
                                                       SNAPSHOT_CHUNKS_DIR):
                listed.append((db_dir, table_dir, session_id, landing.store.list_files(
                    SNAPSHOTS_DIR, db_dir, table_dir, SNAPSHOT_CHUNKS_DIR, session_id)))
    if not listed:
        return
    # Read after listing: a directory listed above belongs to a session requested (or
    # acknowledged) no later than what is read now.
    checkpoint = landing.read_checkpoint()
    if checkpoint is None:
        return
    for db_dir, table_dir, session_id, files in listed:
        where = f"snapshot chunks {db_dir}/{table_dir}/{session_id}"
        try:
            database, table = table_of_parts(db_dir, table_dir)
            if table_parts(database, table) != (db_dir, table_dir):
                continue  # (a raw name: the next engine start moves it)
            engine = engine_session(checkpoint, table_id(database, table))
            requested = _requested_session(landing, db_dir, table_dir, session_id)
            parts = (SNAPSHOTS_DIR, db_dir, table_dir, SNAPSHOT_CHUNKS_DIR, session_id)
            sizes = {info.name: info.size for info in files}
            # (an object store has no directory times: its newest file's; an empty local
            # directory is quiet since its own last change)
            changed = max([info.mtime for info in files] or [_directory_time(landing, parts)])
            doomed, whole = chunk_deletions(session_id, sizes, engine, requested,
                                            now - changed)
            for name in doomed:
                landing.store.delete(*parts, name)
                report.deleted(CHUNKS, sizes.get(name, 0))
            if whole:
                _remove_empty_directory(landing, parts)
        except (OSError, ValueError) as error:
            _failed(report, where, error)


def _directory_time(landing: LandingZone, parts: tuple[str, ...]) -> float:
    """A local directory's modification time; 0 elsewhere (nothing to wait for)."""
    root = landing.store.local_root
    if root is None:
        return 0.0
    try:
        return root.joinpath(*parts).stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _remove_empty_directory(landing: LandingZone, parts: tuple[str, ...]) -> None:
    """A local directory, if still empty (a replaced reader may write on); object stores have
    no directories (a prefix is gone with its last object)."""
    root = landing.store.local_root
    if root is not None:
        with contextlib.suppress(OSError):
            root.joinpath(*parts).rmdir()


def _requested_session(landing: LandingZone, db_dir: str, table_dir: str,
                       session_id: str) -> str | None:
    """The session ``request.json`` names (None without one), read by the request's one
    parser (``SnapshotRequest.from_json``). One that does not read is taken to name
    ``session_id``: the directory is then not judged replaced."""
    data = landing.store.read_bytes(SNAPSHOTS_DIR, db_dir, table_dir, SNAPSHOT_REQUEST_FILE)
    if data is None:
        return None
    try:
        return SnapshotRequest.from_json(data).session_id
    except (ValueError, KeyError, TypeError):
        return session_id


def _count_kept(landing: LandingZone, report: RetentionReport) -> None:
    """What is left, by kind, from one walk of the server's folder through its store (a
    listing per directory; on object storage the engine's spill folder is local scratch,
    not in the zone)."""
    pending = [()]
    while pending:
        parts: tuple[str, ...] = pending.pop()
        files = landing.store.list_files(*parts)
        for info in files:
            kind = _kind(parts, info.name)
            report.kept_files[kind] += 1
            report.kept_bytes[kind] += info.size
        file_names = {info.name for info in files}
        pending.extend((*parts, name) for name in landing.store.list_names(*parts)
                       if name not in file_names)


def _kind(relative: tuple[str, ...], name: str) -> str:
    if relative[:1] == (SPILL_DIR,):
        return SPILL
    if relative[:1] == (SNAPSHOTS_DIR,) and relative[3:4] == (SNAPSHOT_CHUNKS_DIR,):
        return CHUNKS
    if name.startswith(".") and ".tmp-" in name:
        return TEMPORARY
    if relative[:1] == (CHANGELOG_DIR,) and SEGMENT_NAME.match(name):
        return SEGMENTS
    return OTHER
