"""The capture engine: binlog -> committed transactions -> changelog segments + checkpoint.

The binlog adapter (``capture/binlog/stream.py``) yields the project's events; the transaction buffer
(``capture/changes/transactions.py``) says which transactions committed (and XA, savepoints, spilling);
this module gives their records positions, lands them and moves the checkpoint.

Lifecycle (after the async embedded-engine design): CREATED -> STARTING -> STREAMING, with
RECONNECTING between streams when the source connection drops, then STOPPING -> STOPPED, or
FAILED. Every transition is logged. A stop request (Dagster cancel, SIGTERM) is honoured between
events: committed transactions are flushed, the checkpoint written, and ``run`` returns.

Guarantees (ARCHITECTURE section 5): only committed transactions are emitted, in binlog order;
the checkpoint is written after every segment it covers is durable; on restart the engine
deletes segments past the checkpoint and replays from the checkpoint's GTID position, giving
the replayed records the same positions.

Flushes are written by the landing writer (``capture/landing/writer.py``), a thread of its own,
while the stream thread decodes on: one flush in flight at a time, in order, segments before
their checkpoint, a failure raised on the stream thread at the next flush or at the stop.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from cdc_platform.capture import names
from cdc_platform.capture.binlog.columns import learn_server_collations
from cdc_platform.capture.binlog.stream import BinlogStream
from cdc_platform.capture.changes.row_images import (
    Record,
    block_memory,
    column_block,
    records_memory,
    row_records,
)
from cdc_platform.capture.changes.schemas import SchemaTracker
from cdc_platform.capture.changes.spill import (
    HeldRecords,
    SpilledRecords,
    SpillStore,
)
from cdc_platform.capture.changes.transactions import (
    Committed,
    Outcome,
    Prepared,
    RecordLog,
    RolledBack,
    Statement,
    TransactionBuffer,
)
from cdc_platform.capture.changes.xa_state import (
    XA_CHECKPOINT_KEY,
    persist_prepared,
    restore_prepared,
)
from cdc_platform.capture.ddl.history import HistoryMarkers
from cdc_platform.capture.ddl.tracking import DdlTracking
from cdc_platform.capture.engine_options import EngineOptions, EngineState, EngineStats
from cdc_platform.capture.events import (
    EngineError,
    Event,
    Heartbeat,
    Rotate,
    Rows,
    TableMap,
)
from cdc_platform.capture.flavours import flavour_of
from cdc_platform.capture.gtid import GtidSet, any_gtid
from cdc_platform.capture.landing.lander import Lander
from cdc_platform.capture.landing.session_records import SnapshotSession
from cdc_platform.capture.landing.zone import SNAPSHOTS_CHECKPOINT_KEY, Checkpoint, LandingZone
from cdc_platform.capture.snapshot.sessions import SnapshotCoordinator
from cdc_platform.capture.source import (
    SourceSession,
    initial_position,
    is_purged_position,
    is_retriable,
    purged_binlog_recovery,
    purged_binlog_stop,
    require_prerequisites,
)

# An unchanged checkpoint is rewritten after this long (see ``flush``).
CHECKPOINT_REFRESH_SECONDS = 10.0


class CaptureEngine:
    """Streams one source server into its landing-zone folder. One engine per server name."""

    def __init__(self, options: EngineOptions, landing: LandingZone,
                 log: Any | None = None) -> None:
        self.options = options
        self.landing = landing
        self.log = log or logging.getLogger(__name__)
        self.state = EngineState.CREATED
        self.stats = EngineStats()
        self._flavour = flavour_of(options.flavour)
        self._processed: GtidSet = self._flavour.parse_position("")
        self._source = SourceSession(options.connection_settings, options.selector)
        self._tracker = SchemaTracker(self._source, {}, self.log)
        self._lander = Lander(landing, options.flush_max_rows, options.transaction_memory_bytes,
                              self.stats.segments_landed, self.stats.checkpoint_landed, self.log)
        self._spill = SpillStore(landing.root / "spill")
        self._buffer = TransactionBuffer(self._new_record_log)
        self._xa_dirty = False
        self._last_flush = time.monotonic()
        self._checkpointed_position = ""
        self._checkpointed_at = time.monotonic()
        self._last_activity = time.monotonic()
        self._started = False
        self._applying = False
        self._snapshots = SnapshotCoordinator(landing, options.flavour, self.log, self._lander,
                                              self._tracker)
        self._history = HistoryMarkers(landing, self._flavour, options.snapshot_mode,
                                       options.server_name, self.log)
        self._ddl = DdlTracking(landing, self._tracker, self._history, self.log)
        # The position a purged binlog made the engine go on from (capture.snapshot_mode:
        # when_needed): purged again before any transaction from there means stop.
        self._recovered_at: str | None = None

    # -- what monitoring reads (capture/metrics.py), from any thread -----------------------

    def snapshot_sessions(self) -> list[SnapshotSession]:
        """The snapshot sessions the engine's checkpoint holds now."""
        return list(self._snapshots.sessions.values())

    def spill_bytes(self) -> int:
        """Bytes of open transactions spilled to disk now."""
        return self._spill.bytes_on_disk()

    # -- lifecycle -------------------------------------------------------------------------

    def _transition(self, state: EngineState, reason: str = "") -> None:
        previous = self.state
        self.state = state
        self.stats.state = state.value
        self.log.info(
            f"capture engine {self.options.server_name}: {previous.value} -> {state.value}"
            + (f" ({reason})" if reason else "")
        )

    def run(
        self,
        stop: threading.Event | None = None,
        stop_when_caught_up: bool = False,
        caught_up_idle_seconds: float = 0.0,
        on_progress: Callable[[EngineStats], None] | None = None,
    ) -> EngineStats:
        """Stream until ``stop`` is set (or, optionally, until caught up with the source)."""
        stop = stop or threading.Event()
        with self.landing.engine_lock():
            self._transition(EngineState.STARTING)
            try:
                self._start()
                self._stream(stop, stop_when_caught_up, caught_up_idle_seconds, on_progress)
                self._transition(EngineState.STOPPING, "stop requested" if stop.is_set()
                                 else "caught up with the source")
                self._discard_open_transaction("engine stopping")
                self.flush(force=True)
                self._lander.wait()  # stopped means landed: the last flush is durable
                self._transition(EngineState.STOPPED)
            except BaseException as error:
                self._fail(error)
                raise
            finally:
                # (no write may go on once the engine lock is released)
                self._lander.close()
                self._source.close()
        return self.stats

    def _fail(self, error: BaseException) -> None:
        """Keep what was committed: flushing whole transactions is always safe.

        Not before the checkpoint was read, though: flushing then would overwrite it.
        """
        self._discard_open_transaction("engine failing")
        if self._applying:
            # Half a commit is applied: a checkpoint now could drop a prepared XA transaction
            # or give positions twice. The last checkpoint is safe to replay from.
            self.log.warning("capture engine: failed while applying a commit; no final flush "
                             "(the next start replays from the last checkpoint)")
        if self._lander.failed:
            self.log.warning("capture engine: landing a flush failed; no final flush (the next "
                             "start replays from the last checkpoint)")
        try:
            if self._started and not self._applying and not self._lander.failed:
                self.flush(force=True)
                self._lander.wait()
        except Exception:  # noqa: BLE001 - the original error matters more
            self.log.error("capture engine: final flush failed", exc_info=True)
        reason = f"{type(error).__name__}: {error}"
        self._transition(EngineState.FAILED, reason)

    def _start(self) -> None:
        opts = self.options
        checkpoint = self.landing.read_checkpoint()
        if checkpoint is not None:
            checkpoint.check_flavour(opts.flavour)
            self._processed = self._flavour.parse_position(checkpoint.gtid)
            self._lander.next_pos = checkpoint.next_pos
            removed = self.landing.remove_uncommitted(checkpoint.next_pos)
            self.stats.orphans_removed = len(removed)
            if removed:
                self.log.info(f"capture engine {opts.server_name}: removed {len(removed)} "
                              "segment(s) written after the last checkpoint; replaying them")
            self._checkpointed_position = checkpoint.gtid
            self._snapshots.on_start(checkpoint.extra.get(SNAPSHOTS_CHECKPOINT_KEY, {}), self._processed)
        restored, said = restore_prepared(checkpoint.extra.get(XA_CHECKPOINT_KEY, {})
                                          if checkpoint is not None else {},
                                          self._spill, self._new_record_log)
        self._buffer.prepared.update(restored)
        if said:
            self.log.info(f"capture engine {opts.server_name}: {said}")
        self._started = True
        schemas = self._tracker.schemas = self.landing.read_tables()
        self._tracker.forget_uncaptured()
        recorded = set(schemas)
        control = self._source.connection()
        require_prerequisites(control, opts.flavour, opts.server_name)
        learnt = learn_server_collations(control, opts.flavour)
        if learnt:
            self.log.info(f"capture engine {opts.server_name}: collations of the source that "
                          f"mysql-replication does not list, read from the server: {learnt}")
        if checkpoint is None:
            self._processed = initial_position(self._source, opts.flavour,
                                               opts.initial_position)
        listed = self._tracker.learn_captured()
        self._history.at_start(control, checkpoint is None, self._processed,
                               self._lander.next_pos, schemas, recorded, listed)
        self.stats.position = str(self._processed)
        self.stats.next_pos = self._lander.next_pos
        self.log.info(
            f"capture engine {opts.server_name}: resuming after GTID position "
            f"{str(self._processed) or '(start of the binlog)'} at changelog position "
            f"{self._lander.next_pos}"
        )

    def _new_record_log(self) -> RecordLog:
        return RecordLog(self.options.transaction_memory_bytes, self._spill_records)

    def _spill_records(self, held: list[list[Record] | HeldRecords]) -> list[SpilledRecords]:
        """The record log's way out of memory (``SpillStore.spill``)."""
        return self._spill.spill(held, self.options.flush_max_rows, self._buffer.open_gtid)

    def _recover_purged(self, error: BaseException) -> None:
        """``capture.snapshot_mode: when_needed`` and the binlog the checkpoint needs is gone:
        go on from the source's current GTID set, with a PURGED marker for every captured table
        (and a gone one for each recorded table the source no longer has), written before the
        checkpoint passes the new position; open snapshot sessions restart (their touched-key
        logs miss the gap). The snapshots bring every change of the gap, deletes included
        (range assertions and the end-of-snapshot sweep)."""
        opts = self.options
        old = str(self._processed) or "(start)"
        current_text = self._source.run(self._flavour.executed_gtid_text)
        current = self._flavour.parse_position(current_text)
        self.log.warning(purged_binlog_recovery(opts.server_name, old, current_text, error))
        self._discard_open_transaction("binlog purged")
        listed = self._tracker.learn_all()
        self._history.purged(listed, self._tracker.schemas, opts.selector, old, current_text,
                             self._lander.next_pos)
        named = any_gtid(current)
        if named is not None:
            self._snapshots.on_gap(named, f"binlog purged: capture went on from {current_text}")
        self._tracker.forget_ids()
        self._processed = current
        self._recovered_at = str(current)
        self.flush(force=True)

    # -- streaming -------------------------------------------------------------------------

    def _stream(self, stop: threading.Event, stop_when_caught_up: bool,
                caught_up_idle_seconds: float,
                on_progress: Callable[[EngineStats], None] | None) -> None:
        opts = self.options
        failures = 0
        next_caught_up_check = 0.0
        while not stop.is_set():
            stream: BinlogStream | None = None
            try:
                stream = BinlogStream(opts.connection_settings, opts.server_id, self._flavour,
                                      str(self._processed), opts.stream_heartbeat_seconds,
                                      wanted=opts.selector.captures)
                self._transition(EngineState.STREAMING,
                                 f"from {str(self._processed) or 'the start of the binlog'}")
                for event in stream:
                    failures = 0
                    idle = self._handle(event)
                    now = time.monotonic()
                    if now - self._last_flush >= opts.flush_wait(self._lander.tables_queued):
                        self.flush()
                        if on_progress:
                            on_progress(self.stats)
                    elif self._tick_snapshots(now):
                        # Between flushes, a tick that changed something (a chunk decided) is
                        # flushed at once: chunk throughput is then bound by the reader, not by
                        # the flush interval (each commit still lands atomically with its
                        # checkpoint).
                        self.flush(ticked=True)
                    if stop.is_set():
                        return
                    if stop_when_caught_up and not self._buffer.in_group and (
                        idle or now >= next_caught_up_check
                    ):
                        next_caught_up_check = now + 0.5
                        if self._caught_up() and (
                            now - self._last_activity >= caught_up_idle_seconds
                        ) and not self._snapshots.readers_alive():
                            # (a running snapshot reader still needs this engine's commits)
                            return
            except BaseException as error:
                if is_purged_position(error):
                    if opts.snapshot_mode == "when_needed" and (
                            self._recovered_at != str(self._processed)) and not self._applying:
                        self._recover_purged(error)
                        continue
                    raise EngineError(purged_binlog_stop(
                        opts.server_name, str(self._processed), error)) from error
                if not is_retriable(error) or self._applying:
                    # (mid-commit, the engine's state holds half of it: only a new run, from
                    # the last checkpoint, may go on)
                    raise
                failures += 1
                self.stats.reconnects += 1
                self._discard_open_transaction("connection lost")
                limit = opts.max_reconnect_attempts
                if limit and failures > limit:
                    raise EngineError(
                        f"source {opts.server_name} unreachable after {failures - 1} "
                        f"reconnect attempts ({error}); check the replica and restart the run"
                    ) from error
                backoff = opts.reconnect_backoff(failures)
                self._transition(EngineState.RECONNECTING,
                                 f"{error}; retry {failures} in {backoff:.1f}s from "
                                 f"{str(self._processed) or 'the start'}")
                self.flush()
                if failures > 1:
                    self._source.close()
                stop.wait(backoff)
            finally:
                if stream is not None:
                    stream.close()

    def _caught_up(self) -> bool:
        """True when everything the source has executed is processed (not a watermark)."""
        executed = self._flavour.parse_position(
            self._source.run(self._flavour.executed_gtid_text))
        caught_up = self._processed.issuperset(executed)
        self.stats.caught_up = caught_up
        if caught_up:
            self.stats.lag_seconds = 0.0
        return caught_up

    def _handle(self, event: Event) -> bool:
        """Apply one binlog event; returns True when the event says the stream is idle."""
        self.stats.events += 1
        if isinstance(event, Rows):
            self._on_rows(event)
        elif isinstance(event, TableMap):
            self._on_table_map(event)
        elif isinstance(event, Heartbeat):
            # The server had nothing more to send: we are at the end of its binlog.
            if not self._buffer.in_group:
                self.stats.lag_seconds = 0.0
            return True
        elif isinstance(event, Rotate):
            self._tracker.forget_ids()
        else:
            # Until every outcome is applied, the engine's state may hold half a commit (some
            # records queued or landed, its GTID not processed): ``_fail`` must not write it.
            self._applying = True
            for outcome in self._buffer.feed(event):
                self._apply(outcome)
            self._applying = False
        return False

    def _apply(self, outcome: Outcome) -> None:
        if isinstance(outcome, Committed):
            self._commit(outcome)
        elif isinstance(outcome, Statement):
            self._on_statement(outcome)
        elif isinstance(outcome, Prepared):
            # The prepare's GTID is complete; its rows wait (persisted at the next flush) for
            # the XA COMMIT, whose GTID they land under.
            if outcome.gtid:
                self._processed = self._processed.add(self._flavour.parse_gtid(outcome.gtid))
            self._xa_dirty = True
            self.log.info(outcome.describe())
        elif isinstance(outcome, RolledBack):
            self.stats.rolled_back += 1
            self._xa_dirty |= outcome.xid is not None
            (self.log.warning if outcome.unusual else self.log.info)(outcome.describe())

    def _on_table_map(self, event: TableMap) -> None:
        gtid = self._buffer.open_gtid or ""
        first_seen = self._tracker.on_table_map(event, gtid)
        if first_seen is not None:
            self._history.first_seen(first_seen, gtid, self._processed, self._lander.next_pos)

    def _on_rows(self, event: Rows) -> None:
        gtid = self._buffer.open_gtid or "?"
        state = self._tracker.state_of(event, gtid)
        changes = self.stats.row_changes
        changes[event.op] = changes.get(event.op, 0) + (
            event.rows.count if event.columnar else len(event.rows))
        if event.columnar:
            block = column_block(state, event, gtid)
            if block is not None:
                self._buffer.add_block(HeldRecords(state.schema, block), block_memory(block))
            return
        records = row_records(state, event, gtid)
        self._buffer.add(records, records_memory(state, event, len(records)))

    def _on_statement(self, statement: Statement) -> None:
        """A statement outside row events (``DdlTracking``): the tables it changed without
        row events restart their snapshot sessions."""
        effects = self._ddl.on_statement(statement, self._lander.next_pos,
                                         self._buffer.open_gtid or "")
        if effects is None:
            return
        self.stats.ddl_statements += 1
        if effects.renames is not None:
            # The record took a position of its own, so the lake tells the segments before
            # it from those after it (capture/ddl/column_renames.py).
            self._lander.take_position()
        if statement.gtid:
            gtid = self._flavour.parse_gtid(statement.gtid)
            for database, table in effects.tables:
                self._snapshots.on_ddl(names.table_id(database, table), gtid)

    def _commit(self, txn: Committed) -> None:
        """Give the committed records their positions and queue them for the next flush."""
        gtid_value = self._flavour.parse_gtid(txn.gtid) if txn.gtid else None
        count = self._lander.commit(txn.records, txn.gtid, gtid_value,
                                    int(txn.timestamp) * 1000, self._snapshots)
        if gtid_value is not None:
            self._processed = self._processed.add(gtid_value)
        if txn.xid is not None:
            self._buffer.forget_prepared(txn)
            self._xa_dirty = True
        self.stats.transactions += 1
        self.stats.records += count
        self._last_activity = time.monotonic()
        self.stats.lag_seconds = max(0.0, time.time() - float(txn.timestamp))
        self.stats.caught_up = False
        if self._lander.due:
            self.flush()

    def _discard_open_transaction(self, reason: str) -> None:
        gtid = self._buffer.discard_open()
        if gtid is not None:
            self.log.info(f"transaction {gtid or '?'}: discarded ({reason}); it will be read "
                          "again from the binlog")

    # -- landing ---------------------------------------------------------------------------

    def _tick_snapshots(self, now: float | None = None) -> bool:
        """The coordinator's tick at the engine's point (with ``now``: only if one is due);
        its records count in the stats."""
        first = self._lander.next_pos
        changed = self._snapshots.on_tick(self._processed, now)
        self.stats.records += self._lander.next_pos - first
        return changed

    def flush(self, force: bool = False, ticked: bool = False) -> None:
        """Land buffered transactions, then move the checkpoint past them.

        The flush is handed to the landing writer, which writes its segments, then its
        checkpoint, while the stream goes on; this waits for the previous flush to be durable
        first (and raises its failure). Everything the checkpoint says is taken here, on the
        stream thread: the writer reads no engine state."""
        self._last_flush = time.monotonic()
        if not ticked and self._started:
            self._tick_snapshots()
        position_text = str(self._processed)
        # An idle engine still rewrites its checkpoint now and then: its ``written_at`` (and a
        # lag of 0) is how the lake's freshness checks tell an idle source from a dead engine.
        refresh = time.monotonic() - self._checkpointed_at >= CHECKPOINT_REFRESH_SECONDS
        tables = self._tracker.take_changed()
        due = not self._lander.empty or position_text != self._checkpointed_position or (
            tables is not None or self._xa_dirty or force or refresh
            or self._spill.removal_pending)
        snapshots = self._snapshots.checkpoint_state(due)
        if snapshots is None:
            return
        extra: dict[str, Any] = {}
        if snapshots:
            extra[SNAPSHOTS_CHECKPOINT_KEY] = snapshots
        xa_files = bool(self._buffer.prepared)
        if xa_files:
            extra[XA_CHECKPOINT_KEY] = persist_prepared(self._buffer.prepared)
        checkpoint = Checkpoint(
            server_name=self.options.server_name,
            flavour=self.options.flavour,
            gtid=position_text,
            next_pos=self._lander.next_pos,
            written_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            lag_seconds=self.stats.lag_seconds,
            extra=extra,
        )
        self._lander.checkpoint(checkpoint, tables, self._spill, spill_named=xa_files)
        self._xa_dirty = False
        self._checkpointed_position = position_text
        self._checkpointed_at = time.monotonic()
