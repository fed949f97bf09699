"""A private Spark standalone cluster (one master, N workers) for tests that need real executors.

A ``local[N]`` session runs every task inside the driver's JVM, so what only a cluster does is
never exercised there: executors in JVMs of their own, Python workers started by those executors,
tasks spread over several workers, a worker lost in the middle of a job. The pinned pyspark
wheel ships Spark's own launcher (``bin/spark-class``) and jars, so this cluster runs exactly
the driver's Spark version on the installed Java 17, with nothing to download.

The master and each worker are a :class:`ManagedService` of their own (one ``java`` process,
its directory, its ``state.json``); :class:`SparkCluster` starts the master, then the workers,
and is ready when the master's JSON status (``http://host:<web UI>/json/``) lists every worker
ALIVE. All of them bind to ``host`` only, on free ports picked here; ``spark.port.maxRetries``
is 0 so that a port taken in the meantime fails the launch (and it is retried on fresh ports)
instead of Spark quietly binding the next port, which would leave ``master_url`` wrong.

On one machine every executor's ``hostPort`` is ``127.0.0.1:<its own port>``, which says nothing
about its worker. What does: the worker starts the executor with log URLs pointing at *its* web
UI (``http://127.0.0.1:<worker web UI port>/logPage/?appId=...&executorId=N``), and the driver
reports them (``executorLogs`` in ``/api/v1/applications/<app>/allexecutors``); the master's
``/json/`` gives each worker's web UI address and id. Checked against the workers' own ``/json/``
(``executors``: app id and executor id) and against the working directory of the Python
workers (``<worker>/work/<app-id>/<executor-id>``): all three agree.

Layout of ``base_dir``::

    state.json      master URL and the daemons' ports and directories, read by other processes
    master/         master.out (the log), spark-daemon.conf, state.json
    worker-N/       worker.out, spark-daemon.conf, state.json,
                    work/<app-id>/<executor-id>/   an executor's directory (its stdout, stderr)
                    local/                         shuffle and spill files

A driver needs :meth:`SparkCluster.driver_conf` in its session's conf and
:meth:`SparkCluster.driver_env` in its environment before its SparkContext starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

from cdc_platform.devservices._process import DevServiceError, pid_alive, terminate_pid
from cdc_platform.devservices.spark_daemons import (
    SparkDaemon,
    SparkHistoryServer,
    SparkMaster,
    SparkWorker,
    get_json,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "ExecutorPlacement",
    "SparkCluster",
    "SparkWorkerInfo",
]

#: An event log Spark is still writing (its application runs, or its driver died).
_IN_PROGRESS = ".inprogress"
#: Launches of one daemon when its web UI port was taken between picking and binding (Jetty's
#: "Failed to bind" is not the "already in use" the base class retries on by itself).
_START_ATTEMPTS = 3
_UNKNOWN_WORKER = "unknown"


@dataclass(frozen=True)
class SparkWorkerInfo:
    """A worker as the master sees it (its ``/json/``). ``state`` is ALIVE, DEAD (the master
    lost it: killed, stopped), DECOMMISSIONED or UNKNOWN."""

    id: str
    host: str
    port: int
    webui_url: str
    cores: int
    cores_used: int
    memory_mb: int
    state: str


@dataclass(frozen=True)
class ExecutorPlacement:
    """An executor of a running application (the driver's status API) and the worker it runs
    on: ``worker_id`` is the master's id, None if the master no longer lists that worker."""

    executor_id: str
    worker_id: str | None
    host_port: str
    active: bool
    total_tasks: int


# --------------------------------------------------------------------------------------------
# the daemons



@dataclass(eq=False)
class SparkCluster:
    """A private standalone cluster: a master and ``worker_count`` workers of ``worker_cores``
    cores and ``worker_memory`` each. ``base_dir`` None: a temporary directory, removed by
    ``stop()``. ``start()`` is idempotent and also starts again a worker that died.

    Not a :class:`ManagedService` itself (that is one process); it composes them, so each daemon
    keeps its own pid, state file, log and orphan protection.
    """

    base_dir: Path | None = None
    worker_count: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    host: str = "127.0.0.1"
    daemon_memory: str = "512m"
    start_timeout: float = 180.0
    #: Drivers write event logs (``driver_conf``) to ``event_log_dir``, from which
    #: :meth:`finished_tasks_per_worker` reads where the tasks of ended applications ran.
    event_log: bool = False
    #: Added to the workers' environment, and so to their executors' (what a real cluster's
    #: nodes have of their own, such as object-storage credentials).
    worker_env: dict[str, str] = field(default_factory=dict)
    display_name: ClassVar[str] = "Spark standalone cluster"
    master: SparkMaster = field(init=False)
    worker_daemons: list[SparkWorker] = field(init=False)
    history: SparkHistoryServer = field(init=False)
    _temp_dir: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.worker_count < 1:
            raise DevServiceError(f"SparkCluster needs at least one worker, not {self.worker_count}")
        if self.base_dir is None:
            # created by start(), so an unstarted cluster leaves nothing behind
            self.base_dir = Path(tempfile.gettempdir()) / f"cdc-spark-cluster-{uuid.uuid4().hex[:12]}"
            self._temp_dir = True
        self.base_dir = Path(self.base_dir).expanduser().resolve()
        self.master = SparkMaster(self.base_dir / "master", host=self.host,
                                  daemon_memory=self.daemon_memory,
                                  start_timeout=self.start_timeout)
        self.worker_daemons = [self._worker_daemon_at(index) for index in range(self.worker_count)]
        self.history = SparkHistoryServer(self.base_dir / "history", host=self.host,
                                          daemon_memory=self.daemon_memory,
                                          start_timeout=self.start_timeout,
                                          log_dir=self.event_log_dir)

    def _worker_daemon_at(self, index: int) -> SparkWorker:
        return SparkWorker(self.base_dir / f"worker-{index + 1}", host=self.host,
                           daemon_memory=self.daemon_memory, start_timeout=self.start_timeout,
                           cores=self.worker_cores, memory=self.worker_memory,
                           extra_env=self.worker_env)

    # ---- lifecycle -----------------------------------------------------------------------

    @property
    def event_log_dir(self) -> Path:
        """Where drivers write their event logs (with ``event_log``)."""
        return self.base_dir / "events"

    @property
    def services(self) -> list[SparkDaemon]:
        """Its daemons: the master, the workers and (once started) the history server."""
        return [self.master, *self.worker_daemons,
                *([self.history] if self.history.pid is not None else [])]

    @property
    def state_file(self) -> Path:
        """JSON record of the running cluster (master URL, daemons' ports and directories)."""
        return self.base_dir / "state.json"

    def is_running(self) -> bool:
        """True if the master and every worker this object started or attached to are alive."""
        return self.master.is_running() and all(w.is_running() for w in self.worker_daemons)

    def start(self, *, reuse: bool = False, detach: bool = False) -> Self:
        """Start the master, then the workers, and wait until the master lists all of them
        ALIVE (each step at most ``start_timeout`` s). Daemons already running are kept, so a
        second call is a no-op and a call after :meth:`kill_worker` starts that worker again.

        The workers start one after the other: on a small machine parallel JVM starts only slow
        each other down, and a start from another thread would lose the parent-death signal.
        ``reuse`` / ``detach``: as :meth:`ManagedService.start`, for every daemon.
        """
        if self.is_running():
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self.event_log:
            self.event_log_dir.mkdir(exist_ok=True)
        try:
            self._start_daemon(self.master, reuse=reuse, detach=detach)
            for worker in self.worker_daemons:
                self._start_daemon(worker, reuse=reuse, detach=detach)
            self._wait_for_workers(self.start_timeout)
        except BaseException:
            for daemon in [*reversed(self.worker_daemons), self.master]:
                if daemon.owned:
                    with contextlib.suppress(Exception):
                        daemon.stop(timeout=10)
            raise
        self._write_state()
        return self

    def attach(self) -> bool:
        """Attach to a cluster another process started in ``base_dir`` (its state files), if
        the master and every worker it recorded are alive; never launches anything."""
        if self.is_running():
            return True
        recorded = self._read_state()
        if recorded is not None and isinstance(recorded.get("workers"), list):
            self.worker_daemons = [self._worker_daemon_at(i)
                                   for i in range(len(recorded["workers"]))]
            self.worker_count = len(self.worker_daemons)
        return self.master.attach() and all(worker.attach() for worker in self.worker_daemons)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every worker (a worker takes its executors down with it), kill executors a
        worker left behind (one killed by :meth:`kill_worker`), then stop the master; a
        temporary base dir is removed. Safe to call twice; stops attached daemons too."""
        errors: list[Exception] = []
        if self.history.pid is not None:
            try:
                self.history.stop(timeout)
            except Exception as exc:
                errors.append(exc)
        for worker in reversed(self.worker_daemons):
            try:
                worker.stop(timeout)
            except Exception as exc:  # stop the others all the same
                errors.append(exc)
            errors.extend(self._kill_executors(worker, timeout))
        try:
            self.master.stop(timeout)
        except Exception as exc:
            errors.append(exc)
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()
        if self._temp_dir and not errors:
            shutil.rmtree(self.base_dir, ignore_errors=True)
        if errors:
            raise errors[0]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- what a driver needs -------------------------------------------------------------

    @property
    def master_url(self) -> str:
        """``spark://host:port`` for ``SparkSession.builder.master(...)``."""
        return self.master.master_url

    @property
    def master_webui_url(self) -> str:
        """The master's web UI, ``http://host:port`` (``/json/`` is its status as JSON)."""
        return self.master.webui_url

    def driver_conf(self, executor_memory: str = "512m", *,
                    dynamic_allocation: bool = False) -> dict[str, str]:
        """Session settings for a driver on this machine using the whole cluster: one executor
        of ``worker_cores`` cores per worker, ``executor_memory`` each (at most
        ``worker_memory``).

        The driver binds to ``host`` (executors must reach it; the machine's hostname may
        resolve elsewhere). The first job waits until every executor registered, up to
        ``start_timeout`` (Spark's default for standalone is not to wait, and a short job then
        runs all its tasks on the first executor). The UI stays on: :meth:`executors` reads the
        driver's status API.

        ``dynamic_allocation``: for drivers that share the cluster, long-running ones among
        them (an applier's session lives as long as its run): a driver asks for executors
        while it has tasks waiting and gives them back after a few idle seconds (shuffle
        tracking keeps one holding shuffle files another stage reads, for at most 30 s; no
        external shuffle service). Without it a standalone application keeps the cores it got
        until it ends, and a second driver waits for them. The first job does not wait for
        executors then (there are none until it asks).
        """
        shared = {
            "spark.dynamicAllocation.enabled": "true",
            "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            "spark.dynamicAllocation.shuffleTracking.timeout": "30s",
            "spark.dynamicAllocation.minExecutors": "0",
            "spark.dynamicAllocation.maxExecutors": str(len(self.worker_daemons)),
            "spark.dynamicAllocation.executorIdleTimeout": "5s",
            "spark.scheduler.minRegisteredResourcesRatio": "0",
        } if dynamic_allocation else {}
        return {
            "spark.master": self.master_url,
            "spark.driver.host": self.host,
            "spark.driver.bindAddress": self.host,
            "spark.executor.cores": str(self.worker_cores),
            "spark.executor.memory": executor_memory,
            "spark.cores.max": str(self.worker_cores * len(self.worker_daemons)),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": f"{int(self.start_timeout)}s",
            "spark.ui.enabled": "true",
            **({"spark.eventLog.enabled": "true",
                "spark.eventLog.dir": self.event_log_dir.as_uri()} if self.event_log else {}),
            **shared,
        }

    def driver_env(self) -> dict[str, str]:
        """Environment a driver process needs before its SparkContext starts: the executors
        start Python workers with the interpreter named by the *driver's* ``PYSPARK_PYTHON``
        (it travels with each Python function). ``spark.executorEnv.PYSPARK_PYTHON`` does not
        reach them: tried here, they ran the system ``python3``. This interpreter has the
        project's packages, and on one machine the executors can run it too."""
        return {"PYSPARK_PYTHON": sys.executable}

    # ---- inspection ----------------------------------------------------------------------

    def workers(self) -> list[SparkWorkerInfo]:
        """The workers the master knows, dead ones included (the master keeps a few)."""
        status = self.master.json_status()
        if status is None:
            raise DevServiceError(
                f"the Spark master's status is unreachable (web UI port "
                f"{self.master.webui_port}); is the cluster running? Its log: "
                f"{self.master.log_file}")
        return [
            SparkWorkerInfo(
                id=str(worker["id"]), host=str(worker["host"]), port=int(worker["port"]),
                webui_url=str(worker.get("webuiaddress", "")), cores=int(worker["cores"]),
                cores_used=int(worker.get("coresused", 0)),
                memory_mb=int(worker.get("memory", 0)), state=str(worker["state"]))
            for worker in status.get("workers") or []
        ]

    def executors(self, spark: SparkSession) -> list[ExecutorPlacement]:
        """The executors of ``spark``'s application, dead ones included, each with its
        worker: the worker whose web UI serves the executor's logs (see the module notes)."""
        context = spark.sparkContext
        driver_ui, app_id = context.uiWebUrl, context.applicationId
        if not driver_ui:
            raise DevServiceError(
                "the session runs without its UI (spark.ui.enabled false), so the driver's "
                "status API is off: build it with driver_conf(), which keeps the UI on")
        return self._placements(f"{driver_ui}/api/v1", app_id, "the driver's status API")

    def _placements(self, api_url: str, app_id: str, api: str) -> list[ExecutorPlacement]:
        """The executors of application ``app_id`` as the status API at ``api_url`` (a
        driver's or the history server's) lists them, placed on the workers."""
        url = f"{api_url}/applications/{urllib.parse.quote(app_id)}/allexecutors"
        try:
            summaries = get_json(url, timeout=30)
        except (OSError, ValueError) as exc:
            raise DevServiceError(f"{api} failed at {url}: {exc}") from exc
        worker_of_ui = {urllib.parse.urlsplit(w.webui_url).netloc: w.id for w in self.workers()}
        placements = []
        for summary in summaries:
            if summary.get("id") == "driver":
                continue
            logs_url = (summary.get("executorLogs") or {}).get("stdout", "")
            placements.append(ExecutorPlacement(
                executor_id=str(summary["id"]),
                worker_id=worker_of_ui.get(urllib.parse.urlsplit(logs_url).netloc),
                host_port=str(summary.get("hostPort", "")),
                active=bool(summary.get("isActive")),
                total_tasks=int(summary.get("totalTasks", 0))))
        return placements

    def tasks_per_worker(self, spark: SparkSession) -> dict[str, int]:
        """How many tasks of ``spark``'s application ran on each worker's executors, by the
        master's worker id: every worker the master lists (0 when none ran there), and
        ``"unknown"`` for executors of a worker the master no longer lists. The driver updates
        these counts asynchronously: a job's last tasks can appear a moment after it ends."""
        return self._tasks_by_worker(self.executors(spark))

    def _tasks_by_worker(self, executors: Iterable[ExecutorPlacement]) -> dict[str, int]:
        """The tasks of ``executors`` summed by worker: every worker the master lists, and
        ``"unknown"`` for a worker it no longer lists."""
        counts = {worker.id: 0 for worker in self.workers()}
        for executor in executors:
            key = executor.worker_id or _UNKNOWN_WORKER
            counts[key] = counts.get(key, 0) + executor.total_tasks
        return counts

    def logged_tasks_per_worker(self, timeout: float = 120.0) -> tuple[int, dict[str, int]]:
        """How many tasks the applications that kept event logs here (``event_log``), ended or
        still running, ran on each worker's executors, by the master's worker id (as
        :meth:`tasks_per_worker`); and how many applications that is. Read from Spark's status
        API as the history server serves it from the event logs: the drivers are other
        processes, some gone by now. Starts the history server (stopped with the cluster) and
        waits, at most ``timeout`` s, until it lists every application that has ended."""
        if not self.event_log:
            raise DevServiceError("the cluster keeps no event logs: build it with event_log=True")
        if not self.history.is_running():
            self.history.start()
        ended = {path.name for path in self.event_log_dir.iterdir()
                 if not path.name.endswith(_IN_PROGRESS)}
        deadline = time.monotonic() + timeout
        while True:
            apps = self.history.applications()
            listed_ended = [app for app in apps if all(
                attempt.get("completed") for attempt in app.get("attempts") or [{}])]
            if len(listed_ended) >= len(ended):
                break
            if time.monotonic() > deadline:
                raise DevServiceError(
                    f"the Spark history server lists {len(listed_ended)} of the {len(ended)} "
                    f"ended applications in {self.event_log_dir} after {timeout:.0f} s; its "
                    f"log: {self.history.log_file}")
            time.sleep(0.5)
        return len(apps), self._tasks_by_worker(
            executor for app in apps
            for executor in self._placements(self.history.api_url, str(app["id"]),
                                             "the history server's status API"))

    # ---- faults --------------------------------------------------------------------------

    def kill_worker(self, worker: int | str, *, executors: bool = False) -> None:
        """SIGKILL one worker's JVM, as a crash would (``worker``: index in
        ``worker_daemons`` or the master's worker id). Its executors notice the lost worker and
        exit on their own a moment later, the master marks it DEAD and the driver reschedules
        their tasks; ``executors=True`` kills them in the same instant (a lost machine)."""
        daemon = self._daemon_of(worker)
        pid = daemon.pid
        if pid is None or not daemon.is_running():
            raise DevServiceError(f"worker {worker!r} ({daemon.base_dir}) is not running")
        victims = daemon.executor_pids() if executors else []
        os.kill(pid, signal.SIGKILL)
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while daemon.is_running() and time.monotonic() < deadline:  # (reaps the zombie)
            time.sleep(0.05)

    def restart_worker(self, worker: int | str) -> SparkWorker:
        """Start a worker again, dead (:meth:`kill_worker`) or alive, on fresh ports (the
        master refuses a worker registering from the address of one it still lists ALIVE),
        and wait until the master lists every worker ALIVE. Returns its daemon."""
        daemon = self._daemon_of(worker)
        detach = self.master._detached
        daemon.stop()
        errors = self._kill_executors(daemon, 30)
        if errors:
            raise errors[0]
        daemon.port = None
        self._start_daemon(daemon, reuse=False, detach=detach)
        self._wait_for_workers(self.start_timeout)
        self._write_state()
        return daemon

    # ---- internals -----------------------------------------------------------------------

    def _daemon_of(self, worker: int | str) -> SparkWorker:
        if isinstance(worker, int):
            return self.worker_daemons[worker]
        for info in self.workers():
            if info.id == worker:
                for daemon in self.worker_daemons:
                    if daemon.port == info.port and daemon.host == info.host:
                        return daemon
        raise DevServiceError(
            f"no running worker of this cluster has id {worker!r}; workers(): "
            f"{[info.id for info in self.workers()]}")

    def _start_daemon(self, daemon: SparkDaemon, *, reuse: bool, detach: bool) -> None:
        if isinstance(daemon, SparkWorker):
            daemon.master_url = self.master.master_url
            daemon.master_webui_url = self.master.webui_url
        for attempt in range(_START_ATTEMPTS):
            try:
                daemon.start(reuse=reuse, detach=detach)
                return
            except DevServiceError as exc:
                if "Failed to bind" not in str(exc) or attempt == _START_ATTEMPTS - 1:
                    raise
                daemon.port = None  # fresh RPC and web UI ports

    def _wait_for_workers(self, timeout: float) -> None:
        """Until the master lists each of our workers (by RPC port) ALIVE."""
        deadline = time.monotonic() + timeout
        wanted = {(w.host, w.port) for w in self.worker_daemons}
        alive: set[tuple[str, int | None]] = set()
        while True:
            status = self.master.json_status() or {}
            alive = {(str(w.get("host")), w.get("port")) for w in status.get("workers") or []
                     if w.get("state") == "ALIVE"}
            if wanted <= alive:
                return
            if time.monotonic() > deadline:
                raise DevServiceError(
                    f"the Spark master lists {len(wanted & alive)} of {len(wanted)} workers "
                    f"ALIVE after {timeout:.0f} s ({self.master.webui_url}/json/). Logs: "
                    f"{self.master.log_file} and the workers' under {self.base_dir}; a slow "
                    f"machine may need a larger start_timeout.")
            time.sleep(0.25)

    def _kill_executors(self, worker: SparkWorker, timeout: float) -> list[Exception]:
        """SIGTERM (then SIGKILL) the executors still running in ``worker``'s work dir."""
        errors: list[Exception] = []
        for pid in worker.executor_pids():
            if not pid_alive(pid):
                continue
            try:
                terminate_pid(pid, min(timeout, 10.0))
            except DevServiceError as exc:
                errors.append(exc)
        return errors

    def _read_state(self) -> dict[str, Any] | None:
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    def _write_state(self) -> None:
        state = {
            "service": "spark-cluster",
            "master_url": self.master.master_url,
            "master_webui_url": self.master.webui_url,
            "master": {"pid": self.master.pid, "dir": str(self.master.base_dir)},
            "workers": [{"pid": w.pid, "dir": str(w.base_dir), "port": w.port,
                         "webui_port": w.webui_port} for w in self.worker_daemons],
            "owner_pid": os.getpid(),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        tmp = self.state_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state_file)
