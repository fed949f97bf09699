"""The image's entry point, as the chart runs it, serves the definitions (dbt assets included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from cdc_platform.config import CONFIG_ENV
from cdc_platform.defs.dbt.definitions import JOB_NAME as DBT_JOB
from cdc_platform.demo.inventory import create_schema
from cdc_platform.devservices.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _code_server_command(port: int) -> list[str]:
    """The chart's user-deployment container args, on loopback instead of 0.0.0.0."""
    values = yaml.safe_load((ROOT / "helm" / "values.yaml").read_text())
    deployment = values["dagster-user-deployments"]["deployments"][0]
    return [str(BIN / "dagster"), "code-server", "start", "-h", "127.0.0.1", "-p", str(port),
            *deployment["codeServerArgs"]]


def _serving(port: int, env: dict[str, str]) -> bool:
    check = subprocess.run([str(BIN / "dagster"), "api", "grpc-health-check", "-p", str(port)],
                           env=env, capture_output=True, text=True, timeout=60)
    return check.returncode == 0


def test_code_server_entry_point_serves_every_job_of_the_location(cdc_env, tmp_path):
    with cdc_env.connect() as conn:
        create_schema(conn, cdc_env.db)  # the inventory tables: the dbt assets load too
    env = {**os.environ, CONFIG_ENV: str(cdc_env.write_config()),
           "DAGSTER_HOME": str(tmp_path / "dagster_home"), "PATH": f"{BIN}:{os.environ['PATH']}"}
    (tmp_path / "dagster_home").mkdir()
    port = free_port()
    log = open(tmp_path / "code_server.log", "w+")  # noqa: SIM115 - handed to the child
    server = subprocess.Popen(_code_server_command(port), env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while not _serving(port, env):
            assert server.poll() is None, "the code server exited: " + _tail(log)
            assert time.monotonic() < deadline, "the code server never served: " + _tail(log)
            time.sleep(1)
        jobs = subprocess.run(
            [str(BIN / "dagster"), "job", "list", "--grpc-host", "127.0.0.1", "--grpc-port",
             str(port)], env=env, capture_output=True, text=True, timeout=120)
        assert jobs.returncode == 0, jobs.stdout[-2000:] + jobs.stderr[-2000:]
        for job in ("stream_changes", "materialise_targets", "catch_up_and_reconcile", DBT_JOB):
            assert job in jobs.stdout, jobs.stdout
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def _tail(log: object) -> str:
    log.seek(0)  # type: ignore[attr-defined]
    return log.read()[-3000:]  # type: ignore[attr-defined]
