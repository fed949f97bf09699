"""The living lake in Dagster: the long-running ``apply_changes`` job, the sensor that keeps it
running, and each target's ``fresh`` check (``lake.freshness_seconds``).

- ``apply_changes`` runs ``lake.applier.loop.Applier`` in a child process of its one step
  (``lake.applier.process``), with one Spark session there; each merge is recorded as a
  materialisation of the target asset (with the newest source commit applied and the lag to
  the Iceberg commit), each compaction as an observation, each reconcile as a result of the
  target's ``reconcile`` check, each landing-zone sweep as an observation of the changelog.
- The sensor ``<server>_keep_lake_fresh`` (on by default) launches ``apply_changes`` when no run
  of it is active, with the reason as a run tag, and fails a run whose process is gone (a
  ``kill -9``: the default run launcher cannot tell). Each tick it also judges every target's
  freshness (``lake.freshness``) and records the ``fresh`` check's result when it changes.
"""


import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import dagster as dg

from cdc_platform.capture.binlog.headroom import checkpoint_lag_seconds
from cdc_platform.capture.landing.pending import oldest_pending_by_table
from cdc_platform.capture.landing.zone import LandingReader
from cdc_platform.capture.schema import TableSchema
from cdc_platform.config import Settings
from cdc_platform.defs.lake.definitions import stalenesses, target_key
from cdc_platform.defs.long_running import RunTags, active_runs, keep_running, run_alive
from cdc_platform.defs.monitoring import k8s_config_tag
from cdc_platform.defs.names import scoped_name, subsettable_asset_checks
from cdc_platform.defs.streaming.definitions import STREAM_TAG
from cdc_platform.defs.streaming.runner import changelog_key
from cdc_platform.defs.threaded import QueueLog, run_in_thread
from cdc_platform.lake import freshness
from cdc_platform.metrics import Role, metrics_url

JOB_NAME = "apply_changes"
APPLIER_TAG = "cdc_platform/applier"
PID_TAG = "cdc_platform/applier_pid"
# The pid of the process the run merges in (``lake.applier.process``).
CHILD_PID_TAG = "cdc_platform/applier_child_pid"
HOST_TAG = "cdc_platform/applier_host"
RUN_TAGS = RunTags(APPLIER_TAG, PID_TAG, HOST_TAG)
# The fresh check's result is recorded when it changes, and at least this often.
REPORT_EVERY_SECONDS = 300.0
STOP_GRACE_SECONDS = 120.0
# Events received and not yet recorded, at most: past it the child waits to send (memory stays
# bounded if recording falls behind the merges).
PENDING_EVENTS = 10_000


def sensor_name(settings: Settings) -> str:
    return f"{settings.source.server_name}_keep_lake_fresh"


# ---- the job --------------------------------------------------------------------------------

class ApplyConfig(dg.Config):
    """Run config of ``apply_changes``."""

    progress_seconds: float = 60.0


@dataclass(frozen=True)
class LogLine:
    level: str  # info | warning
    text: str


# A relay of more merges than this says them in one line (each still materialises its table).
MERGE_LINES = 5


def _events_to_dagster(settings: Settings, events: list[Any]) -> Iterable[Any]:
    """Dagster events (and ``LogLine``s) for a batch of applier events: the stale markers are
    read once for the batch's merges, and a batch of many merges is one log line (a thousand
    tables merging every few seconds would be a log line each)."""
    from cdc_platform.lake.applier.events import Applied

    applied = [e for e in events if isinstance(e, Applied)]
    stale = stalenesses(settings, [(e.schema, e.result.consumed_pos) for e in applied]) \
        if applied else {}
    if len(applied) > MERGE_LINES:
        yield LogLine("info", _merges_line(applied))
    for event in events:
        if isinstance(event, LogLine):
            yield event
        else:
            yield from _event_to_dagster(settings, event, stale, len(applied) <= MERGE_LINES)


def _merges_line(applied: list[Any]) -> str:
    """One line for many merges: how many, their records, the longest waits, the tables."""
    records = sum(e.result.records_read for e in applied)
    waits = [e.result.wait_seconds for e in applied if e.result.wait_seconds is not None]
    spark = sum(1 for e in applied if e.result.spark)
    names = ", ".join(e.schema.table_id for e in applied[:10])
    more = f" and {len(applied) - 10} more" if len(applied) > 10 else ""
    return (f"applier: {len(applied)} tables merged ({records} records"
            + (f", oldest change waited up to {max(waits):.1f} s" if waits else "")
            + (f", {spark} by Spark" if spark else "") + f"): {names}{more}")


def _event_to_dagster(settings: Settings, event: Any, stale: dict[str, str | None],
                      line: bool) -> Iterable[Any]:
    from cdc_platform.lake.applier.events import (
        Applied,
        Current,
        Failed,
        Maintained,
        Reconciled,
        Swept,
        Waiting,
    )

    if isinstance(event, Applied):
        result, schema = event.result, event.schema
        reason = stale.get(schema.table_id)
        if line:
            yield LogLine("info", event.describe())
        yield dg.AssetMaterialization(
            asset_key=target_key(settings, schema),
            description=f"merged by {JOB_NAME}",
            metadata={"stale": reason is not None, "stale_reason": reason or "",
                      **result.metadata()})
    elif isinstance(event, Current):
        yield dg.AssetMaterialization(
            asset_key=target_key(settings, event.schema),
            description=f"current: every landed change is merged ({JOB_NAME} had nothing to "
            "merge since the last materialisation)",
            metadata={"current": True, "records_read": 0,
                      "consumed_position": -1 if event.consumed_pos is None
                      else event.consumed_pos,
                      **({} if event.rows is None else {"rows": event.rows})})
    elif isinstance(event, Failed):
        yield LogLine("warning", f"{event.schema.table_id}: merge failed ({event.attempts} in a row; "
                          f"retried with backoff): {event.error}")
    elif isinstance(event, Maintained):
        yield LogLine("info", f"{event.schema.table_id}: maintained ({event.reason})")
        yield dg.AssetObservation(asset_key=target_key(settings, event.schema),
                                  metadata={"maintenance": event.reason, **event.report})
    elif isinstance(event, Reconciled):
        result = event.result
        metadata = {**result.to_metadata(), "target_gtid": event.target_gtid,
                    "conclusive": event.conclusive, "by": JOB_NAME}
        if result.ok:
            description = None
        elif event.conclusive:
            description = (f"{result.missing} missing, {result.extra} extra, {result.different} "
                           "different rows at the same source position: re-snapshot the table")
        else:
            description = (f"{result.missing} missing, {result.extra} extra, {result.different} "
                           "different rows, but the source moved while it was read (target at "
                           f"{event.target_gtid}, source at {result.source_gtid}); checked "
                           "again after the next merge")
        yield LogLine("info" if result.ok else "warning",
               f"{event.schema.table_id}: reconcile {'passed' if result.ok else description}")
        yield dg.AssetCheckEvaluation(
            asset_key=target_key(settings, event.schema), check_name="reconcile",
            passed=result.ok, metadata=metadata, description=description,
            severity=dg.AssetCheckSeverity.ERROR if event.conclusive
            else dg.AssetCheckSeverity.WARN)
    elif isinstance(event, Waiting):
        reason = (f"waits for snapshot session {event.session_id} (at most "
                  f"{event.seconds:.0f} s from its start), so that the initial load is one "
                  "append rather than an append and merges")
        yield LogLine("info", f"{event.schema.table_id}: empty target {reason}")
        yield dg.AssetObservation(asset_key=target_key(settings, event.schema),
                                  metadata={"waiting_for_snapshot": event.session_id,
                                            "waiting_reason": reason})
    elif isinstance(event, Swept):
        report = event.report
        yield LogLine("info", f"landing-zone retention: {report}")
        yield dg.AssetObservation(asset_key=changelog_key(settings), metadata=report.metadata())


def _k8s_tags(settings: Settings) -> dict[str, Any]:
    """The run pod's scrape annotations, when the applier serves metrics."""
    config = k8s_config_tag(settings, Role.APPLIER)
    return {"dagster-k8s/config": config} if config else {}


def build_job(settings: Settings) -> dg.JobDefinition:
    server = settings.source.server_name

    @dg.op(
        name=scoped_name(settings, "apply_landed_changes"),
        description="Keeps every lake table merged with its changelog until cancelled: one Spark "
        "session, one Iceberg commit per table per merge, compaction, reconciles and "
        "landing-zone retention on their own cadence (docs/iceberg.md, 'The applier').",
    )
    def apply_landed_changes(context: dg.OpExecutionContext, config: ApplyConfig) -> None:
        from cdc_platform.lake.applier.process import ApplierProcess

        child = ApplierProcess(settings)
        pending: list[Any] = []  # (events the child sent, recorded from the step's thread)

        def merge(stop: threading.Event) -> None:
            # The merges run in a process of their own (``lake.applier.process``: recording
            # a thousand tables' materialisations shared this interpreter with them, and
            # halved their pace); this thread passes its events on until asked to stop.
            child.start()
            try:
                while not stop.is_set():
                    if len(pending) >= PENDING_EVENTS:  # (recording lags: the child waits)
                        stop.wait(0.1)
                        continue
                    pending.extend(child.receive(0.5))
            finally:
                if not child.stop(STOP_GRACE_SECONDS - 10, pending.append):
                    pending.append(LogLine("warning", "applier: its process did not stop "
                                           f"within {STOP_GRACE_SECONDS - 10:.0f}s; killed (a "
                                           "merge that did not commit is redone by the next "
                                           "run)"))

        tagged: list[int] = []

        def relay() -> None:
            if not tagged and child.pid is not None:
                tagged.append(child.pid)
                context.instance.add_run_tags(context.run_id, {CHILD_PID_TAG: str(child.pid)})
            while pending:
                events = pending[:]
                del pending[:len(events)]  # (the receiving thread appends meanwhile)
                try:
                    for item in _events_to_dagster(settings, events):
                        if isinstance(item, LogLine):
                            getattr(context.log, item.level)(item.text)
                        else:
                            context.log_event(item)
                except Exception as error:  # noqa: BLE001 - a report must not stop the merges
                    context.log.error(f"applier: could not record {len(events)} events "
                                      f"({error!r})")

        def progress() -> None:
            counters = child.counters
            context.log.info(f"applier: {counters.merges} merges in {counters.passes} passes "
                             f"over {counters.tables} tables (process {child.pid})")

        context.instance.add_run_tags(context.run_id, RUN_TAGS.where())
        port = settings.metrics_port(Role.APPLIER)
        if port is not None:
            context.log.info(f"applier metrics (served by its process): "
                             f"{metrics_url(settings.metrics.host, port)}")
        try:
            run_in_thread(
                context, "lake-applier", merge, QueueLog(), every=config.progress_seconds,
                on_tick=progress, on_poll=relay,
                stopping="applier: stop requested; finishing the merge in progress",
                grace_seconds=STOP_GRACE_SECONDS,
                not_stopped=f"applier did not stop within {STOP_GRACE_SECONDS:.0f}s; a merge "
                "that did not commit is redone by the next run")
        finally:
            relay()

    return dg.JobDefinition(
        name=scoped_name(settings, JOB_NAME),
        graph_def=dg.GraphDefinition(name=scoped_name(settings, JOB_NAME),
                                     node_defs=[apply_landed_changes]),
        description=f"Long-running applier of {server!r}: landing zone -> Iceberg tables, "
        "within lake.freshness_seconds. The sensor "
        f"{sensor_name(settings)} keeps one run of it going.",
        tags={APPLIER_TAG: server, "dagster/max_runtime": "0",
              **_k8s_tags(settings)},
        executor_def=dg.in_process_executor,
    )


# ---- freshness ----------------------------------------------------------------------------

def _checkpoint_age(checkpoint: Any) -> float | None:
    """Seconds since the engine wrote the checkpoint (``checkpoint_lag_seconds`` without the
    lag it recorded)."""
    return checkpoint_lag_seconds(checkpoint.written_at, 0.0, None)


def judge_targets(instance: dg.DagsterInstance, settings: Settings,
                  tables: list[TableSchema], applier_running: bool,
                  applier_problem: str = "") -> dict[str, freshness.Verdict]:
    """Every target's freshness verdict now (no Spark: run records, the checkpoint, segment
    footers and each target's newest materialisation). Whatever the number of tables: one
    survey of the landing zone, one query for the targets' newest materialisations, and the
    footers of the tables with pending segments read a few at a time (``oldest_pending_by_table``; on object
    storage a request each)."""
    server = settings.source.server_name
    landing = LandingReader.open(settings.landing_zone.url, server, s3=settings.s3)
    survey = landing.survey()
    checkpoint = survey.checkpoint
    limit = settings.lake.freshness_seconds
    age = _checkpoint_age(checkpoint) if checkpoint is not None else None
    engine_running = bool(active_runs(instance, STREAM_TAG, server)) or (
        age is not None and age <= limit)
    engine_lag = None
    if checkpoint is not None and checkpoint.lag_seconds is not None and age is not None \
            and age <= limit:
        engine_lag = float(checkpoint.lag_seconds)
    latest = instance.get_latest_materialization_events(
        [target_key(settings, schema) for schema in tables]) if tables else {}

    oldest = oldest_pending_by_table(landing, survey, {
        (schema.database, schema.table): _consumed_position(latest.get(target_key(settings,
                                                                                 schema)))
        for schema in tables})
    pending = {schema.table_id: oldest[(schema.database, schema.table)] for schema in tables}
    now = time.time()
    return {schema.table_id: freshness.judge(freshness.Facts(
        now=now, freshness_seconds=limit, engine_running=engine_running,
        engine_lag_seconds=engine_lag, applier_running=applier_running,
        oldest_pending=pending[schema.table_id], applier_problem=applier_problem))
        for schema in tables}


def _consumed_position(event: Any) -> int | None:
    """The consumed position a target's newest materialisation recorded (None: none)."""
    if event is None or event.asset_materialization is None:
        return None
    value = event.asset_materialization.metadata.get("consumed_position")
    number = getattr(value, "value", value)
    return int(number) if isinstance(number, int) and number >= 0 else None


def _evaluation(settings: Settings, schema: TableSchema, verdict: freshness.Verdict
                ) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=target_key(settings, schema), check_name="fresh", passed=verdict.passed,
        severity=dg.AssetCheckSeverity.WARN, description=verdict.description(),
        metadata={"lag_seconds": round(verdict.lag_seconds, 1), "cause": verdict.cause,
                  "freshness_seconds": settings.lake.freshness_seconds})


def _fresh_checks(settings: Settings, keyed: list[TableSchema]) -> dg.AssetChecksDefinition:
    """Every keyed target's ``fresh`` check, as one definition (one per table was a thousand
    ops to load and to snapshot in every run's job); a run judges the checks it selects at
    once (``judge_targets``)."""
    server = settings.source.server_name
    by_key = {target_key(settings, schema): schema for schema in keyed}

    @subsettable_asset_checks(f"fresh__{server}", [dg.AssetCheckSpec(
        "fresh", asset=key,
        description=f"Passes while {schema.table_id}'s lake table reflects the source up to "
        f"lake.freshness_seconds ({settings.lake.freshness_seconds:g} s) ago; fails naming "
        "the cause: the capture engine stopped or lagging, the applier not running, or "
        f"merges falling behind. The sensor {sensor_name(settings)} records it as it "
        "changes.") for key, schema in by_key.items()],
        description=f"The fresh checks of {server!r}'s targets.")
    def fresh(context: dg.AssetCheckExecutionContext) -> Iterable[dg.AssetCheckResult]:
        selected = [by_key[check.asset_key] for check in context.selected_asset_check_keys]
        running = [r for r in active_runs(context.instance, APPLIER_TAG, server)
                   if run_alive(r, RUN_TAGS) is not False]
        verdicts = judge_targets(context.instance, settings, selected, bool(running))
        for schema in selected:
            evaluation = _evaluation(settings, schema, verdicts[schema.table_id])
            yield dg.AssetCheckResult(asset_key=evaluation.asset_key, check_name="fresh",
                                      passed=evaluation.passed, severity=evaluation.severity,
                                      description=evaluation.description,
                                      metadata=evaluation.metadata)

    return fresh


# ---- the sensor -----------------------------------------------------------------------------

def build_sensor(settings: Settings, tables: list[TableSchema], job: dg.JobDefinition
                 ) -> dg.SensorDefinition:
    server = settings.source.server_name
    keyed = [t for t in tables if t.primary_key]

    @dg.sensor(
        name=sensor_name(settings),
        job=job,
        minimum_interval_seconds=10,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Keeps the lake of {server!r} fresh by itself: launches {JOB_NAME} when no "
        "run of it is active (the run's tags say why), fails a run whose process is gone, and "
        "records each target's `fresh` check when it changes.",
    )
    def keep_lake_fresh(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        instance = context.instance
        kept = keep_running(context, JOB_NAME, RUN_TAGS, server)
        running, requests, problem = kept.running, kept.requests, kept.problem
        verdicts = judge_targets(instance, settings, keyed, bool(running),
                                 "" if running else problem)
        try:
            previous = json.loads(context.cursor) if context.cursor else {}
        except ValueError:
            previous = {}
        now = time.time()
        cursor, events = {}, []
        for schema in keyed:
            verdict = verdicts[schema.table_id]
            state = [verdict.passed, verdict.cause]
            seen = previous.get(schema.table_id)
            if seen is None or seen[:2] != state or now - seen[2] >= REPORT_EVERY_SECONDS:
                events.append(_evaluation(settings, schema, verdict))
                if not verdict.passed:
                    context.log.warning(f"{schema.table_id}: not fresh: {verdict.reason}")
                cursor[schema.table_id] = [*state, now]
            else:
                cursor[schema.table_id] = seen
        return dg.SensorResult(run_requests=requests, asset_events=events,
                               cursor=json.dumps(cursor))

    return keep_lake_fresh


def build(settings: Settings, tables: list[TableSchema]) -> dg.Definitions:
    """The applier job, its sensor (unless ``lake.applier`` is off) and each keyed target's
    ``fresh`` check."""
    job = build_job(settings)
    keyed = [t for t in tables if t.primary_key]
    sensors = [build_sensor(settings, tables, job)] if settings.lake.applier else []
    return dg.Definitions(jobs=[job], sensors=sensors,
                          asset_checks=[_fresh_checks(settings, keyed)] if keyed else [])
