"""How a source identifier is written in the platform's other namespaces.

MySQL accepts almost any text as a database, table or column name: unicode, dashes, spaces,
reserved words, backticks, dots, slashes, ``..``. Each place the platform writes such a name has
its own rules, and each mapping here is injective (two tables never share a table id, a landing
directory or a Dagster name) and leaves the plain names of the demo (``inventory.orders``)
exactly as they were:

* **table ids** (``table_id``): the ``db.table`` text used as a key (tables.json, checkpoint
  snapshot sessions, signals, config). A part that would make the text ambiguous is
  backtick-quoted as in SQL (`` `my.db`.orders ``); ``split_table_id`` is the inverse and also
  reads every id written before quoting existed. User input in the plain ``db.table`` form is
  resolved against the known tables (``resolve_table_id``), refusing it when it is ambiguous.
* **path components** (``path_component``): one directory name per database or table in the
  landing zone and the warehouse; percent-encoded where a name is unsafe on a filesystem, an
  object store or a Hadoop path (``/``, ``%``, a leading ``.``, glob characters...).
* **names** (``valid_name``, ``joined_name``): Dagster op, check and group names and Spark
  catalog names (``^[A-Za-z0-9_]+$``): a readable slug, plus a short stable hash of the real
  name whenever the slug loses anything.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
import unicodedata
from collections.abc import Iterable
from urllib.parse import unquote

# ---- table ids -------------------------------------------------------------------------------


def _quote(part: str) -> str:
    return "`" + part.replace("`", "``") + "`"


def qualified_name(*parts: str) -> str:
    """``a.b.c``, quoting exactly the parts the plain text would not tell apart.

    A part before a dot is quoted when it holds a dot or starts with a backtick; the last part
    only when it starts with a backtick (the rest of the text is that part). So every name
    without those characters keeps the plain form, and ids written before quoting existed
    (``db.table``, split at the first dot) read the same.
    """
    shown = []
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        needs_quote = part.startswith("`") or (not last and "." in part)
        shown.append(_quote(part) if needs_quote else part)
    return ".".join(shown)


def split_qualified_name(text: str, count: int) -> tuple[str, ...]:
    """The ``count`` parts of ``qualified_name`` text (quoted or not); ValueError if malformed."""
    parts: list[str] = []
    i = 0
    for index in range(count):
        last = index == count - 1
        if text.startswith("`", i):
            pieces, j = [], i + 1
            while True:
                end = text.find("`", j)
                if end < 0:
                    raise ValueError(f"{text!r}: unterminated backtick quote")
                if text.startswith("``", end):
                    pieces.append(text[j:end + 1])
                    j = end + 2
                    continue
                pieces.append(text[j:end])
                i = end + 1
                break
            part = "".join(pieces)
        elif last:
            part, i = text[i:], len(text)
        else:
            end = text.find(".", i)
            if end < 0:
                raise ValueError(f"{text!r} is not a name of {count} dot-separated parts")
            part, i = text[i:end], end
        if not part:
            raise ValueError(f"{text!r}: an empty name")
        parts.append(part)
        if not last:
            if not text.startswith(".", i):
                raise ValueError(f"{text!r} is not a name of {count} dot-separated parts")
            i += 1
    if i != len(text):
        raise ValueError(f"{text!r}: text after the closing backtick")
    return tuple(parts)


def table_id(database: str, table: str) -> str:
    """The table's id: ``db.table``, with `` `my.db`.table `` where a dot would mislead."""
    return qualified_name(database, table)


def split_table_id(text: str) -> tuple[str, str]:
    """``(database, table)`` of a ``table_id``; ValueError when ``text`` is not one.

    Text that is not a quoted id but was written before quoting existed (``f"{db}.{table}"``,
    e.g. for a table named ```x``) reads as it was written: split at the first dot.
    """
    try:
        database, table = split_qualified_name(text, 2)
    except ValueError:
        database, _, table = text.partition(".")
        if not database or not table:
            raise
    return database, table


def plain_name(table: str) -> str:
    """``db.table`` without quotes: what a user types, and what Debezium calls a table."""
    return ".".join(split_table_id(table))


class AmbiguousTableError(ValueError):
    """Plain ``db.table`` text that names more than one known table."""


def resolve_table_id(text: str, known: Iterable[str]) -> str | None:
    """The known table id ``text`` names, or None.

    ``text`` is a table id, a backtick-quoted name (`` `my.db`.`t` ``) or a plain ``db.table``
    (``my.db.t``), which may name two tables when a name holds a dot: then
    AmbiguousTableError says how to quote it.
    """
    try:
        exact = table_id(*split_table_id(text))
    except ValueError:
        exact = None
    found = []
    for candidate in known:
        if candidate in (text, exact):
            found.append(candidate)
        else:
            try:
                if plain_name(candidate) == text:
                    found.append(candidate)
            except ValueError:
                continue
    found = list(dict.fromkeys(found))
    if len(found) > 1:
        raise AmbiguousTableError(
            f"{text!r} names {len(found)} tables ({', '.join(found)}): quote the database and "
            "table name with backticks as in SQL, e.g. `my.db`.`table`")
    return found[0] if found else None


# ---- path components -------------------------------------------------------------------------

_PATH_SAFE_ASCII = frozenset(string.ascii_letters + string.digits + "_-.")
NAME_MAX_BYTES = 255  # the longest file name of common filesystems (ext4, xfs, S3 keys allow more)


def _kept_in_path(ch: str, *, leading: bool) -> bool:
    if ch in _PATH_SAFE_ASCII:
        return not (leading and ch == ".")
    return ord(ch) > 127 and unicodedata.category(ch)[0] in "LNM"


def path_component(name: str) -> str:
    """One directory name for a database or table name: reversible, injective, plain names kept.

    Kept: ASCII letters, digits, ``_``, ``-``, ``.`` (not leading: ``.``, ``..`` and hidden
    names are escaped) and non-ASCII letters, digits and marks (``ü``). Everything else
    (``/``, ``%``, spaces, backticks, glob characters ``*?[]{}``, ``:``, control and format
    characters) becomes ``%XX`` per UTF-8 byte, as in URLs.
    """
    out = []
    for index, ch in enumerate(name):
        if _kept_in_path(ch, leading=index == 0):
            out.append(ch)
        else:
            out.append("".join(f"%{byte:02X}" for byte in ch.encode("utf-8", "surrogatepass")))
    component = "".join(out)
    if not name:
        raise ValueError("an empty name has no path component")
    if len(component.encode("utf-8", "surrogatepass")) > NAME_MAX_BYTES:
        raise ValueError(
            f"the name {name!r} needs {len(component.encode())} bytes as a directory name "
            f"(escaped: {component[:60]}...), more than the {NAME_MAX_BYTES} a filesystem "
            "allows: exclude the table (capture.tables.exclude) or rename it")
    return component


def name_of_path_component(component: str) -> str:
    """The name ``path_component`` escaped (its inverse)."""
    return unquote(component, errors="strict")


# ---- Dagster and Spark catalog names ---------------------------------------------------------

_INVALID_NAME_CHARS = re.compile(r"[^A-Za-z0-9_]")
_PLAIN_PART = re.compile(r"^[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*$")


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _slug(name: str) -> str:
    ascii_text = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return _INVALID_NAME_CHARS.sub("_", ascii_text) or "_"


def valid_name(name: str, *, case_sensitive: bool = True) -> str:
    """A name of letters, digits and underscores (Dagster's and Spark's catalog rule).

    A name that already is one stays as it is; others become a readable slug (accents
    dropped, other characters ``_``) plus a short hash of the real name, so that ``a-b`` and
    ``a_b`` differ. ``case_sensitive=False`` (Spark's catalog) also hashes names with capitals,
    so ``A`` and ``a`` differ there too.
    """
    lossless = not _INVALID_NAME_CHARS.search(name) and name != ""
    if lossless and (case_sensitive or name == name.lower()):
        return name
    slug = _slug(name) if case_sensitive else _slug(name).lower()
    return f"{slug}_{_digest(name)}"


def joined_name(*parts: str) -> str:
    """One valid name for a tuple of names (``server__db__table``), injective over tuples.

    Parts of letters and digits joined by single underscores are joined with ``__`` as Dagster
    does for asset keys (so op names of plain tables stay what they were); any other tuple gets
    the slug of that text and a hash of the parts, so ``("a", "b__c")``, ``("a__b", "c")`` and
    ``("a-b", "c")`` all differ.
    """
    joined = "__".join(parts)
    if all(_PLAIN_PART.match(part) for part in parts):
        return joined
    return f"{_slug(joined)}_{_digest(json.dumps(list(parts)))}"
