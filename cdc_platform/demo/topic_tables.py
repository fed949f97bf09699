"""A plain Kafka consumer of the change topics, as a team's own service would be: it reads a
table's topic from the beginning with confluent-kafka alone, decodes each value by the schema
the message carries (Debezium's semantic types: nothing of ``cdc_platform`` is needed to read
them), applies creates, updates, snapshot reads and deletes by key, and compares the table it
rebuilt with the source (``make demo``'s last lines; the change-topic tests).

Repeats (a publisher restarted after a kill sends its unsaved batch again) are skipped by the
``cdc.position`` header: an event whose position is not above the newest one applied to its
key changes nothing.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from confluent_kafka import Consumer, TopicPartition

EPOCH = dt.datetime(1970, 1, 1)


@dataclass(frozen=True)
class TopicEvent:
    """One message of a change topic, decoded: key (column -> value) and envelope (None for
    a tombstone), with the platform's headers."""

    partition: int
    offset: int
    key: dict[str, Any] | None
    value: dict[str, Any] | None  # {"schema": ..., "payload": ...} or the payload alone
    headers: dict[str, str]

    @property
    def payload(self) -> dict[str, Any] | None:
        if self.value is None:
            return None
        return self.value.get("payload", self.value)

    @property
    def position(self) -> int:
        return int(self.headers.get("cdc.position", "0"))


def read_topic(bootstrap_servers: str, topic: str, idle_seconds: float = 2.0,
               max_seconds: float = 900.0, isolation: str = "read_committed",
               extra: dict[str, str] | None = None) -> list[TopicEvent]:
    """Every message of ``topic`` from offset 0 of each partition, in offset order per
    partition. Reading ends once every partition is read up to the end offset the broker
    reports, asked again after each quiet moment, and nothing more arrived for
    ``idle_seconds`` (``max_seconds`` at most): a consumer under load or a broker that pauses
    while it serves a large fetch stops no read early (it did, on idle time alone, in a busy
    demo). Partitions are assigned, not joined (no consumer group)."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"rebuild-{topic}",
                         "enable.auto.commit": False, "isolation.level": isolation,
                         **(extra or {})})
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions = sorted(metadata.topics[topic].partitions) if topic in metadata.topics \
            else []
        if not partitions:
            return []
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        events: list[TopicEvent] = []
        deadline = time.monotonic() + max_seconds
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            messages = consumer.consume(1000, 0.2)
            if not messages:
                if time.monotonic() - quiet_since >= idle_seconds and _at_end(
                        consumer, topic, partitions):
                    break
                continue
            quiet_since = time.monotonic()
            for message in messages:
                if message.error():
                    continue  # (end of partition and passing errors: keep reading)
                key, value = message.key(), message.value()
                events.append(TopicEvent(
                    message.partition(), message.offset(),
                    None if key is None else _decoded_key(json.loads(key)),
                    None if value is None else json.loads(value),
                    {k: v.decode() if isinstance(v, bytes) else str(v)
                     for k, v in (message.headers() or [])}))
        return events
    finally:
        consumer.close()


def _at_end(consumer: Consumer, topic: str, partitions: list[int]) -> bool:
    """Whether the consumer's position (past transaction markers too) has reached the end
    offset the broker reports in every partition (Tansu reports the base offset of the last
    record batch + 1: a read that reached it has fetched that whole batch)."""
    positions = consumer.position([TopicPartition(topic, p) for p in partitions])
    for position in positions:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, position.partition),
                                                    timeout=10)
        read_to = max(position.offset, 0)  # (negative: nothing read yet)
        if read_to < high:
            return False
    return True


def _decoded_key(document: Any) -> dict[str, Any]:
    """A key message's columns, decoded by its schema when it carries one."""
    if not (isinstance(document, dict) and "payload" in document):
        return document
    fields = {f["field"]: f for f in (document.get("schema") or {}).get("fields", [])}
    return {name: decode(fields.get(name), value)
            for name, value in document["payload"].items()}


@dataclass
class RebuiltTable:
    """A table rebuilt from its change topic: rows by key (the key's values in key order)."""

    rows: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    applied: dict[tuple[Any, ...], int] = field(default_factory=dict)  # key -> newest position
    events: int = 0
    repeats: int = 0
    tombstones: int = 0
    ops: dict[str, int] = field(default_factory=dict)

    def apply(self, event: TopicEvent) -> None:
        if event.key is None:
            raise ValueError("a change event without a key: the table has no primary key; "
                             "it cannot be rebuilt by key")
        key = tuple(event.key.values())
        payload = event.payload
        if payload is None:
            self.tombstones += 1
            return
        self.events += 1
        if event.position and event.position <= self.applied.get(key, 0):
            self.repeats += 1
            return
        self.applied[key] = event.position
        op = payload["op"]
        self.ops[op] = self.ops.get(op, 0) + 1
        if op == "d":
            self.rows.pop(key, None)
            return
        schema = _after_schema(event.value)
        after = payload["after"]
        self.rows[key] = {name: decode(schema.get(name), value) for name, value in after.items()}


def rebuild(events: Iterable[TopicEvent]) -> RebuiltTable:
    table = RebuiltTable()
    for event in events:
        table.apply(event)
    return table


def _after_schema(value: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The ``after`` struct's fields by name, from a message with its schema (else empty: the
    values are then taken as the JSON has them)."""
    if not value or "schema" not in value:
        return {}
    for envelope_field in value["schema"]["fields"]:
        if envelope_field["field"] == "after":
            return {f["field"]: f for f in envelope_field["fields"]}
    return {}


def decode(schema: dict[str, Any] | None, value: Any) -> Any:
    """A field's JSON value as the Python value its Connect schema says (Debezium's semantic
    types), as any consumer decodes it."""
    if value is None or schema is None:
        return value
    name, kind = schema.get("name"), schema.get("type")
    if name == "org.apache.kafka.connect.data.Decimal":
        unscaled = int.from_bytes(base64.b64decode(value), "big", signed=True)
        return Decimal(f"{unscaled}E-{int(schema['parameters']['scale'])}")  # (exact)
    if name == "io.debezium.time.Date":
        return dt.date(1970, 1, 1) + dt.timedelta(days=value)
    if name == "io.debezium.time.Timestamp":
        return EPOCH + dt.timedelta(milliseconds=value)
    if name == "io.debezium.time.MicroTimestamp":
        return EPOCH + dt.timedelta(microseconds=value)
    if name == "io.debezium.time.ZonedTimestamp":
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).replace(tzinfo=None)
    if name in ("io.debezium.time.MicroTime", "io.debezium.time.Time"):
        unit = 1 if name.endswith("MicroTime") else 1000
        return dt.timedelta(microseconds=value * unit)
    if name == "io.debezium.data.Json":
        return json.loads(value)
    if name == "io.debezium.data.EnumSet":
        return frozenset(value.split(",")) if value else frozenset()
    if name == "io.debezium.data.Bits":
        return int.from_bytes(base64.b64decode(value), "little")
    if kind == "bytes":
        return base64.b64decode(value)
    if kind == "boolean":
        return bool(value)
    if kind == "float":
        return struct.unpack("f", struct.pack("f", value))[0]
    return value


def source_value(value: Any, schema: dict[str, Any] | None) -> Any:
    """A value read from the source with PyMySQL (session time zone UTC), in the form
    ``decode`` gives the same column's event value, to compare them."""
    if value is None or schema is None:
        return value
    name, kind = schema.get("name"), schema.get("type")
    if name == "io.debezium.data.Json":
        return json.loads(value)
    if name == "io.debezium.data.EnumSet":
        members = value if isinstance(value, (set, frozenset)) else \
            (value.split(",") if value else [])
        return frozenset(members)
    if name == "io.debezium.data.Bits" or (kind == "boolean" and isinstance(value, bytes)):
        number = int.from_bytes(value, "big") if isinstance(value, bytes) else int(value)
        return bool(number) if kind == "boolean" else number
    if kind == "float":
        return struct.unpack("f", struct.pack("f", float(value)))[0]
    if kind == "int64" and name in (None, "io.debezium.time.Year") and isinstance(value, int) \
            and value >= 2**63:
        return value - 2**64  # (BIGINT UNSIGNED in Debezium's "long" mode)
    return bytes(value) if isinstance(value, bytearray) else value


def differences(rebuilt: RebuiltTable, source_rows: list[dict[str, Any]],
                key_columns: list[str], schema: dict[str, dict[str, Any]]) -> list[str]:
    """What differs between the rebuilt table and the source's rows (each a column -> value
    dict as PyMySQL reads it with a UTC session): missing, extra and different keys, with
    their columns; compares the columns the events carry (excluded columns are not sent), and
    finds a row without a column the newest event's schema has."""
    found: list[str] = []
    source = {tuple(source_value(row[k], schema.get(k)) for k in key_columns): row
              for row in source_rows}
    for key, row in source.items():
        built = rebuilt.rows.get(key)
        if built is None:
            found.append(f"missing {key}")
            continue
        missing = [column for column in schema if column not in built]
        if missing:  # (its last event predates a column the newest events carry)
            found.append(f"{key}: no value for {', '.join(missing)}")
        for column, value in built.items():
            expected = source_value(row.get(column), schema.get(column))
            if expected != value:
                found.append(f"{key}.{column}: source {expected!r}, topic {value!r}")
    found += [f"extra {key}" for key in rebuilt.rows if key not in source]
    return found


def compare_with_source(bootstrap_servers: str, topic: str, connection: Any, database: str,
                        table: str, key_columns: list[str]) -> tuple[RebuiltTable, list[str]]:
    """Rebuild ``topic`` and compare it with ``database.table`` read through ``connection``
    (a PyMySQL connection; its session time zone is set to UTC for TIMESTAMP columns)."""
    events = read_topic(bootstrap_servers, topic)
    rebuilt = rebuild(events)
    schema: dict[str, dict[str, Any]] = {}
    for event in reversed(events):  # (the newest event's schema: the table's current columns)
        if event.value is not None:
            schema = _after_schema(event.value)
            break
    with connection.cursor() as cursor:
        cursor.execute("SET time_zone = '+00:00'")
        quoted = ".".join("`" + part.replace("`", "``") + "`" for part in (database, table))
        cursor.execute(f"SELECT * FROM {quoted}")
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return rebuilt, differences(rebuilt, rows, key_columns, schema)
