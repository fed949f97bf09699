"""Key order: the one the snapshot reader reads in, the lake applies ranges in and reconciliation
cuts checksum ranges in (``capture.keys``) is the source's ``ORDER BY``, NULL parts first."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_platform.capture.keys import Key, key_order
from cdc_platform.devservices.mariadb import MariaDBServer

_part = st.one_of(st.none(), st.integers(-50, 50))


def _source_compare(a: Key, b: Key) -> int:
    """``ORDER BY k1, k2, ... ASC`` as MySQL and MariaDB define it: part by part, a NULL part
    below every value, two NULL parts equal."""
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        if x is None:
            return -1
        if y is None:
            return 1
        return -1 if x < y else 1
    return 0


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3).flatmap(
    lambda width: st.lists(st.tuples(*[_part] * width), max_size=40)))
def test_key_order_is_the_source_order_with_null_first(keys: list[Key]) -> None:
    expected = sorted(keys, key=functools.cmp_to_key(_source_compare))
    assert sorted(keys, key=key_order) == expected
    for a, b in zip(keys, keys[1:], strict=False):
        compared = _source_compare(a, b)
        assert (key_order(a) < key_order(b)) is (compared < 0)
        assert (key_order(a) == key_order(b)) is (compared == 0)


@pytest.mark.integration
def test_key_order_matches_mariadb_order_by(mariadb: MariaDBServer) -> None:
    """The real server, on a nullable two-part key (as a surrogate key may be)."""
    rows: list[tuple[Any, ...]] = [(a, b) for a in (None, -3, 0, 7) for b in (None, -1, 2)]
    with mariadb.root_connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS key_order_test")
        cur.execute("CREATE OR REPLACE TABLE key_order_test.k (a INT NULL, b INT NULL)")
        cur.executemany("INSERT INTO key_order_test.k VALUES (%s, %s)", list(reversed(rows)))
        cur.execute("SELECT a, b FROM key_order_test.k ORDER BY a, b")
        at_source = [tuple(row) for row in cur.fetchall()]
        cur.execute("DROP DATABASE key_order_test")
    assert at_source == sorted(rows, key=key_order)
    assert at_source[0] == (None, None)
