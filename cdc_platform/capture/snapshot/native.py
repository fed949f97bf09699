"""Chunk reads over mysqlclient (libmariadb), straight into Arrow (issue 15).

PyMySQL parses every row packet in Python: a snapshot spent 80 % of its time there (15-40k
rows/s). mysqlclient reads rows in C; read *raw* (no per-value converters: every value as the
bytes the server sent, NULL as None) and transposed column-wise, a chunk becomes Arrow arrays
by Arrow's own casts (text -> int64, decimal128, float64, date32, timestamp), with no Python
per value. mysqlclient must be built against Debian's libmariadb-dev (scripts/bootstrap.sh).

Exactness: the landing values are the old path's to the bit (the type-matrix test compares
them). The old path decoded values as PyMySQL does (``source.SOURCE_DECODERS``) and then ran
``values.converter_for``; here a column kind is cast natively only where Arrow's cast of the
server's text gives the same value, and a chunk column the cast refuses (a zero or invalid
date, text that is not UTF-8, ...) goes through the old path's decoder and converter, for that
column of that chunk only: never a guess. Kinds without a native cast (BIT, JSON) always do.

The chunk's watermarks and SELECTs run on one mysqlclient connection in one consistent-snapshot
transaction (``watermark`` works over both drivers' DB-API); keys are decoded as PyMySQL decodes
them, because they are persisted (``reader.state``) and bound as parameters again.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pymysql.converters
from pymysql.constants import FIELD_TYPE

from cdc_platform.capture.schema import ColumnSpec, ColumnValueError, TableSchema
from cdc_platform.capture.source import SOURCE_DECODERS
from cdc_platform.capture.values import converter_for

try:
    import MySQLdb
    import MySQLdb._mysql
    import MySQLdb.connections
except ImportError:  # pragma: no cover - mysqlclient is a dependency (pyproject.toml)
    MySQLdb = None
try:
    from cdc_platform.capture.snapshot import _rawrows
except ImportError:  # (not built: chunks come through mysqlclient's rows, as before)
    _rawrows = None

_log = logging.getLogger(__name__)

# Errors of either driver: the snapshot path catches these where it caught pymysql's.
SQL_ERRORS: tuple[type[BaseException], ...] = (pymysql.MySQLError,) + (
    (MySQLdb.MySQLError,) if MySQLdb is not None else ())
OPERATIONAL_ERRORS: tuple[type[BaseException], ...] = (
    pymysql.err.OperationalError, pymysql.err.InterfaceError) + (
    (MySQLdb.OperationalError, MySQLdb.InterfaceError) if MySQLdb is not None else ())

# PyMySQL connection settings (``SourceSettings.connection_settings``) -> mysqlclient's names.
_SETTINGS = {"host": "host", "port": "port", "user": "user", "password": "password",
             "passwd": "password", "database": "database", "db": "database",
             "unix_socket": "unix_socket", "connect_timeout": "connect_timeout",
             "read_timeout": "read_timeout", "write_timeout": "write_timeout",
             "charset": "charset", "ssl": "ssl"}
# pymysql's ssl dict keys that mysqlclient reads the same way.
_SSL_KEYS = {"ca", "cert", "key", "capath", "cipher"}
_ENCODINGS = {"utf8mb4": "utf8", "utf8mb3": "utf8", "utf8": "utf8", "latin1": "cp1252"}


def available() -> bool:
    return MySQLdb is not None


def _columnar_available() -> bool:
    """Whether ``_rawrows`` may read results on mysqlclient's connections: built, and linked
    with the very client library mysqlclient uses (it reads that library's MYSQL handle, whose
    layout is the library's own)."""
    return (_rawrows is not None and MySQLdb is not None
            and _rawrows.client_info() == MySQLdb._mysql.get_client_info())


COLUMNAR = _columnar_available()


def is_native(conn: Any) -> bool:
    """Whether ``conn`` is a mysqlclient connection (else PyMySQL's)."""
    return MySQLdb is not None and isinstance(conn, MySQLdb.connections.Connection)


def native_settings(settings: dict[str, Any]) -> dict[str, Any] | None:
    """``settings`` (PyMySQL's keywords) as mysqlclient's, or None when one has no
    counterpart here (the reader then reads chunks with PyMySQL, as before, and says so)."""
    out: dict[str, Any] = {}
    for name, value in settings.items():
        if name not in _SETTINGS:
            return None
        if name == "ssl" and value:
            if not isinstance(value, dict) or set(value) - _SSL_KEYS - {"check_hostname"}:
                return None
            value = {k: v for k, v in value.items() if k in _SSL_KEYS}
        if name.endswith("_timeout") and value is not None:
            value = max(1, math.ceil(value))  # (whole seconds in libmariadb)
        out[_SETTINGS[name]] = value
    out.setdefault("charset", "utf8mb4")
    if out["charset"] not in _ENCODINGS:
        return None
    return out


def connect(settings: dict[str, Any]) -> Any:
    """A read-only, autocommit, UTC session on the source, as ``source.connect`` opens one,
    over mysqlclient. Raises ValueError when the settings have no mysqlclient form."""
    if MySQLdb is None:
        raise ValueError("mysqlclient is not installed (pip install the project)")
    mapped = native_settings(settings)
    if mapped is None:
        raise ValueError("connection settings without a mysqlclient form")
    # binary_prefix: bytes parameters as _binary'...', as source.connect asks PyMySQL.
    conn = MySQLdb.connect(**mapped, autocommit=True, binary_prefix=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION READ ONLY")
            cur.execute("SET time_zone = '+00:00'")
    except BaseException:
        conn.close()
        raise
    return conn


@contextlib.contextmanager
def raw_results(conn: Any) -> Iterator[None]:
    """Results created inside this block hold every value as bytes (PyMySQL's ``undecoded``
    for a mysqlclient connection: no text decoded, no number parsed)."""
    previous = conn.converter
    conn.converter = {}
    try:
        yield
    finally:
        conn.converter = previous


# ---- raw SELECTs ------------------------------------------------------------------------------


class RawResult:
    """A raw SELECT's rows (tuples of bytes/None) and its fields' MySQL types."""

    __slots__ = ("field_types", "rows")

    def __init__(self, rows: list[tuple[Any, ...]], field_types: tuple[int, ...]) -> None:
        self.rows = rows
        self.field_types = field_types


def render(conn: Any, sql: str, params: Sequence[Any]) -> bytes:
    """``sql`` (a ``%s`` format string, ``%%`` for a percent sign) with ``params`` as literals,
    as mysqlclient's cursor renders it."""
    text = sql.encode(conn.encoding)
    if not params:
        return text.replace(b"%%", b"%")
    return text % tuple(conn.literal(p) for p in params)


def query_raw(conn: Any, sql: str, params: Sequence[Any]) -> Any:
    """Run a SELECT; its result object, values unconverted. Streamed (``use_result``): the
    caller reads it with ``fetch_row`` and must read it to its end."""
    conn.query(render(conn, sql, params))
    with raw_results(conn):
        return conn.use_result()


def select_raw(conn: Any, sql: str, params: Sequence[Any]) -> RawResult:
    """A SELECT's rows, read whole, values unconverted."""
    conn.query(render(conn, sql, params))
    with raw_results(conn):
        result = conn.store_result()
    types = tuple(d[1] for d in result.describe())
    return RawResult(list(result.fetch_row(0, 0)), types)


class RawRows(Sequence[tuple[Any, ...]]):
    """A SELECT's rows as raw Arrow binary columns (each value the bytes the server sent, NULL
    as null), in blocks as the SELECTs of a chunk read them. Rows as tuples are made only
    when asked for, one at a time: the chunk path asks for a few (the last key, a collated
    key's group) and takes the rest column-wise."""

    def __init__(self, width: int, blocks: list[list[pa.Array]] | None = None) -> None:
        self.width = width
        self._blocks = [b for b in blocks or () if b and len(b[0])]
        self._count = sum(len(b[0]) for b in self._blocks)

    def columns(self) -> list[pa.Array]:
        """The rows column-wise, one binary array a column."""
        if not self._blocks:
            return [pa.array([], pa.binary()) for _ in range(self.width)]
        if len(self._blocks) > 1:
            self._blocks = [[pa.concat_arrays(parts) for parts in zip(*self._blocks,
                                                                      strict=True)]]
        return self._blocks[0]

    def __len__(self) -> int:
        return self._count

    def _row(self, index: int) -> tuple[Any, ...]:
        for block in self._blocks:
            if index < len(block[0]):
                return tuple(column[index].as_py() for column in block)
            index -= len(block[0])
        raise IndexError(index)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._row(i) for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(index)
        return self._row(index)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return (self._row(i) for i in range(self._count))

    def __iadd__(self, other: Sequence[tuple[Any, ...]]) -> RawRows:
        """Append a block (another RawRows) or a few rows as tuples."""
        if isinstance(other, RawRows):
            blocks = other._blocks  # noqa: SLF001 - the same class
        else:
            rows = list(other)
            blocks = [[pa.array(values, pa.binary()) for values in zip(*rows, strict=True)]
                      ] if rows else []
        self._blocks += blocks
        self._count += sum(len(b[0]) for b in blocks)
        return self


class ColumnarRead:
    """One SELECT read by ``read_columns``: its rows, the bytes counted against the budget,
    whether the budget cut them, and the fields' MySQL types."""

    __slots__ = ("cut", "field_types", "rows", "size")

    def __init__(self, rows: RawRows, size: int, cut: bool, field_types: tuple[int, ...]
                 ) -> None:
        self.rows, self.size, self.cut, self.field_types = rows, size, cut, field_types


def read_columns(conn: Any, sql: str, params: Sequence[Any], variable: Sequence[int],
                 fixed: int, max_bytes: int = -1, take_one: bool = False) -> ColumnarRead:
    """Run a SELECT on a mysqlclient connection and read its result column-wise in C
    (``_rawrows``), up to the row that would pass ``max_bytes`` (the first row always, with
    ``take_one``; no budget when negative), counted as ``keyset._within_budget`` counts: the
    lengths of the ``variable`` columns' values, ``fixed`` per row for the rest.

    Each column arrives as Arrow binary buffers (validity or None, int32 offsets, data), filled
    by capture/_arrowbuf.h as the rows decoder fills its own, and wrapped here without a copy.
    """
    conn.query(render(conn, sql, params))
    # (arguments go to C as given: refusing one, it still reads the result off the wire)
    out = _rawrows.read_result(conn._get_native_connection(), variable, fixed, max_bytes,
                               take_one)
    if out[0] is None:
        # (the server or the connection failed mid-result: mysqlclient raises the same class)
        raise MySQLdb.OperationalError(out[1], out[2])
    field_types, count, size, cut, columns = out
    arrays = [pa.Array.from_buffers(pa.binary(), count, [
        None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets),
        pa.py_buffer(data)], null_count=nulls) for validity, offsets, data, nulls in columns]
    return ColumnarRead(RawRows(len(arrays), [arrays]), size, cut, field_types)


def repeated_key(columns: Sequence[pa.Array], key_indexes: Sequence[int],
                 landed: Sequence[pa.Array | pa.ChunkedArray] | None = None) -> bool:
    """Whether two rows have the same key (raw values; NULL the same as NULL). ``landed``: the
    same columns in landing types, when built: a one-column key of numbers or times that rises
    strictly (the chunk's SELECT orders by it) has no repeat, with no hashing."""
    if not columns or len(columns[0]) < 2:
        return False
    if landed is not None and len(key_indexes) == 1:
        key = landed[key_indexes[0]]
        if not key.null_count and (pa.types.is_integer(key.type) or pa.types.is_temporal(
                key.type) or pa.types.is_decimal(key.type)) and pc.all(
                pc.greater(key[1:], key[:-1])).as_py():
            return False
    if len(key_indexes) == 1:
        return len(pc.unique(columns[key_indexes[0]])) != len(columns[0])
    keys = pa.table({f"k{n}": columns[i] for n, i in enumerate(key_indexes)})
    return keys.group_by(keys.column_names).aggregate([]).num_rows != keys.num_rows


# ---- values as PyMySQL decodes them -----------------------------------------------------------

_TEXT_TYPES = {FIELD_TYPE.BIT, FIELD_TYPE.BLOB, FIELD_TYPE.LONG_BLOB, FIELD_TYPE.MEDIUM_BLOB,
               FIELD_TYPE.STRING, FIELD_TYPE.TINY_BLOB, FIELD_TYPE.VAR_STRING,
               FIELD_TYPE.VARCHAR, FIELD_TYPE.GEOMETRY}
_BINARY_KINDS = frozenset({"binary", "bit"})


def pymysql_decoder(column: ColumnSpec, field_type: int, encoding: str = "utf8"
                    ) -> Callable[[Any], Any]:
    """Raw bytes of ``column`` -> the value PyMySQL's source session returned for them
    (``connections.MySQLResult._get_descriptions`` and ``source.SOURCE_DECODERS``).

    PyMySQL decodes a text-typed field with the connection's encoding unless its charset is
    binary (a binary column, BIT, or a CAST AS BINARY: the column's kind says which), JSON with
    the connection's encoding, anything else as ASCII; then the field type's decoder.
    """
    if field_type == FIELD_TYPE.JSON:
        decode: str | None = encoding
    elif field_type in _TEXT_TYPES:
        decode = None if column.kind in _BINARY_KINDS else encoding
    else:
        decode = "ascii"
    converter = SOURCE_DECODERS.get(field_type)
    if converter is pymysql.converters.through:
        converter = None

    def value(raw: Any) -> Any:
        if raw is None:
            return None
        data = raw.decode(decode) if decode is not None else raw
        return converter(data) if converter is not None else data

    return value


def decode_key(columns: Sequence[ColumnSpec], field_types: Sequence[int],
               raw: Sequence[Any], encoding: str = "utf8") -> tuple[Any, ...]:
    """A raw key as PyMySQL decodes it (the form keys are persisted and bound in)."""
    return tuple(pymysql_decoder(c, t, encoding)(v)
                 for c, t, v in zip(columns, field_types, raw, strict=True))


# ---- raw columns -> Arrow -----------------------------------------------------------------------

_NULL_TEXT = pa.scalar(None, pa.string())
_ZERO_DATE = "0000-00-00"


def _text(raw: pa.Array) -> pa.Array:
    """ASCII text of a number or a date: the bytes reinterpreted, not validated (the casts
    that follow refuse anything that is not their syntax)."""
    return raw.view(pa.string())


def _without_zero_dates(text: pa.Array) -> pa.Array:
    """Zero dates ('0000-00-00...') as NULL: PyMySQL returned their text, which lands NULL."""
    zero = pc.starts_with(text, _ZERO_DATE)
    return pc.if_else(zero, _NULL_TEXT, text) if pc.any(zero).as_py() else text


def _years_valid(values: pa.Array) -> bool:
    """Python's dates start at year 1 (PyMySQL returned the text of year 0, landed NULL)."""
    if values.null_count == len(values):
        return True
    low = pc.min(pc.year(values)).as_py()
    return low is None or low >= 1


def _cast_date(raw: pa.Array) -> pa.Array | None:
    # (exactly YYYY-MM-DD: Arrow's date parser would take other forms Python's would not)
    text = _without_zero_dates(_text(raw))
    if pc.any(pc.invert(pc.match_substring_regex(text, r"^\d{4}-\d{2}-\d{2}$"))).as_py():
        return None
    dates = pc.cast(text, pa.date32())
    return dates if _years_valid(dates) else None


_DATETIME = r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,6})?$"


def _cast_datetime(raw: pa.Array, utc: bool) -> pa.Array | None:
    text = _without_zero_dates(_text(raw))
    if pc.any(pc.invert(pc.match_substring_regex(text, _DATETIME))).as_py():
        return None
    stamps = pc.cast(text, pa.timestamp("us"))
    if not _years_valid(stamps):
        return None
    return stamps.cast(pa.timestamp("us", tz="UTC")) if utc else stamps


def _native_array(column: ColumnSpec, raw: pa.Array) -> pa.Array | None:
    """``raw`` (binary) as the column's landing array by Arrow casts; None where the kind has
    none, or this chunk's values need the old path (see the module doc)."""
    kind = column.kind
    if kind in ("int", "year"):
        return pc.cast(_text(raw), pa.int64())
    if kind == "uint64":
        return pc.cast(_text(raw), pa.decimal128(20, 0))
    if kind == "decimal":
        target = column.arrow_type()
        if pa.types.is_string(target):
            return _text(raw)  # (wider than 38 digits: the server's plain text)
        return pc.cast(_text(raw), target)
    if kind == "double":
        return pc.cast(_text(raw), pa.float64())
    if kind == "float":
        # (read as DOUBLE text, ``select_expression``; narrowed as struct.pack('<f') does)
        return pc.cast(pc.cast(_text(raw), pa.float64()), pa.float32(), safe=False)
    if kind == "date":
        return _cast_date(raw)
    if kind == "datetime":
        return _cast_datetime(raw, utc=False)
    if kind == "timestamp":
        return _cast_datetime(raw, utc=True)
    if kind in ("string", "enum", "time"):
        return raw.cast(pa.string())  # (validates UTF-8)
    if kind == "set":
        text = raw.cast(pa.string())
        empty = pc.equal(text, "")
        return pc.if_else(empty, _NULL_TEXT, text) if pc.any(empty).as_py() else text
    if kind == "binary":
        return raw
    return None  # bit, json: the old path's converters


def _python_array(column: ColumnSpec, field_type: int, values: Sequence[Any],
                  encoding: str) -> pa.Array:
    """The old path for one column: PyMySQL's decoding, the landing converter, pa.array."""
    decode = pymysql_decoder(column, field_type, encoding)
    convert = converter_for(column, from_binlog=False)
    if isinstance(values, pa.Array):
        values = values.to_pylist()
    try:
        decoded = [decode(v) for v in values]
        landed = decoded if convert is None else [convert(v) for v in decoded]
        return pa.array(landed, column.arrow_type())
    except (UnicodeDecodeError, ValueError, TypeError, OverflowError, pa.ArrowInvalid,
            pa.ArrowTypeError) as error:
        if isinstance(error, ColumnValueError):
            raise
        raise ColumnValueError(column, error) from error


def landing_columns(schema: TableSchema, columns: Sequence[Sequence[Any] | pa.Array],
                    field_types: Sequence[int], encoding: str = "utf8") -> list[pa.Array]:
    """Raw chunk columns (bytes/None, schema order) as landing Arrow arrays."""
    arrays = []
    for column, values, field_type in zip(schema.columns, columns, field_types, strict=True):
        array = None
        if column.kind not in ("bit", "json"):
            try:
                raw = values if isinstance(values, pa.Array) else pa.array(values, pa.binary())
                array = _native_array(column, raw)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                array = None  # (this chunk's values: the old path decides, or names the error)
        if array is None:
            array = _python_array(column, field_type, values, encoding)
        arrays.append(array)
    return arrays


def encoding_of(conn: Any) -> str:
    """The Python codec PyMySQL used for the connection's charset."""
    return _ENCODINGS.get(conn.character_set_name(), "utf8")


class ArrowRows(Sequence[tuple[Any, ...]]):
    """A chunk's rows in landing form, made from its Arrow table only when asked for (the
    snapshot path needs only their count; tests and diagnostics look at them). The table
    itself may be built when first asked for (``build``: the reader casts a chunk in its
    writer thread while it reads the next one); its row count is known before."""

    def __init__(self, table: pa.Table | None = None, *,
                 build: Callable[[], pa.Table] | None = None, count: int | None = None
                 ) -> None:
        if table is None and (build is None or count is None):
            raise ValueError("ArrowRows needs a table, or a build function and a row count")
        self._table = table
        self._build = build
        self._count = table.num_rows if table is not None else count
        self._rows: list[tuple[Any, ...]] | None = None

    @property
    def table(self) -> pa.Table:
        """The rows as a landing Arrow table (built now if it was not)."""
        if self._table is None:
            assert self._build is not None
            self._table = self._build()
            self._build = None
        return self._table

    def _materialised(self) -> list[tuple[Any, ...]]:
        if self._rows is None:
            columns = []
            for array in self.table.columns:
                if pa.types.is_timestamp(array.type) and array.type.tz is not None:
                    array = array.cast(pa.timestamp(array.type.unit))  # naive UTC, as landed
                columns.append(array.to_pylist())
            self._rows = list(zip(*columns, strict=True))
        return self._rows

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: Any) -> Any:
        return self._materialised()[index]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._materialised())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]
