"""End to end: source commit -> row readable in the target's Iceberg table, at a steady rate.

The capture engine (``python -m cdc_platform stream``) and the applier (``... apply``) run as
processes of their own with one config file, as in production (``lake.poll_seconds`` and
``capture.flush_interval_seconds`` at their defaults; ``landing_zone.retention_hours`` 0 unless
told, so consumed segments go). Writer processes commit single-row changes at a steady rate
(half inserts of new keys, half updates of keys they inserted), each row carrying its commit
time (``t_commit``, the client's clock just before the autocommit statement). A poller in this
process reads, every 0.5 s, the main branch's new snapshots of the Iceberg table as a
third-party reader would (pyiceberg on the newest metadata file, the snapshots' added data
files) and records, for each row version it sees first, now - t_commit. It reads the landing
zone's new segments too (commit -> landed: the engine's share of the lag).

With ``s3`` (``bench._s3``) the same soak runs with the landing zone and the lake on SeaweedFS:
an s3:// landing zone, the table in the server's Iceberg REST catalog, the poller reading
through that catalog (``RestIcebergTail``).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench._lake import (
    IcebergTail,
    LandingTail,
    RestIcebergTail,
    command_env,
    describe_percentiles,
    directory_size,
    wait_until,
    write_config,
)
from bench._processes import CliProcess, cpu_seconds, system_busy_seconds
from bench._s3 import BenchS3
from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.devservices.mariadb import MariaDBServer, gtid_position_covers

DATABASE, TABLE = "e2e", "ticks"
SERVER_NAME = "e2e"
POLL_SECONDS = 0.5
GOAL_P99_SECONDS, GOAL_RATE = 15.0, 5000.0
WARM_UP_KEY = -1
CREATE_TABLE = (f"CREATE TABLE {DATABASE}.{TABLE} (id BIGINT PRIMARY KEY, writer INT NOT NULL, "
                "seq BIGINT NOT NULL, t_commit DOUBLE NOT NULL, note VARCHAR(32))")
APPLIED_LINE = re.compile(r"^(\S+ \S+) INFO (.+): (\d+) records (merged|appended) in "
                          r"([\d.]+) s")


def _client_connect(settings: dict[str, Any]) -> Any:
    """A root connection by the C client (mysqlclient), autocommit: the writers' own CPU is
    what the machine's two cores cannot spare."""
    import MySQLdb

    return MySQLdb.connect(host=settings["host"], port=settings["port"], user=settings["user"],
                           passwd=settings["password"], autocommit=True)


def write_changes(settings: dict[str, Any], index: int, writers: int, rate: float,
                  start_at: float, seconds: float, results: Any) -> None:
    """One writer process: ``rate`` single-row commits/s (its share), from ``start_at`` for
    ``seconds``; keys ``index + writers * k``. Falling more than a second behind, it drops the
    backlog rather than bursting (the achieved rate says so)."""
    conn = _client_connect(settings)
    cur = conn.cursor()
    rng = random.Random(index)
    interval = 1.0 / rate
    inserted = inserts = updates = 0
    last: tuple[int, float] | None = None
    time.sleep(max(0.0, start_at - time.time()))
    next_at, end_at = start_at, start_at + seconds
    while (now := time.time()) < end_at:
        if inserted and rng.random() < 0.5:
            key = index + writers * rng.randrange(inserted)
            committed = time.time()
            cur.execute(f"UPDATE {DATABASE}.{TABLE} SET t_commit = %s, seq = seq + 1 "
                        "WHERE id = %s", (committed, key))
            updates += 1
        else:
            key = index + writers * inserted
            committed = time.time()
            cur.execute(f"INSERT INTO {DATABASE}.{TABLE} (id, writer, seq, t_commit, note) "
                        "VALUES (%s, %s, 0, %s, %s)", (key, index, committed, f"row {key}"))
            inserted += 1
            inserts += 1
        last = (key, committed)
        next_at += interval
        delay = next_at - time.time()
        if delay > 0:
            time.sleep(delay)
        elif delay < -1.0:
            next_at = now
    conn.close()
    used = os.times()
    results.put((index, inserts, updates, time.time() - start_at, last,
                 used.user + used.system))


@dataclass
class _Observed:
    """What the poller saw, for the row versions committed in the soak."""

    since: float  # versions committed before are the warm-up's
    readable: list[float] = field(default_factory=list)  # commit -> seen by the poller
    iceberg_commit: list[float] = field(default_factory=list)  # commit -> snapshot timestamp
    landed: list[float] = field(default_factory=list)  # commit -> segment file written
    applied: list[float] = field(default_factory=list)  # segment written -> Iceberg commit
    snapshots: list[Any] = field(default_factory=list)
    newest_seen: dict[int, float] = field(default_factory=dict)
    newest_landed: dict[int, tuple[float, float]] = field(default_factory=dict)  # (t, at)
    consumed_gtid: str = ""
    errors: list[BaseException] = field(default_factory=list)


class _Poller:
    """Every POLL_SECONDS: the landing zone's new segments, then the table's new snapshots."""

    def __init__(self, iceberg: IcebergTail, landing: LandingTail, observed: _Observed) -> None:
        self.iceberg, self.landing, self.observed = iceberg, landing, observed
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-poller", daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                self.poll_once()
                self.stop.wait(max(0.0, POLL_SECONDS - (time.monotonic() - started)))
        except BaseException as error:  # noqa: BLE001 - reported by the bench
            self.observed.errors.append(error)

    def poll_once(self) -> None:
        seen = self.observed
        for landed_at, rows in self.landing.poll(["id", "t_commit"]):
            for key, committed in zip(rows["id"].to_pylist(), rows["t_commit"].to_pylist(),
                                      strict=True):
                if committed is not None and committed > seen.newest_landed.get(
                        key, (-1.0, 0.0))[0]:
                    seen.newest_landed[key] = (committed, landed_at)
                    if committed >= seen.since:
                        seen.landed.append(landed_at - committed)
        for snapshot in self.iceberg.poll():
            rows = self.iceberg.added_rows(snapshot, ["id", "t_commit"])
            now = time.time()
            seen.snapshots.append((now, snapshot, rows.num_rows))
            for key, committed in zip(rows["id"].to_pylist(), rows["t_commit"].to_pylist(),
                                      strict=True):
                if committed > seen.newest_seen.get(key, -1.0):
                    seen.newest_seen[key] = committed
                    if committed >= seen.since:
                        seen.readable.append(now - committed)
                        seen.iceberg_commit.append(snapshot.committed_at - committed)
                        landed = seen.newest_landed.get(key)
                        if landed is not None and landed[0] == committed:
                            seen.applied.append(snapshot.committed_at - landed[1])
            if snapshot.consumed_gtid:
                seen.consumed_gtid = snapshot.consumed_gtid

    def __enter__(self) -> _Poller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def _logged_matches(lines: list[str], pattern: re.Pattern[str], since: float, until: float
                    ) -> list[tuple[float, re.Match[str]]]:
    """(logged at, match) of the log lines ``pattern`` matches (its first group: the line's
    time) logged in [since, until]."""
    found = []
    for line in lines:
        match = pattern.match(line)
        if match:
            logged = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if since <= logged <= until:
                found.append((logged, match))
    return found


def _applier_merges(lines: list[str], since: float, until: float) -> list[tuple[float, int, float]]:
    """(logged at, records, seconds) of the applier's merges logged in [since, until]."""
    return [(logged, int(match.group(3)), float(match.group(5)))
            for logged, match in _logged_matches(lines, APPLIED_LINE, since, until)]


# The applier's log line of a compaction (``python -m cdc_platform apply`` logs each event); the
# seconds each of its actions took are in its report (``lake.iceberg.maintenance``).
MAINTAINED_LINE = re.compile(r"^(\S+ \S+) INFO applier: Maintained\(.*reason='([^']*)'")
ACTION_SECONDS = re.compile(r"'(\w+)_seconds': ([\d.]+)")


def _applier_maintenance(lines: list[str], since: float, until: float
                         ) -> list[tuple[float, str, float]]:
    """(logged at, reason, seconds of its actions) of the maintenance logged in [since,
    until]."""
    return [(logged, match.group(2), sum(float(value) for _, value in
                                         ACTION_SECONDS.findall(match.string)))
            for logged, match in _logged_matches(lines, MAINTAINED_LINE, since, until)]


# The applier's log line once its Spark session is warmed up (lake.warmup).
WARMED_UP = "Spark session warmed up"


def _logged_after(lines: list[str], marker: str, since: float) -> bool:
    for line in lines:
        if marker in line:
            try:
                logged = datetime.strptime(" ".join(line.split()[:2]), "%Y-%m-%d %H:%M:%S,%f")
            except ValueError:
                continue
            if logged.timestamp() >= since:
                return True
    return False


def _mb(size: float) -> str:
    return f"{size / 2**20:,.1f} MB"


def bench_e2e(rate: float, seconds: float, writers: int, retention_hours: float | None,
              work: Path, s3: BenchS3 | None = None) -> None:
    retention = "default (1 h)" if retention_hours is None else f"{retention_hours:g} h"
    where = ("ON S3 (SeaweedFS, same machine: s3:// landing zone, Iceberg REST catalog)"
             if s3 is not None else "local landing zone and Hadoop-catalog warehouse")
    print(f"\n## end to end {where}, at {rate:,.0f} commits/s for {seconds:.0f} s: source "
          f"commit -> row "
          f"readable in Iceberg (pyiceberg, polled every {POLL_SECONDS} s); engine and applier "
          f"as processes of their own, lake.poll_seconds and capture.flush_interval_seconds "
          f"at their defaults, landing_zone.retention_hours {retention}")
    root = work / f"e2e-{rate:.0f}{'-s3' if s3 is not None else ''}"
    root.mkdir(parents=True)
    server = MariaDBServer(base_dir=root / "mariadb", server_id=1)
    server.start()
    processes: list[CliProcess] = []
    try:
        server.query(f"CREATE DATABASE {DATABASE}")
        server.query(CREATE_TABLE)
        sections = s3.config_sections(f"e2e-{rate:.0f}") if s3 is not None else None
        config = write_config(
            root / "config.yaml", server, SERVER_NAME, 7101, rf"{DATABASE}\..*", root,
            landing=({} if retention_hours is None else {"retention_hours": retention_hours}),
            sections=sections)
        env = command_env(server)
        started = time.time()
        engine = CliProcess("engine", ["stream", "--config", str(config)], root / "engine.log",
                            env, root)
        processes.append(engine)
        applier = CliProcess("applier", ["apply", "--config", str(config)],
                             root / "applier.log", env, root)
        processes.append(applier)
        if s3 is not None:
            assert sections is not None
            landing_url = sections["landing_zone"]["url"]
            landing = LandingZone(landing_url, SERVER_NAME, s3=s3.options(),
                                  scratch=root / "scratch")
            iceberg: IcebergTail = RestIcebergTail(s3.catalog(), SERVER_NAME, DATABASE, TABLE)
        else:
            landing = LandingZone(str(root / "landing"), SERVER_NAME)
            iceberg = IcebergTail(root / "warehouse", SERVER_NAME, DATABASE, TABLE)

        def zone_size() -> tuple[int, int]:
            if s3 is not None:
                return s3.bucket_size(f"{landing_url}/{SERVER_NAME}")
            return directory_size(landing.root)

        # Warm up: one row through, so the soak measures a running applier, not its start.
        wait_until("the engine's first checkpoint", lambda: _alive_or_raise(processes) and
                   landing.read_checkpoint() is not None, 120)
        server.query(f"INSERT INTO {DATABASE}.{TABLE} VALUES (%s, -1, 0, %s, 'warm-up')",
                     (WARM_UP_KEY, time.time()))
        first = wait_until("the warm-up row readable in Iceberg", lambda: _alive_or_raise(
            processes) and _with_rows(iceberg.current()), 300)
        # The first append needs no Spark (lake.arrow_load): the applier, idle then, starts
        # its session and warms it up; the soak begins once it has (its first MERGE is then
        # not its start's).
        wait_until("the applier's Spark session warmed up", lambda: _alive_or_raise(
            processes) and _logged_after(applier.log_lines(), WARMED_UP, started - 1.0), 300)
        print(f"warm-up: engine and applier started; the first row readable "
              f"{first.committed_at - started:.1f} s after their start (target created, first "
              f"append without Spark), the applier's Spark session started and warmed up "
              f"{time.time() - started:.1f} s after")

        observed = _Observed(since=time.time())
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        settings = server.connection_settings(user="root")
        start_at = time.time() + 2.0  # the writers' imports and connections first
        children = [context.Process(target=write_changes, args=(
            settings, i, writers, rate / writers, start_at, seconds, results),
            name=f"bench-writer-{i}", daemon=True) for i in range(writers)]
        landing_tail = LandingTail(landing, DATABASE, TABLE)
        with _Poller(iceberg, landing_tail, observed):
            for child in children:
                child.start()
            time.sleep(max(0.0, start_at - time.time()))
            for process in processes:
                process.mark()
            busy_before, soak_started = system_busy_seconds(), time.time()
            server_before, bench_before = cpu_seconds(server.pid or 0), _own_cpu()
            done = [results.get(timeout=seconds + 120) for _ in children]
            soak_ended = time.time()
            for child in children:
                child.join(30)
            final = server.gtid_position()
            try:
                wait_until("the applier to consume the last commit", lambda: _alive_or_raise(
                    processes) and not observed.errors and gtid_position_covers(
                    observed.consumed_gtid, final), 600, every=0.1)
            except TimeoutError as error:
                print(f"(drain: {error})")
            drained = time.time()
            busy = system_busy_seconds() - busy_before
            server_cpu = cpu_seconds(server.pid or 0) - server_before
            bench_cpu = _own_cpu() - bench_before
            usage = {p.label: p.usage() for p in processes}
            zone_after = zone_size()
        if observed.errors:
            raise observed.errors[0]
        # Retention runs on the applier's sweep cadence: the zone after its next sweep.
        sweep_seen = _wait_for_sweep(applier, drained)
        zone_swept = zone_size()
        metadata = iceberg.metadata_file
        metadata_size = metadata.stat().st_size if metadata and metadata.exists() else 0
        current = iceberg.current()
        snapshots_kept = len(iceberg.table.metadata.snapshots) if iceberg.table else 0
    finally:
        for process in reversed(processes):
            process.stop()
        server.stop()

    inserts = sum(d[1] for d in done)
    updates = sum(d[2] for d in done)
    soak = soak_ended - soak_started
    commits = inserts + updates
    inserted_seen = sum(1 for k in observed.newest_seen if k != WARM_UP_KEY)
    print(f"writers: {writers} processes (C client), {commits:,} single-row commits "
          f"({inserts:,} inserts, {updates:,} updates) in {soak:.1f} s = {commits / soak:,.0f} "
          f"commits/s achieved (target {rate:,.0f})")
    print(f"readable: {len(observed.readable):,} row versions seen first by the poller "
          f"(updates folded into a later version of the same key within one merge are never "
          f"readable); inserted keys readable: {inserted_seen:,} of {inserts:,}; drained "
          f"{drained - soak_ended:.1f} s after the last commit")
    print(f"  commit -> readable (poller): {describe_percentiles(observed.readable)}  "
          f"(goal p99 <= {GOAL_P99_SECONDS:.0f} s at {GOAL_RATE:,.0f} commits/s; peers' Iceberg "
          "sinks commit every 1-5 min by default)")
    print(f"  commit -> Iceberg commit (snapshot timestamp): "
          f"{describe_percentiles(observed.iceberg_commit)}")
    print(f"  commit -> landed (segment written by the engine"
          f"{'; on S3: first seen by the poller' if s3 is not None else ''}): "
          f"{describe_percentiles(observed.landed)}")
    print(f"  landed -> Iceberg commit (the applier's poll and merge): "
          f"{describe_percentiles(observed.applied)}")
    window = [s for at, s, _ in observed.snapshots if soak_started <= at <= drained]
    merges = [s for s in window if s.operation in ("append", "overwrite")]
    other = [s.operation for s in window if s.operation not in ("append", "overwrite")]
    gaps = [b.committed_at - a.committed_at for a, b in zip(merges, merges[1:], strict=False)]
    logged = _applier_merges(applier.log_lines(), soak_started, drained)
    print(f"applier: {len(merges)} merges (Iceberg commits) in {drained - soak_started:.0f} s, "
          f"one every {describe_percentiles(gaps)}; other snapshots: "
          f"{', '.join(f'{other.count(op)} {op}' for op in sorted(set(other))) or 'none'}")
    if logged:
        durations = [d for _, _, d in logged]
        records = [r for _, r, _ in logged]
        print(f"  merge duration (applier log): {describe_percentiles(durations)}; records per "
              f"merge: mean {sum(records) / len(records):,.0f}, max {max(records):,}; busy "
              f"merging {sum(durations) / (drained - soak_started):.0%} of the time")
        by_minute: dict[int, list[float]] = {}
        for logged_at, _, seconds_taken in logged:
            by_minute.setdefault(int((logged_at - soak_started) // 60), []).append(seconds_taken)
        print("  merge duration by minute of the soak (median, merges): " + "; ".join(
            f"{minute + 1}: {sorted(v)[len(v) // 2]:.1f} s, {len(v)}"
            for minute, v in sorted(by_minute.items())))
    maintained = _applier_maintenance(applier.log_lines(), soak_started, drained)
    print(f"  maintenance (applier log): {len(maintained)} runs" + "".join(
        f"; at {at - soak_started:.0f} s, {seconds:.1f} s ({reason})"
        for at, reason, seconds in maintained))
    print(f"  applier {usage['applier'].describe(drained - soak_started)}")
    print(f"  engine  {usage['engine'].describe(drained - soak_started)}")
    elapsed = drained - soak_started
    writers_cpu = sum(d[5] for d in done)
    shares = {"engine": usage["engine"].cpu_seconds, "applier": usage["applier"].cpu_seconds,
              "MariaDB": server_cpu, "writers": writers_cpu, "poller (pyiceberg)": bench_cpu}
    shares["other processes"] = max(0.0, busy - sum(shares.values()))
    print(f"machine: {busy / elapsed:.2f} of 2 cores busy from the soak's start to the drain, "
          f"in cores: " + ", ".join(f"{k} {v / elapsed:.2f}" for k, v in shares.items()))
    print(f"engine CPU per commit: {usage['engine'].cpu_seconds / commits * 1e6:,.0f} us "
          f"(one core would capture {commits / usage['engine'].cpu_seconds:,.0f} single-row "
          "commits/s)")
    print(f"landing zone after the soak: {_mb(zone_after[0])} in {zone_after[1]:,} files; after "
          f"the applier's next sweep{'' if sweep_seen else ' (none seen within 75 s)'}: "
          f"{_mb(zone_swept[0])} in {zone_swept[1]:,} files (retention {retention}); segments "
          f"landed during the run: {_mb(landing_tail.bytes_seen)} in {landing_tail.files_seen:,} "
          "files (what an hour's retention keeps, before its compaction of consumed minutes)")
    if current is not None:
        print(f"target: {current.rows:,} rows, {current.summary.get('total-data-files')} data + "
              f"{current.summary.get('total-delete-files')} delete files, {snapshots_kept} "
              f"snapshots kept; Iceberg metadata file {_mb(metadata_size)} "
              f"({metadata.name if metadata else '?'})")


def _own_cpu() -> float:
    used = os.times()
    return used.user + used.system


def _with_rows(snapshot: Any) -> Any:
    return snapshot if snapshot is not None and snapshot.rows > 0 else None


def _alive_or_raise(processes: list[CliProcess]) -> bool:
    for process in processes:
        if not process.alive():
            raise process.fail("exited")
    return True


def _wait_for_sweep(applier: CliProcess, since: float, timeout: float = 75.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _logged_after(applier.log_lines(), "Swept", since):
            return True
        time.sleep(1.0)
    return False


def run(rates: list[float], seconds: float, writers: int, retention_hours: float | None,
        work: Path) -> None:
    for rate in rates:
        bench_e2e(rate, seconds, writers, retention_hours, work)
