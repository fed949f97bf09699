"""Snapshots of a lake table as the platform reads them, and the consumed mark they carry.

Exactly once: a materialisation stores the changelog mark it consumed (``cdc.consumed-pos``,
``cdc.consumed-gtid``) in the summary of the snapshot it commits, and the next one reads it back
from the newest snapshot of the main branch's history that carries one (``mark_of``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pyiceberg.table.snapshots import ancestors_of

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot as IcebergSnapshot

# Snapshot summary properties this platform writes.
CONSUMED_POS = "cdc.consumed-pos"
CONSUMED_GTID = "cdc.consumed-gtid"


@dataclass(frozen=True)
class Snapshot:
    """One Iceberg snapshot of a lake table, as the platform reports it."""

    snapshot_id: int
    parent_id: int | None
    committed_at: datetime
    operation: str
    summary: Mapping[str, str] = field(default_factory=dict)

    def count(self, key: str) -> int:
        return int(self.summary.get(key, 0) or 0)

    @property
    def rows(self) -> int:
        """Live rows: data-file records less position deletes (the lake writes no equality
        deletes, and Spark deletes a row position once)."""
        return (self.count("total-records") - self.count("total-position-deletes")
                - self.count("total-equality-deletes"))

    @property
    def consumed_pos(self) -> int | None:
        value = self.summary.get(CONSUMED_POS)
        return int(value) if value not in (None, "") else None

    @property
    def consumed_gtid(self) -> str | None:
        return self.summary.get(CONSUMED_GTID) or None

    def metadata(self) -> dict[str, Any]:
        """What the UI shows of the snapshot a run made."""
        return {
            "iceberg_snapshot_id": str(self.snapshot_id),
            "iceberg_parent_snapshot_id": str(self.parent_id) if self.parent_id else "",
            "iceberg_operation": self.operation,
            "data_files": self.count("total-data-files"),
            "delete_files": self.count("total-delete-files"),
            "added_data_files": self.count("added-data-files"),
            "added_delete_files": self.count("added-delete-files"),
            "records": self.count("total-records"),
            "position_deletes": self.count("total-position-deletes"),
        }



def snapshot_from_java(jvm: Any, java_snapshot: Any) -> Snapshot:
    """A snapshot from its Java object in one call to the JVM (its JSON form: reading the
    summary map entry by entry was a round trip per key, 15 ms a snapshot)."""
    data = json.loads(jvm.org.apache.iceberg.SnapshotParser.toJson(java_snapshot))
    summary = {str(k): str(v) for k, v in (data.get("summary") or {}).items()}
    parent = data.get("parent-snapshot-id")
    return Snapshot(
        snapshot_id=int(data["snapshot-id"]),
        parent_id=int(parent) if parent is not None else None,
        committed_at=datetime.fromtimestamp(int(data["timestamp-ms"]) / 1000, UTC),
        operation=summary.get("operation", ""),
        summary=summary,
    )


def has_mark(summary: Mapping[str, str]) -> bool:
    """Whether a snapshot summary carries a consumed mark."""
    return summary.get(CONSUMED_POS) not in (None, "") or CONSUMED_GTID in summary


def mark_of(chain: list[Snapshot]) -> Snapshot | None:
    """The newest snapshot of ``chain`` (newest first) that carries a consumed mark.

    Maintenance commits (compaction) carry the mark of the snapshot they rewrote, so the
    mark survives snapshot expiry.
    """
    return next((s for s in chain if has_mark(s.summary)), None)


def marked_ancestor(table: Table) -> tuple[IcebergSnapshot | None, int]:
    """A pyiceberg table's (writers without Spark) newest snapshot of main's ancestry that
    carries a consumed mark, and how many snapshots back it is (1: the current one; 0: none),
    walking back only as far as needed."""
    current = table.current_snapshot()
    if current is None:
        return None, 0
    for depth, snapshot in enumerate(ancestors_of(current, table.metadata), start=1):
        if has_mark(snapshot.summary or {}):
            return snapshot, depth
    return None, 0


def snapshot_of(snapshot: IcebergSnapshot) -> Snapshot:
    """The platform's view of a pyiceberg snapshot (``snapshots.snapshot_from_java``'s)."""
    summary = {str(k): str(v) for k, v in
               (snapshot.summary.model_dump() if snapshot.summary is not None else {}).items()}
    return Snapshot(
        snapshot_id=snapshot.snapshot_id,
        parent_id=snapshot.parent_snapshot_id,
        committed_at=datetime.fromtimestamp(snapshot.timestamp_ms / 1000, UTC),
        operation=summary.get("operation", ""),
        summary=summary,
    )


def live_rows(snapshot: IcebergSnapshot) -> int:
    return snapshot_of(snapshot).rows


def marked_snapshot(table: Table) -> Snapshot | None:
    """The newest snapshot of main's ancestry carrying a consumed mark, as the platform
    reports snapshots (``snapshots.marked_ancestor``)."""
    marked, _ = marked_ancestor(table)
    return snapshot_of(marked) if marked is not None else None
