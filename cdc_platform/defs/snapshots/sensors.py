"""The re-snapshot sensor: snapshots the platform launches by itself, few runs for many tables.

The engine writes a marker per table whose target the changelog cannot make exact
(``capture.ddl.stale_markers``): after a DDL that changed its rows without row events
(``capture.resnapshot_on_ddl``), and for a table whose older rows the changelog lacks
(``capture.snapshot_mode``: the engine's first start, a table that became captured with rows, a
purged binlog). Each tick resolves the markers a finished snapshot answered and takes every
table whose newest open marker it may launch now: a history marker waits until the engine's
checkpoint has passed its point; a table a run or a live reader is already snapshotting waits
(a snapshot that opened before a DDL is restarted by the engine, and its new session answers
the marker). Those tables are packed into runs of the source's snapshot assets, smallest first
(``capture.snapshot.reading.batches``: ``capture.tables_per_snapshot_run``,
``capture.rows_per_snapshot_run``), each run reading a few tables at a time; at most
``capture.max_parallel_snapshots`` of these runs are queued or running at a time, and the
other tables wait for a later tick (logged).

Each run carries the newest marker it answers (``ANSWERED_TAG``). A marker whose table a run
selected and which that run answered, once the run ended without resolving it, is judged by
``capture.snapshot.reading.relaunch``: after a failed run (killed, its pod evicted, the table
failing) it is launched again, up to ``SNAPSHOT_RELAUNCHES`` times, each after a longer wait,
and the new run adopts the sessions the failed one left open; after a cancelled run, a stop, or
the last relaunch it is left alone, and the target's ``not_stale`` check says why and what to do
(materialise the snapshot asset). Relaunched runs say so in their tags (``ATTEMPT_TAG``,
``RELAUNCH_TAG``) and the tick's log. A run of one table keeps that marker's own run key (with
the attempt, for a relaunch), so a tick repeated before the daemon created the run asks for the
same run.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Mapping

import dagster as dg

from cdc_platform.capture.ddl import stale_markers
from cdc_platform.capture.landing.records import StaleMarker
from cdc_platform.capture.landing.session_records import Action
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.names import split_table_id
from cdc_platform.capture.snapshot.protocol import read_request
from cdc_platform.capture.snapshot.reading import relaunch
from cdc_platform.capture.snapshot.reading.batches import plan_runs
from cdc_platform.capture.source import SourceSession, selector_from_settings
from cdc_platform.config import Settings
from cdc_platform.defs.monitoring import run_request_tags
from cdc_platform.defs.signals.sensors import SNAPSHOT_TABLE_TAG, busy_tables, counted_runs
from cdc_platform.defs.snapshots.definitions import SnapshotAssets
from cdc_platform.metrics import Role

RESNAPSHOT_TAG = "cdc_platform/resnapshot_after"
# Every run this sensor launches: the source server's name (counted for max_parallel_snapshots).
AUTOMATIC_TAG = "cdc_platform/automatic_snapshot"
# Why: the marker's headline (what the snapshot loads or repairs).
REASON_TAG = "cdc_platform/snapshot_reason"
# The run's key: the marker's for a run of one table, the batch's otherwise.
MARKER_TAG = "cdc_platform/snapshot_marker"
# The newest marker the run answers (``marker_order``): a selected table's marker at or before
# it was launched by this run.
ANSWERED_TAG = "cdc_platform/snapshot_markers_upto"
# How many tables a run of several snapshots (it has no SNAPSHOT_TABLE_TAG).
TABLE_COUNT_TAG = "cdc_platform/snapshot_tables"
# A relaunch (``relaunch``): which run of its markers it is (the highest of its tables: 2 is
# the first relaunch), and why (the failed run before it).
ATTEMPT_TAG = "cdc_platform/snapshot_attempt"
RELAUNCH_TAG = "cdc_platform/relaunched_after"
_ENDED_STATUSES = {dg.DagsterRunStatus.SUCCESS: relaunch.SUCCESS,
                   dg.DagsterRunStatus.FAILURE: relaunch.FAILURE,
                   dg.DagsterRunStatus.CANCELED: relaunch.CANCELED}
# Run creation and a marker's recorded_at come from two hosts' clocks.
_CLOCK_SKEW = dt.timedelta(hours=1)
_LISTED = 20


def sensor_name(settings: Settings) -> str:
    return f"{settings.source.server_name}_resnapshot_after_ddl"


def run_key(marker: StaleMarker) -> str:
    if marker.history:  # (its point has no GTID of its own: when and where it was written)
        return (f"snapshot:{marker.verb}:{marker.table_id}:{marker.position}:"
                f"{marker.recorded_at}")
    return f"resnapshot:{marker.table_id}:{marker.gtid}:{marker.position}"


def marker_order(marker: StaleMarker) -> str:
    """A marker's place among the markers the engine wrote, as text that sorts so: its
    changelog position, then when it was written (a marker written again at the same position
    after its earlier self was forgotten comes after it). Both come from the engine."""
    return f"{marker.position:020d} {marker.recorded_at}"


def attempt_key(marker: StaleMarker, attempt: int = 1) -> str:
    """The marker's run key for its ``attempt``-th run: each launch of it has its own."""
    key = run_key(marker)
    return key if attempt <= 1 else f"{key}:attempt-{attempt}"


def batch_key(markers: list[StaleMarker],
              attempts: Mapping[str, int] | None = None) -> str:
    """The run key of a run answering ``markers`` (each at its attempt, by table: 1 when not
    given): a marker's own for a run of one table."""
    keys = [attempt_key(m, (attempts or {}).get(m.table_id, 1)) for m in markers]
    if len(keys) == 1:
        return keys[0]
    digest = hashlib.sha1("\n".join(sorted(keys)).encode()).hexdigest()
    return f"snapshots:{len(markers)}:{digest[:20]}"


def _answered(instance: dg.DagsterInstance, server: str, keys: Mapping[str, dg.AssetKey],
              wanted: Mapping[str, StaleMarker]
              ) -> dict[str, list[relaunch.EndedRun]]:
    """Tables whose wanted marker runs of ``server`` answered and which ended, with those runs
    (a marker's key may repeat on another source: runs are this source's by tag)."""
    if not wanted:
        return {}
    stamps = [m.recorded_at for m in wanted.values()]
    created_after = None
    if all(stamps):
        try:
            created_after = min(dt.datetime.fromisoformat(s) for s in stamps) - _CLOCK_SKEW
        except ValueError:
            created_after = None
    records = instance.get_run_records(filters=dg.RunsFilter(
        tags={AUTOMATIC_TAG: server}, statuses=list(_ENDED_STATUSES),
        created_after=created_after))
    answered: dict[str, list[relaunch.EndedRun]] = {}
    for table_id, marker in wanted.items():
        key, order, own_key = keys.get(table_id), marker_order(marker), run_key(marker)
        for record in records:
            run = record.dagster_run
            upto = run.tags.get(ANSWERED_TAG)
            if key in (run.asset_selection or ()) and (
                    (upto is not None and order <= upto) or run.tags.get(MARKER_TAG) == own_key):
                ended = record.end_time or record.update_timestamp.timestamp()
                answered.setdefault(table_id, []).append(relaunch.EndedRun(
                    run.run_id, _ENDED_STATUSES[run.status], ended))
    return answered


def _stopped_by(landing: LandingZone, table_id: str) -> str | None:
    """The signal that stopped the table's snapshot, if its request.json says one did."""
    request = read_request(landing, *split_table_id(table_id))
    if request is None or request.action != Action.STOP or request.signal is None:
        return None
    return request.signal.id


def _estimated_rows(settings: Settings, tables: list[str],
                    context: dg.SensorEvaluationContext) -> dict[str, int]:
    """The source's row estimates of ``tables`` (none when it does not answer: the runs are
    then packed by count alone)."""
    connection = dict(settings.source.connection_settings(), connect_timeout=5)
    try:
        with SourceSession(connection, selector_from_settings(settings), attempts=1) as source:
            found = source.estimated_rows([split_table_id(t) for t in tables])
    except Exception as error:  # noqa: BLE001 - the estimates only order the tables
        context.log.warning(f"row estimates of {len(tables)} table(s) not read from the source "
                            f"({' '.join(str(error).split())}); packing them by count alone")
        return {}
    return {t: found[split_table_id(t)] for t in tables if split_table_id(t) in found}


def _listed(tables: list[str]) -> str:
    return ", ".join(tables[:_LISTED]) + (" ..." if len(tables) > _LISTED else "")


def _request(server: str, keys: Mapping[str, dg.AssetKey],
             markers: list[StaleMarker],
             launches: Mapping[str, relaunch.Launch],
             k8s_tags: Mapping[str, str]) -> dg.RunRequest:
    attempts = {m.table_id: launches[m.table_id].attempt for m in markers}
    key = batch_key(markers, attempts)
    tags = {AUTOMATIC_TAG: server, MARKER_TAG: key,
            ANSWERED_TAG: max(marker_order(m) for m in markers), **k8s_tags}
    relaunched = [m.table_id for m in markers if attempts[m.table_id] > 1]
    if relaunched:
        first = launches[relaunched[0]].why
        tags |= {ATTEMPT_TAG: str(max(attempts.values())),
                 RELAUNCH_TAG: (first if len(relaunched) == 1 else
                                f"{first} (and {len(relaunched) - 1} more table(s))")[:200]}
    if len(markers) == 1:
        [marker] = markers
        tags |= {SNAPSHOT_TABLE_TAG: marker.table_id, REASON_TAG: marker.headline()[:200],
                 RESNAPSHOT_TAG: (marker.verb if marker.history else
                                  f"{marker.verb} at GTID {marker.gtid}")[:200]}
    else:
        headlines = sorted({m.headline() for m in markers})
        tags |= {TABLE_COUNT_TAG: str(len(markers)),
                 REASON_TAG: f"{headlines[0]} ({len(markers)} tables"[:190] + (
                     f"; {len(headlines) - 1} other reasons)" if len(headlines) > 1 else ")"),
                 RESNAPSHOT_TAG: ", ".join(sorted({m.verb for m in markers}))[:200]}
    return dg.RunRequest(run_key=key, asset_selection=[keys[m.table_id] for m in markers],
                         tags=tags)


def build_sensor(settings: Settings, assets: SnapshotAssets) -> dg.SensorDefinition:
    server = settings.source.server_name
    capture = settings.capture
    keys = assets.keys
    by_key = {v: k for k, v in keys.items()}
    landing = LandingZone.from_settings(settings, server)

    def launches(marker: StaleMarker) -> bool:
        return stale_markers.launched_by_platform(marker, capture.snapshot_mode,
                                                  capture.resnapshot_on_ddl)

    @dg.sensor(
        name=sensor_name(settings),
        minimum_interval_seconds=settings.signals.sensor_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        asset_selection=dg.AssetSelection.assets(*keys.values()),
        description=f"Snapshots tables of {server!r} by itself, for each stale marker the "
        "capture engine wrote (the target's not_stale check says which): the history of "
        "tables whose older rows the changelog lacks (the engine's first start, a newly "
        "captured table, a purged binlog: capture.snapshot_mode), and tables a DDL changed "
        "without row events (capture.resnapshot_on_ddl). Tables waiting together share runs, "
        "smallest first (capture.tables_per_snapshot_run, capture.rows_per_snapshot_run); at "
        "most capture.max_parallel_snapshots such runs at a time.",
    )
    def resnapshot_after_ddl(context: dg.SensorEvaluationContext
                             ) -> dg.SensorResult | dg.SkipReason:
        wanted = stale_markers.snapshots_wanted(stale_markers.resolve_markers(landing),
                                                launches)
        if not wanted:
            return dg.SkipReason("no table waits for a snapshot (no stale target, no history "
                                 "to load)")
        busy = busy_tables(context.instance, landing, by_key, only=set(wanted))
        running = counted_runs(context.instance, landing, by_key,
                               tags={AUTOMATIC_TAG: server})
        ended = _answered(context.instance, server, keys, wanted)
        checkpoint = landing.read_checkpoint()
        now = time.time()
        unknown, unarmed, snapshotting, launchable = [], [], [], []
        launching: dict[str, relaunch.Launch] = {}
        waiting_relaunch: list[tuple[str, relaunch.Wait]] = []
        given_up: list[str] = []  # (newly: the marker's note written this tick)
        left_alone = 0
        # Oldest marker first: the engine's first start, then DDL in binlog order.
        for table_id, marker in sorted(wanted.items(),
                                       key=lambda item: (item[1].file_name, item[0])):
            if table_id not in keys:
                unknown.append(table_id)
            elif not stale_markers.armed(marker, checkpoint):
                unarmed.append(table_id)
            elif table_id in busy:
                snapshotting.append(table_id)
            else:
                runs = ended.get(table_id, [])
                verdict = relaunch.relaunch_verdict(
                    runs, now, stopped_by=_stopped_by(landing, table_id) if runs else None,
                    relaunches=relaunch.SNAPSHOT_RELAUNCHES,
                    backoff_seconds=relaunch.RELAUNCH_BACKOFF_SECONDS,
                    fix=f"materialise the snapshot asset {keys[table_id].to_user_string()} "
                    "to load it")
                if isinstance(verdict, relaunch.Launch):
                    launching[table_id] = verdict
                    launchable.append(table_id)
                elif isinstance(verdict, relaunch.Wait):
                    waiting_relaunch.append((table_id, verdict))
                else:
                    left_alone += 1
                    if stale_markers.note_given_up(landing, marker, verdict.reason):
                        given_up.append(f"{table_id}: {marker.headline()}; {verdict.reason}")
        for line in given_up[:_LISTED]:
            context.log.warning(line)
        if left_alone > len(given_up[:_LISTED]):
            context.log.info(f"{left_alone - len(given_up[:_LISTED])} (more) table(s) wait for "
                             "a snapshot the platform no longer launches (each target's "
                             "not_stale check says why and what to do)")
        if waiting_relaunch:
            context.log.info(
                f"{len(waiting_relaunch)} table(s) wait to be launched again after their "
                "snapshot run failed: " + _listed([
                    f"{t} (attempt {w.attempt} in {max(0.0, w.at - now):.0f} s; {w.why})"
                    for t, w in waiting_relaunch]))
        if unknown:
            context.log.warning(f"{len(unknown)} table(s) wait for a snapshot but have no "
                                f"snapshot asset yet: reload the code location (they are new "
                                f"to it): {_listed(unknown)}")
        for table_id in unarmed[:_LISTED]:
            marker = wanted[table_id]
            context.log.info(f"{table_id}: {marker.headline()}; waiting for the capture "
                             f"engine to pass GTID position {marker.since}")
        if len(unarmed) > _LISTED:
            context.log.info(f"... and {len(unarmed) - _LISTED} more table(s) waiting for the "
                             "capture engine")
        if snapshotting:
            context.log.info(f"{len(snapshotting)} table(s) wait for the snapshot running now "
                             f"to end: {_listed([f'{t} ({busy[t]})' for t in snapshotting])}")
        free = capture.max_parallel_snapshots - running
        requests: list[dg.RunRequest] = []
        waiting: list[str] = []
        if launchable and free > 0:
            estimates = _estimated_rows(settings, launchable, context)
            planned = plan_runs(launchable, estimates,
                                tables_per_run=capture.tables_per_snapshot_run,
                                rows_per_run=capture.rows_per_snapshot_run)
            for batch in planned[:free]:
                markers = [wanted[t] for t in batch]
                requests.append(_request(server, keys, markers, launching,
                                         run_request_tags(settings, Role.SNAPSHOT)))
                rows = sum(estimates.get(t, 0) for t in batch)
                again = [launching[t].why for t in batch if launching[t].attempt > 1]
                context.log.info(
                    (f"{markers[0].describe()}: requesting a snapshot" if len(batch) == 1 else
                     f"requesting a snapshot of {len(batch)} tables (about {rows:,} rows): "
                     f"{_listed(batch)}")
                    + (f"; launched again ({len(again)} table(s)): {again[0]}" if again else ""))
            waiting = [t for batch in planned[free:] for t in batch]
        else:
            waiting = launchable
        if waiting:
            context.log.info(
                f"{len(waiting)} table(s) wait for a free snapshot slot (capture."
                f"max_parallel_snapshots={capture.max_parallel_snapshots}, "
                f"{running + len(requests)} run(s) running or requested): {_listed(waiting)}")
        return dg.SensorResult(run_requests=requests, skip_reason=None if requests else
                               f"{len(wanted)} table(s) wait for a snapshot, none to request "
                               f"now ({len(waiting)} for a free slot, "
                               f"{len(waiting_relaunch)} to be launched again later, "
                               f"{left_alone} left alone)")

    return resnapshot_after_ddl


def build(settings: Settings, assets: SnapshotAssets) -> dg.Definitions:
    """The sensor, when the platform snapshots anything by itself
    (``capture.resnapshot_on_ddl``, or ``capture.snapshot_mode`` other than ``never``)."""
    capture = settings.capture
    if not capture.resnapshot_on_ddl and capture.snapshot_mode == "never":
        return dg.Definitions()
    return dg.Definitions(sensors=[build_sensor(settings, assets)])
