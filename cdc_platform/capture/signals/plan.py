"""What a batch of signal messages does: pure decisions, executed by the sensor.

For each message in offset order: parse it (``messages.parse_signal``); expand an
execute-snapshot's ``data-collections`` (table names or regular expressions, matched fully
against the captured tables) and validate its additional conditions; and decide:

* ``StartSnapshot`` per table, unless that table is already being snapshotted (a run in
  progress or a live session: ``busy``) or was started earlier in the batch — a duplicate
  signal never starts a parallel snapshot of a table;
* ``ControlSnapshots`` for stop/pause/resume; a stop also cancels the batch's own
  not-yet-launched snapshots of those tables and frees them for a later execute-snapshot;
* ``LogMessage`` for ``log``;
* ``Skipped`` with the reason for anything else (one per bad message, table or condition),
  including a table the snapshot run would refuse (``check``: a surrogate key it cannot use, a
  condition the server rejects; see ``checks``), so a bad signal never launches a run.

Entries of a signal that fail do not stop the others (a signal for three tables with one
unknown starts the two known ones and reports the third), except an additional condition that
names no table of its signal: that skips the whole signal, since running it unfiltered is not
what was asked.

Nothing here raises on message content: the sensor's cursor only moves when its tick returns,
so an exception would make every later tick read the same message and fail again. The regular
expressions in ``data-collections`` are user input run by a backtracking engine, hence
:class:`RegexBudget`; and a message whose planning fails anyway (a bug) becomes a ``Skipped``
naming the exception, while the rest of the batch is planned.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from re import _parser as re_parser  # re's own parser: its syntax, and no unrolling
from typing import Any

import regex

from cdc_platform.capture.names import AmbiguousTableError, resolve_table_id, split_table_id
from cdc_platform.capture.signals.checks import SnapshotCheck
from cdc_platform.capture.signals.messages import (
    EXECUTE_SNAPSHOT,
    LOG,
    Signal,
    SignalMessage,
    Skipped,
    parse_signal,
)
from cdc_platform.capture.snapshot.conditions import Condition, UnsafeConditionError
from cdc_platform.capture.source import TableSelector


@dataclass(frozen=True)
class StartSnapshot:
    table_id: str
    signal: Signal
    condition: Condition | None
    surrogate_key: tuple[str, ...]


@dataclass(frozen=True)
class ControlSnapshots:
    """Stop, pause or resume the snapshots of ``tables`` (all running ones when ``every``)."""

    action: str
    tables: tuple[str, ...]
    every: bool
    signal: Signal


@dataclass(frozen=True)
class LogMessage:
    signal: Signal


Action = StartSnapshot | ControlSnapshots | LogMessage | Skipped

log = logging.getLogger(__name__)

_PLAIN_NAME = re.compile(r"^[\w$]+\.[\w$]+$")

# A table name is at most 64 + 1 + 64 characters: an expression for tables needs far less than
# these. Longer or larger ones are refused before they are compiled (see _compile). Unrolled:
# the length times the largest product of nested counted repeats (regex compiles each copy to
# ~150-300 bytes per character: 100,000 is tens of MB at most).
REGEX_MAX_LENGTH = 1000
REGEX_MAX_UNROLLED = 100_000
REGEX_TIMEOUT_SECONDS = 0.5
REGEX_BATCH_SECONDS = 10.0


@dataclass
class RegexBudget:
    """The time one planning pass may spend matching the regular expressions of signals.

    Each expression gets ``per_expression`` seconds over all the captured tables, and all of
    them together ``in_all`` seconds: a batch of pathological expressions cannot hold the
    sensor's tick past the 60 s Dagster gives it. (The ``regex`` engine gives up at its
    ``timeout`` and releases the GIL while it matches; Python's ``re`` can do neither.)
    """

    per_expression: float = REGEX_TIMEOUT_SECONDS
    in_all: float = REGEX_BATCH_SECONDS
    spent: float = 0.0


class _Refused(Exception):
    """An entry that cannot be matched; the message is the reason for the operator."""


def match_collections(entries: Iterable[str], captured: Sequence[str],
                      selector: TableSelector | None = None,
                      budget: RegexBudget | None = None) -> tuple[list[str], list[str]]:
    """Captured tables matching ``entries`` (in captured order), and one problem per entry
    that matches none, is not a valid regular expression (Python ``re`` syntax) or is too
    costly to match within ``budget``."""
    budget = budget if budget is not None else RegexBudget()
    matched: dict[str, None] = {}
    problems: list[str] = []
    for entry in entries:
        try:  # a table id, a backtick-quoted or a plain db.table naming one captured table
            named = resolve_table_id(entry, captured)
        except AmbiguousTableError as error:
            problems.append(str(error))
            continue
        if named is not None:
            matched[named] = None
            continue
        try:
            found = _fullmatches(_compile(entry), entry, captured, budget)
        except _Refused as refused:
            problems.append(str(refused))
            continue
        if found:
            matched.update(dict.fromkeys(found))
        elif _PLAIN_NAME.match(entry) and selector is not None and \
                not selector.captures(*split_table_id(entry)):
            problems.append(f"{entry} is not captured (excluded by capture.tables or a system "
                            "database): only captured tables can be snapshotted")
        else:
            problems.append(f"{entry!r} matches no captured table (names are database.table; "
                            "a table created since the code location loaded appears after a "
                            "reload)")
    return [t for t in captured if t in matched], problems


def _shown(entry: str) -> str:
    return repr(entry) if len(entry) <= 100 else repr(entry[:100]) + f"... ({len(entry):,} chars)"


def _compile(entry: str) -> Any:
    """``entry`` compiled by ``regex``, after ``re``'s parser accepted it (so the syntax stays
    Python's) and its size was checked: ``regex`` unrolls counted repeats when it compiles, so
    ``(?:a{65535}){65535}`` would exhaust memory and ``(?:(a)|b){1000000}`` crashes the
    process (regex 2026.11.15)."""
    if len(entry) > REGEX_MAX_LENGTH:
        raise _Refused(f"{_shown(entry)} is {len(entry):,} characters long: a table name or "
                       f"regular expression may have at most {REGEX_MAX_LENGTH:,}; list the "
                       "tables as separate entries instead")
    invalid = f"{_shown(entry)} is neither a captured table nor a valid regular expression"
    try:
        unrolled = len(entry) * _repeat_factor(re_parser.parse(entry))
    except Exception as error:  # re.error, OverflowError, RecursionError, ...
        raise _Refused(f"{invalid} ({_error_text(error)})") from error
    if unrolled > REGEX_MAX_UNROLLED:
        raise _Refused(f"regular expression {_shown(entry)} is too large once its counted "
                       f"repeats are unrolled (over {REGEX_MAX_UNROLLED:,} characters; a table "
                       "name has at most 129): use * or + instead of large {n} counts")
    try:
        # Not kept in regex's cache of 500 patterns: user input, megabytes each at worst.
        return regex.compile(entry, cache_pattern=False)
    except Exception as error:  # regex.error, RecursionError, ...
        raise _Refused(f"{invalid} ({_error_text(error)})") from error


_REPEATS = {re_parser.MAX_REPEAT, re_parser.MIN_REPEAT, re_parser.POSSESSIVE_REPEAT}


def _repeat_factor(pattern: Any) -> int:
    """The largest product of counted repeats nested in ``pattern`` (re's parse tree; an
    unbounded repeat counts its minimum): how many times ``regex`` may copy a part of it."""
    factor = 1
    for op, argument in pattern:
        if op in _REPEATS:
            low, high, item = argument
            times = high if high != re_parser.MAXREPEAT else max(low, 1)
            factor = max(factor, times * _repeat_factor(item))
        else:
            factor = max([factor, *(_repeat_factor(p) for p in _subpatterns(argument))])
        if factor > REGEX_MAX_UNROLLED:
            return factor
    return factor


def _subpatterns(argument: Any) -> Iterable[Any]:
    if isinstance(argument, re_parser.SubPattern):
        yield argument
    elif isinstance(argument, tuple | list):
        for part in argument:
            yield from _subpatterns(part)


def _error_text(error: Exception) -> str:
    if isinstance(error, RecursionError):
        return "nested too deeply"
    if isinstance(error, re.error | regex.error):
        return str(error)
    return f"{type(error).__name__}: {error}"


def _fullmatches(pattern: Any, entry: str, captured: Sequence[str],
                 budget: RegexBudget) -> list[str]:
    left = budget.in_all - budget.spent
    if left <= 0:
        raise _Refused(f"regular expression {_shown(entry)} not tried: the signals of this "
                       f"tick already took {budget.in_all:g} s matching regular expressions; "
                       "send it again with simpler expressions or table names")
    limit = min(budget.per_expression, left)
    started = time.monotonic()
    found: list[str] = []
    try:
        for table in captured:
            remaining = limit - (time.monotonic() - started)
            if remaining <= 0:
                raise TimeoutError
            if pattern.fullmatch(table, timeout=remaining):
                found.append(table)
    except TimeoutError:
        if limit < budget.per_expression:
            raise _Refused(f"regular expression {_shown(entry)} not finished: the signals of "
                           f"this tick took {budget.in_all:g} s matching regular expressions; "
                           "send it again with simpler expressions or table names") from None
        raise _Refused(f"regular expression {_shown(entry)} took longer than "
                       f"{budget.per_expression:g} s to match the captured tables; simplify it "
                       "(nested repeats such as (a|.)* backtrack exponentially) or list the "
                       "tables by name") from None
    finally:
        budget.spent += time.monotonic() - started
    return found


def plan_signals(messages: Sequence[SignalMessage], *, server_name: str, topic: str,
                 captured: Sequence[str], selector: TableSelector | None = None,
                 busy: Mapping[str, str] | None = None,
                 max_message_bytes: int | None = None,
                 regex_budget: RegexBudget | None = None,
                 check: SnapshotCheck | None = None) -> list[Action]:
    """The actions for ``messages`` (in offset order). ``busy``: table -> what is already
    snapshotting it (for the duplicate check); ``check``: why a snapshot run would refuse a
    table it is asked to start, or None. Never raises on message content."""
    busy = dict(busy or {})
    budget = regex_budget if regex_budget is not None else RegexBudget()
    kwargs = {} if max_message_bytes is None else {"max_bytes": max_message_bytes}
    actions: list[Action] = []
    for message in sorted(messages, key=lambda m: m.offset):
        signal: Signal | Skipped | None = None
        try:
            signal = parse_signal(message, server_name, topic, **kwargs)
            if isinstance(signal, Skipped):
                actions.append(signal)
            elif signal.type == EXECUTE_SNAPSHOT:
                actions += _execute(signal, captured, selector, busy, actions, budget, check)
            elif signal.type == LOG:
                actions.append(LogMessage(signal))
            else:
                actions += _control(signal, captured, selector, busy, actions, budget)
        except Exception as error:  # a bug: it must not stop the tick or the cursor
            log.exception(f"planning the signal message at offset {message.offset} of "
                          f"{topic!r} failed")
            actions.append(Skipped(
                message.offset, f"planning it failed with {type(error).__name__}: "
                f"{str(error)[:200]} (a bug in cdc_platform: report it with the message; the "
                "message is skipped, the others are planned)",
                signal.id if isinstance(signal, Signal) else ""))
    return actions


def _execute(signal: Signal, captured: Sequence[str], selector: TableSelector | None,
             busy: dict[str, str], earlier: list[Action], budget: RegexBudget,
             check: SnapshotCheck | None = None) -> list[Action]:
    tables, problems = match_collections(signal.data_collections, captured, selector, budget)
    out: list[Action] = [Skipped(signal.offset, p, signal.id) for p in problems]
    if not tables:
        if not problems:
            out.append(Skipped(signal.offset, "no table to snapshot", signal.id))
        return out
    conditions: dict[str, Condition] = {}
    refused: dict[str, str] = {}
    for collection, text in signal.additional_conditions:
        targets = [collection] if collection in tables else match_collections(
            [collection], tables, budget=budget)[0]
        if not targets:
            return out + [Skipped(
                signal.offset, f"additional condition for {_shown(collection)} names no table of "
                f"this signal ({', '.join(tables)}); nothing started: fix the signal and send "
                "it again", signal.id, tables=tuple(tables))]
        try:
            condition = Condition(text)  # where a signal's text enters: checked once
        except UnsafeConditionError as error:
            for table in targets:
                refused[table] = f"additional condition for {table} refused: {error}"
            continue
        for table in targets:
            if table in conditions and conditions[table] != condition:
                refused[table] = (f"two additional conditions for {table}; combine them with "
                                  "AND into one")
            conditions[table] = condition
    started_here = {a.table_id: a.signal for a in earlier if isinstance(a, StartSnapshot)}
    for table in tables:
        if table in refused:
            out.append(Skipped(signal.offset, refused[table], signal.id, tables=(table,)))
        elif table in started_here:
            out.append(Skipped(
                signal.offset, f"{table} is already being snapshotted by "
                f"{started_here[table].describe()} in this batch (a duplicate signal)",
                signal.id, tables=(table,)))
        elif table in busy:
            out.append(Skipped(
                signal.offset, f"{table} is already being snapshotted ({busy[table]}); a "
                "duplicate signal does not start a parallel snapshot: send stop-snapshot "
                "first to start over", signal.id, tables=(table,)))
        elif check is not None and (problem := check(table, signal.surrogate_key,
                                                     conditions.get(table))) is not None:
            out.append(Skipped(signal.offset, f"{table}: the snapshot run would refuse it: "
                               f"{problem}; nothing started for it: fix the signal and send it "
                               "again", signal.id, tables=(table,)))
        else:
            out.append(StartSnapshot(table, signal, conditions.get(table),
                                     signal.surrogate_key))
    return out


def _control(signal: Signal, captured: Sequence[str], selector: TableSelector | None,
             busy: dict[str, str], earlier: list[Action], budget: RegexBudget
             ) -> list[Action]:
    every = not signal.data_collections
    out: list[Action] = []
    if every:
        tables = list(captured)
    else:
        tables, problems = match_collections(signal.data_collections, captured, selector,
                                             budget)
        out += [Skipped(signal.offset, p, signal.id) for p in problems]
        if not tables:
            return out
    if signal.action == "stop":
        # Snapshots this batch would start and the stop now cancels: drop them here.
        for index, action in enumerate(earlier):
            if isinstance(action, StartSnapshot) and action.table_id in tables:
                earlier[index] = Skipped(
                    action.signal.offset, f"{action.table_id}: cancelled by "
                    f"{signal.describe()} before it started", action.signal.id,
                    tables=(action.table_id,))
        for table in tables:
            busy.pop(table, None)
    out.append(ControlSnapshots(signal.action, tuple(tables), every, signal))
    return out
