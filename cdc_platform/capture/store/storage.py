"""One filesystem layer for the landing zone, shared by the capture engine and the lake.

A ``FileStore`` is the files below one root URL, addressed by path parts relative to it. It is
the seam an object-storage backend plugs into: everything the landing zone does to files is
one of its few operations (read, write atomically, write exclusively, list, delete, exists),
and the lake's pyarrow reads take their filesystem from it (``arrow``) while Spark reads the
same files by URL (``uri``).

Besides, a compare-and-swap pair: ``read_versioned`` gives a file's content with a version
token (an S3 ETag, a content hash locally) and ``write_if_match`` replaces the file only if it
is still that version; ``capture.store.lease`` builds the single-writer lease on it and
``write_exclusively``, so that it works alike on every store that has them.

Implementations: ``LocalFileStore`` (local paths and ``file://`` URLs: temporary file, fsync,
rename), ``S3FileStore`` (``s3://`` and ``s3a://`` URLs, in ``capture.store.s3store``: boto3,
conditional PUTs); the engine's ``LandingZone`` writes through either and ``ArrowFileStore`` (any other URL pyarrow
opens: reads and listings for the lake; a put is atomic there, but an exclusive put needs a
conditional request pyarrow does not make, so it is refused).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import os
import posixpath
import shutil
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

# Spark (Hadoop) scheme -> pyarrow scheme, and back, for object stores.


def _checked(parts: tuple[str, ...], below: str) -> tuple[str, ...]:
    """``parts`` if each is a relative path that stays below the root, else ValueError.

    A source name is a part only once escaped (``capture.landing.zone.table_parts``); a part that
    could leave the root (absolute, or with a ``.`` or ``..`` segment) is refused, never joined.
    """
    for part in parts:
        if not part or part.startswith("/") or {".", ".."} & set(part.split("/")):
            raise ValueError(f"{part!r} is not a relative path below {below}; "
                             "escape source names with capture.names.path_component")
    return parts


class StoreUnavailableError(Exception):
    """The store did not answer for as long as its requests are retried (an object store
    away, restarting or throttling); nothing is known about the request's effect beyond
    what the store could check."""


#: The URL schemes of S3 (boto3's and pyarrow's ``s3``, Hadoop's ``s3a`` and old ``s3n``).
S3_SCHEMES = frozenset({"s3", "s3a", "s3n"})


def is_s3_url(url: str | None) -> bool:
    """True for an object-store URL the S3 clients serve (``s3://``, ``s3a://``, ``s3n://``)."""
    return bool(url) and urlparse(str(url)).scheme.lower() in S3_SCHEMES


@dataclass(frozen=True)
class FileInfo:
    """A listed file: its name, size in bytes and modification time (seconds since the epoch)."""

    name: str
    size: int
    mtime: float


class FileStore(ABC):
    """The files below one root. Paths are given as parts relative to the root (``"changelog",
    db_dir, table_dir, name``); no operation reaches above the root."""

    @property
    @abstractmethod
    def uri(self) -> str:
        """The root as Spark reads it (``file:///...``, ``s3a://...``)."""

    @property
    def local_root(self) -> Path | None:
        """The root as a local directory, or None when the files are not local."""
        return None

    @abstractmethod
    def child(self, *parts: str) -> FileStore:
        """The store rooted at a directory below this root."""

    def within(self, deadline: float) -> FileStore:
        """This store, for requests that are worthless after ``deadline`` (``time.monotonic()``:
        a lease's writes, made for a lease that expires then): on object storage a request is
        retried only while the retry can end before it. Local stores never wait: themselves."""
        return self

    def uri_of(self, *parts: str) -> str:
        """A file's (or directory's) URL as Spark reads it."""
        return posixpath.join(self.uri, *_checked(parts, self.uri))

    @abstractmethod
    def arrow(self, *parts: str) -> tuple[pafs.FileSystem, str]:
        """The pyarrow filesystem and path of a file, for pyarrow reads (Parquet footers)."""

    @abstractmethod
    def read_bytes(self, *parts: str) -> bytes | None:
        """The file's content, or None when it does not exist."""

    @abstractmethod
    def write_atomically(self, *parts: str, data: bytes | memoryview,
                         durable: bool = True) -> None:
        """Write the file so that a reader sees either the previous content (or none) or all
        of ``data``. ``durable``: on stable storage before returning (False: for files that can
        be rebuilt)."""

    @abstractmethod
    def write_exclusively(self, *parts: str, data: bytes | memoryview) -> bool:
        """Create the file with ``data`` only if it does not exist, atomically, durably;
        False (and nothing written) if it exists."""

    def read_versioned(self, *parts: str) -> tuple[bytes, str] | None:
        """The file's content and a token of this version of it (for ``write_if_match``), or
        None when it does not exist. Equal content may give an equal token (as S3's ETag)."""
        raise NotImplementedError(
            f"{self.uri_of(*parts)}: this storage backend has no versioned reads")

    def write_if_match(self, *parts: str, data: bytes | memoryview, etag: str) -> bool:
        """Replace the file with ``data`` only if it is still the version ``etag`` (from
        ``read_versioned``), atomically; False (and nothing written) if it changed or is gone.
        Of writers racing from one version, exactly one succeeds."""
        raise NotImplementedError(
            f"{self.uri_of(*parts)}: replacing a file only if unchanged needs a conditional "
            "put (If-Match), which this storage backend does not make")

    def write_versioned(self, *parts: str, data: bytes | memoryview, etag: str | None
                        ) -> str | None:
        """``write_exclusively`` (``etag`` None) or ``write_if_match``, returning the version
        token of what it wrote (as ``read_versioned`` would give it), or None when nothing was
        written: a writer that swaps the file again later (the lease's renewals, the fenced
        checkpoint at every flush) needs no read to learn its own version."""
        raise NotImplementedError(
            f"{self.uri_of(*parts)}: conditional writes need a conditional put, which this "
            "storage backend does not make")

    @abstractmethod
    def list_names(self, *parts: str) -> list[str]:
        """Names directly below a directory, sorted; empty when it does not exist."""

    def list_files(self, *parts: str) -> list[FileInfo]:
        """The files directly below a directory (not its subdirectories), sorted by name, with
        their sizes and modification times (an object's upload time); empty when it does not
        exist."""
        raise NotImplementedError(f"{self.uri_of(*parts)}: this storage backend lists no sizes")

    def list_tree(self, *parts: str) -> list[tuple[str, ...]]:
        """Every file below a directory, at any depth, as its path's parts below it; empty
        when it does not exist. One listing where the backend has one (a prefix listing on
        object storage: a request per thousand files, not one per directory)."""
        found: list[tuple[str, ...]] = []
        for name in self.list_names(*parts):
            below = self.list_tree(*parts, name)
            if below:
                found.extend((name, *rest) for rest in below)
            elif not self.list_names(*parts, name):
                found.append((name,))
        return found

    @abstractmethod
    def delete(self, *parts: str) -> None:
        """Remove a file; nothing when it does not exist."""

    @abstractmethod
    def exists(self, *parts: str) -> bool:
        """Whether the file or directory exists."""

    def stamp(self, *parts: str) -> str | None:
        """A token that changes whenever the file is replaced (None when it does not exist),
        cheaper than reading it: for pollers that re-read a small file only when it changed
        (the engine's look at snapshot requests, a reader's at the checkpoint)."""
        versioned = self.read_versioned(*parts)
        return None if versioned is None else versioned[1]

    def delete_directory(self, *parts: str) -> None:
        """Remove a directory and every file below it; nothing when it does not exist (on
        object storage: every object below the prefix)."""
        for name in self.list_names(*parts):
            if self.list_names(*parts, name):
                self.delete_directory(*parts, name)
            self.delete(*parts, name)

    @abstractmethod
    @contextlib.contextmanager
    def atomic_output(self, *parts: str) -> Iterator[pa.NativeFile]:
        """A stream whose content becomes the file, whole and durable, when the block ends
        without an error (and never otherwise): for large files written by pyarrow (segments),
        which writes a native stream without holding the GIL."""


def write_atomically(path: Path, data: bytes | memoryview, *, durable: bool = True,
                          sync_dir: bool = True) -> None:
    """Write ``data`` so that ``path`` either does not exist or holds all of it, durably.

    ``durable=False`` skips the fsyncs (atomic for readers, but a machine crash may lose it:
    for files that can be rebuilt). ``sync_dir=False`` leaves the directory's fsync to a later
    write into the same directory (its rename makes this one durable too).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    with open(tmp, "wb") as handle:
        handle.write(data)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)
    if durable and sync_dir:
        fsync_directory(path.parent)


def fsync_directory(path: Path) -> None:
    """Make the names in a directory durable (a renamed file can vanish in a crash until its
    directory is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_durable(files: Sequence[Path]) -> None:
    """Make written files' content and names durable, at once: one ``syncfs`` of their
    filesystem (Linux), which writes back every file and directory change of it, instead of
    an fsync per file and per directory (a flush of a thousand tables' segments was a
    thousand fsyncs of each kind: half the engine's time). Elsewhere, or when ``syncfs``
    fails, an fsync of each file and each directory."""
    if not files:
        return
    if _syncfs(files[0].parent):
        return
    for path in files:
        _fsync_file(path)
    for directory in {path.parent for path in files}:
        fsync_directory(directory)


def _syncfs(directory: Path) -> bool:
    """``syncfs(2)`` of the filesystem holding ``directory``; False where it is missing."""
    function = _libc_syncfs()
    if function is None:
        return False
    fd = os.open(directory, os.O_RDONLY)
    try:
        return function(fd) == 0
    finally:
        os.close(fd)


@functools.cache
def _libc_syncfs() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.syncfs
    except (OSError, AttributeError):  # (not Linux: no syncfs)
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def _temporary(path: Path) -> Path:
    """A temporary name beside ``path``: hidden, and unique per process and thread (readers
    skip names starting with a dot; ``LandingZone.remove_uncommitted`` removes stale ones)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")


@contextlib.contextmanager
def _directory_lock(directory: Path) -> Iterator[None]:
    """An exclusive ``flock`` of a directory (Linux locks a directory's descriptor like a
    file's; each open is its own lock, so threads of one process exclude each other too)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _content_version(data: bytes) -> str:
    return '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


class LocalFileStore(FileStore):
    """Files in a local directory: write to a temporary name, fsync, rename."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"LocalFileStore({str(self.root)!r})"

    @property
    def uri(self) -> str:
        return f"file://{self.root}"

    @property
    def local_root(self) -> Path:
        return self.root

    def path(self, *parts: str) -> Path:
        """The local path of a file below the root."""
        return self.root.joinpath(*_checked(parts, self.uri))

    def child(self, *parts: str) -> LocalFileStore:
        return LocalFileStore(self.path(*parts))

    def arrow(self, *parts: str) -> tuple[pafs.FileSystem, str]:
        return pafs.LocalFileSystem(), str(self.path(*parts))

    def read_bytes(self, *parts: str) -> bytes | None:
        try:
            return self.path(*parts).read_bytes()
        except FileNotFoundError:
            return None

    def write_atomically(self, *parts: str, data: bytes | memoryview,
                         durable: bool = True) -> None:
        write_atomically(self.path(*parts), data, durable=durable)

    def write_exclusively(self, *parts: str, data: bytes | memoryview) -> bool:
        """Written under a temporary name and linked to the final one: a link never replaces
        an existing file, so of two writers exactly one succeeds, and readers never see a
        partial file. (Under the directory's lock, so that it is ordered against
        ``write_if_match``.)"""
        path = self.path(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temporary(path)
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            with _directory_lock(path.parent):
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    return False
        finally:
            tmp.unlink(missing_ok=True)
        fsync_directory(path.parent)
        return True

    def read_versioned(self, *parts: str) -> tuple[bytes, str] | None:
        """The version token is a hash of the content (as an S3 ETag is, for one PUT)."""
        data = self.read_bytes(*parts)
        return None if data is None else (data, _content_version(data))

    def write_if_match(self, *parts: str, data: bytes | memoryview, etag: str) -> bool:
        """Compared and replaced under an exclusive ``flock`` of the file's directory, which
        every ``write_if_match`` and ``write_exclusively`` of that directory takes (across
        processes of one machine, the landing zone's local case); the replacement is the
        usual temporary file and rename, so readers never see a partial file."""
        path = self.path(*parts)
        if not path.parent.is_dir():
            return False
        with _directory_lock(path.parent):
            current = self.read_bytes(*parts)
            if current is None or _content_version(current) != etag:
                return False
            write_atomically(path, data)
        return True

    def write_versioned(self, *parts: str, data: bytes | memoryview, etag: str | None
                        ) -> str | None:
        written = (self.write_exclusively(*parts, data=data) if etag is None
                   else self.write_if_match(*parts, data=data, etag=etag))
        return _content_version(bytes(data)) if written else None

    def list_names(self, *parts: str) -> list[str]:
        directory = self.path(*parts)
        try:
            return sorted(entry.name for entry in directory.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []

    def list_tree(self, *parts: str) -> list[tuple[str, ...]]:
        top = self.path(*parts)
        found: list[tuple[str, ...]] = []
        for directory, _, files in os.walk(top):
            below = Path(directory).relative_to(top).parts
            found.extend((*below, name) for name in files)
        return found

    def list_files(self, *parts: str) -> list[FileInfo]:
        found = []
        for name in self.list_names(*parts):
            try:
                stat = self.path(*parts, name).stat()
            except FileNotFoundError:  # (deleted meanwhile)
                continue
            if not S_ISDIR(stat.st_mode):
                found.append(FileInfo(name, stat.st_size, stat.st_mtime))
        return found

    def delete(self, *parts: str) -> None:
        self.path(*parts).unlink(missing_ok=True)

    def exists(self, *parts: str) -> bool:
        return self.path(*parts).exists()

    def stamp(self, *parts: str) -> str | None:
        """A ``stat``: inode, modification time and size (every write here is a rename of a
        new file, so a replaced file is a new inode)."""
        try:
            stat = self.path(*parts).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return f"{stat.st_ino}:{stat.st_mtime_ns}:{stat.st_size}"

    def delete_directory(self, *parts: str) -> None:
        shutil.rmtree(self.path(*parts), ignore_errors=True)

    @contextlib.contextmanager
    def atomic_output(self, *parts: str, sync_dir: bool = True,
                      sync_file: bool = True) -> Iterator[pa.NativeFile]:
        """``sync_dir=False`` leaves the directory's fsync to the caller (one per directory
        after a batch of files); ``sync_file=False`` the file's too (``make_durable`` after a
        batch: for files no reader trusts before a later durable record says so, as a flush's
        segments before its checkpoint)."""
        path = self.path(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temporary(path)
        try:
            with pa.OSFile(str(tmp), "wb") as sink:
                yield sink
            if sync_file:
                _fsync_file(tmp)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if sync_dir:
            fsync_directory(path.parent)


class ArrowFileStore(FileStore):
    """Files wherever a pyarrow filesystem reaches (object stores other than S3). A put is
    atomic and durable there, so ``write_atomically`` is one put; ``write_exclusively`` and
    ``write_if_match`` need conditional puts pyarrow does not make and are refused (S3 URLs
    open an ``S3FileStore``, which makes them)."""

    def __init__(self, fs: pafs.FileSystem, root: str, uri: str) -> None:
        self.fs = fs
        self.root = root
        self._uri = uri

    def __repr__(self) -> str:
        return f"ArrowFileStore({self._uri!r})"

    @property
    def uri(self) -> str:
        return self._uri

    def _path(self, *parts: str) -> str:
        return posixpath.join(self.root, *_checked(parts, self._uri))

    def child(self, *parts: str) -> ArrowFileStore:
        return ArrowFileStore(self.fs, self._path(*parts), self.uri_of(*parts))

    def arrow(self, *parts: str) -> tuple[pafs.FileSystem, str]:
        return self.fs, self._path(*parts)

    def read_bytes(self, *parts: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(self._path(*parts)) as stream:
                return stream.read()
        except FileNotFoundError:
            return None

    def write_atomically(self, *parts: str, data: bytes | memoryview,
                         durable: bool = True) -> None:
        path = self._path(*parts)
        # (filesystems with directories need the parents; on a bucket this is a marker at most)
        self.fs.create_dir(posixpath.dirname(path), recursive=True)
        with self.fs.open_output_stream(path) as stream:
            stream.write(data)

    def write_exclusively(self, *parts: str, data: bytes | memoryview) -> bool:
        raise NotImplementedError(
            f"{self.uri_of(*parts)}: creating a file only if absent needs a conditional put "
            "(If-None-Match), which this storage backend does not make yet")

    def list_names(self, *parts: str) -> list[str]:
        selector = pafs.FileSelector(self._path(*parts), allow_not_found=True, recursive=False)
        return sorted(posixpath.basename(info.path) for info in self.fs.get_file_info(selector))

    def delete(self, *parts: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self._path(*parts))

    def exists(self, *parts: str) -> bool:
        return self.fs.get_file_info(self._path(*parts)).type != pafs.FileType.NotFound

    @contextlib.contextmanager
    def atomic_output(self, *parts: str) -> Iterator[pa.NativeFile]:
        # (an object appears when its upload completes; an aborted block must not complete it)
        raise NotImplementedError(
            f"{self.uri_of(*parts)}: streaming writes to this storage backend are not "
            "supported yet")
        yield  # pragma: no cover
