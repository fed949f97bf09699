"""Binlog -> the project's events: the mysql-replication adapter (``stream``), the event types
it is taught (``decoding``) and row images decoded natively (``rowcodec``)."""
