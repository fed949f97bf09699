"""What the living-lake benchmarks share: a config file for the platform's own commands, and a
third-party view of the lake (pyiceberg reading the Hadoop-catalog table's newest metadata, or
the REST catalog's on S3, as any Iceberg reader would; no Spark in the bench process)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.devservices.mariadb import MariaDBServer
from cdc_platform.lake.iceberg.catalog import namespace_name, table_name
from cdc_platform.lake.iceberg.snapshots import CONSUMED_GTID

SOURCE_PASSWORD_ENV = "CDC_BENCH_SOURCE_PASSWORD"


def write_config(path: Path, server: MariaDBServer, server_name: str, server_id: int,
                 include: str, work: Path, landing: dict[str, Any] | None = None,
                 lake: dict[str, Any] | None = None,
                 sections: dict[str, dict[str, Any]] | None = None) -> Path:
    """A config file for ``python -m cdc_platform``: the private server through the CDC
    account (password from the environment), the landing zone and a Hadoop-catalog warehouse
    under ``work``; every other setting at its default unless given (``sections``: settings
    merged into the config's sections, e.g. ``BenchS3.config_sections``)."""
    settings = server.connection_settings()
    config = {
        "source": {"flavour": "mariadb", "host": settings["host"], "port": settings["port"],
                   "user": settings["user"], "password_env": SOURCE_PASSWORD_ENV,
                   "server_id": server_id, "server_name": server_name},
        "capture": {"tables": {"include": [include]}},
        "landing_zone": {"url": str(work / "landing"), **(landing or {})},
        "warehouse": {"url": str(work / "warehouse")},
        "lake": dict(lake or {}),
    }
    for name, values in (sections or {}).items():
        config[name] = {**config.get(name, {}), **values}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def command_env(server: MariaDBServer) -> dict[str, str]:
    """The environment of the platform's commands: the source password, and Spark's Python
    workers on this interpreter (as ``make`` exports it)."""
    import sys

    return {SOURCE_PASSWORD_ENV: server.connection_settings()["password"],
            "PYSPARK_PYTHON": sys.executable}


def directory_size(root: Path) -> tuple[int, int]:
    """(bytes, files) under ``root``."""
    size = files = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                size += os.stat(os.path.join(folder, name)).st_size
                files += 1
            except OSError:
                pass
    return size, files


@dataclass(frozen=True)
class TargetSnapshot:
    """One snapshot of a target on its main branch, as a third-party reader sees it."""

    snapshot_id: int
    committed_at: float  # epoch seconds
    operation: str
    rows: int  # live rows: records less position deletes
    consumed_gtid: str
    summary: dict[str, str]


class IcebergTail:
    """A target table followed from outside, as a third-party reader would: each ``poll``
    opens the newest metadata file the Hadoop catalog's ``version-hint.text`` names (parsed
    only when it changed) and returns the main branch's snapshots not seen before, oldest
    first; ``added_rows`` reads the rows a snapshot added (its new data files only)."""

    def __init__(self, warehouse: Path, server_name: str, database: str, table: str) -> None:
        self.metadata_dir = (warehouse / namespace_name(server_name, database)
                             / table_name(table, unicode_names=True) / "metadata")
        self.table: Any = None
        self._version: int | None = None
        self._seen: set[int] = set()

    @property
    def metadata_file(self) -> Path | None:
        return (self.metadata_dir / f"v{self._version}.metadata.json"
                if self._version is not None else None)

    def _open_newest(self) -> bool:
        try:
            version = int((self.metadata_dir / "version-hint.text").read_text().strip())
        except (OSError, ValueError):
            return False
        if version == self._version:
            return False
        from pyiceberg.table import StaticTable

        try:
            self.table = StaticTable.from_metadata(
                str(self.metadata_dir / f"v{version}.metadata.json"))
        except (OSError, ValueError):  # (a metadata file the catalog already removed)
            return False
        self._version = version
        return True

    def poll(self) -> list[TargetSnapshot]:
        if not self._open_newest() or self.table.current_snapshot() is None:
            return []
        new = []
        snapshot = self.table.current_snapshot()
        while snapshot is not None and snapshot.snapshot_id not in self._seen:
            self._seen.add(snapshot.snapshot_id)
            new.append(self._describe(snapshot))
            parent = snapshot.parent_snapshot_id
            snapshot = self.table.snapshot_by_id(parent) if parent is not None else None
        return new[::-1]

    def current(self) -> TargetSnapshot | None:
        self._open_newest()
        if self.table is None or self.table.current_snapshot() is None:
            return None
        return self._describe(self.table.current_snapshot())

    @staticmethod
    def _describe(snapshot: Any) -> TargetSnapshot:
        summary = dict(snapshot.summary.additional_properties) if snapshot.summary else {}

        def count(key: str) -> int:
            return int(summary.get(key, 0) or 0)

        operation = snapshot.summary.operation.value if snapshot.summary else ""
        rows = (count("total-records") - count("total-position-deletes")
                - count("total-equality-deletes"))
        return TargetSnapshot(snapshot.snapshot_id, snapshot.timestamp_ms / 1000, operation,
                              rows, summary.get(CONSUMED_GTID, ""), summary)

    def added_files(self, snapshot: TargetSnapshot) -> Iterator[str]:
        """The data files the snapshot added (local paths)."""
        from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

        found = self.table.snapshot_by_id(snapshot.snapshot_id)
        io = self.table.io
        for manifest in found.manifests(io):
            if (manifest.added_snapshot_id != snapshot.snapshot_id
                    or manifest.content != ManifestContent.DATA):
                continue
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
                if entry.status == ManifestEntryStatus.ADDED:
                    path = entry.data_file.file_path
                    yield path.removeprefix("file:") if path.startswith("file:") else path

    def added_rows(self, snapshot: TargetSnapshot, columns: list[str]) -> pa.Table:
        """The rows of the data files the snapshot added (new rows and new versions of
        updated rows; a compaction's ``replace`` adds none)."""
        if snapshot.operation == "replace":
            return pa.table({c: [] for c in columns})
        parts = [pq.read_table(path, columns=columns) for path in self.added_files(snapshot)]
        return pa.concat_tables(parts) if parts else pa.table({c: [] for c in columns})

    def scan(self, columns: tuple[str, ...]) -> pa.Table:
        """The whole table as of its newest snapshot (position deletes applied by pyiceberg)."""
        self._open_newest()
        return self.table.scan(selected_fields=columns).to_arrow()


class RestIcebergTail(IcebergTail):
    """``IcebergTail`` through a REST catalog (the lake on S3): each ``poll`` loads the table
    and reads on only when its metadata location changed; data files are read through the
    table's own FileIO."""

    def __init__(self, catalog: Any, server_name: str, database: str, table: str) -> None:
        self.catalog = catalog
        self.identifier = (namespace_name(server_name, database),
                           table_name(table, unicode_names=True))
        self.table = None
        self._version = None
        self._seen = set()
        self._location: str | None = None

    @property
    def metadata_file(self) -> Path | None:
        return None  # (an object in the table bucket)

    def _open_newest(self) -> bool:
        try:
            table = self.catalog.load_table(self.identifier)
        except Exception:  # noqa: BLE001 - not created yet, or the catalog is busy: next poll
            return False
        if table.metadata_location == self._location:
            return False
        self.table, self._location = table, table.metadata_location
        return True

    def added_rows(self, snapshot: TargetSnapshot, columns: list[str]) -> pa.Table:
        if snapshot.operation == "replace":
            return pa.table({c: [] for c in columns})
        parts = []
        for path in self.added_files(snapshot):
            with self.table.io.new_input(path).open() as stream:
                parts.append(pq.read_table(stream, columns=columns))
        return pa.concat_tables(parts) if parts else pa.table({c: [] for c in columns})


class LandingTail:
    """A table's changelog segments as they land: each ``poll`` returns (landed at, rows) of
    segment files not seen before (a file retention removed before it was read is skipped;
    compaction's merged files repeat rows already seen: callers keep what they saw)."""

    def __init__(self, landing: LandingZone, database: str, table: str) -> None:
        self.landing, self.database, self.table = landing, database, table
        self.directory = landing.table_dir(database, table) if landing.is_local else None
        self._seen: set[str] = set()
        self.bytes_seen = 0
        self.files_seen = 0

    def poll(self, columns: list[str]) -> list[tuple[float, pa.Table]]:
        if self.directory is None:
            return self._poll_store(columns)
        try:
            names = sorted(n for n in os.listdir(self.directory)
                           if n.endswith(".parquet") and n not in self._seen)
        except FileNotFoundError:
            return []
        landed = []
        for name in names:
            path = self.directory / name
            try:
                stat = path.stat()
                rows = pq.read_table(path, columns=columns)
            except (OSError, pa.ArrowInvalid):
                continue
            self._seen.add(name)
            self.bytes_seen += stat.st_size
            self.files_seen += 1
            landed.append((stat.st_mtime, rows))
        return landed

    def _poll_store(self, columns: list[str]) -> list[tuple[float, pa.Table]]:
        """On object storage: a listing, and the time this poll first saw a segment as its
        landing time (an upper bound, by up to the poll interval: S3's upload times have
        whole seconds)."""
        seen_at = time.time()
        store = self.landing.store
        parts = ("changelog", self.database, self.table)
        landed = []
        for info in store.list_files(*parts):
            if not info.name.endswith(".parquet") or info.name in self._seen:
                continue
            fs, path = store.arrow(*parts, info.name)
            try:
                rows = pq.read_table(path, filesystem=fs, columns=columns)
            except (OSError, pa.ArrowInvalid):
                continue
            self._seen.add(info.name)
            self.bytes_seen += info.size
            self.files_seen += 1
            landed.append((seen_at, rows))
        return landed


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}

    def at(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return {"p50": at(0.5), "p95": at(0.95), "p99": at(0.99), "max": ordered[-1]}


def describe_percentiles(values: list[float]) -> str:
    found = percentiles(values)
    if not found:
        return "no samples"
    return ", ".join(f"{k} {v:.2f}s" for k, v in found.items())


def wait_until(what: str, check: Any, timeout: float, every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)
