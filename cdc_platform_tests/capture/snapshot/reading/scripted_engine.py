"""Helpers of the snapshot reader's tests against a scripted engine: a landing zone and a sample
schema for tests without a database, a reader of a test database's table, and
``ScriptedEngine``, which plays the engine's side of docs/snapshots.md by the letter with
decisions chosen by the test, so the reader's protocol (acknowledgement, pipelining, re-reading
rejected chunks, holding back the complete chunk, pause/stop) is checked without the real
engine's timing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdc_platform.capture import source as source_sql
from cdc_platform.capture.landing.session_records import EndedSessions, SnapshotSession
from cdc_platform.capture.landing.zone import SNAPSHOTS_CHECKPOINT_KEY, Checkpoint, LandingZone
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.snapshot.protocol import (
    chunk_parts,
    read_chunk_rows,
    read_request,
)
from cdc_platform.capture.snapshot.reading.reader import SnapshotReader

SCHEMA = TableSchema("shop", "orders", (ColumnSpec("id", "int"), ColumnSpec("total",
                     "decimal", 10, 2), ColumnSpec("at", "timestamp", scale=6),
                     ColumnSpec("note", "string")), ("id",))


def _landing(tmp_path: Path) -> LandingZone:
    return LandingZone(str(tmp_path / "landing"), "demo")


# (seq, manifest) -> commit | reject | wait | give-up (the engine stops the session)
Decide = Callable[[int, dict[str, Any]], str]


class ScriptedEngine:
    """The engine's side of docs/snapshots.md for one table, deciding chunks by ``decide``.

    Like the real engine, it decides pending manifests in seq order and stops at the first
    wait; a committed complete chunk ends the session (``done``).
    """

    def __init__(self, landing: LandingZone, table_id: str, decide: Decide | None = None,
                 interval: float = 0.02, leave_at_once: bool = False) -> None:
        self.landing, self.table_id = landing, table_id
        # An ended session leaves the checkpoint for ended_sessions.json in the same tick (the
        # real engine waits a while: a reader that did not look meanwhile sees the same).
        self.leave_at_once = leave_at_once
        self.decide = decide or (lambda seq, manifest: "commit")
        self.interval = interval
        self.session: dict[str, Any] | None = None
        self.manifests: dict[int, dict[str, Any]] = {}
        self.max_undecided = 0
        self.undecided_at_complete: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.errors: list[BaseException] = []

    def __enter__(self) -> ScriptedEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        if self.errors:
            raise self.errors[0]

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self.tick()
        except BaseException as error:  # noqa: BLE001 - reported by __exit__
            self.errors.append(error)

    def tick(self) -> None:
        database, table = self.table_id.split(".")
        request = read_request(self.landing, database, table)
        if request is None:
            return
        session = self.session
        if request.action in ("open", "pause", "resume") and request.chunk_key and (
                session is None or session["session_id"] != request.session_id):
            session = self.session = {
                "session_id": request.session_id,
                "state": "paused" if request.action == "pause" else "open", "opening": "0-1-1",
                "opening_pos": 1, "horizon": "0-1-1", "committed": [], "rejected": {},
                "rows": 0, "started_at": "now", "ended_at": None}
        elif session is not None and session["session_id"] == request.session_id and \
                session["state"] not in ("done", "stopped"):
            session["state"] = {"pause": "paused", "resume": "open", "stop": "stopped",
                                "open": "open"}[request.action]
        if session is None:
            return
        if session["state"] == "open":
            directory = chunk_dir(self.landing, database, table, session["session_id"])
            decided = set(session["committed"]) | {int(s) for s in session["rejected"]}
            pending = sorted(int(p.stem) for p in directory.glob("*.json")
                             if p.stem.isdigit() and int(p.stem) not in decided
                             ) if directory.is_dir() else []
            self.max_undecided = max(self.max_undecided, len(pending))
            for seq in pending:
                manifest = json.loads((directory / f"{seq:08d}.json").read_bytes())
                assert (directory / f"{seq:08d}.arrow").exists()
                self.manifests[seq] = manifest
                decision = self.decide(seq, manifest)
                if decision == "wait":
                    break
                if decision == "give-up":
                    session.update(state="stopped", reason=f"scripted: chunk {seq} unusable")
                    break
                if decision == "reject":
                    session["rejected"][str(seq)] = f"scripted rejection of chunk {seq}"
                    continue
                session["committed"].append(seq)
                session["rows"] += manifest["rows"]
                if manifest["complete"]:
                    self.undecided_at_complete.append(len(pending) - 1)
                    session["state"] = "done"
                    break
        if self.leave_at_once and session["state"] in ("done", "stopped"):
            self.landing.write_ended_sessions(EndedSessions({self.table_id: (
                SnapshotSession.from_dict(session, self.table_id))}))
            self.landing.write_checkpoint(Checkpoint(
                self.landing.server_name, "mariadb", "0-1-1", 1))
            return
        self.landing.write_checkpoint(Checkpoint(
            self.landing.server_name, "mariadb", "0-1-1", 1,
            extra={SNAPSHOTS_CHECKPOINT_KEY: {self.table_id: dict(session)}}))


def _schema(mariadb: Any, db: str, table: str) -> TableSchema:
    with source_sql.source_connection(mariadb.connection_settings()) as conn:
        return source_sql.read_table_schema(conn, db, table)


def _reader(mariadb: Any, db: str, landing: LandingZone, table: str = "items",
            **options: Any) -> SnapshotReader:
    options.setdefault("poll_seconds", 0.01)
    options.setdefault("ack_timeout_seconds", 10)
    options.setdefault("keep_chunks", True)
    return SnapshotReader(landing, mariadb.connection_settings(), "mariadb",
                          _schema(mariadb, db, table), **options)


def chunk_dir(landing: LandingZone, database: str, table: str, session_id: str) -> Path:
    """A session's chunk directory in a local zone (the tests look at its files)."""
    return landing.root.joinpath(*chunk_parts(database, table, session_id))


def _committed_chunks(engine: ScriptedEngine) -> list[dict[str, Any]]:
    assert engine.session is not None
    return [engine.manifests[s] for s in engine.session["committed"]]


def _ids(landing: LandingZone, db: str, manifests: list[dict[str, Any]]) -> list[int]:
    ids = []
    for manifest in manifests:
        ids += [row["id"] for row in read_chunk_rows(
            landing, db, "items", manifest["session_id"], manifest["seq"]).to_pylist()]
    return ids


def _tick_until_open(engine: ScriptedEngine) -> None:
    """Acknowledge the session once, then play dead."""
    for _ in range(500):
        engine.tick()
        if engine.session is not None:
            return
        time.sleep(0.01)
