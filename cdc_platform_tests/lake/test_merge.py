"""Materialisation: folding by position, idempotence, crashes, races, schema evolution."""

from __future__ import annotations

import json
import os
import random
import re
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import DecimalType, LongType, StringType

from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.lake.merge import MergeResult, materialise
from cdc_platform.lake.table_format import ConcurrentCommitError, TargetTable
from cdc_platform_tests.lake.helpers import (
    SERVER,
    Landing,
    materialise_table,
    rows_of,
    schema,
    target_table,
)

S = schema("orders")


def run(spark: SparkSession, landing: Landing, warehouse: str, table_schema: TableSchema = S,
        **kwargs: Any) -> MergeResult:
    return materialise_table(spark, landing, warehouse, table_schema, **kwargs)


def target(warehouse: str, table_schema: TableSchema = S) -> TargetTable:
    return target_table(warehouse, table_schema)


def state(spark: SparkSession, warehouse: str, table_schema: TableSchema = S) -> dict:
    return rows_of(target(warehouse, table_schema).read(spark))


def r(id_: int, name: str | None = None, amount: str | None = None) -> dict:
    return {"id": id_, "name": name, "amount": None if amount is None else Decimal(amount)}


def test_batches_of_inserts_updates_deletes_fold_to_the_source_state(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "a", "1.00")), ("c", r(2, "b", "2.00")),
                        ("c", r(3, "c", "3.00"))])
    first = run(spark, landing, warehouse)
    assert (first.version, first.rows, first.inserts, first.records_read) == (1, 3, 3, 3)
    landing.segment(S, [("u", r(1, "a2", "1.50")), ("d", {"id": 2}), ("c", r(4, "d", "4.00"))])
    second = run(spark, landing, warehouse, compaction_ratio=10)
    assert (second.version, second.rows) == (2, 3)
    assert (second.inserts, second.updates, second.deletes) == (1, 1, 1)
    assert not second.compacted
    landing.segment(S, [("d", {"id": 3}), ("u", r(4, "d2", "4.40"))])
    landing.segment(S, [("c", r(5, "e", "5.00"))])
    third = run(spark, landing, warehouse, compaction_ratio=10)
    assert (third.version, third.rows, third.records_read) == (3, 3, 3)
    assert state(spark, warehouse) == {
        1: r(1, "a2", "1.50"), 4: r(4, "d2", "4.40"), 5: r(5, "e", "5.00"),
    }
    assert third.consumed_pos == landing.next_pos - 1
    assert third.consumed_gtid == f"0-1-{landing.txn}"
    commit = target(warehouse).current()
    assert commit is not None and commit.version == 3 and commit.rows == 3
    assert [f.kind for f in commit.files] == ["base", "delta", "delta"]


def test_nothing_new_returns_the_current_version_without_a_commit(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "a", "1.00"))])
    first = run(spark, landing, warehouse)
    landing.checkpoint()  # the checkpoint moves on (other tables), this table has nothing new
    again = run(spark, landing, warehouse)
    assert (again.version, again.rows, again.records_read) == (first.version, 1, 0)
    assert again.consumed_pos == first.consumed_pos
    assert target(warehouse).versions() == [1]


def test_a_key_updated_several_times_in_one_batch_keeps_the_highest_position(
    spark, landing, warehouse
):
    # Rows deliberately out of position order inside the file: position decides, not file order.
    landing.segment(S, [("u", r(1, "third", "3.00"), 3), ("c", r(1, "first", "1.00"), 1),
                        ("u", r(1, "second", "2.00"), 2), ("c", r(2, "x", "0.00"), 4)])
    landing.segment(S, [("u", r(2, "y", "0.10")), ("u", r(2, "z", "0.20"))])
    result = run(spark, landing, warehouse)
    assert state(spark, warehouse) == {1: r(1, "third", "3.00"), 2: r(2, "z", "0.20")}
    # Both keys were created inside the batch: their effect on the target is an insert each.
    assert (result.rows, result.records_read, result.updates, result.inserts) == (2, 6, 0, 2)


def test_delete_then_reinsert(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "a", "1.00")), ("c", r(2, "b", "2.00"))])
    run(spark, landing, warehouse)
    # within one batch
    landing.segment(S, [("d", {"id": 1}), ("c", r(1, "a-again", "1.10"))])
    result = run(spark, landing, warehouse, compaction_ratio=10)
    # Key 1 existed before the batch and exists after it: an update of the target.
    assert (result.rows, result.updates, result.inserts, result.deletes) == (2, 1, 0, 0)
    # across batches
    landing.segment(S, [("d", {"id": 2})])
    assert run(spark, landing, warehouse, compaction_ratio=10).rows == 1
    assert state(spark, warehouse) == {1: r(1, "a-again", "1.10")}
    landing.segment(S, [("c", r(2, "b-again", "2.20"))])
    assert run(spark, landing, warehouse, compaction_ratio=10).rows == 2
    assert state(spark, warehouse) == {1: r(1, "a-again", "1.10"), 2: r(2, "b-again", "2.20")}


def test_replayed_records_have_no_duplicate_effect(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "a", "1.00"), 1), ("u", r(1, "b", "2.00"), 2)])
    # at-least-once: the engine replays positions 1..2 in another segment of the same batch
    landing.segment(S, [("c", r(1, "a", "1.00"), 1), ("u", r(1, "b", "2.00"), 2),
                        ("c", r(2, "x", "9.00"), 3)])
    first = run(spark, landing, warehouse)
    assert (first.rows, first.records_read) == (2, 5)
    landing.segment(S, [("u", r(1, "c", "3.00"), 4)])
    run(spark, landing, warehouse, compaction_ratio=10)
    # a replay of already consumed positions in a later segment: ignored by position
    landing.segment(S, [("u", r(1, "b", "2.00"), 2), ("d", {"id": 2}, 3),
                        ("c", r(3, "new", "0.00"), 5)])
    result = run(spark, landing, warehouse, compaction_ratio=10)
    assert (result.records_read, result.rows) == (1, 3)
    assert state(spark, warehouse) == {
        1: r(1, "c", "3.00"), 2: r(2, "x", "9.00"), 3: r(3, "new", "0.00"),
    }


def test_records_at_or_after_the_checkpoint_are_ignored(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "a", "1.00")), ("c", r(2, "b", "2.00"))])  # pos 1, 2
    # a segment straddling the checkpoint, and one entirely after it (crash left-over)
    landing.segment(S, [("u", r(1, "a2", "1.10")), ("u", r(2, "b2", "2.20"))], checkpoint=False)
    landing.segment(S, [("c", r(9, "ghost", "9.99"))], checkpoint=False)
    landing.checkpoint(next_pos=4)
    result = run(spark, landing, warehouse)
    assert (result.records_read, result.consumed_pos) == (3, 3)
    assert state(spark, warehouse) == {1: r(1, "a2", "1.10"), 2: r(2, "b", "2.00")}
    landing.checkpoint()
    result = run(spark, landing, warehouse, compaction_ratio=10)
    assert (result.records_read, result.rows) == (2, 3)
    assert state(spark, warehouse)[2] == r(2, "b2", "2.20")


def test_a_crash_before_the_commit_leaves_the_previous_version(
    spark, landing, warehouse, monkeypatch
):
    landing.segment(S, [("c", r(1, "a", "1.00"))])
    run(spark, landing, warehouse)
    landing.segment(S, [("u", r(1, "b", "2.00")), ("c", r(2, "c", "3.00"))])

    def crash(*args, **kwargs):
        raise SystemExit("killed between the data write and the commit")

    monkeypatch.setattr(TargetTable, "commit", crash)
    with pytest.raises(SystemExit):
        run(spark, landing, warehouse, compaction_ratio=10)
    monkeypatch.undo()
    table = target(warehouse)
    assert table.versions() == [1]
    assert len(list((Path(warehouse) / SERVER / "shop" / "orders" / "data").iterdir())) == 2
    assert state(spark, warehouse) == {1: r(1, "a", "1.00")}
    result = run(spark, landing, warehouse, compaction_ratio=10)
    assert (result.version, result.rows, result.records_read) == (2, 2, 2)
    assert state(spark, warehouse) == {1: r(1, "b", "2.00"), 2: r(2, "c", "3.00")}


def test_the_second_of_two_writers_racing_for_a_version_fails(
    spark, landing, warehouse, monkeypatch
):
    landing.segment(S, [("c", r(1, "a", "1.00"))])
    run(spark, landing, warehouse)
    table = target(warehouse)
    stale = table.current()
    assert stale is not None
    with pytest.raises(ConcurrentCommitError, match="shop.orders"):
        table.commit(1, [], None, None, S)

    landing.segment(S, [("u", r(1, "winner", "2.00"))])
    winner = run(spark, landing, warehouse, compaction_ratio=10)
    assert winner.version == 2
    # the loser prepared its data from version 1, like a writer that started at the same time
    monkeypatch.setattr(TargetTable, "current", lambda self: stale)
    with pytest.raises(ConcurrentCommitError, match="version 2 of shop.orders"):
        run(spark, landing, warehouse, compaction_ratio=10)
    monkeypatch.undo()
    assert table.versions() == [1, 2]
    data_dirs = list((Path(warehouse) / SERVER / "shop" / "orders" / "data").iterdir())
    assert len(data_dirs) == 2  # the loser's data was discarded
    assert state(spark, warehouse) == {1: r(1, "winner", "2.00")}


def test_add_column_mid_stream_and_drop_column(spark, landing, warehouse):
    v1 = schema("orders")
    landing.segment(v1, [("c", r(1, "a", "1.00")), ("c", r(2, "b", "2.00")),
                         ("c", r(3, "c", "3.00"))])
    run(spark, landing, warehouse)
    v2 = schema("orders", *v1.columns, ColumnSpec("email", "string"))
    # ALTER TABLE ... ADD COLUMN email inside a batch: old-schema records, then new-schema ones
    landing.segment(v1, [("u", r(3, "c2", "3.30"))])
    landing.segment(v2, [("u", {**r(2, "b", "2.00"), "email": "b@x"}),
                         ("c", {**r(4, "d", "4.00"), "email": "d@x"})])
    result = run(spark, landing, warehouse, compaction_ratio=10)
    assert result.schema_changed and result.rows == 4
    df = target(warehouse).read(spark)
    assert df.columns == ["id", "name", "amount", "email"]
    assert df.schema["email"].dataType == StringType()
    assert {k: v["email"] for k, v in rows_of(df).items()} == {
        1: None, 2: "b@x", 3: None, 4: "d@x",
    }
    assert rows_of(df)[3]["name"] == "c2"
    # DROP COLUMN name: it disappears from the target; compaction keeps the same state
    v3 = schema("orders", v2.columns[0], v2.columns[2], v2.columns[3])
    landing.segment(v3, [("u", {"id": 1, "amount": Decimal("1.11"), "email": "a@x"})])
    result = run(spark, landing, warehouse, compaction_ratio=0)
    assert result.schema_changed and result.compacted
    df = target(warehouse).read(spark)
    assert df.columns == ["id", "amount", "email"]
    assert [(row.id, row.amount, row.email) for row in df.orderBy("id").collect()] == [
        (1, Decimal("1.11"), "a@x"), (2, Decimal("2.00"), "b@x"), (3, Decimal("3.30"), None),
        (4, Decimal("4.00"), "d@x"),
    ]


def test_compaction_gives_the_same_state_as_deltas(spark, tmp_path):
    rng = random.Random(7)
    never, always = tmp_path / "never", tmp_path / "always"
    landing = Landing(tmp_path / "landing")
    live: dict[int, dict] = {}
    for batch in range(6):
        changes = []
        for _ in range(40):
            key = rng.randrange(60)
            if key in live and rng.random() < 0.3:
                changes.append(("d", {"id": key}))
                live.pop(key)
            else:
                row = r(key, f"n{batch}-{rng.randrange(1000)}", f"{rng.randrange(10000) / 100:.2f}")
                changes.append(("u" if key in live else "c", row))
                live[key] = row
        landing.segment(S, changes)
        lazy = run(spark, landing, str(never), compaction_ratio=1e9, max_deltas=100)
        eager = run(spark, landing, str(always), compaction_ratio=0.0)
        assert batch == 0 or (eager.compacted and not lazy.compacted)
        assert lazy.rows == eager.rows == len(live)
        assert state(spark, str(never)) == state(spark, str(always)) == live
    assert len(target(str(never)).current().deltas) == 5
    compacted = target(str(always)).current()
    assert [f.kind for f in compacted.files] == ["base"]


def test_compaction_by_number_of_deltas(spark, landing, warehouse):
    landing.segment(S, [("c", r(i, "x", "1.00")) for i in range(100)])
    run(spark, landing, warehouse)
    kinds = []
    for i in range(4):
        landing.segment(S, [("u", r(i, "y", "2.00"))])
        result = run(spark, landing, warehouse, max_deltas=2)
        kinds.append(result.compacted)
        assert result.rows == 100
    assert kinds == [False, False, True, False]
    assert [f.kind for f in target(warehouse).current().files] == ["base", "delta"]
    assert sum(1 for row in state(spark, warehouse).values() if row["name"] == "y") == 4


def test_row_count_matches_the_folded_state_over_random_batches(spark, tmp_path):
    for seed in (1, 2):
        rng = random.Random(seed)
        landing = Landing(tmp_path / f"landing{seed}")
        warehouse = str(tmp_path / f"warehouse{seed}")
        live: dict[int, dict] = {}
        for _ in range(5):
            changes = []
            for _ in range(rng.randrange(1, 30)):
                key = rng.randrange(25)
                op = rng.choice("cud")
                if op == "d":
                    changes.append(("d", {"id": key}))
                    live.pop(key, None)
                else:
                    live[key] = r(key, op, "0.00")
                    changes.append((op, live[key]))
            landing.segment(S, changes)
            result = run(spark, landing, warehouse, compaction_ratio=0.5, max_deltas=3)
            assert result.rows == len(live)
        assert state(spark, warehouse) == live


def test_an_empty_table_materialises_to_an_empty_target_with_its_columns(spark, landing,
                                                                          warehouse):
    # no checkpoint at all yet: the target still exists, from the schema hint
    result = run(spark, landing, warehouse)
    assert (result.version, result.rows, result.consumed_pos) == (1, 0, None)
    df = target(warehouse).read(spark)
    assert df.columns == ["id", "name", "amount"]
    assert [f.dataType for f in df.schema.fields] == [LongType(), StringType(), DecimalType(10, 2)]
    assert df.count() == 0
    # the engine runs, other tables change, this one does not: still nothing to commit
    other = schema("other")
    landing.segment(other, [("c", r(1, "a", "1.00"))])
    assert run(spark, landing, warehouse).version == 1
    # then the table's first records arrive
    landing.segment(S, [("c", r(1, "a", "1.00"))])
    result = run(spark, landing, warehouse)
    assert (result.version, result.rows) == (2, 1)
    assert state(spark, warehouse) == {1: r(1, "a", "1.00")}


def test_empty_table_with_a_checkpoint_but_no_segments(spark, landing, warehouse):
    landing.checkpoint()
    result = run(spark, landing, warehouse)
    assert (result.version, result.rows) == (1, 0)
    assert target(warehouse).current().consumed_gtid == "0-1-0"


def test_without_schema_hint_or_changelog_the_error_says_what_to_do(spark, landing, warehouse):
    with pytest.raises(LookupError, match="shop.orders .*schema_hint"):
        materialise(spark, landing.url, warehouse, SERVER, None, "shop", "orders")


def test_old_data_is_garbage_collected_but_the_previous_version_stays_readable(
    spark, landing, warehouse
):
    landing.segment(S, [("c", r(1, "v1", "1.00"))])
    run(spark, landing, warehouse)
    for version in range(2, 7):
        landing.segment(S, [("u", r(1, f"v{version}", "1.00"))])
        run(spark, landing, warehouse, compaction_ratio=0)  # every version is a new base
    table = target(warehouse)
    data = Path(warehouse) / SERVER / "shop" / "orders" / "data"
    assert sorted(p.name.split("-")[0] for p in data.iterdir()) == ["4", "5", "6"]
    assert rows_of(table.read(spark, version=5))[1]["name"] == "v5"
    assert rows_of(table.read(spark))[1]["name"] == "v6"


def test_primary_key_change_is_refused(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "a", "1.00"))])
    run(spark, landing, warehouse)
    rekeyed = schema("orders", *S.columns, key=("name",))
    landing.segment(rekeyed, [("c", r(2, "b", "1.00"))])
    with pytest.raises(ValueError, match="primary key of shop.orders changed"):
        run(spark, landing, warehouse)


def test_unknown_op_is_refused(spark, landing, warehouse):
    landing.segment(S, [("x", r(1, "a", "1.00"))])
    with pytest.raises(ValueError, match="shop.orders .*__cdc_op"):
        run(spark, landing, warehouse)
    assert target(warehouse).versions() == []


def test_a_reset_landing_zone_is_detected(spark, landing, warehouse, tmp_path):
    landing.segment(S, [("c", r(1, "a", "1.00")), ("c", r(2, "b", "1.00"))])
    run(spark, landing, warehouse)
    fresh = Landing(tmp_path / "fresh")
    fresh.checkpoint()
    with pytest.raises(RuntimeError, match="landing zone was reset"):
        materialise(spark, fresh.url, warehouse, SERVER, S, "shop", "orders")


def test_commit_files_follow_the_contract(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "a", "1.00")), ("c", r(2, "b", "2.00"))])
    run(spark, landing, warehouse)
    landing.segment(S, [("d", {"id": 1})])
    run(spark, landing, warehouse, compaction_ratio=10)
    root = Path(warehouse) / SERVER / "shop" / "orders"
    assert sorted(p.name for p in (root / "_commits").iterdir()) == [
        "00000000000000000001.json", "00000000000000000002.json",
    ]
    data = json.loads((root / "_commits" / "00000000000000000002.json").read_text())
    assert data["version"] == 2
    assert [(f["kind"], f["rows"]) for f in data["files"]] == [("base", 2), ("delta", 1)]
    for entry in data["files"]:
        assert re.fullmatch(r"data/\d+-(base|delta)-[0-9a-f]{32}", entry["path"])
        assert list((root / entry["path"]).glob("part-*.parquet"))
    assert data["consumed"] == {"pos": 3, "gtid": "0-1-3"}
    assert data["schema"] == S.to_dict()
    assert data["stats"]["rows"] == 1 and data["stats"]["deletes"] == 1
    assert data["committed_at"].endswith("+00:00")


def test_reading_a_table_that_was_never_materialised_says_so(spark, warehouse):
    with pytest.raises(LookupError, match="shop.orders .*materialise it first"):
        target(warehouse).read(spark)
    assert target(warehouse).current() is None


def test_temporary_commit_files_of_dead_writers_are_removed(spark, landing, warehouse):
    landing.segment(S, [("c", r(1, "a", "1.00"))])
    run(spark, landing, warehouse)
    commits = Path(warehouse) / SERVER / "shop" / "orders" / "_commits"
    stale = commits / ".00000000000000000002.json.tmp-dead"
    fresh = commits / ".00000000000000000002.json.tmp-alive"
    stale.write_text("{")
    fresh.write_text("{")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert target(warehouse).versions() == [1]
    assert target(warehouse).collect_garbage() == ["_commits/" + stale.name]
    assert fresh.exists() and not stale.exists()


def test_composite_key_and_awkward_column_names(spark, landing, warehouse):
    odd = TableSchema("shop", "odd", (
        ColumnSpec("tenant", "string"), ColumnSpec("id", "int"), ColumnSpec("a.b c`d", "double"),
    ), ("tenant", "id"))
    landing.segment(odd, [("c", {"tenant": "x", "id": 1, "a.b c`d": 1.0}),
                          ("c", {"tenant": "y", "id": 1, "a.b c`d": 2.0})])
    run(spark, landing, warehouse, odd)
    landing.segment(odd, [("u", {"tenant": "x", "id": 1, "a.b c`d": 1.5}),
                          ("d", {"tenant": "y", "id": 1}),
                          ("c", {"tenant": "y", "id": 2, "a.b c`d": 3.0})])
    result = run(spark, landing, warehouse, odd, compaction_ratio=10)
    assert not result.compacted and result.rows == 2
    rows = sorted(tuple(row) for row in target(warehouse, odd).read(spark).collect())
    assert rows == [("x", 1, 1.5), ("y", 2, 3.0)]
    landing.segment(odd, [("d", {"tenant": "x", "id": 1})])
    assert run(spark, landing, warehouse, odd, compaction_ratio=0).rows == 1
    assert [tuple(row) for row in target(warehouse, odd).read(spark).collect()] == [("y", 2, 3.0)]
