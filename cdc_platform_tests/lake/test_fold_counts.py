"""The batch's counts computed by pyarrow (``fold.arrow_stats``) are Spark's
(``fold.spark_stats``)
for any batch: keys with NULL parts, several records per key, instructions grouped apart, ops
no engine writes, commit times missing."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from cdc_platform.capture.landing.records import INSTRUCTION_OPS, OP, POS, TS_MS
from cdc_platform.lake.columns import col
from cdc_platform.lake.fold import INSTRUCTION, arrow_stats, spark_stats

KEYS = ["id", "region"]
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("region", pa.string()),
                    pa.field(POS, pa.int64(), nullable=False), pa.field(OP, pa.string()),
                    pa.field(TS_MS, pa.int64())])
SPARK_SCHEMA = StructType([StructField("id", LongType()), StructField("region", StringType()),
                           StructField(POS, LongType(), False), StructField(OP, StringType()),
                           StructField(TS_MS, LongType())])

record = st.tuples(
    st.one_of(st.none(), st.integers(-3, 3)),
    st.one_of(st.none(), st.sampled_from(["eu", "us", "EU", "é"])),
    st.one_of(st.none(), st.sampled_from(["c", "u", "d", "r", "a", "s", "x"])),
    st.one_of(st.none(), st.integers(0, 2 ** 41)),
)


@st.composite
def batches(draw: Any) -> list[tuple]:
    drawn = draw(st.lists(record, max_size=40))
    positions = draw(st.lists(st.integers(1, 10 ** 12), min_size=len(drawn),
                              max_size=len(drawn), unique=True))
    return [(key, region, pos, op, ts) for (key, region, op, ts), pos in zip(drawn, positions,
                                                                           strict=True)]


def spark_counts(spark: Any, rows: list[tuple], instructions: bool) -> dict[str, int]:
    frame = spark.createDataFrame(rows, SPARK_SCHEMA)
    if not instructions:
        return spark_stats(frame, KEYS, None)
    flagged = frame.withColumn(
        INSTRUCTION, F.coalesce(col(OP).isin(*INSTRUCTION_OPS), F.lit(False)))
    return spark_stats(flagged, KEYS, INSTRUCTION)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=batches(), instructions=st.booleans())
def test_arrow_counts_are_sparks(spark, rows, instructions):
    table = pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in rows],
                                 schema=SCHEMA)

    assert arrow_stats(table, KEYS, instructions) == spark_counts(spark, rows, instructions)


@pytest.mark.parametrize("key_type", [pa.float32(), pa.float64()])
def test_floating_point_keys_are_left_to_spark(key_type):
    """Spark groups -0.0 with 0.0 and every NaN together; Arrow by their bits."""
    table = pa.table({"id": pa.array([0.0, -0.0], key_type), POS: [1, 2], OP: ["c", "u"],
                      TS_MS: [1, 2]})

    assert arrow_stats(table, ["id"], False) is None
