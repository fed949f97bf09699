"""The applier loop in a child process of its own, its events streamed back to the parent.

Why. The ``apply_changes`` Dagster run records every merge as a materialisation, and with the
default SQLite storage an event costs milliseconds of Python and a few synchronous commits.
At 1,000 tables merged every few seconds that bookkeeping shared the run's interpreter (its
GIL) with the merges: measured on 2 cores, 1,000 tables under 500 commits/s, the same applier
merged 22 tables a second inside the run and 55 as a plain process, and lake lag p99 went
from 28 s to 43-92 s (28 s again when the run dropped its events). In a child, the merges
run at the plain process's pace and the parent only turns events into Dagster records.

The contract:

* the child builds its applier from the settings exactly as ``python -m cdc_platform apply``
  does (``build_applier``);
* each event (``lake.applier.events.Event``) reaches the parent in order, with the child's counters
  once a second; a loop that fails sends its error's text before the child exits;
* SIGTERM to the child asks it to stop after the merge in progress (``stop``; SIGINT, a
  terminal's Ctrl-C to the whole process group, is the run's to handle); a stop the parent did
  not ask for fails it; if the parent dies, the kernel SIGKILLs the child
  (``PR_SET_PDEATHSIG``): a kill -9 of the run is a kill -9 of its applier, which every merge
  survives exactly (the mark is in the commit).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from cdc_platform.config import Settings
from cdc_platform.lake.applier.events import Event
from cdc_platform.lake.applier.loop import Applier
from cdc_platform.lake.applier.options import ApplierOptions

_PR_SET_PDEATHSIG = 1
#: How often the child sends its counters (merges, passes, tables).
COUNTERS_EVERY_SECONDS = 1.0
#: Events one ``receive`` returns at most (the caller records them before taking more).
RECEIVE_AT_MOST = 1000


def build_applier(settings: Settings, emit: Callable[[Event], None]) -> Applier:
    """The applier of ``settings``' source, its Spark session made from the settings when
    first needed (an initial load is appended without it)."""
    from cdc_platform.lake.spark import build_spark_session, settings_conf

    def spark() -> Any:
        return build_spark_session(settings.spark.master, settings.spark.app_name,
                                   settings_conf(settings))

    return Applier(spark, ApplierOptions.from_settings(settings), emit)


@dataclass(frozen=True)
class Counters:
    """The child applier's progress: merges done, passes made, tables it knows."""

    merges: int = 0
    passes: int = 0
    tables: int = 0


class ApplierFailed(RuntimeError):
    """The child's applier loop raised (its text and traceback), or the child died."""


def _die_with_parent(parent: int) -> None:
    """SIGKILL from the kernel when the parent dies; at once if it died already. (Where
    ``prctl`` is missing, the loop in ``_child`` still stops once the parent is gone.)"""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _child(settings: Settings, conn: Connection, parent: int) -> None:
    """The child process: the applier loop in a thread, stopped by SIGTERM or when the
    parent is gone."""
    _die_with_parent(parent)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    # The parent alone stops it (SIGTERM): a terminal's Ctrl-C reaches the whole process group,
    # and the run's process decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sending = threading.Lock()

    def send(message: tuple[str, Any]) -> None:
        with sending:
            conn.send(message)

    appliers: list[Applier] = []
    failure: list[str] = []

    def loop() -> None:
        from cdc_platform.lake.metrics import applier_metrics, serve_applier_metrics
        from cdc_platform.metrics import MetricsPortTakenError

        endpoint = None
        try:
            metrics = applier_metrics(settings)
            appliers.append(build_applier(settings, metrics.observing(
                lambda event: send(("event", event)))))
            endpoint = serve_applier_metrics(settings, metrics, appliers[0])
            appliers[0].run(stop)
        except MetricsPortTakenError as error:  # (a start failure: its one line, no trace)
            failure.append(str(error))
        except BaseException:  # noqa: BLE001 - sent to the parent, which fails the run
            failure.append(traceback.format_exc())
        finally:
            if endpoint is not None:
                endpoint.close()

    worker = threading.Thread(target=loop, name="lake-applier", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(COUNTERS_EVERY_SECONDS)
        if os.getppid() != parent:  # (orphaned: nobody records what it does)
            stop.set()
        for applier in appliers:
            send(("counters", Counters(applier.merges, applier.cycles, len(applier.states))))
    if failure:
        send(("failed", failure[0]))
    elif stop.is_set():
        send(("stopped", "SIGTERM"))
    conn.close()
    os._exit(1 if failure else 0)  # (no interpreter teardown: the Spark gateway, threads)


class ApplierProcess:
    """The parent's handle: ``start``, ``receive`` events, ``stop``.

    Use it from one thread (``receive`` and ``stop`` read the same pipe).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.counters = Counters()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._failure: str | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        mine, theirs = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_child, args=(self.settings, theirs, os.getpid()),
            name=f"lake-applier-{self.settings.source.server_name}", daemon=False)
        self._process.start()
        theirs.close()
        self._conn = mine

    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def receive(self, timeout: float) -> list[Event]:
        """The events the child sent (at most ``RECEIVE_AT_MOST``), waiting up to ``timeout``
        for the first; raises ``ApplierFailed`` once the child has exited and everything it
        sent is read."""
        assert self._conn is not None and self._process is not None
        events: list[Event] = []
        wait = timeout
        while True:
            try:
                if not self._conn.poll(wait):
                    return events
                kind, payload = self._conn.recv()
            except (EOFError, OSError):  # the child closed its end: it has exited
                self._process.join(5.0)
                if events:
                    return events  # (the failure is raised by the next call)
                raise ApplierFailed(self._failure or (
                    f"the applier's process {self._process.pid} exited with code "
                    f"{self._process.exitcode} without saying why")) from None
            wait = 0.0
            if kind == "event":
                events.append(payload)
                if len(events) >= RECEIVE_AT_MOST:
                    return events
            elif kind == "counters":
                self.counters = payload
            elif kind == "failed":
                self._failure = f"the applier's loop failed in its process:\n{payload}"
            elif kind == "stopped" and not self._stopping:
                self._failure = (f"the applier's process {self._process.pid} stopped on "
                                 f"{payload}, which this run did not send")

    def stop(self, grace_seconds: float, on_event: Callable[[Event], None]) -> bool:
        """Ask the child to stop after the merge in progress, passing on what it still sends;
        SIGKILL it after ``grace_seconds``. Whether it stopped by itself."""
        if self._process is None or self._conn is None:
            return True
        self._stopping = True
        if self._process.is_alive() and self._process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        stopped = True
        while True:
            try:
                for event in self.receive(0.2):
                    on_event(event)
            except ApplierFailed:
                break
            if time.monotonic() >= deadline:
                stopped = False
                self._process.kill()
                break
        self._process.join(10.0)
        self._conn.close()
        return stopped
