"""Fixtures for tests on object storage: a private SeaweedFS (a real S3 server) per test
session, a fresh bucket per test, and the AWS environment its clients read credentials from.

A test module makes the fixtures it uses its own by assignment (``seaweedfs, s3_url =
s3_fixtures.seaweedfs, s3_fixtures.s3_url``: an import would be shadowed by the test
functions' parameters); the conftest files are left alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_platform.config import S3Settings
from cdc_platform.devservices.seaweedfs import SeaweedFS

__all__ = ["s3_env", "s3_options", "s3_url", "seaweedfs"]


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One SeaweedFS S3 server (with an Iceberg REST catalog over table bucket ``warehouse``)
    for the session; tests that restart a server start their own."""
    server = SeaweedFS(Path(tmp_path_factory.mktemp("seaweedfs")), table_bucket="warehouse")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The server's credentials in the standard AWS variables, for this test only (the stores
    take credentials from nowhere else); no instance-metadata lookups."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                 "AWS_ROLE_ARN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    env = {**seaweedfs.client_env(), "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
    del env["AWS_ENDPOINT_URL"]  # the stores take the endpoint from their options
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def s3_options(server: SeaweedFS, **overrides: object) -> S3Settings:
    """The config's ``s3`` section for ``server`` (path-style, as self-hosted servers want)."""
    values: dict[str, object] = {"endpoint_url": server.endpoint_url, "region": server.region,
                                 "path_style": True, **overrides}
    return S3Settings(**values)  # type: ignore[arg-type]


@pytest.fixture
def s3_url(seaweedfs: SeaweedFS, s3_env: dict[str, str]) -> str:
    """``s3://<fresh bucket>/landing`` on the session's server."""
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    seaweedfs.create_bucket(bucket)
    return f"s3://{bucket}/landing"
