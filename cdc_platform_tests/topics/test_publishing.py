"""Change topics end to end on the real server and broker: rows written to MariaDB, captured by
the engine, published, then read back by a plain consumer (``demo.topic_tables``) and compared
with Debezium's MySQL envelope (/work/debezium-notes.md has the reference) and with the source.

Where the platform knowingly differs from Debezium (``topics/encoding.py``, ``topics/envelope.py``
docstrings), the tests assert the platform's documented form and say so: every integer field is
int64, non-key fields are optional, ``before`` of an update is null and ``before`` of a delete
holds the key (other columns null), ``source.file``/``pos`` are ``""``/0."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from cdc_platform.capture.ddl.stale_markers import resolve_markers
from cdc_platform.demo.topic_tables import TopicEvent, compare_with_source, read_topic, rebuild
from cdc_platform.topics.producer import PublishError
from cdc_platform.topics.publisher import PublisherStats, open_publisher
from cdc_platform_tests.capture.snapshot.reading.live_engine import (
    invisible,
    snapshot_reader,
    snapshot_while_writing,
    streaming,
)
from cdc_platform_tests.conftest import CdcEnv

DECIMAL = "org.apache.kafka.connect.data.Decimal"


def _with_topics(env: CdcEnv, **options: Any) -> CdcEnv:
    env.overrides["change_topics"] = {"enabled": True, "poll_seconds": 0.1, **options}
    return env


def _publish(env: CdcEnv) -> PublisherStats:
    """Publish everything the engine has landed so far."""
    return open_publisher(env.settings).run(threading.Event(), stop_when_caught_up=True)


def _topic(env: CdcEnv, table: str) -> str:
    return f"{env.server_name}.{env.db}.{table}"


def _events(env: CdcEnv, table: str) -> list[TopicEvent]:
    return read_topic(env.kafka_bootstrap, _topic(env, table), idle_seconds=1.5)


def _fields(event: TopicEvent, struct: str = "after") -> dict[str, dict[str, Any]]:
    """The ``after`` (or ``before``) struct's field schemas by name."""
    assert event.value is not None
    [found] = [f for f in event.value["schema"]["fields"] if f["field"] == struct]
    return {f["field"]: f for f in found["fields"]}


def _compare(env: CdcEnv, table: str, keys: list[str]) -> tuple[Any, list[str]]:
    with env.connect() as conn:
        return compare_with_source(env.kafka_bootstrap, _topic(env, table), conn, env.db, table,
                                   keys)


def _rebuilt_equals_source(env: CdcEnv, table: str, keys: list[str]) -> Any:
    """The topic rebuilt equals the source table, every column of every row (the demo's
    comparison checks the columns the events carry; a row whose events predate a new column
    would pass it, so the column sets are checked here too)."""
    rebuilt, differences = _compare(env, table, keys)
    assert differences == [], differences
    columns = [row[0] for row in env.query(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() "
        f"AND table_name = '{table}' ORDER BY ordinal_position")]
    assert all(list(row) == columns for row in rebuilt.rows.values()), (columns, rebuilt.rows)
    return rebuilt


def _field(connect_type: str, name: str | None = None, parameters: dict[str, str] | None = None,
           optional: bool = True) -> dict[str, Any]:
    """A field schema as the JSON converter writes it (without ``field``)."""
    schema: dict[str, Any] = {"type": connect_type, "optional": optional}
    if name is not None:
        schema |= {"name": name, "version": 1}
    if parameters is not None:
        schema["parameters"] = parameters
    return schema


# ---- 1. every column type -----------------------------------------------------------------------

# column -> (definition, its field schema). Debezium's width types (int16 for TINYINT/SMALLINT,
# int32 for MEDIUMINT/INT/SMALLINT UNSIGNED) are int64 here: the landing zone keeps no width.
_COLUMNS: dict[str, tuple[str, dict[str, Any]]] = {
    "ti": ("TINYINT", _field("int64")), "tiu": ("TINYINT UNSIGNED", _field("int64")),
    "si": ("SMALLINT", _field("int64")), "siu": ("SMALLINT UNSIGNED", _field("int64")),
    "mi": ("MEDIUMINT", _field("int64")), "miu": ("MEDIUMINT UNSIGNED", _field("int64")),
    "i": ("INT", _field("int64")), "iu": ("INT UNSIGNED", _field("int64")),
    "bi": ("BIGINT", _field("int64")), "biu": ("BIGINT UNSIGNED", _field("int64")),
    "d10": ("DECIMAL(10,2)", _field("bytes", DECIMAL, {"scale": "2",
                                                       "connect.decimal.precision": "10"})),
    "d65": ("DECIMAL(65,30)", _field("bytes", DECIMAL, {"scale": "30",
                                                        "connect.decimal.precision": "65"})),
    "f": ("FLOAT", _field("float")), "dbl": ("DOUBLE", _field("double")),
    "b1": ("BIT(1)", _field("boolean")),
    "b10": ("BIT(10)", _field("bytes", "io.debezium.data.Bits", {"length": "10"})),
    "c": ("CHAR(10) CHARACTER SET utf8mb4", _field("string")),
    "vc": ("VARCHAR(20) CHARACTER SET utf8mb4", _field("string")),
    "tx": ("TEXT CHARACTER SET utf8mb4", _field("string")),
    "l1": ("VARCHAR(20) CHARACTER SET latin1", _field("string")),
    "bn": ("BINARY(4)", _field("bytes")), "vb": ("VARBINARY(8)", _field("bytes")),
    "bl": ("BLOB", _field("bytes")),
    "dt": ("DATE", _field("int32", "io.debezium.time.Date")),
    "t0": ("TIME", _field("int64", "io.debezium.time.MicroTime")),
    "t6": ("TIME(6)", _field("int64", "io.debezium.time.MicroTime")),
    "dt0": ("DATETIME", _field("int64", "io.debezium.time.Timestamp")),
    "dt3": ("DATETIME(3)", _field("int64", "io.debezium.time.Timestamp")),
    "dt6": ("DATETIME(6)", _field("int64", "io.debezium.time.MicroTimestamp")),
    "ts0": ("TIMESTAMP NULL", _field("string", "io.debezium.time.ZonedTimestamp")),
    "ts6": ("TIMESTAMP(6) NULL", _field("string", "io.debezium.time.ZonedTimestamp")),
    "y": ("YEAR", _field("int32", "io.debezium.time.Year")),
    "e": ("ENUM('a','b','é') CHARACTER SET utf8mb4",
          _field("string", "io.debezium.data.Enum", {"allowed": "a,b,é"})),
    "s": ("SET('x','y','z')", _field("string", "io.debezium.data.EnumSet", {"allowed": "x,y,z"})),
    # MariaDB's JSON is LONGTEXT with a json_valid check: no JSON type reaches the binlog or
    # information_schema, so it is a plain string holding the text as stored (Debezium's MySQL
    # connector names a MySQL JSON column io.debezium.data.Json).
    "j": ("JSON", _field("string")),
}

_D65_MIN = "-" + "9" * 35 + "." + "9" * 30
# The SQL of each row and the values Debezium's defaults give it (JSON forms).
_ROW_1 = {
    "ti": ("-128", -128), "tiu": ("255", 255), "si": ("-32768", -32768),
    "siu": ("65535", 65535), "mi": ("-8388608", -8388608), "miu": ("16777215", 16777215),
    "i": ("-2147483648", -2147483648), "iu": ("4294967295", 4294967295),
    "bi": ("-9223372036854775808", -9223372036854775808),
    "biu": ("18446744073709551615", -1),  # bigint.unsigned.handling.mode=long wraps
    # unscaled -9999999999, big-endian two's complement, minimal: ff ab f4 1c 01
    "d10": ("-99999999.99", "/av0HAE="),
    # unscaled -(10**65 - 1) in 28 bytes
    "d65": (_D65_MIN, "/wzp2OOAPG91dBC5sca6EIXayfYAAAAAAAAAAQ=="),
    "f": ("0.1", 0.1), "dbl": ("1.7976931348623157e308", 1.7976931348623157e308),
    "b1": ("b'1'", True),
    "b10": ("b'1000000001'", "AQI="),  # 513 little-endian: 01 02
    "c": ("'😀 é'", "😀 é"), "vc": ("'abc😀'", "abc😀"), "tx": ("'中文 𝄞'", "中文 𝄞"),
    "l1": ("'é ÿ'", "é ÿ"),
    "bn": ("'ab'", "YWIAAA=="),  # padded to 4 bytes: 61 62 00 00
    "vb": ("''", ""), "bl": ("UNHEX('000000')", "AAAA"),
    "dt": ("'2024-02-29'", 19782),
    "t0": ("'-838:59:59'", -3_020_399_000_000), "t6": ("'25:00:00.000001'", 90_000_000_001),
    "dt0": ("'2018-06-20 06:37:03'", 1529476623000),
    "dt3": ("'2018-06-20 06:37:03.123'", 1529476623123),
    "dt6": ("'2018-06-20 06:37:03.123456'", 1529476623123456),
    "ts0": ("'2018-06-20 13:37:03'", "2018-06-20T13:37:03Z"),
    "ts6": ("'2018-06-20 13:37:03.120000'", "2018-06-20T13:37:03.120000Z"),
    "y": ("2024", 2024), "e": ("'é'", "é"), "s": ("'y'", "y"),
    "j": ("'{\"b\": 1, \"a\": [1.5, \"x\", null]}'", '{"b": 1, "a": [1.5, "x", null]}'),
}
_ROW_3 = {
    "ti": ("127", 127), "tiu": ("0", 0), "si": ("32767", 32767), "siu": ("0", 0),
    "mi": ("8388607", 8388607), "miu": ("0", 0), "i": ("2147483647", 2147483647),
    "iu": ("0", 0), "bi": ("9223372036854775807", 9223372036854775807),
    "biu": ("9223372036854775808", -9223372036854775808),
    "d10": ("0.01", "AQ=="), "d65": ("0", "AA=="),
    "f": ("-0.5", -0.5), "dbl": ("5e-324", 5e-324),
    "b1": ("b'0'", False), "b10": ("b'0'", "AAA="),
    "c": ("''", ""), "vc": ("''", ""), "tx": ("''", ""), "l1": ("''", ""),
    "bn": ("UNHEX('00000000')", "AAAAAA=="), "vb": ("UNHEX('00')", "AA=="), "bl": ("''", ""),
    "dt": ("'1969-12-31'", -1), "t0": ("'00:00:00'", 0),
    "t6": ("'-00:00:01.250000'", -1_250_000),
    "dt0": ("'1000-01-01 00:00:00'", -30610224000000),
    "dt3": ("'1900-01-01 00:00:00.001'", -2208988799999),
    "dt6": ("'1969-12-31 23:59:59.999999'", -1),
    "ts0": ("'1970-01-01 00:00:01'", "1970-01-01T00:00:01Z"),
    "ts6": ("'2038-01-19 03:14:07.999999'", "2038-01-19T03:14:07.999999Z"),
    "y": ("1901", 1901), "e": ("'a'", "a"), "s": ("'z,x'", "x,z"), "j": ("'[]'", "[]"),
}


def _insert(row_id: int, row: dict[str, tuple[str, Any]]) -> str:
    columns = ", ".join(["id", *row])
    return f"INSERT INTO types ({columns}) VALUES ({row_id}, " + \
        ", ".join(sql for sql, _ in row.values()) + ")"


def _image(row_id: int, row: dict[str, tuple[str, Any]] | None) -> dict[str, Any]:
    return {"id": row_id, **{c: (row[c][1] if row else None) for c in _COLUMNS}}


def test_every_column_types_encoding(signal_env: CdcEnv) -> None:
    env = _with_topics(signal_env)
    definitions = ", ".join(f"{name} {definition}" for name, (definition, _) in _COLUMNS.items())
    env.execute(f"CREATE TABLE types (id INT PRIMARY KEY, {definitions}) DEFAULT CHARSET=utf8mb4")
    env.execute("SET time_zone = '+00:00'", _insert(1, _ROW_1),
                "INSERT INTO types (id) VALUES (2)", _insert(3, _ROW_3))
    env.execute("UPDATE types SET vc = 'changed', d10 = 12.34 WHERE id = 1",
                "DELETE FROM types WHERE id = 3")
    env.catch_up()
    stats = _publish(env)
    assert stats.messages == {f"{env.db}.types": 6}

    events = _events(env, "types")
    topic = _topic(env, "types")
    assert [(e.key, e.payload and e.payload["op"]) for e in events] == [
        ({"id": 1}, "c"), ({"id": 2}, "c"), ({"id": 3}, "c"), ({"id": 1}, "u"),
        ({"id": 3}, "d"), ({"id": 3}, None)]  # (the tombstone: the key, a null value)
    assert [e.position for e in events] == [1, 2, 3, 4, 5, 5]

    # schemas: the Value struct field for field, the envelope around it
    expected_fields = {"id": {**_field("int64", optional=False), "field": "id"},
                       **{c: {**schema, "field": c} for c, (_, schema) in _COLUMNS.items()}}
    for event in events[:5]:
        assert _fields(event, "after") == _fields(event, "before") == expected_fields
        envelope = event.value["schema"]  # type: ignore[index]
        assert [f["field"] for f in envelope["fields"]] == [
            "before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"]
        assert (envelope["name"], envelope["version"], envelope["optional"]) == (
            f"{topic}.Envelope", 2, False)
        assert {f["field"]: f.get("name") for f in envelope["fields"][:4]} == {
            "before": f"{topic}.Value", "after": f"{topic}.Value",
            "source": "io.debezium.connector.mysql.Source", "transaction": "event.block"}
        [snapshot] = [f for f in envelope["fields"][2]["fields"] if f["field"] == "snapshot"]
        assert snapshot == {
            "type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
            "parameters": {"allowed": "true,first,first_in_data_collection,"
                                      "last_in_data_collection,last,false,incremental"},
            "default": "false", "field": "snapshot"}

    payloads = [e.payload for e in events[:5]]
    assert [(p["before"], p["after"]) for p in payloads] == [  # type: ignore[index]
        (None, _image(1, _ROW_1)), (None, _image(2, None)), (None, _image(3, _ROW_3)),
        (None, _image(1, {**_ROW_1, "vc": ("", "changed"), "d10": ("", "BNI=")})),
        (_image(3, None), None)]
    gtids = [e.headers["cdc.gtid"] for e in events]
    assert gtids[0] == gtids[1] == gtids[2] != gtids[3] == gtids[4] == gtids[5]
    for event, row in zip(events[:5], [0, 1, 2, 0, 1], strict=True):
        source = event.payload["source"]  # type: ignore[index]
        assert source["version"].startswith("cdc_platform ")
        assert source["ts_ms"] % 1000 == 0 and source["ts_ms"] > 1_700_000_000_000
        assert {k: v for k, v in source.items() if k not in ("version", "ts_ms")} == {
            "connector": "mysql", "name": env.server_name, "snapshot": "false", "db": env.db,
            "sequence": None, "ts_us": source["ts_ms"] * 1000,
            "ts_ns": source["ts_ms"] * 1_000_000, "table": "types",
            "server_id": env.mariadb.server_id, "gtid": event.headers["cdc.gtid"], "file": "",
            "pos": 0, "row": row, "thread": None, "query": None}
        assert event.payload["transaction"] is None  # type: ignore[index]

    _rebuilt_equals_source(env, "types", ["id"])


# ---- 2. snapshot rows ---------------------------------------------------------------------------


def test_incremental_snapshot_rows_arrive_as_reads_in_changelog_order(signal_env: CdcEnv) -> None:
    env = _with_topics(signal_env, partitions=2)
    env.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10,2))")
    # rows only a snapshot can bring: the binlog never sees them
    invisible(env, "INSERT INTO items SELECT seq, CONCAT('n', seq), seq / 4 FROM seq_1_to_600")
    written: set[int] = set()

    def write(done: threading.Event) -> None:
        rng = random.Random(11)
        with env.mariadb.root_connect(database=env.db, autocommit=True) as conn, \
                conn.cursor() as cur:
            while not done.is_set():
                key = rng.randint(1, 700)
                if rng.random() < 0.7:
                    cur.execute("INSERT INTO items VALUES (%s, 'w', 1) ON DUPLICATE KEY UPDATE "
                                "name = CONCAT(name, '+'), price = price + 1", (key,))
                else:
                    cur.execute("DELETE FROM items WHERE id = %s", (key,))
                written.add(key)
                time.sleep(0.005)

    result = snapshot_while_writing(env, "items", write, chunk_size=50)
    assert result.status == "done"
    env.catch_up()
    _publish(env)

    events = _events(env, "items")
    assert {e.partition for e in events} == {0, 1}
    reads = [e for e in events if e.payload and e.payload["op"] == "r"]
    assert len(reads) >= 600 - len(written)
    assert all(e.payload["before"] is None and e.payload["source"]["snapshot"] == "incremental"
               for e in reads)  # type: ignore[index]
    others = [e for e in events if e.payload and e.payload["op"] != "r"]
    assert others and all(e.payload["source"]["snapshot"] == "false"
                          for e in others)  # type: ignore[index]
    for partition in (0, 1):
        mine = [e for e in events if e.partition == partition]
        assert [e.offset for e in mine] == sorted(e.offset for e in mine)
        values = [e.position for e in mine if e.value is not None]
        assert values == sorted(values) and len(set(values)) == len(values), values
        # a tombstone carries its delete's position, right after it
        for before, event in zip(mine, mine[1:], strict=False):
            if event.value is None:
                assert before.payload["op"] == "d"  # type: ignore[index]
                assert (before.key, before.position) == (event.key, event.position)

    rebuilt = _rebuilt_equals_source(env, "items", ["id"])
    untouched = set(range(1, 601)) - written
    last_op: dict[int, str] = {}
    for event in events:
        if event.payload is not None:
            last_op[event.key["id"]] = event.payload["op"]  # type: ignore[index]
    assert {k for k in untouched if last_op.get(k) == "r"} == untouched
    assert len(rebuilt.rows) == env.query("SELECT COUNT(*) FROM items")[0][0]


# ---- 3-5. DDL ------------------------------------------------------------------------------------


def _items(env: CdcEnv, table: str = "items", rows: int = 20) -> None:
    env.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, name VARCHAR(40), "
                "price DECIMAL(10,2))")
    env.execute(f"INSERT INTO {table} SELECT seq, CONCAT('n', seq), seq / 4 "
                f"FROM seq_1_to_{rows}")


def _snapshot(env: CdcEnv, table: str) -> None:
    """A whole-table snapshot beside the running engine, as the re-snapshot sensor's run does."""
    with streaming(env):
        assert snapshot_reader(env, table, chunk_size=16).run().status == "done"
    env.catch_up()


def _stale_tables(env: CdcEnv) -> dict[str, bool]:
    return {m.table: m.gone for m in resolve_markers(env.landing) if not m.resolved}


def test_added_columns_reach_the_events_after_them(signal_env: CdcEnv) -> None:
    env = _with_topics(signal_env)
    _items(env)
    env.catch_up()
    _publish(env)
    env.query("ALTER TABLE items ADD COLUMN note VARCHAR(10)")  # no default: rows unchanged
    env.execute("INSERT INTO items VALUES (21, 'new', 1, 'hello')",
                "UPDATE items SET note = 'set' WHERE id = 1")
    env.catch_up()
    assert _stale_tables(env) == {}
    _publish(env)
    events = _events(env, "items")
    assert [list(_fields(e)) for e in events] == [["id", "name", "price"]] * 20 + [
        ["id", "name", "price", "note"]] * 2
    assert _fields(events[-1])["note"] == {"type": "string", "optional": True, "field": "note"}
    assert [e.payload["after"] for e in events[-2:]] == [  # type: ignore[index]
        {"id": 21, "name": "new", "price": "ZA==", "note": "hello"},
        {"id": 1, "name": "n1", "price": "GQ==", "note": "set"}]

    # a DEFAULT fills every existing row without a row event: the table is stale until a
    # snapshot (the rows the topic has for ids 2..20 lack the column)
    env.query("ALTER TABLE items ADD COLUMN flag INT NOT NULL DEFAULT 5")
    env.execute("UPDATE items SET flag = 6 WHERE id = 2")
    env.catch_up()
    assert _stale_tables(env) == {"items": False}
    _publish(env)
    rebuilt = rebuild(_events(env, "items"))
    assert [row.get("flag") for _, row in sorted(rebuilt.rows.items())] == [None, 6] + [None] * 19

    _snapshot(env, "items")
    assert _stale_tables(env) == {}
    _publish(env)
    events = _events(env, "items")
    assert _fields(events[-1])["flag"] == {"type": "int64", "optional": True, "field": "flag"}
    rebuilt = _rebuilt_equals_source(env, "items", ["id"])
    assert [row["flag"] for _, row in sorted(rebuilt.rows.items())] == [5, 6] + [5] * 19


def test_a_renamed_table_gets_the_new_names_topic_and_the_old_one_keeps_its_events(
        signal_env: CdcEnv) -> None:
    """Debezium on RENAME TABLE only moves its schema history: later events go to the new
    name's topic, the old topic gets nothing more (no deletes, no tombstones), and the new topic
    has only changes made after the rename unless a snapshot is signalled. The platform
    re-snapshots the new name (the rename is a stale marker), so its topic is whole."""
    env = _with_topics(signal_env)
    _items(env)
    env.execute("UPDATE items SET name = 'before rename' WHERE id = 3")
    env.catch_up()
    _publish(env)
    old = [(e.key, e.payload) for e in _events(env, "items")]
    assert len(old) == 21

    env.query("RENAME TABLE items TO renamed")
    env.execute("INSERT INTO renamed VALUES (100, 'after rename', 2)",
                "DELETE FROM renamed WHERE id = 4")
    env.catch_up()
    assert _stale_tables(env) == {"items": True, "renamed": False}
    _snapshot(env, "renamed")
    _publish(env)

    assert [(e.key, e.payload) for e in _events(env, "items")] == old
    rebuilt = _rebuilt_equals_source(env, "renamed", ["id"])
    assert len(rebuilt.rows) == 20 and rebuilt.rows[(3,)]["name"] == "before rename"
    assert rebuilt.ops.get("r", 0) >= 19


def test_a_renamed_column_carries_its_new_name_after_the_rename(signal_env: CdcEnv) -> None:
    env = _with_topics(signal_env)
    _items(env, rows=5)
    env.catch_up()
    env.query("ALTER TABLE items RENAME COLUMN name TO title")
    env.execute("UPDATE items SET price = price + 1", "INSERT INTO items VALUES (6, 'six', 3)")
    env.catch_up()
    assert _stale_tables(env) == {}
    _publish(env)

    events = _events(env, "items")
    assert [list(_fields(e)) for e in events] == [["id", "name", "price"]] * 5 + [
        ["id", "title", "price"]] * 6
    assert [e.payload["after"]["title"] for e in events[5:]] == [  # type: ignore[index]
        "n1", "n2", "n3", "n4", "n5", "six"]
    _rebuilt_equals_source(env, "items", ["id"])


# ---- 6-7. which tables get a topic ------------------------------------------------------------


def _topics(env: CdcEnv) -> set[str]:
    admin = AdminClient({"bootstrap.servers": env.kafka_bootstrap})
    mine = f"{env.server_name}.{env.db}."
    return {t for t in admin.list_topics(timeout=10).topics if t.startswith(mine)}


def test_tables_the_filter_leaves_out_get_no_topic(signal_env: CdcEnv) -> None:
    env = _with_topics(signal_env, tables={"exclude": [rf"{signal_env.db}\.secret.*"]})
    _items(env, rows=3)
    _items(env, "secrets", rows=3)
    _items(env, "secret_too", rows=1)
    env.catch_up()
    _publish(env)
    assert _topics(env) == {_topic(env, "items")}
    published = env.landing.read_published("change_topics")
    assert published is not None
    assert published.unpublished == {f"{env.db}.secrets", f"{env.db}.secret_too"}
    assert set(published.through) == {f"{env.db}.items"}
    _rebuilt_equals_source(env, "items", ["id"])


def test_two_tables_sharing_a_topic_name_stop_the_publisher(signal_env: CdcEnv) -> None:
    env = _with_topics(signal_env)
    # '$' is no character of a topic name: both tables' topics are <prefix>.<db>.a_b
    env.execute("CREATE TABLE `a$b` (id INT PRIMARY KEY)", "CREATE TABLE a_b (id INT PRIMARY KEY)",
                "INSERT INTO `a$b` VALUES (1)", "INSERT INTO a_b VALUES (1)")
    env.catch_up()
    with pytest.raises(PublishError) as stopped:
        _publish(env)
    message = str(stopped.value)
    assert f"{env.db}.a$b" in message and f"{env.db}.a_b" in message, message
    assert repr(_topic(env, "a_b")) in message and "change_topics.tables.exclude" in message
