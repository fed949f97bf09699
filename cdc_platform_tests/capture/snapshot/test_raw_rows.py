"""The column-wise chunk rows of the C reader (``native.RawRows``) behave as the list of row
tuples they replace, and ``native.repeated_key`` finds a repeated key exactly when the set of
row keys the tuple path builds does (pure logic: no server)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from cdc_platform.capture.snapshot import native

WIDTH = 3
_values = st.none() | st.binary(max_size=4)
_rows = st.lists(st.tuples(*[_values] * WIDTH), max_size=12)


def _block(rows: list[tuple[Any, ...]]) -> native.RawRows:
    columns = [pa.array([row[i] for row in rows], pa.binary()) for i in range(WIDTH)]
    return native.RawRows(WIDTH, [columns])


@given(parts=st.lists(st.tuples(st.booleans(), _rows), max_size=5),
       start=st.integers(-15, 15), stop=st.integers(-15, 15))
def test_raw_rows_are_the_row_list_they_replace(
        parts: list[tuple[bool, list[tuple[Any, ...]]]], start: int, stop: int) -> None:
    raw = native.RawRows(WIDTH)
    expected: list[tuple[Any, ...]] = []
    for as_block, rows in parts:
        raw += _block(rows) if as_block else rows  # (blocks read, or a few rows added)
        expected += rows
    assert len(raw) == len(expected) and bool(raw) == bool(expected)
    assert list(raw) == expected
    assert raw[start:stop] == expected[start:stop]
    for index in (0, -1, len(expected) - 1):
        if expected:
            assert raw[index] == expected[index]
    columns = raw.columns()
    assert [c.to_pylist() for c in columns] == \
        [[row[i] for row in expected] for i in range(WIDTH)]
    assert all(c.type == pa.binary() for c in columns)
    assert list(raw) == expected  # (still the same rows once joined)


@given(rows=st.lists(st.tuples(st.sampled_from([None, b"a", b"b", b"c"]),
                               st.sampled_from([None, b"1", b"2"])), max_size=10),
       key_indexes=st.sampled_from([(0,), (1,), (0, 1), (1, 0)]))
def test_a_repeated_key_is_found_as_the_set_of_keys_finds_it(
        rows: list[tuple[Any, ...]], key_indexes: tuple[int, ...]) -> None:
    columns = [pa.array([row[i] for row in rows], pa.binary()) for i in range(2)]
    keys = [tuple(row[i] for i in key_indexes) for row in rows]
    assert native.repeated_key(columns, key_indexes) == (len(set(keys)) != len(keys))


@given(numbers=st.lists(st.integers(-5, 5), max_size=10))
def test_a_rising_landed_key_skips_the_hashing_and_any_other_is_hashed(
        numbers: list[int]) -> None:
    """The fast path trusts only a strictly rising one-column key of numbers; anything else
    (a repeat, a fall, as a collation could order keys) is checked on the raw values."""
    raw = [pa.array([str(n).encode() for n in numbers], pa.binary())]
    landed = [pa.array(numbers, pa.int64())]
    assert native.repeated_key(raw, (0,), landed) == (len(set(numbers)) != len(numbers))
