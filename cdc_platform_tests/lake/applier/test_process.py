"""The applier in a child process (``lake.applier.process``), as the ``apply_changes`` run
uses it: its merges reach the parent as events, it stops after the merge in progress when
asked, and a loop that fails fails the parent with the child's error."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from cdc_platform.config import parse_settings
from cdc_platform.lake.applier.events import Applied
from cdc_platform.lake.applier.process import ApplierFailed, ApplierProcess
from cdc_platform_tests.conftest import CdcEnv


def parent_of(pid: int) -> int | None:
    """The parent of ``pid`` while it runs (None: gone, or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[1])


def test_the_child_merges_reports_and_stops_when_asked(cdc_env: CdcEnv) -> None:
    cdc_env.execute("CREATE TABLE orders (id INT PRIMARY KEY, v VARCHAR(20))",
                    "INSERT INTO orders VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    cdc_env.catch_up()
    child = ApplierProcess(cdc_env.settings)
    child.start()
    events: list[object] = []
    try:
        assert child.pid is not None and parent_of(child.pid) == os.getpid()
        deadline = time.monotonic() + 180
        while not any(isinstance(e, Applied) for e in events):
            assert time.monotonic() < deadline, f"no merge reported: {events}"
            events.extend(child.receive(1.0))
        merged = next(e for e in events if isinstance(e, Applied))
        assert merged.schema.table == "orders" and merged.result.rows == 3
        # the counters arrive once a second
        deadline = time.monotonic() + 10
        while child.counters.merges < 1:
            assert time.monotonic() < deadline, child.counters
            events.extend(child.receive(0.5))
    finally:
        assert child.stop(60, events.append)
    assert parent_of(child.pid) is None


def test_a_loop_that_fails_raises_the_childs_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    settings = parse_settings({
        "source": {"flavour": "mariadb", "host": "127.0.0.1", "port": 1, "user": "cdc",
                   "server_id": 5, "server_name": "broken"},
        "landing_zone": {"url": str(tmp_path / "file" / "landing")},
        "warehouse": {"url": str(tmp_path / "warehouse")}}, "test")
    child = ApplierProcess(settings)
    child.start()
    deadline = time.monotonic() + 120
    with pytest.raises(ApplierFailed, match="NotADirectoryError") as failed:
        while time.monotonic() < deadline:
            child.receive(1.0)
    assert "the applier's loop failed in its process" in str(failed.value)
    child.stop(10, lambda event: None)


def test_ctrl_c_is_the_parents_and_a_stop_it_did_not_ask_for_fails_it(cdc_env: CdcEnv) -> None:
    child = ApplierProcess(cdc_env.settings)
    child.start()
    assert child.pid is not None
    try:
        deadline = time.monotonic() + 120
        while child.counters.passes < 1:  # (the loop runs)
            assert time.monotonic() < deadline, child.counters
            child.receive(0.5)
        os.kill(child.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the process group
        child.receive(2.0)
        assert child.alive()
        os.kill(child.pid, signal.SIGTERM)  # not from the run
        with pytest.raises(ApplierFailed, match="stopped on SIGTERM, which this run did not"):
            while time.monotonic() < deadline + 60:
                child.receive(1.0)
    finally:
        child.stop(30, lambda event: None)
