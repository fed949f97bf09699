"""The torture matrices: every cell is a few tables and the SQL that exercises them.

A cell's statements run in order on the primary, as root, autocommit on (``BEGIN`` ... ``COMMIT``
and XA statements group them); each cell has its own tables, so the engine can capture one cell
alone (a loud stop in one cell must not hide the others' results).

Matrices: ``types``, ``names``, ``features`` (XA, compression, CREATE TABLE ... SELECT, the
DDL that changes rows without row events, a replica without log_slave_updates) and
``snapshots`` (type values read by an incremental snapshot, awkward surrogate keys). Cells still
failing on this branch are in :data:`KNOWN_FAILURES` (expected failures, not hidden ones).

Type cells follow one pattern per column type (see :func:`type_cell`): every edge value is
inserted, reached by an UPDATE, left by an UPDATE, deleted, and finally carried unchanged
through an UPDATE of another column (the before image holds it too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TYPES_DB = "torture_types"
FEATURES_DB = "torture_features"
SNAPSHOTS_DB = "torture_snapshots"
DROPPED_DB = "torture_dropped"  # (a cell drops it: a database of its own)
#: A statement, or a statement and its parameters (pymysql binds bytes as raw binary literals,
#: so the binlog's annotated statement text then holds arbitrary bytes).
Statement = str | tuple[str, tuple]


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class Cell:
    matrix: str  # "types" | "names" | "features"
    name: str
    tables: tuple[tuple[str, str], ...]  # (database, table): captured and compared
    statements: tuple[Statement, ...]
    column: str | None = "v"  # the column a loud stop must name (None: the table suffices)
    compressed: bool = False  # run with log_bin_compress=ON on the primary and the replicas
    #: Where the engine reads: "replica1", or "no_log_slave_updates" (a third replica without
    #: log_slave_updates, which the engine must refuse loudly: it would stream nothing).
    source: str = "replica1"
    loud_words: tuple[str, ...] = ()  # what a loud stop must name instead of table/column/GTID
    dagster: bool = False  # also build the Dagster definitions for the cell's tables
    #: Capture the tables by an incremental snapshot only (the engine starts after the
    #: statements), while ``during`` runs on the primary; ``surrogate_keys``: table -> columns.
    snapshot: bool = False
    surrogate_keys: tuple[tuple[str, tuple[str, ...]], ...] = ()
    during: tuple[Statement, ...] = ()
    #: A start-up cell: the engine CLI runs with this account problem ("wrong_password",
    #: "no_binlog_monitor") and must exit with one line naming one of ``loud_words``.
    account: str = ""

    @property
    def xfail(self) -> str | None:
        return KNOWN_FAILURES.get(self.id)

    @property
    def id(self) -> str:
        return f"{self.matrix}/{self.name}"

    @property
    def databases(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(db for db, _ in self.tables))

    def include_patterns(self) -> list[str]:
        return [re.escape(f"{db}.{table}") for db, table in self.tables]


# ---- type matrix ---------------------------------------------------------------------------


def type_cell(name: str, column_type: str, edges: list[str], neutral: str) -> Cell:
    """A table ``(id, v <column_type>, note)`` driven through every edge value."""
    table = name
    t = f"{quote(TYPES_DB)}.{quote(table)}"
    n = len(edges)

    def values(base: int, value_of) -> str:  # noqa: ANN001 - a local helper
        return ", ".join(f"({base + i}, {value_of(i)})" for i in range(n))

    statements = [
        f"CREATE TABLE {t} (id INT PRIMARY KEY, v {column_type}, note INT NOT NULL DEFAULT 0)",
        f"INSERT INTO {t} (id, v) VALUES {values(1, lambda i: edges[i])}",  # inserted
        f"INSERT INTO {t} (id, v) VALUES {values(101, lambda i: neutral)}",
        *(f"UPDATE {t} SET v = {edges[i]} WHERE id = {101 + i}" for i in range(n)),  # reached
        f"INSERT INTO {t} (id, v) VALUES {values(201, lambda i: edges[i])}",
        f"UPDATE {t} SET v = {neutral} WHERE id > 200 AND id < 300",  # left
        f"INSERT INTO {t} (id, v) VALUES {values(301, lambda i: edges[i])}",
        f"DELETE FROM {t} WHERE id > 300",  # deleted
        f"UPDATE {t} SET note = note + 1",  # carried unchanged (before and after images)
        "BEGIN",
        f"UPDATE {t} SET note = note + 1 WHERE id < 100",
        f"DELETE FROM {t} WHERE id = 1",
        f"INSERT INTO {t} (id, v, note) SELECT 1, v, 9 FROM {t} WHERE id = 101",
        "COMMIT",
    ]
    return Cell("types", name, ((TYPES_DB, table),), tuple(statements))


def _s(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


LATIN1 = ["''", "NULL", "'x'", _s("é ü ß"), "UNHEX('C3814C')", "UNHEX('818D8F909D')",
          "UNHEX('80FF')", "'trailing  '"]
UTF8MB4 = ["''", "NULL", _s("é 中文"), _s("😀 𝄞 4-byte"), "'trailing  '", _s("Ω")]
BINARY = ["''", "NULL", "UNHEX('00')", "UNHEX('00000000')", "UNHEX('FF80C381')",
          "UNHEX('61000000')"]
WIDE = ["''", "NULL", "'A'", _s("é 中文"), _s("😀 𝄞")]  # utf16, utf16le, utf32
UCS2 = ["''", "NULL", "'A'", _s("é 中文")]  # BMP only

CP1252_ITEM = "issue 13: 2 (latin1 bytes cp1252 cannot map)"
BINARY_ITEM = "issue 13: 1 (empty BINARY(n) value)"
CHARSET_ITEM = "issue 13: 14 (other charsets)"
ZERO_ITEM = "issue 13: 11 (zero TIMESTAMP and YEAR 0)"


def _text_cells() -> list[Cell]:
    cells = []
    for kind, n in (("char", 10), ("varchar", 300), ("tinytext", None), ("text", None),
                    ("mediumtext", None), ("longtext", None)):
        typed = f"{kind.upper()}({n})" if n else kind.upper()
        for charset, edges in (("latin1", LATIN1), ("utf8mb4", UTF8MB4), ("binary", BINARY)):
            if kind in ("mediumtext", "longtext") and charset != "utf8mb4":
                continue
            size = n or {"tinytext": 255, "text": 2000, "mediumtext": 70_000,
                         "longtext": 300_000}[kind]
            chars = size // (4 if charset == "utf8mb4" else 1)
            filler = "'😀'" if charset == "utf8mb4" else "'z'"
            extra = [f"REPEAT({filler}, {chars})"]  # the longest value the type holds
            cells.append(type_cell(f"{kind}_{charset}", f"{typed} CHARACTER SET {charset}",
                                   edges + extra, "'n'"))
    for charset, edges in (("utf16", WIDE), ("utf16le", WIDE), ("utf32", WIDE),
                           ("ucs2", UCS2)):
        cells.append(type_cell(f"varchar_{charset}", f"VARCHAR(40) CHARACTER SET {charset}",
                               edges, "'n'"))
        cells.append(type_cell(f"text_{charset}", f"TEXT CHARACTER SET {charset}",
                               edges, "'n'"))
    return cells


def _number_cells() -> list[Cell]:
    ints = [
        ("tinyint", "TINYINT", -128, 127), ("tinyint_unsigned", "TINYINT UNSIGNED", 0, 255),
        ("smallint", "SMALLINT", -32768, 32767),
        ("smallint_unsigned", "SMALLINT UNSIGNED", 0, 65535),
        ("mediumint", "MEDIUMINT", -8388608, 8388607),
        ("mediumint_unsigned", "MEDIUMINT UNSIGNED", 0, 16777215),
        ("int", "INT", -2147483648, 2147483647), ("int_unsigned", "INT UNSIGNED", 0, 4294967295),
        ("bigint", "BIGINT", -(2**63), 2**63 - 1),
        ("bigint_unsigned", "BIGINT UNSIGNED", 0, 2**64 - 1),
        ("boolean", "BOOLEAN", -128, 127),
    ]
    cells = [type_cell(name, typed, [str(lo), str(hi), "0", "1", "NULL"], "7")
             for name, typed, lo, hi in ints]
    wide = "9" * 35 + "." + "9" * 30
    cells += [
        type_cell("decimal_10_2", "DECIMAL(10,2)",
                  ["-99999999.99", "99999999.99", "0", "0.01", "NULL"], "1"),
        type_cell("decimal_65_30", "DECIMAL(65,30)",
                  [f"-{wide}", wide, "0", "0." + "0" * 29 + "1", "NULL"], "1"),
        type_cell("decimal_unsigned_zerofill", "DECIMAL(20,0) UNSIGNED ZEROFILL",
                  ["0", "99999999999999999999", "NULL"], "1"),
        type_cell("float", "FLOAT", ["-3.40282e38", "3.40282e38", "1.17549e-38", "0", "-0.0",
                                     "0.1", "NULL"], "1"),
        type_cell("double", "DOUBLE", ["-1.7976931348623157e308", "1.7976931348623157e308",
                                       "2.2250738585072014e-308", "0", "0.1", "NULL"], "1"),
        type_cell("bit_1", "BIT(1)", ["b'0'", "b'1'", "NULL"], "b'1'"),
        type_cell("bit_7", "BIT(7)", ["b'0'", "b'1111111'", "b'1010101'", "NULL"], "b'1'"),
        type_cell("bit_64", "BIT(64)", ["b'0'", "b'" + "1" * 64 + "'", "b'1" + "0" * 63 + "'",
                                        "NULL"], "b'1'"),
    ]
    return cells


def _temporal_cells() -> list[Cell]:
    return [
        type_cell("date", "DATE", ["'1000-01-01'", "'9999-12-31'", "'0000-00-00'",
                                   "'2024-02-29'", "NULL"], "'2000-01-01'"),
        type_cell("datetime", "DATETIME", ["'1000-01-01 00:00:00'", "'9999-12-31 23:59:59'",
                                           "'0000-00-00 00:00:00'", "NULL"],
                  "'2000-01-01 00:00:00'"),
        type_cell("datetime_6", "DATETIME(6)",
                  ["'1000-01-01 00:00:00.000000'", "'9999-12-31 23:59:59.999999'",
                   "'0000-00-00 00:00:00.000000'", "'2024-02-29 12:30:45.000001'", "NULL"],
                  "'2000-01-01 00:00:00'"),
        type_cell("timestamp", "TIMESTAMP NULL DEFAULT NULL",
                  ["'1970-01-01 00:00:01'", "'2038-01-19 03:14:07'", "'0000-00-00 00:00:00'",
                   "NULL"], "'2000-01-01 00:00:00'"),
        type_cell("timestamp_6", "TIMESTAMP(6) NULL DEFAULT NULL",
                  ["'1970-01-01 00:00:01.000000'", "'2038-01-19 03:14:07.999999'",
                   "'0000-00-00 00:00:00.000000'", "NULL"], "'2000-01-01 00:00:00'",
                  ),
        type_cell("time", "TIME", ["'-838:59:59'", "'838:59:59'", "'00:00:00'", "'-00:00:01'",
                                   "NULL"], "'01:00:00'"),
        type_cell("time_6", "TIME(6)", ["'-838:59:59.000000'", "'838:59:59.000000'",
                                        "'-00:00:00.500000'", "'12:34:56.789012'", "NULL"],
                  "'01:00:00'"),
        type_cell("year", "YEAR", ["1901", "2155", "0", "NULL"], "2000"),
    ]


def _other_cells() -> list[Cell]:
    member = _s("ü")
    return [
        type_cell("binary_4", "BINARY(4)", ["''", "UNHEX('00000000')", "UNHEX('01')",
                                            "UNHEX('FFFFFFFF')", "UNHEX('0100')", "NULL"],
                  "UNHEX('AA')"),
        type_cell("varbinary", "VARBINARY(300)", BINARY + ["REPEAT(UNHEX('FE'), 300)"],
                  "UNHEX('AA')"),
        type_cell("tinyblob", "TINYBLOB", BINARY + ["REPEAT(UNHEX('FE'), 255)"], "UNHEX('AA')"),
        type_cell("blob", "BLOB", BINARY + ["REPEAT(UNHEX('00FE'), 32767)"], "UNHEX('AA')"),
        type_cell("mediumblob", "MEDIUMBLOB", BINARY + ["REPEAT(UNHEX('FE'), 70000)"],
                  "UNHEX('AA')"),
        type_cell("longblob", "LONGBLOB", BINARY + ["REPEAT(UNHEX('FE'), 300000)"],
                  "UNHEX('AA')"),
        type_cell("enum_utf8mb4", f"ENUM('a', 'b', {member}, '😀') CHARACTER SET utf8mb4",
                  ["'a'", member, "'😀'", "NULL"], "'b'"),
        type_cell("enum_latin1", f"ENUM('a', {_s('é')}, {_s('ß')}) CHARACTER SET latin1",
                  ["'a'", _s("é"), _s("ß"), "NULL"], "'a'"),
        type_cell("set_utf8mb4", f"SET('a', 'b', {member}) CHARACTER SET utf8mb4",
                  ["''", "'a'", f"CONCAT('a,', {member})", "'a,b'", "NULL"], "'b'"),
        type_cell("set_latin1", f"SET('a', {_s('é')}, {_s('ß')}) CHARACTER SET latin1",
                  ["''", _s("é"), _s("a,é,ß"), "NULL"], "'a'"),
        type_cell("json", "JSON",
                  ["'{}'", "'[]'", _s('{"b": 1, "a": [1.5, "😀", null, true, false]}'),
                   "'null'", _s('"text"'), "'12345678901234567890123'", "'1.10'",
                   _s('{"nested": {"deep": [[], {}], "n": -0.0e0}}'), "NULL"], "'1'"),
        type_cell("geometry", "GEOMETRY",
                  ["ST_GeomFromText('POINT(1 2)')", "ST_GeomFromText('LINESTRING(0 0, 1 1)')",
                   "ST_GeomFromText('POLYGON((0 0, 1 0, 1 1, 0 0))', 4326)",
                   "ST_GeomFromText('GEOMETRYCOLLECTION(POINT(1 1))')", "NULL"],
                  "ST_GeomFromText('POINT(0 0)')"),
        *(type_cell(kind.lower(), kind, [value, "NULL"], neutral) for kind, value, neutral in (
            ("POINT", "ST_GeomFromText('POINT(-180 90)')", "ST_GeomFromText('POINT(0 0)')"),
            ("LINESTRING", "ST_GeomFromText('LINESTRING(0 0, 1 1, 2 0)')",
             "ST_GeomFromText('LINESTRING(0 0, 1 1)')"),
            ("POLYGON", "ST_GeomFromText('POLYGON((0 0, 2 0, 2 2, 0 0))')",
             "ST_GeomFromText('POLYGON((0 0, 1 0, 1 1, 0 0))')"),
            ("MULTIPOINT", "ST_GeomFromText('MULTIPOINT(1 1, 2 2)')",
             "ST_GeomFromText('MULTIPOINT(0 0)')"),
            ("MULTILINESTRING", "ST_GeomFromText('MULTILINESTRING((0 0, 1 1), (2 2, 3 3))')",
             "ST_GeomFromText('MULTILINESTRING((0 0, 1 1))')"),
            ("MULTIPOLYGON", "ST_GeomFromText('MULTIPOLYGON(((0 0, 1 0, 1 1, 0 0)))')",
             "ST_GeomFromText('MULTIPOLYGON(((0 0, 2 0, 2 2, 0 0)))')"),
            ("GEOMETRYCOLLECTION",
             "ST_GeomFromText('GEOMETRYCOLLECTION(POINT(1 1), LINESTRING(0 0, 1 1))')",
             "ST_GeomFromText('GEOMETRYCOLLECTION(POINT(0 0))')"),
        )),
        type_cell("inet4", "INET4", ["'0.0.0.0'", "'255.255.255.255'", "'10.0.0.1'", "NULL"],
                  "'127.0.0.1'"),
        type_cell("inet6", "INET6", ["'::'", "'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff'",
                                     "'::ffff:10.0.0.1'", "NULL"], "'::1'"),
        type_cell("uuid", "UUID", ["'00000000-0000-0000-0000-000000000000'",
                                   "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
                                   "'123e4567-e89b-12d3-a456-426655440000'", "NULL"],
                  "'123e4567-e89b-12d3-a456-426655440001'"),
    ]


# ---- names matrix --------------------------------------------------------------------------


def names_cell(name: str, database: str, table: str, key: str, other: str,
               extra_tables: tuple[str, ...] = ()) -> Cell:
    statements = [f"CREATE DATABASE IF NOT EXISTS {quote(database)}"]
    tables = (table, *extra_tables)
    for i, tbl in enumerate(tables):
        t = f"{quote(database)}.{quote(tbl)}"
        k, o = quote(key), quote(other)
        statements += [
            f"CREATE TABLE {t} ({k} INT PRIMARY KEY, {o} VARCHAR(20))",
            f"INSERT INTO {t} VALUES (1, 'one'), (2, 'two'), (3, 'three'), ({10 + i}, 'own')",
            f"UPDATE {t} SET {o} = CONCAT({o}, '!') WHERE {k} = 2",
            f"DELETE FROM {t} WHERE {k} = 3",
        ]
    return Cell("names", name, tuple((database, tbl) for tbl in tables), tuple(statements),
                column=other, dagster=True)


def _names_cells() -> list[Cell]:
    return [
        names_cell("unicode", "tört_ünï", "ünï", "ïd", "çolumn ü"),
        names_cell("dash", "order-items", "line-items", "item-id", "unit-price"),
        names_cell("space", "my db", "2024 sales", "sale id", "amount eur"),
        names_cell("reserved", "select", "order", "key", "from"),
        names_cell("backtick", "tick`db", "a`b", "c`d", "e``f"),
        names_cell("dot", "db.dot", "t.dot", "c.id", "v.v"),
        names_cell("slash", "torture_names", "a/b", "id", "x/y"),
        names_cell("dotdot", "torture_names", "..", "id", "v"),
        names_cell("case", "torture_names", "Orders", "id", "v", extra_tables=("orders",)),
        names_cell("long", "torture_names", "t" * 64, "c" * 64, "d" * 64),
    ]


# ---- server features -----------------------------------------------------------------------


def _features_cells() -> list[Cell]:
    db = quote(FEATURES_DB)

    def t(name: str) -> str:
        return f"{db}.{quote(name)}"

    def cell(name: str, tables: tuple[str, ...], statements: list[str], **kw) -> Cell:  # noqa: ANN003
        return Cell("features", name, tuple((FEATURES_DB, x) for x in tables),
                    tuple(statements), **kw)

    plain = "(id INT PRIMARY KEY, v VARCHAR(20))"
    rows = "(1, 'a'), (2, 'b'), (3, 'c')"
    cells = [
        cell("xa_commit", ("xa_commit",), [
            f"CREATE TABLE {t('xa_commit')} {plain}",
            "XA START 'torture-1'", f"INSERT INTO {t('xa_commit')} VALUES {rows}",
            "XA END 'torture-1'", "XA PREPARE 'torture-1'", "XA COMMIT 'torture-1'",
            "XA START 'torture-2'", f"UPDATE {t('xa_commit')} SET v = 'xa' WHERE id = 2",
            f"DELETE FROM {t('xa_commit')} WHERE id = 3",
            "XA END 'torture-2'", "XA PREPARE 'torture-2'", "XA COMMIT 'torture-2'",
        ], column=None),
        cell("xa_rollback", ("xa_rollback",), [
            f"CREATE TABLE {t('xa_rollback')} {plain}",
            f"INSERT INTO {t('xa_rollback')} VALUES (9, 'kept')",
            "XA START 'torture-3'", f"INSERT INTO {t('xa_rollback')} VALUES {rows}",
            "XA END 'torture-3'", "XA PREPARE 'torture-3'", "XA ROLLBACK 'torture-3'",
        ], column=None),
        cell("xa_one_phase", ("xa_one_phase",), [
            f"CREATE TABLE {t('xa_one_phase')} {plain}",
            "XA START 'torture-4'", f"INSERT INTO {t('xa_one_phase')} VALUES {rows}",
            "XA END 'torture-4'", "XA COMMIT 'torture-4' ONE PHASE",
        ], column=None),
        cell("compressed", ("compressed",), [
            f"CREATE TABLE {t('compressed')} (id INT PRIMARY KEY, v TEXT, b BLOB)",
            f"INSERT INTO {t('compressed')} VALUES (1, REPEAT('x', 1500), REPEAT(UNHEX('00'), "
            "2000)), (2, REPEAT('😀', 500), NULL), (3, 'small', UNHEX('01'))",
            f"UPDATE {t('compressed')} SET v = REPEAT('y', 3000) WHERE id = 2",
            f"DELETE FROM {t('compressed')} WHERE id = 3",
        ], column=None, compressed=True),
        cell("create_table_select", ("ctas_source", "ctas_copy"), [
            f"CREATE TABLE {t('ctas_source')} (id INT PRIMARY KEY, v VARCHAR(20))",
            f"INSERT INTO {t('ctas_source')} SELECT seq, CONCAT('v', seq) FROM {db}.seq_1_to_500",
            f"CREATE TABLE {t('ctas_copy')} (PRIMARY KEY (id)) SELECT * FROM "
            f"{t('ctas_source')}",
            f"UPDATE {t('ctas_copy')} SET v = 'changed' WHERE id = 7",
        ], column=None),
        cell("savepoint", ("savepoint",), [
            f"CREATE TABLE {t('savepoint')} {plain}",
            "BEGIN", f"INSERT INTO {t('savepoint')} VALUES (1, 'kept')", "SAVEPOINT s1",
            f"INSERT INTO {t('savepoint')} VALUES (2, 'rolled back')", "ROLLBACK TO SAVEPOINT s1",
            f"INSERT INTO {t('savepoint')} VALUES (3, 'kept')", "COMMIT",
        ], column=None),
    ]
    cells += [ddl for suffix, wrapper in DDL_WRAPPERS.items()
              for ddl in _ddl_cells(cell, t, plain, rows, suffix, wrapper)]
    cells += [
        cell("replica_without_log_slave_updates", ("no_log_slave_updates",), [
            f"CREATE TABLE {t('no_log_slave_updates')} {plain}",
            f"INSERT INTO {t('no_log_slave_updates')} VALUES {rows}",
        ], column=None, source="no_log_slave_updates", loud_words=("log_slave_updates",)),
    ]
    return cells


#: The prefixes the server accepts before a statement, as DBAs and online schema tools (SET
#: STATEMENT for lock and statement timeouts), dump and migration tools (executable comments)
#: write them: every DDL cell runs with each ({} is the statement; the key suffixes the cell's
#: name and tables).
DDL_WRAPPERS = {
    "": "{}",
    "_set_statement": "SET STATEMENT lock_wait_timeout=5, max_statement_time=60 FOR {}",
    "_executable_comment": "/*!100100 {} */",
    "_mariadb_comment": "/*M!100100 {} */",
}


def _ddl_cells(cell, t, plain: str, rows: str, suffix: str, wrapper: str) -> list[Cell]:  # noqa: ANN001
    """The DDL that changes rows without row events (and RENAME COLUMN, which changes none),
    one cell each, the DDL written behind ``wrapper``; names take ``suffix``."""
    part = ("PARTITION BY RANGE (id) (PARTITION p0 VALUES LESS THAN (100), "
            "PARTITION p1 VALUES LESS THAN MAXVALUE)")

    def w(statement: str) -> str:
        return wrapper.format(statement)

    def n(name: str) -> str:
        return name + suffix

    return [
        cell(n("rename_table"), (n("renamed_old"), n("renamed_new")), [
            f"CREATE TABLE {t(n('renamed_old'))} {plain}",
            f"INSERT INTO {t(n('renamed_old'))} VALUES {rows}",
            w(f"RENAME TABLE {t(n('renamed_old'))} TO {t(n('renamed_new'))}"),
            f"INSERT INTO {t(n('renamed_new'))} VALUES (4, 'after')",
        ], column=None),
        cell(n("truncate"), (n("truncated"),), [
            f"CREATE TABLE {t(n('truncated'))} {plain}",
            f"INSERT INTO {t(n('truncated'))} VALUES {rows}",
            w(f"TRUNCATE TABLE {t(n('truncated'))}"),
            f"INSERT INTO {t(n('truncated'))} VALUES (4, 'after')",
        ], column=None),
        cell(n("drop_partition"), (n("dropped_partition"),), [
            f"CREATE TABLE {t(n('dropped_partition'))} {plain} {part}",
            f"INSERT INTO {t(n('dropped_partition'))} VALUES (1, 'p0'), (2, 'p0'), (101, 'p1')",
            w(f"ALTER TABLE {t(n('dropped_partition'))} DROP PARTITION p0"),
            f"INSERT INTO {t(n('dropped_partition'))} VALUES (102, 'after')",
        ], column=None),
        cell(n("exchange_partition"), (n("exchanged"), n("exchanged_swap")), [
            f"CREATE TABLE {t(n('exchanged'))} {plain} {part}",
            f"CREATE TABLE {t(n('exchanged_swap'))} {plain}",
            f"INSERT INTO {t(n('exchanged'))} VALUES (1, 'in p0'), (101, 'in p1')",
            f"INSERT INTO {t(n('exchanged_swap'))} VALUES (5, 'swapped in'), (6, 'swapped in')",
            w(f"ALTER TABLE {t(n('exchanged'))} EXCHANGE PARTITION p0 WITH TABLE "
              f"{t(n('exchanged_swap'))}"),
            f"INSERT INTO {t(n('exchanged'))} VALUES (102, 'after')",
        ], column=None),
        cell(n("add_column_default"), (n("added_column"),), [
            f"CREATE TABLE {t(n('added_column'))} {plain}",
            f"INSERT INTO {t(n('added_column'))} VALUES {rows}",
            w(f"ALTER TABLE {t(n('added_column'))} ADD COLUMN c INT NOT NULL DEFAULT 7"),
            f"INSERT INTO {t(n('added_column'))} VALUES (4, 'after', 8)",
        ], column=None),
        cell(n("rename_column"), (n("renamed_column"),), [
            f"CREATE TABLE {t(n('renamed_column'))} {plain}",
            f"INSERT INTO {t(n('renamed_column'))} VALUES {rows}",
            w(f"ALTER TABLE {t(n('renamed_column'))} RENAME COLUMN v TO w"),
            f"INSERT INTO {t(n('renamed_column'))} VALUES (4, 'after')",
        ], column=None),
        *(cell(n(f"modify_temporal_{name}"), (n(f"modified_{name}"),), [
            f"CREATE TABLE {t(n('modified_' + name))} (id INT PRIMARY KEY, d DATETIME(6))",
            f"INSERT INTO {t(n('modified_' + name))} VALUES "
            "(1, '2024-01-01 12:34:56.789012'), (2, '1999-12-31 23:59:59.999999')",
            w(f"ALTER TABLE {t(n('modified_' + name))} MODIFY d {kind}"),
            f"INSERT INTO {t(n('modified_' + name))} (id) VALUES (3)",
        ], column=None) for name, kind in (("date", "DATE"), ("time", "TIME(6)"),
                                           ("timestamp", "TIMESTAMP(6) NULL"))),
        # Changes no remaining value: nothing is marked; the target drops the column although
        # no row changed after the DROP.
        cell(n("drop_column"), (n("dropped_column"),), [
            f"CREATE TABLE {t(n('dropped_column'))} (id INT PRIMARY KEY, v INT, w INT)",
            f"INSERT INTO {t(n('dropped_column'))} VALUES (1, 1, 1), (2, 2, 2)",
            w(f"ALTER TABLE {t(n('dropped_column'))} DROP COLUMN w"),
        ], column=None),
        # Every captured table of the database is gone: targets marked stale as gone.
        Cell("features", n("drop_database"), ((n(DROPPED_DB), "gone_a"), (n(DROPPED_DB), "gone_b")), (
            f"CREATE TABLE {quote(n(DROPPED_DB))}.gone_a {plain}",
            f"CREATE TABLE {quote(n(DROPPED_DB))}.gone_b {plain}",
            f"INSERT INTO {quote(n(DROPPED_DB))}.gone_a VALUES {rows}",
            f"INSERT INTO {quote(n(DROPPED_DB))}.gone_b VALUES {rows}",
            w(f"DROP DATABASE {quote(n(DROPPED_DB))}"),
        ), column=None),
    ]


def all_cells() -> list[Cell]:
    return [*_number_cells(), *_temporal_cells(), *_text_cells(), *_other_cells(),
            *_names_cells(), *_features_cells()]


def snapshot_variant(cell: Cell) -> Cell:
    """The type cell's final rows, captured by an incremental snapshot (the SELECT path)."""
    statements = tuple(s.replace(quote(TYPES_DB), quote(SNAPSHOTS_DB)) for s in cell.statements
                       if isinstance(s, str))
    t = f"{quote(SNAPSHOTS_DB)}.{quote(cell.name)}"
    during = (f"UPDATE {t} SET note = note + 1 WHERE id < 150",
              f"DELETE FROM {t} WHERE id = 102", f"INSERT INTO {t} (id, note) VALUES (999, 1)")
    return Cell("snapshots", cell.name, ((SNAPSHOTS_DB, cell.name),), statements,
                snapshot=True, during=during)


SNAPSHOT_TYPES = ("bigint_unsigned", "decimal_65_30", "double", "bit_64", "timestamp_6",
                  "time_6", "year", "char_latin1", "varchar_utf16", "binary_4", "enum_latin1",
                  "json", "inet6")


def _snapshot_cells() -> list[Cell]:
    db = quote(SNAPSHOTS_DB)
    by_name = {c.name: c for c in all_cells() if c.matrix == "types"}
    cells = [snapshot_variant(by_name[name]) for name in SNAPSHOT_TYPES]
    codes = ["a@x", "A@X", "b", "B", "ß", "ss", "é", "e", "a@x ", "z"]
    cells.append(Cell("snapshots", "ci_surrogate_key", ((SNAPSHOTS_DB, "ci_key"),), (
        f"CREATE TABLE {db}.ci_key (code VARCHAR(10) COLLATE utf8mb4_general_ci, n INT)",
        f"INSERT INTO {db}.ci_key VALUES " + ", ".join(
            f"({_s(code)}, {i})" for i, code in enumerate(codes)),
    ), column=None, snapshot=True, surrogate_keys=(("ci_key", ("code",)),)))
    keys = [bytes([i + 1]) * 15 + b"\xff" for i in range(40)]
    insert = f"INSERT INTO {db}.binary_statements VALUES (%s, %s)"
    cells.append(Cell("snapshots", "binary_statement_text",
                      ((SNAPSHOTS_DB, "binary_statements"),), (
        f"CREATE TABLE {db}.binary_statements (id BINARY(16) PRIMARY KEY, v VARBINARY(32))",
        *((insert, (key, bytes(range(128, 160)))) for key in keys),
    ), column=None, snapshot=True, during=tuple(
        (f"UPDATE {db}.binary_statements SET v = %s WHERE id = %s", (b"\x81\x8d\xff" * 3, key))
        for key in keys)))
    return cells


def _startup_cells() -> list[Cell]:
    return [
        Cell("startup", "wrong_password", (), (), column=None, account="wrong_password",
             loud_words=("password", "Access denied")),
        Cell("startup", "no_binlog_monitor", (), (), column=None, account="no_binlog_monitor",
             loud_words=("BINLOG MONITOR", "REPLICATION CLIENT")),
    ]


CELLS: list[Cell] = all_cells() + _snapshot_cells() + _startup_cells()

#: Cells expected to fail, with the issue that will fix them (an xfail, reported as such).
#: Empty: every cell of issue 13's matrices round-trips or stops loudly. A cell added for a
#: later issue may be listed here until that issue lands; a listed cell that passes is XPASS.
KNOWN_FAILURES: dict[str, str] = {}
SETUP = (f"CREATE DATABASE {quote(TYPES_DB)}", f"CREATE DATABASE {quote(FEATURES_DB)}")


@dataclass
class CellResult:
    """What one cell did: ``pass``, ``loud-stop`` (both fine), ``fail`` or ``crash``."""

    cell: str
    status: str
    detail: str = ""
    tables: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "loud-stop")

    @property
    def rows_equal(self) -> bool:
        """The engine captured the cell and every target equals the primary (Dagster aside)."""
        return self.status in ("pass", "fail") and bool(self.tables) and all(
            t["ok"] for t in self.tables)

    def to_dict(self) -> dict:
        return {"cell": self.cell, "status": self.status, "detail": self.detail,
                "tables": self.tables, "seconds": round(self.seconds, 2)}
