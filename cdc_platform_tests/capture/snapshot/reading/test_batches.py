"""Which tables share a snapshot run (pure logic)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_platform.capture.snapshot.reading.batches import plan_runs


def test_small_tables_share_runs_smallest_first_and_a_large_one_runs_alone() -> None:
    estimates = {"big": 9_000, "a": 10, "b": 30, "c": 20, "huge": 50_000, "mid": 400}
    runs = plan_runs(["big", "a", "b", "c", "huge", "mid", "unknown"], estimates,
                     tables_per_run=3, rows_per_run=1_000)
    assert runs == [["unknown", "a", "c"], ["b", "mid"], ["big"], ["huge"]]


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        plan_runs(["a"], {}, tables_per_run=0, rows_per_run=1)


@given(st.dictionaries(st.text(min_size=1, max_size=4), st.integers(0, 10_000), max_size=40),
       st.integers(1, 8), st.integers(1, 20_000))
def test_every_table_in_one_run_within_the_bounds(estimates: dict[str, int], per_run: int,
                                                  rows: int) -> None:
    runs = plan_runs(list(estimates), estimates, tables_per_run=per_run, rows_per_run=rows)
    assert sorted(t for run in runs for t in run) == sorted(estimates)
    for run in runs:
        assert 1 <= len(run) <= per_run
        assert len(run) == 1 or sum(estimates[t] for t in run) <= rows
    sizes = [estimates[t] for run in runs for t in run]
    assert sizes == sorted(sizes)  # smallest first, across runs too
