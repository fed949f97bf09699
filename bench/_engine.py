"""The capture engine as a process's main function: what ``multiprocessing`` starts for the
benchmarks (a spawned child imports it by name), so that every figure comes with the engine's
own peak RSS (VmHWM of a process that ran nothing else)."""

from __future__ import annotations

import time
from typing import Any

from cdc_platform.capture.engine import CaptureEngine, EngineOptions
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.config import S3Settings


def rss_bytes(field: str = "VmHWM", pid: int | str = "self") -> int:
    """A memory field of /proc/<pid>/status in bytes: VmHWM is the peak RSS, VmRSS the
    current one; 0 if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_engine(options: EngineOptions, landing_url: str, server_name: str, stop: Any,
               results: Any = None, s3: S3Settings | None = None) -> None:
    """Run an engine until ``stop`` is set; put (records, peak RSS) in ``results``. ``s3``:
    the options of an s3:// landing URL (credentials from the inherited AWS environment)."""
    engine = CaptureEngine(options, LandingZone(landing_url, server_name, s3=s3))
    stats = engine.run(stop)
    if results is not None:
        results.put((stats.records, rss_bytes()))


def engine_peak_rss(options: EngineOptions, landing_url: str, server_name: str,
                    results: Any, s3: S3Settings | None = None) -> None:
    """Run an engine until caught up, in this (fresh) process; put (records, seconds, RSS
    before the run, peak RSS) in ``results``, RSS in bytes (VmHWM: the process's peak)."""
    engine = CaptureEngine(options, LandingZone(landing_url, server_name, s3=s3))
    before = rss_bytes("VmRSS")
    started = time.perf_counter()
    stats = engine.run(stop_when_caught_up=True)
    results.put((stats.records, time.perf_counter() - started, before, rss_bytes()))
