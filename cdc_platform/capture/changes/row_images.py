"""Row images -> records: how a rows event of a captured table becomes the records the
transaction buffer holds (pure: no I/O, no engine state).

A ``TableState`` is built once per table map: the landed columns (after exclusions), their
value converters, the key. A rows event then arrives in one of two shapes, and each has one
path here:

* **rows** (``row_records``): one image per row, a tuple in table-map column order (the
  native decoder's, or mysql-replication's dicts turned into tuples by the binlog adapter),
  which becomes a landing tuple by ``TableState.landed``, and records ``(state, op, row)``;
* **columns** (``column_block``): the native decoder's column-wise form (Arrow arrays, or
  lists of Python values), which becomes one Arrow block of records with no Python object per
  value where the decoder built the arrays.

Records: an insert is ``c``, a delete a ``d`` tombstone (only the key kept), an update ``u``;
an update that changes its key is a delete of the old key then an insert of the new one,
since the lake folds records per key (``_update_records`` and ``_key_changed`` state that rule
for the two shapes, in the same order). A value without an exact landing form stops capture
(``EngineError`` naming the table and GTID), never lands wrong.

Each shape also says what its records cost in memory (``records_memory``, ``block_memory``):
the transaction buffer's budget, past which a transaction spills to files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.capture.changes.spill import records_schema
from cdc_platform.capture.events import EngineError, Rows
from cdc_platform.capture.landing.records import CREATE, DELETE, UPDATE
from cdc_platform.capture.schema import ColumnValueError, TableSchema
from cdc_platform.capture.values import Converter, converter_for

# The transaction buffer's memory estimate of records decoded row by row: the binlog bytes of
# their rows event (the values' payload) plus Python's cost of a record and of each value
# object (tracemalloc of 4-column records on this machine: 313 bytes each, estimated 311).
_MEMORY_PER_RECORD = 120
_MEMORY_PER_VALUE = 40


@dataclass
class TableState:
    """How rows of one binlog table id become landing tuples (built once per table map)."""

    schema: TableSchema  # after column exclusion
    names: tuple[str, ...]
    converters: list[tuple[int, Converter]]
    key_indexes: tuple[int, ...]
    # Rows decoded as tuples come in the table map's column order, all columns: the index of
    # each landed column there (None: the same columns, in order), and how many there are.
    picks: tuple[int, ...] | None = None
    width: int = 0
    # Rows decoded column-wise: the records' Arrow schema (op + landing columns), and the
    # converter of each landed column that the decoder gives as Python values (or None).
    arrow: pa.Schema | None = None
    converter_of: tuple[Converter | None, ...] = ()

    @staticmethod
    def of(full: TableSchema, schema: TableSchema) -> TableState:
        """The state of a table map whose columns are ``full`` and whose landed form (after
        the selector's exclusions and surrogate key) is ``schema``."""
        converters = []
        for index, column in enumerate(schema.columns):
            converter = converter_for(column, from_binlog=True)
            if converter is not None:
                converters.append((index, converter))
        key_indexes = tuple(schema.column_names.index(k) for k in schema.primary_key)
        picks = tuple(full.column_names.index(name) for name in schema.column_names)
        by_index = dict(converters)
        return TableState(
            schema, schema.column_names, converters, key_indexes,
            None if picks == tuple(range(len(full.columns))) else picks, len(full.columns),
            records_schema(schema), tuple(by_index.get(i) for i in range(len(schema.columns))))

    def landed(self, values: tuple[Any, ...], gtid: str) -> tuple[Any, ...]:
        """A row decoded as a tuple in table-map column order, as its landing tuple."""
        if self.picks is not None:
            values = tuple([values[i] for i in self.picks])
        if not self.converters:
            return values
        row = list(values)
        try:
            for index, convert in self.converters:
                row[index] = convert(row[index])
        except ColumnValueError as error:
            raise EngineError(
                f"table {self.schema.table_id} at GTID {gtid}: {error}. Capture stops here "
                "rather than land a wrong value") from error
        return tuple(row)

    def tombstone(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """A delete record keeps only the key."""
        out: list[Any] = [None] * len(row)
        for index in self.key_indexes:
            out[index] = row[index]
        return tuple(out)


Record = tuple[TableState, str, tuple[Any, ...]]


def row_records(state: TableState, event: Rows, gtid: str) -> list[Record]:
    """The records of a rows event decoded row by row (tuples in table-map column order, an
    update's as ``(before, after)`` pairs); ``gtid`` names the transaction in errors."""
    rows = event.rows
    if rows:
        first = rows[0][0] if event.op == "update" else rows[0]
        if len(first) != state.width:
            raise EngineError(
                f"table {state.schema.table_id}: binlog row has {len(first)} columns at "
                f"GTID {gtid}, its table map {state.width}; the binlog stream is "
                "inconsistent: restart the engine (it resumes from its checkpoint)")
    landed = state.landed
    if event.op == "insert":
        return [(state, CREATE, landed(row, gtid)) for row in rows]
    if event.op == "delete":
        return [(state, DELETE, state.tombstone(landed(row, gtid))) for row in rows]
    records: list[Record] = []
    for before, after in rows:
        _update_records(state, landed(before, gtid) if state.key_indexes else None,
                        landed(after, gtid), records)
    return records


def _update_records(state: TableState, before: tuple[Any, ...] | None,
                    after: tuple[Any, ...], records: list[Record]) -> None:
    """An update's records: ``u``, or for a key change a delete of the old key then an
    insert of the new one (``before`` None: a table without a key, nothing to compare)."""
    if before is not None and any(before[i] != after[i] for i in state.key_indexes):
        records.append((state, DELETE, state.tombstone(before)))
        records.append((state, CREATE, after))
    else:
        records.append((state, UPDATE, after))


def records_memory(state: TableState, event: Rows, count: int) -> int:
    """The bytes the transaction buffer counts for the ``count`` records ``row_records`` made
    of ``event``: what decides when a transaction spills (``RecordLog``)."""
    return event.size + count * (_MEMORY_PER_RECORD + _MEMORY_PER_VALUE * len(state.names))


def block_memory(block: pa.Table) -> int:
    """The bytes the transaction buffer counts for a ``column_block``: its Arrow buffers (the
    event's bytes are gone once decoded); their total size, not ``nbytes``, which costs as
    much as building the table."""
    return block.get_total_buffer_size()


def column_block(state: TableState, event: Rows, gtid: str) -> pa.Table | None:
    """The records of a rows event decoded column-wise (``Rows.columnar``) as one Arrow
    block, in the order ``row_records`` gives them; None for an event without rows."""
    columns = event.rows
    count = columns.count
    if not count:
        return None
    images = [_landing_image(state, image, count, gtid) for image in columns.images]
    after = images[-1]
    if event.op == "insert":
        return _block(state, CREATE, after, count)
    if event.op == "delete":
        return _block(state, DELETE, _tombstones(state, after, count), count)
    table = _block(state, UPDATE, after, count)
    if state.key_indexes:
        changed = _key_changed(images[0], after, state.key_indexes)
        if changed is not None:
            table = _with_key_changes(
                table, _block(state, DELETE, _tombstones(state, images[0], count), count),
                changed)
    return table


def _landing_image(state: TableState, image: list[Any], count: int,
                   gtid: str) -> list[pa.Array]:
    """One row image's landed columns as Arrow arrays of their landing types: the decoder's
    arrays as they are, Python values through the column's converter."""
    if len(image) != state.width:
        raise EngineError(
            f"table {state.schema.table_id}: binlog rows have {len(image)} columns at GTID "
            f"{gtid}, their table map {state.width}; the binlog stream is inconsistent: "
            "restart the engine (it resumes from its checkpoint)")
    arrays = []
    for index, column in enumerate(state.schema.columns):
        values = image[state.picks[index] if state.picks is not None else index]
        if isinstance(values, list):
            convert = state.converter_of[index]
            if convert is not None:
                try:
                    values = [convert(value) for value in values]
                except ColumnValueError as error:
                    raise EngineError(
                        f"table {state.schema.table_id} at GTID {gtid}: {error}. Capture "
                        "stops here rather than land a wrong value") from error
            try:
                values = pa.array(values, column.arrow_type())
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as error:
                raise EngineError(
                    f"table {state.schema.table_id} at GTID {gtid}: "
                    f"{ColumnValueError(column, error)}") from error
        arrays.append(values)
    return arrays


def _tombstones(state: TableState, image: list[pa.Array], count: int) -> list[pa.Array]:
    """Delete records keep only the key (``TableState.tombstone`` column-wise)."""
    keys = set(state.key_indexes)
    return [array if index in keys else pa.nulls(count, array.type)
            for index, array in enumerate(image)]


def _block(state: TableState, op: str, arrays: list[pa.Array], count: int) -> pa.Table:
    return pa.Table.from_arrays([pa.repeat(pa.scalar(op, pa.string()), count), *arrays],
                                schema=state.arrow)


def _key_changed(before: list[pa.Array], after: list[pa.Array],
                 key_indexes: tuple[int, ...]) -> pa.Array | None:
    """Which updates changed their key (None when none did): ``_update_records``'
    ``before[i] != after[i]`` over the key columns, column-wise (a NULL equals only a NULL).

    Most updates keep their key: equal key columns (``Array.equals``: same values and NULLs
    in the same rows, one call a column) answer None without the element-wise kernels."""
    if all(before[index].equals(after[index]) for index in key_indexes):
        return None
    changed = None
    for index in key_indexes:
        old, new = before[index], after[index]
        differs = pc.fill_null(pc.or_kleene(pc.not_equal(old, new),
                                            pc.xor(pc.is_null(old), pc.is_null(new))), False)
        changed = differs if changed is None else pc.or_(changed, differs)
    if changed is None or not pc.any(changed).as_py():
        return None
    return changed


def _with_key_changes(updates: pa.Table, tombstones: pa.Table, changed: pa.Array) -> pa.Table:
    """Updates whose key changed become a delete of the old key then an insert of the new
    one, in place (as ``_update_records`` orders them)."""
    count = updates.num_rows
    order: list[int] = []
    ops: list[str] = []
    for index, flag in enumerate(changed.to_pylist()):
        if flag:
            order.append(count + index)
            ops.append(DELETE)
        order.append(index)
        ops.append(CREATE if flag else UPDATE)
    table = pa.concat_tables([updates, tombstones]).take(pa.array(order, pa.int64()))
    return table.set_column(0, table.schema.field(0), pa.array(ops, pa.string()))
