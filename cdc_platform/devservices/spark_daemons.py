"""Spark's standalone daemons (master, worker, history server), each one ``java`` process run by
``bin/spark-class`` as a :class:`ManagedService` of its own: its directory, ``state.json``, log
and orphan protection. ``devservices.spark_cluster`` composes them into a cluster; they are
apart because a daemon's launch (ports, properties file, readiness) is one concept and the
cluster's life and its placement of executors another.

The pinned pyspark wheel ships Spark's own launcher and jars (:func:`spark_home`), so the
daemons run exactly the driver's Spark version on the installed Java 17. Each binds to ``host``
only, on free ports picked here; ``spark.port.maxRetries`` is 0 so that a port taken in the
meantime fails the launch (and it is retried on fresh ports) instead of Spark quietly binding
the next port.
"""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from cdc_platform.devservices._process import DevServiceError, ManagedService, find_processes
from cdc_platform.devservices.ports import free_port, port_accepts

_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
_HISTORY_CLASS = "org.apache.spark.deploy.history.HistoryServer"


def spark_home() -> Path:
    """The pinned pyspark's package directory, a whole Spark (``bin/spark-class``, ``jars/``)
    of the driver's version. A ``SPARK_HOME`` from the environment is not used: it could hold
    another version, and a driver and executors of different versions fail in obscure ways."""
    try:
        import pyspark
    except ImportError as exc:
        raise DevServiceError(
            "pyspark is not importable in this interpreter: install the project "
            "(`.venv/bin/pip install -e '.[dev]'`) and run with .venv/bin/python") from exc
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file() or not (home / "jars").is_dir():
        raise DevServiceError(
            f"{home} lacks bin/spark-class or jars/: the pyspark installation is incomplete; "
            f"reinstall it (`.venv/bin/pip install --force-reinstall --no-deps pyspark==...`)")
    return home


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.load(answer)


def _executor_pids(work_dir: Path) -> list[int]:
    """Executor JVMs running in ``work_dir`` (a worker starts each in
    ``work/<app-id>/<executor-id>``), found in /proc: also those of a worker that died."""
    pids: list[int] = []
    for pid in find_processes("java", _EXECUTOR_CLASS):
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd").removesuffix(" (deleted)"))
        except OSError:
            continue
        if cwd.is_relative_to(work_dir):
            pids.append(pid)
    return pids




@dataclass(eq=False)
class SparkDaemon(ManagedService):
    """What the master and a worker share: ``spark-class <main class>`` with RPC port ``port``
    and a web UI port picked beside it, its settings in ``spark-daemon.conf`` (whose path in the
    argv also identifies the process), its output in ``<role>.out``."""

    executable_name = "java"  # spark-class execs the JVM in place: the recorded pid is java's
    main_class: ClassVar[str] = ""
    role: ClassVar[str] = ""

    base_dir: Path
    port: int | None = None
    host: str = "127.0.0.1"
    daemon_memory: str = "512m"
    start_timeout: float = 180.0
    #: Added to the daemon's environment (a worker's reaches its executors).
    extra_env: dict[str, str] = field(default_factory=dict)
    webui_port: int | None = field(default=None, init=False)
    _webui_for: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir).expanduser().resolve()
        self._auto_port = self.port is None

    @property
    def properties_file(self) -> Path:
        """The daemon's Spark settings (``--properties-file``)."""
        return self.base_dir / "spark-daemon.conf"

    @property
    def log_file(self) -> Path:
        """The daemon's log (Spark's log4j writes to stderr, which goes here)."""
        return self._out_log

    @property
    def _out_log(self) -> Path:
        return self.base_dir / f"{self.role}.out"

    @property
    def local_dir(self) -> Path:
        """Spark's scratch space (``SPARK_LOCAL_DIRS``), kept out of the machine's /tmp."""
        return self.base_dir / "local"

    @property
    def webui_url(self) -> str:
        """``http://host:<web UI port>``; its ``/json/`` is the daemon's status."""
        if self.webui_port is None or self._pid is None:
            raise DevServiceError(f"{self.display_name} is not running: call start() first")
        return f"http://{self.host}:{self.webui_port}"

    # ---- hooks ---------------------------------------------------------------------------

    def _marker(self, port: int) -> str:
        return str(self.properties_file)

    def _stray_pids(self) -> list[int]:
        return find_processes(self.executable_name, self._marker(0))

    def _pick_webui_port(self, port: int) -> None:
        """A free web UI port, kept while the RPC port stays (a new RPC port: a new one too)."""
        if self._webui_for == port and self.webui_port is not None:
            return
        candidate = free_port(self.host)
        while candidate == port:
            candidate = free_port(self.host)
        self.webui_port, self._webui_for = candidate, port

    def _daemon_argv(self, port: int) -> list[str]:
        self._pick_webui_port(port)
        return [
            str(spark_home() / "bin" / "spark-class"),
            self.main_class,
            "--host", self.host,
            "--port", str(port),
            "--webui-port", str(self.webui_port),
            "--properties-file", str(self.properties_file),
        ]

    def _settings(self) -> dict[str, str]:
        return {"spark.port.maxRetries": "0"}

    def _prepare(self) -> None:
        self.local_dir.mkdir(parents=True, exist_ok=True)
        self.properties_file.write_text(
            "".join(f"{key} {value}\n" for key, value in self._settings().items()))

    def _env(self) -> dict[str, str]:
        """Our environment without any ``SPARK_*`` of the user's (another SPARK_HOME, a
        spark-env.sh, SPARK_PUBLIC_DNS or SPARK_WORKER_* would change the daemons), then this
        daemon's: pyspark's Spark, a conf dir of its own, loopback, a small heap."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("SPARK_")}
        return {
            **env,
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(self.base_dir),
            "SPARK_LOCAL_IP": self.host,
            "SPARK_LOCAL_DIRS": str(self.local_dir),
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            **self.extra_env,
        }

    def _state_extra(self) -> dict[str, Any]:
        return {"webui_port": self.webui_port, "role": self.role}

    def _load_state_extra(self, state: dict[str, Any]) -> None:
        if isinstance(state.get("webui_port"), int):
            self.webui_port, self._webui_for = int(state["webui_port"]), self.port

    def _failure_hint(self) -> str:
        return ("Fix the cause shown in the log above. spark-class needs Java 17 on PATH (or "
                "JAVA_HOME) and the pyspark wheel's jars; its full log is "
                f"{self.log_file}.")


@dataclass(eq=False)
class SparkMaster(SparkDaemon):
    """A standalone master on ``host:port``; ready when its ``/json/`` status is ALIVE."""

    display_name = "Spark standalone master"
    main_class = _MASTER_CLASS
    role = "master"

    @property
    def master_url(self) -> str:
        """``spark://host:port``: what a driver's ``.master(...)`` and the workers take."""
        if self.port is None or self._pid is None:
            raise DevServiceError("Spark master is not running: call start() first")
        return f"spark://{self.host}:{self.port}"

    def json_status(self) -> dict[str, Any] | None:
        """The master's own status (``/json/``: workers and their state, applications), None
        while it does not answer."""
        if self.webui_port is None:
            return None
        try:
            answer = get_json(f"http://{self.host}:{self.webui_port}/json/")
        except (OSError, ValueError):
            return None
        return answer if isinstance(answer, dict) else None

    def _argv(self, port: int) -> list[str]:
        return self._daemon_argv(port)

    def _is_ready(self) -> bool:
        if self.webui_port is None or not port_accepts(self.host, self.webui_port):
            return False
        status = self.json_status()
        return status is not None and status.get("status") == "ALIVE"


@dataclass(eq=False)
class SparkWorker(SparkDaemon):
    """A standalone worker of ``cores`` cores and ``memory`` for executors, registered with the
    master at ``master_url``; ready when the master lists it ALIVE (it can get executors)."""

    display_name = "Spark standalone worker"
    main_class = _WORKER_CLASS
    role = "worker"

    master_url: str = ""
    master_webui_url: str = ""
    cores: int = 1
    memory: str = "1g"

    @property
    def work_dir(self) -> Path:
        """Where the worker runs its executors (``<app-id>/<executor-id>/`` each)."""
        return self.base_dir / "work"

    def executor_pids(self) -> list[int]:
        """The executor JVMs this worker started that are still alive (also after the worker
        itself died: they exit on their own a moment later)."""
        return _executor_pids(self.work_dir)

    def _argv(self, port: int) -> list[str]:
        if not self.master_url:
            raise DevServiceError("SparkWorker needs master_url (spark://host:port) to start")
        return [
            *self._daemon_argv(port),
            "--cores", str(self.cores),
            "--memory", self.memory,
            "--work-dir", str(self.work_dir),
            self.master_url,
        ]

    def _prepare(self) -> None:
        super()._prepare()
        self.work_dir.mkdir(parents=True, exist_ok=True)

    def _is_ready(self) -> bool:
        """Registered: the master lists a worker at this host and RPC port as ALIVE."""
        try:
            status = get_json(f"{self.master_webui_url}/json/")
        except (OSError, ValueError):
            return False
        return any(worker.get("host") == self.host and worker.get("port") == self.port
                   and worker.get("state") == "ALIVE" for worker in status.get("workers") or [])

    def _state_extra(self) -> dict[str, Any]:
        return {**super()._state_extra(), "master_url": self.master_url,
                "master_webui_url": self.master_webui_url, "cores": self.cores,
                "memory": self.memory}

    def _load_state_extra(self, state: dict[str, Any]) -> None:
        super()._load_state_extra(state)
        self.master_url = str(state.get("master_url") or self.master_url)
        self.master_webui_url = str(state.get("master_webui_url") or self.master_webui_url)
        self.cores = int(state.get("cores") or self.cores)
        self.memory = str(state.get("memory") or self.memory)


@dataclass(eq=False)
class SparkHistoryServer(SparkDaemon):
    """Spark's history server on the event logs in ``log_dir``: the status API of applications
    that have ended (``/api/v1/applications/<app>/allexecutors``: each executor's tasks and
    log URLs), read after the drivers (Dagster runs, each a process of its own) are gone.
    ``port`` is its web UI and API; ready when the API answers."""

    display_name = "Spark history server"
    main_class = _HISTORY_CLASS
    role = "history"

    log_dir: Path = Path()
    _ui_port: int = field(default=0, init=False, repr=False)

    @property
    def api_url(self) -> str:
        """``http://host:port/api/v1``."""
        if self.port is None or self._pid is None:
            raise DevServiceError("the Spark history server is not running: call start() first")
        return f"http://{self.host}:{self.port}/api/v1"

    def applications(self) -> list[dict[str, Any]]:
        """The applications it has read from the event logs (newest first)."""
        answer = get_json(f"{self.api_url}/applications", timeout=30)
        return answer if isinstance(answer, list) else []

    def _settings(self) -> dict[str, str]:
        return {**super()._settings(),
                "spark.history.fs.logDirectory": self.log_dir.resolve().as_uri(),
                "spark.history.fs.update.interval": "1s",
                "spark.history.ui.port": str(self._ui_port)}

    def _argv(self, port: int) -> list[str]:
        self._ui_port = port
        self._prepare()  # (the settings file names the port, picked just now)
        return [str(spark_home() / "bin" / "spark-class"), self.main_class,
                "--properties-file", str(self.properties_file)]

    def _is_ready(self) -> bool:
        if self.port is None or not port_accepts(self.host, self.port):
            return False
        try:
            self.applications()
        except (OSError, ValueError):
            return False
        return True
