"""The signal sensor: Kafka signal topic -> per-table snapshot runs (ARCHITECTURE section 2).

Each tick reads the signal topic from the offset in the sensor's cursor (``assign()``, no
consumer group), asks ``capture.signals.plan`` what the messages do, and returns one run request
per table to snapshot with the cursor just after the messages read. Dagster stores the run
requests and the new cursor together: a tick that dies before that is run again from the old
cursor, and the run keys (signal topic id + offset + table) stop a replayed signal from
launching a second run. Stop, pause and resume act on the tables' snapshot sessions through
request.json, recording the signal so a replay does nothing (``reader.signal_action``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from cdc_platform.capture.landing.session_records import Action, SignalRef, SnapshotRequest
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.names import split_table_id
from cdc_platform.capture.signals.checks import SourceChecks
from cdc_platform.capture.signals.kafka import KafkaChannelError, KafkaTopics, SignalCursor
from cdc_platform.capture.signals.messages import Skipped
from cdc_platform.capture.signals.plan import (
    ControlSnapshots,
    LogMessage,
    StartSnapshot,
    plan_signals,
)
from cdc_platform.capture.snapshot.protocol import read_request, read_session_state, reader_alive
from cdc_platform.capture.snapshot.reading.actions import (
    session_live,
    signal_action,
)
from cdc_platform.capture.source import selector_from_settings
from cdc_platform.config import Settings
from cdc_platform.defs.monitoring import run_request_tags
from cdc_platform.defs.snapshots.definitions import (
    SnapshotAssets,
    SnapshotConfig,
    run_session_prefix,
)
from cdc_platform.metrics import Role

SNAPSHOT_TABLE_TAG = "cdc_platform/snapshot_table"
SIGNAL_ID_TAG = "cdc_platform/signal_id"
SIGNAL_OFFSET_TAG = "cdc_platform/signal_offset"
# Runs that may still snapshot a table (queued ones included: they will).
ACTIVE_STATUSES = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
                   dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
                   dg.DagsterRunStatus.CANCELING]


def sensor_name(settings: Settings, server_name: str | None = None) -> str:
    """The signal sensor of ``settings``' source (or of the deployment's ``server_name``)."""
    return f"{server_name or settings.source.server_name}_snapshot_signals"


def run_key(topic_id: str, offset: int, table_id: str) -> str:
    """One run per (signal, table), whatever the tick that reads the signal."""
    return f"signal:{topic_id}:{offset}:{table_id}"


def _run_signal(run: dg.DagsterRun) -> SignalRef | None:
    """The signal that launched a snapshot run, from its run config (None: started by
    hand)."""
    for op in ((run.run_config or {}).get("ops") or {}).values():
        config = (op or {}).get("config") or {}
        try:
            signal = SnapshotConfig(**config).signal_ref()
        except (TypeError, ValueError):  # (not a snapshot run's config)
            continue
        if signal is not None:
            return signal
    return None


def launched_before(run: dg.DagsterRun, signal: SignalRef) -> bool:
    """Whether a signal older than ``signal`` (same topic) launched the run."""
    launched_by = _run_signal(run)
    return launched_by is not None and signal.newer_than(launched_by)


def told_to_stop(run: dg.DagsterRun, request: SnapshotRequest | None) -> bool:
    """Whether the table's request.json stops this run: a stop of its own session, or a stop
    signal that came after the run's signal. Such a run is ending, however long its status
    takes to say so (a pod shutting down), and no longer counts as snapshotting the table."""
    if request is None or request.action != Action.STOP:
        return False
    if request.session_id.startswith(f"{run_session_prefix(run.run_id)}-"):
        return True
    return request.signal is not None and launched_before(run, request.signal)


class _Requests:
    """Each table's request.json, read once per tick at most."""

    def __init__(self, landing: LandingZone) -> None:
        self.landing = landing
        self.read: dict[str, SnapshotRequest | None] = {}

    def __call__(self, table_id: str) -> SnapshotRequest | None:
        if table_id not in self.read:
            self.read[table_id] = read_request(self.landing, *split_table_id(table_id))
        return self.read[table_id]


def _active_runs(instance: dg.DagsterInstance, tags: Mapping[str, str] | None = None
                 ) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(statuses=ACTIVE_STATUSES,
                                                        tags=dict(tags or {}))))


def busy_tables(instance: dg.DagsterInstance, landing: LandingZone,
                snapshot_keys: dict[dg.AssetKey, str],
                only: set[str] | None = None) -> dict[str, str]:
    """Tables being snapshotted now: by a run in progress (launched by a signal, by hand or
    by the platform) that was not told to stop, or by a live reader outside Dagster (the CLI)
    -> a description for the log. ``only``: just these tables (a run may select a thousand;
    each table costs a read of its request.json)."""
    busy: dict[str, str] = {}
    request = _Requests(landing)
    for run in _active_runs(instance):
        for key in run.asset_selection or ():
            table_id = snapshot_keys.get(key)
            if table_id is None or (only is not None and table_id not in only):
                continue
            if not told_to_stop(run, request(table_id)):
                busy[table_id] = f"run {run.run_id[:8]}, {run.status.value.lower()}"
    checkpoint = landing.read_checkpoint()
    for table_id in snapshot_keys.values():
        if table_id in busy or (only is not None and table_id not in only):
            continue
        state = read_session_state(checkpoint, table_id)
        if state is None or not state.tracked:
            continue
        if reader_alive(landing, *split_table_id(table_id)):
            busy[table_id] = f"session {state.session_id}, {state.state}"
    return busy


def counted_runs(instance: dg.DagsterInstance, landing: LandingZone,
                 snapshot_keys: dict[dg.AssetKey, str], tags: Mapping[str, str]) -> int:
    """Snapshot runs in progress carrying ``tags`` (the platform's own, counted against
    ``capture.max_parallel_snapshots``), but for runs every table of which was told to stop:
    such a run is ending, however long its status takes to say so."""
    request = _Requests(landing)
    counted = 0
    for run in _active_runs(instance, tags):
        tables = [snapshot_keys[k] for k in run.asset_selection or () if k in snapshot_keys]
        if not tables or any(not told_to_stop(run, request(t)) for t in tables):
            counted += 1
    return counted


def _run_request(action: StartSnapshot, topic_id: str, op_name: str,
                 keys: dict[str, dg.AssetKey], k8s_tags: dict[str, str]) -> dg.RunRequest:
    signal = action.signal
    config: dict[str, Any] = {
        "signal_id": signal.id, "signal_topic_id": topic_id, "signal_offset": signal.offset,
        "condition": action.condition, "surrogate_key": list(action.surrogate_key),
    }
    return dg.RunRequest(
        run_key=run_key(topic_id, signal.offset, action.table_id),
        asset_selection=[keys[action.table_id]],
        run_config={"ops": {op_name: {"config": config}}},
        tags={SNAPSHOT_TABLE_TAG: action.table_id, SIGNAL_ID_TAG: signal.id[:200],
              SIGNAL_OFFSET_TAG: str(signal.offset), **k8s_tags},
    )


def _control(context: dg.SensorEvaluationContext, landing: LandingZone,
             action: ControlSnapshots, topic_id: str, pending: set[str],
             keys: dict[str, dg.AssetKey]) -> None:
    """Stop, pause or resume; ``pending``: tables with a snapshot run that may not have opened
    its session yet (runs in progress, and the runs this tick requests)."""
    signal = action.signal
    ref = SignalRef(signal.id, topic_id, signal.offset)
    tables = action.tables
    if action.every:  # all snapshots: runs in progress, sessions the engine or readers hold
        tables = tuple(t for t in tables if t in pending or session_live(
            landing, *split_table_id(t), read_request(landing, *split_table_id(t))))
    if not tables:
        context.log.info(f"{signal.describe()}: no snapshot to {action.action}")
    for table_id in tables:
        database, table = split_table_id(table_id)
        outcome = signal_action(landing, database, table, action.action, ref,
                                run_pending=table_id in pending)
        context.log.info(f"{signal.describe()}: {outcome}")
    if action.action == "stop":
        _cancel_queued(context, tables, ref, {keys[t] for t in tables if t in keys})


def _cancel_queued(context: dg.SensorEvaluationContext, tables: tuple[str, ...],
                   ref: SignalRef, snapshot_keys: set[dg.AssetKey]) -> None:
    """Queued snapshot runs of earlier signals for ``tables`` never start (they would see the
    stop in request.json and end at once; cancelling shows it in the UI right away). Only runs
    of this source's snapshot assets: another source may have tables of the same names."""
    instance = context.instance
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED])):
        table = run.tags.get(SNAPSHOT_TABLE_TAG)
        if table not in tables or not launched_before(run, ref):
            continue
        if not snapshot_keys & set(run.asset_selection or ()):
            continue
        instance.report_run_canceled(run, message=f"stop-snapshot signal {ref.id} (offset "
                                                  f"{ref.offset})")
        context.log.info(f"signal {ref.id}: cancelled queued snapshot run {run.run_id[:8]} "
                         f"of {table}")


def says_unknown_keys(settings: Settings, repository: dg.RepositoryDefinition | None) -> bool:
    """Whether this source's sensor says why a message keyed for no source is rejected: the
    sensor of the first source, in config order, whose signal sensor loaded, so the line is
    said once, and still said when a source before it failed to load (it has no sensor then).
    Without the repository (a sensor evaluated on its own) the first configured source's."""
    servers = settings.deployment_server_names
    loaded = [server for server in servers if repository is None
              or repository.has_sensor_def(sensor_name(settings, server))]
    return loaded[:1] == [settings.source.server_name]


def _unknown_source(settings: Settings, key: bytes | None) -> str:
    """Why a message keyed for another source is rejected, when no source of the deployment
    has its key; else ''."""
    servers = settings.deployment_server_names
    if key is None:
        return ""
    name = key.decode("utf-8", "replace")
    if name in servers:
        return ""
    return (f"no source of this deployment is named {name[:100]!r} (sources: "
            f"{', '.join(servers)}); key a signal with its source's sources[].server_name")


def build_sensor(settings: Settings, assets: SnapshotAssets) -> dg.SensorDefinition:
    signals = settings.signals
    server = settings.source.server_name
    keys = assets.keys
    captured = sorted(keys)
    landing = LandingZone.from_settings(settings, server)

    @dg.sensor(
        name=sensor_name(settings),
        minimum_interval_seconds=signals.sensor_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        asset_selection=dg.AssetSelection.assets(*keys.values()),
        description=f"Reads the signal topic {signals.topic!r} (messages keyed {server!r}) and "
        "launches one snapshot run per table of each execute-snapshot signal; stop-, pause- and "
        "resume-snapshot act on running snapshots. Skipped signals are logged with the reason.",
    )
    def snapshot_signals(context: dg.SensorEvaluationContext
                         ) -> dg.SensorResult | dg.SkipReason:
        if not signals.kafka.bootstrap_servers:
            return dg.SkipReason("signals.kafka.bootstrap_servers is not set: there is no "
                                 "signal topic to read")
        try:
            cursor = SignalCursor.from_json(context.cursor)
        except (ValueError, TypeError) as error:
            context.log.error(f"sensor cursor {context.cursor!r} is unreadable ({error}); "
                              f"reading signal topic {signals.topic!r} from its start (run "
                              "keys still stop signals already acted on from running again)")
            cursor = SignalCursor()
        try:
            topics = KafkaTopics(signals.kafka.bootstrap_servers, signals.kafka.config)
            batch = topics.read(signals.topic, cursor,
                                max_messages=signals.max_messages_per_tick,
                                budget_seconds=signals.read_budget_seconds,
                                max_message_bytes=signals.max_message_bytes)
        except KafkaChannelError as error:
            context.log.warning(str(error))
            return dg.SkipReason(f"signal topic not read: {error}")
        for note in batch.notes:
            context.log.warning(note)
        topic_id = batch.cursor.topic_id or ""
        if not batch.messages:
            return dg.SensorResult(skip_reason=f"no new signal on {signals.topic!r} (next "
                                   f"offset {batch.cursor.offset})",
                                   cursor=batch.cursor.to_json())
        busy = busy_tables(context.instance, landing, {v: k for k, v in keys.items()})
        selector = selector_from_settings(settings)
        checks = SourceChecks(settings.source.connection_settings(), selector)
        try:
            actions = plan_signals(batch.messages, server_name=server, topic=signals.topic,
                                   captured=captured, selector=selector, busy=busy,
                                   max_message_bytes=signals.max_message_bytes, check=checks)
        finally:
            checks.close()
        requests: list[dg.RunRequest] = []
        requested = {a.table_id for a in actions if isinstance(a, StartSnapshot)}
        keys_by_offset = {m.offset: m.key for m in batch.messages}
        says_unknown = says_unknown_keys(settings, context.repository_def)
        for action in actions:
            if isinstance(action, Skipped):
                if not (action.foreign or action.unaddressed):
                    context.log.warning(action.describe())
                elif not says_unknown:  # (said by the source that says unknown keys)
                    context.log.info(action.describe())
                else:
                    unknown = _unknown_source(settings, keys_by_offset.get(action.offset)) \
                        if action.foreign else ""
                    context.log.warning(action.describe() + (f": {unknown}" if unknown else ""))
            elif isinstance(action, LogMessage):
                context.log.info(f"{action.signal.describe()}: {action.signal.message}")
            elif isinstance(action, StartSnapshot):
                requests.append(_run_request(action, topic_id, assets.op_name, keys,
                                             run_request_tags(settings, Role.SNAPSHOT)))
                condition = f" where {action.condition}" if action.condition else ""
                context.log.info(f"{action.signal.describe()}: snapshot of "
                                 f"{action.table_id}{condition}")
            else:
                _control(context, landing, action, topic_id, set(busy) | requested, keys)
        first, last = batch.messages[0].offset, batch.messages[-1].offset
        summary = (f"{len(batch.messages)} signal messages (offsets {first}..{last}): "
                   f"{len(requests)} snapshot runs requested")
        context.log.info(summary)
        return dg.SensorResult(run_requests=requests, cursor=batch.cursor.to_json(),
                               skip_reason=None if requests else summary)

    return snapshot_signals
