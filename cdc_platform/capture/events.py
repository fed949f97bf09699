"""The binlog as the project's own events, and the loud stop of the capture engine.

The binlog adapter (``capture/binlog/stream.py``) turns mysql-replication's events into these small
frozen dataclasses, so the transaction logic (``capture/changes/transactions.py``) and the engine are
written against a vocabulary the project owns, and are tested without a server. Only events
that matter for capture exist here; the adapter drops the known-ignorable ones and stops on
anything else (``UnsupportedEvent``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from cdc_platform.capture.schema import TableSchema


class EngineError(RuntimeError):
    """A non-retriable capture failure (a loud stop); the message names the GTID, table,
    column where relevant, and what to do."""


class UnsupportedEvent(EngineError):
    """A binlog event the engine cannot capture exactly (unknown type, undecodable body)."""


@dataclass(frozen=True, slots=True)
class Begin:
    """A GTID event: the start of one binlog event group (one transaction or statement).

    ``standalone``: the group is a single statement (MariaDB's FL_STANDALONE flag). None when
    the flavour does not say (MySQL), and the statement's text decides. ``xid``: the XA
    transaction the group prepares or completes, when the GTID event names it (MariaDB).
    """

    gtid: str
    timestamp: int = 0
    standalone: bool | None = None
    xid: str | None = None


@dataclass(frozen=True, slots=True)
class TableMap:
    """A table-map event: binlog table id -> the table's schema at this point (all columns)."""

    table_id: int
    schema: TableSchema


RowOp = Literal["insert", "update", "delete"]


@dataclass(frozen=True, slots=True)
class Rows:
    """A rows event of one table. ``rows`` are the row images as tuples in the table map's
    column order (an update's as ``(before, after)`` pairs), as the native decoder
    (``capture/binlog/rowcodec.py``) gives them and the adapter turns mysql-replication's
    dicts into; or with ``columnar`` one ``rowcodec.RowColumns`` (the rows column-wise, Arrow
    arrays in landing form where the decoder builds them natively). ``size`` is the event's
    binlog size in bytes, the basis of the transaction buffer's memory estimate."""

    table_id: int
    database: str
    table: str
    op: RowOp
    rows: Any
    size: int = 0
    columnar: bool = False


@dataclass(frozen=True, slots=True)
class Query:
    """A statement in the binlog (BEGIN, COMMIT, DDL, SAVEPOINT, XA ...)."""

    text: str
    database: str = ""
    timestamp: int = 0


@dataclass(frozen=True, slots=True)
class Xid:
    """The commit of a transactional group."""

    timestamp: int = 0


@dataclass(frozen=True, slots=True)
class XaPrepare:
    """The end of an XA transaction's first phase (``one_phase``: XA COMMIT ... ONE PHASE,
    which commits at once). ``xid`` is the normalised XA id (``xa_id``)."""

    xid: str
    one_phase: bool = False
    timestamp: int = 0


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The source had nothing more to send: the stream is at the end of its binlog."""


@dataclass(frozen=True, slots=True)
class Rotate:
    """The stream moved to another binlog file; table ids of the old file are stale."""

    next_binlog: str = ""


Event = Begin | TableMap | Rows | Query | Xid | XaPrepare | Heartbeat | Rotate


def xa_id(format_id: int, gtrid: bytes, bqual: bytes) -> str:
    """One text form of an XA id for every place it is read from (the XA prepare event, the
    GTID event, and ``XA COMMIT X'..',X'..',n`` statements): ``format:gtrid-hex:bqual-hex``."""
    return f"{format_id}:{gtrid.hex()}:{bqual.hex()}"
