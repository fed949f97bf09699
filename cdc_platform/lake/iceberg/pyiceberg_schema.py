"""A target as Spark's CREATE TABLE makes it, for writers without Spark (``lake.arrow_load``,
``lake.arrow_merge``): its Iceberg schema from the landed columns' Arrow types, and its table
properties. Separate from ``iceberg.schema`` (evolving a table's columns through Spark): these
are the pyiceberg-side definitions both Spark-free paths create and check targets with, so a
table made without Spark is the table Spark would have made.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import types as spark_types

from cdc_platform.capture.landing.records import POS
from cdc_platform.capture.schema import TableSchema
from cdc_platform.lake.columns import spark_type
from cdc_platform.lake.iceberg.properties import target_comment, target_properties

# Spark's types as Iceberg's Spark catalog converts them (``SparkSchemaUtil.convert``): the
# table made without Spark has the columns a Spark CREATE TABLE of ``columns.user_struct`` has.
_ICEBERG_TYPES: dict[type[spark_types.DataType], Callable[[], IcebergType]] = {
    spark_types.LongType: LongType,
    spark_types.IntegerType: IntegerType,
    spark_types.FloatType: FloatType,
    spark_types.DoubleType: DoubleType,
    spark_types.DateType: DateType,
    spark_types.TimestampType: TimestamptzType,
    spark_types.TimestampNTZType: TimestampType,
    spark_types.StringType: StringType,
    spark_types.BinaryType: BinaryType,
    spark_types.BooleanType: BooleanType,
}


def iceberg_type(arrow_type: pa.DataType) -> IcebergType:
    """The Iceberg type of a column landing as ``arrow_type``: the type Spark's CREATE TABLE
    gives the Spark type it reads as (``columns.spark_type``)."""
    data_type = spark_type(arrow_type)
    if isinstance(data_type, spark_types.DecimalType):
        return DecimalType(data_type.precision, data_type.scale)
    return _ICEBERG_TYPES[type(data_type)]()


def iceberg_schema(schema: TableSchema) -> Schema:
    """A target's schema as Spark creates it (``LakeTable.create``): the user columns, then
    ``__cdc_pos``, all optional, ids in order."""
    fields = [(c.name, iceberg_type(c.arrow_type())) for c in schema.columns]
    fields.append((POS, LongType()))
    return Schema(*[NestedField(i, name, field_type, required=False)
                    for i, (name, field_type) in enumerate(fields, start=1)])


def table_properties(server_name: str, schema: TableSchema, renamed_through: int
                     ) -> dict[str, str]:
    """The properties ``LakeTable.create`` / ``ensure_created`` give a target through Spark
    (Spark adds ``owner``; the COMMENT is the ``comment`` property)."""
    return {
        **target_properties(server_name, schema.database, schema.table, schema.primary_key,
                            renamed_through),
        "comment": target_comment(server_name, schema.database, schema.table),
        **({"owner": owner} if (owner := _user()) else {}),
    }


def _user() -> str | None:
    """The user Spark names a table's owner (``SPARK_USER``, else the login name); None in a
    container whose user id has no name (``getpass`` raises there)."""
    try:
        return os.environ.get("SPARK_USER") or getpass.getuser()
    except (KeyError, OSError):
        return None
