"""MySQL 8: UUID:interval GTID sets, auto-positioning, no standalone flag on GTID events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pymysql

from cdc_platform.capture.events import Begin, EngineError
from cdc_platform.capture.flavours.common import (
    error_code,
    global_variable,
    gtid_variable_text,
    log_updates_problem,
    undecoded,
)
from cdc_platform.capture.gtid import Gtid, GtidSet, parse_gtid, parse_position

ER_PARSE_ERROR = 1064


class MysqlFlavour:
    name = "mysql"
    monitor_grant = "REPLICATION CLIENT"
    watermark = "executed_set"
    required_variables = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
                          "binlog_row_metadata": "FULL", "gtid_mode": "ON",
                          "enforce_gtid_consistency": "ON"}

    def parse_position(self, text: str) -> GtidSet:
        return parse_position(self.name, text)

    def parse_gtid(self, text: str) -> Gtid:
        return parse_gtid(self.name, text)

    def stream_start(self, position: str,
                     connect: Callable[[], pymysql.Connection]) -> dict[str, Any]:
        if position:
            return {"auto_position": position}
        # No GTID position to resume from: start at the oldest binlog file.
        conn = connect()
        try:
            with conn.cursor(pymysql.cursors.Cursor) as cur:
                cur.execute("SHOW BINARY LOGS")
                first = cur.fetchone()
        finally:
            conn.close()
        if not first:
            raise EngineError("source has no binary logs: set log_bin on the replica")
        return {"log_file": first[0], "log_pos": 4}

    def begin(self, event: Any) -> Begin:
        # MySQL's GTID event does not say whether the group is one statement; the buffer
        # tells from the statement (CREATE ... SELECT ends its CREATE with START TRANSACTION).
        return Begin(event.gtid, event.timestamp, standalone=None)

    def executed_gtid_text(self, conn: pymysql.Connection) -> str:
        return gtid_variable_text(conn, "gtid_executed")

    def earliest_position(self, conn: pymysql.Connection) -> str:
        # Auto-positioning from the purged set streams everything still in the binlogs, and
        # counts what was purged as processed (it can never arrive).
        with conn.cursor(pymysql.cursors.Cursor) as cur:
            cur.execute("SELECT @@GLOBAL.gtid_purged")
            return str(cur.fetchone()[0] or "").replace("\n", "")

    def replica_problems(self, conn: pymysql.Connection) -> list[str]:
        return self.setting_problems(conn) + self._replica_log_problems(conn)

    @staticmethod
    def setting_problems(conn: pymysql.Connection) -> list[str]:
        """Settings ``required_variables`` cannot express. ``binlog_row_value_options`` must
        be empty: with PARTIAL_JSON, an UPDATE of a JSON column logs only the changed part of
        the value (PARTIAL_UPDATE_ROWS_EVENT), not the after-image capture lands. (A server
        without the variable, older than MySQL 8.0.3, cannot log partial updates.)"""
        value = global_variable(conn, "binlog_row_value_options")
        if not value:
            return []
        return [f"server variable binlog_row_value_options is {value!r}, needs '' (empty): "
                "partial JSON updates log only the changed part of JSON values, which "
                "capture cannot land exactly. Set binlog_row_value_options='' (SET PERSIST, "
                "and in sessions that set it)"]

    @staticmethod
    def _replica_log_problems(conn: pymysql.Connection) -> list[str]:
        # (the status row's error columns quote statements: bytes, see undecoded)
        with conn.cursor(pymysql.cursors.Cursor) as cur, undecoded(conn):
            try:
                cur.execute("SHOW REPLICA STATUS")  # MySQL >= 8.0.22
            except pymysql.MySQLError as error:
                if error_code(error) != ER_PARSE_ERROR:
                    raise
                cur.execute("SHOW SLAVE STATUS")
            if not cur.fetchall():
                return []
        return log_updates_problem(conn, ("log_replica_updates", "log_slave_updates"),
                                   "SHOW REPLICA STATUS")


MYSQL = MysqlFlavour()
