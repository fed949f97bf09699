"""The landing zone's records, as the engine writes them and the lake reads them: the changelog's
column names, ops and Arrow types, a segment's schema and its ``cdc.*`` Parquet metadata, the
column-rename records (``ColumnRenames``) and the stale-target markers (``StaleMarker``).
What decides to write a rename or a marker is capture's (``capture.ddl``); the records, their
(de)serialisation and their meaning to a reader are here.

The contract between the capture engine and the lake in one module (docs/landing-zone.md,
"Segments" and "Snapshot records"). It sits in ``capture`` because the lake imports capture and
never the reverse, and apart from ``capture.landing.zone`` (the layout, the checkpoint and the
files) because every floor of capture speaks it (``changes`` spells the ops) while the zone
sits above them: it imports nothing of the project but ``capture.schema`` and
``capture.names``, so any module may import it (``capture.landing`` imports nothing itself).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

# (the module, not ``from cdc_platform.capture import names``: that import would load the
# ``capture`` package too, and the contract imports no more than it uses)
import cdc_platform.capture.names as names
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
        database, table = names.split_table_id(metadata[b"cdc.table"].decode())
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
    columns = set(schema.column_names)
    return [snapshot_field(schema, name) for name in (
        THRESHOLD, LO_OPEN, HI_OPEN, *[hi_column(k) for k in schema.primary_key if k in columns])]


# ---- column renames: renames/<db>/<table>/<position:020d>.json --------------------------------
# (docs/landing-zone.md, "Column renames"; written by ``capture.ddl.column_renames``)
#
# A rename changes no value, but the binlog carries it only as statement text: the segments
# before it hold the column under its old name, the ones after under the new name. So the
# engine records each ALTER's renames of a captured table, and the lake renames the older
# segments' columns and the Iceberg column. The renames of one ALTER are **simultaneous**: every
# old name refers to the table before the statement (``RENAME COLUMN a TO b, RENAME COLUMN b TO
# a`` swaps), as MariaDB and MySQL apply them. A record takes a changelog position of its own:
# records below it precede the rename, records above it follow it, and a checkpoint covers it
# when its ``next_pos`` is above it. Column names compare case-insensitively, as at the source.
# The same record names the columns the ALTER **drops**: the lake drops them from the target once
# no segment of the table holds records between the drop and its checkpoint.

Rename = tuple[str, str]  # (old column name, new column name) as the statement writes them


@dataclass(frozen=True)
class ColumnRenames:
    """The column renames one ALTER TABLE made to one captured table, in statement order."""

    database: str
    table: str
    gtid: str  # the DDL's GTID
    position: int  # the record's own changelog position (see the section's comment above)
    renames: tuple[Rename, ...]
    recorded_at: str = ""
    # Columns the ALTER drops (as written): the lake drops them from the target once it has
    # consumed the changelog past the record, whether or not a row change followed.
    dropped: tuple[str, ...] = ()

    @property
    def table_id(self) -> str:
        return names.table_id(self.database, self.table)

    def describe(self) -> str:
        changes = [f"{old} -> {new}" for old, new in self.renames]
        changes += [f"{column} dropped" for column in self.dropped]
        return (f"table {self.table_id}: column(s) renamed or dropped at GTID {self.gtid} "
                f"(changelog position {self.position}): {', '.join(changes)}")

    def to_json(self) -> bytes:
        data = dataclasses.asdict(self)
        data["renames"] = [list(pair) for pair in self.renames]
        data["dropped"] = list(self.dropped)
        if not self.dropped:
            del data["dropped"]  # (the files of renames alone read as before)
        return json.dumps(data, indent=1).encode()

    @staticmethod
    def from_json(text: bytes | str) -> ColumnRenames:
        data = json.loads(text)
        return ColumnRenames(
            database=str(data["database"]), table=str(data["table"]), gtid=str(data["gtid"]),
            position=int(data["position"]),
            renames=tuple((str(old), str(new)) for old, new in data["renames"]),
            recorded_at=str(data.get("recorded_at", "")),
            dropped=tuple(str(column) for column in data.get("dropped", ())))


def column_mapping(columns: Iterable[str], records: Sequence[ColumnRenames]) -> dict[str, str]:
    """Each of ``columns`` (names before ``records``) -> its name after them, in order.

    Only columns whose name changes are in the result. Raises ValueError when two columns
    would end under one name (the renames do not belong to these columns).
    """
    current = {c: c for c in columns}  # original -> name now
    for record in records:
        by_name = {now.lower(): original for original, now in current.items()}
        moves = {by_name[old.lower()]: new for old, new in record.renames
                 if old.lower() in by_name}
        current.update(moves)
        finals = [n.lower() for n in current.values()]
        if len(set(finals)) != len(finals):
            clash = sorted({n for n in current.values() if finals.count(n.lower()) > 1})
            raise ValueError(
                f"table {record.table_id}: the column renames at GTID {record.gtid} (changelog "
                f"position {record.position}) would give several columns the name(s) {clash}; "
                "the landing zone's column renames do not match its segments")
    return {original: now for original, now in current.items() if original != now}


def renamed_schema(schema: TableSchema, records: Sequence[ColumnRenames]) -> TableSchema:
    """``schema`` (as before ``records``) with its columns and key renamed by them."""
    mapping = column_mapping(schema.column_names, records)
    if not mapping:
        return schema
    columns = tuple(dataclasses.replace(c, name=mapping.get(c.name, c.name))
                    for c in schema.columns)
    key = tuple(mapping.get(k, k) for k in schema.primary_key)
    return dataclasses.replace(schema, columns=columns, primary_key=key)


# ---- stale-target markers: stale/<file_name> --------------------------------------------------
# (docs/landing-zone.md, "Stale-target markers"; written and resolved by
# ``capture.ddl.stale_markers``, read by the lake's and Dagster's checks and sensors)

#: Verbs of history markers (the engine's, not a statement's): the table's rows predate what
#: the changelog holds. INITIAL: found at the engine's first start; CAPTURED: became captured
#: with rows (a widened filter, or first seen by its row events); PURGED: changes lost to a
#: purged binlog (``capture.snapshot_mode: when_needed``).
HISTORY_VERBS = ("INITIAL", "CAPTURED", "PURGED")
# What the UI says of an open history marker: (the state of the target, the snapshot's name).
HISTORY_WORDS = {
    "INITIAL": ("history not loaded yet", "initial snapshot"),
    "CAPTURED": ("history not loaded yet", "initial snapshot"),
    "PURGED": ("changes lost to a purged binlog not loaded yet", "recovery snapshot"),
}


@dataclass(frozen=True)
class StaleMarker:
    """A target made stale by a DDL: written by the engine before its checkpoint passes the
    DDL, resolved by a whole-table snapshot that opened after it, forgotten once the target
    applied that snapshot."""

    database: str
    table: str
    gtid: str  # the DDL's GTID
    verb: str  # ALTER | CREATE | DROP | RENAME | TRUNCATE | DROP DATABASE | ... (the statement's)
    reason: str
    position: int  # the changelog position at the DDL: records before it precede it
    gone: bool = False  # no source table under this name any more: nothing to snapshot
    index: int = 0  # of the marker among its DDL's markers (part of the file name)
    recorded_at: str = ""
    resolved_by: str | None = None  # the snapshot session that made the target exact again
    resolved_pos: int | None = None  # the table's changelog holds that snapshot up to here
    # History markers (HISTORY_VERBS): the GTID set the engine was at or had to pass (the
    # source's executed set when it wrote the marker). The sensor waits for the checkpoint to
    # contain it; a snapshot whose opening set contains it resolves the marker.
    since: str | None = None
    # A rename brought the rows of a table that is not captured under this name: they are new
    # to capture (launched under capture.snapshot_mode as well as capture.resnapshot_on_ddl).
    newly_captured: bool = False
    # Not stored: the snapshot answering the marker, while one runs (``resolve_markers``).
    running: str = field(default="", compare=False)
    # Why the platform no longer launches the marker's snapshot by itself (the re-snapshot
    # sensor's verdict on the runs that answered it, ``note_given_up``), with what to do.
    given_up: str | None = field(default=None, compare=False)

    @property
    def table_id(self) -> str:
        return names.table_id(self.database, self.table)

    @property
    def resolved(self) -> bool:
        return self.resolved_by is not None

    @property
    def history(self) -> bool:
        """A history marker: the table's older rows are not in the changelog (no DDL)."""
        return self.verb in HISTORY_VERBS

    @property
    def file_name(self) -> str:
        """Sorts in DDL order: by changelog position, then (DDLs with no record between) by
        the GTID's sequence number. A history marker's name is its point, verb and table: the
        engine writes it once (a replay finds it there)."""
        if self.history:
            return f"{self.position:020d}-{0:020d}-{self.verb}-{history_suffix(self.table_id)}"
        sequence = re.search(r"(\d+)$", self.gtid)
        gtid = re.sub(r"[^0-9A-Za-z-]", "_", self.gtid)
        return (f"{self.position:020d}-{int(sequence.group(1)) if sequence else 0:020d}-"
                f"{gtid}-{self.index}.json")

    def headline(self) -> str:
        """One line for a run's tags and the sensor's log: what the snapshot is for."""
        if self.history:
            state, snapshot = HISTORY_WORDS[self.verb]
            return f"{snapshot} ({self.verb}): {state}"
        return f"{self.verb} at GTID {self.gtid}: {self.reason}"

    def describe(self) -> str:
        if self.history:
            state, snapshot = HISTORY_WORDS[self.verb]
            then = ("nothing to snapshot" if self.gone else
                    f"the {snapshot} loads it (capture.snapshot_mode)")
            return (f"table {self.table_id}: {state} ({self.verb}, changelog position "
                    f"{self.position}): {self.reason}; {then}")
        return (f"table {self.table_id}: target stale after {self.verb} at GTID {self.gtid} "
                f"(changelog position {self.position}): {self.reason}")

    def to_json(self) -> bytes:
        data = dataclasses.asdict(self)
        del data["running"]
        if self.given_up is None:
            del data["given_up"]
        return json.dumps(data, indent=1).encode()

    @staticmethod
    def from_json(text: bytes | str) -> StaleMarker:
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(StaleMarker)}
        return StaleMarker(**{k: v for k, v in data.items() if k in known})


def history_suffix(table_id: str) -> str:
    """How a table's history markers' file names end (a digest of its id)."""
    digest = hashlib.sha1(table_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{digest[:16]}.json"
