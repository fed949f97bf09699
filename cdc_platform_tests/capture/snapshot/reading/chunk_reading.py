"""Snapshot helpers for tests: reading a whole table chunk by chunk, without a session (the
snapshot asset persists progress between chunks instead)."""

from __future__ import annotations

from typing import Any

import pymysql

from cdc_platform.capture.snapshot.chunks import DEFAULT_CHUNK_MAX_BYTES, Chunk, ChunkedTable, Key
from cdc_platform.capture.snapshot.reading.keyset import read_chunk, read_max_key, with_row_bound


def read_table_in_chunks(
    conn: pymysql.Connection, flavour: str, table: ChunkedTable, chunk_size: int,
    max_bytes: int = DEFAULT_CHUNK_MAX_BYTES, chunk_conn: Any = None,
) -> list[Chunk]:
    """All chunks of a table, one after the other. ``chunk_conn``: the session chunks are read
    on (a mysqlclient one, ``native.connect``), when not ``conn``."""
    max_key = read_max_key(conn, table)
    chunks: list[Chunk] = []
    if max_key is None:
        return chunks  # nothing existed at the start: rows inserted since come by the stream
    table = with_row_bound(conn, table)
    after_key: Key | None = None
    hint: float | None = None
    while True:
        chunk = read_chunk(conn if chunk_conn is None else chunk_conn, flavour, table,
                           chunk_size, after_key, max_key, max_bytes, hint)
        chunks.append(chunk)
        if chunk.complete:
            return chunks
        after_key = chunk.resume_key
        hint = chunk.bytes_read / max(1, len(chunk.rows))
