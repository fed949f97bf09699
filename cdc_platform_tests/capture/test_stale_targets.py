"""DDL that changes rows without row events, on the real server: the engine marks the target
stale, the target really is stale (reconcile fails), and a snapshot that opens after the DDL
makes it exact again (reconcile passes, the marker is resolved). Then the same through Dagster:
target metadata, the not_stale check, the re-snapshot sensor and the snapshot asset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dagster as dg
import pytest

from cdc_platform.capture.ddl.stale_markers import read_markers, resolve_markers, target_staleness
from cdc_platform_tests.capture.snapshot.reading.live_engine import (
    finish_and_reconcile,
    snapshot_reader,
    streaming,
)
from cdc_platform_tests.conftest import CdcEnv

_COLUMNS = "id INT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10,2), made DATETIME(6)"
_PARTITIONED = (f"CREATE TABLE {{table}} ({_COLUMNS}) PARTITION BY RANGE (id) "
                "(PARTITION p_low VALUES LESS THAN (25), PARTITION p_high VALUES LESS THAN "
                "MAXVALUE)")
_ROWS = ("INSERT INTO {table} SELECT seq, CONCAT('n', seq), seq / 4, "
         "'2025-01-02 03:04:05.678901' + INTERVAL seq SECOND FROM {rows}")


@dataclass(frozen=True)
class Case:
    ddl: str
    stale: dict[str, bool]  # table -> gone
    snapshot: tuple[str, ...]  # tables to re-snapshot, then reconcile
    partitioned: tuple[str, ...] = ()  # tables created partitioned (others plain)
    tables: tuple[str, ...] = ("items",)
    rows: tuple[str, ...] = ("seq_1_to_40",)  # ids of each table's rows
    verb: str = ""  # the markers' verb, when not the statement's first word

    @property
    def marker_verb(self) -> str:
        return self.verb or self.ddl.split()[0]


CASES = {
    "truncate": Case("TRUNCATE TABLE items", {"items": False}, ("items",)),
    "rename-table": Case("RENAME TABLE items TO renamed", {"items": True, "renamed": False},
                         ("renamed",)),
    "drop-partition": Case("ALTER TABLE items DROP PARTITION p_low", {"items": False},
                           ("items",), partitioned=("items",)),
    "exchange-partition": Case("ALTER TABLE parted EXCHANGE PARTITION p_low WITH TABLE items",
                               {"items": False, "parted": False}, ("items", "parted"),
                               partitioned=("parted",), tables=("items", "parted"),
                               # (items' rows must fit p_low to be exchanged with it)
                               rows=("seq_1_to_20", "seq_21_to_60")),
    "add-column-default": Case("ALTER TABLE items ADD COLUMN note VARCHAR(10) DEFAULT 'new'",
                               {"items": False}, ("items",)),
    "add-column-not-null": Case("ALTER TABLE items ADD COLUMN flag INT NOT NULL",
                                {"items": False}, ("items",)),
    "add-generated-column": Case("ALTER TABLE items ADD COLUMN twice DECIMAL(12,2) "
                                 "AS (price * 2) STORED", {"items": False}, ("items",)),
    # (A RENAME COLUMN marks nothing: the lake renames the column, test_column_renames.py;
    # a CHANGE to a new name and definition is marked and re-snapshotted there too.)
    "modify-temporal": Case("ALTER TABLE items MODIFY made DATETIME", {"items": False},
                            ("items",)),
    # DDL behind the prefixes DBAs, online schema tools, dump and migration tools write.
    "set-statement-truncate": Case("SET STATEMENT lock_wait_timeout=5 FOR TRUNCATE TABLE items",
                                   {"items": False}, ("items",), verb="TRUNCATE"),
    "set-statement-add-column": Case("SET STATEMENT max_statement_time=60 FOR ALTER TABLE items "
                                     "ADD COLUMN z INT NOT NULL DEFAULT 5", {"items": False},
                                     ("items",), verb="ALTER"),
    "executable-comment-truncate": Case("/*!100100 TRUNCATE TABLE items */", {"items": False},
                                        ("items",), verb="TRUNCATE"),
}


def _create(env: CdcEnv, case: Case) -> None:
    for table, rows in zip(case.tables, case.rows, strict=True):
        create = _PARTITIONED if table in case.partitioned else (
            f"CREATE TABLE {{table}} ({_COLUMNS})")
        env.execute(create.format(table=table))
        env.execute(_ROWS.format(table=table, rows=rows))


def _staleness(env: CdcEnv, table: str, consumed_pos: int | None) -> str | None:
    return target_staleness(resolve_markers(env.landing), f"{env.db}.{table}", consumed_pos)


@pytest.mark.parametrize("name", list(CASES))
def test_ddl_marks_the_target_stale_and_a_snapshot_makes_it_exact(cdc_env: CdcEnv, spark: Any,
                                                                  name: str) -> None:
    env, case = cdc_env, CASES[name]
    _create(env, case)
    env.catch_up()
    for table in case.tables:
        env.materialise(spark, table)
        assert env.reconcile(spark, table).ok
    env.query(case.ddl)  # (autocommit: an exchange in a transaction waits for its own lock)
    if name == "add-column-default":  # a row event after the DDL: new rows are fine
        env.execute("UPDATE items SET price = price + 1 WHERE id = 1")
    env.catch_up()

    markers = read_markers(env.landing)
    assert {m.table: m.gone for m in markers} == case.stale, markers
    assert all(m.verb == case.marker_verb and m.gtid and m.position > 1 for m in markers)
    if name == "rename-table":
        [gone] = [m for m in markers if m.gone]
        assert f"renamed to {env.db}.renamed; the source table is gone" in gone.reason
    for table in case.snapshot:
        result = env.materialise(spark, table)
        assert _staleness(env, table, result.consumed_pos) is not None
        assert not env.reconcile(spark, table).ok  # the target really is stale

    with streaming(env):
        for table in case.snapshot:
            assert snapshot_reader(env, table, chunk_size=16).run().status == "done"
    finish_and_reconcile(env, spark, *case.snapshot)
    for table in case.snapshot:
        assert all(m.resolved for m in resolve_markers(env.landing) if m.table == table)
        result = env.materialise(spark, table)
        assert _staleness(env, table, result.consumed_pos) is None
    if name == "rename-table":  # the old name's target keeps its rows, and says why
        reason = _staleness(env, "items", None) or ""
        assert "the source table is gone" in reason and "drop the lake table" in reason


def test_dagster_shows_the_stale_target_and_the_sensor_re_snapshots_it(cdc_env: CdcEnv,
                                                                      spark: Any) -> None:
    from cdc_platform.definitions import build_definitions
    from cdc_platform.defs.snapshots.sensors import sensor_name

    env = cdc_env
    env.execute(f"CREATE TABLE items ({_COLUMNS})")
    env.execute(_ROWS.format(table="items", rows="seq_1_to_40"))
    env.catch_up()
    env.query("TRUNCATE TABLE items")
    env.execute("INSERT INTO items VALUES (1000, 'after', 1, NULL)")
    env.catch_up()
    defs = build_definitions(env.settings)
    target = dg.AssetKey([env.server_name, env.db, "items"])
    snapshot = dg.AssetKey([env.server_name, "snapshot", env.db, "items"])
    sensor = defs.resolve_sensor_def(sensor_name(env.settings))

    def tick(instance: dg.DagsterInstance) -> Any:
        with dg.build_sensor_context(instance=instance, definitions=defs) as context:
            return sensor.evaluate_tick(context)

    def materialise_targets(instance: dg.DagsterInstance) -> tuple[dict[str, Any], Any]:
        result = defs.resolve_job_def("materialise_targets").execute_in_process(
            instance=instance, raise_on_error=False)
        event = instance.get_latest_materialization_event(target).asset_materialization
        [check] = [c for c in result.get_asset_check_evaluations()
                   if c.check_name == "not_stale"]
        return {k: v.value for k, v in event.metadata.items()}, check

    with dg.instance_for_test() as instance:
        metadata, check = materialise_targets(instance)
        assert metadata["stale"] is True and "TRUNCATE" in metadata["stale_reason"]
        assert not check.passed and "TRUNCATE" in (check.description or "")

        [request] = tick(instance).run_requests
        assert request.asset_selection == [snapshot]
        assert request.run_key.startswith(f"resnapshot:{env.db}.items:")
        assert [r.run_key for r in tick(instance).run_requests] == [request.run_key]

        with streaming(env):
            job = defs.resolve_implicit_global_asset_job_def()
            run = job.execute_in_process(instance=instance, asset_selection=[snapshot],
                                         tags=request.tags)
            assert run.success
        assert tick(instance).run_requests == []  # resolved: nothing more to request
        env.catch_up()
        metadata, check = materialise_targets(instance)
        assert metadata["stale"] is False and check.passed
        assert env.reconcile(spark, "items").ok
        assert read_markers(env.landing) == []  # applied by the target: forgotten


@pytest.mark.cdc_config(capture={"resnapshot_on_ddl": False, "snapshot_mode": "never"})
def test_without_resnapshot_on_ddl_there_is_no_sensor(cdc_env: CdcEnv) -> None:
    from cdc_platform.definitions import build_definitions
    from cdc_platform.defs.snapshots.sensors import sensor_name

    cdc_env.execute("CREATE TABLE items (id INT PRIMARY KEY)")
    defs = build_definitions(cdc_env.settings)
    with pytest.raises(Exception, match="sensor"):
        defs.resolve_sensor_def(sensor_name(cdc_env.settings))


def test_statements_beside_table_ddl_mark_what_they_may_change(cdc_env: CdcEnv) -> None:
    """On the real server: statements that change no rows mark nothing; a statement the
    platform cannot classify marks the captured tables it names (REPAIR TABLE may drop rows
    it cannot read); a dropped database marks every captured table of it as gone."""
    env = cdc_env
    env.execute(f"CREATE TABLE a ({_COLUMNS})", f"CREATE TABLE b ({_COLUMNS})")
    env.execute(_ROWS.format(table="a", rows="seq_1_to_5"),
                _ROWS.format(table="b", rows="seq_1_to_5"))
    env.query("SET STATEMENT max_statement_time=60 FOR CREATE VIEW v AS SELECT * FROM a")
    env.query("/*!100100 CREATE INDEX i ON a (name) */")
    env.catch_up()
    assert read_markers(env.landing) == []

    env.query("SET STATEMENT lock_wait_timeout=5 FOR REPAIR TABLE a")
    env.catch_up()
    assert [(m.table, m.verb, m.gone) for m in read_markers(env.landing)] == [
        ("a", "REPAIR", False)]

    env.mariadb.query(f"/*!40000 DROP DATABASE `{env.db}` */")
    env.catch_up()
    dropped = [m for m in read_markers(env.landing) if m.verb == "DROP DATABASE"]
    assert {m.table: m.gone for m in dropped} == {"a": True, "b": True}
    assert all(m.gtid and "the source table is gone" in m.reason for m in dropped)


def test_a_dropped_column_leaves_the_target_with_no_later_change(cdc_env: CdcEnv,
                                                                 spark: Any) -> None:
    """ALTER TABLE .. DROP COLUMN changes no remaining value, so it marks nothing: the target
    drops the column at its next materialisation, even when no row of the table changed
    after the DROP (older Iceberg snapshots keep the column's values)."""
    env = cdc_env
    _create(env, Case("", {}, ()))
    env.catch_up()
    env.materialise(spark, "items")
    before = env.target(spark, "items").current()
    assert before is not None and "name" in env.target(spark, "items").read().columns
    env.query("ALTER TABLE items DROP COLUMN name")
    env.catch_up()
    assert read_markers(env.landing) == []
    env.materialise(spark, "items")
    target = env.target(spark, "items")
    assert target.read().columns == ["id", "price", "made"]
    assert env.reconcile(spark, "items").ok
    assert "name" in target.read(snapshot_id=before.snapshot_id).columns
    env.execute("UPDATE items SET price = price + 1 WHERE id = 1")
    env.catch_up()
    env.materialise(spark, "items")
    assert env.reconcile(spark, "items").ok
