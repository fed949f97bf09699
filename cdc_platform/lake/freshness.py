"""Whether a target keeps the promise of ``lake.freshness_seconds``, and if not, why.

A target is fresh when it reflects every source change committed more than ``freshness_seconds``
ago. Three things can break that, and the verdict names the first that does, because each has
a different fix:

1. the capture engine: not running, or running behind the source (the changelog itself lags);
2. the applier: not running, so landed changes wait;
3. the table's own backlog: landed changes older than the promise that the applier has not
   merged yet (the applier is slower than the changes arrive, or its merges fail).

Pure: the Dagster sensor gathers the facts (runs, the checkpoint, the segment footers, the
targets' consumed marks) and this decides, so the rule is one function with tests of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_platform.capture.landing.records import TS_MS
from cdc_platform.capture.landing.zone import LandingReader, changelog_parts


@dataclass(frozen=True)
class Facts:
    """What is known at ``now`` (seconds since the epoch) about one target."""

    now: float
    freshness_seconds: float
    engine_running: bool
    engine_lag_seconds: float | None  # the engine's own lag behind the source, when known
    applier_running: bool
    # Source commit time (seconds) of the oldest landed record the target has not merged;
    # None: the target has merged every landed record of its table.
    oldest_pending: float | None
    applier_problem: str = ""  # e.g. the last merge's error, or how the applier run ended


@dataclass(frozen=True)
class Verdict:
    passed: bool
    lag_seconds: float  # how far behind the source the target may be (0: known current)
    reason: str  # why it is not fresh ("" when it is)
    cause: str  # "" | "engine" | "applier" | "backlog"

    def description(self) -> str:
        if self.passed:
            return f"fresh: at most {self.lag_seconds:.1f} s behind the source"
        return self.reason


def judge(facts: Facts) -> Verdict:
    """The target's freshness verdict (see the module docstring for the order of causes)."""
    limit = facts.freshness_seconds
    backlog = max(0.0, facts.now - facts.oldest_pending) if facts.oldest_pending is not None \
        else 0.0
    engine_lag = facts.engine_lag_seconds or 0.0
    lag = max(backlog, engine_lag)
    if not facts.engine_running:
        return Verdict(False, lag, "the capture engine is not running (launch the "
                       "stream_changes job): nothing new reaches the landing zone", "engine")
    if engine_lag > limit:
        return Verdict(False, lag, f"the capture engine is {engine_lag:.0f} s behind the "
                       f"source (promise: {limit:g} s): the source, or the engine reading it, "
                       "is lagging", "engine")
    if not facts.applier_running:
        problem = f" ({facts.applier_problem})" if facts.applier_problem else ""
        return Verdict(False, lag, f"the applier (apply_changes) is not running{problem}: "
                       "landed changes are not merged; the lake sensor relaunches it", "applier")
    if backlog > limit:
        problem = f"; last error: {facts.applier_problem}" if facts.applier_problem else ""
        return Verdict(False, lag, f"landed changes wait {backlog:.0f} s to be merged "
                       f"(promise: {limit:g} s){problem}", "backlog")
    return Verdict(True, lag, "", "")


def unmerged_segments(names: Iterable[tuple[int, int, str]], consumed_pos: int | None,
                      next_pos: int) -> Iterator[tuple[int, int, str]]:
    """The segments (``(first, last, name)``, in the listing's order) that may hold records of
    a table past its target's consumed mark and before the checkpoint's ``next_pos``: the one
    rule of what a target has still to merge (the applier's ``pending``, this verdict's
    ``oldest_pending_seconds`` and the applier's target-lag metric read it)."""
    return ((first, last, name) for first, last, name in names
            if (consumed_pos is None or last > consumed_pos) and first < next_pos)


def oldest_pending_seconds(landing: LandingReader, database: str, table: str,
                           consumed_pos: int | None, next_pos: int,
                           names: list[tuple[int, int, str]] | None = None) -> float | None:
    """Source commit time (seconds) of the oldest landed record of the table past its target's
    consumed mark and before the checkpoint's ``next_pos``; None when there is none.

    Read from the first such segment's footer statistics (``__cdc_ts_ms``), so no data is
    read; a segment without statistics counts from its file's modification time. ``names``:
    the table's segments as a survey listed them (``LandingReader.survey``), else listed now.
    """
    if names is None:
        names = landing.segment_names(database, table)
    for _first, _last, name in unmerged_segments(names, consumed_pos, next_pos):
        filesystem, path = landing.store.arrow(*changelog_parts(database, table), name)
        try:
            metadata = pq.ParquetFile(filesystem.open_input_file(path)).metadata
        except (OSError, pa.ArrowInvalid):
            continue  # deleted by retention since the listing, or being written
        oldest = _min_statistic(metadata, TS_MS)
        if oldest is not None:
            return oldest / 1000
        info = filesystem.get_file_info(path)
        if info.mtime is not None:
            return info.mtime.timestamp()
    return None


def _min_statistic(metadata: pq.FileMetaData, column: str) -> int | None:
    names = metadata.schema.names
    if column not in names:
        return None
    index = names.index(column)
    lowest = None
    for group in range(metadata.num_row_groups):
        statistics = metadata.row_group(group).column(index).statistics
        if statistics is None or not statistics.has_min_max:
            return None
        lowest = statistics.min if lowest is None else min(lowest, statistics.min)
    return lowest
