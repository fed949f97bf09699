"""The engine's side of incremental snapshots (docs/snapshots.md).

The engine keeps, per table under snapshot, the session's opening position, the touched-key log
(which processed transactions wrote which key since the opening, pruned in generations: see
``commit_rule.TouchedKeyLog``) and the DDL seen since; at each tick it picks up readers' requests
and pending chunk manifests from the landing zone and applies the deferred chunk commit rule
(``commit_rule.decide_chunk_commit``). Session state travels in
the checkpoint, so a chunk's rows and the record that it committed become durable together.

Streaming talks to the coordinator through a few hooks, as Debezium's binlog streaming calls its
read-only incremental snapshot source, and the coordinator never reaches into the run loop:

- ``on_start`` (the sessions of the checkpoint), ``on_ddl`` (a DDL on a table), ``on_gap``
  (capture jumped a purged part of the binlog) and ``on_tick`` (between events when one is
  due, and at each flush: requests, pruning, chunk decisions); the keys each committed record
  touches come through the engine's ``Lander`` (``key_columns``, ``record_touch``: the
  ``landing.segment_buffer.TouchLog``);
- the engine reads back whether a reader still needs its commits (``readers_alive``, asked
  only when it could stop) and the snapshots' part of the checkpoint (``checkpoint_state``:
  None when the coordinator has nothing new for a checkpoint the engine does not write anyway).

What the coordinator needs of the engine is given once, at construction: the one emitter its
records land through (``SnapshotEmitter``, the engine's ``Lander``) and the engine's schemas
(``TableSchemas``, its ``SchemaTracker``).

Its cost follows the sessions under way, not every table ever snapshotted: new requests are
found through the notices readers leave (``protocol.request_notices``: one listing), and an
ended session leaves the checkpoint for ``ended_sessions.json`` once nothing needs it there
(``may_leave_checkpoint``), so that flushes write, and pollers parse, only live sessions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from cdc_platform.capture import names
from cdc_platform.capture.gtid import Gtid, GtidSet, parse_position
from cdc_platform.capture.keys import Key
from cdc_platform.capture.landing.session_records import (
    Action,
    EndedSessions,
    SessionState,
    SnapshotRequest,
    SnapshotSession,
    session_time,
)
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.snapshot.chunk_decisions import (
    ChunkDecisions,
    SnapshotEmitter,
    TableSchemas,
    TrackedSession,
)
from cdc_platform.capture.snapshot.commit_rule import (
    TouchedKeyLog,
)
from cdc_platform.capture.snapshot.protocol import (
    chunk_parts,
    delete_request_notice,
    read_ended_sessions,
    read_request,
    reader_alive,
    request_notices,
    request_parts,
    requested_tables,
)

# The state a reader's request asks for an existing session.
_ACTION_STATES = {Action.PAUSE: SessionState.PAUSED, Action.RESUME: SessionState.OPEN,
                  Action.STOP: SessionState.STOPPED}
# While sessions are open, the engine ticks the coordinator (pending chunks are decided) this
# often. Ticks come between binlog events, so the source's heartbeat period is at most
# ``engine_options.HEARTBEAT_MAX_SECONDS``: on an idle source a chunk waits at most about that long
# (measured: with a 0.2 s heartbeat and poll, polls fell 0.4 s apart and the reader waited for
# the engine half of the time; with 0.1 s, a 1M-row snapshot read in 1.7 s spent 0.19 s of it
# asleep, waiting for the commits of its last chunks; at 0.025 s a 1M-row snapshot ran in
# 0.82-0.85 s against 0.93 s at 0.05 s).
SNAPSHOT_POLL_SECONDS = 0.025
# Without open sessions, new requests are looked for this often (a reader waits for the
# engine's acknowledgement before it reads anything: at 0.25 s this was 0.3 s of a 100k-row
# snapshot's 2 s; at 0.1 s, 0.10 s of a 1M-row snapshot's 0.91 s). A look is a listing of the
# notices readers leave when they write a request (``protocol.request_notices``), whatever the
# number of tables. (At 0.05 s an engine starting on a backlog opened sessions before it had
# passed their table's CREATE TABLE more often, each then ended for a restart at that DDL: a
# wasted round trip.)
SNAPSHOT_REQUEST_POLL_SECONDS = 0.1
# Besides the notices, every table's request is looked at (a ``stat`` each, only a changed one
# read) when the engine starts and this often: a request written without its notice (its
# writer killed between the two files, a reader of an older version, a hand edit) is seen at
# most this much later. Looking at every request at each poll was 21 ms every 0.1 s with 500
# tables (and a request per table per poll on object storage).
REQUEST_SCAN_SECONDS = 60.0
# An ended session (done, stopped, restart) stays in the checkpoint at least this long, so the
# reader, which polls the checkpoint, sees the end there; then it moves to
# ``ended_sessions.json`` once nothing needs it in the checkpoint (``may_leave_checkpoint``).
ENDED_LINGER_SECONDS = 10.0
# How often the coordinator looks for ended sessions that may leave the checkpoint, and how
# long it waits at most before looking again at one whose chunk files are still there.
LEAVE_LOOK_SECONDS = 2.0
MAX_CHUNKS_LOOK_SECONDS = 120.0

# Touched-key log pruning (``commit_rule.TouchedKeyLog``): a session's log starts a new
# generation once it holds this many touches and its generation is at least this old. The
# age keeps chunks that wait for the engine (a lagging engine, a burst of writes) from being
# rejected over and over; the log holds about two generations at most.
MAX_LOGGED_TOUCHES = 200_000
MIN_GENERATION_SECONDS = 30.0
# A session whose chunks were rejected this many times in a row, with no commit between, is
# stopped: something rejects every re-read (a schema the engine cannot match, a chunk that
# cannot be landed), and re-reading forever would only grow ``rejected`` in the checkpoint.
# Legitimate runs stay far below: an engine restart rejects at most the reader's pending
# chunks (32 by default), and their re-reads commit.
MAX_REJECTIONS_IN_A_ROW = 200
# After the source could not give a table's schema, ask again no sooner than this.
SCHEMA_RETRY_SECONDS = 5.0


@dataclass(slots=True)
class _Ended:
    """An ended session still in the checkpoint: what decides when it may leave it."""

    since: float  # time.monotonic() when it ended (or was found ended at start)
    # The checkpoint (``checkpoint_state``'s count of them) that first carried the end; None
    # until one did. At start: 0, the end is in the checkpoint read.
    taken: int | None = None
    look_at: float = 0.0  # when its chunk files are looked for next
    look_every: float = 0.0  # (doubles from LEAVE_LOOK_SECONDS while they are there)


def may_leave_checkpoint(ended: _Ended, checkpoints: int, now: float,
                         chunks_left: bool) -> bool:
    """Whether an ended session may leave the checkpoint for ``ended_sessions.json`` now.

    - Its end is durable: two checkpoints were taken after the one that first carried it
      (the landing writer writes one flush at a time, and each waits for the one before: by
      the second the first is on disk). A session whose end could still be undone by a crash
      never leaves, so ``ended_sessions.json`` never says a session ended that a restarted
      engine would go on with (a record in the checkpoint would win anyway).
    - It ended ``ENDED_LINGER_SECONDS`` ago: the reader, which polls the checkpoint, normally
      saw the end there (one that did not finds it in ``ended_sessions.json``).
    - Its chunk files are gone (``chunks_left``: its reader deletes them when it sees the
      session done; retention deletes the files of an ended session after its grace). Retention
      judges a session's files by the checkpoint's record: while ``request.json`` names the
      session and the checkpoint no longer does, it would keep them forever.
    """
    return (ended.taken is not None and checkpoints >= ended.taken + 2
            and now - ended.since >= ENDED_LINGER_SECONDS and not chunks_left)


class SnapshotCoordinator(ChunkDecisions):
    """Sessions, touched-key log and chunk commits for one engine."""

    def __init__(self, landing: LandingZone, flavour: str, log: Any, emitter: SnapshotEmitter,
                 schemas: TableSchemas, max_logged_touches: int = MAX_LOGGED_TOUCHES,
                 min_generation_seconds: float = MIN_GENERATION_SECONDS,
                 max_rejections_in_a_row: int = MAX_REJECTIONS_IN_A_ROW) -> None:
        self.landing = landing
        self.flavour = flavour
        self.log = log
        self._emitter = emitter
        self._schemas = schemas
        self.max_logged_touches = max_logged_touches
        self.min_generation_seconds = min_generation_seconds
        self.max_rejections_in_a_row = max_rejections_in_a_row
        # The sessions the checkpoint records: those tracked (open, paused: ``_tracked``) and
        # those that ended and have not left it yet (``_ended``).
        self.sessions: dict[str, SnapshotSession] = {}
        self._tracked: dict[str, TrackedSession] = {}
        self._ended: dict[str, _Ended] = {}
        # Sessions that left the checkpoint (``ended_sessions.json``), each table's newest: a
        # request that still names one of them is not opened again.
        self.left: dict[str, SnapshotSession] = {}
        self._checkpoints = 0  # taken by ``checkpoint_state``
        self._next_leave_look = 0.0
        # request.json files as last read, by the store's stamp (a stat locally, an ETag on
        # object storage): a look at every request re-reads only the ones that changed.
        self._requests: dict[tuple[str, str], tuple[str, SnapshotRequest | None]] = {}
        self._last_tick = time.monotonic()
        self._last_request_poll = float("-inf")
        self._next_request_scan = float("-inf")  # (the first poll looks at every request)
        # Locally a look at the notices is a directory listing (microseconds): at every tick.
        # On object storage it is a request: at most every SNAPSHOT_REQUEST_POLL_SECONDS (a
        # pause or stop takes effect that much later).
        self._request_poll_seconds = 0.0 if landing.is_local else SNAPSHOT_REQUEST_POLL_SECONDS
        # Session state changed since the checkpoint last took it (``checkpoint_state``).
        self._changed = False

    # -- state -----------------------------------------------------------------------------

    def on_start(self, state: dict[str, Any], resumed_at: GtidSet) -> None:
        """Sessions from the checkpoint, and those that left it. The touched-key log was in
        memory: it restarts empty at the resumed position, which becomes the horizon chunks'
        low watermarks must contain."""
        self.left = dict(read_ended_sessions(self.landing).sessions)
        for table_id, data in state.items():
            session = SnapshotSession.from_dict(data, table_id)
            self.sessions[table_id] = session
            if session.tracked:
                session.horizon = str(resumed_at)
                self._track(session)
            else:  # (its end is in the checkpoint read: durable)
                self._ended[table_id] = _Ended(time.monotonic() - ENDED_LINGER_SECONDS, 0)

    def checkpoint_state(self, due: bool) -> dict[str, Any] | None:
        """The sessions the checkpoint keeps (empty without sessions), when a checkpoint
        is to be written: ``due`` (the engine writes one anyway), or session state changed
        since it was last taken (a checkpoint must then be written even if nothing else moved);
        None when neither. From here the state counts as checkpointed (the engine writes it
        with the records it emitted). Ended sessions that may leave it first go to
        ``ended_sessions.json`` (``_leave``)."""
        if self._ended and time.monotonic() >= self._next_leave_look:
            self._leave()
        if not due and not self._changed:
            return None
        self._changed = False
        self._checkpoints += 1
        for ended in self._ended.values():
            if ended.taken is None:
                ended.taken = self._checkpoints
        return {table_id: s.to_dict() for table_id, s in self.sessions.items()}

    def _leave(self) -> None:
        """Move the ended sessions that may leave the checkpoint (``may_leave_checkpoint``) to
        ``ended_sessions.json``, written (durably) before the checkpoint that lacks them."""
        now = time.monotonic()
        self._next_leave_look = now + LEAVE_LOOK_SECONDS
        leaving = []
        for table_id, ended in self._ended.items():
            if now < ended.look_at or not may_leave_checkpoint(
                    ended, self._checkpoints, now, chunks_left=False):
                continue  # (its chunk files are listed only once the rest allows it)
            session = self.sessions[table_id]
            chunks_left = bool(self.landing.store.list_names(*chunk_parts(
                *names.split_table_id(table_id), session.session_id)))
            if may_leave_checkpoint(ended, self._checkpoints, now, chunks_left):
                leaving.append(table_id)
            else:  # (looked at again later, less and less often)
                ended.look_every = min(max(2 * ended.look_every, LEAVE_LOOK_SECONDS),
                                       MAX_CHUNKS_LOOK_SECONDS)
                ended.look_at = now + ended.look_every
        if not leaving:
            return
        left = {**self.left, **{t: self.sessions[t] for t in leaving}}
        self.landing.write_ended_sessions(EndedSessions(left))
        self.left = left
        for table_id in leaving:
            del self.sessions[table_id], self._ended[table_id]
        self._changed = True
        self.log.info(f"snapshot sessions: {len(leaving)} ended session(s) left the checkpoint "
                      f"for ended_sessions.json ({', '.join(leaving[:5])}"
                      f"{' ...' if len(leaving) > 5 else ''}); {len(self.sessions)} remain")

    def _track(self, session: SnapshotSession) -> None:
        self._tracked[session.table_id] = TrackedSession(
            TouchedKeyLog(parse_position(self.flavour, session.horizon), time.monotonic()),
            tuple(session.chunk_key))
        self._ended.pop(session.table_id, None)

    def _end(self, table_id: str) -> None:
        """The session ended (done, stopped, restart): no longer tracked, and on its way out of
        the checkpoint."""
        self._tracked.pop(table_id, None)
        self._ended[table_id] = _Ended(time.monotonic())

    def logged_touches(self, table_id: str) -> int:
        """How many touches the table's touched-key log holds (0 without a session)."""
        tracked = self._tracked.get(table_id)
        return 0 if tracked is None else tracked.touched.size

    def readers_alive(self) -> bool:
        """Whether a snapshot reader of an open or paused session is running (it holds its
        table's ``reader.lock``; a dead reader's lock is released with its process)."""
        return any(reader_alive(self.landing, *names.split_table_id(table_id))
                   for table_id in self._tracked)

    # -- the engine's hot path -------------------------------------------------------------

    def key_columns(self, table_id: str) -> tuple[str, ...] | None:
        """The chunk key of a table under snapshot (touches are logged by it), else None."""
        tracked = self._tracked.get(table_id)
        return None if tracked is None else tracked.key_columns

    def record_touch(self, table_id: str, key: Key, gtid: Gtid, position: int) -> None:
        self._tracked[table_id].touched.record(key, gtid, position)

    def on_ddl(self, table_id: str, gtid: Gtid) -> bool:
        """A DDL on a table under snapshot ends its session as ``restart``; True if it did.

        A DDL can change the values of rows without row events (an added column's default, a
        type change, a TRUNCATE), including rows of chunks already committed. So the reader
        starts a new session and reads the whole table again; chunks of the old session are
        no longer decided. Primary-key changes are reported by the reader, not supported.
        """
        tracked = self._tracked.get(table_id)
        if tracked is None:
            return False
        tracked.ddl.append(gtid)
        session = self.sessions.get(table_id)
        if session is None or not session.tracked:
            return False
        session.state = SessionState.RESTART
        session.ended_at = session_time()
        session.reason = f"DDL at GTID {gtid} changed the table"
        self._end(table_id)
        self._changed = True
        self.log.info(f"snapshot of {table_id}: session {session.session_id} ends for a "
                      f"restart ({session.reason}); the reader reads the table again")
        return True

    def on_gap(self, gtid: Gtid, reason: str) -> bool:
        """Capture jumped over a gap of the binlog (a purged position): every open or paused
        session ends as ``restart``, as after a DDL (its touched-key log misses the gap), and
        its reader reads the whole table again; True if one did."""
        restarted = False
        for table_id in list(self._tracked):
            if self.on_ddl(table_id, gtid):
                self.sessions[table_id].reason = reason
                restarted = True
        return restarted

    # -- at each tick ----------------------------------------------------------------------

    def on_tick(self, processed: GtidSet, now: float | None = None) -> bool:
        """Pick up requests, prune touched-key logs, decide pending chunks (landing those that
        commit through the emitter) with ``processed`` the transactions the engine processed;
        True when session state changed (the engine then checkpoints soon).

        With ``now`` (``time.monotonic()``, the engine between events) only when a tick is
        due: often while a session is open (chunks may be pending), less often while only new
        requests may come; False, doing nothing, when none is."""
        if now is not None:
            # (between every two binlog events: only the tracked sessions are looked at; over
            # every session the checkpoint ever held this was 105 us an event at 1,000)
            active = any(self.sessions[t].state == SessionState.OPEN for t in self._tracked)
            if now - self._last_tick < (SNAPSHOT_POLL_SECONDS if active
                                        else SNAPSHOT_REQUEST_POLL_SECONDS):
                return False
        self._last_tick = time.monotonic()
        changed = self._poll_requests(processed, self._emitter.next_pos)
        changed |= self._prune(processed)
        for table_id in list(self._tracked):
            session = self.sessions[table_id]
            if session.state == SessionState.OPEN:
                changed |= self._decide_pending(session, processed)
        self._changed |= changed
        return changed

    def _prune(self, processed: GtidSet) -> bool:
        """Start a new touched-key log generation where the log grew past its bound (see
        ``TouchedKeyLog``); the moved horizon goes to the checkpoint with the session."""
        changed = False
        now = time.monotonic()
        for table_id, tracked in self._tracked.items():
            log = tracked.touched
            if log.size < self.max_logged_touches or (
                    now - log.generation_started < self.min_generation_seconds):
                continue
            before = log.size
            dropped = log.prune(processed, now)
            session = self.sessions[table_id]
            if str(log.horizon) != session.horizon:
                session.horizon = str(log.horizon)
                changed = True
            self.log.info(f"snapshot of {table_id}: touched-key log pruned ({dropped} of "
                          f"{before} touches dropped; horizon now {session.horizon}): chunks "
                          "read before it are rejected and read again")
        return changed

    def _schema_for_decisions(self, session: SnapshotSession) -> TableSchema | None:
        """The schema chunks of the session are compared with, or None to decide later.

        The engine learns schemas from table maps, which only come with row events: after a
        DDL on a quiet table, or for a table created since the engine started, it has an old
        schema or none. So when a session opens (or the engine resumes one), and whenever the
        engine has no schema, it is read from the source. That schema may be newer than the
        engine's position; it is still safe to decide with (``SchemaTracker.learn_table`` says why).
        """
        table_id = session.table_id
        schema = self._schemas.schemas.get(table_id)
        tracked = self._tracked[table_id]
        due = tracked.schema_due_at
        if schema is not None and due is None:
            return schema
        if due is not None and time.monotonic() < due:
            return None
        try:
            fresh = self._schemas.learn_table(table_id)
        except Exception as error:  # noqa: BLE001 - the source may be unreachable for a while
            tracked.schema_due_at = time.monotonic() + SCHEMA_RETRY_SECONDS
            self.log.warning(f"snapshot of {table_id}: could not read the table's schema from "
                             f"the source ({type(error).__name__}: {error}); its chunks wait, "
                             f"and the engine asks again in {SCHEMA_RETRY_SECONDS:.0f}s")
            return None
        if fresh is not None:
            tracked.schema_due_at = None
            return fresh
        if schema is not None:
            tracked.schema_due_at = None  # decided with the engine's schema from now on
            return schema
        tracked.schema_due_at = time.monotonic() + SCHEMA_RETRY_SECONDS
        self.log.warning(f"snapshot of {table_id}: the table does not exist on the source and "
                         "the engine has no schema for it; its chunks wait (session "
                         f"{session.session_id}): stop the snapshot if the table is gone")
        return None

    def _poll_requests(self, processed: GtidSet, next_pos: int) -> bool:
        """New or changed requests: the tables the readers' notices name (one listing), or,
        at start and every ``REQUEST_SCAN_SECONDS``, every table's request (a stamp each; see
        ``_request_poll_seconds``). A notice goes once its table's request was read."""
        now = time.monotonic()
        if now - self._last_request_poll < self._request_poll_seconds:
            return False
        self._last_request_poll = now
        notices = request_notices(self.landing)
        if now >= self._next_request_scan:
            self._next_request_scan = now + REQUEST_SCAN_SECONDS
            tables = requested_tables(self.landing)
        else:
            tables = list(dict.fromkeys(n.table for n in notices if n.table is not None))
        changed = False
        for database, table in tables:
            request = self._request(database, table)
            if request is not None:  # (an unreadable one is logged by read_request)
                changed |= self._apply(names.table_id(database, table), request, processed,
                                      next_pos)
        for notice in notices:  # (after the requests were read: see write_request)
            delete_request_notice(self.landing, notice)
        return changed

    def _request(self, database: str, table: str) -> SnapshotRequest | None:
        """The table's request, read again only when its file changed since the last poll
        (a stamp each, not a parse)."""
        stamp = self.landing.store.stamp(*request_parts(database, table))
        if stamp is None:
            self._requests.pop((database, table), None)
            return None
        known = self._requests.get((database, table))
        if known is not None and known[0] == stamp:
            return known[1]
        request = read_request(self.landing, database, table)
        self._requests[(database, table)] = (stamp, request)
        return request

    def _apply(self, table_id: str, request: SnapshotRequest, processed: GtidSet,
               next_pos: int) -> bool:
        session = self.sessions.get(table_id)
        action, session_id = request.action, request.session_id
        left = self.left.get(table_id)
        if left is not None and left.session_id == session_id and (
                session is None or session.session_id != session_id):
            return False  # (it ended and left the checkpoint; its request stays behind)
        # A new session is opened by its "open", or by a "pause"/"resume" that reached the
        # request before this engine saw the "open" (the engine was down): the request is
        # the desired state.
        if action in (Action.OPEN, Action.PAUSE, Action.RESUME) and request.chunk_key and (
                session is None or session.session_id != session_id):
            session = SnapshotSession(
                table_id=table_id, session_id=session_id,
                state=SessionState.PAUSED if action == Action.PAUSE else SessionState.OPEN,
                opening=str(processed), opening_pos=next_pos, horizon=str(processed),
                chunk_key=list(request.chunk_key), condition=request.condition)
            self.sessions[table_id] = session
            self._track(session)
            self.log.info(f"snapshot of {table_id}: session {session_id} opened at GTID "
                          f"{session.opening or '(start)'}, changelog position {next_pos}"
                          + (" (paused)" if session.state == SessionState.PAUSED else ""))
            return True
        if session is None or session.session_id != session_id:
            return False
        target = _ACTION_STATES.get(action)
        # An ended session stays ended: a pause or resume of a session ended for a restart
        # (the reader had not asked for its new session yet) once made it open again while
        # untracked, and the next tick failed the engine on its missing touched-key log.
        if target is None or not session.tracked or session.state == target:
            return False
        session.state = target
        self.log.info(f"snapshot of {table_id}: session {session_id} {target}")
        if target == SessionState.STOPPED:
            session.ended_at = session_time()
            self._end(table_id)
        return True
