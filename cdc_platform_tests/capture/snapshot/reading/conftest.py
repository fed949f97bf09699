"""Fixtures of the snapshot reader's tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.capture.landing.zone import LandingZone


@pytest.fixture
def shop(mariadb: Any, tmp_path: Path) -> Iterator[tuple[Any, str, LandingZone]]:
    """A database with ``items`` (id 1..100), a CDC connection and a landing zone."""
    db = f"reader_{time.monotonic_ns()}"
    mariadb.query(f"CREATE DATABASE `{db}`")
    mariadb.query(f"CREATE TABLE `{db}`.items (id INT PRIMARY KEY, name VARCHAR(20), "
                  "status VARCHAR(8))")
    mariadb.query(f"INSERT INTO `{db}`.items SELECT seq, CONCAT('n', seq), "
                  f"IF(seq % 3 = 0, 'open', 'closed') FROM `{db}`.seq_1_to_100")
    try:
        yield mariadb, db, LandingZone(str(tmp_path / "landing"), "shop")
    finally:
        mariadb.query(f"DROP DATABASE `{db}`")
