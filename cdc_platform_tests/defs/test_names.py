"""Any legal MySQL identifier as a database, table or column name, end to end.

On the real MariaDB, the real capture engine, Dagster and Spark: the code location loads, op
names are valid and distinct, asset keys keep the real names, the landing zone and warehouse
stay inside their directories, and every table materialises and reconciles.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

import cdc_platform
from cdc_platform.capture.names import table_id
from cdc_platform.capture.source import quote_identifier as q
from cdc_platform.definitions import build_definitions
from cdc_platform.lake.iceberg.catalog import namespace_name
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.table import LakeTable
from cdc_platform.lake.merge import materialise
from cdc_platform_tests.conftest import CdcEnv

# Table names that broke loading, paths or ids, and pairs whose slugs or paths could collide.
TABLES = ["ünï", "order-items", "2024 sales", "a.b", "we`ird", "select", "a-b", "a_b", "A", "a",
          "a/b", "..", ".hidden", "_hidden", "100%", "x*?[1]{2}", "c:d", "t_reconcile", "t"]


def _files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_definitions_load_and_every_awkward_table_materialises(cdc_env, spark):
    env = cdc_env
    for name in TABLES:
        env.execute(f"CREATE TABLE {q(name)} (id INT PRIMARY KEY, v VARCHAR(40))")
        env.execute(f"INSERT INTO {q(name).replace('%', '%%')} VALUES (1, %s), (2, 'two')",
                    args=(name,))
    env.catch_up()
    defs = build_definitions(env.settings)
    dg.Definitions.validate_loadable(defs)
    repository = defs.get_repository_def()
    ops = [node.name for job in repository.get_all_jobs() for node in job.graph.node_defs]
    assert all(re.fullmatch(r"[A-Za-z0-9_]+", name) for name in ops)
    for name in TABLES:  # asset keys and the UI keep the real names
        target = dg.AssetKey([env.server_name, env.db, name])
        snapshot = dg.AssetKey([env.server_name, "snapshot", env.db, name])
        assert target in defs.resolve_assets_def(target).keys
        assert snapshot in defs.resolve_assets_def(snapshot).keys
    # One op materialises and checks the source's targets, one snapshots its tables.
    op_names = {defs.resolve_assets_def(dg.AssetKey([env.server_name, env.db, n])).op.name
                for n in TABLES}
    snapshot_ops = {defs.resolve_assets_def(dg.AssetKey(
        [env.server_name, "snapshot", env.db, n])).op.name for n in TABLES}
    assert len(op_names) == len(snapshot_ops) == 1 and op_names != snapshot_ops

    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("materialise_targets").execute_in_process(
            instance=instance)
        assert result.success
        checks = result.get_asset_check_evaluations()
        for check_name in ("reconcile", "not_stale"):
            assert sorted(c.asset_key.path[-1] for c in checks
                          if c.check_name == check_name) == sorted(TABLES)
        assert all(c.passed for c in checks)
    for name in TABLES:
        rows = env.target_rows(spark, name)
        assert [(r["id"], r["v"]) for r in rows] == [(1, name), (2, "two")]
        target = env.target(spark, name)  # found by its real names in the catalog
        assert (target.property("cdc.source-database"), target.property("cdc.source-table")) \
            == (env.db, name)
    assert env.target(spark, "ünï").name == "ünï"  # the Hadoop catalog keeps Unicode names
    # Nothing escaped the landing zone or the warehouse; one directory per table.
    assert {p.name for p in env.root.iterdir()} >= {"landing", "warehouse"}
    landing = env.landing.root / "changelog" / env.db
    assert len(list(landing.iterdir())) == len(TABLES)
    assert all(p.parent.parent == landing for p in _files_under(landing))
    # The Iceberg (Hadoop catalog) layout: <warehouse>/<server>_<db>/<table>/{metadata,data}.
    warehouse = env.root / "warehouse" / namespace_name(env.server_name, env.db)
    assert len(list(warehouse.iterdir())) == len(TABLES)
    assert all((table / "metadata").is_dir() for table in warehouse.iterdir())


DAGSTER = str(Path(sys.executable).with_name("dagster"))
AWKWARD_DB = "we.ird-db ü"
AWKWARD_TABLE = "order/items ..`x`"
COLUMNS = ["id.part", "na`me", "with space", "select", "ü"]


def _awkward_settings(env: CdcEnv) -> None:
    env.overrides["capture"] = {"tables": {"include": [
        re.escape(table_id(AWKWARD_DB, AWKWARD_TABLE)), rf"{env.db}\..*"]}}


@pytest.fixture
def awkward_db(cdc_env: CdcEnv):
    with cdc_env.mariadb.root_connect() as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {q(AWKWARD_DB)}")
        cur.execute(f"CREATE DATABASE {q(AWKWARD_DB)}")
    try:
        yield AWKWARD_DB
    finally:
        with cdc_env.mariadb.root_connect() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {q(AWKWARD_DB)}")


def _source(env: CdcEnv, *statements: str) -> None:
    with env.mariadb.root_connect(database=AWKWARD_DB, autocommit=False) as conn:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
        conn.commit()


def test_awkward_database_table_and_column_names_stream_materialise_and_reconcile(
        cdc_env, awkward_db, spark):
    env = cdc_env
    _awkward_settings(env)
    table = f"{q(AWKWARD_DB)}.{q(AWKWARD_TABLE)}"
    id_col, name_col, space_col, reserved_col, unicode_col = (q(c) for c in COLUMNS)
    _source(env, f"CREATE TABLE {table} ({id_col} INT, {name_col} VARCHAR(20), "
                 f"{space_col} INT, {reserved_col} DATE, {unicode_col} VARCHAR(5), "
                 f"PRIMARY KEY ({id_col}, {name_col}))")
    _source(env, *[f"INSERT INTO {table} VALUES ({i}, 'n{i}', {i * 10}, '2025-01-0{i}', 'ü{i}')"
                   for i in range(1, 6)])
    _source(env, f"UPDATE {table} SET {space_col} = -1 WHERE {id_col} = 2",
            f"DELETE FROM {table} WHERE {id_col} = 3")
    stats = env.catch_up()
    assert stats.records_by_table[table_id(AWKWARD_DB, AWKWARD_TABLE)] == 5 + 1 + 1

    tables = env.landing.read_tables()
    schema = tables[table_id(AWKWARD_DB, AWKWARD_TABLE)]
    assert (schema.database, schema.table, schema.column_names) == (
        AWKWARD_DB, AWKWARD_TABLE, tuple(COLUMNS))
    segments = env.landing.segments(AWKWARD_DB, AWKWARD_TABLE)
    assert segments and all(
        path.parent == env.landing.table_dir(AWKWARD_DB, AWKWARD_TABLE) for _, _, path in segments)
    assert env.landing.table_dir(AWKWARD_DB, AWKWARD_TABLE).parent.parent == (
        env.landing.root / "changelog")

    s = env.settings
    result = materialise(spark, s.landing_zone.url, s.warehouse.url, env.server_name, None,
                         AWKWARD_DB, AWKWARD_TABLE)
    assert result.rows == 4
    target = LakeTable(Lake.from_settings(spark, s), env.server_name, AWKWARD_DB, AWKWARD_TABLE)
    rows = sorted((r.asDict() for r in target.read().collect()), key=lambda r: r["id.part"])
    assert [(r["id.part"], r["na`me"], r["with space"], r["ü"]) for r in rows] == [
        (1, "n1", 10, "ü1"), (2, "n2", -1, "ü2"), (4, "n4", 40, "ü4"), (5, "n5", 50, "ü5")]

    check = _reconcile(env, spark)
    assert (check.missing, check.extra, check.different) == (0, 0, 0)
    assert check.source_rows == check.target_rows == 4
    # A change the stream never sees is found: the check compares these columns for real.
    _source(env, "SET SESSION sql_log_bin = 0",
            f"UPDATE {table} SET {reserved_col} = '2030-01-01' WHERE {id_col} = 4")
    assert _reconcile(env, spark).different == 1


def _reconcile(env: CdcEnv, spark):
    from cdc_platform.capture import source as source_sql
    from cdc_platform.capture.source import selector_from_settings
    from cdc_platform.lake.reconcile import reconcile_table

    s = env.settings
    connection = s.source.connection_settings()
    with source_sql.source_connection(connection) as conn:
        schema = source_sql.read_table_schema(conn, AWKWARD_DB, AWKWARD_TABLE)
    schema = selector_from_settings(s).shape(schema)
    target = LakeTable(Lake.from_settings(spark, s), env.server_name, AWKWARD_DB, AWKWARD_TABLE)
    return reconcile_table(spark, target.read(), connection, schema, range_rows=2)


def test_materialise_targets_runs_from_another_directory_without_spark_variables(
        cdc_env, awkward_db, tmp_path, spark):
    """`dagster job execute -m cdc_platform.definitions -j materialise_targets` run by a user
    from outside the checkout, with neither PYSPARK_PYTHON nor PYTHONPATH set: reconcile's
    Python workers import cdc_platform (they ran the system python before)."""
    env = cdc_env
    _awkward_settings(env)
    table = f"{q(AWKWARD_DB)}.{q(AWKWARD_TABLE)}"
    _source(env, f"CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(5))",
            f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
    env.catch_up()
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    environment = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON",
                                                                     "PYTHONPATH")}
    environment |= {"CDC_PLATFORM_CONFIG": str(env.write_config()),
                    "DAGSTER_HOME": str(dagster_home)}
    # The checkout holding this cdc_platform, as an installed package would be importable.
    package_parent = str(Path(cdc_platform.__file__).resolve().parents[1])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [DAGSTER, "job", "execute", "-d", package_parent, "-m", "cdc_platform.definitions",
         "-j", "materialise_targets"],
        cwd=elsewhere, env=environment, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    # A failed or erroring blocking reconcile check fails the run.
    assert "RUN_SUCCESS" in output and "ModuleNotFoundError" not in output
    assert "ASSET_CHECK_EVALUATION" in output, output[-8000:]
    s = env.settings
    current = LakeTable(Lake.from_settings(spark, s), env.server_name, AWKWARD_DB,
                        AWKWARD_TABLE).current()
    assert current is not None and current.rows == 2
    assert os.listdir(elsewhere) == []


def test_snapshot_of_awkward_names_lands_rows_the_binlog_never_saw(cdc_env, awkward_db, spark):
    """Chunk queries, watermarks and snapshot files of a table whose database, table and key
    columns hold dots, slashes, backticks and spaces; keyset continuation over a composite key
    of such columns (chunks of 2 rows)."""
    from cdc_platform_tests.defs.test_snapshot_assets import streaming

    env = cdc_env
    _awkward_settings(env)
    table = f"{q(AWKWARD_DB)}.{q(AWKWARD_TABLE)}"
    id_col, name_col, space_col = (q(c) for c in COLUMNS[:3])
    _source(env, f"CREATE TABLE {table} ({id_col} INT, {name_col} VARCHAR(20), "
                 f"{space_col} INT, PRIMARY KEY ({id_col}, {name_col}))")
    _source(env, "SET SESSION sql_log_bin = 0",
            *[f"INSERT INTO {table} VALUES ({i % 3}, 'k`{i}', {i})" for i in range(7)])
    key = dg.AssetKey([env.server_name, "snapshot", AWKWARD_DB, AWKWARD_TABLE])
    with dg.instance_for_test() as instance, streaming(env):
        asset = build_definitions(env.settings).resolve_assets_def(key)
        result = dg.materialize([asset], instance=instance, run_config={"ops": {
            asset.op.name: {"config": {"chunk_size": 2, "progress_seconds": 0.2}}}})
        assert result.success
        metadata = instance.get_latest_materialization_event(key).asset_materialization.metadata
        assert (metadata["status"].value, metadata["rows"].value) == ("done", 7)
    assert not any(p.is_file() for p in (env.root / "landing").rglob("*")
                   if env.landing.root not in p.parents)
    env.catch_up()
    s = env.settings
    assert materialise(spark, s.landing_zone.url, s.warehouse.url, env.server_name, None,
                       AWKWARD_DB, AWKWARD_TABLE).rows == 7
    check = _reconcile(env, spark)
    assert (check.missing, check.extra, check.different, check.target_rows) == (0, 0, 0, 7)


def test_one_check_definition_for_many_awkward_tables_runs_the_selected_checks() -> None:
    """``subsettable_asset_checks``: one op for a check of every table, names of ours."""
    from cdc_platform.defs.names import subsettable_asset_checks

    keys = [dg.AssetKey(["s", "d b", name]) for name in ("ünï", "2024 sales", "a-b")]

    @subsettable_asset_checks("fresh__s", [dg.AssetCheckSpec("fresh", asset=k) for k in keys])
    def fresh(context):  # type: ignore[no-untyped-def]  # (an annotation would be a string here)
        for check in context.selected_asset_check_keys:
            yield dg.AssetCheckResult(asset_key=check.asset_key, check_name="fresh",
                                      passed=check.asset_key.path[-1] != "a-b")

    selected = [dg.AssetCheckKey(keys[0], "fresh"), dg.AssetCheckKey(keys[2], "fresh")]
    defs = dg.Definitions(
        assets=[dg.AssetSpec(k) for k in keys], asset_checks=[fresh],
        jobs=[dg.define_asset_job("two", selection=dg.AssetSelection.checks(*selected))])
    dg.Definitions.validate_loadable(defs)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("two").execute_in_process(instance=instance)
    assert sorted((e.asset_key.path[-1], e.passed) for e in result.get_asset_check_evaluations()
                  ) == [("a-b", False), ("ünï", True)]
