"""What a lake table's snapshot holds, as a writer without Spark needs it: its live data files
with the position delete files applying to each, and the key columns of their live rows.

Iceberg's files never change once written, and a merge every few seconds adds one or two to
a table's dozens: so what is read of them - a manifest's entries, a data file's key columns, a
delete file's positions - is kept in memory by file path and read again only when evicted
(``FileCache``: least recently used first, bounded in bytes). A merge then reads the files
the last one added, not the table's every file: at 60 data and 60 delete files of a small
table, reading them all was 0.3 s of each merge.

Planning is Iceberg's rule for an unpartitioned table with position deletes: a data file is
live when a live entry of the snapshot's manifests lists it; a position delete file applies
to a data file whose data sequence number is not above its own, and whose path lies within
its ``file_path`` bounds. Equality deletes and deletion vectors, which the lake's writers
never write, make ``plan_files`` refuse (``UnsupportedFiles``): the caller leaves such a table to
Spark.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, _read_deletes, schema_to_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestEntry, ManifestFile
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.types import IntegerType, LongType, StringType

# The columns ``key_rows`` adds to the ones asked for.
FILE = "__cdc_file"
ROW = "__cdc_row"
# Iceberg's reserved field id of a position delete file's ``file_path`` column.
DELETE_FILE_PATH_ID = 2147483546
# What the process keeps of files' contents (key columns, delete positions, manifest
# entries): a few hundred bytes per row of a table's keys, across every table it writes.
CACHE_BYTES = 256 << 20


class UnsupportedFiles(ValueError):
    """The snapshot has files this module does not read (equality deletes, deletion
    vectors, another format than Parquet): Spark's path merges the table."""


class FileCache:
    """Contents of immutable files by path, least recently used evicted past ``limit``
    bytes. Thread-safe; a value is computed outside the lock (two threads may both read a
    file the first time: the same contents)."""

    def __init__(self, limit: int = CACHE_BYTES) -> None:
        self.limit = limit
        self._items: OrderedDict[tuple[Any, ...], tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: tuple[Any, ...], read: Callable[[], Any], size: Callable[[Any], int]
            ) -> Any:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return found[0]
            self.misses += 1
        value = read()
        cost = size(value)
        with self._lock:
            if key not in self._items and cost <= self.limit:
                self._items[key] = (value, cost)
                self._bytes += cost
                while self._bytes > self.limit:
                    _, (_, evicted) = self._items.popitem(last=False)
                    self._bytes -= evicted
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


CACHE = FileCache()


@dataclass(frozen=True)
class LiveFile:
    """A live data file and the position delete files that apply to it."""

    data: DataFile
    deletes: tuple[DataFile, ...]


@dataclass(frozen=True)
class LiveFiles:
    """The data files of a snapshot a key filter may hit."""

    files: list[LiveFile]

    @property
    def rows(self) -> int:
        """Records in those data files (deleted ones included): what reading them costs."""
        return sum(f.data.record_count for f in self.files)


def manifests(table: Table, snapshot: Snapshot) -> tuple[ManifestFile, ...]:
    """The snapshot's manifests (its manifest list, read once)."""
    return CACHE.get(("manifest-list", snapshot.manifest_list),
                     lambda: tuple(snapshot.manifests(table.io)),
                     lambda found: 512 * (len(found) + 1))


def entries(table: Table, snapshot: Snapshot) -> list[ManifestEntry]:
    """The snapshot's live manifest entries (data and delete files)."""
    found: list[ManifestEntry] = []
    for manifest in manifests(table, snapshot):
        found.extend(entries_of(table, manifest))
    return found


def entries_of(table: Table, manifest: ManifestFile) -> list[ManifestEntry]:
    """A manifest's live entries (read once)."""
    return CACHE.get(("manifest", manifest.manifest_path),
                     lambda: manifest.fetch_manifest_entry(table.io, discard_deleted=True),
                     lambda found: 2048 * (len(found) + 1))


def plan_files(table: Table, snapshot: Snapshot,
         may_hold: Callable[[DataFile], bool] = lambda _: True) -> LiveFiles:
    """The snapshot's live data files for which ``may_hold`` (a pruning by column bounds) is
    true, each with the position delete files applying to it. UnsupportedFiles: files other
    than Parquet data and Parquet position deletes."""
    data: list[ManifestEntry] = []
    deletes: list[ManifestEntry] = []
    for entry in entries(table, snapshot):
        content = entry.data_file.content
        if entry.data_file.file_format != FileFormat.PARQUET or \
                content == DataFileContent.EQUALITY_DELETES:
            raise UnsupportedFiles(f"{entry.data_file.file_path}: {content.name} in "
                                   f"{entry.data_file.file_format.name}")
        (data if content == DataFileContent.DATA else deletes).append(entry)
    bounds = [(d, _path_bounds(d.data_file)) for d in deletes]
    files = []
    for entry in data:
        if not may_hold(entry.data_file):
            continue
        path = entry.data_file.file_path
        applying = tuple(
            d.data_file for d, (low, high) in bounds
            if (d.sequence_number or 0) >= (entry.sequence_number or 0)
            and (low is None or low <= path) and (high is None or path <= high))
        files.append(LiveFile(entry.data_file, applying))
    return LiveFiles(files)


def _path_bounds(delete_file: DataFile) -> tuple[str | None, str | None]:
    lower = (delete_file.lower_bounds or {}).get(DELETE_FILE_PATH_ID)
    upper = (delete_file.upper_bounds or {}).get(DELETE_FILE_PATH_ID)
    return (from_bytes(StringType(), lower) if lower is not None else None,
            from_bytes(StringType(), upper) if upper is not None else None)


def key_pruning(table: Table, column: str, keys: pa.ChunkedArray,
                max_values: int = 200) -> Callable[[DataFile], bool]:
    """A ``plan_files`` filter: whether a data file's bounds on ``column`` (a key's first column)
    may hold one of ``keys`` (up to ``max_values`` of them, each; beyond, their range).
    Integer and string columns only, without NULLs; otherwise every file may."""
    field = table.schema().find_field(column)
    if keys.null_count or not isinstance(field.field_type, IntegerType | LongType | StringType):
        return lambda _: True
    values = sorted(set(pc.unique(keys).to_pylist()))
    if not values:
        return lambda _: False
    field_id, field_type = field.field_id, field.field_type

    def may_hold(data_file: DataFile) -> bool:
        lower = (data_file.lower_bounds or {}).get(field_id)
        upper = (data_file.upper_bounds or {}).get(field_id)
        if lower is None or upper is None:
            return True
        low, high = from_bytes(field_type, lower), from_bytes(field_type, upper)
        if len(values) > max_values:
            return not (values[-1] < low or high < values[0])
        at = bisect_left(values, low)
        return at < len(values) and values[at] <= high

    return may_hold


def _projection(table: Table, columns: Sequence[str]) -> tuple[Any, tuple[tuple[int, str], ...]]:
    """The table's schema of ``columns`` and the key of a data file's rows of them in the
    cache (field ids and types: a rename reads the same cached columns)."""
    projected = table.schema().select(*columns)
    return projected, tuple((f.field_id, str(f.field_type)) for f in projected.fields)


def remember_rows(table: Table, data_file: DataFile, rows: pa.Table,
                  columns: Sequence[str]) -> None:
    """Keep ``columns`` of the rows a writer just wrote as ``data_file`` (in file order), as
    ``key_rows`` would read them back: the next merge matches its keys against them without
    reading the file."""
    projected, fields = _projection(table, columns)
    arrow_schema = schema_to_pyarrow(projected, include_field_ids=False)
    numbered = pa.table([rows.column(c).cast(arrow_schema.field(c).type) for c in columns],
                        schema=arrow_schema).append_column(
        ROW, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    CACHE.get(("keys", data_file.file_path, fields), lambda: numbered,
              lambda found: found.nbytes + 256)


def remember_deletes(delete_file: DataFile, deletes: dict[str, np.ndarray]) -> None:
    """Keep the positions a writer just wrote as ``delete_file``, by data file path."""
    CACHE.get(("deletes", delete_file.file_path), lambda: deletes,
              lambda found: sum(a.nbytes + len(p) for p, a in found.items()) + 256)


def remember_manifests(manifest_list: str, listed: Sequence[ManifestFile],
                       live: dict[str, list[ManifestEntry]]) -> None:
    """Keep a manifest list a writer just wrote, and the live entries of the manifests it
    wrote with it (by manifest path), as ``manifests`` and ``entries_of`` would read them."""
    CACHE.get(("manifest-list", manifest_list), lambda: tuple(listed),
              lambda found: 512 * (len(found) + 1))
    for path, found in live.items():
        CACHE.get(("manifest", path), lambda found=found: found,
                  lambda found: 2048 * (len(found) + 1))


def key_rows(table: Table, files: LiveFiles, columns: Sequence[str]) -> Iterator[pa.Table]:
    """Per data file of ``files``, its live rows' ``columns`` (by the table's current names:
    pyiceberg projects each file by field id, so renamed and promoted columns read as they
    are now), with ``__cdc_file`` (the data file) and ``__cdc_row`` (the row's number in it,
    which a position delete names). Rows a delete file already deletes are left out, so a
    row is never deleted twice (a snapshot's live row count is records less deletes)."""
    projected, fields = _projection(table, columns)
    scan = ArrowScan(table.metadata, table.io, projected, AlwaysTrue())
    for live in files.files:
        path = live.data.file_path
        rows = CACHE.get(("keys", path, fields), partial(_numbered, scan, live.data),
                         lambda found: found.nbytes + 256)
        rows = rows.rename_columns([*columns, ROW])
        gone = [found for delete_file in live.deletes
                if (found := _delete_positions(table, delete_file).get(path)) is not None]
        if gone:
            rows = rows.filter(pc.invert(pc.is_in(rows.column(ROW), value_set=pa.array(
                np.concatenate(gone)))))
        if rows.num_rows:
            yield rows.append_column(FILE, pa.repeat(pa.scalar(path), rows.num_rows))


def live_table(table: Table, files: LiveFiles) -> pa.Table:
    """Every live row of ``files`` in every column (the table's current schema), the rows
    their delete files delete left out: what a compaction rewrites. Deletes are read once
    (``_delete_positions``), data files not kept (a compaction reads each once)."""
    schema = table.schema()
    scan = ArrowScan(table.metadata, table.io, schema, AlwaysTrue())
    parts = []
    for live in files.files:
        rows = scan.to_table([FileScanTask(live.data)])
        gone = [found for delete_file in live.deletes
                if (found := _delete_positions(table, delete_file).get(live.data.file_path))
                is not None]
        if gone:
            keep = np.ones(rows.num_rows, dtype=bool)
            keep[np.concatenate(gone)] = False
            rows = rows.filter(pa.array(keep))
        parts.append(rows)
    if not parts:
        return schema_to_pyarrow(schema, include_field_ids=False).empty_table()
    return pa.concat_tables(parts, promote_options="permissive")


def _numbered(scan: ArrowScan, data_file: DataFile) -> pa.Table:
    # (no delete files and no filter: every row, in file order, so its index is its number)
    rows = scan.to_table([FileScanTask(data_file)])
    return rows.append_column(ROW, pa.array(np.arange(rows.num_rows, dtype=np.int64)))


def _delete_positions(table: Table, delete_file: DataFile) -> dict[str, np.ndarray]:
    """A position delete file's positions per data file path."""
    def read() -> dict[str, np.ndarray]:
        return {path: positions.to_numpy() for path, positions in
                _read_deletes(table.io, delete_file).items()}

    return CACHE.get(("deletes", delete_file.file_path), read,
                     lambda found: sum(a.nbytes + len(p) for p, a in found.items()) + 256)
