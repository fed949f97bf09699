#!/usr/bin/env bash
# The entry point of the platform image (Dockerfile). Two kinds of container start from it:
#
#   * Dagster's (the code server, every run pod): the chart and the K8sRunLauncher give the
#     command as arguments; it is run as given.
#   * Spark's executors, with spark.master k8s://... (helm/values-spark-k8s.yaml): the driver (a
#     run pod) creates executor pods from spark.kubernetes.container.image, this image, with the
#     single argument `executor` and the executor's settings in SPARK_* variables. Spark's own
#     images answer that with their entrypoint; this one starts the same JVM class with pyspark's
#     jars, the Spark version of the driver (never a second Spark install that could differ).
set -euo pipefail

if [[ "${1:-}" != executor ]]; then
    exec "$@"
fi

for name in SPARK_DRIVER_URL SPARK_EXECUTOR_ID SPARK_EXECUTOR_CORES SPARK_EXECUTOR_MEMORY \
            SPARK_APPLICATION_ID SPARK_EXECUTOR_POD_IP SPARK_EXECUTOR_POD_NAME; do
    if [[ -z "${!name:-}" ]]; then
        echo "image-entrypoint.sh executor: ${name} is not set; Spark's driver sets it in the" \
             "executor pods it creates (spark.master k8s://...), nothing else should run this" >&2
        exit 2
    fi
done

spark_jars="$(python3 -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"

# The driver passes the executor's JVM options as SPARK_JAVA_OPT_0, _1, ... in that order.
java_opts=()
while IFS='=' read -r -d '' name value; do
    [[ "${name}" == SPARK_JAVA_OPT_* ]] && java_opts+=("${name#SPARK_JAVA_OPT_}=${value}")
done < <(env -0)
ordered=()
if (( ${#java_opts[@]} )); then
    while IFS= read -r -d '' entry; do
        ordered+=("${entry#*=}")
    done < <(printf '%s\0' "${java_opts[@]}" | sort -z -t= -k1,1n)
fi

exec java "${ordered[@]}" \
    -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
    -cp "${SPARK_CONF_DIR:-/opt/spark/conf}:${spark_jars}/*${SPARK_CLASSPATH:+:${SPARK_CLASSPATH}}" \
    org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
    --driver-url "${SPARK_DRIVER_URL}" \
    --executor-id "${SPARK_EXECUTOR_ID}" \
    --cores "${SPARK_EXECUTOR_CORES}" \
    --app-id "${SPARK_APPLICATION_ID}" \
    --hostname "${SPARK_EXECUTOR_POD_IP}" \
    --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
    --podName "${SPARK_EXECUTOR_POD_NAME}"
