"""The messages of a batch of landing-zone records: keys, envelopes, tombstones, headers."""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc_platform.capture.landing import records
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.topics.envelope import (
    CONNECTOR_VERSION,
    EnvelopeOptions,
    Message,
    TableEncoder,
    server_id_of,
)

CUSTOMERS = TableSchema("inventory", "customers", (
    ColumnSpec("id", "int"), ColumnSpec("first_name", "string"),
    ColumnSpec("last_name", "string"), ColumnSpec("email", "string")), ("id",))
OPTIONS = EnvelopeOptions(prefix="dbserver1")
MYSQL_GTID = "3e11fa47-71ca-11e1-9e33-c80aa9429562:23"


def row(pos: int, op: str, gtid: str = "0-7-100", ts_ms: int = 1_700_000_000_123,
        **columns: Any) -> dict[str, Any]:
    return {records.POS: pos, records.GTID: gtid, records.OP: op, records.TS_MS: ts_ms,
            **columns}


def segment(schema: TableSchema, rows: list[dict[str, Any]],
            snapshot_columns: bool = False) -> pa.Table:
    arrow = records.segment_schema(schema)
    if snapshot_columns:
        arrow = pa.schema([*arrow, *records.snapshot_arrow_fields(schema)])
    return pa.Table.from_pylist(rows, schema=arrow)


def customer(pos: int, op: str, id_: int, first: str | None = "Anne", **meta: Any) -> dict:
    if op == records.DELETE:
        return row(pos, op, id=id_, first_name=None, last_name=None, email=None, **meta)
    return row(pos, op, id=id_, first_name=first, last_name="Kretchmar",
               email=f"{id_}@example.com", **meta)


def value(message: Message) -> dict[str, Any]:
    assert message.value is not None
    return json.loads(message.value)


def key(message: Message) -> Any:
    assert message.key is not None
    return json.loads(message.key)


def test_one_message_per_row_record_in_position_order() -> None:
    batch = segment(CUSTOMERS, [customer(10, "c", 1), customer(11, "u", 1, "Anna"),
                                customer(12, "r", 2)])
    messages = TableEncoder(CUSTOMERS, OPTIONS).encode(batch)
    assert [m.position for m in messages] == [10, 11, 12]
    assert [value(m)["payload"]["op"] for m in messages] == ["c", "u", "r"]
    assert [key(m)["payload"] for m in messages] == [{"id": 1}, {"id": 1}, {"id": 2}]


def test_create_update_and_read_carry_the_after_image_and_no_before() -> None:
    batch = segment(CUSTOMERS, [customer(1, "c", 1), customer(2, "u", 1, "Anna"),
                                customer(3, "r", 2)])
    payloads = [value(m)["payload"] for m in TableEncoder(CUSTOMERS, OPTIONS).encode(batch)]
    assert [p["before"] for p in payloads] == [None, None, None]
    assert payloads[1]["after"] == {"id": 1, "first_name": "Anna", "last_name": "Kretchmar",
                                    "email": "1@example.com"}


def test_a_delete_carries_the_key_columns_before_and_is_followed_by_a_tombstone() -> None:
    batch = segment(CUSTOMERS, [customer(5, "d", 7)])
    delete, tombstone = TableEncoder(CUSTOMERS, OPTIONS).encode(batch)
    payload = value(delete)["payload"]
    assert payload["op"] == "d"
    assert payload["before"] == {"id": 7, "first_name": None, "last_name": None, "email": None}
    assert payload["after"] is None
    assert tombstone.value is None
    assert tombstone.key == delete.key
    assert tombstone.position == delete.position and tombstone.headers == delete.headers


def test_no_tombstone_when_turned_off() -> None:
    batch = segment(CUSTOMERS, [customer(5, "d", 7)])
    messages = TableEncoder(CUSTOMERS, EnvelopeOptions("p", tombstones_on_delete=False)).encode(
        batch)
    assert [value(m)["payload"]["op"] for m in messages] == ["d"]


def test_a_primary_key_change_is_a_delete_of_the_old_key_and_an_update_of_the_new() -> None:
    batch = segment(CUSTOMERS, [customer(20, "d", 1), customer(21, "u", 2)])
    messages = TableEncoder(CUSTOMERS, OPTIONS).encode(batch)
    assert [(key(m)["payload"], m.value is None) for m in messages] == [
        ({"id": 1}, False), ({"id": 1}, True), ({"id": 2}, False)]


def test_snapshot_instructions_are_not_messages() -> None:
    assertion = row(31, records.RANGE_ASSERTION, id=1, **{records.THRESHOLD: 30,
                                                          records.LO_OPEN: True,
                                                          records.HI_OPEN: False,
                                                          records.hi_column("id"): 9})
    sweep = row(32, records.SWEEP, **{records.THRESHOLD: 30})
    batch = segment(CUSTOMERS, [customer(30, "r", 1), assertion, sweep, customer(33, "c", 4)],
                    snapshot_columns=True)
    messages = TableEncoder(CUSTOMERS, OPTIONS).encode(batch)
    assert [m.position for m in messages] == [30, 33]
    assert value(messages[0])["payload"]["source"]["snapshot"] == "incremental"
    assert value(messages[1])["payload"]["source"]["snapshot"] == "false"


def test_a_batch_of_instructions_only_gives_no_message() -> None:
    batch = segment(CUSTOMERS, [row(1, records.SWEEP, **{records.THRESHOLD: 1})],
                    snapshot_columns=True)
    assert TableEncoder(CUSTOMERS, OPTIONS).encode(batch) == []


def test_an_unknown_op_is_refused_with_the_table_named() -> None:
    batch = segment(CUSTOMERS, [customer(1, "x", 1)])
    with pytest.raises(ValueError, match=r"inventory\.customers.*\['x'\]"):
        TableEncoder(CUSTOMERS, OPTIONS).encode(batch)


def test_headers_name_the_gtid_and_the_changelog_position() -> None:
    [message] = TableEncoder(CUSTOMERS, OPTIONS).encode(
        segment(CUSTOMERS, [customer(123456789, "c", 1, gtid=MYSQL_GTID)]))
    assert message.headers == (("cdc.gtid", MYSQL_GTID.encode()),
                               ("cdc.position", b"123456789"))


def test_source_describes_the_change() -> None:
    [message] = TableEncoder(CUSTOMERS, OPTIONS).encode(
        segment(CUSTOMERS, [customer(1, "c", 1, gtid="0-7-100", ts_ms=1_700_000_000_123)]))
    assert value(message)["payload"]["source"] == {
        "version": CONNECTOR_VERSION, "connector": "mysql", "name": "dbserver1",
        "ts_ms": 1_700_000_000_123, "snapshot": "false", "db": "inventory", "sequence": None,
        "ts_us": 1_700_000_000_123_000, "ts_ns": 1_700_000_000_123_000_000,
        "table": "customers", "server_id": 7, "gtid": "0-7-100", "file": "", "pos": 0,
        "row": 0, "thread": None, "query": None}
    assert CONNECTOR_VERSION.startswith("cdc_platform ")


@pytest.mark.parametrize(("gtid", "server_id"), [
    ("0-7-100", 7), ("12-4294967295-1", 4294967295), (MYSQL_GTID, 0), (None, 0), ("", 0)])
def test_server_id_is_known_only_from_mariadb_gtids(gtid: str | None, server_id: int) -> None:
    assert server_id_of(gtid) == server_id


def test_row_counts_the_records_of_the_table_within_their_transaction() -> None:
    batch = segment(CUSTOMERS, [
        customer(1, "c", 1, gtid="0-1-1"), customer(2, "c", 2, gtid="0-1-1"),
        customer(3, "d", 1, gtid="0-1-1"), customer(4, "c", 3, gtid="0-1-2"),
        customer(5, "c", 4, gtid="0-1-3"), customer(6, "u", 4, gtid="0-1-3")])
    messages = [m for m in TableEncoder(CUSTOMERS, OPTIONS).encode(batch) if m.value]
    assert [value(m)["payload"]["source"]["row"] for m in messages] == [0, 1, 2, 0, 0, 1]


def test_snapshot_rows_land_without_a_gtid_and_are_sent_with_none() -> None:
    """The engine lands chunk rows with an empty GTID and the time of the chunk's commit."""
    batch = segment(CUSTOMERS, [customer(1, "r", 1, gtid=""), customer(2, "r", 2, gtid=""),
                                customer(3, "c", 3, gtid="0-1-9"),
                                customer(4, "c", 4, gtid="0-1-9")])
    messages = TableEncoder(CUSTOMERS, OPTIONS).encode(batch)
    sources = [value(m)["payload"]["source"] for m in messages]
    assert [(s["gtid"], s["server_id"], s["row"], s["snapshot"]) for s in sources] == [
        (None, 0, 0, "incremental"), (None, 0, 0, "incremental"), ("0-1-9", 1, 0, "false"),
        ("0-1-9", 1, 1, "false")]
    assert messages[0].headers[0] == ("cdc.gtid", b"")


def test_the_envelope_time_is_when_the_batch_was_encoded() -> None:
    before = time.time_ns()
    messages = TableEncoder(CUSTOMERS, OPTIONS).encode(
        segment(CUSTOMERS, [customer(1, "c", 1), customer(2, "c", 2)]))
    after = time.time_ns()
    for message in messages:
        payload = value(message)["payload"]
        assert before <= payload["ts_ns"] <= after
        assert payload["ts_us"] == payload["ts_ns"] // 1000
        assert payload["ts_ms"] == payload["ts_ns"] // 1_000_000
        assert payload["transaction"] is None


def test_without_schemas_key_and_value_are_the_payloads_alone() -> None:
    encoder = TableEncoder(CUSTOMERS, EnvelopeOptions("p", schemas_enable=False))
    delete, tombstone = encoder.encode(segment(CUSTOMERS, [customer(1, "d", 9)]))
    assert json.loads(delete.key) == {"id": 9}
    assert list(value(delete)) == ["before", "after", "source", "transaction", "op", "ts_ms",
                                   "ts_us", "ts_ns"]
    assert tombstone.value is None


def test_with_schemas_every_message_carries_the_same_schema_text() -> None:
    encoder = TableEncoder(CUSTOMERS, OPTIONS)
    messages = encoder.encode(segment(CUSTOMERS, [customer(1, "c", 1), customer(2, "d", 1)]))
    assert messages[0].value.startswith(b'{"schema":{"type":"struct","fields":[')
    assert b" " not in messages[0].value.split(b'"payload":')[0]  # compact
    schemas = [value(m)["schema"] for m in messages if m.value]
    assert schemas == [encoder.value_schema, encoder.value_schema]
    assert [key(m)["schema"] for m in messages] == [encoder.key_schema] * 3


def test_a_table_without_a_primary_key_has_no_key() -> None:
    schema = TableSchema("inventory", "log", (ColumnSpec("line", "string"),), ())
    encoder = TableEncoder(schema, OPTIONS)
    messages = encoder.encode(segment(schema, [row(1, "c", line="x"), row(2, "d", line="x")]))
    assert [m.key for m in messages] == [None, None, None]
    assert encoder.key_schema is None


def test_the_key_follows_the_primary_key_order_not_the_column_order() -> None:
    schema = TableSchema("shop", "lines", (ColumnSpec("order_id", "int"),
                                           ColumnSpec("line", "int"),
                                           ColumnSpec("sku", "string")), ("line", "order_id"))
    encoder = TableEncoder(schema, OPTIONS)
    [message] = encoder.encode(segment(schema, [row(1, "c", order_id=5, line=2, sku="a")]))
    assert message.key == (b'{"schema":{"type":"struct","fields":['
                           b'{"type":"int64","optional":false,"field":"line"},'
                           b'{"type":"int64","optional":false,"field":"order_id"}],'
                           b'"optional":false,"name":"dbserver1.shop.lines.Key"},'
                           b'"payload":{"line":2,"order_id":5}}')
    value_fields = encoder.value_schema["fields"][1]["fields"]
    assert [(f["field"], f["optional"]) for f in value_fields] == [
        ("order_id", False), ("line", False), ("sku", True)]


def test_the_topic_is_the_escaped_table_name() -> None:
    schema = TableSchema("my db", "t😀", (ColumnSpec("id", "int"),), ("id",))
    encoder = TableEncoder(schema, OPTIONS)
    assert encoder.topic == "dbserver1.my_db.t__"
    assert encoder.value_schema["name"] == "dbserver1.my_db.t__.Envelope"
    [message] = encoder.encode(segment(schema, [row(1, "c", id=1)]))
    assert value(message)["payload"]["source"]["db"] == "my db"
    assert value(message)["payload"]["source"]["table"] == "t😀"


def test_a_key_column_missing_from_the_columns_is_refused() -> None:
    with pytest.raises(ValueError, match="inventory.customers.*'nope'"):
        TableEncoder(TableSchema("inventory", "customers", CUSTOMERS.columns, ("nope",)),
                     OPTIONS)


def test_a_segment_read_back_from_parquet_with_dictionaries_encodes_alike(tmp_path: Path) -> None:
    batch = segment(CUSTOMERS, [customer(1, "c", 1), customer(2, "d", 1)])
    path = tmp_path / "segment.parquet"
    pq.write_table(batch, path, use_dictionary=list(records.DICTIONARY_COLUMNS))
    read = pq.read_table(path, read_dictionary=list(records.DICTIONARY_COLUMNS))
    assert pa.types.is_dictionary(read.schema.field(records.OP).type)
    encoder = TableEncoder(CUSTOMERS, OPTIONS)

    def comparable(messages: list[Message]) -> list[Any]:
        return [(m.key, m.headers, m.position,
                 m.value and {**value(m)["payload"], "ts_ms": 0, "ts_us": 0, "ts_ns": 0})
                for m in messages]

    assert comparable(encoder.encode(read)) == comparable(encoder.encode(batch))


# ---- every kind, checked against its own schema ------------------------------------------------

EVERY_KIND = TableSchema("types", "all", (
    ColumnSpec("id", "int"),
    ColumnSpec("u", "uint64"),
    ColumnSpec("dec", "decimal", precision=12, scale=3),
    ColumnSpec("big_dec", "decimal", precision=50, scale=2),
    ColumnSpec("f", "float"), ColumnSpec("d", "double"),
    ColumnSpec("day", "date"), ColumnSpec("dtm", "datetime", scale=3),
    ColumnSpec("dtu", "datetime", scale=6), ColumnSpec("ts", "timestamp", scale=2),
    ColumnSpec("tm", "time", scale=1), ColumnSpec("y", "year"), ColumnSpec("s", "string"),
    ColumnSpec("bin", "binary"), ColumnSpec("e", "enum", values=("small", "large")),
    ColumnSpec("set_", "set", values=("a", "b")), ColumnSpec("j", "json"),
    ColumnSpec("flag", "bit", precision=1), ColumnSpec("bits", "bit", precision=12),
), ("id",))

EVERY_KIND_ROW = dict(
    id=1, u=Decimal(2 ** 64 - 1), dec=Decimal("-123.456"), big_dec="1" * 48 + ".25", f=1.5,
    d=-2.25, day=dt.date(2024, 2, 29), dtm=dt.datetime(2024, 2, 29, 13, 5, 9, 123000),
    dtu=dt.datetime(2024, 2, 29, 13, 5, 9, 123456),
    ts=dt.datetime(2024, 2, 29, 13, 5, 9, 120000, tzinfo=dt.UTC), tm="-01:02:03.4", y=2024,
    s="x", bin=b"\x00\xff", e="large", set_="a,b", j='{"k":[1]}', flag=1, bits=0xABC)

JSON_TYPES = {"int32": int, "int64": int, "float": float, "double": float, "string": str,
              "bytes": str, "boolean": bool}


def check_against_schema(schema: dict[str, Any], payload: Any) -> None:
    """What the JSON converter would accept reading the message back: every field present in
    schema order, nulls only where optional, each value of its Connect type."""
    if payload is None:
        assert schema["optional"] or "default" in schema, schema
        return
    if schema["type"] == "struct":
        assert list(payload) == [f["field"] for f in schema["fields"]]
        for field in schema["fields"]:
            check_against_schema(field, payload[field["field"]])
        return
    assert isinstance(payload, JSON_TYPES[schema["type"]]), (schema, payload)
    if schema["type"] == "bytes":
        base64.b64decode(payload, validate=True)
    if schema["type"] in ("int32", "int64"):
        bits = 32 if schema["type"] == "int32" else 64
        assert -(2 ** (bits - 1)) <= payload < 2 ** (bits - 1)


@pytest.mark.parametrize("op", ["c", "u", "r", "d"])
def test_every_kind_encodes_to_what_its_schema_says(op: str) -> None:
    image = EVERY_KIND_ROW if op != "d" else {
        name: (EVERY_KIND_ROW[name] if name == "id" else None) for name in EVERY_KIND_ROW}
    encoder = TableEncoder(EVERY_KIND, OPTIONS)
    message = encoder.encode(segment(EVERY_KIND, [row(1, op, **image)]))[0]
    check_against_schema(value(message)["schema"], value(message)["payload"])
    check_against_schema(key(message)["schema"], key(message)["payload"])
    if op != "d":
        after = value(message)["payload"]["after"]
        assert after["u"] == -1 and after["ts"] == "2024-02-29T13:05:09.12Z"
        assert after["tm"] == -3_723_400_000 and after["bits"] == "vAo="


def test_the_schema_check_can_fail() -> None:
    with pytest.raises(AssertionError):
        check_against_schema({"type": "int32", "optional": False}, None)
    with pytest.raises(AssertionError):
        check_against_schema({"type": "int32", "optional": True}, 2 ** 31)
