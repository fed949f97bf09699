"""What can be checked of the Kubernetes deployment without a cluster, Helm or Docker.

The values, the embedded platform config and the Dockerfile must agree with the code: every
environment variable they set is read by something, every secret they name is created by the
install steps, the config validates against the schema, the entry points exist, and the streaming
job's run settings are the ones the chart's daemon acts on.

Three layouts, each checked: ``values.yaml`` alone (the landing zone and the warehouse in
an S3 bucket, a REST catalog, an IRSA service account: no ReadWriteMany volume), with the
overlay ``values-shared-volume.yaml`` (one shared volume, the Hadoop catalog), and with the
overlay ``values-spark-k8s.yaml`` (S3 as ``values.yaml``, Spark's executors in pods of their own:
``test_spark_k8s.py``), merged as Helm merges ``-f`` files (``_helm_merge``). No ``helm`` binary
is needed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster_k8s.job import (
    DagsterK8sJobConfig,
    construct_dagster_k8s_job,
    get_user_defined_k8s_config,
)

from cdc_platform.capture.store.storage import is_s3_url
from cdc_platform.config import CONFIG_ENV, ConfigError, parse_settings
from cdc_platform.defs.dbt import project as dbt_project
from cdc_platform.defs.streaming import definitions as streaming_defs
from cdc_platform.defs.streaming.runner import STOP_GRACE_SECONDS
from cdc_platform.lake.iceberg.catalog import catalog_properties, iceberg_jar
from cdc_platform.lake.s3 import JARS_ENV, S3_FILE_IO
from cdc_platform.lake.spark import deployment_conf

ROOT = Path(__file__).resolve().parents[2]
HELM = ROOT / "helm"
ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}")
#: The value files of each storage layout, in the order `helm -f` takes them.
LAYOUTS = {"s3": ("values.yaml",), "shared-volume": ("values.yaml", "values-shared-volume.yaml"),
           "spark-k8s": ("values.yaml", "values-spark-k8s.yaml")}
#: The layouts whose landing zone and warehouse are on S3.
S3_LAYOUTS = ("s3", "spark-k8s")
#: What the downward API gives a pod's variables (``valueFrom.fieldRef``), as stand-ins.
POD_FIELDS = {"status.podIP": "10.42.3.17", "metadata.name": "dagster-run-5f0c1d2e-x7k2p",
              "metadata.namespace": "cdc"}
IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"


def _helm_merge(base: Any, overlay: Any) -> Any:
    """``overlay`` over ``base`` as Helm coalesces value files: maps merge key by key, a null
    deletes the key, anything else (lists included) replaces."""
    if not isinstance(base, dict) or not isinstance(overlay, dict):
        return overlay
    merged = dict(base)
    for key, value in overlay.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _helm_merge(base.get(key), value)
    return merged


def _values(layout: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for name in LAYOUTS[layout]:
        merged = _helm_merge(merged, yaml.safe_load((HELM / name).read_text()))
    return merged


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def values(layout: str) -> dict[str, Any]:
    return _values(layout)


@pytest.fixture(scope="module")
def deployment(values: dict[str, Any]) -> dict[str, Any]:
    deployments = values["dagster-user-deployments"]["deployments"]
    assert len(deployments) == 1
    return deployments[0]


@pytest.fixture(scope="module")
def env(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in deployment["env"]}


def _config_text() -> str:
    return (HELM / "cdc-platform-config.yaml").read_text()


def _config_references() -> dict[str, bool]:
    """Environment variables the config references -> whether the reference has a default."""
    return {m.group(1): m.group(2) is not None for m in ENV_REFERENCE.finditer(_config_text())}


def _dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def test_chart_runs_k8s_runs_on_postgres_with_the_daemon_monitoring_and_retrying(values):
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["runLauncher"]["config"]["k8sRunLauncher"]["loadInclusterConfig"] is True
    assert values["postgresql"]["postgresqlHost"] and not values["postgresql"]["enabled"]
    assert values["generatePostgresqlPasswordSecret"] is False
    daemon = values["dagsterDaemon"]
    assert daemon["enabled"] and daemon["runMonitoring"]["enabled"]
    assert daemon["runRetries"]["enabled"]  # without it, stream_changes' max_retries is ignored
    assert daemon["runCoordinator"]["type"] == "QueuedRunCoordinator"


def test_one_streaming_run_per_source_is_the_limit_on_the_jobs_tag(values):
    limits = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"][
        "tagConcurrencyLimits"]
    stream = [limit for limit in limits if limit["key"] == streaming_defs.STREAM_TAG]
    assert stream == [{"key": streaming_defs.STREAM_TAG,
                       "value": {"applyLimitPerUniqueValue": True}, "limit": 1}]


def test_stream_job_has_no_max_runtime_retries_and_a_grace_period_to_checkpoint():
    settings = parse_settings(yaml.safe_load((ROOT / "cdc_platform/demo/demo.yaml")
                                             .read_text())).for_source("demo")
    job = streaming_defs.build(settings).resolve_job_def("demo_stream_changes")
    tags = job.tags
    assert tags[streaming_defs.STREAM_TAG] == settings.source.server_name
    assert float(tags["dagster/max_runtime"]) == 0  # the daemon's "no limit"
    assert int(tags["dagster/max_retries"]) >= 1
    k8s_config = get_user_defined_k8s_config({"dagster-k8s/config": tags["dagster-k8s/config"]})
    pod = construct_dagster_k8s_job(
        DagsterK8sJobConfig(job_image="cdc-platform:test", dagster_home="/opt/dagster",
                            instance_config_map="dagster-instance"),
        ["dagster", "api", "execute_run"], "dagster-run-test", k8s_config,
    ).spec.template.spec
    assert pod.termination_grace_period_seconds > STOP_GRACE_SECONDS


def test_code_server_serves_the_packages_code_location(deployment):
    module = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["dagster"][
        "module_name"]
    assert deployment["codeServerArgs"] == ["-m", module]
    assert importlib.util.find_spec(module) is not None
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", _dockerfile(), re.M).group(1))
    assert cmd[:3] == ["dagster", "code-server", "start"] and cmd[-2:] == ["-m", module]
    assert str(deployment["port"]) in cmd


def test_every_env_var_the_values_set_is_read_by_the_code_or_the_config(env):
    settings_readers = {CONFIG_ENV}
    settings = _settings_with_values_env(env)
    settings_readers |= {source.password_env for source in settings.sources}
    references = _config_references()
    unread = set(env) - settings_readers - set(references)
    assert not unread, f"helm/values.yaml sets {sorted(unread)} but nothing reads them"
    unset = {name for name, has_default in references.items()
             if not has_default and name not in env and name not in _secret_keys()}
    assert not unset, f"the config references {sorted(unset)} without a default or a value"


def test_signals_read_the_kafka_credentials_from_the_secret(env):
    signals = _settings_with_values_env(env).signals
    assert signals.kafka.bootstrap_servers == env["CDC_KAFKA_BOOTSTRAP"]["value"]
    assert signals.kafka.config["sasl.password"] == "from-a-secret"  # (the secret's value)
    assert "CDC_KAFKA_SASL_PASSWORD" in _secret_keys()


def test_secrets_come_from_kubernetes_secrets_that_the_install_steps_create(values, deployment,
                                                                            env):
    settings = _settings_with_values_env(env)
    assert len(settings.sources) == 2, "the values show two sources"
    passwords = [env[source.password_env] for source in settings.sources]
    for password in passwords:
        assert "value" not in password, "a source password must come from a Secret"
    assert len({p["valueFrom"]["secretKeyRef"]["name"] for p in passwords}) == 2, (
        "one Secret per source password")
    secrets = {item["valueFrom"]["secretKeyRef"]["name"] for item in env.values()
               if "secretKeyRef" in item.get("valueFrom", {})}
    secrets |= {item["name"] for item in deployment.get("envSecrets", [])}
    secrets.add(values["global"]["postgresqlSecretName"])
    readme = (HELM / "README.md").read_text()
    for name in secrets:
        assert f"create secret generic {name}" in readme, f"helm/README.md never creates {name}"
    for name, item in env.items():
        if re.search("PASSWORD|SECRET|TOKEN|KEY", name):
            assert "secretKeyRef" in item.get("valueFrom", {}), \
                f"{name} is set inline in helm/values.yaml"


def test_embedded_config_validates_and_points_into_mounted_volumes(layout, deployment, env):
    settings = _settings_with_values_env(env)
    config_file = Path(env[CONFIG_ENV]["value"])
    mounts = {m["name"]: m["mountPath"] for m in deployment["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["volumes"]}
    config_volume = next(name for name, path in mounts.items()
                         if Path(path) == config_file.parent)
    config_map = volumes[config_volume]["configMap"]["name"]
    assert (f"create configmap {config_map} --from-file={config_file.name}="
            "helm/cdc-platform-config.yaml") in (HELM / "README.md").read_text()
    claims = [name for name, volume in volumes.items() if "persistentVolumeClaim" in volume]
    if layout in S3_LAYOUTS:  # no volume to share: the data is in a bucket, the tables in a catalog
        assert not claims
        for url in (settings.landing_zone.url, settings.warehouse.url):
            assert is_s3_url(url), url
    else:
        for url in (settings.landing_zone.url, settings.warehouse.url):
            assert any(Path(url).is_relative_to(mounts[name]) for name in claims), url
        assert settings.warehouse.catalog.type == "hadoop"
    assert settings.spark.master == env["CDC_SPARK_MASTER"]["value"]


def test_s3_layout_has_a_rest_catalog_and_the_region_and_endpoint_of_the_values(layout, env):
    if layout not in S3_LAYOUTS:
        pytest.skip("the S3 layout's storage")
    settings = _settings_with_values_env(env)
    catalog = settings.warehouse.catalog
    assert (catalog.type, catalog.uri) == ("rest", env["CDC_ICEBERG_REST_URI"]["value"])
    assert catalog.uri.startswith(("http://", "https://"))
    assert settings.s3.region == env["AWS_REGION"]["value"]
    assert settings.s3.endpoint_url == env["CDC_S3_ENDPOINT_URL"]["value"] == ""  # AWS's own
    assert settings.s3.path_style is False
    properties = catalog_properties(settings.warehouse.url, catalog, settings.s3)
    assert properties["io-impl"] == S3_FILE_IO
    assert properties["client.region"] == env["AWS_REGION"]["value"]
    assert properties["rest.auth.type"] == env["CDC_ICEBERG_REST_AUTH"]["value"]
    assert "s3.endpoint" not in properties
    # A store on another server: endpoint and path-style addressing come from the values too.
    custom = {**env, "CDC_S3_ENDPOINT_URL": {"value": "http://minio.storage:9000"},
              "CDC_S3_PATH_STYLE": {"value": "true"}}
    s3 = _settings_with_values_env(custom).s3
    assert (s3.endpoint_url, s3.path_style) == ("http://minio.storage:9000", True)


def test_s3_credentials_come_from_the_service_accounts_role_never_the_values(layout, values,
                                                                            deployment, env):
    account = values["dagster-user-deployments"]["serviceAccount"]
    annotations = account.get("annotations") or {}
    if layout == "shared-volume":
        assert IRSA_ANNOTATION not in annotations  # the overlay drops the role
        return
    assert account["create"] is True and account["name"]
    assert re.fullmatch(r"arn:aws:iam::\d{12}:role/[\w+=,.@/-]+", annotations[IRSA_ANNOTATION])
    # runs get the code server's service account (and its env) only with this on
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        assert name not in env or "value" not in env[name], f"{name} inline in the values"
    # the alternative without IRSA: a Secret of the two keys, made by the install steps
    readme = (HELM / "README.md").read_text()
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= _secret_keys()
    assert "eks.amazonaws.com/role-arn" in readme


def test_the_s3_layouts_sessions_take_the_images_s3_jars(layout, env, tmp_path, monkeypatch):
    """The image downloads the S3 jars into $CDC_PLATFORM_S3_JARS; a session of the S3
    layout puts exactly those on spark.jars, beside the Iceberg runtime of the same version."""
    if layout not in S3_LAYOUTS:
        pytest.skip("the S3 layout's sessions")
    dockerfile = _dockerfile()
    jars_dir = re.search(rf"^ENV {JARS_ENV}=(\S+)", dockerfile, re.M).group(1)
    assert JARS_ENV not in env or env[JARS_ENV]["value"] == jars_dir
    paths = re.search(r'ARG S3_JARS="([^"]+)"', dockerfile).group(1).split()
    names = {path.rsplit("/", 1)[-1] for path in paths if path.endswith(".jar")}
    assert len(names) == 3
    runtime_version = re.search(r"-(\d+\.\d+\.\d+)\.jar$", iceberg_jar()).group(1)
    assert f"iceberg-aws-bundle-{runtime_version}.jar" in names
    pyspark_jars = Path(importlib.util.find_spec("pyspark").submodule_search_locations[0]) / "jars"
    hadoop = re.search(r"hadoop-client-api-(\S+)\.jar",
                       " ".join(p.name for p in pyspark_jars.glob("hadoop-client-api-*.jar")))
    assert f"hadoop-aws-{hadoop.group(1)}.jar" in names
    image_jars = tmp_path / "s3-jars"  # the image's directory, here with empty stand-ins
    image_jars.mkdir()
    for name in names:
        (image_jars / name).touch()
    monkeypatch.setenv(JARS_ENV, str(image_jars))
    conf = deployment_conf(_settings_with_values_env(env))
    on_session = {Path(jar).name for jar in conf["spark.jars"].split(",")}
    assert names <= on_session and Path(iceberg_jar()).name in on_session
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == env["AWS_REGION"]["value"]


def test_a_typo_in_the_embedded_config_would_be_caught(env, monkeypatch):
    for name in _secret_keys():
        monkeypatch.setenv(name, "from-a-secret")
    for name, item in env.items():
        monkeypatch.setenv(name, _pod_value(item))
    broken = yaml.safe_load(_config_text())
    broken["landing_zone"]["uri"] = broken["landing_zone"].pop("url")
    with pytest.raises(ConfigError, match="landing_zone"):
        parse_settings(broken, "helm/cdc-platform-config.yaml")


def _secret_keys() -> set[str]:
    """Keys of the secrets the install steps create: envSecrets make them variables too."""
    return set(re.findall(r"--from-literal=(\w+)=", (HELM / "README.md").read_text()))


def _pod_value(item: dict[str, Any]) -> str:
    """The value a pod's variable gets: inline, from the downward API (``POD_FIELDS``), or
    from a Secret."""
    field_ref = (item.get("valueFrom") or {}).get("fieldRef")
    if field_ref is not None:
        return POD_FIELDS[field_ref["fieldPath"]]
    return str(item.get("value", "from-a-secret"))


def _settings_with_values_env(env: dict[str, dict[str, Any]]) -> Any:
    """The settings a pod with the values' environment loads."""
    with pytest.MonkeyPatch.context() as patch:
        for name in _secret_keys():
            patch.setenv(name, "from-a-secret")
        for name, item in env.items():
            patch.setenv(name, _pod_value(item))
        return parse_settings(yaml.safe_load(_config_text()), "helm/cdc-platform-config.yaml")


def test_dockerfile_builds_the_user_code_image_from_what_the_repo_has():
    dockerfile = _dockerfile()
    assert re.search(r"^FROM python:3\.11", dockerfile, re.M)
    assert "openjdk-17-jre-headless" in dockerfile
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    installed = re.search(r'pip install "\.\[(\w+)\]"', dockerfile).group(1)
    assert any(dep.startswith("dagster-postgres") for dep in extras[installed])
    workdir = Path(re.search(r"^WORKDIR (\S+)", dockerfile, re.M).group(1))
    copied = re.findall(r"^COPY (.+) \S+$", dockerfile, re.M)
    sources = [s for line in copied for s in line.split()]
    allowed = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")]
    for source in sources:
        assert (ROOT / source).exists(), source
        assert source.rstrip("/") in allowed, f".dockerignore leaves {source} out of the context"
    project_dir = re.search(rf"{dbt_project.PROJECT_DIR_ENV}=(\S+)", dockerfile).group(1)
    assert Path(project_dir) == workdir / "dbt_project"
    prepare = re.search(r"python -m (\S+) prepare", dockerfile).group(1)
    assert prepare == dbt_project.__name__
    # The build's checks import modules of the package: each must exist (a moved module left
    # the check naming its old place once, which only an image build would have shown).
    checked = [m for code in re.findall(r'python -c "([^"]+)"', dockerfile)
               for statement in code.split(";") if statement.strip().startswith("import ")
               for m in statement.strip()[len("import "):].split(",")]
    assert checked
    for module in checked:
        importlib.import_module(module.strip())


def test_the_image_build_step_prepares_the_dbt_manifest(tmp_path):
    """The Dockerfile's RUN step, on a copy of the project: a manifest for demo/inventory."""
    copy = tmp_path / "dbt_project"
    shutil.copytree(dbt_project.project_dir(), copy,
                    ignore=shutil.ignore_patterns("target", "logs"))
    pair = re.search(r'DBT_MANIFESTS="(\S+)"', _dockerfile()).group(1)
    server, database = pair.split(":")
    command = [sys.executable, "-m", dbt_project.__name__, "prepare", "--server", server,
               "--database", database]
    done = subprocess.run(command, env={**os.environ, dbt_project.PROJECT_DIR_ENV: str(copy)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    manifest = json.loads(Path(done.stdout.strip().splitlines()[-1]).read_text())
    keys = sorted(tuple(s["meta"]["dagster"]["asset_key"]) for s in manifest["sources"].values())
    # the embedded demo config's billing source adds its tables for the joined model
    assert [key for key in keys if key[0] == server] == \
        [(server, database, t) for t in ("customers", "orders", "products")]
