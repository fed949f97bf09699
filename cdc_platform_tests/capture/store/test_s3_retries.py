"""S3FileStore's answers to a throttled, conflicted, forgetful or absent server, on moto's
in-process S3: 503 SlowDown is retried with backoff (botocore's retry loop first, then the
store's own until ``s3.retry_seconds``), refused connections for longer than botocore's attempts
are ridden out, 409 ConditionalRequestConflict is repeated, a conditional put whose first attempt
landed although its answer was lost is recognised as this write's, a lease renewal stops
retrying before the lease expires, and the engine's writes under its lease (a store ``within``
the lease's expiry) are never sent after it, nor its successor's before its writes ended."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError, EndpointConnectionError
from moto.server import ThreadedMotoServer

from cdc_platform.capture.start_errors import describe_start_error
from cdc_platform.capture.store.lease import Lease
from cdc_platform.capture.store.s3store import ObjectStoreUnavailableError, S3FileStore
from cdc_platform.config import S3Settings
from cdc_platform.devservices.ports import free_port


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, **_: object) -> Iterator[bytes]:
        yield self.data


def _error(request: object, status: int, code: str) -> AWSResponse:
    body = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
            f"<Message>{code} (injected)</Message></Error>").encode()
    return AWSResponse(getattr(request, "url", ""), status, {"Content-Type": "application/xml"},
                       _Body(body))


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def store(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch,
          request: pytest.FixtureRequest) -> S3FileStore:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/dev/null",
                        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    bucket = f"retries-{request.node.name.replace('_', '-')[:40].lower()}"
    options = S3Settings(endpoint_url=moto_endpoint, region="us-east-1", path_style=True,
                         max_attempts=getattr(request, "param", 5))
    store = S3FileStore(bucket, "zone", options, setting="landing_zone.url")
    store.client.create_bucket(Bucket=bucket)
    return store


def _inject(store: S3FileStore, operation: str, answers: list[tuple[int, str]],
            before: object = None) -> list[int]:
    """The next requests of ``operation`` get ``answers`` instead of reaching the server (after
    ``before()``, if given); returns the list of attempts seen, growing."""
    attempts: list[int] = []

    def handler(request: object, **_: object) -> AWSResponse | None:
        attempts.append(1)
        if len(attempts) <= len(answers):
            if callable(before):
                before()
            status, code = answers[len(attempts) - 1]
            return _error(request, status, code)
        return None

    for client in _clients(store):
        client.meta.events.register(f"before-send.s3.{operation}", handler)
    return attempts


def test_slow_down_is_retried_with_backoff_until_it_succeeds(store: S3FileStore):
    attempts = _inject(store, "PutObject", [(503, "SlowDown"), (503, "SlowDown")])
    store.write_atomically("a.json", data=b"1")
    assert len(attempts) == 3
    assert store.read_bytes("a.json") == b"1"


@pytest.mark.parametrize("store", [2], indirect=True)
def test_throttling_beyond_max_attempts_is_retried_by_the_store(store: S3FileStore):
    attempts = _inject(store, "PutObject", [(503, "SlowDown")] * 5)
    store.write_atomically("a.json", data=b"1")
    assert len(attempts) == 6 and store.read_bytes("a.json") == b"1"


@pytest.mark.parametrize("store", [2], indirect=True)
def test_an_error_about_the_request_is_not_retried(store: S3FileStore):
    attempts = _inject(store, "PutObject", [(400, "InvalidRequest")] * 3)
    with pytest.raises(ClientError, match="InvalidRequest"):
        store.write_atomically("a.json", data=b"1")
    assert len(attempts) == 1 and store.read_bytes("a.json") is None


def test_a_conditional_request_conflict_is_repeated(store: S3FileStore):
    attempts = _inject(store, "PutObject", [(409, "ConditionalRequestConflict")])
    assert store.write_exclusively("claim", data=b"mine")
    assert len(attempts) == 2 and store.read_bytes("claim") == b"mine"
    assert not store.write_exclusively("claim", data=b"again")


def test_an_exclusive_put_that_landed_before_its_answer_was_lost_is_ours(store: S3FileStore):
    """The first attempt reaches the server, its answer is lost (a 500), botocore retries, and
    the retry meets 412 because of the first attempt itself."""
    landed = S3FileStore(store.bucket, "zone", store.options)
    _inject(store, "PutObject", [(500, "InternalError")],
            before=lambda: landed.write_atomically("claim", data=b"mine"))
    assert store.write_exclusively("claim", data=b"mine")

    _inject(store, "PutObject", [(500, "InternalError")],
            before=lambda: landed.write_atomically("other", data=b"theirs"))
    assert not store.write_exclusively("other", data=b"mine")
    assert store.read_bytes("other") == b"theirs"


def test_moto_refuses_exclusive_and_stale_conditional_puts_like_s3(store: S3FileStore):
    assert store.write_exclusively("x", data=b"1")
    assert not store.write_exclusively("x", data=b"2")
    _, etag = store.read_versioned("x")
    assert store.write_if_match("x", data=b"3", etag=etag)
    assert not store.write_if_match("x", data=b"4", etag=etag)
    assert store.read_bytes("x") == b"3"


# ---- outages longer than botocore's attempts: the store's own retries -----------------------


def _refuse(request: object, **_: object) -> None:
    raise EndpointConnectionError(endpoint_url=getattr(request, "url", "http://injected"))


def _outage(store: S3FileStore, operation: str, seconds: float,
            before: object = None) -> list[float]:
    """Requests of ``operation`` are refused (a connection error, as from a stopped server)
    for ``seconds`` after the first one (after ``before()``, if given, on the first);
    returns the times of the attempts seen."""
    attempts: list[float] = []

    def handler(request: object, **_: object) -> None:
        attempts.append(time.monotonic())
        if attempts[-1] - attempts[0] < seconds:
            if callable(before) and len(attempts) == 1:
                before()
            _refuse(request)

    for client in _clients(store):
        client.meta.events.register(f"before-send.s3.{operation}", handler)
    return attempts


def _clients(store: S3FileStore) -> tuple[object, ...]:
    """Every client the store sends with: botocore's retries, then its own single attempts
    (bounded ones for a ``within`` deadline)."""
    connection = store._connection
    return connection.client, connection.single_client, connection.bounded_client


@pytest.mark.parametrize("store", [2], indirect=True)
def test_an_outage_beyond_botocores_attempts_is_ridden_out(store: S3FileStore):
    store.write_atomically("a.json", data=b"1")
    attempts = _outage(store, "GetObject", 3.0)
    assert store.read_bytes("a.json") == b"1"
    assert attempts[-1] - attempts[0] >= 3.0 and len(attempts) > 4  # (2 per botocore call)
    _outage(store, "PutObject", 2.0)
    store.write_atomically("b.json", data=b"2")
    _outage(store, "ListObjectsV2", 2.0)
    assert store.list_names() == ["a.json", "b.json"]


@pytest.mark.parametrize("store", [1], indirect=True)
def test_an_outage_beyond_retry_seconds_is_one_line_naming_the_endpoint_and_setting(
        store: S3FileStore):
    store = S3FileStore(store.bucket, "zone", store.options.model_copy(update={"retry_seconds": 2.0}),
                        setting="landing_zone.url")
    _outage(store, "PutObject", 60.0)
    started = time.monotonic()
    with pytest.raises(ObjectStoreUnavailableError) as raised:
        store.write_atomically("a.json", data=b"1")
    assert time.monotonic() - started < 4.0
    line = str(raised.value)
    assert "\n" not in line
    assert line.startswith(f"landing_zone.url s3://{store.bucket}/zone: "
                           f"{store.options.endpoint_url} did not answer PUT 'zone/a.json'")
    assert "s3.retry_seconds" in line
    assert describe_start_error(raised.value) == line


@pytest.mark.parametrize("store", [1], indirect=True)
def test_a_conditional_put_retried_across_an_outage_whose_first_attempt_landed_is_ours(
        store: S3FileStore):
    """The first attempt lands, then the connection is lost before its answer (as when the
    server stops right after storing it); the store's retry meets 412 (exclusive) or a
    changed ETag (If-Match) because of that first attempt: still this write's, never a lost
    race or a false fence. Someone else's object in between is a lost race."""
    landed = S3FileStore(store.bucket, "zone", store.options)
    _outage(store, "PutObject", 1.0, before=lambda: landed.write_atomically("claim", data=b"me"))
    assert store.write_exclusively("claim", data=b"me")

    _, etag = store.read_versioned("claim")
    _outage(store, "PutObject", 1.0,
            before=lambda: landed.write_atomically("claim", data=b"me, renewed"))
    written = store.write_versioned("claim", data=b"me, renewed", etag=etag)
    assert written is not None and written == store.read_versioned("claim")[1]

    _outage(store, "PutObject", 1.0,
            before=lambda: landed.write_atomically("other", data=b"theirs"))
    assert not store.write_exclusively("other", data=b"mine")
    _, etag = store.read_versioned("other")
    _outage(store, "PutObject", 1.0,
            before=lambda: landed.write_atomically("other", data=b"theirs again"))
    assert store.write_versioned("other", data=b"mine", etag=etag) is None
    assert store.read_bytes("other") == b"theirs again"


def test_a_lease_renewal_gives_up_before_the_lease_expires(store: S3FileStore):
    """The server is away for longer than the lease lives: the renewal stops retrying before
    the lease's expiry (loudly), and the holder never believes it holds the lease past it."""
    store = S3FileStore(store.bucket, "zone", store.options.model_copy(update={"retry_seconds": 120.0}))
    lease = Lease(store, "engine.lease")
    ttl = 12.0
    assert lease.acquire("engine-1", ttl)
    expires = time.monotonic() + ttl
    _outage(store, "PutObject", 600.0)
    started = time.monotonic()
    with pytest.raises(ObjectStoreUnavailableError, match="the deadline of a lease write"):
        lease.renew()
    assert time.monotonic() < expires  # (gave up before the expiry, not after 120 s)
    assert time.monotonic() - started > 1.0  # (it did retry)
    while time.monotonic() < expires:
        time.sleep(0.2)
    assert not lease.held


# ---- the engine's writes under its lease: never after the lease's expiry ------------------------


def test_a_store_within_a_passed_deadline_sends_nothing(store: S3FileStore):
    attempts = _outage(store, "PutObject", 0.0)  # (counts the attempts, refuses none)
    with pytest.raises(ObjectStoreUnavailableError, match="not sent: the deadline"):
        store.within(time.monotonic() - 1).write_atomically("a.json", data=b"1")
    with pytest.raises(ObjectStoreUnavailableError, match="not sent: the deadline"):
        store.within(lambda: 0.0).child("x").write_atomically("a.json", data=b"1")
    assert attempts == [] and store.read_bytes("a.json") is None


def test_a_callable_deadline_moved_on_by_a_renewal_rides_an_outage_out(store: S3FileStore):
    """The deadline is asked again before every retry: a renewal during an outage lets the
    write go on past the deadline it began with, a lost lease (0) ends it at once."""
    deadline = [time.monotonic() + 9.0]  # (an attempt needs 7 s before it: one retry at most)
    attempts = _outage(store, "PutObject", 3.0)
    renewal = threading.Timer(0.2, lambda: deadline.__setitem__(0, time.monotonic() + 60))
    renewal.start()
    store.within(lambda: deadline[0]).write_atomically("a.json", data=b"1")
    renewal.join()
    assert store.read_bytes("a.json") == b"1" and attempts[-1] - attempts[0] >= 3.0

    attempts = _outage(store, "PutObject", 60.0)
    lost = threading.Timer(1.0, lambda: deadline.__setitem__(0, 0.0))
    lost.start()
    started = time.monotonic()
    with pytest.raises(ObjectStoreUnavailableError, match="the deadline of a lease write"):
        store.within(lambda: deadline[0]).write_atomically("b.json", data=b"2")
    lost.join()
    assert time.monotonic() - started < 8.0  # (not the 60 s the deadline first allowed)
    assert all(at < started + 1.0 + 0.2 for at in attempts)


def test_a_multipart_upload_within_a_deadline_completes_only_before_it(
        store: S3FileStore, monkeypatch: pytest.MonkeyPatch):
    """Beyond the multipart threshold a bounded store sends each part and the completion as
    requests of their own, each only before the deadline: a deadline passed after the first
    part completes nothing (the object never appears); one that holds uploads it whole."""
    from boto3.s3.transfer import TransferConfig

    from cdc_platform.capture.store import s3store

    mib = 1024 * 1024
    monkeypatch.setattr(s3store, "_TRANSFER", TransferConfig(
        multipart_threshold=5 * mib, multipart_chunksize=5 * mib, use_threads=False))
    data = bytes(range(256)) * (11 * mib // 256)  # (3 parts)
    bounded = store.within(lambda: time.monotonic() + 60)
    with bounded.atomic_output("big.bin") as sink:
        sink.write(data)
    assert store.read_bytes("big.bin") == data

    deadline = [time.monotonic() + 60]
    parts: list[int] = []

    def after_a_part(**_: object) -> None:
        parts.append(1)
        deadline[0] = 0.0  # (the lease expires after the first part)

    store._connection.bounded_client.meta.events.register("after-call.s3.UploadPart",
                                                          after_a_part)
    with pytest.raises(ObjectStoreUnavailableError, match="not sent"), \
            store.within(lambda: deadline[0]).atomic_output("late.bin") as sink:
        sink.write(data)
    assert parts == [1] and store.read_bytes("late.bin") is None


def test_a_fenced_segment_write_never_lands_after_the_lease_expired(
        store: S3FileStore, tmp_path, caplog):
    """The engine holds its lease; the server stops answering (a partition) just as it
    writes a segment: the write retries only while a retry can end before the lease's expiry
    (not for s3.retry_seconds), then raises; nothing lands when the server is back. The
    renewer's line says the store did not answer (one line, no traceback), not that another
    engine took over."""
    from cdc_platform.capture.landing.fencing import LandingZoneTakenError
    from cdc_platform.capture.landing.zone import LandingZone
    from cdc_platform.capture.schema import ColumnSpec, TableSchema

    ttl = 12.0
    zone = LandingZone(store, "demo", scratch=tmp_path, lease_ttl_seconds=ttl)
    schema = TableSchema("shop", "orders", (ColumnSpec("id", "int"),), ("id",))
    table = pa.table({"__cdc_pos": pa.array([1], pa.int64()), "__cdc_op": ["c"],
                      "id": pa.array([1], pa.int64())})
    with caplog.at_level("WARNING"), zone.engine_lock():
        expiry = zone._lease.expiry
        attempts = _outage(store, "PutObject", 600.0)
        with pytest.raises(ObjectStoreUnavailableError, match="the deadline of a lease write"):
            zone.write_segment(schema, table, 1, 1)
        ended = time.monotonic()
        attempt_seconds = store._connection.bounded_attempt_seconds
        assert ended < expiry + attempt_seconds  # (not after 120 s of s3.retry_seconds)
        assert attempts and all(at < expiry for at in attempts)
        while not zone._lease_lost.is_set() and time.monotonic() < expiry + 10:
            time.sleep(0.2)
        with pytest.raises(LandingZoneTakenError):
            zone.write_segment(schema, table, 1, 1)
    time.sleep(1.0)
    answering = LandingZone(S3FileStore(store.bucket, "zone", store.options), "demo")
    assert answering.segment_names("shop", "orders") == []  # (nothing left to land either)
    lines = [r for r in caplog.records if "engine lease was lost" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert "the store did not answer before it expired" in lines[0].getMessage()
    assert "another engine took over" not in lines[0].getMessage()
    assert "\n" not in lines[0].getMessage()


def test_an_engine_taking_over_an_expired_lease_waits_out_its_holders_writes(
        store: S3FileStore, tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A successor's first write comes only ENGINE_LEASE_WAIT_SLACK_SECONDS after the
    expires_at of the lease it took over (by then any write its cut-off holder began before
    the expiry has ended); a released lease is taken over at once."""
    from cdc_platform.capture.landing import fencing
    from cdc_platform.capture.landing.fencing import ENGINE_LEASE_FILE
    from cdc_platform.capture.landing.zone import Checkpoint, LandingZone

    monkeypatch.setattr(fencing, "ENGINE_LEASE_WAIT_SLACK_SECONDS", 3.0)
    stale = LandingZone(store, "demo", scratch=tmp_path / "a", lease_ttl_seconds=1.0)
    fresh = LandingZone(store, "demo", scratch=tmp_path / "b", lease_ttl_seconds=30.0)
    monkeypatch.setattr(stale, "_renew_lease", lambda lease, stop: None)  # (frozen)
    with stale.engine_lock():
        expires_at = Lease(fresh.store, ENGINE_LEASE_FILE).current().expires_at
        with fresh.engine_lock():
            assert time.time() >= expires_at + 3.0
            fresh.write_checkpoint(Checkpoint("demo", "mariadb", next_pos=2))
    started = time.monotonic()
    with stale.engine_lock():  # (fresh released it: no wait)
        assert time.monotonic() - started < 2.0
