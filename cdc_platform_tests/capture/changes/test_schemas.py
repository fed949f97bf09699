"""The schema tracker without a server: a rows event whose table map never came stops
capture naming the table and the transaction (the stream is inconsistent; a restart resumes
from the checkpoint), rather than decode rows against no schema; recorded tables the filters
no longer capture are forgotten, with a line saying they will be snapshotted if captured
again."""

import logging

import pytest

from cdc_platform.capture.changes.schemas import SchemaTracker
from cdc_platform.capture.events import EngineError, Rows
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.source import SourceSession, TableSelector


def test_rows_without_their_table_map_stop_capture_naming_table_and_gtid() -> None:
    tracker = SchemaTracker(SourceSession({}), {})
    with pytest.raises(EngineError, match=r"table shop.items at GTID 0-1-3: a rows event "
                                          "without its table map.*restart the engine"):
        tracker.state_of(Rows(7, "shop", "items", "insert", []), "0-1-3")


def test_tables_the_filters_no_longer_capture_are_forgotten_and_said(
        caplog: pytest.LogCaptureFixture) -> None:
    def table(name: str) -> TableSchema:
        return TableSchema("shop", name, (ColumnSpec("id", "int"),), ("id",))

    schemas = {"shop.items": table("items"), "shop.old": table("old")}
    tracker = SchemaTracker(SourceSession({}, TableSelector(exclude=(r"shop\.old",))), schemas)
    with caplog.at_level(logging.INFO):
        assert tracker.forget_uncaptured() == ["shop.old"]
    assert set(tracker.take_changed() or {}) == {"shop.items"}
    assert "1 recorded table(s) no longer captured (capture.tables): shop.old; captured " \
           "again later, each is snapshotted" in caplog.text
    caplog.clear()
    assert tracker.forget_uncaptured() == [] and tracker.take_changed() is None
    assert caplog.text == ""
