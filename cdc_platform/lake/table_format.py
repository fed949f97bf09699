"""The warehouse's small table format: Parquet file sets plus exclusively created commit files.

Layout (docs/landing-zone.md)::

    <warehouse>/<server>/<db>/<table>/
      data/<version>-<kind>-<uuid>/part-*.parquet   # kind = base | delta, written by Spark
      _commits/<version:020d>.json                  # created exclusively; highest = current

Table metadata lives here, not in a metastore, so any number of Spark sessions may read and
write. Creating the commit file is the atomic commit: data written by a writer that crashes or
loses a race is never referenced and is garbage-collected later.

State = base + deltas, merge-on-read. Every delta holds at most one record per key (the one with
the highest ``__cdc_pos`` of its batch, tombstones included), and every delta is newer than the
base and than earlier deltas (batches are cut at the consumed mark). So reading folds the deltas
by highest position, drops base rows whose key appears in any delta, and drops tombstones; the
base itself never holds tombstones.
"""

from __future__ import annotations

import contextlib
import json
import logging
import posixpath
import re
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import reduce
from typing import Any

import pyarrow.fs as pafs
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc_platform.capture.landing import table_parts
from cdc_platform.capture.names import table_id
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.lake.columns import OP, POS, col, conform, key_join, table_struct
from cdc_platform.lake.paths import Location, create_exclusive, resolve
from cdc_platform.lake.spark import ensure_lake_conf

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
COMMIT_NAME = re.compile(r"^(\d{20})\.json$")
DATA_NAME = re.compile(r"^(\d+)-(base|delta)-[0-9a-f]+$")
# Up to this many delta rows, base rows are filtered with a broadcast of the delta keys (no
# shuffle of the base); above it Spark plans the join itself.
BROADCAST_MAX_DELTA_ROWS = 1_000_000


class ConcurrentCommitError(RuntimeError):
    """Another writer created this table version first; re-run to build on its version."""


@dataclass(frozen=True)
class DataFile:
    """One Spark-written file set of a version.

    ``columns`` is set when the set was written with other user columns than the commit's
    schema (before an ALTER TABLE); readers conform it to the commit's schema by name.
    """

    path: str  # relative to the table root: data/<version>-<kind>-<uuid>
    kind: str  # base | delta
    rows: int
    columns: tuple[ColumnSpec, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"path": self.path, "kind": self.kind, "rows": self.rows}
        if self.columns is not None:
            data["columns"] = [c.to_dict() for c in self.columns]
        return data

    @staticmethod
    def from_dict(data: dict[str, Any]) -> DataFile:
        columns = data.get("columns")
        return DataFile(
            path=data["path"],
            kind=data["kind"],
            rows=int(data["rows"]),
            columns=None if columns is None else tuple(ColumnSpec.from_dict(c) for c in columns),
        )


@dataclass(frozen=True)
class Commit:
    """One table version: its file sets, the changelog mark it covers, schema and stats."""

    version: int
    files: tuple[DataFile, ...]
    consumed_pos: int | None
    consumed_gtid: str | None
    schema: TableSchema
    stats: dict[str, Any] = field(default_factory=dict)
    committed_at: str = ""

    @property
    def rows(self) -> int:
        return int(self.stats.get("rows", 0))

    @property
    def base(self) -> DataFile | None:
        return next((f for f in self.files if f.kind == "base"), None)

    @property
    def deltas(self) -> tuple[DataFile, ...]:
        return tuple(f for f in self.files if f.kind == "delta")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "version": self.version,
            "files": [f.to_dict() for f in self.files],
            "consumed": {"pos": self.consumed_pos, "gtid": self.consumed_gtid},
            "schema": self.schema.to_dict(),
            "stats": self.stats,
            "committed_at": self.committed_at,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Commit:
        consumed = data.get("consumed") or {}
        return Commit(
            version=int(data["version"]),
            files=tuple(DataFile.from_dict(f) for f in data["files"]),
            consumed_pos=consumed.get("pos"),
            consumed_gtid=consumed.get("gtid"),
            schema=TableSchema.from_dict(data["schema"]),
            stats=dict(data.get("stats") or {}),
            committed_at=data.get("committed_at", ""),
        )


def fold_latest(df: DataFrame, keys: tuple[str, ...] | list[str]) -> DataFrame:
    """Keep, per key, the record with the highest ``__cdc_pos`` (replayed duplicates collapse)."""
    window = Window.partitionBy(*[col(k) for k in keys]).orderBy(col(POS).desc())
    return df.withColumn("__cdc_rank", F.row_number().over(window)).where(
        col("__cdc_rank") == 1
    ).drop("__cdc_rank")


class TargetTable:
    """One target table in the warehouse: versions, reads, exclusive commits, garbage."""

    def __init__(self, warehouse_url: str, server_name: str, database: str, table: str) -> None:
        self.warehouse_url = warehouse_url
        self.server_name = server_name
        self.database = database
        self.table = table
        self.root = resolve(warehouse_url).join(server_name, *table_parts(database, table))

    @property
    def table_id(self) -> str:
        return table_id(self.database, self.table)

    def __repr__(self) -> str:
        return f"TargetTable({self.root.spark_uri!r})"

    # -- versions ---------------------------------------------------------------------------

    def versions(self) -> list[int]:
        """Committed versions, ascending."""
        found = []
        for name in self.root.join("_commits").list_names():
            match = COMMIT_NAME.match(name)
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def load(self, version: int) -> Commit:
        """The commit of one version."""
        location = self.root.join("_commits", f"{version:020d}.json")
        data = location.read_bytes()
        if data is None:
            raise FileNotFoundError(f"{self.table_id} has no version {version} ({location.path})")
        return Commit.from_dict(json.loads(data))

    def current(self) -> Commit | None:
        """The newest committed version, or None if the table was never materialised."""
        versions = self.versions()
        return self.load(versions[-1]) if versions else None

    # -- reading ----------------------------------------------------------------------------

    def read_files(
        self,
        spark: SparkSession,
        commit: Commit,
        files: tuple[DataFile, ...] | list[DataFile],
        columns: list[str] | None = None,
    ) -> DataFrame:
        """Union of file sets, conformed by name to ``commit``'s schema (+ position, op).

        File sets written with the same columns are read by one scan (many small scans in a
        union cost far more than the data they read); ``columns`` narrows the user columns (e.g.
        to the key) so that Parquet reads less.
        """
        target = table_struct(commit.schema)
        if columns is not None:
            wanted = set(columns) | {POS, OP}
            target = StructType([f for f in target.fields if f.name in wanted])
        if not files:
            return spark.createDataFrame([], target)
        groups: dict[tuple[ColumnSpec, ...], list[str]] = {}
        for data_file in files:
            written = data_file.columns if data_file.columns is not None else commit.schema.columns
            groups.setdefault(tuple(written), []).append(self.root.join(data_file.path).spark_uri)
        frames = []
        for written, uris in groups.items():
            struct = table_struct(replace(commit.schema, columns=written))
            frames.append(conform(spark.read.schema(struct).parquet(*uris), target))
        return reduce(DataFrame.unionByName, frames)

    def state(
        self,
        spark: SparkSession,
        commit: Commit,
        files: tuple[DataFile, ...] | None = None,
    ) -> DataFrame:
        """The folded rows of a version (user columns + ``__cdc_pos`` + ``__cdc_op``).

        Base rows whose key occurs in a delta are superseded (deltas are always newer); deltas are
        folded by highest position; tombstones are dropped.
        """
        files = commit.files if files is None else files
        keys = list(commit.schema.primary_key)
        base = [f for f in files if f.kind == "base"]
        deltas = [f for f in files if f.kind == "delta"]
        if not deltas:
            return self.read_files(spark, commit, base)
        folded = fold_latest(self.read_files(spark, commit, deltas), keys)
        live = folded.where(col(OP) != "d")
        if not base:
            return live
        delta_keys = folded.select(*[col(k) for k in keys])
        if sum(f.rows for f in deltas) <= BROADCAST_MAX_DELTA_ROWS:
            delta_keys = F.broadcast(delta_keys)
        kept = key_join(self.read_files(spark, commit, base), delta_keys, keys, "left_anti")
        return kept.unionByName(live)

    def read(self, spark: SparkSession, version: int | None = None) -> DataFrame:
        """The table's rows at a version (default: current): user columns in schema order."""
        ensure_lake_conf(spark)
        commit = self.current() if version is None else self.load(version)
        if commit is None:
            raise LookupError(
                f"target table {self.table_id} has no committed version under "
                f"{self.root.spark_uri}; materialise it first"
            )
        return self.state(spark, commit).select(*[col(c) for c in commit.schema.column_names])

    # -- writing ----------------------------------------------------------------------------

    def new_data_path(self, version: int, kind: str) -> str:
        """A fresh relative directory for a file set of ``version`` (never reused)."""
        if kind not in ("base", "delta"):
            raise ValueError(f"data file kind must be base or delta, not {kind!r}")
        return f"data/{version}-{kind}-{uuid.uuid4().hex}"

    def data_location(self, path: str) -> Location:
        return self.root.join(path)

    def commit(
        self,
        version: int,
        files: list[DataFile] | tuple[DataFile, ...],
        consumed_pos: int | None,
        consumed_gtid: str | None,
        schema: TableSchema,
        stats: dict[str, Any] | None = None,
    ) -> Commit:
        """Atomically make ``version`` current; ConcurrentCommitError if it already exists.

        ``version`` must be the current version + 1 as seen when the data was prepared: that is
        what makes a racing writer (who prepared from the same version) lose.
        """
        if version < 1:
            raise ValueError(f"{self.table_id}: versions start at 1, got {version}")
        normalised = tuple(
            replace(f, columns=None) if f.columns == schema.columns else f for f in files
        )
        commit = Commit(
            version=version,
            files=normalised,
            consumed_pos=consumed_pos,
            consumed_gtid=consumed_gtid,
            schema=schema,
            stats=dict(stats or {}),
            committed_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        )
        location = self.root.join("_commits", f"{version:020d}.json")
        try:
            create_exclusive(location, json.dumps(commit.to_dict(), indent=1).encode())
        except FileExistsError:
            raise ConcurrentCommitError(
                f"version {version} of {self.table_id} was committed by another writer first "
                f"({location.path}); this writer's data is discarded: run the materialisation "
                "again, it continues from the new version"
            ) from None
        return commit

    def discard(self, paths: list[str]) -> None:
        """Delete file sets that will never be committed (a lost race, an empty batch)."""
        for path in paths:
            self.root.join(path).delete_dir()

    def collect_garbage(self, keep_versions: int = 3) -> list[str]:
        """Delete data directories no longer referenced by the newest ``keep_versions`` commits.

        Directories of versions inside that window are kept even when unreferenced (a writer may
        still be preparing them), so the previous versions stay readable.
        """
        versions = self.versions()
        if not versions:
            return []
        kept_versions = versions[-max(keep_versions, 2):]
        referenced = {f.path for v in kept_versions for f in self.load(v).files}
        horizon = kept_versions[0]
        deleted = []
        for name in self.root.join("data").list_names():
            match = DATA_NAME.match(name)
            if not match or int(match.group(1)) >= horizon:
                continue
            path = f"data/{name}"
            if path not in referenced:
                self.root.join(path).delete_dir()
                deleted.append(path)
        deleted += self._remove_stale_temporary_commits()
        if deleted:
            log.info("%s: removed %d unreferenced data directories", self.table_id, len(deleted))
        return deleted

    def _remove_stale_temporary_commits(self, max_age_seconds: float = 3600) -> list[str]:
        """Temporary commit files of writers that died before linking them (never current)."""
        commits = self.root.join("_commits")
        selector = pafs.FileSelector(commits.path, allow_not_found=True)
        now = datetime.now(UTC)
        removed = []
        for info in commits.fs.get_file_info(selector):
            name = posixpath.basename(info.path)
            if not (name.startswith(".") and ".tmp-" in name) or info.mtime is None:
                continue
            if (now - info.mtime.astimezone(UTC)).total_seconds() > max_age_seconds:
                with contextlib.suppress(FileNotFoundError):
                    commits.fs.delete_file(info.path)
                removed.append(f"_commits/{name}")
        return removed
