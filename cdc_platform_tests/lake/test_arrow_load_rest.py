"""The Spark-free initial load through a REST catalog, against a real SeaweedFS (its S3 and its
Iceberg REST catalog, SigV4-signed), as an S3 deployment has it: the catalog's settings are the
ones Spark's sessions take, translated for pyiceberg (``lake.iceberg.rest``).

What Spark does with such a table afterwards (MERGE into it) is the S3 demo's and
``test_torture_s3``'s: they run the whole platform on SeaweedFS.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog.rest import RestCatalog

from cdc_platform.config import CatalogSettings
from cdc_platform.demo.object_storage import REST_CATALOG_PROPERTIES
from cdc_platform.devservices.seaweedfs import SeaweedFS
from cdc_platform.lake import arrow_load
from cdc_platform.lake.arrow_merge import materialise_without_spark
from cdc_platform.lake.changelog import TableChangelog
from cdc_platform.lake.iceberg.pyiceberg_catalog import lake_catalog
from cdc_platform.lake.iceberg.pyiceberg_schema import iceberg_schema, table_properties
from cdc_platform.lake.iceberg.rest import LakeRestCatalog, pyiceberg_properties
from cdc_platform.lake.iceberg.snapshots import CONSUMED_POS, snapshot_of
from cdc_platform_tests import s3_fixtures
from cdc_platform_tests.lake.helpers import SERVER, Landing, schema
from cdc_platform_tests.lake.test_arrow_load import race_twice

S = schema("orders")


def r(id_: int, name: str = "x") -> dict:
    return {"id": id_, "name": name, "amount": None}


def test_spark_catalog_settings_translate_to_pyiceberg_or_not_at_all() -> None:
    spark_side = {"type": "rest", "uri": "http://catalog:8181", "warehouse": "s3://lake",
                  "cache-enabled": "false", "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
                  "client.region": "eu-west-1", "s3.path-style-access": "true",
                  "s3.endpoint": "http://s3:9000", "rest.auth.type": "sigv4",
                  "rest.signing-name": "s3tables", "rest.signing-region": "eu-west-1",
                  "header.X-Tenant": "a"}
    assert pyiceberg_properties(spark_side) == {
        "uri": "http://catalog:8181", "warehouse": "s3://lake", "s3.region": "eu-west-1",
        "s3.force-virtual-addressing": "false", "s3.endpoint": "http://s3:9000",
        "rest.sigv4-enabled": "true", "rest.signing-name": "s3tables",
        "rest.signing-region": "eu-west-1", "header.X-Tenant": "a"}
    # Anything without a known translation leaves the load to Spark, rather than reaching
    # the catalog as someone else.
    assert pyiceberg_properties({**spark_side, "rest.auth.type": "custom"}) is None
    assert pyiceberg_properties({**spark_side, "client.assume-role.arn": "arn:x"}) is None
    assert pyiceberg_properties({**spark_side, "io-impl": "org.example.MyFileIO"}) is None


seaweedfs, s3_env = s3_fixtures.seaweedfs, s3_fixtures.s3_env


@pytest.fixture
def rest(seaweedfs: SeaweedFS, s3_env: dict[str, str]) -> dict[str, Any]:
    """The deployment's settings for the server (credentials in the environment only)."""
    catalog = CatalogSettings(type="rest", uri=seaweedfs.catalog_uri, properties={
        **REST_CATALOG_PROPERTIES, "rest.signing-region": seaweedfs.region})
    return {"catalog": catalog, "s3": s3_fixtures.s3_options(seaweedfs),
            "warehouse": f"s3://{seaweedfs.table_bucket}",
            "reader": RestCatalog("reader", **seaweedfs.catalog_properties())}


def _server(tmp_path: Path) -> str:
    """A server name of the test's own (the catalog outlives a test: namespaces differ)."""
    return f"{SERVER}_{abs(hash(tmp_path.name)) % 10**8}"


def test_an_initial_load_is_appended_through_the_rest_catalog_without_spark(
        rest: dict[str, Any], tmp_path: Path) -> None:
    server = _server(tmp_path)
    landing = Landing(tmp_path / "landing", server)
    # (a delete of a key the batch does not insert: dropped, as an empty target has none)
    landing.segment(S, [("c", r(i)) for i in range(50)] + [("d", {"id": 70})])
    changelog = TableChangelog.open(landing.url, server, "shop", "orders")
    loaded = materialise_without_spark(changelog, rest["warehouse"], rest["catalog"], server,
                                       rest["s3"])
    assert loaded is not None and loaded.appended and loaded.records == 51
    table = rest["reader"].load_table((f"{server}_shop", "orders"))
    rows = table.scan().to_arrow()
    assert sorted(rows.column("id").to_pylist()) == list(range(50))
    snapshot = table.current_snapshot()
    assert snapshot is not None
    summary = snapshot_of(snapshot).summary
    assert summary[CONSUMED_POS] == "51"
    assert "spark.app.id" not in summary  # (Spark's commits carry their app)
    assert table.properties["cdc.primary-key"] == '["id"]'
    assert table.location().startswith(f"{rest['warehouse']}/")
    # The target has rows now: the next batch is a merge (without Spark: a row delta committed
    # through the catalog), not another append.
    landing.segment(S, [("u", r(1, "later")), ("d", {"id": 2})])
    merged = materialise_without_spark(changelog, rest["warehouse"], rest["catalog"], server,
                                       rest["s3"])
    assert merged is not None and merged.committed and not merged.appended
    assert (merged.updates, merged.deletes, merged.snapshot.rows) == (1, 1, 49)
    assert arrow_load.target_rows(rest["warehouse"], rest["catalog"], server, "shop", "orders",
                                  rest["s3"]) == 49
    table = rest["reader"].load_table((f"{server}_shop", "orders"))
    rows = {row["id"]: row["name"] for row in table.scan().to_arrow().to_pylist()}
    assert len(rows) == 49 and 2 not in rows and rows[1] == "later"
    assert table.current_snapshot().summary["total-position-deletes"] == "2"


def test_two_appenders_racing_through_the_rest_catalog_one_wins(
        rest: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both read the empty target (as Spark creates it: an empty first snapshot) and write
    their files; the service publishes one; the other is ConcurrentCommitError (pyiceberg's
    own retry would append the rows again on top)."""
    server = _server(tmp_path)
    landing = Landing(tmp_path / "landing", server)
    landing.segment(S, [("c", r(i)) for i in range(20)])
    changelog = TableChangelog.open(landing.url, server, "shop", "orders")
    lake = lake_catalog(rest["warehouse"], rest["catalog"], rest["s3"])
    assert isinstance(lake, LakeRestCatalog)
    # (SeaweedFS accepts a second creation of a table, where catalog services refuse it:
    # the race run here is the one on the table's main branch, which it does refuse)
    lake.create_namespace_if_not_exists(f"{server}_shop")
    wanted = iceberg_schema(S)
    empty = lake.create_table((f"{server}_shop", "orders"), wanted,
                              properties=table_properties(server, S, 0))
    empty.append(wanted.as_arrow().empty_table())
    both_ready = threading.Barrier(2, timeout=60)
    real_commit = LakeRestCatalog.commit_table

    def commit_together(self: Any, table: Any, requirements: Any, updates: Any) -> Any:
        both_ready.wait()
        return real_commit(self, table, requirements, updates)

    monkeypatch.setattr(LakeRestCatalog, "commit_table", commit_together)
    identifier = (f"{server}_shop", "orders")
    # (past the table lock, which makes writers of one process take turns: the race the
    # service's compare-and-swap decides)
    outcomes = race_twice(lambda: arrow_load.load_into_empty(
        changelog, lake, identifier, lake.load_table(identifier), server))
    assert sorted(type(o).__name__ for o in outcomes) == ["ConcurrentCommitError", "Loaded"]
    table = rest["reader"].load_table((f"{server}_shop", "orders"))
    assert table.scan().to_arrow().num_rows == 20
    assert len(table.metadata.snapshots) == 2  # (the empty one, and the winner's)


def test_a_rest_catalog_that_does_not_answer_leaves_the_load_to_spark(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Spark's path then meets the same catalog and stops with its one-line error
    (``lake.s3.check_warehouse``), instead of a pyiceberg trace from here. The warning is said
    once, however often the applier asks (every 0.25 s while a target waits)."""
    import socket

    with socket.socket() as probe:  # (a port nothing listens on)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    catalog = CatalogSettings(type="rest", uri=f"http://127.0.0.1:{port}")
    landing = Landing(tmp_path / "landing")
    landing.segment(S, [("c", r(i)) for i in range(3)])
    changelog = TableChangelog.open(landing.url, SERVER, "shop", "orders")
    assert lake_catalog(str(tmp_path / "warehouse"), catalog) is None
    assert materialise_without_spark(changelog, str(tmp_path / "warehouse"), catalog,
                                     SERVER) is None
    assert arrow_load.target_rows(str(tmp_path / "warehouse"), catalog, SERVER, "shop",
                                  "orders") is None
    said = [r for r in caplog.records if "did not answer pyiceberg" in r.getMessage()]
    assert len(said) == 1
