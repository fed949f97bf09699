"""The landing zone's layout and checkpoint, for the engine that writes it and the lake that
reads it: file and directory names, the ``Checkpoint`` (its one parser), the table catalog,
``LandingReader`` (one server's folder, read from any store of ``capture.storage``) and
``LandingZone`` (the engine's local, writable folder). The records' columns are
``capture.landing_contract``'s.

Layout and contracts: docs/landing-zone.md. Every file appears atomically (temporary name,
fsync, rename), and the checkpoint is replaced only after every segment it covers is durable,
so a reader that trusts the checkpoint never sees a half-written or uncommitted file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_platform.capture.landing_contract import DICTIONARY_COLUMNS
from cdc_platform.capture.names import name_of_path_component, path_component
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.storage import FileStore, LocalFileStore, fsync_directory, open_store

# ---- the layout (docs/landing-zone.md), one definition for the engine and the lake ---------------

CHECKPOINT_FILE = "checkpoint.json"
TABLES_FILE = "tables.json"
CHANGELOG_DIR = "changelog"
SNAPSHOTS_DIR = "snapshots"
SEGMENT_NAME = re.compile(r"^(\d{20})-(\d{20})\.parquet$")
COLUMN_RENAMES_DIR = "renames"
COLUMN_RENAMES_NAME = re.compile(r"^(\d{20})\.json$")

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
    """A local directory for a landing-zone URL (plain path or file:// URL).

    Object-storage URLs need a writer of their own (a conditional put instead of a rename):
    ``capture.storage`` is the seam; the engine writes only local stores in this version.
    """
    root = open_store(url).local_root
    if root is None:
        raise ValueError(
            f"landing zone URL {url!r}: only local paths and file:// URLs are supported by the "
            "capture engine in this version"
        )
    return root


class EngineLockedError(RuntimeError):
    """Another engine holds the server's landing folder: a start failure, not a crash."""


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


class LandingReader:
    """One source server's folder in the landing zone, read through the file layer
    (``capture.storage``): what the lake reads, from any store the layer opens."""

    def __init__(self, store: FileStore, server_name: str) -> None:
        self.store = store.child(server_name)
        self.server_name = server_name

    @staticmethod
    def open(url: str, server_name: str) -> LandingReader:
        """The reader of ``server_name``'s folder at a landing-zone URL (local or not)."""
        return LandingReader(open_store(url), server_name)

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


class LandingZone(LandingReader):
    """One source server's folder in the landing zone, as the engine writes it: a local
    directory (object stores need the conditional puts ``capture.storage`` will bring)."""

    store: LocalFileStore

    def __init__(self, url: str, server_name: str) -> None:
        super().__init__(LocalFileStore(local_path(url)), server_name)
        self.root = self.store.root

    @property
    def checkpoint_path(self) -> Path:
        return self.root / CHECKPOINT_FILE

    def table_dir(self, database: str, table: str) -> Path:
        return self.root.joinpath(*changelog_parts(database, table))

    def snapshot_dir(self, database: str, table: str) -> Path:
        return self.root.joinpath(*snapshot_parts(database, table))

    @contextlib.contextmanager
    def engine_lock(self) -> Iterator[None]:
        """At most one engine per server name writes here (an exclusive lock on a local file).

        On Kubernetes the streaming job's tag concurrency limit enforces the same across pods.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        handle = open(self.root / "engine.lock", "a+")  # noqa: SIM115 - held for the run
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                raise EngineLockedError(
                    f"another capture engine is already streaming {self.server_name!r} into "
                    f"{self.root} ({holder}); stop it first: one engine per source server"
                ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}")
            handle.flush()
            self.escape_legacy_dirs()
            yield
        finally:
            handle.close()

    def escape_legacy_dirs(self) -> list[tuple[Path, Path]]:
        """Move table directories written before names were escaped (``changelog/db/2024
        sales`` by an earlier engine) to their escaped names, so no landed change or snapshot
        file is left where the lake no longer looks. Runs under the engine lock; returns the
        moves. A name is taken as escaped when it is the escape of its own decoding."""
        moved: list[tuple[Path, Path]] = []
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
        self.store.write_atomically(CHECKPOINT_FILE, data=checkpoint.to_json())

    def write_tables(self, tables: dict[str, TableSchema]) -> None:
        self.store.write_atomically(TABLES_FILE, data=tables_to_json(tables))

    def column_renames_dir(self, database: str, table: str) -> Path:
        return self.root.joinpath(*column_renames_parts(database, table))

    def write_segment(self, schema: TableSchema, table: pa.Table, first_pos: int,
                      last_pos: int) -> Path:
        """Write one segment durably; the caller checkpoints after all segments of a flush,
        having synced their directories (``sync_dirs``)."""
        parts = (*changelog_parts(schema.database, schema.table), segment_name(first_pos,
                                                                               last_pos))
        with self.store.atomic_output(*parts, sync_dir=False) as sink:
            pq.write_table(table, sink, **segment_write_options(table.column_names))
        return self.store.path(*parts)

    def sync_dirs(self, paths: list[Path]) -> None:
        for directory in {p.parent for p in paths}:
            fsync_directory(directory)

    def segments(self, database: str, table: str) -> list[tuple[int, int, Path]]:
        directory = self.table_dir(database, table)
        return [(first, last, directory / name)
                for first, last, name in self.segment_names(database, table)]

    def remove_uncommitted(self, next_pos: int) -> list[Path]:
        """Delete segments (and temp files) written after the last checkpoint.

        They belong to transactions the engine will replay with the same positions; readers
        never read past the checkpoint, so nobody has seen them.
        Column-rename records at or after ``next_pos`` go too: the replay records them again
        (at the same positions), or not at all if the configuration changed since.
        """
        removed: list[Path] = []
        for top, pattern in ((CHANGELOG_DIR, SEGMENT_NAME),
                             (COLUMN_RENAMES_DIR, COLUMN_RENAMES_NAME)):
            for db_dir in self.store.list_names(top):
                for table_dir in self.store.list_names(top, db_dir):
                    for name in self.store.list_names(top, db_dir, table_dir):
                        match = pattern.match(name)
                        stale_tmp = name.startswith(".") and ".tmp-" in name
                        if stale_tmp or (match and int(match.group(1)) >= next_pos):
                            self.store.delete(top, db_dir, table_dir, name)
                            removed.append(self.store.path(top, db_dir, table_dir, name))
        return removed
