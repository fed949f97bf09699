"""Run long work (the capture engine, a snapshot reader) in a thread under a Dagster step.

Dagster's interrupt (run cancellation, SIGTERM) arrives as an exception in the step's main
thread at an arbitrary point. Running the work in its own thread means the interrupt never lands
in the middle of its bookkeeping: the main thread turns it into a stop request and waits for the
work to wind down. Log lines are relayed to the run's log from the main thread (the Dagster log
manager is not meant to be called from other threads).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import dagster as dg

T = TypeVar("T")


class QueueLog:
    """A logger-shaped object the worker thread writes to; the step's thread drains it."""

    def __init__(self) -> None:
        self.lines: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()

    def __getattr__(self, level: str) -> Any:
        def emit(message: str, *args: Any, **_: Any) -> None:
            self.lines.put((level, message % args if args else message))
        return emit


def run_in_thread(
    context: dg.OpExecutionContext | dg.AssetExecutionContext,
    name: str,
    work: Callable[[threading.Event], T],
    log: QueueLog,
    *,
    every: float,
    on_tick: Callable[[], None],
    stopping: str,
    grace_seconds: float,
    not_stopped: str,
    on_poll: Callable[[], None] | None = None,
) -> T:
    """Run ``work(stop_event)`` in a thread until it returns; relay ``log``; call ``on_tick``
    every ``every`` seconds (and ``on_poll`` at every look, about 5 times a second); on
    interrupt set the stop event, wait up to ``grace_seconds``, and re-raise. ``stopping`` and
    ``not_stopped`` are the log lines for those moments."""
    stop = threading.Event()
    done = threading.Event()
    failure: list[BaseException] = []
    outcome: list[T] = []

    def target() -> None:
        try:
            outcome.append(work(stop))
        except BaseException as error:  # noqa: BLE001 - handed to the step's thread
            failure.append(error)
        finally:
            done.set()

    def relay() -> None:
        if on_poll is not None:
            on_poll()
        while True:
            try:
                level, message = log.lines.get_nowait()
            except queue.Empty:
                return
            getattr(context.log, level if level in ("info", "warning", "error") else "info")(
                message)

    # Completion is signalled by an Event, not Thread.is_alive(): on CPython 3.11 a join()
    # interrupted by a signal can leave is_alive() False while the thread still runs.
    threading.Thread(target=target, name=name, daemon=True).start()
    next_tick = time.monotonic() + every
    try:
        while not done.wait(timeout=0.2):
            relay()
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + every
                on_tick()
    except BaseException:
        context.log.info(stopping)
        stop.set()
        if not done.wait(timeout=grace_seconds):
            context.log.error(not_stopped)
        relay()
        raise
    relay()
    if failure:
        raise failure[0]
    return outcome[0]
