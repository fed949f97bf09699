"""One signal message: its format, and its validation without ever raising on bad input.

The format is the seeds' (Debezium's Kafka signal channel): the message key is the source's
logical server name (``source.server_name``), so one topic can serve several sources; the value
is a JSON object ``{"type": ..., "data": {...}}`` with an optional ``"id"``::

    key   demo
    value {"type": "execute-snapshot",
           "data": {"data-collections": ["inventory.orders", "inventory\\\\.cust.*"],
                    "type": "INCREMENTAL",
                    "additional-conditions": [{"data-collection": "inventory.orders",
                                               "filter": "status = 'paid'"}],
                    "surrogate-key": "order_no"}}

Types: ``execute-snapshot``, ``stop-snapshot`` / ``pause-snapshot`` / ``resume-snapshot``
(``data-collections`` optional: all running snapshots when absent or empty) and ``log``
(``{"message": ...}``). A message that cannot be acted on becomes a :class:`Skipped` with the
reason; one keyed for another source is :class:`Skipped` with ``foreign=True`` (logged, not a
problem), one keyed for no source with ``unaddressed=True`` (every source skips it).
Nothing here raises on message content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

EXECUTE_SNAPSHOT = "execute-snapshot"
STOP_SNAPSHOT = "stop-snapshot"
PAUSE_SNAPSHOT = "pause-snapshot"
RESUME_SNAPSHOT = "resume-snapshot"
LOG = "log"
SIGNAL_TYPES = (EXECUTE_SNAPSHOT, STOP_SNAPSHOT, PAUSE_SNAPSHOT, RESUME_SNAPSHOT, LOG)
CONTROL_ACTIONS = {STOP_SNAPSHOT: "stop", PAUSE_SNAPSHOT: "pause", RESUME_SNAPSHOT: "resume"}

# A signal lists tables, regular expressions and filters: far below this. A larger message is a
# mistake (or an attack on the sensor's memory) and is skipped unread.
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024
MAX_DATA_COLLECTIONS = 1000


@dataclass(frozen=True)
class SignalMessage:
    """A message as read from the signal topic (``key`` and ``value`` raw bytes)."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class Signal:
    """A valid signal for this source."""

    id: str  # the message's "id", else "<signal-topic>@<offset>"
    offset: int
    type: str
    data_collections: tuple[str, ...] = ()
    # (data-collection, filter) pairs, as given: unchecked text, which ``plan`` makes a
    # snapshot ``Condition`` (checking it) once the tables are known
    additional_conditions: tuple[tuple[str, str], ...] = ()
    surrogate_key: tuple[str, ...] = ()
    message: str = ""  # the text of a ``log`` signal
    timestamp_ms: int | None = None

    @property
    def action(self) -> str:
        """``stop``, ``pause`` or ``resume`` for the control signals."""
        return CONTROL_ACTIONS[self.type]

    def describe(self) -> str:
        return f"signal {self.id} ({self.type}, offset {self.offset})"


@dataclass(frozen=True)
class Skipped:
    """A message not acted on, and why. ``foreign``: keyed for another source;
    ``unaddressed``: keyed for no source (no key, or one that is not text)."""

    offset: int
    reason: str
    signal_id: str = ""
    foreign: bool = False
    unaddressed: bool = False
    tables: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        what = f"signal {self.signal_id}" if self.signal_id else "signal message"
        return f"{what} at offset {self.offset} skipped: {self.reason}"


def parse_signal(message: SignalMessage, server_name: str, topic: str,
                 max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Signal | Skipped:
    """The signal in ``message``, or why it is skipped (never raises on the message's content).
    """
    offset = message.offset

    def skip(reason: str, signal_id: str = "", foreign: bool = False,
             unaddressed: bool = False) -> Skipped:
        return Skipped(offset, reason, signal_id, foreign, unaddressed)

    if message.key is None:
        return skip(f"no message key; the key must be the source's server name "
                    f"{server_name!r}", unaddressed=True)
    try:
        key = message.key.decode("utf-8")
    except UnicodeDecodeError:
        return skip(f"message key is not UTF-8 text; want {server_name!r}", unaddressed=True)
    if key != server_name:
        return skip(f"keyed for source {key[:100]!r}, not {server_name!r}", foreign=True)
    if not message.value:
        return skip("empty message value (a tombstone?); want a JSON object with 'type' "
                    "and 'data'")
    if len(message.value) > max_bytes:
        return skip(f"message of {len(message.value):,} bytes exceeds the limit of "
                    f"{max_bytes:,} (signals.max_message_bytes)")
    try:
        value = json.loads(message.value, object_pairs_hook=_unambiguous_object)
    except _DuplicateKey as error:
        return skip(str(error))
    except RecursionError:
        return skip("not valid JSON: nested too deeply to parse (a signal is an object of "
                    "strings and lists of strings)")
    except Exception as error:  # any failure to decode or parse: skipped, never raised
        return skip(f"not valid JSON ({type(error).__name__}: {str(error)[:200]})")
    if not isinstance(value, dict):
        return skip(f"the value must be a JSON object, not {type(value).__name__}")
    signal_id = value.get("id")
    if signal_id is None:
        signal_id = f"{topic}@{offset}"
    elif not isinstance(signal_id, str | int) or isinstance(signal_id, bool) or \
            not str(signal_id).strip() or len(str(signal_id)) > 200:
        return skip("'id' must be a non-empty string of at most 200 characters")
    signal_id = str(signal_id)
    kind = value.get("type")
    if not isinstance(kind, str):
        return skip("missing 'type' (want one of " + ", ".join(SIGNAL_TYPES) + ")", signal_id)
    if kind not in SIGNAL_TYPES:
        return skip(f"unknown type {kind[:100]!r} (want one of {', '.join(SIGNAL_TYPES)})",
                    signal_id)
    data = value.get("data", {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return skip(f"'data' must be a JSON object, not {type(data).__name__}", signal_id)
    base = Signal(signal_id, offset, kind, timestamp_ms=message.timestamp_ms)
    try:
        if kind == EXECUTE_SNAPSHOT:
            return _execute_snapshot(base, data)
        if kind == LOG:
            text = data.get("message")
            if not isinstance(text, str) or not text:
                raise _Invalid("a log signal needs 'data': {'message': '...'}")
            return replace(base, message=text[:10_000])
        collections = _collections(data, required=False)
        return replace(base, data_collections=collections)
    except _Invalid as error:
        return skip(str(error), signal_id)


class _Invalid(ValueError):
    pass


class _DuplicateKey(ValueError):
    pass


def _unambiguous_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different. With a key twice, parsers disagree on
    which value counts (Python's json takes the last, many gateways and audit tools the
    first): a message that reads as a harmless ``log`` to one and as an ``execute-snapshot``
    to another is refused, at any depth, rather than acted on."""
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise _DuplicateKey(f"ambiguous JSON: the key {key[:100]!r} appears twice in one "
                                "object (parsers differ on which value counts); send each key "
                                "once")
        value[key] = item
    return value


def _collections(data: dict[str, Any], required: bool) -> tuple[str, ...]:
    raw = data.get("data-collections")
    if raw is None or raw == []:
        if required:
            raise _Invalid("missing 'data-collections' (a list of table names or regular "
                           "expressions such as \"inventory.orders\")")
        return ()
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(c, str) and c.strip() for c in raw):
        raise _Invalid("'data-collections' must be a list of non-empty strings")
    if len(raw) > MAX_DATA_COLLECTIONS:
        raise _Invalid(f"'data-collections' lists {len(raw)} entries; at most "
                       f"{MAX_DATA_COLLECTIONS} per signal")
    return tuple(dict.fromkeys(c.strip() for c in raw))


def _execute_snapshot(base: Signal, data: dict[str, Any]) -> Signal:
    collections = _collections(data, required=True)
    snapshot_type = data.get("type", "INCREMENTAL")
    if not isinstance(snapshot_type, str) or snapshot_type.upper() != "INCREMENTAL":
        # Not repr() of any JSON value: a deeply nested one would overflow the stack.
        shown = repr(snapshot_type[:100]) if isinstance(snapshot_type, str) else \
            f"(a {type(snapshot_type).__name__})"
        raise _Invalid(f"snapshot type {shown} is not supported: only INCREMENTAL "
                       "(read-only, while streaming continues)")
    conditions: list[tuple[str, str]] = []
    raw_conditions = data.get("additional-conditions")
    if raw_conditions is not None:
        if not isinstance(raw_conditions, list):
            raise _Invalid("'additional-conditions' must be a list of {\"data-collection\": "
                           "..., \"filter\": ...}")
        for entry in raw_conditions:
            if not isinstance(entry, dict):
                raise _Invalid("each additional condition must be an object with "
                               "'data-collection' and 'filter'")
            collection, text = entry.get("data-collection"), entry.get("filter")
            if not isinstance(collection, str) or not collection.strip():
                raise _Invalid("an additional condition lacks its 'data-collection'")
            if not isinstance(text, str) or not text.strip():
                raise _Invalid(f"the additional condition for {collection[:100]!r} lacks its "
                               "'filter'")
            conditions.append((collection.strip(), text))
    legacy = data.get("additional-condition")  # Debezium 1.x/2.0: one filter for every table
    if legacy is not None:
        if not isinstance(legacy, str) or not legacy.strip():
            raise _Invalid("'additional-condition' must be a non-empty string")
        conditions += [(c, legacy) for c in collections]
    surrogate = data.get("surrogate-key")
    if surrogate is None or surrogate == "":
        key: tuple[str, ...] = ()
    elif isinstance(surrogate, str):
        key = tuple(part.strip() for part in surrogate.split(",") if part.strip())
    elif isinstance(surrogate, list) and all(isinstance(p, str) and p for p in surrogate):
        key = tuple(surrogate)
    else:
        raise _Invalid("'surrogate-key' must be a column name or a list of column names")
    return replace(base, data_collections=collections, additional_conditions=tuple(conditions),
                   surrogate_key=key)


def signal_value(kind: str, data: dict[str, Any] | None = None,
                 signal_id: str | None = None) -> bytes:
    """The JSON value of a signal message (the CLI's side of the format)."""
    if kind not in SIGNAL_TYPES:
        raise ValueError(f"unknown signal type {kind!r}: want one of {', '.join(SIGNAL_TYPES)}")
    value: dict[str, Any] = {"type": kind, "data": data or {}}
    if signal_id:
        value = {"id": signal_id, **value}
    return json.dumps(value, separators=(",", ":")).encode()
