"""Run one table's snapshot reader inside a Dagster step (in a thread: see
``defs/threaded.py``). Cancelling the run stops the session: the reader writes ``stop`` to
request.json and returns. Progress is logged every few seconds; progress notifications
(``capture.signals.notifications``) go to the run's log, to the asset's observations and, when
Kafka is configured, to the notification topic."""

from __future__ import annotations

import queue
from typing import Any

import dagster as dg

from cdc_platform.capture.signals.kafka import KafkaChannelError, KafkaTopics, NotificationPublisher
from cdc_platform.capture.signals.notifications import SnapshotNotifier, describe, encode
from cdc_platform.capture.snapshot.reading.progress import (
    SnapshotProgress,
    SnapshotResult,
    describe_progress,
)
from cdc_platform.capture.snapshot.reading.reader import SnapshotReader
from cdc_platform.config import Settings
from cdc_platform.defs.threaded import QueueLog, run_in_thread

STOP_GRACE_SECONDS = 30.0


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


class _Notifications:
    """Notifications of one run: made in the reader's thread, published to Kafka from there
    (the producer is thread-safe), logged and observed from the step's thread."""

    def __init__(self, context: dg.AssetExecutionContext, settings: Settings, table_id: str,
                 notification_id: str) -> None:
        self.context = context
        self.asset_key = context.asset_key
        self.pending: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.publisher: NotificationPublisher | None = None
        signals = settings.signals
        if signals.kafka.bootstrap_servers and signals.notification_topic:
            try:
                self.publisher = NotificationPublisher(
                    KafkaTopics(signals.kafka.bootstrap_servers, signals.kafka.config),
                    signals.notification_topic, settings.source.server_name)
            except KafkaChannelError as error:
                context.log.warning(f"notifications for {table_id} go to this log only: {error}")
        self.notifier = SnapshotNotifier(settings.source.server_name, table_id,
                                         notification_id, self._publish)

    def _publish(self, note: dict[str, Any]) -> None:
        if self.publisher is not None:
            self.publisher.publish(encode(note))
        self.pending.put(note)

    def on_progress(self, progress: SnapshotProgress) -> None:
        self.notifier.on_progress(progress.state, progress.chunks, progress.rows,
                                  progress.last_key, progress.maximum_key)

    def relay(self) -> None:
        """Log and observe what was published since the last call (step's thread only)."""
        while True:
            try:
                note = self.pending.get_nowait()
            except queue.Empty:
                return
            self.context.log.info(describe(note))
            self.context.log_event(dg.AssetObservation(
                asset_key=self.asset_key,
                metadata={"notification": note["type"], "notification_id": note["id"],
                          **{k: v for k, v in note["additional_data"].items() if v != ""}}))

    def close(self) -> None:
        self.relay()
        if self.publisher is not None:
            undelivered = self.publisher.close()
            if undelivered:
                self.context.log.warning(f"{undelivered} notifications were not delivered to "
                                         "the notification topic (see the lines above)")


def run_reader(
    context: dg.AssetExecutionContext,
    settings: Settings,
    reader: SnapshotReader,
    notification_id: str,
    progress_seconds: float = 5.0,
) -> SnapshotResult:
    """Run the reader until it finishes; relay its log and notifications; stop the session on
    interrupt."""
    log = QueueLog()
    reader.log = log
    latest: list[SnapshotProgress] = []
    notifications = _Notifications(context, settings, reader.table_id, notification_id)

    def on_progress(progress: SnapshotProgress) -> None:
        latest[:] = [progress]  # one reference swap: safe to read from the other thread
        notifications.on_progress(progress)

    def report() -> None:
        if latest:
            context.log.info(describe_progress(latest[0]))

    try:
        result = run_in_thread(
            context, f"snapshot-{reader.table_id}",
            lambda stop: reader.run(stop, on_progress), log,
            every=progress_seconds, on_tick=report, on_poll=notifications.relay,
            stopping=f"snapshot of {reader.table_id}: run cancelled or interrupted; stopping "
            f"session {reader.session_id}",
            grace_seconds=STOP_GRACE_SECONDS,
            not_stopped=f"snapshot of {reader.table_id}: the reader did not stop within "
            f"{STOP_GRACE_SECONDS:.0f}s")
    except BaseException as error:
        notifications.notifier.aborted(str(error) or type(error).__name__)
        notifications.close()
        raise
    notifications.notifier.finished(result.status_text, result.rows)
    notifications.close()
    return result


def notify_skipped(context: dg.AssetExecutionContext, settings: Settings, table_id: str,
                   notification_id: str, status: str) -> None:
    """The notifications of a run that skips its table before reading."""
    notifications = _Notifications(context, settings, table_id, notification_id)
    notifications.notifier.finished(status, 0)
    notifications.close()
