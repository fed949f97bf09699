"""The freshness verdict (``lake.freshness.judge``): which cause it names, and that it never
calls a target fresh that is behind by more than the promise."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cdc_platform.lake.freshness import Facts, judge

NOW = 1_000_000.0


def facts(**changes: object) -> Facts:
    values: dict[str, object] = dict(now=NOW, freshness_seconds=60.0, engine_running=True,
                                     engine_lag_seconds=0.0, applier_running=True,
                                     oldest_pending=None)
    values.update(changes)
    return Facts(**values)  # type: ignore[arg-type]


def test_a_target_with_nothing_pending_behind_a_current_engine_is_fresh() -> None:
    verdict = judge(facts())
    assert verdict.passed and verdict.lag_seconds == 0 and verdict.cause == ""
    assert verdict.description().startswith("fresh")


def test_each_cause_is_named_in_order_engine_then_applier_then_backlog() -> None:
    stopped = judge(facts(engine_running=False, applier_running=False,
                          oldest_pending=NOW - 500))
    assert (stopped.passed, stopped.cause) == (False, "engine")
    assert "stream_changes" in stopped.reason
    lagging = judge(facts(engine_lag_seconds=90.0))
    assert (lagging.passed, lagging.cause) == (False, "engine")
    assert "90 s behind" in lagging.reason
    down = judge(facts(applier_running=False, applier_problem="run 1234 is gone"))
    assert (down.passed, down.cause) == (False, "applier")
    assert "run 1234 is gone" in down.reason
    behind = judge(facts(oldest_pending=NOW - 75, applier_problem="boom"))
    assert (behind.passed, behind.cause) == (False, "backlog")
    assert "75 s" in behind.reason and "boom" in behind.reason
    assert judge(facts(oldest_pending=NOW - 30)).passed  # pending, but within the promise


@given(
    # (whole seconds: ``now - (now - age)`` is ``age`` exactly)
    limit=st.integers(1, 3600),
    engine_lag=st.one_of(st.none(), st.integers(0, 10_000)),
    pending_age=st.one_of(st.none(), st.integers(0, 10_000)),
    engine_running=st.booleans(),
    applier_running=st.booleans(),
)
def test_fresh_only_when_every_part_is_within_the_promise(
        limit: int, engine_lag: int | None, pending_age: int | None,
        engine_running: bool, applier_running: bool) -> None:
    verdict = judge(facts(freshness_seconds=limit, engine_lag_seconds=engine_lag,
                          oldest_pending=None if pending_age is None else NOW - pending_age,
                          engine_running=engine_running, applier_running=applier_running))
    within = ((engine_lag or 0) <= limit and (pending_age or 0) <= limit
              and engine_running and applier_running)
    assert verdict.passed == within
    assert verdict.lag_seconds >= max(engine_lag or 0, pending_age or 0) - 1e-9
    assert (verdict.reason == "") == verdict.passed
