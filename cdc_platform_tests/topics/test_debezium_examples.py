"""Our events for ``inventory.customers`` against the structure of the examples in Debezium's
MySQL connector documentation, field by field.

The examples (table ``customers``: ``id`` INTEGER primary key, ``first_name``, ``last_name``,
``email`` VARCHAR NOT NULL) are at
https://debezium.io/documentation/reference/stable/connectors/mysql.html, sections
``#mysql-change-event-keys``, ``#mysql-create-events``, ``#mysql-update-events``,
``#mysql-delete-events`` and ``#mysql-tombstone-events``. Their skeleton is written below as
data. Where the hand-written examples disagree with what the connector's code writes, the
code wins and ``CODE_OVER_DOC`` says where the code is; where we differ from Debezium on
purpose, ``OURS_DIFFER`` says why (docs/change-topics.md, "Differences from Debezium").
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from cdc_platform.capture.landing import records
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.topics.envelope import EnvelopeOptions, Message, TableEncoder

PREFIX = "mysql-server-1"
TOPIC = f"{PREFIX}.inventory.customers"

# ---- the documented skeleton -------------------------------------------------------------------
# A field: (name, Connect type, optional, extra schema keys). A struct: its name, optional and
# fields.

ROW_FIELDS = [("id", "int32", False, {}), ("first_name", "string", False, {}),
              ("last_name", "string", False, {}), ("email", "string", False, {})]
DOC_KEY = {"name": f"{TOPIC}.Key", "optional": False, "fields": [ROW_FIELDS[0]]}
DOC_SOURCE_FIELDS = [
    ("version", "string", False, {}), ("connector", "string", False, {}),
    ("name", "string", False, {}), ("ts_ms", "int64", False, {}),
    ("ts_us", "int64", False, {}), ("ts_ns", "int64", False, {}),
    ("snapshot", "boolean", True, {"default": False}), ("db", "string", False, {}),
    ("table", "string", True, {}), ("server_id", "int64", False, {}),
    ("gtid", "string", True, {}), ("file", "string", False, {}), ("pos", "int64", False, {}),
    ("row", "int32", False, {}), ("thread", "int64", True, {}), ("query", "string", True, {}),
]
DOC_ENVELOPE_FIELDS = ["before", "after", "source", "op", "ts_ms", "ts_us", "ts_ns"]
DOC_ENVELOPE = {"name": f"{TOPIC}.Envelope", "optional": False}
VALUE_NAME, SOURCE_NAME = f"{TOPIC}.Value", "io.debezium.connector.mysql.Source"
# Which image each documented event carries ("row": the full row).
DOC_IMAGES = {"c": ("null", "row"), "u": ("row", "row"), "d": ("row", "null")}

# ---- where the connector's code writes something else than the examples show ----------------
# (debezium/debezium: debezium-connector-common/.../schema/SchemaFactory.java
# sourceInfoSchemaBuilder, snapshotRecordSchema, datatypeEnvelopeSchema, transactionBlockSchema;
# .../data/Envelope.java SCHEMA_VERSION; debezium-connector-binlog/.../
# BinlogSourceInfoStructMaker.java; Kafka's JsonConverter writes a null field with a default
# as the default.)

SNAPSHOT_ENUM = ("snapshot", "string", True, {
    "name": "io.debezium.data.Enum", "version": 1,
    "parameters": {"allowed": "true,first,first_in_data_collection,last_in_data_collection,"
                              "last,false,incremental"},
    "default": "false"})
CODE_OVER_DOC = {
    # source: ts_us/ts_ns optional and after db and sequence; snapshot a string enum; the
    # struct has schema version 1 (3.1 and later)
    "source_fields": [
        *DOC_SOURCE_FIELDS[:4], SNAPSHOT_ENUM, ("db", "string", False, {}),
        ("sequence", "string", True, {}), ("ts_us", "int64", True, {}),
        ("ts_ns", "int64", True, {}), *DOC_SOURCE_FIELDS[8:]],
    "source_version": 1,
    # the envelope: version 2, transaction (event.block) before op
    "envelope_fields": ["before", "after", "source", "transaction", "op", "ts_ms", "ts_us",
                        "ts_ns"],
    "envelope_version": 2,
    "transaction": {"name": "event.block", "version": 1, "optional": True,
                    "fields": [("id", "string", False, {}), ("total_order", "int64", False, {}),
                               ("data_collection_order", "int64", False, {})]},
    "snapshot_value_when_streaming": "false",
}

# ---- where we differ from Debezium on purpose --------------------------------------------------

OURS_DIFFER = {
    # the landing zone keeps no integer width: every integer is int64
    "integer_type": "int64",
    # nor NOT NULL: every non-key column is optional
    "non_key_optional": True,
    # no before image is landed: an update's before is null, a delete's holds the key only
    "images": {"c": ("null", "row"), "u": ("null", "row"), "d": ("key", "null"),
               "r": ("null", "row")},
}


def documented_row_fields() -> list[tuple[str, str, bool, dict[str, Any]]]:
    """The documented row fields as we send them (OURS_DIFFER applied)."""
    fields = []
    for name, connect_type, optional, extra in ROW_FIELDS:
        if connect_type == "int32":
            connect_type = OURS_DIFFER["integer_type"]
        if name != "id":
            optional = OURS_DIFFER["non_key_optional"]
        fields.append((name, connect_type, optional, extra))
    return fields


def field_shape(field: dict[str, Any]) -> tuple[str, str, bool, dict[str, Any]]:
    """A field schema as (name, type, optional, the other keys), asserting the JSON
    converter's key order on the way."""
    keys = [k for k in field if k not in ("fields",)]
    order = ["type", "optional", "name", "version", "doc", "parameters", "default", "field"]
    assert keys == [k for k in order if k in field], field
    extra = {k: v for k, v in field.items() if k not in ("type", "optional", "field")}
    return field["field"], field["type"], field["optional"], extra


# ---- our events --------------------------------------------------------------------------------

CUSTOMERS = TableSchema("inventory", "customers", (
    ColumnSpec("id", "int"), ColumnSpec("first_name", "string"),
    ColumnSpec("last_name", "string"), ColumnSpec("email", "string")), ("id",))
ANNE = {"id": 1004, "first_name": "Anne", "last_name": "Kretchmar",
        "email": "annek@noanswer.org"}


def our_events() -> dict[str, list[Message]]:
    """One c, u, d and r of customer 1004, each encoded on its own."""
    meta = {records.GTID: "0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10", records.TS_MS: 1465491411000}
    deleted = {**ANNE, "first_name": None, "last_name": None, "email": None}
    rows = {"c": ANNE, "u": {**ANNE, "first_name": "Anne Marie"}, "d": deleted, "r": ANNE}
    encoder = TableEncoder(CUSTOMERS, EnvelopeOptions(prefix=PREFIX))
    return {op: encoder.encode(pa.Table.from_pylist(
        [{records.POS: position, records.OP: op, **meta, **image}],
        schema=records.segment_schema(CUSTOMERS)))
        for position, (op, image) in enumerate(rows.items(), start=1)}


EVENTS = our_events()


def envelope_of(op: str) -> dict[str, Any]:
    message = EVENTS[op][0]
    assert message.value is not None
    return json.loads(message.value)


@pytest.mark.parametrize("op", ["c", "u", "d", "r"])
def test_the_key_is_the_documented_key(op: str) -> None:
    message = EVENTS[op][0]
    assert message.key is not None
    key = json.loads(message.key)
    assert list(key) == ["schema", "payload"]
    schema = key["schema"]
    assert list(schema) == ["type", "fields", "optional", "name"]  # the converter's order
    assert (schema["type"], schema["name"], schema["optional"]) == \
        ("struct", DOC_KEY["name"], DOC_KEY["optional"])
    assert [field_shape(f) for f in schema["fields"]] == documented_row_fields()[:1]
    assert key["payload"] == {"id": 1004}


@pytest.mark.parametrize("op", ["c", "u", "d", "r"])
def test_the_value_schema_is_the_documented_envelope(op: str) -> None:
    schema = envelope_of(op)["schema"]
    assert (schema["type"], schema["optional"], schema["name"]) == \
        ("struct", DOC_ENVELOPE["optional"], DOC_ENVELOPE["name"])
    assert schema["version"] == CODE_OVER_DOC["envelope_version"]
    fields = {f["field"]: f for f in schema["fields"]}
    assert [f["field"] for f in schema["fields"]] == CODE_OVER_DOC["envelope_fields"]
    assert set(DOC_ENVELOPE_FIELDS) <= set(fields)

    for image in ("before", "after"):
        struct = fields[image]
        assert (struct["type"], struct["optional"], struct["name"]) == ("struct", True,
                                                                        VALUE_NAME)
        assert [field_shape(f) for f in struct["fields"]] == documented_row_fields()

    source = fields["source"]
    assert (source["type"], source["optional"], source["name"], source["version"]) == \
        ("struct", False, SOURCE_NAME, CODE_OVER_DOC["source_version"])
    assert [field_shape(f) for f in source["fields"]] == CODE_OVER_DOC["source_fields"]
    # every documented source field is there, under its documented name
    assert [f[0] for f in DOC_SOURCE_FIELDS if f[0] not in [g[0] for g in
                                                             CODE_OVER_DOC["source_fields"]]] == []

    transaction = fields["transaction"]
    expected = CODE_OVER_DOC["transaction"]
    assert (transaction["name"], transaction["version"], transaction["optional"]) == \
        (expected["name"], expected["version"], expected["optional"])
    assert [field_shape(f) for f in transaction["fields"]] == expected["fields"]

    assert [field_shape(fields[name]) for name in ("op", "ts_ms", "ts_us", "ts_ns")] == [
        ("op", "string", False, {}), ("ts_ms", "int64", True, {}),
        ("ts_us", "int64", True, {}), ("ts_ns", "int64", True, {})]


@pytest.mark.parametrize("op", ["c", "u", "d", "r"])
def test_the_payload_is_the_documented_payload(op: str) -> None:
    payload = envelope_of(op)["payload"]
    assert list(payload) == CODE_OVER_DOC["envelope_fields"]  # schema order
    assert payload["op"] == op and payload["transaction"] is None
    assert all(isinstance(payload[k], int) for k in ("ts_ms", "ts_us", "ts_ns"))

    before, after = OURS_DIFFER["images"][op]
    if op in DOC_IMAGES:  # we differ from the documented images only in the before images
        differing = {side for side, ours, documented in zip(
            ("before", "after"), (before, after), DOC_IMAGES[op], strict=True)
            if ours != documented}
        assert differing == ({"before"} if op in ("u", "d") else set())
    row = {"c": ANNE, "u": {**ANNE, "first_name": "Anne Marie"}, "r": ANNE}.get(op)
    images = {"null": None, "row": row,
              "key": {"id": 1004, "first_name": None, "last_name": None, "email": None}}
    assert payload["before"] == images[before]
    assert payload["after"] == images[after]
    if payload["after"] is not None:
        assert list(payload["after"]) == [f[0] for f in ROW_FIELDS]

    source = payload["source"]
    assert list(source) == [f[0] for f in CODE_OVER_DOC["source_fields"]]
    assert source["connector"] == "mysql" and source["name"] == PREFIX
    assert (source["db"], source["table"]) == ("inventory", "customers")
    assert source["snapshot"] == ("incremental" if op == "r"
                                  else CODE_OVER_DOC["snapshot_value_when_streaming"])
    assert source["gtid"] == "0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10"
    assert source["server_id"] == 0  # a MySQL GTID names no server id
    assert (source["ts_ms"], source["ts_us"], source["ts_ns"]) == \
        (1465491411000, 1465491411000000, 1465491411000000000)
    types = {"string": str, "int64": int, "int32": int}
    for name, connect_type, optional, _ in CODE_OVER_DOC["source_fields"]:
        if source[name] is None:
            assert optional, name
        else:
            assert isinstance(source[name], types[connect_type]), name


def test_a_delete_is_followed_by_the_documented_tombstone() -> None:
    delete, tombstone = EVENTS["d"]
    assert tombstone.key == delete.key  # same key
    assert tombstone.value is None  # a null value
    assert [len(EVENTS[op]) for op in ("c", "u", "r")] == [1, 1, 1]


def test_the_field_shape_check_can_fail() -> None:
    with pytest.raises(AssertionError):
        field_shape({"optional": False, "type": "int64", "field": "id"})
