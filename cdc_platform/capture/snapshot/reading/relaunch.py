"""Whether the platform launches a table's snapshot again after the run that answered its marker
ended without loading it (the platform's own runs: history loads and DDL re-snapshots).

A run of the platform reads hundreds of tables: one killed run (kill -9, an evicted pod, a
lost node) would otherwise leave every table it had not finished unloaded until someone
materialised them by hand. So a marker whose run *failed* is launched again, a bounded number
of times, each after a longer wait; the next run adopts the sessions the killed one left open
(``reader``: resuming a session whose reader died). What a person decided is left alone: a run
cancelled in Dagster, a run that ended successfully with the table not loaded (its snapshot
stopped: a stop signal, the CLI), a table a stop signal stopped since. Every verdict says why,
for the sensor's log, the run's tags and the target's ``not_stale`` check.

Pure: the sensor (``defs/snapshots/sensors.py``) gives the ended runs that answered the marker.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

# How many times a marker's snapshot is launched again after its run failed, and the wait
# before the first relaunch (doubling each time: 60 s, 120 s, 240 s), since the failed run
# ended. Three relaunches outlast a node lost twice and a source restarted meanwhile; a table
# whose snapshot fails for its own reason stops being launched after four runs.
SNAPSHOT_RELAUNCHES = 3
RELAUNCH_BACKOFF_SECONDS = 60.0

# The run statuses a verdict reads (Dagster's, lower-case).
FAILURE = "failure"
SUCCESS = "success"
CANCELED = "canceled"


@dataclass(frozen=True)
class EndedRun:
    """A run of the platform that answered the marker and ended."""

    run_id: str
    status: str  # FAILURE, SUCCESS or CANCELED
    ended_at: float  # seconds since the epoch

    def describe(self, now: float | None = None) -> str:
        """"run <id> failed at <when>" (with ``now``: and how long ago)."""
        when = dt.datetime.fromtimestamp(self.ended_at, dt.UTC).isoformat(timespec="seconds")
        verb = {FAILURE: "failed", SUCCESS: "succeeded", CANCELED: "was cancelled"}.get(
            self.status, f"ended {self.status}")
        ago = "" if now is None else f" ({max(0.0, now - self.ended_at):.0f} s ago)"
        return f"run {self.run_id[:8]} {verb} at {when}{ago}"


@dataclass(frozen=True)
class Launch:
    """Launch now, as the marker's ``attempt``-th run (1: its first); ``why`` for a relaunch."""

    attempt: int
    why: str = ""


@dataclass(frozen=True)
class Wait:
    """A relaunch is due at ``at`` (seconds since the epoch), as the ``attempt``-th run."""

    attempt: int
    at: float
    why: str


@dataclass(frozen=True)
class GiveUp:
    """Not launched again by the platform: ``reason`` (with what to do)."""

    reason: str


def relaunch_verdict(runs: Sequence[EndedRun], now: float, *, stopped_by: str | None = None,
                     relaunches: int = SNAPSHOT_RELAUNCHES,
                     backoff_seconds: float = RELAUNCH_BACKOFF_SECONDS,
                     fix: str = "materialise the table's snapshot asset"
                     ) -> Launch | Wait | GiveUp:
    """What to do with a marker the runs ``runs`` answered and ended without resolving.

    ``stopped_by``: the signal that stopped the table's snapshot since (its request.json),
    if one did; ``fix``: what a person does to load the table. Judged by the newest run: one
    that failed is launched again (the ``n``-th relaunch ``backoff_seconds * 2**(n-1)`` after
    it ended) while fewer than ``relaunches`` relaunches were made; any other ending, or a
    stop signal, is left alone."""
    if not runs:
        return Launch(1)
    last = max(runs, key=lambda run: (run.ended_at, run.run_id))
    ran = len(runs)
    said = last.describe()  # (a verdict to give up is written once: the same every tick)
    if last.status == CANCELED:
        return GiveUp(f"its snapshot {said} without loading it and is not launched again (a "
                      f"cancel is a person's decision): {fix}")
    if last.status != FAILURE:
        return GiveUp(f"its snapshot {said} without loading it (the table's snapshot was "
                      f"stopped: see the run's observation of the table): {fix}")
    if stopped_by is not None:
        return GiveUp(f"its snapshot {said} and was then stopped by signal {stopped_by}: "
                      f"{fix}")
    if ran > relaunches:
        return GiveUp(f"{ran} snapshot runs ended without loading it, the last: {said}; not "
                      f"launched again after {relaunches} relaunches (the runs' logs say "
                      f"why): {fix}")
    attempt = ran + 1
    why = (f"its snapshot {last.describe(now)} without loading it: relaunch {ran} of "
           f"{relaunches} (attempt {attempt})")
    due = last.ended_at + backoff_seconds * 2 ** (ran - 1)
    if now < due:
        return Wait(attempt, due, why)
    return Launch(attempt, why)
