"""Issue 24's acceptance run: one deployment captures two primary-and-replica topologies.

Source A is the session's cluster (a primary, replicas 1 and 2); source B a topology of its own
(a primary and a replica). One config (``sources: [A, B]``, other server names and server ids)
shares the landing zone, the warehouse and the signal topic. Both primaries are written at once.
A's engine (``stream --source A``) is SIGKILLed at seeded points and fails over from replica 1 to
replica 2 (``run_faults``), while B's engine (``stream --source B``) streams from its replica the
whole time. Halfway through A's kills, signals go through the real signal path (the Tansu broker,
each loaded source's signal sensor of the code location ticked as the daemon ticks them): hostile
ones keyed for one source naming the other's tables, or keyed for no source, must never act,
and are rejected with a reason; a valid one keyed for B starts one snapshot run of B's table,
which is run. Then both engines catch up, and every target of both sources is compared with its
own primary (``compare.py``).

Knobs (environment): ``TORTURE_SEED`` (default 13), ``TORTURE_SOURCES_KILLS`` (A's SIGKILLs,
default 5), ``TORTURE_SOURCES_SECONDS`` (A's workload, default 40).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.signals.kafka import KafkaTopics
from cdc_platform.capture.snapshot import protocol
from cdc_platform.config import Settings, parse_settings
from cdc_platform.devservices.kafka import TansuBroker
from cdc_platform.devservices.mariadb import MariaDBServer
from cdc_platform_tests.defs.signal_sensors import SignalSensors
from cdc_platform_tests.torture.compare import TableVerdict
from cdc_platform_tests.torture.harness import (
    REPORT,
    Cluster,
    EngineProcess,
    FaultResult,
    Workload,
    build_definitions,
    config_dict,
    materialise_and_compare,
    run_faults,
)

pytestmark = [pytest.mark.torture, pytest.mark.integration, pytest.mark.timeout(1800)]

A, B = "torture_a", "torture_b"
A_DB, B_DB = "torture_sources_a", "torture_sources_b"
B_PASSWORD_ENV = "CDC_TORTURE_SOURCE_B_PASSWORD"
UNKNOWN_KEY = "torture_nosuch"


@dataclass
class SignalCase:
    """One signal sent while both engines stream, and what each source's sensor made of it."""

    name: str
    key: str
    value: dict[str, Any]
    requested: dict[str, list[dg.RunRequest]] = field(default_factory=dict)
    logged: dict[str, list[str]] = field(default_factory=dict)

    def lines(self, server: str, *words: str) -> list[str]:
        return [line for line in self.logged.get(server, []) if all(w in line for w in words)]


def _execute(*tables: str) -> dict[str, Any]:
    return {"type": "execute-snapshot", "data": {"data-collections": list(tables)}}


def _stop(*tables: str) -> dict[str, Any]:
    return {"type": "stop-snapshot", "data": {"data-collections": list(tables)}}


SIGNALS = (
    # keyed for A, naming B's table (A has no table of that name: never B's snapshot)
    ("A names B's table", A, _execute(f"{B_DB}.orders")),
    # keyed for B, naming A's tables, by name and by a pattern
    ("B names A's tables", B, _execute(f"{A_DB}.orders", rf"{A_DB}\..*")),
    ("B stops A's table", B, _stop(f"{A_DB}.orders")),
    ("no such source", UNKNOWN_KEY, _execute(f"{A_DB}.orders", f"{B_DB}.orders")),
    ("valid for B", B, _execute(f"{B_DB}.composite")),  # the one that acts, on B only
)


@dataclass
class SourcesRun:
    a: FaultResult
    b_engine_exits: list[str]
    b_catch_up: str
    b_transactions: int
    b_tables: list[TableVerdict]
    signals: dict[str, SignalCase]
    snapshot_run: str  # the valid signal's run: "success", or what went wrong
    requested: dict[str, list[tuple[str, str]]]  # tables with a snapshot request, by source

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a.to_dict(), "b_engine_exits": self.b_engine_exits,
                "b_catch_up": self.b_catch_up, "b_transactions": self.b_transactions,
                "b_tables": [v.to_dict() for v in self.b_tables],
                "snapshot_run": self.snapshot_run, "requested": self.requested,
                "signals": {name: {"key": case.key, "value": case.value,
                                   "run_requests": {s: len(r) for s, r in case.requested.items()},
                                   "logged": case.logged}
                            for name, case in self.signals.items()}}


@pytest.fixture(scope="module")
def topology_b(tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    """Source B's primary and its read replica (parallel applier, log_slave_updates)."""
    base = tmp_path_factory.mktemp("torture-source-b")
    primary = MariaDBServer(base / "primary", server_id=21)
    replica = MariaDBServer(base / "replica", server_id=22, replica=True,
                            slave_parallel_threads=4, slave_parallel_mode="optimistic")
    os.environ[B_PASSWORD_ENV] = primary.cdc_password
    with primary, replica:
        replica.replicate_from(primary)
        try:
            yield primary, replica
        finally:
            os.environ.pop(B_PASSWORD_ENV, None)


def sources_config(a_replica: MariaDBServer, b_replica: MariaDBServer, root: Path,
                   bootstrap: str) -> dict[str, Any]:
    """The deployment's config: A from ``a_replica``, B from ``b_replica``, one landing zone,
    warehouse and signal topic; each engine from the start of its replica's binlog."""
    one = {name: config_dict(replica, name, root, [rf"{re.escape(db)}\..*"], "", server_id)
           for name, replica, db, server_id in ((A, a_replica, A_DB, 7901),
                                                (B, b_replica, B_DB, 7902))}
    one[B]["source"]["password_env"] = B_PASSWORD_ENV
    shared = {k: v for k, v in one[A].items() if k not in ("source", "capture")}
    return {**shared,
            "sources": [{**data["source"], "capture": data["capture"]} for data in one.values()],
            "signals": {"kafka": {"bootstrap_servers": bootstrap},
                        "topic": f"signals-{root.name}", "notification_topic": f"notes-{root.name}",
                        "sensor_interval_seconds": 1, "read_budget_seconds": 5}}


def send_signals(settings: Settings, landing: dict[str, LandingZone]
                 ) -> tuple[dict[str, SignalCase], str]:
    """Each signal of ``SIGNALS`` sent to the topic, then every source's sensor ticked once;
    the valid signal's run request run as the daemon would launch it (B's engine commits its
    chunks)."""
    defs = build_definitions(settings)
    tick = SignalSensors(defs, settings)
    assert set(tick.sensors) == {A, B}, tick.sensors
    topics = KafkaTopics(settings.signals.kafka.bootstrap_servers)
    cases: dict[str, SignalCase] = {}
    snapshot_run = "not requested"
    with dg.instance_for_test() as instance:
        tick(instance)  # (the topic is created: the cursors start at its beginning)
        for name, key, value in SIGNALS:
            case = SignalCase(name, key, value)
            topics.produce(settings.signals.topic, key, json.dumps(value).encode())
            case.requested = tick(instance)
            case.logged = {server: list(lines) for server, lines in tick.logged.items()}
            cases[name] = case
        for request in cases["valid for B"].requested.get(B, []):
            # (a source's snapshot assets are one multi-asset: the run selects its table)
            asset = defs.resolve_assets_def(request.asset_selection[0])
            result = dg.materialize([asset], selection=request.asset_selection,
                                    instance=instance, run_config=request.run_config,
                                    tags=request.tags, raise_on_error=False)
            snapshot_run = "success" if result.success else "failed: " + "; ".join(
                str(e.message)[:300] for e in result.all_events if e.is_failure)
    return cases, snapshot_run


@pytest.fixture(scope="module")
def sources_run(cluster: Cluster, topology_b: tuple[MariaDBServer, MariaDBServer],
                kafka: TansuBroker, spark: Any, tmp_path_factory: pytest.TempPathFactory
                ) -> SourcesRun:
    primary_b, replica_b = topology_b
    root = tmp_path_factory.mktemp("torture-sources")
    seed = int(os.environ.get("TORTURE_SEED", "13"))

    def config_for(a_replica: MariaDBServer) -> dict[str, Any]:
        return sources_config(a_replica, replica_b, root, kafka.bootstrap_servers)

    data = config_for(cluster.replica1)
    (root / "config.yaml").write_text(yaml.safe_dump(data, allow_unicode=True))
    settings = parse_settings(data, "torture sources")
    landing = {name: LandingZone.from_settings(settings.for_source(name)) for name in (A, B)}
    workload_b = Workload(primary_b, seed + 1, rate=100.0, database=B_DB)
    workload_b.create()
    engine_b = EngineProcess(root / "config.yaml", root, ("stream", "--source", B),
                             name="engine-b")
    engine_b.start()
    workload_b.start()
    signals: dict[str, tuple[dict[str, SignalCase], str]] = {}

    def while_a_streams() -> None:
        signals["sent"] = send_signals(settings, landing)

    try:
        a = run_faults(cluster, spark, [], root, kills=int(os.environ.get(
                           "TORTURE_SOURCES_KILLS", "5")),
                       seed=seed, workload_seconds=float(os.environ.get(
                           "TORTURE_SOURCES_SECONDS", "40")),
                       config_for=config_for, source=A, database=A_DB,
                       while_streaming=while_a_streams)
    finally:
        workload_b.finish()
    b_exits = []
    if workload_b.errors:
        b_exits.append(f"workload errors: {workload_b.errors[:3]}")
    replica_b.wait_caught_up(primary_b)
    unasked, code = engine_b.catch_up()
    if unasked is not None:
        b_exits.append(unasked)
    b_catch_up = "ok" if code == 0 else f"exited {code}: {engine_b.tail()}"
    b_tables = materialise_and_compare(spark, settings.for_source(B), primary_b,
                                       workload_b.tables)
    cases, snapshot_run = signals.get("sent", ({}, "signals never sent"))
    result = SourcesRun(a, b_exits, b_catch_up, workload_b.transactions, b_tables, cases,
                        snapshot_run, {name: protocol.requested_tables(zone)
                                       for name, zone in landing.items()})
    REPORT["sources"] = result.to_dict()
    return result


def test_every_target_of_both_sources_equals_its_own_primary(sources_run: SourcesRun) -> None:
    bad = [f"{A}: {v.summary()}" for v in sources_run.a.tables if not v.ok]
    bad += [f"{B}: {v.summary()}" for v in sources_run.b_tables if not v.ok]
    assert not bad, "targets differ from their primary:\n" + "\n".join(bad)
    assert {v.table_id for v in sources_run.a.tables} >= {f"{A_DB}.orders", f"{A_DB}.composite"}
    assert all(v.source_rows > 0 for v in [*sources_run.a.tables, *sources_run.b_tables])
    assert len(sources_run.b_tables) == 5


def test_a_survives_every_kill_and_the_failover_while_b_streams_undisturbed(
        sources_run: SourcesRun) -> None:
    a = sources_run.a
    assert a.kills >= 3
    assert a.kills_survived == a.kills, a.engine_exits
    assert not a.engine_exits, a.engine_exits
    assert a.failover == "ok", a.failover
    assert a.transactions > 100 and sources_run.b_transactions > 100
    assert not sources_run.b_engine_exits, sources_run.b_engine_exits
    assert sources_run.b_catch_up == "ok", sources_run.b_catch_up


def test_a_signal_keyed_for_one_source_never_acts_on_the_other(sources_run: SourcesRun
                                                                ) -> None:
    cases = sources_run.signals
    assert set(cases) == {name for name, _, _ in SIGNALS}, sources_run.snapshot_run
    for name, case in cases.items():
        if name != "valid for B":
            assert not any(case.requested.values()), (name, case.requested)
    # rejected with a reason, by the sensor of the source the signal is keyed for
    assert cases["A names B's table"].lines(A, "skipped", f"{B_DB}.orders", "not captured")
    assert cases["B names A's tables"].lines(B, "skipped", f"{A_DB}.orders", "not captured")
    assert cases["B names A's tables"].lines(B, "skipped", "matches no captured table")
    assert cases["B stops A's table"].lines(B, f"{A_DB}.orders", "not captured")
    # ... and ignored by the other's
    assert cases["A names B's table"].lines(B, f"keyed for source {A!r}, not {B!r}")
    assert cases["B names A's tables"].lines(A, f"keyed for source {B!r}, not {A!r}")
    unknown = cases["no such source"]
    said = unknown.lines(A, f"no source of this deployment is named {UNKNOWN_KEY!r}")
    said += unknown.lines(B, f"no source of this deployment is named {UNKNOWN_KEY!r}")
    assert len(said) == 1, unknown.logged
    # the valid signal: one run, of B's snapshot asset of B's table, run to the end
    valid = cases["valid for B"]
    assert valid.requested[A] == []
    [request] = valid.requested[B]
    assert request.asset_selection == [dg.AssetKey([B, "snapshot", B_DB, "composite"])]
    assert sources_run.snapshot_run == "success", sources_run.snapshot_run
    # the landing zone: snapshot requests only under B, of B's table
    assert sources_run.requested == {A: [], B: [(B_DB, "composite")]}, sources_run.requested

