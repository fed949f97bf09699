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

from dataclasses import dataclass


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
