"""The lake's REST catalog through pyiceberg, without Spark: what the Spark-free initial load
(``lake.arrow_load``) commits through when ``warehouse.catalog.type`` is ``rest``.

The catalog is the one Spark's sessions use, from the same settings: ``catalog_properties``
(Iceberg Java's property names, as Spark takes them) translated to pyiceberg's
(``pyiceberg_properties``). A property this module does not know how to translate makes the
load go through Spark instead (``None``, logged once): the two clients must reach the same
catalog with the same identity, or not both.

A commit is the service's compare-and-swap (the append requires the main branch still at the
snapshot it was read from). A lost race is ConcurrentCommitError, never pyiceberg's
CommitFailedException: on that one a pyiceberg transaction refreshes the table and commits its
append again on top of the winner's (every row twice, the wrong consumed mark). The caller
decides what to do instead (``lake.merge.materialise`` runs again from the new snapshot), as
with ``iceberg.hadoop``. Two creations of one table race on the service's ``assert-create``
(SeaweedFS 4's catalog accepts both, the later one replacing the table: still consistent,
since each carries its own data and consumed mark, and the next merge continues from the
mark that stands).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import CommitFailedException, RESTError
from pyiceberg.typedef import EMPTY_DICT, Properties

from cdc_platform.config import S3Settings
from cdc_platform.lake.iceberg.catalog import catalog_properties
from cdc_platform.lake.iceberg.commit import ConcurrentCommitError
from cdc_platform.lake.s3 import S3_FILE_IO, warehouse_on_s3

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.table import CommitTableResponse, Table, TableRequirement, TableUpdate

log = logging.getLogger(__name__)

# Java property -> pyiceberg property, where only the name differs.
_RENAMED = {"client.region": "s3.region"}
# Properties both clients read under the same name, with the same meaning.
_SAME = frozenset({
    "uri", "warehouse", "credential", "token", "scope", "oauth2-server-uri", "audience",
    "resource", "rest.signing-name", "rest.signing-region", "s3.endpoint", "s3.access-key-id",
    "s3.secret-access-key", "s3.session-token",
})
# Java-only settings with nothing to do on pyiceberg's side (its FileIO for s3:// is
# pyarrow's; it caches nothing).
_JAVA_ONLY = {"type": "rest", "cache-enabled": None, "io-impl": S3_FILE_IO}
_refused: set[tuple[str, ...]] = set()
_catalogs: dict[tuple[str, tuple[tuple[str, str], ...]], LakeRestCatalog] = {}
_unanswered: set[tuple[str, tuple[tuple[str, str], ...]]] = set()


class LakeRestCatalog(RestCatalog):
    """pyiceberg's REST catalog whose lost commit race is ConcurrentCommitError, and whose
    tables share one FileIO per set of properties (pyiceberg makes one per loaded table, and
    with it a new S3 filesystem: a merge's every load).

    ``table_as_committed`` gives the table as this process last committed it, without asking
    the service (a request, and the whole metadata parsed, per merge): optimistic, since the
    next commit requires main still at that snapshot, and a writer that committed meanwhile
    makes it fail (ConcurrentCommitError: the merge runs again from a fresh load). Whoever
    meets an error with such a table ``forget``s it."""

    def _load_file_io(self, properties: Properties = EMPTY_DICT, location: str | None = None
                      ) -> FileIO:
        scheme = (location or "").split("://", 1)[0] if "://" in (location or "") else ""
        key = (scheme, tuple(sorted((k, str(v)) for k, v in properties.items())))
        ios = self.__dict__.setdefault("_lake_file_ios", {})
        if key not in ios:
            ios[key] = super()._load_file_io(properties, location)
        return ios[key]

    def commit_table(self, table: Table, requirements: tuple[TableRequirement, ...],
                     updates: tuple[TableUpdate, ...]) -> CommitTableResponse:
        identifier = tuple(table.name())
        self.forget(identifier)
        try:
            response = super().commit_table(table, requirements, updates)
        except CommitFailedException as error:
            raise ConcurrentCommitError(str(error)) from None
        committed = self.__dict__.setdefault("_lake_committed", {})
        committed[identifier] = (response.metadata, response.metadata_location, table.io)
        return response

    def table_as_committed(self, identifier: tuple[str, ...]) -> Table:
        """The table as this process last committed it, else loaded (see the class)."""
        from pyiceberg.table import Table

        known = self.__dict__.get("_lake_committed", {}).get(tuple(identifier))
        if known is None:
            return self.load_table(identifier)
        metadata, location, io = known
        return Table(tuple(identifier), metadata, location, io, self)

    def forget(self, identifier: tuple[str, ...]) -> None:
        """Drop what ``table_as_committed`` keeps of a table (the next use loads it)."""
        self.__dict__.get("_lake_committed", {}).pop(tuple(identifier), None)


def pyiceberg_properties(properties: dict[str, str]) -> dict[str, str] | None:
    """pyiceberg's properties for a REST catalog Spark reaches with ``properties``, or None
    when one of them has no known translation."""
    out: dict[str, str] = {}
    unknown = []
    for key, value in properties.items():
        if key in _SAME or key.startswith("header."):
            out[key] = value
        elif key in _RENAMED:
            out[_RENAMED[key]] = value
        elif key in _JAVA_ONLY and _JAVA_ONLY[key] in (None, value):
            continue
        elif key == "rest.auth.type" and value.lower() in ("sigv4", "none", "oauth2"):
            if value.lower() == "sigv4":
                out["rest.sigv4-enabled"] = "true"
        elif key == "s3.path-style-access" and value.lower() in ("true", "false"):
            # (pyarrow addresses a custom endpoint path-style unless told otherwise)
            out["s3.force-virtual-addressing"] = "false" if value.lower() == "true" else "true"
        else:
            unknown.append(key)
    if unknown:
        refused = tuple(sorted(unknown))
        if refused not in _refused:
            _refused.add(refused)
            log.info("REST catalog properties %s have no pyiceberg translation here: initial "
                     "loads go through Spark", ", ".join(refused))
        return None
    if "s3.force-virtual-addressing" in out and not out.get("s3.endpoint"):
        out.pop("s3.force-virtual-addressing")  # (AWS itself: pyarrow's default)
    return out


def rest_catalog(warehouse_url: str, catalog: Any, s3: S3Settings | None = None
                 ) -> LakeRestCatalog | None:
    """The REST catalog of ``catalog`` (``config.CatalogSettings``) as pyiceberg reaches it,
    or None: not a REST catalog, or one with settings this module does not translate.
    ``s3``: the config's ``s3`` section (endpoint, region, addressing), as the Spark
    session's."""
    if getattr(catalog, "type", "hadoop") != "rest":
        return None
    properties = pyiceberg_properties(catalog_properties(
        warehouse_url, catalog, s3 if warehouse_on_s3(warehouse_url) else None))
    if properties is None:
        return None
    name = getattr(catalog, "name", "lake")
    key = (name, tuple(sorted(properties.items())))
    if key not in _catalogs:  # (made once per process: it asks the service for its config)
        try:
            _catalogs[key] = LakeRestCatalog(name, **properties)
        except (RESTError, OSError) as error:  # (Spark's path reports it, in one line)
            if key not in _unanswered:  # (asked again at each use: said once)
                _unanswered.add(key)
                log.warning("the REST catalog %s did not answer pyiceberg (%s): initial loads "
                            "go through Spark", properties.get("uri"), error)
            return None
    return _catalogs[key]
