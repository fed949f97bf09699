"""Prepared XA transactions across engine restarts: how the checkpoint names them.

An XA PREPARE's GTID is complete when the engine processes it, but its rows become visible
only at a later XA COMMIT, in another binlog group. Once a checkpoint contains the prepare's
GTID, the binlog will not send those rows again: so every flush persists the records of every
prepared, not yet committed, transaction to spill files, and the checkpoint names them
(``XA_CHECKPOINT_KEY``: xid -> the prepare's GTID and its files). A start restores them from
those files, and removes the spill files nothing names (they belong to transactions the
engine reads again from the binlog).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cdc_platform.capture.changes.spill import SpillStore
from cdc_platform.capture.changes.transactions import PreparedXa, RecordLog
from cdc_platform.capture.events import EngineError

# The checkpoint's ``extra`` key of the XA transactions prepared and not yet committed.
XA_CHECKPOINT_KEY = "xa_prepared"


def persist_prepared(prepared: Mapping[str, PreparedXa]) -> dict[str, Any]:
    """Prepared XA transactions as the checkpoint names them: every record in a spill file
    (written now for those prepared since the last flush)."""
    state = {}
    for xid, transaction in prepared.items():
        transaction.records.spill()
        transaction.persisted = True
        state[xid] = {"gtid": transaction.gtid,
                      "parts": [part.to_dict() for part in transaction.records]}
    return state


def restore_prepared(state: Mapping[str, Any], spill: SpillStore,
                     new_log: Callable[[], RecordLog]) -> tuple[dict[str, PreparedXa], str]:
    """The XA transactions a checkpoint names, from their files (the spill files nothing
    names are removed), and what the start did, in words for its log ("": nothing).
    EngineError when a named file is missing: the transaction's rows could not land at its XA
    COMMIT."""
    restored: dict[str, PreparedXa] = {}
    keep = set()
    for xid, entry in state.items():
        missing = [data["file"] for data in entry["parts"]
                   if not (spill.directory / data["file"]).is_file()]
        if missing:
            raise EngineError(
                f"XA transaction {xid} (prepared at GTID {entry['gtid']}): the checkpoint "
                f"names spill file(s) {', '.join(missing)} that are missing from "
                f"{spill.directory}, so its rows cannot land at its XA COMMIT. "
                "Re-snapshot the tables it wrote, and move the checkpoint away (the engine "
                "then starts from capture.initial_position)")
        parts = [spill.part_from_dict(data) for data in entry["parts"]]
        keep.update(part.path for part in parts)
        log = new_log()
        log.restore(parts)
        restored[xid] = PreparedXa(entry["gtid"], log, persisted=True)
    return restored, _described(state, spill.remove_unreferenced(keep))


def _described(state: Mapping[str, Any], removed: list[Path]) -> str:
    """A restore in one line: the transactions waiting, the files of unfinished ones gone."""
    said = []
    if state:
        said.append(f"{len(state)} prepared XA transaction(s) wait for their XA COMMIT: "
                    + ", ".join(f"{xid} (prepared at GTID {entry['gtid']})"
                                for xid, entry in state.items()))
    if removed:
        said.append(f"removed {len(removed)} spill file(s) of transactions read again from "
                    "the binlog")
    return "; ".join(said)
