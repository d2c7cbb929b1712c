# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of connectors/mysql/rowcodec.py's decode_rows.

Same plans, same contract, same bytes (tests/test_mysql_rowcodec.py compares both on real rows
events); anything unexpected raises fallback.Fallback and the caller takes the typed path.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdio cimport snprintf
from libc.string cimport memcpy, memset

from cdc._bytes cimport load_be, load_le, put, put_blob, put_byte, put_long, store_be

import json

from connectors.mysql.fallback import Fallback

DEF INT = 1
DEF UINT64 = 2
DEF FLOAT = 3
DEF DOUBLE = 4
DEF DECIMAL = 5
DEF STRING = 6
DEF BYTES = 7
DEF ENUM = 8
DEF DATE = 9
DEF DATETIME2 = 10
DEF TIMESTAMP2 = 11
DEF YEAR = 12

cdef int[10] DIG2BYTES = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]
cdef long long[10] POW10 = [1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000,
                            1000000000]


cdef inline long long _days_from_civil(long long y, long long m, long long d):
    y -= m <= 2
    cdef long long era = (y if y >= 0 else y - 399) // 400
    cdef long long yoe = y - era * 400
    cdef long long doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    cdef long long doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


cdef inline void _civil_from_days(long long z, long long* y, long long* m, long long* d):
    z += 719468
    cdef long long era = (z if z >= 0 else z - 146096) // 146097
    cdef long long doe = z - era * 146097
    cdef long long yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    cdef long long doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    cdef long long mp = (5 * doy + 2) // 153
    d[0] = doy - (153 * mp + 2) // 5 + 1
    m[0] = mp + 3 if mp < 10 else mp - 9
    y[0] = yoe + era * 400 + (m[0] <= 2)


cdef int _unscaled(bytearray out, object value) except -1:
    """Avro decimal bytes (minimal big-endian two's complement) of a Python int."""
    data = value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)
    return put_blob(out, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


cdef int _unscaled_ll(bytearray out, long long value) except -1:
    cdef unsigned char buf[9]
    cdef int n = 1
    # the fewest bytes whose two's complement holds the value (with room for the sign bit)
    while n < 8 and not (-(1LL << (8 * n - 1)) <= value < (1LL << (8 * n - 1))):
        n += 1
    store_be(buf, <unsigned long long>value, n)
    return put_blob(out, <const char*>buf, n)


cdef Py_ssize_t _decimal(bytearray out, const unsigned char* p, Py_ssize_t left, int precision,
                         int scale) except -2:
    """Write MySQL's packed DECIMAL at ``p`` as Avro decimal bytes; return its size."""
    cdef int integral = precision - scale
    cdef Py_ssize_t size = (integral // 9) * 4 + DIG2BYTES[integral % 9] + (scale // 9) * 4 + \
        DIG2BYTES[scale % 9]
    if size > left or size > 64:
        raise Fallback()
    cdef unsigned char raw[64]
    memcpy(raw, p, size)
    cdef bint negative = not (raw[0] & 0x80)
    raw[0] ^= 0x80
    cdef Py_ssize_t i
    if negative:
        for i in range(size):
            raw[i] ^= 0xFF
    cdef int offset = 0
    cdef int groups[16]
    cdef int widths[16]
    cdef int count = 0
    if integral % 9:
        groups[count] = integral % 9
        count += 1
    for i in range(integral // 9):
        groups[count] = 9
        count += 1
    for i in range(scale // 9):
        groups[count] = 9
        count += 1
    if scale % 9:
        groups[count] = scale % 9
        count += 1
    cdef long long small = 0
    cdef object big
    cdef int digits, width
    cdef long long part
    if precision <= 18:
        for i in range(count):
            digits = groups[i]
            width = DIG2BYTES[digits]
            part = <long long>load_be(raw + offset, width)
            small = small * POW10[digits] + part
            offset += width
        _unscaled_ll(out, -small if negative else small)
        return size
    big = 0
    for i in range(count):
        digits = groups[i]
        width = DIG2BYTES[digits]
        big = big * POW10[digits] + <long long>load_be(raw + offset, width)
        offset += width
    _unscaled(out, -big if negative else big)
    return size


cdef inline int _null(int prefix, bytearray out, Py_ssize_t start) except -1:
    if prefix < 0:
        raise Fallback()
    PyByteArray_Resize(out, start)
    return put_byte(out, 0)


cdef Py_ssize_t _value(tuple column, const unsigned char* p, Py_ssize_t left,
                       bytearray out) except -2:
    """One non-null value's Avro bytes (its union branch included); its size in the event."""
    cdef int kind = column[0]
    cdef int prefix = column[1]
    cdef int a = column[2]
    cdef int b = column[3]
    cdef Py_ssize_t start = PyByteArray_GET_SIZE(out)
    cdef unsigned long long u
    cdef long long v, seconds, micros, year, month, day, hms
    cdef Py_ssize_t length, width
    cdef char text[40]
    cdef int n
    cdef bytes label
    if prefix >= 0:
        put_byte(out, <unsigned char>prefix)
    if kind == INT:
        if left < a:
            raise Fallback()
        u = load_le(p, a)
        if not b and a < 8 and u & (1ULL << (8 * a - 1)):
            v = <long long>(u - (1ULL << (8 * a)))
        else:
            v = <long long>u
        put_long(out, v)
        return a
    if kind == UINT64:
        if left < 8:
            raise Fallback()
        u = load_le(p, 8)
        if u >> 63:
            _unscaled(out, u)
        else:
            _unscaled_ll(out, <long long>u)
        return 8
    if kind == FLOAT:
        if left < 4:
            raise Fallback()
        put(out, <const char*>p, 4)
        return 4
    if kind == DOUBLE:
        if left < 8:
            raise Fallback()
        put(out, <const char*>p, 8)
        return 8
    if kind == DECIMAL:
        return _decimal(out, p, left, a, b)
    if kind == STRING or kind == BYTES:
        if left < a:
            raise Fallback()
        length = <Py_ssize_t>load_le(p, a)
        if left < a + length:
            raise Fallback()
        if kind == STRING:
            (<bytes>PyBytes_FromStringAndSize(<const char*>p + a, length)).decode()
        width = length
        if kind == BYTES and b and length < b:
            width = b
        put_long(out, width)
        put(out, <const char*>p + a, length)
        if width > length:
            n = PyByteArray_GET_SIZE(out)
            PyByteArray_Resize(out, n + width - length)
            memset(PyByteArray_AS_STRING(out) + n, 0, width - length)
        return a + length
    if kind == ENUM:
        if left < a:
            raise Fallback()
        u = load_le(p, a)
        labels = column[4]
        label = labels[u - 1] if 0 < u <= len(labels) else b""
        put_blob(out, label, len(label))
        return a
    if kind == YEAR:
        if left < 1:
            raise Fallback()
        put_long(out, p[0] + 1900 if p[0] else 0)
        return 1
    if kind == DATE:
        if left < 3:
            raise Fallback()
        u = load_le(p, 3)
        day, month, year = u & 31, (u >> 5) & 15, u >> 9
        if not month or not day:
            _null(prefix, out, start)
        else:
            put_long(out, _days_from_civil(year, month, day))
        return 3
    if kind == DATETIME2:
        width = (a + 1) // 2
        if left < 5 + width:
            raise Fallback()
        v = <long long>load_be(p, 5) - 0x8000000000
        micros = <long long>load_be(p + 5, width) * POW10[6 - 2 * width] if width else 0
        hms = v & 0x1FFFF
        v >>= 17
        year, month, day = (v >> 5) // 13, (v >> 5) % 13, v & 31
        if not month or not day:
            _null(prefix, out, start)
        else:
            seconds = _days_from_civil(year, month, day) * 86400 + (hms >> 12) * 3600 + \
                ((hms >> 6) & 63) * 60 + (hms & 63)
            put_long(out, seconds * 1000000 + micros)
        return 5 + width
    if kind == TIMESTAMP2:
        width = (a + 1) // 2
        if left < 4 + width:
            raise Fallback()
        seconds = <long long>load_be(p, 4)
        micros = <long long>load_be(p + 4, width) * POW10[6 - 2 * width] if width else 0
        if not seconds and not micros:
            _null(prefix, out, start)
        else:
            _civil_from_days(seconds // 86400, &year, &month, &day)
            v = seconds % 86400
            n = snprintf(text, 40, "%04lld-%02lld-%02lldT%02lld:%02lld:%02lld.%06lldZ", year,
                         month, day, v // 3600, v // 60 % 60, v % 60, micros)
            put_blob(out, text, n)
        return 4 + width
    raise Fallback()


cdef Py_ssize_t _image(tuple plan, const unsigned char* p, Py_ssize_t pos, Py_ssize_t end,
                       bytearray out, Py_ssize_t* offsets) except -2:
    cdef Py_ssize_t count = len(plan)
    cdef Py_ssize_t nulls = pos
    cdef Py_ssize_t index
    cdef tuple column
    pos += (count + 7) // 8
    if pos > end:
        raise Fallback()
    for index in range(count):
        column = <tuple>plan[index]
        if p[nulls + (index >> 3)] >> (index & 7) & 1:
            if <int>column[1] < 0:
                raise Fallback()
            put_byte(out, 0)
            offsets[index] = -1
            continue
        offsets[index] = pos
        pos += _value(column, p + pos, end - pos, out)
    return pos


cdef bytes _key(tuple keys, tuple plan, const unsigned char* p, Py_ssize_t* offsets):
    cdef bytearray out = bytearray()
    cdef tuple key, column
    cdef Py_ssize_t pos, length
    cdef int kind, a, b, n
    cdef unsigned long long u
    cdef long long v
    cdef char text[24]
    for key in keys:
        pos = offsets[<Py_ssize_t>key[1]]
        if pos < 0:
            raise Fallback()
        prefix = <bytes>key[0]
        put(out, prefix, len(prefix))
        kind = key[2]
        column = <tuple>plan[<Py_ssize_t>key[1]]
        a, b = column[2], column[3]
        if kind == INT:
            u = load_le(p + pos, a)
            if not b and a < 8 and u & (1ULL << (8 * a - 1)):
                v = <long long>(u - (1ULL << (8 * a)))
            else:
                v = <long long>u
            if b and a == 8:
                n = snprintf(text, 24, "%llu", u)
            else:
                n = snprintf(text, 24, "%lld", v)
            put(out, text, n)
        elif kind == UINT64:
            u = load_le(p + pos, 8)
            n = snprintf(text, 24, "\"%llu\"", u)
            put(out, text, n)
        else:
            length = <Py_ssize_t>load_le(p + pos, a)
            value = PyBytes_FromStringAndSize(<const char*>p + pos + a, length).decode()
            encoded = json.dumps(value, ensure_ascii=False).encode()
            put(out, encoded, len(encoded))
    put_byte(out, ord("}"))
    return bytes(out)


def decode_rows(tuple plan, bytes data, Py_ssize_t pos, Py_ssize_t end, bint update):
    """See rowcodec.decode_rows."""
    cdef tuple columns = plan[0]
    cdef tuple keys = plan[1]
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t count = len(columns)
    cdef list rows = []
    cdef bytearray first, second
    cdef bytes first_key
    if end > PyBytes_GET_SIZE(data):
        raise Fallback()
    cdef bytearray holder = bytearray(8 * (count + 1))
    cdef Py_ssize_t* offsets = <Py_ssize_t*>PyByteArray_AS_STRING(holder)
    while pos < end:
        first = bytearray()
        pos = _image(columns, p, pos, end, first, offsets)
        first_key = _key(keys, columns, p, offsets)
        if not update:
            rows.append((first_key, bytes(first), None, None))
            continue
        second = bytearray()
        pos = _image(columns, p, pos, end, second, offsets)
        rows.append((_key(keys, columns, p, offsets), bytes(second), first_key, bytes(first)))
    if pos != end:
        raise Fallback()
    return rows


cdef bytes _envelope(tuple pieces, bytes before, bytes after, const char* op, long long row,
                     long long total, long long per_table):
    cdef bytes header = pieces[0]
    cdef bytes prefix = pieces[1]
    cdef bytes suffix = pieces[2]
    cdef bytes txn = pieces[3]
    cdef bytes tail = pieces[4]
    cdef bytearray out = bytearray()
    put(out, header, len(header))
    if before is None:
        put_byte(out, 0)
    else:
        put_byte(out, 2)
        put(out, before, len(before))
    if after is None:
        put_byte(out, 0)
    else:
        put_byte(out, 2)
        put(out, after, len(after))
    put(out, prefix, len(prefix))
    put_long(out, row)
    put(out, suffix, len(suffix))
    put(out, txn, len(txn))
    put_long(out, total)
    put_long(out, per_table)
    put(out, op, 2)
    put(out, tail, len(tail))
    return bytes(out)


cdef bytes _position(long long file_seq, long long start, long long ordinal):
    cdef unsigned char buf[25]
    buf[0] = 2
    store_be(buf + 1, <unsigned long long>file_seq, 8)
    store_be(buf + 9, <unsigned long long>start, 8)
    store_be(buf + 17, <unsigned long long>ordinal, 8)
    return PyBytes_FromStringAndSize(<const char*>buf, 25)


def build_records(list decoded, int kind, str topic, tuple pieces, long long total,
                  long long per_table, long long file_seq, long long start, record):
    """See rowcodec.build_records."""
    cdef list records = []
    cdef long long ordinal = 0
    cdef long long row = 0
    cdef bytes position, key, image, old_key, old_image
    for item in decoded:
        key, image, old_key, old_image = item
        ordinal += 1
        position = _position(file_seq, start, ordinal)
        if kind == 0:
            total += 1
            per_table += 1
            records.append(record(topic, key, _envelope(pieces, None, image, b"\x02c", row,
                                                         total, per_table), position))
        elif kind == 1:
            total += 1
            per_table += 1
            records.append(record(topic, key, _envelope(pieces, image, None, b"\x02d", row,
                                                         total, per_table), position))
            records.append(record(topic, key, None, position))
        elif old_key == key:
            total += 1
            per_table += 1
            records.append(record(topic, key, _envelope(pieces, old_image, image, b"\x02u", row,
                                                         total, per_table), position))
        else:
            total += 1
            per_table += 1
            records.append(record(topic, old_key, _envelope(pieces, old_image, None, b"\x02d",
                                                             row, total, per_table), position))
            records.append(record(topic, old_key, None, position))
            ordinal += 1
            total += 1
            per_table += 1
            records.append(record(topic, key, _envelope(pieces, None, image, b"\x02c", row,
                                                         total, per_table),
                                  _position(file_seq, start, ordinal)))
        row += 1
    return records, total, per_table


# ------------------------------------------------------------------- snapshot rows (text)

DEF T_INT = 1
DEF T_UINT64 = 2
DEF T_FLOAT = 3
DEF T_DOUBLE = 4
DEF T_DECIMAL = 5
DEF T_STRING = 6
DEF T_BYTES = 7
DEF T_DATE = 8
DEF T_DATETIME = 9
DEF T_TIMESTAMP = 10
DEF T_YEAR = 11

from libc.string cimport memchr

from cpython.ref cimport PyObject

cdef extern from "Python.h":
    int PyFloat_Pack4(double x, char* p, int le) except -1
    int PyFloat_Pack8(double x, char* p, int le) except -1
    double PyOS_string_to_double(const char* s, char** endptr, PyObject* overflow) except? -1.0


cdef inline long long _digits(const unsigned char* p, Py_ssize_t n) except? -1:
    """A non-negative decimal of at most 18 digits."""
    cdef long long v = 0
    cdef Py_ssize_t i
    if n <= 0 or n > 18:
        raise Fallback()
    for i in range(n):
        if p[i] < 48 or p[i] > 57:
            raise Fallback()
        v = v * 10 + (p[i] - 48)
    return v


cdef int _text_int(bytearray out, const unsigned char* p, Py_ssize_t n, bint unsigned_wide
                   ) except -1:
    cdef bint negative = n > 0 and p[0] == 45
    if negative:
        p += 1
        n -= 1
    if n > 18:  # beyond 64 bits or close to it: Python's int does it exactly
        value = int(PyBytes_FromStringAndSize(<const char*>p, n))
        if negative:
            value = -value
        if unsigned_wide:
            return _unscaled(out, value)
        return put_long(out, value)
    cdef long long v = _digits(p, n)
    if negative:
        v = -v
    if unsigned_wide:
        return _unscaled_ll(out, v)
    return put_long(out, v)


cdef int _text_decimal(bytearray out, const unsigned char* p, Py_ssize_t n, int scale
                       ) except -1:
    cdef const unsigned char* dot = <const unsigned char*>memchr(p, 46, n)
    cdef Py_ssize_t whole = (dot - p) if dot != NULL else n
    cdef Py_ssize_t fraction = n - whole - 1 if dot != NULL else 0
    if fraction != scale:
        raise Fallback()
    cdef bint negative = n > 0 and p[0] == 45
    cdef Py_ssize_t start = 1 if negative else 0
    cdef long long v
    if whole - start + fraction <= 18:
        v = _digits(p + start, whole - start) if whole > start else 0
        if fraction:
            v = v * POW10_18(fraction) + _digits(dot + 1, fraction)
        return _unscaled_ll(out, -v if negative else v)
    text = PyBytes_FromStringAndSize(<const char*>p + start, whole - start)
    if fraction:
        text += PyBytes_FromStringAndSize(<const char*>dot + 1, fraction)
    value = int(text)
    return _unscaled(out, -value if negative else value)


cdef inline long long POW10_18(Py_ssize_t n):
    cdef long long v = 1
    cdef Py_ssize_t i
    for i in range(n):
        v *= 10
    return v


cdef int _text_moment(const unsigned char* p, Py_ssize_t n, long long* days, long long* seconds,
                      long long* micros) except -1:
    """0 for a zero date, 1 for a moment."""
    if n < 10 or p[4] != 45 or p[7] != 45:
        raise Fallback()
    cdef long long year = _digits(p, 4)
    cdef long long month = _digits(p + 5, 2)
    cdef long long day = _digits(p + 8, 2)
    if not month or not day:
        return 0
    days[0] = _days_from_civil(year, month, day)
    seconds[0] = 0
    micros[0] = 0
    cdef Py_ssize_t width
    if n > 10:
        if n < 19:
            raise Fallback()
        seconds[0] = _digits(p + 11, 2) * 3600 + _digits(p + 14, 2) * 60 + _digits(p + 17, 2)
        if n > 20:
            width = n - 20 if n - 20 < 6 else 6
            micros[0] = _digits(p + 20, width) * POW10[6 - width]
    return 1


cdef int _text_value(tuple column, const unsigned char* p, Py_ssize_t n, bytearray out
                     ) except -1:
    cdef int kind = column[0]
    cdef int prefix = column[1]
    cdef int a = column[2]
    cdef Py_ssize_t start = PyByteArray_GET_SIZE(out)
    cdef char buf[48]
    cdef char* end
    cdef double number
    cdef long long days, seconds, micros, year, month, day, v
    cdef int size
    if prefix >= 0:
        put_byte(out, <unsigned char>prefix)
    if kind == T_INT or kind == T_YEAR:
        return _text_int(out, p, n, False)
    if kind == T_UINT64:
        return _text_int(out, p, n, True)
    if kind == T_FLOAT or kind == T_DOUBLE:
        if n >= 47:
            raise Fallback()
        memcpy(buf, p, n)
        buf[n] = 0
        number = PyOS_string_to_double(buf, &end, NULL)
        if end != buf + n:
            raise Fallback()
        if kind == T_FLOAT:
            PyFloat_Pack4(number, buf, 1)
            return put(out, buf, 4)
        PyFloat_Pack8(number, buf, 1)
        return put(out, buf, 8)
    if kind == T_DECIMAL:
        return _text_decimal(out, p, n, a)
    if kind == T_STRING or kind == T_BYTES:
        if kind == T_STRING:
            (<bytes>PyBytes_FromStringAndSize(<const char*>p, n)).decode()
        size = n if not (kind == T_BYTES and a and n < a) else a
        put_long(out, size)
        put(out, <const char*>p, n)
        if size > n:
            v = PyByteArray_GET_SIZE(out)
            PyByteArray_Resize(out, v + size - n)
            memset(PyByteArray_AS_STRING(out) + v, 0, size - n)
        return 0
    if not _text_moment(p, n, &days, &seconds, &micros):
        return _null(prefix, out, start)
    if kind == T_DATE:
        return put_long(out, days)
    if kind == T_DATETIME:
        return put_long(out, (days * 86400 + seconds) * 1000000 + micros)
    _civil_from_days(days, &year, &month, &day)
    size = snprintf(buf, 48, "%04lld-%02lld-%02lldT%02lld:%02lld:%02lld.%06lldZ", year, month,
                    day, seconds // 3600, seconds // 60 % 60, seconds % 60, micros)
    return put_blob(out, buf, size)


cdef inline Py_ssize_t _lenenc(const unsigned char* p, Py_ssize_t left, Py_ssize_t* length
                               ) except -2:
    """The header size of a length-encoded string (its length into ``length``; -1: NULL)."""
    if left < 1:
        raise Fallback()
    cdef unsigned char first = p[0]
    if first < 0xFB:
        length[0] = first
        return 1
    if first == 0xFB:
        length[0] = -1
        return 1
    if first == 0xFC:
        if left < 3:
            raise Fallback()
        length[0] = <Py_ssize_t>load_le(p + 1, 2)
        return 3
    if first == 0xFD:
        if left < 4:
            raise Fallback()
        length[0] = <Py_ssize_t>load_le(p + 1, 3)
        return 4
    if left < 9:
        raise Fallback()
    length[0] = <Py_ssize_t>load_le(p + 1, 8)
    return 9


def encode_text_rows(tuple plan, list packets):
    """See rowcodec.encode_text_rows."""
    cdef tuple columns = plan[0]
    cdef tuple keys = plan[1]
    cdef Py_ssize_t count = len(columns)
    cdef list rows = []
    cdef bytes data
    cdef const unsigned char* p
    cdef Py_ssize_t size, pos, length, index
    cdef tuple column, key
    cdef bytearray image, out
    cdef bytearray holder = bytearray(16 * (count + 1))
    cdef Py_ssize_t* starts = <Py_ssize_t*>PyByteArray_AS_STRING(holder)
    cdef Py_ssize_t* lengths = starts + count
    cdef char text[24]
    cdef int n
    for data in packets:
        p = <const unsigned char*>PyBytes_AS_STRING(data)
        size = PyBytes_GET_SIZE(data)
        pos = 0
        image = bytearray()
        for index in range(count):
            column = <tuple>columns[index]
            pos += _lenenc(p + pos, size - pos, &length)
            if length < 0:
                if <int>column[1] < 0:
                    raise Fallback()
                put_byte(image, 0)
                starts[index] = -1
                continue
            if length > size - pos:
                raise Fallback()
            starts[index] = pos
            lengths[index] = length
            _text_value(column, p + pos, length, image)
            pos += length
        if pos != size:
            raise Fallback()
        out = bytearray()
        for key in keys:
            index = key[1]
            if starts[index] < 0:
                raise Fallback()
            prefix = <bytes>key[0]
            put(out, prefix, len(prefix))
            if <int>key[2] == T_INT:
                _text_key_int(out, p + starts[index], lengths[index], False)
            elif <int>key[2] == T_UINT64:
                _text_key_int(out, p + starts[index], lengths[index], True)
            else:
                value = PyBytes_FromStringAndSize(<const char*>p + starts[index],
                                                  lengths[index]).decode()
                encoded = json.dumps(value, ensure_ascii=False).encode()
                put(out, encoded, len(encoded))
        put_byte(out, ord("}"))
        rows.append((bytes(out), bytes(image)))
    return rows


cdef int _text_key_int(bytearray out, const unsigned char* p, Py_ssize_t n, bint quoted
                       ) except -1:
    """The canonical decimal text of an integer written by MySQL (already canonical, but
    checked: only digits after an optional minus, no leading zeros)."""
    cdef Py_ssize_t start = 1 if n > 0 and p[0] == 45 else 0
    cdef Py_ssize_t i
    if n <= start or (n - start > 1 and p[start] == 48):
        raise Fallback()
    for i in range(start, n):
        if p[i] < 48 or p[i] > 57:
            raise Fallback()
    if quoted:
        put_byte(out, 34)
    put(out, <const char*>p, n)
    if quoted:
        put_byte(out, 34)
    return 0


def snapshot_records(tuple plan, list packets, str topic, bytes header, bytes tail,
                     long long file_seq, long long pos, long long first, record):
    """See rowcodec.snapshot_records."""
    cdef list out = []
    cdef long long n = first
    cdef bytes key, image
    for key, image in encode_text_rows(plan, packets):
        n += 1
        out.append(record(topic, key, header + image + tail, _position(file_seq, pos, n)))
    return out
