/* Native decoding of binlog rows-event bodies: the rows part of a WRITE/UPDATE/DELETE rows
 * event (after the columns-present bitmap(s)) -> a list of row tuples in column order.
 *
 * Every value equals, in type and value, what mysql-replication 1.0.17 returns for the column
 * as cdc_platform patches it (capture/binlog.py): the Python side (capture/rowcodec.py) builds
 * one Decoder per table map, only when every column is of a kind decoded here, and falls back
 * to the library for anything else. Whenever the library would raise on the bytes (truncated
 * data, invalid UTF-8 in a UTF-8 column, an ENUM index past its members, a fraction out of
 * range), this raises ``Unsupported`` instead, and the caller lets the library decode the event
 * (and raise its own error). No value is ever guessed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Column kinds (the Python side reads these constants from the module). */
enum {
    K_INT8 = 1, K_UINT8, K_INT16, K_UINT16, K_INT24, K_UINT24, K_INT32, K_UINT32,
    K_INT64, K_UINT64, K_FLOAT, K_DOUBLE, K_DECIMAL, K_DATE, K_DATETIME2, K_TIMESTAMP2,
    K_TIME2, K_YEAR, K_TEXT, K_BYTES, K_ENUM, K_SET, K_BIT
};

typedef struct {
    int kind;
    int a;            /* length bytes (TEXT/BYTES), fsp, precision, size (ENUM/SET), bits */
    int b;            /* scale (DECIMAL), bytes (BIT) */
    PyObject *values; /* ENUM/SET members (a tuple), or NULL when the library has none */
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

/* RowsEvent.__read_new_decimal: the same text, then decimal.Decimal(text). */
static PyObject *read_decimal(Reader *r, const Column *c) {
    if (!need(r, c->dec_size)) return NULL;
    unsigned char buf[64];
    memcpy(buf, r->p + r->pos, (size_t)c->dec_size);
    r->pos += c->dec_size;
    char text[160];
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
        at += snprintf(text + at, sizeof text - (size_t)at, "%lld", (long long)(be_int(p, size) ^ mask));
        p += size;
    }
    for (int i = 0; i < c->dec_uncomp_int; i++) {
        at += snprintf(text + at, sizeof text - (size_t)at, "%09lld", (long long)(be_int(p, 4) ^ mask));
        p += 4;
    }
    text[at++] = '.';
    for (int i = 0; i < c->dec_uncomp_frac; i++) {
        at += snprintf(text + at, sizeof text - (size_t)at, "%09lld", (long long)(be_int(p, 4) ^ mask));
        p += 4;
    }
    size = DIG2BYTES[c->dec_comp_frac];
    if (size > 0) {
        at += snprintf(text + at, sizeof text - (size_t)at, "%0*lld", c->dec_comp_frac,
                       (long long)(be_int(p, size) ^ mask));
    }
    if (at >= (int)sizeof text - 1) { unsupported("decimal text too long"); return NULL; }
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
    const unsigned char *p;
    switch (c->kind) {
    case K_INT8:
        if (!need(r, 1)) return NULL;
        return PyLong_FromLong((signed char)r->p[r->pos++]);
    case K_UINT8:
        if (!need(r, 1)) return NULL;
        return PyLong_FromLong(r->p[r->pos++]);
    case K_INT16:
        if (!need(r, 2)) return NULL;
        p = r->p + r->pos; r->pos += 2;
        return PyLong_FromLong((int16_t)le_uint(p, 2));
    case K_UINT16:
        if (!need(r, 2)) return NULL;
        p = r->p + r->pos; r->pos += 2;
        return PyLong_FromLong((long)le_uint(p, 2));
    case K_INT24: {
        if (!need(r, 3)) return NULL;
        p = r->p + r->pos; r->pos += 3;
        long v = (long)le_uint(p, 3);
        if (v >= 0x800000) v -= 0x1000000;
        return PyLong_FromLong(v);
    }
    case K_UINT24:
        if (!need(r, 3)) return NULL;
        p = r->p + r->pos; r->pos += 3;
        return PyLong_FromLong((long)le_uint(p, 3));
    case K_INT32:
        if (!need(r, 4)) return NULL;
        p = r->p + r->pos; r->pos += 4;
        return PyLong_FromLong((int32_t)(uint32_t)le_uint(p, 4));
    case K_UINT32:
        if (!need(r, 4)) return NULL;
        p = r->p + r->pos; r->pos += 4;
        return PyLong_FromUnsignedLong((unsigned long)le_uint(p, 4));
    case K_INT64:
        if (!need(r, 8)) return NULL;
        p = r->p + r->pos; r->pos += 8;
        return PyLong_FromLongLong((long long)le_uint(p, 8));
    case K_UINT64:
        if (!need(r, 8)) return NULL;
        p = r->p + r->pos; r->pos += 8;
        return PyLong_FromUnsignedLongLong((unsigned long long)le_uint(p, 8));
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
        /* the patched __read_date: zero or invalid dates are None */
        if (!need(r, 3)) return NULL;
        long v = (long)le_uint(r->p + r->pos, 3);
        r->pos += 3;
        long year = (v >> 9) & 0x7FFF, month = (v >> 5) & 0xF, day = v & 0x1F;
        if (!valid_date(year, month, day)) Py_RETURN_NONE;
        return PyDate_FromDate((int)year, (int)month, (int)day);
    }
    case K_DATETIME2: {
        if (!need(r, 5)) return NULL;
        uint64_t v = be_uint(r->p + r->pos, 5);
        r->pos += 5;
        long ym = (long)((v >> 22) & 0x1FFFF);
        long year = ym / 13, month = ym % 13;
        long day = (long)((v >> 17) & 0x1F), hour = (long)((v >> 12) & 0x1F);
        long minute = (long)((v >> 6) & 0x3F), second = (long)(v & 0x3F);
        int64_t us;
        if (!valid_date(year, month, day) || hour > 23 || minute > 59 || second > 59) {
            if (!read_fsp(r, c->a, &us)) return NULL;
            Py_RETURN_NONE;
        }
        if (!read_fsp(r, c->a, &us)) return NULL;
        if (us > 999999) { unsupported("DATETIME2 fraction out of range"); return NULL; }
        return PyDateTime_FromDateAndTime((int)year, (int)month, (int)day, (int)hour,
                                          (int)minute, (int)second, us > 0 ? (int)us : 0);
    }
    case K_TIMESTAMP2: {
        /* datetime.utcfromtimestamp(signed 4-byte big-endian seconds), naive UTC */
        if (!need(r, 4)) return NULL;
        int64_t secs = be_int(r->p + r->pos, 4);
        r->pos += 4;
        int64_t us;
        if (!read_fsp(r, c->a, &us)) return NULL;
        if (us > 999999) { unsupported("TIMESTAMP2 fraction out of range"); return NULL; }
        int64_t days = floordiv(secs, 86400), rest = secs - days * 86400;
        int y, m, d;
        civil_from_days(days, &y, &m, &d);
        return PyDateTime_FromDateAndTime(y, m, d, (int)(rest / 3600), (int)(rest / 60 % 60),
                                          (int)(rest % 60), us > 0 ? (int)us : 0);
    }
    case K_TIME2: {
        if (!need(r, 3)) return NULL;
        uint32_t raw = (uint32_t)be_uint(r->p + r->pos, 3);
        r->pos += 3;
        int positive = (raw >> 23) & 1;
        uint32_t bits = positive ? raw : ((0x1000000u - raw) & 0xFFFFFFu);
        int64_t hours = (bits >> 12) & 0x3FF, minutes = (bits >> 6) & 0x3F, seconds = bits & 0x3F;
        int64_t us;
        if (!read_fsp(r, c->a, &us)) return NULL;
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
        if (!need(r, c->a)) return NULL;
        Py_ssize_t n = (Py_ssize_t)le_uint(r->p + r->pos, c->a);
        r->pos += c->a;
        if (!need(r, n)) return NULL;
        const char *s = (const char *)r->p + r->pos;
        r->pos += n;
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
        if (!need(r, c->a)) return NULL;
        uint64_t index = le_uint(r->p + r->pos, c->a);
        r->pos += c->a;
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
        if (!need(r, c->a)) return NULL;
        uint64_t mask = le_uint(r->p + r->pos, c->a);
        r->pos += c->a;
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
        int nbytes = c->b, bits = c->a;
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

static PyObject *Decoder_decode(Decoder *self, PyObject *args) {
    Py_buffer view;
    int images;
    if (!PyArg_ParseTuple(args, "y*i", &view, &images)) return NULL;
    if (images != 1 && images != 2) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "images must be 1 or 2");
        return NULL;
    }
    Reader r = {(const unsigned char *)view.buf, 0, view.len};
    PyObject *rows = PyList_New(0);
    if (rows == NULL) goto fail;
    while (r.pos < r.len) {
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
        if (added < 0) goto fail;
    }
    PyBuffer_Release(&view);
    return rows;
fail:
    Py_XDECREF(rows);
    PyBuffer_Release(&view);
    return NULL;
}

static int Decoder_init(Decoder *self, PyObject *args, PyObject *kwds) {
    PyObject *specs;
    static char *kwlist[] = {"columns", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &specs)) return -1;
    PyObject *seq = PySequence_Fast(specs, "columns must be a sequence");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Column *cols = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Column));
    if (cols == NULL) { Py_DECREF(seq); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *values = Py_None;
        Column *c = &cols[i];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iii|O", &c->kind, &c->a, &c->b,
                              &values)) goto fail;
        if (c->kind < K_INT8 || c->kind > K_BIT) {
            PyErr_Format(PyExc_ValueError, "column %zd: unknown kind %d", i, c->kind);
            goto fail;
        }
        if ((c->kind == K_TEXT || c->kind == K_BYTES) && (c->a < 1 || c->a > 4)) {
            PyErr_Format(PyExc_ValueError, "column %zd: length bytes %d", i, c->a);
            goto fail;
        }
        if ((c->kind == K_ENUM || c->kind == K_SET) && (c->a < 1 || c->a > 8)) {
            PyErr_Format(PyExc_ValueError, "column %zd: ENUM/SET size %d", i, c->a);
            goto fail;
        }
        if ((c->kind == K_DATETIME2 || c->kind == K_TIMESTAMP2 || c->kind == K_TIME2) &&
            (c->a < 0 || c->a > 6)) {
            PyErr_Format(PyExc_ValueError, "column %zd: fsp %d", i, c->a);
            goto fail;
        }
        if (c->kind == K_BIT && (c->a < 1 || c->a > 64 || c->b != (c->a + 7) / 8)) {
            PyErr_Format(PyExc_ValueError, "column %zd: BIT(%d) in %d bytes", i, c->a, c->b);
            goto fail;
        }
        if (c->kind == K_DECIMAL) {
            int precision = c->a, scale = c->b;
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
    for (Py_ssize_t i = 0; i < self->ncols; i++) Py_XDECREF(self->cols[i].values);
    PyMem_Free(self->cols);
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
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc_platform.capture._rowcodec.Decoder",
    .tp_basicsize = sizeof(Decoder),
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Decoder(columns): the rows decoder of one table map; columns are "
              "(kind, a, b[, members]) tuples",
    .tp_methods = Decoder_methods,
    .tp_init = (initproc)Decoder_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rowcodec",
    "Native decoding of binlog row images (see capture/rowcodec.py).", -1, NULL,
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
    if (PyType_Ready(&DecoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Unsupported = PyErr_NewException("cdc_platform.capture._rowcodec.Unsupported", NULL, NULL);
    if (Unsupported == NULL) return NULL;
    Py_INCREF(Unsupported);
    PyModule_AddObject(m, "Unsupported", Unsupported);
    Py_INCREF(&DecoderType);
    PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType);
#define KIND(name) PyModule_AddIntConstant(m, #name, name)
    KIND(K_INT8); KIND(K_UINT8); KIND(K_INT16); KIND(K_UINT16); KIND(K_INT24); KIND(K_UINT24);
    KIND(K_INT32); KIND(K_UINT32); KIND(K_INT64); KIND(K_UINT64); KIND(K_FLOAT);
    KIND(K_DOUBLE); KIND(K_DECIMAL); KIND(K_DATE); KIND(K_DATETIME2); KIND(K_TIMESTAMP2);
    KIND(K_TIME2); KIND(K_YEAR); KIND(K_TEXT); KIND(K_BYTES); KIND(K_ENUM); KIND(K_SET);
    KIND(K_BIT);
#undef KIND
    return m;
}
