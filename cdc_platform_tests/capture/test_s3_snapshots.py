"""Incremental snapshots with the landing zone on S3 (a real SeaweedFS): the reader's and the
engine's files (requests, chunks, manifests, reader.state), the reader's lease, the history
load of ``capture.snapshot_mode: initial`` through the Dagster sensor and asset, a reader
killed or fenced mid-snapshot, stale markers and column renames, all through the same code as a
local zone. Each snapshot ends by comparing the target with the source: the S3 zone is copied
byte for byte to a local folder, merged by the lake, and reconciled."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.capture.ddl.stale_markers import read_markers
from cdc_platform.capture.landing.session_records import Action, SnapshotRequest
from cdc_platform.capture.landing.zone import (
    READER_LEASE_FILE,
    SNAPSHOT_CHUNKS_DIR,
    LandingZone,
    snapshot_parts,
)
from cdc_platform.capture.snapshot import protocol
from cdc_platform.capture.snapshot.errors import SnapshotError
from cdc_platform.capture.snapshot.protocol import ReaderLock, reader_alive
from cdc_platform.capture.store.storage import FileStore, LocalFileStore
from cdc_platform_tests import s3_fixtures
from cdc_platform_tests.capture.snapshot.reading.live_engine import (
    _items,
    _wait_until,
    invisible,
    snapshot_reader,
    streaming,
)
from cdc_platform_tests.capture.test_snapshot_mode import _snapshot_as_the_sensor_asks
from cdc_platform_tests.conftest import CdcEnv

seaweedfs, s3_env, s3_url = s3_fixtures.seaweedfs, s3_fixtures.s3_env, s3_fixtures.s3_url

pytestmark = pytest.mark.integration


@dataclasses.dataclass
class S3CdcEnv(CdcEnv):
    """``cdc_env`` whose landing zone is an ``s3://`` prefix of the test's own bucket (the
    config's ``landing_zone.url`` and ``s3`` section: the engine, the readers, the CLI and the
    Dagster definitions all take it from there)."""

    @property
    def landing(self) -> LandingZone:
        return LandingZone.from_settings(self.settings)


@pytest.fixture
def env(cdc_env: CdcEnv, seaweedfs: Any, s3_url: str) -> S3CdcEnv:
    options = s3_fixtures.s3_options(seaweedfs)
    s3_env = S3CdcEnv(**{f.name: getattr(cdc_env, f.name) for f in dataclasses.fields(CdcEnv)})
    s3_env.overrides["landing_zone"] = {"url": s3_url}
    s3_env.overrides["s3"] = {"endpoint_url": options.endpoint_url, "region": options.region,
                              "path_style": True}
    return s3_env


def _copy(store: FileStore, target: LocalFileStore, *parts: str) -> int:
    """Every file below ``parts`` of ``store`` into the same place of ``target``."""
    copied = 0
    files = {info.name for info in store.list_files(*parts)}
    for name in store.list_names(*parts):
        if name in files:
            data = store.read_bytes(*parts, name)
            if data is not None:
                target.write_atomically(*parts, name, data=data, durable=False)
                copied += 1
        else:
            copied += _copy(store, target, *parts, name)
    return copied


def _target_equals_source(env: S3CdcEnv, spark: Any, table: str) -> None:
    """Land everything on S3, copy the zone to a local folder, merge it, reconcile with the
    source: the target holds exactly the source's rows."""
    from cdc_platform.lake.merge import materialise

    env.catch_up()
    local = env.root / "s3-copy"
    assert _copy(env.landing.store, LocalFileStore(local / env.server_name)) > 0
    materialise(spark, str(local), env.settings.warehouse.url, env.server_name, None, env.db,
                table)
    result = env.reconcile(spark, table)
    assert result.ok, (table, result.to_metadata())


def _chunk_objects(env: S3CdcEnv, table: str) -> list[str]:
    chunks = (*snapshot_parts(env.db, table), SNAPSHOT_CHUNKS_DIR)
    return [f"{s}/{n}" for s in env.landing.store.list_names(*chunks)
            for n in env.landing.store.list_names(*chunks, s)]


class _Writes:
    """Inserts, updates and deletes on ``items`` in a thread, until the block ends."""

    def __init__(self, env: S3CdcEnv) -> None:
        self.env, self.stop, self.count = env, threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            self.env.execute(f"INSERT INTO items VALUES ({100_000 + n}, 'new', {n}, 'n')",
                             f"UPDATE items SET name = 'w{n}' WHERE id = {(n * 37) % 3000 + 1}",
                             f"DELETE FROM items WHERE id = {(n * 53) % 3000 + 1}")
            self.count += 1
            time.sleep(0.005)

    def __enter__(self) -> _Writes:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def test_a_snapshot_with_writes_running_lands_exactly_the_source_rows(env: S3CdcEnv,
                                                                      spark: Any) -> None:
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'hidden', seq, 'a' FROM seq_1_to_3000")
    with streaming(env), _Writes(env) as writes:
        result = snapshot_reader(env, "items", chunk_size=100).run()
    assert result.status == "done" and result.chunks >= 30, result
    assert writes.count > 10
    assert _chunk_objects(env, "items") == []  # the finished session's chunks are gone
    request = protocol.read_request(env.landing, env.db, "items")
    assert request is not None and request.session_id == result.session_id
    _target_equals_source(env, spark, "items")


def test_snapshot_mode_initial_loads_history_through_the_sensor_and_asset(
        env: S3CdcEnv, spark: Any) -> None:
    env.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), "
                "price DECIMAL(10,2), status VARCHAR(8))")
    env.execute("INSERT INTO items SELECT seq, CONCAT('n', seq), seq / 4, 'old' "
                "FROM seq_1_to_2000")
    env.start_position = env.mariadb.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or ""
    env.execute("UPDATE items SET name = 'streamed' WHERE id <= 10")
    env.catch_up()  # the first start, under the default snapshot_mode (initial)
    assert {(m.table, m.verb) for m in read_markers(env.landing)} == {("items", "INITIAL")}
    with dg.instance_for_test() as instance:
        _snapshot_as_the_sensor_asks(env, instance, "items")
    _target_equals_source(env, spark, "items")


def test_a_reader_killed_mid_snapshot_is_followed_by_one_that_ends_exact(
        env: S3CdcEnv, spark: Any) -> None:
    """kill -9 of the reader's process: its lease stays until it expires; the next reader
    replaces the session once it has taken the lease, and the snapshot ends exact."""
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_3000")
    config = env.write_config()
    with streaming(env), _Writes(env):
        reader = subprocess.Popen([sys.executable, "-m", "cdc_platform", "snapshot",
                                   f"{env.db}.items", "--chunk-size", "20", "--config",
                                   str(config)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            def committed() -> int:
                checkpoint = env.landing.read_checkpoint()
                session = protocol.read_session_state(checkpoint, f"{env.db}.items")
                return len(session.committed) if session is not None else 0
            _wait_until(lambda: committed() >= 5, 90)
            assert reader_alive(env.landing, env.db, "items")
        finally:
            reader.send_signal(signal.SIGKILL)
            reader.wait()
        assert reader_alive(env.landing, env.db, "items")  # (its lease has not expired)
        result = snapshot_reader(env, "items", chunk_size=200,
                                 ack_timeout_seconds=protocol.READER_LEASE_TTL_SECONDS + 60
                                 ).run()
    assert result.status == "done", result
    assert not reader_alive(env.landing, env.db, "items")
    _target_equals_source(env, spark, "items")


def test_a_reader_whose_lease_was_taken_stops_writing_and_the_next_ends_exact(
        env: S3CdcEnv, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "READER_LEASE_TTL_SECONDS", 1.5)
    _items(env)
    invisible(env, "INSERT INTO items SELECT seq, 'x', seq, 'a' FROM seq_1_to_3000")
    store, lease = env.landing.store, (*snapshot_parts(env.db, "items"), READER_LEASE_FILE)
    with streaming(env):
        errors: list[BaseException] = []
        taken = threading.Event()

        def on_progress(progress: Any) -> None:
            if progress.chunks >= 3 and not taken.is_set():
                # another reader's lease replaces this one's (as after a long stall)
                store.write_atomically(*lease, data=b'{"holder": "other", "token": "t", '
                                                    b'"expires_at": 0.0}')
                taken.set()
                time.sleep(1.5)  # (past the renewal: it finds the lease taken)

        def run() -> None:
            try:
                snapshot_reader(env, "items", chunk_size=20).run(on_progress=on_progress)
            except BaseException as error:  # noqa: BLE001 - checked below
                errors.append(error)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(120)
        assert errors and isinstance(errors[0], SnapshotError), errors
        assert "lease" in str(errors[0]) and "lost" in str(errors[0])
        result = snapshot_reader(env, "items", chunk_size=200).run()
    assert result.status == "done", result
    _target_equals_source(env, spark, "items")


def test_a_second_reader_lock_on_the_table_is_refused_while_the_first_lives(
        env: S3CdcEnv) -> None:
    first = ReaderLock(env.landing, env.db, "items")
    second = ReaderLock(env.landing, env.db, "items")
    assert first.try_acquire()
    try:
        assert not second.try_acquire()
        assert "pid" in second.holder() and reader_alive(env.landing, env.db, "items")
    finally:
        first.release()
    assert not reader_alive(env.landing, env.db, "items")
    assert second.try_acquire()  # released: taken at once
    second.release()


def test_stale_markers_and_column_renames_on_s3(env: S3CdcEnv) -> None:
    """A TRUNCATE leaves a stale marker, a RENAME COLUMN a rename record: both in the S3
    zone, written by the engine and read back by the lake's and the sensor's readers."""
    from cdc_platform.lake.changelog import TableChangelog

    _items(env)
    env.execute("INSERT INTO items VALUES (1, 'a', 1, 'x'), (2, 'b', 2, 'y')")
    env.catch_up()
    env.execute("ALTER TABLE items RENAME COLUMN name TO label")
    env.execute("TRUNCATE TABLE items")
    env.catch_up()
    markers = [m for m in read_markers(env.landing) if m.table == "items"]
    assert [m.verb for m in markers] == ["TRUNCATE"], markers
    assert env.landing.column_renames_names(env.db, "items")
    checkpoint = env.landing.read_checkpoint()
    assert checkpoint is not None
    changelog = TableChangelog.open(env.settings.landing_zone.url, env.server_name, env.db,
                                    "items", s3=env.settings.s3)
    renames = changelog.column_renames(checkpoint.next_pos)
    assert renames, renames
    assert not Path(env.root / "landing").exists()  # nothing written locally


def test_retention_sweeps_decided_chunks_and_finished_sessions_on_s3(seaweedfs: Any,
                                                                     s3_url: str,
                                                                     tmp_path: Path) -> None:
    """The sweep's chunk rules through the store: rows files of decided chunks go at once,
    a replaced session's files and a finished session's once quiet; the request stays."""
    from cdc_platform.capture.landing.retention import CHUNKS, FINISHED_SESSION_GRACE_SECONDS, sweep
    from cdc_platform.capture.landing.session_records import SessionState, SnapshotSession
    from cdc_platform_tests.capture.landing.test_retention import (
        HOUR,
        _sessions_checkpoint,
        _write_chunk,
    )

    landing = LandingZone(s3_url, "demo", s3=s3_fixtures.s3_options(seaweedfs),
                          scratch=tmp_path / "scratch")
    for seq in range(4):
        _write_chunk(landing, "s1", seq, [(seq, "x")])
    _write_chunk(landing, "old", 0, [(1, "x")])
    protocol.write_request(landing, "shop", "items", SnapshotRequest(
        "s1", Action.OPEN, ("id",), None, 10))
    session = SnapshotSession("shop.items", "s1", SessionState.OPEN, "0-1-1", 1, "0-1-1",
                              ["id"], committed=[0, 1], rejected={"2": "re-read"})
    _sessions_checkpoint(landing, session)
    chunks = protocol.chunk_parts("shop", "items", "s1")

    report = sweep(landing, {}, [], HOUR)
    assert landing.store.list_names(*chunks) == [
        "00000000.json", "00000001.json", "00000002.json", "00000003.arrow", "00000003.json"]
    assert report.deleted_files[CHUNKS] == 3 and report.kept_files[CHUNKS] == 7
    later = time.time() + FINISHED_SESSION_GRACE_SECONDS + 1
    sweep(landing, {}, [], HOUR, now=later)
    # the replaced session went (SeaweedFS may still list its empty prefix: no objects)
    assert not landing.store.exists(*chunks[:-1], "old") and landing.store.exists(*chunks)
    _sessions_checkpoint(landing, dataclasses.replace(session, state=SessionState.DONE,
                                                      committed=[0, 1, 3]))
    sweep(landing, {}, [], HOUR, now=later)
    assert not landing.store.exists(*chunks[:-1])
    assert protocol.read_request(landing, "shop", "items") is not None  # the request stays
