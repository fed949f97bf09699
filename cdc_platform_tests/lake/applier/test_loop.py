"""The applier on the real server, engine and Spark: targets follow a write load by themselves.

The engine streams in a thread, the applier loops in another with its own cadence; the test
only writes to the source and watches the events and the tables: the first batch into an empty
table is an append, every merge carries the lag from the source commit, reconciles and
compactions come on their cadence, and the target equals the source once the writes stop.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.capture.landing.zone import SNAPSHOTS_CHECKPOINT_KEY
from cdc_platform.lake.applier import loop as applier_module
from cdc_platform.lake.applier.decisions import compaction_reason, first_load_waits, same_position
from cdc_platform.lake.applier.events import (
    Applied,
    Current,
    Failed,
    Maintained,
    Reconciled,
    Swept,
    Waiting,
)
from cdc_platform.lake.applier.loop import Applier
from cdc_platform.lake.applier.options import ApplierOptions
from cdc_platform_tests.capture.snapshot.reading.live_engine import streaming
from cdc_platform_tests.conftest import CdcEnv


def _options(env: CdcEnv, **changes: Any) -> ApplierOptions:
    options = ApplierOptions.from_settings(env.settings)
    values = {**options.__dict__, "poll_seconds": 0.3, "merge_interval_seconds": 0.0,
              **changes}
    return ApplierOptions(**values)


class Running:
    """An applier looping in a thread; its events collected."""

    def __init__(self, spark: Any, options: ApplierOptions) -> None:
        self.events: list[Any] = []
        self.applier = Applier(spark, options, self.events.append)
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.applier.run(self.stop)
        except BaseException as error:  # noqa: BLE001 - checked by the test
            self.errors.append(error)

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(120)
        assert not self.errors, self.errors

    def of(self, kind: type) -> list[Any]:
        return [e for e in list(self.events) if isinstance(e, kind)]


def _wait(what: str, condition: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_targets_follow_a_write_load_with_appends_lag_reconciles_and_compaction(
        cdc_env: CdcEnv, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    env = cdc_env
    monkeypatch.setattr(applier_module, "EXPIRY_CHECK_MERGES", 2)
    env.execute("CREATE TABLE orders (id INT PRIMARY KEY, v VARCHAR(20), n INT)",
                "CREATE TABLE quiet (id INT PRIMARY KEY, v VARCHAR(20))")
    env.execute("INSERT INTO orders SELECT seq, CONCAT('v', seq), 0 FROM seq_1_to_300",
                "INSERT INTO quiet VALUES (1, 'one')")
    # (the delete share is the unit test's: here only the file count triggers compaction)
    options = _options(env, reconcile_every_merges=4, compact_min_files=6,
                       compact_delete_ratio=1.0, retention_seconds=0.0,
                       sweep_interval_seconds=1.0, max_snapshots=3, min_snapshots_to_keep=1)
    with streaming(env), Running(spark, options) as running:
        first = _wait("the first merges", lambda: {e.schema.table: e.result for e in
                                                   running.of(Applied)}.keys() >= {"orders",
                                                                                  "quiet"})
        assert first
        initial = [e.result for e in running.of(Applied) if e.schema.table == "orders"][0]
        assert initial.appended and initial.rows == 300, initial  # an empty target: an append
        rng = random.Random(5)
        with env.connect() as conn, conn.cursor() as cur:
            # Writes go on until the applier merged them a number of times and compacted and
            # expired snapshots (however slow the machine).
            deadline = time.monotonic() + 180
            i = 0
            def enough() -> bool:
                reasons = " ".join(m.reason for m in running.of(Maintained))
                return len([e for e in running.of(Applied) if e.schema.table == "orders"]
                           ) >= 10 and "data and delete files" in reasons and (
                    "snapshots (at most 3 kept)" in reasons)

            while time.monotonic() < deadline and not enough():
                key = rng.randint(1, 400)
                choice = rng.random()
                if choice < 0.6:
                    cur.execute("UPDATE orders SET n = n + 1, v = %s WHERE id = %s",
                                (f"w{i}", key))
                elif choice < 0.8:
                    cur.execute("DELETE FROM orders WHERE id = %s", (key,))
                else:
                    cur.execute("INSERT IGNORE INTO orders VALUES (%s, 'new', 0)", (key,))
                conn.commit()
                i += 1
                time.sleep(0.005)
        merges_during_writes = len(running.of(Applied))
        _wait("the target to equal the source",
              lambda: env.reconcile(spark, "orders").ok, timeout=120)
        _wait("a reconcile by the applier", lambda: running.of(Reconciled), timeout=120)

    applied = [e.result for e in running.of(Applied) if e.schema.table == "orders"]
    assert merges_during_writes >= 10, merges_during_writes  # merged as the changes came
    later = applied[1:]
    assert later and not any(r.appended for r in later)
    lags = [r.lag_seconds for r in later]
    assert all(lag is not None and 0 <= lag < 60 for lag in lags), lags
    assert all(r.metadata()["lag_seconds"] == r.lag_seconds for r in later)
    # The quiet table merged once, then never again: no records, no commits.
    assert len([e for e in running.of(Applied) if e.schema.table == "quiet"]) == 1
    assert not running.of(Failed)
    reconciled = running.of(Reconciled)
    assert all(e.schema.table == "orders" for e in reconciled)
    assert any(e.result.ok for e in reconciled), [e.result.to_metadata() for e in reconciled]
    # Merges every fraction of a second leave files; the applier compacts past the threshold.
    maintained = running.of(Maintained)
    assert any("data and delete files" in m.reason for m in maintained), maintained
    # ... and expires snapshots past max_snapshots, whatever their age.
    assert any("snapshots (at most 3 kept)" in m.reason for m in maintained), maintained
    snapshots = env.target(spark, "orders").snapshots()
    assert len(snapshots) < len(applied), (len(snapshots), len(applied))
    # What the targets consumed leaves the landing zone (the newest segment of a table stays).
    swept = running.of(Swept)
    assert swept and sum(e.report.deleted_files["segments"] for e in swept) > 0
    assert not any(e.report.errors for e in swept), [e.report.errors for e in swept]
    applier = running.applier
    applier._sweep(applier.tables())  # (once more, now that nothing lands)
    consumed = applier.states[f"{env.db}.orders"].consumed_pos
    left = [s for s in env.landing.segment_names(env.db, "orders") if s[1] <= consumed]
    assert len(left) <= 1, left  # the newest stays; all older consumed ones are gone
    current = env.target(spark, "orders").current()
    assert current is not None
    files = current.metadata()["data_files"] + current.metadata()["delete_files"]
    assert files < 6 + 8, files  # bounded near the threshold, not one file per merge


def test_a_failing_table_backs_off_while_the_others_merge(cdc_env: CdcEnv, spark: Any) -> None:
    env = cdc_env
    env.execute("CREATE TABLE good (id INT PRIMARY KEY, v INT)",
                "CREATE TABLE bad (id INT PRIMARY KEY, v INT)")
    env.execute("INSERT INTO good VALUES (1, 1)", "INSERT INTO bad VALUES (1, 1)")
    env.catch_up()
    # The bad table's target exists with another key: the merge refuses it, loudly.
    env.materialise(spark, "bad")
    target = env.target(spark, "bad")
    spark.sql(f"ALTER TABLE {target.identifier} SET TBLPROPERTIES "
              "('cdc.primary-key' = '[\"v\"]')")
    env.execute("INSERT INTO bad VALUES (2, 2)")
    env.catch_up()
    with Running(spark, _options(env)) as running:
        _wait("good merged", lambda: [e for e in running.of(Applied) if e.schema.table == "good"])
        _wait("bad failed twice", lambda: len(running.of(Failed)) >= 2, timeout=60)
    failures = running.of(Failed)
    assert all(f.schema.table == "bad" for f in failures)
    assert "primary key" in failures[0].error
    assert [f.attempts for f in failures[:2]] == [1, 2]  # counted, retried with backoff


def test_a_table_merged_within_the_merge_interval_waits_for_its_end(
        cdc_env: CdcEnv, spark: Any) -> None:
    """A merge's fixed cost is seconds of CPU: a busy table is merged at most once per
    ``merge_interval_seconds``, its new records then in the next merge, and the loop wakes
    when the interval ends (not up to a poll later)."""
    env = cdc_env
    env.execute("CREATE TABLE busy (id INT PRIMARY KEY, v INT)", "INSERT INTO busy VALUES (1, 0)")
    env.catch_up()
    applied: list[Any] = []
    applier = Applier(spark, _options(env, poll_seconds=30.0, merge_interval_seconds=20.0),
                      lambda event: applied.append(event) if isinstance(event, Applied) else None)
    applier.cycle()
    assert [e.result.rows for e in applied] == [1]
    env.execute("INSERT INTO busy VALUES (2, 0)")
    env.catch_up()
    started = time.monotonic()
    applier.cycle()
    assert len(applied) == 1  # within the interval: not merged
    assert 0 < applier._until_next_cycle(started) <= 20.0  # (wakes when it ends, not at 30 s)
    applier.states[next(iter(applier.states))].merge_started -= 20.0  # the interval is over
    applier.cycle()
    assert [e.result.rows for e in applied] == [1, 2]


def test_a_merge_late_in_a_long_pass_reads_what_landed_since_the_pass_began(
        cdc_env: CdcEnv, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass over many busy tables lasts longer than a poll: a merge that starts once the
    pass's survey is poll_seconds old surveys the landing zone again, so the table merges what
    landed meanwhile, not only what had landed when the pass began."""
    env = cdc_env
    env.execute("CREATE TABLE first (id INT PRIMARY KEY, v INT)",
                "CREATE TABLE second (id INT PRIMARY KEY, v INT)",
                "INSERT INTO first VALUES (1, 0)", "INSERT INTO second VALUES (1, 0)")
    env.catch_up()
    applied: list[Any] = []
    applier = Applier(spark, _options(env, merge_parallelism=1),
                      lambda event: applied.append(event) if isinstance(event, Applied) else None)
    applier.cycle()  # (both targets created and loaded)
    env.execute("INSERT INTO first VALUES (2, 0)", "INSERT INTO second VALUES (2, 0)")
    env.catch_up()
    real = applier_module.materialise
    later: list[str] = []

    def merge_then_land(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if not later:  # the pass's first merge: the other table's row lands meanwhile
            later.append("second" if kwargs["changelog"].table == "first" else "first")
            env.execute(f"INSERT INTO {later[0]} VALUES (3, 0)")
            env.catch_up()
            time.sleep(0.4)  # (the pass's survey is now older than poll_seconds, 0.3 s)
        return result

    monkeypatch.setattr(applier_module, "materialise", merge_then_land)
    del applied[:]
    applier.cycle()
    by_table = {e.schema.table: e.result for e in applied}
    assert set(by_table) == {"first", "second"}
    assert by_table[later[0]].records_read == 2  # row 2, and row 3 that landed in the pass
    assert [row["id"] for row in env.target_rows(spark, later[0])] == [1, 2, 3]


def test_a_pass_reconciles_at_most_one_table_so_the_others_keep_merging(
        cdc_env: CdcEnv, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reconciles take seconds and every table waits meanwhile: with three tables due after
    every merge, no pass runs two, and each table still gets its turn."""
    env = cdc_env
    tables = ("t1", "t2", "t3")
    env.execute(*[f"CREATE TABLE {t} (id INT PRIMARY KEY, v INT)" for t in tables])
    env.execute(*[f"INSERT INTO {t} VALUES (1, 0)" for t in tables])
    passes: list[tuple[int, str]] = []
    real = Applier.reconcile

    def observed(self: Applier, schema: Any) -> Any:
        passes.append((self.cycles, schema.table))
        return real(self, schema)

    monkeypatch.setattr(Applier, "reconcile", observed)
    with streaming(env), Running(spark, _options(env, reconcile_every_merges=1)) as running:
        with env.connect() as conn, conn.cursor() as cur:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and {t for _, t in passes} != set(tables):
                for t in tables:
                    cur.execute(f"UPDATE {t} SET v = v + 1")
                conn.commit()
                time.sleep(0.2)
        _wait("every table reconciled", lambda: {e.schema.table for e in
                                                 running.of(Reconciled)} == set(tables))
    cycles = [cycle for cycle, _ in passes]
    assert len(cycles) == len(set(cycles)), passes  # one reconcile a pass at most
    assert not running.of(Failed)


def test_compaction_reason_and_positions() -> None:
    assert compaction_reason({"data_files": 3, "delete_files": 1}, 4, 0.5)
    assert compaction_reason({"data_files": 1, "delete_files": 0, "records": 10,
                              "position_deletes": 5}, 4, 0.5)
    assert compaction_reason({"data_files": 1, "delete_files": 1, "records": 10,
                              "position_deletes": 4}, 4, 0.5) is None
    assert compaction_reason({}, 4, 0.5) is None
    assert compaction_reason({"data_files": 1, "delete_files": 0, "records": 10,
                              "position_deletes": 5}, 4, None) is None  # (not judged now)
    assert same_position("mariadb", "0-1-5,1-2-3", "1-2-3,0-1-5")
    assert not same_position("mariadb", "0-1-5", "0-1-6")
    assert not same_position("mariadb", None, "0-1-6")


def test_an_empty_target_waits_a_bounded_while_for_its_running_snapshot() -> None:
    import datetime as dt

    from cdc_platform.capture.landing.session_records import SessionState, SnapshotSession

    opened = dt.datetime(2026, 11, 26, 12, 0, 0, tzinfo=dt.UTC)

    def session(state: SessionState) -> SnapshotSession:
        return SnapshotSession("db.t", "s1", state, "0-1-5", 7, "0-1-5", ["id"],
                               started_at=opened.isoformat(timespec="seconds"))

    soon, late = opened + dt.timedelta(seconds=10), opened + dt.timedelta(seconds=31)
    assert first_load_waits(session(SessionState.OPEN), False, soon, 30)
    assert not first_load_waits(session(SessionState.OPEN), False, late, 30)  # bounded
    assert not first_load_waits(session(SessionState.OPEN), True, soon, 30)  # rows: merge
    for ended in (SessionState.DONE, SessionState.PAUSED, SessionState.STOPPED,
                  SessionState.RESTART):
        assert not first_load_waits(session(ended), False, soon, 30)
    assert not first_load_waits(None, False, soon, 30)
    naive = dataclasses.replace(session(SessionState.OPEN), started_at="2026-11-26T12:00:00")
    assert first_load_waits(naive, False, soon, 30)
    assert not first_load_waits(dataclasses.replace(naive, started_at="garbage"), False,
                                soon, 30)


def test_segments_of_a_table_the_filters_no_longer_capture_are_swept(
        cdc_env: CdcEnv, spark: Any) -> None:
    """No target reads a table the filters dropped: its segments go by age, as a keyless
    table's (the newest stays), instead of staying for ever."""
    env = cdc_env
    env.execute("CREATE TABLE kept (id INT PRIMARY KEY, v INT)",
                "CREATE TABLE dropped (id INT PRIMARY KEY, v INT)")
    for i in range(3):  # a run each: a segment each
        env.execute(f"INSERT INTO kept VALUES ({i}, 0)", f"INSERT INTO dropped VALUES ({i}, 0)")
        env.catch_up()
    assert len(env.landing.segment_names(env.db, "dropped")) >= 3
    env.overrides["capture"] = {"tables": {"include": [rf"{env.db}\.kept"]}}
    env.catch_up()  # (the engine forgets the table's schema; its folder stays)
    events: list[Any] = []
    applier = Applier(spark, _options(env, retention_seconds=0.0), events.append,
                      sweep_landing_zone=False)
    applier.cycle()
    applier._sweep(applier.tables())
    [swept] = [e for e in events if isinstance(e, Swept)]
    assert not swept.report.errors
    assert len(env.landing.segment_names(env.db, "dropped")) == 1  # the newest stays
    assert [r["id"] for r in env.target_rows(spark, "kept")] == [0, 1, 2]


def _snapshot_open_on_a_new_table(env: CdcEnv) -> None:
    """Table ``t`` with a changelog record and snapshot session ``s1`` open on it (as the
    engine records it in its checkpoint): its empty target waits for the snapshot."""
    from cdc_platform.capture.landing.session_records import SessionState, SnapshotSession

    env.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)", "INSERT INTO t VALUES (1, 1)")
    env.catch_up()
    checkpoint = env.landing.read_checkpoint()
    session = SnapshotSession(f"{env.db}.t", "s1", SessionState.OPEN, checkpoint.gtid,
                              checkpoint.next_pos, checkpoint.gtid, ["id"])
    env.landing.write_checkpoint(dataclasses.replace(checkpoint, extra={
        **checkpoint.extra, SNAPSHOTS_CHECKPOINT_KEY: {session.table_id: dataclasses.asdict(session)}}))


def test_an_empty_target_says_once_that_it_waits_for_its_snapshot(
        cdc_env: CdcEnv, spark: Any) -> None:
    """The wait is visible (an event the Dagster job turns into an observation of the
    target), once per snapshot session, and nothing is merged meanwhile."""
    env = cdc_env
    _snapshot_open_on_a_new_table(env)
    events: list[Any] = []
    applier = Applier(spark, _options(env, first_load_wait_seconds=600.0), events.append,
                      sweep_landing_zone=False)
    applier.cycle()
    applier.cycle()
    [waiting] = [e for e in events if isinstance(e, Waiting)]
    assert (waiting.schema.table, waiting.session_id, waiting.seconds) == ("t", "s1", 600.0)
    assert not [e for e in events if isinstance(e, Applied)]
    assert env.target(spark, "t").current() is None


def test_a_target_waiting_for_its_snapshot_does_not_start_the_session(
        cdc_env: CdcEnv, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass whose only work is an empty target waiting for its snapshot is not idle: the
    session does not start meanwhile (the load and the merges after it need no Spark; a
    thousand tables loading at a platform's first start should not share the machine with
    a session starting)."""
    env = cdc_env
    _snapshot_open_on_a_new_table(env)
    monkeypatch.setattr(applier_module, "SPARK_IDLE_START_SECONDS", 0.0)
    starts: list[str] = []

    def start() -> Any:
        starts.append(threading.current_thread().name)
        return spark

    applier = Applier(start, _options(env, first_load_wait_seconds=600.0), lambda event: None,
                      sweep_landing_zone=False)
    for _ in range(3):
        applier.cycle()
    assert starts == [] and applier._starting is None
    assert env.target(spark, "t").current() is None  # (still waiting: nothing merged)


def test_the_session_starts_in_the_background_after_a_pass_with_nothing_to_merge(
        cdc_env: CdcEnv, spark: Any, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a way to start its Spark session, the applier appends an initial load and merges
    without it, then starts it in a thread of its own once it has had nothing to merge for
    SPARK_IDLE_START_SECONDS (a session first started for a MERGE under a write load took
    50 s of a saturated machine), and warms it up there (the first MERGE of a cold session
    took 3-4 times a warm one's); what needs Spark then has it."""
    caplog.set_level(logging.INFO, logger="cdc_platform.lake.warmup")
    monkeypatch.setattr(applier_module, "SPARK_IDLE_START_SECONDS", 0.0)
    env = cdc_env
    env.execute("CREATE TABLE early (id INT PRIMARY KEY, v INT)", "INSERT INTO early VALUES (1, 0)")
    env.catch_up()
    starts: list[str] = []

    def start() -> Any:
        starts.append(threading.current_thread().name)
        return spark

    applied: list[Any] = []
    applier = Applier(start, _options(env), lambda event: applied.append(event)
                      if isinstance(event, Applied) else None)
    applier.cycle()
    assert [e.result.rows for e in applied] == [1] and applied[0].result.appended
    assert starts == []  # the initial load needed no session
    applier.cycle()  # nothing to merge: the session starts, in the background
    assert applier.spark is spark
    assert starts == ["applier-spark-start"]
    assert [r for r in caplog.records if r.getMessage().startswith("Spark session warmed up")]
    env.execute("UPDATE early SET v = 1 WHERE id = 1")
    env.catch_up()
    applier.cycle()
    assert [e.result.rows for e in applied] == [1, 1] and not applied[1].result.appended
    assert not applied[1].result.spark  # (the merge needs no Spark, started or not)
    assert starts == ["applier-spark-start"]


def test_files_no_snapshot_references_are_removed_once_old_enough(
        cdc_env: CdcEnv, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that died before its commit, or lost the race, leaves files no snapshot
    references: the applier removes them once they are older than ORPHAN_MIN_AGE (younger
    ones may belong to a write about to commit), and nothing else."""
    env = cdc_env
    env.execute("CREATE TABLE kept (id INT PRIMARY KEY, v INT)",
                "INSERT INTO kept VALUES (1, 1), (2, 2)")
    env.catch_up()
    env.materialise(spark, "kept")
    target = env.target(spark, "kept")
    data = Path(str(target.java_table().location()).removeprefix("file:")) / "data"
    live = sorted(data.rglob("*.parquet"))
    assert live
    old, young = data / "crashed-writer.parquet", data / "writing-now.parquet"
    for orphan in (old, young):
        orphan.write_bytes(live[0].read_bytes())
    aged = time.time() - applier_module.ORPHAN_MIN_AGE.total_seconds() - 3600
    os.utime(old, (aged, aged))
    monkeypatch.setattr(applier_module, "ORPHAN_INTERVAL_SECONDS", 0.0)
    monkeypatch.setattr(applier_module, "ORPHAN_FIRST_SECONDS", 0.0)
    events: list[Any] = []
    applier = Applier(spark, _options(env), events.append)

    applier.cycle()  # (nothing new to merge: the orphans are looked for)

    [removed] = [e for e in events if isinstance(e, Maintained)]
    assert removed.report["deleted_orphan_files_count"] == 1, removed.report
    assert not old.exists() and young.exists()
    assert all(path.exists() for path in live)
    assert env.reconcile(spark, "kept").ok


def test_a_new_applier_removes_orphan_files_an_hour_after_its_start_then_daily() -> None:
    state = applier_module._TableState()
    until_due = applier_module.ORPHAN_INTERVAL_SECONDS - (time.monotonic() - state.orphans_checked)

    assert applier_module.ORPHAN_FIRST_SECONDS - 5 < until_due <= applier_module.ORPHAN_FIRST_SECONDS
    assert applier_module.ORPHAN_FIRST_SECONDS < applier_module.ORPHAN_INTERVAL_SECONDS


def test_a_quiet_target_says_it_is_current_and_a_written_one_is_merged_instead(
        cdc_env: CdcEnv, spark: Any) -> None:
    """``Current`` every ``current_every_seconds`` while the table has nothing to merge, with
    the mark of its last merge; a table with changes waiting is merged, never called current."""
    env = cdc_env
    env.execute("CREATE TABLE quiet (id INT PRIMARY KEY, v VARCHAR(20))",
                "INSERT INTO quiet VALUES (1, 'one'), (2, 'two')")
    options = _options(env, current_every_seconds=0.5)
    with streaming(env), Running(spark, options) as running:
        merged = _wait("the first merge", lambda: running.of(Applied))
        _wait("two Current events", lambda: len(running.of(Current)) >= 2, 60)
        marks = {event.consumed_pos for event in running.of(Current)}
        assert marks == {merged[-1].result.consumed_pos}
        env.execute("INSERT INTO quiet VALUES (3, 'three')")
        _wait("the new row merged", lambda: len(running.of(Applied)) > len(merged), 60)
        events = list(running.events)
        applied = [i for i, e in enumerate(events) if isinstance(e, Applied)][-1]
        newer = events[applied].result.consumed_pos
        assert newer > merged[-1].result.consumed_pos
        _wait("Current with the new mark", lambda: any(
            e.consumed_pos == newer for e in running.of(Current)), 60)
        # (never a Current between the write landing and its merge: every Current carries
        # either the old mark before the merge, or the new one after it)
        assert all(e.consumed_pos == newer for e in events[applied:] if isinstance(e, Current))
