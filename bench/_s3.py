"""The benchmarks' object storage: one private SeaweedFS (``devservices.seaweedfs``: a real S3
server and an Iceberg REST catalog), started by the bench beside its MariaDB, so that the S3
figures are measured on the same machine as the local ones they are printed beside.

Its credentials go where every client of the platform takes them from, the standard AWS
variables of this process (inherited by the engine, applier and reader processes), never into
a config file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_platform.config import S3Settings
from cdc_platform.demo.object_storage import REST_CATALOG_PROPERTIES
from cdc_platform.devservices.seaweedfs import SeaweedFS

TABLE_BUCKET = "lake"


@dataclass
class BenchS3:
    """The running server, and the settings a bench section needs to use it."""

    server: SeaweedFS

    def options(self) -> S3Settings:
        """The config's ``s3`` section as the stores take it."""
        return S3Settings(endpoint_url=self.server.endpoint_url, region=self.server.region,
                          path_style=True)

    def landing_url(self, name: str) -> str:
        """``s3://<name>/landing`` in a bucket of its own (created here)."""
        self.server.create_bucket(name)
        return f"s3://{name}/landing"

    def config_sections(self, landing_bucket: str) -> dict[str, Any]:
        """``landing_zone.url``, ``warehouse`` (the REST catalog's table bucket) and ``s3`` of
        a platform config on this server."""
        return {
            "landing_zone": {"url": self.landing_url(landing_bucket)},
            "warehouse": {"url": f"s3://{TABLE_BUCKET}", "catalog": {
                "type": "rest", "uri": self.server.catalog_uri,
                "properties": {**REST_CATALOG_PROPERTIES,
                               "rest.signing-region": self.server.region}}},
            "s3": {"endpoint_url": self.server.endpoint_url, "region": self.server.region,
                   "path_style": True},
        }

    def catalog(self) -> Any:
        """pyiceberg's view of the REST catalog, as a third-party reader's."""
        from pyiceberg.catalog.rest import RestCatalog

        return RestCatalog("bench", **self.server.catalog_properties())

    def bucket_size(self, url: str) -> tuple[int, int]:
        """(bytes, objects) below an s3:// URL."""
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        size = count = 0
        for page in self.server.client().get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", ()):
                size += int(item["Size"])
                count += 1
        return size, count


@contextlib.contextmanager
def seaweedfs(work: Path) -> Iterator[BenchS3]:
    """A SeaweedFS under ``work`` for the bench's run; its credentials in this process's AWS
    environment meanwhile."""
    server = SeaweedFS(work / "seaweedfs", table_bucket=TABLE_BUCKET)
    server.start()
    saved = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    os.environ.update({**server.client_env(), "AWS_EC2_METADATA_DISABLED": "true"})
    try:
        yield BenchS3(server)
    finally:
        for key in [k for k in os.environ if k.startswith("AWS_")]:
            del os.environ[key]
        os.environ.update(saved)
        server.stop()
