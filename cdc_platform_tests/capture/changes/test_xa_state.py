"""Prepared XA transactions across a restart (``xa_state``): what a checkpoint names comes
back from its spill files, files nothing names go, a named file that is missing stops the
start, and the start says what it restored in one line."""

from pathlib import Path

import pytest

from cdc_platform.capture.changes.row_images import TableState
from cdc_platform.capture.changes.spill import SpillStore
from cdc_platform.capture.changes.transactions import PreparedXa, RecordLog
from cdc_platform.capture.changes.xa_state import persist_prepared, restore_prepared
from cdc_platform.capture.events import EngineError
from cdc_platform.capture.schema import ColumnSpec, TableSchema

ITEMS = TableSchema("shop", "items", (ColumnSpec("id", "int"), ColumnSpec("name", "string")),
                    ("id",))


def _prepared(store: SpillStore) -> PreparedXa:
    state = TableState.of(ITEMS, ITEMS)
    log = RecordLog(0, lambda held: store.spill(held, 1000, "0-1-5"))
    log.extend([(state, "c", (1, "one")), (state, "c", (2, "two"))], 100)
    return PreparedXa("0-1-5", log)


def _rows(log: RecordLog) -> list[dict]:
    return [row for part in log for row in part.read().to_pylist()]


def test_a_restart_restores_what_the_checkpoint_names_and_removes_the_rest(
        tmp_path: Path) -> None:
    before = SpillStore(tmp_path / "spill")
    prepared = _prepared(before)
    state = persist_prepared({"x1": prepared})
    assert prepared.persisted and prepared.records.spilled
    stray = tmp_path / "spill" / "unfinished.arrow"
    stray.write_bytes(b"")

    restored, said = restore_prepared(state, SpillStore(tmp_path / "spill"), RecordLog)

    assert list(restored) == ["x1"] and restored["x1"].gtid == "0-1-5"
    assert restored["x1"].persisted
    assert _rows(restored["x1"].records) == [{"__cdc_op": "c", "id": 1, "name": "one"},
                                             {"__cdc_op": "c", "id": 2, "name": "two"}]
    assert not stray.exists()
    assert said == ("1 prepared XA transaction(s) wait for their XA COMMIT: x1 (prepared at "
                    "GTID 0-1-5); removed 1 spill file(s) of transactions read again from "
                    "the binlog")


def test_a_start_with_nothing_to_restore_says_nothing(tmp_path: Path) -> None:
    assert restore_prepared({}, SpillStore(tmp_path / "spill"), RecordLog) == ({}, "")


def test_a_named_file_that_is_missing_stops_the_start(tmp_path: Path) -> None:
    state = persist_prepared({"x1": _prepared(SpillStore(tmp_path / "spill"))})
    for path in (tmp_path / "spill").iterdir():
        path.unlink()
    with pytest.raises(EngineError, match=r"XA transaction x1 \(prepared at GTID 0-1-5\).*"
                                          "missing"):
        restore_prepared(state, SpillStore(tmp_path / "spill"), RecordLog)
