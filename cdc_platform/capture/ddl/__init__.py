"""Statements and DDL in the binlog: parsing table DDL (``parse``), row changes logged as SQL
(``statement_dml``), the one classifier of statements (``statements``), what a statement does
to capture (``effects``), stale targets (``stale``, ``stale_markers``) and column renames and
drops (``column_renames``)."""
