"""The interval algebra of range assertions and sweeps (``lake.range_assertions``), property
tested against the key-by-key rule it implements: a key's tombstone comes from the highest
(threshold, position) of the instructions whose ``(low, high]`` covers it. No Spark."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_platform.capture.keys import key_order
from cdc_platform.lake.range_assertions import (
    Instruction,
    covered_spans,
    intervals,
    tombstone_position,
    verdict_of,
    verdict_tree,
)

# Composite keys of two small parts, NULL parts included (NULL sorts first).
part = st.one_of(st.none(), st.integers(-3, 3))
keys = st.tuples(part, part)
bounds = st.one_of(st.none(), keys)


@st.composite
def instructions(draw) -> Instruction:
    pos = draw(st.integers(1, 50))
    threshold = draw(st.integers(1, pos))
    if draw(st.booleans()):  # a sweep
        return Instruction(pos, threshold, None, None)
    return Instruction(pos, threshold, draw(bounds), draw(bounds))


batches = st.lists(instructions(), max_size=8)


def model(batch: list[Instruction], key: tuple) -> tuple[int, int] | None:
    """The rule, key by key."""
    covering = [(i.threshold, i.pos) for i in batch if i.covers(key)]
    return max(covering) if covering else None


@settings(max_examples=300, deadline=None)
@given(batches, st.lists(keys, min_size=1, max_size=20))
def test_every_key_gets_the_verdict_of_the_instructions_covering_it(batch, probes):
    cut = intervals(batch)
    tree = verdict_tree(cut)
    for key in probes + [b for i in batch for b in (i.low, i.high) if b is not None]:
        assert verdict_of(tree, key) == model(batch, key)


@settings(max_examples=300, deadline=None)
@given(batches)
def test_intervals_are_ordered_and_neighbours_differ(batch):
    cut = intervals(batch)
    uppers = [upper for upper, _ in cut]
    assert uppers[-1] is None and None not in uppers[:-1]
    orders = [key_order(u) for u in uppers[:-1]]
    assert orders == sorted(set(orders))
    assert all(a[1] != b[1] for a, b in zip(cut, cut[1:], strict=False))
    if not batch:
        assert cut == [(None, None)]


def _in_span(span: tuple, key: tuple) -> bool:
    low, high = span
    return ((low is None or key_order(low) < key_order(key))
            and (high is None or key_order(key) <= key_order(high)))


@settings(max_examples=300, deadline=None)
@given(batches, st.lists(keys, min_size=1, max_size=20), st.integers(1, 4))
def test_spans_cover_exactly_the_judged_keys_or_their_hull(batch, probes, limit):
    cut = intervals(batch)
    exact = covered_spans(cut, limit=len(cut) + 1)
    spans = covered_spans(cut, limit)
    for key in probes:
        judged = model(batch, key) is not None
        assert any(_in_span(s, key) for s in exact) == judged
        if judged:  # the filter never drops a key the instructions judge
            assert any(_in_span(s, key) for s in spans)
    assert len(spans) <= limit or len(spans) == 1
    for (_, high), (low, _) in zip(exact, exact[1:], strict=False):  # disjoint, in order
        assert high is not None and low is not None
        assert key_order(high) < key_order(low)


@given(st.integers(1, 20), st.integers(1, 20), st.integers(0, 25))
def test_a_key_older_than_the_threshold_gets_the_instructions_position(threshold, pos,
                                                                       latest):
    assert tombstone_position(None, latest) is None
    expected = pos if latest < threshold else None
    assert tombstone_position((threshold, pos), latest) == expected
