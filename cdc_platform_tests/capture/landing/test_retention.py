"""Landing-zone retention (``capture.landing.retention``): the rules as properties, the sweep on
landing zones written here, a sweep killed after every one of its deletions, and the real
engine, snapshot reader, lake and a sweeper process killed with kill -9 at random moments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_platform.capture import names
from cdc_platform.capture.gtid import parse_position
from cdc_platform.capture.landing import retention
from cdc_platform.capture.landing.published import CHANGE_TOPICS, PublishedMarks
from cdc_platform.capture.landing.published import hold as publishers_hold
from cdc_platform.capture.landing.records import (
    GTID,
    OP,
    POS,
    THRESHOLD,
    TS_MS,
    segment_schema,
    snapshot_arrow_fields,
)
from cdc_platform.capture.landing.retention import (
    COMPACTION_WINDOW_SECONDS,
    EngineSession,
    SegmentFile,
    chunk_deletions,
    compaction_runs,
    covered_segments,
    engine_session,
    expired_segments,
    horizon,
    sweep,
)
from cdc_platform.capture.landing.session_records import (
    Action,
    SessionState,
    SnapshotRequest,
    SnapshotSession,
)
from cdc_platform.capture.landing.zone import (
    SNAPSHOT_CHUNKS_DIR,
    SNAPSHOTS_CHECKPOINT_KEY,
    SNAPSHOTS_DIR,
    Checkpoint,
    LandingZone,
    column_renames_name,
    column_renames_parts,
    segment_name,
    snapshot_parts,
)
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.snapshot import protocol
from cdc_platform.capture.snapshot.chunks import Chunk, ChunkedTable, ChunkKey
from cdc_platform.capture.snapshot.sessions import SnapshotCoordinator
from cdc_platform.capture.store.storage import LocalFileStore
from cdc_platform.lake.changelog import TableChangelog

HOUR = 3600.0
ITEMS = TableSchema("shop", "items", (ColumnSpec("id", "int"), ColumnSpec("name", "string")),
                    ("id",))
LOG = TableSchema("shop", "log", (ColumnSpec("line", "string"),))


# ---- the rules, as properties -----------------------------------------------------------------


def test_the_horizon_is_the_mark_everything_committed_or_nothing() -> None:
    consumed = {"shop.items": 40, "shop.fresh": None}
    assert horizon("shop.items", consumed, [], next_pos=100) == 40
    assert horizon("shop.items", consumed, [], next_pos=30) == 29  # never past the checkpoint
    assert horizon("shop.fresh", consumed, [], next_pos=100) == 0  # consumed nothing yet
    assert horizon("shop.log", consumed, ["shop.log"], next_pos=100) == 99  # no target
    assert horizon("shop.other", consumed, ["shop.log"], next_pos=100) == 0  # unknown
    # A target's mark wins over "unread" (the caller may list a table twice).
    assert horizon("shop.items", consumed, ["shop.items"], next_pos=100) == 40


@st.composite
def table_segments(draw: st.DrawFn) -> list[SegmentFile]:
    """A table's segments as the engine writes them: ranges that never overlap, with gaps
    (other tables' positions), landing at non-decreasing times."""
    segments, last, mtime = [], 0, 1_000.0
    for _ in range(draw(st.integers(0, 14))):
        first = last + 1 + draw(st.integers(0, 3))
        last = first + draw(st.integers(0, 3))
        mtime += draw(st.sampled_from([0.0, 0.5, 7.0, 61.0, 1800.0]))
        size = draw(st.sampled_from([100, 5_000, 2 * 1024 * 1024, 10 * 1024 * 1024]))
        segments.append(SegmentFile(first, last, segment_name(first, last), size,
                                    mtime))
    return segments


@settings(max_examples=400, deadline=None)
@given(segments=table_segments(), data=st.data())
def test_nothing_at_or_above_a_mark_nor_of_an_unconsumed_table_is_deleted_or_compacted(
        segments: list[SegmentFile], data: st.DataObject) -> None:
    top = max((s.last_pos for s in segments), default=0)
    next_pos = data.draw(st.integers(1, top + 3))
    role = data.draw(st.sampled_from(["consumed", "unread", "unknown"]))
    mark = data.draw(st.none() | st.integers(0, top + 3))
    consumed = {"shop.items": mark} if role == "consumed" else {}
    unread = ["shop.items"] if role == "unread" else []
    retention_seconds = data.draw(st.sampled_from([0.0, 60.0, HOUR]))
    now = data.draw(st.floats(1_000.0, 30_000.0))
    # (a rename record has a position of its own: never inside a segment's range)
    breaks = [b for b in data.draw(st.lists(st.integers(0, top + 3), max_size=3))
              if not any(s.first_pos <= b <= s.last_pos for s in segments)]
    free = horizon("shop.items", consumed, unread, next_pos)

    expired = expired_segments(segments, free, next_pos, retention_seconds, now)
    left = [s for s in segments if s not in expired]
    runs = compaction_runs(left, free, breaks, now)
    touched = set(expired) | {s for run in runs for s in run}
    for segment in touched:
        assert segment.last_pos < next_pos  # committed
        if role == "consumed":
            assert mark is not None and segment.last_pos <= mark
        assert role != "unknown"
    committed = [s for s in segments if s.last_pos < next_pos]
    if committed:
        assert max(committed, key=lambda s: s.last_pos) not in expired
    assert all(now - s.mtime >= retention_seconds for s in expired)
    ordered = sorted(left)
    for run in runs:
        assert len(run) >= 2
        start = ordered.index(run[0])
        assert ordered[start:start + len(run)] == run  # consecutive: nothing left inside
        assert len({int(s.mtime // COMPACTION_WINDOW_SECONDS) for s in run}) == 1
        assert (int(run[0].mtime // COMPACTION_WINDOW_SECONDS) + 1) * \
            COMPACTION_WINDOW_SECONDS <= now  # a closed window
        assert not any(run[0].first_pos < b < run[-1].last_pos for b in breaks)
        assert all(s.size < retention.SMALL_SEGMENT_BYTES for s in run)


@dataclasses.dataclass
class _Simulated:
    """A table's changelog in memory: segment -> the positions it holds (duplicates allowed,
    as a killed compaction leaves them)."""

    files: dict[SegmentFile, frozenset[int]]
    next_pos: int = 1
    mark: int | None = None
    clock: float = 10_000.0

    def land(self, count: int) -> None:
        """One flush: a segment of ``count`` records, and the checkpoint past it."""
        first = self.next_pos + 1  # (another table's record between flushes)
        segment = SegmentFile(first, first + count - 1, "", 100, self.clock)
        self.files[segment] = frozenset(range(first, first + count))
        self.next_pos = first + count

    def operations(self, consumed: dict[str, int | None], unread: list[str],
                   retention_seconds: float) -> list[tuple[str, SegmentFile, frozenset[int]]]:
        """The sweep's steps for this table, as ``retention._sweep_table`` takes them."""
        steps: list[tuple[str, SegmentFile, frozenset[int]]] = []
        listed = list(self.files)
        for segment in covered_segments(listed):
            steps.append(("delete", segment, frozenset()))
        left = [s for s in listed if s not in covered_segments(listed)]
        free = horizon("shop.items", consumed, unread, self.next_pos)
        expired = expired_segments(left, free, self.next_pos, retention_seconds, self.clock)
        steps += [("delete", s, frozenset()) for s in expired]
        left = [s for s in left if s not in expired]
        for run in compaction_runs(left, free, [], self.clock):
            output = SegmentFile(run[0].first_pos, run[-1].last_pos, "", sum(s.size for s in run),
                                 max(s.mtime for s in run))
            steps.append(("write", output, frozenset().union(*(self.files[s] for s in run))))
            steps += [("delete", s, frozenset()) for s in run]
        return steps

    def reader_view(self) -> Counter[int]:
        """What a reader after the mark reads (``lake.changelog.TableChangelog.segments``' selection)."""
        after = self.mark
        view: Counter[int] = Counter()
        for segment, positions in self.files.items():
            if (after is None or segment.last_pos > after) and segment.first_pos < self.next_pos:
                view.update(p for p in positions if (after is None or p > after)
                            and p < self.next_pos)
        return view


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_sequence_of_flushes_marks_and_killed_sweeps_keeps_what_a_reader_needs(
        data: st.DataObject) -> None:
    table = _Simulated({})
    landed: set[int] = set()
    role = data.draw(st.sampled_from(["consumed", "unread"]))
    for _ in range(data.draw(st.integers(1, 12))):
        for _ in range(data.draw(st.integers(0, 6))):
            table.land(data.draw(st.integers(1, 4)))
            table.clock += data.draw(st.sampled_from([0.5, 20.0, 70.0]))
        landed = {p for positions in table.files.values() for p in positions
                  if p < table.next_pos}
        if role == "consumed" and data.draw(st.booleans()):
            low = table.mark or 0
            table.mark = data.draw(st.integers(low, max(low, table.next_pos - 1)))
        consumed = {"shop.items": table.mark} if role == "consumed" else {}
        unread = ["shop.items"] if role == "unread" else []
        steps = table.operations(consumed, unread, data.draw(st.sampled_from([0.0, 100.0])))
        killed_after = data.draw(st.integers(0, len(steps)))  # kill -9 after this many
        for kind, segment, positions in steps[:killed_after]:
            if kind == "write":
                table.files[segment] = positions
            else:
                table.files.pop(segment, None)
        # Whatever a reader still needs is there, exactly once.
        if role == "consumed":
            wanted = {p for p in landed if table.mark is None or p > table.mark}
            assert table.reader_view() == Counter(wanted)
        committed = [s for s in table.files if s.last_pos < table.next_pos]
        if landed:
            assert max(s.last_pos for s in committed) == max(landed)  # the newest stays
        table.clock += data.draw(st.sampled_from([1.0, 65.0]))
    # A sweep that runs to its end leaves no duplicate.
    consumed = {"shop.items": table.mark} if role == "consumed" else {}
    for kind, segment, positions in table.operations(
            consumed, ["shop.items"] if role == "unread" else [], 100.0):
        if kind == "write":
            table.files[segment] = positions
        else:
            table.files.pop(segment, None)
    assert covered_segments(list(table.files)) == []
    held = Counter(p for positions in table.files.values() for p in positions)
    assert max(held.values(), default=1) == 1


def test_covered_segments_are_the_inputs_a_killed_compaction_left() -> None:
    def seg(first: int, last: int) -> SegmentFile:
        return SegmentFile(first, last, segment_name(first, last))

    output, inputs = seg(1, 9), [seg(1, 3), seg(5, 6), seg(8, 9)]
    assert sorted(covered_segments([*inputs, output, seg(11, 12)])) == inputs
    assert covered_segments([seg(1, 3), seg(4, 6)]) == []  # the engine's: never overlapping


def test_compaction_never_spans_a_column_rename_and_waits_for_the_window_to_close() -> None:
    window = COMPACTION_WINDOW_SECONDS
    segments = [SegmentFile(p, p, "", 10, 10 * window + p) for p in (1, 2, 3, 5, 6)]
    assert compaction_runs(segments, 6, [4], now=11 * window) == [segments[:3], segments[3:]]
    assert compaction_runs(segments, 6, [4], now=11 * window - 1) == []  # still open
    assert compaction_runs(segments, 2, [], now=11 * window) == [segments[:2]]  # the horizon


# ---- snapshot chunks: rules, and that they read the snapshot protocol's own layout --------------


def test_chunk_rules_by_session_state() -> None:
    files = ["00000000.json", "00000000.arrow", "00000001.json", "00000001.arrow",
             "00000002.json", "00000002.parquet", "reader.state"]
    open_ = EngineSession("s1", SessionState.OPEN, frozenset({0, 1}))
    # The engine's session: decided chunks' rows go at once, manifests stay.
    assert chunk_deletions("s1", files, open_, "s1", 0.0) == (
        ["00000000.arrow", "00000001.arrow"], False)
    # Ended, and quiet: everything, manifests first.
    done = dataclasses.replace(open_, state=SessionState.DONE)
    doomed, whole = chunk_deletions("s1", files, done, "s1", 1e9)
    assert whole and doomed[:3] == ["00000000.json", "00000001.json", "00000002.json"]
    assert set(doomed) == set(files)
    # Ended but not quiet yet: only what the engine decided.
    assert chunk_deletions("s1", files, done, "s1", 5.0)[1] is False
    # Replaced: the checkpoint and the request both name another session.
    assert chunk_deletions("s0", files, open_, "s1", 1e9)[1] is True
    # Requested and not acknowledged yet: kept whole.
    assert chunk_deletions("s2", files, open_, "s2", 1e9) == ([], False)
    assert chunk_deletions("s2", files, None, "s2", 1e9) == ([], False)


def test_the_rules_read_the_snapshot_protocols_layout_and_session_record(tmp_path: Path) -> None:
    landing = LandingZone(str(tmp_path), "demo")
    assert protocol.chunk_parts("shop", "items", "s1") == (
        SNAPSHOTS_DIR, "shop", "items", SNAPSHOT_CHUNKS_DIR, "s1")
    assert protocol.CHUNK_ROWS_SUFFIX == ".arrow"
    assert not SnapshotSession("t", "s", SessionState.DONE, "", 1, "", []).tracked
    session = SnapshotSession("shop.items", "s1", SessionState.OPEN, "0-1-1", 5, "0-1-1",
                              ["id"], committed=[0, 2], rejected={"1": "no"})
    checkpoint = Checkpoint("demo", "mariadb", extra={SNAPSHOTS_CHECKPOINT_KEY: {
        "shop.items": dataclasses.asdict(session)}})
    assert engine_session(checkpoint, "shop.items") == EngineSession(
        "s1", SessionState.OPEN, frozenset({0, 1, 2}))
    assert engine_session(checkpoint, "shop.other") is None
    # Retention reads the record with the engine's parser: a session ends for both at once,
    # and a record the engine would not read is not taken as a live session either.
    for state in SessionState:
        record = dataclasses.asdict(dataclasses.replace(session, state=state))
        checkpoint.extra[SNAPSHOTS_CHECKPOINT_KEY]["shop.items"] = record
        read = engine_session(checkpoint, "shop.items")
        assert read is not None and read.state is state
        assert read.ended == (not protocol.read_session_state(checkpoint, "shop.items").tracked)
        assert read.ended == (state not in (SessionState.OPEN, SessionState.PAUSED))
    checkpoint.extra[SNAPSHOTS_CHECKPOINT_KEY]["shop.items"]["state"] = "finished"
    with pytest.raises(ValueError, match="snapshot session of shop.items"):
        engine_session(checkpoint, "shop.items")
    manifest = _write_chunk(landing, "s1", 3, [(7, "x")])
    assert sorted(p.name for p in manifest.parent.iterdir()) == ["00000003.arrow",
                                                                 "00000003.json"]


def _write_chunk(landing: LandingZone, session_id: str, seq: int,
                 rows: list[tuple[Any, ...]]) -> Path:
    chunked = ChunkedTable(ITEMS, ChunkKey(("id",), (False,), "primary key"), None)
    gtids = parse_position("mariadb", "0-1-1")
    chunk = Chunk(table=chunked, rows=tuple(rows), range_low=None, range_high=None,
                  low_watermark=gtids, after=gtids, schema_fingerprint="f", resume_key=None,
                  complete=False)
    protocol.write_chunk(landing, chunk, session_id, seq, complete=False)
    return landing.root.joinpath(*protocol.chunk_parts("shop", "items", session_id),
                                 f"{seq:08d}.json")


def _sessions_checkpoint(landing: LandingZone, *sessions: SnapshotSession,
                         next_pos: int = 1) -> None:
    landing.write_checkpoint(Checkpoint("demo", "mariadb", "0-1-1", next_pos, extra={
        SNAPSHOTS_CHECKPOINT_KEY: {s.table_id: dataclasses.asdict(s) for s in sessions}}))


def test_the_session_a_request_names_is_read_by_the_request_parser(tmp_path: Path) -> None:
    landing = LandingZone(str(tmp_path), "demo")
    parts = protocol.request_parts("shop", "items")
    assert retention._requested_session(landing, *parts[1:3], "s1") is None  # (no request)
    protocol.write_request(landing, "shop", "items", SnapshotRequest(
        "s2", Action.OPEN, ("id",), None, 10))
    assert retention._requested_session(landing, *parts[1:3], "s1") == "s2"
    landing.root.joinpath(*parts).write_text('{"session_id": "s2", "act')  # a broken hand edit
    assert retention._requested_session(landing, *parts[1:3], "s1") == "s1"


def test_sweep_deletes_decided_chunk_rows_and_finished_sessions_and_the_engine_still_decides(
        tmp_path: Path) -> None:
    landing = LandingZone(str(tmp_path), "demo")
    for seq in range(4):
        _write_chunk(landing, "s1", seq, [(seq, "x")])
    _write_chunk(landing, "old", 0, [(1, "x")])
    protocol.write_request(landing, "shop", "items", SnapshotRequest(
        "s1", Action.OPEN, ("id",), None, 10))
    session = SnapshotSession("shop.items", "s1", SessionState.OPEN, "0-1-1", 1, "0-1-1",
                              ["id"], committed=[0, 1], rejected={"2": "re-read"})
    _sessions_checkpoint(landing, session)

    report = sweep(landing, {}, [], HOUR)
    chunks = landing.root.joinpath(*protocol.chunk_parts("shop", "items", "s1"))
    assert sorted(p.name for p in chunks.iterdir()) == [
        "00000000.json", "00000001.json", "00000002.json", "00000003.arrow", "00000003.json"]
    assert (chunks.parent / "old").is_dir()  # replaced, but changed moments ago
    assert report.deleted_files[retention.CHUNKS] == 3
    # The engine, restarted from this checkpoint, decides only chunk 3, and reads its rows.
    coordinator = SnapshotCoordinator(landing, "mariadb", None, SimpleNamespace(next_pos=1),
                                      SimpleNamespace(schemas={}))
    coordinator.on_start(landing.read_checkpoint().extra[SNAPSHOTS_CHECKPOINT_KEY],
                         parse_position("mariadb", "0-1-1"))
    pending = coordinator._pending(coordinator.sessions["shop.items"])
    assert pending == [3]
    assert protocol.read_chunk_rows(landing, "shop", "items", "s1", 3).num_rows == 1

    later = time.time() + retention.FINISHED_SESSION_GRACE_SECONDS + 1
    sweep(landing, {}, [], HOUR, now=later)
    assert not (chunks.parent / "old").exists()
    assert chunks.is_dir()  # still the engine's open session
    _sessions_checkpoint(landing, dataclasses.replace(session, state=SessionState.DONE,
                                                      committed=[0, 1, 3]))
    sweep(landing, {}, [], HOUR, now=later)
    assert not chunks.exists()
    assert (chunks.parent.parent / "request.json").exists()  # the request stays


# ---- the sweep on a landing zone written here ----------------------------------------------------


def _segment(landing: LandingZone, schema: TableSchema, positions: list[int], mtime: float,
             op: str = "c", snapshot: bool = False) -> SegmentFile:
    """One segment as the engine writes it (``LandingZone.write_segment``), landed at
    ``mtime``; the first user column holds the position (a number, or ``line <pos>``)."""
    arrow_schema = segment_schema(schema)
    if snapshot:
        for field in snapshot_arrow_fields(schema):
            arrow_schema = arrow_schema.append(field)
    data: dict[str, list[Any]] = {name: [None] * len(positions) for name in arrow_schema.names}
    data.update({POS: positions, GTID: [f"0-1-{p}" for p in positions],
                 OP: [op] * len(positions), TS_MS: [1_700_000_000_000] * len(positions)})
    user = schema.columns[0]
    data[user.name] = [p if user.kind == "int" else f"line {p}" for p in positions]
    if snapshot:
        data[THRESHOLD] = positions
    table = pa.Table.from_pydict(data, schema=arrow_schema)
    path = landing.write_segment(schema, table, positions[0], positions[-1])
    os.utime(path, (mtime, mtime))
    return SegmentFile(positions[0], positions[-1], path.name, path.stat().st_size, mtime)


def _records(landing: LandingZone, schema: TableSchema) -> list[tuple[Any, ...]]:
    """Every record in the table's segment files (duplicates included), by position."""
    out = []
    for _, _, path in landing.segments(schema.database, schema.table):
        out += [tuple(r.values()) for r in pq.read_table(path).to_pylist()]
    return sorted(out, key=lambda r: r[0])


def _view(landing: LandingZone, schema: TableSchema, after: int | None) -> list[int]:
    """The positions the lake's reader finds after ``after`` (``lake.changelog``)."""
    before = landing.read_checkpoint().next_pos
    out = []
    for segment in TableChangelog.open(str(landing.root.parent), landing.server_name,
                                       schema.database, schema.table).segments(after, before):
        positions = pq.read_table(segment.path, columns=[POS]).column(0).to_pylist()
        out += [p for p in positions if (after is None or p > after) and p < before]
    return sorted(out)


def test_sweep_deletes_consumed_old_segments_keeps_the_rest_and_reports(tmp_path: Path) -> None:
    landing = LandingZone(str(tmp_path), "demo")
    now = time.time()
    old = now - 2 * HOUR
    for position in range(1, 40, 2):  # items: 1, 3, ..., 39 (one segment each)
        _segment(landing, ITEMS, [position], old + position)
    for position in range(2, 40, 2):  # log (no target): 2, 4, ..., 38
        _segment(landing, LOG, [position], old + position)
    _segment(landing, ITEMS, [41], old)  # past the checkpoint: the flush being written
    other = TableSchema("shop", "other", ITEMS.columns, ("id",))
    _segment(landing, other, [3], old)  # no target known: kept
    _segment(landing, ITEMS, [43], now)  # young
    landing.write_checkpoint(Checkpoint("demo", "mariadb", "0-1-1", 40))

    report = sweep(landing, {"shop.items": 21}, ["shop.log"], HOUR, compact=False)
    assert [s[0] for s in landing.segments("shop", "items")] == \
        [*range(23, 40, 2), 41, 43]  # <= 21 gone
    assert [s[0] for s in landing.segments("shop", "log")] == [38]  # the newest stays
    assert len(landing.segments("shop", "other")) == 1
    assert report.deleted_files[retention.SEGMENTS] == 11 + 18
    assert report.kept_files[retention.SEGMENTS] == 11 + 1 + 1
    assert report.metadata()["deleted_segments_files"] == 29
    assert "deleted 29 files" in str(report)
    assert _view(landing, ITEMS, 21) == list(range(23, 40, 2))
    # A target that consumed nothing keeps all; so does a segment not past the mark's age.
    before = len(landing.segments("shop", "items"))
    sweep(landing, {"shop.items": None}, [], 0.0, compact=False)
    assert len(landing.segments("shop", "items")) == before


def test_a_temporary_file_goes_only_when_old(tmp_path: Path) -> None:
    landing = LandingZone(str(tmp_path), "demo")
    _segment(landing, ITEMS, [1], time.time())
    landing.write_checkpoint(Checkpoint("demo", "mariadb", "0-1-1", 2))
    directory = landing.table_dir("shop", "items")
    fresh, stale = directory / ".x.parquet.tmp-1-2", directory / ".y.parquet.tmp-1-2"
    fresh.write_bytes(b"being written")
    stale.write_bytes(b"left by a dead writer")
    os.utime(stale, (time.time() - 2 * HOUR,) * 2)
    report = sweep(landing, {}, [], HOUR)
    assert fresh.exists() and not stale.exists()
    assert report.deleted_files[retention.TEMPORARY] == 1


def test_compaction_rewrites_small_consumed_segments_exactly(tmp_path: Path) -> None:
    landing = LandingZone(str(tmp_path), "demo")
    window = COMPACTION_WINDOW_SECONDS
    start = (time.time() // window - 10) * window  # ten windows ago, window-aligned
    positions = iter(range(1, 10_000))
    for minute in range(3):
        for _ in range(8):
            _segment(landing, ITEMS, [next(positions), next(positions)],
                     start + minute * window + 1)
    # Minute 3: two segments, a column rename, two more, two with snapshot records.
    plain = [_segment(landing, ITEMS, [next(positions)], start + 3 * window + 1)
             for _ in range(2)]
    rename = next(positions)
    directory = landing.root.joinpath(*column_renames_parts("shop", "items"))
    directory.mkdir(parents=True)
    (directory / column_renames_name(rename)).write_text("{}")
    plain += [_segment(landing, ITEMS, [next(positions)], start + 3 * window + 2)
              for _ in range(2)]
    for _ in range(2):
        _segment(landing, ITEMS, [next(positions)], start + 3 * window + 3, op="a",
                 snapshot=True)
    last = next(positions)
    _segment(landing, ITEMS, [last], time.time())  # this window: not yet
    landing.write_checkpoint(Checkpoint("demo", "mariadb", "0-1-1", last + 1))
    before = _records(landing, ITEMS)
    assert len(landing.segments("shop", "items")) == 31

    report = sweep(landing, {"shop.items": last}, [], 10 * HOUR)
    after = _records(landing, ITEMS)
    assert after == before  # every record, once, in order
    ranges = [(first, end) for first, end, _ in landing.segments("shop", "items")]
    assert ranges == [(1, 16), (17, 32), (33, 48), (49, 50), (52, 53), (54, 55), (56, 56)]
    assert report.compacted_segments == 8 * 3 + 2 + 2 + 2 and report.compacted_into == 6
    assert _view(landing, ITEMS, 10) == list(range(11, 51)) + list(range(52, 57))
    # The output keeps the age of its newest input, and snapshot records their columns.
    first_minute = landing.segments("shop", "items")[0][2]
    assert first_minute.stat().st_mtime == pytest.approx(start + 1)
    assert THRESHOLD in pq.read_schema(landing.segments("shop", "items")[5][2]).names
    assert THRESHOLD not in pq.read_schema(landing.segments("shop", "items")[4][2]).names
    # Nothing more to do: a window compacted once stays as it is.
    again = sweep(landing, {"shop.items": last}, [], 10 * HOUR)
    assert again.compacted_segments == 0 and _records(landing, ITEMS) == before


def test_unconsumed_segments_are_never_compacted(tmp_path: Path) -> None:
    landing = LandingZone(str(tmp_path), "demo")
    start = time.time() - 10 * COMPACTION_WINDOW_SECONDS
    for position in range(1, 11):
        _segment(landing, ITEMS, [position], start)
    landing.write_checkpoint(Checkpoint("demo", "mariadb", "0-1-1", 11))
    sweep(landing, {"shop.items": 4}, [], HOUR)
    assert [(a, b) for a, b, _ in landing.segments("shop", "items")] == \
        [(1, 4), *((p, p) for p in range(5, 11))]


class Killed(BaseException):
    """kill -9 in the middle of a sweep (nothing of it runs after this)."""


def test_a_sweep_killed_after_any_of_its_deletions_leaves_what_readers_need(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every prefix of a sweep's deletions and writes is a valid zone: killed after each one in
    turn, the lake's reader still reads every record after the mark exactly once, and the next
    sweep finishes the work, leaving no duplicate anywhere."""
    window = COMPACTION_WINDOW_SECONDS
    start = (time.time() // window - 30) * window

    def build(root: Path) -> tuple[LandingZone, int]:
        landing = LandingZone(str(root), "demo")
        position = 0
        for minute in range(4):
            for _ in range(5):
                position += 2
                _segment(landing, ITEMS, [position - 1, position], start + minute * window)
                _segment(landing, LOG, [position + 100], start + minute * window)
        landing.write_checkpoint(Checkpoint("demo", "mariadb", "0-1-1", 1000))
        return landing, position

    landing, top = build(tmp_path / "reference")
    truth = _records(landing, ITEMS)
    mark = top // 2
    # Ages at ``now``: the first minute's segments past the retention, the others compacted.
    consumed, unread, keep = {"shop.items": mark}, ["shop.log"], 30 * window
    now = start + 30.5 * window
    real_unlink, real_output = Path.unlink, LocalFileStore.atomic_output
    steps = [0]
    kill_at = [None]

    def step() -> None:
        steps[0] += 1
        if kill_at[0] is not None and steps[0] > kill_at[0]:
            raise Killed

    def dying_unlink(path: Path, missing_ok: bool = False) -> None:
        step()
        real_unlink(path, missing_ok=missing_ok)

    @contextlib.contextmanager
    def dying_output(store: LocalFileStore, *parts: str, **options: Any) -> Iterator[Any]:
        step()
        with real_output(store, *parts, **options) as sink:
            yield sink

    monkeypatch.setattr(Path, "unlink", dying_unlink)
    monkeypatch.setattr(LocalFileStore, "atomic_output", dying_output)
    report = sweep(landing, consumed, unread, keep, now)  # counts its deletions and writes
    total = steps[0]
    assert total > 20 and report.compacted_into and report.deleted_files[retention.SEGMENTS]

    for kill in range(total):
        landing, _ = build(tmp_path / f"killed-{kill}")
        steps[0], kill_at[0] = 0, kill
        with contextlib.suppress(Killed):
            sweep(landing, consumed, unread, keep, now)
        kill_at[0] = None
        assert _view(landing, ITEMS, mark) == [r[0] for r in truth if r[0] > mark], kill
        assert landing.segments("shop", "log")[-1][1] == top + 100  # the newest stays
        # The next sweep (a new process) completes it: no record twice, none lost above.
        sweep(landing, consumed, unread, keep, now)
        records = _records(landing, ITEMS)
        assert len({r[0] for r in records}) == len(records), kill
        assert [r for r in records if r[0] > mark] == [r for r in truth if r[0] > mark]
        logged = [(a, b) for a, b, _ in landing.segments("shop", "log")]
        assert covered_segments([SegmentFile(a, b, "") for a, b in logged]) == []


def test_one_sweep_at_a_time(tmp_path: Path) -> None:
    import fcntl

    landing = LandingZone(str(tmp_path), "demo")
    _segment(landing, ITEMS, [1], 0.0)
    _segment(landing, ITEMS, [2], 0.0)
    landing.write_checkpoint(Checkpoint("demo", "mariadb", "0-1-1", 3))
    with open(landing.root / retention.SWEEP_LOCK_FILE, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        report = sweep(landing, {"shop.items": 2}, [], 0.0)
    assert report.skipped and str(report).startswith("skipped")
    assert len(landing.segments("shop", "items")) == 2
    assert sweep(landing, {"shop.items": 2}, [], 0.0).deleted_files[retention.SEGMENTS] == 1


def test_spill_files_dropped_are_pending_until_the_next_checkpoint(tmp_path: Path) -> None:
    from cdc_platform.capture.changes.spill import SpillStore, records_table

    store = SpillStore(tmp_path / "spill")
    part = store.write_table(ITEMS, records_table(ITEMS, ["c"], [(1, "x")]))
    assert not store.removal_pending
    part.remove()  # a transaction discarded (a reconnect) or landed
    assert store.removal_pending and part.path.exists()
    assert store.take_removed() == [part.path] and not store.removal_pending


# ---- how many files a day of streaming leaves -----------------------------------------------------


def _simulate(hours: float, flush_seconds: float, compact: bool,
              retention_seconds: float = HOUR) -> int:
    """One busy table landing a segment every flush, its target consuming 2 s behind, a sweep
    every minute (as the lake applier runs it): the most segment files present at once."""
    files: list[SegmentFile] = []
    most, position, clock = 0, 0, 0.0
    next_sweep = 60.0
    while clock < hours * HOUR:
        clock += flush_seconds
        position += 10
        files.append(SegmentFile(position - 9, position, "", 20_000, clock))
        if clock >= next_sweep:
            next_sweep += 60.0
            mark = position - int(2.0 / flush_seconds) * 10
            expired = set(expired_segments(files, mark, position + 1, retention_seconds, clock))
            files = [s for s in files if s not in expired]
            if compact:
                for run in compaction_runs(files, mark, [], clock):
                    merged = SegmentFile(run[0].first_pos, run[-1].last_pos, "",
                                         sum(s.size for s in run), max(s.mtime for s in run))
                    files = sorted([s for s in files if s not in run] + [merged])
        most = max(most, len(files))
    return most


def test_a_day_of_streaming_keeps_a_bounded_number_of_files() -> None:
    """The measurement behind compaction (docs/landing-zone.md, "Retention"). Steady state is
    reached after the retention plus one window: three hours stand for a day."""
    without = {f: _simulate(3, f, compact=False) for f in (0.5, 1.0)}
    with_ = {f: _simulate(3, f, compact=True) for f in (0.5, 1.0)}
    print(f"\nsegments of one busy table at once, retention 1 h: without compaction {without}, "
          f"with {with_}; written per day: {86_400 / 0.5:,.0f} at 0.5 s flushes")
    assert 7_200 <= without[0.5] <= 7_400 and 3_600 <= without[1.0] <= 3_700
    assert with_[0.5] <= 200 and with_[1.0] <= 130


# ---- the real engine, snapshot reader and lake, and a sweeper killed with kill -9 ------------


@contextlib.contextmanager
def _streaming(env: Any) -> Iterator[Any]:
    """The capture engine in a thread, as the stream_changes job runs it."""
    engine = env.engine()
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            engine.run(stop)
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append(error)

    thread = threading.Thread(target=run, name="test-engine", daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        stop.set()
        thread.join(60)
    if errors:
        raise errors[0]


class _Writes:
    """Small transactions on ``items`` (keyed) and ``log`` (no key: no target) in a thread."""

    def __init__(self, env: Any, seed: int) -> None:
        self.env, self.rng = env, random.Random(seed)
        self.stop, self.count = threading.Event(), 0
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Writes:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.errors, self.errors

    def _run(self) -> None:
        try:
            with self.env.mariadb.root_connect(database=self.env.db) as conn, \
                    conn.cursor() as cur:
                while not self.stop.is_set():
                    key = self.rng.randint(1, 300)
                    # (no column named: a RENAME COLUMN may come between two writes)
                    cur.execute("REPLACE INTO items VALUES (%s, %s)", (key, f"v{self.count}"))
                    if self.rng.random() < 0.2:
                        cur.execute("DELETE FROM items WHERE id = %s", (key + 1,))
                    cur.execute("INSERT INTO log VALUES (%s)", (f"line {self.count}",))
                    conn.commit()
                    self.count += 1
                    time.sleep(0.01)
        except BaseException as error:  # noqa: BLE001 - raised on exit
            self.errors.append(error)


SWEEPER = """
import json, random, sys, time
from cdc_platform.capture.landing import retention
from cdc_platform.capture.landing.zone import LandingZone
landing = LandingZone(sys.argv[1], sys.argv[2])
consumed, unread = json.loads(sys.argv[3]), json.loads(sys.argv[4])
print("ready", flush=True)
while True:
    retention.sweep(landing, consumed, unread, random.choice([0.0, 36000.0]),
                    now=time.time() + 600)
"""


def _items_records(landing: LandingZone, db: str, after: int,
                   before: int) -> Counter[tuple[Any, ...]]:
    """(position, op, id) of the records the lake's reader finds in (after, before)."""
    found: Counter[tuple[Any, ...]] = Counter()
    for segment in TableChangelog.open(str(landing.root.parent), landing.server_name, db,
                                       "items").segments(after, before):
        table = pq.read_table(segment.path, columns=[POS, OP, "id"])
        found.update((p, o, k) for p, o, k in zip(*(c.to_pylist() for c in table.columns),
                                                  strict=True) if after < p < before)
    return found


def _half_done(landing: LandingZone, db: str, table: str, pid: int) -> bool:
    """Whether the sweep process ``pid``, killed, left a compaction half done: its output and
    some of its inputs, or its output's temporary file."""
    listed = [SegmentFile(a, b, "") for a, b, _ in landing.segments(db, table)]
    directory = landing.table_dir(db, table)
    return bool(covered_segments(listed)) or any(
        f".tmp-{pid}-" in p.name for p in directory.iterdir())


@pytest.mark.integration
@pytest.mark.cdc_config(capture={"flush_interval_seconds": 0.05})
def test_sweeps_killed_at_random_moments_never_cost_the_lake_or_the_engine_a_record(
        cdc_env: Any, spark: Any) -> None:
    from cdc_platform_tests.capture.snapshot.reading.live_engine import snapshot_reader

    env = cdc_env
    env.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40))",
                "CREATE TABLE log (line VARCHAR(40))")
    env.execute("INSERT INTO items SELECT seq, 'seed' FROM seq_1_to_200")
    with _streaming(env), _Writes(env, seed=1):
        time.sleep(1.5)
        # A snapshot (its chunk files kept, as a stopped or killed reader leaves them) and a
        # column rename, both below the lake's marks to come.
        assert snapshot_reader(env, "items", chunk_size=40, keep_chunks=True).run().status \
            == "done"
        env.execute("ALTER TABLE items RENAME COLUMN name TO label")
        time.sleep(1.0)
    landing = env.landing
    chunks = landing.root.joinpath(*snapshot_parts(env.db, "items"), SNAPSHOT_CHUNKS_DIR)
    assert any(chunks.iterdir())
    assert len(landing.segments(env.db, "items")) > 30  # many small segments
    unread = [names.table_id(env.db, "log")]
    rng = random.Random(7)
    kills = half_done = 0
    with _Writes(env, seed=2):
        for round_ in range(3):
            with _streaming(env):  # the engine restarts every round
                time.sleep(0.5)
                env.materialise(spark, "items")  # the lake reads from its mark on
                mark = env.target(spark, "items").base_and_mark()[1].consumed_pos
                consumed = {names.table_id(env.db, "items"): mark}
                truth = _items_records(landing, env.db, mark,
                                       landing.read_checkpoint().next_pos)
                for _ in range(8):
                    sweeper = subprocess.Popen(
                        [sys.executable, "-c", SWEEPER, str(landing.root.parent),
                         landing.server_name, json.dumps(consumed), json.dumps(unread)],
                        stdout=subprocess.PIPE)
                    assert sweeper.stdout is not None and sweeper.stdout.readline() == b"ready\n"
                    time.sleep(rng.uniform(0.0, 0.25))
                    os.kill(sweeper.pid, signal.SIGKILL)
                    sweeper.wait()
                    kills += 1
                    half_done += any(_half_done(landing, env.db, t, sweeper.pid)
                                     for t in ("items", "log"))
                    found = _items_records(landing, env.db, mark,
                                           landing.read_checkpoint().next_pos)
                    assert max(found.values(), default=1) == 1, (round_, "a record twice")
                    assert not truth - found, (round_, "a record lost after the mark")
    assert kills == 24
    print(f"\n{kills} sweeps killed, {half_done} in the middle of a compaction")
    # A last sweep to its end; the engine lands the rest; the lake merges and equals the source.
    report = sweep(landing, consumed, unread, 0.0, now=time.time() + 600)
    assert not report.errors, report.errors
    assert report.deleted_files[retention.SEGMENTS] > 0
    # Of what the lake consumed, at most the newest segment is left.
    assert len([s for s in landing.segments(env.db, "items") if s[1] <= mark]) <= 1
    env.catch_up()
    assert not chunks.exists() or not any(chunks.iterdir())
    records = _items_records(landing, env.db, 0, landing.read_checkpoint().next_pos)
    assert max(records.values()) == 1  # no duplicate left anywhere
    env.materialise(spark, "items")
    result = env.reconcile(spark, "items")
    assert result.ok, result.to_metadata()
    assert len(landing.segments(env.db, "log")) >= 1  # the newest of a table without target


@pytest.mark.integration
@pytest.mark.cdc_config(capture={"transaction_memory_bytes": 20_000, "flush_max_rows": 2_000})
def test_spill_files_of_a_killed_engine_go_when_it_restarts_and_sweeps_never_touch_them(
        cdc_env: Any) -> None:
    env = cdc_env
    env.execute("CREATE TABLE big (id INT PRIMARY KEY, pad VARCHAR(200))")
    env.execute("INSERT INTO big SELECT seq, REPEAT('x', 200) FROM seq_1_to_60000")
    spill = env.landing.root / "spill"
    left = []
    for _ in range(5):  # kill the engine while it holds the transaction in spill files
        engine = subprocess.Popen(
            [sys.executable, "-m", "cdc_platform", "stream", "--config",
             str(env.write_config())], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (spill.is_dir() and any(spill.iterdir())):
            time.sleep(0.005)
        os.kill(engine.pid, signal.SIGKILL)
        engine.wait()
        left = list(spill.iterdir()) if spill.is_dir() else []
        if left:
            break
    assert left, "the engine never spilled"
    report = sweep(env.landing, {}, [names.table_id(env.db, "big")], 0.0,
                   now=time.time() + 10 * HOUR)
    assert set(spill.iterdir()) == set(left)  # a sweep cannot tell an orphan from an open one
    assert report.kept_files[retention.SPILL] == len(left)
    env.catch_up()  # the engine's start removes them and replays the transaction
    assert not any(spill.iterdir())
    landed = sum(pq.read_metadata(p).num_rows for _, _, p in env.landing.segments(env.db, "big"))
    assert landed == 60_000


# ---- publishers (change topics): nothing is swept before it is published ----------------------


@given(marks=st.dictionaries(st.sampled_from(["shop.items", "shop.log", "shop.other"]),
                             st.integers(0, 120)),
       unpublished=st.sets(st.sampled_from(["shop.items", "shop.log", "shop.other"])),
       consumed=st.integers(0, 120), next_pos=st.integers(1, 120),
       recorded=st.booleans())
def test_the_horizon_never_passes_what_a_required_publisher_published(
        marks: dict[str, int], unpublished: set[str], consumed: int, next_pos: int,
        recorded: bool) -> None:
    record = PublishedMarks(CHANGE_TOPICS, marks, frozenset(unpublished)) if recorded else None
    for table in ("shop.items", "shop.log", "shop.other"):
        held = publishers_hold({CHANGE_TOPICS: record}, table)
        free = horizon(table, {"shop.items": consumed}, ["shop.log"], next_pos, held)
        assert free <= horizon(table, {"shop.items": consumed}, ["shop.log"], next_pos)
        if record is None:
            assert free == 0  # a publisher that saved nothing yet holds every table whole
        elif table in marks:
            assert free <= marks[table]
        elif table in unpublished:
            assert held is None  # a table it does not publish waits only for its target
        else:
            assert free == 0  # not looked at yet: held whole
    # No publisher required: the horizon is the target's alone.
    assert publishers_hold({}, "shop.items") is None


def test_a_sweep_waits_for_the_publisher_and_ignores_one_not_required(tmp_path: Path) -> None:
    landing = LandingZone(str(tmp_path), "demo")
    old = time.time() - 2 * HOUR
    for position in range(1, 40, 2):
        _segment(landing, ITEMS, [position], old + position)
    landing.write_checkpoint(Checkpoint("demo", "mariadb", "0-1-1", 40))
    # Required but no record yet: nothing goes, whatever the target consumed.
    sweep(landing, {"shop.items": 39}, [], HOUR, compact=False, publishers=[CHANGE_TOPICS])
    assert len(landing.segments("shop", "items")) == 20
    assert landing.write_published(PublishedMarks(CHANGE_TOPICS, {"shop.items": 9}), None)
    sweep(landing, {"shop.items": 39}, [], HOUR, compact=False, publishers=[CHANGE_TOPICS])
    assert [s[0] for s in landing.segments("shop", "items")][0] == 11  # <= 9 published: gone
    # A record left by a publisher that is no longer required (change topics turned off)
    # holds nothing back.
    sweep(landing, {"shop.items": 39}, [], HOUR, compact=False)
    assert [s[0] for s in landing.segments("shop", "items")] == [39]


def test_the_publishers_record_is_replaced_only_from_the_version_read(tmp_path: Path) -> None:
    landing = LandingZone(str(tmp_path), "demo")
    first = landing.write_published(PublishedMarks(CHANGE_TOPICS, {"shop.items": 3}), None)
    assert first is not None
    # A second writer that read nothing (or an older version) cannot replace it.
    assert landing.write_published(PublishedMarks(CHANGE_TOPICS, {"shop.items": 5}), None) is None
    second = landing.write_published(PublishedMarks(CHANGE_TOPICS, {"shop.items": 5}), first)
    assert second is not None
    assert landing.write_published(PublishedMarks(CHANGE_TOPICS, {"shop.items": 7}), first) is None
    marks, version = landing.published_version(CHANGE_TOPICS)
    assert (dict(marks.through), version) == ({"shop.items": 5}, second)
