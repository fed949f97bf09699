"""Foreground commands that start processes (``ui``, ``demo``, ``devservices up --foreground``):
Ctrl-C, SIGTERM or SIGHUP stops every process the command started, and none outlives it.

Why it is needed. Ctrl-C sends SIGINT to the terminal's whole foreground process group. Children
left in that group get it at the same moment as the command and each shuts down on its own
schedule, or not at all (``dagster dev`` only stops its webserver and daemon when *it* decides
to; a shell that started the command with SIGINT ignored passes that on to every child), while
the command's own clean-up races them and may SIGKILL ``dagster dev`` half-way, orphaning its
code server. So here the command alone receives the signal and tears down in order:

* every child runs in a session (and process group) of its own, with ``PR_SET_PDEATHSIG`` so
  the kernel signals it if the command is SIGKILLed;
* the first SIGINT/SIGTERM/SIGHUP raises :class:`Interrupted` in the main thread, so blocking
  waits end and ``with`` blocks unwind; the teardown itself is not interruptible, and a second
  signal only cuts the grace periods short;
* an :class:`Interrupted` that Python swallows (the signal landed in a ``__del__``, a weakref
  callback or another finaliser, whose exceptions are printed and ignored) is raised again at
  once: a finaliser runs at any point in the main thread (a pymysql result freed by the
  garbage collector), so without this a Ctrl-C was lost and the command ran on;
* teardown runs in reverse start order: a child gets its stop signal, then (after its grace) its
  whole process group SIGTERM and then SIGKILL; a service gets ``stop()``;
* the command is a child *subreaper*, so a grandchild whose parent died is re-parented to the
  command instead of to init, and a last sweep ends every descendant still alive.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, ClassVar, Protocol, Self, TypeVar

from cdc_platform.devservices._process import ManagedService, child_preexec, pid_alive

__all__ = ["Interrupted", "ProcessSupervisor", "descendants"]



class Service(Protocol):
    """What the supervisor starts and stops: a :class:`ManagedService`, or several composed
    (a ``SparkCluster``: its ``services`` are its processes)."""

    display_name: ClassVar[str]

    def start(self, *, reuse: bool = False, detach: bool = False) -> Any: ...

    def stop(self, timeout: float = 30.0) -> None: ...


_Service = TypeVar("_Service", bound=Service)

#: Signals that stop a foreground command. SIGHUP (terminal closed) only when not ignored:
#: ``nohup`` asks for the command to outlive the terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: After a group's SIGTERM, how long its members get before SIGKILL.
GROUP_TERM_GRACE_SECONDS = 5.0
#: The final sweep of stray descendants: SIGTERM, this long, then SIGKILL.
SWEEP_GRACE_SECONDS = 3.0

_PR_SET_CHILD_SUBREAPER = 36


class Interrupted(KeyboardInterrupt):
    """The command received ``signum``; raised once, in the main thread, to unwind it.

    A ``KeyboardInterrupt`` so that code written for Ctrl-C (``except KeyboardInterrupt``)
    treats SIGTERM and SIGHUP the same way.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The shell convention for a command ended by a signal: 128 + its number."""
        return 128 + self.signum


# --------------------------------------------------------------------------------------------
# /proc: the process tree
# --------------------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name: state, ppid, pgrp, session, ..."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def _all_stats() -> dict[int, list[str]]:
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                stats[int(entry.name)] = fields
    return stats


def descendants(pid: int, *, include_zombies: bool = False) -> list[int]:
    """Pids of every live descendant of ``pid`` (children first), read from ``/proc``."""
    return _descendants_in(_all_stats(), pid, include_zombies)


def _descendants_in(stats: dict[int, list[str]], pid: int, include_zombies: bool) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(child)
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop(0)
        if include_zombies or stats[child][0] != "Z":
            found.append(child)
        todo.extend(children.get(child, []))
    return found


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    return [pid for pid, fields in _all_stats().items()
            if int(fields[2]) == pgid and fields[0] != "Z"]


def _become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    return bool(prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


# --------------------------------------------------------------------------------------------
# the supervisor
# --------------------------------------------------------------------------------------------


@dataclass
class _Child:
    name: str
    process: subprocess.Popen[bytes]
    stop_signal: int
    grace: float


class ProcessSupervisor:
    """Context manager for a foreground command: start services and children through it, and
    leaving the ``with`` block (normally, by an exception, or by :class:`Interrupted`) stops
    them all in reverse order. Use it from the main thread, before starting anything."""

    def __init__(self, *, log: Callable[[str], None] | None = None) -> None:
        self._log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self._stack: list[_Child | Service] = []
        self._previous: dict[int, Any] = {}
        self._stopping = False
        self._hurry = threading.Event()
        self._grandchildren: set[int] = set()
        self._redeliver = False
        self._previous_unraisable_hook: Callable[[Any], Any] | None = None
        self.signal_received: int | None = None

    # ---- entering and leaving ------------------------------------------------------------

    def __enter__(self) -> Self:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("ProcessSupervisor must be used from the main thread (signals)")
        for signum in STOP_SIGNALS:
            previous = signal.getsignal(signum)
            if signum == signal.SIGHUP and previous is signal.SIG_IGN:
                continue  # nohup: keep running when the terminal goes
            self._previous[signum] = previous
            signal.signal(signum, self._on_signal)
        self._previous_unraisable_hook = sys.unraisablehook
        sys.unraisablehook = self._on_unraisable
        _become_subreaper()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._redeliver = False
        self.stop_all()
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if self._previous_unraisable_hook is not None:
            sys.unraisablehook = self._previous_unraisable_hook
            self._previous_unraisable_hook = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._redeliver:  # the Interrupted raised before was swallowed: raise it now
            self._redeliver = False
            raise Interrupted(self.signal_received or signum)
        if self._stopping:
            if not self._hurry.is_set():
                self._hurry.set()
                self._log(f"{signal.Signals(signum).name} again: killing what is left now")
            return
        self._stopping = True
        self.signal_received = signum
        self._log(f"{signal.Signals(signum).name}: stopping everything this command started")
        raise Interrupted(signum)

    def _on_unraisable(self, unraisable: Any) -> None:
        """``sys.unraisablehook``: an exception a finaliser raised, which Python ignores. If
        it is our :class:`Interrupted`, signal the main thread again so that the handler raises
        it where it can unwind the command; if that lands in a finaliser too, the same happens
        again (any other exception goes to the previous hook)."""
        if not isinstance(unraisable.exc_value, Interrupted):
            if self._previous_unraisable_hook is not None:
                self._previous_unraisable_hook(unraisable)
            return
        self._redeliver = True
        main = threading.main_thread().ident
        assert main is not None
        # from another thread, a moment later: the hook itself runs inside the finaliser, where
        # the handler's exception would be swallowed again
        redeliver = threading.Timer(0.05, signal.pthread_kill,
                                    (main, unraisable.exc_value.signum))
        redeliver.daemon = True
        redeliver.start()

    # ---- starting ------------------------------------------------------------------------

    def start_service(self, service: _Service, **start: Any) -> _Service:
        """``service.start(**start)``; stopped when the supervisor stops. Registered before it
        starts, so a signal during start-up still stops it."""
        self._stack.append(service)
        service.start(**start)
        return service

    def spawn(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | Path | None = None, output: IO[bytes] | int | None = None,
              stop_signal: int = signal.SIGTERM, grace: float = 10.0
              ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in a session of its own (stdin: /dev/null; stdout and stderr:
        ``output``, default ours). To stop it: ``stop_signal`` to it, ``grace`` s for it to
        exit, then its process group SIGTERM and SIGKILL. The kernel sends it ``stop_signal``
        if this process dies first."""
        if self._stopping:
            raise Interrupted(self.signal_received or signal.SIGTERM)
        process = subprocess.Popen(
            list(argv), env=dict(env) if env is not None else None, cwd=cwd,
            stdin=subprocess.DEVNULL, stdout=output, stderr=None if output is None else subprocess.STDOUT,
            start_new_session=True, preexec_fn=child_preexec(stop_signal))
        self._stack.append(_Child(name, process, stop_signal, grace))
        return process

    # ---- waiting -------------------------------------------------------------------------

    def wait(self, process: subprocess.Popen[bytes], *,
             services: Sequence[ManagedService] = ()) -> int:
        """Wait for ``process`` to exit (its return code), reaping orphans re-parented to us.
        A service of ``services`` dying first raises an error naming it."""
        while True:
            code = process.poll()
            if code is not None:
                return code
            self._check_services(services)
            self._reap_orphans()
            time.sleep(0.2)

    def wait_forever(self, services: Sequence[ManagedService]) -> None:
        """Block until a signal (:class:`Interrupted`) or until one of ``services`` dies."""
        while True:
            self._check_services(services)
            self._reap_orphans()
            time.sleep(0.5)

    @staticmethod
    def _check_services(services: Sequence[ManagedService]) -> None:
        from cdc_platform.devservices._process import DevServiceError

        for service in services:
            if not service.is_running():
                raise DevServiceError(
                    f"{service.display_name} (base dir {service.base_dir}) exited on its own; "
                    f"its log: {service.failure_details(10)}")

    def _tracked_pids(self) -> set[int]:
        pids = set()
        for entry in self._stack:
            if isinstance(entry, _Child):
                pids.add(entry.process.pid)
                continue
            for service in getattr(entry, "services", [entry]):
                if service.pid is not None:
                    pids.add(service.pid)
        return pids

    def _reap_orphans(self, *, all_untracked: bool = False) -> None:
        """Collect the exit status of grandchildren re-parented to us (we are their
        subreaper), so they do not linger as zombies. While the command runs, only of pids
        seen earlier as grandchildren: a child forked by other code (a ``subprocess.run`` in
        another thread) keeps its status for its own ``wait``. ``all_untracked``: at the end,
        every child no ``Popen`` here tracks."""
        stats = _all_stats()
        me = os.getpid()
        self._grandchildren |= {pid for pid in _descendants_in(stats, me, True)
                                if int(stats[pid][1]) != me}
        tracked = self._tracked_pids()
        for pid, fields in stats.items():
            if fields[0] != "Z" or int(fields[1]) != me or pid in tracked:
                continue
            if all_untracked or pid in self._grandchildren:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                self._grandchildren.discard(pid)

    # ---- stopping ------------------------------------------------------------------------

    def stop_all(self) -> None:
        """Stop everything started here, newest first, then sweep stray descendants.
        Not interrupted by further signals (a second one skips the grace periods)."""
        self._stopping = True
        while self._stack:
            entry = self._stack.pop()
            try:
                if isinstance(entry, _Child):
                    self._stop_child(entry)
                else:
                    entry.stop(timeout=0.5 if self._hurry.is_set() else 30.0)
            except Exception as error:  # noqa: BLE001 - stop the rest, then say what failed
                name = entry.name if isinstance(entry, _Child) else entry.display_name
                self._log(f"stopping {name} failed: {error}")
        self._sweep()
        if self.signal_received is not None:
            self._log("stopped everything this command started")

    def _wait(self, done: Callable[[], bool], seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not done():
            if self._hurry.is_set() or time.monotonic() >= deadline:
                return done()
            time.sleep(0.05)
        return True

    def _stop_child(self, child: _Child) -> None:
        process, pgid = child.process, child.process.pid
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, child.stop_signal)
            if not self._wait(lambda: process.poll() is not None, child.grace):
                self._log(f"{child.name} (pid {process.pid}) did not stop within "
                          f"{child.grace:.0f} s of {signal.Signals(child.stop_signal).name}")
        for sig, seconds in ((signal.SIGTERM, GROUP_TERM_GRACE_SECONDS), (signal.SIGKILL, 10.0)):
            if not _group_members(pgid):
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
            self._wait(lambda: process.poll() is not None and not _group_members(pgid), seconds)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)

    def _sweep(self) -> None:
        """End descendants that escaped their process group (a ``setsid`` grandchild, an
        orphan re-parented to us), then reap the ones that are our children now."""
        me = os.getpid()
        strays = descendants(me)
        if strays:
            self._log(f"stopping {len(strays)} stray process(es) left behind: {strays}")
            for sig, seconds in ((signal.SIGTERM, SWEEP_GRACE_SECONDS), (signal.SIGKILL, 10.0)):
                for pid in descendants(me):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
                if self._wait(lambda: not descendants(me), seconds):
                    break
        self._reap_orphans(all_untracked=True)
        left = [pid for pid in descendants(me) if pid_alive(pid)]
        if left:
            self._log(f"processes {left} survived SIGKILL; check `ps -o pid,stat,cmd -p "
                      f"{','.join(map(str, left))}`")
