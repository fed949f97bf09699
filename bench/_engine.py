"""The capture engine as a process's main function: what ``multiprocessing`` starts for the
snapshot benchmark (a spawned child imports it by name)."""

from __future__ import annotations

from typing import Any

from cdc_platform.capture.engine import CaptureEngine, EngineOptions
from cdc_platform.capture.landing import LandingZone


def run_engine(options: EngineOptions, landing_url: str, server_name: str, stop: Any) -> None:
    CaptureEngine(options, LandingZone(landing_url, server_name)).run(stop)
