# The user-code image for the Dagster Helm chart (helm/): the cdc_platform package, a Java 17
# runtime for PySpark, and the dbt project with its manifest prepared at build time. The chart's
# user deployment runs it as a code server; the K8sRunLauncher starts every run pod from it.
#
#   docker build -t registry.example.com/cdc-platform:0.1.0 .
#
# DBT_MANIFESTS lists the <server>:<database> pairs whose dbt manifest is prepared now (the
# config's source.server_name and the captured database holding the inventory tables); any
# other pair is parsed once when the code server starts.
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYSPARK_PYTHON=python3 \
    CDC_DBT_PROJECT_DIR=/opt/cdc_platform/dbt_project \
    DBT_SEND_ANONYMOUS_USAGE_STATS=false

WORKDIR /opt/cdc_platform
# (setup.py builds the native rows decoder, capture/binlog/_rowcodec.c, and the chunk reader,
# capture/snapshot/_rawrows.c, against libmariadb-dev, with gcc and the image's Python headers;
# the build fails unless both import)
COPY pyproject.toml setup.py README.md ./
COPY cdc_platform ./cdc_platform
# mysqlclient (snapshot chunk reads) has no Linux wheel: pip builds it against libmariadb.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libmariadb-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
# The lake's Iceberg Spark runtime (iceberg-spark-runtime-3.5_2.12-1.10.2.jar) comes with the
# project's dependencies: the pinned wheel snowpark-connect-deps-iceberg==1.0.2 holds it, and
# lake.spark.DEFAULT_CONF puts it on spark.jars at session start
# (lake.iceberg.catalog.iceberg_jar), as in development. Nothing is copied or downloaded here;
# the build fails unless the jar is the one scripts/bootstrap.sh checks. Jars a catalog needs
# besides (docs/iceberg.md) go into the config's spark.conf.
ARG ICEBERG_JAR_SHA256=c562d482dcd16b666e808b755469fbc4b2604284b41622c9d87e2c02b7cc6c5f
RUN pip install ".[k8s]" \
    && python -c "import cdc_platform.capture.binlog._rowcodec, cdc_platform.capture.snapshot._rawrows" \
    && jar="$(python -c 'from cdc_platform.lake.iceberg.catalog import iceberg_jar; print(iceberg_jar())')" \
    && echo "${ICEBERG_JAR_SHA256}  ${jar}" | sha256sum --check --strict

# S3 (a landing zone or warehouse at s3://, docs/iceberg.md): Iceberg's S3FileIO and REST
# signing (iceberg-aws-bundle, the Iceberg runtime's version) and Spark's s3a reads (hadoop-aws
# of pyspark's Hadoop, with the AWS SDK bundle it was built against), from Maven Central, each
# checked against the SHA-1 Maven publishes beside it; lake.s3.s3_jars finds them through
# CDC_PLATFORM_S3_JARS. Development takes the same classes from a PyPI wheel
# (scripts/bootstrap.sh).
ARG MAVEN=https://repo1.maven.org/maven2
ARG S3_JARS="org/apache/iceberg/iceberg-aws-bundle/1.10.2/iceberg-aws-bundle-1.10.2.jar \
org/apache/hadoop/hadoop-aws/3.3.4/hadoop-aws-3.3.4.jar \
com/amazonaws/aws-java-sdk-bundle/1.12.262/aws-java-sdk-bundle-1.12.262.jar"
ENV CDC_PLATFORM_S3_JARS=/opt/cdc_platform/s3-jars
RUN mkdir -p "${CDC_PLATFORM_S3_JARS}" && for path in ${S3_JARS}; do \
        python -c 'import hashlib, sys, urllib.request as u; url, out = sys.argv[1:]; \
data = u.urlopen(url).read(); sha1 = u.urlopen(url + ".sha1").read().split()[0].decode(); \
assert hashlib.sha1(data).hexdigest() == sha1, f"{url}: SHA-1 differs"; \
open(out, "wb").write(data)' "${MAVEN}/${path}" "${CDC_PLATFORM_S3_JARS}/${path##*/}" \
        || exit 1; \
    done

COPY dbt_project ./dbt_project
ARG DBT_MANIFESTS="demo:inventory"
RUN for pair in ${DBT_MANIFESTS}; do \
        python -m cdc_platform.defs.dbt.project prepare \
            --server "${pair%%:*}" --database "${pair#*:}" || exit 1; \
    done

# dbt writes each run's artefacts under dbt_project/target; Spark needs a writable /tmp.
RUN useradd --uid 10001 --create-home cdc && chown -R cdc /opt/cdc_platform/dbt_project
USER 10001

# Dagster's containers run the command they are given; Spark on Kubernetes starts executor pods
# from this image with the argument `executor` (helm/values-spark-k8s.yaml).
COPY scripts/image-entrypoint.sh /usr/local/bin/image-entrypoint.sh
ENTRYPOINT ["/usr/local/bin/image-entrypoint.sh"]

EXPOSE 3030
CMD ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", "3030", "-m", "cdc_platform.definitions"]
