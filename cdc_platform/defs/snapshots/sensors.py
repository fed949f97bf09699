"""The re-snapshot sensor: a DDL that left a target stale -> a run of the table's snapshot asset.

The engine writes a stale marker per table such a DDL changes (``capture.ddl.stale_markers``). Each tick
resolves the markers a finished snapshot answered and asks for one snapshot run per table whose
newest marker is open, keyed by that marker (``resnapshot:<table>:<gtid>:<position>``), so a
marker launches at most one run whatever the ticks; a table a run or a live reader is already
snapshotting waits (a snapshot that opened before the DDL is restarted by the engine, and its
new session answers the marker). On by default: ``capture.resnapshot_on_ddl``.
"""

from __future__ import annotations

import dagster as dg

from cdc_platform.capture.ddl import stale_markers
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.config import Settings
from cdc_platform.defs.signals.sensors import SNAPSHOT_TABLE_TAG, busy_tables

RESNAPSHOT_TAG = "cdc_platform/resnapshot_after"


def sensor_name(settings: Settings) -> str:
    return f"{settings.source.server_name}_resnapshot_after_ddl"


def run_key(marker: stale_markers.StaleMarker) -> str:
    return f"resnapshot:{marker.table_id}:{marker.gtid}:{marker.position}"


def build_sensor(settings: Settings, assets: dict[str, dg.AssetsDefinition]
                 ) -> dg.SensorDefinition:
    server = settings.source.server_name
    keys = {table_id: asset.key for table_id, asset in assets.items()}
    landing = LandingZone(settings.landing_zone.url, server)

    @dg.sensor(
        name=sensor_name(settings),
        minimum_interval_seconds=settings.signals.sensor_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        asset_selection=dg.AssetSelection.assets(*keys.values()),
        description=f"Re-snapshots a table of {server!r} after a DDL changed its rows without "
        "row events (the target's not_stale check says which DDL): one snapshot run per stale "
        "marker the capture engine wrote (capture.resnapshot_on_ddl).",
    )
    def resnapshot_after_ddl(context: dg.SensorEvaluationContext
                             ) -> dg.SensorResult | dg.SkipReason:
        wanted = stale_markers.snapshots_wanted(stale_markers.resolve_markers(landing))
        if not wanted:
            return dg.SkipReason("no table is stale after a DDL")
        busy = busy_tables(context.instance, landing, {v: k for k, v in keys.items()})
        requests = []
        for table_id, marker in sorted(wanted.items()):
            if table_id not in keys:
                context.log.warning(f"{marker.describe()}; no snapshot asset for it yet: reload "
                                    "the code location (the table is new to it)")
            elif table_id in busy:
                context.log.info(f"{table_id}: stale after GTID {marker.gtid}; a snapshot is "
                                 f"running ({busy[table_id]}), waiting for it")
            else:
                context.log.info(f"{marker.describe()}: requesting a snapshot")
                requests.append(dg.RunRequest(
                    run_key=run_key(marker), asset_selection=[keys[table_id]],
                    tags={SNAPSHOT_TABLE_TAG: table_id,
                          RESNAPSHOT_TAG: f"{marker.verb} at GTID {marker.gtid}"[:200]}))
        return dg.SensorResult(run_requests=requests, skip_reason=None if requests else
                               f"{len(wanted)} stale table(s), none to request now")

    return resnapshot_after_ddl


def build(settings: Settings, assets: dict[str, dg.AssetsDefinition]) -> dg.Definitions:
    """The sensor, when ``capture.resnapshot_on_ddl`` is on."""
    if not settings.capture.resnapshot_on_ddl:
        return dg.Definitions()
    return dg.Definitions(sensors=[build_sensor(settings, assets)])
