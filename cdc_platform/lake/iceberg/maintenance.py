"""Table maintenance with Iceberg's own Spark actions: compaction, delete-file rewrite and
snapshot expiry, keeping the consumed mark; and the private branches crashed writers left.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cdc_platform.lake.iceberg.commit import (
    BRANCH_PREFIX,
    STALE_BRANCH_HOURS,
    branch_created,
    drop_branch,
)
from cdc_platform.lake.iceberg.snapshots import CONSUMED_GTID, CONSUMED_POS, mark_of

if TYPE_CHECKING:
    from cdc_platform.lake.iceberg.table import LakeTable


def maintain(table: LakeTable, older_than: datetime, retain_last: int) -> dict[str, Any]:
    """Compaction and snapshot expiry with Iceberg's own Spark actions, keeping the mark.

    In order: drop the private ``cdc_commit_*`` branches of writers that died between
    creating and dropping them (``STALE_BRANCH_HOURS``); ``rewriteDataFiles`` (the action
    behind the ``rewrite_data_files`` procedure), which rewrites every data file with a
    delete file applying to it, and small files; ``rewritePositionDeletes`` with
    ``rewrite-all`` (``rewrite_position_delete_files``), which drops the delete entries
    the compaction left dangling (so a snapshot's ``rows`` stays exact); then
    ``expireSnapshots`` older than ``older_than``, keeping the ``retain_last`` newest
    snapshots of main, and deleting the files only expired snapshots referenced.

    The actions, not the SQL procedures: only the actions take snapshot properties
    (``snapshotProperty``; the procedures ignore ``CommitMetadata``), and both rewrite
    snapshots must carry the consumed mark of the snapshot they rewrote, or expiry would
    leave main with no mark and the next materialisation would replay the whole
    changelog. Expiry also never removes the newest snapshot carrying a mark. If a
    materialisation commits while a rewrite runs, the rewrite fails (it conflicts with
    the new deletes) or lands on top with the older mark; replaying from an older mark
    is idempotent (a MERGE never lets an older record overwrite a newer row).

    Files a crashed writer wrote but never committed are not removed: that is the
    ``remove_orphan_files`` procedure, not run here (it needs an age limit longer than
    any write; docs/iceberg.md). Returns what each action did, by its output's name.
    """
    report: dict[str, Any] = {}
    base, mark = table.base_and_mark()
    if base is None:
        return report
    jvm = table.spark.sparkContext._jvm
    jspark = table.spark._jsparkSession  # type: ignore[attr-defined]
    # Iceberg's rewrites read their file groups through ``SparkSession.active()``, which is
    # per JVM thread: a thread that has not made a DataFrame (the applier's, when its loads
    # were appended without Spark) has none of its own, and the read then looks up Iceberg's
    # cache catalog in another session ("default_cache_iceberg ... is not defined").
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(jspark)
    actions = jvm.org.apache.iceberg.spark.actions.SparkActions.get(jspark)

    def loaded() -> Any:  # fresh metadata for each action (the catalog cache is off)
        return jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            jspark, table.identifier)

    def marked(action: Any) -> Any:
        mark = mark_of(table.history())
        if mark is not None:
            for key in (CONSUMED_POS, CONSUMED_GTID):
                action = action.snapshotProperty(key, mark.summary.get(key, ""))
        return action

    with table.writing():
        stale = stale_branches(table)
        for branch in stale:
            drop_branch(table, branch)
        report["dropped_stale_branches"] = len(stale)
        rewrite = marked(actions.rewriteDataFiles(loaded())).option(
            "delete-file-threshold", "1").option("min-input-files", "2").option(
            "remove-dangling-deletes", "true").execute()
        report["rewritten_data_files_count"] = rewrite.rewrittenDataFilesCount()
        report["added_data_files_count"] = rewrite.addedDataFilesCount()
        report["rewritten_bytes_count"] = rewrite.rewrittenBytesCount()
        report["failed_data_files_count"] = rewrite.failedDataFilesCount()
        deletes = marked(actions.rewritePositionDeletes(loaded())).option(
            "rewrite-all", "true").execute()
        report["rewritten_delete_files_count"] = deletes.rewrittenDeleteFilesCount()
        report["added_delete_files_count"] = deletes.addedDeleteFilesCount()
        before = table.snapshot_count()
        chain = table.history()
        mark = mark_of(chain)
        keep = max(int(retain_last), 1, chain.index(mark) + 1 if mark is not None else 1)
        expired = actions.expireSnapshots(loaded()).expireOlderThan(
            int(older_than.timestamp() * 1000)).retainLast(keep).execute()
    report["expired_snapshots"] = before - table.snapshot_count()
    report["deleted_data_files_count"] = expired.deletedDataFilesCount()
    report["deleted_position_delete_files_count"] = \
        expired.deletedPositionDeleteFilesCount()
    report["deleted_manifest_files_count"] = expired.deletedManifestsCount()
    report["deleted_manifest_lists_count"] = expired.deletedManifestListsCount()
    return report


def stale_branches(table: LakeTable) -> list[str]:
    """Private branches of writers that died between creating and dropping them: older
    than ``STALE_BRANCH_HOURS`` by the time in their name (by their snapshot's time for
    names without one)."""
    rows = table.lake.sql(f"SELECT name, snapshot_id FROM {table.metadata_table('refs')} "
                          f"WHERE type = 'BRANCH' AND name LIKE '{BRANCH_PREFIX}%'").collect()
    if not rows:
        return []
    by_id = {s.snapshot_id: s for s in table.snapshots()}
    now = time.time()
    stale = []
    for row in rows:
        created = branch_created(row.name)
        if created is None:
            snapshot = by_id.get(row.snapshot_id)
            created = snapshot.committed_at.timestamp() if snapshot is not None else 0.0
        if now - created > STALE_BRANCH_HOURS * 3600:
            stale.append(row.name)
    return stale
