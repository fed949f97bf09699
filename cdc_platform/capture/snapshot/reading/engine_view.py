"""The capture engine's decisions as a snapshot reader sees them: the checkpoint's record of a
table's session, and ``ended_sessions.json``'s once the session left the checkpoint.

A reader polls these while it waits for chunks to be committed, many times a second; this
module owns how often that costs a parse (only when the checkpoint's stamp changed, shared by
the readers of a process) so that ``reader`` only asks what the engine decided.
"""

from __future__ import annotations

import threading
import time

from cdc_platform.capture.landing.session_records import SnapshotSession
from cdc_platform.capture.landing.zone import CHECKPOINT_FILE, Checkpoint, LandingZone
from cdc_platform.capture.snapshot.protocol import read_ended_sessions, read_session_state


class _SharedCheckpoints:
    """The newest parsed checkpoint of each landing zone, shared by the readers of a process.

    A snapshot run reads several tables at once, and each reader re-read the checkpoint at
    every engine flush: with 1,000 tables' sessions in it (400 KB) that was a parse per reader
    per flush. Readers that see the same stamp now share one parse. An entry is only handed
    out for the stamp it was read after, so a reader never gets a checkpoint older than the
    file it saw."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[str, Checkpoint | None]] = {}

    def read(self, landing: LandingZone, stamp: str) -> Checkpoint | None:
        key = landing.store.uri
        with self._lock:
            cached = self._latest.get(key)
            if cached is not None and cached[0] == stamp:
                return cached[1]
            checkpoint = landing.read_checkpoint()
            self._latest[key] = (stamp, checkpoint)
            return checkpoint


_SHARED_CHECKPOINTS = _SharedCheckpoints()


class EngineView:
    """The capture engine's record of one table's session, as a reader polls it.

    The checkpoint is re-parsed only when the file changed (its store's stamp: a stat
    locally, a HEAD on object storage); ``changed_at`` is when it last changed, which tells
    a stalled engine."""

    def __init__(self, landing: LandingZone, table_id: str) -> None:
        self.landing = landing
        self.table_id = table_id
        self._checkpoint_stamp: str | None = None
        self._checkpoint: Checkpoint | None = None
        self.changed_at = time.monotonic()
        # ended_sessions.json's record of this session, as of the checkpoint stamp it was
        # looked at for (``session``).
        self._left: tuple[str | None, SnapshotSession | None] = ("", None)

    def checkpoint(self) -> Checkpoint | None:
        """The engine's checkpoint, re-parsed only when the file changed (its store's stamp:
        a stat locally, a HEAD on object storage)."""
        stamp = self.landing.store.stamp(CHECKPOINT_FILE)
        if stamp is None:
            return None
        if stamp != self._checkpoint_stamp:
            self._checkpoint_stamp = stamp
            self.changed_at = time.monotonic()
            try:
                self._checkpoint = _SHARED_CHECKPOINTS.read(self.landing, stamp)
            except ValueError:
                self._checkpoint_stamp = None  # caught mid-replace on a non-POSIX filesystem
        return self._checkpoint

    def session(self, session_id: str) -> SnapshotSession | None:
        """The engine's record of the table's session: the checkpoint's, else (an ended
        session leaves the checkpoint some seconds after it ended) the record of
        ``session_id`` in ``ended_sessions.json``, which is looked at again only when the
        checkpoint changed (the engine writes it before the checkpoint that lacks the
        session)."""
        state = read_session_state(self.checkpoint(), self.table_id)
        if state is not None:
            return state
        if self._left[0] != self._checkpoint_stamp:
            left = read_ended_sessions(self.landing).get(self.table_id)
            self._left = (self._checkpoint_stamp, left if left is not None and (
                left.session_id == session_id) else None)
        return self._left[1]
