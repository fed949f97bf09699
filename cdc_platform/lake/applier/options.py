"""What the applier needs from the config (``ApplierOptions.from_settings``).

Apart from the loop (``applier.loop``) so that what the applier is told and what it does with
it read separately: a tool or test builds the options from the settings and changes a field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdc_platform.capture import source as source_sql
from cdc_platform.capture.landing.published import CHANGE_TOPICS
from cdc_platform.capture.source import TableSelector
from cdc_platform.capture.store.storage import is_s3_url
from cdc_platform.config import (
    LakeSettings,
    LandingZoneSettings,
    ReconcileSettings,
    S3Settings,
    WarehouseSettings,
    default_of,
)

# lake.merge_parallelism 0: merges at once on local storage, and on object storage (where a
# merge mostly waits on a dozen requests).
MERGE_THREADS_LOCAL = 4
MERGE_THREADS_OBJECT_STORAGE = 16


@dataclass(frozen=True)
class ApplierOptions:
    """What the applier needs from the config (``from_settings``)."""

    server_name: str
    flavour: str
    landing_url: str
    warehouse_url: str
    catalog: Any
    connection: Mapping[str, Any]
    selector: TableSelector
    # Defaults: the settings schema's (config.py), converted as ``from_settings`` converts
    # them, so that options built without a config file behave as a config that leaves the
    # keys out (merge_parallelism: what its 0 means on local storage).
    poll_seconds: float = default_of(LakeSettings, "poll_seconds")
    merge_interval_seconds: float = default_of(LakeSettings, "merge_interval_seconds")
    merge_parallelism: int = MERGE_THREADS_LOCAL
    reconcile_every_merges: int = default_of(LakeSettings, "reconcile_every_merges")
    reconcile_interval_seconds: float = default_of(LakeSettings,
                                                   "reconcile_interval_minutes") * 60
    reconcile_range_rows: int = default_of(ReconcileSettings, "range_rows")
    reconcile_sample_keys: int = default_of(ReconcileSettings, "sample_keys")
    compact_min_files: int = default_of(LakeSettings, "compact_min_files")
    compact_delete_ratio: float = default_of(LakeSettings, "compact_delete_ratio")
    max_snapshots: int = default_of(LakeSettings, "max_snapshots")
    snapshot_retention_hours: float = default_of(WarehouseSettings, "snapshot_retention_hours")
    min_snapshots_to_keep: int = default_of(WarehouseSettings, "min_snapshots_to_keep")
    retention_seconds: float = default_of(LandingZoneSettings, "retention_hours") * 3600
    sweep_interval_seconds: float = 60.0  # (no setting: how often the landing zone is swept)
    first_load_wait_seconds: float = default_of(LakeSettings, "freshness_seconds") / 2
    # A target with nothing to merge says it is current (``events.Current``) this often.
    current_every_seconds: float = default_of(LakeSettings, "freshness_seconds") / 2
    s3: S3Settings | None = None  # the config's s3 options (a landing zone at an S3 URL)
    # Publishers retention waits for (``capture.landing.published``): the change topics'.
    publishers: tuple[str, ...] = ()

    @staticmethod
    def from_settings(settings: Any) -> ApplierOptions:
        lake = settings.lake
        return ApplierOptions(
            server_name=settings.source.server_name,
            flavour=settings.source.flavour,
            landing_url=settings.landing_zone.url,
            warehouse_url=settings.warehouse.url,
            catalog=settings.warehouse.catalog,
            connection=settings.source.connection_settings(),
            selector=source_sql.selector_from_settings(settings),
            poll_seconds=lake.poll_seconds,
            merge_interval_seconds=lake.merge_interval_seconds,
            merge_parallelism=lake.merge_parallelism or (
                MERGE_THREADS_OBJECT_STORAGE if any(
                    is_s3_url(url) for url in (settings.landing_zone.url, settings.warehouse.url))
                else MERGE_THREADS_LOCAL),
            reconcile_every_merges=lake.reconcile_every_merges,
            reconcile_interval_seconds=lake.reconcile_interval_minutes * 60,
            reconcile_range_rows=settings.reconcile.range_rows,
            reconcile_sample_keys=settings.reconcile.sample_keys,
            compact_min_files=lake.compact_min_files,
            compact_delete_ratio=lake.compact_delete_ratio,
            max_snapshots=lake.max_snapshots,
            snapshot_retention_hours=settings.warehouse.snapshot_retention_hours,
            min_snapshots_to_keep=settings.warehouse.min_snapshots_to_keep,
            retention_seconds=settings.landing_zone.retention_hours * 3600,
            first_load_wait_seconds=lake.freshness_seconds / 2,
            current_every_seconds=lake.freshness_seconds / 2,
            s3=settings.s3,
            publishers=publishers_of(settings),
        )


def publishers_of(settings: Any) -> tuple[str, ...]:
    """The publishers a source's landing-zone retention waits for."""
    return (CHANGE_TOPICS,) if settings.source.change_topics.enabled else ()
