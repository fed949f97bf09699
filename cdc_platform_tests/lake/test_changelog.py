"""Reading one table's changelog: checkpoint, segment selection by name, merged schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cdc_platform.capture.landing.records import table_schema_of_segment
from cdc_platform.capture.landing.zone import LandingReader
from cdc_platform.capture.schema import ColumnSpec
from cdc_platform.lake.changelog import TableChangelog, read_checkpoint
from cdc_platform_tests.lake.helpers import SERVER, Landing, schema

S = schema("items")


def test_checkpoint_absent_present_and_invalid(tmp_path: Path):
    landing = Landing(tmp_path)
    assert read_checkpoint(landing.url, SERVER) is None
    landing.checkpoint(next_pos=42)
    checkpoint = read_checkpoint(f"file://{tmp_path}", SERVER)
    assert checkpoint is not None and checkpoint.next_pos == 42
    (tmp_path / SERVER / "checkpoint.json").write_text("{not json")
    with pytest.raises(ValueError, match="checkpoint .* is not valid"):
        read_checkpoint(landing.url, SERVER)


def test_segments_are_selected_by_their_position_range(tmp_path: Path):
    landing = Landing(tmp_path)
    landing.segment(S, [("c", {"id": 1}), ("c", {"id": 2})])  # 1-2
    landing.segment(S, [("c", {"id": 3}), ("c", {"id": 4})])  # 3-4
    landing.segment(S, [("c", {"id": 5})])  # 5-5
    directory = tmp_path / SERVER / "changelog" / "shop" / "items"
    (directory / ".00000000000000000006-00000000000000000007.parquet.tmp-1").write_bytes(b"x")
    (directory / "notes.txt").write_text("not a segment")

    def ranges(after, before):
        segments = TableChangelog.open(landing.url, SERVER, "shop", "items").segments(after,
                                                                                   before)
        return [(s.first_pos, s.last_pos) for s in segments]

    assert ranges(None, None) == [(1, 2), (3, 4), (5, 5)]
    assert ranges(2, 6) == [(3, 4), (5, 5)]
    assert ranges(3, 5) == [(3, 4)]
    assert ranges(5, 100) == []
    assert ranges(None, 1) == []
    assert TableChangelog.open(landing.url, SERVER, "shop", "nothing").segments(None, None) == []
    segment = TableChangelog.open(landing.url, SERVER, "shop", "items").segments(None, None)[0]
    metadata = pq.read_schema(segment.path, filesystem=segment.filesystem).metadata
    assert table_schema_of_segment(metadata) == S


def test_batch_filters_positions_and_conforms_older_segments_by_name(spark, tmp_path: Path):
    landing = Landing(tmp_path)
    landing.segment(S, [("c", {"id": 1, "name": "a"}), ("c", {"id": 2, "name": "b"})])
    # ALTER TABLE: amount dropped, email added (and columns reordered)
    newer = schema("items", ColumnSpec("email", "string"), ColumnSpec("id", "int"),
                   ColumnSpec("name", "string"))
    landing.segment(newer, [("u", {"id": 1, "name": "a", "email": "a@x"}),
                            ("d", {"id": 2}), ("c", {"id": 3, "name": "c", "email": "c@x"})])
    batch, newest = TableChangelog.open(landing.url, SERVER, "shop", "items").batch(spark, 1, 5)
    assert newest == newer
    assert batch is not None
    assert batch.columns == ["__cdc_pos", "__cdc_gtid", "__cdc_op", "__cdc_ts_ms", "email", "id",
                             "name"]
    rows = [(r["__cdc_pos"], r["__cdc_op"], r.id, r.name, r.email)
            for r in batch.orderBy("__cdc_pos").collect()]
    assert rows == [(2, "c", 2, "b", None), (3, "u", 1, "a", "a@x"), (4, "d", 2, None, None)]
    changelog = TableChangelog.open(landing.url, SERVER, "shop", "items")
    assert changelog.batch(spark, 5, 9) == (None, None)


def test_table_schemas_fallback(tmp_path: Path):
    assert LandingReader.open(str(tmp_path), SERVER).read_tables() == {}
    (tmp_path / SERVER).mkdir()
    (tmp_path / SERVER / "tables.json").write_text(
        json.dumps({"tables": {"shop.items": S.to_dict()}})
    )
    assert LandingReader.open(str(tmp_path), SERVER).read_tables() == {"shop.items": S}


def test_a_source_column_named_like_the_lakes_own_is_refused_by_name(spark, tmp_path: Path):
    landing = Landing(tmp_path)
    odd = schema("items", ColumnSpec("__CDC_note", "string"))
    landing.segment(odd, [("c", {"id": 1, "__CDC_note": "x"})])
    with pytest.raises(ValueError, match=r"shop.items: column\(s\) '__CDC_note' start with "
                                         r"'__cdc_'.*capture.excluded_columns"):
        TableChangelog.open(landing.url, SERVER, "shop", "items").batch(spark, None, 100)
