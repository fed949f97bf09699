"""Stale-target markers in the landing zone: written by the engine, resolved by snapshots.
The marker record (``StaleMarker``, its file name and JSON) is the landing contract's,
``capture.landing.records``; this module writes, reads, resolves and forgets the files.

For every table a DDL leaves stale (``capture.ddl.stale``), the engine writes a marker while it
processes the DDL, so before its checkpoint passes it; a replay writes the same file again.
A marker is **resolved** once a whole-table snapshot that opened after the DDL is done (the
checkpoint's snapshot sessions say so), and forgotten once the target has applied that
snapshot. Dagster reads them: target metadata, the ``not_stale`` check, the re-snapshot sensor.
Format: docs/landing-zone.md, "Stale-target markers".

**History markers** (``capture.snapshot_mode``, docs/snapshots.md "Automatic snapshots") say
the same of a table whose rows predate what the changelog holds, at a point rather than at a
statement: ``INITIAL`` (the engine's first start found the table with rows), ``CAPTURED`` (a
table that became captured with rows: a widened filter, or first seen by its row events) and
``PURGED`` (the binlog the checkpoint needed was purged; the engine went on from the source's
current GTID set). Their point is ``since``, a GTID set: the sensor launches their snapshot once
the checkpoint contains it, and a snapshot resolves them when it opened at a set containing it.
A table the engine then sees created (``CREATE TABLE``) has all its rows in the binlog from
there on: its history markers are withdrawn (:func:`withdraw_history`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence

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
from cdc_platform.capture.landing.records import (
    HISTORY_VERBS,
    HISTORY_WORDS,
    StaleMarker,
    history_suffix,
)
from cdc_platform.capture.landing.session_records import (
    EndedSessions,
    SessionState,
    SnapshotSession,
)
from cdc_platform.capture.landing.zone import Checkpoint, LandingReader, LandingZone
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.snapshot.protocol import read_ended_sessions, read_session_state


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


MARKERS_DIR = "stale"


def read_markers(landing: LandingReader) -> list[StaleMarker]:
    """Every marker, in DDL order (unreadable files are skipped: written atomically, a
    half-written one cannot exist; a foreign file is not ours)."""
    markers = []
    for name in landing.store.list_names(MARKERS_DIR):
        if name.startswith(".") or not name.endswith(".json"):
            continue
        try:
            data = landing.store.read_bytes(MARKERS_DIR, name)
            if data is not None:
                markers.append(StaleMarker.from_json(data))
        except (OSError, ValueError, TypeError):
            continue
    return markers


def _write(landing: LandingZone, markers: Sequence[StaleMarker]) -> None:
    for marker in markers:  # (DDL is rare: a durable write each is cheap)
        landing.store.write_atomically(MARKERS_DIR, marker.file_name, data=marker.to_json())


def _pending_gone_name(marker: StaleMarker) -> bool:
    """An open marker that leaves old rows under the table's name: a table created again
    under that name is stale too. (An open history marker that is not ``gone`` says only that
    older rows were never loaded: nothing of another table.)"""
    return not marker.resolved and (marker.gone or not marker.history)


def record_stale_targets(landing: LandingZone, ddl: TableDdl, gtid: str, position: int,
                         schemas: Mapping[str, TableSchema],
                         captures: Callable[[str, str], bool],
                         column_captured: ColumnCaptured | None = None) -> list[StaleMarker]:
    """Write a marker for every captured table ``ddl`` leaves stale (durably: the engine
    calls this before its checkpoint passes the DDL; a replay writes the same files again).

    A CREATE TABLE of a name with an open marker (the table was dropped or renamed away, and
    its target still holds the old rows) marks the new table stale too.

    A rename that brings a table that is not captured under a captured name marks the target
    ``newly_captured``: its rows are new to capture (``capture.snapshot_mode`` loads them).
    """
    verdicts = [v for v in stale_tables(ddl, schemas, column_captured)
                if captures(v.database, v.table)]
    if ddl.verb == "CREATE" and not verdicts:
        pending = {m.table_id for m in read_markers(landing) if _pending_gone_name(m)}
        for database, table in ddl.tables[:1]:
            if names.table_id(database, table) in pending and captures(database, table):
                verdicts.append(StaleTable(database, table, "created again under the name of "
                                           "a table that is gone: the target still holds the "
                                           "old table's rows"))
    new = {v.table_id for v in verdicts if v.origin is not None and not captures(*v.origin)}
    verdicts = [dataclasses.replace(v, reason=f"{v.reason}; {names.table_id(*v.origin)} is not "
                                    "captured: its rows are new to capture")
                if v.table_id in new and v.origin is not None else v for v in verdicts]
    return _record(landing, verdicts, gtid, ddl.verb, position, newly_captured=new)


def record_stale_after_statement(landing: LandingZone, statement: DatabaseDrop | Unclassified,
                                 gtid: str, position: int,
                                 captured: Iterable[tuple[str, str]]) -> list[StaleMarker]:
    """Write a marker for every table of ``captured`` a statement other than table DDL (a
    dropped database, a statement the platform cannot classify) leaves stale; durably, as
    :func:`record_stale_targets`."""
    return _record(landing, stale_after_statement(statement, captured), gtid, statement.verb,
                   position)


def _record(landing: LandingZone, verdicts: Sequence[StaleTable], gtid: str, verb: str,
            position: int, newly_captured: set[str] | frozenset[str] = frozenset()
            ) -> list[StaleMarker]:
    now = _now()
    markers = [StaleMarker(v.database, v.table, gtid, verb, v.reason, position, v.gone,
                           index, now, newly_captured=v.table_id in newly_captured)
               for index, v in enumerate(verdicts)]
    _write(landing, markers)
    return markers


def record_history(landing: LandingZone, verb: str, tables: Iterable[StaleTable], gtid: str,
                   position: int, since: str) -> list[StaleMarker]:
    """Write a history marker (``verb`` one of HISTORY_VERBS) per table, durably, before the
    engine's checkpoint passes ``since``; returns the markers written. A marker already there
    (a replay, a start after a crash) is kept as it is: its run key stays the same."""
    if verb not in HISTORY_VERBS:
        raise ValueError(f"not a history verb: {verb!r}")
    now = _now()
    written = []
    for table in tables:
        marker = StaleMarker(table.database, table.table, gtid, verb, table.reason, position,
                             table.gone, 0, now, since=since)
        if not landing.store.exists(MARKERS_DIR, marker.file_name):
            landing.store.write_atomically(MARKERS_DIR, marker.file_name,
                                           data=marker.to_json())
            written.append(marker)
    return written


def withdraw_history(landing: LandingZone, table_id: str) -> list[StaleMarker]:
    """A table the engine saw created (``CREATE TABLE``) has all its rows in the binlog from
    there on: its open history markers are deleted (gone ones stay: they speak of the target's
    rows of the table that was dropped). Returns the markers withdrawn. Only the markers
    named for the table are read (a new database's thousand CREATEs each read every marker:
    70 ms a CREATE at a thousand tables)."""
    suffix = history_suffix(table_id)
    withdrawn = []
    for name in landing.store.list_names(MARKERS_DIR):
        if not name.endswith(suffix):
            continue
        try:
            data = landing.store.read_bytes(MARKERS_DIR, name)
            marker = StaleMarker.from_json(data) if data is not None else None
        except (OSError, ValueError, TypeError):  # (as read_markers: not one of ours)
            continue
        if marker is not None and marker.table_id == table_id and marker.history and \
                not marker.resolved and not marker.gone:
            landing.store.delete(MARKERS_DIR, marker.file_name)
            withdrawn.append(marker)
    return withdrawn


def armed(marker: StaleMarker, checkpoint: Checkpoint | None) -> bool:
    """Whether the marker's snapshot may start now: a history marker once the engine's
    checkpoint contains its point (by then the engine has withdrawn the markers of tables it
    saw created, and a snapshot opens after the point); other markers at once."""
    if marker.since is None:
        return True
    if checkpoint is None:
        return False
    try:
        return parse_position(checkpoint.flavour, checkpoint.gtid).issuperset(
            parse_position(checkpoint.flavour, marker.since))
    except ValueError:
        return False


def launched_by_platform(marker: StaleMarker, snapshot_mode: str,
                         resnapshot_on_ddl: bool) -> bool:
    """Whether the platform snapshots the marker's table by itself: history markers and
    tables renamed into the captured set under ``capture.snapshot_mode`` (not ``never``),
    DDL markers under ``capture.resnapshot_on_ddl``."""
    history = snapshot_mode != "never"
    if marker.history:
        return history
    return resnapshot_on_ddl or (marker.newly_captured and history)


def _opened_after(session: SnapshotSession, marker: StaleMarker, flavour: str) -> bool:
    """Whether a snapshot session opened after the marker's DDL was processed (a history
    marker: at a GTID set containing its point)."""
    try:
        opening = parse_position(flavour, session.opening)
        if marker.since is not None:
            return opening.issuperset(parse_position(flavour, marker.since))
        return opening.contains_gtid(parse_gtid(flavour, marker.gtid))
    except ValueError:  # (no GTID known for the DDL): by changelog position
        return session.opening_pos > marker.position


def _resolves(session: SnapshotSession | None, marker: StaleMarker, flavour: str) -> bool:
    """Whether ``session`` is a finished whole-table snapshot that opened after the marker."""
    return session is not None and session.state == SessionState.DONE and not (
        session.condition) and _opened_after(session, marker, flavour)


def resolve_markers(landing: LandingZone) -> list[StaleMarker]:
    """Every marker, resolving (on disk too) those whose table has a finished whole-table
    snapshot that opened after the DDL: the checkpoint's snapshot sessions, or one that ended
    and left the checkpoint since (``ended_sessions.json``; read, with the checkpoint again
    after it, only when a marker is not resolved by the checkpoint's record). The resolved
    position is where the table's changelog ends at that checkpoint: a target that consumed
    up to it has applied the snapshot."""
    markers = read_markers(landing)
    if not any(not m.resolved for m in markers):
        return markers
    checkpoint = landing.read_checkpoint()
    if checkpoint is None:
        return markers
    flavour = checkpoint.flavour
    # (read when needed: the sessions that left the checkpoint, then, when one of them
    # resolves a marker, the checkpoint again, which is then at least as new as their end:
    # the engine writes ended_sessions.json after their end is durable and before a
    # checkpoint that lacks them)
    left: EndedSessions | None = None
    later: Checkpoint | None = None
    out, changed = [], []
    for marker in markers:
        if marker.resolved:
            out.append(marker)
            continue
        session = read_session_state(checkpoint, marker.table_id)
        resolver, at = None, checkpoint
        if _resolves(session, marker, flavour):
            resolver = session
        else:
            left = read_ended_sessions(landing) if left is None else left
            ended = left.get(marker.table_id)
            if ended is not None and _resolves(ended, marker, flavour) and (
                    session is None or session.session_id != ended.session_id):
                later = landing.read_checkpoint() if later is None else later
                resolver, at = ended, later or checkpoint
        if resolver is not None:
            ends = [last for _, last, _ in landing.segment_names(marker.database,
                                                                 marker.table)
                    if last < at.next_pos]
            marker = dataclasses.replace(
                marker, resolved_by=resolver.session_id,
                resolved_pos=max(ends, default=resolver.opening_pos))
            changed.append(marker)
        elif session is not None and session.tracked and not session.condition and (
                _opened_after(session, marker, flavour)):
            marker = dataclasses.replace(marker, running=(
                f"session {session.session_id} {session.state.value}, {session.rows:,} rows "
                "loaded so far"))
        out.append(marker)
    _write(landing, changed)
    return out


def note_given_up(landing: LandingZone, marker: StaleMarker, reason: str) -> bool:
    """Record on the marker's file why the platform no longer launches its snapshot (the
    target's ``not_stale`` check then says it); True if written. Only over the file as it
    was read, still open (a compare-and-swap): a marker resolved or forgotten meanwhile by
    another process is left as it is."""
    if marker.given_up == reason:
        return False
    current = landing.store.read_versioned(MARKERS_DIR, marker.file_name)
    if current is None:
        return False
    data, version = current
    try:
        on_disk = StaleMarker.from_json(data)
    except (ValueError, TypeError):
        return False
    if on_disk.resolved or on_disk != marker:
        return False
    noted = dataclasses.replace(on_disk, given_up=reason)
    return landing.store.write_if_match(MARKERS_DIR, marker.file_name, data=noted.to_json(),
                                        etag=version)


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
            gone = ("the source table is gone: drop the lake table, or re-create the source "
                    "table and snapshot it")
            if marker.history:
                state, snapshot = HISTORY_WORDS[marker.verb]
                progress = (f"running ({marker.running})" if marker.running else
                            f"not loaded: {marker.given_up}" if marker.given_up else
                            "pending (the platform launches it: capture.snapshot_mode, at "
                            "most capture.max_parallel_snapshots at a time; or materialise "
                            "the table's snapshot asset)")
                reasons.append(f"{state}: {gone}; {marker.reason}" if marker.gone else
                               f"{state}: {snapshot} {progress}; {marker.reason}")
                continue
            automatic = ("capture.snapshot_mode or capture.resnapshot_on_ddl"
                         if marker.newly_captured else "capture.resnapshot_on_ddl")
            fix = gone if marker.gone else (
                f"snapshot running ({marker.running})" if marker.running else
                f"re-snapshot not done: {marker.given_up}" if marker.given_up else
                f"re-snapshot {table_id} (automatic with {automatic})")
            reasons.append(f"{marker.verb} at GTID {marker.gtid}: {marker.reason}; {fix}")
        elif (consumed_pos or 0) < (marker.resolved_pos or 0):
            what = (f"{HISTORY_WORDS[marker.verb][1]} ({marker.verb})" if marker.history
                    else f"{marker.verb} at GTID {marker.gtid}")
            reasons.append(f"{what}: snapshotted (session {marker.resolved_by}); materialise "
                           "the target to apply it")
    return " | ".join(reasons) or None


def forget_applied(landing: LandingZone, markers: Sequence[StaleMarker], table_id: str,
                   consumed_pos: int | None) -> None:
    """Delete the table's resolved markers whose snapshot the target has applied."""
    for marker in markers:
        if marker.table_id == table_id and marker.resolved and (
                (consumed_pos or 0) >= (marker.resolved_pos or 0)):
            landing.store.delete(MARKERS_DIR, marker.file_name)


def snapshots_wanted(markers: Sequence[StaleMarker],
                     launches: Callable[[StaleMarker], bool] | None = None
                     ) -> dict[str, StaleMarker]:
    """Tables to re-snapshot -> the marker the request answers (the table's newest open one
    that ``launches`` accepts: :func:`launched_by_platform`; any, without it). A table whose
    newest open marker says it is gone is left alone: there is nothing to read. One snapshot
    that opened after every open marker of the table resolves them all."""
    newest: dict[str, StaleMarker] = {}
    wanted: dict[str, StaleMarker] = {}
    for marker in markers:
        if not marker.resolved:
            newest[marker.table_id] = marker
            if launches is None or launches(marker):
                wanted[marker.table_id] = marker
    return {t: m for t, m in wanted.items() if not newest[t].gone}
