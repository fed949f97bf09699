"""Which tables go together in one snapshot run (the platform's own runs: history loads and
DDL re-snapshots).

A run costs seconds to start (a process, the code location), where a small table's snapshot
takes a fraction of one: tables waiting together should share runs. But a run ends when its
last table is done, and its slot (``capture.max_parallel_snapshots``) stays taken until then,
so a large table must not share a run with many small ones. Tables are packed smallest first
(by the server's row estimates) into runs of at most ``tables_per_run`` tables and
``rows_per_run`` estimated rows; a table above ``rows_per_run`` gets a run of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def plan_runs(tables: Sequence[str], estimated_rows: Mapping[str, int], *,
              tables_per_run: int, rows_per_run: int) -> list[list[str]]:
    """``tables`` (ids) grouped into runs, smallest first; a table without an estimate counts
    as empty. Every table is in exactly one run; the runs come in the order to launch them."""
    if tables_per_run < 1 or rows_per_run < 1:
        raise ValueError("tables_per_run and rows_per_run must be at least 1")
    ordered = sorted(tables, key=lambda table: (max(0, estimated_rows.get(table, 0)), table))
    runs: list[list[str]] = []
    current: list[str] = []
    rows = 0
    for table in ordered:
        size = max(0, estimated_rows.get(table, 0))
        if current and (len(current) >= tables_per_run or rows + size > rows_per_run):
            runs.append(current)
            current, rows = [], 0
        current.append(table)
        rows += size
    if current:
        runs.append(current)
    return runs
