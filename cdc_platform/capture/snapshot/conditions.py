"""Validation of a snapshot's ``additional-condition``: a SQL boolean over the table's own rows.

The text comes from a signal, that is from a user. It is embedded in the chunk SELECT as
``... AND (<condition>)``, so the validator makes sure it cannot leave those parentheses, run
another statement, write, lock, wait, read other tables or change session state. It tokenises
the text (string literals with doubled quotes, backtick identifiers) instead of matching regular
expressions over it, so a ``;`` or ``--`` inside a string literal is data, and a keyword inside
one is not a keyword. The read also runs in a READ ONLY transaction with quoted identifiers:
this is the first of two walls, not the only one.

Backslashes are refused everywhere: whether ``\\'`` ends a string depends on the server's
``NO_BACKSLASH_ESCAPES`` mode, and a tokenizer that guesses the mode wrong can be walked out of
a literal. Doubled quotes (``'it''s'``) mean the same in every mode.

The rule is checked once, where untrusted text enters (a signal, a run's config, a file read
back from the landing zone), by constructing a :class:`Condition`; from there on the condition
travels as that type, and the SQL builders take nothing else (:func:`require_condition`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CONDITION_LENGTH = 4096

# Words refused outside string literals and backtick identifiers (a column with such a name
# must be backtick-quoted). Each is one of: a statement that writes, alters, locks or chains;
# a subquery or set operation (reading other tables); a query-level clause that would change
# how rows are read; a function that waits, takes locks, reads files or changes session or
# sequence state.
DENIED_WORDS = frozenset({
    # statements and their parts
    "ALTER", "ANALYZE", "CALL", "CHANGE", "COMMIT", "CREATE", "DEALLOCATE", "DELETE", "DO",
    "DROP", "EXECUTE", "FLUSH", "GRANT", "HANDLER", "INSTALL", "KILL", "LOAD", "LOCK",
    "OPTIMIZE", "PREPARE", "PURGE", "RENAME", "REPAIR", "RESET", "REVOKE", "ROLLBACK",
    "SAVEPOINT", "SET", "SHOW", "SHUTDOWN", "TRUNCATE", "UNINSTALL", "UNLOCK", "UPDATE",
    "USE", "XA",
    # subqueries and set operations
    "SELECT", "TABLE", "VALUES", "WITH", "UNION", "EXCEPT", "INTERSECT",
    # query-level clauses
    "INTO", "OUTFILE", "DUMPFILE", "FOR", "ORDER", "GROUP", "HAVING", "LIMIT", "PROCEDURE",
    "WINDOW", "RETURNING",
    # functions that wait, lock, read files, or change session/sequence state
    "SLEEP", "BENCHMARK", "GET_LOCK", "RELEASE_LOCK", "RELEASE_ALL_LOCKS", "IS_FREE_LOCK",
    "IS_USED_LOCK", "LOAD_FILE", "MASTER_POS_WAIT", "SOURCE_POS_WAIT", "MASTER_GTID_WAIT",
    "WAIT_FOR_EXECUTED_GTID_SET", "WAIT_UNTIL_SQL_THREAD_AFTER_GTIDS", "NEXTVAL", "SETVAL",
    "LASTVAL", "NEXT", "PREVIOUS", "LAST_INSERT_ID", "SYS_EXEC", "SYS_EVAL",
})

# Statement words that are also harmless string functions: allowed only as ``NAME(``.
FUNCTION_ONLY_WORDS = frozenset({"REPLACE", "INSERT"})

_WORD = re.compile(r"[A-Za-z0-9_$\u0080-\U0010ffff]+")
_OPERATOR_CHARS = frozenset("=<>!+-*/%&|^~(),.")


class UnsafeConditionError(ValueError):
    """The additional condition was refused; the message says what and where."""


@dataclass(frozen=True)
class Token:
    kind: str  # "word", "string", "identifier", "op"
    text: str
    offset: int


def tokenize_condition(text: str) -> list[Token]:
    """Split a condition into tokens; UnsafeConditionError on anything outside the grammar."""
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in " \t\r\n":
            i += 1
        elif ch in "'\"":
            end = _end_of_quoted(text, i, ch, "string literal")
            tokens.append(Token("string", text[i:end], i))
            i = end
        elif ch == "`":
            end = _end_of_quoted(text, i, "`", "backtick identifier")
            tokens.append(Token("identifier", text[i:end], i))
            i = end
        elif text.startswith(("--", "/*", "*/"), i) or ch == "#":
            raise _refuse(text, i, "comments are not allowed")
        elif ch == ";":
            raise _refuse(text, i, "';' would end the statement")
        elif ch == "@":
            raise _refuse(text, i, "variables (@name, @@name) are not allowed")
        elif ch == "\\":
            raise _refuse(text, i, "backslashes are not allowed (their meaning depends on "
                                   "sql_mode); double a quote to escape it")
        elif _is_control(ch):
            raise _refuse(text, i, f"control character {ch!r}")
        elif match := _WORD.match(text, i):
            tokens.append(Token("word", match.group(), i))
            i = match.end()
        elif ch in _OPERATOR_CHARS:
            tokens.append(Token("op", ch, i))
            i += 1
        else:
            raise _refuse(text, i, f"unexpected character {ch!r}")
    return tokens


class Condition(str):
    """An additional condition that passed the checks: constructing one runs them.

    ``Condition(text)`` is the stripped text, or UnsafeConditionError saying why it was
    refused; a ``Condition`` given again is returned as it is (it was checked). It is a ``str``
    so that whatever only carries or stores it (Dagster run config, ``request.json``, the
    checkpoint, log lines) works unchanged and writes the same bytes; it is a type of its own
    so that SQL is only ever built from checked text (:func:`require_condition`). Immutable,
    as a ``str`` is, and without attributes to set.
    """

    __slots__ = ()

    def __new__(cls, text: str) -> Condition:
        if isinstance(text, Condition):
            return text
        return super().__new__(cls, _checked(text))

    @property
    def sql(self) -> str:
        """The text to embed in a statement, as a plain ``str``."""
        return str(self)


def validate_condition(text: str) -> Condition:
    """The condition, stripped, if it is a safe boolean expression; else UnsafeConditionError.

    The same as ``Condition(text)``, in the form callers outside ``capture`` use."""
    return Condition(text)


def require_condition(value: object) -> Condition:
    """``value`` if it is a :class:`Condition`; TypeError otherwise.

    Called by the code that puts a condition into SQL, so that text nobody checked (a plain
    ``str`` from a signal, a config or a file) is refused there instead of being embedded.
    """
    if not isinstance(value, Condition):
        raise TypeError("an additional condition must be a Condition (checked by "
                        "cdc_platform.capture.snapshot.conditions), not a "
                        f"{type(value).__name__}: construct Condition(text) where the text "
                        "enters")
    return value


def _checked(text: str) -> str:
    """``text`` stripped, if it is a safe boolean expression; else UnsafeConditionError."""
    if len(text) > MAX_CONDITION_LENGTH:
        raise UnsafeConditionError(
            f"additional condition is {len(text)} characters long; at most "
            f"{MAX_CONDITION_LENGTH} are accepted"
        )
    condition = text.strip()
    if not condition:
        raise UnsafeConditionError("additional condition is empty")
    tokens = tokenize_condition(condition)
    depth = 0
    for index, token in enumerate(tokens):
        if token.kind == "op" and token.text == "(":
            depth += 1
        elif token.kind == "op" and token.text == ")":
            depth -= 1
            if depth < 0:
                raise _refuse(condition, token.offset, "')' closes a parenthesis that was never "
                                                       "opened (it would escape the WHERE clause)")
        elif token.kind == "word":
            word = token.text.upper()
            if word in DENIED_WORDS:
                raise _refuse(condition, token.offset, f"{token.text!r} is not allowed in a "
                                                       "filter (quote a column of that name with "
                                                       "backticks)")
            if word in FUNCTION_ONLY_WORDS:
                following = tokens[index + 1] if index + 1 < len(tokens) else None
                if following is None or following.text != "(":
                    raise _refuse(condition, token.offset,
                                  f"{token.text!r} is only allowed as a function call")
    if depth:
        raise UnsafeConditionError(f"additional condition {condition!r}: {depth} unclosed '('")
    return condition


def _end_of_quoted(text: str, start: int, quote: str, what: str) -> int:
    """Index just past the closing quote; a doubled quote is an escaped quote."""
    i = start + 1
    while True:
        end = text.find(quote, i)
        if end < 0:
            raise _refuse(text, start, f"unterminated {what}")
        backslash = text.find("\\", i, end)
        if backslash >= 0:
            raise _refuse(text, backslash, "backslashes are not allowed (their meaning depends "
                                           "on sql_mode); double a quote to escape it")
        control = next((k for k in range(i, end) if _is_control(text[k], in_literal=True)), -1)
        if control >= 0:
            raise _refuse(text, control, f"control character {text[control]!r} in a {what}")
        if text.startswith(quote * 2, end):
            i = end + 2
            continue
        return end + 1


def _is_control(ch: str, in_literal: bool = False) -> bool:
    allowed = "\t\r\n" if in_literal else ""
    return (ord(ch) < 32 or ord(ch) == 127) and ch not in allowed


def _refuse(text: str, offset: int, reason: str) -> UnsafeConditionError:
    excerpt = text[max(0, offset - 20): offset + 20]
    return UnsafeConditionError(
        f"additional condition refused at character {offset + 1} (near {excerpt!r}): {reason}"
    )
