"""Where the checkpoint stands against the source: the binlog headroom and the engine's lag.

**Binlog headroom**: how long until the source purges the binlog file a resume from the
checkpoint needs. Once that file is gone the engine cannot resume exactly (error 1236) and
every captured table must be snapshotted again, so the platform forecasts it, above all while
the engine is stopped: a running engine's dump thread keeps the file it reads from being purged,
a stopped one keeps nothing.

* **Retention** (``retention_from_variables``): time-based purge by
  ``binlog_expire_logs_seconds`` (MariaDB >= 10.6, MySQL 8), else ``expire_logs_days`` (days,
  fractional on MariaDB); both 0, or MySQL's ``binlog_expire_logs_auto_purge=OFF``: no purge
  by age. Size-based purge by MariaDB's ``max_binlog_total_size`` (11.4+, alias
  ``binlog_space_limit``, also Percona Server's name); MySQL has none. Manual ``PURGE BINARY
  LOGS`` cannot be forecast.
* **The needed file** (``needed_file_index``): each binlog file starts with the GTIDs executed
  before it (MariaDB's ``Gtid_list`` event, MySQL's ``Previous_gtids``, shown by ``SHOW BINLOG
  EVENTS IN 'file' LIMIT 3``). A resume starts in the newest file whose starting GTIDs the
  checkpoint contains, which is how both servers pick the file for a GTID connect. No file
  qualifies: the needed one is purged already.
* **When it goes** (``forecast``): a purge by age removes a file once its last write is older
  than the expiry. A file's last write is the rotation that closed it, which is when the next
  file began: the first event's timestamp of the next file (``file_started_at``, a short
  binlog read). When the server began the next file at a start, not a rotation, the needed
  file was closed at the shutdown before, at an unknown moment after its own start: the
  forecast counts from its own start, the earliest it can go. The active (last) file is still
  being written, so its headroom is at least the expiry. The servers purge by age only when
  they rotate, flush or start, so the forecast is the earliest moment, never late. A purge by size removes the oldest files while the binlog is
  larger than the limit: the needed file goes once it and the files after it exceed the limit.
* **Low** (``is_low``): under ``WARN_FRACTION`` of the retention or under
  ``WARN_SECONDS``, whichever is larger (and under ``WARN_FRACTION`` of a size limit).

**The engine's lag** behind the source, in seconds: ``checkpoint_lag_seconds`` from the
checkpoint alone (the engine need not run) and ``LagClock`` for a running engine watched from
outside.

The computation is pure (property-tested without a server); ``read_headroom`` is the one I/O
adapter: a short-lived read-only session with the engine's account (SELECT, REPLICATION SLAVE,
REPLICATION CLIENT, which MariaDB >= 10.5 calls BINLOG MONITOR: enough for ``SHOW BINARY LOGS``,
``SHOW BINLOG EVENTS`` and a binlog read). It never raises: what it cannot tell is an
``UNKNOWN`` headroom with the reason, and capture goes on.
"""

from __future__ import annotations

import datetime as dt
import enum
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql
from pymysql.constants import COMMAND

from cdc_platform.capture import source as source_sql
from cdc_platform.capture.flavours import flavour_of
from cdc_platform.capture.gtid import GtidSet, MariadbGtid, MysqlGtidSet

#: Headroom is low under this share of the source's retention ...
WARN_FRACTION = 0.25
#: ... or under this many seconds, whichever is larger.
WARN_SECONDS = 3600.0
#: Connect and read timeout of the headroom's own session: a slow source leaves the headroom
#: unknown for a while, it never holds anything up for long.
READ_TIMEOUT_SECONDS = 5.0

RETENTION_VARIABLES = ("binlog_expire_logs_seconds", "expire_logs_days",
                       "binlog_expire_logs_auto_purge", "max_binlog_total_size",
                       "binlog_space_limit")

_DAY = 86400.0
_BINLOG_DUMP_NON_BLOCK = 1
_OK_PACKET = 0x00
_FORMAT_DESCRIPTION_EVENT = 15


# ---- retention ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Retention:
    """How the source purges its binlog by itself (0: not that way)."""

    expire_seconds: float = 0.0
    size_limit_bytes: int = 0
    #: The settings that decided it, as the server names them.
    why: str = ""

    @property
    def purges(self) -> bool:
        return self.expire_seconds > 0 or self.size_limit_bytes > 0


def retention_from_variables(variables: Mapping[str, str]) -> Retention:
    """The retention ``SHOW GLOBAL VARIABLES`` describes (names lower case; a variable the
    server does not have is absent). ``binlog_expire_logs_seconds`` wins when non-zero, else
    ``expire_logs_days`` (MySQL 8's rule; MariaDB >= 10.6 keeps the two in step)."""

    def number(name: str) -> float:
        try:
            return max(0.0, float(variables.get(name) or 0))
        except ValueError:
            return 0.0

    why = []
    seconds = number("binlog_expire_logs_seconds")
    if seconds > 0:
        why.append(f"binlog_expire_logs_seconds={seconds:g}")
    else:
        days = number("expire_logs_days")
        seconds = days * _DAY
        names = [n for n in ("binlog_expire_logs_seconds", "expire_logs_days") if n in variables]
        why.append(f"expire_logs_days={days:g}" if days > 0
                   else ", ".join(f"{n}=0" for n in names) or "no expiry variable")
    auto_purge = str(variables.get("binlog_expire_logs_auto_purge", "ON")).upper()
    if seconds > 0 and auto_purge in ("OFF", "0"):
        why.append("binlog_expire_logs_auto_purge=OFF")
        seconds = 0.0
    size = 0
    for name in ("max_binlog_total_size", "binlog_space_limit"):
        size = int(number(name))
        if size:
            why.append(f"{name}={size}")
            break
    return Retention(seconds, size, ", ".join(why))


# ---- the needed file ----------------------------------------------------------------------------

@dataclass(frozen=True)
class BinlogFile:
    """A row of ``SHOW BINARY LOGS``."""

    name: str
    size: int


@dataclass(frozen=True)
class FileStart:
    """When the source began a binlog file (its clock, epoch seconds), and whether it did so
    when it started (else at a rotation: the file before was last written then)."""

    at: float
    at_server_start: bool = False


class _MariadbStart:
    """MariaDB: ``Gtid_list``, the last GTID of each (domain, server id) before the file, e.g.
    ``[0-1-100,1-2-7]``; a domain may appear with several server ids."""

    event_type = "Gtid_list"

    @staticmethod
    def contained(info: str, checkpoint: GtidSet) -> bool:
        text = info.strip().removeprefix("[").removesuffix("]").replace("\n", "")
        gtids = [MariadbGtid.parse(part) for part in text.split(",") if part.strip()]
        return all(checkpoint.contains_gtid(g) for g in gtids)


class _MysqlStart:
    """MySQL: ``Previous_gtids``, the GTID set executed before the file."""

    event_type = "Previous_gtids"

    @staticmethod
    def contained(info: str, checkpoint: GtidSet) -> bool:
        return checkpoint.issuperset(MysqlGtidSet.parse(info.replace("\n", "")))


_STARTS = {"mariadb": _MariadbStart(), "mysql": _MysqlStart()}


def starting_event_type(flavour: str) -> str:
    """The event at the start of each binlog file that names the GTIDs before it."""
    return _STARTS[flavour].event_type


def starts_within(flavour: str, info: str, checkpoint: GtidSet) -> bool:
    """Whether the checkpoint contains the GTIDs a file starts after (``info``: that event's
    Info column): a resume from the checkpoint may start in that file."""
    return _STARTS[flavour].contained(info, checkpoint)


def needed_file_index(names: Sequence[str], starts_within_checkpoint: Callable[[str], bool]
                      ) -> int | None:
    """The index of the file a resume from the checkpoint starts in: the newest file whose
    starting GTIDs the checkpoint contains (asked newest first, so only the files from the
    active one back to the needed one are read). None: every such file is purged."""
    for index in range(len(names) - 1, -1, -1):
        if starts_within_checkpoint(names[index]):
            return index
    return None


# ---- the forecast -----------------------------------------------------------------------------

class HeadroomStatus(enum.Enum):
    OK = "ok"
    LOW = "low"
    #: The needed file is gone: the engine cannot resume exactly.
    PURGED = "purged"
    #: The source purges nothing by itself.
    UNBOUNDED = "unbounded"
    #: No checkpoint yet: nothing to keep.
    NO_CHECKPOINT = "no_checkpoint"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class BinlogHeadroom:
    """The forecast for one checkpoint; ``describe()`` says it in one line."""

    status: HeadroomStatus
    #: UNKNOWN: why; PURGED: what is gone.
    reason: str = ""
    needed_file: str | None = None
    active_file: str | None = None
    #: Newer files than the needed one on the source.
    files_after: int = 0
    #: Seconds until a purge by age may remove the needed file (0: due at the next rotation);
    #: None: no purge by age (or unknown).
    seconds: float | None = None
    #: The needed file is the active one: the headroom is at least ``seconds`` (the expiry).
    at_least: bool = False
    #: The source restarted after the needed file: ``seconds`` counts from the file's start.
    restarted: bool = False
    #: Bytes the binlog may grow before a purge by size removes the needed file (None: no limit).
    bytes_left: int | None = None
    retention: Retention | None = None
    #: The checkpoint holds every transaction the source has executed (None: not known).
    caught_up: bool | None = None

    @property
    def low(self) -> bool:
        """A warning is due: low, or purged already."""
        return self.status in (HeadroomStatus.LOW, HeadroomStatus.PURGED)

    @property
    def retention_seconds(self) -> float | None:
        return None if self.retention is None else self.retention.expire_seconds

    def describe(self) -> str:
        why = f" ({self.retention.why})" if self.retention is not None else ""
        if self.status is HeadroomStatus.UNKNOWN:
            return f"unknown: {self.reason}"
        if self.status is HeadroomStatus.NO_CHECKPOINT:
            return "no checkpoint yet: the engine has not run, the source keeps nothing for it"
        if self.status is HeadroomStatus.PURGED:
            return (f"purged: {self.reason}. The engine cannot resume exactly: re-snapshot the "
                    "captured tables (or start from a fresh landing zone), and keep binlogs "
                    "longer")
        if self.status is HeadroomStatus.UNBOUNDED:
            return (f"unbounded: the source purges no binlog by itself{why}; the checkpoint "
                    f"needs {self.needed_file}")
        parts = []
        if self.seconds is not None:
            if self.at_least:
                parts.append(f"at least {duration_text(self.seconds)} (the checkpoint needs the "
                             f"active binlog file {self.needed_file})")
            elif self.seconds <= 0:
                parts.append(f"none: {self.needed_file}, which the checkpoint needs, is past "
                             "its expiry; the source purges it at its next binlog rotation")
            else:
                parts.append(f"{duration_text(self.seconds)} until {self.needed_file}, which "
                             f"the checkpoint needs, may be purged ({self.files_after} newer "
                             "file(s) on the source)")
            if self.restarted:
                parts[-1] += (" (the source restarted after it: counted from the file's "
                              "start, the earliest it can go)")
        if self.bytes_left is not None:
            parts.append(f"{max(self.bytes_left, 0)} bytes more binlog until a purge by size "
                         f"removes {self.needed_file}")
        text = "; ".join(parts) + why
        if self.status is HeadroomStatus.LOW:
            return (f"LOW: {text}. Keep the capture engine (stream_changes) running so its "
                    "checkpoint moves on, or raise the source's binlog retention")
        return text


def is_low(seconds: float | None, bytes_left: int | None, retention: Retention) -> bool:
    """Under ``WARN_FRACTION`` of the retention or ``WARN_SECONDS`` (the larger), or under
    ``WARN_FRACTION`` of the size limit."""
    if seconds is not None and seconds < max(WARN_FRACTION * retention.expire_seconds,
                                             WARN_SECONDS):
        return True
    return bytes_left is not None and bytes_left < WARN_FRACTION * retention.size_limit_bytes


def forecast(files: Sequence[BinlogFile], needed: int | None, retention: Retention, *,
             last_written_at: float | None, now: float, restarted: bool = False,
             caught_up: bool | None = None) -> BinlogHeadroom:
    """The headroom of the checkpoint whose resume starts in ``files[needed]`` (files oldest
    first, as ``SHOW BINARY LOGS`` lists them; ``needed`` from ``needed_file_index``).
    ``last_written_at``: when that file was last written, at the earliest, in the source's
    clock like ``now`` (unused when it is the active file); ``restarted``: that is the file's
    own start, the source having restarted after it."""
    active = files[-1].name if files else None
    if needed is None:
        oldest = files[0].name if files else "none"
        return BinlogHeadroom(
            HeadroomStatus.PURGED, reason="no binlog file on the source starts within the "
            f"checkpoint's GTIDs (oldest file: {oldest})", active_file=active,
            seconds=0.0, retention=retention, caught_up=caught_up)
    seconds: float | None = None
    at_least = False
    if retention.expire_seconds > 0:
        if needed == len(files) - 1:
            seconds, at_least = retention.expire_seconds, True
        elif last_written_at is not None:
            # (never more than the expiry: a last write stamped after ``now`` is clock skew)
            seconds = min(retention.expire_seconds,
                          max(0.0, last_written_at + retention.expire_seconds - now))
        else:
            raise ValueError(f"when {files[needed].name} was last written is needed")
    bytes_left = None
    if retention.size_limit_bytes > 0:
        bytes_left = retention.size_limit_bytes - sum(f.size for f in files[needed:])
    if seconds is None and bytes_left is None:
        status = HeadroomStatus.UNBOUNDED
    elif is_low(seconds, bytes_left, retention):
        status = HeadroomStatus.LOW
    else:
        status = HeadroomStatus.OK
    return BinlogHeadroom(status, needed_file=files[needed].name, active_file=active,
                          files_after=len(files) - 1 - needed, seconds=seconds,
                          at_least=at_least, restarted=restarted and seconds is not None
                          and not at_least, bytes_left=bytes_left, retention=retention,
                          caught_up=caught_up)



def duration_text(seconds: float) -> str:
    """``3 d 4 h``, ``1 h 52 min``, ``12 min``, ``45 s``."""
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{minutes} min" if minutes else f"{secs} s"


# ---- reading the source ----------------------------------------------------------------------

def read_headroom(connection_settings: Mapping[str, Any], flavour: str,
                  checkpoint_gtid: str | None) -> BinlogHeadroom:
    """The headroom of a checkpoint at ``checkpoint_gtid`` (None: no checkpoint yet), read from
    the source now. Never raises: a failure is an UNKNOWN headroom naming it."""
    settings = {**connection_settings, "connect_timeout": READ_TIMEOUT_SECONDS,
                "read_timeout": READ_TIMEOUT_SECONDS}
    try:
        with source_sql.source_connection(settings) as conn:
            return _read(conn, settings, flavour, checkpoint_gtid)
    except pymysql.MySQLError as error:
        return BinlogHeadroom(HeadroomStatus.UNKNOWN, reason=_mysql_error_text(error, flavour))
    except Exception as error:  # noqa: BLE001 - a forecast must never break capture
        return BinlogHeadroom(HeadroomStatus.UNKNOWN, reason=f"{type(error).__name__}: {error}")


def _mysql_error_text(error: pymysql.MySQLError, flavour: str) -> str:
    code = error.args[0] if error.args else None
    if code in (1227, 1142):  # (a privilege missing)
        return (f"the source refused a binlog query ({error}): the account needs REPLICATION "
                f"SLAVE and {flavour_of(flavour).monitor_grant}")
    return f"source error {error}"


def _read(conn: pymysql.Connection, settings: Mapping[str, Any], flavour: str,
          checkpoint_gtid: str | None) -> BinlogHeadroom:
    retention = retention_from_variables(
        source_sql.server_variables(conn, RETENTION_VARIABLES))
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute("SHOW BINARY LOGS")
        files = [BinlogFile(str(row[0]), int(row[1])) for row in cur.fetchall()]
        cur.execute("SELECT UNIX_TIMESTAMP()")
        now = float(cur.fetchone()[0])
    if not files:
        return BinlogHeadroom(HeadroomStatus.UNKNOWN, reason="the source lists no binary logs "
                              "(is log_bin on?)", retention=retention)
    if checkpoint_gtid is None:
        return BinlogHeadroom(HeadroomStatus.NO_CHECKPOINT, active_file=files[-1].name,
                              retention=retention)
    side = flavour_of(flavour)
    checkpoint = side.parse_position(checkpoint_gtid)
    caught_up = checkpoint.issuperset(side.parse_position(side.executed_gtid_text(conn)))
    names = [f.name for f in files]
    if flavour == "mysql" and checkpoint.is_empty:
        needed: int | None = 0  # (an empty MySQL position streams from the oldest file)
    else:
        needed = needed_file_index(names, lambda name: starts_within(
            flavour, starting_gtids(conn, flavour, name), checkpoint))
    written_at, restarted = None, False
    if needed is not None and needed < len(files) - 1 and retention.expire_seconds > 0:
        # The next file's start; after a restart, the needed file's own (the earliest).
        following = file_started_at(settings, names[needed + 1])
        restarted = following.at_server_start
        written_at = (file_started_at(settings, names[needed]).at if restarted
                      else following.at)
    return forecast(files, needed, retention, last_written_at=written_at, now=now,
                    restarted=restarted, caught_up=caught_up)


def starting_gtids(conn: pymysql.Connection, flavour: str, file_name: str) -> str:
    """The Info of the event that opens ``file_name`` with the GTIDs before it."""
    wanted = starting_event_type(flavour)
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute("SHOW BINLOG EVENTS IN %s LIMIT 3", (file_name,))
        for row in cur.fetchall():
            if str(row[2]) == wanted:
                info = row[5]
                return info.decode() if isinstance(info, bytes) else str(info or "")
    raise ValueError(f"binlog file {file_name} has no {wanted} event among its first three")


def file_started_at(connection_settings: Mapping[str, Any], file_name: str) -> FileStart:
    """When the source began ``file_name``: the timestamp of its first event, the format
    description (the dump's leading Rotate event has none), read over the replication
    protocol; its ``created`` field is set only in the file a server opens when it starts.

    The dump asks for no blocking and names server id 0: the server registers no replica,
    never disconnects another one with the same id (the engine's), and ends the dump at the
    end of the binlog. Only the first events are read, then the session is closed.
    """
    conn = pymysql.connect(**connection_settings)
    try:
        with conn.cursor() as cur:
            # Checksummed events are sent only to a reader that says it can take them.
            cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum, "
                        "@source_binlog_checksum = @@global.binlog_checksum, "
                        "@mariadb_slave_capability = 4")
        conn._execute_command(  # (pymysql's own framing, as mysql-replication uses it)
            COMMAND.COM_BINLOG_DUMP,
            struct.pack("<IHI", 4, _BINLOG_DUMP_NON_BLOCK, 0) + file_name.encode())
        for _ in range(3):
            data = conn._read_packet().get_all_data()  # (raises the server's error)
            if data[0] != _OK_PACKET:
                break
            timestamp, event_type = struct.unpack_from("<IB", data, 1)
            if event_type == _FORMAT_DESCRIPTION_EVENT:
                # header (19 bytes), binlog version (2), server version (50), created (4)
                created = struct.unpack_from("<I", data, 1 + 19 + 2 + 50)[0]
                return FileStart(float(timestamp), at_server_start=created != 0)
    finally:
        conn.close()
    raise ValueError(f"binlog file {file_name}: no format description event at its start")


# ---- the engine's lag ---------------------------------------------------------------------------

def checkpoint_lag_seconds(written_at: str, lag_at_write: float | None,
                           caught_up: bool | None, now: float | None = None) -> float | None:
    """The engine's lag behind the source as its checkpoint shows it, running or not: 0 when
    the checkpoint holds every transaction the source executed; otherwise the checkpoint's age
    plus the lag it recorded, i.e. how long ago the engine last showed it was current (an
    upper bound: the source may have been idle for part of it). None when the checkpoint
    says neither."""
    if caught_up:
        return 0.0
    try:
        written = dt.datetime.fromisoformat(written_at).timestamp()
    except (TypeError, ValueError):
        return None
    age = max(0.0, (time.time() if now is None else now) - written)
    return age + max(0.0, lag_at_write or 0.0)


class LagClock:
    """The lag of a running engine, watched from outside it.

    The engine measures its lag when a transaction commits (now minus the commit time) and when
    a heartbeat shows it at the end of the binlog (0); in between its figure stands still, also
    while it is stuck (reconnecting, reading one long transaction). Watched every few seconds,
    the figure plus the time since it last moved is a lag that keeps growing while the engine
    makes no progress, and falls back to the engine's own figure when it does. ``caught_up``
    (the engine's position holds the source's executed set, just checked) means 0.
    """

    def __init__(self) -> None:
        self._seen: tuple[int, int] | None = None
        self._base: float | None = None
        self._moved_at = 0.0

    def lag(self, now: float, reported: float | None, transactions: int, events: int,
            caught_up: bool = False) -> float | None:
        seen, self._seen = self._seen, (transactions, events)
        if caught_up:
            self._base, self._moved_at = 0.0, now
        elif (seen is None or transactions != seen[0]
              or (reported == 0 and events != seen[1])):
            self._base, self._moved_at = reported, now
        if self._base is None:
            return None
        return self._base + (now - self._moved_at)
