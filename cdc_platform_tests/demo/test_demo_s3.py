"""``make demo-s3`` / ``python -m cdc_platform demo --s3`` (issue 23): the demo's config on
object storage, its SeaweedFS as the demo sets it up, and Ctrl-C stopping everything it
started, S3 server included.

The config is the embedded demo config with the landing zone and the warehouse moved to the
demo's SeaweedFS (one definition of the demo's source, capture and signals); credentials are
only in the environment the demo gives its processes, and a client without them is refused.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
import yaml

from cdc_platform.capture.landing.zone import Checkpoint, LandingReader, LandingZone
from cdc_platform.capture.store.s3store import ObjectStoreError
from cdc_platform.config import CONFIG_ENV, DEMO_CONFIG, load_settings, parse_settings
from cdc_platform.demo import object_storage
from cdc_platform.devservices.seaweedfs import SeaweedFS
from cdc_platform.lake.s3 import s3_jars
from cdc_platform.lake.spark import settings_conf
from cdc_platform_tests.test_cli_signals import (
    _demo_env,
    _started,
    _stop_and_check,
    needs_services,
)

# A server as the config sees it (no process needed for the config's own checks).
FAKE_SERVER = SimpleNamespace(endpoint_url="http://127.0.0.1:18333",
                              catalog_uri="http://127.0.0.1:18181", region="us-east-1",
                              access_key="demo-access-key", secret_key="demo-secret-key")


def _embedded() -> dict[str, Any]:
    return yaml.safe_load(DEMO_CONFIG.read_text())


def _settings(config: dict[str, Any]) -> Any:
    with pytest.MonkeyPatch.context() as env:
        for name in ("CDC_SOURCE_HOST", "CDC_SOURCE_PORT", "CDC_BILLING_HOST",
                     "CDC_BILLING_PORT", "CDC_KAFKA_BOOTSTRAP", "CDC_HOME"):
            env.delenv(name, raising=False)
        return parse_settings(config, "demo-s3 config")


def test_the_s3_config_moves_only_the_storage_to_the_server() -> None:
    embedded = _embedded()
    config = object_storage.s3_demo_config(embedded, FAKE_SERVER)  # type: ignore[arg-type]
    settings = _settings(config)
    assert settings.landing_zone.url == "s3://landing/cdc"
    assert settings.warehouse.url == "s3://lake"
    catalog = settings.warehouse.catalog
    assert (catalog.type, catalog.uri) == ("rest", FAKE_SERVER.catalog_uri)
    assert catalog.properties == {"rest.auth.type": "sigv4", "rest.signing-name": "s3tables",
                                  "rest.signing-region": "us-east-1"}
    assert (settings.s3.endpoint_url, settings.s3.region, settings.s3.path_style) == \
        (FAKE_SERVER.endpoint_url, "us-east-1", True)
    # everything else is the embedded demo config, which `make demo` keeps using unchanged
    plain = _settings(embedded)
    for section in ("sources", "spark", "signals", "lake", "reconcile"):
        assert getattr(settings, section) == getattr(plain, section), section
    assert not plain.landing_zone.url.startswith("s3://")
    assert plain.warehouse.catalog.type == "hadoop"
    assert config is not embedded and "s3" not in embedded


def test_the_s3_config_gives_spark_the_s3_jars_and_no_credentials(tmp_path: Path) -> None:
    path = object_storage.write_config(tmp_path / "config.yaml", DEMO_CONFIG,
                                       FAKE_SERVER)  # type: ignore[arg-type]
    text = path.read_text()
    assert FAKE_SERVER.secret_key not in text and FAKE_SERVER.access_key not in text
    assert "secret" not in yaml.safe_load(text).get("s3", {})
    conf = settings_conf(_settings(yaml.safe_load(text)))
    assert set(s3_jars()) <= set(conf["spark.jars"].split(","))
    assert conf["spark.hadoop.fs.s3a.endpoint"] == FAKE_SERVER.endpoint_url
    assert not any("secret" in key or "access.key" in key for key in conf)


# ---- against the demo's SeaweedFS ------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    seaweedfs = object_storage.demo_seaweedfs(tmp_path_factory.mktemp("demo-seaweedfs"))
    with seaweedfs:
        object_storage.create_buckets(seaweedfs)
        yield seaweedfs


@pytest.fixture
def demo_env(server: SeaweedFS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The environment the demo gives its processes (AWS_* of the server, the written config),
    and the settings they load from it."""
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in object_storage.environment(server).items():
        monkeypatch.setenv(name, value)
    path = object_storage.write_config(tmp_path / "config.yaml", DEMO_CONFIG, server)
    monkeypatch.setenv(CONFIG_ENV, str(path))
    return load_settings()


@pytest.mark.integration
def test_the_landing_zone_is_writable_with_the_environments_credentials_only(
        server: SeaweedFS, demo_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]) == \
        (server.access_key, server.secret_key)
    server_name = f"d{uuid.uuid4().hex[:8]}"
    zone = LandingZone.from_settings(demo_env, server_name)
    with zone.engine_lock():  # the engine's start: the lease and the store's check
        zone.write_checkpoint(Checkpoint(server_name, "mariadb", gtid="0-1-7", next_pos=3))
    reader = LandingReader.open(demo_env.landing_zone.url, server_name,
                                s3=demo_env.s3)
    assert reader.read_checkpoint() == Checkpoint(server_name, "mariadb", gtid="0-1-7",
                                                  next_pos=3)
    assert server.client().list_objects_v2(Bucket=object_storage.LANDING_BUCKET,
                                           Prefix=f"cdc/{server_name}/")["KeyCount"] > 0
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-servers")
    with pytest.raises(ObjectStoreError, match="landing_zone.url"):
        LandingReader.open(demo_env.landing_zone.url, server_name,
                           s3=demo_env.s3).read_checkpoint()


@pytest.mark.integration
def test_target_rows_are_read_through_the_rest_catalog(server: SeaweedFS, demo_env: Any
                                                       ) -> None:
    from pyiceberg.catalog.rest import RestCatalog

    namespace = f"demo_{uuid.uuid4().hex[:8]}"
    catalog = RestCatalog("writer", **server.catalog_properties())
    catalog.create_namespace(namespace)
    table = catalog.create_table((namespace, "orders"), schema=pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": [1, 2, 3]}))
    table.delete("id = 2")
    assert object_storage.target_rows(server, namespace, ["orders", "customers"]) == \
        {"orders": 2, "customers": None}
    # the warehouse the config names is the catalog's: the written table is under it
    assert table.location().startswith(demo_env.warehouse.url + "/")


# ---- Ctrl-C -------------------------------------------------------------------------------


@pytest.mark.integration
@needs_services
def test_demo_s3_stops_everything_on_ctrl_c_while_streaming(tmp_path: Path) -> None:
    """Interrupted mid-way (S3 server, daemon, streaming run and workload running): exit 130,
    nothing left, the S3 server included."""
    argv = [sys.executable, "-m", "cdc_platform", "demo", "--s3", "--orders", "2000",
            "--workload-seconds", "600"]
    with _started(argv, tmp_path, _demo_env(tmp_path)) as command:
        def streaming() -> bool:
            running = " ".join(command.commands())
            return all(part in running for part in
                       ("mariadbd", "tansu", "weed mini", "dagster-daemon",
                        "-j demo_stream_changes", "-j billing_stream_changes"))
        command.wait_for("SeaweedFS, the daemon and both sources' stream_changes runs",
                         streaming, 180)
        config = yaml.safe_load((tmp_path / "cdc" / "demo" / "config.yaml").read_text())
        assert config["landing_zone"]["url"].startswith("s3://")
        _stop_and_check(command, signal.SIGINT, expected_code=128 + signal.SIGINT)
        assert "stopped everything this command started" in command.output()
