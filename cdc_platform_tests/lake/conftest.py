"""One real local Spark session for all lake tests (starting one takes seconds)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdc_platform.lake.spark import build_spark_session
from cdc_platform_tests.lake.helpers import Landing


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # for tests that ship Python code
    session = build_spark_session(app_name="cdc_platform_tests.lake")
    yield session
    session.stop()


@pytest.fixture
def landing(tmp_path: Path) -> Landing:
    return Landing(tmp_path / "landing")


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    return str(tmp_path / "warehouse")
