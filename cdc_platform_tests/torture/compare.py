"""The torture suite's verdict: a target table against the primary, row by row, cell by cell.

Deliberately independent of the platform: no import from ``cdc_platform.capture.values`` (the
engine's converters), ``cdc_platform.lake.reconcile`` (the reconcile check) or the schema
mapping. Both sides are brought to one plain Python form by rules written here, from what the
server itself says a value is:

* the primary is read as root with every value rendered *by the server* into an unambiguous
  form (text through ``CONVERT(... USING utf8mb4)`` and ``HEX``, so no client-side charset
  decoding is involved; numbers and temporals as the server's own text);
* the target is read with Spark's ``DataFrame.collect()``.

What the docs declare lossy (docs/landing-zone.md, README "Known limits") is accepted only as
exactly that: a zero date may land as NULL, an empty SET may land as NULL. Anything else that
differs is reported with its key and column name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pymysql

_INTS = {"tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year"}
_DECIMALS = {"decimal", "numeric"}
_TEXTUAL = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}
_BLOBS = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry",
          "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
          "geometrycollection"}
_SERVER_TEXT = {"inet4", "inet6", "uuid"}
_TEMPORAL = {"date", "datetime", "timestamp"}


class Zero:
    """A zero date/datetime (``0000-00-00``) on the primary."""

    def __repr__(self) -> str:
        return "ZERO-DATE"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Zero)

    def __hash__(self) -> int:
        return 0


ZERO = Zero()


@dataclass(frozen=True)
class SourceColumn:
    name: str
    data_type: str
    column_type: str
    charset: str | None

    @property
    def family(self) -> str:
        t = self.data_type
        if t in _INTS:
            return "int"
        if t == "bit":
            return "bit"
        if t in _DECIMALS:
            return "decimal"
        if t in ("float", "double", "real"):
            return t if t != "real" else "double"
        if t in _TEMPORAL:
            return "temporal"
        if t == "time":
            return "time"
        if t == "json" or (t == "longtext" and "json" in self.column_type):
            return "json"
        if t in _TEXTUAL:
            return "bytes" if self.charset in (None, "binary") else "text"
        if t in _BLOBS:
            return "bytes"
        if t in _SERVER_TEXT:
            return "servertext"
        return "unknown"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def source_columns(conn: pymysql.Connection, database: str, table: str) -> list[SourceColumn]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME, "
            "(SELECT COUNT(*) FROM information_schema.CHECK_CONSTRAINTS k "
            " WHERE k.CONSTRAINT_SCHEMA = c.TABLE_SCHEMA AND k.TABLE_NAME = c.TABLE_NAME "
            " AND k.CHECK_CLAUSE LIKE CONCAT('%%json_valid(`', c.COLUMN_NAME, '`)%%')) "
            "FROM information_schema.COLUMNS c WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
            "ORDER BY ORDINAL_POSITION", (database, table))
        rows = cur.fetchall()
    columns = []
    for name, data_type, column_type, charset, json_checks in rows:
        data_type = str(data_type).lower()
        if json_checks:  # MariaDB's JSON is LONGTEXT with a json_valid() check
            data_type = "json"
        columns.append(SourceColumn(name, data_type, str(column_type).lower(), charset))
    return columns


def primary_key(conn: pymysql.Connection, database: str, table: str) -> list[str]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s "
            "AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
            (database, table))
        return [r[0] for r in cur.fetchall()]


def table_exists(conn: pymysql.Connection, database: str, table: str) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND "
                    "TABLE_NAME = %s", (database, table))
        return cur.fetchone() is not None


def _select_expression(column: SourceColumn) -> str:
    """A server-side rendering of the column that the client never has to decode."""
    q = _quote(column.name)
    family = column.family
    if family == "bit":
        return f"HEX(CAST({q} + 0 AS CHAR))"
    if family == "float":
        return f"HEX(CAST(CAST({q} AS DOUBLE) AS CHAR))"  # widened: printed exactly
    if family == "servertext":
        # INET4/INET6/UUID land as their stored bytes (docs/landing-zone.md's type table).
        return f"HEX(CAST({q} AS BINARY({4 if column.data_type == 'inet4' else 16})))"
    if family in ("int", "decimal", "double", "temporal", "time"):
        return f"HEX(CAST({q} AS CHAR))"
    if family in ("text", "json"):
        return f"HEX(CONVERT({q} USING utf8mb4))"
    return f"HEX({q})"


def _primary_value(column: SourceColumn, hexed: str | None) -> Any:
    if hexed is None:
        return None
    raw = bytes.fromhex(hexed)
    family = column.family
    if family in ("bytes", "servertext"):
        return raw
    text = raw.decode("utf-8")
    if family in ("int", "bit"):
        return int(text)
    if family == "decimal":
        return Decimal(text)
    if family in ("float", "double"):
        return float(text)
    if family == "temporal":
        if text.startswith("0000-00-00"):
            return ZERO
        return _temporal_text(text)
    if family == "time":
        return _time_micros(text)
    if family == "json":
        return _json_value(text)
    return text


def _temporal_text(text: str) -> str:
    """``YYYY-MM-DD[ HH:MM:SS[.f]]`` -> one canonical form with six fraction digits."""
    day, _, clock = text.partition(" ")
    if not clock:
        return day
    whole, _, fraction = clock.partition(".")
    return f"{day} {whole}.{(fraction + '000000')[:6]}"


def _time_micros(text: str) -> int:
    negative = text.startswith("-")
    text = text.lstrip("-")
    whole, _, fraction = text.partition(".")
    hours, minutes, seconds = (int(x) for x in whole.split(":"))
    micros = ((hours * 60 + minutes) * 60 + seconds) * 1_000_000 + int((fraction + "000000")[:6])
    return -micros if negative else micros


def _json_value(text: str) -> Any:
    return json.loads(text, parse_float=Decimal, parse_int=Decimal)


def _target_value(column: SourceColumn, value: Any) -> Any:
    if value is None:
        return None
    family = column.family
    if family in ("bytes", "servertext"):
        return bytes(value) if isinstance(value, bytes | bytearray | memoryview) else value
    if family in ("int", "bit"):
        return int(value) if isinstance(value, int | Decimal) else value
    if family == "decimal":
        return Decimal(value) if isinstance(value, str | int | Decimal) else value
    if family in ("float", "double"):
        return float(value) if isinstance(value, int | float) else value
    if family == "temporal":
        if isinstance(value, datetime):
            if column.data_type == "timestamp":  # Spark hands back naive local time
                value = value.astimezone(UTC)
            return _temporal_text(value.strftime("%Y-%m-%d %H:%M:%S.%f"))
        if isinstance(value, date):
            return value.isoformat() if column.data_type == "date" else (
                _temporal_text(value.isoformat() + " 00:00:00"))
        return value
    if family == "time" and isinstance(value, str):
        try:
            return _time_micros(value)
        except ValueError:
            return value
    if family == "json" and isinstance(value, str):
        try:
            return _json_value(value)
        except ValueError:
            return value
    return value


def _same(column: SourceColumn, expected: Any, actual: Any) -> bool | str:
    """True, False, or the name of the documented deviation the pair is."""
    if type(expected) is float and type(actual) is float:
        return expected == actual or (math.isnan(expected) and math.isnan(actual))
    if expected == actual and type(expected) is type(actual):
        return True
    if isinstance(expected, Decimal) and isinstance(actual, Decimal):
        return expected == actual
    if expected is ZERO and actual is None:
        return "zero date lands as NULL (docs/landing-zone.md)"
    if column.data_type == "set" and expected == "" and actual is None:
        return "empty SET lands as NULL (README Known limits)"
    return False


@dataclass
class TableVerdict:
    """One target compared with its source table on the primary."""

    table_id: str
    source_rows: int = 0
    target_rows: int = 0
    missing: list[Any] = field(default_factory=list)  # keys on the primary, not in the target
    extra: list[Any] = field(default_factory=list)  # keys in the target, not on the primary
    different: list[tuple[Any, str, Any, Any]] = field(default_factory=list)  # key, column, p, t
    documented: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # schema-level: missing/extra columns

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.different or self.problems)

    def summary(self, limit: int = 4) -> str:
        if self.ok:
            text = f"{self.table_id}: {self.source_rows} rows equal"
            if self.documented:
                text += f" (documented deviations: {self.documented})"
            return text
        parts = [f"{self.table_id}: primary {self.source_rows} rows, target {self.target_rows}"]
        parts += self.problems
        if self.missing:
            parts.append(f"{len(self.missing)} missing, e.g. {self.missing[:limit]}")
        if self.extra:
            parts.append(f"{len(self.extra)} extra, e.g. {self.extra[:limit]}")
        if self.different:
            columns = sorted({c for _, c, _, _ in self.different})
            sample = [f"key {k} column {c!r}: primary {_show(p)} target {_show(t)}"
                      for k, c, p, t in self.different[:limit]]
            parts.append(f"{len(self.different)} different cells in columns {columns}: "
                         + "; ".join(sample))
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table_id, "ok": self.ok, "source_rows": self.source_rows,
                "target_rows": self.target_rows, "missing": len(self.missing),
                "extra": len(self.extra), "different": len(self.different),
                "documented": self.documented, "summary": self.summary()}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_primary(conn: pymysql.Connection, database: str, table: str,
                 key: tuple[str, ...] | None = None
                 ) -> tuple[list[SourceColumn], list[str], dict[tuple[Any, ...], dict[str, Any]]]:
    columns = source_columns(conn, database, table)
    key = list(key or primary_key(conn, database, table))
    if not key:
        raise AssertionError(f"{database}.{table} has no primary key: the torture suite "
                             "compares by key")
    select = ", ".join(_select_expression(c) for c in columns)
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    with conn.cursor() as cur:
        cur.execute(f"SELECT {select} FROM {_quote(database)}.{_quote(table)}")
        for raw in cur.fetchall():
            row = {c.name: _primary_value(c, v) for c, v in zip(columns, raw, strict=True)}
            rows[tuple(row[k] for k in key)] = row
    return columns, key, rows


def compare_table(conn: pymysql.Connection, database: str, table: str,
                  target_rows: list[dict[str, Any]] | None,
                  key: tuple[str, ...] | None = None, marked_gone: bool = False
                  ) -> TableVerdict:
    """Compare the primary's table with the collected target rows (None: no target table),
    by primary key (or ``key``: the surrogate key of a table without one).

    A source table that no longer exists (renamed, dropped) expects an empty or absent target,
    or one the platform marked stale as gone (``marked_gone``: the documented behaviour, the
    platform never deletes a lake table on its own; its not_stale check fails).
    """
    verdict = TableVerdict(f"{database}.{table}")
    targets = target_rows or []
    verdict.target_rows = len(targets)
    if not table_exists(conn, database, table):
        if targets and marked_gone:
            verdict.documented["source gone, target marked stale"] = len(targets)
        elif targets:
            verdict.extra = [tuple(sorted(r.items()))[:2] for r in targets]
            verdict.problems.append("the source table no longer exists but its target has rows")
        return verdict
    columns, key_names, primary = read_primary(conn, database, table, key)
    verdict.source_rows = len(primary)
    if target_rows is None:
        verdict.problems.append("no target table")
        verdict.missing = list(primary)
        return verdict
    names = [c.name for c in columns]
    target_names = {n for r in targets[:1] for n in r if not n.startswith("__cdc")}
    if targets:
        absent = [n for n in names if n not in target_names]
        unexpected = sorted(target_names - set(names))
        if absent:
            verdict.problems.append(f"target lacks columns {absent}")
        if unexpected:
            verdict.problems.append(f"target has columns the primary lacks {unexpected}")
    by_name = {c.name: c for c in columns}
    seen: set[tuple[Any, ...]] = set()
    for raw in targets:
        row = {n: _target_value(by_name[n], v) for n, v in raw.items() if n in by_name}
        try:
            k = tuple(row.get(name) for name in key_names)
        except TypeError:
            k = tuple(repr(row.get(name)) for name in key_names)
        expected = primary.get(k)
        if expected is None or k in seen:
            verdict.extra.append(k)
            continue
        seen.add(k)
        for name in names:
            if name not in row:
                continue
            same = _same(by_name[name], expected[name], row[name])
            if same is False:
                verdict.different.append((k, name, expected[name], row[name]))
            elif same is not True:
                verdict.documented[same] = verdict.documented.get(same, 0) + 1
    verdict.missing = [k for k in primary if k not in seen]
    return verdict
