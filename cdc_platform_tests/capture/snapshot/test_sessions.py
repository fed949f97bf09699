"""The engine's session coordinator without a database: touched-key log pruning (bounded, and
still exact), chunks that cannot be landed, endless rejections, where schemas come from,
unreadable requests, and what an ended session leaves behind.

Chunks are real reader files (``write_chunk``) in a temporary landing zone; the engine the
coordinator is given at construction (its emitter and its schemas) is ``Engine``, which records
what the engine would land."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_platform.capture.gtid import MariadbPosition, parse_gtid
from cdc_platform.capture.landing.session_records import SnapshotRequest
from cdc_platform.capture.landing.zone import Checkpoint, LandingZone
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.snapshot import chunk_decisions, protocol, sessions
from cdc_platform.capture.snapshot.chunks import Chunk, ChunkedTable, ChunkKey, schema_fingerprint
from cdc_platform.capture.snapshot.commit_rule import TouchedKeyLog
from cdc_platform.capture.snapshot.protocol import request_parts, write_chunk, write_request
from cdc_platform.capture.snapshot.sessions import SnapshotCoordinator

SCHEMA = TableSchema("db", "t", (ColumnSpec("k", "int"), ColumnSpec("v", "int")), ("k",))
WIDER = TableSchema("db", "t", SCHEMA.columns + (ColumnSpec("note", "string"),), ("k",))
TABLE = ChunkedTable(SCHEMA, ChunkKey(("k",), (False,), "primary key"))


def _pos(seq: int) -> MariadbPosition:
    return MariadbPosition.parse(f"0-1-{seq}")


class Engine:
    """What the coordinator is given of the engine: its emitter (what it would land: (op, rows)
    per emit, with increasing positions) and its schemas (``read_schema``: the source's, when
    set; else the engine's as they are)."""

    def __init__(self, schemas: dict[str, TableSchema] | None = None,
                 fail_on: str | None = None) -> None:
        self.records: list[tuple[str, list[tuple[Any, ...]]]] = []
        self.next_pos = 1000
        self.fail_on = fail_on
        self.schemas = {"db.t": SCHEMA} if schemas is None else schemas
        self.read_schema: Callable[[str], TableSchema | None] | None = None

    def add_snapshot(self, schema: TableSchema, op: str, rows: Any, extra: Any) -> int:
        if op == self.fail_on:
            raise ValueError(f"records of op {op!r} do not fit {schema.table_id}")
        if isinstance(rows, pa.Table):
            rows = [tuple(r.values()) for r in rows.to_pylist()]
        self.records.append((op, list(rows)))
        first = self.next_pos
        self.next_pos += len(rows)
        return first

    def learn_table(self, table_id: str) -> TableSchema | None:
        if self.read_schema is None:
            return self.schemas.get(table_id)
        return self.read_schema(table_id)

    def rows(self) -> list[tuple[Any, ...]]:
        return [row for op, rows in self.records if op == "r" for row in rows]

    def landed_anew(self) -> Engine:
        """Forget what was landed so far (what a test checks next lands from here)."""
        self.records = []
        return self


def _coordinator(tmp_path: Path, schemas: dict[str, TableSchema] | None = None,
                 **options: Any) -> tuple[SnapshotCoordinator, LandingZone, Engine]:
    landing = LandingZone(str(tmp_path / "landing"), "demo")
    engine = Engine(schemas)
    coordinator = SnapshotCoordinator(landing, "mariadb", logging.getLogger(__name__), engine,
                                      engine, **options)
    write_request(landing, "db", "t", SnapshotRequest("s1", "open", ("k",), None, 10))
    return coordinator, landing, engine


def _publish(landing: LandingZone, seq: int, rows: tuple[tuple[Any, ...], ...], read_at: int,
             schema: TableSchema = SCHEMA, high: int | None = None,
             complete: bool = False) -> None:
    """A chunk as the reader writes it, read at source position ``0-1-<read_at>``."""
    table = ChunkedTable(schema, ChunkKey(("k",), (False,), "primary key"))
    chunk = Chunk(table, rows, None, None if high is None else (high,), _pos(read_at),
                  _pos(read_at), schema_fingerprint(schema), None, complete)
    write_chunk(landing, chunk, "s1", seq, complete)


def _session(coordinator: SnapshotCoordinator) -> dict[str, Any]:
    return coordinator.checkpoint_state(due=True)["db.t"]


def test_touched_key_log_stays_bounded_under_endless_writes(tmp_path: Path) -> None:
    coordinator, _, _ = _coordinator(tmp_path, max_logged_touches=100, min_generation_seconds=0)
    coordinator.on_tick(_pos(1))
    sizes = []
    for txn in range(2, 5002):  # a writer updating 1000 keys round and round
        coordinator.record_touch("db.t", (txn % 1000,), parse_gtid("mariadb", f"0-1-{txn}"), txn)
        if txn % 10 == 0:  # the engine ticks every few transactions
            coordinator.on_tick(_pos(txn))
            sizes.append(coordinator.logged_touches("db.t"))
    assert max(sizes) <= 100 + 10  # the bound plus one tick's writes, never the 5000 written
    # The horizon went to the checkpoint: a generation behind the engine, not at its position.
    horizon = MariadbPosition.parse(_session(coordinator)["horizon"])
    assert horizon.issuperset(_pos(4800)) and not horizon.issuperset(_pos(5000))


def test_pruning_rejects_only_chunks_read_before_the_previous_generation_and_stays_exact(
        tmp_path: Path) -> None:
    coordinator, landing, landed = _coordinator(tmp_path, max_logged_touches=1,
                                                min_generation_seconds=0)
    coordinator.on_tick(_pos(10))
    # Key 1 written at 0-1-11; the log prunes at 0-1-11 (generation mark), then key 2 at 0-1-12.
    coordinator.record_touch("db.t", (1,), parse_gtid("mariadb", "0-1-11"), 50)
    coordinator.on_tick(_pos(11))
    assert _session(coordinator)["horizon"] == "0-1-10"  # one generation: nothing dropped yet
    coordinator.record_touch("db.t", (2,), parse_gtid("mariadb", "0-1-12"), 51)
    # Both chunks were read before key 2's write. Pruning now moves the horizon to 0-1-11 and
    # drops key 1's touch: the chunk read at 0-1-10 could have used it, so it is rejected; the
    # one read at 0-1-11 commits, without key 2 (touched since its read view).
    _publish(landing, 0, ((1, 10), (2, 20)), read_at=10, high=2)
    _publish(landing, 1, ((1, 11), (2, 21)), read_at=11, high=2)
    coordinator.on_tick(_pos(12))
    session = _session(coordinator)
    assert session["horizon"] == "0-1-11" and coordinator.logged_touches("db.t") == 1
    assert "pruning horizon 0-1-11" in session["rejected"]["0"]
    assert session["committed"] == [1] and landed.rows() == [(1, 11)]


def test_a_chunk_that_cannot_be_landed_is_rejected_and_the_session_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    coordinator, landing, engine = _coordinator(tmp_path)
    coordinator.on_tick(_pos(10))
    _publish(landing, 0, ((1, 10),), read_at=10, high=1)
    engine.fail_on = "r"
    coordinator.on_tick(_pos(10))
    session = _session(coordinator)
    assert session["state"] == "open" and session["committed"] == []
    assert "chunk 0 of db.t could not be decided or landed (ValueError: records of op 'r' " \
           "do not fit db.t); re-select it" in session["rejected"]["0"]
    assert "chunk 0 of db.t could not be decided or landed" in caplog.text
    # The re-read lands.
    engine.fail_on = None
    landed = engine.landed_anew()
    _publish(landing, 1, ((1, 10),), read_at=10, high=1)
    coordinator.on_tick(_pos(10))
    assert _session(coordinator)["committed"] == [1] and landed.rows() == [(1, 10)]


def test_a_waiting_chunk_is_decided_from_its_manifest_and_its_rows_read_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the engine has not processed a chunk's ``after`` (a lagging engine, looking at
    its pending chunks every poll), the chunk's rows file is not read: only its commit
    reads it."""
    coordinator, landing, engine = _coordinator(tmp_path)
    coordinator.on_tick(_pos(10))
    _publish(landing, 0, ((1, 10), (2, 20)), read_at=15, high=2)
    opened: list[int] = []
    read_rows = chunk_decisions.read_chunk_rows

    def counting(landing: LandingZone, database: str, table: str, session_id: str,
                 seq: int) -> Any:
        opened.append(seq)
        return read_rows(landing, database, table, session_id, seq)

    monkeypatch.setattr(chunk_decisions, "read_chunk_rows", counting)
    for processed in range(10, 15):
        assert not coordinator.on_tick(_pos(processed))
    assert opened == [] and _session(coordinator)["committed"] == []
    landed = engine.landed_anew()
    coordinator.on_tick(_pos(15))
    assert _session(coordinator)["committed"] == [0] and landed.rows() == [(1, 10), (2, 20)]
    assert opened == [0]


def test_a_session_whose_chunks_are_always_rejected_is_stopped_with_the_reason(
        tmp_path: Path) -> None:
    """The engine's schema never matches the chunks: re-reading forever would only grow
    ``rejected``; after a few rejections in a row the session stops, naming the cause."""
    coordinator, landing, _ = _coordinator(tmp_path, {"db.t": WIDER}, max_rejections_in_a_row=3)
    coordinator.on_tick(_pos(10))
    for seq in range(5):
        _publish(landing, seq, ((1, 10),), read_at=10, high=1)
        coordinator.on_tick(_pos(10))
    session = _session(coordinator)
    assert session["state"] == "stopped" and len(session["rejected"]) == 3
    assert session["reason"].startswith("3 chunks in a row were rejected with no commit "
                                        "between (the last, chunk 2: ")
    assert "binlog schema is" in session["reason"]


def test_a_commit_resets_the_count_of_rejections_in_a_row(tmp_path: Path) -> None:
    coordinator, landing, _ = _coordinator(tmp_path, max_rejections_in_a_row=2)
    coordinator.on_tick(_pos(10))
    for seq in range(0, 6, 2):  # rejected (older schema), then committed, three times
        _publish(landing, seq, ((1, 10, "n"),), read_at=10, high=1, schema=WIDER)
        _publish(landing, seq + 1, ((1, 10),), read_at=10, high=1)
        coordinator.on_tick(_pos(10))
    session = _session(coordinator)
    assert session["state"] == "open" and session["committed"] == [1, 3, 5]


def test_the_schema_is_read_from_the_source_when_a_session_opens_and_when_missing(
        tmp_path: Path) -> None:
    """After a DDL no row event followed, the engine's schema is old (or, for a table created
    since it started, missing): it asks the source before deciding the session's chunks."""
    coordinator, landing, landed = _coordinator(tmp_path)
    asked: list[str] = []

    def read_schema(table_id: str) -> TableSchema | None:
        asked.append(table_id)
        return WIDER

    landed.read_schema = read_schema
    _publish(landing, 0, ((1, 10, "n"),), read_at=10, high=1, schema=WIDER)
    coordinator.on_tick(_pos(10))  # opens the session
    coordinator.on_tick(_pos(10))
    assert asked == ["db.t"]  # once per session, not per chunk
    assert _session(coordinator)["committed"] == [0] and landed.rows() == [(1, 10, "n")]

    other, landing, other_engine = _coordinator(tmp_path / "other", {})
    other_engine.read_schema = read_schema
    _publish(landing, 0, ((1, 10, "n"),), read_at=10, high=1, schema=WIDER, complete=True)
    other.on_tick(_pos(10))
    assert _session(other)["state"] == "done"


def test_a_source_that_cannot_give_the_schema_holds_chunks_back(tmp_path: Path) -> None:
    coordinator, landing, engine = _coordinator(tmp_path)

    def unreachable(table_id: str) -> TableSchema | None:
        raise ConnectionError("source down")

    def gone(table_id: str) -> TableSchema | None:
        return None

    engine.read_schema = unreachable
    _publish(landing, 0, ((1, 10),), read_at=10, high=1)
    coordinator.on_tick(_pos(10))
    assert _session(coordinator)["committed"] == []  # waits: the engine's schema may be old
    other, landing, other_engine = _coordinator(tmp_path / "other", {})
    other_engine.read_schema = gone
    _publish(landing, 0, ((1, 10),), read_at=10, high=1)
    other.on_tick(_pos(10))
    assert _session(other)["committed"] == [] and not _session(other)["rejected"]


def test_a_failed_schema_read_is_tried_again_after_a_pause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    coordinator, landing, engine = _coordinator(tmp_path)
    asked: list[str] = []

    def unreachable(table_id: str) -> TableSchema | None:
        asked.append(table_id)
        raise ConnectionError("source down")

    def reachable(table_id: str) -> TableSchema | None:
        asked.append(table_id)
        return SCHEMA

    _publish(landing, 0, ((1, 10),), read_at=10, high=1)
    engine.read_schema = unreachable
    coordinator.on_tick(_pos(10))
    engine.read_schema = reachable
    coordinator.on_tick(_pos(10))
    assert asked == ["db.t"] and _session(coordinator)["committed"] == []  # not yet again

    monkeypatch.setattr(sessions, "SCHEMA_RETRY_SECONDS", 0.0)
    other, landing, other_engine = _coordinator(tmp_path / "other")
    _publish(landing, 0, ((1, 10),), read_at=10, high=1)
    other_engine.read_schema = unreachable
    other.on_tick(_pos(10))
    other_engine.read_schema = reachable
    other.on_tick(_pos(10))
    assert asked == ["db.t"] * 3 and _session(other)["committed"] == [0]


def test_a_checkpoint_takes_the_sessions_when_they_changed_or_when_it_is_written_anyway(
        tmp_path: Path) -> None:
    coordinator, landing, _ = _coordinator(tmp_path)
    assert coordinator.checkpoint_state(due=False) is None
    assert coordinator.checkpoint_state(due=True) == {}
    write_request(landing, "db", "t", SnapshotRequest("s1", "open", ("k",), None, 10))
    assert coordinator.on_tick(_pos(10))
    assert coordinator.checkpoint_state(due=False)["db.t"]["state"] == "open"
    assert coordinator.checkpoint_state(due=False) is None  # (taken: nothing new since)
    assert coordinator.checkpoint_state(due=True)["db.t"]["state"] == "open"


def test_between_events_the_coordinator_ticks_only_when_a_tick_is_due(tmp_path: Path) -> None:
    coordinator, landing, _ = _coordinator(tmp_path)
    write_request(landing, "db", "t", SnapshotRequest("s1", "open", ("k",), None, 10))
    assert coordinator.on_tick(_pos(10), time.monotonic() + 1)  # (due: never ticked yet)
    write_request(landing, "db", "t", SnapshotRequest("s1", "pause", ("k",), None, 10))
    assert not coordinator.on_tick(_pos(10), time.monotonic())  # (ticked just now)
    assert _session(coordinator)["state"] == "open"
    later = time.monotonic() + sessions.SNAPSHOT_POLL_SECONDS
    assert coordinator.on_tick(_pos(10), later)
    assert _session(coordinator)["state"] == "paused"


def test_an_unreadable_request_opens_nothing_until_it_is_written_again(
        tmp_path: Path) -> None:
    coordinator, landing, _ = _coordinator(tmp_path)
    path = landing.root.joinpath(*request_parts("db", "t"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"session_id": "s1", "action": "op')  # a broken hand edit
    for _ in range(3):
        assert not coordinator.on_tick(_pos(10))
    assert coordinator.checkpoint_state(due=True) == {}
    write_request(landing, "db", "t", SnapshotRequest("s1", "open", ("k",), None, 10))
    assert coordinator.on_tick(_pos(10))
    assert _session(coordinator)["state"] == "open"


def test_a_request_is_read_again_only_when_its_file_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine looks for requests every few hundredths of a second: an unchanged
    request.json is a ``stat``, not a parse, and every action written after is seen."""
    coordinator, landing, _ = _coordinator(tmp_path)
    reads: list[str] = []
    read_request = sessions.read_request

    def counting(landing: LandingZone, database: str, table: str) -> Any:
        reads.append(table)
        return read_request(landing, database, table)

    monkeypatch.setattr(sessions, "read_request", counting)
    assert coordinator.on_tick(_pos(10))
    for _ in range(5):
        coordinator.on_tick(_pos(10))
    assert reads == ["t"] and _session(coordinator)["state"] == "open"
    for action, state in (("pause", "paused"), ("resume", "open"), ("stop", "stopped")):
        write_request(landing, "db", "t", SnapshotRequest("s1", action, ("k",), None, 10))
        coordinator.on_tick(_pos(10))
        assert _session(coordinator)["state"] == state, action
    assert len(reads) == 4
    landing.root.joinpath(*request_parts("db", "t")).unlink()
    coordinator.on_tick(_pos(10))
    write_request(landing, "db", "t", SnapshotRequest("s2", "open", ("k",), None, 10))
    coordinator.on_tick(_pos(10))
    assert _session(coordinator)["session_id"] == "s2" and len(reads) == 5


@pytest.mark.parametrize("end", ["done", "stopped", "restart"])
def test_a_session_that_ends_no_longer_logs_touches(tmp_path: Path, end: str) -> None:
    """The engine logs touches only for tables under an open or paused session."""
    coordinator, landing, _ = _coordinator(tmp_path, max_rejections_in_a_row=1)
    coordinator.on_tick(_pos(10))
    coordinator.record_touch("db.t", (1,), parse_gtid("mariadb", "0-1-11"), 5)
    assert coordinator.key_columns("db.t") == ("k",) and coordinator.logged_touches("db.t") == 1
    if end == "done":
        _publish(landing, 0, ((2, 20),), read_at=11, high=None, complete=True)
    elif end == "stopped":  # (rejected once, which is here as many as in a row as allowed)
        _publish(landing, 0, ((2, 20, "n"),), read_at=11, high=None, schema=WIDER)
    else:
        assert coordinator.on_ddl("db.t", parse_gtid("mariadb", "0-1-12"))
    coordinator.on_tick(_pos(12))
    assert _session(coordinator)["state"] == end
    assert coordinator.key_columns("db.t") is None and coordinator.logged_touches("db.t") == 0
    assert not coordinator.on_ddl("db.t", parse_gtid("mariadb", "0-1-13"))


def test_touched_key_log_generations() -> None:
    log = TouchedKeyLog(_pos(1))
    log.record((1,), parse_gtid("mariadb", "0-1-2"), 10)
    assert log.prune(_pos(2)) == 0 and log.horizon == _pos(1)  # first mark: nothing yet
    log.record((1,), parse_gtid("mariadb", "0-1-3"), 11)
    log.record((2,), parse_gtid("mariadb", "0-1-3"), 12)
    assert log.prune(_pos(3)) == 1 and log.horizon == _pos(2)
    assert log.size == 2 and set(log.touches) == {(1,), (2,)}
    assert log.prune(_pos(3)) == 2 and log.size == 0 and log.touches == {}


_KEY_SPECS = (ColumnSpec("a", "int"), ColumnSpec("b", "string"),
              ColumnSpec("c", "timestamp", scale=6), ColumnSpec("d", "decimal", 6, 2),
              ColumnSpec("e", "double"))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), width=st.integers(1, 5))
def test_touch_candidates_keep_every_row_whose_key_was_touched(data, width) -> None:
    """The column-wise pre-filter of a chunk's rows never leaves out a row whose key (as the
    commit rule compares it: Python values) is a touched one."""
    specs = _KEY_SPECS[:width]
    value = {
        "a": st.one_of(st.none(), st.integers(-3, 3)),
        "b": st.one_of(st.none(), st.sampled_from(["x", "X", "", "y"])),
        "c": st.one_of(st.none(), st.sampled_from(
            [dt.datetime(2020, 1, 1), dt.datetime(2020, 1, 1, 0, 0, 0, 1)])),
        "d": st.one_of(st.none(), st.sampled_from(
            [Decimal("1.5"), Decimal("1.50"), Decimal("-0.01")])),
        "e": st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5])),
    }
    key = st.tuples(*(value[s.name] for s in specs))
    rows = data.draw(st.lists(key, max_size=60))
    touched = data.draw(st.lists(key, max_size=8))
    schema = TableSchema("db", "t", specs, tuple(s.name for s in specs))
    table = pa.Table.from_arrays(
        [pa.array([r[i] for r in rows], s.arrow_type()) for i, s in enumerate(specs)],
        schema=schema.arrow_schema())
    touches = {tuple(k): ["t"] for k in touched} | {(): ["wide"]}
    candidates = chunk_decisions._touch_candidates(table, schema.primary_key, touches)
    chosen = set(range(len(rows))) if candidates is None else set(candidates.to_pylist())
    python_keys = list(zip(*(chunk_decisions._key_values(table.column(n)) for n in schema.primary_key),
                           strict=True)) if rows else []
    for index, row_key in enumerate(python_keys):
        if row_key in touches:
            assert index in chosen, (row_key, touched)


@pytest.mark.parametrize(("condition", "committed"), [("k > 0", [0]), ("1=1) OR (1=1", [])])
def test_a_condition_read_back_from_request_json_is_checked_again(
        tmp_path: Path, condition: str, committed: list[int]) -> None:
    """request.json is a file anyone with access to the landing zone can edit: the engine
    checks its condition again, and a refused one lands nothing (its chunks are rejected)."""
    landing = LandingZone(str(tmp_path / "landing"), "demo")
    engine = Engine()
    coordinator = SnapshotCoordinator(landing, "mariadb", logging.getLogger(__name__), engine,
                                      engine)
    write_request(landing, "db", "t", SnapshotRequest("s1", "open", ("k",), condition, 10))
    coordinator.on_tick(_pos(10))
    _publish(landing, 0, ((1, 10),), read_at=10, high=1)
    landed = engine.landed_anew()
    coordinator.on_tick(_pos(10))
    session = _session(coordinator)
    assert session["condition"] == condition and session["committed"] == committed
    if committed:
        assert landed.rows() == [(1, 10)]
    else:
        assert landed.rows() == []
        assert "UnsafeConditionError: additional condition refused at character 4" in \
            session["rejected"]["0"]


# ---- the cost of many tables: notices, and ended sessions leaving the checkpoint ----------


def _open_many(tmp_path: Path, count: int) -> tuple[SnapshotCoordinator, LandingZone, Engine]:
    landing = LandingZone(str(tmp_path / "landing"), "demo")
    engine = Engine({f"db.t{i}": TableSchema("db", f"t{i}", SCHEMA.columns, ("k",))
                     for i in range(count)})
    coordinator = SnapshotCoordinator(landing, "mariadb", logging.getLogger(__name__), engine,
                                      engine)
    for i in range(count):
        write_request(landing, "db", f"t{i}", SnapshotRequest(f"s{i}", "open", ("k",), None, 10))
    return coordinator, landing, engine


def test_requests_are_found_through_notices_without_a_look_at_every_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After its first look at every request, the engine looks only at the tables whose
    request a notice says changed: a poll of 50 tables with nothing new is one listing."""
    coordinator, landing, _ = _open_many(tmp_path, 50)
    assert coordinator.on_tick(_pos(10))
    assert len(coordinator.sessions) == 50
    assert protocol.request_notices(landing) == []  # (read, then deleted)
    stamps: list[tuple[str, ...]] = []
    stamp = landing.store.stamp

    def counting(*parts: str) -> str | None:
        stamps.append(parts)
        return stamp(*parts)

    monkeypatch.setattr(landing.store, "stamp", counting)
    for _ in range(5):
        assert not coordinator.on_tick(_pos(10))
    assert stamps == []
    write_request(landing, "db", "t7", SnapshotRequest("s7", "pause", ("k",), None, 10))
    assert coordinator.on_tick(_pos(10))
    assert coordinator.sessions["db.t7"].state == "paused"
    assert [parts[-2] for parts in stamps] == ["t7"]
    assert protocol.request_notices(landing) == []


def test_a_request_written_without_its_notice_is_seen_at_the_next_look_at_every_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer killed between request.json and its notice (or a reader of an older version)
    is made up for by the look at every request every REQUEST_SCAN_SECONDS."""
    coordinator, landing, _ = _coordinator(tmp_path)
    assert coordinator.on_tick(_pos(10))
    path = landing.root.joinpath(*request_parts("db", "t"))
    path.write_bytes(SnapshotRequest("s1", "pause", ("k",), None, 10).to_json())
    assert not coordinator.on_tick(_pos(10))
    assert _session(coordinator)["state"] == "open"
    monkeypatch.setattr(coordinator, "_next_request_scan", 0.0)
    assert coordinator.on_tick(_pos(10))
    assert _session(coordinator)["state"] == "paused"


def _finish(coordinator: SnapshotCoordinator, landing: LandingZone, table: str,
            session_id: str, read_at: int = 10) -> None:
    """The session's one (complete) chunk, committed: the session is done."""
    schema = TableSchema("db", table, SCHEMA.columns, ("k",))
    chunk = Chunk(ChunkedTable(schema, ChunkKey(("k",), (False,), "primary key")),
                  ((1, 10),), None, None, _pos(read_at), _pos(read_at),
                  schema_fingerprint(schema), None, True)
    seq = len(protocol.manifest_seqs(landing, "db", table, session_id))
    write_chunk(landing, chunk, session_id, seq, True)
    coordinator.on_tick(_pos(read_at))
    assert coordinator.sessions[f"db.{table}"].state == "done"


def _take(coordinator: SnapshotCoordinator, times: int = 1) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for _ in range(times):
        coordinator._next_leave_look = 0.0  # (no wait between looks here)
        state = coordinator.checkpoint_state(due=True)
    return state


def test_a_done_session_leaves_the_checkpoint_once_its_end_is_durable_and_its_chunks_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions, "ENDED_LINGER_SECONDS", 0.0)
    coordinator, landing, _ = _coordinator(tmp_path)
    coordinator.on_tick(_pos(10))
    _finish(coordinator, landing, "t", "s1")
    # Taken by one checkpoint, then one more: the first may still be in flight.
    assert _take(coordinator, 2)["db.t"]["state"] == "done"
    # Two after it, but its chunk files are there (its reader has not seen the end, or
    # retention not deleted them): it stays, for retention judges them by it.
    assert "db.t" in _take(coordinator, 3)
    landing.store.delete_directory(*protocol.chunk_parts("db", "t", "s1"))
    coordinator._ended["db.t"].look_at = 0.0
    assert _take(coordinator) == {}
    left = protocol.read_ended_sessions(landing).get("db.t")
    assert left is not None and left.session_id == "s1" and left.state == "done"
    assert protocol.latest_session(landing, None, "db.t") == left
    # Its request.json still says "open s1": the engine does not open it again, nor does an
    # engine started from the checkpoint.
    for engine in (coordinator, _restarted(landing, coordinator)):
        for _ in range(2):
            engine._next_request_scan = 0.0
            assert not engine.on_tick(_pos(20))
        assert "db.t" not in engine.sessions
    # A new session of the table opens as ever.
    write_request(landing, "db", "t", SnapshotRequest("s2", "open", ("k",), None, 10))
    assert coordinator.on_tick(_pos(20)) and _session(coordinator)["session_id"] == "s2"


def _restarted(landing: LandingZone, coordinator: SnapshotCoordinator) -> SnapshotCoordinator:
    """A new engine's coordinator, started from what ``coordinator`` last checkpointed."""
    engine = Engine()
    restarted = SnapshotCoordinator(landing, "mariadb", logging.getLogger(__name__), engine,
                                    engine)
    restarted.on_start(coordinator.checkpoint_state(due=True), _pos(20))
    return restarted


def test_a_session_ended_for_a_restart_stays_ended_whatever_its_request_says(
        tmp_path: Path) -> None:
    """A pause or resume of a session the engine ended for a restart (its reader has not
    asked for its new session yet) leaves it ended: it once made it open again while
    untracked, and the next tick failed the engine."""
    coordinator, landing, _ = _coordinator(tmp_path)
    coordinator.on_tick(_pos(10))
    assert coordinator.on_ddl("db.t", parse_gtid("mariadb", "0-1-11"))
    for action in ("pause", "resume"):
        write_request(landing, "db", "t", SnapshotRequest("s1", action, ("k",), None, 10))
        assert not coordinator.on_tick(_pos(12))
        assert _session(coordinator)["state"] == "restart"
    _publish(landing, 0, ((1, 10),), read_at=12, high=None, complete=True)
    assert not coordinator.on_tick(_pos(12))


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # (constants only)
@given(steps=st.lists(st.sampled_from(["open", "done", "done", "done-reader-killed", "stop",
                                       "ddl", "retention", "flush", "flush", "flush", "flush",
                                       "crash"]), max_size=60),
       tables=st.integers(1, 2), data=st.data())
def test_every_session_is_in_the_durable_checkpoint_or_in_ended_sessions(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        steps: list[str], tables: int, data: st.DataObject) -> None:
    """Whatever happens (sessions opened, ended every way, readers that see their session
    done delete its chunks, killed ones leave them to retention, flushes, a crash of the
    engine restarting from its last durable checkpoint), for every
    table the engine's newest session is found (``latest_session``: the checkpoint's record,
    else ``ended_sessions.json``) as the durable checkpoint knows it, or, once ended, as it
    ended; and a request that still names an ended session never opens it again."""
    monkeypatch.setattr(sessions, "ENDED_LINGER_SECONDS", 0.0)
    monkeypatch.setattr(sessions, "LEAVE_LOOK_SECONDS", 0.0)
    tmp_path = tmp_path_factory.mktemp("sessions")
    coordinator, landing, _ = _open_many(tmp_path, tables)
    names_ = [f"t{i}" for i in range(tables)]
    counter = 0
    taken: list[dict[str, Any]] = [{}]  # checkpoints written; all but the newest are durable
    ended: dict[tuple[str, str], str] = {}  # (table, session) -> how the engine ended it
    for iterations, step in enumerate(steps, start=1):
        table = data.draw(st.sampled_from(names_))
        table_id = f"db.{table}"
        session = coordinator.sessions.get(table_id)
        if step == "open":
            counter += 1
            write_request(landing, "db", table, SnapshotRequest(
                f"n{counter}", "open", ("k",), None, 10))
        elif step.startswith("done") and session is not None and session.state == "open":
            _finish(coordinator, landing, table, session.session_id, read_at=10 + iterations)
            if step == "done":  # (its reader saw it done)
                landing.store.delete_directory(*protocol.chunk_parts("db", table,
                                                                       session.session_id))
        elif step == "stop" and session is not None and session.tracked:
            write_request(landing, "db", table, SnapshotRequest(
                session.session_id, "stop", ("k",), None, 10))
        elif step == "ddl":
            coordinator.on_ddl(table_id, parse_gtid("mariadb", f"0-1-{10 + iterations}"))
        elif step == "retention" and session is not None and not session.tracked:
            landing.store.delete_directory(*protocol.chunk_parts("db", table,
                                                                   session.session_id))
        elif step == "flush":
            coordinator._next_leave_look = 0.0
            for done in coordinator._ended.values():
                done.look_at = 0.0
            taken.append(coordinator.checkpoint_state(due=True))
        elif step == "crash":
            durable = taken[-2] if len(taken) > 1 else {}
            engine = Engine({f"db.{t}": TableSchema("db", t, SCHEMA.columns, ("k",))
                             for t in names_})
            coordinator = SnapshotCoordinator(landing, "mariadb",
                                              logging.getLogger(__name__), engine, engine)
            coordinator.on_start(durable, _pos(10 + iterations))
            taken = [durable]
        coordinator.on_tick(_pos(10 + iterations))
        for table_id, session in coordinator.sessions.items():
            if not session.tracked:
                ended[(table_id, session.session_id)] = str(session.state)
        # The invariant, as any reader sees the landing zone now (the durable checkpoint).
        durable = taken[-2] if len(taken) > 1 else {}
        left = protocol.read_ended_sessions(landing)
        for t in names_:
            table_id = f"db.{t}"
            found = protocol.latest_session(landing, Checkpoint(
                "demo", "mariadb", extra={"snapshots": durable}), table_id)
            in_checkpoint = durable.get(table_id)
            if in_checkpoint is not None:
                assert found is not None and found.session_id == in_checkpoint["session_id"]
                assert str(found.state) == in_checkpoint["state"]
            record = left.get(table_id)
            if record is not None:
                # Only ended sessions leave, as they ended, and never one a restarted engine
                # would go on with.
                assert ended[(table_id, record.session_id)] == str(record.state)
                assert in_checkpoint is None or in_checkpoint["session_id"] != \
                    record.session_id or in_checkpoint["state"] == str(record.state)
        # A session that left is not opened again by its request.
        for table_id, record in coordinator.left.items():
            current = coordinator.sessions.get(table_id)
            assert current is None or current.session_id != record.session_id or \
                not current.tracked
