"""The S3 server restarting under a merge: the changelog on an s3:// landing zone, the target an
Iceberg table on SeaweedFS through its REST catalog, and SeaweedFS stopped at a random point of
each merge, for 2 s twice and then for 20 s (longer than botocore's attempts). A merge the restart breaks fails loudly (or retries and succeeds);
running it again gives exactly the rows the changelog says, because the consumed mark is in the
Iceberg commit (a commit that landed although its caller saw an error is not merged twice).

Spark runs in a child interpreter (the S3 jars are static settings of a JVM, as in
``test_s3_lake``) that merges when told on its stdin and answers on its stdout; this process
writes the changelog, restarts the server and reads the table with pyiceberg, as the
acceptance run does.
"""

from __future__ import annotations

import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc_platform.capture.landing.records import segment_schema
from cdc_platform.capture.landing.zone import Checkpoint, LandingZone
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.config import S3Settings
from cdc_platform.devservices.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

REGION = "us-east-1"
TABLE_BUCKET = "lake"
LANDING = "s3://landing/zone"
SERVER_NAME, DATABASE, TABLE = "faults", "shop", "orders"
SCHEMA = TableSchema(DATABASE, TABLE, (ColumnSpec("id", "int"), ColumnSpec("customer", "int"),
                                       ColumnSpec("status", "string")), ("id",))
CHILD_ENV = "CDC_TEST_S3_MERGE_FAULTS"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs-merge"), table_bucket=TABLE_BUCKET,
                       region=REGION)
    server.start()  # (ready: its REST catalog serves the table bucket)
    try:
        server.create_bucket("landing")
        yield server
    finally:
        server.stop()


def _options(server: SeaweedFS) -> S3Settings:
    return S3Settings(endpoint_url=server.endpoint_url, region=REGION, path_style=True)


# ---- the Spark child --------------------------------------------------------------------------


def _merge_child() -> None:
    """Merges the table on each ``merge`` line of stdin, answering ``MERGED <json>`` or
    ``FAILED <first line of the error>``; ``rows`` answers the table's rows; EOF ends it."""
    from cdc_platform.config import CatalogSettings
    from cdc_platform.lake.iceberg.lake import Lake
    from cdc_platform.lake.iceberg.table import LakeTable
    from cdc_platform.lake.merge import materialise
    from cdc_platform.lake.s3 import s3_session_conf
    from cdc_platform.lake.spark import build_spark_session

    job = json.loads(os.environ[CHILD_ENV])
    spark = build_spark_session(app_name="cdc_platform_tests.s3_merge_faults", conf=s3_session_conf(
        S3Settings(endpoint_url=job["endpoint"], region=REGION, path_style=True)))
    spark.sparkContext.setLogLevel("ERROR")
    catalog = CatalogSettings(type="rest", uri=job["catalog_uri"], properties={
        "rest.auth.type": "sigv4", "rest.signing-name": "s3tables",
        "rest.signing-region": REGION})
    s3 = S3Settings(endpoint_url=job["endpoint"], region=REGION, path_style=True,
                    max_attempts=3)
    print("READY", flush=True)
    for line in sys.stdin:
        command = line.strip()
        try:
            if command == "merge":
                result = materialise(spark, LANDING, f"s3://{TABLE_BUCKET}", SERVER_NAME, SCHEMA,
                                     DATABASE, TABLE, catalog=catalog, s3=s3)
                print("MERGED " + json.dumps({
                    "consumed": result.consumed_pos,
                    "spark_free": result.appended and result.snapshot is not None
                    and "spark.app.id" not in result.snapshot.summary}), flush=True)
            elif command == "rows":
                table = LakeTable(Lake(spark, f"s3://{TABLE_BUCKET}", catalog), SERVER_NAME,
                                  DATABASE, TABLE)
                rows = [[r.id, r.customer, r.status] for r in table.read().collect()]
                print("ROWS " + json.dumps(sorted(rows)), flush=True)
        except Exception as error:  # noqa: BLE001 - the parent judges it
            first = (str(error).strip().splitlines() or [""])[0][:300]
            cause = getattr(error, "java_exception", None)  # (Py4JJavaError: its root cause)
            while cause is not None and cause.getCause() is not None:
                cause = cause.getCause()
            root = "" if cause is None else " <- " + " ".join(str(cause.toString()).split())[:300]
            print(f"FAILED {type(error).__name__}: {first}{root}", flush=True)
    spark.stop()


class _Child:
    def __init__(self, server: SeaweedFS) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(server.client_env(), PYSPARK_PYTHON=sys.executable)
        env[CHILD_ENV] = json.dumps({"endpoint": server.endpoint_url,
                                     "catalog_uri": server.catalog_uri})
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from cdc_platform_tests.lake.test_s3_merge_faults import "
             "_merge_child; _merge_child()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, cwd=REPO, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip().split(" ", 1)[0] in ("READY", "MERGED", "FAILED", "ROWS"):
                self.lines.put(line.strip())
        self.lines.put("EXITED")

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def answer(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the Spark child gave no answer within {timeout:.0f} s") \
                from None
        assert line != "EXITED", "the Spark child exited"
        return line

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


# ---- the changelog ----------------------------------------------------------------------------


class _Changelog:
    """Batches of consistent changes (inserts of new keys, updates and deletes of live ones),
    each one segment and a checkpoint; ``rows`` is what the target must hold."""

    def __init__(self, zone: LandingZone) -> None:
        self.zone = zone
        self.rows: dict[int, tuple[int, str]] = {}
        self.next_pos, self.next_id = 1, 1
        self.rng = random.Random(23)

    def add_batch(self, changes: int, inserts_only: bool = False) -> None:
        columns: dict[str, list[Any]] = {"__cdc_pos": [], "__cdc_gtid": [], "__cdc_op": [],
                                         "__cdc_ts_ms": [], "id": [], "customer": [],
                                         "status": []}
        first = self.next_pos
        for _ in range(changes):
            r = self.rng.random()
            if inserts_only:
                key, op, self.next_id = self.next_id, "c", self.next_id + 1
            elif self.rows and r < 0.5:
                key, op = self.rng.choice(list(self.rows)), "u"
            elif self.rows and r < 0.7:
                key, op = self.rng.choice(list(self.rows)), "d"
            else:
                key, op, self.next_id = self.next_id, "c", self.next_id + 1
            if op == "d":
                del self.rows[key]
                customer, status = None, None
            else:
                customer, status = self.rng.randint(1, 999), f"s{self.next_pos}"
                self.rows[key] = (customer, status)
            for name, value in (("__cdc_pos", self.next_pos),
                                ("__cdc_gtid", f"0-1-{self.next_pos}"), ("__cdc_op", op),
                                ("__cdc_ts_ms", int(time.time() * 1000)), ("id", key),
                                ("customer", customer), ("status", status)):
                columns[name].append(value)
            self.next_pos += 1
        table = pa.Table.from_pydict(columns, schema=segment_schema(SCHEMA))
        self.zone.write_segment(SCHEMA, table, first, self.next_pos - 1)
        self.zone.write_tables({SCHEMA.table_id: SCHEMA})
        self.zone.write_checkpoint(Checkpoint(SERVER_NAME, "mariadb",
                                              f"0-1-{self.next_pos - 1}", self.next_pos))

    def expected(self) -> list[list[Any]]:
        return sorted([key, customer, status] for key, (customer, status) in self.rows.items())


def _pyiceberg_rows(server: SeaweedFS) -> list[list[Any]]:
    """The table as any Iceberg reader sees it through the REST catalog."""
    from pyiceberg.catalog import load_catalog

    from cdc_platform.lake.iceberg.catalog import namespace_name, table_name

    catalog = load_catalog("seaweedfs", **{
        "type": "rest", "uri": server.catalog_uri, "warehouse": f"s3://{TABLE_BUCKET}",
        "credential": f"{server.access_key}:{server.secret_key}", "scope": "catalog",
        "oauth2-server-uri": f"{server.catalog_uri}/v1/oauth/tokens",
        "s3.endpoint": server.endpoint_url, "s3.region": REGION,
        "s3.access-key-id": server.access_key, "s3.secret-access-key": server.secret_key})
    table = catalog.load_table((namespace_name(SERVER_NAME, DATABASE),
                                table_name(TABLE, unicode_names=True)))
    rows = table.scan(selected_fields=("id", "customer", "status")).to_arrow().to_pylist()
    return sorted([r["id"], r["customer"], r["status"]] for r in rows)


def test_seaweedfs_restarting_under_merges_leaves_exactly_the_changelog_rows(
        seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    for name, value in seaweedfs.client_env().items():
        monkeypatch.setenv(name, value)
    zone = LandingZone(LANDING, SERVER_NAME, s3=_options(seaweedfs), scratch=tmp_path)
    changelog = _Changelog(zone)
    child = _Child(seaweedfs)
    rng = random.Random(5)
    outcomes: list[str] = []
    try:
        assert child.answer(300) == "READY"
        # The first merge creates the table (no fault): an initial load, appended without
        # Spark through the REST catalog; the later ones are Spark's MERGEs into that table.
        changelog.add_batch(3000, inserts_only=True)
        child.send("merge")
        first = child.answer(300)
        assert first.startswith("MERGED") and json.loads(first.split(" ", 1)[1])["spark_free"]
        for down_seconds in (2.0, 2.0, 20.0):
            changelog.add_batch(2000)
            child.send("merge")
            time.sleep(rng.uniform(0.2, 2.0))
            seaweedfs.stop()
            time.sleep(down_seconds)
            seaweedfs.start()  # (ready as at first: the catalog serves the table bucket)
            answer = child.answer(300)
            outcomes.append(answer[:500])  # (MERGED, or FAILED and why: shown below)
            answers = [answer]
            for _attempt in range(5):  # a failed merge runs again, as the applier's next pass
                if answer.startswith("MERGED"):
                    break
                assert answer.startswith("FAILED"), answer
                time.sleep(2.0)
                child.send("merge")
                answer = child.answer(300)
                answers.append(answer)
            assert answer.startswith("MERGED"), answers
            assert json.loads(answer.split(" ", 1)[1])["consumed"] == changelog.next_pos - 1
        child.send("rows")
        rows = json.loads(child.answer(120).split(" ", 1)[1])
    finally:
        child.close()
    expected = changelog.expected()
    assert len(expected) > 500
    assert rows == expected
    assert _pyiceberg_rows(seaweedfs) == expected
    print("merges under a server restart:\n  " + "\n  ".join(outcomes))


def test_the_lake_reading_an_s3_zone_with_wrong_credentials_or_no_bucket_is_one_line(
        seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch):
    """What a merge and the applier open first (the changelog's checkpoint) names
    ``landing_zone.url`` and the fix in one line, never the secret."""
    from cdc_platform.capture.start_errors import describe_start_error
    from cdc_platform.capture.store.s3store import ObjectStoreError
    from cdc_platform.lake.changelog import TableChangelog

    for name, value in seaweedfs.client_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-at-all")
    with pytest.raises(ObjectStoreError) as denied:
        TableChangelog.open(LANDING, SERVER_NAME, DATABASE, TABLE,
                            s3=_options(seaweedfs)).checkpoint()
    line = describe_start_error(denied.value)
    assert line is not None and "\n" not in line and "not-the-secret" not in line
    assert line.startswith(f"landing_zone.url {LANDING}/{SERVER_NAME}: access denied"), line
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweedfs.secret_key)
    with pytest.raises(ObjectStoreError, match=r"^landing_zone.url s3://no-such-bucket/zone/"
                                               r"faults: bucket 'no-such-bucket' does not "
                                               r"exist; create it or fix the URL$"):
        TableChangelog.open("s3://no-such-bucket/zone", SERVER_NAME, DATABASE, TABLE,
                            s3=_options(seaweedfs)).checkpoint()
