"""A real Prometheus (Debian's package) scrapes a streaming engine and an applier
(``python -m cdc_platform stream`` / ``apply`` with ``metrics.port``) on a private MariaDB under
a write load, evaluating the shipped alert rules: the lag metrics move with the load and settle
when it stops, and stopping the engine fires ``CdcCaptureDown`` until it is back."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.devservices.ports import free_port_range
from cdc_platform.devservices.prometheus import PrometheusServer
from cdc_platform_tests.conftest import CdcEnv

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("prometheus") is None,
                       reason="Debian's prometheus is not installed (make bootstrap)"),
]


def _wait(what: str, condition: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@contextmanager
def _process(env: CdcEnv, command: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "cdc_platform", command, "--config",
                                    str(env.root / "config.yaml")], cwd=REPO, stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class _Writer:
    """Single-row inserts and updates, autocommit, until stopped."""

    def __init__(self, env: CdcEnv) -> None:
        self.env = env
        self.rows = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with self.env.connect() as conn, conn.cursor() as cur:
            conn.autocommit(True)
            while not self._stop.is_set():
                self.rows += 1
                cur.execute("INSERT INTO orders VALUES (%s, %s) ON DUPLICATE KEY UPDATE "
                            "amount = amount + 1", (self.rows % 500, self.rows))
                time.sleep(0.01)


def _value(prometheus: PrometheusServer, promql: str) -> float | None:
    samples = prometheus.query(promql)
    return samples[0][1] if samples else None


def _firing(prometheus: PrometheusServer, alert: str) -> bool:
    return any(labels.get("alertname") == alert for labels in prometheus.firing())


def test_prometheus_scrapes_the_lags_as_they_move_and_the_capture_alert_fires(
        cdc_env: CdcEnv) -> None:
    env = cdc_env
    base = free_port_range(4)
    env.overrides["metrics"] = {"port": base, "host": "127.0.0.1"}
    env.overrides["lake"] = {"applier": False, "poll_seconds": 0.5, "merge_interval_seconds": 2,
                             "freshness_seconds": 30}
    env.write_config()
    env.execute("CREATE TABLE orders (id INT PRIMARY KEY, amount INT)")
    engine_target, applier_target = f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"
    prometheus = PrometheusServer(base_dir=env.root / "prometheus", scrape_seconds=1.0,
                                  targets={"engine": [engine_target],
                                           "applier": [applier_target]})
    prometheus.start()
    source = f'source="{env.server_name}"'
    try:
        with _process(env, "stream", env.root / "engine.log") as engine, \
                _process(env, "apply", env.root / "applier.log"):
            _wait("both targets scraped", lambda: prometheus.targets_up() == {
                engine_target: True, applier_target: True}, 180)

            # -- under a write load the changes flow and the target's lag moves ----------------
            with _Writer(env) as writer:
                _wait("changes counted by op", lambda: (_value(
                    prometheus, f'cdc_capture_row_changes_total{{{source}, op="c"}}') or 0) > 50,
                    120)
                _wait("merges into the target", lambda: (_value(
                    prometheus, f'sum(cdc_merged_records_total{{{source}}})') or 0) > 50, 180)
                _wait("the target's lag above 0 while changes wait for their merge",
                      lambda: (_value(prometheus, f'max_over_time(cdc_target_lag_seconds'
                                                  f'{{{source}}}[1m])') or 0) > 0, 120)
                # (a commit's lag is now minus its commit second: under load, a fraction of one)
                _wait("the engine's lag above 0 while changes arrive", lambda: (_value(
                    prometheus, f"max_over_time(cdc_capture_lag_seconds{{{source}}}[1m])")
                    or 0) > 0, 60)
                assert writer.rows > 0
            # -- the load stopped: both lags settle at 0 ----------------------------------------
            _wait("the target's lag settles at 0", lambda: _value(
                prometheus, f'cdc_target_lag_seconds{{{source}, table="{env.db}.orders"}}') == 0,
                120)
            _wait("the engine's lag settles at 0", lambda: _value(
                prometheus, f"cdc_capture_lag_seconds{{{source}}}") == 0, 60)
            assert _value(prometheus, f"cdc_capture_connected{{{source}}}") == 1
            assert (_value(prometheus, f"cdc_merge_duration_seconds_count{{{source}}}") or 0) > 0
            assert _value(prometheus, f"cdc_lake_freshness_seconds{{{source}}}") == 30
            assert not _firing(prometheus, "CdcCaptureDown")

            # -- the engine stops: its target goes down and the capture alert fires -------------
            engine.terminate()
            assert engine.wait(60) == 0
            with _Writer(env):  # (changes the stopped engine does not see)
                _wait("CdcCaptureDown firing", lambda: _firing(prometheus, "CdcCaptureDown"),
                      150)
            assert not _firing(prometheus, "CdcApplierDown")

            # -- started again: it reads the backlog (in a second or two: too fast to be sure a
            # scrape sees its lag), its lag settles, the alert resolves, the target catches up --
            with _process(env, "stream", env.root / "engine.log"):
                _wait("the backlog read by the new process", lambda: (_value(
                    prometheus, f"sum(cdc_capture_row_changes_total{{{source}}})") or 0) > 100,
                    120)
                _wait("the engine's lag settles at 0 again", lambda: _value(
                    prometheus, f"cdc_capture_lag_seconds{{{source}}}") == 0, 120)
                _wait("CdcCaptureDown resolved",
                      lambda: not _firing(prometheus, "CdcCaptureDown"), 60)
                _wait("the target catches up", lambda: _value(
                    prometheus,
                    f'cdc_target_lag_seconds{{{source}, table="{env.db}.orders"}}') == 0, 180)
    finally:
        prometheus.stop()
