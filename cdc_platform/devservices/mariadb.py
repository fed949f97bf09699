"""A private MariaDB source server configured like a CDC-ready read replica.

The demo and the integration tests need a server with GTIDs and a full row-based binlog, which
the machine's own MariaDB (a system service on port 3306) is not, and must not be touched. This
module runs Debian's ``mariadbd`` with ``--no-defaults`` on its own data directory, socket and
free port, so nothing from ``/etc/mysql`` leaks in.

Layout of ``base_dir``::

    data/            datadir (initialised once with mariadb-install-db, reused afterwards)
    binlog/          binlog.NNNNNN + binlog.index
    mariadbd.err     server error log        mariadbd.out  stdout/stderr of the process
    mariadbd.pid     server pid file         mariadbd.sock unix socket (if the path is short)
    state.json       pid/port/socket of the running server, read by other processes

A server can also run as a GTID replica of another one (``replica=True``, then
:meth:`MariaDBServer.replicate_from`): read-only, with a parallel applier and
``log_slave_updates``, like the read replicas the platform streams from in production.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql

from cdc_platform.devservices._process import (
    DevServiceError,
    ManagedService,
    find_processes,
)

__all__ = ["MariaDBServer", "REPLICATION_GRANTS", "gtid_position_covers"]

#: What the CDC account gets. On MariaDB >= 10.5 ``REPLICATION CLIENT`` is an alias of
#: ``BINLOG MONITOR`` (SHOW MASTER/BINLOG STATUS, SHOW BINARY LOGS), so nothing else is needed.
REPLICATION_GRANTS = "SELECT, REPLICATION SLAVE, REPLICATION CLIENT"

#: The account a replica's IO thread uses on its primary (only ``REPLICATION SLAVE``).
REPLICATION_USER = "repl"
REPLICATION_PASSWORD = "repl"

_ER_NO_SUCH_THREAD = 1094
_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux; keep a margin


def _find_binary(explicit: str | None, name: str, candidates: Sequence[str]) -> str:
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise DevServiceError(f"{name} binary {explicit!r} is not executable")
        return explicit
    found = shutil.which(name)
    if found:
        return found
    for candidate in candidates:
        if os.access(candidate, os.X_OK):
            return candidate
    raise DevServiceError(
        f"{name} not found on PATH or in {', '.join(candidates)}. Install the Debian package "
        f"mariadb-server (scripts/bootstrap.sh does this), or pass its path explicitly."
    )


def _gtid_seqnos(position: str) -> dict[tuple[int, int], int]:
    """``"0-1-42,1-2-7"`` -> ``{(0, 1): 42, (1, 2): 7}`` (MariaDB GTID position text)."""
    seqnos: dict[tuple[int, int], int] = {}
    for part in (position or "").replace("\n", "").split(","):
        part = part.strip()
        if part:
            domain, server, seqno = (int(x) for x in part.split("-"))
            seqnos[(domain, server)] = seqno
    return seqnos


def gtid_position_covers(position: str, target: str) -> bool:
    """True when MariaDB GTID ``position`` has reached ``target`` in every replication domain.

    A position holds the last GTID per domain; a domain's sequence numbers grow monotonically
    across server ids (gtid_strict_mode), so "reached" is: for each domain of ``target``,
    ``position`` holds a sequence number at least as high.
    """
    reached: dict[int, int] = {}
    for (domain, _server), seqno in _gtid_seqnos(position).items():
        reached[domain] = max(reached.get(domain, 0), seqno)
    return all(reached.get(domain, -1) >= seqno
               for (domain, _server), seqno in _gtid_seqnos(target).items())


@dataclass(eq=False)
class MariaDBServer(ManagedService):
    """A private ``mariadbd`` with GTIDs and a FULL row-based binlog, for tests and the demo.

    ``start()`` initialises ``base_dir/data`` on first use only, launches the server on
    ``host:port`` (a free port if ``port`` is None), waits until it accepts connections, and
    (re)creates the ``cdc_user`` account with exactly :data:`REPLICATION_GRANTS`. User setup is
    not binlogged, so a fresh server's ``@@gtid_binlog_pos`` stays empty until the first write.
    Root connects over TCP with an empty password (test data only).

    ``replica=True`` starts it as a read replica: ``--read-only``, a parallel applier
    (``slave_parallel_threads`` workers in ``slave_parallel_mode``) and, like every server here,
    ``--log-slave-updates``; :meth:`replicate_from` then points it at its primary over GTIDs.
    """

    executable_name = "mariadbd"
    display_name = "MariaDB server"

    base_dir: Path
    port: int | None = None
    host: str = "127.0.0.1"
    server_id: int = 1
    cdc_user: str = "cdc"
    cdc_password: str = "cdc"
    innodb_buffer_pool_size: str = "256M"
    extra_args: Sequence[str] = ()
    start_timeout: float = 60.0
    replica: bool = False
    slave_parallel_threads: int = 4
    slave_parallel_mode: str = "optimistic"
    mariadbd: str | None = field(default=None, repr=False)
    install_db: str | None = field(default=None, repr=False)
    _socket: Path | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir).expanduser().resolve()
        self._auto_port = self.port is None

    # ---- paths ---------------------------------------------------------------------------

    @property
    def tmp_dir(self) -> Path:
        """The server's own temporary directory (created on start)."""
        return self.base_dir / "tmp"

    @property
    def datadir(self) -> Path:
        """The server's data directory (kept across restarts; delete it for a fresh server)."""
        return self.base_dir / "data"

    @property
    def binlog_dir(self) -> Path:
        """Directory holding ``binlog.NNNNNN`` and ``binlog.index``."""
        return self.base_dir / "binlog"

    @property
    def error_log(self) -> Path:
        """The server error log; its tail is quoted when start-up fails."""
        return self.base_dir / "mariadbd.err"

    @property
    def socket(self) -> str:
        """Unix socket path (under base_dir, or a short path in the temp dir if that is too long)."""
        if self._socket is None:
            path = self.base_dir / "mariadbd.sock"
            if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
                digest = hashlib.sha1(os.fsencode(self.base_dir)).hexdigest()[:12]
                path = Path(tempfile.gettempdir()) / f"cdc-mariadb-{digest}.sock"
            self._socket = path
        return str(self._socket)

    # ---- hooks ---------------------------------------------------------------------------

    def _marker(self, port: int) -> str:
        return f"--datadir={self.datadir}"

    def _log_files(self) -> list[Path]:
        return [self.error_log, self._out_log]

    def _failure_hint(self) -> str:
        return (
            f"Fix the cause shown in the log above. If the data directory is damaged (test data "
            f"only), delete {self.base_dir} to start from a fresh one."
        )

    def _stray_pids(self) -> list[int]:
        return find_processes(self.executable_name, self._marker(0))

    def _state_extra(self) -> dict[str, Any]:
        return {"socket": self.socket, "datadir": str(self.datadir), "server_id": self.server_id,
                "replica": self.replica}

    def _load_state_extra(self, state: dict[str, Any]) -> None:
        if state.get("socket"):
            self._socket = Path(state["socket"])
        if isinstance(state.get("server_id"), int):
            self.server_id = state["server_id"]

    def _argv(self, port: int) -> list[str]:
        mariadbd = _find_binary(self.mariadbd, "mariadbd", ["/usr/sbin/mariadbd"])
        user = ["--user=root"] if os.geteuid() == 0 else []
        return [
            mariadbd,
            "--no-defaults",  # must come first: ignore /etc/mysql and ~/.my.cnf
            *user,
            f"--datadir={self.datadir}",
            f"--socket={self.socket}",
            f"--pid-file={self.base_dir / 'mariadbd.pid'}",
            f"--port={port}",
            f"--bind-address={self.host}",
            f"--log-error={self.error_log}",
            f"--tmpdir={self.tmp_dir}",
            f"--log-bin={self.binlog_dir / 'binlog'}",
            "--binlog-format=ROW",
            "--binlog-row-image=FULL",
            "--binlog-row-metadata=FULL",
            "--gtid-strict-mode=ON",
            f"--server-id={self.server_id}",
            "--log-slave-updates=ON",
            "--skip-name-resolve",
            f"--innodb-buffer-pool-size={self.innodb_buffer_pool_size}",
            # test data only: trade durability for speed
            "--innodb-flush-log-at-trx-commit=2",
            "--sync-binlog=0",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_unicode_ci",
            "--default-time-zone=+00:00",
            *self._replica_args(),
            *self.extra_args,
        ]

    def _replica_args(self) -> list[str]:
        if not self.replica:
            return []
        return [
            "--read-only=ON",
            f"--slave-parallel-threads={self.slave_parallel_threads}",
            f"--slave-parallel-mode={self.slave_parallel_mode}",
            f"--relay-log={self.binlog_dir / 'relay'}",
        ]

    def _prepare(self) -> None:
        """Initialise the datadir once; an existing one (e.g. the demo's) is reused as is."""
        self.binlog_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        if (self.datadir / "mysql").is_dir():
            return
        if self.datadir.exists() and any(self.datadir.iterdir()):
            raise DevServiceError(
                f"{self.datadir} exists but is not an initialised MariaDB data directory (no "
                f"mysql/ schema inside). Delete it (rm -rf {self.datadir}) and start again."
            )
        install_db = _find_binary(
            self.install_db, "mariadb-install-db", ["/usr/bin/mariadb-install-db"]
        )
        staging = self.base_dir / "data.initialising"
        shutil.rmtree(staging, ignore_errors=True)
        argv = [
            install_db,
            "--no-defaults",
            f"--datadir={staging}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--skip-name-resolve",
            # A private tmpdir: concurrent installs in the shared /tmp collide on temp names.
            f"--tmpdir={self.tmp_dir}",
            *(["--user=root"] if os.geteuid() == 0 else []),
        ]
        try:
            done = subprocess.run(
                argv, cwd=self.base_dir, capture_output=True, text=True, timeout=180, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise DevServiceError(f"mariadb-install-db failed for {self.datadir}: {exc}") from exc
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
            raise DevServiceError(
                f"mariadb-install-db exited with {done.returncode} while initialising "
                f"{self.datadir}:\n{output}"
            )
        if self.datadir.exists():
            self.datadir.rmdir()  # empty (checked above)
        os.replace(staging, self.datadir)  # a half-initialised datadir is never left behind

    def _is_ready(self) -> bool:
        try:
            conn = self.root_connect(connect_timeout=2, read_timeout=5)
        except pymysql.MySQLError:
            return False
        conn.close()
        return True

    def _on_ready(self) -> None:
        """(Re)create the CDC account with exactly the replica-reader grants."""
        with self.root_connect() as conn, conn.cursor() as cur:
            # Keep account management out of the binlog: CDC tests see only their own writes.
            cur.execute("SET SESSION sql_log_bin = 0")
            account = (self.cdc_user,)
            cur.execute(
                "CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s", (*account, self.cdc_password)
            )
            cur.execute("ALTER USER %s@'%%' IDENTIFIED BY %s", (*account, self.cdc_password))
            cur.execute("REVOKE ALL PRIVILEGES, GRANT OPTION FROM %s@'%%'", account)
            cur.execute(f"GRANT {REPLICATION_GRANTS} ON *.* TO %s@'%%'", account)

    # ---- replication ---------------------------------------------------------------------

    def create_replication_account(self) -> tuple[str, str]:
        """(Re)create the account replicas of this server log in with; returns (user, password).

        Not binlogged, like the CDC account: replicas keep their own accounts.
        """
        with self.root_connect() as conn, conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            account = (REPLICATION_USER,)
            cur.execute("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s",
                        (*account, REPLICATION_PASSWORD))
            cur.execute("ALTER USER %s@'%%' IDENTIFIED BY %s", (*account, REPLICATION_PASSWORD))
            cur.execute("GRANT REPLICATION SLAVE ON *.* TO %s@'%%'", account)
        return REPLICATION_USER, REPLICATION_PASSWORD

    def replicate_from(self, primary: MariaDBServer, timeout: float = 60.0) -> None:
        """Replicate ``primary`` over GTIDs (``MASTER_USE_GTID=slave_pos``) and wait until both
        replication threads run. Idempotent: a running replica is re-pointed."""
        if not self.replica:
            raise DevServiceError(
                f"MariaDB server in {self.base_dir} was not started as a replica "
                f"(replica=True): it has no read-only / parallel-applier settings"
            )
        user, password = primary.create_replication_account()
        with self.root_connect() as conn, conn.cursor() as cur:
            cur.execute("STOP SLAVE")
            cur.execute(
                "CHANGE MASTER TO MASTER_HOST=%s, MASTER_PORT=%s, MASTER_USER=%s, "
                "MASTER_PASSWORD=%s, MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1",
                (primary.host, primary._require_port(), user, password),
            )
            cur.execute("START SLAVE")
        deadline = time.monotonic() + timeout
        while True:
            status = self.replica_status()
            if status.get("Slave_IO_Running") == "Yes" and status.get("Slave_SQL_Running") == "Yes":
                return
            self._raise_on_replication_error(status)
            if time.monotonic() > deadline:
                raise DevServiceError(
                    f"replica {self.base_dir} did not start replicating from "
                    f"{primary.host}:{primary.port} within {timeout:.0f} s: "
                    f"IO {status.get('Slave_IO_Running')}, SQL {status.get('Slave_SQL_Running')}"
                )
            time.sleep(0.1)

    def replica_status(self) -> dict[str, Any]:
        """``SHOW SLAVE STATUS`` as a dict ({} when this server replicates from nobody)."""
        dict_rows = pymysql.cursors.DictCursor
        with self.root_connect(cursorclass=dict_rows) as conn, conn.cursor() as cur:
            cur.execute("SHOW SLAVE STATUS")
            row = cur.fetchone()
        return dict(row) if row else {}

    def _raise_on_replication_error(self, status: dict[str, Any]) -> None:
        for thread in ("IO", "SQL"):
            error = status.get(f"Last_{thread}_Error")
            if error:
                raise DevServiceError(
                    f"replica {self.base_dir}: {thread} thread error "
                    f"{status.get(f'Last_{thread}_Errno')}: {error}"
                )

    def gtid_position(self, variable: str = "gtid_binlog_pos") -> str:
        """``@@GLOBAL.<variable>`` (gtid_binlog_pos, gtid_slave_pos, gtid_current_pos)."""
        if variable not in ("gtid_binlog_pos", "gtid_slave_pos", "gtid_current_pos"):
            raise ValueError(f"not a GTID position variable: {variable}")
        return str(self.query(f"SELECT @@GLOBAL.{variable}")[0][0] or "")

    def wait_caught_up(self, primary: MariaDBServer, timeout: float = 120.0,
                       logged: bool = True) -> str:
        """Wait until this replica applied, and logged, everything ``primary`` has binlogged.

        Compares the primary's ``gtid_binlog_pos`` with this replica's ``gtid_slave_pos``
        (applied) and ``gtid_binlog_pos`` (written to its own binlog: what a CDC reader of the
        replica sees, thanks to ``log_slave_updates``; ``logged=False`` for a replica without
        it). Returns the primary's position.
        """
        target = primary.gtid_position()
        deadline = time.monotonic() + timeout
        while True:
            applied = self.gtid_position("gtid_slave_pos")
            written = self.gtid_position() if logged else target
            if gtid_position_covers(applied, target) and gtid_position_covers(written, target):
                return target
            status = self.replica_status()
            self._raise_on_replication_error(status)
            if not status:
                raise DevServiceError(f"{self.base_dir} is not replicating (no slave status)")
            if time.monotonic() > deadline:
                raise DevServiceError(
                    f"replica {self.base_dir} not caught up with {target!r} within "
                    f"{timeout:.0f} s: applied {applied!r}, logged {written!r}"
                )
            time.sleep(0.05)

    # ---- clients -------------------------------------------------------------------------

    def _require_port(self) -> int:
        if self.port is None or self._pid is None:
            raise DevServiceError(
                f"MariaDB server in {self.base_dir} is not running: call start() first"
            )
        return self.port

    def connection_settings(
        self, user: str | None = None, password: str | None = None
    ) -> dict[str, Any]:
        """Keyword arguments for ``pymysql.connect`` / mysql-replication (a fresh dict each call).

        Defaults to the CDC account; ``user="root"`` gets the empty root password.
        """
        user = self.cdc_user if user is None else user
        if password is None:
            password = self.cdc_password if user == self.cdc_user else ""
        return {"host": self.host, "port": self._require_port(), "user": user, "password": password}

    def root_connect(self, **kwargs: Any) -> pymysql.connections.Connection:
        """A root connection over TCP with autocommit on; ``kwargs`` override pymysql defaults."""
        params: dict[str, Any] = {
            **self.connection_settings(user="root"),
            "autocommit": True,
            "charset": "utf8mb4",
            "connect_timeout": 10,
        }
        params.update(kwargs)
        return pymysql.connect(**params)

    def query(self, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement as root and return all rows (handy for setup and assertions)."""
        with self.root_connect() as conn, conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def kill_connections(self, user: str) -> list[int]:
        """Kill every connection of ``user``, binlog dump threads included; returns their ids.

        Tests use it to simulate a dropped source connection or a replica restart.
        """
        with self.root_connect() as conn, conn.cursor() as cur:
            cur.execute("SHOW FULL PROCESSLIST")
            me = conn.thread_id()
            ids = [int(row[0]) for row in cur.fetchall() if row[1] == user and row[0] != me]
            killed = []
            for thread_id in ids:
                try:
                    cur.execute(f"KILL CONNECTION {thread_id}")
                except pymysql.MySQLError as exc:
                    if exc.args and exc.args[0] == _ER_NO_SUCH_THREAD:
                        continue  # it went away on its own
                    raise
                killed.append(thread_id)
            return killed
