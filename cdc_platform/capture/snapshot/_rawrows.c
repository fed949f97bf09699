/* Chunk SELECT results read column-wise in C, straight into Arrow binary buffers (issue 15).
 *
 * mysqlclient's fetch_row makes a Python bytes object per value and a tuple per row; the
 * chunk path then transposes them and copies them again into Arrow arrays. Here the rows of a
 * result are read with libmariadb (mysql_use_result / mysql_fetch_row, the C client's own
 * loop) on the connection mysqlclient opened (its MYSQL handle, from _get_native_connection),
 * with the GIL released, into one growing buffer set per column: Arrow's binary layout
 * (validity bits, int32 offsets, data). Python wraps them with pa.Array.from_buffers; the
 * casts to landing types are Arrow's, as before. Values stay the server's bytes: nothing is
 * decoded here, so nothing can be decoded differently.
 *
 * The byte budget is the Python path's rule (chunks._within_budget), row by row: a row counts
 * `fixed` plus the lengths of its non-NULL values in the `variable` columns; the first row
 * that would pass `max_bytes` ends the read (unless it is the first row and take_one is set),
 * and mysql_free_result reads the rest of the result off the wire.
 *
 * Only the owner of the connection calls this, between a query and the next one (the
 * snapshot reader's thread): the MYSQL handle is not locked.
 *
 * Arguments are checked, not trusted (issue 26): a column index is kept at full width and
 * checked against the result's column count (an IndexError naming both, never a wrapped index
 * or the 2 GiB message, which is for a real buffer overflow only); bytes are counted without
 * overflow; buffer growth cannot wrap around (capture/_arrowbuf.h: the buffers, shared with the
 * rows decoder).
 *
 * Return conventions (as in capture/binlog/_rowcodec.c and capture/_arrowbuf.h): a function returning
 * PyObject * gives a new reference, or NULL with a Python exception set; an int function gives
 * 1 on success and 0 on failure. Code that runs with the GIL released cannot set an exception:
 * there the read loop's functions return a READ_* status (READ_OK, or the failure read_result
 * reports once it holds the GIL again).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <mysql.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../_arrowbuf.h"

#define CAPSULE_NAME "_mysql.connection.native_connection"

typedef struct {
    ArrowBuf offsets; /* int32, rows + 1 */
    ArrowBuf data;
    ArrowBuf validity; /* one bit a row, least significant first */
    Py_ssize_t nulls;
} Column;

enum { READ_OK = 0, READ_NO_MEMORY, READ_TOO_LARGE, READ_SERVER, READ_BAD_INDEX };

/* One row onto the columns (GIL released): READ_OK, or READ_TOO_LARGE when a column's data
 * would pass int32 offsets, READ_NO_MEMORY. */
static int append_row(Column *columns, unsigned count, MYSQL_ROW row, unsigned long *lengths,
                      Py_ssize_t index) {
    for (unsigned i = 0; i < count; i++) {
        Column *column = &columns[i];
        size_t length = row[i] == NULL ? 0 : lengths[i];
        if (length > ARROWBUF_OFFSETS_MAX - column->data.len) /* (data.len <= the max) */
            return READ_TOO_LARGE;
        if (!arrowbuf_set_validity(&column->validity, (size_t)index, row[i] != NULL))
            return READ_NO_MEMORY;
        if (row[i] == NULL)
            column->nulls++;
        else if (!arrowbuf_append(&column->data, row[i], length))
            return READ_NO_MEMORY;
        if (!arrowbuf_put_offset(&column->offsets, column->data.len))
            return READ_NO_MEMORY; /* (the offset fits: checked above) */
    }
    return READ_OK;
}

static void free_columns(Column *columns, unsigned count) {
    if (columns == NULL)
        return;
    for (unsigned i = 0; i < count; i++) {
        arrowbuf_free(&columns[i].offsets);
        arrowbuf_free(&columns[i].data);
        arrowbuf_free(&columns[i].validity);
    }
    free(columns);
}

/* Bytes are counted in 128 bits, as Python counts them (without bound): `fixed` and every
 * length may be near 2**63 without the sum overflowing (undefined behaviour) or a saturated
 * sum deciding the budget differently; only the size returned is held to long long. */
typedef __int128 Count;

static long long count_as_long_long(Count n) {
    return n > LLONG_MAX ? LLONG_MAX : n < LLONG_MIN ? LLONG_MIN : (long long)n;
}

/* The result as Python objects: (field types, rows, size, cut, [(validity|None, offsets, data,
 * nulls), ...]). */
static PyObject *result_tuple(Column *columns, unsigned count, const int *types,
                              Py_ssize_t rows, long long size, int cut) {
    PyObject *type_tuple = PyTuple_New(count);
    PyObject *column_list = PyList_New(count);
    if (type_tuple == NULL || column_list == NULL)
        goto fail;
    for (unsigned i = 0; i < count; i++) {
        PyObject *field_type = PyLong_FromLong(types[i]);
        if (field_type == NULL)
            goto fail;
        PyTuple_SET_ITEM(type_tuple, i, field_type);
        Column *column = &columns[i];
        PyObject *validity;
        if (column->nulls) {
            validity = arrowbuf_bytes(&column->validity);
        } else {
            validity = Py_None;
            Py_INCREF(validity);
        }
        PyObject *entry = Py_BuildValue("(NNNn)", validity, arrowbuf_bytes(&column->offsets),
                                        arrowbuf_bytes(&column->data), column->nulls);
        if (entry == NULL)
            goto fail;
        PyList_SET_ITEM(column_list, i, entry);
    }
    return Py_BuildValue("(NnLNN)", type_tuple, rows, size, PyBool_FromLong(cut), column_list);
fail:
    Py_XDECREF(type_tuple);
    Py_XDECREF(column_list);
    return NULL;
}

PyDoc_STRVAR(read_result_doc,
"read_result(connection, variable, fixed, max_bytes, take_one)\n"
"\n"
"Read the result of the query just sent on `connection` (mysqlclient's native-connection\n"
"capsule) column-wise. `variable`: indexes of the columns counted by length; `fixed`: bytes\n"
"counted per row for the others; `max_bytes` < 0: no budget. Returns (field types, rows,\n"
"bytes counted, cut by the budget, [(validity or None, offsets, data, null count)]), or\n"
"(None, errno, message) when the server or the connection failed. IndexError when an index\n"
"of `variable` is not a column of the result; on this and any other argument refused, the\n"
"result is read off the wire first (the connection stays ready for its next query).");

/* The result of the query just sent, read off the wire and dropped, the exception set kept:
 * read_result refusing its arguments still consumes the result, or the connection would be
 * left out of sync ("Commands out of sync" on its next query). */
static PyObject *discard_result(MYSQL *mysql) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    Py_BEGIN_ALLOW_THREADS
    MYSQL_RES *result = mysql_use_result(mysql);
    if (result != NULL)
        mysql_free_result(result); /* (unbuffered: reads the rest off the wire) */
    Py_END_ALLOW_THREADS
    PyErr_Restore(type, value, traceback);
    return NULL;
}

static PyObject *read_result(PyObject *self, PyObject *args) {
    PyObject *capsule, *variable_seq, *fixed_arg, *max_bytes_arg, *take_one_arg;
    if (!PyArg_UnpackTuple(args, "read_result", 5, 5, &capsule, &variable_seq, &fixed_arg,
                           &max_bytes_arg, &take_one_arg))
        return NULL;
    MYSQL *mysql = PyCapsule_GetPointer(capsule, CAPSULE_NAME);
    if (mysql == NULL)
        return NULL;
    long long fixed = PyLong_AsLongLong(fixed_arg);
    if (fixed == -1 && PyErr_Occurred())
        return discard_result(mysql);
    long long max_bytes = PyLong_AsLongLong(max_bytes_arg);
    if (max_bytes == -1 && PyErr_Occurred())
        return discard_result(mysql);
    int take_one = PyObject_IsTrue(take_one_arg);
    if (take_one < 0)
        return discard_result(mysql);
    /* (a tuple: it is read again after the GIL was released, and no thread can change it) */
    PyObject *variable_tuple = PySequence_Tuple(variable_seq);
    if (variable_tuple == NULL)
        return discard_result(mysql);
    /* Indexes at full width: out-of-range ones (negative, or past any column count) are
     * flagged here and reported with the result's column count once it is known. */
    Py_ssize_t variable_count = PyTuple_GET_SIZE(variable_tuple);
    unsigned long long *variable = PyMem_New(unsigned long long, (size_t)variable_count + 1);
    if (variable == NULL) {
        Py_DECREF(variable_tuple);
        PyErr_NoMemory();
        return discard_result(mysql);
    }
    Py_ssize_t bad_index = -1; /* the position in `variable` of the first index out of range */
    for (Py_ssize_t i = 0; i < variable_count; i++) {
        PyObject *number = PyNumber_Index(PyTuple_GET_ITEM(variable_tuple, i));
        int overflow = 0;
        long long index = number == NULL ? -1 : PyLong_AsLongLongAndOverflow(number, &overflow);
        Py_XDECREF(number);
        if (index == -1 && PyErr_Occurred()) { /* (not an integer: TypeError) */
            PyMem_Free(variable);
            Py_DECREF(variable_tuple);
            return discard_result(mysql);
        }
        if (overflow || index < 0) {
            variable[i] = ULLONG_MAX; /* (out of range of any result) */
            if (bad_index < 0)
                bad_index = i;
        } else {
            variable[i] = (unsigned long long)index;
        }
    }

    int status = READ_OK;
    unsigned count = 0;
    Column *columns = NULL;
    int *types = NULL;
    Py_ssize_t rows = 0;
    Count size = 0;
    int cut = 0;
    unsigned int error_number = 0;
    char error_message[512] = "";

    Py_BEGIN_ALLOW_THREADS
    MYSQL_RES *result = mysql_use_result(mysql);
    if (result == NULL) {
        status = READ_SERVER;
    } else {
        count = mysql_num_fields(result);
        columns = calloc(count ? count : 1, sizeof(Column));
        types = calloc(count ? count : 1, sizeof(int));
        if (columns == NULL || types == NULL) {
            status = READ_NO_MEMORY;
        } else {
            MYSQL_FIELD *fields = mysql_fetch_fields(result);
            for (unsigned i = 0; i < count; i++)
                types[i] = (int)fields[i].type;
            for (unsigned i = 0; i < count && status == READ_OK; i++) {
                if (!arrowbuf_put_offset(&columns[i].offsets, 0))
                    status = READ_NO_MEMORY;
            }
            for (Py_ssize_t i = 0; i < variable_count && status == READ_OK; i++) {
                if (variable[i] >= count) {
                    status = READ_BAD_INDEX; /* (reported with the index and count below) */
                    bad_index = i;
                }
            }
            MYSQL_ROW row;
            while (status == READ_OK && (row = mysql_fetch_row(result)) != NULL) {
                unsigned long *lengths = mysql_fetch_lengths(result);
                Count row_bytes = fixed;
                for (Py_ssize_t i = 0; i < variable_count; i++) {
                    if (row[variable[i]] != NULL)
                        row_bytes += lengths[variable[i]];
                }
                if (max_bytes >= 0 && (rows > 0 || !take_one) && size + row_bytes > max_bytes) {
                    cut = 1;
                    break;
                }
                status = append_row(columns, count, row, lengths, rows);
                rows++;
                size += row_bytes;
            }
            if (status == READ_OK && !cut && mysql_errno(mysql))
                status = READ_SERVER;
        }
        if (status == READ_SERVER) {
            error_number = mysql_errno(mysql);
            snprintf(error_message, sizeof error_message, "%s", mysql_error(mysql));
        }
        mysql_free_result(result);  /* (an unbuffered result: reads the rest off the wire) */
    }
    if (result == NULL) {
        error_number = mysql_errno(mysql);
        snprintf(error_message, sizeof error_message, "%s", mysql_error(mysql));
    }
    Py_END_ALLOW_THREADS

    PyMem_Free(variable);
    PyObject *out = NULL;
    if (status == READ_OK) {
        out = result_tuple(columns, count, types, rows, count_as_long_long(size), cut);
    } else if (status == READ_NO_MEMORY) {
        PyErr_NoMemory();
    } else if (status == READ_TOO_LARGE) {
        PyErr_SetString(PyExc_OverflowError,
                        "a column of the chunk holds more than 2 GiB (Arrow's int32 offsets): "
                        "lower the snapshot's chunk_max_bytes");
    } else if (status == READ_BAD_INDEX) {
        PyErr_Format(PyExc_IndexError,
                     "column index %R (variable[%zd]) is out of range: the result has %u "
                     "columns", PyTuple_GET_ITEM(variable_tuple, bad_index), bad_index,
                     count);
    } else if (error_number == 0) {
        out = Py_BuildValue("(OIs)", Py_None, 0u, "the statement returned no result set");
    } else {
        out = Py_BuildValue("(OIs)", Py_None, error_number, error_message);
    }
    free_columns(columns, count);
    free(types);
    Py_DECREF(variable_tuple);
    return out;
}

static PyObject *client_info(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(mysql_get_client_info());
}

static PyMethodDef methods[] = {
    {"read_result", read_result, METH_VARARGS, read_result_doc},
    {"client_info", client_info, METH_NOARGS,
     "The client library version this module was linked with (mysql_get_client_info)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rawrows",
    "Chunk SELECT results read column-wise into Arrow binary buffers (libmariadb).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__rawrows(void) { return PyModule_Create(&module); }
