"""Table maintenance with Iceberg's own Spark actions: compaction, delete-file rewrite and
snapshot expiry, keeping the consumed mark; and what crashed writers left: their private
branches, and the files they wrote but never committed (orphans).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from cdc_platform.lake.iceberg.commit import (
    BRANCH_PREFIX,
    STALE_BRANCH_HOURS,
    branch_created,
    drop_branch,
)
from cdc_platform.lake.iceberg.snapshots import CONSUMED_GTID, CONSUMED_POS, Snapshot, mark_of

if TYPE_CHECKING:
    from cdc_platform.lake.iceberg.table import LakeTable


# An unreferenced file younger than this is never removed as an orphan: a write still running
# (a MERGE, a compaction, an append without Spark) may yet commit it.
ORPHAN_MIN_AGE = timedelta(days=3)


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

    Files a crashed writer wrote but never committed are not removed here: that is
    ``remove_orphans``, with an age limit longer than any write (the applier runs it daily).
    Returns what each action did, by its output's name.
    """
    report: dict[str, Any] = {}
    base, mark = table.base_and_mark()
    if base is None:
        return report
    actions, loaded = _spark_actions(table)

    def marked(action: Any) -> Any:
        mark, _ = marked_ancestor(table)
        if mark is not None:
            for key in (CONSUMED_POS, CONSUMED_GTID):
                action = action.snapshotProperty(key, mark.summary.get(key, ""))
        return action

    clock = time.monotonic()

    def timed(name: str) -> None:  # (the report says where a compaction's seconds went)
        nonlocal clock
        now = time.monotonic()
        report[f"{name}_seconds"] = round(now - clock, 2)
        clock = now

    with table.writing():
        stale = stale_branches(table)
        for branch in stale:
            drop_branch(table, branch)
        report["dropped_stale_branches"] = len(stale)
        timed("stale_branches")
        rewrite = marked(actions.rewriteDataFiles(loaded())).option(
            "delete-file-threshold", "1").option("min-input-files", "2").option(
            "remove-dangling-deletes", "true").execute()
        report["rewritten_data_files_count"] = rewrite.rewrittenDataFilesCount()
        report["added_data_files_count"] = rewrite.addedDataFilesCount()
        report["rewritten_bytes_count"] = rewrite.rewrittenBytesCount()
        report["failed_data_files_count"] = rewrite.failedDataFilesCount()
        timed("rewrite_data_files")
        report["rewritten_delete_files_count"] = report["added_delete_files_count"] = 0
        current = table.current()
        # (the data rewrite applied every delete file to its data files and dropped the
        # dangling ones: with none left, the delete rewrite would only plan, 1.8 s under load)
        if current is None or current.summary.get("total-delete-files", "1") != "0":
            deletes = marked(actions.rewritePositionDeletes(loaded())).option(
                "rewrite-all", "true").execute()
            report["rewritten_delete_files_count"] = deletes.rewrittenDeleteFilesCount()
            report["added_delete_files_count"] = deletes.addedDeleteFilesCount()
        timed("rewrite_position_deletes")
        before = table.snapshot_times()
        mark, depth = marked_ancestor(table)
        keep = max(int(retain_last), 1, depth if mark is not None else 1)
        expired = None
        # (with no snapshot old enough, the action still reads every manifest to find the
        # files only expired snapshots held: 6 s of a busy table's compaction, for nothing)
        if before and before[0].timestamp() < older_than.timestamp():
            expired = actions.expireSnapshots(loaded()).expireOlderThan(
                int(older_than.timestamp() * 1000)).retainLast(keep).execute()
    report["expired_snapshots"] = len(before) - table.snapshot_count()
    timed("expire_snapshots")
    for key, count in (("deleted_data_files_count", "deletedDataFilesCount"),
                       ("deleted_position_delete_files_count",
                        "deletedPositionDeleteFilesCount"),
                       ("deleted_manifest_files_count", "deletedManifestsCount"),
                       ("deleted_manifest_lists_count", "deletedManifestListsCount")):
        report[key] = getattr(expired, count)() if expired is not None else 0
    return report


def _spark_actions(table: LakeTable) -> tuple[Any, Callable[[], Any]]:
    """Iceberg's Spark actions for this thread, and a function loading the table's Java
    object with fresh metadata (for each action: the catalog cache is off).

    Iceberg's actions read their file groups through ``SparkSession.active()``, which is per
    JVM thread: a thread that has not made a DataFrame (the applier's, when its loads were
    appended without Spark) has none of its own, and the read then looks up Iceberg's cache
    catalog in another session ("default_cache_iceberg ... is not defined")."""
    jvm = table.spark.sparkContext._jvm
    jspark = table.spark._jsparkSession  # type: ignore[attr-defined]
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(jspark)

    def loaded() -> Any:
        return jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            jspark, table.identifier)

    return jvm.org.apache.iceberg.spark.actions.SparkActions.get(jspark), loaded


def remove_orphans(table: LakeTable, older_than: datetime) -> dict[str, Any]:
    """Delete the files under the table's location that nothing of the table reaches (no
    snapshot of any ref, no kept metadata file) and that were written before ``older_than``:
    the data and delete files of writers that died before their commit or lost its race (an
    append without Spark writes its files first), and those of rewrites that failed.
    Iceberg's ``deleteOrphanFiles`` action (the ``remove_orphan_files`` procedure), listing
    through the table's FileIO (prefix listing: an S3 warehouse needs no Hadoop filesystem
    for it). ``older_than`` must be well before any write still running: a younger
    unreferenced file may belong to a MERGE about to commit (``ORPHAN_MIN_AGE``)."""
    if table.current() is None:
        return {"deleted_orphan_files_count": 0}
    started = time.monotonic()
    actions, loaded = _spark_actions(table)
    result = actions.deleteOrphanFiles(loaded()).olderThan(
        int(older_than.timestamp() * 1000)).usePrefixListing(True).execute()
    deleted = [str(location) for location in result.orphanFileLocations()]
    return {"deleted_orphan_files_count": len(deleted),
            "deleted_orphan_files": deleted[:20],
            "remove_orphan_files_seconds": round(time.monotonic() - started, 2)}


def marked_ancestor(table: LakeTable) -> tuple[Snapshot | None, int]:
    """The newest snapshot of main's ancestry that carries a consumed mark, and how many
    snapshots back it is (1: the current one), walking back only as far as needed (a
    table's whole history is a thousand snapshots read over Py4J)."""
    for depth, snapshot in enumerate(table.ancestry(), start=1):
        if mark_of([snapshot]) is not None:
            return snapshot, depth
    return None, 0


def stale_branches(table: LakeTable) -> list[str]:
    """Private branches of writers that died between creating and dropping them: older
    than ``STALE_BRANCH_HOURS`` by the time in their name (by their snapshot's time for
    names without one)."""
    # (the table's refs from its metadata in the driver: the ``refs`` metadata table is a
    # Spark job, 0.6 s of each compaction under a write load)
    refs = table.java_table().refs()
    branches = [(str(name), int(refs.get(name).snapshotId())) for name in refs.keySet()
                if str(name).startswith(BRANCH_PREFIX) and refs.get(name).isBranch()]
    if not branches:
        return []
    by_id = {s.snapshot_id: s for s in table.snapshots()}
    now = time.time()
    stale = []
    for name, snapshot_id in branches:
        created = branch_created(name)
        if created is None:
            snapshot = by_id.get(snapshot_id)
            created = snapshot.committed_at.timestamp() if snapshot is not None else 0.0
        if now - created > STALE_BRANCH_HOURS * 3600:
            stale.append(name)
    return stale
