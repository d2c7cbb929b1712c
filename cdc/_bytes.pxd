# cython: language_level=3
"""The byte primitives of the compiled kernels, written once: appending to a bytearray, Avro's
long (a zig-zag varint) written and read, and fixed-width integers in either byte order.

``cdc/_fast.pyx``, ``cdc/log/_fast.pyx``, ``connectors/postgres/_fast.pyx`` and
``connectors/mysql/_fast.pyx`` cimport them (``from cdc._bytes cimport ...``); every function is
``cdef inline``, compiled into each kernel, so there is no module of this name at run time. The
pure-Python twins write the same bytes with ``bytearray``, ``int.to_bytes`` and ``struct``.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.string cimport memcpy

cdef extern from "Python.h":
    ctypedef struct PyByteArrayObject:
        Py_ssize_t ob_alloc
        char* ob_bytes
        char* ob_start
    void Py_SET_SIZE(object o, Py_ssize_t size)


# ------------------------------------------------------------------ appending to a bytearray

cdef inline int put(bytearray out, const char* data, Py_ssize_t n) except -1:
    """Append ``n`` bytes: in place while the bytearray's allocation has room (most writes:
    bytearray over-allocates and the scratch buffers are reused), else through
    PyByteArray_Resize (which grows it)."""
    cdef PyByteArrayObject* raw = <PyByteArrayObject*>out
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(out)
    if raw.ob_start == raw.ob_bytes and size + n < raw.ob_alloc:
        Py_SET_SIZE(out, size + n)
        memcpy(raw.ob_start + size, data, n)
        raw.ob_start[size + n] = 0  # bytearray keeps a NUL after its bytes
        return 0
    PyByteArray_Resize(out, size + n)
    memcpy(PyByteArray_AS_STRING(out) + size, data, n)
    return 0


cdef inline int put_byte(bytearray out, int value) except -1:
    """Append one byte (``value``'s low eight bits)."""
    cdef char c = <char>value
    return put(out, &c, 1)


cdef inline int put_bytes(bytearray out, bytes data) except -1:
    """Append a bytes object's bytes."""
    return put(out, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


cdef inline int put_long(bytearray out, long long value) except -1:
    """Append an Avro long: zig-zag, then a little-endian base-128 varint (1 to 10 bytes)."""
    cdef unsigned long long n = (<unsigned long long>value << 1) ^ <unsigned long long>(value >> 63)
    cdef char buf[10]
    cdef int i = 0
    while n > 0x7F:
        buf[i] = <char>((n & 0x7F) | 0x80)
        n >>= 7
        i += 1
    buf[i] = <char>n
    return put(out, buf, i + 1)


cdef inline int put_blob(bytearray out, const char* data, Py_ssize_t n) except -1:
    """Append Avro bytes or string: the length as a long, then the ``n`` bytes."""
    put_long(out, n)
    return put(out, data, n)


# ------------------------------------------------------------------ reading an Avro long

cdef inline const unsigned char* read_long(const unsigned char* p, const unsigned char* end,
                                           long long* value) noexcept nogil:
    """The Avro long at ``p`` into ``value``; returns just past it, or NULL when it does not end
    within ``end`` or within ten bytes (then ``end - p > 10`` tells that the long is too long
    rather than cut short)."""
    cdef unsigned long long n = 0
    cdef int shift = 0
    while p < end and shift <= 63:
        n |= (<unsigned long long>(p[0] & 0x7F)) << shift
        shift += 7
        if p[0] < 0x80:
            value[0] = <long long>((n >> 1) ^ (-(n & 1)))
            return p + 1
        p += 1
    return NULL


# ------------------------------------------------------------------ fixed-width integers
# Written out byte by byte rather than as loops: with a constant width (most calls) the compiler
# drops the tests that fail and is left with straight-line code (gcc -O2 keeps a loop a loop).

cdef inline unsigned long long load_le(const unsigned char* p, int n) noexcept nogil:
    """The unsigned little-endian integer of the ``n`` (0 to 8) bytes at ``p``."""
    cdef unsigned long long v = 0
    if n > 0:
        v = p[0]
    if n > 1:
        v |= <unsigned long long>p[1] << 8
    if n > 2:
        v |= <unsigned long long>p[2] << 16
    if n > 3:
        v |= <unsigned long long>p[3] << 24
    if n > 4:
        v |= <unsigned long long>p[4] << 32
    if n > 5:
        v |= <unsigned long long>p[5] << 40
    if n > 6:
        v |= <unsigned long long>p[6] << 48
    if n > 7:
        v |= <unsigned long long>p[7] << 56
    return v


cdef inline unsigned long long load_be(const unsigned char* p, int n) noexcept nogil:
    """The unsigned big-endian integer of the ``n`` (0 to 8) bytes at ``p``."""
    cdef unsigned long long v = 0
    if n > 0:
        v = p[0]
    if n > 1:
        v = (v << 8) | p[1]
    if n > 2:
        v = (v << 8) | p[2]
    if n > 3:
        v = (v << 8) | p[3]
    if n > 4:
        v = (v << 8) | p[4]
    if n > 5:
        v = (v << 8) | p[5]
    if n > 6:
        v = (v << 8) | p[6]
    if n > 7:
        v = (v << 8) | p[7]
    return v


cdef inline void store_le(unsigned char* p, unsigned long long v, int n) noexcept nogil:
    """``v``'s low ``n`` (0 to 8) bytes at ``p``, little-endian."""
    if n > 0:
        p[0] = <unsigned char>(v & 0xFF)
    if n > 1:
        p[1] = <unsigned char>((v >> 8) & 0xFF)
    if n > 2:
        p[2] = <unsigned char>((v >> 16) & 0xFF)
    if n > 3:
        p[3] = <unsigned char>((v >> 24) & 0xFF)
    if n > 4:
        p[4] = <unsigned char>((v >> 32) & 0xFF)
    if n > 5:
        p[5] = <unsigned char>((v >> 40) & 0xFF)
    if n > 6:
        p[6] = <unsigned char>((v >> 48) & 0xFF)
    if n > 7:
        p[7] = <unsigned char>((v >> 56) & 0xFF)


cdef inline void store_be(unsigned char* p, unsigned long long v, int n) noexcept nogil:
    """``v``'s low ``n`` (0 to 8) bytes at ``p``, big-endian (two's complement for a negative
    value cast to unsigned)."""
    if n > 0:
        p[n - 1] = <unsigned char>(v & 0xFF)
    if n > 1:
        p[n - 2] = <unsigned char>((v >> 8) & 0xFF)
    if n > 2:
        p[n - 3] = <unsigned char>((v >> 16) & 0xFF)
    if n > 3:
        p[n - 4] = <unsigned char>((v >> 24) & 0xFF)
    if n > 4:
        p[n - 5] = <unsigned char>((v >> 32) & 0xFF)
    if n > 5:
        p[n - 6] = <unsigned char>((v >> 40) & 0xFF)
    if n > 6:
        p[n - 7] = <unsigned char>((v >> 48) & 0xFF)
    if n > 7:
        p[n - 8] = <unsigned char>((v >> 56) & 0xFF)
