"""Row changes logged as SQL statements: which tables they write (pure parsing).

With ``binlog_format=STATEMENT`` (or MIXED, for statements the server deems safe), and for
the ``DELETE FROM db.t`` MariaDB writes when a MEMORY table comes back empty after a restart,
a row change reaches the binlog as a Query event, not as row events. The engine cannot know
the rows such a statement changed, so one that writes a captured table is a loud stop
(``capture/ddl/effects.py``); this module says whether a statement is such DML and which tables
it writes. Statements whose target it cannot pin down (multi-table UPDATE/DELETE, ``WITH``)
report ``exact=False`` with every database they name, so the engine can err on stopping.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cdc_platform.capture.ddl.parse import may_be_wrapped, statement_tokens

_DML_VERBS = frozenset({"INSERT", "REPLACE", "UPDATE", "DELETE", "LOAD", "WITH"})
_INSERT_MODIFIERS = frozenset({"LOW_PRIORITY", "DELAYED", "HIGH_PRIORITY", "IGNORE", "INTO"})
_DELETE_MODIFIERS = frozenset({"LOW_PRIORITY", "QUICK", "IGNORE"})
# What may follow the table of a single-table DELETE / UPDATE.
_DELETE_TAIL = frozenset({"WHERE", "ORDER", "LIMIT", "RETURNING", "PARTITION", "FOR"})
_FIRST_WORD = re.compile(r"[\w$]+")


@dataclass(frozen=True)
class StatementDml:
    """A statement that changes rows: its verb, the ``(database, table)`` pairs it writes
    (default database filled in), and whether that list is exact. When it is not, ``tables``
    holds every qualified name found (and the default database's), for the engine to decide
    by database."""

    verb: str
    tables: tuple[tuple[str, str], ...]
    exact: bool

    @property
    def databases(self) -> frozenset[str]:
        return frozenset(database for database, _ in self.tables if database)


def parse_statement_dml(query: str, default_db: str) -> StatementDml | None:
    """The tables a DML statement writes, or None when ``query`` is not DML (comments and
    leading whitespace allowed; ``INSERT|REPLACE ... [INTO] t``, ``UPDATE t``, ``DELETE FROM
    t``, ``LOAD DATA|XML ... INTO TABLE t``; multi-table and ``WITH`` forms are inexact)."""
    start = query.lstrip()
    if not may_be_wrapped(start) and not start.startswith("("):
        first = _FIRST_WORD.match(start)
        if first is None or first.group().upper() not in _DML_VERBS:
            return None  # the common case, without tokenizing
    tokens = statement_tokens(query)
    while tokens and tokens[0] == ("punct", "("):
        tokens = tokens[1:]

    def word(at: int) -> str | None:
        if at < len(tokens) and tokens[at][0] == "word":
            return tokens[at][1].upper()
        return None

    def punct(at: int, char: str) -> bool:
        return at < len(tokens) and tokens[at] == ("punct", char)

    def name(at: int) -> tuple[tuple[str, str] | None, int]:
        if at >= len(tokens) or tokens[at][0] == "punct":
            return None, at
        first = tokens[at][1]
        if punct(at + 1, ".") and at + 2 < len(tokens) and tokens[at + 2][0] != "punct":
            return (first, tokens[at + 2][1]), at + 3
        return (default_db, first), at + 1

    def inexact(verb: str) -> StatementDml:
        named = [(default_db, "")]
        for at in range(len(tokens) - 2):
            if tokens[at][0] != "punct" and punct(at + 1, ".") and tokens[at + 2][0] != "punct":
                named.append((tokens[at][1], tokens[at + 2][1]))
        return StatementDml(verb, tuple(dict.fromkeys(named)), exact=False)

    verb = word(0)
    if verb not in _DML_VERBS:
        return None
    if verb == "WITH":
        if not any(word(at) in ("INSERT", "REPLACE", "UPDATE", "DELETE")
                   for at in range(1, len(tokens))):
            return None  # a plain WITH ... SELECT
        found = next(word(at) for at in range(1, len(tokens))
                     if word(at) in ("INSERT", "REPLACE", "UPDATE", "DELETE"))
        return inexact(found or "WITH")
    position = 1
    if verb == "LOAD":
        if word(1) not in ("DATA", "XML"):
            return None
        for at in range(2, len(tokens) - 1):
            if word(at) == "INTO" and word(at + 1) == "TABLE":
                table, _ = name(at + 2)
                if table is not None:
                    return StatementDml("LOAD DATA", (table,), exact=True)
        return inexact("LOAD DATA")
    if verb in ("INSERT", "REPLACE"):
        while word(position) in _INSERT_MODIFIERS:
            position += 1
        table, _ = name(position)
        if table is None:
            return inexact(verb)
        return StatementDml(verb, (table,), exact=True)
    if verb == "UPDATE":
        while word(position) in ("LOW_PRIORITY", "IGNORE"):
            position += 1
        table, position = name(position)
        if table is None:
            return inexact(verb)
        if word(position) == "AS":
            position += 1
        if word(position) not in ("SET", None) and not punct(position, ","):
            position += 1  # an alias
        if word(position) == "SET":
            return StatementDml(verb, (table,), exact=True)
        return inexact(verb)
    # DELETE
    while word(position) in _DELETE_MODIFIERS:
        position += 1
    if word(position) != "FROM":
        return inexact(verb)  # DELETE t1, t2 FROM ...
    table, position = name(position + 1)
    if table is None:
        return inexact(verb)
    if position >= len(tokens) or word(position) in _DELETE_TAIL or punct(position, ";"):
        return StatementDml(verb, (table,), exact=True)
    return inexact(verb)  # DELETE FROM t1, t2 USING ..., aliases, joins
