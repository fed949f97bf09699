"""Faults under a capture engine streaming into an s3:// landing zone on a real SeaweedFS, with
a write load on the source: ``kill -9`` of the engine at random points (mid-upload among them)
and the S3 server stopped for seconds under it. Either way the landed changelog must equal the
source's committed changes exactly: per key, every change once, in commit order, none missing
and none twice (``_Ledger`` knows each committed change: every update moves a key's version
one up).

The engine runs as a process of its own (``_engine_child``: the CLI's ``stream`` with a short
engine-lease ttl, which the config does not expose, so that a killed engine's lease blocks its
successor for seconds, not a minute). ``_Supervisor`` restarts it as a Dagster run retry or a
Kubernetes pod restart would, and measures how long a restart after a kill takes to stream
again: about the lease's ttl at most.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cdc_platform.capture.landing.fencing import ENGINE_LEASE_FILE
from cdc_platform.capture.landing.zone import LandingReader
from cdc_platform.capture.store import open_store
from cdc_platform.devservices.mariadb import gtid_position_covers
from cdc_platform.devservices.seaweedfs import SeaweedFS
from cdc_platform_tests import s3_fixtures
from cdc_platform_tests.conftest import CdcEnv
from cdc_platform_tests.s3_fixtures import s3_options

pytestmark = pytest.mark.integration

s3_env = s3_fixtures.s3_env
CHILD_ENV = "CDC_TEST_S3_FAULTS_ENGINE"
TABLE = "ledger"
REFUSED = "another capture engine is already streaming"
STREAMING = "-> streaming"
WAITING = "to expire (not released"  # capture.store.lease's line while it waits out a dead holder
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """A server of this module's own: its tests stop and start it."""
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs-faults"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


# ---- the write load, and what it committed --------------------------------------------------


@dataclass
class _Ledger:
    """Transactions of 1-4 changes on ``ledger`` (id, version, pad): inserts of new keys at
    version 0, updates that move a key's version one up, deletes; a change joins ``changes``
    only once its transaction committed."""

    env: CdcEnv
    rate: float = 120.0  # transactions/s
    seed: int = 23
    changes: dict[int, list[tuple[str, int | None]]] = field(default_factory=dict)
    transactions: int = 0
    errors: list[BaseException] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def create(self) -> None:
        self.env.execute(f"CREATE TABLE {TABLE} (id INT PRIMARY KEY, version INT NOT NULL, "
                         "pad VARCHAR(200) NOT NULL)")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ledger-writes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        assert not self.errors, self.errors

    def _run(self) -> None:
        rng = random.Random(self.seed)
        alive: dict[int, int] = {}
        next_id = 1
        try:
            with self.env.mariadb.root_connect(database=self.env.db, autocommit=False) as conn, \
                    conn.cursor() as cur:
                interval, next_at = 1.0 / self.rate, time.monotonic()
                while not self._stop.is_set():
                    pending: list[tuple[int, str, int | None]] = []
                    versions = dict(alive)
                    for _ in range(rng.randint(1, 4)):
                        pad = "".join(rng.choices("abcdefghij", k=rng.randint(20, 200)))
                        r = rng.random()
                        if versions and r < 0.55:
                            key = rng.choice(list(versions))
                            versions[key] += 1
                            cur.execute(f"UPDATE {TABLE} SET version = %s, pad = %s WHERE id = %s",
                                        (versions[key], pad, key))
                            pending.append((key, "u", versions[key]))
                        elif versions and r < 0.7:
                            key = rng.choice(list(versions))
                            del versions[key]
                            cur.execute(f"DELETE FROM {TABLE} WHERE id = %s", (key,))
                            pending.append((key, "d", None))
                        else:
                            key, next_id = next_id, next_id + 1
                            versions[key] = 0
                            cur.execute(f"INSERT INTO {TABLE} VALUES (%s, 0, %s)", (key, pad))
                            pending.append((key, "c", 0))
                    conn.commit()
                    alive = versions
                    for key, op, version in pending:
                        self.changes.setdefault(key, []).append((op, version))
                    self.transactions += 1
                    next_at += interval
                    self._stop.wait(max(0.0, next_at - time.monotonic()))
        except BaseException as error:  # noqa: BLE001 - the test reports it
            self.errors.append(error)

    def assert_landed_exactly(self, reader: LandingReader) -> None:
        """The changelog below the checkpoint holds each committed change once, in order."""
        checkpoint = reader.read_checkpoint()
        assert checkpoint is not None
        records: list[tuple[int, int, str, int | None]] = []
        for first, _, name in reader.segment_names(self.env.db, TABLE):
            assert first < checkpoint.next_pos, f"a segment past the checkpoint: {name}"
            fs, path = reader.store.arrow("changelog", self.env.db, TABLE, name)
            table = pq.read_table(path, filesystem=fs, columns=["__cdc_pos", "__cdc_op", "id",
                                                                "version"])
            records += [(r["__cdc_pos"], r["id"], r["__cdc_op"], r["version"])
                        for r in table.to_pylist()]
        positions = [r[0] for r in records]
        assert len(positions) == len(set(positions)), "a changelog position landed twice"
        landed: dict[int, list[tuple[str, int | None]]] = {}
        for _, key, op, version in sorted(records):
            landed.setdefault(key, []).append((op, None if op == "d" else version))
        wrong = sorted(k for k in self.changes.keys() | landed.keys()
                       if self.changes.get(k) != landed.get(k))
        assert not wrong, "keys whose changes did not land exactly once: " + "; ".join(
            f"{k}: committed {self.changes.get(k)} landed {landed.get(k)}" for k in wrong[:5])
        alive = {k for k, ops in self.changes.items() if ops[-1][0] != "d"}
        assert {row[0] for row in self.env.query(f"SELECT id FROM {TABLE}")} == alive


# ---- the engine as a process of its own ------------------------------------------------------


def _engine_child() -> None:
    """``python -m cdc_platform stream --config ...`` with the engine lease's ttl of the job:
    the same settings, engine and landing zone, one line for a known start error."""
    from cdc_platform.capture.engine import CaptureEngine
    from cdc_platform.capture.engine_options import EngineOptions
    from cdc_platform.capture.landing.zone import LandingZone
    from cdc_platform.capture.start_errors import describe_start_error
    from cdc_platform.config import load_settings

    job = json.loads(os.environ[CHILD_ENV])
    settings = load_settings(job["config"])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    landing = LandingZone(settings.landing_zone.url, settings.source.server_name,
                          s3=settings.s3, scratch=Path(job["scratch"]),
                          lease_ttl_seconds=job["lease_ttl"])
    try:
        CaptureEngine(EngineOptions.from_settings(settings), landing).run(
            stop, stop_when_caught_up=job["until_caught_up"])
    except Exception as error:
        line = describe_start_error(error)
        if line is None:
            raise
        print(f"cdc_platform stream: {line}", file=sys.stderr, flush=True)
        sys.exit(1)


@dataclass
class _Supervisor:
    """Starts the engine child, and starts it again when it exits refused or failed, as a
    run retry or a pod restart would (``refusals``, ``failures``); its log is kept."""

    env: CdcEnv
    config: Path
    lease_ttl: float
    logs: Path
    refusals: int = 0
    waits: int = 0  # starts that waited for a live lease (logged) rather than being refused
    failures: list[str] = field(default_factory=list)
    starts: int = 0
    process: subprocess.Popen[bytes] | None = None
    _log: Path | None = None

    def start(self, until_caught_up: bool = False) -> None:
        self.starts += 1
        self._log = self.logs / f"engine-{self.starts}.log"
        job = {"config": str(self.config), "scratch": str(self.logs / f"pod-{self.starts}"),
               "lease_ttl": self.lease_ttl, "until_caught_up": until_caught_up}
        with open(self._log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from cdc_platform_tests.capture.test_s3_faults "
                 "import _engine_child; _engine_child()"],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                env={**os.environ, CHILD_ENV: json.dumps(job)})

    def log_text(self) -> str:
        return self._log.read_text(errors="replace") if self._log else ""

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()  # SIGKILL: no flush, no checkpoint, no lease release
        self.process.wait()

    def wait_streaming(self, timeout: float, until_caught_up: bool = False) -> float:
        """Until the running child streams; a child that exits refused (the old lease still
        live) or failed is started again. Returns the seconds it took."""
        started = time.monotonic()
        while True:
            assert self.process is not None
            code = self.process.poll()
            if code is None and STREAMING in self.log_text():
                self.waits += WAITING in self.log_text()
                return time.monotonic() - started
            if code is not None:
                text = self.log_text()
                if REFUSED in text:
                    self.refusals += 1
                else:
                    self.failures.append(text)
                time.sleep(0.5)
                self.start(until_caught_up)
            if time.monotonic() - started > timeout:
                raise AssertionError(f"the engine did not stream within {timeout:.0f} s; its "
                                     f"log:\n{self.log_text()[-3000:]}")
            time.sleep(0.1)

    def finish(self, timeout: float = 180.0) -> None:
        """Stop it cleanly (SIGTERM: flush, checkpoint, release the lease)."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        assert code == 0, self.log_text()[-3000:]


def _configure(env: CdcEnv, server: SeaweedFS) -> tuple[str, Path]:
    bucket = f"faults-{uuid.uuid4().hex[:12]}"
    server.create_bucket(bucket)
    url = f"s3://{bucket}/landing"
    env.overrides.update({
        "capture": {"flush_interval_seconds": 0.2, "flush_max_rows": 400,
                    "snapshot_mode": "never"},
        "landing_zone": {"url": url},
        "s3": {"endpoint_url": server.endpoint_url, "region": server.region,
               "path_style": True},
    })
    return url, env.write_config()


def _streaming_under_load(env: CdcEnv, url: str, config: Path, ttl: float, tmp_path: Path,
                          server: SeaweedFS) -> tuple[LandingReader, _Ledger, _Supervisor]:
    """The zone's reader, and the engine (supervised, lease ttl ``ttl``) streaming while the
    ledger's write load runs: the start every fault test here shares."""
    reader = LandingReader(open_store(url, s3=s3_options(server)), env.server_name)
    ledger = _Ledger(env)
    ledger.create()
    supervisor = _Supervisor(env, config, ttl, tmp_path)
    supervisor.start()
    supervisor.wait_streaming(120)
    ledger.start()
    return reader, ledger, supervisor


def _wait_caught_up(reader: LandingReader, env: CdcEnv, timeout: float,
                    supervisor: _Supervisor) -> None:
    final = env.mariadb.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
    deadline = time.monotonic() + timeout
    while True:
        checkpoint = reader.read_checkpoint()
        if checkpoint is not None and gtid_position_covers(checkpoint.gtid, final):
            return
        assert supervisor.process is not None
        if supervisor.process.poll() is not None:  # (a failure: recorded, started again)
            supervisor.wait_streaming(max(1.0, deadline - time.monotonic()))
        assert time.monotonic() < deadline, f"the engine did not land {final} in time"
        time.sleep(0.2)


def test_kill_9_mid_upload_then_restart_lands_every_change_exactly_once(
        cdc_env: CdcEnv, seaweedfs: SeaweedFS, s3_env: dict[str, str], tmp_path: Path):
    env, ttl = cdc_env, 8.0  # (longer than a child's start on a loaded machine)
    url, config = _configure(env, seaweedfs)
    reader, ledger, supervisor = _streaming_under_load(env, url, config, ttl, tmp_path,
                                                       seaweedfs)
    rng = random.Random(9)
    restarts: list[float] = []
    try:
        for round_ in range(4):
            if round_ % 2:  # just after a checkpoint: the next flush's uploads are under way
                before = reader.read_checkpoint()
                deadline = time.monotonic() + 30
                while reader.read_checkpoint() == before and time.monotonic() < deadline:
                    time.sleep(0.02)
                time.sleep(rng.uniform(0.0, 0.2))
            else:
                time.sleep(rng.uniform(0.3, 2.5))
            supervisor.kill()
            assert reader.store.exists(ENGINE_LEASE_FILE)  # (left behind, live)
            supervisor.start()
            restarts.append(supervisor.wait_streaming(ttl + 90))
    finally:
        ledger.stop()
    _wait_caught_up(reader, env, 120, supervisor)
    supervisor.finish()

    assert ledger.transactions > 300
    ledger.assert_landed_exactly(reader)
    assert not supervisor.failures, supervisor.failures[0][-3000:]
    # a restart takes over the lease of the dead engine (a process of this host that is
    # gone) instead of being refused on it
    assert supervisor.refusals == 0, supervisor.refusals
    # a restart after a kill streams again about when the dead engine's lease expired
    assert max(restarts) < ttl + 60, restarts
    print(f"restarts after kill -9 streamed after {[round(s, 1) for s in restarts]} s "
          f"(lease ttl {ttl:g} s); {supervisor.refusals} start(s) refused on the dead engine's "
          f"live lease, {supervisor.waits} waited it out")


def test_seaweedfs_stopped_under_the_streaming_engine_loses_and_repeats_nothing(
        cdc_env: CdcEnv, seaweedfs: SeaweedFS, s3_env: dict[str, str], tmp_path: Path):
    """The server is down while the engine streams and flushes, for 2 s and then for 20 s
    (longer than botocore's attempts, about 7-14 s): the store retries its requests with
    backoff (``s3.retry_seconds``) and the engine rides both out without stopping, its lease
    (the default 60 s ttl) renewed across them; after the server is back, the changelog is
    exact."""
    env, ttl = cdc_env, 60.0
    url, config = _configure(env, seaweedfs)
    reader, ledger, supervisor = _streaming_under_load(env, url, config, ttl, tmp_path,
                                                       seaweedfs)
    try:
        for down_seconds in (2.0, 20.0):
            time.sleep(3.0)
            seaweedfs.stop()
            time.sleep(down_seconds)
            seaweedfs.start()
        time.sleep(3.0)
    finally:
        ledger.stop()
    assert supervisor.process is not None and supervisor.process.poll() is None, \
        supervisor.log_text()[-3000:]
    _wait_caught_up(reader, env, 180, supervisor)
    supervisor.finish()

    ledger.assert_landed_exactly(reader)
    log = supervisor.log_text()
    assert supervisor.starts == 1 and not supervisor.failures, log[-3000:]
    assert "retrying for up to" in log and "Traceback" not in log, log[-3000:]
    print(f"{ledger.transactions} transactions; the engine rode out both outages: "
          f"{log.count('retrying for up to')} request(s) retried")


def test_an_outage_beyond_retry_seconds_stops_the_engine_with_one_line(
        cdc_env: CdcEnv, seaweedfs: SeaweedFS, s3_env: dict[str, str], tmp_path: Path):
    """Down for longer than ``s3.retry_seconds`` (here 4 s, after botocore's own attempts):
    the engine stops with one line naming the endpoint and the setting (its failed state's
    reason, and the CLI's last line: no uncaught traceback); started again once the server is
    back, it resumes from the checkpoint and the changelog is exact."""
    env, ttl = cdc_env, 60.0
    url, _ = _configure(env, seaweedfs)
    env.overrides["s3"]["retry_seconds"] = 4.0
    config = env.write_config()
    reader, ledger, supervisor = _streaming_under_load(env, url, config, ttl, tmp_path,
                                                       seaweedfs)
    try:
        time.sleep(2.0)
        seaweedfs.stop()
        assert supervisor.process is not None
        supervisor.process.wait(60)  # (stopped: botocore's attempts, then 4 s)
        stopped = supervisor.log_text()
        seaweedfs.start()
        supervisor.start()
        supervisor.wait_streaming(120)
        time.sleep(2.0)
    finally:
        ledger.stop()
    _wait_caught_up(reader, env, 180, supervisor)
    supervisor.finish()

    ledger.assert_landed_exactly(reader)
    line = stopped.strip().splitlines()[-1]  # (not an uncaught exception's last line)
    assert line.startswith("cdc_platform stream: landing_zone.url "), stopped[-3000:]
    assert seaweedfs.endpoint_url in line and "s3.retry_seconds" in line, line
    assert "-> failed (ObjectStoreUnavailableError: landing_zone.url " in stopped, \
        stopped[-3000:]


def test_a_cli_engine_start_on_wrong_credentials_or_no_bucket_is_one_line(
        cdc_env: CdcEnv, seaweedfs: SeaweedFS, s3_env: dict[str, str]):
    """``python -m cdc_platform stream`` as a user runs it: one line on stderr naming
    ``landing_zone.url`` and what to fix, no traceback, exit code 1; never the secret."""
    env = cdc_env
    url, config = _configure(env, seaweedfs)

    def start(**aws: str) -> str:
        child = subprocess.run(
            [sys.executable, "-m", "cdc_platform", "stream", "--config", str(config)],
            capture_output=True, text=True, timeout=120, cwd=REPO,
            env={**os.environ, **aws})
        assert child.returncode == 1, child.stderr[-3000:]
        assert "Traceback" not in child.stderr, child.stderr[-3000:]
        lines = child.stderr.strip().splitlines()
        return lines[-1]

    line = start(AWS_SECRET_ACCESS_KEY="not-the-secret-at-all")
    assert line.startswith(f"cdc_platform stream: landing_zone.url {url}/{env.server_name}: "
                           "access denied"), line
    assert "not-the-secret" not in line
    env.overrides["landing_zone"] = {"url": "s3://no-such-bucket-here/landing"}
    config = env.write_config()
    line = start()
    assert line == (f"cdc_platform stream: landing_zone.url s3://no-such-bucket-here/landing/"
                    f"{env.server_name}: bucket 'no-such-bucket-here' does not exist; create it "
                    "or fix the URL"), line
