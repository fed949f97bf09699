"""The snapshot reader: key encoding and files (pure), the protocol against a scripted engine,
and whole snapshots through the real capture engine ending with target == source.

The scripted engine (``ScriptedEngine``) plays the engine's side of docs/snapshots.md by the
letter, with decisions chosen by the test, so the reader's protocol (acknowledgement, pipelining,
re-reading rejected chunks, holding back the complete chunk, pause/stop) is checked without the
real engine's timing. The integration tests then run the real engine in a thread.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc_platform.capture import source as source_sql
from cdc_platform.capture.landing.zone import (
    SNAPSHOTS_CHECKPOINT_KEY,
    Checkpoint,
    EndedSessions,
    LandingZone,
    SnapshotSession,
)
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.snapshot.chunks import Chunk, ChunkedTable, ChunkKey, schema_fingerprint
from cdc_platform.capture.snapshot.conditions import Condition, UnsafeConditionError
from cdc_platform.capture.snapshot.errors import (
    NoEngineError,
    SnapshotError,
)
from cdc_platform.capture.snapshot.protocol import (
    DEFAULT_CHUNK_SIZE,
    ChunkManifest,
    SignalRef,
    SnapshotRequest,
    chunk_parts,
    decode_key,
    encode_key,
    latest_session,
    read_chunk_rows,
    read_request,
    write_chunk,
    write_request,
)
from cdc_platform.capture.snapshot.reading import actions
from cdc_platform.capture.snapshot.reading.actions import (
    pause,
    resume,
    signal_action,
    stop,
)
from cdc_platform.capture.snapshot.reading.keyset import ChunkKeyError
from cdc_platform.capture.snapshot.reading.progress import (
    SnapshotProgress,
    SnapshotResult,
    SnapshotStatus,
)
from cdc_platform.capture.snapshot.reading.reader import SnapshotReader
from cdc_platform.capture.source import selector_from_settings
from cdc_platform_tests.conftest import CdcEnv

# ---- key encoding (pure) -----------------------------------------------------------------------

UTC = dt.UTC
KEY_VALUES = [
    (ColumnSpec("i", "int"), -(2**63)),
    (ColumnSpec("i", "int"), 42),
    (ColumnSpec("u", "uint64"), Decimal(2**64 - 1)),
    (ColumnSpec("d", "decimal", 10, 2), Decimal("-12345678.90")),
    (ColumnSpec("d", "decimal", 10, 5), Decimal("0.00000")),
    (ColumnSpec("w", "decimal", 50, 0), "123456789012345678901234567890123456789012345678"),
    (ColumnSpec("f", "float"), 0.10000000149011612),
    (ColumnSpec("g", "double"), -1.0000000000000002e-300),
    (ColumnSpec("g", "double"), -0.0),
    (ColumnSpec("day", "date"), dt.date(1000, 1, 1)),
    (ColumnSpec("at", "datetime", scale=6), dt.datetime(2025, 1, 31, 23, 59, 59, 999999)),
    (ColumnSpec("ts", "timestamp", scale=3), dt.datetime(2025, 6, 1, 12, 0, 0, 123000)),
    (ColumnSpec("ts", "timestamp"), dt.datetime(2025, 6, 1, 12, 0, tzinfo=UTC)),
    (ColumnSpec("t", "time", scale=2), "-838:59:59.00"),
    (ColumnSpec("s", "string"), "naïve 🐍 'quoted' \"double\" \\ back"),
    (ColumnSpec("b", "binary", 4), b"\x00\xff\x10\x00"),
    (ColumnSpec("e", "enum", values=("z", "a")), "a"),
    (ColumnSpec("set", "set", values=("x", "b")), "x,b"),
    (ColumnSpec("bit", "bit", 5), 31),
    (ColumnSpec("bit", "bit", 64), Decimal(2**64 - 1)),
]


@pytest.mark.parametrize(("column", "value"), KEY_VALUES,
                         ids=[f"{c.kind}-{i}" for i, (c, _) in enumerate(KEY_VALUES)])
def test_key_values_round_trip_through_json_by_kind(column: ColumnSpec, value: Any) -> None:
    encoded = encode_key((value,), [column])
    decoded = decode_key(json.loads(json.dumps(encoded)), [column])
    assert decoded == (value,)
    assert type(decoded[0]) is type(value)
    if isinstance(value, float):
        assert str(decoded[0]) == str(value)  # -0.0 keeps its sign


def test_encoding_follows_the_contract_per_kind() -> None:
    columns = [ColumnSpec("i", "int"), ColumnSpec("u", "uint64"), ColumnSpec("d", "decimal", 10, 2),
               ColumnSpec("day", "date"), ColumnSpec("at", "datetime", scale=6),
               ColumnSpec("b", "binary"), ColumnSpec("s", "string")]
    key = (7, Decimal(18446744073709551615), Decimal("1.50"), dt.date(2025, 1, 2),
           dt.datetime(2025, 1, 2, 3, 4, 5, 6), b"\x01\xab", "x")
    assert encode_key(key, columns) == [
        7, "18446744073709551615", "1.50", "2025-01-02", "2025-01-02T03:04:05.000006", "01ab",
        "x"]


def test_open_sides_and_null_key_parts() -> None:
    columns = [ColumnSpec("a", "int"), ColumnSpec("b", "date")]
    assert encode_key(None, columns) is None and decode_key(None, columns) is None
    assert encode_key((None, None), columns) == [None, None]
    assert decode_key([1, None], columns) == (1, None)


def test_decoding_with_bare_kinds_as_the_engine_does() -> None:
    kinds = ["int", "uint64", "decimal", "date", "datetime", "timestamp", "binary", "bit", "bit"]
    key = (1, Decimal(5), Decimal("2.5"), dt.date(2024, 2, 29), dt.datetime(2024, 2, 29, 1),
           dt.datetime(2024, 2, 29, 1, tzinfo=UTC), b"\x00", 3, Decimal(2**63))
    columns = [ColumnSpec("c", "int"), ColumnSpec("c", "uint64"),
               ColumnSpec("c", "decimal", 10, 1), ColumnSpec("c", "date"),
               ColumnSpec("c", "datetime"), ColumnSpec("c", "timestamp"),
               ColumnSpec("c", "binary"), ColumnSpec("c", "bit", 3), ColumnSpec("c", "bit", 64)]
    assert decode_key(encode_key(key, columns), kinds) == key


def test_key_length_mismatch_and_unencodable_values_are_errors() -> None:
    with pytest.raises(ValueError, match="2 values for 1 key columns"):
        encode_key((1, 2), [ColumnSpec("a", "int")])
    with pytest.raises(ValueError, match=r"key column 'a' \(string\): cannot encode"):
        encode_key((object(),), [ColumnSpec("a", "string")])


# ---- request and manifest files (pure) ---------------------------------------------------------

SCHEMA = TableSchema("shop", "orders", (ColumnSpec("id", "int"), ColumnSpec("total",
                     "decimal", 10, 2), ColumnSpec("at", "timestamp", scale=6),
                     ColumnSpec("note", "string")), ("id",))


def _landing(tmp_path: Path) -> LandingZone:
    return LandingZone(str(tmp_path / "landing"), "demo")


def test_request_json_has_the_contract_fields_and_actions_rewrite_it(tmp_path: Path) -> None:
    landing = _landing(tmp_path)
    request = SnapshotRequest("run-1", "open", ("id",), "total > 0", 4096)
    path = write_request(landing, "shop", "orders", request)
    assert path == str(landing.root / "snapshots" / "shop" / "orders" / "request.json")
    data = json.loads(Path(path).read_bytes())
    assert set(data) == {"session_id", "action", "chunk_key", "condition", "chunk_size",
                         "requested_at", "signal"}
    assert data["signal"] is None  # (set when a signal asked: docs/signals.md)
    assert (data["action"], data["chunk_key"], data["chunk_size"]) == ("open", ["id"], 4096)
    assert data["requested_at"].endswith("Z")
    for action, helper in (("pause", pause), ("resume", resume), ("stop", stop)):
        helper(landing, "shop", "orders")
        again = read_request(landing, "shop", "orders")
        assert again is not None
        assert (again.session_id, again.action, again.condition) == ("run-1", action, "total > 0")


def test_request_json_is_the_same_bytes_for_a_checked_condition() -> None:
    """The on-disk format does not know the Condition type: the engine reads the same file."""
    text = SnapshotRequest("run-1", "open", ("id",), "note LIKE 'a%'", 4096, "2026-01-01T00:00:00Z")
    checked = SnapshotRequest("run-1", "open", ("id",), Condition("note LIKE 'a%'"), 4096,
                              "2026-01-01T00:00:00Z")
    assert checked.to_json() == text.to_json()


def test_actions_without_a_session_or_for_a_replaced_one_are_clear_errors(tmp_path: Path) -> None:
    landing = _landing(tmp_path)
    with pytest.raises(SnapshotError, match=r"snapshot of shop\.orders on demo: no session to "
                                            "pause"):
        pause(landing, "shop", "orders")
    write_request(landing, "shop", "orders", SnapshotRequest("run-2", "open", ("id",), None, 10))
    with pytest.raises(SnapshotError, match="session run-1 was replaced by session run-2"):
        actions.request_action(landing, "shop", "orders", "stop", "run-1")
    with pytest.raises(ValueError, match="action 'open'"):
        actions.request_action(landing, "shop", "orders", "open")


def _chunk(rows: tuple[tuple[Any, ...], ...], low: Any, high: Any, complete: bool) -> Chunk:
    from cdc_platform.capture.gtid import parse_position

    table = ChunkedTable(SCHEMA, ChunkKey(("id",), (False,), "primary key"))
    return Chunk(table, rows, low, high, parse_position("mariadb", "0-1-10"),
                 parse_position("mariadb", "0-1-12"), schema_fingerprint(SCHEMA), None, complete)


def test_a_chunk_written_as_parquet_by_an_earlier_reader_still_reads(tmp_path: Path) -> None:
    """Readers before issue 15 wrote a chunk's rows as Parquet: a session one of them left
    open is committed by a newer engine all the same."""
    landing = _landing(tmp_path)
    at = dt.datetime(2025, 1, 1, 10, 0, 0, 5)
    rows = ((3, Decimal("1.50"), at, "x"), (9, None, None, None))
    write_chunk(landing, _chunk(rows, (2,), (9,), False), "run-1", 7, False)
    directory = chunk_dir(landing, "shop", "orders", "run-1")
    arrow = read_chunk_rows(landing, "shop", "orders", "run-1", 7)
    (directory / "00000007.arrow").unlink()
    pq.write_table(arrow, directory / "00000007.parquet", compression="none")
    assert read_chunk_rows(landing, "shop", "orders", "run-1", 7).equals(arrow)
    assert arrow.column("id").to_pylist() == [3, 9] and arrow.num_rows == 2


def test_chunk_files_rows_first_then_manifest(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    landing = _landing(tmp_path)
    written: list[str] = []
    original = landing.store.write_exclusively

    def recording(*parts: str, data: bytes) -> bool:
        written.append(parts[-1])
        return original(*parts, data=data)

    monkeypatch.setattr(landing.store, "write_exclusively", recording)
    at = dt.datetime(2025, 1, 1, 10, 0, 0, 5)
    rows = ((3, Decimal("1.50"), at, "x"), (9, None, None, None))
    manifest = write_chunk(landing, _chunk(rows, (2,), (9,), False), "run-1", 7, False)
    assert written == ["00000007.arrow", "00000007.json"]
    directory = chunk_dir(landing, "shop", "orders", "run-1")
    assert sorted(p.name for p in directory.iterdir()) == ["00000007.arrow", "00000007.json"]
    data = json.loads((directory / "00000007.json").read_bytes())
    assert set(data) == {"session_id", "seq", "rows", "complete", "range_low", "range_high",
                         "low_open", "high_open", "low_watermark", "after", "fingerprint",
                         "read_at"}
    assert data | {"read_at": None} == {
        "session_id": "run-1", "seq": 7, "rows": 2, "complete": False, "range_low": [2],
        "range_high": [9], "low_open": False, "high_open": False, "low_watermark": "0-1-10",
        "after": "0-1-12", "fingerprint": schema_fingerprint(SCHEMA), "read_at": None}
    assert ChunkManifest.from_json((directory / "00000007.json").read_bytes()) == manifest
    table = read_chunk_rows(landing, "shop", "orders", "run-1", 7)
    assert table.schema.equals(SCHEMA.arrow_schema(metadata_columns=False),
                               check_metadata=True)
    assert [tuple(r.values()) for r in table.to_pylist()] == [
        (3, Decimal("1.50"), at.replace(tzinfo=UTC), "x"), (9, None, None, None)]
    assert not list(directory.glob(".*"))  # no temporary files left


def test_open_ranges_are_null_with_open_flags(tmp_path: Path) -> None:
    landing = _landing(tmp_path)
    write_chunk(landing, _chunk((), None, None, True), "run-1", 0, True)
    data = json.loads((chunk_dir(landing, "shop", "orders", "run-1") / "00000000.json")
                      .read_bytes())
    assert (data["range_low"], data["range_high"], data["low_open"], data["high_open"],
            data["complete"], data["rows"]) == (None, None, True, True, True, 0)


def test_unsafe_condition_is_refused_naming_the_table(tmp_path: Path) -> None:
    with pytest.raises(UnsafeConditionError, match=r"snapshot of shop\.orders: additional "
                                                   "condition refused"):
        SnapshotReader(_landing(tmp_path), {}, "mariadb", SCHEMA, condition="1=1; DROP TABLE x")


def test_the_condition_is_checked_once_where_it_enters(tmp_path: Path) -> None:
    """Text (the CLI's, a run's config) becomes a Condition in the reader; a Condition already
    checked (by the signal planner) is kept as it is."""
    reader = SnapshotReader(_landing(tmp_path), {}, "mariadb", SCHEMA, condition=" total > 0 ")
    assert isinstance(reader.condition, Condition) and reader.condition == "total > 0"
    checked = Condition("total > 0")
    again = SnapshotReader(_landing(tmp_path), {}, "mariadb", SCHEMA, condition=checked)
    assert again.condition is checked


def test_default_chunk_size() -> None:
    assert DEFAULT_CHUNK_SIZE == 32768


# ---- the reader's files as the engine's coordinator reads them (pure) --------------------------

CONTRACT_KEYS = [
    (ColumnSpec("k", "int"), (1, 2)),
    (ColumnSpec("k", "uint64"), (Decimal(1), Decimal(2**64 - 1))),
    (ColumnSpec("k", "decimal", 10, 2), (Decimal("1.50"), Decimal("2.00"))),
    (ColumnSpec("k", "date"), (dt.date(2025, 1, 1), dt.date(2025, 1, 2))),
    (ColumnSpec("k", "datetime", scale=6), (dt.datetime(2025, 1, 1), dt.datetime(2025, 1, 2))),
    (ColumnSpec("k", "timestamp"), (dt.datetime(2025, 1, 1), dt.datetime(2025, 1, 2))),
    (ColumnSpec("k", "binary"), (b"\x01", b"\x02")),
    (ColumnSpec("k", "string"), ("a", "b")),
]


@pytest.mark.parametrize(("column", "keys"), CONTRACT_KEYS,
                         ids=[c.kind for c, _ in CONTRACT_KEYS])
def test_engine_drops_chunk_rows_whose_key_was_touched_outside_the_low_watermark(
        tmp_path: Path, column: ColumnSpec, keys: tuple[Any, Any]) -> None:
    """A key the stream touched after the chunk's read view must not be emitted from the chunk.

    The touched key comes from the binlog in landing form, the same values a SELECT gives (the
    naive UTC datetime for TIMESTAMP): the engine must match it against the rows it reads back
    from the reader's Parquet file.
    """
    import logging

    from cdc_platform.capture.gtid import parse_gtid, parse_position
    from cdc_platform.capture.snapshot.sessions import SnapshotCoordinator

    schema = TableSchema("db", "t", (column, ColumnSpec("v", "int")), ("k",))
    landing = _landing(tmp_path)
    table = ChunkedTable(schema, ChunkKey(("k",), (False,), "primary key"))
    lw = parse_position("mariadb", "0-1-10")
    chunk = Chunk(table, ((keys[0], 1), (keys[1], 2)), None, (keys[1],), lw, lw,
                  schema_fingerprint(schema), None, True)
    emitted: list[tuple[str, list[tuple[Any, ...]]]] = []

    class Engine:
        """The coordinator's emitter and schemas: what it emits, recorded."""

        next_pos = 50
        schemas = {"db.t": schema}

        def add_snapshot(self, schema: TableSchema, op: str, rows: Any, extra: Any) -> int:
            if isinstance(rows, pa.Table):  # chunk rows come as Arrow data
                rows = [tuple(row.values()) for row in rows.to_pylist()]
            emitted.append((op, rows))
            return 100

        def learn_table(self, table_id: str) -> TableSchema | None:
            return self.schemas.get(table_id)

    engine = Engine()
    coordinator = SnapshotCoordinator(landing, "mariadb", logging.getLogger(__name__), engine,
                                      engine)
    write_request(landing, "db", "t", SnapshotRequest("s1", "open", ("k",), None, 10))
    coordinator.on_tick(lw)
    write_chunk(landing, chunk, "s1", 0, True)
    coordinator.record_touch("db.t", (keys[0],), parse_gtid("mariadb", "0-1-11"), 60)
    engine.next_pos = 61
    coordinator.on_tick(parse_position("mariadb", "0-1-11"))
    [rows] = [rows for op, rows in emitted if op == "r"]
    assert [row[1] for row in rows] == [2], rows  # the touched key's row is dropped


# ---- the protocol against a scripted engine (real MariaDB, scripted engine side) ---------------


# (seq, manifest) -> commit | reject | wait | give-up (the engine stops the session)
Decide = Callable[[int, dict[str, Any]], str]


class ScriptedEngine:
    """The engine's side of docs/snapshots.md for one table, deciding chunks by ``decide``.

    Like the real engine, it decides pending manifests in seq order and stops at the first
    wait; a committed complete chunk ends the session (``done``).
    """

    def __init__(self, landing: LandingZone, table_id: str, decide: Decide | None = None,
                 interval: float = 0.02, leave_at_once: bool = False) -> None:
        self.landing, self.table_id = landing, table_id
        # An ended session leaves the checkpoint for ended_sessions.json in the same tick (the
        # real engine waits a while: a reader that did not look meanwhile sees the same).
        self.leave_at_once = leave_at_once
        self.decide = decide or (lambda seq, manifest: "commit")
        self.interval = interval
        self.session: dict[str, Any] | None = None
        self.manifests: dict[int, dict[str, Any]] = {}
        self.max_undecided = 0
        self.undecided_at_complete: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.errors: list[BaseException] = []

    def __enter__(self) -> ScriptedEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        if self.errors:
            raise self.errors[0]

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self.tick()
        except BaseException as error:  # noqa: BLE001 - reported by __exit__
            self.errors.append(error)

    def tick(self) -> None:
        database, table = self.table_id.split(".")
        request = read_request(self.landing, database, table)
        if request is None:
            return
        session = self.session
        if request.action in ("open", "pause", "resume") and request.chunk_key and (
                session is None or session["session_id"] != request.session_id):
            session = self.session = {
                "session_id": request.session_id,
                "state": "paused" if request.action == "pause" else "open", "opening": "0-1-1",
                "opening_pos": 1, "horizon": "0-1-1", "committed": [], "rejected": {},
                "rows": 0, "started_at": "now", "ended_at": None}
        elif session is not None and session["session_id"] == request.session_id and \
                session["state"] not in ("done", "stopped"):
            session["state"] = {"pause": "paused", "resume": "open", "stop": "stopped",
                                "open": "open"}[request.action]
        if session is None:
            return
        if session["state"] == "open":
            directory = chunk_dir(self.landing, database, table, session["session_id"])
            decided = set(session["committed"]) | {int(s) for s in session["rejected"]}
            pending = sorted(int(p.stem) for p in directory.glob("*.json")
                             if p.stem.isdigit() and int(p.stem) not in decided
                             ) if directory.is_dir() else []
            self.max_undecided = max(self.max_undecided, len(pending))
            for seq in pending:
                manifest = json.loads((directory / f"{seq:08d}.json").read_bytes())
                assert (directory / f"{seq:08d}.arrow").exists()
                self.manifests[seq] = manifest
                decision = self.decide(seq, manifest)
                if decision == "wait":
                    break
                if decision == "give-up":
                    session.update(state="stopped", reason=f"scripted: chunk {seq} unusable")
                    break
                if decision == "reject":
                    session["rejected"][str(seq)] = f"scripted rejection of chunk {seq}"
                    continue
                session["committed"].append(seq)
                session["rows"] += manifest["rows"]
                if manifest["complete"]:
                    self.undecided_at_complete.append(len(pending) - 1)
                    session["state"] = "done"
                    break
        if self.leave_at_once and session["state"] in ("done", "stopped"):
            self.landing.write_ended_sessions(EndedSessions({self.table_id: (
                SnapshotSession.from_dict(session, self.table_id))}))
            self.landing.write_checkpoint(Checkpoint(
                self.landing.server_name, "mariadb", "0-1-1", 1))
            return
        self.landing.write_checkpoint(Checkpoint(
            self.landing.server_name, "mariadb", "0-1-1", 1,
            extra={SNAPSHOTS_CHECKPOINT_KEY: {self.table_id: dict(session)}}))


@pytest.fixture
def shop(mariadb: Any, tmp_path: Path) -> Iterator[tuple[Any, str, LandingZone]]:
    """A database with ``items`` (id 1..100), a CDC connection and a landing zone."""
    db = f"reader_{time.monotonic_ns()}"
    mariadb.query(f"CREATE DATABASE `{db}`")
    mariadb.query(f"CREATE TABLE `{db}`.items (id INT PRIMARY KEY, name VARCHAR(20), "
                  "status VARCHAR(8))")
    mariadb.query(f"INSERT INTO `{db}`.items SELECT seq, CONCAT('n', seq), "
                  f"IF(seq % 3 = 0, 'open', 'closed') FROM `{db}`.seq_1_to_100")
    try:
        yield mariadb, db, LandingZone(str(tmp_path / "landing"), "shop")
    finally:
        mariadb.query(f"DROP DATABASE `{db}`")


def _schema(mariadb: Any, db: str, table: str) -> TableSchema:
    with source_sql.source_connection(mariadb.connection_settings()) as conn:
        return source_sql.read_table_schema(conn, db, table)


def _reader(mariadb: Any, db: str, landing: LandingZone, table: str = "items",
            **options: Any) -> SnapshotReader:
    options.setdefault("poll_seconds", 0.01)
    options.setdefault("ack_timeout_seconds", 10)
    options.setdefault("keep_chunks", True)
    return SnapshotReader(landing, mariadb.connection_settings(), "mariadb",
                          _schema(mariadb, db, table), **options)


def test_a_result_has_one_of_the_snapshot_statuses() -> None:
    """The asset, the CLI's exit code and the notifications read ``status``: a status none of
    them knows (a typo in one place) fails where the result is made, not as a wrong outcome."""
    assert SnapshotResult("s.t", "x", "stopped").status is SnapshotStatus.STOPPED
    assert SnapshotResult("s.t", "x", SnapshotStatus.DONE).status_text == "done"
    skipped = SnapshotResult("s.t", "x", SnapshotStatus.SKIPPED, reason="no key")
    assert skipped.skipped and skipped.status_text == "skipped: no key"
    with pytest.raises(ValueError, match="finished"):
        SnapshotResult("s.t", "x", "finished")


def test_table_without_key_is_skipped_without_touching_the_landing_zone(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    mariadb.query(f"CREATE TABLE `{db}`.log (line VARCHAR(20))")
    result = _reader(mariadb, db, landing, "log").run()
    assert result.status is SnapshotStatus.SKIPPED
    assert result.status_text == \
        "skipped: no primary key and no surrogate key (set capture.surrogate_keys)"
    assert result.skipped and result.rows == 0
    assert not (landing.root / "snapshots").exists()


def test_without_an_engine_the_session_times_out_naming_the_server(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    reader = _reader(mariadb, db, landing, ack_timeout_seconds=0.3, session_id="run-x")
    with pytest.raises(NoEngineError, match="^no capture engine is streaming shop: start the "
                                            r"stream_changes job \(snapshot session run-x of "
                                            rf"{db}\.items was not acknowledged"):
        reader.run()
    request = read_request(landing, db, "items")
    assert request is not None and (request.session_id, request.action) == ("run-x", "stop")


def test_a_source_that_cannot_be_snapshotted_exactly_fails_naming_the_setting(
        shop: tuple[Any, str, LandingZone]) -> None:
    """The replica's settings are checked before anything is requested."""
    mariadb, db, landing = shop
    mariadb.query("SET GLOBAL binlog_row_image = 'MINIMAL'")
    try:
        with pytest.raises(SnapshotError, match=rf"^snapshot of {db}\.items: source 'shop' "
                           r"cannot be snapshotted exactly: server variable binlog_row_image "
                           r"is 'MINIMAL', needs 'FULL'"):
            _reader(mariadb, db, landing).run()
    finally:
        mariadb.query("SET GLOBAL binlog_row_image = 'FULL'")
    assert not (landing.root / "snapshots").exists()


def chunk_dir(landing: LandingZone, database: str, table: str, session_id: str) -> Path:
    """A session's chunk directory in a local zone (the tests look at its files)."""
    return landing.root.joinpath(*chunk_parts(database, table, session_id))


def _committed_chunks(engine: ScriptedEngine) -> list[dict[str, Any]]:
    assert engine.session is not None
    return [engine.manifests[s] for s in engine.session["committed"]]


def _ids(landing: LandingZone, db: str, manifests: list[dict[str, Any]]) -> list[int]:
    ids = []
    for manifest in manifests:
        ids += [row["id"] for row in read_chunk_rows(
            landing, db, "items", manifest["session_id"], manifest["seq"]).to_pylist()]
    return ids


def test_reads_the_table_in_tiled_chunks_and_finishes_when_the_complete_chunk_commits(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    progress: list[SnapshotProgress] = []
    with ScriptedEngine(landing, f"{db}.items") as engine:
        result = _reader(mariadb, db, landing, chunk_size=30).run(on_progress=progress.append)
    assert isinstance(result, SnapshotResult)
    assert (result.status, result.rows, result.chunks, result.rejected) == ("done", 100, 4, 0)
    chunks = _committed_chunks(engine)
    assert [(c["range_low"], c["range_high"], c["rows"], c["complete"]) for c in chunks] == [
        (None, [30], 30, False), ([30], [60], 30, False), ([60], [90], 30, False),
        ([90], [100], 10, True)]
    assert _ids(landing, db, chunks) == list(range(1, 101))
    assert result.start_gtid == chunks[0]["low_watermark"]
    assert result.end_gtid == chunks[-1]["after"]
    assert result.rows_per_second > 0 and result.duration_seconds > 0
    assert progress[-1].state == "done" and progress[-1].chunks == 4
    assert progress[-1].last_key == [100]


def test_a_reader_whose_session_left_the_checkpoint_learns_how_it_ended(
        shop: tuple[Any, str, LandingZone]) -> None:
    """An ended session leaves the checkpoint (for ended_sessions.json) some seconds after it
    ended: a reader that did not look at the checkpoint meanwhile (a stalled thread) still
    ends done, or fails with the engine's reason."""
    mariadb, db, landing = shop
    with ScriptedEngine(landing, f"{db}.items", leave_at_once=True):
        result = _reader(mariadb, db, landing, chunk_size=30).run()
    assert (result.status, result.rows, result.chunks) == ("done", 100, 4)

    def give_up(seq: int, manifest: dict[str, Any]) -> str:
        return "give-up" if seq == 1 else "commit"

    with ScriptedEngine(landing, f"{db}.items", give_up, leave_at_once=True), \
            pytest.raises(SnapshotError, match="scripted: chunk 1 unusable"):
        _reader(mariadb, db, landing, chunk_size=30).run()


def test_at_most_max_pending_chunks_wait_and_the_complete_one_waits_for_all_others(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    release = threading.Event()

    def slow(seq: int, manifest: dict[str, Any]) -> str:
        return "commit" if release.is_set() else "wait"

    with ScriptedEngine(landing, f"{db}.items", slow) as engine:
        reader = _reader(mariadb, db, landing, chunk_size=10, max_pending=3)
        outcome: list[SnapshotResult] = []
        thread = threading.Thread(target=lambda: outcome.append(reader.run()), daemon=True)
        thread.start()
        time.sleep(0.5)
        assert len(engine.manifests) == 0 or max(engine.manifests) <= 2
        directory = chunk_dir(landing, db, "items", reader.session_id)
        assert len(list(directory.glob("*.json"))) == 3  # and then it waits
        release.set()
        thread.join(30)
    assert outcome[0].status == "done" and outcome[0].chunks == 10
    assert engine.max_undecided <= 3
    assert engine.undecided_at_complete == [0]  # nothing else was pending


def test_rejected_chunks_are_read_again_under_new_seqs(shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    rejected_once: set[tuple[Any, Any]] = set()

    def reject_some(seq: int, manifest: dict[str, Any]) -> str:
        # By range, not seq: which seq a re-read range gets depends on the engine's timing.
        span = (json.dumps(manifest["range_low"]), json.dumps(manifest["range_high"]))
        if span in (("[10]", "[20]"), ("[30]", "[40]")) and span not in rejected_once:
            rejected_once.add(span)
            return "reject"
        return "commit"

    mariadb.query(f"DELETE FROM `{db}`.items WHERE id > 50")
    with ScriptedEngine(landing, f"{db}.items", reject_some) as engine:
        result = _reader(mariadb, db, landing, chunk_size=10).run()
    assert (result.status, result.rejected, result.reselected) == ("done", 2, 2)
    assert result.rows == 50 and result.chunks == 5
    chunks = _committed_chunks(engine)
    assert len(engine.session["rejected"]) == 2
    # The re-read chunks cover exactly the rejected ranges; together the committed ones tile all.
    spans = sorted((c["range_low"] or [0], c["range_high"]) for c in chunks)
    assert spans == [([0], [10]), ([10], [20]), ([20], [30]), ([30], [40]), ([40], [50])]
    assert sorted(_ids(landing, db, chunks)) == list(range(1, 51))
    assert chunks[-1]["complete"] and chunks[-1]["seq"] == max(engine.manifests)


def test_rejected_complete_chunk_is_read_again_and_still_ends_the_session(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    seen: list[int] = []

    def reject_first_complete(seq: int, manifest: dict[str, Any]) -> str:
        if manifest["complete"] and not seen:
            seen.append(seq)
            return "reject"
        return "commit"

    with ScriptedEngine(landing, f"{db}.items", reject_first_complete) as engine:
        result = _reader(mariadb, db, landing, chunk_size=60).run()
    assert (result.status, result.chunks, result.rejected, result.rows) == ("done", 2, 1, 100)
    assert [c["complete"] for c in _committed_chunks(engine)] == [False, True]


def test_empty_table_publishes_one_empty_complete_chunk(shop: tuple[Any, str, LandingZone]
                                                        ) -> None:
    mariadb, db, landing = shop
    mariadb.query(f"DELETE FROM `{db}`.items")
    with ScriptedEngine(landing, f"{db}.items") as engine:
        result = _reader(mariadb, db, landing).run()
    assert (result.status, result.rows, result.chunks) == ("done", 0, 1)
    [chunk] = _committed_chunks(engine)
    assert (chunk["range_low"], chunk["range_high"], chunk["complete"]) == (None, None, True)


def test_condition_selects_only_matching_rows(shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    with ScriptedEngine(landing, f"{db}.items") as engine:
        result = _reader(mariadb, db, landing, chunk_size=7, condition="status = 'open'").run()
    assert result.status == "done" and result.rows == 33
    assert _ids(landing, db, _committed_chunks(engine)) == list(range(3, 101, 3))
    request = read_request(landing, db, "items")
    assert request is not None and request.condition == "status = 'open'"


def test_composite_surrogate_key_with_null_parts(shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    mariadb.query(f"CREATE TABLE `{db}`.pairs (a INT NULL, b DATE NULL, v INT, "
                  "UNIQUE KEY (a, b))")
    mariadb.query(f"INSERT INTO `{db}`.pairs VALUES (NULL, NULL, 1), (NULL, '2025-01-01', 2), "
                  "(1, NULL, 3), (1, '2025-01-01', 4), (1, '2025-01-02', 5), (2, NULL, 6)")
    with ScriptedEngine(landing, f"{db}.pairs") as engine:
        result = _reader(mariadb, db, landing, "pairs", chunk_size=2,
                         surrogate_key=["a", "b"]).run()
    assert (result.status, result.rows, result.chunks) == ("done", 6, 3)
    request = read_request(landing, db, "pairs")
    assert request is not None and request.chunk_key == ("a", "b")
    assert [(c["range_low"], c["range_high"]) for c in _committed_chunks(engine)] == [
        (None, [None, "2025-01-01"]), ([None, "2025-01-01"], [1, "2025-01-01"]),
        ([1, "2025-01-01"], [2, None])]


def test_a_repeated_key_found_in_the_writer_thread_stops_the_run_before_its_files(
        shop: tuple[Any, str, LandingZone]) -> None:
    """The reader casts chunks read column-wise, and checks their keys, in its writer thread
    while it reads the next one: a repeated surrogate key there still ends the run loudly,
    naming the key, and the chunk's files are never written."""
    mariadb, db, landing = shop
    mariadb.query(f"CREATE TABLE `{db}`.dups (a INT NOT NULL, v VARCHAR(4))")
    mariadb.query(f"INSERT INTO `{db}`.dups VALUES (1, 'a'), (1, 'b'), (9, 'c')")
    with ScriptedEngine(landing, f"{db}.dups"), pytest.raises(
            ChunkKeyError, match=r"chunk key \(a\) = \(1,\) appears twice"):
        _reader(mariadb, db, landing, "dups", chunk_size=10, surrogate_key=["a"]).run()
    request = read_request(landing, db, "dups")
    assert request is not None
    directory = chunk_dir(landing, db, "dups", request.session_id)
    assert not list(directory.glob("00000000.*"))


def test_pause_holds_reading_resume_continues_and_stop_ends_the_run(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    limit = [2]  # the scripted engine commits chunks below this seq, then waits

    def commit_below_limit(seq: int, manifest: dict[str, Any]) -> str:
        return "commit" if seq < limit[0] else "wait"

    with ScriptedEngine(landing, f"{db}.items", commit_below_limit) as engine:
        reader = _reader(mariadb, db, landing, chunk_size=5, max_pending=2)
        progress: list[SnapshotProgress] = []
        outcome: list[SnapshotResult] = []
        thread = threading.Thread(target=lambda: outcome.append(
            reader.run(on_progress=progress.append)), daemon=True)
        thread.start()
        _wait_until(lambda: engine.session is not None and len(engine.session["committed"]) == 2)
        reader.pause()
        _wait_until(lambda: engine.session["state"] == "paused")
        limit[0] = 100
        directory = chunk_dir(landing, db, "items", reader.session_id)
        time.sleep(0.2)
        files = len(list(directory.glob("*.json")))
        time.sleep(0.4)
        assert len(list(directory.glob("*.json"))) == files  # paused: no reading
        assert len(engine.session["committed"]) == 2  # paused: no commits
        assert progress[-1].state == "paused"
        limit[0] = 8
        reader.resume()
        _wait_until(lambda: len(engine.session["committed"]) == 8)
        reader.stop()
        thread.join(30)
        _wait_until(lambda: engine.session["state"] == "stopped")
    assert (outcome[0].status, outcome[0].chunks) == ("stopped", 8)


def test_a_pause_signal_before_the_run_opened_its_session_opens_it_paused(
        shop: tuple[Any, str, LandingZone]) -> None:
    """execute-snapshot, then pause-snapshot while the run is still queued: the run opens its
    session paused; a replayed pause does nothing; resume-snapshot lets it finish."""
    mariadb, db, landing = shop
    launched_by = SignalRef("snap", "topic-1", 3)
    hold, go = SignalRef("hold", "topic-1", 4), SignalRef("go", "topic-1", 5)
    assert signal_action(landing, db, "items", "pause", hold) == \
        f"{db}.items: no running snapshot session to pause"
    assert signal_action(landing, db, "items", "pause", hold, run_pending=True) == \
        f"{db}.items: no session open yet; the snapshot run of an earlier signal opens it paused"
    assert "already recorded" in signal_action(landing, db, "items", "pause", hold,
                                               run_pending=True)
    with ScriptedEngine(landing, f"{db}.items") as engine:
        reader = _reader(mariadb, db, landing, chunk_size=10, signal=launched_by)
        outcome: list[SnapshotResult] = []
        thread = threading.Thread(target=lambda: outcome.append(reader.run()), daemon=True)
        thread.start()
        _wait_until(lambda: engine.session is not None and engine.session["state"] == "paused")
        time.sleep(0.3)
        assert not list(chunk_dir(landing, db, "items", reader.session_id).glob("*.json"))
        assert signal_action(landing, db, "items", "pause", hold, run_pending=True) == \
            f"{db}.items: pause already applied by this signal"
        assert signal_action(landing, db, "items", "resume", go, run_pending=True) == \
            f"{db}.items: session {reader.session_id}: resume requested"
        thread.join(30)
    assert (outcome[0].status, outcome[0].rows, outcome[0].chunks) == ("done", 100, 10)


def test_a_run_of_a_later_signal_ignores_an_earlier_pause(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    signal_action(landing, db, "items", "pause", SignalRef("hold", "topic-1", 4),
                  run_pending=True)
    with ScriptedEngine(landing, f"{db}.items"):
        result = _reader(mariadb, db, landing, chunk_size=50,
                         signal=SignalRef("snap", "topic-1", 6)).run()
    assert (result.status, result.rows) == ("done", 100)


def test_a_session_the_engine_gave_up_on_fails_the_run_with_the_reason(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    expected = (rf"snapshot of {db}\.items \(session .*\): the capture engine stopped the "
                r"session: scripted: chunk 2 unusable; fix the cause")
    with ScriptedEngine(landing, f"{db}.items", lambda seq, _: "give-up" if seq == 2
                        else "commit"), pytest.raises(SnapshotError, match=expected):
        _reader(mariadb, db, landing, chunk_size=10).run()


def test_a_table_dropped_during_the_snapshot_fails_the_run_saying_so(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    reader = _reader(mariadb, db, landing, chunk_size=10)
    reader._table = ChunkedTable(reader.schema, ChunkKey(("id",), (False,), "primary key"))
    mariadb.query(f"DROP TABLE `{db}`.items")
    with pytest.raises(SnapshotError, match=r"the table no longer exists on the source"):
        reader.reload_schema()


def test_stop_event_writes_stop_and_returns(shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    stop_event = threading.Event()

    def on_progress(progress: SnapshotProgress) -> None:
        if progress.chunks >= 3:
            stop_event.set()

    with ScriptedEngine(landing, f"{db}.items") as engine:
        result = _reader(mariadb, db, landing, chunk_size=5).run(stop_event, on_progress)
        _wait_until(lambda: engine.session["state"] == "stopped")
    assert result.status == "stopped" and 3 <= result.chunks < 20
    request = read_request(landing, db, "items")
    assert request is not None and request.action == "stop"


def test_a_new_session_replaces_the_old_one_and_removes_its_chunks(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    # (the first session's chunks wait for good: it can only end by being replaced)
    with ScriptedEngine(landing, f"{db}.items",
                        lambda s, m: "commit" if m["session_id"] == "run-b" else "wait"):
        first = _reader(mariadb, db, landing, chunk_size=50, session_id="run-a")
        errors: list[BaseException] = []

        def run_first() -> None:
            try:
                first.run()
            except BaseException as error:  # noqa: BLE001 - checked below
                errors.append(error)

        thread = threading.Thread(target=run_first, daemon=True)
        thread.start()
        _wait_until(lambda: any(chunk_dir(landing, db, "items", "run-a").glob("*.json")))
        second = _reader(mariadb, db, landing, chunk_size=50, session_id="run-b",
                         keep_chunks=False)
        result = second.run()
        thread.join(30)
    assert result.status == "done"
    assert errors and isinstance(errors[0], SnapshotError)
    assert "replaced by session run-b" in str(errors[0])
    assert not (landing.root / "snapshots" / db / "items" / "chunks").exists() or not any(
        (landing.root / "snapshots" / db / "items" / "chunks").iterdir())


def test_a_stopped_session_replaced_before_its_reader_saw_the_stop_still_ends_stopped(
        shop: tuple[Any, str, LandingZone]) -> None:
    """A stop, then at once a new snapshot of the table (a signal after a stop-snapshot, or the
    platform's own snapshot of a table the stop freed): the stopped run ends as stopped, not
    failed as replaced, and the new one reads the table."""
    mariadb, db, landing = shop
    with ScriptedEngine(landing, f"{db}.items",
                        lambda s, m: "commit" if m["session_id"] == "run-b" else "wait"
                        ) as engine:
        # (polls its request every 2 s while paused: the new run starts in between)
        first = _reader(mariadb, db, landing, chunk_size=50, session_id="run-a",
                        poll_seconds=2.0)
        outcome: list[SnapshotResult | BaseException] = []

        def run_first() -> None:
            try:
                outcome.append(first.run())
            except BaseException as error:  # noqa: BLE001 - checked below
                outcome.append(error)

        thread = threading.Thread(target=run_first, daemon=True)
        thread.start()
        _wait_until(lambda: engine.session is not None and engine.session["state"] == "open")
        first.pause()
        _wait_until(lambda: engine.session["state"] == "paused")
        time.sleep(0.3)  # (the first reader has seen the pause and sleeps)
        actions.request_action(landing, db, "items", "stop")
        second = _reader(mariadb, db, landing, chunk_size=50, session_id="run-b")
        result = second.run()
        thread.join(30)
    assert isinstance(outcome[0], SnapshotResult), outcome[0]
    assert outcome[0].status == "stopped"
    assert (result.status, result.rows) == ("done", 100)


def test_stalled_engine_is_reported_naming_server_table_and_chunks(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    engine = ScriptedEngine(landing, f"{db}.items")
    reader = _reader(mariadb, db, landing, chunk_size=30, stall_timeout_seconds=0.5,
                     session_id="run-s")
    thread = threading.Thread(target=lambda: _tick_until_open(engine), daemon=True)
    thread.start()
    with pytest.raises(NoEngineError, match=rf"no capture engine is streaming shop: start the "
                                            rf"stream_changes job \(chunks 0, 1, 2 of {db}\.items, "
                                            "session run-s"):
        reader.run()
    thread.join()


def _tick_until_open(engine: ScriptedEngine) -> None:
    """Acknowledge the session once, then play dead."""
    for _ in range(500):
        engine.tick()
        if engine.session is not None:
            return
        time.sleep(0.01)


def _wait_until(condition: Callable[[], bool], timeout: float = 90.0) -> None:
    """Poll until ``condition`` holds; the generous default is for a loaded CI machine
    (the engine's snapshot tick under load average 10 took over 30 s), a passing wait ends
    at once."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


# ---- whole snapshots through the real capture engine -------------------------------------------


@contextmanager
def streaming(env: CdcEnv) -> Iterator[Any]:
    """The capture engine running in a thread, as the stream_changes job runs it."""
    engine = env.engine()
    stop_engine = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            engine.run(stop_engine)
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append(error)

    thread = threading.Thread(target=run, name="test-engine", daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        stop_engine.set()
        thread.join(60)
    if errors:
        raise errors[0]


def snapshot_reader(env: CdcEnv, table: str, **options: Any) -> SnapshotReader:
    options.setdefault("poll_seconds", 0.05)
    options.setdefault("ack_timeout_seconds", 30)
    options.setdefault("stall_timeout_seconds", 60)
    selector = selector_from_settings(env.settings)
    options.setdefault("selector", selector)
    connection = env.settings.source.connection_settings()
    with source_sql.source_connection(connection) as conn:
        schema = selector.shape(source_sql.read_table_schema(conn, env.db, table))
    return SnapshotReader(env.landing, connection, "mariadb", schema, **options)


def finish_and_reconcile(env: CdcEnv, spark: Any, *tables: str) -> None:
    """Land everything, materialise, and require target == source for each table."""
    env.catch_up()
    for table in tables:
        env.materialise(spark, table)
        result = env.reconcile(spark, table)
        assert result.ok, (table, result.to_metadata())


def invisible(env: CdcEnv, *statements: str) -> None:
    """Statements the binlog never sees: only a snapshot can bring their effect to the target."""
    env.execute("SET SESSION sql_log_bin = 0", *statements)


def _items(env: CdcEnv, table: str = "items") -> None:
    env.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, name VARCHAR(40), "
                "price DECIMAL(10,2), status VARCHAR(8))")


def test_snapshot_only_brings_rows_the_binlog_never_saw_and_removes_orphans(cdc_env: CdcEnv,
                                                                            spark: Any) -> None:
    env = cdc_env
    _items(env)
    env.execute("INSERT INTO items SELECT seq, CONCAT('seen ', seq), seq, 'open' "
                "FROM seq_1_to_50")
    env.catch_up()
    env.materialise(spark, "items")  # the target has rows 1..50 as the binlog had them
    invisible(env, "INSERT INTO items SELECT seq, CONCAT('hidden ', seq), seq / 3, 'new' "
                   "FROM seq_51_to_700",
              "UPDATE items SET name = 'changed' WHERE id <= 10",
              "DELETE FROM items WHERE id BETWEEN 20 AND 25")
    with streaming(env):
        result = snapshot_reader(env, "items", chunk_size=64).run()
    assert (result.status, result.rows, result.rejected) == ("done", 694, 0)
    assert result.chunks == 11 and result.start_gtid and result.end_gtid
    finish_and_reconcile(env, spark, "items")
    rows = env.target_rows(spark, "items")
    assert len(rows) == 694 and rows[0]["name"] == "changed"
    assert not (env.landing.root / "snapshots" / env.db / "items" / "chunks" /
                result.session_id).exists()


def test_inserts_updates_and_deletes_during_the_snapshot(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq * 2, CONCAT('n', seq), seq, 'open' "
                   "FROM seq_1_to_3000")
    done = threading.Event()
    writes: list[int] = []

    def write() -> None:
        rng = random.Random(7)
        with env.mariadb.root_connect(database=env.db, autocommit=True) as conn, \
                conn.cursor() as cur:
            while not done.is_set():
                key = rng.randint(1, 6100)  # inside every chunk's range, and past the end
                op = rng.random()
                if op < 0.4:
                    cur.execute("INSERT INTO items VALUES (%s, 'ins', 1, 'w') ON DUPLICATE KEY "
                                "UPDATE name = 'upsert', price = price + 1", (key,))
                elif op < 0.8:
                    cur.execute("UPDATE items SET name = CONCAT(name, '+'), price = price + 1 "
                                "WHERE id BETWEEN %s AND %s", (key, key + 3))
                else:
                    cur.execute("DELETE FROM items WHERE id = %s", (key,))
                writes.append(key)
                time.sleep(0.002)

    with streaming(env):
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        try:
            result = snapshot_reader(env, "items", chunk_size=100).run()
        finally:
            done.set()
            writer.join(30)
    assert result.status == "done" and result.chunks >= 25
    assert len(writes) > 50
    finish_and_reconcile(env, spark, "items")


def test_chunk_size_one(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_25")
    with streaming(env):
        result = snapshot_reader(env, "items", chunk_size=1).run()
    assert (result.status, result.rows, result.chunks) == ("done", 25, 25)
    finish_and_reconcile(env, spark, "items")


def test_empty_table_removes_the_rows_the_target_still_has(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    env.execute("INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_5")
    env.catch_up()
    env.materialise(spark, "items")
    invisible(env, "DELETE FROM items")
    with streaming(env):
        result = snapshot_reader(env, "items").run()
    assert (result.status, result.rows, result.chunks) == ("done", 0, 1)
    finish_and_reconcile(env, spark, "items")
    assert env.target_rows(spark, "items") == []


def test_composite_primary_key(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    env.execute("CREATE TABLE order_lines (tenant INT, day DATE, code VARCHAR(8), qty INT, "
                "PRIMARY KEY (tenant, day, code))")
    env.execute("INSERT INTO order_lines SELECT seq % 3, '2025-01-01' + INTERVAL seq % 5 DAY, "
                "CONCAT('c', seq), seq FROM seq_1_to_40")
    env.catch_up()
    env.materialise(spark, "order_lines")
    invisible(env, "INSERT INTO order_lines SELECT seq % 4, '2025-02-01' + INTERVAL seq % 7 DAY, "
                   "CONCAT('h', seq), seq FROM seq_1_to_200",
              "DELETE FROM order_lines WHERE code IN ('c1', 'c2', 'c3')",
              "UPDATE order_lines SET qty = -1 WHERE tenant = 0")
    with streaming(env):
        result = snapshot_reader(env, "order_lines", chunk_size=7).run()
    assert result.status == "done" and result.rows == 237
    finish_and_reconcile(env, spark, "order_lines")


@pytest.mark.cdc_config(capture={"surrogate_keys": {"{db}.events": ["a", "b"]}})
def test_surrogate_key_for_a_table_without_primary_key_and_skip_without_one(
        cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    env.execute("CREATE TABLE events (a INT NULL, b INT NULL, v VARCHAR(10), UNIQUE KEY (a, b))",
                "CREATE TABLE loose (a INT, v VARCHAR(10))")
    env.execute("INSERT INTO events VALUES (NULL, NULL, 'seen'), (5, 5, 'orphan')")
    env.catch_up()
    env.materialise(spark, "events")
    invisible(env, "DELETE FROM events WHERE a = 5",
              "UPDATE events SET v = 'nn' WHERE a IS NULL AND b IS NULL",
              "INSERT INTO events VALUES (NULL, 1, 'n1'), (1, NULL, '1n'), (1, 1, '11'), "
              "(1, 2, '12'), (2, 1, '21'), (3, NULL, '3n')",
              "INSERT INTO loose VALUES (1, 'x')")
    with streaming(env):
        skipped = snapshot_reader(env, "loose").run()
        result = snapshot_reader(env, "events", chunk_size=2).run()
        writes = ["UPDATE events SET v = 'w' WHERE a IS NULL AND b = 1",
                  "DELETE FROM events WHERE a = 3 AND b IS NULL"]
        env.execute(*writes)
    assert (skipped.status, skipped.status_text) == (
        SnapshotStatus.SKIPPED,
        "skipped: no primary key and no surrogate key (set capture.surrogate_keys)")
    assert (result.status, result.rows, result.chunks) == ("done", 7, 4)
    # The target merges by (a, b), NULL parts matching NULL: one row per key, orphan (5, 5) gone.
    finish_and_reconcile(env, spark, "events")
    assert sorted((r["a"] is None, r["a"], r["b"] is None, r["b"], r["v"])
                  for r in env.target_rows(spark, "events", order_by="a")) == sorted(
        (a is None, a, b is None, b, v) for a, b, v in env.query("SELECT a, b, v FROM events"))


def _landed_rows(env: CdcEnv, table: str, op: str) -> list[tuple[Any, ...]]:
    checkpoint = env.landing.read_checkpoint()
    assert checkpoint is not None
    rows = []
    for first, _, path in env.landing.segments(env.db, table):
        if first >= checkpoint.next_pos:
            continue
        data = pq.read_table(path)
        user = [f.name for f in data.schema if not f.name.startswith("__cdc")]
        for record in data.to_pylist():
            if record["__cdc_op"] == op and record["__cdc_pos"] < checkpoint.next_pos:
                rows.append(tuple(record[c] for c in user))
    return rows


def test_additional_condition_only_touches_matching_rows(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    env.execute("INSERT INTO items SELECT seq, 'seen', seq, IF(seq % 2, 'open', 'closed') "
                "FROM seq_1_to_20")
    env.catch_up()
    env.materialise(spark, "items")
    invisible(env, "DELETE FROM items WHERE id IN (1, 2)",  # 1 open, 2 closed: orphans
              "UPDATE items SET name = 'changed' WHERE id IN (3, 4)",
              "INSERT INTO items SELECT seq, 'hidden', seq, IF(seq % 2, 'open', 'closed') "
              "FROM seq_21_to_40")
    with streaming(env):
        result = snapshot_reader(env, "items", chunk_size=4, condition="status = 'open'").run()
    assert result.status == "done" and result.rows == 19  # 3..39 odd
    env.catch_up()
    env.materialise(spark, "items")
    target = {r["id"]: r["name"] for r in env.target_rows(spark, "items")}
    # A filtered snapshot says nothing about rows outside its condition, nor deletes anything:
    # orphans 1 and 2 stay, closed rows keep their binlog state, hidden closed rows stay out.
    assert set(target) == set(range(1, 21)) | set(range(21, 40, 2))
    assert target[3] == "changed" and target[4] == "seen"
    assert all(target[i] == "hidden" for i in range(21, 40, 2))
    # ...and the source's rows that match it are in the target as they are, every column.
    matching = [dict(zip(("id", "name", "price", "status"), row, strict=True)) for row in
                env.query("SELECT id, name, price, status FROM items WHERE status = 'open' "
                          "ORDER BY id")]
    keys = {row["id"] for row in matching}
    assert len(matching) == 19
    assert [r for r in env.target_rows(spark, "items") if r["id"] in keys] == matching


def test_pause_resume_and_stop_with_the_engine(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_300")
    with streaming(env):
        reader = snapshot_reader(env, "items", chunk_size=10, max_pending=2)
        progress: list[SnapshotProgress] = []
        outcome: list[SnapshotResult] = []
        thread = threading.Thread(target=lambda: outcome.append(
            reader.run(on_progress=progress.append)), daemon=True)
        thread.start()
        _wait_until(lambda: bool(progress) and progress[-1].chunks >= 3)
        reader.pause()
        _wait_until(lambda: _engine_state(env, "items") == "paused")
        time.sleep(0.5)  # let an in-flight chunk land
        committed = len(_engine_session(env, "items")["committed"])
        time.sleep(1.0)
        assert len(_engine_session(env, "items")["committed"]) == committed
        assert progress[-1].state == "paused"
        reader.resume()
        thread.join(120)
        assert outcome[0].status == "done" and outcome[0].rows == 300

        stop_event = threading.Event()
        stopped = snapshot_reader(env, "items", chunk_size=10).run(
            stop_event, lambda p: stop_event.set() if p.chunks >= 2 else None)
        assert stopped.status == "stopped"
        _wait_until(lambda: _engine_state(env, "items") == "stopped")
        again = snapshot_reader(env, "items", chunk_size=50).run()
        assert again.status == "done" and again.rows == 300
    finish_and_reconcile(env, spark, "items")


def _requested(env: CdcEnv, table: str) -> str | None:
    request = read_request(env.landing, env.db, table)
    return request.action if request else None


def _engine_session(env: CdcEnv, table: str) -> dict[str, Any]:
    """The table's newest session the engine recorded (the checkpoint's, else the one that
    left it for ended_sessions.json)."""
    session = latest_session(env.landing, env.landing.read_checkpoint(), f"{env.db}.{table}")
    assert session is not None
    return session.to_dict()


def _engine_state(env: CdcEnv, table: str) -> str | None:
    session = latest_session(env.landing, env.landing.read_checkpoint(), f"{env.db}.{table}")
    return None if session is None else str(session.state)


def test_several_tables_at_once(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    tables = ("t_a", "t_b", "t_c")
    for index, table in enumerate(tables):
        _items(env, table)
        invisible(env, f"INSERT INTO {table} SELECT seq, 'x', seq, 'a' "
                       f"FROM seq_1_to_{300 * (index + 1)}")
    results: dict[str, SnapshotResult] = {}
    errors: list[BaseException] = []

    def snapshot(table: str) -> None:
        try:
            results[table] = snapshot_reader(env, table, chunk_size=50).run()
        except BaseException as error:  # noqa: BLE001 - asserted below
            errors.append(error)

    with streaming(env):
        threads = [threading.Thread(target=snapshot, args=(t,), daemon=True) for t in tables]
        for thread in threads:
            thread.start()
        for i in range(100):  # concurrent traffic on every table
            env.execute(*[f"UPDATE {t} SET name = 'w{i}' WHERE id = {i * 3 + 1}" for t in tables])
        for thread in threads:
            thread.join(180)
    assert not errors, errors
    assert {t: (r.status, r.rows) for t, r in results.items()} == {
        "t_a": ("done", 300), "t_b": ("done", 600), "t_c": ("done", 900)}
    finish_and_reconcile(env, spark, *tables)


class EngineThread:
    """The capture engine in a thread that a test can stop and start again."""

    def __init__(self, env: CdcEnv) -> None:
        self.env = env
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop = threading.Event()
        engine, stop_engine = self.env.engine(), self._stop

        def run() -> None:
            try:
                engine.run(stop_engine)
            except BaseException as error:  # noqa: BLE001 - checked by the test
                self.errors.append(error)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        assert not self.errors, self.errors


def _wait_paused_and_caught_up(env: CdcEnv, table: str) -> None:
    """The engine holds the table's session paused and has checkpointed all of the binlog."""
    _wait_until(lambda: _engine_state(env, table) == "paused")
    _wait_caught_up(env)


def test_changes_to_keys_of_chunks_waiting_for_the_engine_are_dropped_from_them(
        cdc_env: CdcEnv, spark: Any) -> None:
    """Updates, deletes and re-inserts of keys inside chunks already read but not committed:
    the engine drops those keys from the chunks (the stream carries their newer state), and
    the target still equals the source."""
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_200")
    engine = EngineThread(env)
    engine.start()
    _wait_caught_up(env)
    reader = snapshot_reader(env, "items", chunk_size=50, max_pending=8)
    stopped: list[bool] = []

    def on_progress(progress: SnapshotProgress) -> None:
        if progress.state == "open" and not stopped:
            stopped.append(True)
            engine.stop()  # acknowledged: the chunks are read while no engine decides them

    outcome: list[SnapshotResult] = []
    thread = threading.Thread(target=lambda: outcome.append(reader.run(on_progress=on_progress)),
                              daemon=True)
    thread.start()
    # Chunks 0-2 are published; the complete chunk 3 waits in the reader for them.
    _wait_until(lambda: len(list(chunk_dir(env.landing, env.db, "items", reader.session_id)
                                 .glob("*.json"))) == 3)
    env.execute("UPDATE items SET name = 'updated' WHERE id IN (10, 60, 110)",
                "DELETE FROM items WHERE id IN (20, 70)",
                "DELETE FROM items WHERE id = 30",
                "INSERT INTO items VALUES (30, 'inserted again', 1, 'b')")
    # Paused, the engine records the touches without deciding a chunk, so it processes all
    # of them before it commits one (else it may commit at the chunks' watermark first).
    reader.pause()
    engine.start()
    _wait_paused_and_caught_up(env, "items")
    reader.resume()
    thread.join(60)
    engine.stop()
    [result] = outcome
    assert (result.status, result.rows, result.chunks) == ("done", 200, 4)
    assert result.rows_emitted == 200 - 6  # keys 10, 20, 30, 60, 70, 110 came from the stream
    finish_and_reconcile(env, spark, "items")
    assert {r["id"]: r["name"] for r in env.target_rows(spark, "items")
            if r["id"] in (10, 20, 30)} == {10: "updated", 30: "inserted again"}


def _wait_caught_up(env: CdcEnv) -> None:
    """Until the engine's checkpoint is at the source's binlog position: past the table's
    CREATE TABLE, so that a session it opens now does not end for a restart at that DDL (the
    tests that stop the engine after the acknowledgement could not acknowledge a new one)."""
    _wait_until(lambda: (env.landing.read_checkpoint() or Checkpoint("", "")).gtid == env.query(
        "SELECT @@GLOBAL.gtid_binlog_pos")[0][0])


def test_engine_restarts_mid_snapshot_reject_stale_chunks_which_are_read_again(
        cdc_env: CdcEnv, spark: Any) -> None:
    """After a restart the touched-key log starts empty at the resumed position: chunks whose
    low watermark predates it are rejected, read again, and the snapshot still ends exact."""
    env = cdc_env
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_400")
    engine = EngineThread(env)
    engine.start()
    _wait_caught_up(env)
    reader = snapshot_reader(env, "items", chunk_size=20, max_pending=4)

    done: set[str] = set()  # each step once: progress repeats after the rejections

    def on_progress(progress: SnapshotProgress) -> None:
        if progress.state == "open" and progress.pending == 0 and "stop" not in done:
            done.add("stop")
            engine.stop()  # acknowledged, nothing read yet: the engine goes down
        elif progress.pending == 4 and progress.state == "open" and "pause" not in done:
            done.add("pause")
            reader.pause()  # four chunks wait for an engine

    outcome: list[SnapshotResult | BaseException] = []

    def run() -> None:
        try:
            outcome.append(reader.run(on_progress=on_progress))
        except BaseException as error:  # noqa: BLE001 - asserted below
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    _wait_until(lambda: _requested(env, "items") == "pause" or bool(outcome))
    # The stream moves on past the chunks' low watermark; the engine processes it while the
    # session is paused (no decisions), checkpoints, and restarts.
    env.execute("UPDATE items SET name = 'moved on' WHERE id % 9 = 0")
    engine.start()
    _wait_paused_and_caught_up(env, "items")
    engine.stop()
    engine.start()
    reader.resume()
    thread.join(120)
    engine.stop()
    [result] = outcome
    assert isinstance(result, SnapshotResult), result
    assert (result.status, result.rows, result.rejected, result.reselected) == (
        "done", 400, 4, 4)
    finish_and_reconcile(env, spark, "items")
