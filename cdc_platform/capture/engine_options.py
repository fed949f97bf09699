"""What a caller gives the capture engine and reads back: its options (from the config, and
what follows from them: the stream's heartbeat, the reconnect backoff), the states of its
lifecycle, and the stats of a run (which the Dagster op reports as metadata; the landing
writer's thread adds what became durable)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdc_platform.capture.source import TableSelector, selector_from_settings
from cdc_platform.config import CaptureSettings, ReconnectSettings, default_of

if TYPE_CHECKING:
    from cdc_platform.capture.landing.segment_buffer import Landed
    from cdc_platform.capture.landing.zone import Checkpoint
    from cdc_platform.config import Settings


# The snapshot coordinator is ticked between binlog events, every ``sessions.
# SNAPSHOT_POLL_SECONDS`` while sessions are open: on an idle source, heartbeats are what
# bring those events, so they come as often. A heartbeat is one small event: 40 a second cost
# little.
HEARTBEAT_MAX_SECONDS = 0.025
# The longest a flush is put off for ``flush_max_segments_per_second`` (EngineOptions.flush_wait).
FLUSH_STRETCH_MAX_SECONDS = 10.0


class EngineState(enum.Enum):
    CREATED = "created"
    STARTING = "starting"
    STREAMING = "streaming"
    RECONNECTING = "reconnecting"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(frozen=True)
class EngineOptions:
    server_name: str
    flavour: str
    server_id: int
    connection_settings: dict[str, Any]
    selector: TableSelector = field(default_factory=TableSelector)
    # Defaults: the settings schema's (config.py), so that options built without a config
    # file behave as a config that leaves the keys out.
    heartbeat_seconds: float = default_of(CaptureSettings, "heartbeat_interval_seconds")
    flush_interval_seconds: float = default_of(CaptureSettings, "flush_interval_seconds")
    flush_max_rows: int = default_of(CaptureSettings, "flush_max_rows")
    flush_max_segments_per_second: int = default_of(CaptureSettings,
                                                    "flush_max_segments_per_second")
    initial_backoff_seconds: float = default_of(ReconnectSettings, "initial_backoff_seconds")
    max_backoff_seconds: float = default_of(ReconnectSettings, "max_backoff_seconds")
    max_reconnect_attempts: int = default_of(ReconnectSettings, "max_attempts")
    initial_position: str = default_of(CaptureSettings, "initial_position")
    transaction_memory_bytes: int = default_of(CaptureSettings, "transaction_memory_bytes")
    # capture.snapshot_mode: initial | when_needed | never (docs/snapshots.md, "Automatic
    # snapshots"): which tables get history markers, and whether a purged binlog is recovered.
    snapshot_mode: str = default_of(CaptureSettings, "snapshot_mode")

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineOptions:
        capture = settings.capture
        return cls(
            server_name=settings.source.server_name,
            flavour=settings.source.flavour,
            server_id=settings.source.server_id,
            connection_settings=settings.source.connection_settings(),
            selector=selector_from_settings(settings),
            heartbeat_seconds=capture.heartbeat_interval_seconds,
            flush_interval_seconds=capture.flush_interval_seconds,
            flush_max_rows=capture.flush_max_rows,
            flush_max_segments_per_second=capture.flush_max_segments_per_second,
            initial_backoff_seconds=capture.reconnect.initial_backoff_seconds,
            max_backoff_seconds=capture.reconnect.max_backoff_seconds,
            max_reconnect_attempts=capture.reconnect.max_attempts,
            initial_position=capture.initial_position,
            transaction_memory_bytes=capture.transaction_memory_bytes,
            snapshot_mode=capture.snapshot_mode,
        )

    @property
    def stream_heartbeat_seconds(self) -> float:
        """The heartbeat period the binlog stream asks the source for. Heartbeats also bound
        how long a lone commit waits for its flush, and on an idle source how long a snapshot
        chunk waits for its commit, so they come at least once per flush interval and
        snapshot poll."""
        return min(self.heartbeat_seconds, self.flush_interval_seconds, HEARTBEAT_MAX_SECONDS)

    def flush_wait(self, tables_queued: int) -> float:
        """How long after the last flush the next one comes, with ``tables_queued`` tables
        holding committed records: ``flush_interval_seconds``, stretched (up to
        ``FLUSH_STRETCH_MAX_SECONDS``) so that flushes write at most
        ``flush_max_segments_per_second`` segments a second on average.

        A flush writes a segment per table it holds. With a thousand tables changing now and
        then, every second's flush was several hundred one-record segments, and each costs
        the same in the engine (a file), the applier (a footer and a read) and retention (a
        compaction read): 500 commits/s over 1,000 tables kept the engine at half a core and
        the lake 100 s behind (p99). Waiting until the tables queued are at most
        ``flush_max_segments_per_second`` times the time since the last flush bounds the
        files; a busy table fills its segment meanwhile (``flush_max_rows`` still forces a
        flush), and the few tables of most databases still flush every
        ``flush_interval_seconds``."""
        wait = self.flush_interval_seconds
        if self.flush_max_segments_per_second:
            wait = max(wait, min(FLUSH_STRETCH_MAX_SECONDS,
                                 tables_queued / self.flush_max_segments_per_second))
        return wait

    def reconnect_backoff(self, failures: int) -> float:
        """The wait before reconnecting after ``failures`` failures in a row (1: the first):
        doubling from ``initial_backoff_seconds``, at most ``max_backoff_seconds``."""
        return min(self.max_backoff_seconds, self.initial_backoff_seconds * 2 ** (failures - 1))


@dataclass
class EngineStats:
    """What the engine did in one ``run``; the Dagster op reports these as metadata."""

    state: str = EngineState.CREATED.value
    events: int = 0
    transactions: int = 0
    records: int = 0
    records_by_table: dict[str, int] = field(default_factory=dict)
    # row changes read from row events by the binlog's op (insert, update, delete)
    row_changes: dict[str, int] = field(default_factory=dict)
    ddl_statements: int = 0
    rolled_back: int = 0
    reconnects: int = 0
    flushes: int = 0
    segments_written: int = 0
    landed_bytes: int = 0  # the bytes of those segments
    orphans_removed: int = 0
    position: str = ""
    next_pos: int = 1
    lag_seconds: float | None = None
    caught_up: bool = False
    started_at: float = field(default_factory=time.time)

    @property
    def elapsed_seconds(self) -> float:
        return time.time() - self.started_at

    def segments_landed(self, landed: Landed) -> None:
        """Once segments are durable (on the landing writer's thread): their records by table."""
        # (a new dict, not an update: another thread may be reading the old one)
        by_table = dict(self.records_by_table)
        for table_id, count in landed.records_by_table.items():
            by_table[table_id] = by_table.get(table_id, 0) + count
        self.records_by_table = by_table
        self.segments_written += landed.segments
        self.landed_bytes += landed.bytes

    def checkpoint_landed(self, checkpoint: Checkpoint) -> None:
        """Once a checkpoint is durable (on the landing writer's thread): where it stands."""
        self.flushes += 1
        self.position = checkpoint.gtid
        self.next_pos = checkpoint.next_pos
