"""Topic and Connect schema names of the change topics, by the rule of Debezium's default topic
naming strategy, so that a consumer written for Debezium finds a table where it expects it.

The topic of table ``db.t`` is ``<prefix>.<db>.<t>``: parts that are empty or blank (Java's
``trim``: nothing above U+0020) are left out, then every UTF-16 code unit that a Kafka topic
name cannot hold (anything but ASCII letters, digits, ``.``, ``_``, ``-``) becomes ``_`` (so a
character beyond U+FFFF, two code units, becomes ``__``), then the name is cut to Kafka's 249
characters; a name that is exactly ``.`` or ``..`` becomes ``_`` or ``__``. Like Debezium's,
the rule is not injective (``my-db.t`` and ``my_db.t`` differ, but ``a.b``'s table ``c`` and
``a``'s table ``b.c`` share ``prefix.a.b.c``). Debezium would let two such tables share the
topic; our publisher stops instead, naming both (``topics.publisher``): a consumer could not
tell their events apart.

The key, value and envelope schemas are named after the topic (``<topic>.Key``, ``.Value``,
``.Envelope``), unadjusted: Debezium's default ``schema.name.adjustment.mode`` is ``none``.
"""

from __future__ import annotations

import re

# Kafka's limit on a topic name (Debezium's TopicNamingStrategy.MAX_NAME_LENGTH).
MAX_TOPIC_LENGTH = 249
DELIMITER = "."
REPLACEMENT = "_"

_VALID_CHARACTER = re.compile(r"[A-Za-z0-9._-]")
_VALID_TOPIC = re.compile(r"[A-Za-z0-9._-]+")


def topic_name(prefix: str, database: str, table: str) -> str:
    """``<prefix>.<database>.<table>`` with Debezium's escaping of characters a Kafka topic name
    cannot hold (each becomes ``_``, per UTF-16 code unit) and its cut to 249 characters.

    ``prefix`` (Debezium's ``topic.prefix``) must itself be a valid topic name: ValueError.
    """
    check_prefix(prefix)
    parts = [part for part in (prefix, database, table) if not _java_blank(part)]
    return sanitized_topic_name(DELIMITER.join(parts))


def sanitized_topic_name(name: str) -> str:
    """``name`` made a valid Kafka topic name the way Debezium does it (see the module)."""
    sanitized = "".join(
        unit if _VALID_CHARACTER.fullmatch(unit) else REPLACEMENT for unit in _utf16_units(name))
    if len(sanitized) > MAX_TOPIC_LENGTH:
        return sanitized[:MAX_TOPIC_LENGTH]
    if sanitized in (".", ".."):
        return REPLACEMENT * len(sanitized)
    return sanitized


def check_prefix(prefix: str) -> None:
    """Raise ValueError unless ``prefix`` is usable as Debezium's ``topic.prefix``: a non-empty
    valid topic name (its schema names and ``source.name`` carry it unescaped)."""
    if not prefix or not _VALID_TOPIC.fullmatch(prefix) or prefix in (".", ".."):
        raise ValueError(
            f"topic prefix {prefix!r} is not a valid Kafka topic name: use ASCII letters, "
            "digits, '.', '_' and '-' only (it names the topics <prefix>.<db>.<table>)")
    if len(prefix) > MAX_TOPIC_LENGTH:
        raise ValueError(f"topic prefix {prefix[:40]!r}... is longer than Kafka's "
                         f"{MAX_TOPIC_LENGTH} characters")


def key_schema_name(topic: str) -> str:
    return f"{topic}.Key"


def value_schema_name(topic: str) -> str:
    return f"{topic}.Value"


def envelope_schema_name(topic: str) -> str:
    return f"{topic}.Envelope"


def _java_blank(part: str) -> bool:
    """Java's ``String.trim().isEmpty()``: every character is at most U+0020."""
    return all(ch <= " " for ch in part)


def _utf16_units(text: str) -> list[str]:
    """One entry per UTF-16 code unit: a character beyond U+FFFF counts twice (Java's chars)."""
    units: list[str] = []
    for ch in text:
        units.append(ch)
        if ord(ch) > 0xFFFF:
            units.append(ch)
    return units
