"""The schema tracker without a server: a rows event whose table map never came stops
capture naming the table and the transaction (the stream is inconsistent; a restart resumes
from the checkpoint), rather than decode rows against no schema."""

import pytest

from cdc_platform.capture.changes.schemas import SchemaTracker
from cdc_platform.capture.events import EngineError, Rows
from cdc_platform.capture.source import SourceSession


def test_rows_without_their_table_map_stop_capture_naming_table_and_gtid() -> None:
    tracker = SchemaTracker(SourceSession({}), {})
    with pytest.raises(EngineError, match=r"table shop.items at GTID 0-1-3: a rows event "
                                          "without its table map.*restart the engine"):
        tracker.state_of(Rows(7, "shop", "items", "insert", []), "0-1-3")
