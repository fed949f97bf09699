"""Rows decoded column-wise become exactly the records the row-wise path builds.

The engine takes a rows event in one of three forms (``events.Rows``): library dicts, tuples
from the native decoder, or columns (``rowcodec.RowColumns``: Arrow arrays in landing form
where the decoder builds them, Python values elsewhere). The column-wise path is a separate
implementation of the same rules (converters, excluded columns, delete tombstones, an update
that changes its key becoming a delete and an insert): here both paths take the same
generated events and must buffer the same records, in the same order, with the same types.
The decoder's side (bytes -> arrays) is tested against the library in test_rowcodec.py.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_platform.capture.changes.spill import records_table
from cdc_platform.capture.engine import CaptureEngine, EngineOptions
from cdc_platform.capture.events import Begin, Rows, TableMap
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.source import TableSelector

SCHEMA = TableSchema("db", "t", (
    ColumnSpec("id", "int"),
    ColumnSpec("code", "string"),
    ColumnSpec("amount", "decimal", 10, 2),
    ColumnSpec("secret", "string"),
    ColumnSpec("at", "timestamp", scale=6),
    ColumnSpec("ratio", "float"),
), ("id", "code"))
# Columns the decoder builds as arrays (the rest come as Python values, converted here).
NATIVE = {"id", "code", "amount", "secret", "at"}

_values = st.tuples(
    st.integers(0, 3),
    st.sampled_from(["a", "b", "A"]),
    st.one_of(st.none(), st.decimals(-99999999, 99999999, places=2, allow_nan=False,
                                     allow_infinity=False)),
    st.one_of(st.none(), st.text(max_size=3)),
    st.one_of(st.none(), st.datetimes(dt.datetime(1970, 1, 2), dt.datetime(2038, 1, 1))),
    st.one_of(st.none(), st.floats(-1e30, 1e30, allow_nan=False)),
)
_events = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.lists(_values, min_size=1, max_size=6)),
    st.tuples(st.just("delete"), st.lists(_values, min_size=1, max_size=6)),
    st.tuples(st.just("update"), st.lists(st.tuples(_values, _values), min_size=1, max_size=6)),
), min_size=1, max_size=5)


def _engine(tmp: str, excluded: tuple[str, ...]) -> CaptureEngine:
    options = EngineOptions("s", "mariadb", 1, {},
                            selector=TableSelector(excluded_columns=excluded))
    engine = CaptureEngine(options, LandingZone(tmp, "s"))
    engine._handle(Begin("0-1-1"))
    engine._handle(TableMap(7, SCHEMA))
    return engine


def _columns(images: list[list[tuple[Any, ...]]]) -> SimpleNamespace:
    """The images as the column-wise decoder gives them."""
    out = []
    for rows in images:
        image: list[Any] = []
        for index, column in enumerate(SCHEMA.columns):
            values = [row[index] for row in rows]
            if column.name in NATIVE:
                if column.kind == "decimal":
                    values = [None if v is None else Decimal(v) for v in values]
                image.append(pa.array(values, column.arrow_type()))
            else:
                image.append(values)
        out.append(image)
    return SimpleNamespace(count=len(images[0]), images=tuple(out))


def _buffered(engine: CaptureEngine) -> pa.Table:
    """The open transaction's records as one table (the op, then the landing columns)."""
    tables = []
    for part in engine._buffer._group.records:
        if isinstance(part, list):
            state = part[0][0]
            tables.append(records_table(state.schema, [r[1] for r in part],
                                        [r[2] for r in part]))
        else:
            tables.append(part.read())
    return pa.concat_tables(tables)


@settings(max_examples=150, deadline=None)
@given(events=_events, exclude=st.booleans())
def test_column_wise_rows_buffer_the_records_of_the_row_wise_path(tmp_path_factory, events,
                                                                   exclude):
    excluded = (r"db\.t\.secret",) if exclude else ()
    row_wise = _engine(str(tmp_path_factory.mktemp("rows")), excluded)
    column_wise = _engine(str(tmp_path_factory.mktemp("columns")), excluded)
    for op, rows in events:
        if op == "update":
            images = [[before for before, _ in rows], [after for _, after in rows]]
        else:
            images = [rows]
        row_wise._handle(Rows(7, "db", "t", op, rows, 100))
        column_wise._handle(Rows(7, "db", "t", op, _columns(images), 100, columnar=True))
    expected, got = _buffered(row_wise), _buffered(column_wise)
    assert got.schema.equals(expected.schema)
    assert got.to_pylist() == expected.to_pylist()
    assert got.equals(expected)


def test_an_update_changing_its_key_is_a_delete_then_an_insert_in_place(tmp_path):
    engine = _engine(str(tmp_path), ())
    at = dt.datetime(2025, 1, 1)
    same = ((1, "a", "1.00", "x", at, 0.5), (1, "a", "2.00", "y", at, 0.5))
    moved = ((2, "a", "1.00", "x", at, 0.5), (2, "b", "1.00", "x", at, 0.5))
    engine._handle(Rows(7, "db", "t", "update", _columns([[same[0], moved[0]],
                                                          [same[1], moved[1]]]), 100,
                        columnar=True))
    got = _buffered(engine).to_pylist()
    assert [(r["__cdc_op"], r["id"], r["code"], r["amount"]) for r in got] == [
        ("u", 1, "a", Decimal("2.00")), ("d", 2, "a", None), ("c", 2, "b", Decimal("1.00"))]
