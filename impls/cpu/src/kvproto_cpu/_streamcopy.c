/* kvproto_cpu._streamcopy: row copies with non-temporal (streaming) stores (CPU-13).
 *
 * copy_rows(destination, source) copies a 2-D byte array row by row, each row contiguous, into
 * another of the same shape. On x86-64 the bulk of each row is written with SSE2 streaming stores
 * (_mm_stream_si128), which bypass the cache: a block copied into a CPU slot is not read again
 * soon, and a store that skips the cache also skips reading the destination line first, so a copy
 * moves two bytes of memory traffic per byte instead of three. Elsewhere the rows are memcpy'd.
 * The GIL is released while copying. The address ranges the two arrays span (first row to last)
 * must not intersect (ValueError): a conservative test, which also refuses two interleaved views
 * of one buffer that share no byte.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
/* SSE2 is part of x86-64; gcc and clang say so with __SSE2__, MSVC with _M_X64 / _M_AMD64. */
#if defined(__SSE2__) || defined(_M_X64) || defined(_M_AMD64)
#include <emmintrin.h>
#define STREAMING 1
#else
#define STREAMING 0
#endif

static void copy_row(char *dst, const char *src, size_t n)
{
#if STREAMING
    /* Streaming stores need a 16-byte aligned destination: the unaligned head and the tail under
     * one cache line go through memcpy. */
    size_t head = (size_t)(-(uintptr_t)dst) & 15u;
    if (head > n)
        head = n;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    for (; n >= 64; dst += 64, src += 64, n -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src);
        __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
#endif
    memcpy(dst, src, n);
}

/* The [lo, hi) address range a 2-D buffer's rows cover (rows of `width` bytes, any row stride). */
static void extent(const Py_buffer *view, Py_ssize_t width, uintptr_t *lo, uintptr_t *hi)
{
    uintptr_t first = (uintptr_t)view->buf;
    uintptr_t last = first + (uintptr_t)((view->shape[0] - 1) * view->strides[0]);
    *lo = first < last ? first : last;
    *hi = (first < last ? last : first) + (uintptr_t)width;
}

static PyObject *copy_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "copy_rows() takes 2 positional arguments (%zd given)", nargs);
        return NULL;
    }
    Py_buffer dst, src;
    if (PyObject_GetBuffer(args[0], &dst, PyBUF_STRIDES | PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &src, PyBUF_STRIDES) < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    PyObject *result = NULL;
    if (dst.ndim != 2 || src.ndim != 2 || dst.itemsize != 1 || src.itemsize != 1) {
        PyErr_SetString(PyExc_ValueError, "copy_rows: destination and source must be 2-D arrays of bytes");
        goto done;
    }
    if (dst.shape[0] != src.shape[0] || dst.shape[1] != src.shape[1]) {
        PyErr_Format(PyExc_ValueError, "copy_rows: destination is %zd x %zd bytes but source is %zd x %zd",
                     dst.shape[0], dst.shape[1], src.shape[0], src.shape[1]);
        goto done;
    }
    Py_ssize_t rows = dst.shape[0], width = dst.shape[1];
    if (rows == 0 || width == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (width > 1 && (dst.strides[1] != 1 || src.strides[1] != 1)) {
        PyErr_SetString(PyExc_ValueError, "copy_rows: each row must be contiguous");
        goto done;
    }
    uintptr_t dst_lo, dst_hi, src_lo, src_hi;
    extent(&dst, width, &dst_lo, &dst_hi);
    extent(&src, width, &src_lo, &src_hi);
    if (dst_lo < src_hi && src_lo < dst_hi) {
        PyErr_SetString(PyExc_ValueError, "copy_rows: destination and source overlap (their address ranges intersect)");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++)
        copy_row((char *)dst.buf + r * dst.strides[0], (const char *)src.buf + r * src.strides[0], (size_t)width);
#if STREAMING
    _mm_sfence(); /* streaming stores are weakly ordered: visible to every thread before we return */
#endif
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyMethodDef methods[] = {
    {"copy_rows", (PyCFunction)(void (*)(void))copy_rows, METH_FASTCALL,
     "copy_rows(destination, source, /)\n--\n\n"
     "Copy a 2-D byte array, rows contiguous, into another of the same shape (streaming stores where "
     "the CPU has them); the GIL is released while copying; the address ranges the two span must not "
     "intersect."},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *m)
{
    /* STREAMING: whether this build writes with streaming stores (False: memcpy only). */
    return PyModule_AddObjectRef(m, "STREAMING", STREAMING ? Py_True : Py_False);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, (void *)exec_module},
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvproto_cpu._streamcopy", NULL, 0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__streamcopy(void)
{
    return PyModuleDef_Init(&module);
}
