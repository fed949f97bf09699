"""A snapshot run's result (``reading/progress.py``): its status is one the asset, the CLI and
the notifications know.
"""

from __future__ import annotations

import pytest

from cdc_platform.capture.snapshot.reading.progress import (
    SnapshotResult,
    SnapshotStatus,
)


def test_a_result_has_one_of_the_snapshot_statuses() -> None:
    """The asset, the CLI's exit code and the notifications read ``status``: a status none of
    them knows (a typo in one place) fails where the result is made, not as a wrong outcome."""
    assert SnapshotResult("s.t", "x", "stopped").status is SnapshotStatus.STOPPED
    assert SnapshotResult("s.t", "x", SnapshotStatus.DONE).status_text == "done"
    skipped = SnapshotResult("s.t", "x", SnapshotStatus.SKIPPED, reason="no key")
    assert skipped.skipped and skipped.status_text == "skipped: no key"
    with pytest.raises(ValueError, match="finished"):
        SnapshotResult("s.t", "x", "finished")
