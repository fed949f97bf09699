"""The interval algebra of range assertions and sweeps: which keys an instruction judges, and
by which threshold. Pure functions of the instructions (no Spark), so they are property-tested
against a key-by-key model (cdc_platform_tests/lake/test_range_assertions.py); ``lake.verdicts``
applies their result, in Spark and in Arrow.

A range assertion (``a``) at position P with threshold T over ``(low, high]`` says: a key in
that range whose latest record is below T does not exist at P; a sweep (``s``) says the same of
every key (docs/landing-zone.md, "Snapshot records"). Keys compare by ``capture.keys.key_order``
(lexicographic, NULL first), as the chunk reader read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cdc_platform.capture.keys import Key, key_order

Verdict = tuple[int, int]  # (threshold, position of the instruction that sets it)
# A key interval ``(previous upper, upper]`` and its verdict; the last upper is None (no end).
Interval = tuple[Key | None, Verdict | None]
# A span of covered keys: ``(low, high]``, None for an open end.
Span = tuple[Key | None, Key | None]


@dataclass(frozen=True)
class Instruction:
    """One ``a`` or ``s`` record: delete keys in ``(low, high]`` whose latest position is below
    ``threshold`` (``None`` bounds are open; a sweep has both open)."""

    pos: int
    threshold: int
    low: Key | None
    high: Key | None

    def covers(self, key: Key) -> bool:
        """Whether ``key`` lies in ``(low, high]``."""
        order = key_order(key)
        return ((self.low is None or key_order(self.low) < order)
                and (self.high is None or order <= key_order(self.high)))


def intervals(instructions: Sequence[Instruction]) -> list[Interval]:
    """The key space cut at every bound into ``(previous upper, upper]`` intervals, in order,
    each with the highest (threshold, position) of the instructions covering it (None: none).

    Every bound is a low (exclusive) or high (inclusive) end, so each instruction covers whole
    intervals. The last upper is None (to the last key); neighbours with equal verdicts merge.
    """
    bounds: dict[tuple, Key] = {}
    for ins in instructions:
        for bound in (ins.low, ins.high):
            if bound is not None:
                bounds.setdefault(key_order(bound), bound)
    ordered = sorted(bounds)
    index = {o: i for i, o in enumerate(ordered)}
    verdicts: list[Verdict | None] = [None] * (len(ordered) + 1)
    for ins in instructions:
        first = 0 if ins.low is None else index[key_order(ins.low)] + 1
        last = len(ordered) if ins.high is None else index[key_order(ins.high)]
        for j in range(first, last + 1):  # empty when low >= high
            current = verdicts[j]
            if current is None or (ins.threshold, ins.pos) > current:
                verdicts[j] = (ins.threshold, ins.pos)
    uppers: list[Key | None] = [bounds[o] for o in ordered] + [None]
    merged: list[Interval] = []
    for upper, verdict in zip(uppers, verdicts, strict=True):
        if merged and merged[-1][1] == verdict:
            merged[-1] = (upper, verdict)
        else:
            merged.append((upper, verdict))
    return merged


def covered_spans(cut: Sequence[Interval], limit: int) -> list[Span]:
    """The runs of ``intervals`` that have a verdict, as ``(low, high]`` spans in key order;
    more than ``limit`` of them become their hull (one span: a filter the table scan can
    push down stays short, and keys between the spans are judged ``None`` anyway)."""
    spans: list[Span] = []
    previous_upper: Key | None = None
    running = False
    for j, (upper, verdict) in enumerate(cut):
        if verdict is not None and not running:
            spans.append((previous_upper if j else None, upper))
            running = True
        elif verdict is not None:
            spans[-1] = (spans[-1][0], upper)
        else:
            running = False
        previous_upper = upper
    if len(spans) > limit:
        spans = [(spans[0][0], spans[-1][1])]
    return spans


@dataclass(frozen=True)
class Split:
    """A node of the verdict search tree: keys ``<= upper`` go ``below``, the others
    ``above``; a leaf is an interval's verdict."""

    upper: Key
    below: Split | Verdict | None
    above: Split | Verdict | None


def verdict_tree(cut: Sequence[Interval]) -> Split | Verdict | None:
    """A balanced tree of ``key <= upper`` tests over the intervals, so a key is judged
    with about log2(intervals) comparisons however many instructions the batch holds
    (``lake.verdicts`` renders it as nested ``CASE WHEN``)."""

    def build(lo: int, hi: int) -> Split | Verdict | None:
        if lo == hi:
            return cut[lo][1]
        mid = (lo + hi) // 2
        upper = cut[mid][0]
        assert upper is not None  # only the last interval is open above
        return Split(upper, build(lo, mid), build(mid + 1, hi))

    return build(0, len(cut) - 1)


def verdict_of(tree: Split | Verdict | None, key: Key) -> Verdict | None:
    """The verdict ``tree`` finds for ``key``: its interval's."""
    order = key_order(key)
    while isinstance(tree, Split):
        tree = tree.below if order <= key_order(tree.upper) else tree.above
    return tree


def tombstone_position(verdict: Verdict | None, latest_pos: int) -> int | None:
    """The position of the delete a key gets, given its interval's verdict and its latest
    record's position: the instruction's, when the key is older than the threshold."""
    if verdict is None:
        return None
    threshold, pos = verdict
    return pos if latest_pos < threshold else None
