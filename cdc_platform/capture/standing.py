"""Where a running capture engine stands, watched from outside it: its lag behind the source
(``LagClock``) and the binlog headroom of its checkpoint, read on a thread of its own so that
no watcher waits for the source. The Dagster streaming run, ``python -m cdc_platform stream``
and the engine's metrics endpoint share one reading (``capture/binlog/headroom.py`` computes
it; this module is the engine's side of asking)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from cdc_platform.capture.binlog.headroom import (
    BinlogHeadroom,
    HeadroomStatus,
    LagClock,
    read_headroom,
)
from cdc_platform.capture.engine_options import EngineStats
from cdc_platform.capture.landing.zone import Checkpoint, LandingReader
from cdc_platform.config import Settings

#: The streaming run reads the binlog headroom from the source at most this often.
HEADROOM_EVERY_SECONDS = 60.0
#: While the headroom stays low, the run repeats its warning this often.
HEADROOM_WARN_EVERY_SECONDS = 900.0


def checkpoint_headroom(settings: Settings) -> tuple[Checkpoint | None, BinlogHeadroom]:
    """The engine's checkpoint and its binlog headroom, read now (a short-lived source
    session; never raises: what cannot be read is an UNKNOWN headroom naming it)."""
    try:
        checkpoint = LandingReader.open(settings.landing_zone.url, settings.source.server_name,
                                        s3=settings.s3).read_checkpoint()
    except (OSError, ValueError) as error:
        return None, BinlogHeadroom(HeadroomStatus.UNKNOWN,
                                    reason=f"the checkpoint cannot be read: {error}")
    headroom = read_headroom(settings.source.connection_settings(), settings.source.flavour,
                             None if checkpoint is None else checkpoint.gtid)
    return checkpoint, headroom


class HeadroomProbe:
    """The binlog headroom, read at most every ``every`` seconds on a thread of its own: the
    step's thread (which relays the engine's log and handles interrupts) never waits for the
    source, and a slow or unreachable source leaves the previous reading standing."""

    def __init__(self, read: Callable[[], BinlogHeadroom],
                 every: float = HEADROOM_EVERY_SECONDS) -> None:
        self._read = read
        self._every = every
        self._thread: threading.Thread | None = None
        self._started_at = float("-inf")
        # (count, reading): replaced whole by the reading thread, so a poll sees both as one
        self._reading: tuple[int, BinlogHeadroom | None] = (0, None)
        self._seen = 0

    def poll(self) -> tuple[BinlogHeadroom | None, bool]:
        """The newest reading and whether it is new since the last poll; starts the next
        reading when one is due and none is under way."""
        count, latest = self._reading
        new, self._seen = count != self._seen, count
        now = time.monotonic()
        idle = self._thread is None or not self._thread.is_alive()
        if idle and now - self._started_at >= self._every:
            self._started_at = now
            self._thread = threading.Thread(target=self._run, name="binlog-headroom",
                                            daemon=True)
            self._thread.start()
        return latest, new

    @property
    def latest(self) -> BinlogHeadroom | None:
        """The newest reading (None before the first), without starting one."""
        return self._reading[1]

    def _run(self) -> None:
        self._reading = (self._reading[0] + 1, self._read())


class StandingReport:
    """What each progress tick adds to the run: the engine's lag (``LagClock``) and the newest
    headroom reading (``HeadroomProbe``), with a warning in the run's log when the headroom is
    low (when it becomes low, then every ``HEADROOM_WARN_EVERY_SECONDS``)."""

    def __init__(self, read: Callable[[], BinlogHeadroom], log: Any,
                 every: float = HEADROOM_EVERY_SECONDS) -> None:
        self._log = log
        self._clock = LagClock()
        self._probe = HeadroomProbe(read, every)
        self._status: HeadroomStatus | None = None
        self._warned_at = float("-inf")
        self._probe.poll()  # (the first reading starts now)

    def headroom(self) -> BinlogHeadroom | None:
        """The newest headroom reading (for the metrics endpoint's scrapes)."""
        return self._probe.latest

    def tick(self, stats: EngineStats) -> tuple[float | None, BinlogHeadroom | None]:
        headroom, new = self._probe.poll()
        caught_up = stats.caught_up or bool(new and headroom is not None and headroom.caught_up)
        lag = self._clock.lag(time.time(), stats.lag_seconds, stats.transactions, stats.events,
                              caught_up)
        if new and headroom is not None:
            self.tell(headroom)
        return lag, headroom

    def tell(self, headroom: BinlogHeadroom) -> None:
        """Log a new reading: a warning when low (rate-limited), its text when it changes."""
        now = time.monotonic()
        changed, self._status = headroom.status != self._status, headroom.status
        if headroom.low:
            if changed or now - self._warned_at >= HEADROOM_WARN_EVERY_SECONDS:
                self._warned_at = now
                self._log.warning(f"binlog headroom {headroom.describe()}")
        elif changed:
            self._log.info(f"binlog headroom: {headroom.describe()}")
