"""A MySQL 8/9 source made of one binlog file, for tests without a server (none runs here).

mysql-replication takes its connections from ``pymysql_wrapper`` (the adapter's
``BinlogStream._connect``, which calls ``pymysql.connect``): a ``FakeMysql`` connection serves
the file's events as a replication connection would (a fake ROTATE, then the file; with
auto-positioning only the transactions the requested GTID set lacks, as MySQL does; then
heartbeats, or EOF in non-blocking mode), and answers the few statements the library, the
adapter and the engine send on their sessions. Files written with ``gtid_mode=OFF`` carry
ANONYMOUS_GTID events, which capture refuses; ``with_gtids`` turns them into GTID events of
one made-up server UUID, numbered in file order, the rest of each event unchanged.

The GTID set a COM_BINLOG_DUMP_GTID sends is decoded with ``gtid.decode_mysql_gtid_set``, so
a test that resumes from a tagged position checks the encoding the library now sends.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql
import pymysql.converters
import pymysql.protocol

from cdc_platform.capture.binlog.decoding import decode_tagged_gtid
from cdc_platform.capture.gtid import MysqlGtid, MysqlGtidSet, decode_mysql_gtid_set

BINLOGS = Path(__file__).parent / "binlogs"
ANONYMOUS_UUID = "a0a0a0a0-0000-4000-8000-00000000feed"
_GTID, _ANONYMOUS_GTID, _TAGGED_GTID = 33, 34, 42
_FORMAT_DESCRIPTION, _ROTATE, _HEARTBEAT = 15, 4, 27
_COM_BINLOG_DUMP, _COM_BINLOG_DUMP_GTID = 0x12, 0x1E


@dataclass
class BinlogFile:
    """A binlog file's events (each with its checksum, when the file has them)."""

    name: str
    server_version: str
    checksum: bool
    events: list[bytes] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path, with_gtids: bool = True) -> BinlogFile:
        data = path.read_bytes()
        assert data[:4] == b"\xfebin", f"{path} is not a binlog file"
        at, events = 4, []
        while at + 19 <= len(data):
            size = struct.unpack_from("<I", data, at + 9)[0]
            events.append(data[at:at + size])
            at += size
        fde = events[0]
        assert fde[4] == _FORMAT_DESCRIPTION
        version = fde[21:71].split(b"\0")[0].decode()
        # (the FDE ends with the checksum algorithm, 1 = CRC32, and its own checksum)
        checksum = fde[-5] == 1
        binlog = cls(path.name, version, checksum, events)
        if with_gtids:
            binlog.events = [binlog._with_gtid(e, n) for n, e in enumerate(events)]
        return binlog

    def _with_gtid(self, event: bytes, index: int) -> bytes:
        if event[4] != _ANONYMOUS_GTID:
            return event
        number = sum(1 for e in self.events[:index] if e[4] == _ANONYMOUS_GTID) + 1
        raw = bytearray(event)
        raw[4] = _GTID
        raw[19 + 1:19 + 17] = bytes.fromhex(ANONYMOUS_UUID.replace("-", ""))
        raw[19 + 17:19 + 25] = number.to_bytes(8, "little")
        return self._sealed(raw)

    def _sealed(self, raw: bytearray) -> bytes:
        if self.checksum:
            raw[-4:] = (zlib.crc32(bytes(raw[:-4])) & 0xFFFFFFFF).to_bytes(4, "little")
        return bytes(raw)

    def gtid_of(self, event: bytes) -> MysqlGtid | None:
        """The GTID a GTID or tagged GTID event names (None for other events)."""
        body = event[19:-4] if self.checksum else event[19:]
        if event[4] == _GTID:
            sid = body[1:17].hex()
            uuid = f"{sid[:8]}-{sid[8:12]}-{sid[12:16]}-{sid[16:20]}-{sid[20:]}"
            return MysqlGtid(uuid, int.from_bytes(body[17:25], "little"))
        if event[4] == _TAGGED_GTID:
            try:
                return MysqlGtid.parse(decode_tagged_gtid(body).gtid)
            except ValueError:  # (a test's damaged event: the adapter must say so)
                return None
        return None

    def executed(self) -> MysqlGtidSet:
        """Every GTID of the file (what the server's gtid_executed would show of it)."""
        return MysqlGtidSet.from_gtids(g for e in self.events if (g := self.gtid_of(e)))

    def event(self, event_type: int, body: bytes, timestamp: int = 0) -> bytes:
        """An event of this file's server, as the server would send it."""
        size = 19 + len(body) + (4 if self.checksum else 0)
        raw = bytearray(struct.pack("<IBIIIH", timestamp, event_type, 1, size, 0, 0x20) + body
                        + b"\0" * (4 if self.checksum else 0))
        return self._sealed(raw)


class FakeMysql:
    """One connection to the file's "server" (stream or session: both answer the same)."""

    def __init__(self, binlog: BinlogFile, variables: dict[str, str], dict_cursor: bool,
                 heartbeats: int) -> None:
        self.binlog = binlog
        self.variables = variables
        self.dict_cursor = dict_cursor
        self.heartbeats = heartbeats
        self.charset = "utf8mb4"
        self.encoding = "utf8"
        self.use_unicode = True
        self._next_seq_id = 0
        self._queue: list[bytes] = []
        self._blocking = True
        self.requested: MysqlGtidSet | None = None

    # -- sessions -----------------------------------------------------------------------------
    def get_server_info(self) -> str:
        return self.binlog.server_version

    def cursor(self, *args: Any) -> FakeCursor:
        return FakeCursor(self)

    def commit(self) -> None:
        pass

    def close(self) -> None:
        pass

    def answer(self, sql: str) -> list[tuple[Any, ...]]:
        text = " ".join(sql.split()).rstrip(";")
        upper = text.upper()
        if upper.startswith("SET ") or upper.startswith("START TRANSACTION"):
            return []
        match = re.fullmatch(r"SHOW (?:GLOBAL )?VARIABLES LIKE '([^']+)'", text, re.IGNORECASE)
        if match:
            name = match.group(1).lower()
            return [(name, self.variables[name])] if name in self.variables else []
        if upper == "SHOW GLOBAL VARIABLES":
            return list(self.variables.items())
        match = re.fullmatch(r"SELECT @@GLOBAL\.(\w+)", text, re.IGNORECASE)
        if match:
            return [(self.variables.get(match.group(1).lower(), ""),)]
        if upper in ("SHOW BINARY LOGS", "SHOW MASTER LOGS"):
            return [(self.binlog.name, sum(len(e) for e in self.binlog.events) + 4)]
        if upper in ("SHOW REPLICA STATUS", "SHOW SLAVE STATUS"):
            return []
        if "INFORMATION_SCHEMA" in upper:  # (collations, tables, column names: none known)
            return []
        raise pymysql.err.ProgrammingError(1064, f"the binlog-file server cannot answer {sql!r}")

    # -- the replication stream ---------------------------------------------------------------
    def _write_bytes(self, data: bytes) -> None:
        command = data[4]
        if command == _COM_BINLOG_DUMP:
            flags = struct.unpack_from("<H", data, 9)[0]
            self._blocking = not flags & 1
            self.requested = None
        elif command == _COM_BINLOG_DUMP_GTID:
            flags = struct.unpack_from("<H", data, 5)[0]
            self._blocking = not flags & 1
            name_size = struct.unpack_from("<I", data, 11)[0]
            at = 15 + name_size + 8
            size = struct.unpack_from("<I", data, at)[0]
            self.requested = decode_mysql_gtid_set(data[at + 4:at + 4 + size])
        else:
            raise AssertionError(f"unexpected command 0x{command:02x}")
        self._queue = self._events()

    def _events(self) -> list[bytes]:
        binlog = self.binlog
        rotate = binlog.event(_ROTATE, struct.pack("<Q", 4) + binlog.name.encode())
        out, skipping = [rotate], False
        for event in binlog.events:
            gtid = binlog.gtid_of(event)
            if gtid is not None:
                skipping = self.requested is not None and gtid in self.requested
            elif event[4] in (_FORMAT_DESCRIPTION, 35, _ROTATE, 3):
                skipping = False  # (FDE, PREVIOUS_GTIDS, ROTATE, STOP: not in a transaction)
            if not skipping:
                out.append(event)
        return out

    def _read_packet(self) -> pymysql.protocol.MysqlPacket:
        if self._queue:
            return pymysql.protocol.MysqlPacket(b"\x00" + self._queue.pop(0), "utf8")
        if self._blocking and self.heartbeats:
            self.heartbeats -= 1
            beat = self.binlog.event(_HEARTBEAT, self.binlog.name.encode())
            return pymysql.protocol.MysqlPacket(b"\x00" + beat, "utf8")
        if self._blocking:
            raise pymysql.err.OperationalError(2013, "Lost connection (the file has ended)")
        return pymysql.protocol.MysqlPacket(b"\xfe\x00\x00\x02\x00", "utf8")


class FakeCursor:
    def __init__(self, conn: FakeMysql) -> None:
        self.conn = conn
        self.rows: list[Any] = []

    def __enter__(self) -> FakeCursor:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def execute(self, sql: str, args: Any = None) -> int:
        if args is not None:  # (only string parameters are sent to it)
            values = args if isinstance(args, tuple | list) else (args,)
            sql = sql % tuple(pymysql.converters.escape_string(str(v)).join("''")
                              for v in values)
        rows = self.conn.answer(sql)
        if self.conn.dict_cursor:
            rows = [{"Variable_name": r[0], "Value": r[1]} if len(r) == 2 else r for r in rows]
        self.rows = rows
        return len(rows)

    def fetchone(self) -> Any:
        return self.rows.pop(0) if self.rows else None

    def fetchall(self) -> list[Any]:
        rows, self.rows = self.rows, []
        return rows

    def close(self) -> None:
        pass


MYSQL_VARIABLES = {
    "log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL", "gtid_mode": "ON", "enforce_gtid_consistency": "ON",
    "binlog_row_value_options": "", "gtid_purged": "",
}


class BinlogFileServer:
    """``connect`` stands in for ``pymysql.connect``: every connection reads ``binlog``."""

    def __init__(self, binlog: BinlogFile, heartbeats: int = 3, **variables: str) -> None:
        self.binlog = binlog
        self.variables = dict(MYSQL_VARIABLES, **variables)
        self.variables["binlog_checksum"] = "CRC32" if binlog.checksum else "NONE"
        self.variables.setdefault("gtid_executed", str(binlog.executed()))
        self.heartbeats = heartbeats
        self.connections: list[FakeMysql] = []

    def connect(self, **settings: Any) -> FakeMysql:
        dict_cursor = settings.get("cursorclass") is pymysql.cursors.DictCursor
        conn = FakeMysql(self.binlog, self.variables, dict_cursor, self.heartbeats)
        self.connections.append(conn)
        return conn


def read_binlog(name: str, with_gtids: bool = True) -> BinlogFile:
    return BinlogFile.read(BINLOGS / name, with_gtids)


# -- events built from MySQL's documented formats (what no public file holds) ------------------
# libs/mysql/binlog/event/{control,statement,rows}_events.h; the row value formats of the
# MySQL internals documentation (DATETIME2 packed big-endian, GEOMETRY as SRID + WKB).

def lenenc(value: int) -> bytes:
    """A MySQL length-encoded integer."""
    if value < 0xFB:
        return bytes([value])
    if value < 1 << 16:
        return b"\xfc" + value.to_bytes(2, "little")
    if value < 1 << 24:
        return b"\xfd" + value.to_bytes(3, "little")
    return b"\xfe" + value.to_bytes(8, "little")


def gtid_body(uuid: str, gno: int, sequence_number: int = 1) -> bytes:
    """GTID_LOG_EVENT: flags, sid, gno, logical-clock type 2, last committed, sequence."""
    return (b"\x00" + bytes.fromhex(uuid.replace("-", "")) + gno.to_bytes(8, "little")
            + b"\x02" + (0).to_bytes(8, "little") + sequence_number.to_bytes(8, "little"))


def query_body(database: str, statement: str) -> bytes:
    """QUERY_EVENT: thread id, time, database length, error code, no status variables."""
    db = database.encode()
    return struct.pack("<IIBHH", 7, 0, len(db), 0, 0) + db + b"\0" + statement.encode()


def xid_body(xid: int) -> bytes:
    return xid.to_bytes(8, "little")


def xa_prepare_body(format_id: int, gtrid: bytes, bqual: bytes, one_phase: bool = False
                    ) -> bytes:
    """XA_PREPARE_LOG_EVENT (38)."""
    return (bytes([one_phase]) + struct.pack("<III", format_id, len(gtrid), len(bqual))
            + gtrid + bqual)


@dataclass(frozen=True)
class BuiltColumn:
    name: str
    type: int
    metadata: bytes = b""
    collation: int | None = None  # (character columns)
    unsigned: bool = False


_NUMERIC = {1, 2, 3, 4, 5, 8, 9, 13, 246}


def table_map_body(table_id: int, database: str, table: str, columns: list[BuiltColumn],
                   key: tuple[int, ...] = (0,), extra_optional: bytes = b"") -> bytes:
    """TABLE_MAP_EVENT with the optional metadata ``binlog_row_metadata=FULL`` writes:
    signedness, column charsets, names, primary key (``extra_optional``: fields before
    them)."""
    count = len(columns)
    body = table_id.to_bytes(6, "little") + b"\x01\x00"
    body += bytes([len(database)]) + database.encode() + b"\0"
    body += bytes([len(table)]) + table.encode() + b"\0"
    body += lenenc(count) + bytes(c.type for c in columns)
    metadata = b"".join(c.metadata for c in columns)
    body += lenenc(len(metadata)) + metadata
    body += bytes((count + 7) // 8 * [0xFF])  # (every column nullable)

    def field(field_type: int, value: bytes) -> bytes:
        return bytes([field_type]) + lenenc(len(value)) + value

    numeric = [c for c in columns if c.type in _NUMERIC]
    bits = 0
    for i, column in enumerate(numeric):
        if column.unsigned:
            bits |= 0x80 >> (i % 8) << (8 * (i // 8))
    optional = extra_optional
    if numeric:
        optional += field(1, bits.to_bytes((len(numeric) + 7) // 8, "little"))
    charsets = [c.collation for c in columns if c.collation is not None]
    if charsets:
        optional += field(3, b"".join(lenenc(c) for c in charsets))
    optional += field(4, b"".join(lenenc(len(c.name)) + c.name.encode() for c in columns))
    optional += field(8, b"".join(lenenc(i) for i in key))
    return body + optional


def write_rows_body(table_id: int, count: int, rows: list[list[bytes | None]]) -> bytes:
    """WRITE_ROWS_EVENT (v2, type 30): every column present; per row a null bitmap, then the
    values of the non-null columns in their binlog form."""
    body = table_id.to_bytes(6, "little") + b"\x00\x00" + b"\x02\x00" + lenenc(count)
    body += bytes((count + 7) // 8 * [0xFF])
    for row in rows:
        nulls = sum(1 << i for i, v in enumerate(row) if v is None)
        body += nulls.to_bytes((count + 7) // 8, "little")
        body += b"".join(v for v in row if v is not None)
    return body


def datetime2(year: int, month: int, day: int, hour: int, minute: int, second: int,
              micro: int, fsp: int) -> bytes:
    """DATETIME2(fsp): 5 bytes big-endian (sign, year*13+month, day, hour, minute, second),
    then the fraction in (fsp+1)//2 bytes big-endian."""
    ym = year * 13 + month
    packed = (1 << 39) | ym << 22 | day << 17 | hour << 12 | minute << 6 | second
    width = (fsp + 1) // 2
    fraction = micro // 10 ** (6 - 2 * width)
    return packed.to_bytes(5, "big") + (fraction.to_bytes(width, "big") if width else b"")
