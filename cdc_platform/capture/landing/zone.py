"""The landing zone's layout and checkpoint, for the engine that writes it and the lake that
reads it: file and directory names, the ``Checkpoint`` (its one parser; the snapshot session
records that it, ``ended_sessions.json`` and ``request.json`` keep are
``capture.landing.session_records``'s), the table catalog, ``LandingReader`` (one server's
folder, read from any store of ``capture.store.storage``) and ``LandingZone`` (the engine's
writable folder, local or on S3, through the same store), with the copies of the XA spill
files on object storage. The records' columns are ``capture.landing.records``'s; the engine
lock, lease and fencing of its writes are ``capture.landing.fencing``'s (``SingleWriter``,
which ``LandingZone`` is).

Layout and contracts: docs/landing-zone.md. Every file appears atomically (temporary name,
fsync, rename; one PUT on object storage), and the checkpoint is replaced only after every segment it covers is durable,
so a reader that trusts the checkpoint never sees a half-written or uncommitted file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_platform.capture.events import EngineError
from cdc_platform.capture.landing.fencing import (
    ENGINE_LEASE_TTL_SECONDS,
    LandingZoneTakenError,
    SingleWriter,
)
from cdc_platform.capture.landing.published import (
    PUBLISHED_DIR,
    PublishedMarks,
    published_name,
)
from cdc_platform.capture.landing.records import DICTIONARY_COLUMNS
from cdc_platform.capture.landing.session_records import (
    ENDED_SESSIONS_FILE,
    EndedSessions,
    SnapshotSession,
)
from cdc_platform.capture.names import name_of_path_component, path_component
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.store import open_store
from cdc_platform.capture.store.storage import (
    ArrowFileStore,
    FileStore,
    LocalFileStore,
    fsync_directory,
    make_durable,
    write_atomically,
)

if TYPE_CHECKING:
    from cdc_platform.config import S3Settings, Settings

# ---- the layout (docs/landing-zone.md), one definition for the engine and the lake ---------------

CHECKPOINT_FILE = "checkpoint.json"
TABLES_FILE = "tables.json"
CHANGELOG_DIR = "changelog"
SNAPSHOTS_DIR = "snapshots"
# The checkpoint's section of the engine's snapshot sessions (table id -> its record, which
# ``session_records.SnapshotSession`` reads), beside ``changes.xa_state.XA_CHECKPOINT_KEY``:
# the sessions the engine tracks, and those that ended a little while ago.
SNAPSHOTS_CHECKPOINT_KEY = "snapshots"
SEGMENT_NAME = re.compile(r"^(\d{20})-(\d{20})\.parquet$")
# A table's snapshot directory (``snapshot_parts``; docs/snapshots.md, ``snapshot.protocol``):
SNAPSHOT_REQUEST_FILE = "request.json"
SNAPSHOT_CONTROL_FILE = "control.json"
SNAPSHOT_CHUNKS_DIR = "chunks"  # chunks/<session id>/: chunk files and the reader's state
READER_LOCK_FILE = "reader.lock"  # local zones: a live reader's flock
READER_LEASE_FILE = "reader.lease"  # object stores: a live reader's lease (capture.store.lease)
COLUMN_RENAMES_DIR = "renames"
COLUMN_RENAMES_NAME = re.compile(r"^(\d{20})\.json$")
XA_DIR = "xa"  # object stores: copies of the spill files the checkpoint names

log = logging.getLogger(__name__)


def table_parts(database: str, table: str) -> tuple[str, str]:
    """A table's two directory names (``<db>/<table>``) below ``changelog/`` and ``snapshots/``,
    and in the warehouse: escaped by ``names.path_component`` (plain names stay as they are)."""
    return path_component(database), path_component(table)


def table_of_parts(database_dir: str, table_dir: str) -> tuple[str, str]:
    """``(database, table)`` of the directory names ``table_parts`` gave."""
    return name_of_path_component(database_dir), name_of_path_component(table_dir)


def _written_name(directory: str) -> str:
    """The name a directory was written for: decoded when it is in escaped form, else the name
    itself (written before names were escaped)."""
    try:
        name = name_of_path_component(directory)
        if path_component(name) == directory:
            return name
    except ValueError:  # invalid %-escapes (UnicodeDecodeError), or too long
        pass
    return directory


def changelog_parts(database: str, table: str) -> tuple[str, ...]:
    """The path of a table's changelog directory below the server's folder."""
    return (CHANGELOG_DIR, *table_parts(database, table))


def snapshot_parts(database: str, table: str) -> tuple[str, ...]:
    """The path of a table's snapshot directory (request, control, chunks) below the server's
    folder."""
    return (SNAPSHOTS_DIR, *table_parts(database, table))


def column_renames_parts(database: str, table: str) -> tuple[str, ...]:
    """The path of a table's column-rename records (``capture.ddl.column_renames``) below the
    server's folder."""
    return (COLUMN_RENAMES_DIR, *table_parts(database, table))


def column_renames_name(position: int) -> str:
    return f"{position:020d}.json"


def segment_name(first_pos: int, last_pos: int) -> str:
    return f"{first_pos:020d}-{last_pos:020d}.parquet"


def segment_write_options(column_names: list[str]) -> dict[str, Any]:
    """How a segment's Parquet is written (the engine's flushes and retention's compaction):
    zstd, the low-cardinality change columns dictionary-encoded, every other column plain."""
    return {"compression": "zstd",
            "use_dictionary": [name for name in DICTIONARY_COLUMNS if name in column_names]}


def tables_from_json(data: bytes | str) -> dict[str, TableSchema]:
    """``tables.json``: table id -> schema. Keyed by the ids of the schemas' own names, so a
    file written with another table-id form (before ids were quoted) reads the same."""
    schemas = [TableSchema.from_dict(v) for v in json.loads(data).get("tables", {}).values()]
    return {s.table_id: s for s in schemas}


def tables_to_json(tables: dict[str, TableSchema]) -> bytes:
    data = {"tables": {s.table_id: s.to_dict() for _, s in sorted(tables.items())}}
    return json.dumps(data, indent=1).encode()


def local_path(url: str) -> Path:
    """A local directory for a landing-zone URL (plain path or file:// URL); ValueError for an
    object-store URL (``LandingZone`` opens those as stores of their own)."""
    root = open_store(url).local_root
    if root is None:
        raise ValueError(f"landing zone URL {url!r} is not a local path or file:// URL")
    return root


def _xa_files(checkpoint: Checkpoint) -> set[str]:
    """The spill files a checkpoint names (its prepared XA transactions)."""
    from cdc_platform.capture.changes.xa_state import XA_CHECKPOINT_KEY

    state = checkpoint.extra.get(XA_CHECKPOINT_KEY) or {}
    return {part["file"] for entry in state.values() for part in entry.get("parts", ())}


@dataclass
class Checkpoint:
    """The engine's commit point: everything before ``next_pos`` is durable and covered."""

    server_name: str
    flavour: str
    gtid: str = ""
    next_pos: int = 1
    written_at: str = ""
    lag_seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        data = {
            "server_name": self.server_name, "flavour": self.flavour, "gtid": self.gtid,
            "next_pos": self.next_pos, "written_at": self.written_at,
            "lag_seconds": self.lag_seconds, **self.extra,
        }
        return json.dumps(data, indent=1).encode()

    def check_flavour(self, flavour: str) -> None:
        """Raise EngineError unless the checkpoint was written for a ``flavour`` source: its
        GTID set reads only in the flavour that wrote it, and resuming another flavour's
        position would skip or replay transactions."""
        if self.flavour != flavour:
            raise EngineError(
                f"checkpoint of {self.server_name} was written for a {self.flavour} source but "
                f"source.flavour is {flavour}: fix the config or point landing_zone.url "
                "elsewhere")

    def snapshot_session(self, table_id: str) -> SnapshotSession | None:
        """The engine's record of the table's snapshot session (``SNAPSHOTS_CHECKPOINT_KEY``),
        or None; the one parser of the record (``SnapshotSession.from_dict``), for the engine,
        the snapshot reader and retention. KeyError, TypeError or ValueError when the record
        does not read (its ``state`` not a ``SessionState``)."""
        state = (self.extra.get(SNAPSHOTS_CHECKPOINT_KEY) or {}).get(table_id)
        return SnapshotSession.from_dict(state, table_id) if isinstance(state, dict) else None

    @staticmethod
    def from_json(text: bytes | str) -> Checkpoint:
        data = json.loads(text)
        known = {"server_name", "flavour", "gtid", "next_pos", "written_at", "lag_seconds"}
        return Checkpoint(
            server_name=data["server_name"], flavour=data["flavour"], gtid=data.get("gtid", ""),
            next_pos=int(data.get("next_pos", 1)), written_at=data.get("written_at", ""),
            lag_seconds=data.get("lag_seconds"),
            extra={k: v for k, v in data.items() if k not in known},
        )


@dataclass(frozen=True)
class Survey:
    """One look at a server's landing zone: the checkpoint, then every table's changelog
    segments and column-rename records (``LandingReader.survey``). A pass of the applier reads
    this once for all its tables, instead of a checkpoint read and two listings per table (on
    object storage a request each: a thousand tables, thousands of requests a pass)."""

    checkpoint: Checkpoint | None
    # by a table's directory names (``table_parts``): (first_pos, last_pos, name), in order
    segments: Mapping[tuple[str, str], list[tuple[int, int, str]]]
    # by a table's directory names: (position, name) of its column-rename records, in order
    renames: Mapping[tuple[str, str], list[tuple[int, str]]]

    def segment_names(self, database: str, table: str) -> list[tuple[int, int, str]]:
        """``LandingReader.segment_names`` as of the survey."""
        return self.segments.get(table_parts(database, table), [])

    def column_renames_names(self, database: str, table: str) -> list[tuple[int, str]]:
        """``LandingReader.column_renames_names`` as of the survey."""
        return self.renames.get(table_parts(database, table), [])


class LandingReader:
    """One source server's folder in the landing zone, read through the file layer
    (``capture.store.storage``): what the lake reads, from any store the layer opens."""

    def __init__(self, store: FileStore, server_name: str) -> None:
        self.store = store.child(server_name)
        self.server_name = server_name

    @staticmethod
    def open(url: str, server_name: str, *, s3: S3Settings | None = None) -> LandingReader:
        """The reader of ``server_name``'s folder at a landing-zone URL (local or not; ``s3``:
        the config's ``s3`` options for an S3 URL)."""
        return LandingReader(open_store(url, s3=s3, setting="landing_zone.url"), server_name)

    def read_checkpoint(self) -> Checkpoint | None:
        """The engine's checkpoint, or None before its first one. The one parser of
        ``checkpoint.json`` (``Checkpoint.from_json``), for the engine and the lake."""
        data = self.store.read_bytes(CHECKPOINT_FILE)
        if data is None:
            return None
        what = (f"checkpoint {self.store.uri_of(CHECKPOINT_FILE)} is not valid (expected JSON "
                "with server_name, flavour and next_pos; it is written by the capture engine, "
                "check that the landing URL is right)")
        try:
            return Checkpoint.from_json(data)
        except json.JSONDecodeError as exc:  # (still one, for callers that catch it)
            raise json.JSONDecodeError(f"{what}: {exc.msg}", exc.doc, exc.pos) from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{what}: {exc!r}") from exc

    def read_tables(self) -> dict[str, TableSchema]:
        """The captured tables' newest schemas, as the engine last recorded them."""
        data = self.store.read_bytes(TABLES_FILE)
        return {} if data is None else tables_from_json(data)

    def segment_names(self, database: str, table: str) -> list[tuple[int, int, str]]:
        """``(first_pos, last_pos, file name)`` of a table's changelog segments, in position
        order; temporary files and anything not named like a segment are left out."""
        found = []
        for name in self.store.list_names(*changelog_parts(database, table)):
            match = SEGMENT_NAME.match(name)
            if match:
                found.append((int(match.group(1)), int(match.group(2)), name))
        return sorted(found)

    def survey(self) -> Survey:
        """The checkpoint, then every table's segments and column-rename records, each set in
        one listing. In that order: a segment below the checkpoint's ``next_pos`` was written
        before the checkpoint, so the listing after the read finds it (a batch that skipped
        one would consume past it: lost changes)."""
        checkpoint = self.read_checkpoint()
        segments: dict[tuple[str, str], list[tuple[int, int, str]]] = {}
        for parts in self.store.list_tree(CHANGELOG_DIR):
            if len(parts) == 3 and (match := SEGMENT_NAME.match(parts[2])):
                segments.setdefault((parts[0], parts[1]), []).append(
                    (int(match.group(1)), int(match.group(2)), parts[2]))
        renames: dict[tuple[str, str], list[tuple[int, str]]] = {}
        for parts in self.store.list_tree(COLUMN_RENAMES_DIR):
            if len(parts) == 3 and (match := COLUMN_RENAMES_NAME.match(parts[2])):
                renames.setdefault((parts[0], parts[1]), []).append(
                    (int(match.group(1)), parts[2]))
        for found in (*segments.values(), *renames.values()):
            found.sort()
        return Survey(checkpoint, segments, renames)

    def changelog_tables(self) -> list[tuple[str, str]]:
        """``(database, table)`` of every table with a changelog directory, in directory order.
        Only directories in escaped form (``table_parts`` of the names they decode to): one
        an earlier engine wrote under a raw name is moved by the next engine start, and is
        left alone until then."""
        found = []
        for db_dir in self.store.list_names(CHANGELOG_DIR):
            for table_dir in self.store.list_names(CHANGELOG_DIR, db_dir):
                try:
                    names = table_of_parts(db_dir, table_dir)
                    if table_parts(*names) == (db_dir, table_dir):
                        found.append(names)
                except ValueError:  # (invalid %-escapes, or too long)
                    continue
        return found

    def column_renames_names(self, database: str, table: str) -> list[tuple[int, str]]:
        """``(position, file name)`` of a table's column-rename records, in position order."""
        found = []
        for name in self.store.list_names(*column_renames_parts(database, table)):
            match = COLUMN_RENAMES_NAME.match(name)
            if match:
                found.append((int(match.group(1)), name))
        return sorted(found)

    def read_published(self, publisher: str) -> PublishedMarks | None:
        """``publisher``'s record (``capture.landing.published``), None before its first."""
        found = self.published_version(publisher)
        return None if found is None else found[0]

    def published_version(self, publisher: str) -> tuple[PublishedMarks, str] | None:
        """``publisher``'s record and the version token its next ``write_published`` names."""
        found = self.store.read_versioned(PUBLISHED_DIR, published_name(publisher))
        if found is None:
            return None
        data, etag = found
        try:
            return PublishedMarks.from_json(data), etag
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{self.store.uri_of(PUBLISHED_DIR, published_name(publisher))} is not a valid "
                f"publisher record ({exc!r}); it is written by the {publisher} publisher"
            ) from exc

    def write_published(self, marks: PublishedMarks, etag: str | None) -> str | None:
        """Replace the publisher's record if it is still the version ``etag`` (None: create it
        if there is none); the new version's token, or None when another writer changed it
        (a second publisher of this source took over)."""
        return self.store.write_versioned(PUBLISHED_DIR, published_name(marks.publisher),
                                          data=marks.to_json(), etag=etag)


class LandingZone(SingleWriter, LandingReader):
    """One source server's folder in the landing zone, as the engine writes it: a local
    directory, or a prefix of an S3 bucket (``s3://bucket/prefix``), through one ``FileStore``.

    Locally every file is written under a temporary name, fsynced and renamed, and one engine
    holds an ``flock`` (``engine_lock``). On object storage a PUT is atomic and durable; one
    engine holds a ``Lease`` (renewed in the background) and every checkpoint is a
    compare-and-swap on the version it replaces, so that an engine whose lease expired while it
    was frozen can never commit after another took over (``LandingZoneTakenError``).

    ``root`` is a local directory either way: the zone itself when it is local, else a local
    scratch directory of this zone (spill files, which are engine-private and never landing
    data). Every landing file is read and written through ``store`` with path parts below the
    server's folder (``changelog_parts``, ``snapshot_parts``, ...), alike on both; the few
    methods returning local paths (``checkpoint_path``, ``table_dir``, ``segments``) serve
    tools that look at a local zone's files and raise on object storage.
    """

    def __init__(self, url: str | FileStore, server_name: str, *, s3: S3Settings | None = None,
                 scratch: Path | None = None,
                 lease_ttl_seconds: float = ENGINE_LEASE_TTL_SECONDS) -> None:
        store = url if isinstance(url, FileStore) else open_store(
            url, s3=s3, setting="landing_zone.url")
        self._init_single_writer(lease_ttl_seconds)
        self.segment_bytes = 0  # bytes of the segments ``write_segment`` wrote
        if isinstance(store, ArrowFileStore):
            raise ValueError(
                f"landing_zone.url {store.uri}: the capture engine writes only local paths, "
                "file:// and s3:// URLs (an object store needs conditional PUTs to publish "
                "files)")
        super().__init__(store, server_name)
        self.local: Path | None = self.store.local_root
        if self.local is not None:
            self.root = self.local
        else:
            digest = hashlib.sha256(self.store.uri.encode()).hexdigest()[:16]
            self.root = scratch or Path(tempfile.gettempdir()) / "cdc_platform-scratch" / digest
        self._xa_uploaded: set[str] = set()

    @staticmethod
    def from_settings(settings: Settings, server_name: str | None = None) -> LandingZone:
        """The zone at ``landing_zone.url``, with the config's ``s3`` options for S3 URLs."""
        return LandingZone(settings.landing_zone.url, server_name or settings.source.server_name,
                           s3=settings.s3)

    @property
    def is_local(self) -> bool:
        return self.local is not None

    @property
    def spill_dir(self) -> Path:
        """The engine's spill folder: local scratch (in the zone when it is local)."""
        return self.root / "spill"

    def _local_path(self, *parts: str) -> Path:
        if self.local is None:
            raise ValueError(
                f"landing zone {self.store.uri}: {'/'.join(parts)} has no local path on object "
                "storage; read it through the zone's store (landing.store, read_checkpoint, "
                "segment_names)")
        return self.local.joinpath(*parts)

    @property
    def checkpoint_path(self) -> Path:
        return self._local_path(CHECKPOINT_FILE)

    def table_dir(self, database: str, table: str) -> Path:
        return self._local_path(*changelog_parts(database, table))

    def where(self, *parts: str) -> Path | str:
        """A file's local path on a local zone, else its URL (for logs and return values)."""
        return self.local.joinpath(*parts) if self.local is not None else self.store.uri_of(
            *parts)

    # ---- the single writer (``fencing``) ------------------------------------------------

    @contextlib.contextmanager
    def engine_lock(self) -> Iterator[None]:
        """At most one engine per server name writes here: an exclusive ``flock`` of a local
        file; on object storage a ``Lease`` (``engine.lease``, renewed every third of its ttl
        by a daemon thread, released on exit), and the checkpoint's compare-and-swap.

        On Kubernetes the streaming job's tag concurrency limit enforces the same across pods.
        """
        if self.local is None:
            with self._engine_lease(CHECKPOINT_FILE):
                self._restore_xa_files()  # (renewed meanwhile: large files take a while)
                yield
            return
        with self._engine_flock():
            self.escape_legacy_dirs()
            yield

    # ---- writes ----------------------------------------------------------------------------

    def escape_legacy_dirs(self) -> list[tuple[Path, Path]]:
        """Move table directories written before names were escaped (``changelog/db/2024
        sales`` by an earlier engine) to their escaped names, so no landed change or snapshot
        file is left where the lake no longer looks. Runs under the engine lock; returns the
        moves. A name is taken as escaped when it is the escape of its own decoding. Local
        zones only: object-store zones were never written under raw names."""
        moved: list[tuple[Path, Path]] = []
        if self.local is None:
            return moved
        for top in (CHANGELOG_DIR, SNAPSHOTS_DIR):
            base = self.root / top
            pairs = [(d, t) for d in base.iterdir() if d.is_dir() for t in d.iterdir()
                     if t.is_dir()] if base.is_dir() else []
            for db_dir, table_dir in pairs:
                target = base.joinpath(*table_parts(_written_name(db_dir.name),
                                                    _written_name(table_dir.name)))
                if target == table_dir:
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.exists():  # both: move the files (segment names never clash)
                    for entry in table_dir.iterdir():
                        os.replace(entry, target / entry.name)
                    table_dir.rmdir()
                else:
                    os.replace(table_dir, target)
                fsync_directory(target.parent)
                with contextlib.suppress(OSError):  # another table may still live there
                    db_dir.rmdir()
                moved.append((table_dir, target))
                log.warning(f"landing zone: moved {table_dir} to {target} (names are escaped "
                            "since this version; docs/landing-zone.md)")
        return moved

    def write_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Replace the checkpoint atomically (after everything it covers is durable). On
        object storage under the engine lock: a compare-and-swap on the version this engine
        last read or wrote; a lost swap raises ``LandingZoneTakenError``."""
        data = checkpoint.to_json()
        named = self._upload_xa_files(checkpoint)
        if not self._fenced:
            self.store.write_atomically(CHECKPOINT_FILE, data=data)
            self._forget_xa_files(named)
            return
        self._check_fence()
        written = self.store.write_versioned(CHECKPOINT_FILE, data=data,
                                             etag=self._checkpoint_etag)
        if written is None:
            self._lease_lost.set()
            raise LandingZoneTakenError(
                f"capture engine {self.server_name!r}: the checkpoint "
                f"{self.store.uri_of(CHECKPOINT_FILE)} changed since this engine wrote it: "
                "another engine took over the landing zone (this one's lease had expired); "
                "stopping without committing")
        # (the version this write made: a replacement by another engine fails the next swap)
        self._checkpoint_etag = written
        self._forget_xa_files(named)

    # ---- prepared XA transactions' spill files on object storage ----------------------------

    def _upload_xa_files(self, checkpoint: Checkpoint) -> set[str] | None:
        """On object storage: the spill files the checkpoint names (prepared XA transactions,
        ``changes.xa_state``) are local scratch, so they are copied to ``xa/`` before the
        checkpoint that names them is written (a new pod restores them from there). Returns
        the names (None on local zones, where the spill folder is in the zone)."""
        if self.local is not None:
            return None
        named = _xa_files(checkpoint)
        for name in sorted(named - self._xa_uploaded):
            self._check_fence()
            with open(self.spill_dir / name, "rb") as source, \
                    self.store.atomic_output(XA_DIR, name) as sink:
                while block := source.read(1 << 20):
                    sink.write(block)
            self._xa_uploaded.add(name)
        return named

    def _forget_xa_files(self, named: set[str] | None) -> None:
        """After a durable checkpoint: copies it no longer names are deleted."""
        if named is None:
            return
        for name in sorted(self._xa_uploaded - named):
            self.store.delete(XA_DIR, name)
            self._xa_uploaded.discard(name)

    def _restore_xa_files(self) -> None:
        """At engine start on object storage: the spill files the checkpoint names, fetched
        into the local spill folder (where ``xa_state.restore_prepared`` finds them); copies
        nothing names are deleted."""
        checkpoint = self.read_checkpoint()
        named = _xa_files(checkpoint) if checkpoint is not None else set()
        for name in sorted(named):
            data = self.store.read_bytes(XA_DIR, name)
            if data is None:
                continue  # (restore_prepared names the missing file and stops)
            self.spill_dir.mkdir(parents=True, exist_ok=True)
            write_atomically(self.spill_dir / name, data)
        self._xa_uploaded = set(named)
        for name in self.store.list_names(XA_DIR):
            if name not in named:
                self.store.delete(XA_DIR, name)

    def write_tables(self, tables: dict[str, TableSchema]) -> None:
        self._check_fence()
        self.store.write_atomically(TABLES_FILE, data=tables_to_json(tables))

    def write_ended_sessions(self, ended: EndedSessions) -> None:
        """Replace ``ended_sessions.json`` atomically and durably (the engine, before the
        checkpoint that no longer records the sessions it adds)."""
        self._check_fence()
        self.store.write_atomically(ENDED_SESSIONS_FILE, data=ended.to_json())

    def write_segment(self, schema: TableSchema, table: pa.Table, first_pos: int,
                      last_pos: int) -> Path | str:
        """Write one segment; the caller checkpoints after all segments of a flush, having
        made them durable (``sync_dirs``: locally the files and their names at once; no reader
        reads a segment before a durable checkpoint covers it, and an engine start deletes
        those past its checkpoint, whole or not). Returns its local path (its URL on object
        storage, where a segment is durable when its PUT returns)."""
        self._check_fence()
        parts = (*changelog_parts(schema.database, schema.table), segment_name(first_pos,
                                                                               last_pos))
        if isinstance(self.store, LocalFileStore):
            with self.store.atomic_output(*parts, sync_dir=False, sync_file=False) as sink:
                pq.write_table(table, sink, **segment_write_options(table.column_names))
                self.segment_bytes += sink.tell()
        else:
            with self.store.atomic_output(*parts) as sink:
                pq.write_table(table, sink, **segment_write_options(table.column_names))
                self.segment_bytes += sink.tell()
        return self.where(*parts)

    def sync_dirs(self, paths: list[Path] | list[Path | str]) -> None:
        """Make written segments and their names durable (``storage.make_durable``: one
        ``syncfs`` for a flush's every file); nothing on object storage (an object is durable
        when its PUT returns; there are no directories)."""
        make_durable([p for p in paths if isinstance(p, Path)])

    def segments(self, database: str, table: str) -> list[tuple[int, int, Path]]:
        """``(first, last, path)`` of a table's segments (local zones; ``segment_names``
        anywhere)."""
        directory = self.table_dir(database, table)
        return [(first, last, directory / name)
                for first, last, name in self.segment_names(database, table)]

    def remove_uncommitted(self, next_pos: int) -> list[Path | str]:
        """Delete segments (and temp files) written after the last checkpoint.

        They belong to transactions the engine will replay with the same positions; readers
        never read past the checkpoint, so nobody has seen them.
        Column-rename records at or after ``next_pos`` go too: the replay records them again
        (at the same positions), or not at all if the configuration changed since.
        """
        removed: list[Path | str] = []
        for top, pattern in ((CHANGELOG_DIR, SEGMENT_NAME),
                             (COLUMN_RENAMES_DIR, COLUMN_RENAMES_NAME)):
            for db_dir in self.store.list_names(top):
                for table_dir in self.store.list_names(top, db_dir):
                    for name in self.store.list_names(top, db_dir, table_dir):
                        match = pattern.match(name)
                        stale_tmp = name.startswith(".") and ".tmp-" in name
                        if stale_tmp or (match and int(match.group(1)) >= next_pos):
                            self.store.delete(top, db_dir, table_dir, name)
                            removed.append(self.where(top, db_dir, table_dir, name))
        return removed
