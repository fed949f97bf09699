"""The lake's start errors on object storage, against a real SeaweedFS and its Iceberg REST
catalog: a missing warehouse (table) bucket, refused credentials and an unreachable catalog URI
are each one line naming the setting to fix (``lake.s3.check_warehouse``, which ``Lake`` runs
once per process and catalog before any Spark statement), as the landing zone's are.

What SeaweedFS answers (seen): its table bucket answers ``head_bucket`` like a plain bucket;
its REST catalog answers ``/v1/config`` for any warehouse and any (or no) signature, so the
check lists the warehouse's namespaces, signed: a missing table bucket is 404 there, a wrong
key 403, and a plain bucket named as the warehouse 500 ("attribute not found:
s3tables.metadata").
"""

from __future__ import annotations

import uuid

import pytest

from cdc_platform.capture.start_errors import describe_start_error
from cdc_platform.capture.store.s3store import ObjectStoreError
from cdc_platform.config import CatalogSettings, S3Settings
from cdc_platform.devservices.ports import free_port
from cdc_platform.devservices.seaweedfs import SeaweedFS
from cdc_platform.lake.iceberg.catalog import catalog_properties
from cdc_platform.lake.s3 import check_warehouse
from cdc_platform_tests import s3_fixtures

pytestmark = pytest.mark.integration

seaweedfs, s3_env = s3_fixtures.seaweedfs, s3_fixtures.s3_env
SIGV4 = {"rest.auth.type": "sigv4", "rest.signing-name": "s3tables"}


def _rest(server: SeaweedFS, warehouse: str, uri: str | None = None) -> dict[str, str]:
    """The Spark catalog's properties for a REST catalog, as the platform builds them."""
    catalog = CatalogSettings(type="rest", uri=uri or server.catalog_uri or "",
                              properties={**SIGV4, "rest.signing-region": server.region})
    return catalog_properties(warehouse, catalog, S3Settings(
        endpoint_url=server.endpoint_url, region=server.region, path_style=True))


def _hadoop(server: SeaweedFS, warehouse: str) -> dict[str, str]:
    return catalog_properties(warehouse, CatalogSettings(), S3Settings(
        endpoint_url=server.endpoint_url, region=server.region, path_style=True))


def _line(properties: dict[str, str]) -> str:
    with pytest.raises(ObjectStoreError) as raised:
        check_warehouse(properties)
    line = str(raised.value)
    assert "\n" not in line and describe_start_error(raised.value) == line
    return line


def test_a_working_rest_catalog_and_hadoop_warehouse_pass(seaweedfs: SeaweedFS,
                                                          s3_env: dict[str, str]):
    check_warehouse(_rest(seaweedfs, "s3://warehouse"))
    bucket = f"wh-{uuid.uuid4().hex[:12]}"
    seaweedfs.create_bucket(bucket)
    check_warehouse(_hadoop(seaweedfs, f"s3://{bucket}/lake"))


def test_a_missing_warehouse_is_one_line_naming_warehouse_url(seaweedfs: SeaweedFS,
                                                              s3_env: dict[str, str]):
    line = _line(_rest(seaweedfs, "s3://no-such-table-bucket"))
    assert line.startswith(f"warehouse.url s3://no-such-table-bucket: the Iceberg REST catalog "
                           f"at {seaweedfs.catalog_uri} has no such warehouse ("), line
    assert line.endswith("create it (on SeaweedFS or S3 Tables: a table bucket) or fix "
                         "warehouse.url"), line

    plain = f"plain-{uuid.uuid4().hex[:12]}"
    seaweedfs.create_bucket(plain)
    line = _line(_rest(seaweedfs, f"s3://{plain}"))
    assert line.startswith(f"warehouse.url s3://{plain}: the Iceberg REST catalog at "), line
    assert "a table bucket, not a plain bucket" in line, line

    assert _line(_hadoop(seaweedfs, "s3://no-such-bucket-here/lake")) == (
        "warehouse.url s3://no-such-bucket-here/lake: bucket 'no-such-bucket-here' does not "
        "exist; create it or fix the URL")


def test_wrong_credentials_are_one_line_without_the_secret(
        seaweedfs: SeaweedFS, s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-at-all")
    line = _line(_rest(seaweedfs, "s3://warehouse"))
    assert line.startswith(f"warehouse.catalog.uri {seaweedfs.catalog_uri}: the Iceberg REST "
                           "catalog refused the request (403 "), line
    assert "with the AWS credentials from the environment (AWS_ACCESS_KEY_ID " in line, line
    assert "not-the-secret" not in line

    bucket = f"wh-{uuid.uuid4().hex[:12]}"
    seaweedfs.create_bucket(bucket)
    line = _line(_hadoop(seaweedfs, f"s3://{bucket}/lake"))
    assert line.startswith(f"warehouse.url s3://{bucket}/lake: access denied "), line
    assert "not-the-secret" not in line


def test_an_unreachable_catalog_uri_is_one_line_naming_it(seaweedfs: SeaweedFS,
                                                          s3_env: dict[str, str]):
    uri = f"http://127.0.0.1:{free_port()}"
    line = _line(_rest(seaweedfs, "s3://warehouse", uri=uri))
    assert line.startswith(f"warehouse.catalog.uri {uri}: cannot reach the Iceberg REST "
                           "catalog ("), line
    assert line.endswith("check the URI and that the catalog service runs"), line
