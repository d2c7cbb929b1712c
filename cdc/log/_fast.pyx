# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twins of cdc/log/partitioner.py's murmur2 and cdc/log/segment.py's record framing.

Same results, bit for bit (tests/test_partitioner.py and tests/test_local_log.py run both).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t
from libc.string cimport memcpy

from cdc._bytes cimport load_le, store_le

cdef extern from "crc32_fold.h":
    uint32_t cdc_crc32(uint32_t crc, const unsigned char* buf, size_t len) nogil
    int cdc_crc32_accelerated() nogil


def crc32(data, unsigned int value=0):
    """``zlib.crc32(data, value)``, folded with PCLMULQDQ where the CPU has it
    (cdc/log/crc32_fold.h): what framing and verification use."""
    cdef const unsigned char[:] view = data
    if view.shape[0] == 0:
        return value
    return cdc_crc32(value, &view[0], view.shape[0])


def crc32_accelerated():
    """Whether :func:`crc32` folds with PCLMULQDQ on this machine."""
    return bool(cdc_crc32_accelerated())


cdef inline uint32_t _murmur2(const unsigned char* data, Py_ssize_t length):
    cdef uint32_t m = 0x5BD1E995
    cdef uint32_t h = 0x9747B28C ^ <uint32_t>length
    cdef uint32_t k
    cdef Py_ssize_t i, whole = length & ~3
    for i in range(0, whole, 4):
        k = <uint32_t>load_le(data + i, 4)
        k *= m
        k ^= k >> 24
        k *= m
        h *= m
        h ^= k
    cdef Py_ssize_t rest = length & 3
    if rest == 3:
        h ^= <uint32_t>data[whole + 2] << 16
    if rest >= 2:
        h ^= <uint32_t>data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h *= m
    h ^= h >> 13
    h *= m
    h ^= h >> 15
    return h


def murmur2(bytes data):
    """Kafka's ``Utils.murmur2`` as a signed 32-bit int (see partitioner.murmur2)."""
    cdef uint32_t h = _murmur2(<const unsigned char*>PyBytes_AS_STRING(data),
                               PyBytes_GET_SIZE(data))
    return <int>h if h < 0x80000000 else <long long>h - 4294967296


def partition_for(bytes key, int partitions):
    """See partitioner.partition_for."""
    cdef uint32_t h = _murmur2(<const unsigned char*>PyBytes_AS_STRING(key),
                               PyBytes_GET_SIZE(key))
    return (h & 0x7FFFFFFF) % partitions


cdef inline Py_ssize_t _framed_size(bytes key, value, bytes position) except -1:
    """The framed size of a record (and the check that its parts fit the format)."""
    cdef Py_ssize_t key_len = PyBytes_GET_SIZE(key), pos_len = PyBytes_GET_SIZE(position)
    cdef Py_ssize_t value_len = 0 if value is None else PyBytes_GET_SIZE(<bytes>value)
    if pos_len > 0xFFFF or key_len > 0xFFFFFFFF or value_len > 0xFFFFFFFF:
        raise OverflowError("a record part is too long for the segment format")
    return 4 + 27 + 4 + pos_len + key_len + value_len  # length, crc, body header, parts


cdef void _frame_into(char* p, Py_ssize_t size, long long offset, long long timestamp_ms,
                      bytes key, value, bytes position):
    """One framed record (segment.encode_record) written at ``p`` (``size`` bytes)."""
    cdef Py_ssize_t key_len = PyBytes_GET_SIZE(key), pos_len = PyBytes_GET_SIZE(position)
    cdef Py_ssize_t value_len = 0 if value is None else PyBytes_GET_SIZE(<bytes>value)
    cdef unsigned char* u = <unsigned char*>p
    store_le(u, <uint32_t>(size - 4), 4)
    store_le(u + 8, <unsigned long long>offset, 8)
    store_le(u + 16, <unsigned long long>timestamp_ms, 8)
    p[24] = <char>(1 if value is None else 0)
    store_le(u + 25, <unsigned long long>pos_len, 2)
    store_le(u + 27, <uint32_t>key_len, 4)
    store_le(u + 31, <uint32_t>value_len, 4)
    memcpy(p + 35, PyBytes_AS_STRING(position), pos_len)
    memcpy(p + 35 + pos_len, PyBytes_AS_STRING(key), key_len)
    if value_len:
        memcpy(p + 35 + pos_len + key_len, PyBytes_AS_STRING(<bytes>value), value_len)
    store_le(u + 4, cdc_crc32(0, <const unsigned char*>(p + 8), <size_t>(size - 8)), 4)


def encode_record_bytes(long long offset, long long timestamp_ms, bytes key, value,
                        bytes position):
    """One framed record as a single bytes object (see segment.encode_record_bytes)."""
    cdef Py_ssize_t size = _framed_size(key, value, position)
    out = PyBytes_FromStringAndSize(NULL, size)
    _frame_into(PyBytes_AS_STRING(out), size, offset, timestamp_ms, key, value, position)
    return out


def parse_records(bytes buffer, Py_ssize_t cursor, long long buffer_start, bint verify):
    """See segment.parse_records (the same tuples, bit for bit)."""
    cdef const unsigned char* data = <const unsigned char*>PyBytes_AS_STRING(buffer)
    cdef Py_ssize_t total = PyBytes_GET_SIZE(buffer)
    cdef Py_ssize_t size, at, pos_len, key_len, value_len
    cdef uint32_t length
    cdef list out = []
    while total - cursor >= 35:
        length = <uint32_t>load_le(data + cursor, 4)
        size = 4 + <Py_ssize_t>length
        if size < 35:
            return out, cursor, cursor
        if total - cursor < size:
            break
        if verify and cdc_crc32(0, data + cursor + 8, <size_t>(size - 8)) \
                != <uint32_t>load_le(data + cursor + 4, 4):
            return out, cursor, cursor
        pos_len = <Py_ssize_t>load_le(data + cursor + 25, 2)
        key_len = <Py_ssize_t>load_le(data + cursor + 27, 4)
        value_len = <Py_ssize_t>load_le(data + cursor + 31, 4)
        if 35 + pos_len + key_len + value_len > size:
            return out, cursor, cursor
        at = cursor + 35
        position = PyBytes_FromStringAndSize(<const char*>(data + at), pos_len)
        at += pos_len
        key = PyBytes_FromStringAndSize(<const char*>(data + at), key_len)
        at += key_len
        if data[cursor + 24] & 1:
            value = None
        else:
            value = PyBytes_FromStringAndSize(<const char*>(data + at), value_len)
        out.append((<int64_t>load_le(data + cursor + 8, 8),
                    <int64_t>load_le(data + cursor + 16, 8), key, value, position,
                    buffer_start + cursor, size))
        cursor += size
    return out, cursor, -1


from cpython.bytearray cimport (PyByteArray_AS_STRING, PyByteArray_FromStringAndSize,
                                 PyByteArray_GET_SIZE, PyByteArray_Resize)
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyTypeObject


cdef extern from *:
    """
    /* ``type(topic, partition, offset, (file, start, size))`` for a tuple subclass without
       __dict__ (a NamedTuple): what tuple.__new__(type, ...) makes, without the argument
       tuple in between */
    static PyObject* cdc_placed(PyTypeObject* type, PyObject* topic, long partition,
                                long long offset, PyObject* file, long long start,
                                Py_ssize_t size) {
        PyObject* location = PyTuple_New(3);
        PyObject* made;
        if (location == NULL) return NULL;
        Py_INCREF(file);
        PyTuple_SET_ITEM(location, 0, file);
        PyTuple_SET_ITEM(location, 1, PyLong_FromLongLong(start));
        PyTuple_SET_ITEM(location, 2, PyLong_FromSsize_t(size));
        if (PyTuple_GET_ITEM(location, 1) == NULL || PyTuple_GET_ITEM(location, 2) == NULL) {
            Py_DECREF(location);
            return NULL;
        }
        made = type->tp_alloc(type, 4);
        if (made == NULL) {
            Py_DECREF(location);
            return NULL;
        }
        Py_INCREF(topic);
        PyTuple_SET_ITEM(made, 0, topic);
        PyTuple_SET_ITEM(made, 1, PyLong_FromLong(partition));
        PyTuple_SET_ITEM(made, 2, PyLong_FromLongLong(offset));
        PyTuple_SET_ITEM(made, 3, location);
        if (PyTuple_GET_ITEM(made, 1) == NULL || PyTuple_GET_ITEM(made, 2) == NULL) {
            Py_DECREF(made);
            return NULL;
        }
        return made;
    }
    """
    object cdc_placed(PyTypeObject* type, object topic, long partition, long long offset,
                      object file, long long start, Py_ssize_t size)


cdef class _Frames:
    """One topic's partitions within one frame_records call: next offsets, blobs, bytes used,
    where each blob goes (file, first byte); C arrays, so a record costs no dict lookup."""
    cdef object topic
    cdef list parts  # offsets[topic], written back at the end
    cdef Py_ssize_t count
    cdef long long* next_offset
    cdef Py_ssize_t* used
    cdef long long* base
    cdef char* touched
    cdef list blobs  # bytearray or None per partition
    cdef list files  # file or None per partition

    def __cinit__(self, topic, list parts):
        cdef Py_ssize_t i
        self.topic = topic
        self.parts = parts
        self.count = len(parts)
        self.next_offset = <long long*>PyMem_Malloc(self.count * sizeof(long long))
        self.used = <Py_ssize_t*>PyMem_Malloc(self.count * sizeof(Py_ssize_t))
        self.base = <long long*>PyMem_Malloc(self.count * sizeof(long long))
        self.touched = <char*>PyMem_Malloc(self.count)
        if not (self.next_offset and self.used and self.base and self.touched):
            raise MemoryError()
        for i in range(self.count):
            self.next_offset[i] = parts[i]
            self.touched[i] = 0
        self.blobs = [None] * self.count
        self.files = [None] * self.count

    def __dealloc__(self):
        PyMem_Free(self.next_offset)
        PyMem_Free(self.used)
        PyMem_Free(self.base)
        PyMem_Free(self.touched)

    cdef int touch(self, Py_ssize_t partition, dict blobs, dict used, base_of) except -1:
        where = (self.topic, partition)
        found = blobs.get(where)
        if found is None:
            found = blobs[where] = bytearray()
        self.blobs[partition] = found
        self.used[partition] = used.get(where, 0)
        file, first = base_of(self.topic, partition)
        self.files[partition] = file
        self.base[partition] = first
        self.touched[partition] = 1
        return 0

    cdef int finish(self, dict used) except -1:
        cdef Py_ssize_t i
        for i in range(self.count):
            if self.touched[i]:
                self.parts[i] = self.next_offset[i]
                used[(self.topic, i)] = self.used[i]
        return 0


def frame_records(list records, dict offsets, long long now_ms, dict blobs, dict used, result,
                  base_of):
    """See segment.frame_records."""
    cdef list out = []
    cdef dict frames = {}
    cdef _Frames current = None
    cdef bytearray blob
    cdef Py_ssize_t size, at, have
    cdef uint32_t partition
    cdef long long offset
    if not isinstance(result, type) or not issubclass(result, tuple):
        raise TypeError("result must be a tuple subclass (a NamedTuple)")
    for record in records:
        topic = record[0]
        key = <bytes>record[1]
        if current is None or topic is not current.topic:
            current = frames.get(topic)
            if current is None:
                current = frames[topic] = _Frames(topic, offsets[topic])
        partition = (_murmur2(<const unsigned char*>PyBytes_AS_STRING(key),
                              PyBytes_GET_SIZE(key)) & 0x7FFFFFFF) % <uint32_t>current.count
        if not current.touched[partition]:
            current.touch(partition, blobs, used, base_of)
        offset = current.next_offset[partition]
        current.next_offset[partition] = offset + 1
        blob = <bytearray>current.blobs[partition]
        size = _framed_size(key, record[2], <bytes>record[3])
        at = current.used[partition]
        have = PyByteArray_GET_SIZE(blob)
        if at + size > have:  # grow geometrically; the bytes past ``used`` are scratch
            try:
                PyByteArray_Resize(blob, max(at + size, 2 * have, 65536))
            except BufferError:  # a view of it is still alive somewhere: use a new one
                blob = PyByteArray_FromStringAndSize(PyByteArray_AS_STRING(blob), at)
                PyByteArray_Resize(blob, max(at + size, 2 * have, 65536))
                blobs[(topic, partition)] = blob
                current.blobs[partition] = blob
        current.used[partition] = at + size
        _frame_into(PyByteArray_AS_STRING(blob) + at, size, offset, now_ms, key, record[2],
                    <bytes>record[3])
        out.append(cdc_placed(<PyTypeObject*>result, topic, partition, offset,
                              current.files[partition], current.base[partition] + at, size))
    for current in frames.values():
        current.finish(used)
    return out
