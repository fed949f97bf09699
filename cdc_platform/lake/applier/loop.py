"""The applier: one long-lived Spark session that keeps every target merged with its changelog.

A Dagster run per merge costs 20-28 s before it merges anything (the process, the definitions,
a Spark session), so targets cannot be kept within a minute of the source by runs. The applier
is instead one long-running loop, as Flink's and Kafka Connect's Iceberg sinks are: every
``poll_seconds`` it reads the checkpoint, finds the tables whose segments hold records past
their target's consumed mark (a listing of file names: no data is read for idle tables), and
merges each of them not merged in the last ``merge_interval_seconds`` (a merge's fixed cost
is seconds of CPU: back to back, a busy table's merges would take the CPU the capture engine
beside them needs) with ``lake.merge.materialise`` - one Iceberg commit per table per merge,
with the consumed mark inside the commit, so exactly-once is that of a manual run: a killed
applier resumes from the marks, and a manual ``materialise_targets`` at the same time is safe
through the same compare-and-swap.

Besides merging it keeps the tables healthy: it compacts a table once its file count or its
share of deleted rows passes the configured threshold (so merges every few seconds do not
leave thousands of small and delete files), reconciles each target against the source every N
merges or on an interval (when the table has caught up, so a difference is not just lag),
deletes each target's orphan files once a day (``ORPHAN_INTERVAL_SECONDS``), and sweeps
the landing zone of what every target has consumed (``capture.landing.retention``).
An empty target whose table is being snapshotted waits a little for the snapshot to end
(``first_load_waits``), so that an initial load is one append rather than an append and
MERGEs. Compactions and reconciles take seconds each, and every other table waits meanwhile:
a pass does at most one of them (the next one due waits for the next pass, a few seconds
later, while every table merges), and each pass starts one table further along, so one table
that stays due never keeps the others from their turn.

It knows nothing of Dagster: what it did is a stream of events (``Applied``, ``Failed``,
``Maintained``, ``Reconciled``, ``Swept``) that the Dagster job turns into materialisations,
check results and log lines.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql import SparkSession

from cdc_platform.capture.landing.pending import unmerged_segments
from cdc_platform.capture.landing.zone import Checkpoint, LandingReader, Survey
from cdc_platform.capture.schema import TableSchema
from cdc_platform.capture.snapshot.protocol import read_session_state
from cdc_platform.lake.applier.decisions import compaction_reason, first_load_waits, same_position
from cdc_platform.lake.applier.events import (
    Applied,
    Current,
    Event,
    Failed,
    Maintained,
    Reconciled,
    Waiting,
)
from cdc_platform.lake.applier.options import ApplierOptions
from cdc_platform.lake.applier.sweep import LandingSweep
from cdc_platform.lake.arrow_load import target_rows
from cdc_platform.lake.arrow_merge import upkeep_without_spark
from cdc_platform.lake.changelog import TableChangelog
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.maintenance import ORPHAN_MIN_AGE, maintain, remove_orphans
from cdc_platform.lake.iceberg.table import LakeTable
from cdc_platform.lake.merge import MergeResult, materialise
from cdc_platform.lake.reconcile import ReconcileResult, reconcile_target
from cdc_platform.lake.warmup import warm_up

log = logging.getLogger(__name__)


@dataclass
class _TableState:
    consumed_pos: int | None = None
    known: bool = False  # consumed_pos was read from the target (or set by a merge)
    merges: int = 0
    merges_since_reconcile: int = 0
    last_reconcile: float = field(default_factory=time.monotonic)
    reconcile_pending: bool = False  # an inconclusive reconcile waits for the next catch-up
    failures: int = 0
    retry_at: float = 0.0
    merges_since_expiry: int = 0
    spark_upkeep: str = ""  # why the table needs Spark's compaction (too large without it)
    merge_started: float = -1e9  # (monotonic) when its last committed merge started
    # (epoch seconds) when the target's newest Iceberg snapshot was committed, as last seen
    committed_at: float | None = None
    rows: int | None = None  # the target's rows after its last merge
    # (monotonic) when it last said it was merged or current (``Applied``, ``Current``)
    reported_at: float = field(default_factory=time.monotonic)
    last_compaction: float = -1e9
    loaded: bool = False  # the target is known to hold rows
    waited_for: str = ""  # the snapshot session it last said it waits for
    awaiting_snapshot: bool = False  # its empty target waits for its snapshot (first_load_waits)
    # (monotonic) when its orphan files were last removed; at the start, as if ORPHAN_FIRST_SECONDS
    # remained until the next removal (an applier restarted daily still removes them)
    orphans_checked: float = field(default_factory=lambda: time.monotonic() - (
        ORPHAN_INTERVAL_SECONDS - ORPHAN_FIRST_SECONDS))


# A table passing compact_delete_ratio is compacted at most this often (by the file count, at
# any time).
DELETE_COMPACTION_INTERVAL_SECONDS = 300.0
# Snapshots are counted (a read of the table's metadata) once per this many merges of a table.
EXPIRY_CHECK_MERGES = 100
# After a table's merge fails, it is tried again after this long, doubling up to the cap.
RETRY_SECONDS = 5.0
# While an empty target waits for its snapshot to end, passes come this often (reading the
# checkpoint: one small file), so the initial load is appended within this of the end.
FIRST_LOAD_POLL_SECONDS = 0.25
# After this long with nothing to merge, the applier starts its Spark session (and warms it
# up) in the background, for what needs Spark (reconciles, schema changes, very large
# batches and tables): ready then, without a busy start's cost. Not on the first idle pass: a
# platform starting (no table recorded yet, snapshots landing) is busy with other work.
SPARK_IDLE_START_SECONDS = 30.0
MAX_RETRY_SECONDS = 300.0
# Compactions and snapshot expiries without Spark a pass runs at most: tables created and
# merged together cross their thresholds in the same pass (a hundred at once held a pass for
# 36 s); the others wait for their next merge.
UPKEEPS_PER_PASS = 8
# Within a pass, the landing zone is surveyed again for the merges still to start once the
# survey is poll_seconds old and this many times older than a survey takes (on object storage a
# survey of thousands of segments is seconds of listing).
SURVEY_REFRESH_COST = 10.0
# A pass that merges this many tables says so in one line (how long a pass over them takes is
# how stale the busiest tables get).
PASS_LINE_TABLES = 10
# Each target's unreferenced files older than ORPHAN_MIN_AGE (a crashed writer's, a lost race's)
# are removed this often, the first time ORPHAN_FIRST_SECONDS after the applier starts.
ORPHAN_INTERVAL_SECONDS = 24 * 3600.0
ORPHAN_FIRST_SECONDS = 3600.0


class Applier:
    """The loop; ``run`` until ``stop`` is set, events to ``emit`` (from this thread)."""

    def __init__(self, spark: SparkSession | Callable[[], SparkSession],
                 options: ApplierOptions, emit: Callable[[Event], None],
                 sweep_landing_zone: bool = True) -> None:
        # (a function: the session is made when first needed, or in the background after the
        # first pass with nothing to merge. An initial load is appended without Spark, so a
        # cold applier does not wait 5-10 s for the session first; but a session first made
        # for a merge under a write load took 50 s of a saturated machine's cores.)
        self._spark = spark
        self._starting: threading.Thread | None = None
        self._started: list[SparkSession | BaseException] = []
        self._pass_pending = False
        self._idle_since: float | None = None  # (monotonic) since when no pass had work
        self.options = options
        self.emit = emit
        self.sweep_landing_zone = sweep_landing_zone
        self.states: dict[str, _TableState] = {}
        self.cycles = 0
        self.merges = 0
        # Told each pass's length in seconds (the metrics' pass-duration histogram).
        self.on_pass: Callable[[float], None] | None = None
        self._housekept = False  # (this pass compacted or reconciled a table already)
        self._pool: ThreadPoolExecutor | None = None  # (merges of a pass, in parallel)
        self._pool_size = 0
        self._spark_lock = threading.Lock()  # (merge threads may ask for the session at once)
        self._upkeep_lock = threading.Lock()
        self._pass_upkeeps = 0  # (compactions and expiries without Spark in this pass)
        # The newest survey of the landing zone: a merge starts from it, taken again within a
        # pass once it is ``poll_seconds`` old (``_survey_for_merge``).
        self._survey_lock = threading.Lock()
        self._survey: Survey | None = None
        self._survey_at = 0.0  # (monotonic)
        self._survey_seconds = 0.0  # (what the last one took)
        self._landing = LandingReader.open(options.landing_url, options.server_name,
                                           s3=options.s3)
        self._landing_sweep = LandingSweep(options, self._landing)

    # -- the loop ---------------------------------------------------------------------------

    @property
    def spark(self) -> SparkSession:
        """The applier's Spark session (started on first use when given as a function, or
        taken from its start in the background)."""
        if isinstance(self._spark, SparkSession):
            return self._spark
        with self._spark_lock:
            return self._session()

    def _session(self) -> SparkSession:
        if isinstance(self._spark, SparkSession):
            return self._spark
        if self._starting is not None:
            self._starting.join()
            started = self._started.pop()
            self._starting = None
            if isinstance(started, BaseException):
                raise started  # (the next use starts it again)
            session = started
        else:
            session = self._spark()
        self._spark = session
        return session

    def _start_spark_in_background(self) -> None:
        """Start the session in a thread of its own once the applier has had nothing to
        merge for SPARK_IDLE_START_SECONDS, and warm it up (``lake.warmup``): it is then ready
        for what needs Spark, started while the applier idles, and the first Spark MERGE runs
        as fast as the later ones. (Merges are mostly without Spark: under a steady load there
        is no idle time, and the session starts when something first needs it.)"""
        factory = self._spark
        if isinstance(factory, SparkSession) or self._starting is not None:
            return

        def start() -> None:
            try:
                session = factory()
            except BaseException as error:  # noqa: BLE001 - raised where the session is used
                self._started.append(error)
                return
            try:
                warm_up(session)
            except Exception as error:  # noqa: BLE001 - only slower: the first MERGE warms it
                log.warning("warming the Spark session up failed (%s); the first merge will "
                            "be slower", error)
            self._started.append(session)

        self._starting = threading.Thread(target=start, name="applier-spark-start",
                                          daemon=True)
        self._starting.start()

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                started = time.monotonic()
                self.cycle(stop)
                stop.wait(self._until_next_cycle(started))
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            self._landing_sweep.stop()

    def _until_next_cycle(self, started: float) -> float:
        """Seconds until the next pass: ``poll_seconds`` after this one started, or sooner when
        a table's ``merge_interval_seconds`` ends before (it is merged when due, not up to a
        poll later), or ``FIRST_LOAD_POLL_SECONDS`` while an empty target waits for its
        snapshot (the load is appended as soon as the snapshot ends)."""
        now = time.monotonic()
        due = started + self.options.poll_seconds
        if any(state.awaiting_snapshot for state in self.states.values()):
            due = min(due, started + FIRST_LOAD_POLL_SECONDS)
        for state in self.states.values():
            if state.merge_started > 0:
                ends = state.merge_started + self.options.merge_interval_seconds
                if now < ends < due:
                    due = ends
        return max(0.0, due - now)

    @property
    def landing(self) -> LandingReader:
        """The landing zone it merges from."""
        return self._landing

    @property
    def survey(self) -> Survey | None:
        """The newest survey of the landing zone (None before the first pass)."""
        return self._survey

    def cycle(self, stop: threading.Event | None = None) -> None:
        """One pass: merge every table with new records (``merge_parallelism`` at a time),
        then the housekeeping that is due. The landing zone is read once for all tables
        (``LandingReader.survey``: the checkpoint, then one listing of every table's segments
        and one of their column renames)."""
        started = time.monotonic()
        try:
            self._cycle(stop)
        finally:
            if self.on_pass is not None:
                self.on_pass(time.monotonic() - started)

    def _cycle(self, stop: threading.Event | None) -> None:
        self.cycles += 1
        self._housekept = False
        self._pass_upkeeps = 0
        survey = self._take_survey()
        checkpoint = survey.checkpoint
        if checkpoint is None:
            return
        tables = self.tables()
        turn = self.cycles % len(tables) if tables else 0
        self._pass_pending = False
        due: list[TableSchema] = []
        for schema in tables[turn:] + tables[:turn]:
            if stop is not None and stop.is_set():
                return
            if self._due(schema, checkpoint, survey):
                due.append(schema)
        self._report_current(tables, due, checkpoint, survey)
        if due:
            merging = time.monotonic()
            self._merge_all(due, stop)
            if len(due) >= PASS_LINE_TABLES:
                log.info("applier: pass %d merged %d tables in %.1f s", self.cycles, len(due),
                         time.monotonic() - merging)
        for schema in tables[turn:] + tables[:turn]:  # (one heavy task a pass, in turn)
            state = self.states[schema.table_id]
            if state.spark_upkeep and not self._housekept:
                self._maybe_compact(schema, state, {}, reason=state.spark_upkeep)
        now = time.monotonic()
        self._idle_since = None if self._pass_pending else (self._idle_since or now)
        if self._idle_since is not None and now - self._idle_since >= SPARK_IDLE_START_SECONDS:
            self._start_spark_in_background()
        if self.sweep_landing_zone and self._landing_sweep.due():
            for swept in self._landing_sweep.in_background(tables, self.states):
                self.emit(swept)

    def _report_current(self, tables: list[TableSchema], due: list[TableSchema],
                        checkpoint: Checkpoint, survey: Survey) -> None:
        """``Current`` for each known target with nothing to merge that has said nothing for
        ``current_every_seconds`` (the applier is the one writer of a target's mark, so what
        it says follows its merges in order)."""
        now, merging = time.monotonic(), {schema.table_id for schema in due}
        for schema in tables:
            state = self.states[schema.table_id]
            if schema.table_id in merging or not state.known or state.failures or \
                    now - state.reported_at < self.options.current_every_seconds or \
                    self.pending(schema, checkpoint, survey):
                continue
            state.reported_at = now
            self.emit(Current(schema, state.consumed_pos, state.rows))

    def tables(self) -> list[TableSchema]:
        """The captured tables with a key, as the engine recorded them (new tables join as
        they land; a code-location reload is not needed)."""
        selector = self.options.selector
        found = []
        for table_id, schema in sorted(self._landing.read_tables().items()):
            if not selector.captures(schema.database, schema.table):
                continue
            shaped = selector.shape(schema)
            if shaped.primary_key:
                found.append(shaped)
            self.states.setdefault(table_id, _TableState())
        return found

    def pending(self, schema: TableSchema, checkpoint: Checkpoint,
                survey: Survey | None = None) -> bool:
        """Whether segments may hold records of the table past its consumed mark (as the
        pass's ``survey`` lists them, else as listed now)."""
        state = self.states[schema.table_id]
        if not state.known:
            return True
        names = survey.segment_names(schema.database, schema.table) if survey is not None \
            else self._landing.segment_names(schema.database, schema.table)
        return next(unmerged_segments(names, state.consumed_pos, checkpoint.next_pos),
                    None) is not None

    def _target(self, schema: TableSchema) -> LakeTable:
        return LakeTable(Lake(self.spark, self.options.warehouse_url, self.options.catalog),
                         self.options.server_name, schema.database, schema.table)

    def _due(self, schema: TableSchema, checkpoint: Checkpoint, survey: Survey) -> bool:
        """Whether the table is merged in this pass; a table with nothing new gets its
        housekeeping instead (reconcile, orphan files: one heavy task a pass)."""
        state = self.states[schema.table_id]
        now = time.monotonic()
        if now < state.retry_at or now - state.merge_started < self.options.merge_interval_seconds:
            return False
        if not self.pending(schema, checkpoint, survey):
            self._after_catch_up(schema, state)
            self._maybe_remove_orphans(schema, state)
            return False
        self._pass_pending = True
        state.awaiting_snapshot = self._loading(schema, state, checkpoint)
        return not state.awaiting_snapshot

    def _take_survey(self) -> Survey:
        started = time.monotonic()
        survey = self._landing.survey()
        self._survey, self._survey_at = survey, time.monotonic()
        self._survey_seconds = self._survey_at - started
        return survey

    def _survey_for_merge(self) -> Survey:
        """The survey a merge starting now reads from: the pass's, or a newer one once it is
        ``poll_seconds`` old (and older than ``SURVEY_REFRESH_COST`` times what a survey
        takes). A pass over many busy tables lasts longer than a poll: with its first survey
        only, a table merged near the end of a 40 s pass over 1,000 tables merged what had
        landed 40 s before, and was twice as stale as needed. A survey that fails leaves the
        merge with the last one (equally exact, only older)."""
        with self._survey_lock:
            newest = self._survey
            assert newest is not None  # (the pass took one before its merges)
            age = time.monotonic() - self._survey_at
            if age < max(self.options.poll_seconds, SURVEY_REFRESH_COST * self._survey_seconds):
                return newest
            try:
                return self._take_survey()
            except Exception as error:  # noqa: BLE001 - the pass's survey serves as well
                log.info("applier: surveying the landing zone again failed (%s); merging from "
                         "the survey of %.0f s ago", error, age)
                self._survey_at = time.monotonic()
                return newest

    def _merge_all(self, due: list[TableSchema], stop: threading.Event | None) -> None:
        """Merge the due tables, ``merge_parallelism`` at a time (never one table twice at
        once: a table is due once a pass), and record each outcome in this thread as it comes.
        Merges without Spark spend most of their time in pyarrow (reading, writing Parquet)
        and, on object storage, waiting on requests: they overlap; Spark's take turns in the
        session (``locks.spark_commits``)."""
        started = {schema.table_id: time.monotonic() for schema in due}
        workers = max(1, min(self.options.merge_parallelism, len(due)))
        if workers == 1:
            for schema in due:
                if stop is not None and stop.is_set():
                    return
                self._merged(schema, started[schema.table_id],
                             lambda schema=schema: self._merge(schema))
            return
        if self._pool is None or self._pool_size != workers:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._pool = ThreadPoolExecutor(max_workers=workers,
                                            thread_name_prefix="applier-merge")
            self._pool_size = workers
        futures = {}
        for schema in due:
            if stop is not None and stop.is_set():
                break
            futures[self._pool.submit(self._merge, schema)] = schema
        for future in as_completed(futures):
            schema = futures[future]
            self._merged(schema, started[schema.table_id], future.result)

    def _merge(self, schema: TableSchema) -> tuple[MergeResult, Maintained | None]:
        """One table's merge and, when it made the table need it, its compaction or snapshot
        expiry without Spark (``lake.arrow_merge.upkeep_without_spark``); in a worker thread."""
        options = self.options
        changelog = TableChangelog(self._landing, schema.database, schema.table,
                                   self._survey_for_merge())
        result = materialise(lambda: self.spark, options.landing_url, options.warehouse_url,
                             options.server_name, schema, schema.database, schema.table,
                             catalog=options.catalog, s3=options.s3, changelog=changelog)
        maintained = None
        if result.committed and result.snapshot is not None and not result.spark:
            maintained = self._upkeep_without_spark(schema, result)
        return result, maintained

    def _upkeep_without_spark(self, schema: TableSchema, result: MergeResult
                              ) -> Maintained | None:
        """Compact a table past the file or delete thresholds and expire its snapshots past
        ``max_snapshots`` (with some slack: expiry is a commit of its own), without Spark,
        right after its merge; a table too large for that is left to Spark's compaction
        (``_TableState.spark_upkeep``, one a pass)."""
        options, state = self.options, self.states[schema.table_id]
        assert result.snapshot is not None
        deletes_count = (time.monotonic() - state.last_compaction
                         >= DELETE_COMPACTION_INTERVAL_SECONDS)
        reason = compaction_reason(result.snapshot.metadata(), options.compact_min_files,
                                   options.compact_delete_ratio if deletes_count else None)
        count = result.snapshot_count or 0
        expire = count >= options.max_snapshots + max(10, options.max_snapshots // 10)
        if reason is None and not expire:
            return None
        with self._upkeep_lock:  # (tables merged together cross their thresholds together)
            if self._pass_upkeeps >= UPKEEPS_PER_PASS:
                return None  # (the next merge judges again)
            self._pass_upkeeps += 1
        report = upkeep_without_spark(
            options.warehouse_url, options.catalog, options.server_name, schema.database,
            schema.table, options.s3, compact=reason is not None,
            keep=options.max_snapshots if expire else None)
        if reason is not None and not (report or {}).get("concurrent_commit"):
            if report is None or "compaction_seconds" not in report:
                state.spark_upkeep = reason  # (too large: Spark's actions, in a later pass)
            else:
                state.last_compaction = time.monotonic()
        if not report:
            return None
        why = ", ".join(filter(None, [reason, f"{count} snapshots (at most "
                                      f"{options.max_snapshots} kept)" if expire else ""]))
        return Maintained(schema, f"{why} (without Spark)", report,
                          "compaction" if reason is not None else "expiry")

    def _merged(self, schema: TableSchema, started: float,
                outcome: Callable[[], tuple[MergeResult, Maintained | None]]) -> None:
        """Record one table's merge (``outcome`` returns it or raises its error)."""
        state = self.states[schema.table_id]
        try:
            result, maintained = outcome()
        except Exception as error:  # noqa: BLE001 - one table's failure leaves the others going
            state.failures += 1
            state.retry_at = time.monotonic() + min(
                RETRY_SECONDS * 2 ** (state.failures - 1), MAX_RETRY_SECONDS)
            text = str(error).strip().splitlines()[0] if str(error).strip() else type(
                error).__name__
            log.warning("applier: merging %s failed (%d in a row): %s", schema.table_id,
                        state.failures, text)
            self.emit(Failed(schema, text[:2000], state.failures))
            return
        state.failures = 0
        state.consumed_pos = result.consumed_pos
        state.known = True
        if result.snapshot is not None:
            state.committed_at = result.snapshot.committed_at.timestamp()
        state.rows = result.rows
        state.loaded = state.loaded or result.rows > 0
        if result.committed:
            state.merge_started = started
            state.merges += 1
            state.merges_since_reconcile += 1
            state.merges_since_expiry += 1
            self.merges += 1
            state.reported_at = time.monotonic()
            self.emit(Applied(schema, result))
            if maintained is not None:
                self.emit(maintained)
            elif result.spark and result.snapshot is not None:
                self._maybe_compact(schema, state, result.snapshot.metadata())
        self._after_catch_up(schema, state)
        self._maybe_remove_orphans(schema, state)

    def _loading(self, schema: TableSchema, state: _TableState, checkpoint: Checkpoint
                 ) -> bool:
        """Whether an empty target waits for its table's running snapshot
        (``first_load_waits``). When the target cannot be read, it does not wait: the merge
        then meets the same error and reports it."""
        session = read_session_state(checkpoint, schema.table_id)
        if not first_load_waits(session, state.loaded, datetime.now(UTC),
                                self.options.first_load_wait_seconds):
            return False
        try:  # (the target read only when the session alone says wait; without Spark when
            # the catalog allows: a cold applier's session is not started for it)
            rows = target_rows(self.options.warehouse_url, self.options.catalog,
                               self.options.server_name, schema.database, schema.table,
                               self.options.s3)
            if rows is None:
                current = self._target(schema).current()
                rows = current.rows if current is not None else 0
        except Exception:  # noqa: BLE001 - the merge reports it, with its backoff
            log.debug("applier: reading %s failed", schema.table_id, exc_info=True)
            return False
        state.loaded = rows > 0
        if not state.loaded and session is not None and session.session_id != state.waited_for:
            state.waited_for = session.session_id
            self.emit(Waiting(schema, session.session_id, self.options.first_load_wait_seconds))
        return not state.loaded

    # -- housekeeping ---------------------------------------------------------------------

    def _maybe_compact(self, schema: TableSchema, state: _TableState,
                       metadata: Mapping[str, Any], reason: str | None = None) -> None:
        """Compact the table past the file or delete thresholds, and expire its oldest
        snapshots past ``max_snapshots`` (``maintenance.maintain`` does both, mark kept), with
        Spark's actions; not when this pass compacted or reconciled already (the next merge
        judges again). ``reason``: compact for it (a table too large to compact without
        Spark, ``_upkeep_without_spark``)."""
        options = self.options
        if self._housekept:
            return
        # (a small table with many updates passes the delete share in a few merges: compacting
        # it that often made the rows landing meanwhile wait; the file count always counts)
        deletes_count = (time.monotonic() - state.last_compaction
                         >= DELETE_COMPACTION_INTERVAL_SECONDS)
        if reason is None:
            reason = compaction_reason(metadata, options.compact_min_files,
                                       options.compact_delete_ratio if deletes_count else None)
        kind = "compaction" if reason is not None else "expiry"
        state.spark_upkeep = ""
        older_than = datetime.now(UTC) - timedelta(hours=options.snapshot_retention_hours)
        if state.merges_since_expiry >= EXPIRY_CHECK_MERGES:
            state.merges_since_expiry = 0
            target = self._target(schema)
            if target.snapshot_count() > options.max_snapshots:
                times = target.snapshot_times()
                older_than = max(older_than, times[-options.max_snapshots])
                reason = ", ".join(filter(None, [reason, (
                    f"{len(times)} snapshots (at most {options.max_snapshots} kept)")]))
        if reason is None:
            return
        self._housekept = True
        target = self._target(schema)
        try:
            report = maintain(target, older_than, options.min_snapshots_to_keep)
        except Exception as error:  # noqa: BLE001 - a conflicting merge wins; retried later
            log.warning("applier: compacting %s failed (%s); tried again after a later merge",
                        schema.table_id, str(error).splitlines()[0] if str(error) else error)
            return
        state.last_compaction = time.monotonic()
        current = target.current()
        self.emit(Maintained(schema, reason, {
            **report, **(current.metadata() if current is not None else {})}, kind))

    def _maybe_remove_orphans(self, schema: TableSchema, state: _TableState) -> None:
        """Every ``ORPHAN_INTERVAL_SECONDS``, after a merge or an idle pass (a table that
        always has new records is never idle), as the pass's one heavy task (when another took
        the pass, in a later one): delete the target's files that nothing references and that
        are older than ``ORPHAN_MIN_AGE`` (``maintenance.remove_orphans``), so the files of
        writers that died or lost a race do not accumulate in the warehouse."""
        if self._housekept or state.consumed_pos is None or \
                time.monotonic() - state.orphans_checked < ORPHAN_INTERVAL_SECONDS:
            return
        self._housekept = True
        state.orphans_checked = time.monotonic()
        try:
            report = remove_orphans(self._target(schema), datetime.now(UTC) - ORPHAN_MIN_AGE)
        except Exception as error:  # noqa: BLE001 - tried again at the next interval
            log.warning("applier: removing orphan files of %s failed (%s); tried again in "
                        "%.0f h", schema.table_id,
                        str(error).splitlines()[0] if str(error) else error,
                        ORPHAN_INTERVAL_SECONDS / 3600)
            return
        self.emit(Maintained(schema, f"files referenced by no snapshot, older than "
                             f"{ORPHAN_MIN_AGE.days} days, removed", report, "orphans"))

    def _after_catch_up(self, schema: TableSchema, state: _TableState) -> None:
        """Reconcile when due: the table has merged all it had (a difference then is real,
        unless the source moved while it was read: ``Reconciled.conclusive``); one heavy
        task a pass (see the module's docstring)."""
        options = self.options
        due_by_count = (options.reconcile_every_merges > 0
                        and state.merges_since_reconcile >= options.reconcile_every_merges)
        due_by_time = (options.reconcile_interval_seconds > 0 and state.merges > 0
                       and time.monotonic() - state.last_reconcile
                       >= options.reconcile_interval_seconds)
        if not (due_by_count or due_by_time or (state.reconcile_pending and state.merges)):
            return
        if self._housekept:
            return  # (still due in the next pass)
        self._housekept = True
        state.last_reconcile = time.monotonic()
        state.merges_since_reconcile = 0
        try:
            result, gtid = self.reconcile(schema)
        except Exception as error:  # noqa: BLE001 - reported; the merges go on
            log.warning("applier: reconciling %s failed: %s", schema.table_id, error)
            state.reconcile_pending = False
            return
        conclusive = result.ok or same_position(self.options.flavour, result.source_gtid, gtid)
        state.reconcile_pending = not conclusive
        state.merges = 0 if conclusive else state.merges
        self.emit(Reconciled(schema, result, gtid, conclusive))

    def reconcile(self, schema: TableSchema) -> tuple[ReconcileResult, str | None]:
        """Reconcile the target against the source now; (result, the target's GTID mark)."""
        return reconcile_target(self.spark, self._target(schema), self.options.connection,
                                self.options.selector, schema,
                                self.options.reconcile_range_rows,
                                self.options.reconcile_sample_keys)

    def _sweep(self, tables: list[TableSchema]) -> None:
        """Sweep the landing zone now (``capture.landing.retention``)."""
        swept = self._landing_sweep.now(tables, self.states)
        if swept is not None:
            self.emit(swept)
