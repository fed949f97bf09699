"""One code location, two sources: two real MariaDB servers, one landing zone, one warehouse.

Both servers hold a database of the same name with a table of the same name but different
rows, so anything that acted on the wrong source would show in the other's target.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from cdc_platform.capture.snapshot.protocol import read_request
from cdc_platform.config import Settings, parse_settings
from cdc_platform.definitions import build_definitions
from cdc_platform.devservices.mariadb import MariaDBServer
from cdc_platform_tests.conftest import CdcEnv
from cdc_platform_tests.defs.signal_sensors import SignalSensors
from cdc_platform_tests.defs.test_snapshot_assets import streaming

B_PASSWORD_ENV = "CDC_TEST_SOURCE_B_PASSWORD"


@pytest.fixture(scope="module")
def second_mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    server = MariaDBServer(base_dir=tmp_path_factory.mktemp("mariadb_b"), server_id=2,
                           cdc_password="cdc-b")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pair(cdc_env: CdcEnv, second_mariadb: MariaDBServer,
         monkeypatch: pytest.MonkeyPatch) -> tuple[CdcEnv, CdcEnv]:
    """Source A on the session's server, source B on the second one: the same database name,
    the landing zone and warehouse shared, a password variable each."""
    a = cdc_env
    monkeypatch.setenv(B_PASSWORD_ENV, second_mariadb.cdc_password)
    position = second_mariadb.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or ""
    second_mariadb.query(f"CREATE DATABASE IF NOT EXISTS `{a.db}`")
    b = CdcEnv(second_mariadb, a.db, f"{a.server_name}b", a.root,
               {"source": {"password_env": B_PASSWORD_ENV}})
    b.start_position = position
    b.kafka_bootstrap = a.kafka_bootstrap
    return a, b


def two_sources(a: CdcEnv, b: CdcEnv) -> Settings:
    """The config of a deployment capturing both (``sources:``), shared sections from A's."""
    data = a.settings_dict()
    sources = []
    for env in (a, b):
        one = env.settings_dict()
        sources.append({**one["source"], "capture": one["capture"]})
    del data["source"], data["capture"]
    return parse_settings({**data, "sources": sources}, "two-source test config")


def _seed(env: CdcEnv, rows: int) -> None:
    env.execute("CREATE TABLE items (id INT PRIMARY KEY, owner VARCHAR(20))")
    # Rows only a snapshot can bring (not in the binlog), then rows the stream brings.
    env.execute("SET SESSION sql_log_bin = 0",
                f"INSERT INTO items SELECT seq, '{env.server_name}' FROM seq_1_to_{rows}")


def _unused_port() -> int:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        return unused.getsockname()[1]


def test_one_code_location_serves_both_sources_and_one_unreachable(
        pair: tuple[CdcEnv, CdcEnv]) -> None:
    a, b = pair
    _seed(a, 5)
    _seed(b, 7)
    b.execute("CREATE TABLE only_b (id INT PRIMARY KEY)")
    defs = build_definitions(two_sources(a, b))
    graph = defs.resolve_asset_graph()
    for env in (a, b):
        server = env.server_name
        target = dg.AssetKey([server, env.db, "items"])
        assert graph.get(target).group_name.startswith(f"{server}_")
        assert graph.has(dg.AssetKey([server, "snapshot", env.db, "items"]))
        for job in ("stream_changes", "materialise_targets", "catch_up_and_reconcile",
                    "apply_changes", "lake_maintenance"):
            defs.resolve_job_def(f"{server}_{job}")
        defs.resolve_sensor_def(f"{server}_snapshot_signals")
    assert graph.has(dg.AssetKey([b.server_name, b.db, "only_b"]))
    assert not graph.has(dg.AssetKey([a.server_name, a.db, "only_b"]))

    b.catch_up()  # B's landing zone records its tables
    b.overrides["source"]["port"] = _unused_port()
    defs = build_definitions(two_sources(a, b))
    graph = defs.resolve_asset_graph()
    assert graph.has(dg.AssetKey([a.server_name, a.db, "items"]))
    assert graph.has(dg.AssetKey([b.server_name, b.db, "only_b"]))  # from the landing zone
    problem = defs.resolve_sensor_def(f"{b.server_name}_load_problem")
    assert "unreachable" in (problem.description or "")
    assert "\n" not in (problem.description or "")
    with pytest.raises(Exception, match="load_problem"):
        defs.resolve_sensor_def(f"{a.server_name}_load_problem")


def test_each_source_lands_its_own_targets_equal_to_its_own_source(
        pair: tuple[CdcEnv, CdcEnv], spark: Any) -> None:
    a, b = pair
    _seed(a, 150)
    _seed(b, 90)
    settings = two_sources(a, b)
    defs = build_definitions(settings)
    with dg.instance_for_test() as instance:
        with ExitStack() as stack:
            for env in (a, b):
                stack.enter_context(streaming(env))
            for env in (a, b):
                asset = defs.resolve_assets_def(
                    dg.AssetKey([env.server_name, "snapshot", env.db, "items"]))
                result = dg.materialize([asset], instance=instance, run_config={
                    "ops": {asset.op.name: {"config": {"chunk_size": 40}}}})
                assert result.success
                env.execute(f"UPDATE items SET owner = 'streamed {env.server_name}' "
                            "WHERE id % 10 = 0")
                env.execute("DELETE FROM items WHERE id = 3")
        for env in (a, b):
            job = defs.resolve_job_def(f"{env.server_name}_catch_up_and_reconcile")
            result = job.execute_in_process(instance=instance)
            assert result.success
            checks = [e for e in result.get_asset_check_evaluations()
                      if e.check_name == "reconcile"]
            assert checks and all(c.passed for c in checks)
    for env, rows in ((a, 150), (b, 90)):
        expected = [{"id": i, "owner": f"streamed {env.server_name}" if i % 10 == 0
                     else env.server_name} for i in range(1, rows + 1) if i != 3]
        assert env.target_rows(spark, "items") == expected


def test_a_signal_keyed_for_one_source_never_acts_on_the_other(
        signal_env: CdcEnv, pair: tuple[CdcEnv, CdcEnv],
        capfd: pytest.CaptureFixture[str]) -> None:
    from cdc_platform_tests.defs.test_signal_sensor import execute, send

    a, b = pair  # (signals: the test's own topic on the shared broker, keyed per source)
    b.kafka_bootstrap = signal_env.kafka_bootstrap
    _seed(a, 3)
    _seed(b, 3)
    settings = two_sources(a, b)
    tick = SignalSensors(build_definitions(settings), settings)

    with dg.instance_for_test() as instance:
        tick(instance)  # creates the topic
        send(a, execute(a, "items"))  # keyed for A; B has a table of the same name
        send(b, {"type": "stop-snapshot", "data": {"data-collections": [f"{b.db}.items"]}})
        send(a, execute(a, "items"), key="nosuch")
        capfd.readouterr()
        requested = tick(instance)
        logged = capfd.readouterr().err  # (a sensor's log goes to the console and the instance)
        [request] = requested[a.server_name]
        assert request.asset_selection == [
            dg.AssetKey([a.server_name, "snapshot", a.db, "items"])]
        assert requested[b.server_name] == []
        # B's stop acted on B's table only: A's request.json is untouched.
        assert read_request(a.landing, a.db, "items") is None
        assert read_request(b.landing, b.db, "items") is not None
        assert "no source of this deployment is named 'nosuch'" in logged


def test_a_source_that_cannot_be_wired_leaves_the_others_loaded(
        pair: tuple[CdcEnv, CdcEnv], tmp_path: Path) -> None:
    a, b = pair
    _seed(a, 1)
    _seed(b, 1)
    b.catch_up()
    (tmp_path / "landing" / b.server_name / "tables.json").write_text("{not json")
    defs = build_definitions(two_sources(a, b))
    assert defs.resolve_asset_graph().has(dg.AssetKey([a.server_name, a.db, "items"]))
    problem = defs.resolve_sensor_def(f"{b.server_name}_load_problem")
    assert (problem.description or "").startswith(f"source {b.server_name!r}: not loaded: ")


@pytest.mark.parametrize("first_source", ["unreachable", "not loaded"])
def test_a_signal_keyed_for_no_source_is_rejected_once_whichever_sources_load(
        signal_env: CdcEnv, pair: tuple[CdcEnv, CdcEnv], first_source: str) -> None:
    """The rejection is said by the first source whose sensor loaded: with the first source
    unreachable (its sensor loads from the landing zone) and with it not loaded at all. So is
    that of a message with no key at all (addressed to no source: once, not by each)."""
    from cdc_platform_tests.defs.test_signal_sensor import execute, send

    a, b = pair
    b.kafka_bootstrap = signal_env.kafka_bootstrap
    _seed(a, 1)
    _seed(b, 1)
    a.catch_up()
    if first_source == "unreachable":
        a.overrides.setdefault("source", {})["port"] = _unused_port()
    else:
        (a.root / "landing" / a.server_name / "tables.json").write_text("{not json")
    settings = two_sources(a, b)
    tick = SignalSensors(build_definitions(settings), settings)
    assert (a.server_name in tick.sensors) == (first_source == "unreachable")
    assert b.server_name in tick.sensors
    with dg.instance_for_test() as instance:
        tick(instance)  # creates the topic
        send(b, execute(b, "items"), key="nosuch")
        send(b, execute(b, "items"), key=None)
        requested = tick(instance)
    assert not any(requested.values())
    for rejection in ("no source of this deployment is named 'nosuch'", "no message key"):
        said = [line for lines in tick.logged.values() for line in lines
                if rejection in line and line.startswith("WARNING")]
        assert len(said) == 1, tick.logged


def _per_source_names(defs: dg.Definitions) -> dict[str, list[str]]:
    """Every name two sources' definitions could collide on, by kind."""
    repository = defs.get_repository_def()
    graph = defs.resolve_asset_graph()
    return {
        "job": [job.name for job in repository.get_all_jobs()
                if not job.name.startswith("__ASSET_JOB")],
        "sensor": [sensor.name for sensor in repository.sensor_defs],
        "schedule": [schedule.name for schedule in repository.schedule_defs],
        "resource": [key for key in defs.resources or {} if key != "pyspark"],
        "op": [node.name for node in
               repository.get_implicit_global_asset_job_def().nodes_in_topological_order],
        "asset": ["/".join(key.path) for key in graph.get_all_asset_keys()],
    }


def test_two_sources_with_the_same_inventory_tables_each_get_their_own_dbt_models(
        pair: tuple[CdcEnv, CdcEnv]) -> None:
    """Two shards of one schema (both capture the inventory tables of a database of the same
    name): each source's dbt models load under its own server, with their own job, resource,
    manifest and lineage to its own targets; neither shows a load problem. Every job, sensor,
    schedule, resource, op and asset of the location names the one source it belongs to."""
    from dagster_dbt.asset_utils import get_manifest_and_translator_from_dbt_assets

    from cdc_platform.defs.dbt import definitions as dbt_defs
    from cdc_platform.demo.inventory import create_schema

    a, b = pair
    for env in (a, b):
        with env.mariadb.root_connect() as conn:
            create_schema(conn, env.db)
    defs = build_definitions(two_sources(a, b))
    graph = defs.resolve_asset_graph()
    for env, other in ((a, b), (b, a)):
        server = env.server_name
        with pytest.raises(Exception, match="load_problem"):
            defs.resolve_sensor_def(f"{server}_load_problem")
        model = dg.AssetKey([server, "analytics", "customer_order_totals"])
        assert graph.get(model).group_name == f"{server}_analytics"
        upstream = graph.get(model).parent_keys
        assert dg.AssetKey([server, env.db, "customers"]) in upstream
        assert not any(key.path[0] == other.server_name for key in upstream)
        job = defs.resolve_job_def(f"{server}_{dbt_defs.JOB_NAME}")
        assert {key.path[0] for key in job.asset_layer.executable_asset_keys} == {server}
        # dbt reads this source's own lake tables and writes its own models' namespace.
        manifest = get_manifest_and_translator_from_dbt_assets(
            [defs.resolve_assets_def(model)])[0]
        assert {source["schema"] for source in manifest["sources"].values()} == {
            f"{server}_{env.db}"}
        assert {node["schema"] for node in manifest["nodes"].values()
                if node["resource_type"] == "model"} == {f"{server}_analytics"}

    servers = (a.server_name, b.server_name)
    for kind, names in _per_source_names(defs).items():
        for name in names:
            owners = [s for s in servers
                      if s in name.split("__") or name.startswith((f"{s}_", f"{s}/"))]
            assert len(owners) == 1, f"{kind} {name!r} does not name its one source"


def test_a_stop_keyed_for_one_source_cancels_only_its_own_queued_snapshot_runs(
        signal_env: CdcEnv, pair: tuple[CdcEnv, CdcEnv]) -> None:
    """Both sources have a snapshot run of ``items`` (same database and table names) queued
    behind the run coordinator; a stop-snapshot keyed for A cancels A's, B's stays queued
    until a stop keyed for B (for every table: its queued run counts as pending)."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteRepositoryOrigin
    from dagster._core.run_coordinator import SubmitRunContext
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    from cdc_platform_tests.defs.test_signal_sensor import execute, send

    a, b = pair
    b.kafka_bootstrap = signal_env.kafka_bootstrap
    _seed(a, 1)
    _seed(b, 1)
    settings = two_sources(a, b)
    defs = build_definitions(settings)
    tick = SignalSensors(defs, settings)
    job = defs.resolve_implicit_global_asset_job_def()
    origin = RemoteRepositoryOrigin(InProcessCodeLocationOrigin(LoadableTargetOrigin(
        module_name="cdc_platform.definitions", attribute="defs")), "__repository__",
    ).get_job_origin(job.name)  # (a queued run names the code location the daemon loads)
    with dg.instance_for_test(overrides={"run_coordinator": {
            "module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"}},
                              ) as instance:
        tick(instance)  # creates the topic
        send(a, execute(a, "items"))
        send(b, execute(b, "items"))
        queued = {}
        for server, [request] in tick(instance).items():
            # As the daemon does with a run request: create the run, submit it (queued).
            run = instance.create_run_for_job(
                job, run_config=request.run_config, tags=request.tags,
                asset_selection=frozenset(request.asset_selection), remote_job_origin=origin)
            submitted = instance.run_coordinator.submit_run(SubmitRunContext(run, None))
            assert submitted.status == dg.DagsterRunStatus.QUEUED
            queued[server] = run.run_id

        def status(env: CdcEnv) -> dg.DagsterRunStatus:
            return instance.get_run_by_id(queued[env.server_name]).status

        send(a, {"type": "stop-snapshot", "data": {"data-collections": [f"{a.db}.items"]}})
        assert tick(instance) == {a.server_name: [], b.server_name: []}
        assert status(a) == dg.DagsterRunStatus.CANCELED
        assert status(b) == dg.DagsterRunStatus.QUEUED
        assert any("cancelled queued snapshot run" in line for line in tick.logged[a.server_name])

        send(b, {"type": "stop-snapshot"})
        tick(instance)
        assert status(b) == dg.DagsterRunStatus.CANCELED


def test_sources_whose_definitions_clash_leave_the_first_loaded_and_say_why(
        pair: tuple[CdcEnv, CdcEnv], monkeypatch: pytest.MonkeyPatch) -> None:
    """Should two sources' definitions ever clash (a name their server does not scope, as the
    dbt resource key once was), the first loads and the second is a load problem naming the
    clash; the code location still loads."""
    from cdc_platform.defs.dbt import definitions as dbt_defs
    from cdc_platform.demo.inventory import create_schema

    a, b = pair
    for env in (a, b):
        with env.mariadb.root_connect() as conn:
            create_schema(conn, env.db)
    monkeypatch.setattr(dbt_defs, "scoped_name", lambda _settings, name: name)
    defs = build_definitions(two_sources(a, b))
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    assert graph.has(dg.AssetKey([a.server_name, "analytics", "customer_order_totals"]))
    assert not graph.has(dg.AssetKey([b.server_name, "analytics", "customer_order_totals"]))
    problem = defs.resolve_sensor_def(f"{b.server_name}_load_problem")
    assert "clash with another source's" in (problem.description or "")
    assert "dbt" in (problem.description or "")
    with pytest.raises(Exception, match="load_problem"):
        defs.resolve_sensor_def(f"{a.server_name}_load_problem")
