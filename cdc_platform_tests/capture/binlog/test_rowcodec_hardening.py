"""The native rows decoder (capture/binlog/_rowcodec.c) against hostile or impossible inputs (issue 26,
decoder hardening): what a review and ASan/UBSan fuzzing found, each as the class behind it.

* A decoder has at least one column (a row of none consumes no bytes: the row loops never
  ended), is initialised exactly once (a second ``__init__`` freed the columns a running
  decode reads), and refuses to decode before a successful ``__init__``.
* Any decoder that can be built consumes any body: it returns rows or raises ``Unsupported``,
  both ways (``decode``, ``decode_columns``) alike (hypothesis).
* The first value of a string or binary column may be empty (a pointer was computed from NULL).
* Rows events no decoder reads exactly are refused by ``rowcodec`` itself, whatever the caller
  checked: MySQL's partial updates (binlog_row_value_options=PARTIAL_JSON), and rows of a
  table map of no columns.
* The same cases, and a fuzz run, under AddressSanitizer and UndefinedBehaviorSanitizer: the
  source compiled with both, in a child interpreter (skipped without gcc and libasan).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pymysql.protocol
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import PartialUpdateRowsEvent, TableMapEvent

from cdc_platform.capture.binlog import decoding as binlog_decoding
from cdc_platform.capture.binlog import patches as _patches  # noqa: F401 - installs them
from cdc_platform.capture.binlog import rowcodec
from cdc_platform.capture.binlog.columns import schema_from_table_map
from cdc_platform.capture.events import UnsupportedEvent
from cdc_platform_tests.capture.mysql_binlog_files import read_binlog
from cdc_platform_tests.capture.test_mysql_binlog_files import _library_events

pytestmark = pytest.mark.skipif(not rowcodec.available(), reason="native decoder not built")

_codec = rowcodec._rowcodec  # noqa: SLF001 - the extension under test


# -- the decoder's own contract ----------------------------------------------------------------

def test_a_decoder_of_no_columns_is_refused_at_construction():
    """With no columns, a non-empty body never ended ``decode``/``decode_columns``."""
    for empty in ([], (), iter(())):
        with pytest.raises(ValueError, match="at least one column"):
            _codec.Decoder(empty)


def test_a_decoder_never_initialised_refuses_to_decode():
    """``Decoder.__new__`` alone (or a failed ``__init__``) leaves a decoder of no columns."""
    bare = _codec.Decoder.__new__(_codec.Decoder)
    for body in (b"", b"\x00", b"\x00" * 9):  # (the empty body first: it never looped)
        for method in (bare.decode, bare.decode_columns):
            with pytest.raises(RuntimeError, match="before a successful __init__"):
                method(body, 1)
    failed = _codec.Decoder.__new__(_codec.Decoder)
    with pytest.raises(ValueError, match="unknown kind"):
        failed.__init__([(999, 0, 0)])
    with pytest.raises(RuntimeError, match="before a successful __init__"):
        failed.decode(b"\x00", 1)


def test_a_decoder_is_initialised_once_and_keeps_its_columns():
    decoder = _codec.Decoder([(_codec.K_TEXT, 1, 0)])
    with pytest.raises(RuntimeError, match="already initialised"):
        decoder.__init__([(_codec.K_INT8, 0, 0)])
    assert decoder.decode(b"\x00\x02hi", 1) == [("hi",)]


class _Reinitialising:
    """A SET member whose hash, asked for while a decode builds the set, initialises the
    decoder again: before, that freed the columns the decode went on reading."""

    decoder: Any = None
    refusals: list[str] = []

    def __hash__(self) -> int:
        try:
            _Reinitialising.decoder.__init__([(_codec.K_INT8, 0, 0)])
        except RuntimeError as error:
            _Reinitialising.refusals.append(str(error))
        return 1

    def __eq__(self, other: object) -> bool:
        return self is other


def test_a_member_cannot_reinitialise_its_decoder_mid_decode():
    members = (_Reinitialising(), _Reinitialising())
    decoder = _codec.Decoder([(_codec.K_SET, 1, 0, members), (_codec.K_TEXT, 1, 0)])
    _Reinitialising.decoder, _Reinitialising.refusals = decoder, []
    rows = decoder.decode(b"\x00\x03\x05hello" * 3, 1)
    assert rows == [(set(members), "hello")] * 3
    assert _Reinitialising.refusals and all("already initialised" in r
                                            for r in _Reinitialising.refusals)


def test_an_init_run_again_from_inside_itself_is_refused():
    """Arbitrary code runs inside ``__init__`` too (an iterable of ENUM members): an inner
    ``__init__`` completing first wins, the outer one refuses rather than replace it."""
    decoder = _codec.Decoder.__new__(_codec.Decoder)

    def members() -> Any:
        _codec.Decoder.__init__(decoder, [(_codec.K_INT8, 0, 0)])
        yield "a"

    with pytest.raises(RuntimeError, match="during its own __init__"):
        decoder.__init__([(_codec.K_ENUM, 1, 0, members())])
    assert decoder.decode(b"\x00\x05", 1) == [(5,)]


def test_empty_first_values_of_string_and_binary_targets():
    """The first value of a T_UTF8 or unpadded T_BINARY column empty: its data buffer did not
    exist yet, and the pointer to write to was computed from NULL (UBSan; the sanitizer test
    below runs this under it)."""
    specs = [(_codec.K_TEXT, 1, 0, None, _codec.T_UTF8, 0),
             (_codec.K_BYTES, 2, 0, None, _codec.T_BINARY, 0),
             (_codec.K_BYTES, 1, 0, None, _codec.T_BINARY, 3)]
    decoder = _codec.Decoder(specs)
    body = (b"\x00" + b"\x00" + b"\x00\x00" + b"\x00"  # (null bitmap, three empty values)
            + b"\x00" + b"\x01a" + b"\x01\x00b" + b"\x01c")
    count, (columns,) = decoder.decode_columns(body, 1)
    assert count == 2
    arrays = [rowcodec._array(t, count, c)  # noqa: SLF001 - the wrapping the engine uses
              for t, c in zip((pa.string(), pa.binary(), pa.binary()), columns, strict=True)]
    assert [a.to_pylist() for a in arrays] == [["", "a"], [b"", b"b"], [b"\x00" * 3, b"c\x00\x00"]]
    assert decoder.decode(body, 1) == [("", "", ""), ("a", b"b", b"c")]


# -- any decoder consumes any body ---------------------------------------------------------------

_KINDS = sorted(getattr(_codec, name) for name in dir(_codec) if name.startswith("K_"))
_TARGETS = sorted(getattr(_codec, name) for name in dir(_codec) if name.startswith("T_"))


@st.composite
def _spec(draw: st.DrawFn) -> tuple[Any, ...]:
    """A column spec, mostly one the decoder accepts (parameters in their ranges), sometimes
    anything near them."""
    kind = draw(st.sampled_from(_KINDS))
    if draw(st.integers(0, 9)) == 0:
        return (kind, draw(st.integers(-2, 70)), draw(st.integers(-2, 70)), None,
                draw(st.sampled_from([*_TARGETS, -1, 99])), draw(st.integers(-1, 20)))
    a = b = 0
    members = None
    if kind in (_codec.K_TEXT, _codec.K_BYTES):
        a = draw(st.integers(1, 4))
    elif kind in (_codec.K_ENUM, _codec.K_SET):
        a = draw(st.sampled_from([1, 2, 3, 4, 8]))
        members = draw(st.none() | st.lists(st.text(max_size=2), min_size=1, max_size=70)
                       .map(tuple))
    elif kind in (_codec.K_DATETIME2, _codec.K_TIMESTAMP2, _codec.K_TIME2):
        a = draw(st.integers(0, 6))
    elif kind == _codec.K_BIT:
        a = draw(st.integers(1, 64))
        b = (a + 7) // 8
    elif kind == _codec.K_DECIMAL:
        a = draw(st.integers(1, 65))
        b = draw(st.integers(0, a))
    return (kind, a, b, members, draw(st.sampled_from(_TARGETS)), draw(st.integers(0, 20)))


def _verdict(method: Any, body: bytes, images: int) -> Any:
    try:
        return method(body, images)
    except _codec.Unsupported:
        return None


@settings(max_examples=400, deadline=None)
@given(specs=st.lists(_spec(), max_size=6), body=st.binary(max_size=80),
       images=st.sampled_from([1, 2]))
def test_any_decoder_consumes_any_body(specs, body, images):
    """Every decoder that can be built ends on every body: rows, or ``Unsupported``; the
    column-wise decode refuses whatever the row-wise one refuses (and, where every column is
    T_OBJECT, exactly that), and otherwise reads as many rows."""
    if not specs:
        with pytest.raises(ValueError, match="at least one column"):
            _codec.Decoder(specs)
        return
    try:
        decoder = _codec.Decoder(specs)
    except ValueError:
        return  # (parameters out of their ranges, or a target the kind has not)
    rows = _verdict(decoder.decode, body, images)
    columns = _verdict(decoder.decode_columns, body, images)
    if rows is None:
        assert columns is None, "decode_columns read bytes decode refuses"
        return
    assert len(rows) <= len(body)  # (each row image consumes its null bitmap at least)
    if all(spec[4] == _codec.T_OBJECT for spec in specs):
        assert columns is not None, "decode_columns refused bytes decode reads"
    if columns is not None:
        assert columns[0] == len(rows)


# -- rows events no decoder may read ----------------------------------------------------------

_TABLE_ID = 77


def _event(event_type: int, payload: bytes) -> bytes:
    """A v4 event of ``payload`` with a (zero) checksum."""
    payload += b"\x00" * 4
    return struct.pack("<IBIIIH", 0, event_type, 1, 19 + len(payload), 0, 0) + payload


def _parse(raw_event: bytes, tables: dict) -> Any:
    """The event as the library parses it off a MySQL 8.0 stream."""
    ctl = SimpleNamespace(_get_dbms=lambda: "mysql", charset="utf8mb4")
    return BinLogPacketWrapper(
        pymysql.protocol.MysqlPacket(b"\x00" + raw_event, "utf8"), tables, ctl, (8, 0, 36),
        True, binlog_decoding.ALLOWED_EVENTS, None, None, None, None, False, False, False,
        True, False, False, None).event


def _table_map(tables: dict, types: bytes, names: list[bytes]) -> TableMapEvent:
    """The table map of ``db.t``: ``types`` (metadata-free MySQL types), all nullable, with
    the column names in its optional metadata."""
    named = b"".join(bytes([len(n)]) + n for n in names)
    metadata = bytes([4, len(named)]) + named if names else b""  # (4: COLUMN_NAME)
    payload = (_TABLE_ID.to_bytes(6, "little") + b"\x01\x00" + b"\x02db\x00" + b"\x01t\x00"
               + bytes([len(types)]) + types + b"\x00" + b"\xff" * ((len(types) + 7) // 8)
               + metadata)
    event = _parse(_event(0x13, payload), tables)  # TABLE_MAP_EVENT
    assert isinstance(event, TableMapEvent)
    return event


def _partial_update(tables: dict, columns: int, body: bytes) -> Any:
    """A PARTIAL_UPDATE_ROWS_EVENT (MySQL, binlog_row_value_options=PARTIAL_JSON) of ``body``:
    per row the before image, the value options (a packed int) and the after image."""
    bitmap = rowcodec._full_bitmap(columns)  # noqa: SLF001
    payload = (_TABLE_ID.to_bytes(6, "little") + b"\x00\x00" + b"\x02\x00" + bytes([columns])
               + bitmap + bitmap + body)
    return _parse(_event(0x27, payload), tables)


def _six_partial_updates() -> tuple[dict, TableMapEvent, Any, bytes]:
    """``UPDATE t SET n = 2 WHERE n = 0`` on ids 1..6 of ``t (id INT, n TINYINT)``, logged as
    partial updates (no JSON column: every value-options field is 0)."""
    tables: dict = {}
    table = _table_map(tables, b"\x03\x01", [b"id", b"n"])
    body = b"".join(b"\x00" + i.to_bytes(4, "little") + b"\x00" + b"\x00"
                    + b"\x00" + i.to_bytes(4, "little") + b"\x02" for i in range(1, 7))
    return tables, table, _partial_update(tables, 2, body), body


def test_a_partial_update_is_refused_by_every_decoder_entry():
    tables, table, event, body = _six_partial_updates()
    assert isinstance(event, PartialUpdateRowsEvent)
    # (why: the library reads six rows; row images read as plain ones are seven wrong rows)
    library = [(tuple(r["before_values"].values()), tuple(r["after_values"].values()))
               for r in event.rows]
    assert library == [((i, 0), (i, 2)) for i in range(1, 7)]
    plain = _codec.Decoder([(_codec.K_INT32, 0, 0), (_codec.K_INT8, 0, 0)]).decode(body, 2)
    assert len(plain) == 7

    schema = schema_from_table_map(table)
    event = _partial_update(tables, 2, body)
    entries = {"RowsDecoders.rows": lambda: rowcodec.RowsDecoders().rows(event),
               "RowsDecoders.columns": lambda: rowcodec.RowsDecoders().columns(event, schema),
               "decoder_for": lambda: rowcodec.decoder_for(event),
               "decoder_for(schema)": lambda: rowcodec.decoder_for(event, schema)}
    for name, entry in entries.items():
        with pytest.raises(UnsupportedEvent) as refused:
            entry()
        message = str(refused.value)
        assert "binlog_row_value_options='' (empty)" in message, name
        assert "table db.t" in message and "PARTIAL_JSON" in message, name


def test_mysql_s_own_partial_update_is_refused():
    """MySQL 8.0.22's bytes (binlog_row_value_options=PARTIAL_JSON, a JSON column updated in
    place), as the stream reads them."""
    events = _library_events(read_binlog("json.binlog.000001"),
                             [TableMapEvent, PartialUpdateRowsEvent])
    [partial] = [e for e in events if isinstance(e, PartialUpdateRowsEvent)]
    with pytest.raises(UnsupportedEvent, match=r"table mysql\.t: .*binlog_row_value_options=''"):
        rowcodec.RowsDecoders().rows(partial)


def test_a_partial_update_is_refused_after_a_decoder_was_built_for_its_table():
    """The decoders are kept per table map: a partial update after a plain update of the same
    table finds its decoder built, and is refused all the same."""
    tables, _, event, body = _six_partial_updates()
    decoders = rowcodec.RowsDecoders()
    plain = _parse(_event(0x1F, _TABLE_ID.to_bytes(6, "little") + b"\x00\x00\x02\x00\x02\x03\x03"
                          + b"\x00\x01\x00\x00\x00\x00" + b"\x00\x01\x00\x00\x00\x02"), tables)
    assert decoders.rows(plain) == [((1, 0), (1, 2))]  # (UPDATE_ROWS_EVENT_V2)
    with pytest.raises(UnsupportedEvent, match="binlog_row_value_options"):
        decoders.rows(_partial_update(tables, 2, body))


def test_the_partial_update_type_is_refused_whatever_class_parsed_it():
    as_plain_update = SimpleNamespace(event_type=0x27, schema="db", table="t", columns=[object()])
    with pytest.raises(UnsupportedEvent, match="binlog_row_value_options"):
        rowcodec.refuse_unreadable(as_plain_update)


def test_without_the_extension_a_partial_update_is_refused_all_the_same(monkeypatch):
    tables, _, event, _ = _six_partial_updates()
    monkeypatch.setattr(rowcodec, "_rowcodec", None)
    with pytest.raises(UnsupportedEvent, match="binlog_row_value_options"):
        rowcodec.RowsDecoders().rows(event)


def test_rows_of_a_table_map_of_no_columns_are_refused():
    """No table has no columns: such a table map is a damaged binlog, whose rows neither the
    extension nor the library (which then loops on a non-empty body) can step through."""
    tables: dict = {}
    _table_map(tables, b"", [])
    payload = _TABLE_ID.to_bytes(6, "little") + b"\x00\x00" + b"\x00" + b"\x00"
    event = _parse(_event(0x17, payload), tables)  # WRITE_ROWS_EVENT_V1
    assert event.columns == []
    for entry in (lambda: rowcodec.RowsDecoders().rows(event), lambda: rowcodec.decoder_for(event)):
        with pytest.raises(UnsupportedEvent, match="no columns"):
            entry()


# -- under the sanitizers ---------------------------------------------------------------------

_PROBE = textwrap.dedent('''
    import random, sys
    sys.path.insert(0, sys.argv[1])
    import _rowcodec as c

    # no columns, never initialised, initialised twice (and from a member mid-decode)
    for make in (lambda: c.Decoder([]), lambda: c.Decoder.__new__(c.Decoder).decode(b"\\0", 1)):
        try:
            make()
            raise SystemExit("accepted")
        except (ValueError, RuntimeError):
            pass
    class Member:
        def __hash__(self):
            try:
                holder[0].__init__([(c.K_INT8, 0, 0)])
            except RuntimeError:
                pass
            return 1
    holder = [c.Decoder([(c.K_SET, 1, 0, (Member(), Member())), (c.K_TEXT, 1, 0)])]
    assert len(holder[0].decode(b"\\0\\3\\5hello" * 4, 1)) == 4
    # empty first values of every variable-width target
    d = c.Decoder([(c.K_TEXT, 1, 0, None, c.T_UTF8, 0), (c.K_BYTES, 1, 0, None, c.T_BINARY, 0),
                   (c.K_BYTES, 4, 0, None, c.T_BINARY, 0)])
    assert d.decode_columns(b"\\0\\0\\0\\0\\0\\0\\0", 1)[0] == 1
    # any decoder on random bodies
    targets = {c.K_INT32: c.T_INT64, c.K_UINT64: c.T_DECIMAL128, c.K_FLOAT: c.T_FLOAT32,
               c.K_DOUBLE: c.T_FLOAT64, c.K_DATE: c.T_DATE32, c.K_DATETIME2: c.T_TIMESTAMP_US,
               c.K_TIMESTAMP2: c.T_TIMESTAMP_US, c.K_TEXT: c.T_UTF8, c.K_BYTES: c.T_BINARY,
               c.K_DECIMAL: c.T_DECIMAL128, c.K_YEAR: c.T_INT64}
    specs = [(c.K_DECIMAL, 65, 30), (c.K_DECIMAL, 38, 10), (c.K_BIT, 64, 8), (c.K_TIME2, 6, 0),
             (c.K_ENUM, 2, 0, ("a",)), (c.K_SET, 8, 0, tuple("abcdefgh")), (c.K_INT24, 0, 0)]
    specs += [(k, {c.K_TEXT: 2, c.K_BYTES: 1, c.K_DATETIME2: 3, c.K_TIMESTAMP2: 6,
                   c.K_DECIMAL: 20}.get(k, 0), 4 if k == c.K_DECIMAL else 0, None, t,
               3 if t == c.T_BINARY else 0) for k, t in targets.items()]
    rnd = random.Random(26)
    for _ in range(1500):
        d = c.Decoder(rnd.sample(specs, rnd.randint(1, 5)))
        body = bytes(rnd.choice([0, 0, 255, rnd.randrange(256)])
                     for _ in range(rnd.choice([0, 1, 3, 17, 90])))
        for images in (1, 2):
            for method in (d.decode, d.decode_columns):
                try:
                    method(body, images)
                except c.Unsupported:
                    pass
    print("clean")
''')


def _sanitizer_runtime() -> str | None:
    """libasan's path (it must be loaded before the interpreter), or None without gcc."""
    if shutil.which("gcc") is None:
        return None
    found = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                           text=True, check=False).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else None


def test_the_decoder_is_clean_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    libasan = _sanitizer_runtime()
    if libasan is None:
        pytest.skip("gcc with libasan is needed to build the sanitized decoder")
    source = Path(rowcodec.__file__).with_name("_rowcodec.c")  # (the extension's own folder)
    module = tmp_path / f"_rowcodec{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-g", "-std=c11",
                    "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                    "-fno-omit-frame-pointer", f"-I{sysconfig.get_paths()['include']}",
                    str(source), "-o", str(module)], check=True, capture_output=True)
    probe = tmp_path / "probe.py"
    probe.write_text(_PROBE)
    env = {**os.environ, "LD_PRELOAD": libasan, "ASAN_OPTIONS": "detect_leaks=0",
           "UBSAN_OPTIONS": "print_stacktrace=1"}
    run = subprocess.run([sys.executable, str(probe), str(tmp_path)], capture_output=True,
                         text=True, env=env, check=False, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "clean", run.stderr[-4000:]
    assert "runtime error" not in run.stderr and "Sanitizer" not in run.stderr, run.stderr
