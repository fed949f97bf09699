"""Spark on Kubernetes (``helm/values-spark-k8s.yaml``), checked without a Kubernetes cluster.

What a run pod of that layout gets is rendered from the chart's values as Helm merges them
(``test_helm_values``): its environment, with the downward API's pod IP, pod name and namespace
as stand-ins, loaded into the platform config, and the Spark settings its session starts with
(the same functions a run calls). Then Spark itself, from the pinned pyspark's jars, turns those
settings into the executor pod it would ask the API server for (``KubernetesExecutorBuilder``):
the platform image, the executors' service account, cores and memory, the driver's address.
That pod's command (``executor``) and environment are then given to the image's entry point
(``scripts/image-entrypoint.sh``) on this machine, pointed at a real driver: the executor it
starts registers and runs the driver's tasks. And the Role of ``helm/spark-k8s-rbac.yaml`` grants
the run pods' account what a driver does with executor pods.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_platform.config import is_cluster_master
from cdc_platform.lake.spark import deployment_conf
from cdc_platform_tests.deploy.test_helm_values import (
    HELM,
    POD_FIELDS,
    ROOT,
    _settings_with_values_env,
    _values,
)

ENTRYPOINT = ROOT / "scripts" / "image-entrypoint.sh"
EXECUTOR_ACCOUNT = "cdc-spark-executor"


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    return _values("spark-k8s")


@pytest.fixture(scope="module")
def deployment(values: dict[str, Any]) -> dict[str, Any]:
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    return deployment


@pytest.fixture(scope="module")
def env(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in deployment["env"]}


@pytest.fixture(scope="module")
def run_pod_conf(env: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The Spark settings a run pod's session starts with (``deployment_conf`` of the config
    the pod loads, as the Dagster resource's and dbt's sessions take it)."""
    return deployment_conf(_settings_with_values_env(env))


def _rbac() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((HELM / "spark-k8s-rbac.yaml").read_text()) if doc]


def test_run_pods_drive_executor_pods_through_the_in_cluster_api(run_pod_conf, deployment,
                                                                 env, values):
    conf = run_pod_conf
    assert conf["spark.master"] == "k8s://https://kubernetes.default.svc"
    assert is_cluster_master(conf["spark.master"])
    # executors connect to the driver at its pod's IP, and are owned by its pod in its namespace
    assert env["CDC_SPARK_DRIVER_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert conf["spark.driver.host"] == POD_FIELDS["status.podIP"]
    assert conf["spark.kubernetes.driver.pod.name"] == POD_FIELDS["metadata.name"]
    assert conf["spark.kubernetes.namespace"] == POD_FIELDS["metadata.namespace"]
    # executors run the platform image, the deployment's own
    image = deployment["image"]
    assert conf["spark.kubernetes.container.image"] == f"{image['repository']}:{image['tag']}"
    assert conf["spark.kubernetes.authenticate.executor.serviceAccountName"] == EXECUTOR_ACCOUNT
    # their size, and dynamic allocation with shuffle tracking (no external shuffle service)
    assert (conf["spark.executor.cores"], conf["spark.executor.memory"]) == ("2", "4g")
    assert conf["spark.dynamicAllocation.enabled"] == "true"
    assert conf["spark.dynamicAllocation.shuffleTracking.enabled"] == "true"
    low, initial, high = (int(conf[f"spark.dynamicAllocation.{k}"]) if k != "initial"
                          else int(conf["spark.executor.instances"])
                          for k in ("minExecutors", "initial", "maxExecutors"))
    assert 0 <= low <= initial <= high
    assert conf["spark.dynamicAllocation.shuffleTracking.timeout"]
    # the package goes to the executors with the session (whatever the image holds)
    assert conf["spark.submit.pyFiles"].endswith(".zip")
    # runs get the deployment's env (the downward API's fields included) and account
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True
    assert values["dagster-user-deployments"]["serviceAccount"]["name"] == "cdc-platform"


def test_the_values_of_other_layouts_leave_kubernetes_settings_out():
    """The config's Kubernetes entries are ``${VAR:-}``: a pod of values.yaml (local[2]) gets
    none of them, not an empty one (``spark.driver.host=""`` breaks a local session)."""
    (deployment,) = _values("s3")["dagster-user-deployments"]["deployments"]
    settings = _settings_with_values_env({item["name"]: item for item in deployment["env"]})
    assert settings.spark.master == "local[2]"
    assert not [key for key in settings.spark.conf
                if key.startswith(("spark.kubernetes.", "spark.dynamicAllocation.",
                                   "spark.executor.", "spark.driver.host"))]
    assert set(settings.spark.conf) == {"spark.driver.memory"}


def test_every_spark_setting_of_the_config_is_one_spark_knows(run_pod_conf, spark):
    """A misspelt key is silently ignored by Spark; these are checked against the registry of
    the pinned Spark's own settings (its Kubernetes ones included)."""
    jvm = spark._jvm
    jvm.org.apache.spark.deploy.k8s.Config.KUBERNETES_NAMESPACE()  # registers its settings
    settings = yaml.safe_load((HELM / "cdc-platform-config.yaml").read_text())["spark"]["conf"]
    unknown = [key for key in settings
               if jvm.org.apache.spark.internal.config.ConfigEntry.findEntry(key) is None]
    assert not unknown, f"Spark knows no setting {unknown}"


def _executor_pod(conf: dict[str, str]) -> dict[str, Any]:
    """The executor pod Spark's Kubernetes scheduler builds from ``conf`` (executor 1), in a
    JVM of its own with no SparkContext: the executors' resource profile is made from the first
    conf a JVM sees, which must be this one."""
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway()
    try:
        jvm = gateway.jvm
        spark_conf = jvm.org.apache.spark.SparkConf(False)
        for key, value in conf.items():
            spark_conf.set(key, value)
        spark_conf.set("spark.driver.port", "7078")  # (the driver's, once its context started)
        none = jvm.scala.Option.apply(None)
        kubernetes_conf = jvm.org.apache.spark.deploy.k8s.KubernetesConf.createExecutorConf(
            spark_conf, "1", "spark-application-1", none, 0)
        secret_file = jvm.org.apache.spark.internal.config.ConfigEntry.findEntry(
            "spark.authenticate.secret.file")
        security = jvm.org.apache.spark.SecurityManager(spark_conf, none, secret_file)
        profiles = jvm.java.lang.Class.forName("org.apache.spark.resource.ResourceProfile$") \
            .getField("MODULE$").get(None)  # (Scala's object: no static forwarder for this)
        profile = profiles.getOrCreateDefaultProfile(spark_conf)
        client = jvm.io.fabric8.kubernetes.client.KubernetesClientBuilder().build()
        try:
            built = jvm.org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBuilder() \
                .buildFromFeatures(kubernetes_conf, security, client, profile).pod()
            as_json = jvm.io.fabric8.kubernetes.client.utils.Serialization.asJson
            return {"namespace": kubernetes_conf.namespace(),
                    "pod": json.loads(as_json(built.pod())),
                    "container": json.loads(as_json(built.container()))}
        finally:
            client.close()
    finally:
        gateway.shutdown()
        gateway.proc.stdin.close()  # the JVM exits when its stdin closes
        gateway.proc.wait(60)


@pytest.fixture(scope="module")
def executor_pod(run_pod_conf: dict[str, str], spark: Any) -> dict[str, Any]:
    """The executor pod of a run pod's session. A driver's SparkContext adds the JVM options
    Spark needs on Java 17 (``--add-opens``) to ``spark.executor.extraJavaOptions`` when it
    starts, before it builds a pod; here they are taken from a real context's conf."""
    options = spark.sparkContext.getConf().get("spark.executor.extraJavaOptions")
    assert "--add-opens" in options
    return _executor_pod({**run_pod_conf, "spark.executor.extraJavaOptions": options})


def test_spark_builds_executor_pods_of_the_platform_image_and_account(executor_pod,
                                                                      run_pod_conf):
    """What Spark would ask the API server for: the platform image, told to be an executor,
    run as the executors' account, sized by the values, connecting to the run pod's IP."""
    pod, container = executor_pod["pod"], executor_pod["container"]
    assert container["image"] == run_pod_conf["spark.kubernetes.container.image"]
    assert container["args"] == ["executor"]
    assert pod["spec"]["serviceAccountName"] == EXECUTOR_ACCOUNT
    assert executor_pod["namespace"] == POD_FIELDS["metadata.namespace"]
    variables = {item["name"]: item.get("value") for item in container["env"]}
    assert variables["SPARK_DRIVER_URL"] == \
        f"spark://CoarseGrainedScheduler@{POD_FIELDS['status.podIP']}:7078"
    assert (variables["SPARK_EXECUTOR_CORES"], variables["SPARK_EXECUTOR_MEMORY"]) == \
        ("2", "4096m")
    resources = container["resources"]
    assert resources["requests"]["cpu"] == "2"
    # 4g of heap and Spark's overhead (10%, at least 384 MiB), the pod's request and limit
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == "4505Mi"


@pytest.fixture(scope="module")
def lone_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A standalone master with no worker: the only executor a driver of it gets is the one
    a test starts itself."""
    from cdc_platform.devservices.spark_daemons import SparkMaster

    with SparkMaster(tmp_path_factory.mktemp("lone-master")) as master:
        yield master


@pytest.mark.integration
def test_the_images_entry_point_starts_the_executor_spark_asks_for(executor_pod, lone_master,
                                                                   tmp_path):
    """``image-entrypoint.sh`` with the arguments and environment of the executor pod Spark
    built, the driver's address replaced by a real driver's (a child process: its session is
    a standalone application with no worker): the executor registers, and the driver's job
    runs on it."""
    container = executor_pod["container"]
    pod_env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    java_options = {value for name, value in pod_env.items() if name.startswith("SPARK_JAVA_OPT_")}
    assert {"-Dspark.driver.port=7078", "--add-opens=java.base/java.nio=ALL-UNNAMED"} <= \
        java_options  # (the entry point passes them to the JVM, in their order)
    pod_env.update(SPARK_EXECUTOR_POD_IP="127.0.0.1", SPARK_EXECUTOR_POD_NAME="executor-1",
                   SPARK_EXECUTOR_MEMORY="512m", SPARK_EXECUTOR_CORES="1",
                   SPARK_LOCAL_DIRS=str(tmp_path / "executor-local"),
                   SPARK_CONF_DIR=str(tmp_path / "conf"))
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, lone_master.master_url],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    executor = None
    log = tmp_path / "executor.log"
    try:
        started = _answer(driver, None, log)
        port = started["driver_url"].rsplit(":", 1)[1]
        pod_env.update({name: f"-Dspark.driver.port={port}" for name, value in pod_env.items()
                        if value == "-Dspark.driver.port=7078"})
        pod_env.update(SPARK_DRIVER_URL=started["driver_url"],
                       SPARK_APPLICATION_ID=started["app_id"])
        # the image's PATH: its python3 (with pyspark) and java
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
        with open(log, "wb") as out:
            executor = subprocess.Popen(
                [str(ENTRYPOINT), *container["args"]], stdout=out, stderr=subprocess.STDOUT,
                env={"PATH": path, "HOME": str(tmp_path), **pod_env})
        driver.stdin.write("go\n")
        driver.stdin.flush()
        answer = _answer(driver, executor, log)
        assert answer["sum"] == sum(range(1000)) * 2
        assert answer["executors"] == ["1"], answer
    finally:
        for process in (driver, executor):
            if process is not None and process.poll() is None:
                process.kill()
            if process is not None:
                process.wait(30)


def _answer(driver: subprocess.Popen[str], executor: subprocess.Popen[bytes] | None,
            log: Path, timeout: float = 240.0) -> dict[str, Any]:
    """The driver's next line of JSON; fails with the logs if the driver or the executor
    exits first, or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([driver.stdout], [], [], 1.0)[0]:
            line = driver.stdout.readline()
            if line:
                return json.loads(line)
        for name, process in (("driver", driver), ("executor", executor)):
            if process is not None and process.poll() is not None:
                pytest.fail(f"the {name} exited ({process.returncode}); executor log:\n"
                            f"{log.read_text()[-3000:] if log.exists() else ''}\ndriver:\n"
                            f"{driver.stderr.read()[-3000:] if driver.poll() is not None else ''}")
    pytest.fail(f"no answer from the driver within {timeout:.0f} s; executor log:\n"
                f"{log.read_text()[-3000:] if log.exists() else ''}")


# A driver in a process of its own: prints its driver URL and app id, waits for a line, runs a
# job of Python tasks (on whatever executor registered), prints the result and the executors.
_DRIVER = """
import json, sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master(sys.argv[1]).config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.ui.enabled", "false")
         .getOrCreate())
context = spark.sparkContext
conf = context.getConf()
print(json.dumps({"app_id": context.applicationId, "driver_url":
    "spark://CoarseGrainedScheduler@%s:%s" % (conf.get("spark.driver.host"),
                                               conf.get("spark.driver.port"))}), flush=True)
sys.stdin.readline()
total = context.parallelize(range(1000), 4).map(lambda x: x * 2).sum()
status = context._jsc.sc().getExecutorIds()
executors = sorted(status.apply(i) for i in range(status.size()))
print(json.dumps({"sum": total, "executors": executors}), flush=True)
spark.stop()
"""


def test_the_run_pods_account_may_manage_executor_pods_and_the_executors_none(values):
    documents = _rbac()
    kinds = {doc["kind"]: doc for doc in documents}
    role, binding, account = kinds["Role"], kinds["RoleBinding"], kinds["ServiceAccount"]
    granted: dict[str, set[str]] = {}
    for rule in role["rules"]:
        if "" in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault(resource, set()).update(rule["verbs"])
    for resource in ("pods", "configmaps"):  # executor pods, and the config map they mount
        assert {"create", "get", "list", "watch", "delete"} <= granted[resource], resource
    run_pods_account = values["dagster-user-deployments"]["serviceAccount"]["name"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": run_pods_account}]
    assert account["metadata"]["name"] == EXECUTOR_ACCOUNT
    assert not [doc for doc in documents if doc["kind"] == "RoleBinding"
                and any(s["name"] == EXECUTOR_ACCOUNT for s in doc["subjects"])]
    # the executors reach S3 with the same role as the run pods
    irsa = "eks.amazonaws.com/role-arn"
    assert account["metadata"]["annotations"][irsa] == \
        values["dagster-user-deployments"]["serviceAccount"]["annotations"][irsa]
    readme = (HELM / "README.md").read_text()
    assert "kubectl -n cdc apply -f helm/spark-k8s-rbac.yaml" in readme
    assert shutil.which("bash") and os.access(ENTRYPOINT, os.X_OK)

