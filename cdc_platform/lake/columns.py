"""Arrow -> Spark types, and by-name conformance of data frames to a target schema.

Every read in the lake passes an explicit Spark schema (no inference job, no positional
surprises) and then selects/casts the columns to the target schema *by name*: a column missing in
older files becomes NULL, a dropped column disappears, a changed type is cast.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from cdc_platform.capture.landing.records import (
    CHANGELOG_META_FIELDS,
    OP,
    POS,
    RESERVED_PREFIX,
    snapshot_arrow_fields,
)
from cdc_platform.capture.schema import ColumnSpec, TableSchema


def refuse_reserved_columns(schema: TableSchema) -> None:
    """A source column named like the lake's own columns would be confused with them: stop
    with the table, the column and the fix, instead of merging the wrong values."""
    reserved = [c for c in schema.column_names if c.lower().startswith(RESERVED_PREFIX)]
    if reserved:
        raise ValueError(
            f"{schema.table_id}: column(s) {', '.join(map(repr, reserved))} start with "
            f"{RESERVED_PREFIX!r}, which the changelog and the lake reserve for their own "
            "columns; exclude them (capture.excluded_columns) or rename them on the source")


def spark_type(arrow_type: pa.DataType) -> DataType:
    """The Spark type a landing-zone Arrow type reads as (docs/landing-zone.md, type mapping)."""
    t = arrow_type
    if pa.types.is_int64(t):
        return LongType()
    if pa.types.is_int32(t):
        return IntegerType()
    if pa.types.is_decimal(t):
        return DecimalType(t.precision, t.scale)
    if pa.types.is_float32(t):
        return FloatType()
    if pa.types.is_float64(t):
        return DoubleType()
    if pa.types.is_date32(t):
        return DateType()
    if pa.types.is_timestamp(t):
        return TimestampType() if t.tz else TimestampNTZType()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return StringType()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return BinaryType()
    if pa.types.is_boolean(t):
        return BooleanType()
    raise TypeError(f"Arrow type {t} has no mapping to a Spark type in the landing-zone contract")


# Metadata columns of changelog segments (as the contract types them), and the ones kept in the
# warehouse's data files.
CHANGELOG_META = StructType(
    [StructField(f.name, spark_type(f.type), f.nullable) for f in CHANGELOG_META_FIELDS])
TABLE_META = StructType([StructField(POS, LongType()), StructField(OP, StringType())])


def struct_from_arrow(schema: pa.Schema) -> StructType:
    """The Spark schema to read a Parquet file with this Arrow schema."""
    return StructType([StructField(f.name, spark_type(f.type), f.nullable) for f in schema])


def user_struct(columns: tuple[ColumnSpec, ...] | list[ColumnSpec]) -> StructType:
    """Spark schema of the user columns, from their column specs."""
    return StructType([StructField(c.name, spark_type(c.arrow_type())) for c in columns])


def table_struct(schema: TableSchema) -> StructType:
    """Spark schema of the warehouse's data files: user columns, then position and op."""
    return StructType(user_struct(schema.columns).fields + TABLE_META.fields)


def col(name: str) -> Column:
    """A column by its exact name (dots, spaces and backticks are not interpreted)."""
    return F.col("`" + name.replace("`", "``") + "`")


def conform(df: DataFrame, target: StructType) -> DataFrame:
    """Select ``target``'s columns by name, casting where types differ, NULL where missing."""
    have = {f.name: f.dataType for f in df.schema.fields}
    selected = []
    for field in target.fields:
        if field.name in have:
            column = col(field.name)
            if have[field.name] != field.dataType:
                column = column.cast(field.dataType)
        else:
            column = F.lit(None).cast(field.dataType)
        selected.append(column.alias(field.name))
    return df.select(*selected)


def snapshot_struct(schema: TableSchema) -> StructType:
    """Spark schema of the snapshot-record columns (see ``snapshot_arrow_fields``)."""
    fields = snapshot_arrow_fields(schema)
    return StructType([StructField(f.name, spark_type(f.type)) for f in fields])

