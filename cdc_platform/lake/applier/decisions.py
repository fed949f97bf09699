"""The applier's per-table decisions, as pure functions of what it read: whether a table needs
compacting (``compaction_reason``), whether an empty target waits for its table's snapshot
(``first_load_waits``), whether a reconcile saw the target's position (``same_position``).

Apart from the loop (``applier.loop``), which reads the tables and acts, so that each rule
is tested without a Spark session, a source or a landing zone.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from cdc_platform.capture.gtid import parse_position
from cdc_platform.capture.landing.session_records import SessionState, SnapshotSession


def compaction_reason(metadata: Mapping[str, Any], min_files: int,
                      delete_ratio: float | None) -> str | None:
    """Why a table with this snapshot metadata (``Snapshot.metadata``) needs compacting, or
    None: too many data and delete files, or too large a share of deleted rows (not judged
    when ``delete_ratio`` is None)."""
    files = int(metadata.get("data_files", 0)) + int(metadata.get("delete_files", 0))
    if files >= min_files:
        return f"{files} data and delete files (threshold {min_files})"
    records = int(metadata.get("records", 0))
    deleted = int(metadata.get("position_deletes", 0))
    if delete_ratio is not None and records and deleted and deleted / records >= delete_ratio:
        return (f"{deleted} of {records} records deleted ({deleted / records:.0%}, threshold "
                f"{delete_ratio:.0%})")
    return None


def first_load_waits(session: SnapshotSession | None, loaded: bool, now: datetime,
                     wait_seconds: float) -> bool:
    """Whether a target's merge waits for the table's snapshot: the target has no rows yet
    and the snapshot session opened less than ``wait_seconds`` ago and is still reading.

    Chunks land as the snapshot reads them; merged as they come, the first part is an append
    and every later part a MERGE into the rows before it (a 1M-row load: 557k appended in
    6.7 s, then 443k merged in 10.1 s). Waiting a while makes a snapshot that ends in time
    one append; one that does not is merged as before, so the wait is bounded (half the
    freshness promise by default) and a paused or stalled snapshot holds nothing back."""
    if loaded or session is None or session.state is not SessionState.OPEN:
        return False
    try:
        opened = datetime.fromisoformat(session.started_at)
    except ValueError:
        return False
    if opened.tzinfo is None:
        opened = opened.replace(tzinfo=UTC)
    return (now - opened).total_seconds() < wait_seconds


def same_position(flavour: str, left: str | None, right: str | None) -> bool:
    """Whether two GTID positions of the source are the same set."""
    if not left or not right:
        return False
    try:
        a, b = parse_position(flavour, left), parse_position(flavour, right)
        return a.issuperset(b) and b.issuperset(a)
    except ValueError:
        return left.strip() == right.strip()
