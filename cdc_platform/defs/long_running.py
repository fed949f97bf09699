"""Long-running runs kept going by a sensor (the applier's ``apply_changes``, the change
topics' ``publish_changes``): which runs of a job are active, whether a run's process is still
alive, and one sensor tick's decision to fail a run whose process is gone and launch a new one
when none is active, with the reason as a run tag."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field

import dagster as dg

from cdc_platform.defs.signals.sensors import ACTIVE_STATUSES

#: Run tag: why a sensor launched the run.
REASON_TAG = "cdc_platform/launched_because"


@dataclass(frozen=True)
class RunTags:
    """The tags a long-running job's runs carry: ``kind`` (value: the server name) marks them,
    ``pid``/``host`` say where the run's process is (set by the run itself)."""

    kind: str
    pid: str
    host: str

    def where(self) -> dict[str, str]:
        """The tags a run sets on itself when it starts (this process, this host)."""
        return {self.pid: str(os.getpid()), self.host: socket.gethostname()}


def active_runs(instance: dg.DagsterInstance, tag: str, server: str) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(statuses=ACTIVE_STATUSES,
                                                        tags={tag: server})))


def run_alive(run: dg.DagsterRun, tags: RunTags) -> bool | None:
    """Whether the run's process is alive, when this host can tell (None: it cannot)."""
    pid, host = run.tags.get(tags.pid), run.tags.get(tags.host)
    if not pid or host != socket.gethostname():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return None
    return True


@dataclass
class KeptRunning:
    """One tick's verdict: the runs still going, the run to launch (if none is), and what
    went wrong (a run whose process is gone, or why none runs)."""

    running: list[dg.DagsterRun] = field(default_factory=list)
    requests: list[dg.RunRequest] = field(default_factory=list)
    problem: str = ""


def keep_running(context: dg.SensorEvaluationContext, job_name: str, tags: RunTags,
                 server: str) -> KeptRunning:
    """Fail the active runs whose process is gone (a ``kill -9``: the default run launcher
    cannot tell), and request a run when none is left, tagged with the reason."""
    instance = context.instance
    kept = KeptRunning()
    for run in active_runs(instance, tags.kind, server):
        if run_alive(run, tags) is False:
            kept.problem = (f"run {run.run_id[:8]} ended without stopping (its process "
                            f"{run.tags.get(tags.pid)} is gone)")
            context.log.warning(f"{job_name} {kept.problem}; marking it failed")
            instance.report_run_failed(run, message=f"{job_name}: {kept.problem}")
        else:
            kept.running.append(run)
    if not kept.running:
        last = instance.get_runs(filters=dg.RunsFilter(tags={tags.kind: server}), limit=1)
        reason = kept.problem or (f"the last run {last[0].run_id[:8]} ended "
                                  f"({last[0].status.value.lower()})" if last
                                  else "no run of it yet")
        kept.problem = kept.problem or reason
        context.log.info(f"launching {job_name}: {reason}")
        kept.requests.append(dg.RunRequest(run_key=f"{tags.kind}:{server}:{time.time():.0f}",
                                           tags={REASON_TAG: reason[:200]}))
    return kept
