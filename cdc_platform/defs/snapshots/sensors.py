"""The re-snapshot sensor: snapshots the platform launches by itself, one run per stale marker.

The engine writes a marker per table whose target the changelog cannot make exact
(``capture.ddl.stale_markers``): after a DDL that changed its rows without row events
(``capture.resnapshot_on_ddl``), and for a table whose older rows the changelog lacks
(``capture.snapshot_mode``: the engine's first start, a table that became captured with rows, a
purged binlog). Each tick resolves the markers a finished snapshot answered and asks for one
run of the table's snapshot asset per table whose newest open marker it may launch, keyed by
that marker, so a marker launches at most one run whatever the ticks. A history marker waits
until the engine's checkpoint has passed its point; a table a run or a live reader is already
snapshotting waits (a snapshot that opened before a DDL is restarted by the engine, and its new
session answers the marker); and at most ``capture.max_parallel_snapshots`` of these runs are
queued or running at a time: the others wait for a later tick (logged). A marker whose run
ended without resolving it is not launched again (the target's ``not_stale`` check keeps
saying why): materialise the snapshot asset by hand.
"""

from __future__ import annotations

import dagster as dg

from cdc_platform.capture.ddl import stale_markers
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.config import Settings
from cdc_platform.defs.signals.sensors import ACTIVE_STATUSES, SNAPSHOT_TABLE_TAG, busy_tables

RESNAPSHOT_TAG = "cdc_platform/resnapshot_after"
# Every run this sensor launches: the source server's name (counted for max_parallel_snapshots).
AUTOMATIC_TAG = "cdc_platform/automatic_snapshot"
# Why: the marker's headline (what the snapshot loads or repairs).
REASON_TAG = "cdc_platform/snapshot_reason"
# The marker the run answers (its run key): a marker's run is launched once.
MARKER_TAG = "cdc_platform/snapshot_marker"


def sensor_name(settings: Settings) -> str:
    return f"{settings.source.server_name}_resnapshot_after_ddl"


def run_key(marker: stale_markers.StaleMarker) -> str:
    if marker.history:  # (its point has no GTID of its own: when and where it was written)
        return (f"snapshot:{marker.verb}:{marker.table_id}:{marker.position}:"
                f"{marker.recorded_at}")
    return f"resnapshot:{marker.table_id}:{marker.gtid}:{marker.position}"


def _ended_runs(instance: dg.DagsterInstance, server: str, keys: list[str]
                ) -> dict[str, dg.DagsterRun]:
    """Runs launched for these markers of ``server`` that are no longer queued or running (a
    marker's key may repeat on another source)."""
    if not keys:
        return {}
    runs = instance.get_runs(filters=dg.RunsFilter(tags={MARKER_TAG: keys,
                                                         AUTOMATIC_TAG: server}))
    return {run.tags[MARKER_TAG]: run for run in runs if run.status not in ACTIVE_STATUSES}


def build_sensor(settings: Settings, assets: dict[str, dg.AssetsDefinition]
                 ) -> dg.SensorDefinition:
    server = settings.source.server_name
    capture = settings.capture
    keys = {table_id: asset.key for table_id, asset in assets.items()}
    landing = LandingZone.from_settings(settings, server)

    def launches(marker: stale_markers.StaleMarker) -> bool:
        return stale_markers.launched_by_platform(marker, capture.snapshot_mode,
                                                  capture.resnapshot_on_ddl)

    @dg.sensor(
        name=sensor_name(settings),
        minimum_interval_seconds=settings.signals.sensor_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        asset_selection=dg.AssetSelection.assets(*keys.values()),
        description=f"Snapshots tables of {server!r} by itself, one run of the table's snapshot "
        "asset per stale marker the capture engine wrote (the target's not_stale check says "
        "which): the history of tables whose older rows the changelog lacks (the engine's "
        "first start, a newly captured table, a purged binlog: capture.snapshot_mode), and "
        "tables a DDL changed without row events (capture.resnapshot_on_ddl). At most "
        "capture.max_parallel_snapshots such runs at a time.",
    )
    def resnapshot_after_ddl(context: dg.SensorEvaluationContext
                             ) -> dg.SensorResult | dg.SkipReason:
        wanted = stale_markers.snapshots_wanted(stale_markers.resolve_markers(landing),
                                                launches)
        if not wanted:
            return dg.SkipReason("no table waits for a snapshot (no stale target, no history "
                                 "to load)")
        by_key = {v: k for k, v in keys.items()}
        busy = busy_tables(context.instance, landing, by_key)
        running = busy_tables(context.instance, landing, by_key, tags={AUTOMATIC_TAG: server})
        ended = _ended_runs(context.instance, server, [run_key(m) for m in wanted.values()])
        checkpoint = landing.read_checkpoint()
        free = capture.max_parallel_snapshots - len(running)
        requests, waiting = [], []
        # Oldest marker first: the engine's first start, then DDL in binlog order.
        for table_id, marker in sorted(wanted.items(),
                                       key=lambda item: (item[1].file_name, item[0])):
            key = run_key(marker)
            if table_id not in keys:
                context.log.warning(f"{marker.describe()}; no snapshot asset for it yet: reload "
                                    "the code location (the table is new to it)")
            elif not stale_markers.armed(marker, checkpoint):
                context.log.info(f"{table_id}: {marker.headline()}; waiting for the capture "
                                 f"engine to pass GTID position {marker.since}")
            elif table_id in busy:
                context.log.info(f"{table_id}: {marker.headline()}; a snapshot is running "
                                 f"({busy[table_id]}), waiting for it")
            elif key in ended:
                run = ended[key]
                context.log.warning(
                    f"{table_id}: {marker.headline()}; its snapshot run {run.run_id[:8]} ended "
                    f"{run.status.value} without resolving it: materialise the snapshot asset "
                    f"{keys[table_id].to_user_string()} to load it")
            elif free <= 0:
                waiting.append(table_id)
            else:
                free -= 1
                context.log.info(f"{marker.describe()}: requesting a snapshot")
                requests.append(dg.RunRequest(
                    run_key=key, asset_selection=[keys[table_id]],
                    tags={SNAPSHOT_TABLE_TAG: table_id, AUTOMATIC_TAG: server,
                          MARKER_TAG: key, REASON_TAG: marker.headline()[:200],
                          RESNAPSHOT_TAG: (marker.verb if marker.history else
                                           f"{marker.verb} at GTID {marker.gtid}")[:200]}))
        if waiting:
            context.log.info(
                f"{len(waiting)} table(s) wait for a free snapshot slot (capture."
                f"max_parallel_snapshots={capture.max_parallel_snapshots}, "
                f"{len(running) + len(requests)} running or requested): "
                f"{', '.join(waiting[:20])}{' ...' if len(waiting) > 20 else ''}")
        return dg.SensorResult(run_requests=requests, skip_reason=None if requests else
                               f"{len(wanted)} table(s) wait for a snapshot, none to request "
                               f"now ({len(waiting)} for a free slot)")

    return resnapshot_after_ddl


def build(settings: Settings, assets: dict[str, dg.AssetsDefinition]) -> dg.Definitions:
    """The sensor, when the platform snapshots anything by itself
    (``capture.resnapshot_on_ddl``, or ``capture.snapshot_mode`` other than ``never``)."""
    capture = settings.capture
    if not capture.resnapshot_on_ddl and capture.snapshot_mode == "never":
        return dg.Definitions()
    return dg.Definitions(sensors=[build_sensor(settings, assets)])
