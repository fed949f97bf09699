/* The growable buffer both native readers fill with Arrow's layouts (issue 22): the rows decoder
 * (capture/binlog/_rowcodec.c, binlog row images -> landing-type columns) and the chunk reader
 * (capture/snapshot/_rawrows.c, SELECT results -> binary columns). One implementation, so
 * that growth, the validity bits and the int32 offsets are written (and hardened) once.
 *
 * Why raw memory and not a bytes object grown in place: the chunk reader fills its buffers
 * with the GIL released (libmariadb's fetch loop), where no Python object may be touched.
 * PyMem_Raw* may be called without the GIL. A buffer becomes a Python bytes object once, at
 * the end (arrowbuf_bytes, with the GIL held).
 *
 * Return conventions (as in both C files): int functions return 1 on success and 0 on
 * failure. Nothing here sets a Python exception (the GIL may not be held): a 0 from
 * arrowbuf_reserve / arrowbuf_extend / arrowbuf_set_validity means out of memory, from
 * arrowbuf_put_offset a column past int32 offsets (ARROWBUF_OFFSETS_MAX bytes) or out of
 * memory, told apart by arrowbuf_offset_fits. The caller reports it (MemoryError,
 * Unsupported, OverflowError), once it holds the GIL. Sizes are size_t and every addition
 * is checked: growth cannot wrap around.
 */
#ifndef CDC_PLATFORM_ARROWBUF_H
#define CDC_PLATFORM_ARROWBUF_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The first allocation of a buffer; it then doubles (stopping at the size wanted, never
 * wrapping to 0). */
#define ARROWBUF_FIRST 256

/* The most bytes a string/binary column's data may hold: Arrow's offsets are int32. */
#define ARROWBUF_OFFSETS_MAX ((size_t)INT32_MAX)

typedef struct {
    char *data; /* NULL until the first reserve */
    size_t len;
    size_t cap;
} ArrowBuf;

/* Room for ``extra`` more bytes. The buffer is allocated on the first call even for
 * extra == 0: a pointer at ``data + len`` is then into real memory, never computed from NULL. */
static inline int arrowbuf_reserve(ArrowBuf *b, size_t extra) {
    if (extra > SIZE_MAX - b->len)
        return 0;
    size_t want = b->len + extra;
    if (b->data != NULL && want <= b->cap)
        return 1;
    size_t cap = b->cap ? b->cap : ARROWBUF_FIRST;
    while (cap < want)
        cap = cap > SIZE_MAX / 2 ? want : cap * 2;
    char *grown = PyMem_RawRealloc(b->data, cap);
    if (grown == NULL)
        return 0;
    b->data = grown;
    b->cap = cap;
    return 1;
}

/* ``n`` more bytes at the end of ``b``: where to write them, or NULL (out of memory). */
static inline char *arrowbuf_extend(ArrowBuf *b, size_t n) {
    if (!arrowbuf_reserve(b, n))
        return NULL;
    char *at = b->data + b->len;
    b->len += n;
    return at;
}

static inline int arrowbuf_append(ArrowBuf *b, const void *bytes, size_t n) {
    char *at = arrowbuf_extend(b, n);
    if (at == NULL)
        return 0;
    if (n)
        memcpy(at, bytes, n);
    return 1;
}

/* Row ``row``'s bit of an Arrow validity bitmap (least significant bit first); rows are set
 * in order, each exactly once, so a new byte starts zeroed every 8 rows. */
static inline int arrowbuf_set_validity(ArrowBuf *validity, size_t row, int valid) {
    if ((row & 7) == 0) {
        char *at = arrowbuf_extend(validity, 1);
        if (at == NULL)
            return 0;
        *at = 0;
    }
    if (valid)
        validity->data[row >> 3] |= (char)(1 << (row & 7));
    return 1;
}

/* Whether a string/binary column's data of ``data_len`` bytes still has int32 offsets. */
static inline int arrowbuf_offset_fits(size_t data_len) {
    return data_len <= ARROWBUF_OFFSETS_MAX;
}

/* The end offset (``data_len``, the column's data length after its latest value). */
static inline int arrowbuf_put_offset(ArrowBuf *offsets, size_t data_len) {
    if (!arrowbuf_offset_fits(data_len))
        return 0;
    int32_t end = (int32_t)data_len;
    return arrowbuf_append(offsets, &end, sizeof end);
}

/* The filled part as a new bytes object (GIL held), or NULL with MemoryError set. */
static inline PyObject *arrowbuf_bytes(const ArrowBuf *b) {
    return PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len);
}

static inline void arrowbuf_free(ArrowBuf *b) {
    PyMem_RawFree(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

#endif
