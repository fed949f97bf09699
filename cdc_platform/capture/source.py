"""Read-only access to the source replica over SQL: discovery, schemas, positions, prerequisites.

Every session opened here is read-only (``SET SESSION TRANSACTION READ ONLY``): the platform
never writes to the source, and a bug here cannot make it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pymysql
import pymysql.converters
import pymysql.cursors
from pymysql.constants import FIELD_TYPE

from cdc_platform.capture import names
from cdc_platform.capture.events import EngineError
from cdc_platform.capture.flavours import flavour_of
from cdc_platform.capture.gtid import GtidSet
from cdc_platform.capture.schema import TableSchema, column_from_information_schema

T = TypeVar("T")

if TYPE_CHECKING:
    from cdc_platform.config import Settings


# pymysql error codes after which reconnecting may succeed (network, restart, kill).
RETRIABLE_MYSQL_ERRORS = {1040, 1053, 1158, 1159, 1160, 1161, 1317, 1927, 2002, 2003, 2006,
                          2013, 2055}


class SourceDisconnected(ConnectionError):
    """The binlog connection dropped or could not be opened; reconnecting may succeed."""


try:  # the snapshot reader reads chunks over mysqlclient: its errors carry the same codes
    import MySQLdb

    _OPERATIONAL_ERRORS: tuple[type[BaseException], ...] = (
        pymysql.err.OperationalError, pymysql.err.InterfaceError, MySQLdb.OperationalError,
        MySQLdb.InterfaceError)
except ImportError:  # pragma: no cover - mysqlclient is a dependency
    _OPERATIONAL_ERRORS = (pymysql.err.OperationalError, pymysql.err.InterfaceError)


def is_retriable(error: BaseException) -> bool:
    if isinstance(error, SourceDisconnected | ConnectionError | TimeoutError | EOFError):
        return True
    if isinstance(error, _OPERATIONAL_ERRORS):
        code = error.args[0] if error.args else None
        return code in RETRIABLE_MYSQL_ERRORS or not isinstance(code, int)
    return False


def is_purged_position(error: BaseException) -> bool:
    """Error 1236: the requested GTID state is older than the oldest binlog file."""
    cause = error.__cause__ if isinstance(error, SourceDisconnected) else error
    args = getattr(cause, "args", ())
    return bool(args) and args[0] == 1236


def server_message(error: BaseException) -> str:
    """The server's words of an error (the cause of a lost stream), for the log."""
    cause = error.__cause__ if isinstance(error, SourceDisconnected) else error
    args = getattr(cause, "args", ())
    return str(args[1]) if len(args) > 1 else str(cause)


def purged_binlog_stop(server_name: str, position: str, error: BaseException) -> str:
    """Why capture stops when the binlog no longer holds its GTID position, and the ways on."""
    return f"source {server_name}: {purged_binlog_text(position, server_message(error))}"


def purged_binlog_text(position: str | None, message: str) -> str:
    """The words for MySQL error 1236 (the binlog no longer holds the position asked for) and
    the ways on, whoever meets it: the engine's stop (``purged_binlog_stop``) and the start
    checks (``start_errors``, which do not know the position: None). ``""``: a first start."""
    where = "the requested GTID position" if position is None else \
        f"GTID position {position or '(start)'}"
    return (
        f"the binlog no longer holds {where} (purged: {message})."
        " The changelog cannot continue exactly: keep binlogs longer, and either "
        "set capture.snapshot_mode: when_needed (the engine then goes on from the "
        "source's current position and snapshots every captured table again), "
        "or re-snapshot the tables (or move the checkpoint away and start with "
        "capture.initial_position)"
    )


def purged_binlog_recovery(server_name: str, old: str, current: str,
                           error: BaseException) -> str:
    """What capture.snapshot_mode: when_needed does about a purged binlog, and what the
    targets miss until their snapshots are applied."""
    return (
        f"source {server_name}: the binlog no longer holds GTID position {old} (purged: "
        f"{server_message(error)}). capture.snapshot_mode is when_needed: capture goes on "
        f"from the source's current GTID position {current or '(empty)'}, and every "
        "captured table is snapshotted again; until each snapshot is applied, its target "
        f"misses the changes between {old} and {current or '(empty)'}")


def initial_position(session: SourceSession, flavour: str, choice: str) -> GtidSet:
    """Where a first start reads from (config: capture.initial_position): ``earliest`` (the
    oldest binlog the source still has), ``current`` (its executed GTIDs) or a GTID
    position."""
    positions = flavour_of(flavour)
    choice = choice.strip()
    if choice == "earliest":
        choice = session.run(positions.earliest_position)
    if choice == "current":
        choice = session.run(positions.executed_gtid_text)
    try:
        return positions.parse_position(choice)
    except ValueError as error:
        raise EngineError(f"capture.initial_position {choice!r} is not a valid "
                          f"{flavour} GTID position: {error}") from None


class PrerequisiteError(RuntimeError):
    """The source is not configured for GTID row-based capture; the message says what to set."""


@dataclass(frozen=True)
class TableSelector:
    """Which tables and columns are captured (config: capture.tables / excluded_columns)."""

    include: tuple[str, ...] = (".*",)
    exclude: tuple[str, ...] = ()
    excluded_columns: tuple[str, ...] = ()
    system_databases: tuple[str, ...] = ("mysql", "information_schema", "performance_schema", "sys")
    # ``(("db.table", ("col", ...)), ...)``: the key of tables without a primary key
    # (config: capture.surrogate_keys).
    surrogate_keys: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_include", [re.compile(p) for p in self.include])
        object.__setattr__(self, "_exclude", [re.compile(p) for p in self.exclude])
        object.__setattr__(self, "_columns", [re.compile(p) for p in self.excluded_columns])
        object.__setattr__(self, "_cache", {})

    def captures(self, database: str, table: str) -> bool:
        """True when the table passes the include/exclude patterns (memoised: hot path).

        A pattern may be written against the table id (``names.table_id``: `` `my.db`.t ``
        where a dot would mislead) or against the plain ``db.table`` text Debezium's
        include lists use: a table is included when either form matches an include pattern,
        and excluded when either matches an exclude pattern."""
        key = (database, table)
        cache: dict[tuple[str, str], bool] = self._cache  # type: ignore[attr-defined]
        if key not in cache:
            forms = {names.table_id(database, table), f"{database}.{table}"}
            include: list[re.Pattern[str]] = self._include  # type: ignore[attr-defined]
            exclude: list[re.Pattern[str]] = self._exclude  # type: ignore[attr-defined]
            cache[key] = (
                database not in self.system_databases
                and any(p.fullmatch(f) for p in include for f in forms)
                and not any(p.fullmatch(f) for p in exclude for f in forms)
            )
        return cache[key]

    def surrogate_key_of(self, table_id: str) -> tuple[str, ...]:
        """The configured surrogate key of a table id (empty: none), configured under its
        table id, another quoting of it, or its plain ``db.table`` text."""
        for configured, key in self.surrogate_keys:
            if names.resolve_table_id(configured, [table_id]) is not None:
                return key
        return ()

    def shape(self, schema: TableSchema) -> TableSchema:
        """The schema as it lands: excluded columns removed; a table without a primary key
        keyed by its configured surrogate key.

        Every place that derives a landed schema from the source (the engine from table maps
        and information_schema, the snapshot reader, the Dagster definitions, reconciliation)
        goes through here, so they agree on columns and key.
        """
        surrogate = self.surrogate_key_of(schema.table_id)
        if surrogate and not schema.primary_key:
            missing = [c for c in surrogate if c not in schema.column_names]
            if not missing:
                schema = TableSchema(schema.database, schema.table, schema.columns, surrogate)
        return schema.without_columns(
            self.excluded_columns_of(schema.database, schema.table, schema.column_names))

    def excluded_columns_of(self, database: str, table: str, columns: Iterable[str]) -> set[str]:
        patterns: list[re.Pattern[str]] = self._columns  # type: ignore[attr-defined]
        return {
            c for c in columns
            if any(p.fullmatch(form) for p in patterns
                   for form in (names.qualified_name(database, table, c),
                                f"{database}.{table}.{c}"))
        }


def datetime_from_text(value: str | bytes) -> Any:
    """pymysql's DATETIME/TIMESTAMP decoder, with ``datetime.fromisoformat`` first.

    pymysql parses each value with a regular expression and ``int()`` per field: 40 % of a
    bare fetch of a table with one DATETIME column (measured: 3.7 s -> 2.6 s for 300k rows).
    ``fromisoformat`` (C) gives the same datetime for every value the server sends in the text
    protocol ('YYYY-MM-DD HH:MM:SS[.f{1,6}]'); what it refuses (zero dates, '2025-02-30' under
    a lax sql_mode) goes to pymysql's decoder, which returns it as text, as before.
    """
    text = value.decode("ascii") if isinstance(value, bytes | bytearray) else value
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        return pymysql.converters.convert_datetime(value)


def time_from_text(value: str | bytes) -> str:
    """TIME as the server's own text (``[-]HH:MM:SS[.f]``), which is its landing form.

    pymysql's timedelta cannot be a parameter again: it escapes a negative timedelta wrongly
    (-838:59:59 becomes '-839:00:01'), so a keyset scan on a TIME key never advanced.
    """
    return value.decode("ascii") if isinstance(value, bytes | bytearray) else value


# The decoders of source sessions: pymysql's, with the faster DATETIME/TIMESTAMP decoder and
# TIME kept as text.
SOURCE_DECODERS: dict[Any, Any] = {
    **pymysql.converters.conversions,
    FIELD_TYPE.DATETIME: datetime_from_text,
    FIELD_TYPE.TIMESTAMP: datetime_from_text,
    FIELD_TYPE.TIME: time_from_text,
}


def connect(settings: dict[str, Any], dict_cursor: bool = False) -> pymysql.Connection:
    """A read-only, autocommit, UTC session on the source."""
    conn = pymysql.connect(
        **settings,
        autocommit=True,
        # bytes parameters (binary chunk keys) as _binary'...': without the prefix they are text
        # literals in the connection charset, which INET6/UUID/INET4 parse as text (no match)
        # and which carry non-UTF-8 bytes wrongly.
        binary_prefix=True,
        cursorclass=pymysql.cursors.DictCursor if dict_cursor else pymysql.cursors.Cursor,
        conv=SOURCE_DECODERS,
    )
    with conn.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION READ ONLY")
        cur.execute("SET time_zone = '+00:00'")
    return conn


@contextmanager
def source_connection(settings: dict[str, Any], dict_cursor: bool = False) -> Iterator[Any]:
    conn = connect(settings, dict_cursor=dict_cursor)
    try:
        yield conn
    finally:
        conn.close()


class SourceSession:
    """One read-only session on the source, opened on first use and opened again after it
    broke: the engine's control session, the snapshot reader's and the signal checks' are all
    this, so connecting, retrying and closing are written once.

    ``run`` gives an action the session, and when the connection broke under it (a retriable
    error) runs it once more on a fresh one: a replica restarting or a killed session costs
    one retry, not a failed run. Any other error is the action's own and is raised as is.
    """

    def __init__(self, settings: dict[str, Any], selector: TableSelector | None = None,
                 attempts: int = 2) -> None:
        self.settings = settings
        self.selector = selector or TableSelector()
        self.attempts = attempts
        self._conn: pymysql.Connection | None = None

    def connection(self) -> pymysql.Connection:
        """The session, opened now if it is not open."""
        if self._conn is None:
            self._conn = connect(self.settings)
        return self._conn

    def run(self, action: Callable[[pymysql.Connection], T]) -> T:
        """``action(connection)``, once more on a new connection when the connection broke."""
        for attempt in range(1, self.attempts + 1):
            try:
                return action(self.connection())
            except Exception as error:
                if not is_retriable(error):
                    raise
                self.close()
                if attempt == self.attempts:
                    raise
        raise AssertionError("unreachable")  # (attempts >= 1)

    def read_schema(self, database: str, table: str) -> TableSchema | None:
        """The table's schema as it lands (the selector's shape); None when the source has no
        such table."""
        try:
            schema = self.run(lambda conn: read_table_schema(conn, database, table))
        except LookupError:
            return None
        return self.selector.shape(schema)

    def read_schemas(self, tables: Iterable[tuple[str, str]]
                     ) -> dict[tuple[str, str], TableSchema]:
        """The schemas of ``tables`` (``(database, table)``) as they land, in two queries
        whatever their number; a table the source does not have is left out."""
        wanted = list(tables)
        found = self.run(lambda conn: read_table_schemas(conn, wanted))
        return {pair: self.selector.shape(schema) for pair, schema in found.items()}

    def estimated_rows(self, tables: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The server's estimate of each table's rows (``estimated_rows``)."""
        wanted = list(tables)
        return self.run(lambda conn: estimated_rows(conn, wanted))

    def list_tables(self) -> list[tuple[str, str]]:
        """The captured base tables the source has, sorted."""
        return self.run(lambda conn: list_tables(conn, self.selector))

    def __enter__(self) -> SourceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the session (a broken one too); the next use opens a new one."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):  # (broken, perhaps)
                conn.close()


def missing_table(table_id: str) -> str:
    """How every reader of the source says that a table is not there."""
    return f"table {table_id} does not exist on the source"


def quote_identifier(name: str) -> str:
    """Backtick-quote an identifier; backticks inside are doubled (never trust names)."""
    return "`" + name.replace("`", "``") + "`"


def list_tables(conn: pymysql.Connection, selector: TableSelector) -> list[tuple[str, str]]:
    """Base tables on the source that the selector captures, sorted."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
            "WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME"
        )
        rows = cur.fetchall()
    return [(db, t) for db, t in (_pair(r) for r in rows) if selector.captures(db, t)]


def resolve_table(conn: pymysql.Connection, selector: TableSelector, text: str
                  ) -> tuple[str, str] | None:
    """``(database, table)`` of the captured table that user input names (``db.table``, quoted
    `` `my.db`.table `` or plain ``my.db.table``: ``names.resolve_table_id``); None when it names
    none. AmbiguousTableError when the plain form names two tables."""
    found = names.resolve_table_id(
        text, [names.table_id(d, t) for d, t in list_tables(conn, selector)])
    return None if found is None else names.split_table_id(found)


def _pair(row: Any) -> tuple[str, str]:
    if isinstance(row, dict):
        return row["TABLE_SCHEMA"], row["TABLE_NAME"]
    return row[0], row[1]


_SCHEMA_COLUMNS = ("COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE, "
                   "DATETIME_PRECISION, CHARACTER_SET_NAME, CHARACTER_OCTET_LENGTH")


def read_table_schema(conn: pymysql.Connection, database: str, table: str) -> TableSchema:
    """The table's columns and primary key from information_schema (key in index order)."""
    cur = conn.cursor(pymysql.cursors.DictCursor)
    try:
        cur.execute(
            f"SELECT {_SCHEMA_COLUMNS} FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            (database, table),
        )
        columns = tuple(column_from_information_schema(r) for r in cur.fetchall())
        if not columns:
            raise LookupError(missing_table(names.table_id(database, table)))
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s "
            "AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
            (database, table),
        )
        primary_key = tuple(r["COLUMN_NAME"] for r in cur.fetchall())
    finally:
        cur.close()
    return TableSchema(database, table, columns, primary_key)


def read_table_schemas(conn: pymysql.Connection, tables: Iterable[tuple[str, str]]
                       ) -> dict[tuple[str, str], TableSchema]:
    """The schemas of many tables, as ``read_table_schema`` reads one, in two
    information_schema queries over their databases: one query per table cost a round trip
    each (1,000 tables: a second of every code-location load). Tables the source does not have
    are left out."""
    wanted = set(tables)
    if not wanted:
        return {}
    databases = sorted({database for database, _ in wanted})
    marks = ", ".join(["%s"] * len(databases))
    columns: dict[tuple[str, str], list[Any]] = {}
    keys: dict[tuple[str, str], list[str]] = {}
    cur = conn.cursor(pymysql.cursors.DictCursor)
    try:
        cur.execute(
            f"SELECT TABLE_SCHEMA, TABLE_NAME, {_SCHEMA_COLUMNS} FROM information_schema.COLUMNS "
            f"WHERE TABLE_SCHEMA IN ({marks}) ORDER BY TABLE_SCHEMA, TABLE_NAME, "
            "ORDINAL_POSITION", databases)
        for row in cur.fetchall():
            pair = (row["TABLE_SCHEMA"], row["TABLE_NAME"])
            if pair in wanted:
                columns.setdefault(pair, []).append(column_from_information_schema(row))
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME FROM information_schema.STATISTICS "
            f"WHERE TABLE_SCHEMA IN ({marks}) AND INDEX_NAME = 'PRIMARY' "
            "ORDER BY TABLE_SCHEMA, TABLE_NAME, SEQ_IN_INDEX", databases)
        for row in cur.fetchall():
            keys.setdefault((row["TABLE_SCHEMA"], row["TABLE_NAME"]), []).append(
                row["COLUMN_NAME"])
    finally:
        cur.close()
    return {pair: TableSchema(pair[0], pair[1], tuple(specs), tuple(keys.get(pair, ())))
            for pair, specs in columns.items()}


def estimated_rows(conn: pymysql.Connection, tables: Iterable[tuple[str, str]]
                   ) -> dict[tuple[str, str], int]:
    """The server's estimate of each table's rows (``information_schema.TABLES.TABLE_ROWS``:
    InnoDB's sampled statistics, not a count), in one query: enough to order snapshots small
    first. A table without an estimate is left out."""
    wanted = set(tables)
    if not wanted:
        return {}
    databases = sorted({database for database, _ in wanted})
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_ROWS FROM information_schema.TABLES "
            f"WHERE TABLE_SCHEMA IN ({', '.join(['%s'] * len(databases))})", databases)
        rows = cur.fetchall()
    return {(db, t): int(n) for db, t, n in rows if (db, t) in wanted and n is not None}


def server_flavour(conn: pymysql.Connection) -> str:
    return "mariadb" if "mariadb" in conn.get_server_info().lower() else "mysql"


def executed_gtid_text(conn: pymysql.Connection, flavour: str) -> str:
    """The source's executed GTIDs as text (not a watermark: see ARCHITECTURE section 4).

    Used to decide when the engine has caught up, where reading a little early is harmless.
    """
    return flavour_of(flavour).executed_gtid_text(conn)


def server_variables(conn: pymysql.Connection, names: Iterable[str]) -> dict[str, str]:
    wanted = {n.lower() for n in names}
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL VARIABLES")
        return {str(k).lower(): str(v) for k, v in cur.fetchall() if str(k).lower() in wanted}


def check_prerequisites(conn: pymysql.Connection, flavour: str) -> list[str]:
    """Problems that prevent exact capture, each with the setting to change. Empty = fine.

    The engine and the snapshot reader both run it: server variables, and on a replica that
    what it applies reaches its binlog (log_slave_updates / log_replica_updates, OFF by
    default on MariaDB: the engine would stream nothing and call itself caught up).
    """
    actual = server_flavour(conn)
    if actual != flavour:
        return [f"source.flavour is {flavour!r} but the server is {actual}: fix source.flavour"]
    required = flavour_of(flavour).required_variables
    found = server_variables(conn, required)
    problems = []
    for name, value in required.items():
        have = found.get(name)
        if have is None or have.upper() != value:
            problems.append(f"server variable {name} is {have!r}, needs {value!r}")
    return problems + flavour_of(flavour).replica_problems(conn)


def require_prerequisites(conn: pymysql.Connection, flavour: str, server_name: str) -> None:
    problems = check_prerequisites(conn, flavour)
    if problems:
        raise PrerequisiteError(
            f"source {server_name!r} cannot be captured exactly: " + "; ".join(problems)
            + ". Set these on the replica (my.cnf) and restart it."
        )


def selector_from_settings(settings: Settings) -> TableSelector:
    """The tables, columns and keys the config captures (capture.tables, excluded_columns,
    surrogate_keys)."""
    capture = settings.capture
    return TableSelector(
        include=capture.tables.include,
        exclude=capture.tables.exclude,
        excluded_columns=capture.excluded_columns,
        system_databases=capture.system_databases,
        surrogate_keys=tuple((t, tuple(k)) for t, k in sorted(capture.surrogate_keys.items())),
    )
