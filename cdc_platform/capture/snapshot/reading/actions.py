"""What a pause, resume, stop or stop/pause/resume signal does to a table's snapshot session.

The reader owns its session's run (``reader``); these act on a session from outside it (the CLI,
the signal sensor, a reader's own ``pause``/``resume``/``stop``) by rewriting ``request.json``
or ``control.json`` (``protocol``, docs/snapshots.md).
"""

from __future__ import annotations

from dataclasses import replace

from cdc_platform.capture import names
from cdc_platform.capture.landing.session_records import (
    DEFAULT_CHUNK_SIZE,
    NO_SESSION,
    Action,
    SignalRef,
    SnapshotRequest,
    timestamp_now,
)
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.snapshot.errors import SnapshotError
from cdc_platform.capture.snapshot.protocol import (
    read_control,
    read_request,
    read_session_state,
    reader_alive,
    write_control,
    write_request,
)


def request_action(landing: LandingZone, database: str, table: str, action: str,
                   session_id: str | None = None) -> SnapshotRequest:
    """Rewrite ``request.json`` with a new action for the current (or the given) session."""
    if action not in ("pause", "resume", "stop"):
        raise ValueError(f"snapshot action {action!r}: want pause, resume or stop ('open' "
                         "starts a new session: materialise the snapshot asset)")
    current = read_request(landing, database, table)
    if current is None or current.session_id == NO_SESSION:
        raise SnapshotError(f"snapshot of {database}.{table} on {landing.server_name}: no "
                            f"session to {action} (no request.json); materialise the snapshot "
                            "asset to start one")
    if session_id is not None and current.session_id != session_id:
        raise SnapshotError(f"snapshot of {database}.{table}: session {session_id} was replaced "
                            f"by session {current.session_id}; {action} that one instead")
    request = replace(current, action=action, requested_at=timestamp_now())
    write_request(landing, database, table, request)
    return request


def session_live(landing: LandingZone, database: str, table: str,
                 request: SnapshotRequest | None) -> bool:
    """Whether ``request`` (the table's request.json) is a session still running: the engine
    reports it open or paused, or has not seen it yet while its reader is alive. A finished
    session's request stays behind with its last action."""
    if request is None or request.session_id == NO_SESSION or request.action == Action.STOP:
        return False
    state = read_session_state(landing.read_checkpoint(), names.table_id(database, table))
    if state is not None and state.session_id == request.session_id:
        return state.tracked
    return reader_alive(landing, database, table)


def signal_action(landing: LandingZone, database: str, table: str, action: str,
                  signal: SignalRef, run_pending: bool = False) -> str:
    """Apply a stop/pause/resume signal to the table's session, once; what happened, for the
    log.

    A signal acts only on a session that no newer signal opened or steered, so a signal read
    twice (a sensor tick retried after a crash) does nothing the second time. When no session
    is running, the signal is still recorded if a run may yet open one:

    * a stop, in ``request.json`` (session ``NO_SESSION``): runs that earlier signals launched
      and that have not opened their session yet never open it;
    * a pause or resume, when ``run_pending`` (a snapshot run of the table is queued or
      starting), in ``control.json``: a run of an earlier signal opens its session paused or
      running. The run looks at it just after requesting its session and this looks at
      ``request.json`` again just after writing it, so one of the two always sees the other.
    """
    if action not in ("pause", "resume", "stop"):
        raise ValueError(f"signal action {action!r}: want pause, resume or stop")
    current = read_request(landing, database, table)
    table_id = names.table_id(database, table)
    if current is not None and current.signal is not None and not signal.newer_than(
            current.signal):
        if current.signal == signal:
            return f"{table_id}: already {action}ped by this signal" if action == "stop" else \
                f"{table_id}: {action} already applied by this signal"
        if current.signal.topic_id == signal.topic_id:
            return (f"{table_id}: session {current.session_id} follows a newer signal "
                    f"({current.signal.id}); left alone")
    live = session_live(landing, database, table, current)
    if action == "stop" and (current is None or not live):
        barrier = SnapshotRequest(NO_SESSION, "stop", (), None, DEFAULT_CHUNK_SIZE,
                                  signal=signal)
        write_request(landing, database, table, barrier)
        return f"{table_id}: no running snapshot session; runs of earlier signals will not start"
    if current is None or not live:
        if not run_pending:
            return f"{table_id}: no running snapshot session to {action}"
        control = read_control(landing, database, table)
        if control is not None and not signal.newer_than(control[1]):
            return f"{table_id}: {action} already recorded by this or a newer signal"
        write_control(landing, database, table, action, signal)
        current = read_request(landing, database, table)
        if current is None or not session_live(landing, database, table, current) or (
                current.signal is not None and not signal.newer_than(current.signal)):
            return (f"{table_id}: no session open yet; the snapshot run of an earlier signal "
                    f"opens it {'paused' if action == 'pause' else 'running'}")
        # (the run requested its session meanwhile: steer it as below)
    if current.action == action or (action == "resume" and current.action == "open"):
        updated = replace(current, signal=signal, requested_at=timestamp_now())
        write_request(landing, database, table, updated)
        return f"{table_id}: session {current.session_id} is already " + (
            "paused" if action == "pause" else "running")
    write_request(landing, database, table, replace(
        current, action=action, signal=signal, requested_at=timestamp_now()))
    return f"{table_id}: session {current.session_id}: {action} requested"


def pause(landing: LandingZone, database: str, table: str) -> SnapshotRequest:
    """Pause the table's session: the reader reads no more chunks, the engine commits none."""
    return request_action(landing, database, table, "pause")


def resume(landing: LandingZone, database: str, table: str) -> SnapshotRequest:
    """Resume a paused session where it stopped."""
    return request_action(landing, database, table, "resume")


def stop(landing: LandingZone, database: str, table: str) -> SnapshotRequest:
    """Stop the session for good (committed chunks stay applied; a new run starts over)."""
    return request_action(landing, database, table, "stop")
