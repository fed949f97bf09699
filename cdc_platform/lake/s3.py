"""What a Spark session needs to reach the lake and the landing zone on S3-compatible storage.

Two clients read and write S3 in a lake session, each with its own jars:

* Iceberg's ``S3FileIO`` (AWS SDK v2) for the tables' data and metadata files, configured as
  properties of the Iceberg catalog (``catalog_s3_properties``;
  ``iceberg.catalog.catalog_properties`` adds them when the warehouse is an ``s3://`` URL). The
  REST catalog's SigV4 signer uses the same SDK.
* Hadoop's ``S3AFileSystem`` (``hadoop-aws``, AWS SDK v1) for Spark's own reads of
  ``s3a://`` URLs: the landing zone's changelog segments and chunk files
  (``capture.store.open_store`` turns ``s3://`` into ``s3a://`` for Spark), set as
  ``spark.hadoop.fs.s3a.*`` (``s3a_conf``).

The jars are not in pyspark: ``scripts/bootstrap.sh`` extracts a checksum-pinned set into
``<venv>/share/cdc-platform/s3-jars`` (``s3_jars``); a production image points
``CDC_PLATFORM_S3_JARS`` at a directory holding the Maven Central artifacts instead
(docs/iceberg.md). They are static settings: ``s3_session_conf`` gives them to a session before
it starts.

Where things come from: endpoint, region and addressing style are arguments (the config's ``s3``
section: ``s3.endpoint_url``, ``s3.region``, ``s3.path_style``), each falling back to the AWS
environment (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, ``AWS_REGION`` /
``AWS_DEFAULT_REGION``, else ``us-east-1``) as boto3 and pyarrow do: ``config.S3Settings.resolved``,
the one resolution every S3 client of the platform takes. Credentials never come from the
configuration: both clients take them from the AWS environment and default chain
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, a profile, IRSA's
web identity, instance metadata).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cdc_platform.capture.store.storage import is_s3_url
from cdc_platform.config import S3Settings

S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
# Environment first (explicit keys, as the platform's other clients take them), then the SDK's
# default chain (profile, web identity as IRSA sets it, container and instance metadata).
S3A_CREDENTIALS_PROVIDERS = ("com.amazonaws.auth.EnvironmentVariableCredentialsProvider,"
                             "com.amazonaws.auth.DefaultAWSCredentialsProviderChain")
JARS_ENV = "CDC_PLATFORM_S3_JARS"


def warehouse_on_s3(warehouse: str | None) -> bool:
    """True when a catalog's warehouse keeps its files on S3: an S3 URL, or an S3 Tables
    table bucket's ARN (the warehouse of its REST endpoint)."""
    return is_s3_url(warehouse) or str(warehouse or "").startswith("arn:aws:s3tables:")


def resolved_s3(s3: S3Settings | None) -> S3Settings:
    """The config's ``s3`` section resolved against the AWS environment
    (``S3Settings.resolved``); None (no section given): the environment alone."""
    return S3Settings.from_environment() if s3 is None else s3.resolved()


def s3_settings_of_session(get: Callable[[str], str | None]) -> S3Settings:
    """The S3 settings a Spark session was built with (``s3a_conf``'s, read with ``get``,
    e.g. ``lambda key: spark.conf.get(key, None)``): the session is where the config's ``s3``
    section reaches the lake, so an Iceberg catalog registered in it addresses S3 as its
    ``s3a`` reads do. Unset ones come from the environment; an unset addressing style is
    path-style with a custom endpoint."""
    prefix = "spark.hadoop.fs.s3a"
    path_style = get(f"{prefix}.path.style.access")
    resolved = S3Settings(endpoint_url=get(f"{prefix}.endpoint") or "",
                          region=get(f"{prefix}.endpoint.region") or "").resolved()
    return resolved.model_copy(update={"path_style": bool(resolved.endpoint_url)
                                       if path_style is None else path_style.lower() == "true"})


def s3_jars_dir() -> Path:
    """The directory of the S3 jars: ``$CDC_PLATFORM_S3_JARS``, else the one
    ``scripts/bootstrap.sh`` fills in this interpreter's environment."""
    configured = os.environ.get(JARS_ENV)
    return Path(configured) if configured else Path(sys.prefix) / "share" / "cdc-platform" / \
        "s3-jars"


def s3_jars() -> list[str]:
    """The jars a session needs for S3 (``hadoop-aws`` and the AWS SDKs), sorted by name."""
    directory = s3_jars_dir()
    jars = sorted(str(path) for path in directory.glob("*.jar")) if directory.is_dir() else []
    if not jars:
        raise FileNotFoundError(
            f"no S3 jars in {directory}: run scripts/bootstrap.sh (or `make bootstrap`), or set "
            f"{JARS_ENV} to a directory holding iceberg-aws-bundle, hadoop-aws and "
            "aws-java-sdk-bundle (docs/iceberg.md)")
    return jars


def catalog_s3_properties(s3: S3Settings | None = None) -> dict[str, str]:
    """The Iceberg catalog properties for tables on S3 through ``S3FileIO``.

    ``s3``: the config's ``s3`` section, or None (the environment).
    """
    endpoint = resolved_s3(s3)
    props = {
        "io-impl": S3_FILE_IO,
        "client.region": endpoint.region,
        "s3.path-style-access": str(endpoint.path_style).lower(),
    }
    if endpoint.endpoint_url:
        props["s3.endpoint"] = endpoint.endpoint_url
    return props


def s3a_conf(s3: S3Settings | None = None) -> dict[str, str]:
    """The ``spark.hadoop.fs.s3a.*`` settings for Spark's reads of ``s3a://`` (and ``s3://``)
    URLs: endpoint, region, addressing style and the credentials providers."""
    endpoint = resolved_s3(s3)
    prefix = "spark.hadoop.fs.s3a"
    conf = {
        "spark.hadoop.fs.s3a.impl": S3A_FILESYSTEM,
        # ``s3://`` URLs (a Hadoop catalog's warehouse, a user's reads) go through S3A too.
        "spark.hadoop.fs.s3.impl": S3A_FILESYSTEM,
        f"{prefix}.aws.credentials.provider": S3A_CREDENTIALS_PROVIDERS,
        f"{prefix}.path.style.access": str(endpoint.path_style).lower(),
        f"{prefix}.endpoint.region": endpoint.region,
    }
    if endpoint.endpoint_url:
        conf[f"{prefix}.endpoint"] = endpoint.endpoint_url
        conf[f"{prefix}.connection.ssl.enabled"] = str(
            urlparse(endpoint.endpoint_url).scheme.lower() != "http").lower()
    return conf


def s3_session_conf(s3: S3Settings | None = None) -> dict[str, str]:
    """The static settings of a session that reads or writes S3: the S3 jars on
    ``spark.jars``, and ``s3a_conf``. (The Iceberg runtime is every lake session's:
    ``lake.spark.DEFAULT_CONF``, which ``merge_conf`` joins these jars to.)"""
    return {"spark.jars": ",".join(s3_jars()), **s3a_conf(s3)}


def settings_use_s3(settings: Any) -> bool:
    """True when a ``config.Settings``'s landing zone or warehouse is on S3: an S3 URL or
    table bucket, a Glue catalog, or a catalog whose properties name ``S3FileIO`` (a REST
    service whose warehouse is a name, as Polaris's)."""
    catalog = getattr(settings.warehouse, "catalog", None)
    return (is_s3_url(settings.landing_zone.url) or warehouse_on_s3(settings.warehouse.url)
            or getattr(catalog, "type", None) == "glue"
            or (getattr(catalog, "properties", None) or {}).get("io-impl") == S3_FILE_IO)


def settings_s3_conf(settings: Any) -> dict[str, str]:
    """The session settings a ``config.Settings`` needs beyond ``spark.DEFAULT_CONF``:
    ``s3_session_conf`` of its ``s3`` section when its landing zone or warehouse is on S3, else
    none."""
    return s3_session_conf(getattr(settings, "s3", None)) if settings_use_s3(settings) else {}


# ---- start check: the warehouse and its catalog answer, as the session will ask them --------

_CHECK_TIMEOUT_SECONDS = 10.0


def check_warehouse(properties: dict[str, str]) -> None:
    """Raise ``ObjectStoreError`` with one line naming the setting to fix (``warehouse.url``,
    ``warehouse.catalog.uri``, ``warehouse.catalog.properties``, ``s3.*``) unless the lake's
    catalog (its Spark properties, ``iceberg.catalog.catalog_properties``) can be used: a REST
    catalog answers at its URI, accepts this environment's credentials and serves the
    warehouse; a warehouse on S3 is a bucket the credentials may use. Other catalogs (JDBC,
    Hive, Glue) and local warehouses are not checked here. Before any Spark statement, whose
    failures are Java stack traces."""
    from cdc_platform.capture.store.s3store import S3FileStore
    from cdc_platform.config import S3Settings

    warehouse = properties.get("warehouse", "")
    if properties.get("type") == "rest":
        _check_rest_catalog(properties)
    if is_s3_url(warehouse):
        options = S3Settings(endpoint_url=properties.get("s3.endpoint", ""),
                             region=properties.get("client.region", ""),
                             path_style=properties.get("s3.path-style-access") == "true")
        S3FileStore.from_url(warehouse, options, setting="warehouse.url").check()


def _check_rest_catalog(properties: dict[str, str]) -> None:
    from cdc_platform.capture.store.s3store import ObjectStoreError

    uri = properties.get("uri", "").rstrip("/")
    warehouse = properties.get("warehouse", "")
    where = f"warehouse.catalog.uri {uri}"
    status, answer = _rest_get(properties, f"{uri}/v1/config?"
                               + urllib.parse.urlencode({"warehouse": warehouse}))
    if status is None:
        raise ObjectStoreError(f"{where}: cannot reach the Iceberg REST catalog ({answer}); "
                               "check the URI and that the catalog service runs")
    if status in (401, 403):
        raise ObjectStoreError(_refused(where, status, answer, properties))
    if status != 200:
        raise ObjectStoreError(f"{where}: the Iceberg REST catalog answered {status} "
                               f"({_message(answer)}) for its config; is it an Iceberg REST "
                               "catalog URI (its /v1/config)?")
    prefix = str(_json(answer).get("overrides", {}).get("prefix", "") or "")
    listing = f"{uri}/v1/{urllib.parse.quote(prefix, safe='')}/namespaces" if prefix else \
        f"{uri}/v1/namespaces"
    status, answer = _rest_get(properties, listing)
    if status is None:
        raise ObjectStoreError(f"{where}: cannot reach the Iceberg REST catalog ({answer}); "
                               "check the URI and that the catalog service runs")
    if status in (401, 403):
        raise ObjectStoreError(_refused(where, status, answer, properties))
    if status == 404:
        raise ObjectStoreError(
            f"warehouse.url {warehouse}: the Iceberg REST catalog at {uri} has no such "
            f"warehouse ({_message(answer)}); create it (on SeaweedFS or S3 Tables: a table "
            "bucket) or fix warehouse.url")
    if status != 200:
        raise ObjectStoreError(
            f"warehouse.url {warehouse}: the Iceberg REST catalog at {uri} answered {status} "
            f"listing its namespaces ({_message(answer)}); is it a warehouse of this catalog "
            "(on SeaweedFS or S3 Tables: a table bucket, not a plain bucket)?")


def _rest_get(properties: dict[str, str], url: str) -> tuple[int | None, str]:
    """``(status, body)`` of a GET as the session's REST client sends it (SigV4-signed when
    ``rest.auth.type`` is ``sigv4`` or ``rest.sigv4-enabled``, a bearer ``token`` if one is
    set), or ``(None, reason)`` when the catalog cannot be reached."""
    headers: dict[str, str] = {}
    if properties.get("token"):
        headers["Authorization"] = f"Bearer {properties['token']}"
    if _signs(properties):
        import boto3
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        session = boto3.session.Session()
        credentials = session.get_credentials()
        if credentials is not None:
            region = (properties.get("rest.signing-region") or properties.get("client.region")
                      or S3Settings().resolved(session.region_name).region)
            request = AWSRequest(method="GET", url=url)
            SigV4Auth(credentials.get_frozen_credentials(),
                      properties.get("rest.signing-name", "execute-api"), region
                      ).add_auth(request)
            headers.update(dict(request.headers.items()))
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=_CHECK_TIMEOUT_SECONDS) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except (OSError, ValueError) as error:  # URLError, refused, timed out, a malformed URI
        reason = getattr(error, "reason", None) or error
        return None, " ".join(str(reason).split())


def _signs(properties: dict[str, str]) -> bool:
    return (properties.get("rest.auth.type", "").lower() == "sigv4"
            or properties.get("rest.sigv4-enabled", "").lower() == "true")


def _refused(where: str, status: int, answer: str, properties: dict[str, str]) -> str:
    if not _signs(properties):
        return (f"{where}: the Iceberg REST catalog refused the request ({status} "
                f"{_message(answer)}); set its authentication in warehouse.catalog.properties")
    import boto3

    from cdc_platform.capture.store.s3store import credentials_source

    held = credentials_source(boto3.session.Session())
    return (f"{where}: the Iceberg REST catalog refused the request ({status} "
            f"{_message(answer)}) signed with the AWS credentials from the environment "
            f"({held}); fix the credentials, or rest.signing-name / rest.signing-region in "
            "warehouse.catalog.properties")


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _message(answer: str) -> str:
    """The catalog's error message (Iceberg REST's ``{"error": {"message": ...}}``), short."""
    error = _json(answer).get("error")
    text = error.get("message", "") if isinstance(error, dict) else answer
    return " ".join(str(text).split())[:300] or "no message"
