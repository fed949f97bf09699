"""MySQL and MariaDB differences behind one small protocol (Debezium's flavour seam).

Everything the capture engine and the binlog adapter do differently per server flavour is a
method here: GTID syntax, how a binlog stream is positioned, what a GTID event says about its
group, which server settings capture needs, how the server shows it is a replica. Callers ask
``flavour_of(name)`` instead of comparing flavour strings. (The snapshot watermark,
``capture/snapshot/watermark.py``, still has its own branches for how it reads a watermark
and MySQL's commit-order setting; they belong here next.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pymysql

from cdc_platform.capture.events import Begin
from cdc_platform.capture.gtid import Gtid, GtidSet


class Flavour(Protocol):
    name: str
    #: Server variables capture needs, with their required value.
    required_variables: dict[str, str]

    def parse_position(self, text: str) -> GtidSet:
        """An executed set / position as the server prints it."""

    def parse_gtid(self, text: str) -> Gtid:
        """One GTID as a binlog GTID event names it."""

    def stream_start(self, position: str,
                     connect: Callable[[], pymysql.Connection]) -> dict[str, Any]:
        """mysql-replication ``BinLogStreamReader`` arguments that start after ``position``
        (``connect`` opens a source session if the flavour needs one)."""

    def begin(self, event: Any) -> Begin:
        """The project's ``Begin`` from mysql-replication's GTID event."""

    def executed_gtid_text(self, conn: pymysql.Connection) -> str:
        """The executed GTIDs as text (not a watermark: ARCHITECTURE section 4)."""

    def earliest_position(self, conn: pymysql.Connection) -> str:
        """The position at the start of the oldest binlog still on the server."""

    def replica_problems(self, conn: pymysql.Connection) -> list[str]:
        """Why a replica's binlog would miss what it applies (empty: fine or not a replica)."""


def flavour_of(name: str) -> Flavour:
    from cdc_platform.capture.flavours.mariadb import MARIADB
    from cdc_platform.capture.flavours.mysql import MYSQL

    try:
        return {"mariadb": MARIADB, "mysql": MYSQL}[name]
    except KeyError:
        raise ValueError(f"unknown flavour {name!r} (want 'mysql' or 'mariadb')") from None


def error_code(error: BaseException) -> int | None:
    code = error.args[0] if error.args else None
    return code if isinstance(code, int) else None


@contextlib.contextmanager
def undecoded(conn: pymysql.Connection) -> Iterator[None]:
    """Text columns arrive as bytes inside this block.

    Some result columns hold statement text with whatever bytes the statement had (binary
    literals, a UUID in a BINARY(16), another charset): SHOW BINLOG EVENTS' Info, the error
    columns of SHOW REPLICA / ALL SLAVES STATUS. Decoded as the connection's charset they
    raise UnicodeDecodeError; read as bytes, only what the caller parses is decoded.
    """
    previous = conn.use_unicode
    conn.use_unicode = False
    try:
        yield
    finally:
        conn.use_unicode = previous


def gtid_variable_text(conn: pymysql.Connection, name: str) -> str:
    """A GTID-set server variable (``gtid_executed``, ``gtid_binlog_pos``) as one line of text,
    read outside any open read view (the session commits after it)."""
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute(f"SELECT @@GLOBAL.{name}")  # (a fixed variable name of the flavours)
        value = cur.fetchone()[0] or ""
    conn.commit()
    return str(value).replace("\n", "")


def global_variable(conn: pymysql.Connection, name: str) -> str | None:
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute("SHOW GLOBAL VARIABLES LIKE %s", (name,))
        row = cur.fetchone()
    return None if row is None else str(row[1])


def log_updates_problem(conn: pymysql.Connection, names: tuple[str, ...],
                        evidence: str) -> list[str]:
    """The one replica rule of both flavours: what the replica applies must reach its binlog."""
    for name in names:
        value = global_variable(conn, name)
        if value is not None:
            break
    else:
        name, value = names[0], None
    if (value or "").upper() == "ON":
        return []
    return [f"the server is a replica ({evidence}) but {name} is {value!r}: its binlog lacks "
            f"the replicated transactions, so capture would see none of them. Set {name}=ON "
            "on the replica (my.cnf) and restart it"]
