"""The applier's sweeps of the landing zone (``LandingSweep``): segments every target has
consumed go once older than the retention (``capture.landing.retention``), in a thread beside
the merges.

Apart from the loop (``applier.loop``): a sweep has its own cadence, thread and inputs (every
target's consumed mark), and the loop only asks whether one is due.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Protocol

from cdc_platform.capture import names
from cdc_platform.capture.landing import retention
from cdc_platform.capture.landing.zone import LandingReader, LandingZone
from cdc_platform.capture.schema import TableSchema
from cdc_platform.lake.applier.events import Swept
from cdc_platform.lake.applier.options import ApplierOptions

log = logging.getLogger(__name__)


class _Mark(Protocol):
    """What a sweep reads of a table's state in the applier (``_TableState``)."""

    known: bool  # consumed_pos was read from the target
    consumed_pos: int | None


# On stop, a sweep still running is waited for this long (then left: it is kill -9 safe).
SWEEP_STOP_WAIT_SECONDS = 10.0


class LandingSweep:
    """The applier's sweeps of the landing zone: what every target has consumed, once older
    than the retention, goes (``capture.landing.retention``). A sweep reads and compacts
    every small consumed segment: with a thousand tables, tens of thousands of files a
    minute, seconds to a minute of work during which no table would be merged, so the loop
    runs it in a thread of its own (``in_background``) and reports it when done."""

    def __init__(self, options: ApplierOptions, landing: LandingReader) -> None:
        self.options = options
        self._landing = landing
        self._last_sweep = time.monotonic()
        self._sweeping: threading.Thread | None = None  # (the landing zone's sweep, if running)
        self._swept: list[retention.RetentionReport | BaseException] = []  # (to report)

    def due(self) -> bool:
        """Whether a sweep finished (to report) or ``sweep_interval_seconds`` have passed
        since the last one started."""
        return bool(self._swept) or (
            time.monotonic() - self._last_sweep >= self.options.sweep_interval_seconds)

    def stop(self) -> None:
        """Wait a little for a sweep still running (safe to stop at any point: it is kill -9
        safe)."""
        if self._sweeping is not None:
            self._sweeping.join(SWEEP_STOP_WAIT_SECONDS)

    def _sweep_landing_zone(self, consumed: Mapping[str, int | None], unread: list[str]
                            ) -> retention.RetentionReport:
        landing = LandingZone(self.options.landing_url, self.options.server_name,
                              s3=self.options.s3)
        return retention.sweep(landing, consumed, unread, self.options.retention_seconds,
                               publishers=self.options.publishers)

    def _inputs(self, tables: list[TableSchema], states: Mapping[str, _Mark]
                ) -> tuple[dict[str, int | None], list[str]] | None:
        """Every target's consumed mark and the tables no target reads, for a sweep; None
        while a target has not been read yet (wait for its first pass)."""
        keyed = {s.table_id for s in tables}
        consumed = {}
        for schema in tables:
            state = states[schema.table_id]
            if not state.known:
                return None
            consumed[schema.table_id] = state.consumed_pos
        # No target reads a keyless table, nor one the capture filters no longer name (its
        # target is not maintained; widened again, the table is snapshotted, as any table that
        # becomes captured holding rows): its segments go once older than the retention.
        selector = self.options.selector
        unread = [t for t in states if t not in keyed] + [
            names.table_id(database, table) for database, table in self._landing.changelog_tables()
            if not selector.captures(database, table)]
        return consumed, unread

    def now(self, tables: list[TableSchema], states: Mapping[str, _Mark]) -> Swept | None:
        """Sweep the landing zone now, in this thread; what it did, or None (nothing to
        sweep by yet, or it failed: logged)."""
        self._last_sweep = time.monotonic()
        inputs = self._inputs(tables, states)
        if inputs is None:
            return None
        try:
            report = self._sweep_landing_zone(*inputs)
        except Exception as error:  # noqa: BLE001 - retention waits for the next sweep
            log.warning("applier: landing-zone retention failed: %s", error)
            return None
        return Swept(report)

    def in_background(self, tables: list[TableSchema], states: Mapping[str, _Mark]
                      ) -> list[Swept]:
        """Start a sweep in a thread of its own, unless one still runs or the last started
        less than ``sweep_interval_seconds`` ago; return the finished ones. (Reporting a
        finished sweep once started the next at once: every pass swept, each listing the
        whole landing zone, a request a table on object storage.) Safe beside merges: it
        touches only segments below every target's mark, and one sweep runs at a time
        (``retention.sweep``'s lock)."""
        finished = []
        while self._swept:
            outcome = self._swept.pop(0)
            if isinstance(outcome, BaseException):
                log.warning("applier: landing-zone retention failed: %s", outcome)
            else:
                finished.append(Swept(outcome))
        if self._sweeping is not None and self._sweeping.is_alive():
            return finished
        if time.monotonic() - self._last_sweep < self.options.sweep_interval_seconds:
            return finished  # (a pass that only reports a finished sweep starts none)
        self._last_sweep = time.monotonic()
        inputs = self._inputs(tables, states)
        if inputs is None:
            return finished

        def sweep() -> None:
            try:
                self._swept.append(self._sweep_landing_zone(*inputs))
            except Exception as error:  # noqa: BLE001 - reported by the next pass
                self._swept.append(error)

        self._sweeping = threading.Thread(target=sweep, name="applier-retention", daemon=True)
        self._sweeping.start()
        return finished
