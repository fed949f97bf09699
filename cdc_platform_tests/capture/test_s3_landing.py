"""The engine's landing zone (``LandingZone``) on S3 (a real SeaweedFS) and locally, through the
same code: its writes, the single writer (flock locally, a lease on S3), the checkpoint's
compare-and-swap that fences a stale engine, prepared XA files kept beside the checkpoint, the
start check of a wrong bucket, and an engine streaming from MariaDB into an s3:// zone read back
by ``LandingReader``."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc_platform.capture.ddl.stale import StaleTable
from cdc_platform.capture.ddl.stale_markers import read_markers, record_history, withdraw_history
from cdc_platform.capture.landing.fencing import (
    ENGINE_LEASE_FILE,
    EngineLockedError,
    LandingZoneTakenError,
)
from cdc_platform.capture.landing.retention import SWEEP_LEASE_FILE, sweep
from cdc_platform.capture.landing.zone import (
    CHECKPOINT_FILE,
    XA_DIR,
    Checkpoint,
    LandingReader,
    LandingZone,
    column_renames_name,
    column_renames_parts,
)
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.store import open_store
from cdc_platform.capture.store.lease import Lease
from cdc_platform.capture.store.s3store import ObjectStoreError
from cdc_platform_tests import s3_fixtures
from cdc_platform_tests.s3_fixtures import s3_options

seaweedfs, s3_env, s3_url = s3_fixtures.seaweedfs, s3_fixtures.s3_env, s3_fixtures.s3_url

pytestmark = pytest.mark.integration


def _zone(request: pytest.FixtureRequest, kind: str, tmp_path: Path, **kwargs) -> LandingZone:
    if kind == "local":
        return LandingZone(str(tmp_path / "landing"), "demo", **kwargs)
    server = request.getfixturevalue("seaweedfs")
    url = request.getfixturevalue("s3_url")
    return LandingZone(url, "demo", s3=s3_options(server), scratch=tmp_path / "scratch",
                       **kwargs)


@pytest.fixture(params=["local", "s3"])
def zone(request: pytest.FixtureRequest, tmp_path: Path) -> LandingZone:
    return _zone(request, request.param, tmp_path)


@pytest.fixture
def s3_zone_url(seaweedfs, s3_url) -> str:
    return s3_url


def _s3_zone(seaweedfs, url: str, scratch: Path, **kwargs) -> LandingZone:
    return LandingZone(url, "demo", s3=s3_options(seaweedfs), scratch=scratch, **kwargs)


def _schema() -> TableSchema:
    return TableSchema("shop", "orders", (ColumnSpec("id", "int"), ColumnSpec("note", "string")),
                       ("id",))


def _records(first: int, count: int) -> pa.Table:
    return pa.table({"__cdc_pos": pa.array(range(first, first + count), pa.int64()),
                     "__cdc_op": ["c"] * count,
                     "id": pa.array(range(count), pa.int64()),
                     "note": [f"n{i}" for i in range(count)]})


# ---- the zone's writes, on both stores ----------------------------------------------------------


def test_segments_checkpoint_tables_and_uncommitted_files(zone: LandingZone):
    schema = _schema()
    with zone.engine_lock():
        written = [zone.write_segment(schema, _records(1, 3), 1, 3),
                   zone.write_segment(schema, _records(4, 2), 4, 5)]
        zone.sync_dirs(written)
        zone.write_tables({schema.table_id: schema})
        zone.write_checkpoint(Checkpoint("demo", "mariadb", gtid="0-1-5", next_pos=4))
        # a flush past the checkpoint (a crash's left-overs) and a rename record past it
        zone.store.write_atomically(*column_renames_parts("shop", "orders"),
                                    column_renames_name(5), data=b"{}")
        zone.store.write_atomically(*column_renames_parts("shop", "orders"),
                                    column_renames_name(3), data=b"{}")

    reader = zone
    assert reader.read_checkpoint() == Checkpoint("demo", "mariadb", gtid="0-1-5", next_pos=4)
    assert reader.read_tables() == {schema.table_id: schema}
    assert [(f, last) for f, last, _ in zone.segment_names("shop", "orders")] == [(1, 3), (4, 5)]
    fs, path = zone.store.arrow("changelog", "shop", "orders", "00000000000000000001-"
                                "00000000000000000003.parquet")
    assert pq.read_table(path, filesystem=fs).column("note").to_pylist() == ["n0", "n1", "n2"]

    removed = zone.remove_uncommitted(4)
    assert len(removed) == 2
    assert [(f, last) for f, last, _ in zone.segment_names("shop", "orders")] == [(1, 3)]
    assert [p for p, _ in zone.column_renames_names("shop", "orders")] == [3]
    if zone.is_local:
        assert isinstance(written[0], Path) and written[0].is_file()
        assert zone.segments("shop", "orders")[0][2] == written[0]
    else:
        assert written[0] == zone.store.uri_of(
            "changelog", "shop", "orders", "00000000000000000001-00000000000000000003.parquet")
        assert zone.root == zone.spill_dir.parent  # (local scratch)


def test_list_files_gives_sizes_and_times_of_files_only(zone: LandingZone):
    before = time.time() - 5
    zone.store.write_atomically("d", "b.json", data=b"12345")
    zone.store.write_atomically("d", "a.json", data=b"1")
    zone.store.write_atomically("d", "sub", "c.json", data=b"123")
    listed = zone.store.list_files("d")
    assert [(f.name, f.size) for f in listed] == [("a.json", 1), ("b.json", 5)]
    assert all(before <= f.mtime <= time.time() + 5 for f in listed)
    assert zone.store.list_files("nothing") == []


def test_stale_markers_on_both_stores(zone: LandingZone):
    table = StaleTable("shop", "orders", "a first start")
    [marker] = record_history(zone, "INITIAL", [table], "0-1-1", 1, since="0-1-1")
    assert record_history(zone, "INITIAL", [table], "0-1-1", 1, since="0-1-1") == []
    assert read_markers(zone) == [marker]
    assert withdraw_history(zone, marker.table_id) == [marker]
    assert read_markers(zone) == []


def test_retention_deletes_consumed_segments_on_both_stores(zone: LandingZone):
    schema = _schema()
    for first in (1, 3, 5):
        zone.write_segment(schema, _records(first, 2), first, first + 1)
    zone.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=7))
    report = sweep(zone, {"shop.orders": 4}, (), 0, now=time.time() + 60)
    assert not report.skipped and not report.errors
    assert [(f, last) for f, last, _ in zone.segment_names("shop", "orders")] == [(5, 6)]
    assert report.deleted_files["segments"] == 2
    assert report.kept_files["segments"] == 1


def test_retention_compacts_small_consumed_segments_on_both_stores(zone: LandingZone):
    """Small consumed segments are rewritten as one through the store (read with its pyarrow
    filesystem, written with one PUT on S3), every record once and in order, the inputs gone."""
    from cdc_platform.capture.landing.retention import COMPACTION_WINDOW_SECONDS
    from cdc_platform.capture.landing.zone import changelog_parts, segment_name

    def records() -> list[dict]:
        out = []
        for first, last, _ in zone.segment_names("shop", "orders"):
            filesystem, path = zone.store.arrow(*changelog_parts("shop", "orders"),
                                                segment_name(first, last))
            out += pq.read_table(path, filesystem=filesystem).to_pylist()
        return out

    schema = _schema()
    for first in range(1, 13, 2):
        zone.write_segment(schema, _records(first, 2), first, first + 1)
    zone.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=13))
    before = records()
    later = time.time() + 3 * COMPACTION_WINDOW_SECONDS  # (their window has closed)
    report = sweep(zone, {"shop.orders": 12}, (), 10 * 3600, now=later)
    assert not report.errors, report.errors
    ranges = [(first, last) for first, last, _ in zone.segment_names("shop", "orders")]
    # (six segments written within a second: one window, or two when it straddled a boundary)
    assert ranges[0][0] == 1 and ranges[-1][1] == 12 and len(ranges) <= 2, ranges
    assert report.compacted_segments >= 5 and report.compacted_bytes_out > 0
    assert records() == before  # every record, once, in order
    again = sweep(zone, {"shop.orders": 12}, (), 10 * 3600, now=later)
    assert again.compacted_segments == 0 and records() == before


def test_one_retention_sweep_at_a_time_on_object_storage(request, tmp_path):
    zone = _zone(request, "s3", tmp_path)
    zone.write_segment(_schema(), _records(1, 2), 1, 2)
    zone.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=3))
    other = Lease(zone.store, SWEEP_LEASE_FILE)
    assert other.acquire("another sweeper", 60)
    assert "another sweep" in sweep(zone, {"shop.orders": 2}, (), 0).skipped
    other.release()
    assert not sweep(zone, {"shop.orders": 2}, (), 0).skipped


# ---- one engine per zone, and fencing -----------------------------------------------------------


def test_a_second_engine_is_refused_on_an_s3_zone(seaweedfs, s3_zone_url, tmp_path):
    # (a short ttl: the second engine waits until it sees the first renew, a third of it)
    first = _s3_zone(seaweedfs, s3_zone_url, tmp_path / "a", lease_ttl_seconds=3.0)
    second = _s3_zone(seaweedfs, s3_zone_url, tmp_path / "b", lease_ttl_seconds=3.0)
    with first.engine_lock():
        assert first.store.exists(ENGINE_LEASE_FILE)
        refused = r"another capture engine is already streaming 'demo' into s3a://.*pid"
        with pytest.raises(EngineLockedError, match=refused), second.engine_lock():
            pass
    with second.engine_lock():  # released on exit: taken at once
        second.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=2))
    assert first.read_checkpoint().next_pos == 2


def test_the_lease_is_renewed_while_the_engine_runs(seaweedfs, s3_zone_url, tmp_path):
    zone = _s3_zone(seaweedfs, s3_zone_url, tmp_path / "a", lease_ttl_seconds=1.5)
    other = _s3_zone(seaweedfs, s3_zone_url, tmp_path / "b", lease_ttl_seconds=1.5)
    with zone.engine_lock():
        time.sleep(3.5)  # more than two ttls: only renewals keep it
        with pytest.raises(EngineLockedError), other.engine_lock():
            pass
        zone.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=7))
    assert other.read_checkpoint().next_pos == 7


def test_a_frozen_engine_whose_lease_expired_cannot_commit(seaweedfs, s3_zone_url, tmp_path,
                                                            monkeypatch):
    stale = _s3_zone(seaweedfs, s3_zone_url, tmp_path / "a", lease_ttl_seconds=1.0)
    fresh = _s3_zone(seaweedfs, s3_zone_url, tmp_path / "b", lease_ttl_seconds=30.0)
    # the stale engine is frozen: its renewer never runs
    monkeypatch.setattr(stale, "_renew_lease", lambda lease, stop: None)
    with stale.engine_lock():
        stale.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=2))
        time.sleep(1.3)
        with fresh.engine_lock():  # takes the expired lease over
            fresh.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=5))
            with pytest.raises(LandingZoneTakenError, match="another engine took over"):
                stale.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=3))
            with pytest.raises(LandingZoneTakenError):
                stale.write_segment(_schema(), _records(3, 1), 3, 3)
            fresh.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=6))
    assert fresh.read_checkpoint().next_pos == 6


def test_a_lost_checkpoint_swap_stops_the_writer(seaweedfs, s3_zone_url, tmp_path):
    """Even while its lease looks live to it, an engine whose checkpoint another replaced (a
    lease that expired under it, clocks apart) cannot commit: the swap names the cause."""
    zone = _s3_zone(seaweedfs, s3_zone_url, tmp_path / "a")
    with zone.engine_lock():
        zone.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=2))
        intruder = Checkpoint("other", "mariadb", next_pos=9)
        zone.store.write_atomically(CHECKPOINT_FILE, data=intruder.to_json())
        with pytest.raises(LandingZoneTakenError, match="another engine took over the landing "
                                                        "zone"):
            zone.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=3))
        with pytest.raises(LandingZoneTakenError):  # and stays stopped
            zone.write_tables({})
    assert zone.read_checkpoint() == intruder


def test_a_checkpoint_written_meanwhile_is_not_overwritten_by_a_new_engine_start(
        seaweedfs, s3_zone_url, tmp_path):
    """The swap starts from the checkpoint read when the lock was taken (none: create)."""
    zone = _s3_zone(seaweedfs, s3_zone_url, tmp_path / "a")
    with zone.engine_lock():
        zone.store.write_atomically(CHECKPOINT_FILE,
                                    data=Checkpoint("x", "mariadb", next_pos=4).to_json())
        with pytest.raises(LandingZoneTakenError):
            zone.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=2))


def test_a_missing_bucket_is_one_line_naming_the_setting(seaweedfs, s3_env, tmp_path):
    from cdc_platform.capture.start_errors import describe_start_error

    zone = LandingZone("s3://no-such-bucket-here/landing", "demo", s3=s3_options(seaweedfs),
                       scratch=tmp_path)
    with pytest.raises(ObjectStoreError) as refused, zone.engine_lock():
        pass
    line = describe_start_error(refused.value)
    assert line is not None and "\n" not in line and line.startswith("landing_zone.url ")
    with pytest.raises(ObjectStoreError, match=r"^landing_zone.url s3://no-such-bucket-here/"
                                               r"landing/demo: bucket 'no-such-bucket-here' "
                                               r"does not exist"), zone.engine_lock():
        pass


# ---- prepared XA transactions' spill files -------------------------------------------------------


def test_spill_files_a_checkpoint_names_follow_it_to_the_store(seaweedfs, s3_zone_url,
                                                                 tmp_path):
    zone = _s3_zone(seaweedfs, s3_zone_url, tmp_path / "a")
    xa = {"xa_prepared": {"1:61:": {"gtid": "0-1-3",
                                    "parts": [{"file": "p-00000000.arrow", "count": 2}]}}}
    with zone.engine_lock():
        zone.spill_dir.mkdir(parents=True)
        (zone.spill_dir / "p-00000000.arrow").write_bytes(b"records")
        zone.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=2, extra=xa))
        assert zone.store.read_bytes(XA_DIR, "p-00000000.arrow") == b"records"

    # another pod (empty scratch) takes over: the file is there before the engine restores it
    other = _s3_zone(seaweedfs, s3_zone_url, tmp_path / "b")
    zone.store.write_atomically(XA_DIR, "orphan.arrow", data=b"x")
    with other.engine_lock():
        assert (other.spill_dir / "p-00000000.arrow").read_bytes() == b"records"
        assert other.store.list_names(XA_DIR) == ["p-00000000.arrow"]
        other.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=3))  # committed
        assert other.store.list_names(XA_DIR) == []


# ---- the engine streaming into an s3:// landing zone -------------------------------------------


def test_the_engine_streams_into_an_s3_landing_zone(cdc_env, seaweedfs, s3_zone_url, tmp_path):
    from cdc_platform.capture.engine import CaptureEngine
    from cdc_platform.capture.engine_options import EngineOptions

    env = cdc_env
    env.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20))")
    env.execute("INSERT INTO items VALUES (1, 'one'), (2, 'two')")
    env.execute("UPDATE items SET name = 'TWO' WHERE id = 2", "DELETE FROM items WHERE id = 1")

    def engine(scratch: Path) -> CaptureEngine:
        landing = LandingZone(s3_zone_url, env.server_name, s3=s3_options(seaweedfs),
                              scratch=scratch, lease_ttl_seconds=3.0)
        return CaptureEngine(EngineOptions.from_settings(env.settings), landing)

    stats = engine(tmp_path / "pod-a").run(stop_when_caught_up=True)
    assert stats.state == "stopped"
    env.execute("INSERT INTO items VALUES (3, 'three')")
    engine(tmp_path / "pod-b").run(stop_when_caught_up=True)  # a new pod resumes

    reader = LandingReader(open_store(s3_zone_url, s3=s3_options(seaweedfs)), env.server_name)
    checkpoint = reader.read_checkpoint()
    assert checkpoint is not None and checkpoint.server_name == env.server_name
    records = []
    for first, _, name in reader.segment_names(env.db, "items"):
        fs, path = reader.store.arrow("changelog", env.db, "items", name)
        table = pq.read_table(path, filesystem=fs)
        records += [(r["__cdc_op"], r["id"], r["name"]) for r in table.to_pylist()
                    if r["__cdc_pos"] < checkpoint.next_pos]
        assert first < checkpoint.next_pos
    assert records == [("c", 1, "one"), ("c", 2, "two"), ("u", 2, "TWO"), ("d", 1, None),
                       ("c", 3, "three")]
    assert env.db in {t.split(".")[0] for t in reader.read_tables()}
    assert not reader.store.exists(ENGINE_LEASE_FILE) or (
        reader.store.read_bytes(ENGINE_LEASE_FILE) or b"").find(b'"expires_at": 0.0') >= 0


def _landed(reader: LandingReader, database: str, table: str) -> list[tuple[object, ...]]:
    checkpoint = reader.read_checkpoint()
    assert checkpoint is not None
    rows = []
    for _, _, name in reader.segment_names(database, table):
        fs, path = reader.store.arrow("changelog", database, table, name)
        rows += [(r["__cdc_op"], r["id"], r["v"]) for r in
                 pq.read_table(path, filesystem=fs).to_pylist()
                 if r["__cdc_pos"] < checkpoint.next_pos]
    return rows


def test_a_prepared_xa_transaction_lands_after_the_engine_moved_to_a_new_pod(
        cdc_env, seaweedfs, s3_zone_url, tmp_path):
    """Its records are in a spill file the checkpoint names: on S3 the file goes with the
    checkpoint, so an engine on another machine (no scratch of its own) lands it at XA
    COMMIT."""
    from cdc_platform.capture.engine import CaptureEngine
    from cdc_platform.capture.engine_options import EngineOptions

    env = cdc_env
    env.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")
    with env.mariadb.root_connect(database=env.db) as conn, conn.cursor() as cur:
        cur.execute("XA START 'long'")
        cur.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
        cur.execute("XA END 'long'")
        cur.execute("XA PREPARE 'long'")
    env.execute("INSERT INTO t VALUES (3, 'c')")

    def run(scratch: Path) -> None:
        landing = LandingZone(s3_zone_url, env.server_name, s3=s3_options(seaweedfs),
                              scratch=scratch)
        CaptureEngine(EngineOptions.from_settings(env.settings), landing).run(
            stop_when_caught_up=True)

    run(tmp_path / "pod-a")
    reader = LandingReader(open_store(s3_zone_url, s3=s3_options(seaweedfs)), env.server_name)
    assert _landed(reader, env.db, "t") == [("c", 3, "c")]
    assert "xa_prepared" in reader.read_checkpoint().extra
    assert len(reader.store.list_names(XA_DIR)) == 1
    env.mariadb.query("XA COMMIT 'long'")
    run(tmp_path / "pod-b")  # another machine: its scratch has no spill file
    assert _landed(reader, env.db, "t") == [("c", 3, "c"), ("c", 1, "a"), ("c", 2, "b")]
    assert "xa_prepared" not in reader.read_checkpoint().extra
    assert reader.store.list_names(XA_DIR) == []


def test_a_second_engine_on_the_same_s3_zone_is_refused_in_one_line(
        cdc_env, seaweedfs, s3_zone_url, tmp_path):
    import threading

    from cdc_platform.capture.engine import CaptureEngine
    from cdc_platform.capture.engine_options import EngineOptions
    from cdc_platform.capture.start_errors import describe_start_error

    env = cdc_env
    env.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")

    def engine(scratch: Path) -> CaptureEngine:
        landing = LandingZone(s3_zone_url, env.server_name, s3=s3_options(seaweedfs),
                              scratch=scratch, lease_ttl_seconds=3.0)
        return CaptureEngine(EngineOptions.from_settings(env.settings), landing)

    first, stop = engine(tmp_path / "pod-a"), threading.Event()
    running = threading.Thread(target=first.run, kwargs={"stop": stop})
    running.start()
    try:
        deadline = time.monotonic() + 30
        while first.state.value not in ("streaming", "failed") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.state.value == "streaming"
        with pytest.raises(EngineLockedError) as refused:
            engine(tmp_path / "pod-b").run(stop_when_caught_up=True)
        line = describe_start_error(refused.value)
        assert line is not None and "\n" not in line
        assert f"another capture engine is already streaming {env.server_name!r}" in line
    finally:
        stop.set()
        running.join(30)
    assert first.state.value == "stopped"
    engine(tmp_path / "pod-b").run(stop_when_caught_up=True)  # the lease was released
