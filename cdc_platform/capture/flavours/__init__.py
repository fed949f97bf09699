"""MySQL and MariaDB differences behind one small protocol (Debezium's flavour seam).

Everything the capture engine and the binlog adapter do differently per server flavour is a
method here: GTID syntax, how a binlog stream is positioned, what a GTID event says about its
group, which server settings capture needs, how the server shows it is a replica. Callers ask
``flavour_of(name)`` instead of comparing flavour strings. The snapshot watermark's algorithms
stay in ``capture/snapshot/watermark.py``; a flavour names which one it takes (``watermark``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import pymysql

from cdc_platform.capture.events import Begin
from cdc_platform.capture.gtid import Gtid, GtidSet


class Flavour(Protocol):
    name: str
    #: Server variables capture needs, with their required value.
    required_variables: dict[str, str]
    #: How a read-only snapshot watermark is taken (``capture/snapshot/watermark.py``):
    #: ``consistent_snapshot`` (MariaDB: the read view's own binlog position, exact) or
    #: ``executed_set`` (MySQL: the executed GTID set before and after the read).
    watermark: str
    #: The grant that lets the account read binlog positions, as this flavour names it.
    monitor_grant: str

    def parse_position(self, text: str) -> GtidSet:
        """An executed set / position as the server prints it."""

    def parse_gtid(self, text: str) -> Gtid:
        """One GTID as a binlog GTID event names it."""

    def stream_start(self, position: str,
                     connect: Callable[[], pymysql.Connection]) -> dict[str, Any]:
        """mysql-replication ``BinLogStreamReader`` arguments that start after ``position``
        (``connect`` opens a source session if the flavour needs one)."""

    def begin(self, event: Any) -> Begin:
        """The project's ``Begin`` from mysql-replication's GTID event."""

    def executed_gtid_text(self, conn: pymysql.Connection) -> str:
        """The executed GTIDs as text (not a watermark: ARCHITECTURE section 4)."""

    def earliest_position(self, conn: pymysql.Connection) -> str:
        """The position at the start of the oldest binlog still on the server."""

    def replica_problems(self, conn: pymysql.Connection) -> list[str]:
        """Why the binlog would miss what capture needs beyond ``required_variables``: on a
        replica, what it applies; on MySQL, partial JSON updates (empty: fine)."""


def flavour_of(name: str) -> Flavour:
    from cdc_platform.capture.flavours.mariadb import MARIADB
    from cdc_platform.capture.flavours.mysql import MYSQL

    try:
        return {"mariadb": MARIADB, "mysql": MYSQL}[name]
    except KeyError:
        raise ValueError(f"unknown flavour {name!r} (want 'mysql' or 'mariadb')") from None
