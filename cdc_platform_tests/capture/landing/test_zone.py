"""The checkpoint's own rules, read back from a landing zone as the engine reads it."""

from pathlib import Path

import pytest

from cdc_platform.capture.events import EngineError
from cdc_platform.capture.landing.zone import Checkpoint, LandingZone


def test_a_checkpoint_refuses_a_source_of_another_flavour(tmp_path: Path) -> None:
    """A MariaDB GTID set resumed on a MySQL source (or the reverse) would skip or replay
    transactions: the engine's start stops with the setting to fix."""
    landing = LandingZone(str(tmp_path), "demo")
    landing.write_checkpoint(Checkpoint("demo", "mariadb", gtid="0-1-10", next_pos=5))
    checkpoint = landing.read_checkpoint()
    assert checkpoint is not None
    checkpoint.check_flavour("mariadb")
    with pytest.raises(EngineError, match="checkpoint of demo was written for a mariadb source "
                       "but source.flavour is mysql: fix the config"):
        checkpoint.check_flavour("mysql")
