"""Why capture cannot start, as one line that names the setting or grant and the fix.

A wrong password, a missing grant, an unreachable replica or a setting that makes capture
inexact are the failures a new deployment meets first. Each is reported the same way wherever
it happens (the CLI prints the line on stderr and exits non-zero, Dagster fails the run with
it): :func:`describe_start_error` turns a known error into that line, and
:func:`check_source` finds the account's problems before the engine or a reader starts, so
they are reported at once instead of from deep inside a stream.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pymysql

from cdc_platform.capture.flavours import flavour_of
from cdc_platform.capture.source import purged_binlog_text

if TYPE_CHECKING:
    from cdc_platform.config import Settings

# The account the README documents (section "Configuration": source.user).
DOCUMENTED_GRANTS = ("SELECT", "REPLICATION SLAVE", "REPLICATION CLIENT")
_ACCESS_DENIED = 1045
_PRIVILEGE_ERRORS = {1044, 1142, 1143, 1227}
_CANNOT_CONNECT = {2002, 2003, 2005, 2006, 2013}
_UNKNOWN_DATABASE = 1049
_PURGED = 1236
_NEEDED = re.compile(r"need \(at least one of\) the (.+?) privilege", re.IGNORECASE)
_COMMAND_DENIED = re.compile(r"^(\w+) command denied .* for table [`']?([^`']+)", re.IGNORECASE)
_GRANT_LINE = re.compile(r"^GRANT (.+?) ON (\S+) TO ", re.IGNORECASE | re.DOTALL)


class StartError(RuntimeError):
    """Capture cannot start; the message is the one line to show (setting or grant, fix)."""


@dataclass(frozen=True)
class SourceAccount:
    """What a start error names: the server, its address and the account (never a password).
    """

    server_name: str
    host: str
    port: int
    user: str
    password_env: str
    password_set: bool
    flavour: str = "mariadb"

    @classmethod
    def from_settings(cls, settings: Settings) -> SourceAccount:
        source = settings.source
        return cls(source.server_name, source.host, source.port, source.user,
                   source.password_env, bool(source.password()), source.flavour)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def grant_statement(self) -> str:
        return f"GRANT {', '.join(DOCUMENTED_GRANTS)} ON *.* TO '{self.user}'@'%'"


def grant_name(privilege: str, flavour: str = "mariadb") -> str:
    """A privilege as the documented account names it (MariaDB calls REPLICATION CLIENT
    BINLOG MONITOR since 10.5, and lists SUPER as an alternative)."""
    name = " ".join(privilege.upper().split())
    if name in ("BINLOG MONITOR", "REPLICATION CLIENT", "SUPER"):
        return flavour_of(flavour).monitor_grant
    return name


def missing_grants(grant_lines: Iterable[str], flavour: str) -> list[str]:
    """Which of the documented privileges ``SHOW GRANTS`` lines lack (empty: all there, or
    the account gets privileges through roles, which this does not follow).

    SELECT counts at any level (a database or table grant is enough to start; a table the
    account cannot read fails its snapshot naming the table); REPLICATION SLAVE and REPLICATION
    CLIENT only on ``*.*``, where they exist.
    """
    have: set[str] = set()
    select_somewhere = False
    for line in grant_lines:
        match = _GRANT_LINE.match(line.strip())
        if match is None:
            if line.strip().upper().startswith("GRANT "):
                return []  # a role grant: its privileges are not listed here
            continue
        privileges = {" ".join(p.split()).upper()
                      for p in re.sub(r"\([^)]*\)", "", match.group(1)).split(",")}
        on_all = match.group(2).replace("`", "") == "*.*"
        if privileges & {"ALL", "ALL PRIVILEGES"}:
            if on_all:
                return []
            select_somewhere = True
        if "SELECT" in privileges:
            select_somewhere = True
        if on_all:
            have |= privileges
    missing = []
    if not select_somewhere:
        missing.append("SELECT")
    if "REPLICATION SLAVE" not in have:
        missing.append("REPLICATION SLAVE")
    if not have & {"REPLICATION CLIENT", "BINLOG MONITOR", "SUPER"}:
        missing.append(grant_name("REPLICATION CLIENT", flavour))
    return missing


def _one_line(text: str) -> str:
    return "; ".join(part.strip().rstrip(";") for part in str(text).splitlines() if part.strip())


try:  # (the snapshot reader's chunk connection is mysqlclient's: same (code, message) args)
    import MySQLdb

    _MYSQL_ERRORS: tuple[type[BaseException], ...] = (pymysql.MySQLError, MySQLdb.MySQLError)
except ImportError:  # pragma: no cover - mysqlclient is a dependency
    _MYSQL_ERRORS = (pymysql.MySQLError,)


def _mysql_error(error: BaseException) -> pymysql.MySQLError | None:
    """The pymysql or mysqlclient error behind ``error`` (itself, or a cause a wrapper
    kept)."""
    seen = 0
    while error is not None and seen < 5:
        if isinstance(error, _MYSQL_ERRORS):
            return error  # type: ignore[return-value]
        error = error.__cause__  # type: ignore[assignment]
        seen += 1
    return None


def _describe_mysql(error: pymysql.MySQLError, account: SourceAccount | None) -> str | None:
    args = error.args
    code = args[0] if args and isinstance(args[0], int) else None
    message = _one_line(args[1]) if len(args) > 1 else _one_line(str(error))
    server = f"source {account.server_name!r}" if account else "source"
    where = f" at {account.address}" if account else ""
    user = f"{account.user!r}" if account else "the configured user"
    if code == _ACCESS_DENIED:
        if account is None:
            return f"{server}: {message}: check source.user and the password variable"
        unset = "" if account.password_set else f" ({account.password_env} is not set)"
        return (f"{server}: access denied for user {user}{where}: check source.user and the "
                f"password in the environment variable {account.password_env} "
                f"(source.password_env){unset}")
    if code in _PRIVILEGE_ERRORS:
        needed = _NEEDED.search(message)
        denied = _COMMAND_DENIED.search(message)
        if needed:
            names = [grant_name(p.strip(), account.flavour if account else "mariadb")
                     for p in needed.group(1).split(",")]
            grant = " or ".join(dict.fromkeys(names))
            what = f"the {grant} privilege"
        elif denied:
            what = f"the {denied.group(1).upper()} privilege on {denied.group(2)}"
        else:
            what = "SELECT on the captured databases"
        fix = account.grant_statement() if account else (
            f"GRANT {', '.join(DOCUMENTED_GRANTS)} ON *.* TO the account")
        return (f"{server}: the account {user} lacks {what} ({message}); grant the documented "
                f"source account's privileges: {fix} (README, source.user)")
    if code in _CANNOT_CONNECT:
        address = account.address if account else "the source"
        return (f"{server}: cannot connect to {address} ({message}): check source.host and "
                "source.port, and that the replica is running and reachable from here")
    if code == _UNKNOWN_DATABASE:
        return f"{server}: {message}: check capture.tables and the table names used"
    if code == _PURGED:
        return f"{server}: {purged_binlog_text(None, message)}"
    return None


def describe_start_error(error: BaseException, account: SourceAccount | None = None
                         ) -> str | None:
    """The one line for a known start error (None: not one of them; show it as it is).

    Known: a bad config file (``ConfigError``), a source not set up for exact capture
    (``PrerequisiteError``), the engine's own stops (``EngineError``, ``StartError``), another
    engine holding the landing folder (``EngineLockedError``), an object store that refuses
    the platform (``ObjectStoreError``: no bucket, wrong credentials), a metrics port taken
    (``MetricsPortTakenError``), and the
    server's answers for a wrong password (1045), missing grants (1044, 1142, 1227), an
    unreachable server (2002, 2003, 2005, 2006, 2013), an unknown database (1049) and purged
    binlogs (1236). Nothing in the line comes from a password.
    """
    from cdc_platform.capture.engine import EngineError
    from cdc_platform.capture.landing.fencing import EngineLockedError
    from cdc_platform.capture.source import PrerequisiteError
    from cdc_platform.capture.store.s3store import ObjectStoreError
    from cdc_platform.config import ConfigError
    from cdc_platform.metrics import MetricsPortTakenError

    if isinstance(error, ConfigError | PrerequisiteError | EngineError | StartError
                  | EngineLockedError | ObjectStoreError | MetricsPortTakenError):
        return _one_line(str(error))
    cause = _mysql_error(error)
    if cause is not None:
        return _describe_mysql(cause, account)
    return None


def check_source(settings: Settings) -> None:
    """Connect as the configured account and refuse to start on what would fail later or make
    capture inexact: a wrong password or an unreachable server (pymysql's error, which
    :func:`describe_start_error` words), server settings (``PrerequisiteError``) and missing
    grants of the documented account (``StartError``)."""
    from cdc_platform.capture import source as source_sql

    account = SourceAccount.from_settings(settings)
    with source_sql.source_connection(settings.source.connection_settings()) as conn:
        source_sql.require_prerequisites(conn, settings.source.flavour, account.server_name)
        with conn.cursor() as cur:
            cur.execute("SHOW GRANTS")
            lines = [str(row[0]) for row in cur.fetchall()]
    missing = missing_grants(lines, settings.source.flavour)
    if missing:
        raise StartError(
            f"source {account.server_name!r}: the account {account.user!r} lacks "
            f"{', '.join(missing)}: grant the documented source account's privileges: "
            f"{account.grant_statement()} (README, source.user)")
