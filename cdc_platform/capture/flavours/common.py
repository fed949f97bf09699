"""Server-session helpers both flavours use (``capture/flavours/``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pymysql


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
