"""Two materialisations of one table at once: compare-and-swap on main, no update lost.

A materialisation reads its mark from main's newest snapshot and publishes only if main is
still there: Spark's MERGE on a private branch made there, published with ``fast_forward``,
which Iceberg refuses if main moved meanwhile; a write without Spark through the catalog's
compare-and-swap on the table's version. The loser publishes nothing and runs again from
the new snapshot. Every snapshot main ever points
at must be exactly the fold of the changelog up to the mark it carries.
"""

from __future__ import annotations

import random
import threading
import time
from decimal import Decimal
from typing import Any

import pytest

from cdc_platform.lake import merge
from cdc_platform.lake.iceberg.commit import ConcurrentCommitError, commit_merge
from cdc_platform.lake.iceberg.hadoop import LocalHadoopCatalog
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.merge import COMMIT_ATTEMPTS
from cdc_platform_tests.lake.helpers import (
    Changelog,
    assert_every_published_snapshot_is_a_fold,
    materialise_table,
    random_changes,
    rows_of,
    schema,
    target_table,
)
from cdc_platform_tests.lake.third_party import assert_third_party_reads_same

S = schema("orders")


def r(id_: int, name: str) -> dict:
    return {"id": id_, "name": name, "amount": Decimal("1.00")}


def test_a_commit_landing_between_the_mark_and_the_publication_makes_the_loser_retry(
    spark, landing, warehouse, monkeypatch
):
    changelog = Changelog(landing)
    changelog.write([("c", r(1, "a")), ("c", r(2, "b"))])  # positions 1, 2
    first = materialise_table(spark, landing, warehouse, S)
    changelog.write([("u", r(1, "loser's batch")), ("c", r(3, "c"))])  # 3, 4
    table = target_table(spark, warehouse, S)
    real_commit = commit_merge
    calls: list[str] = []
    seen: dict[str, Any] = {}

    def another_writer_publishes_first(branch: str) -> None:
        # The loser has read its mark (2) and made its branch; data arrives, another
        # materialisation publishes positions 3..5, then more data arrives (6).
        changelog.write([("u", r(2, "winner"))])
        seen["winner"] = materialise_table(spark, landing, warehouse, S, spark_free=False)
        changelog.write([("u", r(1, "after"))])

    def racing_commit(target, base, merge_sql, properties, prepare=None):
        calls.append(properties["cdc.consumed-pos"])
        if len(calls) == 1:
            try:
                return real_commit(target, base, merge_sql, properties,
                                   another_writer_publishes_first)
            except ConcurrentCommitError:
                seen["after_loss"] = (table.current(), rows_of(table.read()))
                raise
        return real_commit(target, base, merge_sql, properties, prepare)

    monkeypatch.setattr(merge, "commit_merge", racing_commit)
    result = materialise_table(spark, landing, warehouse, S, spark_free=False)
    monkeypatch.undo()

    winner = seen["winner"]
    assert winner.committed and winner.consumed_pos == 5 and winner.attempts == 1
    assert calls == ["4", "5", "6"]  # loser (mark 4), winner (5), the loser's retry (6)
    # the loser published nothing: main stayed at the winner's snapshot, with its rows
    current, rows = seen["after_loss"]
    assert current.snapshot_id == winner.snapshot_id
    assert rows == changelog.fold(5) and rows[1]["name"] == "loser's batch"
    lost = [s for s in table.snapshots() if s.consumed_pos == 4]
    assert len(lost) == 1 and lost[0].snapshot_id not in {s.snapshot_id for s in
                                                          table.history()}
    # the retry ran from the winner's snapshot and converged
    assert result.committed and result.attempts == 2
    assert (result.consumed_pos, result.records_read) == (6, 1)
    assert result.snapshot.parent_id == winner.snapshot_id
    assert winner.snapshot.parent_id == first.snapshot_id
    assert rows_of(table.read()) == changelog.fold() == {
        1: r(1, "after"), 2: r(2, "winner"), 3: r(3, "c")}
    refs = {row.name for row in spark.sql(
        f"SELECT name FROM {table.metadata_table('refs')}").collect()}
    assert refs == {"main"}  # the private branches are gone
    assert_every_published_snapshot_is_a_fold(table, changelog)
    assert_third_party_reads_same(spark, table)


def test_a_commit_without_spark_that_loses_the_race_runs_again_from_the_winner(
    spark, landing, warehouse, monkeypatch
):
    """The row delta is written (data file, delete file, manifests) and its catalog commit
    finds main moved: the commit is refused (ConcurrentCommitError: pyiceberg's own retry
    would re-apply the rows on top), nothing of it is visible, and the materialisation runs
    again from the winner's snapshot."""
    changelog = Changelog(landing)
    changelog.write([("c", r(1, "a")), ("c", r(2, "b"))])  # positions 1, 2
    first = materialise_table(spark, landing, warehouse, S)
    changelog.write([("u", r(1, "loser's batch")), ("c", r(3, "c"))])  # 3, 4
    table = target_table(spark, warehouse, S)
    real_commit = LocalHadoopCatalog.commit_table
    seen: dict[str, Any] = {}

    def commit_table(self, table_, requirements, updates):
        if "winner" not in seen:  # another process publishes between the read and the commit
            changelog.write([("u", r(2, "winner"))])  # 5
            seen["winner"] = materialise_table(spark, landing, warehouse, S,
                                               spark_free=False)
            changelog.write([("u", r(1, "after"))])  # 6
            try:
                return real_commit(self, table_, requirements, updates)
            except ConcurrentCommitError:
                seen["after_loss"] = (table.current(), rows_of(table.read()))
                raise
        return real_commit(self, table_, requirements, updates)

    monkeypatch.setattr(LocalHadoopCatalog, "commit_table", commit_table)
    result = materialise_table(spark, landing, warehouse, S)
    monkeypatch.undo()

    winner = seen["winner"]
    assert winner.committed and winner.consumed_pos == 5
    current, rows = seen["after_loss"]
    assert current.snapshot_id == winner.snapshot_id
    assert rows == changelog.fold(5) and rows[1]["name"] == "loser's batch"
    assert result.committed and not result.spark and result.attempts == 2
    assert (result.consumed_pos, result.records_read) == (6, 1)
    assert result.snapshot.parent_id == winner.snapshot_id
    assert winner.snapshot.parent_id == first.snapshot_id
    assert rows_of(table.read()) == changelog.fold() == {
        1: r(1, "after"), 2: r(2, "winner"), 3: r(3, "c")}
    assert_every_published_snapshot_is_a_fold(table, changelog)
    assert_third_party_reads_same(spark, table)


def test_a_writer_that_loses_every_attempt_raises_and_publishes_nothing(
    spark, landing, warehouse, monkeypatch
):
    changelog = Changelog(landing)
    changelog.write([("c", r(1, "a"))])
    materialise_table(spark, landing, warehouse, S)
    changelog.write([("u", r(1, "loser"))])
    table = target_table(spark, warehouse, S)
    real_commit = commit_merge
    depth = threading.local()
    winners = []

    def racing_commit(target, base, merge_sql, properties, prepare=None):
        if getattr(depth, "inside", False):
            return real_commit(target, base, merge_sql, properties, prepare)

        def interfere(branch: str) -> None:
            depth.inside = True
            try:
                changelog.write([("c", r(10 + len(winners), "winner"))])
                winners.append(materialise_table(spark, landing, warehouse, S,
                                                 spark_free=False))
                changelog.write([("u", r(1, f"after winner {len(winners)}"))])
            finally:
                depth.inside = False

        return real_commit(target, base, merge_sql, properties, interfere)

    monkeypatch.setattr(merge, "commit_merge", racing_commit)
    with pytest.raises(ConcurrentCommitError, match="another materialisation committed"):
        materialise_table(spark, landing, warehouse, S, spark_free=False)
    monkeypatch.undo()
    assert len(winners) == COMMIT_ATTEMPTS
    assert table.current().snapshot_id == winners[-1].snapshot_id
    # main holds what the winners published, up to the last winner's mark
    assert rows_of(table.read()) == changelog.fold(winners[-1].consumed_pos)
    assert all(s.consumed_pos in {1, *(w.consumed_pos for w in winners)}
               for s in table.history() if s.consumed_pos is not None)
    again = materialise_table(spark, landing, warehouse, S)
    assert again.committed and again.attempts == 1 and again.records_read == 1
    assert rows_of(table.read()) == changelog.fold()
    assert_every_published_snapshot_is_a_fold(table, changelog)


@pytest.mark.parametrize("spark_free", [True, False], ids=["spark-free", "spark"])
def test_two_threads_materialising_one_table_while_data_arrives_lose_no_update(
    spark, landing, warehouse, spark_free
):
    rng = random.Random(14)
    changelog = Changelog(landing)
    live: set[int] = set()
    changelog.write(random_changes(rng, live, 0))
    materialise_table(spark, landing, warehouse, S)
    writing = threading.Event()
    writing.set()
    outcomes: list[Any] = []
    lock = threading.Lock()

    def writer() -> None:
        try:
            for batch in range(1, 16):
                changelog.write(random_changes(rng, live, batch))
                time.sleep(1.0)
        finally:
            writing.clear()

    def materialiser() -> None:
        while writing.is_set():
            try:
                outcome: Any = materialise_table(spark, landing, warehouse, S,
                                                 spark_free=spark_free)
            except ConcurrentCommitError as error:
                outcome = error
            except BaseException as error:  # noqa: BLE001 - reported by the assertion below
                outcome = error
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=writer),
               threading.Thread(target=materialiser), threading.Thread(target=materialiser)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not any(thread.is_alive() for thread in threads)
    unexpected = [o for o in outcomes if isinstance(o, BaseException)
                  and not isinstance(o, ConcurrentCommitError)]
    assert not unexpected, unexpected
    final = materialise_table(spark, landing, warehouse, S)
    table = target_table(spark, warehouse, S)
    assert rows_of(table.read()) == changelog.fold()
    assert final.rows == len(changelog.fold())
    assert_every_published_snapshot_is_a_fold(table, changelog)
    assert_third_party_reads_same(spark, table)
    retried = sum(1 for o in outcomes if not isinstance(o, BaseException) and o.attempts > 1)
    print(f"{len(outcomes)} materialisations, {retried} retried after losing the race, "
          f"{sum(isinstance(o, ConcurrentCommitError) for o in outcomes)} gave up")


def test_the_result_reports_the_snapshot_this_run_published(spark, landing, warehouse,
                                                            monkeypatch):
    """Another process may commit right after this run's fast_forward: the result still names
    this run's snapshot (its mark, its rows), not whatever main holds by then."""
    changelog = Changelog(landing)
    changelog.write([("c", r(1, "a"))])
    materialise_table(spark, landing, warehouse, S)
    changelog.write([("c", r(2, "b"))])  # position 2: this run's batch
    real_sql = Lake.sql
    later: list[Any] = []

    def sql(self, statement):
        result = real_sql(self, statement)
        if "fast_forward" in statement and not later:
            later.append(None)
            result = result.collect()
            changelog.write([("c", r(3, "c")), ("c", r(4, "d"))])  # 3, 4
            later[0] = materialise_table(spark, landing, warehouse, S)
            return spark.createDataFrame(result) if result else spark.range(0)
        return result

    monkeypatch.setattr(Lake, "sql", sql)
    result = materialise_table(spark, landing, warehouse, S, spark_free=False)
    monkeypatch.undo()
    assert later[0].committed and later[0].consumed_pos == 4
    assert result.consumed_pos == result.snapshot.consumed_pos == 2
    assert result.rows == 2 and result.snapshot.snapshot_id == later[0].snapshot.parent_id
    assert target_table(spark, warehouse, S).current().snapshot_id == later[0].snapshot_id
