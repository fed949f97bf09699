"""The supervisor's escalation: a child that ignores its stop signal, and a grandchild that left
its process group, are still gone when the command exits; a second signal skips the graces.

The supervisor installs signal handlers and makes its process a child subreaper, so it runs in
a small command of its own here, never inside pytest.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from cdc_platform.devservices.supervisor import (
    GROUP_TERM_GRACE_SECONDS,
    SWEEP_GRACE_SECONDS,
    descendants,
)

# A child that ignores SIGTERM and starts a grandchild in a session of its own, which ignores
# SIGTERM too: only the group's SIGKILL ends the child, only the sweep ends the grandchild.
_COMMAND = textwrap.dedent("""
    import signal, sys
    from cdc_platform.devservices.supervisor import Interrupted, ProcessSupervisor

    STUBBORN = '''
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", "import os, signal, time; os.setsid(); "
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    time.sleep(600)
    '''
    try:
        with ProcessSupervisor() as supervisor:
            child = supervisor.spawn("stubborn", [sys.executable, "-c", STUBBORN], grace=1.0)
            supervisor.wait(child)
    except Interrupted as stop:
        sys.exit(stop.exit_code)
""")


@contextmanager
def _command() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", _COMMAND], start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    tree: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(tree) < 2:  # the stubborn child and its grandchild
            assert process.poll() is None, "the command exited early"
            assert time.monotonic() < deadline, f"no child and grandchild: {tree}"
            time.sleep(0.1)
            tree = descendants(process.pid)
        yield process
    finally:
        for pid in [process.pid, *tree, *descendants(process.pid)]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=30)


def _alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie has stopped)."""
    alive = []
    for pid in pids:
        with suppress(OSError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z":
                alive.append(pid)
    return alive


def test_stubborn_child_and_escaped_grandchild_are_killed() -> None:
    with _command() as command:
        tree = descendants(command.pid)
        assert len(tree) == 2, tree  # the stubborn child and its setsid grandchild
        # a session of its own: the terminal's Ctrl-C reaches the command, not the child
        assert all(os.getsid(pid) != os.getsid(command.pid) for pid in tree)
        started = time.monotonic()
        os.killpg(command.pid, signal.SIGTERM)
        assert command.wait(timeout=60) == 128 + signal.SIGTERM
        elapsed = time.monotonic() - started
        assert _alive(tree) == []
        # it escalated instead of giving up: the child's grace, its group's, the sweep's
        assert elapsed >= 1.0 + GROUP_TERM_GRACE_SECONDS + SWEEP_GRACE_SECONDS - 0.5
        assert command.stdout is not None
        output = command.stdout.read().decode()
        assert "did not stop within 1 s of SIGTERM" in output
        assert "stray process(es) left behind" in output


def test_a_second_signal_kills_at_once() -> None:
    with _command() as command:
        tree = descendants(command.pid)
        started = time.monotonic()
        os.killpg(command.pid, signal.SIGINT)
        time.sleep(0.3)
        os.kill(command.pid, signal.SIGINT)  # the impatient second Ctrl-C
        assert command.wait(timeout=60) == 128 + signal.SIGINT
        assert _alive(tree) == []
        assert time.monotonic() - started < GROUP_TERM_GRACE_SECONDS + SWEEP_GRACE_SECONDS
        assert command.stdout is not None
        assert "SIGINT again: killing what is left now" in command.stdout.read().decode()


# The signal lands while a finaliser runs (as a pymysql result freed by the garbage collector
# did in the demo): Python prints and ignores an exception raised there, so the command ran on.
_SIGNAL_IN_FINALISER = textwrap.dedent("""
    import os, signal, sys, time
    from cdc_platform.devservices.supervisor import Interrupted, ProcessSupervisor

    class Freed:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, inside __del__
            sum(range(1000))

    try:
        with ProcessSupervisor():
            Freed()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                time.sleep(0.05)
            print("ran on after the signal")
            sys.exit(3)
    except Interrupted as stop:
        print("interrupted")
        sys.exit(stop.exit_code)
""")


def test_a_signal_swallowed_by_a_finaliser_still_stops_the_command() -> None:
    done = subprocess.run([sys.executable, "-c", _SIGNAL_IN_FINALISER], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 128 + signal.SIGINT, done.stdout + done.stderr
    assert "interrupted" in done.stdout
    assert "Exception ignored" not in done.stderr  # ours is re-raised, not reported as lost
