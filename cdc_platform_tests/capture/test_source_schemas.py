"""Schemas of many tables read at once (the code location's load, a snapshot run's start)
equal the schemas read one table at a time, on the real MariaDB."""

from __future__ import annotations

from cdc_platform.capture.source import SourceSession, selector_from_settings
from cdc_platform.capture.source import quote_identifier as q
from cdc_platform_tests.conftest import CdcEnv


def test_schemas_read_together_equal_schemas_read_one_by_one(cdc_env: CdcEnv) -> None:
    env = cdc_env
    env.overrides["capture"] = {"excluded_columns": [rf"{env.db}\.people\.secret"],
                                "surrogate_keys": {"{db}.keyless": ["a", "b"]}}
    env.execute("CREATE TABLE people (id BIGINT UNSIGNED PRIMARY KEY, name VARCHAR(40) "
                "CHARACTER SET latin1, secret TEXT, born DATETIME(3), price DECIMAL(12,4), "
                "kind ENUM('x','y'), flags BIT(5), raw BINARY(4))")
    env.execute("CREATE TABLE composite (b INT, a VARCHAR(10), v JSON, PRIMARY KEY (b, a))")
    env.execute("CREATE TABLE keyless (a INT, b INT, c DOUBLE)")
    env.execute(f"CREATE TABLE {q('we`ird name-ü')} (id INT PRIMARY KEY)")
    tables = [(env.db, t) for t in ("people", "composite", "keyless", "we`ird name-ü")]
    settings = env.settings
    with SourceSession(settings.source.connection_settings(),
                       selector_from_settings(settings)) as source:
        together = source.read_schemas([*tables, (env.db, "missing")])
        one_by_one = {pair: source.read_schema(*pair) for pair in tables}
        estimates = source.estimated_rows(tables)
    assert together == one_by_one
    assert together[(env.db, "keyless")].primary_key == ("a", "b")
    assert "secret" not in together[(env.db, "people")].column_names
    assert set(estimates) == set(tables) and all(n == 0 for n in estimates.values())
