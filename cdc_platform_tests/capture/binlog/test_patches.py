"""The changes cdc_platform makes to mysql-replication (``binlog/patches.py``) are installed."""

from __future__ import annotations

from cdc_platform_tests.capture.test_values import _PACKED_DATETIME


def test_the_binlog_adapter_installs_its_decoders_into_mysql_replication():
    """The adapter's fixes live in mysql-replication's internals: an upgrade that renames them
    must fail here, not silently decode text and JSON the old way."""
    from pymysqlreplication import json_binary
    from pymysqlreplication.row_event import RowsEvent, TableMapEvent

    from cdc_platform.capture.binlog import patches

    assert RowsEvent.charset_to_encoding("cp1252") == "cdc-platform-keeps-bytes"
    assert RowsEvent.charset_to_encoding("utf8") == "utf8"
    assert TableMapEvent._read_type_values is patches._type_values_as_bytes
    assert json_binary.parse_opaque is patches._json_opaque
    assert patches._json_opaque(bytes([12, 8]) + _PACKED_DATETIME.to_bytes(8, "little")) == \
        "2024-02-29 13:05:09.000123"
