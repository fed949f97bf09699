"""The C chunk reader (capture/snapshot/_rawrows.c) against arguments no caller should pass
(issue 26, decoder hardening), on a real server.

* A column index out of range, at any width (past the count, past 2**32, past 2**64, negative),
  is an IndexError naming the index and the result's column count: never an index wrapped to
  a valid column, never the "2 GiB, lower chunk_max_bytes" message (kept for a real overflow).
* Any argument refused, the result is read off the wire first: the connection runs the next
  query.
* Byte counts near 2**63 decide the budget exactly (they overflowed a long long before).
* The budget rule is the Python path's (``keyset._within_budget`` over the same raw rows), for
  any columns counted by length, budget and ``take_one`` (hypothesis).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_platform.capture.snapshot import native
from cdc_platform.capture.snapshot.reading import keyset

pytestmark = pytest.mark.skipif(not native._columnar_available(),  # noqa: SLF001
                                reason="_rawrows not built, or linked with another libmariadb")

# Three columns; values of several lengths, NULLs, an empty string.
SELECT = ("SELECT 'a' AS a, 'bc' AS b, NULL AS c UNION ALL SELECT 'defg', '', 'h' "
          "UNION ALL SELECT NULL, 'ijklmnop', 'qr' UNION ALL SELECT 's', 't', NULL "
          "UNION ALL SELECT 'uvwxyz', NULL, 'z'")
_COLUMNS = 3


@pytest.fixture
def conn(mariadb: Any) -> Iterator[Any]:
    """A connection of the test's own (a connection left out of sync fails only its test)."""
    connection = native.connect(mariadb.connection_settings())
    try:
        yield connection
    finally:
        connection.close()


@pytest.mark.parametrize("index", [3, 7, 2**31, 2**32, 2**32 + 1, 2**63, 2**64 + 2, -1, -2**64])
def test_an_index_out_of_range_is_named_with_the_column_count(conn: Any, index: int) -> None:
    with pytest.raises(IndexError) as raised:
        native.read_columns(conn, SELECT, (), [0, index], 0)
    message = str(raised.value)
    assert f"column index {index} " in message, message
    assert f"the result has {_COLUMNS} columns" in message, message
    assert "chunk_max_bytes" not in message  # (that advice is for a real overflow)
    # (the refused result was read to its end: the connection is ready for the next query)
    read = native.read_columns(conn, SELECT, (), [1], 0)
    assert len(read.rows) == 5 and read.size == 2 + 0 + 8 + 1


@pytest.mark.parametrize(("arguments", "error"), [
    (([0, "1"], 0, -1), TypeError),  # (an index that is not an integer)
    ((7, 0, -1), TypeError),  # (indexes that are not a sequence)
    (([0], 2**64, -1), OverflowError),  # (a count past long long)
    (([0], 0, -2**64), OverflowError),
])
def test_arguments_refused_leave_the_connection_ready(conn: Any, arguments: tuple[Any, ...],
                                                      error: type[Exception]) -> None:
    """Whatever argument is refused, the query's result is read to its end first (left
    unread, the connection's next query failed: "Commands out of sync")."""
    with pytest.raises(error):
        native.read_columns(conn, SELECT, (), *arguments)
    assert len(native.read_columns(conn, SELECT, (), [], 0).rows) == 5


def test_byte_counts_near_the_largest_long_long_decide_the_budget_exactly(conn: Any) -> None:
    """``fixed`` = ``max_bytes`` = 2**63 - 1: the first row fits exactly, the second passes
    the budget (its sum overflowed to a negative count before, and every row was read)."""
    largest = 2**63 - 1
    read = native.read_columns(conn, SELECT, (), [], largest, largest, take_one=False)
    assert (len(read.rows), read.cut, read.size) == (1, True, largest)
    # (a first row past any budget, taken by take_one; the size held at the largest count)
    read = native.read_columns(conn, SELECT, (), [0, 1], largest, largest, take_one=True)
    assert (len(read.rows), read.cut, read.size) == (1, True, largest)


def _python_path(rows: list[tuple[Any, ...]], variable: list[int], max_bytes: int,
                 take_one: bool, batch: int) -> tuple[list[tuple[Any, ...]], int, bool]:
    """What the rows path (``keyset._within_budget``) reads of ``rows``, fetched ``batch`` at
    a time, for a table whose ``variable`` columns are counted by length."""
    table = SimpleNamespace(variable_indexes=tuple(variable),
                            schema=SimpleNamespace(columns=[None] * _COLUMNS))
    batches = iter([rows[i:i + batch] for i in range(0, len(rows), batch)])
    return keyset._within_budget(lambda: next(batches, []), table,  # noqa: SLF001
                                 max_bytes, take_one)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(variable=st.lists(st.integers(0, _COLUMNS - 1), unique=True).map(sorted),
       max_bytes=st.integers(0, 70), take_one=st.booleans(), batch=st.integers(1, 6))
def test_the_budget_is_the_python_paths(conn: Any, variable: list[int], max_bytes: int,
                                        take_one: bool, batch: int) -> None:
    fixed = keyset._FIXED_VALUE_BYTES * (_COLUMNS - len(variable))  # noqa: SLF001
    read = native.read_columns(conn, SELECT, (), variable, fixed, max_bytes, take_one)
    rows, size, cut = _python_path(native.select_raw(conn, SELECT, ()).rows, variable,
                                   max_bytes, take_one, batch)
    assert (list(read.rows), read.size, read.cut) == (rows, size, cut)
