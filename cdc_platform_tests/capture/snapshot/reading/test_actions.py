"""Pause, resume and stop of a table's session from outside its run (``reading/actions.py``):
they rewrite request.json, and refuse clearly without a session or for a replaced one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_platform.capture.landing.session_records import SnapshotRequest
from cdc_platform.capture.snapshot.errors import SnapshotError
from cdc_platform.capture.snapshot.protocol import read_request, write_request
from cdc_platform.capture.snapshot.reading import actions
from cdc_platform.capture.snapshot.reading.actions import (
    pause,
    resume,
    stop,
)
from cdc_platform_tests.capture.snapshot.reading.scripted_engine import _landing


def test_request_json_has_the_contract_fields_and_actions_rewrite_it(tmp_path: Path) -> None:
    landing = _landing(tmp_path)
    request = SnapshotRequest("run-1", "open", ("id",), "total > 0", 4096)
    path = write_request(landing, "shop", "orders", request)
    assert path == str(landing.root / "snapshots" / "shop" / "orders" / "request.json")
    data = json.loads(Path(path).read_bytes())
    assert set(data) == {"session_id", "action", "chunk_key", "condition", "chunk_size",
                         "requested_at", "signal"}
    assert data["signal"] is None  # (set when a signal asked: docs/signals.md)
    assert (data["action"], data["chunk_key"], data["chunk_size"]) == ("open", ["id"], 4096)
    assert data["requested_at"].endswith("Z")
    for action, helper in (("pause", pause), ("resume", resume), ("stop", stop)):
        helper(landing, "shop", "orders")
        again = read_request(landing, "shop", "orders")
        assert again is not None
        assert (again.session_id, again.action, again.condition) == ("run-1", action, "total > 0")


def test_actions_without_a_session_or_for_a_replaced_one_are_clear_errors(tmp_path: Path) -> None:
    landing = _landing(tmp_path)
    with pytest.raises(SnapshotError, match=r"snapshot of shop\.orders on demo: no session to "
                                            "pause"):
        pause(landing, "shop", "orders")
    write_request(landing, "shop", "orders", SnapshotRequest("run-2", "open", ("id",), None, 10))
    with pytest.raises(SnapshotError, match="session run-1 was replaced by session run-2"):
        actions.request_action(landing, "shop", "orders", "stop", "run-1")
    with pytest.raises(ValueError, match="action 'open'"):
        actions.request_action(landing, "shop", "orders", "open")
