"""GTID algebra: server-text examples plus model-based properties for both flavours."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_platform.capture.gtid import (
    MAX_GNO,
    MariadbGtid,
    MariadbPosition,
    MysqlGtid,
    MysqlGtidSet,
    parse_gtid,
    parse_position,
)

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
U2 = "4b11fa47-71ca-11e1-9e33-c80aa9429563"
U3 = "00000000-0000-0000-0000-000000000001"

# ------------------------------------------------------------------------------- MySQL examples


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("", ""),
        ("  \n ", ""),
        (
            f"{U2.upper()}:1-3:7:9-12,\n{U1.upper()}:1-5",
            f"{U1}:1-5,{U2}:1-3:7:9-12",
        ),
        (f"{U1}:1-5:Tag1:3-4:tag2:1", f"{U1}:1-5:tag1:3-4:tag2:1"),
        (f"{U1}:zz:1, {U1}:1-3,\n{U1}:aa:2", f"{U1}:1-3:aa:2:zz:1"),
        (f"{U1}:_t:4-6", f"{U1}:_t:4-6"),
        (f"{U1}:1-3:4-5", f"{U1}:1-5"),
        (f"{U1}:7,{U1}:1-3,{U1}:4-6", f"{U1}:1-7"),
        (f"{U1}:1-5:3-8:2", f"{U1}:1-8"),
        (f"{U1}:5-5:9", f"{U1}:5:9"),
        (f"{U1} : 1 - 3 : 10", f"{U1}:1-3:10"),
        (f"{U1}:1-{MAX_GNO}", f"{U1}:1-{MAX_GNO}"),
    ],
)
def test_mysql_parse_canonical(text: str, canonical: str) -> None:
    s = MysqlGtidSet.parse(text)
    assert str(s) == canonical
    assert MysqlGtidSet.parse(canonical) == s
    assert s.is_empty == (canonical == "")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (f"{U1}:5-3", "interval 5-3 is reversed"),
        ("x", "bad UUID 'x'"),
        ("3e11fa47-71ca-11e1-9e33-c80aa942956:1", "bad UUID"),
        (f"{U1}:0", "transaction number 0 is out of range"),
        (f"{U1}:0-4", "transaction number 0"),
        (f"{U1}:1-{MAX_GNO + 1}", f"transaction number {MAX_GNO + 1}"),
        (f"{U1}:1-{'9' * 5000}", "out of range"),
        (f"{U1}", "missing interval after"),
        (f"{U1}:1:tag", "missing interval after 'tag'"),
        (f"{U1}:t1:t2:1", "expected an interval, got 't2'"),
        (f"{U1}:1abc", "expected an interval, got '1abc'"),
        (f"{U1}:{'t' * 33}:1", "expected an interval"),
        (f"{U1}:\u212a:1", "expected an interval"),  # Kelvin sign is not ASCII 'k'
        (f"{U1}:1,,{U2}:1", "empty element"),
        (f"{U1}:1,", "empty element"),
        (f"{U1}:1-2-3", "expected an interval"),
    ],
)
def test_mysql_parse_errors(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="invalid GTID set") as info:
        MysqlGtidSet.parse(text)
    assert fragment in str(info.value)


def test_mysql_gtid() -> None:
    assert str(MysqlGtid.parse(f" {U1.upper()}:42 ")) == f"{U1}:42"
    g = MysqlGtid.parse(f"{U1}:TAG_1:7")
    assert (g.uuid, g.tag, g.gno) == (U1, "tag_1", 7)
    assert str(g) == f"{U1}:tag_1:7"
    assert MysqlGtid(U1.upper(), 7, "Tag_1") == g
    for bad in (f"{U1}:0", f"{U1}:1-2", f"{U1}", f"{U1}:t:u:1", "x:1", f"{U1}:9t:1"):
        with pytest.raises(ValueError, match="invalid MySQL GTID"):
            MysqlGtid.parse(bad)


def test_mysql_operations() -> None:
    a = MysqlGtidSet.parse(f"{U1}:1-10:t:1-3,{U2}:5")
    b = MysqlGtidSet.parse(f"{U1}:4-6,{U2}:5-6")
    assert str(a | b) == f"{U1}:1-10:t:1-3,{U2}:5-6"
    assert str(a - b) == f"{U1}:1-3:7-10:t:1-3"
    assert str(a & b) == f"{U1}:4-6,{U2}:5"
    assert a.count() == 14 and (a - a).count() == 0 and (a - a).is_empty
    assert MysqlGtid(U1, 10) in a and MysqlGtid(U1, 11) not in a
    assert a.contains_gtid(MysqlGtid(U1, 2, "t")) and not a.contains_gtid(MysqlGtid(U1, 2, "u"))
    assert a >= a & b and not a >= b and a > a & b and a - b < a
    assert a.add(MysqlGtid(U2, 6)) == a | MysqlGtidSet.parse(f"{U2}:6")
    assert a.add(MysqlGtid(U1, 3)) is a  # already contained: value unchanged
    assert MysqlGtidSet({(U1.upper(), ""): [(4, 5), (1, 3)]}) == MysqlGtidSet.parse(f"{U1}:1-5")
    assert a.intervals()[(U1, "t")] == ((1, 3),)
    assert {a: 1}[MysqlGtidSet.parse(str(a))] == 1
    assert repr(b) == f"MysqlGtidSet('{U1}:4-6,{U2}:5-6')"
    assert not MysqlGtidSet() and MysqlGtidSet.empty() == MysqlGtidSet.parse("")


def test_mysql_constructor_validates() -> None:
    with pytest.raises(ValueError, match="reversed"):
        MysqlGtidSet({(U1, ""): [(3, 2)]})
    with pytest.raises(ValueError, match="out of range"):
        MysqlGtidSet({(U1, ""): [(0, 2)]})


# ----------------------------------------------------------------------------- MariaDB examples


def test_mariadb_position_parse() -> None:
    p = MariadbPosition.parse(" 1-2-7,\n0-1-100 ")
    assert str(p) == "0-1-100,1-2-7"
    assert MariadbPosition.parse(str(p)) == p and hash(p) == hash(MariadbPosition.parse(str(p)))
    assert list(p) == [MariadbGtid(0, 1, 100), MariadbGtid(1, 2, 7)]
    assert p.get(1) == MariadbGtid(1, 2, 7) and p.get(5) is None
    assert MariadbPosition.parse("").is_empty and str(MariadbPosition()) == ""
    assert repr(p) == "MariadbPosition('0-1-100,1-2-7')"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("0-1-5,0-2-6", "duplicate domain 0"),
        ("0-1", "want domain-server_id-seq"),
        ("0-1-5,", "invalid MariaDB GTID ''"),
        ("a-1-5", "want domain-server_id-seq"),
        (f"{2**32}-1-5", f"domain {2**32} is out of range"),
        (f"0-{2**32}-5", "server_id"),
        (f"0-1-{2**64}", "seq"),
    ],
)
def test_mariadb_position_errors(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="invalid MariaDB GTID position") as info:
        MariadbPosition.parse(text)
    assert fragment in str(info.value)


def test_mariadb_semantics() -> None:
    p = MariadbPosition.parse("0-1-100,1-2-7")
    assert MariadbGtid(0, 9, 100) in p  # server id does not matter under strict mode
    assert MariadbGtid(0, 1, 101) not in p and MariadbGtid(2, 1, 1) not in p
    assert p >= MariadbPosition.parse("0-3-50") and not p >= MariadbPosition.parse("2-1-1")
    assert str(p | MariadbPosition.parse("0-3-90,2-1-1")) == "0-1-100,1-2-7,2-1-1"
    assert str(p.add(MariadbGtid(1, 3, 8))) == "0-1-100,1-3-8"
    with pytest.raises(TypeError, match="high-water marks"):
        p - p  # noqa: B018
    with pytest.raises(TypeError, match="high-water marks"):
        p.intersection(p)
    with pytest.raises(ValueError, match="duplicate domain"):
        MariadbPosition([MariadbGtid(0, 1, 1), MariadbGtid(0, 1, 2)])
    assert MariadbPosition.from_gtids([MariadbGtid(0, 1, 1), MariadbGtid(0, 1, 2)]) == (
        MariadbPosition.parse("0-1-2")
    )


def test_flavour_dispatch_and_mixing() -> None:
    m = parse_position("mysql", f"{U1}:1-3")
    d = parse_position("mariadb", "0-1-3")
    assert isinstance(m, MysqlGtidSet) and isinstance(d, MariadbPosition)
    assert parse_gtid("mysql", f"{U1}:2") in m and parse_gtid("mariadb", "0-5-3") in d
    with pytest.raises(ValueError, match="unknown flavour"):
        parse_position("postgres", "")
    with pytest.raises(TypeError):
        m >= d  # noqa: B015
    with pytest.raises(TypeError):
        m.union(d)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        m.contains_gtid(MariadbGtid(0, 1, 1))
    with pytest.raises(TypeError):
        MariadbGtid(0, 1, 1) in m  # noqa: B015
    assert m != d


# ------------------------------------------------------------------------------ MySQL properties

UUIDS = [U1, U2, U3]
TAGS = ["", "a", "tag_2"]
N = 60
UNIVERSE = [(u, t, n) for u in UUIDS for t in TAGS for n in range(1, N + 1)]

# Runs (uuid, tag, lo, hi) so sets have long intervals as well as scattered points.
runs = st.lists(
    st.tuples(
        st.sampled_from(UUIDS), st.sampled_from(TAGS), st.integers(1, N), st.integers(0, 12)
    ).map(lambda r: (r[0], r[1], r[2], min(N, r[2] + r[3]))),
    max_size=8,
)


def expand(rs: list[tuple[str, str, int, int]]) -> frozenset[tuple[str, str, int]]:
    return frozenset((u, t, n) for u, t, lo, hi in rs for n in range(lo, hi + 1))


models = runs.map(expand)


def build(model: frozenset[tuple[str, str, int]]) -> MysqlGtidSet:
    return MysqlGtidSet.from_gtids(MysqlGtid(u, n, t) for u, t, n in model)


@st.composite
def messy_text(draw: st.DrawFn) -> tuple[str, frozenset[tuple[str, str, int]]]:
    """Non-canonical server-like text: shuffled, overlapping, mixed case, odd whitespace."""
    rs = draw(st.permutations(draw(runs)))
    parts = []
    for u, t, lo, hi in rs:
        u = u.upper() if draw(st.booleans()) else u
        t = t.upper() if draw(st.booleans()) else t
        iv = f"{lo}-{hi}" if hi > lo or draw(st.booleans()) else str(lo)
        parts.append(":".join([u, t, iv] if t else [u, iv]))
    sep = draw(st.sampled_from([",", ",\n", ", ", " ,\n  "]))
    return sep.join(parts), expand(rs)


@given(messy_text())
def test_mysql_parse_matches_model(case: tuple[str, frozenset[tuple[str, str, int]]]) -> None:
    text, model = case
    s = MysqlGtidSet.parse(text)
    assert s == build(model)
    assert s.count() == len(model)
    assert MysqlGtidSet.parse(str(s)) == s
    assert str(MysqlGtidSet.parse(str(s))) == str(s)


@given(models)
def test_mysql_contains_matches_model(model: frozenset[tuple[str, str, int]]) -> None:
    s = build(model)
    assert s.count() == len(model) and s.is_empty == (not model)
    for u, t, n in UNIVERSE:
        assert s.contains_gtid(MysqlGtid(u, n, t)) == ((u, t, n) in model)


@given(models, models)
def test_mysql_algebra_matches_model(ma: frozenset, mb: frozenset) -> None:
    a, b = build(ma), build(mb)
    assert a | b == build(ma | mb)
    assert a - b == build(ma - mb)
    assert a & b == build(ma & mb)
    assert (a >= b) == (ma >= mb) and (a <= b) == (ma <= mb)
    assert (a == b) == (ma == mb) and (str(a) == str(b)) == (ma == mb)
    assert (hash(a) == hash(b)) or ma != mb


@given(models, models, models)
def test_mysql_union_laws(ma: frozenset, mb: frozenset, mc: frozenset) -> None:
    a, b, c = build(ma), build(mb), build(mc)
    assert a | b == b | a
    assert (a | b) | c == a | (b | c)
    assert a | a == a and a | MysqlGtidSet() == a
    assert a | b >= a and (a - b) | (a & b) == a


# ---------------------------------------------------------------------------- MariaDB properties

DOMAINS = st.integers(0, 4)
gtids = st.builds(MariadbGtid, DOMAINS, st.integers(1, 3), st.integers(0, 50))
positions = st.lists(gtids, max_size=5, unique_by=lambda g: g.domain).map(MariadbPosition)


def seqs(p: MariadbPosition) -> dict[int, int]:
    return {g.domain: g.seq for g in p}


@given(positions)
def test_mariadb_round_trip(p: MariadbPosition) -> None:
    assert MariadbPosition.parse(str(p)) == p
    assert parse_position("mariadb", str(p)) == p


@given(positions, positions, gtids)
def test_mariadb_matches_model(a: MariadbPosition, b: MariadbPosition, g: MariadbGtid) -> None:
    ma, mb = seqs(a), seqs(b)
    assert a.contains_gtid(g) == (g.domain in ma and ma[g.domain] >= g.seq)
    assert a.issuperset(b) == all(d in ma and ma[d] >= s for d, s in mb.items())
    assert seqs(a | b) == {d: max(ma.get(d, -1), mb.get(d, -1)) for d in ma.keys() | mb.keys()}
    assert a | b == b | a and a | a == a


@given(positions, positions, positions)
def test_mariadb_union_monotone_and_order(
    a: MariadbPosition, b: MariadbPosition, c: MariadbPosition
) -> None:
    assert a | b >= a and a | b >= b and a >= a
    if a >= b:
        assert a | c >= b | c
    if a >= b and b >= a:  # antisymmetric up to server ids (ignored under strict mode)
        assert seqs(a) == seqs(b)
    big = a | b
    bigger = big | c
    assert bigger >= big >= a  # transitive chain
    assert bigger >= a
    assert (a | b) | c == a | (b | c)


@given(positions, gtids)
def test_mariadb_contains_after_add(p: MariadbPosition, g: MariadbGtid) -> None:
    q = p.add(g)
    assert q.contains_gtid(g) and q >= p
    assert all(q.contains_gtid(x) for x in p)
    assert q == p.union(MariadbPosition([g]))


# ------------------------------------------------ MySQL binary GTID sets (COM_BINLOG_DUMP_GTID)


@given(models)
def test_mysql_binary_gtid_sets_round_trip(model: frozenset[tuple[str, str, int]]) -> None:
    from cdc_platform.capture.gtid import decode_mysql_gtid_set, encode_mysql_gtid_set

    gtid_set = build(model)
    encoded = encode_mysql_gtid_set(gtid_set)
    assert decode_mysql_gtid_set(encoded) == gtid_set
    tagged = any(t for _, t, _ in model)
    assert (encoded[0], encoded[7]) == ((1, 1) if tagged else (len(gtid_set.intervals()), 0))


@given(models.filter(lambda m: not any(t for _, t, _ in m)))
def test_untagged_sets_encode_as_mysql_replication_always_sent_them(
        model: frozenset[tuple[str, str, int]]) -> None:
    """Every MySQL 5.6+ reads the untagged format: a resume from an untagged position sends
    the same bytes as before tags were known."""
    from pymysqlreplication.gtid import GtidSet as LibraryGtidSet

    from cdc_platform.capture.gtid import encode_mysql_gtid_set

    gtid_set = build(model)
    text = str(gtid_set)
    assert encode_mysql_gtid_set(gtid_set) == (LibraryGtidSet(text).encoded() if text
                                               else bytes(8))


def test_damaged_binary_gtid_sets_are_refused() -> None:
    from cdc_platform.capture.gtid import decode_mysql_gtid_set, encode_mysql_gtid_set

    encoded = encode_mysql_gtid_set(MysqlGtidSet.parse(f"{U1}:1-5:tag:3"))
    for damaged in (encoded[:-1], encoded + b"\0", encoded[:20]):
        with pytest.raises(ValueError):
            decode_mysql_gtid_set(damaged)


def test_a_tagged_executed_set_is_a_watermark() -> None:
    """``Executed_Gtid_Set`` of MySQL 8.4 with tagged transactions (as the server prints it:
    one line per uuid, the untagged intervals first), read around a chunk's read view."""
    from cdc_platform_tests.capture.snapshot.test_watermark import (
        SELECT,
        FakeMysql,
        _status,
        read_chunk_with_watermarks,
    )

    conn = FakeMysql({
        "SHOW BINARY LOG STATUS": [_status(f"{U1}:1-10:orders:1-3,\n{U2}:1-3"),
                                   _status(f"{U1}:1-10:orders:1-5,\n{U2}:1-3")],
        SELECT: (("id",), [(7,)]),
    })
    rows, low_watermark, after = read_chunk_with_watermarks(conn, "mysql", SELECT, (6, 1))
    assert rows == [(7,)]
    assert after - low_watermark == MysqlGtidSet.parse(f"{U1}:orders:4-5")
    assert MysqlGtid.parse(f"{U1}:orders:3") in low_watermark
    assert MysqlGtid.parse(f"{U1}:orders:4") not in low_watermark
    assert MysqlGtid.parse(f"{U1}:4") in low_watermark  # (the untagged 4: another GTID)
    processed = MysqlGtidSet.parse(f"{U1}:1-10:orders:1-4,{U2}:1-3")
    assert not processed >= after and processed.add(MysqlGtid.parse(f"{U1}:orders:5")) >= after
