"""The private SeaweedFS: S3 with the given credentials only, an Iceberg REST catalog a
third-party client writes and reads through, a restart on the same data, nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from botocore.exceptions import ClientError

from cdc_platform.devservices import SeaweedFS, find_processes

pytestmark = pytest.mark.integration


def test_s3_catalog_restart_and_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    server = SeaweedFS(tmp_path / "weed", table_bucket="warehouse")
    with server:
        assert server.create_bucket("landing") == "s3://landing"
        assert server.create_bucket("landing") == "s3://landing"  # (exists: fine)
        server.client().put_object(Bucket="landing", Key="a/b", Body=b"x")
        with pytest.raises(ClientError, match="NoSuchBucket"):  # no bucket made by a PUT
            server.client().put_object(Bucket="missing", Key="a", Body=b"x")

        for name, value in server.client_env().items():
            monkeypatch.setenv(name, value)
        from pyiceberg.catalog.rest import RestCatalog

        catalog = RestCatalog("lake", **server.catalog_properties())
        catalog.create_namespace("demo")
        table = catalog.create_table("demo.t", schema=pa.schema([("id", pa.int64())]))
        table.append(pa.table({"id": [1, 2, 3]}))

        ports = (server.port, server.catalog_uri)
        server.restart()
        assert (server.port, server.catalog_uri) == ports
        assert server.client().get_object(Bucket="landing", Key="a/b")["Body"].read() == b"x"
        catalog = RestCatalog("lake", **server.catalog_properties())
        assert catalog.load_table("demo.t").scan().to_arrow().num_rows == 3
    assert not find_processes("weed", f"-dir={server.data_dir}")
    assert not server.state_file.exists()


def test_a_temporary_server_removes_its_directory():
    with SeaweedFS() as server:
        base = server.base_dir
        server.restart()  # (keeps it)
        assert base.exists() and server.is_running()
    assert not base.exists()
    with pytest.raises(Exception, match="no catalog"):
        server.catalog_properties()
