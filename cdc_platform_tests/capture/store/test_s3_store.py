"""The file layer on S3 (capture.store.s3store) against a real S3 server (SeaweedFS), and the same
contract on the local store: every operation, exclusive and compare-and-swap writes under
races, the lease, the start errors of a wrong deployment, and a server restart mid-use."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc_platform.capture.store import open_store
from cdc_platform.capture.store.lease import Lease, LeaseRecord
from cdc_platform.capture.store.s3store import ObjectStoreError, S3FileStore
from cdc_platform.capture.store.storage import FileStore, LocalFileStore
from cdc_platform.config import S3Settings
from cdc_platform.devservices.seaweedfs import SeaweedFS
from cdc_platform_tests import s3_fixtures
from cdc_platform_tests.s3_fixtures import s3_options

# the shared fixtures this module uses (assigned, so that pytest finds them here)
seaweedfs, s3_env, s3_url = s3_fixtures.seaweedfs, s3_fixtures.s3_env, s3_fixtures.s3_url

pytestmark = pytest.mark.integration


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> FileStore:
    """The same contract on both stores."""
    if request.param == "local":
        return open_store(str(tmp_path / "landing"))
    server = request.getfixturevalue("seaweedfs")
    url = request.getfixturevalue("s3_url")
    return open_store(url, s3=s3_options(server), setting="landing_zone.url")


def _race(count: int, attempt: Callable[[int], bool]) -> list[bool]:
    """``attempt(i)`` from ``count`` threads released at once."""
    barrier = threading.Barrier(count)

    def run(i: int) -> bool:
        barrier.wait()
        return attempt(i)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count)))


# ---- the FileStore contract, on both stores ---------------------------------------------------


def test_reads_writes_lists_and_deletes(store: FileStore):
    assert store.read_bytes("a", "one.json") is None
    assert store.list_names("a") == [] and not store.exists("a")
    store.write_atomically("a", "one.json", data=b"1")
    store.write_atomically("a", "one.json", data=b"one")  # replaces
    store.write_atomically("a", "two.json", data=memoryview(b"2"), durable=False)
    store.write_atomically("a", "sub", "deep.json", data=b"3")
    assert store.read_bytes("a", "one.json") == b"one"
    assert store.list_names("a") == ["one.json", "sub", "two.json"]  # files and directories
    assert store.list_names("a", "sub") == ["deep.json"]
    assert store.list_names() == ["a"]
    assert store.exists("a") and store.exists("a", "sub") and store.exists("a", "two.json")
    assert not store.exists("a", "on") and store.list_names("a", "on") == []  # not a prefix
    store.delete("a", "two.json")
    store.delete("a", "two.json")  # (absent: nothing)
    assert store.list_names("a") == ["one.json", "sub"] and not store.exists("a", "two.json")
    child = store.child("a")
    assert child.read_bytes("one.json") == b"one"
    assert child.uri == store.uri_of("a") and child.uri_of("sub") == store.uri_of("a", "sub")


def test_exclusive_write_is_refused_when_the_file_exists(store: FileStore):
    assert store.write_exclusively("claims", "c1", data=b"first")
    assert not store.write_exclusively("claims", "c1", data=b"second")
    assert store.read_bytes("claims", "c1") == b"first"


def test_of_16_racing_exclusive_writers_exactly_one_wins(store: FileStore):
    results = _race(16, lambda i: store.write_exclusively("lock", data=f"writer {i}".encode()))
    assert sorted(results) == [False] * 15 + [True]
    assert store.read_bytes("lock") == f"writer {results.index(True)}".encode()
    assert store.list_names() == ["lock"]


def test_compare_and_swap_replaces_only_the_version_read(store: FileStore):
    assert store.read_versioned("state.json") is None
    assert not store.write_if_match("state.json", data=b"x", etag='"nothing"')
    assert store.read_bytes("state.json") is None
    store.write_atomically("state.json", data=b"v1")
    data, v1 = store.read_versioned("state.json")
    assert data == b"v1"
    assert store.write_if_match("state.json", data=b"v2", etag=v1)
    assert not store.write_if_match("state.json", data=b"v3", etag=v1)  # stale version
    data, v2 = store.read_versioned("state.json")
    assert data == b"v2" and v2 != v1
    results = _race(16, lambda i: store.write_if_match("state.json", data=f"w{i}".encode(),
                                                       etag=v2))
    assert sorted(results) == [False] * 15 + [True]
    assert store.read_bytes("state.json") == f"w{results.index(True)}".encode()


def test_atomic_output_appears_whole_or_not_at_all(store: FileStore):
    table = pa.table({"v": list(range(1000)), "s": [f"row {i}" for i in range(1000)]})
    with store.atomic_output("seg", "t.parquet") as sink:
        pq.write_table(table, sink)
    fs, path = store.arrow("seg", "t.parquet")
    assert pq.read_table(path, filesystem=fs).equals(table)
    with pytest.raises(RuntimeError), store.atomic_output("seg", "broken.parquet") as sink:
        sink.write(b"PAR1")
        raise RuntimeError("writer failed half-way")
    assert store.list_names("seg") == ["t.parquet"]


# ---- the lease, on both stores -----------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_of_racing_acquirers_exactly_one_holds_the_lease(store: FileStore):
    leases = [Lease(store, "engine.lease") for _ in range(16)]
    results = _race(16, lambda i: leases[i].acquire(f"pod-{i}", ttl_seconds=60))
    assert sorted(results) == [False] * 15 + [True]
    winner = results.index(True)
    assert leases[winner].held and leases[winner].holder == f"pod-{winner}"
    assert store.read_versioned("engine.lease") is not None
    assert Lease(store, "engine.lease").current().holder == f"pod-{winner}"


def test_a_live_lease_is_refused_an_expired_one_taken_over(store: FileStore):
    clock = _Clock()
    first, second = Lease(store, "l", clock=clock), Lease(store, "l", clock=clock)
    assert first.acquire("a", ttl_seconds=30)
    assert not second.acquire("b", ttl_seconds=30)
    assert not second.acquire("a", ttl_seconds=30)  # the same name in another process: refused
    clock.now += 20
    assert first.renew()  # the holder extends it: now until +50
    clock.now += 25
    assert not second.acquire("b", ttl_seconds=30)
    clock.now += 10  # expired
    racers = [Lease(store, "l", clock=clock) for _ in range(8)]
    results = _race(8, lambda i: racers[i].acquire(f"b{i}", ttl_seconds=30))
    assert sorted(results) == [False] * 7 + [True]  # one of the racers takes it over
    assert not first.renew() and not first.held  # the old holder lost it
    first.release()  # (changes nothing: not its lease any more)
    assert Lease(store, "l").current().holder == f"b{results.index(True)}"


def test_release_frees_the_lease_at_once_and_only_the_holder_renews(store: FileStore):
    holder, other = Lease(store, "l"), Lease(store, "l")
    assert not other.renew()  # never acquired
    with holder:
        assert holder.acquire("a", ttl_seconds=600)
        assert not other.acquire("b", ttl_seconds=600)
    assert not holder.held and holder.current().expires_at == 0
    assert other.acquire("b", ttl_seconds=600) and other.held
    assert not holder.renew()


def test_a_lease_nobody_renews_is_waited_out_and_taken_over(store: FileStore, caplog):
    """A holder killed with kill -9 never releases its lease: an acquirer that may wait takes
    it over when it expires (a restarted engine gets going by itself), and says so."""
    dead = Lease(store, "l")
    assert dead.acquire("dead pod", ttl_seconds=5.0)
    expires_at = dead.current().expires_at
    successor = Lease(store, "l")
    assert not successor.acquire("new pod", ttl_seconds=5.0)  # (no wait: refused at once)
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="cdc_platform.capture.store.lease"):
        assert successor.acquire("new pod", ttl_seconds=5.0, wait_seconds=10)
    # taken only once the dead holder's lease expired (not before), and soon after
    assert time.time() >= expires_at and time.monotonic() - started < 15
    assert successor.held and successor.current().holder == "new pod"
    assert "for the lease of dead pod to expire" in caplog.text
    assert not dead.renew()  # the dead holder's version is gone


def test_a_waiting_acquirer_is_refused_when_the_holder_renews(store: FileStore):
    """Never two holders: a renewal seen while waiting ends the wait with a refusal, well
    before the wait's bound."""
    live = Lease(store, "l")
    assert live.acquire("live pod", ttl_seconds=1.5)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(0.5):
            live.renew()

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        started = time.monotonic()
        assert not Lease(store, "l").acquire("second pod", ttl_seconds=1.5, wait_seconds=30)
        assert time.monotonic() - started < 10
        assert live.held and live.current().holder == "live pod"
    finally:
        stop.set()
        renewer.join()
    # released while another waits: taken at once, not at the expiry
    assert live.acquire("live pod", ttl_seconds=30)
    release = threading.Timer(0.3, live.release)
    release.start()
    started = time.monotonic()
    assert Lease(store, "l").acquire("third pod", ttl_seconds=1.5, wait_seconds=60)
    assert time.monotonic() - started < 10
    release.join()


def test_a_lease_that_outlives_the_wait_is_refused_without_waiting(store: FileStore):
    assert Lease(store, "l").acquire("a", ttl_seconds=60)
    started = time.monotonic()
    assert not Lease(store, "l").acquire("b", ttl_seconds=60, wait_seconds=5)
    assert time.monotonic() - started < 3


def test_a_lease_whose_holder_process_is_gone_is_taken_over_at_once(store: FileStore):
    """A holder of this host killed with kill -9: its process is gone, so its lease is free
    before it expires (a restarted engine or reader on the same machine goes on at once). A
    live process's lease, another host's, another pid namespace's are not."""
    import os
    import socket
    import subprocess
    import sys

    from cdc_platform.capture.store.lease import holder_gone, process_holder

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # (gone: its pid is free)
    mine = process_holder()
    assert mine.startswith(f"{socket.gethostname()} pid {os.getpid()} ns ")
    gone = mine.replace(f" pid {os.getpid()} ", f" pid {child.pid} ")
    far = time.time() + 600

    def held_by(holder: str) -> LeaseRecord:
        record = LeaseRecord(holder, uuid.uuid4().hex, far)
        store.write_atomically("l", data=record.to_json())
        return record

    assert holder_gone(held_by(gone))
    assert Lease(store, "l").acquire("successor", ttl_seconds=60)
    for alive in (mine,  # (this process: another Lease object of it)
                  mine.replace(f" pid {os.getpid()} ", f" pid {os.getppid()} "),
                  gone.replace(socket.gethostname(), "another-host", 1),
                  gone.rsplit(" ns ", 1)[0] + " ns pid:[1]",
                  gone.rsplit(" ns ", 1)[0], "dead pod"):
        assert not holder_gone(held_by(alive)), alive
        assert not Lease(store, "l").acquire("successor", ttl_seconds=60), alive


def test_an_unreadable_lease_object_counts_as_expired(store: FileStore):
    store.write_atomically("l", data=b"{torn")
    assert LeaseRecord.parse(b"{torn").expires_at == 0
    assert Lease(store, "l").acquire("a", ttl_seconds=60)


# ---- S3 only -----------------------------------------------------------------------------------


def test_s3_urls_open_an_s3_store_that_spark_and_pyarrow_read(seaweedfs: SeaweedFS, s3_url: str):
    bucket = s3_url.removeprefix("s3://").split("/")[0]
    options = S3Settings(endpoint_url=seaweedfs.endpoint_url, path_style=True)
    store = open_store(s3_url, s3=options)
    assert isinstance(store, S3FileStore) and store.local_root is None
    assert store.uri == f"s3a://{bucket}/landing"
    assert store.child("demo").uri_of("x.json") == f"s3a://{bucket}/landing/demo/x.json"
    assert open_store(f"s3a://{bucket}/landing/", s3=options).uri == store.uri
    store.check()
    store.write_atomically("demo", "x.json", data=b"{}")
    assert seaweedfs.client().get_object(Bucket=bucket, Key="landing/demo/x.json")[
        "Body"].read() == b"{}"
    fs, path = store.arrow("demo", "x.json")
    assert path == f"{bucket}/landing/demo/x.json"
    with fs.open_input_stream(path) as stream:
        assert stream.read() == b"{}"


def test_a_missing_bucket_is_one_line_naming_the_setting(seaweedfs: SeaweedFS,
                                                         s3_env: dict[str, str]):
    store = open_store("s3://no-such-bucket-here/landing", s3=s3_options(seaweedfs),
                       setting="landing_zone.url")
    with pytest.raises(ObjectStoreError) as raised:
        store.check()
    line = str(raised.value)
    assert line == ("landing_zone.url s3://no-such-bucket-here/landing: bucket "
                    "'no-such-bucket-here' does not exist; create it or fix the URL")
    with pytest.raises(ObjectStoreError, match="does not exist"):
        store.write_atomically("x", data=b"1")


def test_wrong_credentials_are_one_line_naming_the_setting_not_the_secret(
        seaweedfs: SeaweedFS, s3_url: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-at-all")
    store = open_store(s3_url, s3=s3_options(seaweedfs), setting="warehouse.url")
    with pytest.raises(ObjectStoreError) as raised:
        store.check()
    line = str(raised.value)
    assert "\n" not in line and "not-the-secret" not in line
    assert line.startswith(f"warehouse.url {s3_url}: access denied")
    assert "with the AWS credentials from the environment (AWS_ACCESS_KEY_ID cdc-" in line
    with pytest.raises(ObjectStoreError, match="access denied"):
        store.read_bytes("x")


def test_no_credentials_at_all_is_one_line(seaweedfs: SeaweedFS, s3_url: str,
                                           monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ObjectStoreError, match=r"^landing_zone.url s3://.*: no AWS credentials"):
        open_store(s3_url, s3=s3_options(seaweedfs), setting="landing_zone.url").check()


def test_the_store_keeps_working_across_a_server_restart(tmp_path: Path, s3_env: dict[str, str]):
    """Requests made while the server is down are retried with backoff until it is back."""
    with SeaweedFS(tmp_path / "weed") as server:
        server.create_bucket("restarts")
        store = open_store("s3://restarts/zone", s3=s3_options(server, max_attempts=12))
        store.write_atomically("before", data=b"1")
        restarted = threading.Thread(target=server.restart)
        restarted.start()
        written = 0
        deadline = time.monotonic() + 60
        while restarted.is_alive() and time.monotonic() < deadline:
            store.write_atomically("during", f"{written}", data=b"x")
            written += 1
        restarted.join()
        server.stop()  # down: the next request waits (retries) until the server is back
        back = threading.Timer(1.5, server.start)
        back.start()
        started = time.monotonic()
        store.write_atomically("while-down", data=b"w")
        assert time.monotonic() - started > 1.0
        back.join()
        assert store.read_bytes("while-down") == b"w"
        assert store.read_bytes("before") == b"1"
        assert store.write_exclusively("after", data=b"2")
        assert not store.write_exclusively("after", data=b"3")
        assert len(store.list_names("during")) == written
        lease = Lease(store, "lease")
        assert lease.acquire(f"pod-{uuid.uuid4().hex[:6]}", ttl_seconds=60)


def test_local_and_s3_compare_and_swap_share_one_api(tmp_path: Path):
    """(the local version token is a content hash, quoted like an ETag)"""
    local = LocalFileStore(tmp_path)
    local.write_atomically("f", data=b"abc")
    assert local.read_versioned("f") == (b"abc", '"900150983cd24fb0d6963f7d28e17f72"')


def test_the_store_resolves_its_region_and_endpoint_as_every_s3_client_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One resolution (``S3Settings.resolved``): the config, then AWS_REGION /
    AWS_DEFAULT_REGION, then boto3's profile, then us-east-1; the endpoint from the config or
    AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL. (The store once skipped AWS_REGION, which the
    lake's clients honoured: the two could sign for different regions.)"""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                 "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "aws-config"
    config.write_text("[default]\nregion = ap-south-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))

    def connection(**settings: Any) -> Any:
        return S3FileStore("bucket", "", S3Settings(**settings))._connection

    assert connection().region == "ap-south-1"  # (the profile's)
    monkeypatch.setenv("AWS_REGION", "eu-north-1")
    assert connection().region == "eu-north-1"
    assert connection(region="us-west-2").region == "us-west-2"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://seaweed:8333/")
    assert connection().resolved.endpoint_url == "http://seaweed:8333"
    assert connection(endpoint_url="http://minio:9000").resolved.endpoint_url == \
        "http://minio:9000"
