"""The Kafka messages of a batch of landing-zone change records: key and value in the JSON
envelope Debezium's MySQL connector writes through Kafka Connect's JSON converter
(docs/change-topics.md, "Envelope").

Shape (Debezium 3.1 and later; 2.7 to 3.0 differ only in the source struct's schema ``version``):
the value is ``before, after, source, transaction, op, ts_ms, ts_us, ts_ns`` under the schema
``<topic>.Envelope`` (version 2), ``before``/``after`` of ``<topic>.Value``; the key holds the
primary key columns under ``<topic>.Key``. What the landing zone does not hold is sent as the
schema allows: ``before`` of an update is null (no before image is landed), ``before`` of a
delete carries the key columns only, ``file``/``pos`` (not landed) are ``""``/``0``, ``row``
counts the transaction's records of this table in the batch (0 for snapshot rows, which land
with no GTID), ``thread``/``query`` are null and
``transaction`` is null (no transaction metadata).

An encoder is built once per segment schema: its schema JSON is written once and spliced
into every message; values are converted a column at a time (``topics.encoding``).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.capture.landing import records
from cdc_platform.capture.schema import TableSchema
from cdc_platform.topics import naming
from cdc_platform.topics.encoding import FieldEncoding, field_encoding


def _package_version() -> str:
    try:
        return metadata.version("cdc_platform")
    except metadata.PackageNotFoundError:  # (run from a source tree that is not installed)
        return "unknown"


# What ``source.version`` says: the software that wrote the event (Debezium writes its own
# release there, e.g. "3.1.0.Final"; ours is not Debezium).
CONNECTOR_VERSION = f"cdc_platform {_package_version()}"
CONNECTOR = "mysql"
SOURCE_SCHEMA_NAME = "io.debezium.connector.mysql.Source"
ENVELOPE_VERSION = 2
SOURCE_VERSION = 1  # (Debezium 3.1+; absent before)
# Debezium's SnapshotRecord values, in its order (the enum's ``allowed`` parameter).
SNAPSHOT_VALUES = ("true", "first", "first_in_data_collection", "last_in_data_collection",
                   "last", "false", "incremental")
# Our snapshots are all incremental; Debezium marks incremental snapshot rows so.
SNAPSHOT_INCREMENTAL, SNAPSHOT_FALSE = "incremental", "false"

# Headers of every message (the tombstone after a delete carries its delete's): a consumer
# that remembers the last position it applied skips the repeats a publisher restart sends.
GTID_HEADER = "cdc.gtid"
POSITION_HEADER = "cdc.position"

_COMPACT = (",", ":")
_MARIADB_GTID = re.compile(r"\d+-(\d+)-\d+")


@dataclass(frozen=True)
class EnvelopeOptions:
    prefix: str  # Debezium's topic.prefix; also source.name
    schemas_enable: bool = True  # JSON converter schemas.enable, for key and value
    tombstones_on_delete: bool = True


@dataclass(frozen=True)
class Message:
    key: bytes | None  # JSON; None for a table without a primary key
    value: bytes | None  # JSON; None: a tombstone
    headers: tuple[tuple[str, bytes], ...]
    position: int  # the record's changelog position (__cdc_pos)


def server_id_of(gtid: str | None) -> int:
    """``source.server_id``: MariaDB's GTID ``domain-server-sequence`` names the server that
    wrote the transaction; MySQL's ``uuid:n`` names none (0, as Debezium's snapshot events)."""
    match = _MARIADB_GTID.fullmatch(gtid or "")
    return int(match.group(1)) if match else 0


_json = json.JSONEncoder(separators=_COMPACT, ensure_ascii=False).encode


def _struct_schema(fields: list[dict[str, Any]], optional: bool, name: str | None = None,
                   version: int | None = None) -> dict[str, Any]:
    """A struct's schema in the JSON converter's key order (type, fields, optional, name,
    version)."""
    schema: dict[str, Any] = {"type": "struct", "fields": fields, "optional": optional}
    if name is not None:
        schema["name"] = name
    if version is not None:
        schema["version"] = version
    return schema


def _primitive(field: str, connect_type: str, optional: bool) -> dict[str, Any]:
    return {"type": connect_type, "optional": optional, "field": field}


def source_schema() -> dict[str, Any]:
    """The ``source`` struct of Debezium's MySQL connector, field for field."""
    snapshot = {"type": "string", "optional": True, "name": "io.debezium.data.Enum",
                "version": 1, "parameters": {"allowed": ",".join(SNAPSHOT_VALUES)},
                "default": SNAPSHOT_FALSE, "field": "snapshot"}
    fields = [
        _primitive("version", "string", False),
        _primitive("connector", "string", False),
        _primitive("name", "string", False),
        _primitive("ts_ms", "int64", False),
        snapshot,
        _primitive("db", "string", False),
        _primitive("sequence", "string", True),
        _primitive("ts_us", "int64", True),
        _primitive("ts_ns", "int64", True),
        _primitive("table", "string", True),
        _primitive("server_id", "int64", False),
        _primitive("gtid", "string", True),
        _primitive("file", "string", False),
        _primitive("pos", "int64", False),
        _primitive("row", "int32", False),
        _primitive("thread", "int64", True),
        _primitive("query", "string", True),
    ]
    return {**_struct_schema(fields, False, SOURCE_SCHEMA_NAME, SOURCE_VERSION),
            "field": "source"}


def transaction_schema() -> dict[str, Any]:
    """Debezium's ``event.block`` (always null here: no transaction metadata)."""
    fields = [_primitive("id", "string", False), _primitive("total_order", "int64", False),
              _primitive("data_collection_order", "int64", False)]
    return {**_struct_schema(fields, True, "event.block", 1), "field": "transaction"}


class TableEncoder:
    """The messages of one table's records written with one segment schema."""

    def __init__(self, schema: TableSchema, options: EnvelopeOptions) -> None:
        missing = [k for k in schema.primary_key if k not in schema.column_names]
        if missing:
            raise ValueError(f"table {schema.table_id}: key column(s) {missing} are not among "
                             f"its columns {list(schema.column_names)}")
        self.schema = schema
        self.options = options
        self.topic = naming.topic_name(options.prefix, schema.database, schema.table)
        keys = set(schema.primary_key)
        self._fields: list[FieldEncoding] = [
            field_encoding(c, optional=c.name not in keys) for c in schema.columns]
        by_name = {f.column.name: f for f in self._fields}
        self._key_fields = [by_name[k] for k in schema.primary_key]

        value_struct = _struct_schema([f.field_schema() for f in self._fields], True,
                                      naming.value_schema_name(self.topic))
        envelope = _struct_schema([
            {**value_struct, "field": "before"},
            {**value_struct, "field": "after"},
            source_schema(),
            transaction_schema(),
            _primitive("op", "string", False),
            _primitive("ts_ms", "int64", True),
            _primitive("ts_us", "int64", True),
            _primitive("ts_ns", "int64", True),
        ], False, naming.envelope_schema_name(self.topic), ENVELOPE_VERSION)
        key_struct = _struct_schema([f.field_schema() for f in self._key_fields], False,
                                    naming.key_schema_name(self.topic))
        self.value_schema: dict[str, Any] = envelope
        self.key_schema: dict[str, Any] | None = key_struct if self._key_fields else None
        # The texts spliced around every payload.
        if options.schemas_enable:
            self._value_head = b'{"schema":' + _json(envelope).encode() + b',"payload":'
            self._key_head = b'{"schema":' + _json(key_struct).encode() + b',"payload":'
            self._tail = b"}"
        else:
            self._value_head = self._key_head = self._tail = b""

    def encode(self, records_table: pa.Table) -> list[Message]:
        """The messages of ``records_table``: the rows of one segment (change metadata, user
        columns, possibly snapshot-record columns) in position order. ``a``/``s`` records are
        skipped; each ``c``/``u``/``d``/``r`` gives one message, a ``d`` then a tombstone
        (``tombstones_on_delete``)."""
        rows = self._row_records(records_table)
        if rows.num_rows == 0:
            return []
        processed_ns = time.time_ns()
        envelope_ts = (processed_ns // 1_000_000, processed_ns // 1_000, processed_ns)
        positions = rows.column(records.POS).to_pylist()
        gtids = rows.column(records.GTID).to_pylist()
        ops = rows.column(records.OP).to_pylist()
        commit_ms = rows.column(records.TS_MS).to_pylist()
        columns = [f.values(rows.column(f.column.name)) for f in self._fields]
        names = [f.column.name for f in self._fields]
        key_names = [f.column.name for f in self._key_fields]
        key_indexes = [names.index(k) for k in key_names]

        messages: list[Message] = []
        row_in_transaction, previous_gtid = 0, None
        for index, values in enumerate(zip(*columns, strict=True)):
            # (snapshot records land with an empty GTID: they belong to no transaction)
            position, gtid, op = positions[index], gtids[index] or None, ops[index]
            same_transaction = gtid is not None and gtid == previous_gtid
            row_in_transaction = row_in_transaction + 1 if same_transaction else 0
            previous_gtid = gtid
            image = dict(zip(names, values, strict=True))
            if commit_ms[index] is None:
                raise ValueError(f"table {self.schema.table_id}: the record at changelog "
                                 f"position {position} has no commit time ({records.TS_MS})")
            source = self._source(commit_ms[index], op, gtid, row_in_transaction)
            before, after = (image, None) if op == records.DELETE else (None, image)
            payload = {"before": before, "after": after, "source": source, "transaction": None,
                       "op": op, "ts_ms": envelope_ts[0], "ts_us": envelope_ts[1],
                       "ts_ns": envelope_ts[2]}
            key = self._key({k: values[i] for k, i in zip(key_names, key_indexes, strict=True)})
            headers = ((GTID_HEADER, (gtid or "").encode()),
                       (POSITION_HEADER, str(position).encode()))
            value = b"".join((self._value_head, _json(payload).encode(), self._tail))
            messages.append(Message(key, value, headers, position))
            if op == records.DELETE and self.options.tombstones_on_delete:
                messages.append(Message(key, None, headers, position))
        return messages

    def _row_records(self, records_table: pa.Table) -> pa.Table:
        ops = records_table.column(records.OP)
        if pa.types.is_dictionary(ops.type):
            ops = ops.cast(ops.type.value_type)
        known = pc.is_in(ops, value_set=pa.array([*records.ROW_OPS, *records.INSTRUCTION_OPS]))
        if not pc.all(pc.fill_null(known, False)).as_py():
            unknown = sorted(set(ops.filter(pc.invert(pc.fill_null(known, False))).to_pylist()),
                             key=str)
            raise ValueError(f"table {self.schema.table_id}: unknown change op(s) {unknown} in "
                             "the records (the landing zone's ops are c, u, d, r, a, s)")
        return records_table.filter(pc.is_in(ops, value_set=pa.array(records.ROW_OPS)))

    def _source(self, commit_ms: int, op: str, gtid: str | None, row: int) -> dict[str, Any]:
        return {
            "version": CONNECTOR_VERSION, "connector": CONNECTOR, "name": self.options.prefix,
            "ts_ms": commit_ms,
            "snapshot": SNAPSHOT_INCREMENTAL if op == records.SNAPSHOT_ROW else SNAPSHOT_FALSE,
            "db": self.schema.database, "sequence": None,
            "ts_us": commit_ms * 1_000, "ts_ns": commit_ms * 1_000_000,
            "table": self.schema.table, "server_id": server_id_of(gtid), "gtid": gtid,
            "file": "", "pos": 0, "row": row, "thread": None, "query": None,
        }

    def _key(self, key: dict[str, Any]) -> bytes | None:
        if not self._key_fields:
            return None
        return b"".join((self._key_head, _json(key).encode(), self._tail))
