"""The deferred chunk commit rule on random histories, for both GTID flavours.

A model source (a table of a few keys and a history of committed transactions), a model engine
(processes the history in binlog order, keeps the touched-key log, applies the rule to chunks
that arrive at random points, late ones included) and a model lake (folds records, chunk rows
range assertions and the end-of-snapshot sweep by position). The engine's touched-key log is
the real ``TouchedKeyLog``, pruned at random points, one generation or two at a time.
Properties: whenever the engine has committed a chunk, every key of the committed ranges has its
true value at the engine's point, and at the end the target equals the source. Deliberately
broken rules are caught by the same properties.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, Phase, event, find, given, settings
from hypothesis import strategies as st

from cdc_platform.capture.gtid import (
    Gtid,
    GtidSet,
    MariadbGtid,
    MariadbPosition,
    MysqlGtid,
    MysqlGtidSet,
)
from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.snapshot.chunks import Chunk, ChunkedTable, ChunkKey, Key
from cdc_platform.capture.snapshot.commit_rule import (
    ALL_KEYS,
    TABLE_WIDE_TOUCHES,
    Commit,
    Decision,
    RangeAssertion,
    Reject,
    SnapshotSweep,
    Touch,
    TouchedKeyLog,
    Wait,
    decide_chunk_commit,
    sweep_after_snapshot,
)
from cdc_platform.capture.snapshot.conditions import Condition

UUIDS = ("3e11fa47-71ca-11e1-9e33-c80aa9429562", "4b11fa47-71ca-11e1-9e33-c80aa9429563",
         "00000000-0000-0000-0000-000000000001")
FINGERPRINT = "schema-v1"


def _table(range_assertions: bool) -> ChunkedTable:
    # Text keys make the reader withhold range assertions (the lake cannot order them like
    # the source); the values stay ints, only the declared kind matters to the rule.
    kind = "int" if range_assertions else "string"
    schema = TableSchema("db", "t", (ColumnSpec("k", kind), ColumnSpec("v", "int")), ("k",))
    return ChunkedTable(schema, ChunkKey(("k",), (False,), "primary key"))


# ---- the model source --------------------------------------------------------------------------


@dataclass(frozen=True)
class Txn:
    gtid: Gtid
    writes: tuple[tuple[int, int | None], ...]  # (key, value) or (key, None) for a delete
    truncate: bool = False

    def keys(self) -> set[int]:
        return {k for k, _ in self.writes}


@dataclass(frozen=True)
class Scenario:
    flavour: str
    n_keys: int
    initial: dict[int, int]  # the source before the history
    garbage: dict[int, int]  # the target before the engine ran (stale rows, orphans)
    txns: tuple[Txn, ...]
    opening: int  # the session opens after the engine processed txns[:opening]
    ranges: tuple[tuple[Key | None, Key | None], ...]  # chunk ranges tiling the key space
    range_assertions: bool
    seed: int  # chunk timings: when chunks are read, arrive, are re-read

    def state_after(self, indexes: list[int]) -> dict[int, int]:
        """The table after applying the given transactions (1-based) in binlog order."""
        state = dict(self.initial)
        for i in sorted(indexes):
            txn = self.txns[i - 1]
            if txn.truncate:
                state.clear()
            for key, value in txn.writes:
                if value is None:
                    state.pop(key, None)
                else:
                    state[key] = value
        return state


def _conflict(a: Txn, b: Txn) -> bool:
    return a.truncate or b.truncate or bool(a.keys() & b.keys())


@st.composite
def scenarios(draw: st.DrawFn, flavour: str | None = None) -> Scenario:
    flavour = flavour or draw(st.sampled_from(["mysql", "mariadb"]))
    n_keys = draw(st.integers(1, 6))
    keys = st.integers(0, n_keys - 1)
    values = iter(range(100, 10_000))
    initial = {k: next(values) for k in draw(st.sets(keys))}
    garbage = {k: -1 - k for k in draw(st.sets(keys))}
    n_txns = draw(st.integers(0, 14))
    opening = draw(st.integers(0, n_txns))
    gtids = _draw_gtids(draw, flavour, n_txns)
    txns = []
    for i in range(n_txns):
        # TRUNCATE has no row events; the engine cannot stream it, a snapshot repairs it. Only
        # before the session opens: during one it would need a new session (engine policy).
        if i < opening and draw(st.integers(0, 9)) == 0:
            txns.append(Txn(gtids[i], (), truncate=True))
            continue
        writes = draw(st.lists(st.tuples(keys, st.booleans()), min_size=1, max_size=3))
        txns.append(Txn(gtids[i], tuple((k, None if delete else next(values))
                                        for k, delete in writes)))
    chunk_size = draw(st.integers(1, n_keys + 1))
    bounds = list(range(chunk_size - 1, n_keys - 1, chunk_size))
    ranges = []
    low: Key | None = None
    for high in bounds:
        ranges.append((low, (high,)))
        low = (high,)
    ranges.append((low, None))
    return Scenario(flavour, n_keys, initial, garbage, tuple(txns), opening, tuple(ranges),
                    draw(st.integers(0, 3)) > 0, draw(st.integers(0, 2**32)))


def _draw_gtids(draw: st.DrawFn, flavour: str, n: int) -> list[Gtid]:
    gap = st.integers(0, 2)
    if flavour == "mariadb":
        domains = draw(st.lists(st.sampled_from([0, 1, 7]), min_size=1, max_size=2, unique=True))
        seq = dict.fromkeys(domains, 0)
        out: list[Gtid] = []
        for _ in range(n):
            domain = draw(st.sampled_from(domains))
            seq[domain] += 1 + draw(gap)  # gtid_strict_mode: increasing per domain
            out.append(MariadbGtid(domain, draw(st.sampled_from([1, 2])), seq[domain]))
        return out
    sids = draw(st.lists(st.tuples(st.sampled_from(UUIDS), st.sampled_from(["", "tag_a"])),
                         min_size=1, max_size=3, unique=True))
    chosen = [draw(st.sampled_from(sids)) for _ in range(n)]
    gnos: dict[tuple[str, str], list[int]] = {}
    for sid in chosen:
        taken = gnos.setdefault(sid, [])
        taken.append((taken[-1] if taken else 0) + 1 + draw(gap))
    if draw(st.booleans()):
        # A replica without commit-order preservation logs a source's GTIDs out of order;
        # set containment must not care.
        gnos = {sid: draw(st.permutations(taken)) for sid, taken in gnos.items()}
    counters = dict.fromkeys(gnos, 0)
    out = []
    for uuid, tag in chosen:
        out.append(MysqlGtid(uuid, gnos[(uuid, tag)][counters[(uuid, tag)]], tag))
        counters[(uuid, tag)] += 1
    return out


# ---- chunk reads ---------------------------------------------------------------------------------


def _position(flavour: str, txns: list[Txn]) -> GtidSet:
    cls = MysqlGtidSet if flavour == "mysql" else MariadbPosition
    return cls.from_gtids(t.gtid for t in txns)


def read_chunk(sc: Scenario, rng: random.Random, table: ChunkedTable,
               chunk_range: tuple[Key | None, Key | None], engine_point: int,
               watermark_ahead: bool) -> Chunk:
    """A chunk read while the source had executed at least txns[:engine_point].

    MariaDB: an exact watermark, the read view is a binlog prefix (``lw = after``). MySQL: the
    source commits concurrently; a transaction is in ``lw`` (stage 0), visible to the SELECT
    but outside ``lw`` (1), in ``after`` only (2) or later (3), stages never decreasing along
    transactions that touch a common key (row locks order them). ``watermark_ahead`` models
    the hazard: a low watermark holding a transaction the SELECT did not see.
    """
    n = len(sc.txns)
    read_point = min(n, engine_point + rng.randint(0, 3))
    if sc.flavour == "mariadb":
        visible = list(range(1, read_point + 1))
        marked = list(range(1, min(n, read_point + (1 if watermark_ahead else 0)) + 1))
        lw = after = _position("mariadb", [sc.txns[i - 1] for i in marked])
    else:
        width = rng.randint(0, 3)
        stage: dict[int, int] = {}
        for i in range(1, n + 1):
            if i <= max(engine_point, read_point - width):
                s = 0
            elif i > read_point + width:
                s = 3
            else:
                s = rng.randint(0, 3)
            for j in range(1, i):
                if _conflict(sc.txns[j - 1], sc.txns[i - 1]):
                    s = max(s, stage[j])
            stage[i] = s
        visible = [i for i in stage if stage[i] <= 1]
        low_stage = 2 if watermark_ahead else 0
        lw = _position("mysql", [sc.txns[i - 1] for i in stage if stage[i] <= low_stage])
        after = _position("mysql", [sc.txns[i - 1] for i in stage if stage[i] <= 2])
    state = sc.state_after(visible)
    low, high = chunk_range
    rows = tuple((k, state[k]) for k in sorted(state) if _in_range((k,), low, high))
    return Chunk(table, rows, low, high, lw, after, FINGERPRINT, None, True)


def _in_range(key: Key, low: Key | None, high: Key | None) -> bool:
    return (low is None or key > low) and (high is None or key <= high)


# ---- the model engine and lake ---------------------------------------------------------------------

Rule = Callable[..., Decision]


@dataclass
class Record:
    position: int
    key: Key | None = None
    value: int | None = None  # None: tombstone
    assertion: RangeAssertion | None = None
    sweep: SnapshotSweep | None = None
    threshold: int = 0


@dataclass
class Outcome:
    final: dict[int, int]
    truth: dict[int, int]
    violations: list[str]
    stats: dict[str, int]

    @property
    def ok(self) -> bool:
        return self.final == self.truth and not self.violations


def fold(garbage: dict[int, int], records: list[Record]) -> dict[int, int]:
    """The lake: replay by position; an assertion deletes keys in its range whose latest
    record is below its threshold; the sweep deletes keys whose latest record is below it."""
    state: dict[Key, tuple[int | None, int]] = {(k,): (v, 0) for k, v in garbage.items()}
    for record in sorted(records, key=lambda r: r.position):
        if record.key is not None:
            state[record.key] = (record.value, record.position)
            continue
        for key, (value, position) in list(state.items()):
            if value is None or position >= record.threshold:
                continue
            if record.sweep is not None or _in_range(
                key, record.assertion.range_low, record.assertion.range_high
            ):
                state[key] = (None, record.position)
    return {k[0]: v for k, (v, _) in state.items() if v is not None}


def fold_unordered(garbage: dict[int, int], records: list[Record]) -> dict[int, int]:
    """The same result computed as a merge-on-read lake would: fold rows to the latest per
    key, then drop keys that any assertion or sweep covers with a higher threshold."""
    latest: dict[Key, tuple[int | None, int]] = {(k,): (v, 0) for k, v in garbage.items()}
    for record in records:
        if record.key is not None and record.position >= latest.get(record.key, (0, -1))[1]:
            latest[record.key] = (record.value, record.position)
    out = {}
    for key, (value, position) in latest.items():
        deleted = any(
            position < r.threshold and (r.sweep is not None or _in_range(
                key, r.assertion.range_low, r.assertion.range_high))
            for r in records if r.key is None
        )
        if value is not None and not deleted:
            out[key[0]] = value
    return out


def simulate(sc: Scenario, rule: Rule = decide_chunk_commit, watermark_ahead: bool = False,
             prune: bool = True, table_wide_after: int = TABLE_WIDE_TOUCHES) -> Outcome:
    rng, n, flavour = random.Random(sc.seed), len(sc.txns), sc.flavour
    table = _table(sc.range_assertions)
    empty = _position(flavour, [])
    processed, opening = empty, empty
    next_pos = 1
    opening_pos = 0
    records: list[Record] = []
    log = TouchedKeyLog(empty, table_wide_after=table_wide_after)  # the session's
    stats = dict.fromkeys(["commits", "waits", "rejects", "dropped", "asserted_deletes",
                           "pruned_touches", "table_wide_touches"], 0)
    violations: list[str] = []

    def schedule(index: int, engine_point: int, stale_ok: bool) -> tuple[int, int, Chunk]:
        point = engine_point
        if stale_ok and sc.opening and rng.random() < 0.2:
            point = rng.randint(0, sc.opening)  # read before the session opened
        chunk = read_chunk(sc, rng, table, sc.ranges[index], point, watermark_ahead)
        return engine_point + rng.randint(0, 5), index, chunk

    in_flight = [schedule(i, sc.opening + rng.randint(0, 3), True)
                 for i in range(len(sc.ranges))]
    pending: list[tuple[int, Chunk]] = []
    covered: list[tuple[Key | None, Key | None]] = []

    def evaluate(point: int) -> None:
        nonlocal next_pos
        arrived = [c for c in in_flight if c[0] <= point]
        for c in arrived:
            in_flight.remove(c)
            pending.append((c[1], c[2]))
        rng.shuffle(pending)
        for item in list(pending):
            index, chunk = item
            decision = rule(chunk, processed, opening, log.horizon, log.touches, FINGERPRINT, ())
            if isinstance(decision, Wait):
                stats["waits"] += 1
                continue
            pending.remove(item)
            if isinstance(decision, Reject):
                stats["rejects"] += 1
                in_flight.append(schedule(index, point, False))
                continue
            assert isinstance(decision, Commit)
            stats["commits"] += 1
            stats["dropped"] += len(decision.dropped_keys)
            first = next_pos
            for row in decision.rows_to_emit:
                records.append(Record(next_pos, (row[0],), row[1]))
                next_pos += 1
            if decision.assertion is not None:
                records.append(Record(next_pos, assertion=decision.assertion,
                                      threshold=decision.assertion.threshold(first)))
                next_pos += 1
            covered.append((chunk.range_low, chunk.range_high))

    def maybe_prune() -> None:
        """A new log generation at the engine's point; twice in a row moves the horizon all
        the way to ``processed`` (the most a pruning may do)."""
        if rng.random() < 0.2:
            for _ in range(rng.choice([1, 1, 2])):
                stats["pruned_touches"] += log.prune(processed)

    def check(point: int) -> None:
        truth = sc.state_after(list(range(1, point + 1)))
        target = fold(sc.garbage, records)
        for k in range(sc.n_keys):
            if not any(_in_range((k,), low, high) for low, high in covered):
                continue
            if not sc.range_assertions and k not in truth:
                continue  # without range assertions an orphan waits for the sweep
            if target.get(k) != truth.get(k):
                violations.append(f"after txn {point}: key {k} is {target.get(k)} in the "
                                  f"target, {truth.get(k)} at the source")

    for point in range(n + 1):
        if point:
            txn = sc.txns[point - 1]
            state_before = sc.state_after(list(range(1, point)))
            for key, value in txn.writes:
                if value is None and key not in state_before:
                    continue  # deleting a missing row logs no row event
                records.append(Record(next_pos, (key,), value))
                if point > sc.opening:
                    log.record((key,), txn.gtid, next_pos)
                next_pos += 1
                if value is None:
                    state_before.pop(key, None)
                else:
                    state_before[key] = value
            processed = processed.add(txn.gtid)
        if point == sc.opening:
            opening, opening_pos = processed, next_pos
            log = TouchedKeyLog(processed, table_wide_after=table_wide_after)
        if prune and point > sc.opening:
            maybe_prune()
        if point >= sc.opening:
            evaluate(point)
        check(point)
    # Idle source: heartbeats keep the engine evaluating; re-reads now see everything.
    for heartbeat in range(20):
        if not pending and not in_flight:
            break
        if prune:
            maybe_prune()
        evaluate(n + 1 + 6 * heartbeat)  # a rejected chunk's re-read arrives by the next one
    assert not pending and not in_flight, "chunks never committed"
    # The engine follows the last chunk with the sweep in every unfiltered session, with range
    # assertions or without.
    sweep = sweep_after_snapshot(table.table_id, opening_pos, filtered=False)
    if sweep is not None:
        records.append(Record(next_pos, sweep=sweep, threshold=sweep.before_pos))
    check(n)
    final = fold(sc.garbage, records)
    if final != fold_unordered(sc.garbage, records):
        violations.append("folding by position and merge-on-read disagree")
    truth = sc.state_after(list(range(1, n + 1)))
    stats["table_wide_touches"] = len(log.touches.get(ALL_KEYS, ()))
    before = fold(sc.garbage, [r for r in records if r.key is not None])
    stats["asserted_deletes"] = len(set(before) - set(final))
    return Outcome(final, truth, violations, stats)


# ---- properties ------------------------------------------------------------------------------------

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Searching for a counterexample (not shrinking it: the first one proves the point).
SEARCH = settings(max_examples=3000, deadline=None, database=None, phases=[Phase.generate])


@pytest.mark.parametrize("flavour", ["mysql", "mariadb"])
@SETTINGS
@given(data=st.data())
def test_target_equals_source_on_random_histories(flavour: str, data: st.DataObject) -> None:
    sc = data.draw(scenarios(flavour))
    outcome = simulate(sc)
    for name, count in outcome.stats.items():
        event(f"{name}: {'some' if count else 'none'}")
    assert not outcome.violations, outcome.violations[:3]
    assert outcome.final == outcome.truth


@pytest.mark.parametrize("flavour", ["mysql", "mariadb"])
@SETTINGS
@given(data=st.data(), table_wide_after=st.integers(0, 2))
def test_table_wide_touches_keep_the_target_equal_to_the_source(
        flavour: str, data: st.DataObject, table_wide_after: int) -> None:
    """With the per-transaction bound of the touched-key log set small, transactions are
    logged table-wide: the same histories still end with the target equal to the source."""
    sc = data.draw(scenarios(flavour))
    outcome = simulate(sc, table_wide_after=table_wide_after)
    event(f"table-wide touches: {'some' if outcome.stats['table_wide_touches'] else 'none'}")
    assert not outcome.violations, outcome.violations[:3]
    assert outcome.final == outcome.truth
    assert outcome.final == simulate(sc).final  # the per-key log's result


def drop_all_rows_on_a_table_wide_touch(chunk, processed, opening, horizon, touched,
                                        *args):  # noqa: ANN001, ANN201
    """Treats a table-wide touch as "every key touched": drops every row instead of
    re-reading the chunk."""
    wide = touched.get(ALL_KEYS, ())
    if wide and any(not chunk.low_watermark.contains_gtid(t.gtid) for t in wide):
        every = {tuple(row[i] for i in chunk.table.key_indexes): [wide[0]]
                 for row in chunk.rows}
        touched = {**{k: v for k, v in touched.items() if k != ALL_KEYS}, **every}
    return decide_chunk_commit(chunk, processed, opening, horizon, touched, *args)


@pytest.mark.parametrize("flavour", ["mysql", "mariadb"])
def test_dropping_all_rows_on_a_table_wide_touch_is_caught(flavour: str) -> None:
    counterexample = find(
        scenarios(flavour),
        lambda sc: not simulate(sc, rule=drop_all_rows_on_a_table_wide_touch,
                                table_wide_after=0).ok,
        settings=SEARCH,
    )
    assert not simulate(counterexample, rule=drop_all_rows_on_a_table_wide_touch,
                        table_wide_after=0).ok


# Rules a careless implementation might use; each must be caught by the same properties.


def commit_before_after_is_processed(chunk, processed, *args):  # noqa: ANN001, ANN201
    return decide_chunk_commit(chunk, chunk.after.union(processed), *args)


def keep_touched_keys(chunk, processed, opening, horizon, touched, *args):  # noqa: ANN001, ANN201
    return decide_chunk_commit(chunk, processed, opening, horizon, {}, *args)


def ignore_session_opening(chunk, processed, opening, horizon, *args):  # noqa: ANN001, ANN201
    return decide_chunk_commit(chunk, processed, chunk.low_watermark.empty(),
                               chunk.low_watermark.empty(), *args)


def ignore_pruning_horizon(chunk, processed, opening, horizon, *args):  # noqa: ANN001, ANN201
    return decide_chunk_commit(chunk, processed, opening, opening, *args)


def threshold_at_commit(*args):  # noqa: ANN002, ANN201
    decision = decide_chunk_commit(*args)
    if isinstance(decision, Commit) and decision.assertion is not None:
        return replace(decision, assertion=replace(decision.assertion, keep_from_pos=None))
    return decision


@pytest.mark.parametrize("flavour", ["mysql", "mariadb"])
@pytest.mark.parametrize(
    ("broken", "options"),
    [
        pytest.param(commit_before_after_is_processed, {}, id="commit-before-processed-has-after"),
        pytest.param(keep_touched_keys, {}, id="keep-touched-keys"),
        pytest.param(ignore_session_opening, {}, id="ignore-session-opening-and-horizon"),
        pytest.param(ignore_pruning_horizon, {}, id="ignore-pruning-horizon"),
        pytest.param(threshold_at_commit, {}, id="assertion-ignores-keep-from-pos"),
        pytest.param(decide_chunk_commit, {"watermark_ahead": True},
                     id="low-watermark-ahead-of-read-view"),
    ],
)
def test_broken_rules_are_caught(flavour: str, broken: Rule, options: dict) -> None:
    counterexample = find(
        scenarios(flavour),
        lambda sc: not simulate(sc, rule=broken, **options).ok,
        settings=SEARCH,
    )
    assert not simulate(counterexample, rule=broken, **options).ok


@pytest.mark.parametrize("flavour", ["mysql", "mariadb"])
def test_the_property_exercises_every_branch(flavour: str) -> None:
    """Not vacuous: correct runs include waits, rejections, dropped keys, deletes and pruned
    touches."""
    for stat in ("waits", "rejects", "dropped", "asserted_deletes", "pruned_touches"):
        found = find(scenarios(flavour), lambda sc, s=stat: (o := simulate(sc)).ok
                     and o.stats[s] > 0,
                     settings=SEARCH)
        assert simulate(found).stats[stat] > 0


# ---- examples ----------------------------------------------------------------------------------------


def _mysql(*parts: str) -> MysqlGtidSet:
    return MysqlGtidSet.parse(",".join(parts))


U1, U2 = UUIDS[0], UUIDS[1]


def _chunk(rows: tuple, lw: str, after: str, low: Key | None = None, high: Key | None = None,
           table: ChunkedTable | None = None) -> Chunk:
    return Chunk(table or _table(True), rows, low, high, _mysql(lw), _mysql(after), FINGERPRINT,
                 None, True)


def test_waits_until_processed_contains_after_across_server_uuids() -> None:
    chunk = _chunk(((1, 10),), f"{U1}:1-5", f"{U1}:1-6,{U2}:1-2")
    decision = decide_chunk_commit(chunk, _mysql(f"{U1}:1-9,{U2}:1"), _mysql(""), _mysql(""),
                                   {}, FINGERPRINT)
    assert isinstance(decision, Wait) and "db.t" in decision.reason
    decision = decide_chunk_commit(chunk, _mysql(f"{U1}:1-9,{U2}:1-2"), _mysql(""), _mysql(""),
                                   {}, FINGERPRINT)
    assert decision == Commit(((1, 10),), frozenset(),
                              RangeAssertion("db.t", None, None, None))


def test_drops_keys_touched_outside_the_low_watermark_and_keeps_from_first_such_touch() -> None:
    chunk = _chunk(((1, 10), (2, 20), (3, 30)), f"{U1}:1-5", f"{U1}:1-7", (0,), (3,))
    touched = {
        (1,): [Touch(MysqlGtid(U1, 4), 40)],  # inside lw: the chunk reflects it
        (2,): [Touch(MysqlGtid(U1, 4), 41), Touch(MysqlGtid(U1, 7), 52)],
        (9,): [Touch(MysqlGtid(U1, 6), 50)],  # another key of the table
    }
    decision = decide_chunk_commit(chunk, _mysql(f"{U1}:1-8"), _mysql(f"{U1}:1-3"), _mysql(""),
                                   touched, FINGERPRINT)
    assert decision == Commit(((1, 10), (3, 30)), frozenset({(2,)}),
                              RangeAssertion("db.t", (0,), (3,), 50))
    assert decision.assertion.threshold(commit_position=99) == 50


@pytest.mark.parametrize(
    ("opening", "horizon", "ddl", "fingerprint", "reason"),
    [
        (f"{U1}:1-6", "", (), FINGERPRINT, "session's opening position"),
        ("", f"{U2}:1", (), FINGERPRINT, "pruning horizon"),
        ("", "", (MysqlGtid(U1, 6),), FINGERPRINT, "DDL at GTID " + U1 + ":6"),
        ("", "", (MysqlGtid(U1, 3),), "schema-v2", "binlog schema is schema-v2"),
    ],
)
def test_rejects_chunks_that_cannot_be_made_exact(opening: str, horizon: str, ddl: tuple,
                                                  fingerprint: str, reason: str) -> None:
    chunk = _chunk(((1, 10),), f"{U1}:1-5", f"{U1}:1-5")
    decision = decide_chunk_commit(chunk, _mysql(f"{U1}:1-9"), _mysql(opening), _mysql(horizon),
                                   {}, fingerprint, ddl)
    assert isinstance(decision, Reject)
    assert reason in decision.reason and "re-select" in decision.reason


def test_schema_mismatch_waits_while_the_engine_is_behind() -> None:
    """The engine may not have processed the DDL the chunk already saw: wait, then compare."""
    chunk = _chunk(((1, 10),), f"{U1}:1-5", f"{U1}:1-5")
    decision = decide_chunk_commit(chunk, _mysql(f"{U1}:1-4"), _mysql(""), _mysql(""), {},
                                   "schema-v0")
    assert isinstance(decision, Wait)


def test_filtered_and_text_keyed_chunks_carry_no_range_assertion() -> None:
    text_keyed = _chunk(((1, 10),), f"{U1}:1", f"{U1}:1", table=_table(False))
    decision = decide_chunk_commit(text_keyed, _mysql(f"{U1}:1"), _mysql(""), _mysql(""), {},
                                   FINGERPRINT)
    assert isinstance(decision, Commit) and decision.assertion is None
    filtered = replace(_table(True), condition=Condition("v > 3"))
    chunk = _chunk(((1, 10),), f"{U1}:1", f"{U1}:1", table=filtered)
    decision = decide_chunk_commit(chunk, _mysql(f"{U1}:1"), _mysql(""), _mysql(""), {},
                                   FINGERPRINT)
    assert isinstance(decision, Commit) and decision.assertion is None
    assert sweep_after_snapshot("db.t", 7, filtered=True) is None
    assert sweep_after_snapshot("db.t", 7, filtered=False) == SnapshotSweep("db.t", 7)


def test_mariadb_positions_compare_per_domain() -> None:
    table = _table(True)
    lw = MariadbPosition.parse("0-1-10,1-2-5")
    chunk = Chunk(table, ((1, 10),), None, None, lw, lw, FINGERPRINT, None, True)
    touched = {(1,): [Touch(MariadbGtid(1, 1, 6), 77)]}  # domain 1 beyond lw: touched
    decision = decide_chunk_commit(chunk, MariadbPosition.parse("0-1-12,1-1-6"),
                                   MariadbPosition.parse("0-1-3"), MariadbPosition(), touched,
                                   FINGERPRINT)
    assert decision == Commit((), frozenset({(1,)}), RangeAssertion("db.t", None, None, 77))
    assert isinstance(decide_chunk_commit(chunk, MariadbPosition.parse("0-1-12"),
                                          MariadbPosition(), MariadbPosition(), {}, FINGERPRINT),
                      Wait)
