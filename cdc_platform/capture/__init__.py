"""The capture engine: pure Python, no Dagster or Spark imports."""
