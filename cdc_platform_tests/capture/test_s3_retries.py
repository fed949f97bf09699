"""S3FileStore's answers to a throttled, conflicted or forgetful server, on moto's in-process S3:
503 SlowDown is retried with backoff (botocore's retry loop, not ours), 409
ConditionalRequestConflict is repeated, and a conditional put whose first attempt landed although
its answer was lost is recognised as this write's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer

from cdc_platform.capture.s3store import S3FileStore, S3Options
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
    options = S3Options(endpoint_url=moto_endpoint, region="us-east-1", path_style=True,
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

    store.client.meta.events.register(f"before-send.s3.{operation}", handler)
    return attempts


def test_slow_down_is_retried_with_backoff_until_it_succeeds(store: S3FileStore):
    attempts = _inject(store, "PutObject", [(503, "SlowDown"), (503, "SlowDown")])
    store.write_atomically("a.json", data=b"1")
    assert len(attempts) == 3
    assert store.read_bytes("a.json") == b"1"


@pytest.mark.parametrize("store", [2], indirect=True)
def test_throttling_beyond_max_attempts_is_raised(store: S3FileStore):
    attempts = _inject(store, "PutObject", [(503, "SlowDown")] * 3)
    with pytest.raises(ClientError, match="SlowDown"):
        store.write_atomically("a.json", data=b"1")
    assert len(attempts) == 2 and store.read_bytes("a.json") is None


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
