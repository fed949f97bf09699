"""The additional-condition validator: realistic filters pass, injection attempts do not."""

from __future__ import annotations

import pytest

from cdc_platform.capture.snapshot.conditions import (
    UnsafeConditionError,
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
