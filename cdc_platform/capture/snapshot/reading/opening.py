"""How a snapshot reader comes to own its table's session: it requests one (or a new one after
the engine ended it for a DDL), adopts the open session of a reader that died, replaces the
session of a reader told to stop, and waits for the capture engine's acknowledgement.

:class:`SessionOpening` holds these phases of ``SnapshotReader``'s run (``reader``), which
inherits them; the read-publish-follow loop that comes after is the reader's own. They use
the reader's settings (``landing``, ``schema``, ``session_id``, ``signal``...), its run
(``_run``, ``reading.run_state``) and a few of its steps (``_request``, ``_progress``,
``_stopped``, ``_with_connection``).
"""

from __future__ import annotations

import collections
import json
import re
import time

from cdc_platform.capture.landing.session_records import NO_SESSION, Action, SnapshotRequest
from cdc_platform.capture.landing.zone import SNAPSHOT_CHUNKS_DIR, snapshot_parts
from cdc_platform.capture.snapshot.errors import NoEngineError, SnapshotError
from cdc_platform.capture.snapshot.protocol import (
    chunk_parts,
    manifest_name,
    progress_parts,
    read_control,
    read_request,
    read_session_state,
    write_request,
)
from cdc_platform.capture.snapshot.reading.keyset import read_max_key
from cdc_platform.capture.snapshot.reading.progress import (
    KeyRange,
    ReaderState,
    SnapshotResult,
    WrittenChunk,
    decode_range,
)

# How often a reader waiting for the engine to acknowledge its session looks (it reads
# request.json each time, to see a stop).
ACK_POLL_SECONDS = 0.02


class SessionOpening:
    """The phases of a reader's run before it reads: open, adopt or replace the table's
    session, and wait for the engine to acknowledge it (mixed into ``SnapshotReader``)."""

    def _stop_for(self, barrier: SnapshotRequest) -> None:
        """A stop-snapshot signal raced with this session's opening (its request replaced
        ours): stop this session, keeping the signal on record for runs launched before it."""
        write_request(self.landing, self.schema.database, self.schema.table, SnapshotRequest(
            self.session_id, Action.STOP, self._chunked.key.columns, self.condition,
            self.chunk_size, signal=barrier.signal))

    def _superseded(self) -> SnapshotRequest | None:
        """The table's request if a newer signal wrote it (a stop-snapshot, or a snapshot it
        started): this run's signal is then out of date and the run must not open a session.
        """
        signal = self.signal
        if signal is None:
            return None
        current = read_request(self.landing, self.schema.database, self.schema.table)
        # A newer stop, or a newer snapshot of the table; a pause or resume a newer signal
        # applied to an earlier session says nothing about this run.
        if current is not None and current.signal is not None and \
                current.signal.newer_than(signal) and current.action in (Action.STOP, Action.OPEN):
            return current
        return None

    def _follow_control(self) -> str | None:
        """Just after requesting a session: a pause (or resume) signal that found no session
        of the table open while this run was queued left ``control.json``
        (``signal_action``); a run of an earlier signal follows it. Runs of later signals, and
        runs started by hand, do not."""
        control = read_control(self.landing, self.schema.database, self.schema.table)
        if control is None or self.signal is None:
            return None
        action, signal = control
        if not signal.newer_than(self._steering or self.signal):
            return None
        self._steering = signal
        self._request(action)  # (a "resume" opens a session the engine has not seen yet)
        self.log.info(f"{self._where()}: {action} requested by signal {signal.id}, sent before "
                      "this run opened its session")
        return action

    def _open_session(self, restart: bool = False) -> SnapshotResult | None:
        """Request a session (a new one after a restart, paused if the run was paused), wait
        for the engine's acknowledgement, read the maximum key; a result if it was stopped."""
        paused = self._run.state == ReaderState.PAUSED
        if restart:
            self._check_writes(wait=True)  # the old session's files, before it is removed
            current = read_request(self.landing, self.schema.database, self.schema.table)
            if current is not None and (current.session_id == NO_SESSION or (
                    current.session_id == self.session_id and current.action == Action.STOP)):
                return self._stopped("a stop request while the session restarted")
            self._run.restarts += 1
            self.session_id = f"{self._run.base_session_id}-r{self._run.restarts}"
            self._run.todo.clear()
            self._run.pending.clear()
            self._run.held = self._run.final_seq = None
            self._run.next_seq = self._run.rows = self._run.chunks = 0
            self._with_connection("re-reading the table's schema", lambda _c: self.reload_schema())
        if not self._lock.held and self._replaces_a_stopped_session():
            # Its reader ends on seeing the stop: let it see the stop (and end as stopped, not
            # as replaced) before this session's request takes its place.
            self._wait_for_the_replaced_reader()
        self._request(Action.PAUSE if paused else Action.OPEN)
        paused = {"pause": True, "resume": False}.get(self._follow_control() or "", paused)
        if not self._lock.held:
            self._wait_for_the_replaced_reader()
        key = ", ".join(self._chunked.key.columns)
        self.log.info(f"{self._where()}: requested (chunk key {key}, "
                      f"chunk size {self.chunk_size}"
                      + (f", condition {self.condition!r}" if self.condition else "")
                      + (f"; restart {self._run.restarts}" if restart else "") + ")")
        if not self._wait_for_acknowledgement():
            return self._stopped("stop requested before the engine acknowledged the session")
        self._remove_other_sessions()
        max_key = self._with_connection("reading the maximum key",
                                        lambda conn: read_max_key(conn, self._chunked))
        self._run.todo.append(KeyRange(None, max_key, True))
        self._run.maximum_key = None if max_key is None else [str(v) for v in max_key]
        self._run.state = ReaderState.PAUSED if paused else ReaderState.OPEN
        self._progress()
        return None

    # -- resuming a session whose reader died ---------------------------------------------

    def _resume_session(self) -> bool:
        """Adopt the table's open session if its reader died (a killed run) and this run asks
        for the same snapshot; True when adopted.

        The engine kept deciding the dead reader's chunks; ``reader.state`` (JSON) says which ranges
        were still to read and which chunks were written. A chunk recorded as written whose
        manifest never appeared is read again; so is a held (unpublished) last chunk.
        """
        request = read_request(self.landing, self.schema.database, self.schema.table)
        if request is None or request.action == Action.STOP:
            return False
        state = read_session_state(self._engine.checkpoint(), self.table_id)
        if state is None or state.session_id != request.session_id or not state.tracked:
            return False
        if request.chunk_key != self._chunked.key.columns or request.condition != self.condition:
            self.log.info(f"snapshot of {self.table_id}: session {request.session_id} is open with "
                          f"another chunk key or condition; starting a new session replaces it")
            return False
        data = self.landing.store.read_bytes(*progress_parts(
            self.schema.database, self.schema.table, request.session_id))
        try:
            saved = json.loads(data) if data is not None else None
        except ValueError:
            saved = None
        if not isinstance(saved, dict):
            return False
        self.session_id = request.session_id
        self._run.base_session_id = self.session_id.rsplit("-r", 1)[0] if re.fullmatch(
            r".*-r\d+", self.session_id) else self.session_id
        self._run.todo = collections.deque(decode_range(d) for d in saved["todo"])
        files = self.landing.store.list_names(*chunk_parts(
            self.schema.database, self.schema.table, self.session_id))
        for seq_text, data in sorted(saved["pending"].items(), key=lambda i: int(i[0])):
            written = WrittenChunk(int(seq_text), decode_range(data["range"]), int(data["rows"]),
                                   bool(data["complete"]), str(data["after_gtid"]))
            if manifest_name(written.seq) in files:
                self._run.pending[written.seq] = written
                if written.complete:
                    self._run.final_seq = written.seq
            else:  # died before publishing it: read it again first
                self._run.todo.appendleft(written.range)
        if saved.get("held") is not None:
            self._run.todo.append(decode_range(saved["held"]))
        # (past every chunk file, even a rows file without its manifest: seqs are written
        # once, exclusively, and reader.state is not fsynced)
        written_seqs = [int(stem) for stem in (name.partition(".")[0] for name in files)
                        if stem.isdigit()]
        self._run.next_seq = max([int(saved["next_seq"]), *(seq + 1 for seq in written_seqs)])
        self._run.rows, self._run.chunks = int(saved["rows"]), int(saved["chunks"])
        self._run.rejected = self._run.reselected = int(saved["rejected"])
        self._run.start_gtid = str(saved["start_gtid"])
        self._run.end_gtid = str(saved["end_gtid"])
        self.log.info(f"{self._where()}: resuming the session of a reader that stopped: "
                      f"{self._run.chunks} chunks ({self._run.rows} rows) committed, "
                      f"{len(self._run.pending)} waiting for the engine, {len(self._run.todo)} "
                      "ranges still to read")
        return True

    def _replaces_a_stopped_session(self) -> bool:
        """Whether the table's request stops another session (its run told to stop: a signal,
        the CLI, a cancelled run) that this one is about to replace."""
        current = read_request(self.landing, self.schema.database, self.schema.table)
        return current is not None and current.action == Action.STOP and \
            current.session_id not in (NO_SESSION, self.session_id)

    def _wait_for_the_replaced_reader(self) -> None:
        """Another reader of the table is alive: this session replaces its session (it notices
        and ends); read only once it is gone."""
        holder = self._lock.holder()
        self.log.info(f"{self._where()}: replacing the session of a running reader ({holder})")
        deadline = time.monotonic() + self.ack_timeout_seconds
        while not self._lock.try_acquire():
            if time.monotonic() >= deadline:
                raise SnapshotError(
                    f"{self._where()}: the reader of the replaced session ({holder}) did not end "
                    f"within {self.ack_timeout_seconds:.0f}s; stop its run, then start again")
            time.sleep(self.poll_seconds)

    def _wait_for_acknowledgement(self) -> bool:
        deadline = time.monotonic() + self.ack_timeout_seconds
        while True:
            if self._run.state == ReaderState.WAITING:
                self._progress()  # (how long it has waited: the run's progress lines say)
            if self._run.stop_event.is_set():
                self._request(Action.STOP)
                return False
            request = read_request(self.landing, self.schema.database, self.schema.table)
            if request is not None and (request.action == Action.STOP
                                        or request.session_id != self.session_id):
                # stopped (a signal, the CLI) or replaced before the engine saw it
                if request.session_id == NO_SESSION:
                    self._stop_for(request)
                return False
            state = self._engine.session(self.session_id)
            if state is not None and state.session_id == self.session_id:
                self.log.info(f"{self._where()}: acknowledged by the capture engine at GTID "
                              f"{state.opening or '(start)'}, changelog position "
                              f"{state.opening_pos}")
                return True
            if time.monotonic() >= deadline:
                # A later engine must not open a session nobody reads.
                self._request(Action.STOP)
                raise NoEngineError(
                    f"no capture engine is streaming {self.landing.server_name}: start the "
                    f"stream_changes job (snapshot session {self.session_id} of {self.table_id} "
                    f"was not acknowledged within {self.ack_timeout_seconds:.0f}s; the engine "
                    "picks up requests at every flush)"
                )
            time.sleep(min(self.poll_seconds, ACK_POLL_SECONDS))

    def _remove_other_sessions(self) -> None:
        """Chunk files of sessions this one replaced: the engine no longer reads them."""
        if self.keep_chunks:
            return
        chunks = (*snapshot_parts(self.schema.database, self.schema.table), SNAPSHOT_CHUNKS_DIR)
        for session_id in self.landing.store.list_names(*chunks):
            if session_id != self.session_id:
                self.landing.store.delete_directory(*chunks, session_id)
