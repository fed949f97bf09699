"""The sensor's pre-launch checks: only a checked condition is put into the source's SELECT."""

from __future__ import annotations

import pytest

from cdc_platform.capture.schema import ColumnSpec, TableSchema
from cdc_platform.capture.signals.checks import SourceChecks
from cdc_platform.capture.source import TableSelector

ORDERS = TableSchema("inv", "orders", (ColumnSpec("id", "int"),), ("id",))


@pytest.mark.parametrize("text", ["id > 1", "1=1) OR (1=1"])
def test_text_nobody_checked_is_refused_before_the_source_is_asked(text: str) -> None:
    checks = SourceChecks({}, TableSelector(include=(r"inv\..*",)))
    with pytest.raises(TypeError, match="must be a Condition"):
        checks._condition_problem(ORDERS, text)  # type: ignore[arg-type]
    assert checks._source._conn is None  # (no connection was even opened)
