"""When the platform launches a snapshot again after its run ended without loading the table
(pure logic): after failures only, a bounded number of times, each after a longer wait."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cdc_platform.capture.snapshot.reading.relaunch import (
    CANCELED,
    FAILURE,
    SUCCESS,
    EndedRun,
    GiveUp,
    Launch,
    Wait,
    relaunch_verdict,
)

T0 = 1_800_000_000.0


def _failed(count: int, every: float = 1000.0) -> list[EndedRun]:
    return [EndedRun(f"run{i:05d}-x", FAILURE, T0 + i * every) for i in range(count)]


def test_a_first_launch_then_relaunches_after_failures_with_a_growing_wait() -> None:
    assert relaunch_verdict([], T0) == Launch(1)
    [run] = _failed(1)
    waiting = relaunch_verdict([run], T0 + 10, relaunches=3, backoff_seconds=60)
    assert isinstance(waiting, Wait) and (waiting.attempt, waiting.at) == (2, T0 + 60)
    assert "run run00000 failed at" in waiting.why and "relaunch 1 of 3 (attempt 2)" in \
        waiting.why
    launch = relaunch_verdict([run], T0 + 60, relaunches=3, backoff_seconds=60)
    assert isinstance(launch, Launch) and launch.attempt == 2 and launch.why == \
        relaunch_verdict([run], T0 + 60, relaunches=3, backoff_seconds=60).why
    runs = _failed(3)  # the third ended at T0 + 2000: its relaunch waits 4 x 60 s
    assert relaunch_verdict(runs, T0 + 2000 + 239, backoff_seconds=60) == Wait(
        4, T0 + 2240, relaunch_verdict(runs, T0 + 2000 + 239, backoff_seconds=60).why)
    due = relaunch_verdict(runs, T0 + 2240, backoff_seconds=60)
    assert isinstance(due, Launch) and due.attempt == 4


def test_after_the_last_relaunch_a_person_cancelling_or_a_stop_it_is_left_alone() -> None:
    given_up = relaunch_verdict(_failed(4), T0 + 9000, relaunches=3, fix="materialise it")
    assert isinstance(given_up, GiveUp)
    assert given_up.reason.startswith("4 snapshot runs ended without loading it, the last: "
                                      "run run00003 failed at ")
    assert given_up.reason.endswith("not launched again after 3 relaunches (the runs' logs "
                                    "say why): materialise it")
    cancelled = relaunch_verdict([EndedRun("abcdefgh-1", CANCELED, T0)], T0 + 9000)
    assert isinstance(cancelled, GiveUp) and "was cancelled" in cancelled.reason
    stopped = relaunch_verdict([EndedRun("abcdefgh-1", SUCCESS, T0)], T0 + 9000)
    assert isinstance(stopped, GiveUp) and "stopped" in stopped.reason
    signal = relaunch_verdict(_failed(1), T0 + 9000, stopped_by="sig-7")
    assert isinstance(signal, GiveUp) and "stopped by signal sig-7" in signal.reason
    # The newest run decides: a failure after a cancel is relaunched.
    runs = [EndedRun("a", CANCELED, T0), EndedRun("b", FAILURE, T0 + 5)]
    assert isinstance(relaunch_verdict(runs, T0 + 9000), Launch)


@given(st.lists(st.tuples(st.sampled_from([FAILURE, FAILURE, FAILURE, SUCCESS, CANCELED]),
                          st.floats(0, 1e5)), max_size=12),
       st.integers(0, 5), st.floats(0, 600), st.floats(0, 1e6))
def test_launches_are_bounded_and_never_before_their_wait(
        ended: list[tuple[str, float]], relaunches: int, backoff: float, later: float) -> None:
    """Whatever runs ended, a marker gets at most 1 + ``relaunches`` runs; a relaunch follows
    a failure only, never sooner than its wait after it; anything but a failure ends it."""
    runs = [EndedRun(f"r{i}", status, T0 + at) for i, (status, at) in enumerate(ended)]
    now = T0 + later
    verdict = relaunch_verdict(runs, now, relaunches=relaunches, backoff_seconds=backoff)
    if not runs:
        assert verdict == Launch(1)
        return
    last = max(runs, key=lambda run: (run.ended_at, run.run_id))
    if isinstance(verdict, Launch | Wait):
        assert last.status == FAILURE
        assert verdict.attempt == len(runs) + 1 <= relaunches + 1
        due = last.ended_at + backoff * 2 ** (len(runs) - 1)
        assert isinstance(verdict, Launch) == (now >= due)
    else:
        assert last.status != FAILURE or len(runs) > relaunches
