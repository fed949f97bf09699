"""Typed settings: one YAML file, loaded once, validated with errors that name the bad key.

The file's path comes from ``CDC_PLATFORM_CONFIG``; without it the embedded demo config
(``cdc_platform/demo/demo.yaml``) is used, so ``make demo`` and ``make ui`` need no setup.
Values may reference environment variables as ``${NAME}`` or ``${NAME:-default}``; secrets are
never written in the file: the source password is read from the variable ``password_env`` names.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, get_args, get_origin
from urllib.parse import urlparse

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

CONFIG_ENV = "CDC_PLATFORM_CONFIG"
DEMO_CONFIG = Path(__file__).parent / "demo" / "demo.yaml"

_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(ValueError):
    """The config file is missing, unreadable or invalid; the message names the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def default_of(section: type[BaseModel], name: str) -> Any:
    """The default of setting ``name`` of ``section`` as this schema declares it.

    The option types that code builds without a config file (the engine's, the applier's: in
    tests, the bench, embedding) take their defaults from here, so each default is written once
    and a changed default changes every caller."""
    return section.model_fields[name].get_default(call_default_factory=True)


class SourceSettings(_Section):
    """The MySQL 8 / MariaDB read replica to capture from."""

    flavour: Literal["mariadb", "mysql"] = Field(
        description="Server family: decides the GTID format and the watermark queries."
    )
    host: str = Field(description="Host name or address of the replica.")
    port: int = Field(default=3306, ge=1, le=65535, description="TCP port of the replica.")
    user: str = Field(
        description="Account with SELECT, REPLICATION SLAVE, REPLICATION CLIENT only."
    )
    password_env: str = Field(
        default="CDC_SOURCE_PASSWORD",
        description="Name of the environment variable holding the account's password.",
    )
    server_id: int = Field(
        ge=1, le=2**32 - 1,
        description="Replica server id the engine registers with; unique among the source's replicas.",
    )
    server_name: str = Field(
        pattern=r"^[a-z][a-z0-9_]{0,62}$",
        description="Logical server name: names the landing-zone folder, the asset key prefix "
        "and the key of signal messages. Lower-case letters, digits, underscores.",
    )
    connect_timeout_seconds: float = Field(default=10.0, gt=0, description="TCP connect timeout.")

    def password(self) -> str:
        """The password from the environment (empty when the variable is unset)."""
        return os.environ.get(self.password_env, "")

    def connection_settings(self) -> dict[str, Any]:
        """Keyword arguments for ``pymysql.connect`` (and mysql-replication)."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password(),
            "connect_timeout": self.connect_timeout_seconds,
            "charset": "utf8mb4",
        }


class TableFilter(_Section):
    include: tuple[str, ...] = Field(
        default=(".*",),
        description="Regular expressions matched (fully) against `database.table`, written "
        "plainly (`my.db.orders`) or as the table id (a database name with a dot "
        "backtick-quoted, `` `my.db`.orders ``); a table is captured when one matches either "
        "form and no `exclude` pattern matches either.",
    )
    exclude: tuple[str, ...] = Field(
        default=(), description="Regular expressions of `database.table` never captured."
    )

    @field_validator("include", "exclude")
    @classmethod
    def _compile(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"invalid regular expression {pattern!r}: {error}") from None
        return patterns


class ReconnectSettings(_Section):
    initial_backoff_seconds: float = Field(
        default=0.5, gt=0, description="First wait before reconnecting after a dropped connection."
    )
    max_backoff_seconds: float = Field(
        default=30.0, gt=0, description="Ceiling of the exponential backoff between attempts."
    )
    max_attempts: int = Field(
        default=0, ge=0,
        description="Consecutive failed attempts before the engine fails the run; 0 = no limit.",
    )


class CaptureSettings(_Section):
    """What the engine captures and how it batches."""

    tables: TableFilter = Field(default_factory=TableFilter, description="Table filter.")
    excluded_columns: tuple[str, ...] = Field(
        default=(),
        description="Regular expressions matched against `database.table.column` (a database or "
        "table name with a dot backtick-quoted); matching "
        "columns never leave the engine (e.g. personal data).",
    )
    surrogate_keys: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Key columns of tables without a primary key, as `database.table: [col, "
        "...]`. They must identify rows (unique, NULL counting as a value). Target tables merge "
        "by them and snapshots chunk by them; a table without a primary key or surrogate key is "
        "landed but gets no target and its snapshots are skipped.",
    )
    heartbeat_interval_seconds: float = Field(
        default=5.0, gt=0, le=3600,
        description="Source heartbeat period: keeps an idle stream alive and lag measurable "
        "(the engine asks for them at least every 0.025 s, `HEARTBEAT_MAX_SECONDS`, so that "
        "on an idle source snapshot chunks and lone commits do not wait for one).",
    )
    flush_interval_seconds: float = Field(
        default=1.0, gt=0,
        description="Longest time a committed transaction waits in memory before it lands "
        "(stretched when a flush would write many tables' segments: "
        "`flush_max_segments_per_second`).",
    )
    flush_max_rows: int = Field(
        default=50_000, ge=1, description="Buffered rows that force a flush before the interval."
    )
    flush_max_segments_per_second: int = Field(
        default=100, ge=0,
        description="A flush writes a segment per table with new records; when many tables "
        "change now and then, flushes come less often than `flush_interval_seconds` (at most "
        "10 s apart) so that they write at most this many segments a second on average: each "
        "segment costs a file in the engine, a read in the applier and one in retention, "
        "whatever its records (500 commits/s spread over 1,000 tables, flushed every second, "
        "kept the lake 100 s behind; every 8 s, 64 s). 0: every `flush_interval_seconds`.",
    )
    transaction_memory_bytes: int = Field(
        default=64 * 1024 * 1024, ge=0,
        description="Estimated memory one open (or XA-prepared) transaction may hold; beyond it "
        "its rows spill to files under the landing zone's `spill/` folder, deleted once the "
        "transaction landed or rolled back. 0 keeps every transaction in memory.",
    )
    initial_position: str = Field(
        default="earliest",
        description="Where a first start (no checkpoint yet) reads from: `earliest` (the oldest "
        "binlog still on the source), `current` (only changes from now on) or an explicit GTID "
        "position/set in the source's format. Ignored once a checkpoint exists.",
    )
    resnapshot_on_ddl: bool = Field(
        default=True,
        description="Re-snapshot a table automatically (a Dagster sensor requests a run of its "
        "snapshot asset) after a DDL changed its rows without row events (TRUNCATE, RENAME "
        "TABLE, partition DROP/EXCHANGE, ADD COLUMN with a default, type changes, ...; not a "
        "RENAME COLUMN, which the lake follows). Off: the target is still marked stale "
        "(metadata, the `not_stale` check) until you snapshot it.",
    )
    snapshot_mode: Literal["initial", "when_needed", "never"] = Field(
        default="initial",
        description="When the platform snapshots tables by itself (read-only incremental "
        "snapshots, launched as runs of the snapshot assets by a sensor). `initial`: on a first "
        "start (no checkpoint) every captured table with a key, and later every table that "
        "becomes captured while already holding rows (a widened filter, a RENAME TABLE into the "
        "captured set, a table first seen by its row events). `when_needed`: as `initial`, and "
        "when the binlog the checkpoint needs was purged the engine restarts at the source's "
        "current GTID set and snapshots every captured table instead of stopping. `never`: "
        "only signals and DDL re-snapshots start snapshots.",
    )
    max_parallel_snapshots: int = Field(
        default=2, ge=1,
        description="Snapshot runs the platform launches by itself (snapshot_mode, DDL "
        "re-snapshots) that may run at the same time; more wait, queued by the sensor.",
    )
    snapshot_readers: int = Field(
        default=4, ge=1, le=64,
        description="Tables one snapshot run reads at the same time (reader threads of the "
        "run's process, smallest tables first); each holds two source connections. A run's "
        "`parallel_tables` overrides it.",
    )
    tables_per_snapshot_run: int = Field(
        default=500, ge=1,
        description="Most tables in one snapshot run the platform launches by itself: a run "
        "costs seconds to start, so tables waiting together are snapshotted by few runs.",
    )
    rows_per_snapshot_run: int = Field(
        default=5_000_000, ge=1,
        description="Estimated rows (information_schema.TABLES) the platform puts in one "
        "snapshot run at most: small tables go together, smallest first, and a table above it "
        "gets a run of its own, so a large table does not hold many small ones back.",
    )
    reconnect: ReconnectSettings = Field(default_factory=ReconnectSettings)
    system_databases: tuple[str, ...] = Field(
        default=("mysql", "information_schema", "performance_schema", "sys"),
        description="Databases never captured, whatever the filter says.",
    )

    @field_validator("excluded_columns")
    @classmethod
    def _compile_columns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        return TableFilter._compile(patterns)


class LandingZoneSettings(_Section):
    url: str = Field(
        description="Directory (local path or file:// URL; relative paths are resolved against "
        "the working directory), or object-store prefix `s3://bucket/prefix` (see the `s3` "
        "section), holding changelog segments and the engine checkpoint."
    )
    retention_hours: float = Field(
        default=1.0, ge=0,
        description="Changelog segments are deleted once every target has consumed them (its "
        "Iceberg mark is past them) and they are older than this; committed snapshot chunks "
        "and their manifests once their rows are in the changelog. 0: as soon as consumed.",
    )


def is_cluster_master(master: str) -> bool:
    """Whether a Spark master runs tasks outside the driver's process (``spark://``,
    ``k8s://``, ``yarn``, ``local-cluster[...]``), where executors may be on other hosts; not
    ``local`` and ``local[N]``."""
    return not re.fullmatch(r"local(\[[^\]]*\])?", master.strip())


def _local_path(url: str, plain_names_are_paths: bool) -> bool:
    """Whether ``url`` names this machine's files: ``file:`` or an absolute path, or (where
    the reader takes a plain name as a relative path) any URL without a scheme."""
    scheme = urlparse(url).scheme.lower()
    return scheme == "file" or (scheme == "" and (plain_names_are_paths or url.startswith("/")))


class SparkSettings(_Section):
    master: str = Field(
        default="local[2]",
        description="Spark master URL: `local[N]` runs Spark's work in the process that needs "
        "it; a cluster (`spark://host:7077`, `k8s://https://...`) runs it on executors, which "
        "then need the landing zone and the warehouse on S3 (or `shared_filesystem`).")
    app_name: str = Field(default="cdc_platform", description="Spark application name.")
    conf: dict[str, str] = Field(
        default_factory=dict, description="Extra Spark configuration, e.g. executor memory. An "
        "entry whose value is empty (a `${VAR:-}` whose variable is unset) is left out, so "
        "Spark's default applies: one config serves pods with and without a setting "
        "(helm/values-spark-k8s.yaml sets the Kubernetes ones).")
    shared_filesystem: bool = Field(
        default=False,
        description="With a cluster `master`: every Spark worker mounts a local "
        "`landing_zone.url` and `warehouse.url` at the same paths as the platform's pods (an "
        "NFS or ReadWriteMany volume). Without it, local paths with a cluster master are "
        "refused at start: executors on other hosts would not find the files.")

    @field_validator("conf")
    @classmethod
    def _unset_entries_left_out(cls, conf: dict[str, str]) -> dict[str, str]:
        return {key: value for key, value in conf.items() if str(value).strip()}


class CatalogSettings(_Section):
    """The Iceberg catalog holding the lake tables (docs/iceberg.md has an example of each)."""

    type: Literal["hadoop", "rest", "jdbc", "hive", "glue"] = Field(
        default="hadoop",
        description="Catalog implementation. `hadoop` (the embedded default) keeps the tables' "
        "metadata under `warehouse.url` and needs no service; `rest`, `jdbc`, `hive` and "
        "`glue` name a catalog service (set `uri`, and `properties` as it needs).",
    )
    name: str = Field(
        default="lake", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The Spark catalog name the tables appear under, in the platform's Spark "
        "sessions and in dbt's (`<name>.<server>_<db>.<table>`).",
    )
    uri: str = Field(
        default="",
        description="The catalog service's URI (`rest`: `http://...`, `jdbc`: a JDBC URL, "
        "`hive`: `thrift://...`); unused by `hadoop` and `glue`.",
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="Further Iceberg catalog properties, passed as "
        "`spark.sql.catalog.<name>.<key>` (credentials, `io-impl`, `jdbc.user`, ...).",
    )


class WarehouseSettings(_Section):
    url: str = Field(
        description="Where the lake's Iceberg tables keep their data and metadata files (a "
        "local path or file:// URL, or an object-store URL with a catalog service).")
    catalog: CatalogSettings = Field(default_factory=CatalogSettings)
    snapshot_retention_hours: float = Field(
        default=72.0, gt=0,
        description="The maintenance job expires table snapshots older than this (time travel "
        "reaches back this far; a dbt run shorter than it never loses files under it).",
    )
    min_snapshots_to_keep: int = Field(
        default=10, ge=1,
        description="Snapshots the maintenance job keeps per table, however old they are.",
    )
    maintenance_cron: str = Field(
        default="0 3 * * *",
        description="When the `lake_maintenance` schedule runs compaction and snapshot expiry "
        "(the schedule starts stopped; turn it on in the UI or run the job by hand).",
    )


#: The signing region when neither the config, the environment nor a profile names one.
S3_DEFAULT_REGION = "us-east-1"


class S3Settings(_Section):
    """How to reach S3-compatible object storage, for `s3://` URLs of `landing_zone.url` and
    `warehouse.url`. Credentials are never set here: they come from the standard AWS chain
    (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, IRSA's web identity, instance
    metadata); docs/object-storage.md."""

    endpoint_url: str = Field(
        default="",
        description="S3 endpoint URL, e.g. `http://seaweedfs:8333` or `https://minio.example`. "
        "Empty: AWS's endpoint for the region (or AWS_ENDPOINT_URL).",
    )
    region: str = Field(
        default="",
        description="Signing region. Empty: AWS_REGION / AWS_DEFAULT_REGION / the profile's, "
        "else `us-east-1`.",
    )
    path_style: bool = Field(
        default=False,
        description="Address buckets as `endpoint/bucket/key` (most self-hosted servers: "
        "SeaweedFS, MinIO) instead of `bucket.endpoint/key`.",
    )
    retry_mode: Literal["standard", "adaptive"] = Field(
        default="standard",
        description="botocore's retry mode for throttling (503 SlowDown), 5xx answers and "
        "timeouts; `adaptive` also rate-limits the client after throttling.",
    )
    max_attempts: int = Field(
        default=10, ge=1, le=50,
        description="Attempts of one request (first try included) before the error is raised.",
    )
    connect_timeout_seconds: float = Field(
        default=10.0, gt=0, description="TCP connect timeout of one attempt."
    )
    read_timeout_seconds: float = Field(
        default=60.0, gt=0, description="Socket read timeout of one attempt."
    )
    retry_seconds: float = Field(
        default=120.0, gt=0,
        description="How long the landing zone's store repeats a request, with backoff, while "
        "the server is away, restarting or throttling (after botocore's `max_attempts`), "
        "before the engine, a reader or retention stops with one line naming the endpoint. "
        "The engine's lease is never renewed past its expiry: it rides out outages of about "
        "half its 60 s lease.",
    )


    def resolved(self, profile_region: str | None = None) -> S3Settings:
        """This section with each empty setting filled from the AWS environment as boto3 and
        pyarrow fill it: the endpoint from ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (else
        AWS's own), the region from ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else
        ``profile_region`` (boto3's profile, where the caller has a session), else
        ``S3_DEFAULT_REGION``. The one resolution every S3 client of the platform takes: the
        landing zone's (boto3, pyarrow) and the lake's (Spark's s3a, Iceberg's S3FileIO)."""
        env = os.environ
        endpoint = (self.endpoint_url or env.get("AWS_ENDPOINT_URL_S3")
                    or env.get("AWS_ENDPOINT_URL") or "").rstrip("/")
        region = (self.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
                  or profile_region or S3_DEFAULT_REGION)
        return self.model_copy(update={"endpoint_url": endpoint, "region": region})

    @classmethod
    def from_environment(cls) -> S3Settings:
        """Where no ``s3`` section is given: all from the AWS environment, addressing buckets
        by path with a custom endpoint (self-hosted servers serve ``endpoint/bucket/key``)."""
        resolved = cls().resolved()
        return resolved.model_copy(update={"path_style": bool(resolved.endpoint_url)})

class LakeSettings(_Section):
    """How the applier (the long-running ``apply_changes`` job) keeps the lake tables fresh."""

    applier: bool = Field(
        default=True,
        description="Keep every target merged continuously: a sensor keeps one run of the "
        "`apply_changes` job going (relaunched when it ends or its process dies). Off: targets "
        "change only when `materialise_targets` runs.",
    )
    freshness_seconds: float = Field(
        default=60.0, gt=0,
        description="The promise: while the stream runs, every target reflects the changelog "
        "up to at most this many seconds ago. Each target's freshness check fails beyond it.",
    )
    poll_seconds: float = Field(
        default=2.0, gt=0,
        description="How often the applier looks for new changelog records; a table with new "
        "records is merged at once (one Iceberg commit per table per merge), unless it was "
        "merged less than `merge_interval_seconds` ago.",
    )
    merge_interval_seconds: float = Field(
        default=5.0, ge=0,
        description="A table is merged at most once per this interval (from the start of one "
        "merge to the start of the next): a longer interval merges more records per merge, "
        "with fewer Iceberg commits, files and snapshots. Most merges take milliseconds "
        "without Spark (pyarrow and pyiceberg); Spark's MERGE, for schema changes and very "
        "large batches, costs seconds whatever its size. Freshness is about this interval plus "
        "the time a pass over every busy table takes.",
    )
    merge_parallelism: int = Field(
        default=0, ge=0, le=64,
        description="Tables the applier merges at once (threads of its process; never one "
        "table twice at once). Merges without Spark spend their time in pyarrow's reads and "
        "writes and, on object storage, waiting on requests, so they overlap; Spark's take "
        "turns. 0: 4, or 16 when the landing zone or the warehouse is on object storage "
        "(a merge there is a dozen requests).",
    )
    reconcile_every_merges: int = Field(
        default=0, ge=0,
        description="The applier reconciles a target against the source after this many merges "
        "of it (0: by reconcile_interval_minutes only).",
    )
    reconcile_interval_minutes: float = Field(
        default=60.0, ge=0,
        description="The applier reconciles each target at least this often, when it has "
        "caught up with the changelog (0: by reconcile_every_merges only).",
    )
    max_snapshots: int = Field(
        default=1000, ge=10,
        description="Snapshots the applier keeps per table at most: a merge every few seconds "
        "would otherwise keep `warehouse.snapshot_retention_hours` of them, and every commit "
        "rewrites metadata that lists them all. Time travel reaches back this many merges (or "
        "the retention, whichever is shorter).",
    )
    compact_min_files: int = Field(
        default=64, ge=2,
        description="The applier compacts a target (Iceberg's rewrite actions) once it has this "
        "many data and delete files.",
    )
    compact_delete_ratio: float = Field(
        default=0.2, gt=0, le=1,
        description="... or once its delete files hold this share of its rows.",
    )


class ReconcileSettings(_Section):
    range_rows: int = Field(
        default=10_000, ge=1,
        description="Rows per key range whose checksums are compared; mismatching ranges are "
        "drilled into row by row.",
    )
    sample_keys: int = Field(default=10, ge=0, description="Sample keys reported per category.")


_TOPIC = r"^[A-Za-z0-9._-]{1,249}$"


class KafkaSettings(_Section):
    bootstrap_servers: str = Field(
        default="",
        description="Kafka bootstrap servers (`host:port,...`). In `signals.kafka`: of the "
        "signal and notification topics, empty: no signals (the signal sensor skips each tick "
        "saying so). In `change_topics.kafka`: of the change topics, empty: `signals.kafka`'s.",
    )
    config: dict[str, str] = Field(
        default_factory=dict,
        description="Extra librdkafka client settings, e.g. `security.protocol`, "
        "`sasl.mechanism`, `sasl.username`, `sasl.password: ${KAFKA_PASSWORD}`. In "
        "`change_topics.kafka` without bootstrap servers of its own, they extend "
        "`signals.kafka.config` (e.g. `message.max.bytes` for large rows).",
    )


class SignalSettings(_Section):
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    topic: str = Field(
        default="cdc-signals", pattern=_TOPIC,
        description="Signal topic (one partition; created if missing). Messages are keyed by "
        "`source.server_name`, so several sources may share it.",
    )
    notification_topic: str = Field(
        default="cdc-notifications", pattern=r"^$|" + _TOPIC,
        description="Topic for snapshot progress notifications (Debezium's format; created if "
        "missing). Empty: notifications only in the snapshot runs' logs.",
    )
    sensor_interval_seconds: int = Field(
        default=5, ge=1, le=3600, description="Seconds between the signal sensor's ticks."
    )
    read_budget_seconds: float = Field(
        default=10.0, gt=0, le=40,
        description="Longest a sensor tick reads the topic (Dagster gives a tick 60 s).",
    )
    max_messages_per_tick: int = Field(
        default=500, ge=1, le=10_000, description="Signal messages read per sensor tick at most."
    )
    max_message_bytes: int = Field(
        default=256 * 1024, ge=1024, le=16 * 1024 * 1024,
        description="Larger signal messages are skipped unread (with a reason in the log).",
    )


class ChangeTopicSettings(_Section):
    """Debezium-envelope change events on Kafka topics, one per table (docs/change-topics.md):
    the publisher (``publish_changes``) reads the landing zone from its own position."""

    enabled: bool = Field(
        default=False,
        description="Publish this source's row changes to Kafka topics. The `publish_changes` "
        "job (kept running by its sensor) publishes; landing-zone retention waits for it.",
    )
    kafka: KafkaSettings = Field(
        default_factory=KafkaSettings,
        description="The brokers of the change topics; an empty `bootstrap_servers` means "
        "those of the signal topic, with their `config` (`signals.kafka`), which this `config` "
        "extends.",
    )
    prefix: str = Field(
        default="", pattern=r"^$|^[A-Za-z0-9._-]{1,200}$",
        description="Debezium's `topic.prefix`: topics are `<prefix>.<database>.<table>` (each "
        "character a topic name cannot hold becomes `_`) and `source.name` says it. Empty: the "
        "source's `server_name`.",
    )
    tables: TableFilter = Field(
        default_factory=TableFilter,
        description="Which captured tables publish (patterns as `capture.tables`); by default "
        "every captured table.",
    )
    tombstones_on_delete: bool = Field(
        default=True,
        description="After each delete event, a tombstone (the key, a null value) for log "
        "compaction, as Debezium's `tombstones.on.delete`.",
    )
    schemas_enable: bool = Field(
        default=True,
        description="The JSON converter's `schemas.enable`: each key and value is "
        "`{\"schema\": ..., \"payload\": ...}`; false: the payload alone.",
    )
    transactions: bool = Field(
        default=True,
        description="Publish each batch in a Kafka transaction (`transactional.id` "
        "`cdc-topics-<server_name>`), so `read_committed` consumers never see a batch a killed "
        "publisher left half-sent. Off: an idempotent producer only.",
    )
    partitions: int = Field(
        default=1, ge=1, le=1000,
        description="Partitions of each topic the publisher creates (keyed by the primary key: "
        "one key's changes stay in order in one partition).",
    )
    replication_factor: int = Field(
        default=-1, ge=-1, le=32,
        description="Replication factor of the topics it creates; -1: the broker's default.",
    )
    batch_records: int = Field(
        default=20_000, ge=1, le=1_000_000,
        description="Records published per batch (one transaction, then the position is "
        "saved) at most.",
    )
    poll_seconds: float = Field(
        default=0.5, gt=0, le=60, description="Wait between looks at the landing zone when idle."
    )


#: Ports each source takes from ``metrics.port`` (docs/metrics.md, "Ports"): its engine, its
#: applier, its snapshot runs, and its change-topic publisher.
METRICS_PORTS_PER_SOURCE = 4


class MetricsSettings(_Section):
    """Prometheus endpoints (``/metrics``) of the long-running processes: the capture engine,
    the applier and snapshot runs while they read (docs/metrics.md)."""

    port: int = Field(
        default=0, ge=0, le=65535,
        description="First port of the deployment's metrics endpoints; 0: none. Source N (its "
        "place in `sources`, from 0) takes 4 ports from `port + 4*N`: its capture engine, its "
        "applier, its snapshot runs, and its change-topic publisher. On Kubernetes each run's "
        "pod gets the `prometheus.io/*` annotations of its port.",
    )
    host: str = Field(
        default="0.0.0.0",
        description="Address the endpoints listen on (`127.0.0.1`: this host only).",
    )


class CapturedSource(SourceSettings):
    """One source of a deployment: its replica (as ``source``) and what is captured from it (as
    ``capture``). Its landing-zone folder, asset key prefix, lake namespaces and signal key are
    its ``server_name``."""

    capture: CaptureSettings = Field(default_factory=CaptureSettings)
    change_topics: ChangeTopicSettings = Field(default_factory=ChangeTopicSettings)


# The top-level keys of a one-source config that are ``sources[0]``'s (``_single_source``).
_PER_SOURCE = ("source", "capture", "change_topics")


class Settings(_Section):
    """The whole deployment: its sources and what they share (landing zone, warehouse, Spark,
    Kafka). A single-source config may say ``source:`` and ``capture:`` instead of ``sources:``;
    it reads as a one-element ``sources``."""

    sources: tuple[CapturedSource, ...] = Field(
        min_length=1,
        description="The databases this deployment captures, each with the keys of "
        "`sources[].*` below. A config with one source may instead say `source:` (the keys "
        "without `capture`) and `capture:` at the top level, as before.",
    )
    landing_zone: LandingZoneSettings
    spark: SparkSettings = Field(default_factory=SparkSettings)
    warehouse: WarehouseSettings
    s3: S3Settings = Field(default_factory=S3Settings)
    lake: LakeSettings = Field(default_factory=LakeSettings)
    reconcile: ReconcileSettings = Field(default_factory=ReconcileSettings)
    signals: SignalSettings = Field(default_factory=SignalSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    # The whole deployment's settings, kept by ``for_source``'s one-source settings.
    _deployment: Settings | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _single_source(cls, data: Any) -> Any:
        """``source:`` + ``capture:`` (+ ``change_topics:``) is the one-element ``sources:``."""
        if not isinstance(data, dict) or not any(key in data for key in _PER_SOURCE):
            return data
        if "sources" in data:
            raise ValueError("set either `sources` or `source` (+ `capture`, `change_topics`), "
                             "not both")
        data = dict(data)
        source = data.pop("source", None)
        sections = {key: data.pop(key) for key in _PER_SOURCE[1:] if key in data}
        if not isinstance(source, dict):
            raise ValueError("`source` must be a mapping (or use `sources`, a list)")
        data["sources"] = [{**source, **sections}]
        return data

    @model_validator(mode="after")
    def _distinct_sources(self) -> Settings:
        names: dict[str, int] = {}
        ids: dict[tuple[str, int, int], int] = {}
        for index, source in enumerate(self.sources):
            first = names.setdefault(source.server_name, index)
            if first != index:
                raise ValueError(
                    f"sources[{index}].server_name {source.server_name!r} is also "
                    f"sources[{first}]'s; each source needs its own server_name")
            host = (source.host, source.port, source.server_id)
            first = ids.setdefault(host, index)
            if first != index:
                raise ValueError(
                    f"sources[{index}].server_id {source.server_id} is also sources[{first}]'s "
                    f"on {source.host}:{source.port}; give each source of a host its own "
                    "server_id")
        return self

    @model_validator(mode="after")
    def _cluster_reads_the_files(self) -> Settings:
        master = self.spark.master
        if not is_cluster_master(master) or self.spark.shared_filesystem:
            return self
        local = [f"{name} {url!r}" for name, url, path in (
            ("landing_zone.url", self.landing_zone.url, True),
            # (a catalog service's warehouse may be a name it resolves, e.g. Polaris's)
            ("warehouse.url", self.warehouse.url, self.warehouse.catalog.type == "hadoop"))
            if _local_path(url, path)]
        if local:
            raise ValueError(
                f"spark.master {master!r} runs Spark's work on executors, which cannot read the "
                f"local {' and '.join(local)}: put them on S3 (s3://bucket/prefix), or set "
                "spark.shared_filesystem: true if every Spark worker mounts them at the same "
                "paths")
        return self

    @model_validator(mode="after")
    def _metrics_ports_exist(self) -> Settings:
        last = self.metrics.port + METRICS_PORTS_PER_SOURCE * len(self.sources) - 1
        if self.metrics.port and last > 65535:
            raise ValueError(
                f"metrics.port {self.metrics.port} leaves no room for the "
                f"{METRICS_PORTS_PER_SOURCE} ports of each of {len(self.sources)} sources "
                f"(the last would be {last}): set it to at most "
                f"{65536 - METRICS_PORTS_PER_SOURCE * len(self.sources)}")
        return self

    def metrics_port(self, slot: int) -> int | None:
        """The metrics port of this one-source settings' process in ``slot`` (0 engine, 1
        applier, 2 snapshot runs, 3 change-topic publisher), or None when ``metrics.port`` is 0. The source's place is
        its place in the deployment, so one source's settings (``for_source``) give the same
        port as the whole config's."""
        if not self.metrics.port:
            return None
        index = self.deployment.server_names.index(self.source.server_name)
        return self.metrics.port + METRICS_PORTS_PER_SOURCE * index + slot

    @property
    def server_names(self) -> tuple[str, ...]:
        return tuple(source.server_name for source in self.sources)

    @property
    def deployment_server_names(self) -> tuple[str, ...]:
        """Every source of the deployment, also from one source's settings (``for_source``)."""
        return self.deployment.server_names

    @property
    def deployment(self) -> Settings:
        """The settings of every source, also from one source's settings (``for_source``):
        what one source's definitions may refer to in another (the dbt models joining them)."""
        return self._deployment or self

    @property
    def source(self) -> CapturedSource:
        """The source of a one-source settings (a config with one source, or ``for_source``)."""
        return self._only_source()

    @property
    def capture(self) -> CaptureSettings:
        """What is captured from the source of a one-source settings."""
        return self._only_source().capture

    def _only_source(self) -> CapturedSource:
        if len(self.sources) != 1:
            raise ValueError(
                f"these settings hold {len(self.sources)} sources ({', '.join(self.server_names)})"
                "; take one with settings.for_source(server_name)")
        return self.sources[0]

    def for_source(self, server_name: str | None) -> Settings:
        """The settings of one source: its ``source`` and ``capture``, the shared sections.
        ``None`` names the only source of a one-source config."""
        if server_name is None and len(self.sources) == 1:
            return self
        for source in self.sources:
            if source.server_name == server_name:
                one = self.model_copy(update={"sources": (source,)})
                one._deployment = self.deployment
                return one
        if server_name is None:
            raise ConfigError(f"the config has {len(self.sources)} sources "
                              f"({', '.join(self.server_names)}): name one with --source")
        raise ConfigError(f"no source named {server_name!r} in sources[].server_name "
                          f"({', '.join(self.server_names)})")

    def per_source(self) -> list[Settings]:
        """One single-source settings per source, in config order."""
        return [self.for_source(name) for name in self.server_names]


def _expand_env(value: Any, path: str) -> Any:
    if isinstance(value, dict):
        return {k: _expand_env(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"config key {path!r}: environment variable {name} is not set")

    return _ENV_REFERENCE.sub(replace, value)


def _error_key(loc: tuple[Any, ...], single_source: bool) -> str:
    """The dotted key of a validation error, as the user wrote it: ``sources[1].host``, or
    ``source.host`` / ``capture.tables`` in a one-source config."""
    parts = [str(part) for part in loc]
    if parts[:1] == ["sources"] and len(parts) > 1 and parts[1].isdigit():
        if single_source:
            rest = parts[2:]
            parts = rest if rest[:1] and rest[0] in _PER_SOURCE[1:] else ["source", *rest]
        else:
            parts = [f"sources[{parts[1]}]", *parts[2:]]
    return ".".join(parts)


def parse_settings(data: Any, origin: str = "<config>") -> Settings:
    """Validate a parsed YAML document; errors list every bad key with its dotted path."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping at the top level")
    data = _expand_env(data, "")
    single_source = "sources" not in data
    try:
        return Settings.model_validate(data)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            key = _error_key(item["loc"], single_source)
            message = item["msg"].removeprefix("Value error, ")
            problems.append(f"  {key}: {message}" if key else f"  {message}")
        raise ConfigError(f"{origin}: invalid configuration\n" + "\n".join(problems)) from None


def config_path() -> Path:
    return Path(os.environ.get(CONFIG_ENV) or DEMO_CONFIG)


def load_settings(path: str | Path | None = None) -> Settings:
    """Load and validate the config file (``CDC_PLATFORM_CONFIG`` or the demo default)."""
    path = Path(path) if path else config_path()
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}; set {CONFIG_ENV} "
                          "to a readable file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    return parse_settings(data, str(path))


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The process-wide settings, loaded once."""
    return load_settings()


def _type_name(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin is tuple:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}"
    return getattr(annotation, "__name__", str(annotation))


def config_reference() -> str:
    """Every config key with its type, default and description, as a Markdown table.

    The README's reference is generated from this, and a test keeps the two in step.
    """
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            key = f"{prefix}{name}"
            annotation = info.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, key + ".")
                continue
            item = get_args(annotation)[0] if get_origin(annotation) is tuple else None
            if isinstance(item, type) and issubclass(item, BaseModel):
                description = (info.description or "").replace("|", "\\|")
                lines.append(f"| `{key}` | list | required | {description} |")
                walk(item, key + "[].")
                continue
            if info.is_required():
                default = "required"
            else:
                value = info.get_default(call_default_factory=True)
                default = f"`{list(value) if isinstance(value, tuple) else value}`"
            type_name = _type_name(annotation)
            description = (info.description or "").replace("|", "\\|")
            lines.append(f"| `{key}` | {type_name} | {default} | {description} |")

    walk(Settings, "")
    return "\n".join(lines)
