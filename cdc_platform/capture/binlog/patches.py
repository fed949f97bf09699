"""The changes cdc_platform makes to mysql-replication's classes, installed once, on import, for
every stream of this process (the library has no hooks for them; ``stream.py`` imports this
module). Each replacement's docstring says why it exists:

* text stays bytes for ``capture.values`` (``_keep_text_bytes``), ENUM/SET member names too
  (``_type_values_as_bytes``); JSON opaque scalars as MySQL prints them (``_json_opaque``);
  an invalid date lands NULL (``_invalid_date_as_none``);
* a DECIMAL reader's unread byte goes back where it came from (``_unread_first``);
* ``Table`` built without a dict per column (``_table_init``);
* table maps read by their declared lengths, and cached (``table_maps.table_map_init``),
  with VECTOR's charset (``table_maps.is_character_column``);
* a tagged GTID set to resume from (``_DumpGtidSet``).

``test_patches`` fails when an upgrade of the library moves what they replace. Event types
the library does not know are taught to it in ``decoding.py``.
"""

from __future__ import annotations

from typing import Any

from pymysqlreplication import binlogstream, json_binary
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import RowsEvent, TableMapEvent
from pymysqlreplication.table import Table
from pymysqlreplication.util.bytes import decode_decimal

from cdc_platform.capture.binlog.table_maps import is_character_column, table_map_init
from cdc_platform.capture.charsets import UTF8_CHARSETS
from cdc_platform.capture.gtid import MysqlGtidSet, encode_mysql_gtid_set
from cdc_platform.capture.values import json_opaque_text


def _keep_text_bytes(encoding: str) -> str:
    """mysql-replication asks this for the Python codec of a text column's charset (it passes
    the charset's ``encoding``): only UTF-8 is decoded by the library; any other name is not a
    codec, so the library hands the bytes over (its LookupError path) for capture.values."""
    return encoding if encoding in UTF8_CHARSETS else "cdc-platform-keeps-bytes"


def _type_values_as_bytes(self: TableMapEvent, length: int) -> list[list[bytes]] | None:
    """TableMapEvent._read_type_values keeping ENUM/SET member names as bytes: the library
    decodes them as UTF-8 and turns any other name into '' (they are in the column's charset)."""
    packet = self.packet
    read_until = packet.read_bytes + length
    if packet.read_bytes >= read_until:
        return None
    result = []
    while packet.read_bytes < read_until:
        count = packet.read_length_coded_binary()
        result.append([bytes(packet.read_variable_length_string()) for _ in range(count)])
    return result


def _json_opaque(data: bytes) -> Any:
    """json_binary.parse_opaque, exact: DECIMAL as Decimal, every other opaque scalar as the
    text MySQL prints for it (the library loses TIME's sign and range, DATE vs DATETIME, and
    decodes other opaque bytes with errors ignored)."""
    if len(data) < 1:
        return None
    field_type = data[0]
    length, n = json_binary.decode_variable_length(data[1:])
    payload = bytes(data[1 + n : 1 + n + length])
    if field_type in (FIELD_TYPE.NEWDECIMAL, FIELD_TYPE.DECIMAL):
        return decode_decimal(payload)
    return json_opaque_text(field_type, payload)


def _invalid_date_as_none(read: Any) -> Any:
    """A DATE/DATETIME reader of the library that returns None for an invalid date such as
    2020-02-30 (ALLOW_INVALID_DATES) instead of raising: it lands NULL like zero dates and as
    the SELECT side reads it. The value's bytes are consumed before the date is built."""
    def lenient(self: RowsEvent) -> Any:
        try:
            return read(self)
        except ValueError:
            return None

    return lenient


def _unread_first(self: BinLogPacketWrapper, data: bytes) -> None:
    """BinLogPacketWrapper.unread putting ``data`` back *before* what is still buffered.

    The library appends it after, which is only right when nothing is buffered: a compressed
    rows event's inflated rows (``binlog_decoding``), or rows handed back by the native
    decoder (``rowcodec``), are buffered, and the DECIMAL reader unreads its first byte, which
    then came back at the end of the rows (a wrong value or an error)."""
    name = "_BinLogPacketWrapper__data_buffer"
    self.read_bytes -= len(data)
    setattr(self, name, data + getattr(self, name))


def _table_init(self: Table, table_id: int, schema: str, table: str, columns: list[Any],
                primary_key: Any = None, column_name_flag: bool = False) -> None:
    """Table.__init__ reading each column's name and key flag directly: the library builds a
    dict of every column's attributes to read those two, for every table map, so once per
    transaction (a tenth of streaming small transactions). The same values result."""
    if primary_key is None:
        names = [c.name for c in columns if c.is_primary]
        primary_key = "" if not names else names[0] if len(names) == 1 else tuple(names)
    self.__dict__.update({"table_id": table_id, "schema": schema, "table": table,
                          "columns": columns, "primary_key": primary_key,
                          "column_name_flag": column_name_flag})


class _DumpGtidSet:
    """What mysql-replication's COM_BINLOG_DUMP_GTID asks of its ``GtidSet``: the binary
    form of the position the stream starts after. The library's own cannot parse a tagged set
    (``uuid:tag:1-5``, MySQL 8.3+), so a stream could not resume after a tagged transaction;
    this one encodes both formats (``gtid.encode_mysql_gtid_set``; untagged sets as before)."""

    def __init__(self, text: str) -> None:
        self._encoded = encode_mysql_gtid_set(MysqlGtidSet.parse(text))

    @property
    def encoded_length(self) -> int:
        return len(self._encoded)

    def encoded(self) -> bytes:
        return self._encoded


# Installed once, for every stream of this process (the library has no hooks for these).
Table.__init__ = _table_init
BinLogPacketWrapper.unread = _unread_first
RowsEvent._RowsEvent__read_date = _invalid_date_as_none(RowsEvent._RowsEvent__read_date)
RowsEvent._RowsEvent__read_datetime = _invalid_date_as_none(RowsEvent._RowsEvent__read_datetime)
RowsEvent.charset_to_encoding = staticmethod(_keep_text_bytes)
TableMapEvent._read_type_values = _type_values_as_bytes  # noqa: SLF001
TableMapEvent.__init__ = table_map_init
TableMapEvent._is_character_column = staticmethod(is_character_column)  # noqa: SLF001
json_binary.parse_opaque = _json_opaque
binlogstream.GtidSet = _DumpGtidSet
