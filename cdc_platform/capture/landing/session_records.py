"""The records of a snapshot session as the landing zone keeps them: the engine's session record
(``SessionState``, ``SnapshotSession``) that the checkpoint's ``snapshots`` section holds
(``Checkpoint.snapshot_session`` parses it), ``EndedSessions`` (``ended_sessions.json``: the
sessions that ended and left the checkpoint) and the reader's ``SnapshotRequest``
(``request.json``, with its ``Action``, ``SignalRef`` and ``DEFAULT_CHUNK_SIZE``).

Apart from ``capture.landing.zone`` (the layout, the checkpoint, the reader and the writable
zone) because they are the snapshot protocol's records rather than the zone's plumbing: the
engine (``snapshot.sessions``) and the reader (``snapshot.protocol``, retention) both read and
write them, and neither needs the zone's stores to do so. Layout and contracts:
docs/landing-zone.md, docs/snapshots.md.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

log = logging.getLogger(__name__)

# Ended sessions that left the checkpoint (``EndedSessions``): the newest of each table.
ENDED_SESSIONS_FILE = "ended_sessions.json"


class SessionState(enum.StrEnum):
    """The engine's ``state`` of a session in ``checkpoint.json``."""

    OPEN = "open"
    PAUSED = "paused"
    STOPPED = "stopped"
    DONE = "done"
    RESTART = "restart"  # ended for a DDL: the reader reads the table again in a new session

    @property
    def tracked(self) -> bool:
        """Open or paused: the engine tracks the session (its touches are logged); any other
        state has ended, and its chunk files are never read again."""
        return self in (SessionState.OPEN, SessionState.PAUSED)


def session_time() -> str:
    """A session's ``started_at`` / ``ended_at``: UTC, to the second."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass
class SnapshotSession:
    """One table's session as the checkpoint records it."""

    table_id: str
    session_id: str
    state: SessionState
    opening: str
    opening_pos: int
    horizon: str
    chunk_key: list[str]
    condition: str | None = None
    committed: list[int] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    rows: int = 0
    started_at: str = field(default_factory=session_time)
    ended_at: str | None = None
    reason: str | None = None  # why the engine ended it (a restart)

    @staticmethod
    def from_dict(data: dict[str, Any], table_id: str = "") -> SnapshotSession:
        """The session a checkpoint records (``table_id``: its key there). Fields a record
        lacks take their defaults, and fields this version does not know are left out, so a
        checkpoint of another version reads too; ``state`` must be one of ``SessionState``.
        The record's lists and mappings are copied: the session grows its own (a chunk
        committed after it was read must not change the record it was read from)."""
        known = {f.name for f in fields(SnapshotSession)}
        opening = str(data.get("opening") or "")
        defaults = {"table_id": table_id, "opening": opening, "opening_pos": 0,
                    "horizon": opening, "chunk_key": []}
        values = {**defaults, **{k: v for k, v in data.items() if k in known}}
        values.update({k: list(values[k]) for k in ("chunk_key", "committed") if k in values})
        if "rejected" in values:
            values["rejected"] = dict(values["rejected"])
        return SnapshotSession(**{**values, "state": SessionState(data["state"])})

    @property
    def tracked(self) -> bool:
        """Whether the engine tracks the session (open or paused): its touches are logged."""
        return self.state.tracked

    def to_dict(self) -> dict[str, Any]:
        """The record as the checkpoint keeps it (``from_dict`` reads it back): built field by
        field, where ``dataclasses.asdict`` (deep copies through a generic walk) cost 60 us a
        session, a flush's main cost with a thousand of them."""
        return {"table_id": self.table_id, "session_id": self.session_id,
                "state": str(self.state), "opening": self.opening,
                "opening_pos": self.opening_pos, "horizon": self.horizon,
                "chunk_key": list(self.chunk_key), "condition": self.condition,
                "committed": list(self.committed), "rejected": dict(self.rejected),
                "rows": self.rows, "started_at": self.started_at, "ended_at": self.ended_at,
                "reason": self.reason}


@dataclass(frozen=True)
class EndedSessions:
    """``ended_sessions.json``: each table's newest snapshot session that ended (done,
    stopped, restart) and then left the checkpoint, as the checkpoint recorded it.

    The checkpoint keeps the sessions the engine tracks and, for a little while, those that
    ended (``snapshot.sessions``: until the end is durable, the reader has seen it and its
    chunk files are gone); kept there forever, a thousand tables' done sessions made every
    flush write and every poller parse 400 KB. What still needs an ended session's record
    later reads it here: the engine (a ``request.json`` that still names a session which
    ended is not opened again), a reader told its session ended, a stale marker resolved
    after its snapshot ended. Written by the engine alone (``LandingZone.
    write_ended_sessions``), atomically, before any checkpoint that lacks the sessions it
    adds; a record in the checkpoint wins over this one (``snapshot.protocol.latest_session``).
    One record per table: its size follows the tables snapshotted, and it is rewritten only
    when sessions leave the checkpoint."""

    sessions: Mapping[str, SnapshotSession] = field(default_factory=dict)

    def get(self, table_id: str) -> SnapshotSession | None:
        return self.sessions.get(table_id)

    def to_json(self) -> bytes:
        records = {table_id: s.to_dict() for table_id, s in sorted(self.sessions.items())}
        return json.dumps({"sessions": records}, separators=(",", ":")).encode()

    @staticmethod
    def from_json(text: bytes | str) -> EndedSessions:
        """The file's records (one that does not read as a session is left out, logged: the
        engine writes whole files, so only a hand edit breaks one)."""
        sessions: dict[str, SnapshotSession] = {}
        for table_id, data in (json.loads(text).get("sessions") or {}).items():
            try:
                sessions[table_id] = SnapshotSession.from_dict(data, table_id)
            except (KeyError, TypeError, ValueError) as error:
                log.warning(f"{ENDED_SESSIONS_FILE}: the record of {table_id} does not read "
                            f"({error!r}); left out")
        return EndedSessions(sessions)


# ---- request.json (reader -> engine; docs/snapshots.md) ----------------------------------------
# The reader's request is a record of the landing zone too, beside the engine's session record
# above: ``snapshot.protocol`` names it with the rest of the protocol, and retention reads it
# with the same parser from this floor below.

# Rows per chunk, chosen by measurement. Each chunk pays a fixed cost: its watermark
# statements, opening the read view and planning the SELECT, the reader's state file and the
# chunk's two files (renames, an fsync), the engine's look at them: some 5 ms on this machine's
# disk. While rows cost ~60 us each (PyMySQL, 2025) that was 9 % of a 4096-row chunk, and
# 4096 was where the rate levelled off:
#   256: 23k   1024: 36k   2048: 53k   4096: 60k   8192: 64k   16384: 66k   65536: 68k rows/s
# Read in C straight into Arrow (issue 15) a row costs ~1 us, and the fixed cost was 80 % of a
# 4096-row chunk. Measured again end to end (bench/profile_snapshot-style: 1M rows, reader +
# engine in its own process, 2-core machine shared with other work, rows/s):
#   4096: 373-453k   8192: 337k   16384: 430-748k   32768: 599-984k   65536: 493-656k
# Memory does not grow with it past ``chunk_max_bytes`` (32 MiB of values by default: a chunk
# is cut there), and a wider chunk only widens the window in which touched keys are dropped
# from it (each is then landed by the stream).
DEFAULT_CHUNK_SIZE = 32768


class Action(enum.StrEnum):
    """``request.json``'s ``action``: the state the reader asks for its session."""

    OPEN = "open"
    PAUSE = "pause"
    RESUME = "resume"
    STOP = "stop"


ACTIONS = tuple(a.value for a in Action)


def timestamp_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class SignalRef:
    """The signal behind a request: its id and its place in the signal topic.

    Offsets order signals only within one topic incarnation (``topic_id``): a signal is newer
    than another when both come from the same topic and its offset is higher.
    """

    id: str
    topic_id: str
    offset: int

    def newer_than(self, other: SignalRef | None) -> bool:
        return other is not None and self.topic_id == other.topic_id and \
            self.offset > other.offset

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "topic_id": self.topic_id, "offset": self.offset}

    @staticmethod
    def from_dict(data: dict[str, Any] | None) -> SignalRef | None:
        if not data:
            return None
        return SignalRef(str(data["id"]), str(data["topic_id"]), int(data["offset"]))


# request.json of a table with no session, written by a stop-snapshot signal: runs launched by
# earlier signals that have not opened their session yet must not open one.
NO_SESSION = "none"


@dataclass(frozen=True)
class SnapshotRequest:
    """``request.json``: what the reader asks of the engine for one table (and the signal
    that asked, if one did)."""

    session_id: str
    action: Action  # (a plain string is converted)
    chunk_key: tuple[str, ...]
    condition: str | None
    chunk_size: int
    requested_at: str = field(default_factory=timestamp_now)
    signal: SignalRef | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"snapshot request action {self.action!r}: want one of {ACTIONS}")
        object.__setattr__(self, "action", Action(self.action))

    def to_json(self) -> bytes:
        return json.dumps({
            "session_id": self.session_id, "action": str(self.action),
            "chunk_key": list(self.chunk_key), "condition": self.condition,
            "chunk_size": self.chunk_size, "requested_at": self.requested_at,
            "signal": None if self.signal is None else self.signal.to_dict(),
        }, indent=1).encode()

    @staticmethod
    def from_json(text: bytes | str) -> SnapshotRequest:
        data = json.loads(text)
        return SnapshotRequest(
            session_id=str(data["session_id"]), action=str(data["action"]),
            chunk_key=tuple(data.get("chunk_key") or ()), condition=data.get("condition"),
            chunk_size=int(data.get("chunk_size") or DEFAULT_CHUNK_SIZE),
            requested_at=str(data.get("requested_at") or ""),
            signal=SignalRef.from_dict(data.get("signal")),
        )
