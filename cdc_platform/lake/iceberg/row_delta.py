"""Row-level changes to a lake table without Spark: Iceberg's row delta, written by pyarrow.

What Spark's MERGE writes in merge-on-read mode is one snapshot that adds data files (the new
row versions) and position delete files (``file_path``, ``pos``: the rows they replace or
delete, by data file and row number), with the consumed mark in its summary. This module
writes the same thing for a batch the applier folded in Arrow (``lake.arrow_merge``, which
finds the rows a batch replaces with ``iceberg.live_files``):

- ``write_rows`` / ``write_position_deletes``: the files;
- ``commit``: one snapshot adding them (and, for a compaction, removing files), published
  only if main is still at the base snapshot.

pyiceberg 0.12 writes data files and commits appends and copy-on-write overwrites, but
writes neither position delete files nor delete manifests, and its transaction deep-copies
the whole table metadata at each step (at 250 snapshots a 10-row append took 0.25 s, 85 %
of it copying). So the snapshot is made here from pyiceberg's own parts (its manifest and
manifest-list writers, its summary collector, its data-file writer) and committed once
through the catalog: ``iceberg.hadoop``'s compare-and-swap on a local warehouse, or the REST
service's. A lost race is ``ConcurrentCommitError`` (the caller runs again from the new
snapshot); what this module wrote for a commit that did not land is an orphan, removed
later like any other (``maintenance.remove_orphans``).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterable, Mapping
from copy import copy
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.conversions import to_bytes
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.manifest import (
    UNASSIGNED_SEQ,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotSummaryCollector, Summary
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetSnapshotRefUpdate,
)
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, StringType

from cdc_platform.lake.iceberg.live_files import (
    DELETE_FILE_PATH_ID,
    FILE,
    ROW,
    entries_of,
    manifests,
    remember_deletes,
    remember_manifests,
)
from cdc_platform.lake.iceberg.manifests import (
    DataManifestWriter,
    DeleteManifestWriter,
    ManifestListWriter,
)

MAIN = "main"
# Iceberg's reserved field id of a position delete file's ``pos`` column (``file_path``'s:
# ``live_files``), which readers find them by.
DELETE_POS_ID = 2147483545
POSITION_DELETE_SCHEMA = pa.schema([
    pa.field("file_path", pa.string(), nullable=False,
             metadata={b"PARQUET:field_id": str(DELETE_FILE_PATH_ID).encode()}),
    pa.field("pos", pa.int64(), nullable=False,
             metadata={b"PARQUET:field_id": str(DELETE_POS_ID).encode()}),
])


def write_rows(table: Table, rows: pa.Table) -> list[DataFile]:
    """``rows`` (in the table's columns, by name) written as the table's data files."""
    if rows.num_rows == 0:
        return []
    written = list(_dataframe_to_data_files(table.metadata, rows, table.io))
    for data_file in written:  # (from_args drops it; readers of the entry need it)
        data_file.spec_id = table.metadata.default_spec_id
    return written


def write_position_deletes(table: Table, deletes: pa.Table) -> list[DataFile]:
    """One position delete file of ``deletes`` (``__cdc_file``, ``__cdc_row``), sorted by
    file and row as the spec asks, with the column bounds readers use to skip it for data
    files it does not name."""
    if deletes.num_rows == 0:
        return []
    data = pa.table([deletes.column(FILE).cast(pa.string()), deletes.column(ROW)],
                    schema=POSITION_DELETE_SCHEMA)
    data = data.sort_by([("file_path", "ascending"), ("pos", "ascending")])
    location = table.location_provider().new_data_location(
        f"{uuid.uuid4()}-deletes.parquet")
    output = table.io.new_output(location)
    with output.create(overwrite=True) as stream:
        pq.write_table(data, stream, compression="zstd")
    paths, positions = data.column("file_path"), data.column("pos")
    by_file = {}
    for path in pc.unique(paths).to_pylist():
        by_file[path] = positions.filter(pc.equal(paths, path)).to_numpy()
    lower = {DELETE_FILE_PATH_ID: to_bytes(StringType(), paths[0].as_py()),
             DELETE_POS_ID: to_bytes(LongType(), pc.min(positions).as_py())}
    upper = {DELETE_FILE_PATH_ID: to_bytes(StringType(), paths[-1].as_py()),
             DELETE_POS_ID: to_bytes(LongType(), pc.max(positions).as_py())}
    written = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=data.num_rows,
        file_size_in_bytes=len(output),
        value_counts={DELETE_FILE_PATH_ID: data.num_rows, DELETE_POS_ID: data.num_rows},
        null_value_counts={DELETE_FILE_PATH_ID: 0, DELETE_POS_ID: 0},
        lower_bounds=lower,
        upper_bounds=upper,
    )
    written.spec_id = table.metadata.default_spec_id  # (from_args drops it)
    remember_deletes(written, by_file)
    return [written]


@dataclass(frozen=True)
class Removed:
    """Files a commit removes (a compaction's): live entries of the base snapshot."""

    entries: list[ManifestEntry]


def commit(catalog: Catalog, table: Table, base: Snapshot | None, added: Iterable[DataFile],
           properties: Mapping[str, str], removed: Removed | None = None) -> Table:
    """One snapshot on main adding ``added`` (data and position delete files) and removing
    ``removed``, child of ``base`` (None: the table's first), with ``properties`` in its
    summary; committed only if main is still at ``base`` (else the catalog raises
    ``ConcurrentCommitError``). Returns the table as committed. With nothing added or
    removed the snapshot still commits: it carries the new consumed mark (or, the first,
    makes an empty table one every later commit has a base in)."""
    metadata = table.metadata
    io = table.io
    added = list(added)
    snapshot_id = metadata.new_snapshot_id()
    commit_uuid = uuid.uuid4()
    counter = itertools.count(0)
    spec = metadata.spec()
    schema = metadata.schema()
    compression = metadata.properties.get("write.avro.compression-codec", "gzip")
    provider = table.location_provider()

    def output() -> object:
        name = f"{commit_uuid}-m{next(counter)}.avro"
        return io.new_output(provider.new_metadata_location(name))

    def manifest(content: DataFileContent, removing: list[ManifestEntry]) -> list[ManifestFile]:
        files = [f for f in added if (f.content == DataFileContent.DATA) ==
                 (content == DataFileContent.DATA)]
        if not files and not removing:
            return []
        maker = DataManifestWriter if content == DataFileContent.DATA else DeleteManifestWriter
        writer = maker(spec=spec, schema=schema, output_file=output(), snapshot_id=snapshot_id,
                       avro_compression=compression)
        with writer:
            for data_file in files:
                writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED,
                                                   snapshot_id=snapshot_id,
                                                   data_file=data_file))
            for entry in removing:
                writer.delete(entry)
        return [writer.to_manifest_file()]

    removing = removed.entries if removed is not None else []
    removed_paths = {e.data_file.file_path for e in removing}
    if base is None:
        existing: list[ManifestFile] = []
    else:
        existing = list(manifests(table, base)) if removed is None else \
            _untouched_manifests(table, base, removed_paths)
    parent = base.snapshot_id if base is not None else None
    listed = [
        *manifest(DataFileContent.DATA,
                  [e for e in removing if e.data_file.content == DataFileContent.DATA]),
        *manifest(DataFileContent.POSITION_DELETES,
                  [e for e in removing if e.data_file.content != DataFileContent.DATA]),
        *existing,
    ]
    sequence_number = metadata.next_sequence_number()
    manifest_list = provider.new_metadata_location(
        f"snap-{snapshot_id}-0-{commit_uuid}.avro")
    with ManifestListWriter(output_file=io.new_output(manifest_list), snapshot_id=snapshot_id,
                            parent_snapshot_id=parent,
                            sequence_number=sequence_number,
                            compression=compression) as writer:
        writer.add_manifests(listed)
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent,
        sequence_number=sequence_number,
        timestamp_ms=int(time.time() * 1000),
        manifest_list=manifest_list,
        summary=_summary(added, [e.data_file for e in removing], base, properties),
        schema_id=metadata.current_schema_id,
    )
    response = catalog.commit_table(
        table,
        requirements=(AssertTableUUID(uuid=metadata.table_uuid),
                      AssertRefSnapshotId(ref=MAIN, snapshot_id=parent)),
        updates=(AddSnapshotUpdate(snapshot=snapshot),
                 SetSnapshotRefUpdate(ref_name=MAIN, type="branch", snapshot_id=snapshot_id)))
    _remember(manifest_list, listed, len(listed) - len(existing), added, snapshot_id,
              sequence_number)
    return Table(table.name(), response.metadata, response.metadata_location, io, catalog)


def _remember(manifest_list: str, listed: list[ManifestFile], new: int, added: list[DataFile],
              snapshot_id: int, sequence_number: int) -> None:
    """Keep the committed manifest list and its new manifests' live entries as a reader
    would find them (sequence numbers inherited: ``live_files``), for the next merge."""
    stored = []
    for position, manifest_file in enumerate(listed):
        if position < new:
            manifest_file = copy(manifest_file)
            manifest_file.sequence_number = sequence_number
            if manifest_file.min_sequence_number == UNASSIGNED_SEQ:
                manifest_file.min_sequence_number = sequence_number
        stored.append(manifest_file)
    live: dict[str, list[ManifestEntry]] = {}
    for manifest_file in stored[:new]:
        data = manifest_file.content == ManifestContent.DATA
        live[manifest_file.manifest_path] = [
            ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id,
                                    sequence_number=sequence_number,
                                    file_sequence_number=sequence_number, data_file=f)
            for f in added if (f.content == DataFileContent.DATA) == data]
    remember_manifests(manifest_list, stored, live)


def _untouched_manifests(table: Table, base: Snapshot, removed: set[str]
                         ) -> list[ManifestFile]:
    """The base's manifests that list none of the ``removed`` files (the others are
    replaced by the commit's own, which list those files as deleted)."""
    kept = []
    for manifest_file in manifests(table, base):
        listed = entries_of(table, manifest_file)
        if not any(e.data_file.file_path in removed for e in listed):
            kept.append(manifest_file)
        elif any(e.data_file.file_path not in removed for e in listed):
            raise ValueError(f"manifest {manifest_file.manifest_path} lists files both kept "
                             "and removed: a commit removes whole manifests' files only")
    return kept


# Summary totals: (total, added, removed) properties, as Iceberg keeps them.
_TOTALS = (
    ("total-data-files", "added-data-files", "deleted-data-files"),
    ("total-delete-files", "added-delete-files", "removed-delete-files"),
    ("total-records", "added-records", "deleted-records"),
    ("total-files-size", "added-files-size", "removed-files-size"),
    ("total-position-deletes", "added-position-deletes", "removed-position-deletes"),
    ("total-equality-deletes", "added-equality-deletes", "removed-equality-deletes"),
)


def _summary(added: list[DataFile], removed: list[DataFile], base: Snapshot | None,
             properties: Mapping[str, str]) -> Summary:
    """The snapshot's summary as Iceberg's Java writers make it: the operation (``append``
    when it only adds data files, ``delete`` when it only adds deletes, ``replace`` when it
    rewrites files, else ``overwrite``), what it added and removed, and the new totals."""
    collector = SnapshotSummaryCollector()
    for data_file in added:
        collector.add_file(data_file, schema=None)  # type: ignore[arg-type] - unpartitioned
    for data_file in removed:
        collector.remove_file(data_file, schema=None)  # type: ignore[arg-type]
    counts = collector.build()
    adds_data = any(f.content == DataFileContent.DATA for f in added)
    adds_deletes = any(f.content != DataFileContent.DATA for f in added)
    if removed:
        operation = Operation.REPLACE
    elif (adds_data or base is None) and not adds_deletes:
        operation = Operation.APPEND
    elif adds_deletes and not adds_data:
        operation = Operation.DELETE
    else:
        operation = Operation.OVERWRITE
    previous = (base.summary or {}) if base is not None else {t: "0" for t, _, _ in _TOTALS}
    for total, plus, minus in _TOTALS:
        before = previous.get(total)
        if before is None:
            continue
        counts[total] = str(int(before) + int(counts.get(plus, 0)) - int(counts.get(minus, 0)))
    return Summary(operation=operation, **counts, **dict(properties))

