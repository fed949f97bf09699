"""Process plumbing shared by the dev services: start, record, attach, stop, and never orphan.

A service owns a *base directory*. While it runs, ``<base>/state.json`` records its pid and
port so another process (``make ui`` after ``make demo``, or ``python -m cdc_platform.devservices
down``) can find it; ``<base>/.lock`` serialises concurrent starts on the same base directory.

Orphans are prevented three ways for services this process owns: an ``atexit`` hook (also runs
after Ctrl-C, which raises ``KeyboardInterrupt``), a SIGTERM/SIGHUP handler when the signal still
has its default disposition, and on Linux ``PR_SET_PDEATHSIG`` so the kernel sends the child
its stop signal even when the owner is SIGKILLed. Detached services (``start(detach=True)``) skip
all three on purpose: they must outlive the command that started them. Foreground commands that
start several processes go through :mod:`cdc_platform.devservices.supervisor`, which stops them
all on the first SIGINT/SIGTERM/SIGHUP.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, ClassVar, Self

from cdc_platform.devservices.ports import free_port

__all__ = ["DevServiceError", "ManagedService", "child_preexec", "find_processes", "pid_alive"]


class DevServiceError(RuntimeError):
    """A private service could not be started, reached or stopped; the message says what to do."""


class _PortTaken(Exception):
    """The auto-picked port was grabbed by someone else between picking and binding."""


# --------------------------------------------------------------------------------------------
# process inspection
# --------------------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (a zombie has already stopped serving)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def find_processes(executable: str, marker: str) -> list[int]:
    """Pids of live processes running ``executable`` (basename) with ``marker`` as one argument.

    Used to spot a server that still holds a data directory although no state file records it,
    and by tests to prove that nothing was left behind. Linux only (reads ``/proc``).
    """
    pids: list[int] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return pids
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        argv = _cmdline(pid)
        if argv and Path(argv[0]).name == executable and marker in argv[1:] and pid_alive(pid):
            pids.append(pid)
    return sorted(pids)


def _matches(pid: int, executable: str, marker: str) -> bool:
    """True if ``pid`` is still the process we recorded (guards against pid reuse)."""
    if not pid_alive(pid):
        return False
    argv = _cmdline(pid)
    if argv is None:  # no /proc: trust the pid
        return True
    return bool(argv) and Path(argv[0]).name == executable and marker in argv[1:]


def terminate_pid(
    pid: int,
    timeout: float,
    *,
    popen: subprocess.Popen[bytes] | None = None,
    sig: int = signal.SIGTERM,
) -> None:
    """Send ``sig`` (SIGTERM) to ``pid``, wait up to ``timeout`` s, then SIGKILL its session."""

    def gone() -> bool:
        if popen is not None:
            return popen.poll() is not None
        return not pid_alive(pid)

    if gone():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone():
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not gone():
        time.sleep(0.05)
    if not gone():
        raise DevServiceError(
            f"process {pid} survived SIGKILL; check `ps -o pid,stat,cmd -p {pid}`"
        )


# --------------------------------------------------------------------------------------------
# orphan prevention for owned services
# --------------------------------------------------------------------------------------------

_REGISTRY_LOCK = threading.RLock()  # re-entered when a signal handler interrupts a stop()
_OWNED: dict[int, ManagedService] = {}
_ATEXIT_INSTALLED = False
_SIGNALS_INSTALLED = False


def _stop_all_owned() -> None:
    with _REGISTRY_LOCK:
        services = list(_OWNED.values())
    for service in reversed(services):
        if service._owner_pid != os.getpid():
            continue  # a forked child inherited the registry; the parent still owns these
        with contextlib.suppress(Exception):
            service.stop()


def _on_fatal_signal(signum: int, frame: FrameType | None) -> None:
    _stop_all_owned()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _register(service: ManagedService) -> None:
    global _ATEXIT_INSTALLED, _SIGNALS_INSTALLED
    with _REGISTRY_LOCK:
        _OWNED[id(service)] = service
        if not _ATEXIT_INSTALLED:
            atexit.register(_stop_all_owned)
            _ATEXIT_INSTALLED = True
        if not _SIGNALS_INSTALLED and threading.current_thread() is threading.main_thread():
            _SIGNALS_INSTALLED = True
            for sig in (signal.SIGTERM, signal.SIGHUP):
                # Only where nobody else (Dagster, a test runner) has claimed the signal.
                with contextlib.suppress(ValueError, OSError):
                    if signal.getsignal(sig) is signal.SIG_DFL:
                        signal.signal(sig, _on_fatal_signal)


def _unregister(service: ManagedService) -> None:
    with _REGISTRY_LOCK:
        _OWNED.pop(id(service), None)


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal.restype = ctypes.c_void_p
        libc.prctl  # noqa: B018 - fail here, not in a forked child
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _load_libc()  # resolved up front: the preexec hook must not load libraries after fork
_PR_SET_PDEATHSIG = 1
_SIG_DFL = 0
#: The signals a child is stopped with; a child must not inherit them ignored.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def child_preexec(pdeathsig: int | None) -> Callable[[], None] | None:
    """A ``preexec_fn``: the stop signals back to their default action, and (``pdeathsig``)
    the kernel sends the child that signal when its parent dies.

    Why the reset: a shell starts background commands (``make ui &`` in a script) with SIGINT
    ignored, and an ignored signal stays ignored across ``exec``: the child would then ignore
    the very signal it is stopped with (Tansu stops on SIGINT, ``dagster dev`` too).
    """
    libc = _LIBC
    if libc is None:
        return None

    def preexec() -> None:
        for sig in _STOP_SIGNALS:
            libc.signal(sig, _SIG_DFL)
        if pdeathsig is not None:
            libc.prctl(_PR_SET_PDEATHSIG, pdeathsig)

    return preexec


# --------------------------------------------------------------------------------------------
# the base class
# --------------------------------------------------------------------------------------------


def _tail(path: Path, offset: int, lines: int) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(offset if offset <= path.stat().st_size else 0)
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


@dataclass(eq=False)
class ManagedService:
    """Lifecycle shared by :class:`MariaDBServer` and :class:`TansuBroker`.

    Subclasses declare ``base_dir``, ``port``, ``host`` and ``start_timeout`` fields and fill in
    the ``_argv`` / ``_marker`` / ``_is_ready`` hooks.
    """

    executable_name: ClassVar[str] = ""
    display_name: ClassVar[str] = ""
    #: The signal that makes the server shut down cleanly and promptly.
    stop_signal: ClassVar[int] = signal.SIGTERM

    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _pid: int | None = field(default=None, init=False, repr=False)
    _owned: bool = field(default=False, init=False, repr=False)
    _detached: bool = field(default=False, init=False, repr=False)
    _auto_port: bool = field(default=True, init=False, repr=False)
    _owner_pid: int | None = field(default=None, init=False, repr=False)
    _log_offsets: dict[Path, int] = field(default_factory=dict, init=False, repr=False)

    if TYPE_CHECKING:  # declared as dataclass fields by the subclasses
        base_dir: Path
        port: int | None
        host: str
        start_timeout: float

    # ---- hooks ---------------------------------------------------------------------------

    def _argv(self, port: int) -> list[str]:
        raise NotImplementedError

    def _marker(self, port: int) -> str:
        """One argv element that identifies this instance's process (checked in /proc)."""
        raise NotImplementedError

    def _is_ready(self) -> bool:
        raise NotImplementedError

    def _prepare(self) -> None:
        """Create directories / initialise data before the first launch."""

    def _on_ready(self) -> None:
        """Runs after start or attach, under the base-dir lock (e.g. create users)."""

    def _log_files(self) -> list[Path]:
        return [self._out_log]

    def _state_extra(self) -> dict[str, Any]:
        return {}

    def _load_state_extra(self, state: dict[str, Any]) -> None:
        """Adopt settings of an attached instance recorded by another process."""

    def _env(self) -> dict[str, str] | None:
        """Environment for the child (None: inherit ours)."""
        return None

    def _failure_hint(self) -> str:
        """What to try when the process died during start-up for no recognised reason."""
        return "Fix the cause shown in the log above and start again."

    def _stray_pids(self) -> list[int]:
        """Unrecorded processes that would conflict with a new launch (e.g. same datadir)."""
        return []

    # ---- paths ---------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        """JSON record (pid, port, ...) of the running instance, read by other processes."""
        return self.base_dir / "state.json"

    @property
    def _lock_file(self) -> Path:
        return self.base_dir / ".lock"

    @property
    def _out_log(self) -> Path:
        return self.base_dir / f"{self.executable_name}.out"

    # ---- public lifecycle ----------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """Pid of the running (owned or attached) process, else None."""
        return self._pid

    @property
    def owned(self) -> bool:
        """True if this object launched the process (and is therefore the one to stop it)."""
        return self._owned

    def is_running(self) -> bool:
        """True if the process this object started or attached to is still alive."""
        if self._pid is None:
            return False
        if self._proc is not None:
            return self._proc.poll() is None
        return pid_alive(self._pid)

    def start(self, *, reuse: bool = False, detach: bool = False) -> Self:
        """Start the service and wait until it serves requests (at most ``start_timeout`` s).

        ``reuse=True`` attaches to an instance another process recorded in this base dir
        instead of failing. ``detach=True`` lets the process outlive this interpreter (no
        atexit / signal / parent-death cleanup): stop it later with ``stop()`` from any process
        or ``python -m cdc_platform.devservices down``.
        """
        if self.is_running():
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        with self._locked():
            state = self._live_state()
            if state is not None:
                if not reuse:
                    raise DevServiceError(
                        f"{self.display_name} for {self.base_dir} is already running "
                        f"(pid {state['pid']}, port {state['port']}, recorded in "
                        f"{self.state_file}). Attach to it with start(reuse=True), or stop it "
                        f"first (`python -m cdc_platform.devservices down` or kill {state['pid']})."
                    )
                self._adopt(state)
                self._wait_ready(self.start_timeout)
            else:
                strays = self._stray_pids()
                if strays:
                    raise DevServiceError(
                        f"{self.display_name} process(es) {strays} already use {self.base_dir} "
                        f"but {self.state_file} does not record them (left over from a crash?). "
                        f"Stop them (`kill {' '.join(map(str, strays))}`) and start again."
                    )
                self._prepare()
                self._launch(detach)
                self._write_state()
            try:
                self._on_ready()
            except Exception:
                if self._owned:
                    self.stop()
                raise
        return self

    def attach(self) -> bool:
        """Attach to an instance recorded in the base dir, if one is alive; never launches."""
        if self.is_running():
            return True
        if not self.state_file.exists():
            return False
        with self._locked():
            state = self._live_state()
            if state is None:
                with contextlib.suppress(FileNotFoundError):
                    self.state_file.unlink()  # stale: its process is gone
                return False
            self._adopt(state)
            self._wait_ready(self.start_timeout)
            self._on_ready()
        return True

    def status(self) -> dict[str, Any] | None:
        """The recorded state of a live instance in the base dir (any owner), else None."""
        return self._live_state()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the process (``stop_signal``, SIGKILL after ``timeout`` s). Safe to call twice.

        Stops attached instances too: calling ``stop()`` is an explicit request. Owners that
        never call it still get cleanup at interpreter exit, unless started detached.
        """
        self._halt(timeout)

    def _halt(self, timeout: float) -> None:
        """End the process and forget it; subclasses' ``stop()`` may clean up more after this."""
        pid = self._pid
        if pid is None:
            return
        try:
            if self._proc is not None:
                terminate_pid(pid, timeout, popen=self._proc, sig=self.stop_signal)
            elif self.port is not None and _matches(
                pid, self.executable_name, self._marker(self.port)
            ):
                terminate_pid(pid, timeout, sig=self.stop_signal)
        finally:
            _unregister(self)
            self._proc = None
            self._pid = None
            self._owned = False
            self._clear_state(pid)

    def restart(self) -> Self:
        """Stop and start again on the same port and data (simulates a source/broker restart)."""
        detach = self._detached
        self.stop()
        return self.start(detach=detach)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- internals -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + self.start_timeout + 30
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise DevServiceError(
                            f"another process holds {self._lock_file} (starting "
                            f"{self.display_name} in {self.base_dir}?); wait for it or kill it"
                        ) from None
                    time.sleep(0.1)
            yield
        finally:
            os.close(fd)

    def _read_state(self) -> dict[str, Any] | None:
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(state, dict) or not isinstance(state.get("pid"), int):
            return None
        if not isinstance(state.get("port"), int):
            return None
        return state

    def _live_state(self) -> dict[str, Any] | None:
        state = self._read_state()
        if state is None:
            return None
        if not _matches(state["pid"], self.executable_name, self._marker(state["port"])):
            return None
        return state

    def _write_state(self) -> None:
        assert self._pid is not None and self.port is not None
        state = {
            "service": self.executable_name,
            "pid": self._pid,
            "host": self.host,
            "port": self.port,
            "detached": self._detached,
            "owner_pid": os.getpid(),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            **self._state_extra(),
        }
        tmp = self.state_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state_file)

    def _clear_state(self, pid: int) -> None:
        state = self._read_state()
        if state is not None and state["pid"] == pid:
            with contextlib.suppress(FileNotFoundError):
                self.state_file.unlink()

    def _adopt(self, state: dict[str, Any]) -> None:
        self._proc = None
        self._pid = int(state["pid"])
        self.port = int(state["port"])
        self.host = str(state.get("host", self.host))
        self._owned = False
        self._detached = bool(state.get("detached", False))
        self._load_state_extra(state)

    def _launch(self, detach: bool) -> None:
        attempts = 3 if self._auto_port else 1
        for attempt in range(attempts):
            port = self.port if (self.port is not None and attempt == 0) else free_port(self.host)
            self._log_offsets = {
                path: (path.stat().st_size if path.exists() else 0) for path in self._log_files()
            }
            argv = self._argv(port)
            use_pdeathsig = not detach and threading.current_thread() is threading.main_thread()
            with self._out_log.open("ab") as out:
                try:
                    proc = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        cwd=self.base_dir,
                        env=self._env(),
                        start_new_session=True,
                        close_fds=True,
                        preexec_fn=child_preexec(self.stop_signal if use_pdeathsig else None),
                    )
                except OSError as exc:
                    raise DevServiceError(
                        f"cannot execute {argv[0]} for {self.display_name}: {exc}"
                    ) from exc
            self._proc, self._pid, self.port = proc, proc.pid, port
            self._owned, self._detached, self._owner_pid = True, detach, os.getpid()
            if not detach:
                _register(self)
            try:
                self._wait_ready(self.start_timeout)
                return
            except _PortTaken:
                self._halt(5)  # not stop(): the base dir must survive for the next attempt
                continue
        raise DevServiceError(
            f"{self.display_name}: {attempts} auto-picked ports on {self.host} were taken before "
            f"the server could bind them; pass an explicit free port"
        )

    def failure_details(self, lines: int = 30) -> str:
        """The last log lines written since the latest launch, to explain a failure."""
        parts = []
        for path in self._log_files():
            text = _tail(path, self._log_offsets.get(path, 0), lines)
            if text:
                parts.append(f"--- {path} ---\n{text}")
        return "\n".join(parts) or "(no log output)"

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            if not self.is_running():
                code = self._proc.returncode if self._proc is not None else None
                details = self.failure_details()
                port_taken = any(
                    text in details.lower() for text in (
                        "already in use", "address in use",
                        "port allocation failed")  # (weed mini, for any of its ports)
                )
                if port_taken and self._owned and self._auto_port:
                    raise _PortTaken()
                pid = self._pid
                _unregister(self)
                self._proc = self._pid = None
                if pid is not None:
                    self._clear_state(pid)
                hint = (
                    f"Port {self.port} is taken: pass another port, or none to get a free one."
                    if port_taken
                    else self._failure_hint()
                )
                raise DevServiceError(
                    f"{self.display_name} (pid {pid}, port {self.port}) exited"
                    f"{f' with code {code}' if code is not None else ''} before accepting "
                    f"connections. Base dir: {self.base_dir}\n{details}\n{hint}"
                )
            if self._is_ready():
                return
            if time.monotonic() > deadline:
                details = self.failure_details()
                if self._owned:
                    self.stop(timeout=5)
                raise DevServiceError(
                    f"{self.display_name} did not accept connections on {self.host}:{self.port} "
                    f"within {timeout:.0f} s (base dir {self.base_dir}).\n{details}\n"
                    f"An owned process was stopped. Check the log above; a slow machine may need "
                    f"a larger start_timeout."
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)
