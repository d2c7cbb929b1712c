# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of cdc/avro.py's ``envelope_tail`` (same bytes; tests/test_rowcodec.py and
tests/test_codec.py run both)."""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.string cimport memcpy


cdef inline int _put(bytearray out, const char* data, Py_ssize_t n) except -1:
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(out)
    PyByteArray_Resize(out, size + n)
    memcpy(PyByteArray_AS_STRING(out) + size, data, n)
    return 0


cdef inline int _bytes(bytearray out, bytes data) except -1:
    return _put(out, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


cdef inline int _long(bytearray out, long long value) except -1:
    cdef unsigned long long n = (<unsigned long long>value << 1) ^ <unsigned long long>(value >> 63)
    cdef char buf[10]
    cdef int i = 0
    while n > 0x7F:
        buf[i] = <char>((n & 0x7F) | 0x80)
        n >>= 7
        i += 1
    buf[i] = <char>n
    return _put(out, buf, i + 1)


cdef inline int _byte(bytearray out, char value) except -1:
    return _put(out, &value, 1)


def envelope_tail(bytearray out, tuple pieces, sequence, lsn, bytes txn_prefix, total, dco,
                  bytes op, bytes times):
    """See cdc.avro.envelope_tail."""
    cdef const char* s
    cdef Py_ssize_t n
    _bytes(out, <bytes>pieces[0])
    if sequence is None:
        _byte(out, 0)
    else:
        data = (<str>sequence).encode()
        _byte(out, 2)
        _long(out, PyBytes_GET_SIZE(data))
        _bytes(out, data)
    _bytes(out, <bytes>pieces[1])
    if lsn is None:
        _byte(out, 0)
    else:
        _byte(out, 2)
        _long(out, lsn)
    _bytes(out, <bytes>pieces[2])
    if txn_prefix is None:
        _byte(out, 0)
    else:
        _bytes(out, txn_prefix)
        _long(out, total)
        _long(out, dco)
    _bytes(out, op)
    _bytes(out, times)
