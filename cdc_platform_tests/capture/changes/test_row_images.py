"""The transaction buffer's memory estimate of records (``row_images.records_memory``,
``block_memory``): what decides when a large transaction spills to files instead of filling
the engine's memory, so it must stay near what the records really take."""

import tracemalloc

import pyarrow as pa

from cdc_platform.capture.changes.row_images import (
    TableState,
    block_memory,
    column_block,
    records_memory,
    row_records,
)
from cdc_platform.capture.events import Rows
from cdc_platform.capture.schema import ColumnSpec, TableSchema

ITEMS = TableSchema("shop", "items", (ColumnSpec("id", "int"), ColumnSpec("name", "string"),
                                      ColumnSpec("qty", "int"), ColumnSpec("price", "double")),
                    ("id",))


def test_the_estimate_of_rows_decoded_one_by_one_is_near_what_python_holds() -> None:
    """4-column records as the decoder gives them (tuples) and ``row_records`` keeps them:
    the estimate, without the event's binlog bytes, is within a quarter of what tracemalloc
    sees allocated for them (the binlog bytes stand for the values' payload on top)."""
    state = TableState.of(ITEMS, ITEMS)
    count = 20_000
    tracemalloc.start()
    try:
        rows = [(1000 + i, f"item-{i:06d}", 500 + i, i * 1.5) for i in range(count)]
        event = Rows(1, "shop", "items", "insert", rows, size=0)
        records = row_records(state, event, "0-1-1")
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(records) == count
    estimate = records_memory(state, event, len(records))
    assert 0.75 <= held / estimate <= 1.25
    binlog_bytes = 40 * count
    assert records_memory(state, Rows(1, "shop", "items", "insert", rows, size=binlog_bytes),
                          count) == estimate + binlog_bytes


def test_a_column_block_is_counted_by_its_arrow_buffers() -> None:
    state = TableState.of(ITEMS, ITEMS)
    columns = [pa.array([1, 2, 3], pa.int64()), pa.array(["a", "b", "c"]),
               pa.array([1, 1, 1], pa.int32()), pa.array([0.5, 1.5, 2.5])]
    block = column_block(state, Rows(1, "shop", "items", "insert", _Columns(3, [columns]),
                                     columnar=True), "0-1-1")
    assert block is not None and block.num_rows == 3
    assert block_memory(block) >= block.nbytes > 0


class _Columns:
    """A rows event's column-wise form as the native decoder gives it (``RowColumns``)."""

    def __init__(self, count: int, images: list[list[pa.Array]]) -> None:
        self.count = count
        self.images = images
