"""Reading one table's changelog from the landing zone (docs/landing-zone.md).

Only records with ``__cdc_pos < checkpoint.next_pos`` are committed; segment files are selected
by their names (``<first_pos>-<last_pos>.parquet``), so a batch touches only the segments it
needs. Segments written before and after an ``ALTER TABLE`` have different columns: each group of
files with the same Arrow schema is read with its own explicit Spark schema, its columns renamed
by the column renames recorded after it (``capture.ddl.column_renames``), and then conformed to the
newest segment's columns by name. Files are found and their footers read through the landing
zone's own definitions (``capture.landing.zone.LandingReader`` over ``capture.store.storage``); Spark reads
the segments by the URLs the same layer gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from cdc_platform.capture.landing.records import (
    CHANGELOG_META_FIELDS,
    HI_PREFIX,
    POS,
    RESERVED_PREFIX,
    THRESHOLD,
    ColumnRenames,
    column_mapping,
    renamed_schema,
    snapshot_arrow_fields,
    table_schema_of_segment,
)
from cdc_platform.capture.landing.zone import (
    Checkpoint,
    LandingReader,
    Survey,
    changelog_parts,
    column_renames_parts,
)
from cdc_platform.capture.names import table_id
from cdc_platform.capture.schema import TableSchema
from cdc_platform.config import S3Settings
from cdc_platform.lake.columns import (
    CHANGELOG_META,
    col,
    conform,
    refuse_reserved_columns,
    snapshot_struct,
    struct_from_arrow,
    user_struct,
)


@dataclass(frozen=True)
class Segment:
    """One changelog segment file and the position range its name declares."""

    first_pos: int
    last_pos: int
    uri: str  # as Spark reads it
    filesystem: pafs.FileSystem  # and pyarrow (its footer)
    path: str


@dataclass(frozen=True)
class SegmentGroup:
    """Segments of a batch written with one Arrow schema and followed by the same column
    renames: read together, then renamed and conformed to the newest schema."""

    schema: pa.Schema  # as written, without metadata
    renames_after: tuple[ColumnRenames, ...]
    segments: list[Segment]


@dataclass(frozen=True)
class BatchPlan:
    """What a batch reads (``TableChangelog.plan``)."""

    groups: list[SegmentGroup]
    newest: TableSchema  # the newest segment's schema, renamed by the renames after it
    snapshot_columns: bool  # some segment carries the snapshot-record columns
    rows: int = 0  # the segments' records (their footers), in the range or not
    # their row groups' uncompressed size (footers): what reading them costs Arrow in memory
    bytes: int = 0
    # each segment's footer, by path: ``arrow_batch`` reads the rows without parsing it again
    footers: Mapping[str, pq.FileMetaData] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class TableChangelog:
    """One table's changelog in the landing zone, opened once: what a materialisation reads
    of it (the checkpoint, the column renames, the segments and the batch) comes through this
    one reader, in that order (``lake.merge``)."""

    landing: LandingReader
    database: str
    table: str
    # What the landing zone held when a pass of the applier looked (``LandingReader.survey``):
    # the checkpoint and listings from it, not a read and two listings of this table's own.
    survey: Survey | None = None

    @classmethod
    def open(cls, landing_url: str, server_name: str, database: str, table: str, *,
             s3: S3Settings | None = None) -> TableChangelog:
        """``s3``: the config's ``s3`` options, for a landing zone at an S3 URL."""
        return cls(LandingReader.open(landing_url, server_name, s3=s3), database, table)

    @property
    def table_id(self) -> str:
        return table_id(self.database, self.table)

    def checkpoint(self) -> Checkpoint | None:
        """The engine's checkpoint, or None before its first one."""
        if self.survey is not None:
            return self.survey.checkpoint
        return self.landing.read_checkpoint()

    def _segment_names(self) -> list[tuple[int, int, str]]:
        if self.survey is not None:
            return self.survey.segment_names(self.database, self.table)
        return self.landing.segment_names(self.database, self.table)

    def recorded_schema(self) -> TableSchema | None:
        """The table's newest schema as the engine recorded it in ``tables.json`` (None if
        absent or unreadable): only a fallback for a table that has no changelog yet."""
        try:
            tables = self.landing.read_tables()
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        return tables.get(self.table_id)

    def segments(self, after_pos: int | None = None, before_pos: int | None = None
                 ) -> list[Segment]:
        """Segments that may hold records with ``after_pos < pos < before_pos``, oldest
        first. Temporary files and anything not named like a segment are ignored."""
        landing, database, table = self.landing, self.database, self.table
        directory = changelog_parts(database, table)
        segments = []
        for first, last, name in self._segment_names():
            if after_pos is not None and last <= after_pos:
                continue
            if before_pos is not None and first >= before_pos:
                continue
            filesystem, path = landing.store.arrow(*directory, name)
            segments.append(Segment(first, last, landing.store.uri_of(*directory, name),
                                    filesystem, path))
        return segments

    def column_renames(self, before_pos: int) -> list[ColumnRenames]:
        """The table's column renames a checkpoint with ``next_pos`` = ``before_pos`` covers,
        in changelog order (each record has a position of its own:
        ``capture.ddl.column_renames``)."""
        landing, database, table = self.landing, self.database, self.table
        directory = column_renames_parts(database, table)
        found = []
        names = self.survey.column_renames_names(database, table) if self.survey is not None \
            else landing.column_renames_names(database, table)
        for position, name in names:
            if position >= before_pos:
                continue
            try:
                found.append(ColumnRenames.from_json(landing.store.read_bytes(*directory, name)
                                                     or b""))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"column-rename record {landing.store.uri_of(*directory, name)} is not "
                    f"valid ({exc!r}); it is written by the capture engine: without it older "
                    f"segments of {table_id(database, table)} would lose the renamed columns' "
                    "values"
                ) from exc
        return sorted(found, key=lambda r: r.position)

    def plan(self, after_pos: int | None, before_pos: int,
             renames: Sequence[ColumnRenames] = ()) -> BatchPlan | None:
        """Which segments hold records with ``after_pos < __cdc_pos < before_pos``, grouped by
        their Arrow schema and the renames after them, and the newest segment's schema (renamed
        by the renames after it: a rename after the last segment names its columns too); None
        when no segment overlaps the range. Footers only: what ``batch`` (Spark) and
        ``arrow_batch`` (pyarrow) read is planned here, once."""
        database, table = self.database, self.table
        segments = self.segments(after_pos, before_pos)
        if not segments:
            return None
        groups: list[SegmentGroup] = []
        newest_metadata = None
        rows = size = 0
        footers = {}
        for segment in segments:
            footer = pq.read_metadata(segment.path, filesystem=segment.filesystem)
            footers[segment.path] = footer
            rows += footer.num_rows
            size += sum(footer.row_group(i).total_byte_size
                        for i in range(footer.num_row_groups))
            arrow_schema = footer.schema.to_arrow_schema()
            newest_metadata = arrow_schema.metadata
            plain = arrow_schema.remove_metadata()
            # (a segment is a run of one flush between two positions; a rename's own position
            # is never inside one: it lies wholly before or after)
            later = tuple(r for r in renames if r.position > segment.last_pos)
            for group in groups:
                if group.schema.equals(plain) and group.renames_after == later:
                    group.segments.append(segment)
                    break
            else:
                groups.append(SegmentGroup(plain, later, [segment]))
        newest = renamed_schema(_schema_from_metadata(newest_metadata, segments[-1]),
                                [r for r in renames if r.position > segments[-1].last_pos])
        if (newest.database, newest.table) != (database, table):
            raise ValueError(
                f"segment {segments[-1].uri} says it belongs to {newest.table_id}, "
                f"not {table_id(database, table)}; the landing zone's changelog directory is "
                "inconsistent"
            )
        refuse_reserved_columns(newest)
        return BatchPlan(groups, newest,
                         any(THRESHOLD in group.schema.names for group in groups), rows,
                         size, footers)

    def batch(
        self,
        spark: SparkSession,
        after_pos: int | None,
        before_pos: int,
        snapshot_columns: bool = False,
        renames: Sequence[ColumnRenames] = (),
    ) -> tuple[DataFrame | None, TableSchema | None]:
        """Records with ``after_pos < __cdc_pos < before_pos`` and the newest segment's schema.

        ``renames``: the table's column renames (``column_renames``); a segment's columns are
        renamed by those after it, and so is the newest schema (``plan``). The frame has the
        changelog metadata columns followed by the newest schema's user columns; rows from
        older segments lacking a column carry NULL there. With ``snapshot_columns``, if any
        segment of the batch carries the snapshot-record columns (only those may hold range
        assertions and sweeps), they follow (``columns.snapshot_struct``, typed after the
        newest key; NULL in segments without them). Returns (None, None) when no segment
        overlaps the range. Reading the footers is pyarrow work; the frame itself is lazy.
        """
        plan = self.plan(after_pos, before_pos, renames)
        if plan is None:
            return None, None
        return self.frame(spark, plan, after_pos, before_pos, snapshot_columns), plan.newest

    def frame(self, spark: SparkSession, plan: BatchPlan, after_pos: int | None,
              before_pos: int, snapshot_columns: bool = False) -> DataFrame:
        """``batch``'s frame for a plan already made (``plan``)."""
        newest = plan.newest
        target = StructType(CHANGELOG_META.fields + user_struct(newest.columns).fields)
        if snapshot_columns and plan.snapshot_columns:
            target = StructType(target.fields + snapshot_struct(newest).fields)
        frames = [
            conform(_renamed_columns(
                spark.read.schema(struct_from_arrow(group.schema)).parquet(
                    *[s.uri for s in group.segments]), group.renames_after), target)
            for group in plan.groups
        ]
        batch = reduce(DataFrame.unionByName, frames)
        condition = col(POS) < before_pos
        if after_pos is not None:
            condition = condition & (col(POS) > after_pos)
        return batch.where(condition)

    def arrow_batch(self, plan: BatchPlan, after_pos: int | None, before_pos: int,
                    columns: Sequence[str] | None = None) -> pa.Table:
        """``batch`` read with pyarrow, no Spark: the same records in the same columns (the
        changelog metadata, the newest schema's user columns, then the snapshot-record columns
        when the plan has them), each cast to its landing-zone Arrow type, exactly
        (``safe``: a value that would change is an error, never a silent change).
        ``columns``: only these of them (by their newest names), in that order; only they
        are read."""
        newest = plan.newest
        fields = [*CHANGELOG_META_FIELDS, *[pa.field(c.name, c.arrow_type())
                                            for c in newest.columns]]
        if plan.snapshot_columns:
            fields += snapshot_arrow_fields(newest)
        if columns is not None:
            by_name = {f.name: f for f in fields}
            fields = [by_name[c] for c in columns]
        target = pa.schema(fields)
        tables = []
        for group in plan.groups:
            mapping = renamed_column_names(group.schema.names, group.renames_after)
            wanted = None if columns is None else [
                c for c in group.schema.names if mapping.get(c, c) in target.names or c == POS]
            for segment in group.segments:
                # (ParquetFile, not read_table: its dataset machinery is most of a small
                # segment's read)
                with segment.filesystem.open_input_file(segment.path) as source:
                    data = pq.ParquetFile(source, metadata=plan.footers.get(
                        segment.path)).read(columns=wanted)
                positions = data.column(POS)
                keep = pc.less(positions, before_pos)
                if after_pos is not None:
                    keep = pc.and_(keep, pc.greater(positions, after_pos))
                data = data.filter(keep)
                if mapping:
                    data = data.rename_columns([mapping.get(c, c) for c in data.column_names])
                tables.append(_conform_arrow(data, target))
        return pa.concat_tables(tables) if tables else target.empty_table()


def read_checkpoint(landing_url: str, server_name: str, *, s3: S3Settings | None = None
                    ) -> Checkpoint | None:
    """The engine's checkpoint, or None before its first one (``LandingReader``: the one
    parser of ``checkpoint.json``)."""
    return LandingReader.open(landing_url, server_name, s3=s3).read_checkpoint()


def renamed_column_names(columns: Sequence[str], records: Sequence[ColumnRenames]
                         ) -> dict[str, str]:
    """A segment's user columns, and the range-assertion bound columns of renamed key
    columns, -> their names after ``records`` (only those that change)."""
    users = [c for c in columns if not c.startswith(RESERVED_PREFIX)]
    mapping = column_mapping(users, records)
    mapping.update({HI_PREFIX + old: HI_PREFIX + new for old, new in mapping.items()})
    return mapping


def _renamed_columns(df: DataFrame, records: Sequence[ColumnRenames]) -> DataFrame:
    """``df`` (one group of segments) with its columns under their names after ``records``."""
    mapping = renamed_column_names(df.columns, records)
    if not mapping:
        return df
    return df.select(*[col(c).alias(mapping.get(c, c)) for c in df.columns])


def _conform_arrow(data: pa.Table, target: pa.Schema) -> pa.Table:
    """``columns.conform`` in Arrow: ``target``'s columns by name, cast where types differ
    (dictionary-encoded metadata columns decode; widened columns widen), NULL where missing."""
    columns = []
    for field in target:
        if field.name in data.column_names:
            column = data.column(field.name)
            if column.type != field.type:
                column = column.cast(field.type, safe=True)
        else:
            column = pa.nulls(data.num_rows, field.type)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=pa.schema(
        [pa.field(f.name, f.type) for f in target]))


def _schema_from_metadata(metadata: dict[bytes, bytes] | None, segment: Segment) -> TableSchema:
    try:
        return table_schema_of_segment(metadata or {})
    except (KeyError, ValueError) as exc:
        raise ValueError(
            f"segment {segment.uri} lacks valid cdc.table / cdc.primary_key / "
            f"cdc.columns metadata ({exc!r}); only files written by the capture engine belong "
            "in the changelog directory"
        ) from exc
