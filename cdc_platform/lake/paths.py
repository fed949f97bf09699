"""One URL, two views: what Spark reads and writes, and what pyarrow uses for metadata I/O.

Spark handles the bulk data (segments); the small metadata files (checkpoint, schemas, directory
listings) go through ``pyarrow.fs`` so that they need no Spark job. Local paths and ``file://``
URLs are fully supported; object stores work through ``pyarrow.fs`` reads and listings. (Lake
tables are Iceberg's, committed by its catalog: ``lake.iceberg``.)
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow.fs as pafs

# Spark (Hadoop) scheme -> pyarrow scheme, and back, for object stores.
_ARROW_SCHEME = {"s3a": "s3", "s3n": "s3"}
_SPARK_SCHEME = {"s3": "s3a"}


@dataclass(frozen=True)
class Location:
    """A directory or file addressable by Spark (``spark_uri``) and pyarrow (``fs``, ``path``)."""

    spark_uri: str
    fs: pafs.FileSystem
    path: str

    def join(self, *parts: str) -> Location:
        """A location below this one (``parts`` are relative paths, never URLs).

        A source name is a part only once escaped (``capture.landing.table_parts``); a part
        that could leave this directory (absolute, or with a ``.`` or ``..`` segment) is
        refused, never joined.
        """
        for part in parts:
            if not part or part.startswith("/") or {".", ".."} & set(part.split("/")):
                raise ValueError(f"{part!r} is not a relative path below {self.spark_uri}; "
                                 "escape source names with capture.names.path_component")
        return Location(
            spark_uri=posixpath.join(self.spark_uri, *parts),
            fs=self.fs,
            path=posixpath.join(self.path, *parts),
        )

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def exists(self) -> bool:
        return self.fs.get_file_info(self.path).type != pafs.FileType.NotFound

    def list_names(self) -> list[str]:
        """Names directly below this directory; empty when it does not exist."""
        selector = pafs.FileSelector(self.path, allow_not_found=True, recursive=False)
        return sorted(posixpath.basename(info.path) for info in self.fs.get_file_info(selector))

    def read_bytes(self) -> bytes | None:
        """The file's content, or None when it does not exist."""
        try:
            with self.fs.open_input_stream(self.path) as stream:
                return stream.read()
        except FileNotFoundError:
            return None


def resolve(url: str) -> Location:
    """Turn a landing/warehouse URL (path, relative path, ``file://``, ``s3a://``...) into a Location.

    Relative paths are made absolute against the current directory, so that Spark executors and
    the driver agree on them.
    """
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        local = parsed.path if scheme == "file" else url
        if scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise ValueError(f"URL {url!r}: file:// URLs must not name a host")
        absolute = os.path.abspath(os.path.expanduser(local)).rstrip("/") or "/"
        return Location(spark_uri=f"file://{absolute}", fs=pafs.LocalFileSystem(), path=absolute)
    arrow_scheme = _ARROW_SCHEME.get(scheme, scheme)
    spark_scheme = _SPARK_SCHEME.get(scheme, scheme)
    rest = url.split("://", 1)[1].rstrip("/")
    fs, path = pafs.FileSystem.from_uri(f"{arrow_scheme}://{rest}")
    return Location(spark_uri=f"{spark_scheme}://{rest}", fs=fs, path=path.rstrip("/"))

