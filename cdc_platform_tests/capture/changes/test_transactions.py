"""The transaction buffer without a server: every way a binlog group can end."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_platform.capture.changes.transactions import (
    Committed,
    Prepared,
    RecordLog,
    RolledBack,
    Statement,
    TransactionBuffer,
    parse_xa_finish,
)
from cdc_platform.capture.events import Begin, EngineError, Query, XaPrepare, Xid, xa_id


@dataclass
class FakePart:
    """A spilled part held in a list (what the engine writes to a file); with ``in_memory``,
    a block of records the engine built at once and holds in memory until spilled."""

    rows: list
    removed: bool = False
    in_memory: bool = False

    @property
    def count(self) -> int:
        return len(self.rows)

    def truncate(self, keep: int) -> FakePart:
        if not self.in_memory:
            self.removed = True
        return FakePart(self.rows[:keep], in_memory=self.in_memory)

    def remove(self) -> None:
        self.removed = True


def fake_spill(parts: list[FakePart]):
    """The engine's spill: consecutive held parts (records, blocks) as one spilled part."""
    def spill(held):
        assert held and all(isinstance(p, list) or p.in_memory for p in held)
        parts.append(FakePart([r for p in held for r in (p if isinstance(p, list) else p.rows)]))
        return [parts[-1]]

    return spill


def all_records(log: RecordLog) -> list:
    out: list = []
    for part in log:
        out += part if isinstance(part, list) else part.rows
    return out


def committed(outcomes) -> list[tuple[str, list]]:
    return [(o.gtid, all_records(o.records)) for o in outcomes if isinstance(o, Committed)]


def run(buffer: TransactionBuffer, *steps) -> list:
    """Steps are events, or lists of records or blocks (one rows event each). Committed XA
    transactions are forgotten once "applied", as the engine does."""
    out: list = []
    for step in steps:
        if isinstance(step, list):
            buffer.add(step, 10 * len(step))
        elif isinstance(step, FakePart):
            buffer.add_block(step, 10 * step.count)
        else:
            outcomes = buffer.feed(step)
            for outcome in outcomes:
                if isinstance(outcome, Committed):
                    buffer.forget_prepared(outcome)
            out += outcomes
    return out


def test_begin_commit_and_xid_emit_the_rows_under_the_gtid():
    buffer = TransactionBuffer()
    out = run(buffer, Begin("0-1-1"), Query("BEGIN"), [1, 2], Xid(),
              Begin("0-1-2"), Query("BEGIN"), [3], Query("COMMIT"))
    assert committed(out) == [("0-1-1", [1, 2]), ("0-1-2", [3])]
    assert not buffer.in_group


def test_rollback_and_abandoned_groups_emit_nothing():
    buffer = TransactionBuffer()
    out = run(buffer, Begin("0-1-1"), Query("BEGIN"), [1], Query("ROLLBACK"),
              Begin("0-1-2"), Query("BEGIN"), [2], Begin("0-1-3"), Query("BEGIN"), [3], Xid())
    assert committed(out) == [("0-1-3", [3])]
    assert [(o.gtid, o.records, o.abandoned) for o in out if isinstance(o, RolledBack)] == [
        ("0-1-1", 1, False), ("0-1-2", 1, True)]
    # The engine warns of abandoned rows only; each outcome says what was dropped and why.
    dropped = [o for o in out if isinstance(o, RolledBack)]
    assert [o.unusual for o in dropped] == [False, True]
    assert dropped[0].describe() == (f"transaction 0-1-1: 1 record(s) dropped "
                                     f"({dropped[0].reason}); nothing emitted")
    assert not RolledBack("0-1-4", 0, "cut", abandoned=True).unusual


def test_savepoints_drop_only_the_rows_after_them():
    buffer = TransactionBuffer()
    out = run(buffer, Begin("0-1-1"), Query("BEGIN"), [1], Query("SAVEPOINT `a b`"), [2],
              Query("SAVEPOINT s2"), [3], Query("ROLLBACK TO `a b`"), [4], Xid())
    assert committed(out) == [("0-1-1", [1, 4])]


def test_savepoint_names_compare_case_insensitively_quoted_or_not():
    buffer = TransactionBuffer()
    out = run(buffer, Begin("0-1-1"), Query("BEGIN"), [1], Query("SAVEPOINT Sp"), [2],
              Query("ROLLBACK TO sp"), [3], Query("SAVEPOINT `Ä x`"), [4],
              Query("ROLLBACK WORK TO SAVEPOINT `ä X`"), Xid())
    assert committed(out) == [("0-1-1", [1, 3])]


@pytest.mark.parametrize("unknown", [
    "ROLLBACK TO s2",  # gone with the rollback to `a`
    "ROLLBACK TO SAVEPOINT never_set",
])
def test_a_rollback_to_an_unknown_savepoint_is_a_loud_stop(unknown):
    buffer = TransactionBuffer()
    run(buffer, Begin("0-1-1"), Query("BEGIN"), [1], Query("SAVEPOINT a"), [2],
        Query("SAVEPOINT s2"), [3], Query("ROLLBACK TO a"))
    with pytest.raises(EngineError, match=r"GTID 0-1-1: .*never set.*re-snapshot"):
        run(buffer, Query(unknown))


def test_standalone_ddl_completes_its_gtid_and_is_reported_first():
    buffer = TransactionBuffer()
    out = run(buffer, Begin("0-1-1", standalone=True),
              Query("ALTER TABLE t ADD c INT", database="db"))
    assert isinstance(out[0], Statement) and out[0].database == "db"
    assert committed(out) == [("0-1-1", [])]


def test_create_table_select_on_mariadb_ends_at_its_xid_not_at_the_ddl():
    buffer = TransactionBuffer()
    out = run(buffer, Begin("0-1-5", standalone=False), Query("CREATE TABLE c (id INT)"))
    assert [type(o) for o in out] == [Statement]
    assert buffer.open_gtid == "0-1-5"
    out = run(buffer, [1, 2], Xid())
    assert committed(out) == [("0-1-5", [1, 2])]


def test_create_table_select_on_mysql_is_told_by_its_start_transaction():
    buffer = TransactionBuffer()
    out = run(buffer, Begin("u:7"), Query("CREATE TABLE c (id INT) START TRANSACTION"),
              [1], Xid(), Begin("u:8"), Query("DROP TABLE x"))
    assert committed(out) == [("u:7", [1]), ("u:8", [])]


XID = xa_id(1, b"x1", b"")


def test_xa_rows_are_emitted_at_xa_commit_under_the_commit_gtid():
    buffer = TransactionBuffer()
    out = run(buffer, Begin("0-1-3", standalone=False, xid=XID), [1, 2],
              Query("XA END X'7831',X'',1"), XaPrepare(XID))
    assert out == [Prepared("0-1-3", XID, 2)]
    assert out[0].describe() == (f"XA transaction {XID}: prepared at GTID 0-1-3 with 2 "
                                 "record(s); they land at its XA COMMIT")
    assert set(buffer.prepared) == {XID}
    out = run(buffer, Begin("0-1-4", standalone=True), Query("XA COMMIT X'7831',X'',1"))
    assert committed(out) == [("0-1-4", [1, 2])]
    assert buffer.prepared == {}


def test_an_xa_commit_stays_prepared_until_the_engine_applied_it():
    """A checkpoint written while the commit is half applied must still name the XA."""
    buffer = TransactionBuffer()
    run(buffer, Begin("0-1-3", standalone=False, xid=XID), [1], XaPrepare(XID))
    out = buffer.feed(Begin("0-1-4", standalone=True)) + buffer.feed(
        Query("XA COMMIT X'7831',X'',1"))
    assert committed(out) == [("0-1-4", [1])] and set(buffer.prepared) == {XID}
    buffer.forget_prepared(out[-1])
    assert buffer.prepared == {}


def test_xa_rollback_drops_the_prepared_rows_and_completes_its_gtid():
    buffer = TransactionBuffer()
    run(buffer, Begin("0-1-5", xid=XID), [1], Query("XA END X'7831',X'',1"), XaPrepare(XID))
    out = run(buffer, Begin("0-1-6", standalone=True), Query("XA ROLLBACK X'7831',X'',1"))
    assert committed(out) == [("0-1-6", [])]
    assert [o.gtid for o in out if isinstance(o, RolledBack)] == ["0-1-5"]


def test_mysql_xa_start_and_one_phase_commit():
    buffer = TransactionBuffer()
    out = run(buffer, Begin("u:1"), Query("XA START X'7831',X'',1"), [1],
              Query("XA END X'7831',X'',1"), XaPrepare(XID, one_phase=True))
    assert committed(out) == [("u:1", [1])]


def test_xa_commit_of_a_prepare_never_read_is_a_loud_stop():
    buffer = TransactionBuffer()
    with pytest.raises(EngineError, match=r"0-1-9.*XA COMMIT.*never read"):
        run(buffer, Begin("0-1-9", standalone=True), Query("XA COMMIT X'7831',X'',1"))


def test_xa_ids_parse_like_the_prepare_event_names_them():
    assert parse_xa_finish("XA COMMIT X'7831',X'62',7") == ("COMMIT", xa_id(7, b"x1", b"b"),
                                                            False)
    assert parse_xa_finish("xa rollback X'00ff'") == ("ROLLBACK", xa_id(1, b"\x00\xff", b""),
                                                      False)
    assert parse_xa_finish("XA COMMIT X'31',X'',1 ONE PHASE")[2] is True


def test_a_spilled_log_is_cut_and_discarded_with_its_parts():
    parts: list[FakePart] = []
    log = RecordLog(memory_bytes=25, spill=fake_spill(parts))
    for i in range(10):
        log.extend([i], 10)
    assert log.spilled and all_records(log) == list(range(10))
    log.truncate(4)
    assert all_records(log) == [0, 1, 2, 3]
    log.discard()
    assert all(p.removed for p in parts)


def test_held_blocks_count_against_the_budget_and_spill_in_order():
    parts: list[FakePart] = []
    log = RecordLog(memory_bytes=45, spill=fake_spill(parts))
    log.extend([0, 1], 20)
    log.append_block(FakePart([2, 3], in_memory=True), 20)
    assert not log.spilled and all_records(log) == [0, 1, 2, 3]
    log.extend([4], 10)  # 50 bytes held: everything held is written out, in order
    assert log.spilled and [p.rows for p in parts] == [[0, 1, 2, 3, 4]]
    assert all_records(log) == [0, 1, 2, 3, 4]
    log.append_block(FakePart([5, 6, 7], in_memory=True), 30)
    log.truncate(6)  # a held block is cut in memory
    assert all_records(log) == [0, 1, 2, 3, 4, 5] and len(log) == 6
    log.spill()  # (an XA prepare: every record out of memory)
    assert all(not p.in_memory for p in log) and all_records(log) == list(range(6))


# -- property: random savepoint/rollback programs against a reference model ---------------

step = st.one_of(
    st.tuples(st.just("rows"), st.integers(1, 3)),
    st.tuples(st.just("block"), st.integers(1, 3)),
    st.tuples(st.just("savepoint"), st.sampled_from("abc")),
    st.tuples(st.just("rollback_to"), st.sampled_from("abc")),
    st.tuples(st.just("release"), st.sampled_from("abc")),
)


@settings(max_examples=300, deadline=None)
@given(programs=st.lists(st.tuples(st.lists(step, max_size=12),
                                   st.sampled_from(["commit", "xid", "rollback", "none"])),
                         max_size=6),
       memory=st.sampled_from([0, 15, 45]))
def test_committed_rows_match_a_reference_model(programs, memory):
    parts: list[FakePart] = []
    spill = fake_spill(parts)
    buffer = TransactionBuffer(lambda: RecordLog(memory, spill))
    expected: list[tuple[str, list]] = []
    got: list = []
    counter = 0
    for number, (steps, end) in enumerate(programs):
        gtid = f"0-1-{number + 1}"
        got += run(buffer, Begin(gtid), Query("BEGIN"))
        rows: list[int] = []
        marks: dict[str, int] = {}
        for kind, arg in steps:
            if kind in ("rows", "block"):
                new = list(range(counter, counter + arg))
                counter += arg
                rows += new
                got += run(buffer, new if kind == "rows" else FakePart(new, in_memory=True))
            elif kind == "savepoint":
                marks[arg] = len(rows)
                got += run(buffer, Query(f"SAVEPOINT {arg}"))
            elif kind == "rollback_to":
                if arg not in marks:
                    continue  # the server refuses it: never in the binlog
                del rows[marks[arg]:]
                marks = {k: v for k, v in marks.items() if v <= marks[arg]}
                # (names compare case-insensitively, quoted or not)
                got += run(buffer, Query(f"ROLLBACK TO SAVEPOINT `{arg.upper()}`"))
            else:
                marks.pop(arg, None)
                got += run(buffer, Query(f"RELEASE SAVEPOINT {arg}"))
        if end == "commit":
            got += run(buffer, Query("COMMIT"))
            expected.append((gtid, rows))
        elif end == "xid":
            got += run(buffer, Xid())
            expected.append((gtid, rows))
        elif end == "rollback":
            got += run(buffer, Query("ROLLBACK"))
    buffer.discard_open()
    assert committed(got) == expected
    # Parts of rolled-back, cut or abandoned rows were removed; only committed ones remain.
    live = {id(p) for o in got if isinstance(o, Committed) for p in o.records
            if not isinstance(p, list)}
    assert all(p.removed for p in parts if id(p) not in live)


# -- property: XA transactions prepared, committed and rolled back in any interleaving -------

xa_step = st.tuples(st.sampled_from(["plain", "prepare", "commit", "rollback", "one_phase",
                                     "ddl", "ctas"]),
                    st.sampled_from(["x", "y", "z"]), st.integers(0, 3))


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(xa_step, max_size=25))
def test_xa_interleavings_match_a_reference_model(steps):
    buffer = TransactionBuffer()
    prepared: dict[str, list[int]] = {}
    expected: list[tuple[str, list[int]]] = []
    got: list = []
    counter = 0
    for number, (kind, name, count) in enumerate(steps):
        gtid = f"0-1-{number + 1}"
        xid = xa_id(1, name.encode(), b"")
        hexid = name.encode().hex()
        rows = list(range(counter, counter + count))
        counter += count
        if kind == "plain":
            got += run(buffer, Begin(gtid, standalone=False), Query("BEGIN"), rows, Xid())
            expected.append((gtid, rows))
        elif kind == "prepare":
            if xid in prepared:
                continue  # the server refuses a second XA with a prepared id
            got += run(buffer, Begin(gtid, standalone=False, xid=xid), rows,
                       Query(f"XA END X'{hexid}',X'',1"), XaPrepare(xid))
            prepared[xid] = rows
            expected.append((None, []))  # the prepare's GTID completes with no records
        elif kind in ("commit", "rollback"):
            if xid not in prepared:
                continue
            verb = "COMMIT" if kind == "commit" else "ROLLBACK"
            got += run(buffer, Begin(gtid, standalone=True),
                       Query(f"XA {verb} X'{hexid}',X'',1"))
            kept = prepared.pop(xid)
            expected.append((gtid, kept if kind == "commit" else []))
        elif kind == "one_phase":
            got += run(buffer, Begin(gtid), Query(f"XA START X'{hexid}',X'',1"), rows,
                       Query(f"XA END X'{hexid}',X'',1"), XaPrepare(xid, one_phase=True))
            expected.append((gtid, rows))
        elif kind == "ddl":
            got += run(buffer, Begin(gtid, standalone=True), Query("ALTER TABLE t ADD x INT"))
            expected.append((gtid, []))
        else:
            got += run(buffer, Begin(gtid, standalone=False), Query("CREATE TABLE c (a INT)"),
                       rows, Xid())
            expected.append((gtid, rows))
    completed = [(o.gtid, all_records(o.records)) if isinstance(o, Committed) else (None, [])
                 for o in got if isinstance(o, Committed | Prepared)]
    assert completed == expected
    assert set(buffer.prepared) == set(prepared)
    assert {x: all_records(p.records) for x, p in buffer.prepared.items()} == prepared
