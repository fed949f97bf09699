"""Run the readers of a snapshot run's tables inside one Dagster step, a few at a time.

One snapshot run reads many tables: a run costs seconds to start (a process, the code
location), so one run per table spent most of its time starting. The step's thread hands the
tables to up to ``parallel`` reader threads, smallest first, and stays free for Dagster: it
relays each reader's log lines and progress notifications (the Dagster log manager is not meant
to be called from other threads), logs each running table's progress every few seconds, and
hands back each table's outcome as soon as it ends, so the table's materialisation shows while
the others are still read. One table's failure ends only that table.

Cancelling the run (or SIGTERM) stops every session: the shared stop event makes each reader
write ``stop`` to its request.json and return; tables not started yet are not started. A run
killed outright leaves its sessions open, and the next run of those tables adopts them
(``reader.py``, "One reader per table"). Progress notifications
(``capture.signals.notifications``) go to the run's log, to the table's asset observations
and, when Kafka is configured, to the notification topic.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from cdc_platform.capture.signals.kafka import KafkaChannelError, KafkaTopics, NotificationPublisher
from cdc_platform.capture.signals.notifications import SnapshotNotifier, describe, encode
from cdc_platform.capture.snapshot.errors import EngineStalledError, NoEngineError
from cdc_platform.capture.snapshot.reading.progress import (
    SnapshotProgress,
    SnapshotResult,
    describe_progress,
)
from cdc_platform.capture.snapshot.reading.reader import SnapshotReader
from cdc_platform.config import Settings
from cdc_platform.defs.threaded import QueueLog

STOP_GRACE_SECONDS = 30.0
_POLL_SECONDS = 0.2


def result_metadata(result: SnapshotResult) -> dict[str, Any]:
    return {
        "status": result.status_text,
        "session_id": result.session_id,
        "rows": result.rows,
        "chunks": result.chunks,
        "rejected_chunks": result.rejected,
        "reselected_chunks": result.reselected,
        "restarts": result.restarts,
        "duration_seconds": round(result.duration_seconds, 2),
        "rows_per_second": round(result.rows_per_second, 1),
        "start_gtid": result.start_gtid,
        "end_gtid": result.end_gtid,
    }


@dataclass(frozen=True)
class Retries:
    """What to do when the capture engine acknowledged a table's session and then stopped
    deciding its chunks (``EngineStalledError``): read on after ``seconds``, adopting the
    session, at most ``times`` times per table."""

    times: int
    seconds: float


@dataclass(eq=False)
class TableRun:
    """One table of the run: how to make its reader (each retry makes a new one, which adopts
    the session), and what its reader reported so far."""

    table_id: str
    asset_key: dg.AssetKey
    make_reader: Callable[[], SnapshotReader]
    notification_id: str
    log: QueueLog = field(default_factory=QueueLog)
    notifier: SnapshotNotifier | None = None
    notes: queue.SimpleQueue[dict[str, Any]] = field(default_factory=queue.SimpleQueue)
    latest: list[SnapshotProgress] = field(default_factory=list)
    started: bool = False
    ended: bool = False  # its outcome is known (done, stopped, skipped or failed)


@dataclass(frozen=True)
class TableOutcome:
    """How a table's snapshot ended: its ``result``, or the ``error`` that ended it."""

    table: TableRun
    result: SnapshotResult | None = None
    error: BaseException | None = None


class Notifications:
    """The run's notifications: one Kafka producer for every table (thread-safe; published
    from the reader threads), each table's notes logged and observed from the step's thread."""

    def __init__(self, context: dg.AssetExecutionContext, settings: Settings) -> None:
        self.context = context
        self.server = settings.source.server_name
        self.publisher: NotificationPublisher | None = None
        signals = settings.signals
        if signals.kafka.bootstrap_servers and signals.notification_topic:
            try:
                self.publisher = NotificationPublisher(
                    KafkaTopics(signals.kafka.bootstrap_servers, signals.kafka.config),
                    signals.notification_topic, self.server)
            except KafkaChannelError as error:
                context.log.warning(f"snapshot notifications go to this log only: {error}")

    def attach(self, table: TableRun) -> SnapshotNotifier:
        def publish(note: dict[str, Any]) -> None:
            if self.publisher is not None:
                self.publisher.publish(encode(note))
            table.notes.put(note)

        table.notifier = SnapshotNotifier(self.server, table.table_id, table.notification_id,
                                          publish)
        return table.notifier

    def relay(self, tables: Sequence[TableRun], ending: Sequence[TableRun] = ()) -> None:
        """Log and observe what the readers of ``tables`` and ``ending`` (tables whose outcome
        is recorded next) said and published since the last call (step's thread).

        Each Dagster event is a write to the event log: a line or a note each, and an
        observation per note, made 14 events a table, and a run of 100 small tables spent
        most of its time writing them. So the lines of all tables (each names its table) are
        one log event per level, and a table still being read has its notes in one
        observation (the newest note's data, and the types of all); an ending table's
        materialisation or observation, with its result, follows at once instead."""
        lines: list[tuple[str, str]] = []
        for table in [*tables, *ending]:
            while True:
                try:
                    level, message = table.log.lines.get_nowait()
                except queue.Empty:
                    break
                lines.append((level if level in ("warning", "error") else "info", message))
            notes: list[dict[str, Any]] = []
            while True:
                try:
                    notes.append(table.notes.get_nowait())
                except queue.Empty:
                    break
            lines += [("info", describe(note)) for note in notes]
            if notes and table not in ending:
                newest = notes[-1]
                self.context.log_event(dg.AssetObservation(
                    asset_key=table.asset_key,
                    metadata={"notification": newest["type"],
                              "notifications": ", ".join(note["type"] for note in notes),
                              "notification_id": newest["id"],
                              **{k: v for k, v in newest["additional_data"].items() if v != ""}}))
        for level, group in itertools.groupby(lines, key=lambda line: line[0]):
            getattr(self.context.log, level)("\n".join(message for _, message in group))

    def close(self) -> None:
        if self.publisher is not None:
            undelivered = self.publisher.close()
            if undelivered:
                self.context.log.warning(f"{undelivered} notifications were not delivered to "
                                         "the notification topic (see the lines above)")


def notify_skipped(notifications: Notifications, table: TableRun, status: str) -> None:
    """The notifications of a table the run skips before reading it."""
    notifications.attach(table).finished(status, 0)
    notifications.relay((), ending=[table])


def run_tables(
    context: dg.AssetExecutionContext,
    notifications: Notifications,
    tables: Sequence[TableRun],
    *,
    parallel: int,
    retries: Retries,
    progress_seconds: float = 5.0,
) -> Iterator[TableOutcome]:
    """Read ``tables`` (in this order) with up to ``parallel`` readers at a time; yield each
    table's outcome as it ends. Every error of a table is its outcome, not raised, except an
    interrupt of the step: then every session is stopped, and the interrupt re-raised."""
    stop = threading.Event()
    no_engine: list[NoEngineError] = []

    def read(table: TableRun) -> SnapshotResult:
        if stop.is_set():
            raise _NotStarted("the run was stopped before this table's turn")
        if no_engine:  # (every table would wait ack_timeout_seconds for it, one after another)
            raise _NotStarted(f"not read: {no_engine[0]}")
        table.started = True
        notifier = notifications.attach(table)

        def on_progress(progress: SnapshotProgress) -> None:
            table.latest[:] = [progress]  # one reference swap: safe to read from the step
            notifier.on_progress(progress.state, progress.chunks, progress.rows,
                                 progress.last_key, progress.maximum_key)

        attempt = 0
        while True:
            reader = table.make_reader()
            reader.log = table.log
            try:
                result = reader.run(stop, on_progress)
            except EngineStalledError as error:  # (before its base class, NoEngineError)
                if attempt < retries.times and not stop.is_set():
                    attempt += 1
                    table.log.warning(f"{error}; retrying in {retries.seconds:.0f}s (retry "
                                      f"{attempt} of {retries.times})")
                    if not stop.wait(retries.seconds):
                        continue
                no_engine.append(error)
                notifier.aborted(str(error))
                raise
            except NoEngineError as error:
                no_engine.append(error)
                notifier.aborted(str(error))
                raise
            except BaseException as error:
                notifier.aborted(str(error) or type(error).__name__)
                raise
            notifier.finished(result.status_text, result.rows)
            return result

    pool = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="snapshot")
    futures: dict[Future[SnapshotResult], TableRun] = {pool.submit(read, t): t for t in tables}
    order = {future: i for i, future in enumerate(futures)}
    pending = set(futures)
    next_tick = time.monotonic() + progress_seconds
    try:
        while pending:
            done, pending = wait(pending, timeout=_POLL_SECONDS, return_when=FIRST_COMPLETED)
            running = [futures[f] for f in sorted(pending, key=order.__getitem__)
                       if futures[f].started]
            ended = [futures[f] for f in sorted(done, key=order.__getitem__)]
            notifications.relay(running, ending=ended)
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + progress_seconds
                for table in running:
                    if table.latest:
                        context.log.info(describe_progress(table.latest[0]))
            for future in sorted(done, key=order.__getitem__):
                futures[future].ended = True
                error = future.exception()
                yield TableOutcome(futures[future], None if error else future.result(), error)
    except BaseException:  # an interrupt, or the step closing this generator
        if pending:
            running = [futures[f].table_id for f in pending if futures[f].started]
            context.log.info(f"snapshot run cancelled or interrupted: stopping the sessions of "
                             f"{', '.join(running) or 'no table'}; "
                             f"{sum(not futures[f].started for f in pending)} table(s) not "
                             "started")
        stop.set()
        for future in pending:
            future.cancel()
        _, not_stopped = wait(pending, timeout=STOP_GRACE_SECONDS)
        notifications.relay(list(futures.values()))
        if not_stopped:
            late = ", ".join(futures[f].table_id for f in not_stopped)
            context.log.error(f"the readers of {late} did not stop within "
                              f"{STOP_GRACE_SECONDS:.0f}s")
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


class _NotStarted(Exception):
    """A table the run did not begin to read."""
