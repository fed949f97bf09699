"""One real local Spark session for all lake tests (starting one takes seconds)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from cdc_platform.lake.spark import build_spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # for tests that ship Python code
    session = build_spark_session(app_name="cdc_platform_tests.lake")
    yield session
    session.stop()
