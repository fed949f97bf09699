"""Maintenance without Spark, for tables small enough to rewrite in one process's memory:
compaction (every live row rewritten into one data file, every delete file dropped) and
snapshot expiry (old snapshots removed from the metadata, and the files only they reached
deleted).

Merges without Spark (``lake.arrow_merge``) add a data file and a delete file each; a table
merged every few seconds passes ``lake.compact_min_files`` within minutes, and with a thousand
such tables Spark's rewrite actions (seconds each) cannot keep up. A small table's rows
rewritten in Arrow take milliseconds. Both commit like a merge (``row_delta.commit``: one
snapshot, compare-and-swap on main; a compaction carries the consumed mark of the snapshot it
rewrote, as ``maintenance.maintain`` does, so the next merge continues from it).

Expiry keeps main's newest snapshots (at least the newest with a consumed mark) and every
ref's head (a Spark writer's private branch), removes the others from the metadata, then
deletes what only they reached: their manifest lists, manifests no kept snapshot lists, and
the data and delete files those manifests named that no kept manifest lists as live (Iceberg's
reachable-file cleanup). Files are deleted only after the commit: a lost race deletes nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import ancestors_of
from pyiceberg.table.update import AssertRefSnapshotId, AssertTableUUID, RemoveSnapshotsUpdate

from cdc_platform.lake.iceberg.live_files import (
    UnsupportedFiles,
    entries,
    live_table,
    manifests,
    plan_files,
)
from cdc_platform.lake.iceberg.row_delta import Removed, commit, write_rows
from cdc_platform.lake.iceberg.snapshots import CONSUMED_GTID, CONSUMED_POS, marked_ancestor

log = logging.getLogger(__name__)

# A table whose files hold more than this is compacted by Spark's actions (in parallel tasks
# that spill): here its rows are read into memory and written again.
MAX_COMPACTION_BYTES = 64 << 20


def compact(catalog: Any, table: Table) -> dict[str, Any] | None:
    """Rewrite the table's live rows into one data file and drop every delete file, carrying
    the consumed mark; None (nothing done) when the table is larger than
    ``MAX_COMPACTION_BYTES`` or holds files this module does not read: Spark's actions
    compact it. ConcurrentCommitError: a writer committed meanwhile (nothing published; the
    next merge judges again)."""
    started = time.monotonic()
    base = table.current_snapshot()
    if base is None:
        return None
    size = int((base.summary or {}).get("total-files-size", "0") or 0)
    if size > MAX_COMPACTION_BYTES:
        return None
    try:
        files = plan_files(table, base)  # (refuses equality deletes and deletion vectors)
    except UnsupportedFiles:
        return None
    live = entries(table, base)
    rows = live_table(table, files)
    marked, _ = marked_ancestor(table)
    summary = (marked.summary or {}) if marked is not None else {}
    properties = {k: summary[k] for k in (CONSUMED_POS, CONSUMED_GTID) if k in summary}
    added = write_rows(table, rows)
    commit(catalog, table, base, added, properties, removed=Removed(live))
    data = [e for e in live if e.data_file.content.name == "DATA"]
    return {
        "rewritten_data_files_count": len(data),
        "added_data_files_count": len(added),
        "rewritten_delete_files_count": len(live) - len(data),
        "rewritten_bytes_count": size,
        "rows": rows.num_rows,
        "compaction_seconds": round(time.monotonic() - started, 3),
    }


def expire(catalog: Any, table: Table, keep: int) -> dict[str, Any] | None:
    """Remove all but main's ``keep`` newest snapshots (and never the newest with a consumed
    mark, nor any ref's head), then delete the files only they reached; None when there is
    nothing to remove. ConcurrentCommitError: main moved meanwhile (nothing removed)."""
    started = time.monotonic()
    metadata = table.metadata
    current = table.current_snapshot()
    if current is None:
        return None
    _, depth = marked_ancestor(table)
    chain = list(ancestors_of(current, metadata))
    kept_ids = {s.snapshot_id for s in chain[:max(keep, depth, 1)]}
    kept_ids |= {ref.snapshot_id for ref in metadata.refs.values()}
    expired = [s for s in metadata.snapshots if s.snapshot_id not in kept_ids]
    if not expired:
        return None
    kept = [s for s in metadata.snapshots if s.snapshot_id in kept_ids]
    io = table.io
    kept_manifests = {m.manifest_path for s in kept for m in manifests(table, s)}
    live = {e.data_file.file_path for s in kept for e in entries(table, s)}
    gone_manifests = {m.manifest_path: m for s in expired for m in manifests(table, s)
                      if m.manifest_path not in kept_manifests}
    gone_files = {e.data_file.file_path for m in gone_manifests.values()
                  for e in m.fetch_manifest_entry(io, discard_deleted=False)} - live
    catalog.commit_table(
        table,
        requirements=(AssertTableUUID(uuid=metadata.table_uuid),
                      AssertRefSnapshotId(ref=MAIN_BRANCH, snapshot_id=current.snapshot_id)),
        updates=(RemoveSnapshotsUpdate(snapshot_ids=[s.snapshot_id for s in expired]),))
    failed = 0
    for path in [*(s.manifest_list for s in expired), *gone_manifests, *gone_files]:
        try:
            io.delete(path)
        except OSError as error:  # (left for remove_orphans, which finds it unreferenced)
            failed += 1
            log.debug("expiry: could not delete %s: %s", path, error)
    if failed:
        log.warning("%s: %d files of expired snapshots could not be deleted; the daily "
                    "orphan-file removal deletes them", ".".join(table.name()), failed)
    return {
        "expired_snapshots": len(expired),
        "deleted_manifest_lists_count": len(expired),
        "deleted_manifest_files_count": len(gone_manifests),
        "deleted_data_and_delete_files_count": len(gone_files),
        "expire_snapshots_seconds": round(time.monotonic() - started, 3),
    }
