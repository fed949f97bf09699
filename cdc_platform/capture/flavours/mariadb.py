"""MariaDB: domain-server-sequence GTIDs, GTID event flags, connect state positions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pymysql

from cdc_platform.capture.events import Begin
from cdc_platform.capture.flavours.common import (
    error_code,
    gtid_variable_text,
    log_updates_problem,
    undecoded,
)
from cdc_platform.capture.gtid import Gtid, GtidSet, parse_gtid, parse_position

# Gtid_log_event flags2 (MariaDB sql/log_event.h).
FL_STANDALONE = 1
FL_PREPARED_XA = 64
FL_COMPLETED_XA = 128
ER_SPECIFIC_ACCESS_DENIED = 1227


class MariadbFlavour:
    name = "mariadb"
    monitor_grant = "REPLICATION CLIENT (BINLOG MONITOR)"
    watermark = "consistent_snapshot"
    required_variables = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
                          "binlog_row_metadata": "FULL", "gtid_strict_mode": "ON"}

    def parse_position(self, text: str) -> GtidSet:
        return parse_position(self.name, text)

    def parse_gtid(self, text: str) -> Gtid:
        return parse_gtid(self.name, text)

    def stream_start(self, position: str,
                     connect: Callable[[], pymysql.Connection]) -> dict[str, Any]:
        # An empty connect state means "from the oldest binlog".
        return {"is_mariadb": True, "auto_position": position}

    def begin(self, event: Any) -> Begin:
        flags = int(getattr(event, "flags", 0) or 0)
        return Begin(event.gtid, event.timestamp, standalone=bool(flags & FL_STANDALONE),
                     xid=getattr(event, "xa_id", None))

    def executed_gtid_text(self, conn: pymysql.Connection) -> str:
        return gtid_variable_text(conn, "gtid_binlog_pos")

    def earliest_position(self, conn: pymysql.Connection) -> str:
        # An empty connect state is refused once older files were purged: name the state at
        # the start of the oldest binlog still on the source.
        with conn.cursor(pymysql.cursors.Cursor) as cur:
            cur.execute("SHOW BINARY LOGS")
            oldest = cur.fetchone()
            cur.execute("SELECT BINLOG_GTID_POS(%s, 4)", (oldest[0],))
            return str(cur.fetchone()[0] or "")

    def replica_problems(self, conn: pymysql.Connection) -> list[str]:
        replica, evidence = self._is_replica(conn)
        if not replica:
            return []
        return log_updates_problem(conn, ("log_slave_updates",), evidence)

    @staticmethod
    def _is_replica(conn: pymysql.Connection) -> tuple[bool, str]:
        """Whether the server replicates from another, and the evidence.

        ``SHOW ALL SLAVES STATUS`` needs SLAVE MONITOR, which the CDC account (SELECT,
        REPLICATION SLAVE, REPLICATION CLIENT) lacks; then running replica threads or a
        non-empty ``gtid_slave_pos`` (it applied replicated transactions) are the evidence.
        """
        with conn.cursor(pymysql.cursors.Cursor) as cur:
            try:
                # (the status rows' error columns quote statements: bytes, see undecoded)
                with undecoded(conn):
                    cur.execute("SHOW ALL SLAVES STATUS")
                    replicating = bool(cur.fetchall())
                return (True, "SHOW ALL SLAVES STATUS") if replicating else (False, "")
            except pymysql.MySQLError as error:
                if error_code(error) != ER_SPECIFIC_ACCESS_DENIED:
                    raise
            cur.execute("SHOW GLOBAL STATUS LIKE 'Slaves_running'")
            row = cur.fetchone()
            if row is not None and int(row[1] or 0) > 0:
                return True, f"Slaves_running={row[1]}"
            cur.execute("SELECT @@GLOBAL.gtid_slave_pos")
            row = cur.fetchone()
            position = str(row[0] or "") if row else ""
            return (True, f"gtid_slave_pos={position!r}") if position else (False, "")


MARIADB = MariadbFlavour()
