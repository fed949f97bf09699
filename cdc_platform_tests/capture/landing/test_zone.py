"""The checkpoint's own rules, read back from a landing zone as the engine reads it."""

from pathlib import Path

import pytest

from cdc_platform.capture.events import EngineError
from cdc_platform.capture.landing.records import segment_schema
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


@pytest.mark.parametrize("syncfs", [True, False], ids=["syncfs", "fsync-each"])
def test_a_flushs_segments_are_made_durable_together(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     syncfs: bool) -> None:
    """A flush's segments are written without an fsync each, then made durable together
    (one ``syncfs`` of the filesystem, or where there is none an fsync of each file and
    directory), before the checkpoint that covers them; they read back whole."""
    import pyarrow as pa

    from cdc_platform.capture.schema import ColumnSpec, TableSchema
    from cdc_platform.capture.store import storage

    synced: list[str] = []
    if not syncfs:
        monkeypatch.setattr(storage, "_libc_syncfs", lambda: None)
    real_fsync = storage._fsync_file
    monkeypatch.setattr(storage, "_fsync_file",
                        lambda path: (synced.append(path.name), real_fsync(path))[1])
    landing = LandingZone(str(tmp_path / "landing"), "s")
    written = []
    for name in ("a", "b", "c"):
        schema = TableSchema("db", name, (ColumnSpec("id", "int"),), ("id",))
        table = pa.Table.from_pydict({"__cdc_pos": [1], "__cdc_gtid": ["0-1-1"],
                                      "__cdc_op": ["c"], "__cdc_ts_ms": [1], "id": [1]},
                                     schema=segment_schema(schema))
        written.append(landing.write_segment(schema, table, 1, 1))
    assert synced == []  # (nothing synced file by file while writing)
    landing.sync_dirs(written)
    assert sorted(synced) == ([] if syncfs else sorted(p.name for p in written))
    assert all(landing.segment_names("db", n) == [(1, 1, written[i].name)]
               for i, n in enumerate(("a", "b", "c")))
