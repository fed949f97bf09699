"""The platform's own commands as processes of their own, as in production, with what they
cost: ``python -m cdc_platform stream|apply|snapshot`` started with a config file, their log in a
file, their CPU seconds and peak RSS read from /proc for the whole process tree (the applier's
Python driver and the JVM it starts, and Spark's Python workers while they live)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench._engine import rss_bytes

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (not of its children); 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def _children(pid: int) -> list[int]:
    found = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    return found


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants alive now."""
    return [p for p, _ in _tree_with_parents(pid)]


def _tree_with_parents(pid: int) -> list[tuple[int, int | None]]:
    tree: list[tuple[int, int | None]] = []
    todo: list[tuple[int, int | None]] = [(pid, None)]
    while todo:
        current, parent = todo.pop()
        tree.append((current, parent))
        todo += [(child, current) for child in _children(current)]
    return tree


def _exe(pid: int | None) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe") if pid is not None else None
    except OSError:
        return None


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return "?"


def system_busy_seconds() -> float:
    """CPU seconds every core of the machine spent busy since boot (/proc/stat, all but idle
    and iowait): beside a tree's own CPU it shows what else ran during a measurement."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / CLOCK_TICKS


@dataclass
class _Sampled:
    name: str
    cpu: float = 0.0
    peak_rss: int = 0
    cpu_at_mark: float = 0.0
    # A child that has not exec'd yet (the JVM forking Spark's Python workers, the daemon
    # forking workers): its peak is the parent's pages, counted with the parent.
    parent_image: bool = False


@dataclass
class TreeUsage:
    """What a process tree used: CPU seconds since the mark, peak RSS per process name."""

    cpu_seconds: float
    peak_rss_by_name: dict[str, int] = field(default_factory=dict)

    @property
    def peak_rss(self) -> int:
        """Sum of the processes' own peaks: an upper bound of the tree's peak."""
        return sum(self.peak_rss_by_name.values())

    def describe(self, seconds: float) -> str:
        rss = ", ".join(f"{name} {size / 2**20:,.0f}" for name, size in
                        sorted(self.peak_rss_by_name.items(), key=lambda kv: -kv[1])
                        if size >= 10 * 2**20)  # (not spark-submit's helpers)
        return (f"CPU {self.cpu_seconds:,.1f} s ({self.cpu_seconds / seconds:.2f} cores), peak "
                f"RSS {self.peak_rss / 2**20:,.0f} MB ({rss} MB)")


class CliProcess:
    """``python -m cdc_platform <args>`` in a process of its own, stopped with SIGTERM (its
    clean stop) on ``stop``, sampled every ``sample_seconds`` for CPU and peak RSS."""

    def __init__(self, label: str, args: list[str], log_path: Path, env: dict[str, str],
                 cwd: Path, sample_seconds: float = 0.5) -> None:
        self.label = label
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.started_at = time.time()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cdc_platform", *args], stdout=self._log,
            stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=cwd)
        self.ended_at: float | None = None
        self._samples: dict[int, _Sampled] = {}
        self._lock = threading.Lock()
        self._stop_sampling = threading.Event()
        self._sampler = threading.Thread(target=self._sample_loop, args=(sample_seconds,),
                                         name=f"sample-{label}", daemon=True)
        self._sampler.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def _sample_loop(self, every: float) -> None:
        while not self._stop_sampling.is_set():
            self.sample()
            if self.process.poll() is not None and self.ended_at is None:
                self.ended_at = time.time()
            self._stop_sampling.wait(every)

    def sample(self) -> None:
        for pid, parent in _tree_with_parents(self.pid):
            cpu, peak = cpu_seconds(pid), rss_bytes("VmHWM", pid)
            exe = _exe(pid)
            with self._lock:
                sampled = self._samples.setdefault(pid, _Sampled(_name(pid)))
                if peak:  # (still there) the name and peak of its newest image
                    sampled.name = _name(pid)
                    sampled.peak_rss = peak
                    sampled.parent_image = exe is not None and exe == _exe(parent)
                sampled.cpu = max(sampled.cpu, cpu)

    def mark(self) -> None:
        """From now on ``usage().cpu_seconds`` counts from here (a phase of the run)."""
        self.sample()
        with self._lock:
            for sampled in self._samples.values():
                sampled.cpu_at_mark = sampled.cpu

    def usage(self) -> TreeUsage:
        if self.alive():
            self.sample()
        with self._lock:
            cpu = sum(s.cpu - s.cpu_at_mark for s in self._samples.values())
            peaks: dict[str, int] = {}
            for sampled in self._samples.values():
                if sampled.parent_image:
                    continue
                # (Spark's short-lived Python workers: the largest one stands for them)
                peaks[sampled.name] = max(peaks.get(sampled.name, 0), sampled.peak_rss)
        return TreeUsage(cpu, peaks)

    def wait(self, timeout: float | None = None) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(timeout)
        return None

    def stop(self, grace_seconds: float = 90.0) -> int | None:
        """SIGTERM (flush, checkpoint, exit), then SIGKILL after the grace period; a JVM left
        behind by a killed driver is killed by its pid too."""
        tree = process_tree(self.pid) if self.alive() else []
        if self.alive():
            self.sample()
            self.process.send_signal(signal.SIGTERM)
            if self.wait(grace_seconds) is None:
                print(f"({self.label} did not stop within {grace_seconds:.0f} s of SIGTERM: "
                      "killed)")
                self.process.kill()
                self.process.wait()
        for pid in tree[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._stop_sampling.set()
        self._sampler.join(5)
        if self.ended_at is None:
            self.ended_at = time.time()
        self._log.close()
        return self.process.returncode

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()

    def fail(self, what: str) -> RuntimeError:
        tail = "\n".join(self.log_lines()[-25:])
        return RuntimeError(f"{self.label} {what} (exit code {self.process.poll()}); the end of "
                            f"{self.log_path}:\n{tail}")
