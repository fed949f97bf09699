"""Keys (primary or chunk keys) and their order, one definition for the snapshot and the lake.

The snapshot reader cuts a table into key ranges in the source's ``ORDER BY``; the lake applies
range assertions over the same ranges and reconciliation cuts the same key space into checksum
ranges. Both sides must agree on what a key is, how two keys compare (NULL parts included:
surrogate keys may have them) and which key types sort alike at the source and in the lake.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from cdc_platform.capture.schema import ColumnSpec

Key = tuple[Any, ...]
KeyOrder = tuple[tuple[bool, Any], ...]


def key_order(key: Key) -> KeyOrder:
    """The sort key of a key tuple: lexicographic, part by part, NULL first.

    NULL first is what MySQL and MariaDB do for ``ORDER BY k ASC`` (NULL sorts below every
    value), so ranges of keys taken in this order are the ranges the chunk reader read. A NULL
    part never meets ``<`` (its sort key ``(False, None)`` differs from any value's first).
    """
    return tuple((v is not None, v) for v in key)


# Key types whose landing (Arrow) type sorts in the lake as the source's ORDER BY sorts them: only
# chunks keyed by these carry a per-chunk range assertion, and the lake accepts range
# assertions only on them. Decided by the landed type, not the kind: a DECIMAL wider than 38
# digits lands as text. Text sorts by collation at the source and bytewise in the lake (TIME,
# ENUM, SET and JSON land as text too).
RANGE_ORDERED_TYPES: tuple[Callable[[pa.DataType], bool], ...] = (
    pa.types.is_integer, pa.types.is_decimal, pa.types.is_floating, pa.types.is_date,
    pa.types.is_timestamp, pa.types.is_binary,
)


def range_ordered(column: ColumnSpec) -> bool:
    """Whether the lake orders ``column``'s landed values as the source orders the column."""
    if column.source_type == "uuid":  # lands as bytes, sorts by swapped segments
        return False
    arrow_type = column.arrow_type()
    return any(test(arrow_type) for test in RANGE_ORDERED_TYPES)
