"""The landing zone's records, as the engine writes them and the lake reads them: the changelog's
column names, ops and Arrow types, a segment's schema and its ``cdc.*`` Parquet metadata.

The contract between the capture engine and the lake in one module (docs/landing-zone.md,
"Segments" and "Snapshot records"). It sits in ``capture`` because the lake imports capture and
never the reverse, and apart from ``capture.landing.zone`` (the layout, the checkpoint and the
files) because every floor of capture speaks it (``changes`` spells the ops) while the zone
sits above them: it imports nothing of the project but ``capture.schema`` and
``capture.names``, so any module may import it (``capture.landing`` imports nothing itself).
"""

from __future__ import annotations

import json

import pyarrow as pa

from cdc_platform.capture.names import split_table_id
from cdc_platform.capture.schema import ColumnSpec, TableSchema

# Every column the changelog and the lake add starts with this; a source column may not (the
# lake refuses such tables: Spark matches column names ignoring case).
RESERVED_PREFIX = "__cdc_"

# ---- change metadata, first in every segment ---------------------------------------------------

POS = "__cdc_pos"  # int64, never NULL: the record's changelog position (strictly increasing)
GTID = "__cdc_gtid"  # the source transaction's GTID
OP = "__cdc_op"  # one of the ops below
TS_MS = "__cdc_ts_ms"  # int64: the source commit time, milliseconds since the epoch

CHANGELOG_META_FIELDS: tuple[pa.Field, ...] = (
    pa.field(POS, pa.int64(), nullable=False),
    pa.field(GTID, pa.string()),
    pa.field(OP, pa.string()),
    pa.field(TS_MS, pa.int64()),
)
# Written dictionary-encoded: a few values per segment (one GTID and commit time a transaction,
# three ops). Elsewhere a dictionary costs more than it saves: on the bench's segments
# dictionaries on every column took 0.34 s to write 14.9 MB, on these alone 0.21 s for 7.7 MB
# (zstd finds the repeats of low-cardinality user columns).
DICTIONARY_COLUMNS = (GTID, OP, TS_MS)



def segment_schema(schema: TableSchema) -> pa.Schema:
    """A segment's Arrow schema: the change metadata columns first, then the table's user
    columns (``TableSchema.arrow_schema``), with ``segment_metadata`` attached. Built once per
    schema (the stream asks for it per block of rows; the metadata is JSON)."""
    cached = schema.__dict__.get("_segment_schema")
    if cached is None:
        cached = pa.schema([*CHANGELOG_META_FIELDS, *schema.arrow_schema()],
                           metadata=segment_metadata(schema))
        object.__setattr__(schema, "_segment_schema", cached)  # (frozen: not a field)
    return cached


def segment_metadata(schema: TableSchema) -> dict[bytes, bytes]:
    """The ``cdc.*`` key-value metadata of a segment's Parquet footer: the table's names, key
    and columns, from which the lake reads the schema the segment was written with."""
    return {
        b"cdc.table": schema.table_id.encode(),
        b"cdc.database": schema.database.encode(),
        b"cdc.table_name": schema.table.encode(),
        b"cdc.primary_key": json.dumps(list(schema.primary_key)).encode(),
        b"cdc.columns": json.dumps([c.to_dict() for c in schema.columns]).encode(),
    }


def table_schema_of_segment(metadata: dict[bytes, bytes]) -> TableSchema:
    """The table schema a segment was written with, from its ``segment_metadata``."""
    if b"cdc.database" in metadata and b"cdc.table_name" in metadata:
        database = metadata[b"cdc.database"].decode()
        table = metadata[b"cdc.table_name"].decode()
    else:  # segments written before the names were stored apart
        database, table = split_table_id(metadata[b"cdc.table"].decode())
    return TableSchema(
        database=database,
        table=table,
        columns=tuple(ColumnSpec.from_dict(c) for c in json.loads(metadata[b"cdc.columns"])),
        primary_key=tuple(json.loads(metadata[b"cdc.primary_key"])),
    )


# ---- ops ---------------------------------------------------------------------------------------

CREATE, UPDATE, DELETE = "c", "u", "d"
# Snapshot records. ``r`` is a chunk row (a full row image, folded like an upsert); ``a`` (range
# assertion) and ``s`` (sweep) are instructions to the lake that never become rows.
SNAPSHOT_ROW, RANGE_ASSERTION, SWEEP = "r", "a", "s"
ROW_OPS = (CREATE, UPDATE, DELETE, SNAPSHOT_ROW)
INSTRUCTION_OPS = (RANGE_ASSERTION, SWEEP)

# ---- snapshot-record columns, after the user columns; NULL on every other record --------------

THRESHOLD = "__cdc_threshold"  # int64: keys whose latest record position is below it go
LO_OPEN = "__cdc_lo_open"  # bool: the range has no low bound (else: the key columns, exclusive)
HI_OPEN = "__cdc_hi_open"  # bool: the range has no high bound (else: __cdc_hi__<key>, inclusive)
HI_PREFIX = "__cdc_hi__"


def hi_column(key_column: str) -> str:
    """The column holding a range assertion's high bound for one key column."""
    return HI_PREFIX + key_column


def snapshot_field(schema: TableSchema, name: str) -> pa.Field:
    """The Arrow field of one snapshot-record column: a high bound has its key column's type."""
    if name.startswith(HI_PREFIX):
        return pa.field(name, schema.column(name[len(HI_PREFIX):]).arrow_type())
    if name == THRESHOLD:
        return pa.field(name, pa.int64())
    if name in (LO_OPEN, HI_OPEN):
        return pa.field(name, pa.bool_())
    raise ValueError(f"{name!r} is not a snapshot-record column of the changelog contract")


def snapshot_arrow_fields(schema: TableSchema) -> list[pa.Field]:
    """The Arrow fields a segment holding ``a``/``s`` records adds after the user columns."""
    names = set(schema.column_names)
    return [snapshot_field(schema, name) for name in (
        THRESHOLD, LO_OPEN, HI_OPEN, *[hi_column(k) for k in schema.primary_key if k in names])]
