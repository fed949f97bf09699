"""Dagster wiring only, one folder per domain."""
