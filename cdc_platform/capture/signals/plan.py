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
* ``Skipped`` with the reason for anything else (one per bad message, table or condition).

Entries of a signal that fail do not stop the others (a signal for three tables with one
unknown starts the two known ones and reports the third), except an additional condition that
names no table of its signal: that skips the whole signal, since running it unfiltered is not
what was asked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cdc_platform.capture.signals.messages import (
    EXECUTE_SNAPSHOT,
    LOG,
    Signal,
    SignalMessage,
    Skipped,
    parse_signal,
)
from cdc_platform.capture.snapshot.conditions import UnsafeConditionError, validate_condition
from cdc_platform.capture.source import TableSelector


@dataclass(frozen=True)
class StartSnapshot:
    table_id: str
    signal: Signal
    condition: str | None
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

_PLAIN_NAME = re.compile(r"^[\w$]+\.[\w$]+$")


def match_collections(entries: Iterable[str], captured: Sequence[str],
                      selector: TableSelector | None = None
                      ) -> tuple[list[str], list[str]]:
    """Captured tables matching ``entries`` (in captured order), and one problem per entry
    that matches none (or is not a valid regular expression)."""
    matched: dict[str, None] = {}
    problems: list[str] = []
    for entry in entries:
        if entry in captured:
            matched[entry] = None
            continue
        try:
            pattern = re.compile(entry)
        except re.error as error:
            problems.append(f"{entry!r} is neither a captured table nor a valid regular "
                            f"expression ({error})")
            continue
        found = [t for t in captured if pattern.fullmatch(t)]
        if found:
            matched.update(dict.fromkeys(found))
        elif _PLAIN_NAME.match(entry) and selector is not None and \
                not selector.captures(*entry.split(".", 1)):
            problems.append(f"{entry} is not captured (excluded by capture.tables or a system "
                            "database): only captured tables can be snapshotted")
        else:
            problems.append(f"{entry!r} matches no captured table (names are database.table; "
                            "a table created since the code location loaded appears after a "
                            "reload)")
    return [t for t in captured if t in matched], problems


def plan_signals(messages: Sequence[SignalMessage], *, server_name: str, topic: str,
                 captured: Sequence[str], selector: TableSelector | None = None,
                 busy: Mapping[str, str] | None = None,
                 max_message_bytes: int | None = None) -> list[Action]:
    """The actions for ``messages`` (in offset order). ``busy``: table -> what is already
    snapshotting it (for the duplicate check)."""
    busy = dict(busy or {})
    actions: list[Action] = []
    for message in sorted(messages, key=lambda m: m.offset):
        kwargs = {} if max_message_bytes is None else {"max_bytes": max_message_bytes}
        signal = parse_signal(message, server_name, topic, **kwargs)
        if isinstance(signal, Skipped):
            actions.append(signal)
        elif signal.type == EXECUTE_SNAPSHOT:
            actions += _execute(signal, captured, selector, busy, actions)
        elif signal.type == LOG:
            actions.append(LogMessage(signal))
        else:
            actions += _control(signal, captured, selector, busy, actions)
    return actions


def _execute(signal: Signal, captured: Sequence[str], selector: TableSelector | None,
             busy: dict[str, str], earlier: list[Action]) -> list[Action]:
    tables, problems = match_collections(signal.data_collections, captured, selector)
    out: list[Action] = [Skipped(signal.offset, p, signal.id) for p in problems]
    if not tables:
        if not problems:
            out.append(Skipped(signal.offset, "no table to snapshot", signal.id))
        return out
    conditions: dict[str, str] = {}
    refused: dict[str, str] = {}
    for collection, text in signal.additional_conditions:
        targets = [collection] if collection in tables else match_collections(
            [collection], tables)[0]
        if not targets:
            return out + [Skipped(
                signal.offset, f"additional condition for {collection!r} names no table of "
                f"this signal ({', '.join(tables)}); nothing started: fix the signal and send "
                "it again", signal.id, tables=tuple(tables))]
        try:
            condition = validate_condition(text)
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
        else:
            out.append(StartSnapshot(table, signal, conditions.get(table),
                                     signal.surrogate_key))
    return out


def _control(signal: Signal, captured: Sequence[str], selector: TableSelector | None,
             busy: dict[str, str], earlier: list[Action]) -> list[Action]:
    every = not signal.data_collections
    out: list[Action] = []
    if every:
        tables = list(captured)
    else:
        tables, problems = match_collections(signal.data_collections, captured, selector)
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
