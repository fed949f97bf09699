"""The capture engine's landing writer: flushes written on a thread of their own.

Writing a flush (Arrow tables concatenated, Parquet encoded and compressed, fsynced) took about
a fifth of the engine's time on the stream thread, with the binlog waiting. pyarrow does that
work without the GIL, so on a second core it overlaps the decoding of the next events.

What the engine relies on (ARCHITECTURE section 5 holds as without the thread):

* Jobs run one at a time, in the order submitted, each a whole flush (its segments, then its
  checkpoint) or a batch of segments of a large transaction: a checkpoint is never written
  before the segments it covers are durable, and never before an earlier job's.
* At most one job is in flight: ``submit`` first waits for the previous one. The engine then
  holds its current buffer plus one flush being written: at most twice ``flush_max_rows``
  records / ``transaction_memory_bytes`` of buffered records.
* A failure is never swallowed: it is raised on the stream thread (``LandingFailed``, naming
  the cause) at the next ``submit`` or ``wait``, and again at every later one; no job runs
  after a failed one, so the checkpoint stays at the last flush that landed whole.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from cdc_platform.capture.events import EngineError


class LandingFailed(EngineError):
    """Writing to the landing zone failed on the writer thread (the cause is chained)."""


class LandingWriter:
    """One background thread that writes the engine's flushes, one at a time, in order."""

    def __init__(self, name: str, log: Any | None = None) -> None:
        self._name = name
        self.log = log or logging.getLogger(__name__)
        self._executor: ThreadPoolExecutor | None = None
        self._in_flight: Future[None] | None = None
        self._failure: BaseException | None = None
        self._reported = False

    @property
    def failed(self) -> bool:
        """True once a job failed (whether or not that was raised yet)."""
        self._settle(block=False)
        return self._failure is not None

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the writer thread once the previous job has finished; raises
        ``LandingFailed`` (and runs nothing) if that or any earlier job failed."""
        self.wait()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=self._name)
        self._in_flight = self._executor.submit(job)

    def wait(self) -> None:
        """Block until the job in flight (if any) is done; raise ``LandingFailed`` if a job
        failed."""
        self._settle(block=True)
        if self._failure is not None:
            self._reported = True
            error = self._failure
            raise LandingFailed(
                f"landing a flush failed: {type(error).__name__}: {error}. The checkpoint "
                "stays at the last flush that landed whole; the next start replays from it"
            ) from error

    def close(self) -> None:
        """Wait for the job in flight and end the thread. A failure nobody was told of is
        logged: the engine is failing already, and the error that stopped it is raised."""
        self._settle(block=True)
        if self._failure is not None and not self._reported:
            self._reported = True
            self.log.error(f"capture engine: landing a flush failed too ({self._failure}); "
                           "the checkpoint stays at the last flush that landed whole",
                           exc_info=self._failure)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _settle(self, block: bool) -> None:
        """Collect the job in flight if it is done (or, ``block``, once it is)."""
        future = self._in_flight
        if future is None or not (block or future.done()):
            return
        error = future.exception()  # (waits)
        self._in_flight = None
        if error is not None and self._failure is None:
            self._failure = error
