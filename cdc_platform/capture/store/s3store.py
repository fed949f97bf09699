"""The landing zone and warehouse on S3-compatible object storage, through boto3.

``S3FileStore`` is the ``FileStore`` of an ``s3://bucket/prefix`` (or ``s3a://``) URL. Every
write that publishes something is one request: a PUT is atomic on S3 (readers see the old object
or the new one), ``write_exclusively`` is a PUT with ``If-None-Match: *`` (the server refuses it
with 412 when the object exists, so of racing writers exactly one wins) and ``write_if_match``
a PUT with ``If-Match: <etag>`` (compare-and-swap; ``capture.store.lease`` builds the single-writer
lease on it). pyarrow's S3 filesystem makes no conditional requests, so it is used only for the
lake's reads (``arrow``), never for a publishing write.

Where things come from: the endpoint, region and addressing style from the config's ``s3``
section (``config.S3Settings``); the credentials only from the standard AWS chain (environment,
profile, web identity as IRSA sets it, instance metadata), never from the config file.
Throttling (503 SlowDown), 5xx answers, timeouts and refused connections are retried twice
over: by botocore within one request (``retry_mode``, ``max_attempts``: blips of a few seconds),
and beyond that by the store, the whole request again with backoff until ``retry_seconds``
have passed (a server restarting, an outage of a minute); then it stops with one line naming the
endpoint and ``s3.retry_seconds`` (``ObjectStoreUnavailableError``). A conditional PUT retried
after its first attempt may have landed is decided by the object's content (``_conditional_put``).
``within(deadline)`` is the same store sending a request only before a deadline and retrying it
only while the retry can end before it: the lease's writes, which are worthless once the lease
they write has expired, and the engine's writes under its lease (``LandingZone.store``), which
must not land after a successor took over (the deadline may be a callable: the lease's expiry,
moved on by each renewal).

A wrong credential or a missing bucket is a start error of one line naming the setting
(``check``); the same line is raised when an operation meets it later.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlparse

import boto3
import pyarrow as pa
import pyarrow.fs as pafs
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
)
from botocore.exceptions import ConnectionError as BotocoreConnectionError

from cdc_platform.capture.store.storage import (
    S3_SCHEMES,
    FileInfo,
    FileStore,
    StoreUnavailableError,
    _checked,
)
from cdc_platform.config import S3Settings

__all__ = ["ObjectStoreError", "ObjectStoreUnavailableError", "S3FileStore",
           "credentials_source", "parse_s3_url"]

# 409 ConditionalRequestConflict: another conditional write to the key was in flight; the
# request may be repeated (it is not an answer about the object's state).
_CONFLICT_ATTEMPTS = 20
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
# Answers that say nothing about the request itself: the server is busy, restarting or away.
_TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                    "RequestTimeoutException", "InternalError", "ServiceUnavailable",
                    "TooManyRequests", "RequestLimitExceeded"}
# The store's own retries of a whole request (after botocore's): backoff from the first to
# the longest pause, each drawn at random from its upper half.
_FIRST_BACKOFF_SECONDS, _MAX_BACKOFF_SECONDS = 0.5, 5.0
# A store ``within`` a deadline sends single attempts (no botocore retries) with these
# timeouts, so that an attempt started before the deadline ends about when it passes.
_BOUNDED_CONNECT_SECONDS, _BOUNDED_READ_SECONDS = 2.0, 5.0
# A deadline: a time.monotonic() value, or a callable giving the current one (a lease's expiry).
Deadline = float | Callable[[], float]

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class ObjectStoreError(ValueError):
    """The object store refuses this deployment (no bucket, no access, no credentials, no
    endpoint); the message is one line naming the setting and the fix. (A ValueError like
    ``config.ConfigError``: a wrong setting. This module sits on the storage floor, below
    ``start_errors``, so it does not derive from ``StartError``.)"""


class ObjectStoreUnavailableError(ObjectStoreError, StoreUnavailableError):
    """The object store did not answer (refused connections, timeouts, 5xx, throttling) for
    longer than ``s3.retry_seconds`` (or a ``within`` deadline); one line naming the endpoint
    and the setting. Nothing about the deployment is wrong: a later start goes on."""


def parse_s3_url(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket/prefix`` / ``s3a://...`` (prefix without slashes
    at either end)."""
    parsed = urlparse(url)
    if parsed.scheme.lower() not in S3_SCHEMES or not parsed.netloc:
        raise ValueError(f"{url!r} is not an s3://bucket/prefix URL")
    return parsed.netloc, parsed.path.strip("/")


@dataclass(eq=False)
class _Connection:
    """The boto3 client and pyarrow filesystem shared by a store and its children (boto3
    clients are thread-safe; a session is not, so each connection makes its own)."""

    options: S3Settings
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _session: Any = field(default=None, repr=False)
    _client: Any = field(default=None, repr=False)
    _bounded_client: Any = field(default=None, repr=False)
    _single_client: Any = field(default=None, repr=False)
    _arrow: pafs.S3FileSystem | None = field(default=None, repr=False)
    _resolved: S3Settings | None = field(default=None, repr=False)

    @property
    def session(self) -> boto3.session.Session:
        with self._lock:
            if self._session is None:
                self._session = boto3.session.Session()
            return self._session

    @property
    def resolved(self) -> S3Settings:
        """The options resolved as every S3 client of the platform resolves them, with the
        region of boto3's profile before the default (``S3Settings.resolved``)."""
        with self._lock:
            if self._resolved is None:
                self._resolved = self.options.resolved(self.session.region_name)
            return self._resolved

    @property
    def region(self) -> str:
        return self.resolved.region

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                options = self.options
                self._client = self._new_client(options.max_attempts,
                                                options.connect_timeout_seconds,
                                                options.read_timeout_seconds)
            return self._client

    @property
    def bounded_client(self) -> Any:
        """Single attempts with short timeouts, for requests that must end by a deadline."""
        with self._lock:
            if self._bounded_client is None:
                options = self.options
                self._bounded_client = self._new_client(
                    1, min(options.connect_timeout_seconds, _BOUNDED_CONNECT_SECONDS),
                    min(options.read_timeout_seconds, _BOUNDED_READ_SECONDS))
            return self._bounded_client

    @property
    def single_client(self) -> Any:
        """Single attempts with the configured timeouts: the store's own retries during an
        outage, so that its backoff (at most 5 s), not botocore's (up to some 13 s at the
        default attempts), decides how soon a returning server is used again."""
        with self._lock:
            if self._single_client is None:
                options = self.options
                self._single_client = self._new_client(1, options.connect_timeout_seconds,
                                                       options.read_timeout_seconds)
            return self._single_client

    @property
    def bounded_attempt_seconds(self) -> float:
        """The longest a ``bounded_client`` attempt takes (connect plus read timeout)."""
        options = self.options
        return (min(options.connect_timeout_seconds, _BOUNDED_CONNECT_SECONDS)
                + min(options.read_timeout_seconds, _BOUNDED_READ_SECONDS))

    def _new_client(self, attempts: int, connect_timeout: float, read_timeout: float) -> Any:
        session, region, options = self.session, self.region, self.options
        config = Config(
            region_name=region,
            retries={"mode": options.retry_mode, "total_max_attempts": attempts},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            s3={"addressing_style": "path" if options.path_style else "auto"},
            # plain signed bodies, no aws-chunked trailing checksums (which some
            # S3-compatible servers refuse); PUTs carry Content-MD5 where required
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        return session.client("s3", endpoint_url=self.resolved.endpoint_url or None,
                              config=config)

    def arrow(self) -> pafs.S3FileSystem:
        with self._lock:
            if self._arrow is None:
                options = self.options
                kwargs: dict[str, Any] = {
                    "region": self.region,
                    "connect_timeout": options.connect_timeout_seconds,
                    "request_timeout": options.read_timeout_seconds,
                    "force_virtual_addressing": not options.path_style,
                    "retry_strategy": pafs.AwsStandardS3RetryStrategy(
                        max_attempts=options.max_attempts),
                }
                if self.resolved.endpoint_url:
                    endpoint = urlparse(self.resolved.endpoint_url)
                    kwargs["endpoint_override"] = endpoint.netloc + endpoint.path.rstrip("/")
                    kwargs["scheme"] = endpoint.scheme or "https"
                # (no keys: pyarrow's AWS SDK reads the same standard credential chain)
                self._arrow = pafs.S3FileSystem(**kwargs)
            return self._arrow


class S3FileStore(FileStore):
    """The objects below ``s3://bucket/prefix``; a "directory" is a key prefix ending in ``/``.

    ``setting`` names the config key the URL came from (``landing_zone.url``), so that errors
    say which setting to fix. Nothing is requested until the first operation (or ``check``).
    """

    def __init__(self, bucket: str, prefix: str = "", options: S3Settings | None = None, *,
                 setting: str = "storage URL", _connection: _Connection | None = None,
                 _deadline: Deadline | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.setting = setting
        self._connection = _connection or _Connection(options or S3Settings())
        self._deadline = _deadline  # (time.monotonic(), or a callable of it; ``within``)

    @classmethod
    def from_url(cls, url: str, options: S3Settings | None = None, *,
                 setting: str = "storage URL") -> S3FileStore:
        bucket, prefix = parse_s3_url(url)
        return cls(bucket, prefix, options, setting=setting)

    def __repr__(self) -> str:
        return f"S3FileStore({self.uri!r})"

    @property
    def options(self) -> S3Settings:
        return self._connection.options

    @property
    def client(self) -> Any:
        """The boto3 S3 client (shared by this store and its children); single attempts with
        short timeouts in a store ``within`` a deadline."""
        if self._deadline is not None:
            return self._connection.bounded_client
        return self._connection.client

    @property
    def uri(self) -> str:
        return f"s3a://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, *parts: str) -> str:
        """The object key of a path below the root."""
        return posixpath.join(self.prefix, *_checked(parts, self.uri)) if parts else self.prefix

    def child(self, *parts: str) -> S3FileStore:
        return S3FileStore(self.bucket, self.key(*parts), setting=self.setting,
                           _connection=self._connection, _deadline=self._deadline)

    def within(self, deadline: Deadline) -> S3FileStore:
        """This store, sending a request only before ``deadline`` (``time.monotonic()``, or a
        callable giving it, asked again before every attempt: a lease's expiry that renewals
        move on) and retrying it only while the retry can end before it: each attempt is one
        request with short timeouts (no botocore retries, ``bounded_attempt_seconds`` at most
        for a stalled one), no attempt is started at or after the deadline, and no retry that
        could end after it. So every request ends within ``bounded_attempt_seconds`` of the
        deadline (a request moving a body ends that long after its body stops moving; see
        ``atomic_output`` for large uploads). Past it: ``ObjectStoreUnavailableError``. A
        store already within a deadline keeps it too (the earlier of both counts)."""
        if self._deadline is not None:
            deadline = _earlier(self._deadline, deadline)
        return S3FileStore(self.bucket, self.prefix, setting=self.setting,
                           _connection=self._connection, _deadline=deadline)

    def _deadline_now(self) -> float | None:
        """The ``within`` deadline as it stands now (None: none)."""
        deadline = self._deadline
        return deadline() if callable(deadline) else deadline

    # ---- retries beyond botocore's -----------------------------------------------------------

    def _request(self, operation: str, key: str, call: Callable[[Any], _T]) -> _T:
        """``call(client)``, repeated with backoff while the server is away, busy or
        restarting (``_transient``) until ``s3.retry_seconds`` after the first attempt (or
        the ``within`` deadline: no attempt then starts at or after it, and none is retried
        that could end after it); then one line naming the endpoint and the setting. Any
        other error is raised as it is, for the caller to tell (404, 412, 403...)."""
        started = time.monotonic()
        retry_until = started + self.options.retry_seconds
        give_up = retry_until
        attempt_seconds = 0.0
        if self._deadline is not None:
            attempt_seconds = self._connection.bounded_attempt_seconds
        backoff, failures = _FIRST_BACKOFF_SECONDS, 0
        last_error: BaseException | None = None
        client = self.client
        while True:
            deadline = self._deadline_now()
            if deadline is not None:
                # (asked before every attempt: a renewal moves it on, a lost lease ends it)
                give_up = min(retry_until, deadline)
                if time.monotonic() >= deadline:
                    raise ObjectStoreUnavailableError(self._too_late(
                        operation, key, last_error, time.monotonic() - started)) from last_error
            try:
                result = call(client)
            except Exception as error:
                if not _transient(error):
                    raise
                last_error = error
                failures += 1
                pause = random.uniform(backoff / 2, backoff)
                now = time.monotonic()
                if self._deadline is not None:
                    give_up = min(retry_until, self._deadline_now() or 0.0)
                if now + pause + attempt_seconds >= give_up:
                    raise ObjectStoreUnavailableError(
                        self._unavailable(operation, key, error, now - started)) from error
                if failures == 1:
                    log.warning(f"{operation} s3://{self.bucket}/{key}: {_short(error)}; "
                                f"retrying for up to {give_up - now:.0f} s (s3.retry_seconds)")
                time.sleep(pause)
                backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)
                if self._deadline is None:
                    client = self._connection.single_client
                continue
            if failures:
                log.warning(f"{operation} s3://{self.bucket}/{key}: answered after "
                            f"{time.monotonic() - started:.1f} s and {failures} retries")
            return result

    def _too_late(self, operation: str, key: str, error: BaseException | None,
                  waited: float) -> str:
        """The line of a request not sent because its ``within`` deadline had passed."""
        if error is not None:
            return self._unavailable(operation, key, error, waited)
        return (f"{self._where()}: {operation} {key!r} not sent: the deadline of a lease write "
                "had passed (the lease it was made under expired or was lost)")

    def _unavailable(self, operation: str, key: str, error: BaseException,
                     waited: float) -> str:
        endpoint = self.options.endpoint_url or f"the AWS S3 endpoint ({self._connection.region})"
        bound = (f"s3.retry_seconds {self.options.retry_seconds:g}" if self._deadline is None
                 else "the deadline of a lease write")
        return (f"{self._where()}: {endpoint} did not answer {operation} {key!r} for "
                f"{waited:.0f} s ({_short(error)}); retried with backoff until {bound}; "
                "check the server and the network, or raise s3.retry_seconds to ride out "
                "longer outages")

    def arrow(self, *parts: str) -> tuple[pafs.FileSystem, str]:
        return self._connection.arrow(), posixpath.join(self.bucket, self.key(*parts))

    # ---- start check and errors ------------------------------------------------------------

    def check(self) -> None:
        """Raise ``ObjectStoreError`` (one line naming the setting) unless the bucket exists
        and the credentials from the environment may use it."""
        try:  # (not retried beyond botocore: a wrong endpoint is a start error, said at once)
            self.client.head_bucket(Bucket=self.bucket)
            self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._dir_prefix(),
                                        MaxKeys=1)
        except (ClientError, NoCredentialsError, PartialCredentialsError,
                EndpointConnectionError, ConnectTimeoutError) as error:
            raise ObjectStoreError(self._explain(error)) from None

    probe = check

    def _where(self) -> str:
        return f"{self.setting} s3://{self.bucket}/{self.prefix}".rstrip("/")

    def _credentials_source(self) -> str:
        return credentials_source(self._connection.session)

    def _explain(self, error: BaseException) -> str:
        where = self._where()
        if isinstance(error, NoCredentialsError | PartialCredentialsError):
            return (f"{where}: no AWS credentials in the environment: set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or a web identity (IRSA)")
        if isinstance(error, EndpointConnectionError | ConnectTimeoutError):
            endpoint = self.options.endpoint_url or "the AWS endpoint"
            return (f"{where}: cannot reach {endpoint} (s3.endpoint_url): {error}; check the "
                    "endpoint and the network")
        assert isinstance(error, ClientError)
        code, status = _error_code(error)
        if code in ("NoSuchBucket",) or (status == 404 and code in ("404", "NotFound", "")):
            return (f"{where}: bucket '{self.bucket}' does not exist; create it or fix the "
                    "URL")
        if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId",
                                      "SignatureDoesNotMatch"):
            return (f"{where}: access denied ({code}) with the AWS credentials from the "
                    f"environment ({self._credentials_source()}); fix the credentials or grant "
                    f"them s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject on "
                    f"the bucket")
        message = error.response.get("Error", {}).get("Message", "")
        return f"{where}: {code or status} {message}".strip()

    def _raise(self, error: ClientError, key: str, operation: str) -> NoReturn:
        """Re-raise ``error`` as the one line when it is about the deployment (bucket,
        credentials), else as it is, with the key in the message."""
        code, status = _error_code(error)
        if code == "NoSuchBucket" or status == 403 or code in ("AccessDenied",
                                                               "InvalidAccessKeyId",
                                                               "SignatureDoesNotMatch"):
            raise ObjectStoreError(self._explain(error)) from error
        error.add_note(f"{operation} s3://{self.bucket}/{key} ({self.setting})")
        raise error

    # ---- reads -----------------------------------------------------------------------------

    def read_bytes(self, *parts: str) -> bytes | None:
        versioned = self.read_versioned(*parts)
        return None if versioned is None else versioned[0]

    def read_versioned(self, *parts: str) -> tuple[bytes, str] | None:
        key = self.key(*parts)

        def get(client: Any) -> tuple[bytes, str]:
            response = client.get_object(Bucket=self.bucket, Key=key)
            with contextlib.closing(response["Body"]) as body:
                return body.read(), str(response["ETag"])

        try:
            return self._request("GET", key, get)
        except ClientError as error:
            if _error_code(error)[0] in _NOT_FOUND:
                return None
            self._raise(error, key, "GET")

    def _dir_prefix(self, *parts: str) -> str:
        key = self.key(*parts)
        return f"{key}/" if key else ""

    def list_names(self, *parts: str) -> list[str]:
        prefix = self._dir_prefix(*parts)
        names: set[str] = set()
        for page in self._pages(prefix, delimiter="/"):
            for item in page.get("Contents", ()):
                name = item["Key"][len(prefix):]
                if name:  # (not a "directory marker" object of the prefix itself)
                    names.add(name)
            for common in page.get("CommonPrefixes", ()):
                name = common["Prefix"][len(prefix):].rstrip("/")
                if name:
                    names.add(name)
        return sorted(names)

    def _pages(self, prefix: str, delimiter: str = "") -> list[dict[str, Any]]:
        """Every page of a listing (a listing interrupted by an outage is started over)."""
        def pages(client: Any) -> list[dict[str, Any]]:
            paginator = client.get_paginator("list_objects_v2")
            extra = {"Delimiter": delimiter} if delimiter else {}
            return list(paginator.paginate(Bucket=self.bucket, Prefix=prefix, **extra))

        try:
            return self._request("LIST", prefix, pages)
        except ClientError as error:
            self._raise(error, prefix, "LIST")

    def list_tree(self, *parts: str) -> list[tuple[str, ...]]:
        """One prefix listing, without a delimiter (a request per thousand objects)."""
        prefix = self._dir_prefix(*parts)
        found = []
        for page in self._pages(prefix):
            for item in page.get("Contents", ()):
                name = item["Key"][len(prefix):]
                if name and not name.endswith("/"):  # (not a "directory marker" object)
                    found.append(tuple(name.split("/")))
        return found

    def list_files(self, *parts: str) -> list[FileInfo]:
        """From the listing: sizes, and upload times as modification times."""
        prefix = self._dir_prefix(*parts)
        found = []
        for page in self._pages(prefix, delimiter="/"):
            for item in page.get("Contents", ()):
                name = item["Key"][len(prefix):]
                if name:
                    found.append(FileInfo(name, int(item["Size"]),
                                          item["LastModified"].timestamp()))
        return sorted(found, key=lambda info: info.name)

    def exists(self, *parts: str) -> bool:
        key = self.key(*parts)
        if key:
            try:
                self._request("HEAD", key, lambda client: client.head_object(
                    Bucket=self.bucket, Key=key))
                return True
            except ClientError as error:
                if _error_code(error)[1] != 404:
                    self._raise(error, key, "HEAD")
        prefix = self._dir_prefix(*parts)
        try:
            page = self._request("LIST", prefix, lambda client: client.list_objects_v2(
                Bucket=self.bucket, Prefix=prefix, MaxKeys=1))
        except ClientError as error:
            self._raise(error, key, "LIST")
        return bool(page.get("KeyCount", len(page.get("Contents", ()))))

    def stamp(self, *parts: str) -> str | None:
        """The object's ETag, from a HEAD (no body is transferred)."""
        key = self.key(*parts)
        try:
            return str(self._request("HEAD", key, lambda client: client.head_object(
                Bucket=self.bucket, Key=key))["ETag"])
        except ClientError as error:
            if _error_code(error)[1] == 404 or _error_code(error)[0] in _NOT_FOUND:
                return None
            self._raise(error, key, "HEAD")

    def delete_directory(self, *parts: str) -> None:
        """Every object below the prefix, listed without a delimiter and deleted in batches
        of up to 1000 (one request each)."""
        prefix = self._dir_prefix(*parts)
        if not prefix:
            raise ValueError(f"{self.uri}: refusing to delete the whole store")
        for page in self._pages(prefix):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", ())]
            if keys:
                try:
                    self._request("DELETE", prefix, lambda client, keys=keys: client.delete_objects(
                        Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True}))
                except ClientError as error:
                    self._raise(error, prefix, "DELETE")

    # ---- writes ----------------------------------------------------------------------------

    def write_atomically(self, *parts: str, data: bytes | memoryview,
                         durable: bool = True) -> None:
        """One PUT: atomic and durable on S3 (``durable`` changes nothing)."""
        key, body = self.key(*parts), bytes(data)
        try:
            self._request("PUT", key, lambda client: client.put_object(
                Bucket=self.bucket, Key=key, Body=body))
        except ClientError as error:
            self._raise(error, key, "PUT")

    def write_exclusively(self, *parts: str, data: bytes | memoryview) -> bool:
        """``PUT If-None-Match: *``: False (nothing written) on 412, the object exists."""
        return self.write_versioned(*parts, data=data, etag=None) is not None

    def write_if_match(self, *parts: str, data: bytes | memoryview, etag: str) -> bool:
        """``PUT If-Match: etag``: replace the object only if it is still the version
        ``read_versioned`` returned; False (nothing written) if it changed or is gone."""
        return self.write_versioned(*parts, data=data, etag=etag) is not None

    def write_versioned(self, *parts: str, data: bytes | memoryview, etag: str | None
                        ) -> str | None:
        """The PUT's own ETag is the version written."""
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        return self._conditional_put(self.key(*parts), bytes(data), **condition)

    def _conditional_put(self, key: str, data: bytes, **condition: str) -> str | None:
        """A conditional PUT: the new object's ETag, or None (nothing written) when the
        condition failed. 409 ConditionalRequestConflict (a concurrent conditional write
        to the key) is repeated. A 412 after the request was retried (by botocore or by
        ``_request``: a timeout, a lost connection or a 5xx whose attempt may have landed) is
        checked against the object's content: when it holds exactly ``data``, that landing was
        this write's, so a retry never turns into a false "lost the race" or a false fence.
        (Callers whose racing writers could write equal bytes make them unique: the lease's
        token.)"""
        attempts = 0

        def put(client: Any) -> Any:
            nonlocal attempts
            attempts += 1
            return client.put_object(Bucket=self.bucket, Key=key, Body=data, **condition)

        for attempt in range(_CONFLICT_ATTEMPTS):
            try:
                return str(self._request("PUT", key, put)["ETag"])
            except ClientError as error:
                code, status = _error_code(error)
                if status == 409 or code == "ConditionalRequestConflict":
                    time.sleep(min(0.05 * 2 ** attempt, 1.0))
                    continue
                if status == 412 or code == "PreconditionFailed":
                    retried = attempts > 1 or error.response.get(
                        "ResponseMetadata", {}).get("RetryAttempts", 0)
                    if retried:
                        current = self.read_versioned(*self._parts_of(key))
                        return current[1] if current is not None and current[0] == data \
                            else None
                    return None
                if code in _NOT_FOUND:  # (If-Match on a deleted object)
                    return None
                self._raise(error, key, "PUT")
        raise ObjectStoreError(
            f"{self._where()}: {_CONFLICT_ATTEMPTS} conditional writes of {key!r} in a row met "
            "409 ConditionalRequestConflict; another writer keeps writing it")

    def _parts_of(self, key: str) -> tuple[str, ...]:
        relative = key[len(self.prefix) + 1:] if self.prefix else key
        return tuple(relative.split("/"))

    def delete(self, *parts: str) -> None:
        key = self.key(*parts)
        try:
            self._request("DELETE", key, lambda client: client.delete_object(
                Bucket=self.bucket, Key=key))
        except ClientError as error:
            if _error_code(error)[0] not in _NOT_FOUND:
                self._raise(error, key, "DELETE")

    @contextlib.contextmanager
    def atomic_output(self, *parts: str) -> Iterator[pa.NativeFile]:
        """Spooled to a local temporary file (memory stays bounded), then uploaded in one PUT,
        or as a multipart upload beyond 64 MiB: either way the object appears only when the
        upload completes, and an error in the block uploads nothing.

        In a store ``within`` a deadline every request of the upload is one of its bounded
        requests (``_multipart``: each part, and the completion, is started only before the
        deadline and ends within ``bounded_attempt_seconds`` of it when stalled). What bounds
        the total: the object appears only by the last request (the one PUT, or the multipart
        upload's completion, which carries no data), and that request is started before the
        deadline; its timeouts are per socket operation, so a healthy PUT of up to 64 MiB
        takes its transfer time, while one whose transfer stalls (a partition) ends within the
        connect plus read timeouts."""
        key = self.key(*parts)
        fd, spool = tempfile.mkstemp(prefix="cdc-s3-upload-")
        os.close(fd)
        try:
            with pa.OSFile(spool, "wb") as sink:
                yield sink
            if self._deadline is not None and \
                    os.path.getsize(spool) > _TRANSFER.multipart_threshold:
                self._multipart(key, spool)
                return
            try:
                self._request("PUT", key, lambda client: client.upload_file(
                    spool, self.bucket, key, Config=_TRANSFER))
            except S3UploadFailedError as error:  # (boto3 wraps the ClientError in it)
                if isinstance(error.__context__, ClientError):
                    self._raise(error.__context__, key, "PUT")
                raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(spool)

    def _multipart(self, key: str, spool: str) -> None:
        """A multipart upload of ``spool`` made of separate requests, each through
        ``_request`` (so in a store ``within`` a deadline each is sent only before it, where
        boto3's ``upload_file`` would be one request to ``_request`` however many parts it
        sends), in parts of ``_TRANSFER.multipart_chunksize``. The object appears only by the
        completion; a failed upload is aborted (best effort: the bucket's lifecycle rule for
        incomplete multipart uploads removes what an abort leaves)."""
        try:
            upload = self._request("PUT", key, lambda client: client.create_multipart_upload(
                Bucket=self.bucket, Key=key))["UploadId"]
        except ClientError as error:
            self._raise(error, key, "PUT")
        try:
            done: list[dict[str, Any]] = []
            with open(spool, "rb") as source:
                while chunk := source.read(_TRANSFER.multipart_chunksize):
                    number = len(done) + 1
                    answer = self._request("PUT", key, lambda client, chunk=chunk, number=number:
                                           client.upload_part(Bucket=self.bucket, Key=key,
                                                              UploadId=upload, Body=chunk,
                                                              PartNumber=number))
                    done.append({"ETag": answer["ETag"], "PartNumber": number})
            self._request("PUT", key, lambda client: client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": done}))
        except BaseException as error:
            with contextlib.suppress(Exception):
                self._connection.bounded_client.abort_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload)
            if isinstance(error, ClientError):
                self._raise(error, key, "PUT")
            raise


_TRANSFER = TransferConfig(multipart_threshold=64 * 1024 * 1024,
                           multipart_chunksize=16 * 1024 * 1024, use_threads=False)


def credentials_source(session: boto3.session.Session) -> str:
    """Where a session's credentials came from, for an error line: the source and the key id
    shortened (never the secret), or "none found"."""
    credentials = session.get_credentials()
    if credentials is None:
        return "none found"
    key_id = credentials.access_key or ""
    shown = f"{key_id[:4]}...{key_id[-2:]}" if len(key_id) > 8 else "(short)"
    method = getattr(credentials, "method", "unknown")
    origin = "AWS_ACCESS_KEY_ID" if method == "env" else method
    return f"{origin} {shown}"


def _earlier(first: Deadline, second: Deadline) -> Deadline:
    """The earlier of two deadlines (a callable when either is one)."""
    if not callable(first) and not callable(second):
        return min(first, second)
    return lambda: min(first() if callable(first) else first,
                       second() if callable(second) else second)


def _transient(error: BaseException) -> bool:
    """Whether ``error`` says the server is away, busy or restarting (refused or lost
    connections, timeouts, 5xx, throttling), not something about the request: worth the
    same request again later. boto3's upload wraps the cause (``S3UploadFailedError``)."""
    if isinstance(error, S3UploadFailedError):
        cause = error.__context__
        return cause is not None and cause is not error and _transient(cause)
    if isinstance(error, BotocoreConnectionError | HTTPClientError | IncompleteReadError):
        return True
    if isinstance(error, ClientError):
        code, status = _error_code(error)
        return status >= 500 or status == 429 or code in _TRANSIENT_CODES
    return False


def _short(error: BaseException) -> str:
    """An error as one short phrase for a log line."""
    if isinstance(error, ClientError):
        code, status = _error_code(error)
        return f"{status} {code}".strip()
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:200]


def _error_code(error: ClientError) -> tuple[str, int]:
    response = error.response
    return (str(response.get("Error", {}).get("Code", "")),
            int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0))
