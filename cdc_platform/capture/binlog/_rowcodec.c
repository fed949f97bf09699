/* Native decoding of binlog rows-event bodies: the rows part of a WRITE/UPDATE/DELETE rows
 * event (after the columns-present bitmap(s)) -> a list of row tuples in column order.
 *
 * Every value equals, in type and value, what mysql-replication 1.0.17 returns for the column
 * as cdc_platform patches it (capture/binlog/stream.py): the Python side (capture/binlog/rowcodec.py) builds
 * one Decoder per table map, only when every column is of a kind decoded here, and falls back
 * to the library for anything else. Whenever the library would raise on the bytes (truncated
 * data, invalid UTF-8 in a UTF-8 column, an ENUM index past its members, a fraction out of
 * range), this raises ``Unsupported`` instead, and the caller lets the library decode the event
 * (and raise its own error). No value is ever guessed.
 *
 * ``decode_columns`` reads the same bytes column-wise, and writes the columns that have a
 * landing *target* straight into Arrow buffers: no Python object per value. A target is the
 * Arrow layout of the column's landing type (capture/schema.py ColumnSpec.arrow_type), and the
 * value written there is the one the tuple path lands: ``pa.array([converter(v) for v in
 * values], type)`` with capture/values.py ``converter_for(column, from_binlog=True)``, bit for
 * bit. Where that path would fail (a DECIMAL that does not fit its decimal128), this raises
 * ``Unsupported`` too, so that the caller takes the tuple path and fails as loudly as before.
 *
 * Hostile inputs (issue 26: review, ASan/UBSan fuzzing) are refused, never trusted: a Decoder
 * has at least one column, so every row image consumes at least its null bitmap and the row
 * loops always advance; it is initialised exactly once (its columns are never freed while a
 * decode that reads them runs: a second __init__ raises); no pointer is taken into a buffer
 * that does not exist yet. The event kinds whose row images are not plain images (MySQL's
 * partial JSON updates) are refused by the Python side before any bytes reach this file.
 *
 * The boundary: Decoder(columns) takes one (kind, a, b, members, target, target_arg) tuple a
 * column, made in one place, ``ColumnCodec.native`` (capture/binlog/rowcodec.py), where each kind's
 * meaning of ``a`` and ``b`` is named; ``KINDS`` and ``TARGETS`` (name -> value) are the
 * constants the Python side builds its enums from. Arrow buffers are capture/_arrowbuf.h's,
 * shared with the chunk reader (capture/snapshot/_rawrows.c).
 *
 * Return conventions (as in capture/snapshot/_rawrows.c and capture/_arrowbuf.h): a function
 * returning PyObject * gives a new reference, or NULL with a Python exception set
 * (``Unsupported`` when the library must decode the event); an int function gives 1 on
 * success and 0 with an exception set, and where a value may be NULL (read_date,
 * read_datetime2, put_value) -1 for NULL, nothing written; decimal_text gives a length, or -1
 * with an exception set. Predicates (valid_utf8, decimal_groups: "the fast path applies",
 * target_fits, is_varwidth) give 1 or 0 and set nothing. tp_init (Decoder_init) keeps
 * CPython's 0 / -1.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../_arrowbuf.h"

/* Column kinds (the Python side reads these constants from the module). */
enum {
    K_INT8 = 1, K_UINT8, K_INT16, K_UINT16, K_INT24, K_UINT24, K_INT32, K_UINT32,
    K_INT64, K_UINT64, K_FLOAT, K_DOUBLE, K_DECIMAL, K_DATE, K_DATETIME2, K_TIMESTAMP2,
    K_TIME2, K_YEAR, K_TEXT, K_BYTES, K_ENUM, K_SET, K_BIT
};

/* Landing targets of decode_columns (T_OBJECT: a list of the values decode gives). */
enum {
    T_OBJECT = 0, T_INT64, T_DECIMAL128, T_FLOAT32, T_FLOAT64, T_DATE32, T_TIMESTAMP_US,
    T_UTF8, T_BINARY
};

/* One column as Decoder_init names the spec's positional (a, b) for its kind (name_arguments);
 * a field the kind does not read stays 0. */
typedef struct {
    int kind;
    int length_bytes;  /* TEXT, BYTES: the little-endian length before each value (1..4) */
    int fsp;           /* DATETIME2, TIMESTAMP2, TIME2: fraction digits (0..6) */
    int precision;     /* DECIMAL (1..65) */
    int scale;         /* DECIMAL (0..precision) */
    int storage_bytes; /* ENUM, SET: bytes of the index or mask; BIT: bytes of the bits */
    int bits;          /* BIT (1..64) */
    PyObject *values;  /* ENUM/SET members (a tuple), or NULL when the library has none */
    int target;       /* T_*: where decode_columns puts the column's values */
    int target_arg;   /* T_BINARY: the length values are padded to with 0x00 (BINARY(n)) */
    /* DECIMAL layout, derived from precision and scale as the library does */
    int dec_comp_int, dec_uncomp_int, dec_uncomp_frac, dec_comp_frac, dec_size;
} Column;

typedef struct {
    PyObject_HEAD
    Py_ssize_t ncols;
    Column *cols;
} Decoder;

static PyObject *Unsupported;  /* the library must decode this event */
static PyObject *DecimalType;
static PyObject *EmptyStr;

static const int DIG2BYTES[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};

typedef struct {
    const unsigned char *p;
    Py_ssize_t pos;
    Py_ssize_t len;
} Reader;

static int need(Reader *r, Py_ssize_t n) {
    if (n < 0 || r->len - r->pos < n) {
        PyErr_SetString(Unsupported, "rows data ends inside a value");
        return 0;
    }
    return 1;
}

static uint64_t le_uint(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint64_t be_uint(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* The library's read_int_be_by_size for 1..4 bytes: signed big-endian. */
static int64_t be_int(const unsigned char *p, int n) {
    uint64_t v = be_uint(p, n);
    int bits = 8 * n;
    if (v & ((uint64_t)1 << (bits - 1))) return (int64_t)v - ((int64_t)1 << bits);
    return (int64_t)v;
}

static void unsupported(const char *what) { PyErr_SetString(Unsupported, what); }

/* RowsEvent.__read_fsp: microseconds from the fraction bytes (signed big-endian read). */
static int read_fsp(Reader *r, int fsp, int64_t *out) {
    int n = (fsp == 1 || fsp == 2) ? 1 : (fsp == 3 || fsp == 4) ? 2 : (fsp == 5 || fsp == 6) ? 3 : 0;
    if (n == 0) { *out = 0; return 1; }
    if (!need(r, n)) return 0;
    int64_t v = be_int(r->p + r->pos, n);
    r->pos += n;
    if (fsp % 2) v = v / 10;  /* int(v / 10): truncation toward zero, as C does */
    int64_t scale = 1;
    for (int i = fsp; i < 6; i++) scale *= 10;
    *out = v * scale;
    return 1;
}

static int is_leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

static int days_in_month(int y, int m) {
    static const int dim[13] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return (m == 2 && is_leap(y)) ? 29 : dim[m];
}

/* What datetime.date()/datetime() accept. */
static int valid_date(long y, long m, long d) {
    return y >= 1 && y <= 9999 && m >= 1 && m <= 12 && d >= 1 && d <= days_in_month((int)y, (int)m);
}

/* Days since 1970-01-01 -> proleptic Gregorian civil date (H. Hinnant's algorithm). */
static void civil_from_days(int64_t z, int *y, int *m, int *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t yy = yoe + era * 400;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = (int)(yy + (*m <= 2));
}

static int64_t floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

/* An integer column's value at ``r`` (K_INT8 .. K_UINT64; K_UINT64 as its 64 bits): what
 * both decoders read. 0 when the data ends inside it. */
static int read_integer(Reader *r, int kind, int64_t *out) {
    static const int WIDTH[] = {[K_INT8] = 1, [K_UINT8] = 1, [K_INT16] = 2, [K_UINT16] = 2,
                                [K_INT24] = 3, [K_UINT24] = 3, [K_INT32] = 4, [K_UINT32] = 4,
                                [K_INT64] = 8, [K_UINT64] = 8};
    int width = WIDTH[kind];
    if (!need(r, width)) return 0;
    uint64_t v = le_uint(r->p + r->pos, width);
    r->pos += width;
    switch (kind) {
    case K_INT8: *out = (int8_t)v; break;
    case K_INT16: *out = (int16_t)v; break;
    case K_INT24: *out = v >= 0x800000 ? (int64_t)v - 0x1000000 : (int64_t)v; break;
    case K_INT32: *out = (int32_t)(uint32_t)v; break;
    default: *out = (int64_t)v;  /* unsigned kinds, and K_INT64 */
    }
    return 1;
}

typedef struct {
    long year, month, day, hour, minute, second;
    int64_t us;  /* the fraction, 0 .. 999999 */
} Civil;

/* The patched __read_date: 1 with the date, -1 for a zero or invalid date (None), 0 when the
 * data ends inside it. */
static int read_date(Reader *r, Civil *t) {
    if (!need(r, 3)) return 0;
    long v = (long)le_uint(r->p + r->pos, 3);
    r->pos += 3;
    t->year = (v >> 9) & 0x7FFF, t->month = (v >> 5) & 0xF, t->day = v & 0x1F;
    return valid_date(t->year, t->month, t->day) ? 1 : -1;
}

/* RowsEvent.__read_datetime2 as patched: 1 with the value, -1 for a zero or invalid one
 * (None), 0 with ``Unsupported`` set (data ends, a fraction out of range). */
static int read_datetime2(Reader *r, int fsp, Civil *t) {
    if (!need(r, 5)) return 0;
    uint64_t v = be_uint(r->p + r->pos, 5);
    r->pos += 5;
    long ym = (long)((v >> 22) & 0x1FFFF);
    t->year = ym / 13, t->month = ym % 13;
    t->day = (long)((v >> 17) & 0x1F), t->hour = (long)((v >> 12) & 0x1F);
    t->minute = (long)((v >> 6) & 0x3F), t->second = (long)(v & 0x3F);
    if (!read_fsp(r, fsp, &t->us)) return 0;
    if (!valid_date(t->year, t->month, t->day) || t->hour > 23 || t->minute > 59 ||
        t->second > 59)
        return -1;
    if (t->us > 999999) { unsupported("DATETIME2 fraction out of range"); return 0; }
    if (t->us < 0) t->us = 0;
    return 1;
}

/* RowsEvent.__read_timestamp2: signed 4-byte big-endian seconds since the epoch and the
 * fraction (0 .. 999999); 0 with ``Unsupported`` set (data ends, a fraction out of range). */
static int read_timestamp2(Reader *r, int fsp, int64_t *secs, int64_t *us) {
    if (!need(r, 4)) return 0;
    *secs = be_int(r->p + r->pos, 4);
    r->pos += 4;
    if (!read_fsp(r, fsp, us)) return 0;
    if (*us > 999999) { unsupported("TIMESTAMP2 fraction out of range"); return 0; }
    if (*us < 0) *us = 0;
    return 1;
}

/* A string or blob value: ``length_bytes`` of little-endian length, then its bytes. */
static int read_counted(Reader *r, int length_bytes, const unsigned char **s, Py_ssize_t *n) {
    if (!need(r, length_bytes)) return 0;
    *n = (Py_ssize_t)le_uint(r->p + r->pos, length_bytes);
    r->pos += length_bytes;
    if (!need(r, *n)) return 0;
    *s = r->p + r->pos;
    r->pos += *n;
    return 1;
}

/* Room for decimal_text (65 digits in groups of up to 11 characters, a sign and a point). */
#define DECIMAL_TEXT 160

/* RowsEvent.__read_new_decimal's text of the value at ``r`` (the library then reads it with
 * decimal.Decimal): its length, or -1 with Unsupported set. */
static int decimal_text(Reader *r, const Column *c, char text[DECIMAL_TEXT]) {
    const size_t room = DECIMAL_TEXT;
    if (!need(r, c->dec_size)) return -1;
    unsigned char buf[64];
    memcpy(buf, r->p + r->pos, (size_t)c->dec_size);
    r->pos += c->dec_size;
    int at = 0;
    int64_t mask;
    if (buf[0] & 0x80) {
        mask = 0;
    } else {
        mask = -1;
        text[at++] = '-';
    }
    buf[0] ^= 0x80;
    const unsigned char *p = buf;
    int size = DIG2BYTES[c->dec_comp_int];
    if (size > 0) {
        at += snprintf(text + at, room - (size_t)at, "%lld", (long long)(be_int(p, size) ^ mask));
        p += size;
    }
    for (int i = 0; i < c->dec_uncomp_int; i++) {
        at += snprintf(text + at, room - (size_t)at, "%09lld", (long long)(be_int(p, 4) ^ mask));
        p += 4;
    }
    text[at++] = '.';
    for (int i = 0; i < c->dec_uncomp_frac; i++) {
        at += snprintf(text + at, room - (size_t)at, "%09lld", (long long)(be_int(p, 4) ^ mask));
        p += 4;
    }
    size = DIG2BYTES[c->dec_comp_frac];
    if (size > 0) {
        at += snprintf(text + at, room - (size_t)at, "%0*lld", c->dec_comp_frac,
                       (long long)(be_int(p, size) ^ mask));
    }
    if (at >= (int)room - 1) { unsupported("decimal text too long"); return -1; }
    return at;
}

/* RowsEvent.__read_new_decimal: decimal.Decimal(decimal_text). */
static PyObject *read_decimal(Reader *r, const Column *c) {
    char text[DECIMAL_TEXT];
    int at = decimal_text(r, c, text);
    if (at < 0) return NULL;
    PyObject *s = PyUnicode_FromStringAndSize(text, at);
    if (s == NULL) return NULL;
    PyObject *value = PyObject_CallOneArg(DecimalType, s);
    Py_DECREF(s);
    if (value == NULL) {  /* (the library's Decimal() raises the same on such bytes) */
        PyErr_Clear();
        unsupported("decimal bytes the library cannot read");
    }
    return value;
}

static PyObject *read_value(Reader *r, const Column *c) {
    switch (c->kind) {
    case K_INT8: case K_UINT8: case K_INT16: case K_UINT16: case K_INT24: case K_UINT24:
    case K_INT32: case K_UINT32: case K_INT64: {
        int64_t v;
        if (!read_integer(r, c->kind, &v)) return NULL;
        return PyLong_FromLongLong(v);
    }
    case K_UINT64: {
        int64_t v;
        if (!read_integer(r, c->kind, &v)) return NULL;
        return PyLong_FromUnsignedLongLong((uint64_t)v);
    }
    case K_FLOAT: {
        if (!need(r, 4)) return NULL;
        uint32_t bits = (uint32_t)le_uint(r->p + r->pos, 4);
        r->pos += 4;
        float f;
        memcpy(&f, &bits, 4);
        return PyFloat_FromDouble((double)f);
    }
    case K_DOUBLE: {
        if (!need(r, 8)) return NULL;
        uint64_t bits = le_uint(r->p + r->pos, 8);
        r->pos += 8;
        double d;
        memcpy(&d, &bits, 8);
        return PyFloat_FromDouble(d);
    }
    case K_DECIMAL:
        return read_decimal(r, c);
    case K_DATE: {
        Civil t;
        int got = read_date(r, &t);
        if (got <= 0) { if (got < 0) Py_RETURN_NONE; return NULL; }
        return PyDate_FromDate((int)t.year, (int)t.month, (int)t.day);
    }
    case K_DATETIME2: {
        Civil t;
        int got = read_datetime2(r, c->fsp, &t);
        if (got <= 0) { if (got < 0) Py_RETURN_NONE; return NULL; }
        return PyDateTime_FromDateAndTime((int)t.year, (int)t.month, (int)t.day, (int)t.hour,
                                          (int)t.minute, (int)t.second, (int)t.us);
    }
    case K_TIMESTAMP2: {
        /* datetime.utcfromtimestamp(seconds), naive UTC */
        int64_t secs, us;
        if (!read_timestamp2(r, c->fsp, &secs, &us)) return NULL;
        int64_t days = floordiv(secs, 86400), rest = secs - days * 86400;
        int y, m, d;
        civil_from_days(days, &y, &m, &d);
        return PyDateTime_FromDateAndTime(y, m, d, (int)(rest / 3600), (int)(rest / 60 % 60),
                                          (int)(rest % 60), (int)us);
    }
    case K_TIME2: {
        if (!need(r, 3)) return NULL;
        uint32_t raw = (uint32_t)be_uint(r->p + r->pos, 3);
        r->pos += 3;
        int positive = (raw >> 23) & 1;
        uint32_t bits = positive ? raw : ((0x1000000u - raw) & 0xFFFFFFu);
        int64_t hours = (bits >> 12) & 0x3FF, minutes = (bits >> 6) & 0x3F, seconds = bits & 0x3F;
        int64_t us;
        if (!read_fsp(r, c->fsp, &us)) return NULL;
        int64_t total = ((hours * 60 + minutes) * 60 + seconds) * 1000000 + us;
        if (!positive) total = -total;
        int64_t days = floordiv(total, 86400000000LL);
        int64_t rest = total - days * 86400000000LL;
        return PyDelta_FromDSU((int)days, (int)(rest / 1000000), (int)(rest % 1000000));
    }
    case K_YEAR:
        if (!need(r, 1)) return NULL;
        return PyLong_FromLong(1900 + r->p[r->pos++]);
    case K_TEXT:
    case K_BYTES: {
        const unsigned char *bytes;
        Py_ssize_t n;
        if (!read_counted(r, c->length_bytes, &bytes, &n)) return NULL;
        const char *s = (const char *)bytes;
        if (n == 0) {  /* b''.decode(any codec) is '' */
            Py_INCREF(EmptyStr);
            return EmptyStr;
        }
        if (c->kind == K_BYTES) return PyBytes_FromStringAndSize(s, n);
        PyObject *text = PyUnicode_DecodeUTF8(s, n, "strict");
        if (text == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            unsupported("invalid UTF-8 in a UTF-8 column");
        }
        return text;
    }
    case K_ENUM: {
        if (!need(r, c->storage_bytes)) return NULL;
        uint64_t index = le_uint(r->p + r->pos, c->storage_bytes);
        r->pos += c->storage_bytes;
        if (c->values == NULL) Py_RETURN_NONE;
        if (index >= (uint64_t)PyTuple_GET_SIZE(c->values)) {
            unsupported("ENUM index past its members");
            return NULL;
        }
        PyObject *member = PyTuple_GET_ITEM(c->values, (Py_ssize_t)index);
        Py_INCREF(member);
        return member;
    }
    case K_SET: {
        if (!need(r, c->storage_bytes)) return NULL;
        uint64_t mask = le_uint(r->p + r->pos, c->storage_bytes);
        r->pos += c->storage_bytes;
        if (c->values == NULL || mask == 0) Py_RETURN_NONE;
        Py_ssize_t count = PyTuple_GET_SIZE(c->values);
        if (count > 64) count = 64;
        PyObject *members = PySet_New(NULL);
        if (members == NULL) return NULL;
        for (Py_ssize_t i = 0; i < count; i++) {
            if ((mask >> i) & 1) {
                if (PySet_Add(members, PyTuple_GET_ITEM(c->values, i)) < 0) {
                    Py_DECREF(members);
                    return NULL;
                }
            }
        }
        if (PySet_GET_SIZE(members) == 0) {
            Py_DECREF(members);
            Py_RETURN_NONE;
        }
        return members;
    }
    case K_BIT: {
        /* RowsEvent.__read_bit: '0'/'1' text, the first byte holding bits % 8 of them */
        int nbytes = c->storage_bytes, bits = c->bits;
        if (!need(r, nbytes)) return NULL;
        char text[8 * 256 + 1];
        int at = 0;
        for (int i = 0; i < nbytes; i++) {
            unsigned char byte = r->p[r->pos + i];
            int end = 8;
            if (i == 0) {
                if (nbytes == 1) end = bits;
                else { end = bits % 8; if (end == 0) end = 8; }
            }
            for (int bit = end - 1; bit >= 0; bit--) text[at++] = (byte >> bit) & 1 ? '1' : '0';
        }
        r->pos += nbytes;
        return PyUnicode_FromStringAndSize(text, at);
    }
    }
    unsupported("unknown column kind");
    return NULL;
}

/* One row image: the null bitmap, then every non-NULL column's value. */
static PyObject *read_image(Decoder *self, Reader *r) {
    Py_ssize_t nbitmap = (self->ncols + 7) / 8;
    if (!need(r, nbitmap)) return NULL;
    const unsigned char *nulls = r->p + r->pos;
    r->pos += nbitmap;
    PyObject *row = PyTuple_New(self->ncols);
    if (row == NULL) return NULL;
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        PyObject *value;
        if (nulls[i >> 3] & (1 << (i & 7))) {
            value = Py_None;
            Py_INCREF(value);
        } else {
            value = read_value(r, &self->cols[i]);
            if (value == NULL) {
                Py_DECREF(row);
                return NULL;
            }
        }
        PyTuple_SET_ITEM(row, i, value);
    }
    return row;
}

/* The (data, images) arguments of both decode methods; 0 with an exception set. */
static int parse_body(PyObject *args, Py_buffer *view, int *images) {
    if (!PyArg_ParseTuple(args, "y*i", view, images)) return 0;
    if (*images != 1 && *images != 2) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "images must be 1 or 2");
        return 0;
    }
    return 1;
}

/* 0 with RuntimeError for a decoder __init__ never completed on (Decoder.__new__ alone, or a
 * failed __init__): it has no columns, and a row of no columns would never end the body. */
static int initialised(Decoder *self) {
    if (self->cols == NULL || self->ncols < 1) {
        PyErr_SetString(PyExc_RuntimeError, "Decoder used before a successful __init__");
        return 0;
    }
    return 1;
}

/* A row loop's guard: 0 with RuntimeError when an iteration consumed no bytes (the loop would
 * never end). Unreachable while every decoder has a column; kept so that no future kind of
 * row can turn a body into an endless loop. */
static int advanced(const Reader *r, Py_ssize_t before) {
    if (r->pos > before) return 1;
    PyErr_SetString(PyExc_RuntimeError, "rows decoder made no progress in the body");
    return 0;
}

static PyObject *Decoder_decode(Decoder *self, PyObject *args) {
    Py_buffer view;
    int images;
    if (!initialised(self) || !parse_body(args, &view, &images)) return NULL;
    Reader r = {(const unsigned char *)view.buf, 0, view.len};
    PyObject *rows = PyList_New(0);
    if (rows == NULL) goto fail;
    while (r.pos < r.len) {
        Py_ssize_t before = r.pos;
        PyObject *row = read_image(self, &r);
        if (row == NULL) goto fail;
        if (images == 2) {
            PyObject *after = read_image(self, &r);
            if (after == NULL) { Py_DECREF(row); goto fail; }
            PyObject *pair = PyTuple_Pack(2, row, after);
            Py_DECREF(row);
            Py_DECREF(after);
            if (pair == NULL) goto fail;
            row = pair;
        }
        int added = PyList_Append(rows, row);
        Py_DECREF(row);
        if (added < 0 || !advanced(&r, before)) goto fail;
    }
    PyBuffer_Release(&view);
    return rows;
fail:
    Py_XDECREF(rows);
    PyBuffer_Release(&view);
    return NULL;
}

/* ---- column-wise decoding into Arrow buffers (decode_columns) --------------------------- */

/* ``n`` more bytes at the end of ``b`` (capture/_arrowbuf.h): where to write them, or NULL
 * with MemoryError set. */
static inline char *grow(ArrowBuf *b, size_t n) {
    char *at = arrowbuf_extend(b, n);
    if (at == NULL) PyErr_NoMemory();
    return at;
}

/* The filled part of ``b`` as a new bytes object (``b`` is freed by out_clear). */
static PyObject *take(const ArrowBuf *b) { return arrowbuf_bytes(b); }

/* One column of one row image: Arrow buffers (validity, data, offsets) or a list. */
typedef struct {
    ArrowBuf validity, data, offsets;
    Py_ssize_t nulls;
    PyObject *list;  /* T_OBJECT */
} Out;

static void out_clear(Out *o) {
    arrowbuf_free(&o->validity);
    arrowbuf_free(&o->data);
    arrowbuf_free(&o->offsets);
    Py_CLEAR(o->list);
}

static const int TARGET_WIDTH[] = {
    [T_INT64] = 8, [T_DECIMAL128] = 16, [T_FLOAT32] = 4, [T_FLOAT64] = 8, [T_DATE32] = 4,
    [T_TIMESTAMP_US] = 8,
};

static int is_varwidth(int target) { return target == T_UTF8 || target == T_BINARY; }

/* The validity bit of row ``row`` (rows are appended in order). */
static int put_validity(Out *o, Py_ssize_t row, int valid) {
    if (!arrowbuf_set_validity(&o->validity, (size_t)row, valid)) {
        PyErr_NoMemory();
        return 0;
    }
    if (!valid) o->nulls++;
    return 1;
}

/* The end offset of the value just written to a string/binary column. */
static int put_offset(Out *o) {
    if (!arrowbuf_offset_fits(o->data.len)) {
        unsupported("string column over 2 GiB in one event (int32 Arrow offsets)");
        return 0;
    }
    if (!arrowbuf_put_offset(&o->offsets, o->data.len)) {
        PyErr_NoMemory();
        return 0;
    }
    return 1;
}

static int put_null(Out *o, const Column *c, Py_ssize_t row) {
    if (!put_validity(o, row, 0)) return 0;
    if (is_varwidth(c->target)) return put_offset(o);
    char *at = grow(&o->data, (size_t)TARGET_WIDTH[c->target]);
    if (at == NULL) return 0;
    memset(at, 0, (size_t)TARGET_WIDTH[c->target]);
    return 1;
}

static int put_fixed(Out *o, const void *value, int width) {
    char *at = grow(&o->data, (size_t)width);
    if (at == NULL) return 0;
    memcpy(at, value, (size_t)width);
    return 1;
}

static int put_int64(Out *o, int64_t v) { return put_fixed(o, &v, 8); }

/* A decimal128 value: 16 bytes, little-endian two's complement (Arrow's layout on the
 * little-endian hosts the Python side allows targets on). */
static int put_int128(Out *o, __int128 v) { return put_fixed(o, &v, 16); }

/* Python's strict UTF-8 decoder's verdict on s[0:n]: well-formed UTF-8 (Unicode table 3-7:
 * no overlong forms, no surrogates, nothing past U+10FFFF, no truncated sequence). */
static int valid_utf8(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        while (n - i >= 8) {
            uint64_t word;
            memcpy(&word, s + i, 8);
            if (word & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        unsigned char b = s[i];
        if (b < 0x80) { i++; continue; }
        if (b < 0xC2) return 0;
        if (b < 0xE0) {
            if (n - i < 2 || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
            continue;
        }
        if (b < 0xF0) {
            if (n - i < 3) return 0;
            unsigned char lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
            if (s[i + 1] < lo || s[i + 1] > hi || (s[i + 2] & 0xC0) != 0x80) return 0;
            i += 3;
            continue;
        }
        if (b < 0xF5) {
            if (n - i < 4) return 0;
            unsigned char lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
            if (s[i + 1] < lo || s[i + 1] > hi || (s[i + 2] & 0xC0) != 0x80 ||
                (s[i + 3] & 0xC0) != 0x80) return 0;
            i += 4;
            continue;
        }
        return 0;
    }
    return 1;
}

static unsigned __int128 POW10[39];

/* The decimal128(precision, scale) value pyarrow makes of decimal.Decimal(text) for the text
 * of decimal_text, or 0 with Unsupported set where Decimal() or pyarrow raise.
 *
 * Decimal(text) is exact: coefficient C (all digits) and exponent -f (f: digits after the
 * point). pyarrow parses str() of it, which keeps C and f; it rescales to ``scale`` (an error
 * when digits other than 0 would be dropped) and refuses a value of more than ``precision``
 * digits. A C of 2**127 or more (possible only for bytes no server writes, with digit groups
 * past 999999999) wraps in pyarrow's 128-bit parse: refused here, never guessed. */
static int decimal_value(const char *text, int len, int precision, int scale, __int128 *out) {
    const unsigned __int128 max = ((unsigned __int128)1 << 127) - 1;
    unsigned __int128 coefficient = 0;
    int at = 0, negative = 0, digits = 0, fraction = -1, wraps = 0;
    if (len > 0 && text[0] == '-') { negative = 1; at = 1; }
    for (; at < len; at++) {
        char ch = text[at];
        if (ch == '.' && fraction < 0) { fraction = 0; continue; }
        if (ch < '0' || ch > '9') {
            unsupported("decimal bytes the library cannot read");
            return 0;
        }
        digits++;
        if (fraction >= 0) fraction++;
        unsigned d = (unsigned)(ch - '0');
        if (coefficient > (max - d) / 10) wraps = 1;
        else coefficient = coefficient * 10 + d;
    }
    if (digits == 0) { unsupported("decimal bytes the library cannot read"); return 0; }
    if (wraps) { unsupported("decimal digits past 128 bits"); return 0; }
    if (fraction < 0) fraction = 0;
    if (fraction > scale) {  /* (decimal_text writes at least ``scale`` fraction digits) */
        unsigned __int128 divisor = POW10[fraction - scale];
        if (coefficient % divisor) {
            unsupported("DECIMAL fraction digits its decimal128 cannot hold");
            return 0;
        }
        coefficient /= divisor;
    } else if (fraction < scale) {
        unsupported("DECIMAL text with fewer fraction digits than its scale");
        return 0;
    }
    if (coefficient >= POW10[precision]) {
        unsupported("DECIMAL value past its decimal128 precision");
        return 0;
    }
    *out = negative ? -(__int128)coefficient : (__int128)coefficient;
    return 1;
}

/* decimal_value without the text, for the DECIMAL at ``src`` (dec_size bytes, precision <= 38)
 * when every digit group is within its digits, as a server writes them: decimal_text is then
 * the plain positional notation of that value with exactly ``scale`` fraction digits, which
 * Decimal and pyarrow read as is. 0 for any other bytes (decimal_text and decimal_value then
 * decide). */
static int decimal_groups(const unsigned char *src, const Column *c, __int128 *out) {
    unsigned char buf[64];
    memcpy(buf, src, (size_t)c->dec_size);
    int64_t mask = (buf[0] & 0x80) ? 0 : -1;
    buf[0] ^= 0x80;
    const unsigned char *p = buf;
    unsigned __int128 v = 0;
    int size = DIG2BYTES[c->dec_comp_int];
    if (size > 0) {
        int64_t group = be_int(p, size) ^ mask;
        p += size;
        if (group < 0 || (unsigned __int128)group >= POW10[c->dec_comp_int]) return 0;
        v = (unsigned __int128)group;
    }
    for (int i = 0; i < c->dec_uncomp_int + c->dec_uncomp_frac; i++) {
        int64_t group = be_int(p, 4) ^ mask;
        p += 4;
        if (group < 0 || group > 999999999) return 0;
        v = v * 1000000000 + (unsigned __int128)group;
    }
    size = DIG2BYTES[c->dec_comp_frac];
    if (size > 0) {
        int64_t group = be_int(p, size) ^ mask;
        if (group < 0 || (unsigned __int128)group >= POW10[c->dec_comp_frac]) return 0;
        v = v * POW10[c->dec_comp_frac] + (unsigned __int128)group;
    }
    *out = mask ? -(__int128)v : (__int128)v;
    return 1;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm). */
static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* The value at ``r`` of a column with a native target, appended to its data (and offsets):
 * 1, or -1 when its landing value is NULL (nothing appended), or 0 with an exception set.
 * Reads and refuses exactly what read_value does, kind by kind. */
static int put_value(Reader *r, const Column *c, Out *o) {
    switch (c->kind) {
    case K_INT8: case K_UINT8: case K_INT16: case K_UINT16: case K_INT24: case K_UINT24:
    case K_INT32: case K_UINT32: case K_INT64: {
        int64_t v;
        return read_integer(r, c->kind, &v) && put_int64(o, v);
    }
    case K_UINT64: {  /* Decimal(int) in decimal128(20, 0) */
        int64_t v;
        return read_integer(r, c->kind, &v) && put_int128(o, (__int128)(uint64_t)v);
    }
    case K_YEAR: {  /* values._binlog_year: the library's 1900 (the byte 0) is the year 0 */
        if (!need(r, 1)) return 0;
        int byte = r->p[r->pos++];
        return put_int64(o, byte ? 1900 + byte : 0);
    }
    case K_FLOAT: {
        /* decode widens to a double, values._float32 and pyarrow narrow it back: the same
         * bits, except that x86 quiets a signalling NaN on the way (the quiet bit is set). */
        if (!need(r, 4)) return 0;
        uint32_t bits = (uint32_t)le_uint(r->p + r->pos, 4);
        r->pos += 4;
        if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu)) bits |= 0x00400000u;
        return put_fixed(o, &bits, 4);
    }
    case K_DOUBLE: {
        if (!need(r, 8)) return 0;
        uint64_t bits = le_uint(r->p + r->pos, 8);
        r->pos += 8;
        return put_fixed(o, &bits, 8);
    }
    case K_DECIMAL: {
        __int128 v;
        if (!need(r, c->dec_size)) return 0;
        if (decimal_groups(r->p + r->pos, c, &v)) {
            r->pos += c->dec_size;
            return put_int128(o, v);
        }
        char text[DECIMAL_TEXT];
        int len = decimal_text(r, c, text);
        if (len < 0 || !decimal_value(text, len, c->precision, c->scale, &v)) return 0;
        return put_int128(o, v);
    }
    case K_DATE: {
        Civil t;
        int got = read_date(r, &t);
        if (got <= 0) return got;
        int32_t days = (int32_t)days_from_civil(t.year, (int)t.month, (int)t.day);
        return put_fixed(o, &days, 4);
    }
    case K_DATETIME2: {
        Civil t;
        int got = read_datetime2(r, c->fsp, &t);
        if (got <= 0) return got;
        int64_t seconds = days_from_civil(t.year, (int)t.month, (int)t.day) * 86400 +
                          (t.hour * 60 + t.minute) * 60 + t.second;
        return put_int64(o, seconds * 1000000 + t.us);
    }
    case K_TIMESTAMP2: {
        int64_t secs, us;
        if (!read_timestamp2(r, c->fsp, &secs, &us)) return 0;
        if (secs == 0 && us == 0) return -1;  /* values._binlog_timestamp: the zero TIMESTAMP */
        return put_int64(o, secs * 1000000 + us);
    }
    case K_TEXT:
    case K_BYTES: {
        const unsigned char *s;
        Py_ssize_t n;
        if (!read_counted(r, c->length_bytes, &s, &n)) return 0;
        if (c->kind == K_TEXT && !valid_utf8(s, n)) {
            unsupported("invalid UTF-8 in a UTF-8 column");
            return 0;
        }
        /* values._binlog_binary: BINARY(n) padded back with the 0x00 the binlog strips */
        Py_ssize_t pad = c->target == T_BINARY && n < c->target_arg ? c->target_arg - n : 0;
        char *at = grow(&o->data, (size_t)(n + pad));
        if (at == NULL) return 0;
        if (n) memcpy(at, s, (size_t)n);
        if (pad) memset(at + n, 0, (size_t)pad);
        return put_offset(o);
    }
    }
    unsupported("no native target for this column kind");
    return 0;
}

/* read_image, column-wise: row ``row`` of every column appended to ``outs``. */
static int read_image_columns(Decoder *self, Reader *r, Out *outs, Py_ssize_t row) {
    Py_ssize_t nbitmap = (self->ncols + 7) / 8;
    if (!need(r, nbitmap)) return 0;
    const unsigned char *nulls = r->p + r->pos;
    r->pos += nbitmap;
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        const Column *c = &self->cols[i];
        Out *o = &outs[i];
        int null = (nulls[i >> 3] >> (i & 7)) & 1;
        if (c->target == T_OBJECT) {
            PyObject *value;
            if (null) {
                value = Py_None;
                Py_INCREF(value);
            } else {
                value = read_value(r, c);
                if (value == NULL) return 0;
            }
            int added = PyList_Append(o->list, value);
            Py_DECREF(value);
            if (added < 0) return 0;
            continue;
        }
        if (null) {
            if (!put_null(o, c, row)) return 0;
            continue;
        }
        int got = put_value(r, c, o);
        if (got == 0) return 0;
        if (got < 0) {
            if (!put_null(o, c, row)) return 0;
        } else if (!put_validity(o, row, 1)) {
            return 0;
        }
    }
    return 1;
}

/* A finished column: (validity or None, data, offsets or None), or its list. */
static PyObject *column_result(Out *o, const Column *c) {
    if (c->target == T_OBJECT) {
        PyObject *list = o->list;
        o->list = NULL;
        return list;
    }
    PyObject *validity, *data = NULL, *offsets = NULL;
    if (o->nulls == 0) {
        validity = Py_None;
        Py_INCREF(validity);
    } else if ((validity = take(&o->validity)) == NULL) {
        return NULL;
    }
    if ((data = take(&o->data)) == NULL) goto fail;
    if (is_varwidth(c->target)) {
        if ((offsets = take(&o->offsets)) == NULL) goto fail;
    } else {
        offsets = Py_None;
        Py_INCREF(offsets);
    }
    PyObject *out = PyTuple_Pack(3, validity, data, offsets);
    Py_DECREF(validity);
    Py_DECREF(data);
    Py_DECREF(offsets);
    return out;
fail:
    Py_DECREF(validity);
    Py_XDECREF(data);
    return NULL;
}

static PyObject *Decoder_decode_columns(Decoder *self, PyObject *args) {
    Py_buffer view;
    int images;
    if (!initialised(self) || !parse_body(args, &view, &images)) return NULL;
    Py_ssize_t ncols = self->ncols, nouts = images * ncols;
    PyObject *result = NULL, *image_lists = NULL;
    Out *outs = PyMem_Calloc(nouts ? (size_t)nouts : 1, sizeof(Out));
    if (outs == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < nouts; k++) {
        const Column *c = &self->cols[k % ncols];
        if (c->target == T_OBJECT) {
            if ((outs[k].list = PyList_New(0)) == NULL) goto done;
        } else if (is_varwidth(c->target) && !put_offset(&outs[k])) {
            goto done;
        }
    }
    Reader r = {(const unsigned char *)view.buf, 0, view.len};
    Py_ssize_t count = 0;
    while (r.pos < r.len) {
        Py_ssize_t before = r.pos;
        for (int k = 0; k < images; k++) {
            if (!read_image_columns(self, &r, outs + k * ncols, count)) goto done;
        }
        if (!advanced(&r, before)) goto done;
        count++;
    }
    if ((image_lists = PyTuple_New(images)) == NULL) goto done;
    for (int k = 0; k < images; k++) {
        PyObject *columns = PyList_New(ncols);
        if (columns == NULL) goto done;
        PyTuple_SET_ITEM(image_lists, k, columns);
        for (Py_ssize_t i = 0; i < ncols; i++) {
            PyObject *column = column_result(&outs[k * ncols + i], &self->cols[i]);
            if (column == NULL) goto done;
            PyList_SET_ITEM(columns, i, column);
        }
    }
    result = Py_BuildValue("(nO)", count, image_lists);
done:
    Py_XDECREF(image_lists);
    for (Py_ssize_t k = 0; k < nouts; k++) out_clear(&outs[k]);
    PyMem_Free(outs);
    PyBuffer_Release(&view);
    return result;
}

/* The pairs of column kind and target decode_columns implements. */
static int target_fits(const Column *c) {
    switch (c->target) {
    case T_OBJECT:
        return 1;
    case T_INT64:
        return (c->kind >= K_INT8 && c->kind <= K_INT64) || c->kind == K_YEAR;
    case T_DECIMAL128:
        return c->kind == K_UINT64 || (c->kind == K_DECIMAL && c->precision >= 1 && c->precision <= 38);
    case T_FLOAT32:
        return c->kind == K_FLOAT;
    case T_FLOAT64:
        return c->kind == K_DOUBLE;
    case T_DATE32:
        return c->kind == K_DATE;
    case T_TIMESTAMP_US:
        return c->kind == K_DATETIME2 || c->kind == K_TIMESTAMP2;
    case T_UTF8:
        return c->kind == K_TEXT;
    case T_BINARY:
        return c->kind == K_BYTES && c->target_arg >= 0;
    }
    return 0;
}

/* The spec's positional (a, b) under the names the kind reads them by, in the order
 * ColumnCodec.native (capture/binlog/rowcodec.py) writes them; a kind reads no other. */
static void name_arguments(Column *c, int a, int b) {
    switch (c->kind) {
    case K_DATETIME2: case K_TIMESTAMP2: case K_TIME2: c->fsp = a; break;
    case K_DECIMAL: c->precision = a; c->scale = b; break;
    case K_TEXT: case K_BYTES: c->length_bytes = a; break;
    case K_ENUM: case K_SET: c->storage_bytes = a; break;
    case K_BIT: c->bits = a; c->storage_bytes = b; break;
    }
}

/* A decoder is initialised once: a second __init__ (only a hostile caller makes one) would
 * free the columns a decode running on the same decoder reads (a decode calls back into
 * Python: a SET member's __hash__, Decimal()). A failed __init__ leaves it uninitialised. A
 * decoder has at least one column: a table has one, and a row of none consumes no bytes. */
static int Decoder_init(Decoder *self, PyObject *args, PyObject *kwds) {
    PyObject *specs;
    static char *kwlist[] = {"columns", NULL};
    if (self->cols != NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Decoder is already initialised: build a new Decoder for new columns");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &specs)) return -1;
    PyObject *seq = PySequence_Fast(specs, "columns must be a sequence");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError,
                        "Decoder needs at least one column (a table map of no columns has no "
                        "row images to decode)");
        return -1;
    }
    Column *cols = PyMem_Calloc((size_t)n, sizeof(Column));
    if (cols == NULL) { Py_DECREF(seq); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *values = Py_None;
        Column *c = &cols[i];
        int a = 0, b = 0;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iii|Oii", &c->kind, &a, &b,
                              &values, &c->target, &c->target_arg)) goto fail;
        if (c->kind < K_INT8 || c->kind > K_BIT) {
            PyErr_Format(PyExc_ValueError, "column %zd: unknown kind %d", i, c->kind);
            goto fail;
        }
        name_arguments(c, a, b);
        if (!target_fits(c)) {
            PyErr_Format(PyExc_ValueError, "column %zd: no target %d (argument %d) for kind %d",
                         i, c->target, c->target_arg, c->kind);
            goto fail;
        }
        if ((c->kind == K_TEXT || c->kind == K_BYTES) &&
            (c->length_bytes < 1 || c->length_bytes > 4)) {
            PyErr_Format(PyExc_ValueError, "column %zd: length bytes %d", i, c->length_bytes);
            goto fail;
        }
        if ((c->kind == K_ENUM || c->kind == K_SET) &&
            (c->storage_bytes < 1 || c->storage_bytes > 8)) {
            PyErr_Format(PyExc_ValueError, "column %zd: ENUM/SET size %d", i, c->storage_bytes);
            goto fail;
        }
        if ((c->kind == K_DATETIME2 || c->kind == K_TIMESTAMP2 || c->kind == K_TIME2) &&
            (c->fsp < 0 || c->fsp > 6)) {
            PyErr_Format(PyExc_ValueError, "column %zd: fsp %d", i, c->fsp);
            goto fail;
        }
        if (c->kind == K_BIT &&
            (c->bits < 1 || c->bits > 64 || c->storage_bytes != (c->bits + 7) / 8)) {
            PyErr_Format(PyExc_ValueError, "column %zd: BIT(%d) in %d bytes", i, c->bits,
                         c->storage_bytes);
            goto fail;
        }
        if (c->kind == K_DECIMAL) {
            int precision = c->precision, scale = c->scale;
            if (precision < 1 || precision > 65 || scale < 0 || scale > precision) {
                PyErr_Format(PyExc_ValueError, "column %zd: DECIMAL(%d,%d)", i, precision, scale);
                goto fail;
            }
            int integral = precision - scale;
            c->dec_uncomp_int = integral / 9;
            c->dec_uncomp_frac = scale / 9;
            c->dec_comp_int = integral - c->dec_uncomp_int * 9;
            c->dec_comp_frac = scale - c->dec_uncomp_frac * 9;
            c->dec_size = DIG2BYTES[c->dec_comp_int] + 4 * c->dec_uncomp_int +
                          4 * c->dec_uncomp_frac + DIG2BYTES[c->dec_comp_frac];
        }
        if ((c->kind == K_ENUM || c->kind == K_SET) && values != Py_None) {
            c->values = PySequence_Tuple(values);
            if (c->values == NULL) goto fail;
        }
    }
    Py_DECREF(seq);
    if (self->cols != NULL) {  /* (a column's members made __init__ run again meanwhile) */
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(cols[i].values);
        PyMem_Free(cols);
        PyErr_SetString(PyExc_RuntimeError, "Decoder was initialised during its own __init__");
        return -1;
    }
    self->cols = cols;
    self->ncols = n;
    return 0;
fail:
    for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(cols[i].values);
    PyMem_Free(cols);
    Py_DECREF(seq);
    return -1;
}

static void Decoder_dealloc(Decoder *self) {
    for (Py_ssize_t i = 0; i < self->ncols; i++) Py_XDECREF(self->cols[i].values);
    PyMem_Free(self->cols);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Decoder_methods[] = {
    {"decode", (PyCFunction)Decoder_decode, METH_VARARGS,
     "decode(data, images) -> list of row tuples (images=2: (before, after) pairs)"},
    {"decode_columns", (PyCFunction)Decoder_decode_columns, METH_VARARGS,
     "decode_columns(data, images) -> (count, images): per image, one entry per column: "
     "(validity or None, data, offsets or None) bytes for a column with a target, else the "
     "list of the values decode gives"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc_platform.capture.binlog._rowcodec.Decoder",
    .tp_basicsize = sizeof(Decoder),
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Decoder(columns): the rows decoder of one table map; columns are "
              "(kind, a, b[, members[, target, target_arg]]) tuples",
    .tp_methods = Decoder_methods,
    .tp_init = (initproc)Decoder_init,
    .tp_new = PyType_GenericNew,
};

typedef struct {
    const char *name;
    int value;
} Constant;

#define CONSTANT(prefix, name) {#name, prefix##name}
static const Constant KIND_NAMES[] = {
    CONSTANT(K_, INT8), CONSTANT(K_, UINT8), CONSTANT(K_, INT16), CONSTANT(K_, UINT16),
    CONSTANT(K_, INT24), CONSTANT(K_, UINT24), CONSTANT(K_, INT32), CONSTANT(K_, UINT32),
    CONSTANT(K_, INT64), CONSTANT(K_, UINT64), CONSTANT(K_, FLOAT), CONSTANT(K_, DOUBLE),
    CONSTANT(K_, DECIMAL), CONSTANT(K_, DATE), CONSTANT(K_, DATETIME2), CONSTANT(K_, TIMESTAMP2),
    CONSTANT(K_, TIME2), CONSTANT(K_, YEAR), CONSTANT(K_, TEXT), CONSTANT(K_, BYTES),
    CONSTANT(K_, ENUM), CONSTANT(K_, SET), CONSTANT(K_, BIT),
};
static const Constant TARGET_NAMES[] = {
    CONSTANT(T_, OBJECT), CONSTANT(T_, INT64), CONSTANT(T_, DECIMAL128), CONSTANT(T_, FLOAT32),
    CONSTANT(T_, FLOAT64), CONSTANT(T_, DATE32), CONSTANT(T_, TIMESTAMP_US), CONSTANT(T_, UTF8),
    CONSTANT(T_, BINARY),
};
#undef CONSTANT

/* Each constant of ``table`` as the module's int ``prefix`` + name (K_INT8, ...), and all of
 * them as the dict ``dict_name`` (name -> value: what rowcodec.Kind and .Target are built
 * from). 1, or 0 with an exception set. */
static int add_constants(PyObject *m, const char *prefix, const char *dict_name,
                         const Constant *table, size_t count) {
    PyObject *names = PyDict_New();
    if (names == NULL) return 0;
    for (size_t i = 0; i < count; i++) {
        char attribute[64];
        snprintf(attribute, sizeof attribute, "%s%s", prefix, table[i].name);
        PyObject *value = PyLong_FromLong(table[i].value);
        int failed = value == NULL || PyDict_SetItemString(names, table[i].name, value) < 0 ||
                     PyModule_AddIntConstant(m, attribute, table[i].value) < 0;
        Py_XDECREF(value);
        if (failed) { Py_DECREF(names); return 0; }
    }
    if (PyModule_AddObject(m, dict_name, names) < 0) { Py_DECREF(names); return 0; }
    return 1;
}

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rowcodec",
    "Native decoding of binlog row images (see capture/binlog/rowcodec.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__rowcodec(void) {
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL) return NULL;
    PyObject *decimal = PyImport_ImportModule("decimal");
    if (decimal == NULL) return NULL;
    DecimalType = PyObject_GetAttrString(decimal, "Decimal");
    Py_DECREF(decimal);
    if (DecimalType == NULL) return NULL;
    EmptyStr = PyUnicode_FromStringAndSize("", 0);
    if (EmptyStr == NULL) return NULL;
    POW10[0] = 1;
    for (int i = 1; i < 39; i++) POW10[i] = POW10[i - 1] * 10;
    if (PyType_Ready(&DecoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Unsupported = PyErr_NewException("cdc_platform.capture.binlog._rowcodec.Unsupported", NULL, NULL);
    if (Unsupported == NULL) return NULL;
    Py_INCREF(Unsupported);
    PyModule_AddObject(m, "Unsupported", Unsupported);
    Py_INCREF(&DecoderType);
    PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType);
    if (!add_constants(m, "K_", "KINDS", KIND_NAMES, sizeof KIND_NAMES / sizeof *KIND_NAMES) ||
        !add_constants(m, "T_", "TARGETS", TARGET_NAMES,
                       sizeof TARGET_NAMES / sizeof *TARGET_NAMES))
        return NULL;
    return m;
}
