"""The Spark side: changelog -> target tables, reconciliation."""
