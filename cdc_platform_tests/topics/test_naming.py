"""Topic names by Debezium's default topic naming strategy."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_platform.topics.naming import (
    MAX_TOPIC_LENGTH,
    envelope_schema_name,
    key_schema_name,
    sanitized_topic_name,
    topic_name,
    value_schema_name,
)

KAFKA_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
PREFIX = st.from_regex(r"[a-zA-Z0-9_-][a-zA-Z0-9._-]{0,30}", fullmatch=True)


def test_plain_names_are_joined_by_dots() -> None:
    assert topic_name("mysql-server-1", "inventory", "customers") == \
        "mysql-server-1.inventory.customers"


@pytest.mark.parametrize(("database", "table", "topic"), [
    ("my db", "orders", "p.my_db.orders"),
    ("inventory", "order/items", "p.inventory.order_items"),
    ("ünï", "t", "p._n_.t"),  # every non-ASCII letter is replaced, not only punctuation
    ("db", "t😀", "p.db.t__"),  # beyond U+FFFF: two UTF-16 code units, two underscores
    ("db", "a.b-c_d", "p.db.a.b-c_d"),  # the valid characters stay, dots included
])
def test_characters_a_topic_cannot_hold_become_underscores(
        database: str, table: str, topic: str) -> None:
    assert topic_name("p", database, table) == topic


def test_blank_parts_are_left_out() -> None:
    assert topic_name("p", " \t", "orders") == "p.orders"
    assert topic_name("p", "db", "") == "p.db"


def test_long_names_are_cut_to_kafkas_limit() -> None:
    topic = topic_name("p", "d" * 200, "t" * 200)
    assert topic == ("p." + "d" * 200 + "." + "t" * 200)[:MAX_TOPIC_LENGTH]
    assert len(topic) == 249


def test_a_name_of_dots_only_becomes_underscores() -> None:
    assert sanitized_topic_name(".") == "_"
    assert sanitized_topic_name("..") == "__"
    assert sanitized_topic_name("...") == "..."


@pytest.mark.parametrize("prefix", ["", "my server", ".", "..", "é", "x" * 250])
def test_an_invalid_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        topic_name(prefix, "db", "t")


def test_schema_names_follow_the_topic_unadjusted() -> None:
    topic = topic_name("my-server", "inventory", "customers")
    assert key_schema_name(topic) == "my-server.inventory.customers.Key"
    assert value_schema_name(topic) == "my-server.inventory.customers.Value"
    assert envelope_schema_name(topic) == "my-server.inventory.customers.Envelope"


@given(PREFIX, st.text(), st.text())
def test_every_topic_is_a_valid_kafka_topic_name(prefix: str, database: str, table: str) -> None:
    topic = topic_name(prefix, database, table)
    assert KAFKA_TOPIC.fullmatch(topic)
    assert len(topic) <= MAX_TOPIC_LENGTH
    assert topic not in (".", "..")
    assert topic.startswith(prefix)


NOT_BLANK = st.text(min_size=1).filter(lambda s: any(ch > " " for ch in s))


@given(PREFIX, NOT_BLANK, NOT_BLANK)
def test_a_name_keeps_its_valid_characters_in_place(prefix: str, database: str,
                                                    table: str) -> None:
    """Each UTF-16 unit maps to one character: the valid ones as they are, the others '_'."""
    joined = f"{prefix}.{database}.{table}"
    units = "".join(ch * (2 if ord(ch) > 0xFFFF else 1) for ch in joined)
    expected = "".join(u if KAFKA_TOPIC.fullmatch(u) else "_" for u in units)
    assert topic_name(prefix, database, table) == expected[:MAX_TOPIC_LENGTH]
