"""What each binlog column lands as (``binlog/columns.py``)."""

from __future__ import annotations

import pytest

from cdc_platform.capture.schema import ColumnSpec


def test_column_specs_from_table_maps_record_charsets_and_member_names():
    from types import SimpleNamespace

    from pymysqlreplication.constants import FIELD_TYPE as BINLOG_TYPE

    from cdc_platform.capture.binlog.columns import column_from_binlog

    def column(ftype, **attrs):
        return SimpleNamespace(type=ftype, name="c", **attrs)

    latin1 = column(BINLOG_TYPE.VARCHAR, character_set_name="cp1252",
                    collation_name="latin1_swedish_ci")
    assert column_from_binlog(latin1) == ColumnSpec("c", "string", charset="latin1")
    utf8 = column(BINLOG_TYPE.VARCHAR, character_set_name="utf8",
                  collation_name="utf8mb4_unicode_ci")
    assert column_from_binlog(utf8) == ColumnSpec("c", "string")
    enum = column(BINLOG_TYPE.ENUM, character_set_name="cp1252",
                  collation_name="latin1_swedish_ci", enum_values=["", b"\xe9", b"b"])
    assert column_from_binlog(enum) == ColumnSpec("c", "enum", values=("é", "b"),
                                                  charset="latin1")
    emoji = column(BINLOG_TYPE.SET, character_set_name="utf8",
                   collation_name="utf8mb4_bin", set_values=["😀".encode(), b"b"])
    assert column_from_binlog(emoji).values == ("?", "b")  # as information_schema shows it
    assert column_from_binlog(column(BINLOG_TYPE.YEAR)) == ColumnSpec("c", "year")
    unknown = column(BINLOG_TYPE.VARCHAR, character_set_name="utf8", collation_name=None)
    with pytest.raises(ValueError, match="collation id is not known"):
        column_from_binlog(unknown)
