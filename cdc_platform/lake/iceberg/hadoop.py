"""The local Hadoop-catalog warehouse through pyiceberg, without Spark: load, create and commit
tables in the layout Iceberg's ``HadoopTableOperations`` reads and writes.

A table is ``<warehouse>/<namespace>/<table>``; its versions are
``metadata/v<N>.metadata.json``, and ``metadata/version-hint.text`` names the newest (a hint:
readers also look for ``v<N+1>``, as Java's does). pyiceberg 0.12 reads such a table
(``StaticTable``) but cannot commit to it, so the commit is here, as Java's: the new version
is written to a temporary file and published under ``v<N+1>.metadata.json`` by ``os.link``,
which fails when that name exists, so of two writers racing for one version exactly one wins
and the other gets ``ConcurrentCommitError`` (Java's rename onto it overwrites on a local
filesystem; that is why every writer also holds ``locks.table_lock``). Then the hint is
replaced atomically (Java deletes it and renames a new one in; a reader meanwhile lists the
directory). A commit is refused unless the table is still at the version it was loaded from:
compare-and-swap on the whole metadata, as Java's ``commit(base, metadata)``.

A lost race is ConcurrentCommitError, not pyiceberg's CommitFailedException: on that one a
pyiceberg transaction refreshes the table and commits its append again on top of the
winner's, which for the lake would be every row twice and the wrong consumed mark. The
caller decides what to do instead (``lake.merge.materialise`` runs again from the new
snapshot).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyiceberg.catalog import MetastoreCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
)
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.serializers import FromInputFile, ToOutputFile
from pyiceberg.table import CommitTableResponse, StagedTable, Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
    update_table_metadata,
)

from cdc_platform.capture.store import open_store
from cdc_platform.lake.iceberg.commit import ConcurrentCommitError

if TYPE_CHECKING:
    from pyiceberg.table import TableRequirement, TableUpdate
    from pyiceberg.typedef import Identifier, Properties

VERSION_HINT = "version-hint.text"
_VERSION_FILE = re.compile(r"v(\d+)\.metadata\.json")


class LocalHadoopCatalog(MetastoreCatalog):
    """A Hadoop catalog on a local warehouse directory: what the lake's Spark-free writer
    needs of it (load, create in one commit with the first data, commit), nothing more."""

    def __init__(self, name: str, root: Path, uri: str) -> None:
        super().__init__(name, warehouse=uri)
        self.root = root  # the warehouse as a local directory
        self.uri = uri.rstrip("/")  # and as the tables' locations name it (file:///...)
        # Each table's newest metadata this catalog read or wrote, by version: a version's
        # file never changes, so a load finding the same version parses nothing (at a hundred
        # snapshots the metadata file is a few hundred kB of JSON, parsed per merge).
        self._metadata: dict[tuple[str, str], tuple[int, TableMetadata]] = {}
        self._io: FileIO | None = None

    # -- layout ---------------------------------------------------------------------------

    def _parts(self, identifier: str | Identifier) -> tuple[str, str]:
        parts = self.identifier_to_tuple(identifier)
        if len(parts) != 2:
            raise NoSuchTableError(f"{parts}: a lake table is <namespace>.<table>")
        return parts[0], parts[1]

    def metadata_dir(self, identifier: str | Identifier) -> Path:
        namespace, table = self._parts(identifier)
        return self.root / namespace / table / "metadata"

    def location(self, identifier: str | Identifier) -> str:
        namespace, table = self._parts(identifier)
        return f"{self.uri}/{namespace}/{table}"

    def _metadata_uri(self, identifier: str | Identifier, version: int) -> str:
        # (as Java names it in metadata logs: file:/path)
        path = self.metadata_dir(identifier) / f"v{version}.metadata.json"
        return f"file:{path}"

    def current_version(self, identifier: str | Identifier) -> int | None:
        """The newest version, as Java's ``HadoopTableOperations.findVersion`` and
        ``refresh`` find it: the hint, else the highest file; then any ``v<N+1>`` beyond.
        None: no table."""
        directory = self.metadata_dir(identifier)
        try:
            version = int((directory / VERSION_HINT).read_text().strip())
        except (OSError, ValueError):
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                return None
            found = [int(m.group(1)) for m in map(_VERSION_FILE.fullmatch, names) if m]
            if not found:
                return None
            version = max(found)
        while (directory / f"v{version + 1}.metadata.json").exists():
            version += 1
        if not (directory / f"v{version}.metadata.json").exists():
            raise NoSuchTableError(
                f"{directory}: {VERSION_HINT} names version {version}, whose metadata file "
                "is missing (a compressed metadata file is not read here)")
        return version

    # -- reading --------------------------------------------------------------------------

    def load_table(self, identifier: str | Identifier) -> Table:
        version = self.current_version(identifier)
        if version is None:
            raise NoSuchTableError(f"no table {identifier} in {self.uri}")
        parts = self._parts(identifier)
        location = self._metadata_uri(identifier, version)
        io = self._file_io(location)
        known = self._metadata.get(parts)
        if known is not None and known[0] == version:
            metadata = known[1]
        else:
            metadata = FromInputFile.table_metadata(io.new_input(location))
            self._metadata[parts] = (version, metadata)
        return Table(parts, metadata, location, io, self)

    def _file_io(self, location: str) -> FileIO:
        """One FileIO for the catalog's tables (its filesystem made once)."""
        if self._io is None:
            self._io = load_file_io(self.properties, location)
        return self._io

    def load_namespace_properties(self, namespace: str | Identifier) -> Properties:
        name = self.namespace_to_string(namespace)
        if not (self.root / name).is_dir():
            raise NoSuchNamespaceError(f"no namespace {name} in {self.uri}")
        return {}

    def list_namespaces(self, namespace: str | Identifier = ()) -> list[Identifier]:
        if namespace:
            return []
        return [(p.name,) for p in sorted(self.root.iterdir()) if p.is_dir()] \
            if self.root.is_dir() else []

    def list_tables(self, namespace: str | Identifier) -> list[Identifier]:
        name = self.namespace_to_string(namespace)
        directory = self.root / name
        if not directory.is_dir():
            raise NoSuchNamespaceError(f"no namespace {name} in {self.uri}")
        return [(name, p.name) for p in sorted(directory.iterdir())
                if self.current_version((name, p.name)) is not None]

    # -- writing --------------------------------------------------------------------------

    def create_namespace(self, namespace: str | Identifier,
                         properties: Properties | None = None) -> None:
        name = self.namespace_to_string(namespace)
        try:
            (self.root / name).mkdir(parents=True)
        except FileExistsError:
            raise NamespaceAlreadyExistsError(name) from None

    def create_table(self, identifier: str | Identifier, schema: Any, location: str | None = None,
                     partition_spec: Any = None, sort_order: Any = None,
                     properties: Properties | None = None) -> Table:
        """Create an empty table (its first version, no snapshot)."""
        kwargs = {k: v for k, v in {"partition_spec": partition_spec,
                                     "sort_order": sort_order}.items() if v is not None}
        transaction = self.create_table_transaction(identifier, schema, location,
                                                    properties=properties or {}, **kwargs)
        return transaction.commit_transaction()

    def commit_table(self, table: Table, requirements: tuple[TableRequirement, ...],
                     updates: tuple[TableUpdate, ...]) -> CommitTableResponse:
        """Publish the next version if the table is still at the one ``table`` was loaded
        from (a staged table: if there is no table yet); ConcurrentCommitError otherwise
        (never retried by pyiceberg: see the module's docstring)."""
        try:
            return self._commit(table, requirements, updates)
        except CommitFailedException as error:
            raise ConcurrentCommitError(
                f"table {'.'.join(table.name())} in {self.uri}: {error}") from None

    def _commit(self, table: Table, requirements: tuple[TableRequirement, ...],
                updates: tuple[TableUpdate, ...]) -> CommitTableResponse:
        identifier = table.name()
        version = self.current_version(identifier)
        if isinstance(table, StagedTable):
            if version is not None:
                raise CommitFailedException(f"table {identifier} already exists")
            current = None
        else:
            loaded = _version_of(table.metadata_location)
            if version != loaded:
                raise CommitFailedException(
                    f"table {identifier} moved from version {loaded} to {version} since it "
                    "was loaded")
            current = table  # (its version is the newest: the file it was read from)
        for requirement in requirements:
            requirement.validate(current.metadata if current is not None else None)
        if current is None:
            metadata = update_table_metadata(base_metadata=self._empty_table_metadata(),
                                             updates=updates, enforce_validation=True)
        else:
            metadata = _updated(current.metadata, updates, current.metadata_location)
        next_version = (version or 0) + 1
        directory = self.metadata_dir(identifier)
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / f"v{next_version}.metadata.json"
        temporary = directory / f"{uuid.uuid4()}.metadata.json"
        io = self._file_io(str(final))
        ToOutputFile.table_metadata(metadata, io.new_output(str(temporary)))
        try:
            os.link(temporary, final)  # the commit: exclusive, never replaces
        except FileExistsError:
            raise CommitFailedException(
                f"another writer committed version {next_version} of {identifier} "
                "first") from None
        finally:
            temporary.unlink(missing_ok=True)
        _write_version_hint(directory, next_version)
        self._metadata[self._parts(identifier)] = (next_version, metadata)
        if current is not None:  # (as Java's HadoopTableOperations, when the table says so)
            self._delete_old_metadata(io, current.metadata, metadata)
        return CommitTableResponse(metadata=metadata,
                                   metadata_location=self._metadata_uri(identifier,
                                                                        next_version))

    # -- not needed by the lake: refused ---------------------------------------------------

    def register_table(self, identifier: str | Identifier, metadata_location: str,
                       overwrite: bool = False) -> Table:
        raise NotImplementedError

    def drop_table(self, identifier: str | Identifier) -> None:
        raise NotImplementedError

    def rename_table(self, from_identifier: str | Identifier,
                     to_identifier: str | Identifier) -> Table:
        raise NotImplementedError

    def drop_namespace(self, namespace: str | Identifier) -> None:
        raise NotImplementedError

    def update_namespace_properties(self, namespace: str | Identifier,
                                    removals: set[str] | None = None,
                                    updates: Properties | None = None) -> Any:
        raise NotImplementedError

    def list_views(self, namespace: str | Identifier) -> list[Identifier]:
        return []

    def load_view(self, identifier: str | Identifier) -> Any:
        raise NotImplementedError

    def view_exists(self, identifier: str | Identifier) -> bool:
        return False

    def drop_view(self, identifier: str | Identifier) -> None:
        raise NotImplementedError

    def register_view(self, identifier: str | Identifier, metadata_location: str) -> Any:
        raise NotImplementedError


def _updated(base: TableMetadata, updates: tuple[TableUpdate, ...], location: str
             ) -> TableMetadata:
    """``update_table_metadata`` without its final deep copy of the whole metadata (every
    snapshot and schema: 85 % of a small commit's time at 250 snapshots). The metadata
    models are immutable; each update makes a new one, sharing what it does not change."""
    context = _TableMetadataUpdateContext()
    metadata = base
    for update in updates:
        metadata = _apply_table_update(update, metadata, context)
    if context.has_changes():
        metadata = _update_table_metadata_log(metadata, location, base.last_updated_ms)
        if base.last_updated_ms == metadata.last_updated_ms:
            metadata = metadata.model_copy(update={"last_updated_ms": int(time.time() * 1000)})
    metadata.spec().check_compatible(metadata.schema())
    metadata.sort_order().check_compatible(metadata.schema())
    return metadata


def _version_of(metadata_location: str) -> int:
    match = _VERSION_FILE.fullmatch(metadata_location.rsplit("/", 1)[-1])
    if match is None:
        raise CommitFailedException(f"{metadata_location} is not a Hadoop-catalog version")
    return int(match.group(1))


def _write_version_hint(directory: Path, version: int) -> None:
    """Point ``version-hint.text`` at ``version`` (Java writes the bare number), atomically.
    Best effort, as Java's: readers also probe ``v<N+1>``."""
    temporary = directory / f"{uuid.uuid4()}-version-hint.temp"
    try:
        temporary.write_text(str(version))
        os.replace(temporary, directory / VERSION_HINT)
    except OSError:
        temporary.unlink(missing_ok=True)


def local_hadoop_catalog(warehouse_url: str, catalog: Any = None) -> LocalHadoopCatalog | None:
    """The warehouse as a writer without Spark commits to it, or None (another catalog:
    Spark's path)."""
    if getattr(catalog, "type", "hadoop") != "hadoop" or getattr(catalog, "properties", None):
        return None
    try:
        store = open_store(warehouse_url)
    except (ValueError, OSError):
        return None
    root = store.local_root
    if root is None:
        return None
    key = (getattr(catalog, "name", "lake"), str(root), store.uri)
    if key not in _hadoop_catalogs:  # (one per warehouse: it keeps each table's metadata)
        _hadoop_catalogs[key] = LocalHadoopCatalog(key[0], root, store.uri)
    return _hadoop_catalogs[key]


_hadoop_catalogs: dict[tuple[str, str, str], LocalHadoopCatalog] = {}
