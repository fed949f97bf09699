"""Which tables a DDL statement changes, from its text in the binlog (pure parsing).

The engine ends the snapshot session of every table a DDL changes (docs/snapshots.md): a DDL
can change rows without row events. Naming a table too many only costs that table's snapshot
a restart; missing one would let a snapshot go wrong, so the parser errs on listing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

# Tokens of a statement: comments and whitespace (skipped), the opening of an executable
# comment (``/*!50001``, ``/*M!100100``: the server runs its text), the closing ``*/`` of one,
# quoted identifiers, string literals (skipped), words, and single punctuation characters.
_TOKEN = re.compile(
    r"(?P<executable>/\*M?!\d*)"
    r"|(?P<skip>\s+|/\*.*?(?:\*/|$)|--(?:[ \t][^\n]*)?(?:\n|$)|\#[^\n]*)"
    r"|(?P<close>\*/)"
    r"|(?P<quoted>`(?:[^`]|``)*`)"
    r"|(?P<string>'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\")"
    r"|(?P<word>[\w$]+)"
    r"|(?P<punct>.)",
    re.DOTALL,
)
_TABLE_DDL_VERBS = ("ALTER", "CREATE", "DROP", "RENAME", "TRUNCATE")
# Words between the verb and TABLE (ALTER ONLINE IGNORE TABLE, CREATE OR REPLACE TEMPORARY
# TABLE, DROP TEMPORARY TABLE).
_TABLE_DDL_MODIFIERS = frozenset({"ONLINE", "OFFLINE", "IGNORE", "TEMPORARY", "OR", "REPLACE"})
# What a statement that may be a table DDL starts with: a verb, a comment (executable or
# not) before it, or MariaDB's ``SET STATEMENT var=value FOR`` prefix.
_COMMENT_STARTS = ("/", "-", "#")
_PREFIXED_STARTS = ("SET",)


@dataclass(frozen=True)
class TableDdl:
    """A DDL statement and every table it names: ``(database, table)`` pairs, the default
    database filled in; for a RENAME both sides of each pair (the old name's table is gone,
    the new name's table changed), for an ALTER also the new name of a RENAME TO and the other
    table of a partition exchange or conversion."""

    verb: str  # ALTER | CREATE | DROP | RENAME | TRUNCATE
    tables: tuple[tuple[str, str], ...]
    # (old, new) of each rename, in statement order (RENAME TABLE, ALTER TABLE .. RENAME TO).
    renames: tuple[tuple[tuple[str, str], tuple[str, str]], ...] = field(default=(),
                                                                         compare=False)
    # The statement and its default database, for what it does to rows (capture.ddl.stale).
    query: str = field(default="", compare=False)
    default_db: str = field(default="", compare=False)


def statement_tokens(query: str) -> list[tuple[str, str]]:
    """(kind, text) tokens of the statement the server ran for ``query``: ``word`` (as
    written), ``name`` (a quoted identifier, unquoted) or ``punct``.

    Comments, whitespace and string literals are dropped. What the server runs although it
    is not the statement proper is unwrapped, so that every parser of binlog statements sees
    the statement itself: the text of executable comments (``/*!50001 ... */``, MariaDB's
    ``/*M!100100 ... */``, which dump and migration tools write) is kept, their markers
    dropped; MariaDB's ``SET STATEMENT var=value[, ...] FOR`` prefixes (DBAs and online
    schema tools wrap DDL in them for lock and statement timeouts) are removed. A versioned
    comment is kept whatever its version: reading a statement the server skipped as run
    costs at most a needless re-snapshot, the other way round a silently stale target.
    """
    out: list[tuple[str, str]] = []
    executable = False
    for match in _TOKEN.finditer(query):
        kind = match.lastgroup
        text = match.group()
        if kind == "word":
            out.append(("word", text))
        elif kind == "quoted":
            out.append(("name", text[1:-1].replace("``", "`")))
        elif kind == "punct":
            out.append(("punct", text))
        elif kind == "executable":
            executable = True
        elif kind == "close":
            if executable:
                executable = False
            else:
                out += [("punct", "*"), ("punct", "/")]
    return _without_set_statement(out)


def _without_set_statement(tokens: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``tokens`` without leading ``SET STATEMENT ... FOR`` prefixes (MariaDB): the variable
    assignments end at the first ``FOR`` outside parentheses."""
    while (len(tokens) > 2 and tokens[0][0] == "word" and tokens[0][1].upper() == "SET"
           and tokens[1][0] == "word" and tokens[1][1].upper() == "STATEMENT"):
        depth = 0
        for at in range(2, len(tokens)):
            kind, text = tokens[at]
            if (kind, text) == ("punct", "("):
                depth += 1
            elif (kind, text) == ("punct", ")"):
                depth = max(0, depth - 1)
            elif depth == 0 and kind == "word" and text.upper() == "FOR":
                tokens = tokens[at + 1:]
                break
        else:
            return tokens  # not a prefix after all: no FOR
    return tokens


def may_be_wrapped(start: str) -> bool:
    """Whether a statement starting with ``start`` (stripped) may hide another statement
    behind a comment or a ``SET STATEMENT`` prefix: the fast paths tokenize only then."""
    return start.startswith(_COMMENT_STARTS) or start[:3].upper().startswith(_PREFIXED_STARTS)


Token = tuple[str, str]


def word_of(token: Token | None) -> str | None:
    """A word token's text in upper case (keywords); None for names, punctuation, nothing."""
    return token[1].upper() if token is not None and token[0] == "word" else None


def token_at(tokens: Sequence[Token], index: int) -> Token | None:
    return tokens[index] if 0 <= index < len(tokens) else None


def name_at(tokens: Sequence[Token], index: int) -> str:
    """The identifier (word or quoted name) at ``index``, as written; ``?`` past the end."""
    token = token_at(tokens, index)
    return token[1] if token is not None else "?"


def split_top_level(tokens: Sequence[Token]) -> list[list[Token]]:
    """``tokens`` split at commas outside parentheses."""
    parts: list[list[Token]] = [[]]
    depth = 0
    for token in tokens:
        if token == ("punct", "("):
            depth += 1
        elif token == ("punct", ")"):
            depth = max(0, depth - 1)
        elif token == ("punct", ",") and depth == 0:
            parts.append([])
            continue
        parts[-1].append(token)
    return [p for p in parts if p]


def alter_clauses(tokens: Sequence[Token]) -> list[list[Token]]:
    """The clauses of an ALTER TABLE statement's tokens (after the table name), in statement
    order; a lone name after a comma continues the clause before (``DROP PARTITION p1, p2``).
    """
    position = 1
    while word_of(token_at(tokens, position)) in ("ONLINE", "OFFLINE", "IGNORE"):
        position += 1
    position += 1  # TABLE
    if word_of(token_at(tokens, position)) == "IF":
        position += 2
    position += 3 if token_at(tokens, position + 1) == ("punct", ".") else 1
    if word_of(token_at(tokens, position)) == "NOWAIT":
        position += 1
    elif word_of(token_at(tokens, position)) == "WAIT":
        position += 2
    specs: list[list[Token]] = []
    for part in split_top_level(tokens[position:]):
        if specs and len(part) == 1 and part[0][0] in ("word", "name") and (
                word_of(part[0]) not in {"FORCE"}):
            specs[-1] = specs[-1] + [("punct", ","), *part]
        else:
            specs.append(part)
    return specs


# DROP <word> clauses of an ALTER TABLE that drop something other than a column.
_DROPS_OTHER_THAN_COLUMNS = frozenset({"INDEX", "KEY", "FOREIGN", "CONSTRAINT", "CHECK",
                                       "PRIMARY", "PARTITION", "SYSTEM", "PERIOD"})


def dropped_column(clause: Sequence[Token]) -> str | None:
    """The column an ALTER TABLE clause drops (``DROP [COLUMN] [IF EXISTS] c``), as written;
    None for any other clause (``DROP INDEX``, ``DROP PRIMARY KEY``, ``DROP PARTITION``...)."""
    if word_of(token_at(clause, 0)) != "DROP":
        return None
    what = word_of(token_at(clause, 1))
    if what in _DROPS_OTHER_THAN_COLUMNS:
        return None
    position = 2 if what == "COLUMN" else 1
    if word_of(token_at(clause, position)) == "IF":  # IF EXISTS
        position += 2
    column = name_at(clause, position)
    return None if column == "?" else column


def parse_table_ddl(query: str, default_db: str) -> TableDdl | None:
    """The tables a DDL statement changes, or None when it is not a table DDL.

    Covers ``ALTER | CREATE | DROP | RENAME TABLE`` and ``TRUNCATE [TABLE]``, with comments
    anywhere (the server appends ``/* generated by server */`` to DROPs it writes), backquoted
    or bare names, database qualifiers, and every table of ``DROP TABLE a, b`` and of
    ``RENAME TABLE a TO b, c TO d``. An ALTER also names the table after every ``TABLE``
    keyword in it: ``EXCHANGE PARTITION p WITH TABLE u`` and MariaDB's ``CONVERT PARTITION p
    TO TABLE u`` / ``CONVERT TABLE u TO PARTITION p`` change ``u``'s rows without row events.
    A table the statement only reads (``CREATE TABLE t LIKE s``) is not listed. Naming a table
    too many (a RENAME word inside an ALTER's option) only costs that table's snapshot a
    restart; missing one would let a snapshot go wrong.
    """
    start = query.lstrip()
    if not may_be_wrapped(start) and not start[:8].upper().startswith(_TABLE_DDL_VERBS):
        return None  # the common case, without tokenizing
    tokens = statement_tokens(query)

    def word(at: int) -> str | None:
        if at < len(tokens) and tokens[at][0] == "word":
            return tokens[at][1].upper()
        return None

    verb = word(0)
    if verb not in _TABLE_DDL_VERBS:
        return None
    position = 1
    if verb == "TRUNCATE":
        if word(position) == "TABLE":
            position += 1
    else:
        while word(position) in _TABLE_DDL_MODIFIERS:
            position += 1
        if word(position) not in ("TABLE", "TABLES"):
            return None
        position += 1
    if word(position) == "IF":
        position += 1
        if word(position) == "NOT":
            position += 1
        if word(position) != "EXISTS":
            return None
        position += 1

    def name(at: int) -> tuple[tuple[str, str] | None, int]:
        """A possibly qualified table name at ``at``, and the position after it."""
        if at >= len(tokens) or tokens[at][0] == "punct":
            return None, at
        first = tokens[at][1]
        if at + 2 < len(tokens) and tokens[at + 1] == ("punct", ".") and (
                tokens[at + 2][0] != "punct"):
            return (first, tokens[at + 2][1]), at + 3
        return (default_db, first), at + 1

    def punct(at: int, char: str) -> bool:
        return at < len(tokens) and tokens[at] == ("punct", char)

    def skip_wait(at: int) -> int:
        """MariaDB's ``WAIT n`` / ``NOWAIT`` after a name."""
        if word(at) == "NOWAIT":
            return at + 1
        if word(at) == "WAIT":
            return at + 2
        return at

    tables: list[tuple[str, str]] = []
    renames: list[tuple[tuple[str, str], tuple[str, str]]] = []
    if verb == "DROP":
        while True:
            table, position = name(position)
            if table is None:
                break
            tables.append(table)
            if not punct(position, ","):
                break
            position += 1
    elif verb == "RENAME":
        while True:
            old, position = name(position)
            position = skip_wait(position)
            if old is None or word(position) != "TO":
                break
            new, position = name(position + 1)
            if new is None:
                break
            tables += [old, new]
            renames.append((old, new))
            if not punct(position, ","):
                break
            position += 1
    else:
        table, position = name(position)
        if table is None:
            return None
        tables.append(table)
        if verb == "ALTER":
            # The other tables an ALTER changes: the new name of RENAME [TO | AS] u (not
            # RENAME COLUMN / INDEX / KEY), and the table after every TABLE keyword (EXCHANGE
            # PARTITION p WITH TABLE u, CONVERT PARTITION p TO TABLE u, CONVERT TABLE u TO
            # PARTITION p). A quoted `table` is a name token, never the keyword.
            for at in range(position, len(tokens)):
                if word(at) == "TABLE":
                    target = at + 1
                elif word(at) == "RENAME" and word(at + 1) not in ("COLUMN", "INDEX", "KEY"):
                    target = at + 2 if word(at + 1) in ("TO", "AS") else at + 1
                else:
                    continue
                other, _ = name(target)
                if other is not None:
                    tables.append(other)
                    if word(at) == "RENAME":
                        renames.append((tables[0], other))
    if not tables:
        return None
    return TableDdl(verb, tuple(dict.fromkeys(tables)), tuple(renames), query, default_db)
