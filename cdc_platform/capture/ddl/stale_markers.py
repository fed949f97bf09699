"""Stale-target markers in the landing zone: written by the engine, resolved by snapshots.

For every table a DDL leaves stale (``capture.ddl.stale``), the engine writes a marker while it
processes the DDL, so before its checkpoint passes it; a replay writes the same file again.
A marker is **resolved** once a whole-table snapshot that opened after the DDL is done (the
checkpoint's snapshot sessions say so), and forgotten once the target has applied that
snapshot. Dagster reads them: target metadata, the ``not_stale`` check, the re-snapshot sensor.
Format: docs/landing-zone.md, "Stale-target markers".
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cdc_platform.capture import names
from cdc_platform.capture.ddl.parse import TableDdl
from cdc_platform.capture.ddl.stale import (
    ColumnCaptured,
    StaleTable,
    stale_after_statement,
    stale_tables,
)
from cdc_platform.capture.ddl.statements import DatabaseDrop, Unclassified
from cdc_platform.capture.gtid import parse_gtid, parse_position
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.snapshot.protocol import (
    SessionState,
    SnapshotSession,
    read_session_state,
)
from cdc_platform.capture.storage import write_atomically


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class StaleMarker:
    """A target made stale by a DDL: written by the engine before its checkpoint passes the
    DDL, resolved by a whole-table snapshot that opened after it, forgotten once the target
    applied that snapshot."""

    database: str
    table: str
    gtid: str  # the DDL's GTID
    verb: str  # ALTER | CREATE | DROP | RENAME | TRUNCATE | DROP DATABASE | ... (the statement's)
    reason: str
    position: int  # the changelog position at the DDL: records before it precede it
    gone: bool = False  # no source table under this name any more: nothing to snapshot
    index: int = 0  # of the marker among its DDL's markers (part of the file name)
    recorded_at: str = ""
    resolved_by: str | None = None  # the snapshot session that made the target exact again
    resolved_pos: int | None = None  # the table's changelog holds that snapshot up to here

    @property
    def table_id(self) -> str:
        return names.table_id(self.database, self.table)

    @property
    def resolved(self) -> bool:
        return self.resolved_by is not None

    @property
    def file_name(self) -> str:
        """Sorts in DDL order: by changelog position, then (DDLs with no record between) by
        the GTID's sequence number."""
        sequence = re.search(r"(\d+)$", self.gtid)
        gtid = re.sub(r"[^0-9A-Za-z-]", "_", self.gtid)
        return (f"{self.position:020d}-{int(sequence.group(1)) if sequence else 0:020d}-"
                f"{gtid}-{self.index}.json")

    def describe(self) -> str:
        return (f"table {self.table_id}: target stale after {self.verb} at GTID {self.gtid} "
                f"(changelog position {self.position}): {self.reason}")

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), indent=1).encode()

    @staticmethod
    def from_json(text: bytes | str) -> StaleMarker:
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(StaleMarker)}
        return StaleMarker(**{k: v for k, v in data.items() if k in known})


def markers_dir(landing: LandingZone) -> Path:
    return landing.root / "stale"


def read_markers(landing: LandingZone) -> list[StaleMarker]:
    """Every marker, in DDL order (unreadable files are skipped: written atomically, a
    half-written one cannot exist; a foreign file is not ours)."""
    directory = markers_dir(landing)
    if not directory.is_dir():
        return []
    markers = []
    for path in sorted(directory.glob("*.json")):
        try:
            markers.append(StaleMarker.from_json(path.read_bytes()))
        except (OSError, ValueError, TypeError):
            continue
    return markers


def _write(landing: LandingZone, markers: Sequence[StaleMarker]) -> None:
    for marker in markers:  # (DDL is rare: a durable write each is cheap)
        write_atomically(markers_dir(landing) / marker.file_name, marker.to_json())


def record_stale_targets(landing: LandingZone, ddl: TableDdl, gtid: str, position: int,
                         schemas: Mapping[str, TableSchema],
                         captures: Callable[[str, str], bool],
                         column_captured: ColumnCaptured | None = None) -> list[StaleMarker]:
    """Write a marker for every captured table ``ddl`` leaves stale (durably: the engine
    calls this before its checkpoint passes the DDL; a replay writes the same files again).

    A CREATE TABLE of a name with an open marker (the table was dropped or renamed away, and
    its target still holds the old rows) marks the new table stale too.
    """
    verdicts = [v for v in stale_tables(ddl, schemas, column_captured)
                if captures(v.database, v.table)]
    if ddl.verb == "CREATE" and not verdicts:
        pending = {m.table_id for m in read_markers(landing) if not m.resolved}
        for database, table in ddl.tables[:1]:
            if names.table_id(database, table) in pending and captures(database, table):
                verdicts.append(StaleTable(database, table, "created again under the name of "
                                           "a table that is gone: the target still holds the "
                                           "old table's rows"))
    return _record(landing, verdicts, gtid, ddl.verb, position)


def record_stale_after_statement(landing: LandingZone, statement: DatabaseDrop | Unclassified,
                                 gtid: str, position: int,
                                 captured: Iterable[tuple[str, str]]) -> list[StaleMarker]:
    """Write a marker for every table of ``captured`` a statement other than table DDL (a
    dropped database, a statement the platform cannot classify) leaves stale; durably, as
    :func:`record_stale_targets`."""
    return _record(landing, stale_after_statement(statement, captured), gtid, statement.verb,
                   position)


def _record(landing: LandingZone, verdicts: Sequence[StaleTable], gtid: str, verb: str,
            position: int) -> list[StaleMarker]:
    now = _now()
    markers = [StaleMarker(v.database, v.table, gtid, verb, v.reason, position, v.gone,
                           index, now) for index, v in enumerate(verdicts)]
    _write(landing, markers)
    return markers


def _opened_after(session: SnapshotSession, marker: StaleMarker, flavour: str) -> bool:
    """Whether a snapshot session opened after the marker's DDL was processed."""
    try:
        opening = parse_position(flavour, session.opening)
        return opening.contains_gtid(parse_gtid(flavour, marker.gtid))
    except ValueError:  # (no GTID known for the DDL): by changelog position
        return session.opening_pos > marker.position


def resolve_markers(landing: LandingZone) -> list[StaleMarker]:
    """Every marker, resolving (on disk too) those whose table has a finished whole-table
    snapshot that opened after the DDL (the checkpoint's snapshot sessions). The resolved
    position is where the table's changelog ends at that checkpoint: a target that consumed
    up to it has applied the snapshot."""
    markers = read_markers(landing)
    if not any(not m.resolved for m in markers):
        return markers
    checkpoint = landing.read_checkpoint()
    if checkpoint is None:
        return markers
    out, changed = [], []
    for marker in markers:
        session = read_session_state(checkpoint, marker.table_id)
        if not marker.resolved and session is not None and (
                session.state == SessionState.DONE) and not session.condition and (
                _opened_after(session, marker, checkpoint.flavour)):
            ends = [last for _, last, _ in landing.segments(marker.database, marker.table)
                    if last < checkpoint.next_pos]
            marker = dataclasses.replace(
                marker, resolved_by=session.session_id,
                resolved_pos=max(ends, default=session.opening_pos))
            changed.append(marker)
        out.append(marker)
    _write(landing, changed)
    return out


def target_staleness(markers: Sequence[StaleMarker], table_id: str,
                     consumed_pos: int | None) -> str | None:
    """Why a target that consumed the changelog up to ``consumed_pos`` is stale, or None.

    Stale: an unresolved marker, or a resolved one whose snapshot the target has not consumed
    yet (materialise again)."""
    reasons = []
    for marker in markers:
        if marker.table_id != table_id:
            continue
        if not marker.resolved:
            fix = ("the source table is gone: drop the lake table, or re-create the source "
                   "table and snapshot it" if marker.gone else
                   f"re-snapshot {table_id} (automatic with capture.resnapshot_on_ddl)")
            reasons.append(f"{marker.verb} at GTID {marker.gtid}: {marker.reason}; {fix}")
        elif (consumed_pos or 0) < (marker.resolved_pos or 0):
            reasons.append(f"{marker.verb} at GTID {marker.gtid}: re-snapshotted (session "
                           f"{marker.resolved_by}); materialise the target to apply it")
    return " | ".join(reasons) or None


def forget_applied(landing: LandingZone, markers: Sequence[StaleMarker], table_id: str,
                   consumed_pos: int | None) -> None:
    """Delete the table's resolved markers whose snapshot the target has applied."""
    for marker in markers:
        if marker.table_id == table_id and marker.resolved and (
                (consumed_pos or 0) >= (marker.resolved_pos or 0)):
            (markers_dir(landing) / marker.file_name).unlink(missing_ok=True)


def snapshots_wanted(markers: Sequence[StaleMarker]) -> dict[str, StaleMarker]:
    """Tables to re-snapshot -> the marker the request answers (the table's newest open one).
    A table whose newest open marker says it is gone is left alone: there is nothing to read.
    """
    newest: dict[str, StaleMarker] = {}
    for marker in markers:
        if not marker.resolved:
            newest[marker.table_id] = marker
    return {t: m for t, m in newest.items() if not m.gone}
