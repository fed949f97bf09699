"""The additional-condition validator: realistic filters pass, injection attempts do not."""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_platform.capture.snapshot.conditions import (
    Condition,
    UnsafeConditionError,
    require_condition,
    tokenize_condition,
    validate_condition,
)

ACCEPTED = [
    "status = 'paid' AND total > 10",
    "region IN ('eu','us')",
    "name LIKE 'a;b%'",
    "note = 'it''s -- not /* a */ comment # nor ; a statement'",
    'label = "double; quoted"',
    "`order` >= 5 AND `select` IS NOT NULL",
    "created_at >= '2024-01-01 00:00:00' AND created_at < '2025-01-01'",
    "amount BETWEEN 1.5 AND 2e3",
    "NOT (deleted <=> 1) OR deleted IS NULL",
    "COALESCE(region, 'eu') = 'eu'",
    "id % 2 = 0",
    "LOWER(name) = 'bob' AND LENGTH(name) < 20",
    "REPLACE(sku, '-', '') = 'AB12'",
    "EXTRACT(YEAR FROM created_at) = 2024",
    "flags & 4 <> 0 AND x'0A' = payload",
    "price * qty > 100.00 AND customer_id != -1",
    "description = 'update; delete; drop table'",
    "städte = 'Köln'",
]

ATTACKS = [
    ("1=1; DROP TABLE orders", "';'"),
    ("id = 1;", "';'"),
    ("1=1 -- ", "comments"),
    ("1=1 --x", "comments"),
    ("1=1 # trailing", "comments"),
    ("1=1 /* hidden */", "comments"),
    ("/*!50000 1=1*/", "comments"),
    ("id = 1) OR (1=1", "never opened"),
    ("1=1) UNION SELECT user, password FROM mysql.user WHERE (1=1", "never opened"),
    ("(id = 1", "unclosed"),
    ("id IN (SELECT id FROM other_table)", "'SELECT'"),
    ("id IN (TABLE other_table)", "'TABLE'"),
    ("1=1 UNION ALL SELECT 1", "'UNION'"),
    ("SLEEP(10) = 0", "'SLEEP'"),
    ("BENCHMARK(100000000, MD5('x')) = 0", "'BENCHMARK'"),
    ("GET_LOCK('snapshot', 60) = 1", "'GET_LOCK'"),
    ("LOAD_FILE('/etc/passwd') IS NOT NULL", "'LOAD_FILE'"),
    ("1=1 INTO OUTFILE '/tmp/x'", "'INTO'"),
    ("1=1 FOR UPDATE", "'FOR'"),
    ("1=1 LOCK IN SHARE MODE", "'LOCK'"),
    ("1=1 ORDER BY id LIMIT 1", "'ORDER'"),
    ("name = 'abc", "unterminated string"),
    ("`name = 1", "unterminated backtick"),
    ("name = 'a\\' OR 1=1 -- '", "backslash"),
    ("@x := 1", "variables"),
    ("@@global.read_only = 0", "variables"),
    ("NEXTVAL(order_seq) > 0", "'NEXTVAL'"),
    ("NEXT VALUE FOR order_seq > 0", "'NEXT'"),
    ("MASTER_POS_WAIT('binlog.000001', 4) = 0", "'MASTER_POS_WAIT'"),
    ("LAST_INSERT_ID(5) = 5", "'LAST_INSERT_ID'"),
    ("id = 1 AND update_ts > 0 OR UPDATE", "'UPDATE'"),
    ("REPLACE INTO t VALUES (1)", "only allowed as a function call"),
    ("{fn SLEEP(1)}", "unexpected character '{'"),
    ("id = 1\x00", "control character"),
    ("id = ?", "unexpected character '?'"),
    ("set = 1", "'set'"),
    ("   ", "empty"),
    ("x" * 5000, "at most"),
]


@pytest.mark.parametrize("condition", ACCEPTED)
def test_realistic_filters_are_accepted(condition: str) -> None:
    assert validate_condition(f"  {condition}\n") == condition


@pytest.mark.parametrize(("condition", "reason"), ATTACKS, ids=[a[0][:40] for a in ATTACKS])
def test_injection_attempts_are_refused(condition: str, reason: str) -> None:
    with pytest.raises(UnsafeConditionError) as refused:
        validate_condition(condition)
    assert reason in str(refused.value)


def test_enough_attacks_are_covered() -> None:
    assert len(ATTACKS) >= 15


def test_keywords_and_separators_inside_literals_are_data() -> None:
    tokens = tokenize_condition("a = 'x; DROP TABLE t -- ' AND `weird``name` = \"q\"\"q\"")
    assert [(t.kind, t.text) for t in tokens] == [
        ("word", "a"), ("op", "="), ("string", "'x; DROP TABLE t -- '"), ("word", "AND"),
        ("identifier", "`weird``name`"), ("op", "="), ("string", '"q""q"'),
    ]


def test_error_names_the_position() -> None:
    with pytest.raises(UnsafeConditionError, match=r"at character 5 \(near 'id=1; DROP"):
        validate_condition("id=1; DROP TABLE x")


@pytest.mark.parametrize(("condition", "reason"), ATTACKS, ids=[a[0][:40] for a in ATTACKS])
def test_a_condition_cannot_be_made_of_refused_text(condition: str, reason: str) -> None:
    with pytest.raises(UnsafeConditionError) as refused:
        Condition(condition)
    assert reason in str(refused.value)


# Fragments of filters and of attacks: joined at random, they make texts near the boundary.
_FRAGMENTS = st.sampled_from([
    "id", " = ", "1", "'a;b'", "'it''s'", "`select`", "(", ")", " AND ", " OR ", ";", "--",
    "/*", "#", "@x", "\\", "SELECT", "SLEEP(1)", "REPLACE(", "REPLACE ", "'", "`", '"',
    " ", "\n", "%", "1=1) OR (1=1", "x'0A'", "\x00",
])
_TEXTS = st.one_of(st.text(max_size=60), st.lists(_FRAGMENTS, max_size=12).map("".join),
                   st.sampled_from(ACCEPTED + [a for a, _ in ATTACKS]))


@given(text=_TEXTS)
def test_a_condition_is_its_checked_text_and_checking_it_again_changes_nothing(
        text: str) -> None:
    """Condition and validate_condition agree; a condition read back as text (request.json,
    the checkpoint) is accepted again, unchanged: checking at every boundary is safe."""
    try:
        condition = Condition(text)
    except UnsafeConditionError as refused:
        with pytest.raises(UnsafeConditionError) as again:
            validate_condition(text)
        assert str(again.value) == str(refused)
        return
    assert condition == text.strip() == validate_condition(text)
    assert type(condition.sql) is str and condition.sql == condition
    assert Condition(condition) is condition
    assert Condition(str(condition)) == condition
    assert pickle.loads(pickle.dumps(condition)) == condition


@given(text=_TEXTS)
def test_an_accepted_condition_stays_inside_its_parentheses(text: str) -> None:
    """Embedded as ``AND (<condition>)``, nothing closes the parenthesis before its end, and
    no statement separator or comment appears outside literals."""
    try:
        condition = Condition(text)
    except UnsafeConditionError:
        return
    tokens = tokenize_condition(f"({condition.sql})")
    depth = 0
    for index, token in enumerate(tokens):
        if token.kind == "op":
            depth += {"(": 1, ")": -1}.get(token.text, 0)
        assert depth > 0 or index == len(tokens) - 1
    assert depth == 0


@given(text=_TEXTS)
def test_a_condition_is_stored_as_the_same_bytes_as_its_text(text: str) -> None:
    """The landing zone's files (request.json, the checkpoint) do not change with the type."""
    try:
        condition = Condition(text)
    except UnsafeConditionError:
        return
    for indent in (None, 1):
        assert json.dumps({"condition": condition}, indent=indent) == json.dumps(
            {"condition": condition.sql}, indent=indent)


def test_only_a_condition_is_accepted_where_sql_is_built() -> None:
    checked = Condition("id > 1")
    assert require_condition(checked) is checked
    for unchecked in ["id > 1", "1=1; DROP TABLE x", None, 1]:
        with pytest.raises(TypeError, match="must be a Condition"):
            require_condition(unchecked)


def test_a_condition_cannot_be_changed() -> None:
    condition = Condition("id > 1")
    with pytest.raises(AttributeError):
        condition.text = "1=1) OR (1=1"  # type: ignore[attr-defined]
