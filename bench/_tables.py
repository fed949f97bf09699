"""The snapshotted table of the snapshot and initial-load benchmarks: rows that never reached
the binlog, as on a source whose history is gone."""

from __future__ import annotations

from cdc_platform.devservices.mariadb import MariaDBServer

SNAPSHOT_DB, SNAPSHOT_TABLE = "snap", "items"
SNAPSHOT_COLUMNS = "id, name, price, status, created"
SNAPSHOT_FILL_BATCH = 100_000


def fill_snapshot_table(server: MariaDBServer, rows: int, table: str = SNAPSHOT_TABLE) -> None:
    """The table exists (DDL binlogged), its rows do not reach the binlog: as on a source whose
    history is gone, only a snapshot can bring them, and the engine has no backlog to stream."""
    with server.root_connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {SNAPSHOT_DB}")
        cur.execute(f"CREATE TABLE {SNAPSHOT_DB}.{table} (id BIGINT PRIMARY KEY, "
                    "name VARCHAR(40), price DECIMAL(10,2), status VARCHAR(8), "
                    "created DATETIME(6))")
        cur.execute("SET SESSION sql_log_bin = 0")
        for start in range(1, rows + 1, SNAPSHOT_FILL_BATCH):
            end = min(rows, start + SNAPSHOT_FILL_BATCH - 1)
            cur.execute(
                f"INSERT INTO {SNAPSHOT_DB}.{table} SELECT seq, CONCAT('item ', seq), "
                "(seq * 7919 % 1000000) / 100, ELT(1 + seq % 3, 'new', 'paid', 'shipped'), "
                "TIMESTAMP('2025-01-01') + INTERVAL seq SECOND + INTERVAL seq % 1000000 "
                f"MICROSECOND FROM {SNAPSHOT_DB}.seq_{start}_to_{end}")
        cur.execute(f"ANALYZE TABLE {SNAPSHOT_DB}.{table}")
        cur.fetchall()
