"""The capture engine as a process's main function: what ``multiprocessing`` starts for the
snapshot benchmark (a spawned child imports it by name)."""

from __future__ import annotations

from typing import Any

from cdc_platform.capture.engine import CaptureEngine, EngineOptions
from cdc_platform.capture.landing import LandingZone


def run_engine(options: EngineOptions, landing_url: str, server_name: str, stop: Any) -> None:
    CaptureEngine(options, LandingZone(landing_url, server_name)).run(stop)


def engine_peak_rss(options: EngineOptions, landing_url: str, server_name: str,
                    results: Any) -> None:
    """Run an engine until caught up, in this (fresh) process; put (records, seconds, RSS
    before the run, peak RSS) in ``results``, RSS in bytes (VmHWM: the process's peak)."""
    import time

    def rss(field: str) -> int:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    engine = CaptureEngine(options, LandingZone(landing_url, server_name))
    before = rss("VmRSS")
    started = time.perf_counter()
    stats = engine.run(stop_when_caught_up=True)
    results.put((stats.records, time.perf_counter() - started, before, rss("VmHWM")))
