"""Every landing type of docs/landing-zone.md survives changelog -> Iceberg target exactly.

Values go through every write path: the first batch is inserted, the second merged in beside
it, the third updates a row (merge-on-read: a position delete and a new row), then Iceberg's
compaction rewrites the files. Read back with Spark (collect) and with a third-party reader
(pyiceberg, no Spark), whose Iceberg schema must keep DATETIME as a timestamp without zone and
TIMESTAMP as an instant.
"""

from __future__ import annotations

import struct
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from pyiceberg import types as iceberg_types
from pyspark.sql.types import (
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    LongType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.lake.iceberg.lake import Lake
from cdc_platform.lake.iceberg.maintenance import maintain
from cdc_platform.lake.iceberg.table import LakeTable
from cdc_platform.lake.merge import materialise
from cdc_platform_tests.lake.helpers import SERVER, Landing
from cdc_platform_tests.lake.third_party import (
    assert_third_party_reads_same,
    open_table,
    third_party_rows,
)


def f32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


COLUMNS = (
    ColumnSpec("id", "int"),
    ColumnSpec("i64", "int"),
    ColumnSpec("u64", "uint64"),
    ColumnSpec("dec", "decimal", 38, 10),
    ColumnSpec("dec_small", "decimal", 5, 2),
    ColumnSpec("dec_wide", "decimal", 65, 30),
    ColumnSpec("f", "float"),
    ColumnSpec("d", "double"),
    ColumnSpec("day", "date"),
    ColumnSpec("dt", "datetime", scale=6),
    ColumnSpec("ts", "timestamp", scale=6),
    ColumnSpec("tm", "time", scale=6),
    ColumnSpec("s", "string"),
    ColumnSpec("e", "enum", values=("a", "b")),
    ColumnSpec("st", "set", values=("a", "b", "c")),
    ColumnSpec("j", "json"),
    ColumnSpec("bin", "binary"),
    ColumnSpec("bit5", "bit", precision=5),
    ColumnSpec("bit64", "bit", precision=64),
)
SCHEMA = TableSchema("types", "all_types", COLUMNS, ("id",))

SPARK_TYPES = {
    "id": LongType(), "i64": LongType(), "u64": DecimalType(20, 0),
    "dec": DecimalType(38, 10), "dec_small": DecimalType(5, 2), "dec_wide": StringType(),
    "f": FloatType(), "d": DoubleType(), "day": DateType(), "dt": TimestampNTZType(),
    "ts": TimestampType(), "tm": StringType(), "s": StringType(), "e": StringType(),
    "st": StringType(), "j": StringType(), "bin": BinaryType(), "bit5": LongType(),
    "bit64": DecimalType(20, 0),
}

ROWS = [
    {
        "id": 1, "i64": -(2**63), "u64": Decimal(2**64 - 1),
        "dec": Decimal("-1234567890123456789012345678.0123456789"),
        "dec_small": Decimal("-999.99"), "dec_wide": "-" + "9" * 35 + "." + "0" * 29 + "1",
        "f": f32(3.1415927), "d": 1.7976931348623157e308, "day": date(1000, 1, 1),
        "dt": datetime(1000, 1, 1, 0, 0, 0), "ts": datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
        "tm": "-838:59:59.000000", "s": "héllo 😀 𝄞 中文", "e": "b", "st": "a,c",
        "j": '{"a":[1,2],"b":{"c":null}}', "bin": bytes(range(256)), "bit5": 31,
        "bit64": Decimal(2**64 - 1),
    },
    {
        "id": 2, "i64": 2**63 - 1, "u64": Decimal(0), "dec": Decimal("0E-10"),
        "dec_small": Decimal("0.01"), "dec_wide": "0.000000000000000000000000000001",
        "f": f32(-1.5e-38), "d": -2.5e-300, "day": date(9999, 12, 31),
        "dt": datetime(9999, 12, 31, 23, 59, 59, 999999),
        "ts": datetime(2038, 1, 19, 3, 14, 7, 999999, tzinfo=UTC), "tm": "00:00:00", "s": "",
        "e": "a", "st": "", "j": "[]", "bin": b"", "bit5": 0, "bit64": Decimal(0),
    },
    {"id": 3, **{c.name: None for c in COLUMNS[1:]}},
    {
        "id": 4, "i64": 0, "u64": Decimal(2**63), "dec": Decimal("1E-10"),
        "dec_small": Decimal("123.45"), "dec_wide": "1", "f": f32(16777217.0), "d": 0.1,
        "day": date(2024, 2, 29), "dt": datetime(2024, 2, 29, 12, 30, 45, 123456),
        "ts": datetime(2024, 3, 31, 1, 30, 0, 1, tzinfo=UTC), "tm": "838:59:59.999999",
        "s": "\x00 nul and ' quotes \"", "e": "a", "st": "a,b,c", "j": '"x"',
        "bin": b"\x00\xff" * 3, "bit5": 1, "bit64": Decimal(1),
    },
]


def spark_value(name: str, value):
    """Python values as pyspark collects them: LTZ timestamps come back as naive local time."""
    if value is None:
        return None
    if name == "ts":
        return value.astimezone(UTC)
    if name == "bin":
        return bytes(value)
    return value


ICEBERG_TYPES = {
    "id": iceberg_types.LongType(), "u64": iceberg_types.DecimalType(20, 0),
    "dec_wide": iceberg_types.StringType(), "f": iceberg_types.FloatType(),
    "day": iceberg_types.DateType(), "dt": iceberg_types.TimestampType(),
    "ts": iceberg_types.TimestamptzType(), "bin": iceberg_types.BinaryType(),
    "bit5": iceberg_types.LongType(), "bit64": iceberg_types.DecimalType(20, 0),
}


def collected(table: LakeTable) -> dict[int, dict]:
    df = table.read()
    assert {f.name: f.dataType for f in df.schema.fields} == SPARK_TYPES
    assert df.columns == [c.name for c in COLUMNS]
    return {
        row["id"]: {k: spark_value(k, v) for k, v in row.asDict().items()}
        for row in df.collect()
    }


def read_by_pyiceberg(table: LakeTable) -> dict[int, dict]:
    return {row["id"]: row for row in third_party_rows(table)}


@pytest.mark.parametrize("arrow_load", [True, False], ids=["arrow-initial-load", "spark-only"])
def test_every_type_round_trips_through_merge_update_and_compaction(spark, tmp_path: Path,
                                                                     arrow_load: bool):
    """The first batch goes into an empty target: appended without Spark (lake.arrow_load)
    or by Spark; the same values either way, then through Spark's MERGEs and compaction."""
    landing = Landing(tmp_path / "landing")
    warehouse = str(tmp_path / "warehouse")
    table = LakeTable(Lake(spark, warehouse), SERVER, "types", "all_types")

    def run():
        return materialise(spark, landing.url, warehouse, SERVER, SCHEMA, "types", "all_types",
                           spark_free=arrow_load)

    def check(expected: list[dict]) -> None:
        assert collected(table) == {row["id"]: row for row in expected}
        assert read_by_pyiceberg(table) == {row["id"]: row for row in expected}
        assert_third_party_reads_same(spark, table)

    landing.segment(SCHEMA, [("c", row) for row in ROWS[:2]])
    first = run()
    assert first.rows == 2 and first.appended
    assert ("spark.app.id" not in first.snapshot.summary) == arrow_load
    check(ROWS[:2])

    landing.segment(SCHEMA, [("c", row) for row in ROWS[2:]])
    assert run().rows == 4
    check(ROWS)

    landing.segment(SCHEMA, [("u", ROWS[0])])
    updated = run()
    assert updated.rows == 4 and updated.updates == 1
    assert updated.snapshot.metadata()["position_deletes"] == 1
    check(ROWS)

    report = maintain(table, datetime.now() + timedelta(hours=1), retain_last=1)
    assert report["rewritten_data_files_count"] > 0
    assert table.current().metadata()["position_deletes"] == 0
    check(ROWS)

    # The Iceberg schema any engine sees: DATETIME without zone, TIMESTAMP an instant.
    fields = {f.name: f.field_type for f in open_table(table).schema().fields}
    assert {name: fields[name] for name in ICEBERG_TYPES} == ICEBERG_TYPES
