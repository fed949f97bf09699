"""``make demo-s3`` / ``python -m cdc_platform demo --s3``: the demo on object storage.

The same demo as ``make demo``, with the landing zone and the lake's warehouse in buckets of a
private SeaweedFS (``devservices.seaweedfs``: a real S3 server with conditional writes) and the
lake's tables in SeaweedFS's Iceberg REST catalog. Nothing to configure: the config is the
embedded demo config (``demo.yaml``, so source, capture and signals are defined once) with its
``landing_zone``, ``warehouse`` and ``s3`` sections pointed at the server; it is written to
``.cdc/demo/config.yaml`` and every run of the demo reads it (``CDC_PLATFORM_CONFIG``).

Credentials are never in that file: the demo gives its processes the server's keys in the
standard AWS variables (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``), from where every
client takes them, as a deployment's pods take theirs from IRSA or a Secret.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from cdc_platform.devservices.seaweedfs import SeaweedFS

#: The bucket holding the landing zone (a prefix of it) and the table bucket of the catalog.
LANDING_BUCKET = "landing"
TABLE_BUCKET = "lake"
LANDING_URL = f"s3://{LANDING_BUCKET}/cdc"
WAREHOUSE_URL = f"s3://{TABLE_BUCKET}"
#: SeaweedFS's catalog signs requests as S3 Tables does: SigV4 for the service ``s3tables``.
REST_CATALOG_PROPERTIES = {"rest.auth.type": "sigv4", "rest.signing-name": "s3tables"}


def demo_seaweedfs(base_dir: Path) -> SeaweedFS:
    """The demo's S3 server (not started), with its table bucket for the REST catalog."""
    return SeaweedFS(base_dir=base_dir, table_bucket=TABLE_BUCKET)


def create_buckets(server: SeaweedFS) -> None:
    """The landing bucket (the table bucket is the server's own): S3 makes no bucket on a
    PUT, and neither does the demo's server."""
    server.create_bucket(LANDING_BUCKET)


def s3_demo_config(demo_config: dict[str, Any], server: SeaweedFS) -> dict[str, Any]:
    """The embedded demo config (parsed YAML, ``${...}`` references kept) with the landing
    zone and the warehouse on ``server``: an ``s3://`` landing zone, the table bucket as the
    warehouse of the REST catalog, and the ``s3`` section for the server's endpoint. No
    credentials: they come from the environment (``environment``)."""
    config = copy.deepcopy(demo_config)
    config["landing_zone"] = {**config.get("landing_zone", {}), "url": LANDING_URL}
    config["warehouse"] = {**config.get("warehouse", {}), "url": WAREHOUSE_URL, "catalog": {
        "type": "rest", "uri": server.catalog_uri,
        "properties": {**REST_CATALOG_PROPERTIES, "rest.signing-region": server.region}}}
    config["s3"] = {"endpoint_url": server.endpoint_url, "region": server.region,
                    "path_style": True}
    return config


def write_config(path: Path, demo_config_path: Path, server: SeaweedFS,
                 spark: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Path:
    """Write ``s3_demo_config`` of the embedded demo config to ``path``, with a header saying
    where it comes from; returns ``path``. ``spark``: makes the config's ``spark`` section
    (``make demo-cluster``: the demo's Spark cluster, ``demo.cluster.spark_section``)."""
    config = s3_demo_config(yaml.safe_load(demo_config_path.read_text()), server)
    if spark is not None:
        config["spark"] = spark(config.get("spark") or {})
    header = ("# Written by `make demo-s3` / `make demo-cluster`: the embedded demo config with "
              "the landing\n# zone and the lake on the demo's SeaweedFS. Credentials come from "
              "the environment\n# (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), never from this "
              "file.\n")
    path.write_text(header + yaml.safe_dump(config, sort_keys=False))
    return path


def environment(server: SeaweedFS) -> dict[str, str]:
    """What the demo's processes need besides the config: the server's credentials, region
    and endpoint in the standard AWS variables, and no instance-metadata lookups."""
    return {**server.client_env(), "AWS_EC2_METADATA_DISABLED": "true"}


def target_rows(server: SeaweedFS, namespace: str, tables: list[str]) -> dict[str, int | None]:
    """Rows of each target table, read with pyiceberg through the server's REST catalog (not
    through the platform's Spark session that wrote them); None for a table the catalog does
    not have."""
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.exceptions import NoSuchTableError

    catalog = RestCatalog("demo", **server.catalog_properties())
    rows: dict[str, int | None] = {}
    for table in tables:
        try:
            rows[table] = catalog.load_table((namespace, table)).scan().count()
        except NoSuchTableError:
            rows[table] = None
    return rows
