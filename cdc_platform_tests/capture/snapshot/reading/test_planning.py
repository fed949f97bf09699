"""Before a reader reads (``reading/reader.py``): the additional condition is checked where it
enters, a table without a chunk key is skipped, a source whose settings do not make
watermarks exact is refused, and a table dropped meanwhile fails the run saying so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdc_platform.capture.landing.zone import LandingZone
from cdc_platform.capture.snapshot.chunks import ChunkedTable, ChunkKey
from cdc_platform.capture.snapshot.conditions import Condition, UnsafeConditionError
from cdc_platform.capture.snapshot.errors import SnapshotError
from cdc_platform.capture.snapshot.reading.progress import SnapshotStatus
from cdc_platform.capture.snapshot.reading.reader import SnapshotReader
from cdc_platform_tests.capture.snapshot.reading.scripted_engine import (
    SCHEMA,
    _landing,
    _reader,
)


def test_unsafe_condition_is_refused_naming_the_table(tmp_path: Path) -> None:
    with pytest.raises(UnsafeConditionError, match=r"snapshot of shop\.orders: additional "
                                                   "condition refused"):
        SnapshotReader(_landing(tmp_path), {}, "mariadb", SCHEMA, condition="1=1; DROP TABLE x")


def test_the_condition_is_checked_once_where_it_enters(tmp_path: Path) -> None:
    """Text (the CLI's, a run's config) becomes a Condition in the reader; a Condition already
    checked (by the signal planner) is kept as it is."""
    reader = SnapshotReader(_landing(tmp_path), {}, "mariadb", SCHEMA, condition=" total > 0 ")
    assert isinstance(reader.condition, Condition) and reader.condition == "total > 0"
    checked = Condition("total > 0")
    again = SnapshotReader(_landing(tmp_path), {}, "mariadb", SCHEMA, condition=checked)
    assert again.condition is checked


def test_table_without_key_is_skipped_without_touching_the_landing_zone(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    mariadb.query(f"CREATE TABLE `{db}`.log (line VARCHAR(20))")
    result = _reader(mariadb, db, landing, "log").run()
    assert result.status is SnapshotStatus.SKIPPED
    assert result.status_text == \
        "skipped: no primary key and no surrogate key (set capture.surrogate_keys)"
    assert result.skipped and result.rows == 0
    assert not (landing.root / "snapshots").exists()


def test_a_source_that_cannot_be_snapshotted_exactly_fails_naming_the_setting(
        shop: tuple[Any, str, LandingZone]) -> None:
    """The replica's settings are checked before anything is requested."""
    mariadb, db, landing = shop
    mariadb.query("SET GLOBAL binlog_row_image = 'MINIMAL'")
    try:
        with pytest.raises(SnapshotError, match=rf"^snapshot of {db}\.items: source 'shop' "
                           r"cannot be snapshotted exactly: server variable binlog_row_image "
                           r"is 'MINIMAL', needs 'FULL'"):
            _reader(mariadb, db, landing).run()
    finally:
        mariadb.query("SET GLOBAL binlog_row_image = 'FULL'")
    assert not (landing.root / "snapshots").exists()


def test_a_table_dropped_during_the_snapshot_fails_the_run_saying_so(
        shop: tuple[Any, str, LandingZone]) -> None:
    mariadb, db, landing = shop
    reader = _reader(mariadb, db, landing, chunk_size=10)
    reader._table = ChunkedTable(reader.schema, ChunkKey(("id",), (False,), "primary key"))
    mariadb.query(f"DROP TABLE `{db}`.items")
    with pytest.raises(SnapshotError, match=r"the table no longer exists on the source"):
        reader.reload_schema()
