"""Read-only GTID watermarks around a chunk SELECT, per flavour (ARCHITECTURE section 4).

A chunk carries two watermarks: ``low_watermark`` (``lw``), transactions the chunk certainly
reflects, and ``after``, a set holding every transaction it may reflect. The engine commits the
chunk once ``processed ⊇ after`` and drops keys touched outside ``lw``. If ``lw`` held a
transaction the SELECT could not see, the engine would emit the chunk's older row over that
transaction's newer image: silent corruption. So, per flavour:

* MariaDB: ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` opens the read view and, through the
  binlog's commit-ordering hook, records the binlog offset consistent with it (session status
  ``binlog_snapshot_file`` / ``binlog_snapshot_position``). ``BINLOG_GTID_POS`` turns that offset
  into a GTID position holding exactly what the view sees: ``lw = after`` (a connection that
  took a watermark before may instead apply the GTIDs of the events in between; see
  ``INCREMENTAL_MAX_GAP_FRACTION``). ``@@gtid_binlog_pos``
  is *not* a watermark: it advances when a transaction is written to the binlog, before the
  storage-engine commit makes it visible.
* MySQL: ``Executed_Gtid_Set`` is updated after the storage-engine commit, so read before the
  read view opens it is a safe ``lw``; read again after the SELECT it is a safe ``after``. Each
  status read is followed by COMMIT so that no metadata lock outlives it.

Every statement runs on a session opened with ``capture.source.connect`` (read-only).
"""

from __future__ import annotations

import contextlib
import logging
import re
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import pymysql
import pymysql.cursors

from cdc_platform.capture.flavours import flavour_of
from cdc_platform.capture.flavours.common import undecoded
from cdc_platform.capture.gtid import GtidSet, MariadbGtid, MariadbPosition, parse_position
from cdc_platform.capture.snapshot.native import SQL_ERRORS, is_native, raw_results
from cdc_platform.capture.source import PrerequisiteError, check_prerequisites, server_variables

T = TypeVar("T")

ER_PARSE_ERROR = 1064

_BINARY_LOG_STATUS = "SHOW BINARY LOG STATUS"  # MySQL >= 8.2
_MASTER_STATUS = "SHOW MASTER STATUS"  # MySQL < 8.2 (removed in 8.4)

# Which status statement a MySQL connection understood, so the fallback costs one failed
# round trip per connection, not one per watermark.
_status_statement: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


class WatermarkError(RuntimeError):
    """A watermark could not be read; the message says why and what to do."""


@dataclass(frozen=True)
class Watermarks:
    """The GTID bounds of one read view: it reflects all of ``low_watermark``, nothing outside
    ``after``. ``snapshot_binlog`` is the MariaDB read view's binlog offset (for diagnostics)."""

    low_watermark: GtidSet
    after: GtidSet
    snapshot_binlog: tuple[str, int] | None = None


def read_with_watermarks(
    conn: pymysql.Connection, flavour: str, read: Callable[[Any], T]
) -> tuple[T, Watermarks]:
    """Run ``read(cursor)`` inside one consistent read view, between read-only watermarks.

    ``read`` may run several statements (the chunk SELECT, then the table's column list while
    the SELECT's metadata lock still blocks DDL); they all see the same read view.
    """
    return _READERS[flavour_of(flavour).watermark](conn, read)


def _cursor(conn: Any) -> Any:
    """A plain (tuple, buffered) cursor of either driver: the reader reads chunks over
    mysqlclient, everything else over PyMySQL."""
    return conn.cursor() if is_native(conn) else conn.cursor(pymysql.cursors.Cursor)


def _undecoded(conn: Any) -> Any:
    return raw_results(conn) if is_native(conn) else undecoded(conn)


def _read_mariadb(conn: pymysql.Connection, read: Callable[[Any], T]) -> tuple[T, Watermarks]:
    with _cursor(conn) as cur:
        # Under READ COMMITTED each statement takes a newer read view than the snapshot whose
        # binlog offset we record; the session stays READ ONLY (set by source.connect).
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        try:
            snapshot = _mariadb_snapshot_offset(cur)
            low_watermark = _mariadb_gtid_position(conn, cur, *snapshot)
            result = read(cur)
            conn.commit()
        except BaseException:
            _rollback_quietly(conn)
            raise
    return result, Watermarks(low_watermark, low_watermark, snapshot)


# BINLOG_GTID_POS reads the binlog file from its start up to the offset: measured 0.19 ms per
# MB here (77 ms at 400 MB into a file, so about 200 ms per chunk near the end of a default
# 1 GB file, several times a 4096-row chunk's SELECT). A reader taking watermarks one after
# another on one connection instead reads only the events between its previous offset and the
# new one (SHOW BINLOG EVENTS, needs BINLOG MONITOR = REPLICATION CLIENT) and applies their
# GTIDs: 0.15-0.3 ms per KB of small-row events, about 1300 times the server's cost per byte,
# so it is used while the gap is below 1/2000 of the offset (at 400 MB: gaps up to 200 KB,
# some 700 single-row transactions); on another file, or when in doubt, the server computes
# the position, and every VERIFY_EVERY-th watermark on a connection is the server's and is
# compared with the events' answer.
INCREMENTAL_MAX_GAP_FRACTION = 1 / 2000
VERIFY_EVERY = 64
_EVENTS_PAGE = 2000
_GTID_IN_EVENT = re.compile(r"\bGTID (\d+)-(\d+)-(\d+)\b")


@dataclass
class _ResolvedOffset:
    """The last binlog offset a connection turned into a GTID position."""

    file: str
    offset: int
    position: MariadbPosition
    since_verified: int = 0  # watermarks computed from events since the server's last one
    events_disabled: bool = False


_resolved: weakref.WeakKeyDictionary[Any, _ResolvedOffset] = weakref.WeakKeyDictionary()
_log = logging.getLogger(__name__)


def _mariadb_gtid_position(conn: pymysql.Connection, cur: Any, file: str,
                           offset: int) -> MariadbPosition:
    """The GTID position of binlog offset ``(file, offset)``: what ``BINLOG_GTID_POS`` says,
    computed from the connection's previous offset when that is cheaper (see above)."""
    last = _resolved.get(conn)
    follows = last is not None and last.file == file and last.offset <= offset
    if last is not None and follows and not last.events_disabled:
        position = None
        if last.since_verified + 1 < VERIFY_EVERY:
            if last.offset == offset:
                position = last.position  # (an idle source: nothing to read at all)
            elif offset - last.offset <= offset * INCREMENTAL_MAX_GAP_FRACTION:
                position = _apply_events(cur, file, last.offset, offset, last.position)
        if position is not None:
            _resolved[conn] = _ResolvedOffset(file, offset, position, last.since_verified + 1)
            return position
    position = _binlog_gtid_pos(cur, file, offset)
    disabled = last is not None and follows and last.events_disabled
    if last is not None and follows and not disabled and (
            last.since_verified + 1 >= VERIFY_EVERY):
        forward = _apply_events(cur, file, last.offset, offset, last.position)
        if forward is not None and forward != position:
            # Not expected: the server's answer is used, and this connection asks the server
            # from now on (a new connection starts over).
            _log.warning(
                f"watermark at binlog {file}:{offset}: the events since offset {last.offset} "
                f"gave {forward}, BINLOG_GTID_POS gave {position}; BINLOG_GTID_POS is used "
                "from now on on this connection (please report this)")
            disabled = True
    _resolved[conn] = _ResolvedOffset(file, offset, position, events_disabled=disabled)
    return position


def _binlog_gtid_pos(cur: Any, file: str, offset: int) -> MariadbPosition:
    cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, offset))
    row = cur.fetchone()
    if row is None or row[0] is None:
        raise WatermarkError(
            f"BINLOG_GTID_POS('{file}', {offset}) returned NULL: the binlog file of the read "
            "view is unreadable (purged or rotated away?); retry the chunk"
        )
    return MariadbPosition.parse(str(row[0]))


def _apply_events(cur: Any, file: str, start: int, end: int,
                  position: MariadbPosition) -> MariadbPosition | None:
    """``position`` (that of offset ``start``) moved over the events in ``[start, end)``: each
    GTID event replaces its domain's GTID, as BINLOG_GTID_POS does. None when the events do
    not run from ``start`` to exactly ``end`` (the caller asks the server instead)."""
    domains = {gtid.domain: gtid for gtid in position}
    at = start
    while at < end:
        try:
            with _undecoded(cur.connection):
                cur.execute("SHOW BINLOG EVENTS IN %s FROM %s LIMIT %s",
                            (file, at, _EVENTS_PAGE))
                events = cur.fetchall()
        except SQL_ERRORS as error:
            _log.debug(f"SHOW BINLOG EVENTS IN {file} FROM {at}: {error}")
            return None
        if not events:
            return None
        for _name, pos, kind, _server, end_pos, info in events:
            if at >= end:
                break
            if int(pos) != at:
                return None
            if kind == b"Gtid":
                # Only a GTID event's Info is parsed, as ASCII; any other byte is not ours.
                match = _GTID_IN_EVENT.search(bytes(info or b"").decode("ascii", "replace"))
                if match is None:
                    return None
                gtid = MariadbGtid(*(int(part) for part in match.groups()))
                domains[gtid.domain] = gtid
            at = int(end_pos)
    if at != end:
        return None
    return MariadbPosition(domains.values())


def _mariadb_snapshot_offset(cur: Any) -> tuple[str, int]:
    """The binlog offset consistent with this transaction's read view."""
    cur.execute("SHOW SESSION STATUS LIKE 'binlog_snapshot_%'")
    status = {str(name).lower(): value for name, value in cur.fetchall()}
    file, position = status.get("binlog_snapshot_file"), status.get("binlog_snapshot_position")
    if not file or position is None:
        raise WatermarkError(
            "the source reports no binlog_snapshot_file/position: binary logging is off; "
            "start the replica with log_bin (and log_slave_updates) to take snapshots"
        )
    return str(file), int(position)


def _read_mysql(conn: pymysql.Connection, read: Callable[[Any], T]) -> tuple[T, Watermarks]:
    with _cursor(conn) as cur:
        low_watermark = _mysql_executed_gtid_set(conn, cur)
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        try:
            result = read(cur)
            conn.commit()
        except BaseException:
            _rollback_quietly(conn)
            raise
        after = _mysql_executed_gtid_set(conn, cur)
    return result, Watermarks(low_watermark, after)


def _mysql_executed_gtid_set(conn: pymysql.Connection, cur: Any) -> GtidSet:
    """``Executed_Gtid_Set`` from the binary log status, then COMMIT (no lingering MDL)."""
    statement = _status_statement.get(conn, _BINARY_LOG_STATUS)
    try:
        cur.execute(statement)
    except SQL_ERRORS as error:
        if statement != _BINARY_LOG_STATUS or _error_code(error) != ER_PARSE_ERROR:
            raise
        statement = _MASTER_STATUS
        cur.execute(statement)
    _status_statement[conn] = statement
    row = cur.fetchone()
    names = [str(d[0]).lower() for d in cur.description or ()]
    conn.commit()
    if row is None or "executed_gtid_set" not in names:
        raise WatermarkError(
            f"{statement} returned no Executed_Gtid_Set: binary logging or GTIDs are off on the "
            "source; set log_bin, gtid_mode=ON and enforce_gtid_consistency=ON"
        )
    text = str(row[names.index("executed_gtid_set")] or "")
    try:
        return parse_position("mysql", text)
    except ValueError as error:
        raise WatermarkError(f"{statement}: unreadable Executed_Gtid_Set: {error}") from None


def _rollback_quietly(conn: pymysql.Connection) -> None:
    # A failing rollback means a broken connection; the original error says why.
    with contextlib.suppress(*SQL_ERRORS):
        conn.rollback()


def _error_code(error: BaseException) -> int | None:
    code = error.args[0] if error.args else None
    return code if isinstance(code, int) else None


# ---- prerequisites ---------------------------------------------------------------------------


def check_snapshot_prerequisites(conn: pymysql.Connection, flavour: str) -> list[str]:
    """Problems that make read-only snapshots inexact, each naming the setting. Empty = fine.

    The streaming prerequisites (``source.check_prerequisites``: GTIDs, ROW binlog, FULL row
    image and metadata, and on a replica ``log_slave_updates``), and only what is specific to
    snapshots on top: on a MySQL replica, parallel workers must commit in source order, as the
    seed requires. MariaDB needs no parallel-mode setting: its parallel replication commits in
    order within a replication domain in every ``slave_parallel_mode`` (only different domains
    may commit out of order), and a MariaDB GTID position tracks each domain on its own; the
    ``gtid_strict_mode`` the streaming checks require keeps each domain's sequence increasing.
    """
    problems = check_prerequisites(conn, flavour)
    if problems and problems[0].startswith("source.flavour"):
        return problems
    extra = _SNAPSHOT_CHECKS.get(flavour_of(flavour).watermark)
    return problems + extra(conn) if extra else problems


def require_snapshot_prerequisites(
    conn: pymysql.Connection, flavour: str, server_name: str
) -> None:
    """Raise PrerequisiteError listing every problem (see check_snapshot_prerequisites)."""
    problems = check_snapshot_prerequisites(conn, flavour)
    if problems:
        raise PrerequisiteError(
            f"source {server_name!r} cannot be snapshotted exactly: " + "; ".join(problems)
            + ". Set these on the replica (my.cnf) and restart it."
        )


def _first(values: dict[str, str], names: Iterable[str]) -> tuple[str, str | None]:
    """The first of several names (new, old) the server knows, with its value."""
    names = list(names)
    for name in names:
        if name in values:
            return name, values[name]
    return names[0], None


def _mysql_commit_order_problems(conn: pymysql.Connection) -> list[str]:
    if not _mysql_is_replica(conn):
        return []
    values = server_variables(conn, [
        "replica_parallel_workers", "slave_parallel_workers", "replica_preserve_commit_order",
        "slave_preserve_commit_order",
    ])
    workers_name, workers = _first(values, ["replica_parallel_workers", "slave_parallel_workers"])
    order_name, order = _first(values, ["replica_preserve_commit_order",
                                        "slave_preserve_commit_order"])
    if int(workers or 0) > 0 and (order or "").upper() != "ON":
        return [f"{workers_name} is {workers} but {order_name} is {order!r}, needs 'ON' "
                "(parallel workers must commit in source order)"]
    return []


def _mysql_is_replica(conn: pymysql.Connection) -> bool:
    # (the status row's error columns quote statements: bytes, see undecoded)
    with conn.cursor(pymysql.cursors.Cursor) as cur, undecoded(conn):
        try:
            cur.execute("SHOW REPLICA STATUS")  # MySQL >= 8.0.22
        except pymysql.MySQLError as error:
            if _error_code(error) != ER_PARSE_ERROR:
                raise
            cur.execute("SHOW SLAVE STATUS")
        return bool(cur.fetchall())


# How each flavour's watermark is read (``Flavour.watermark``), and what snapshots need on top
# of the streaming prerequisites: a MySQL replica's parallel workers must commit in order.
_READERS: dict[str, Callable[[pymysql.Connection, Callable[[Any], Any]], Any]] = {
    "consistent_snapshot": _read_mariadb,
    "executed_set": _read_mysql,
}
_SNAPSHOT_CHECKS: dict[str, Callable[[pymysql.Connection], list[str]]] = {
    "executed_set": _mysql_commit_order_problems,
}
