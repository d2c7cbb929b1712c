# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of cdc/avro.py's ``envelope_tail`` (same bytes; tests/test_rowcodec.py and
tests/test_codec.py run both)."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.tuple cimport PyTuple_Check
from libc.string cimport memcpy

from cdc._bytes cimport load_le, put_blob, put_byte, put_bytes, put_long, read_long


def envelope_tail(bytearray out, tuple pieces, sequence, lsn, bytes txn_prefix, total, dco,
                  bytes op, bytes times):
    """See cdc.avro.envelope_tail."""
    put_bytes(out, <bytes>pieces[0])
    if sequence is None:
        put_byte(out, 0)
    else:
        data = (<str>sequence).encode()
        put_byte(out, 2)
        put_blob(out, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
    put_bytes(out, <bytes>pieces[1])
    if lsn is None:
        put_byte(out, 0)
    else:
        put_byte(out, 2)
        put_long(out, lsn)
    put_bytes(out, <bytes>pieces[2])
    if txn_prefix is None:
        put_byte(out, 0)
    else:
        put_bytes(out, txn_prefix)
        put_long(out, total)
        put_long(out, dco)
    put_bytes(out, op)
    put_bytes(out, times)


# ------------------------------------------------------------------ envelope projection
# Compiled twin of the generated readers of cdc/avroreader.py: runs the tree of nodes
# built by ``cdc.avroreader.compile_program`` (tuples ``(code, a, b, c)``) over a value.
# The node codes below are mirrored there (``_N``); cdc/avroreader.py documents them.

from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.bytes cimport PyBytes_FromStringAndSize

cdef enum:
    N_NULL = 0
    N_BOOL = 1
    N_LONG = 2
    N_FLOAT = 3
    N_DOUBLE = 4
    N_BYTES = 5
    N_STRING = 6
    S_LONG = 7
    S_BYTES = 8
    S_FIXED = 9
    N_UNION = 10
    S_RECORD = 11
    N_PY = 12
    S_PY = 13
    N_DECTEXT = 14
    N_CONVERT = 15
    N_ROW = 16


cdef inline int _need(Py_ssize_t at, Py_ssize_t n, Py_ssize_t size) except -1:
    if n < 0 or at + n > size:
        raise IndexError("the Avro value ends early")
    return 0


cdef inline long long _zigzag(const unsigned char* buf, Py_ssize_t size, Py_ssize_t* pos) except? -1:
    cdef long long value
    cdef const unsigned char* end = read_long(buf + pos[0], buf + size, &value)
    if end == NULL:
        if size - pos[0] > 10:
            raise ValueError("an Avro long longer than 10 bytes")
        raise IndexError("the Avro value ends early")
    pos[0] = end - buf
    return value


cdef object _dectext(const unsigned char* buf, Py_ssize_t size, Py_ssize_t* pos, tuple node):
    """A decimal's bytes as its JSON form: ``format(Decimal, "f")`` of the scaled value."""
    cdef long long length = _zigzag(buf, size, pos)
    cdef Py_ssize_t at = pos[0]
    cdef int scale = node[1]
    cdef int precision = node[2]
    cdef unsigned long long u = 0
    cdef long long n
    cdef bint negative
    cdef char digits[24]
    cdef char out[64]
    cdef int count = 0, i, k = 0
    _need(at, <Py_ssize_t>length, size)
    pos[0] = at + <Py_ssize_t>length
    if length > 8:
        return node[3](int.from_bytes(buf[at:at + length], "big", signed=True))
    if length > 0:
        u = 0xFFFFFFFFFFFFFFFF if buf[at] & 0x80 else 0
        for i in range(<int>length):
            u = (u << 8) | buf[at + i]
    n = <long long>u
    negative = n < 0
    u = <unsigned long long>(-n) if negative else <unsigned long long>n
    while True:
        digits[count] = <char>(48 + u % 10)
        count += 1
        u //= 10
        if u == 0:
            break
    if (count > precision and n != 0) or scale > 40:
        return node[3](n)
    if negative:
        out[k] = 45
        k += 1
    if count <= scale:  # 0.00ddd
        out[k] = 48
        k += 1
        out[k] = 46
        k += 1
        for i in range(scale - count):
            out[k] = 48
            k += 1
        for i in range(count - 1, -1, -1):
            out[k] = digits[i]
            k += 1
    else:
        for i in range(count - 1, -1, -1):
            out[k] = digits[i]
            k += 1
            if i == scale and scale > 0:
                out[k] = 46
                k += 1
    return PyUnicode_DecodeUTF8(out, k, NULL)


cdef object _run(tuple node, object data, const unsigned char* buf, Py_ssize_t size,
                 Py_ssize_t* pos):
    cdef int code = node[0]
    cdef long long n
    cdef Py_ssize_t at
    cdef unsigned int i
    cdef unsigned int u32
    cdef unsigned long long u64
    cdef float f
    cdef double d
    cdef tuple items
    cdef dict out
    if code == N_STRING or code == N_BYTES:
        n = _zigzag(buf, size, pos)
        at = pos[0]
        _need(at, <Py_ssize_t>n, size)
        pos[0] = at + <Py_ssize_t>n
        if code == N_STRING:
            return PyUnicode_DecodeUTF8(<const char*>buf + at, <Py_ssize_t>n, NULL)
        return PyBytes_FromStringAndSize(<const char*>buf + at, <Py_ssize_t>n)
    if code == N_UNION:
        _need(pos[0], 1, size)
        i = buf[pos[0]] >> 1
        pos[0] += 1
        items = node[1]
        if i >= <unsigned int>len(items):
            raise ValueError("union branch out of range")
        return _run(<tuple>items[i], data, buf, size, pos)
    if code == N_LONG:
        return _zigzag(buf, size, pos)
    if code == S_LONG:
        at = pos[0]
        while True:
            _need(at, 1, size)
            if buf[at] < 128:
                break
            at += 1
        pos[0] = at + 1
        return None
    if code == S_BYTES:
        n = _zigzag(buf, size, pos)
        pos[0] += <Py_ssize_t>n
        return None
    if code == N_NULL:
        return None
    if code == S_RECORD:
        for item in <tuple>node[1]:
            _run(<tuple>item, data, buf, size, pos)
        return None
    if code == N_ROW:
        out = {}
        items = node[2]
        for i, name in enumerate(<tuple>node[1]):
            out[name] = _run(<tuple>items[i], data, buf, size, pos)
        return out
    if code == N_DECTEXT:
        return _dectext(buf, size, pos, node)
    if code == N_CONVERT:
        value = _run(<tuple>node[1], data, buf, size, pos)
        return None if value is None else node[2](value)
    if code == N_BOOL:
        _need(pos[0], 1, size)
        pos[0] += 1
        return buf[pos[0] - 1] == 1
    if code == N_FLOAT:
        at = pos[0]
        _need(at, 4, size)
        u32 = <unsigned int>load_le(buf + at, 4)
        memcpy(&f, &u32, 4)
        pos[0] = at + 4
        return <double>f
    if code == N_DOUBLE:
        at = pos[0]
        _need(at, 8, size)
        u64 = load_le(buf + at, 8)
        memcpy(&d, &u64, 8)
        pos[0] = at + 8
        return d
    if code == S_FIXED:
        pos[0] += <Py_ssize_t>node[1]
        return None
    if code == N_PY:
        value, pos[0] = node[1](data, pos[0])
        return value
    if code == S_PY:
        pos[0] = node[1](data, pos[0])
        return None
    raise ValueError(f"unknown projection node {code}")


def run_program(tuple program, bytes data, Py_ssize_t start):
    """``(op, after image, ts)`` of ``data`` read from ``start`` by ``program``: a tuple of
    ``(slot, node)`` steps, slot 0 = op, 1 = after, 2 = ts, -1 = skipped."""
    cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t pos = start
    cdef int slot
    op = after = ts = None
    for step in program:
        slot = (<tuple>step)[0]
        value = _run(<tuple>(<tuple>step)[1], data, buf, size, &pos)
        if slot == 0:
            op = value
        elif slot == 1:
            after = value
        elif slot == 2:
            ts = value
    if pos > size:
        raise IndexError("the Avro value ends early")
    return op, after, ts


# ------------------------------------------------------------------ previous images' key index
# Compiled twin of cdc/images.py's KeyIndex: the same answers, about 32 bytes a key instead of
# a few hundred (a dict of bytes keys and tuples).

from libc.stdlib cimport calloc, free
from libc.stdint cimport uint32_t, uint64_t

DEF NO_FILE = 0xFFFFFF


cdef inline uint64_t _fnv1a(const unsigned char* data, Py_ssize_t n):
    cdef uint64_t h = 1469598103934665603ULL
    cdef Py_ssize_t i
    for i in range(n):
        h ^= data[i]
        h *= 1099511628211ULL
    return h if h else 1  # 0 marks an empty slot


cdef class KeyIndex:
    """See cdc.images.KeyIndex. Keys are kept as 64-bit hashes: ``get`` may answer for another
    key with the same hash, which the caller finds when the record it reads has another key."""

    cdef uint64_t* hashes
    cdef uint64_t* offsets
    cdef uint64_t* places  # file number << 40 | byte position
    cdef uint32_t* sizes
    cdef Py_ssize_t capacity, count
    cdef list files
    cdef dict file_ids
    cdef object last_path, last_id

    def __cinit__(self):
        self.capacity = 0
        self.count = 0
        self.files = []
        self.file_ids = {}
        self._allocate(1024)

    def __dealloc__(self):
        free(self.hashes)
        free(self.offsets)
        free(self.places)
        free(self.sizes)

    cdef int _allocate(self, Py_ssize_t capacity) except -1:
        cdef uint64_t* old_hashes = self.hashes if self.capacity else NULL
        cdef uint64_t* old_offsets = self.offsets if self.capacity else NULL
        cdef uint64_t* old_places = self.places if self.capacity else NULL
        cdef uint32_t* old_sizes = self.sizes if self.capacity else NULL
        cdef Py_ssize_t old_capacity = self.capacity, i, slot
        self.hashes = <uint64_t*>calloc(capacity, sizeof(uint64_t))
        self.offsets = <uint64_t*>calloc(capacity, sizeof(uint64_t))
        self.places = <uint64_t*>calloc(capacity, sizeof(uint64_t))
        self.sizes = <uint32_t*>calloc(capacity, sizeof(uint32_t))
        if not (self.hashes and self.offsets and self.places and self.sizes):
            raise MemoryError()
        self.capacity = capacity
        for i in range(old_capacity):
            if old_hashes[i]:
                slot = self._slot(old_hashes[i])
                self.hashes[slot] = old_hashes[i]
                self.offsets[slot] = old_offsets[i]
                self.places[slot] = old_places[i]
                self.sizes[slot] = old_sizes[i]
        free(old_hashes)
        free(old_offsets)
        free(old_places)
        free(old_sizes)
        return 0

    cdef inline Py_ssize_t _slot(self, uint64_t h):
        cdef Py_ssize_t slot = <Py_ssize_t>(h & <uint64_t>(self.capacity - 1))
        while self.hashes[slot] and self.hashes[slot] != h:
            slot = (slot + 1) & (self.capacity - 1)
        return slot

    def put(self, bytes key, long long offset, location):
        self._put(key, offset, location)

    cdef int _put(self, bytes key, long long offset, object location) except -1:
        cdef uint64_t h = _fnv1a(<const unsigned char*>PyBytes_AS_STRING(key),
                                 PyBytes_GET_SIZE(key))
        cdef uint64_t file_id = NO_FILE, at = 0
        cdef uint32_t size = 0
        cdef Py_ssize_t slot
        if location is not None:
            if not PyTuple_Check(location):
                raise TypeError(f"a location must be a tuple, not {type(location)}")
            path = (<tuple>location)[0]
            start = (<tuple>location)[1]
            length = (<tuple>location)[2]
            if path is self.last_path:  # the usual case: a commit's records share one object
                found = self.last_id
            else:
                found = self.file_ids.get(path)
                if found is None:
                    found = self.file_ids[path] = len(self.files)
                    self.files.append(path)
                self.last_path, self.last_id = path, found
            file_id = <uint64_t>found
            at = <uint64_t>start
            size = <uint32_t>length
            if file_id >= NO_FILE or at >= (1ULL << 40) or length > 0xFFFFFFFF:
                file_id, at, size = NO_FILE, 0, 0  # the offset alone still finds it
        if (self.count + 1) * 4 > self.capacity * 3:
            self._allocate(self.capacity * 2)
        slot = self._slot(h)
        if not self.hashes[slot]:
            self.count += 1
            self.hashes[slot] = h
        self.offsets[slot] = <uint64_t>offset
        self.places[slot] = (file_id << 40) | at
        self.sizes[slot] = size
        return 0

    def get(self, bytes key):
        cdef uint64_t h = _fnv1a(<const unsigned char*>PyBytes_AS_STRING(key),
                                 PyBytes_GET_SIZE(key))
        cdef Py_ssize_t slot = self._slot(h)
        cdef uint64_t file_id
        if not self.hashes[slot]:
            return None
        file_id = self.places[slot] >> 40
        if file_id == NO_FILE:
            return self.offsets[slot], None
        return self.offsets[slot], (self.files[file_id], self.places[slot] & ((1ULL << 40) - 1),
                                    self.sizes[slot])

    def __len__(self):
        return self.count


# ------------------------------------------------------------------ transaction ends
# Compiled twin of cdc/transactions.py's advance (same dicts).

cdef list _PARTITION_NAMES = [str(n) for n in range(4096)]


def advance(dict ends, results):
    """See cdc.transactions.advance."""
    cdef dict parts
    cdef long long offset
    last_topic = None
    parts = None
    for result in results:
        topic = result[0]
        if topic is not last_topic:
            found = ends.get(topic)
            if found is None:
                found = ends[topic] = {}
            parts = <dict>found
            last_topic = topic
        partition = result[1]
        name = _PARTITION_NAMES[partition] if 0 <= partition < 4096 else str(partition)
        offset = result[2]
        current = parts.get(name)
        if current is None or <long long>current <= offset:
            parts[name] = offset + 1


def index_appended(list records, list results, set topics, dict indexes, dict read_limit,
                   make):
    """See cdc.images.index_appended."""
    cdef Py_ssize_t i, count = len(records)
    cdef Py_ssize_t partition
    cdef KeyIndex index
    cdef list slots = None  # the current topic's indexes by partition (None: not made yet)
    cdef dict by_topic = {}
    cdef bint wanted = False
    last_topic = None
    if len(results) < count:  # results may go on (the transaction events a commit added)
        raise ValueError("fewer results than records")
    for i in range(count):
        record = records[i]
        if not PyTuple_Check(record):
            raise TypeError(f"a record must be a tuple (a Record), not {type(record)}")
        topic = (<tuple>record)[0]
        if topic is not last_topic:
            last_topic = topic
            wanted = topic in topics
            if wanted:
                slots = by_topic.get(topic)
                if slots is None:
                    slots = by_topic[topic] = []
        if not wanted:
            continue
        result = results[i]
        if not PyTuple_Check(result):
            raise TypeError(f"a result must be a tuple (an AppendResult), not {type(result)}")
        partition = (<tuple>result)[1]
        offset = (<tuple>result)[2]
        if partition >= len(slots):
            slots.extend([None] * (partition + 1 - len(slots)))
        found = slots[partition]
        if found is None:
            where = (topic, partition)
            found = indexes.get(where)
            if found is None:
                found = indexes[where] = make()
                read_limit[where] = offset  # older records (other runs) are read up to here
            slots[partition] = found
        index = <KeyIndex?>found
        index._put((<tuple>record)[1], offset, (<tuple>result)[3])


def remember_all(list records, set topics, dict buffered, lru):
    """See cdc.images.remember_all (returns the bytes of the LRU entries dropped)."""
    cdef Py_ssize_t dropped = 0
    cdef bint wanted = False
    cdef dict found = None
    last_topic = None
    for record in records:
        if not PyTuple_Check(record):
            raise TypeError(f"a record must be a tuple (a Record), not {type(record)}")
        topic = (<tuple>record)[0]
        if topic is not last_topic:
            last_topic = topic
            wanted = topic in topics
            if wanted:
                found = buffered.get(topic)
                if found is None:
                    found = buffered[topic] = {}
        if not wanted:
            continue
        key = (<tuple>record)[1]
        found[key] = (<tuple>record)[2]
        if lru:
            old = lru.pop((topic, key), None)
            if old is not None:
                dropped += <Py_ssize_t>(<tuple>old)[1]
    return dropped


def value_bytes(list records):
    """The bytes of the records' values (tombstones count 0)."""
    cdef Py_ssize_t total = 0
    for record in records:
        if not PyTuple_Check(record):
            raise TypeError(f"a record must be a tuple (a Record), not {type(record)}")
        value = (<tuple>record)[2]
        if value is not None:
            total += len(value)
    return total
