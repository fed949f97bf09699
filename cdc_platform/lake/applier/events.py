"""What the applier did: the events it emits, one per merge, failure, wait, maintenance,
reconcile and sweep.

The applier knows nothing of Dagster; the ``apply_changes`` job (``defs.lake.applier``) turns
these into materialisations, check results and log lines, and ``python -m cdc_platform apply``
into log lines. Apart from the loop so that those readers depend on the events only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdc_platform.capture.landing import retention
from cdc_platform.capture.schema import TableSchema
from cdc_platform.lake.merge import MergeResult
from cdc_platform.lake.reconcile import ReconcileResult


@dataclass(frozen=True)
class Applied:
    schema: TableSchema
    result: MergeResult

    def describe(self) -> str:
        result = self.result
        lag = f", lag {result.lag_seconds:.1f} s" if result.lag_seconds is not None else ""
        wait = (f", oldest change waited {result.wait_seconds:.1f} s"
                if result.wait_seconds is not None else "")
        return (f"{self.schema.table_id}: {result.records_read} records "
                f"{'appended' if result.appended else 'merged'} in "
                f"{result.duration_seconds:.2f} s{lag}{wait}"
                f"{'' if result.spark else ' (without Spark)'}")


@dataclass(frozen=True)
class Current:
    """A target with nothing to merge: every landed change of its table is merged (it says so
    every ``current_every_seconds`` while it stays quiet, so that Dagster's freshness policy,
    which counts from the last materialisation, sees a quiet table as fresh). Its mark is
    the one its last merge committed, and its rows those that merge left (None: not known)."""

    schema: TableSchema
    consumed_pos: int | None
    rows: int | None = None


@dataclass(frozen=True)
class Failed:
    schema: TableSchema
    error: str
    attempts: int  # consecutive failed merges of the table


@dataclass(frozen=True)
class Waiting:
    """An empty target holds its merge back for its table's running snapshot (once per
    session): the UI says why the target has no rows yet."""

    schema: TableSchema
    session_id: str
    seconds: float  # how long it waits at most from the session's start


@dataclass(frozen=True)
class Maintained:
    schema: TableSchema
    reason: str
    report: Mapping[str, Any]
    # compaction (files rewritten, snapshots maybe expired too) | expiry (snapshots only) |
    # orphans (unreferenced files removed)
    kind: str = "compaction"


@dataclass(frozen=True)
class Reconciled:
    schema: TableSchema
    result: ReconcileResult
    target_gtid: str | None
    conclusive: bool  # the source was read at the target's position (a difference is real)


@dataclass(frozen=True)
class Swept:
    report: retention.RetentionReport


Event = Applied | Current | Failed | Maintained | Reconciled | Swept
