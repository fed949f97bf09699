"""The snapshot protocol's files (``snapshot/protocol.py``), pure: key encoding, request.json,
a chunk's rows and manifest, and the reader's files as the engine's coordinator reads them.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc_platform.capture.landing.session_records import (
    DEFAULT_CHUNK_SIZE,
    SnapshotRequest,
    SnapshotSession,
)
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.snapshot.chunks import Chunk, ChunkedTable, ChunkKey, schema_fingerprint
from cdc_platform.capture.snapshot.conditions import Condition
from cdc_platform.capture.snapshot.protocol import (
    ChunkManifest,
    decode_key,
    encode_key,
    read_chunk_rows,
    write_chunk,
    write_request,
)
from cdc_platform_tests.capture.snapshot.reading.scripted_engine import (
    SCHEMA,
    _landing,
    chunk_dir,
)

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


def test_request_json_is_the_same_bytes_for_a_checked_condition() -> None:
    """The on-disk format does not know the Condition type: the engine reads the same file."""
    text = SnapshotRequest("run-1", "open", ("id",), "note LIKE 'a%'", 4096, "2026-01-01T00:00:00Z")
    checked = SnapshotRequest("run-1", "open", ("id",), Condition("note LIKE 'a%'"), 4096,
                              "2026-01-01T00:00:00Z")
    assert checked.to_json() == text.to_json()


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
    assert table.schema.equals(SCHEMA.arrow_schema(),
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


def test_a_session_read_from_a_record_never_changes_the_record() -> None:
    """The engine restarts from a checkpoint's records: a chunk committed afterwards must not
    write itself into the record it was read from (which a later restart would read as a
    committed chunk of a session still open: its next chunk 0 was never decided)."""
    record = {"session_id": "s1", "state": "open", "opening": "0-1-1", "chunk_key": ["k"],
              "committed": [], "rejected": {}}
    session = SnapshotSession.from_dict(record, "db.t")
    session.committed.append(0)
    session.rejected["1"] = "raced"
    session.chunk_key.append("x")
    assert record == {"session_id": "s1", "state": "open", "opening": "0-1-1",
                      "chunk_key": ["k"], "committed": [], "rejected": {}}
