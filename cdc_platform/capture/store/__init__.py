"""Where the engine's files live: a ``FileStore`` on a local disk or on S3, and a lease on it.

``open_store`` is the face: the store of a landing-zone or warehouse URL. ``storage`` holds the
store's interface, the local store and pyarrow's; ``s3store`` the S3 one (conditional writes,
retries through outages); ``lease`` the single-writer lease object stores need instead of a
file lock.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import pyarrow.fs as pafs

from cdc_platform.capture.store.storage import (
    S3_SCHEMES,
    ArrowFileStore,
    FileStore,
    LocalFileStore,
)

if TYPE_CHECKING:
    from cdc_platform.config import S3Settings

#: How pyarrow and Spark name the object-store schemes a URL may use.
_ARROW_SCHEME = {"s3a": "s3", "s3n": "s3"}
_SPARK_SCHEME = {"s3": "s3a"}


def open_store(url: str, *, s3: S3Settings | None = None,
               setting: str = "storage URL") -> FileStore:
    """The store of a landing-zone or warehouse URL: a path (relative ones made absolute
    against the current directory, so Spark executors and the driver agree), ``file://``,
    ``s3://bucket/prefix`` or ``s3a://...`` (an ``S3FileStore``: endpoint, region and
    addressing from ``s3``, the config's ``s3`` section; credentials from the AWS environment),
    or another object-store URL pyarrow opens. ``setting`` names the config key the URL came
    from, for the errors (``landing_zone.url``)."""
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        local = parsed.path if scheme == "file" else url
        if scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise ValueError(f"URL {url!r}: file:// URLs must not name a host")
        absolute = os.path.abspath(os.path.expanduser(local)).rstrip("/") or "/"
        return LocalFileStore(Path(absolute))
    if scheme in S3_SCHEMES:
        # (imported here: boto3 loads only in processes that use S3)
        from cdc_platform.capture.store.s3store import S3FileStore

        return S3FileStore.from_url(url, s3, setting=setting)
    arrow_scheme = _ARROW_SCHEME.get(scheme, scheme)
    spark_scheme = _SPARK_SCHEME.get(scheme, scheme)
    rest = url.split("://", 1)[1].rstrip("/")
    fs, path = pafs.FileSystem.from_uri(f"{arrow_scheme}://{rest}")
    return ArrowFileStore(fs, path.rstrip("/"), f"{spark_scheme}://{rest}")
