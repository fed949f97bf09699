"""The applier's sweeps of the landing zone (``lake.applier.sweep``): one at most every
``sweep_interval_seconds``, reported by the pass after it ends, never re-started by the pass
that reports it (which swept the landing zone at every pass)."""

from __future__ import annotations

import time
from pathlib import Path

from cdc_platform.capture.landing.zone import LandingReader
from cdc_platform.capture.source import TableSelector
from cdc_platform.lake.applier.options import ApplierOptions
from cdc_platform.lake.applier.sweep import LandingSweep


def test_a_finished_sweep_is_reported_and_the_next_waits_for_its_interval(
        tmp_path: Path) -> None:
    landing_url = str(tmp_path / "landing")
    (tmp_path / "landing" / "shop").mkdir(parents=True)
    options = ApplierOptions(server_name="shop", flavour="mariadb", landing_url=landing_url,
                             warehouse_url=str(tmp_path / "warehouse"), catalog=None,
                             connection={}, selector=TableSelector(), s3=None,
                             sweep_interval_seconds=3600.0)
    sweeps = LandingSweep(options, LandingReader.open(landing_url, "shop"))
    started: list[float] = []
    sweep = sweeps._sweep_landing_zone

    def counted(*args: object) -> object:
        started.append(time.monotonic())
        return sweep(*args)  # type: ignore[arg-type]

    sweeps._sweep_landing_zone = counted  # type: ignore[method-assign]
    assert not sweeps.due()  # (the interval counts from the start)
    sweeps._last_sweep -= 3600.0
    assert sweeps.due()
    reported = []
    deadline = time.monotonic() + 30
    while len(reported) < 1 and time.monotonic() < deadline:  # passes, one after another
        reported += sweeps.in_background([], {})
        time.sleep(0.01)
    for _ in range(50):  # more passes within the interval: nothing more is started
        reported += sweeps.in_background([], {})
        time.sleep(0.01)
    assert len(started) == 1 and len(reported) == 1
    assert not sweeps.due()
