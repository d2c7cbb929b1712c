# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of connectors/postgres/rowcodec.py (and of pgoutput's tuple parser).

Same contracts, same plans, same bytes: see rowcodec.py. Every value whose text is not in the
shape a fast kind expects goes through the column's typed steps (parse, to_avro, the Avro
writer), exactly like the pure-Python implementation; tests/test_rowcodec.py compares both with
the typed path.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.ref cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memcpy
from libc.stdint cimport uint64_t

from cdc._bytes cimport load_be, put, put_blob, put_byte, put_bytes, put_long, read_long, store_be

import json

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL
    double PyOS_string_to_double(const char* s, char** endptr, PyObject* overflow) except? -1.0
    int PyFloat_Pack4(double x, char* p, int le) except -1
    int PyFloat_Pack8(double x, char* p, int le) except -1

DEF GENERIC = 0
DEF LONG = 1
DEF BOOL = 2
DEF DOUBLE = 3
DEF FLOAT = 4
DEF STRING = 5
DEF UUID = 6
DEF NUMERIC_TEXT = 7
DEF DECIMAL = 8
DEF TIMESTAMPTZ = 9
DEF TIMESTAMP = 10
DEF DATE = 11
DEF BYTEA = 12

cdef object UNCHANGED = object()
cdef long long _fallbacks = 0


def init(unchanged):
    """Bind the unchanged-TOAST marker (pgoutput's)."""
    global UNCHANGED
    UNCHANGED = unchanged


def fallbacks():
    """How many values of a fast kind went through their typed steps (a diagnostic)."""
    return _fallbacks


# ---------------------------------------------------------------------------- text shapes

cdef inline bint _digits(const char* s, Py_ssize_t n):
    cdef Py_ssize_t i
    for i in range(n):
        if s[i] < 48 or s[i] > 57:
            return False
    return True


cdef inline long long _number(const char* s, Py_ssize_t n):
    cdef long long v = 0
    cdef Py_ssize_t i
    for i in range(n):
        v = v * 10 + (s[i] - 48)
    return v


cdef long long _days_from_civil(long long year, long long month, long long day):
    year -= month <= 2
    cdef long long era = (year if year >= 0 else year - 399) // 400
    cdef long long year_of_era = year - era * 400
    cdef long long day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    cdef long long day_of_era = (year_of_era * 365 + year_of_era // 4 - year_of_era // 100
                                 + day_of_year)
    return era * 146097 + day_of_era - 719468


cdef inline bint _date_shape(const char* s):
    """YYYY-MM-DD with digits where digits belong."""
    return (_digits(s, 4) and s[4] == 45 and _digits(s + 5, 2) and s[7] == 45
            and _digits(s + 8, 2))


cdef inline bint _time_shape(const char* s):
    """HH:MM:SS"""
    return _digits(s, 2) and s[2] == 58 and _digits(s + 3, 2) and s[5] == 58 and _digits(s + 6, 2)


cdef inline long long _date_days(const char* s):
    return _days_from_civil(_number(s, 4), _number(s + 5, 2), _number(s + 8, 2))


cdef inline long long _seconds_of_day(const char* s):
    return _number(s, 2) * 3600 + _number(s + 3, 2) * 60 + _number(s + 6, 2)


cdef inline long long _fraction(const char* s, Py_ssize_t n):
    """n (1-6) fraction digits as microseconds."""
    cdef long long v = _number(s, n)
    cdef Py_ssize_t i
    for i in range(6 - n):
        v *= 10
    return v


cdef inline bint _plain_numeric(const char* s, Py_ssize_t n):
    """-?(0|[1-9][0-9]*)(\\.[0-9]+)? or NaN / Infinity / -Infinity"""
    cdef Py_ssize_t i = 0, start
    if n == 3 and s[0] == 78 and s[1] == 97 and s[2] == 78:
        return True
    if n == 8 and memcmp_(s, b"Infinity", 8):
        return True
    if n == 9 and memcmp_(s, b"-Infinity", 9):
        return True
    if i < n and s[i] == 45:
        i += 1
    start = i
    while i < n and 48 <= s[i] <= 57:
        i += 1
    if i == start or (s[start] == 48 and i - start > 1):
        return False
    if i == n:
        return True
    if s[i] != 46:
        return False
    i += 1
    start = i
    while i < n and 48 <= s[i] <= 57:
        i += 1
    return i == n and i > start


cdef inline bint memcmp_(const char* a, const char* b, Py_ssize_t n):
    cdef Py_ssize_t i
    for i in range(n):
        if a[i] != b[i]:
            return False
    return True


cdef inline bint _is_special(const char* s, Py_ssize_t n):
    return ((n == 3 and memcmp_(s, b"NaN", 3)) or (n == 8 and memcmp_(s, b"Infinity", 8))
            or (n == 9 and memcmp_(s, b"-Infinity", 9)))


cdef inline bint _canonical_uuid(const char* s, Py_ssize_t n):
    cdef Py_ssize_t i
    cdef char c
    if n != 36:
        return False
    for i in range(36):
        c = s[i]
        if i == 8 or i == 13 or i == 18 or i == 23:
            if c != 45:
                return False
        elif not ((48 <= c <= 57) or (97 <= c <= 102)):
            return False
    return True


cdef inline int _hex(char c):
    if 48 <= c <= 57:
        return c - 48
    if 97 <= c <= 102:
        return c - 87
    if 65 <= c <= 70:
        return c - 55
    return -1


# ----------------------------------------------------------------------------- one column

cdef int _typed(tuple column, object text, bytearray out) except -1:
    global _fallbacks
    if column[0] != GENERIC:
        _fallbacks += 1
    column[6](column[5](column[4](text)), out)
    return 0


cdef inline object _str(object text, const char* s, Py_ssize_t n):
    """The value as a str: ``text`` itself, or made from its UTF-8 bytes (raw messages)."""
    if text is None:
        return PyUnicode_DecodeUTF8(s, n, NULL)
    return text


cdef inline bint _ascii(const char* s, Py_ssize_t n):
    cdef Py_ssize_t i = 0
    cdef uint64_t word, seen = 0
    while i + 8 <= n:  # eight bytes at a time: any high bit set is not ASCII
        memcpy(&word, s + i, 8)
        seen |= word
        i += 8
    if seen & 0x8080808080808080ULL:
        return False
    while i < n:
        if <unsigned char>s[i] >= 0x80:
            return False
        i += 1
    return True


cdef inline double _to_double(object text, const char* s, Py_ssize_t n) except? -1.0:
    """A float's text (NUL-terminated copy: raw bytes are not)."""
    cdef char buf[32]
    if n > 30:
        return float(_str(text, s, n))
    memcpy(buf, s, n)
    buf[n] = 0
    return PyOS_string_to_double(buf, NULL, NULL)


cdef int _column(tuple column, object text, bytearray out) except -1:
    """One non-null, sent value (a str, or bytes for a binary one)."""
    cdef const char* s
    cdef Py_ssize_t n
    if column[0] == GENERIC or type(text) is not str:
        return _typed(column, text, out)
    s = PyUnicode_AsUTF8AndSize(text, &n)
    return _column_chars(column, text, s, n, out)


cdef int _column_chars(tuple column, object text, const char* s, Py_ssize_t n,
                       bytearray out) except -1:
    """One non-null, sent value as UTF-8 bytes ``s[:n]``; ``text`` is its str, or None (then
    made only if a typed step needs it)."""
    cdef int kind = column[0]
    cdef int prefix = column[1]
    cdef Py_ssize_t i, digits, frac
    cdef char buf[32]
    cdef long long v, days
    cdef unsigned long long u
    cdef int scale, size, high, low
    cdef double d
    if kind == GENERIC:
        return _typed(column, _str(text, s, n), out)
    if kind == LONG:
        i = 1 if n > 0 and s[0] == 45 else 0
        if 0 < n - i <= 18 and _digits(s + i, n - i):
            v = _number(s + i, n - i)
            if prefix >= 0:
                put_byte(out, prefix)
            return put_long(out, -v if i else v)
        v = int(_str(text, s, n))  # 19 digits: Python checks the range
        if prefix >= 0:
            put_byte(out, prefix)
        return put_long(out, v)
    if kind == STRING:
        if text is None and not _ascii(s, n):
            PyUnicode_DecodeUTF8(s, n, NULL)  # raises on bytes that are not UTF-8
        if prefix >= 0:
            put_byte(out, prefix)
        return put_blob(out, s, n)
    if kind == TIMESTAMPTZ:
        if (n == 22 or 24 <= n <= 29) and _date_shape(s) and s[10] == 32 and _time_shape(s + 11) \
                and s[n - 3] == 43 and s[n - 2] == 48 and s[n - 1] == 48 \
                and (n == 22 or (s[19] == 46 and _digits(s + 20, n - 23))):
            memcpy(buf, s, 10)
            buf[10] = 84  # T
            memcpy(buf + 11, s + 11, 8)
            buf[19] = 46  # .
            for i in range(6):
                buf[20 + i] = s[20 + i] if 20 + i < n - 3 else 48
            buf[26] = 90  # Z
            if prefix >= 0:
                put_byte(out, prefix)
            return put_blob(out, buf, 27)
        return _typed(column, _str(text, s, n), out)
    if kind == DECIMAL:
        scale = column[3]
        i = 1 if n > 0 and s[0] == 45 else 0
        digits = 0
        frac = -1
        v = 0
        while i < n:
            if 48 <= s[i] <= 57:
                v = v * 10 + (s[i] - 48)
                digits += 1
                if frac >= 0:
                    frac += 1
            elif s[i] == 46 and frac < 0:
                frac = 0
            else:
                break
            if digits > 18:
                break
            i += 1
        if i == n and digits > 0 and frac <= scale and digits + scale - (frac if frac > 0 else 0) <= 18:
            for i in range(scale - (frac if frac > 0 else 0)):
                v *= 10
            if s[0] == 45:
                v = -v
            u = <unsigned long long>(v if v >= 0 else -v)
            size = 0
            while u:
                size += 1
                u >>= 1
            size = (size + 8) // 8
            store_be(<unsigned char*>buf, <unsigned long long>v, size)
            put_byte(out, prefix)
            return put_blob(out, buf, size)
        if _is_special(s, n):
            put_byte(out, column[2])
            return put_blob(out, s, n)
        return _typed(column, _str(text, s, n), out)
    if kind == BOOL:
        if prefix >= 0:
            put_byte(out, prefix)
        return put_byte(out, 1 if n == 1 and s[0] == 116 else 0)
    if kind == DOUBLE:
        d = _to_double(text, s, n)
        PyFloat_Pack8(d, buf, 1)
        if prefix >= 0:
            put_byte(out, prefix)
        return put(out, buf, 8)
    if kind == FLOAT:
        d = _to_double(text, s, n)
        PyFloat_Pack4(d, buf, 1)
        if prefix >= 0:
            put_byte(out, prefix)
        return put(out, buf, 4)
    if kind == DATE:
        if n == 10 and _date_shape(s):
            if prefix >= 0:
                put_byte(out, prefix)
            return put_long(out, _date_days(s))
        return _typed(column, _str(text, s, n), out)
    if kind == TIMESTAMP:
        if (n == 19 or 21 <= n <= 26) and _date_shape(s) and s[10] == 32 and _time_shape(s + 11) \
                and (n == 19 or (s[19] == 46 and _digits(s + 20, n - 20))):
            v = (_date_days(s) * 86400 + _seconds_of_day(s + 11)) * 1000000
            if n > 19:
                v += _fraction(s + 20, n - 20)
            if prefix >= 0:
                put_byte(out, prefix)
            return put_long(out, v)
        return _typed(column, _str(text, s, n), out)
    if kind == UUID:
        if _canonical_uuid(s, n):
            if prefix >= 0:
                put_byte(out, prefix)
            return put_blob(out, s, n)
        return _typed(column, _str(text, s, n), out)
    if kind == NUMERIC_TEXT:
        if _plain_numeric(s, n):
            if prefix >= 0:
                put_byte(out, prefix)
            return put_blob(out, s, n)
        return _typed(column, _str(text, s, n), out)
    if kind == BYTEA:
        if n >= 2 and s[0] == 92 and s[1] == 120 and n % 2 == 0:
            for i in range(2, n):
                if _hex(s[i]) < 0:
                    return _typed(column, _str(text, s, n), out)
            if prefix >= 0:
                put_byte(out, prefix)
            put_long(out, (n - 2) // 2)
            for i in range(2, n, 2):
                put_byte(out, (_hex(s[i]) << 4) | _hex(s[i + 1]))
            return 0
        return _typed(column, _str(text, s, n), out)
    raise ValueError(f"unknown kind {kind}")


cdef inline int _null(tuple column, bytearray out) except -1:
    if column[1] >= 0 and column[0] != DECIMAL:
        return put_byte(out, 0)
    column[6](None, out)  # a decimal's union, or a field that is not nullable (raises)
    return 0


def encode_row(tuple plan, values, bytearray out, filled):
    """See rowcodec.encode_row."""
    cdef Py_ssize_t i, count = len(plan)
    cdef tuple row = tuple(values)
    if len(row) != count:
        raise ValueError("a tuple of another width than the table")
    for i in range(count):
        text = row[i]
        if text is None:
            _null(<tuple>plan[i], out)
        elif text is UNCHANGED:
            raise ValueError("an unchanged TOAST value (use encode_row_filled)")
        else:
            _column(<tuple>plan[i], text, out)


def encode_row_filled(tuple plan, values, bytearray out, filled):
    """See rowcodec.encode_row_filled."""
    cdef Py_ssize_t i, count = len(plan)
    cdef tuple row = tuple(values)
    if len(row) != count:
        raise ValueError("a tuple of another width than the table")
    for i in range(count):
        text = row[i]
        if text is UNCHANGED:
            (<tuple>plan[i])[6](None if filled is None else filled.get(i), out)
        elif text is None:
            _null(<tuple>plan[i], out)
        else:
            _column(<tuple>plan[i], text, out)


_dumps = json.dumps


def key_json(tuple plan, values):
    """See rowcodec.key_json."""
    cdef list parts = []
    cdef tuple column
    cdef int kind
    cdef const char* s
    cdef Py_ssize_t n, i
    for column in plan:
        text = values[column[1]]
        parts.append(column[0])
        kind = column[2]
        if text is None or text is UNCHANGED:
            parts.append("null")
        elif kind == LONG:
            s = PyUnicode_AsUTF8AndSize(text, &n)
            i = 1 if n > 0 and s[0] == 45 else 0
            if 0 < n - i <= 18 and _digits(s + i, n - i) and (s[i] != 48 or n - i == 1) \
                    and not (i and n == 2 and s[1] == 48):
                parts.append(text)
            else:
                parts.append(str(int(text)))
        elif kind == STRING:
            parts.append(_dumps(text, ensure_ascii=False))
        else:
            ctype = column[4]
            parts.append(_dumps(ctype.to_json(ctype.to_avro(column[3](text))),
                                separators=(",", ":"), ensure_ascii=False))
    parts.append("}")
    return "".join(parts).encode()


# ------------------------------------------------------------------------ pgoutput tuples

def parse_tuple(bytes data, Py_ssize_t at):
    """pgoutput's TupleData at ``at``: (tuple of str / None / UNCHANGED, next position);
    ``(None, _)`` for anything malformed (the pure parser then raises its error)."""
    cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t count, i, length
    cdef unsigned char kind
    if at + 2 > size:
        return None, at
    count = <Py_ssize_t>load_be(s + at, 2)
    at += 2
    values = [None] * count
    for i in range(count):
        if at >= size:
            return None, at
        kind = s[at]
        at += 1
        if kind == 0x74 or kind == 0x62:  # text, binary
            if at + 4 > size:
                return None, at
            length = <Py_ssize_t>load_be(s + at, 4)
            at += 4
            if length < 0 or at + length > size:
                return None, at
            if kind == 0x74:
                values[i] = PyUnicode_DecodeUTF8(<const char*>s + at, length, NULL)
            else:
                values[i] = data[at:at + length]
            at += length
        elif kind == 0x6E:  # null
            pass
        elif kind == 0x75:  # unchanged TOAST
            values[i] = UNCHANGED
        else:
            return None, at  # the caller's own parser explains
    return tuple(values), at


# ------------------------------------------------------------ replication messages -> records
# Compiled twin of rowcodec.encode_changes (see there for the contract).

from libc.stdlib cimport malloc, free
from libc.stdio cimport snprintf
from cpython.bytearray cimport PyByteArray_FromStringAndSize
from cpython.bytes cimport PyBytes_FromStringAndSize

cdef Py_ssize_t _scan(const unsigned char* s, Py_ssize_t size, Py_ssize_t at, Py_ssize_t width,
                      const char** ptrs, Py_ssize_t* lens):
    """The fields of a TupleData at ``at`` of exactly ``width`` text, null or unchanged TOAST
    columns (``lens[i]`` -1 for null, -2 for unchanged); -1 for anything else (binary,
    malformed: the typed path)."""
    cdef Py_ssize_t count, i, length
    cdef unsigned char kind
    if at + 2 > size:
        return -1
    count = <Py_ssize_t>load_be(s + at, 2)
    if count != width:
        return -1
    at += 2
    for i in range(count):
        if at >= size:
            return -1
        kind = s[at]
        at += 1
        if kind == 0x74:  # text
            if at + 4 > size:
                return -1
            length = <Py_ssize_t>load_be(s + at, 4)
            at += 4
            if length < 0 or at + length > size:
                return -1
            ptrs[i] = <const char*>s + at
            lens[i] = length
            at += length
        elif kind == 0x6E:  # null
            lens[i] = -1
        elif kind == 0x75:  # unchanged TOAST
            lens[i] = -2
        else:
            return -1
    return at


cdef int _row_chars(tuple plan, const char** ptrs, Py_ssize_t* lens, bytearray out) except -1:
    cdef Py_ssize_t i
    for i in range(len(plan)):
        if lens[i] < 0:
            _null(<tuple>plan[i], out)
        else:
            _column_chars(<tuple>plan[i], None, ptrs[i], lens[i], out)
    return 0


cdef int _row_filled(tuple plan, const char** ptrs, Py_ssize_t* lens, const char** old,
                     Py_ssize_t* old_lens, bytearray out) except -1:
    """_row_chars, unchanged columns (``lens[i]`` -2) copied from ``old``'s field bytes."""
    cdef Py_ssize_t i
    for i in range(len(plan)):
        if lens[i] == -2:
            put(out, old[i], old_lens[i])
        elif lens[i] < 0:
            _null(<tuple>plan[i], out)
        else:
            _column_chars(<tuple>plan[i], None, ptrs[i], lens[i], out)
    return 0


cdef const unsigned char* _skip(tuple column, const unsigned char* p, const unsigned char* end):
    """Just past one field's bytes (rowcodec._skip); NULL when they do not fit."""
    cdef long long branch, size
    cdef int code
    if column[0]:
        p = read_long(p, end, &branch)
        if p == NULL or branch < 0 or branch >= len(column) - 1:
            return NULL
        code = column[1 + branch]
    else:
        code = column[1]
    if code == 1:
        p = read_long(p, end, &size)
    elif code == 5:
        p = read_long(p, end, &size)
        if p == NULL or size < 0 or size > end - p:
            return NULL
        p += size
    elif code == 2:
        p += 1
    elif code == 3:
        p += 4
    elif code == 4:
        p += 8
    if p == NULL or p > end:
        return NULL
    return p


cdef bint _after_fields(tuple skips, bytes value, const char** old, Py_ssize_t* old_lens):
    """rowcodec.after_fields into ``old``/``old_lens``; False when there are none."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(value)
    cdef const unsigned char* end = p + PyBytes_GET_SIZE(value)
    cdef const unsigned char* start
    cdef long long branch
    cdef Py_ssize_t i
    if end - p < 6:
        return False
    p = read_long(p + 5, end, &branch)
    if p == NULL:
        return False
    if branch == 1:
        for i in range(len(skips)):
            p = _skip(<tuple>skips[i], p, end)
            if p == NULL:
                return False
    elif branch != 0:
        return False
    p = read_long(p, end, &branch)
    if p == NULL or branch != 1:
        return False
    for i in range(len(skips)):
        start = p
        p = _skip(<tuple>skips[i], p, end)
        if p == NULL:
            return False
        old[i] = <const char*>start
        old_lens[i] = p - start
    return True


cdef object _NOT_RECENT = object()

# Values are written into a per-thread scratch bytearray after a fixed prefix and copied out;
# rewinding to the prefix is a "minor downsize" for bytearray (no realloc), so the scratch's
# memory is reused, warm, for every value (a fresh or grown buffer per value costs reallocs
# and, on a VM, first-touch faults of fresh pages).
DEF SCRATCH_PREFIX = 1 << 20
cdef dict _SCRATCH = {}


DEF KEY_PREFIX = 1 << 12
cdef dict _KEY_SCRATCH = {}


cdef bytearray _rewound(dict scratches, Py_ssize_t prefix):
    """This thread's scratch of ``scratches`` (made on first use), rewound to ``prefix``."""
    tid = PyThread_get_thread_ident()
    found = scratches.get(tid)
    if found is None:
        found = scratches[tid] = bytearray(prefix)
    PyByteArray_Resize(found, prefix)
    return <bytearray>found


cdef inline bytearray _key_scratch():
    """This thread's scratch for keys (values are written meanwhile), rewound."""
    return _rewound(_KEY_SCRATCH, KEY_PREFIX)


cdef inline bytearray _scratch():
    """This thread's scratch for values, rewound."""
    return _rewound(_SCRATCH, SCRATCH_PREFIX)


cdef bytes _key_chars(tuple plan, const char** ptrs, Py_ssize_t* lens):
    """key_json of a raw tuple (same bytes)."""
    cdef bytearray out = _key_scratch()
    cdef tuple column
    cdef int kind
    cdef const char* p
    cdef const char* v
    cdef Py_ssize_t n, i, index
    for column in plan:
        p = PyUnicode_AsUTF8AndSize(column[0], &n)
        put(out, p, n)
        index = column[1]
        kind = column[2]
        n = lens[index]
        v = ptrs[index]
        if n < 0:  # null (or unchanged: encode_changes declines those keys)
            put(out, b"null", 4)
        elif kind == LONG:
            i = 1 if n > 0 and v[0] == 45 else 0
            if 0 < n - i <= 18 and _digits(v + i, n - i) and (v[i] != 48 or n - i == 1) \
                    and not (i and n == 2 and v[1] == 48):
                put(out, v, n)
            else:
                _text(out, str(int(PyUnicode_DecodeUTF8(v, n, NULL))))
        elif kind == STRING:
            _text(out, _dumps(PyUnicode_DecodeUTF8(v, n, NULL), ensure_ascii=False))
        else:
            ctype = column[4]
            _text(out, _dumps(ctype.to_json(ctype.to_avro(column[3](
                PyUnicode_DecodeUTF8(v, n, NULL)))), separators=(",", ":"), ensure_ascii=False))
    put(out, b"}", 1)
    return PyBytes_FromStringAndSize(PyByteArray_AS_STRING(out) + KEY_PREFIX,
                                     PyByteArray_GET_SIZE(out) - KEY_PREFIX)


cdef inline int _text(bytearray out, str text) except -1:
    cdef Py_ssize_t n
    cdef const char* p = PyUnicode_AsUTF8AndSize(text, &n)
    return put(out, p, n)


cdef inline int _opt_long(bytearray out, long long value) except -1:
    put_byte(out, 2)
    return put_long(out, value)


#: encode_changes' scratch buffer starts over past this size


cdef bytes _pg_position(unsigned long long lsn, int phase, unsigned long long ordinal):
    """Position.postgres(lsn, ordinal).to_bytes(): tag 1, then lsn, phase, ordinal (big
    endian)."""
    cdef unsigned char buf[25]
    buf[0] = 1
    store_be(buf + 1, lsn, 8)
    store_be(buf + 9, <unsigned long long>phase, 8)
    store_be(buf + 17, ordinal, 8)
    return PyBytes_FromStringAndSize(<const char*>buf, 25)


cdef inline bytes _position(unsigned long long lsn, unsigned long long ordinal):
    return _pg_position(lsn, 1, ordinal)  # a streamed change


cdef Py_ssize_t _ruled(tuple rules, const char** ptrs, Py_ssize_t* lens, const char** out,
                      Py_ssize_t* out_lens, list keep) except -1:
    """rowcodec._ruled for every logged column: the transformed spans into ``out`` (hashes
    kept alive in ``keep``); returns their count."""
    cdef Py_ssize_t j = 0, index, n, i, chars, limit
    cdef int code
    cdef const unsigned char* v
    cdef unsigned char c
    for rule in rules:
        index = rule[0]
        code = rule[1]
        n = lens[index]
        out[j] = ptrs[index]
        out_lens[j] = n
        if n >= 0 and code == 1:
            out_lens[j] = -1
        elif n >= 0 and code == 2:
            out[j] = PyBytes_AS_STRING(<bytes>rule[2])
            out_lens[j] = PyBytes_GET_SIZE(<bytes>rule[2])
        elif n >= 0 and code == 4:  # hash: the function of the value's text
            hashed = rule[2](PyUnicode_DecodeUTF8(ptrs[index], n, NULL))
            keep.append(hashed)
            out[j] = PyUnicode_AsUTF8AndSize(hashed, &out_lens[j])
        elif n >= 0 and code == 3:  # the first ``limit`` characters of UTF-8 text
            limit = rule[2]
            v = <const unsigned char*>ptrs[index]
            i = chars = 0
            while i < n and chars < limit:
                c = v[i]
                i += 1 if c < 0x80 else 2 if (c >> 5) == 6 else 3 if (c >> 4) == 14 else 4
                chars += 1
            out_lens[j] = i if i < n else n
        j += 1
    return j


cdef object _fill_from(tuple plan, Py_ssize_t* lens, bytes key, unsigned long long commit_lsn,
                      long long ordinal, previous, dict recent, const char** old,
                      Py_ssize_t* old_lens):
    """rowcodec._unchanged_from: the key's latest after image's fields into ``old``; returns
    the value they point into (keep it alive while they are used), or None."""
    cdef tuple key_plan = plan[2]
    cdef bytes header = plan[3]
    cdef Py_ssize_t i
    skips = plan[10]
    if skips is None or previous is None or recent is None:
        return None
    for column in key_plan:
        if lens[<Py_ssize_t>column[1]] == -2:
            return None
    topic = plan[0]
    found = recent.get((topic, key), _NOT_RECENT)
    if found is _NOT_RECENT:
        found = previous(topic, key, _position(commit_lsn, <unsigned long long>(ordinal + 1)))
    if type(found) is not bytes or PyBytes_GET_SIZE(<bytes>found) < 5 or not memcmp_(
            PyBytes_AS_STRING(<bytes>found), PyBytes_AS_STRING(header), 5):
        return None
    if not _after_fields(<tuple>skips, <bytes>found, old, old_lens):
        return None
    for i in range(len(skips)):  # a null there reads as "not available" on the event path
        if lens[i] == -2 and old_lens[i] == 1 and old[i][0] == 0 and (<tuple>skips[i])[0] \
                and (<tuple>skips[i])[1] == 0:
            return None
    return found


def encode_changes(dict plans, list messages, Py_ssize_t start, txn, list records, record,
                   bytes times, dict touched, previous=None, dict recent=None):
    """See rowcodec.encode_changes."""
    cdef Py_ssize_t i = start, count = len(messages), size, at, width, most = 0
    cdef const unsigned char* s
    cdef const char** ptrs = NULL
    cdef Py_ssize_t* lens = NULL
    cdef const char** old = NULL
    cdef Py_ssize_t* old_lens = NULL
    cdef const char** rptrs = NULL  # the logged columns, after column rules
    cdef Py_ssize_t* rlens = NULL
    cdef void** block
    cdef const char** cptrs
    cdef Py_ssize_t* clens
    cdef bint unchanged
    cdef Py_ssize_t begin = 0
    cdef bytearray out = _scratch()  # each value is written here, then copied out
    cdef long long ordinal = txn.ordinal, per, events = 0
    cdef long long commit_ms = txn.commit_ms, xid = txn.xid
    cdef unsigned long long commit_lsn = txn.commit_lsn, lsn
    cdef bytes commit_text = txn.commit_text.encode()
    cdef bytes txn_prefix = txn.txn_prefix
    cdef dict per_table = txn.per_table
    cdef char lsn_text[40]
    cdef int lsn_n
    cdef unsigned char kind
    cdef tuple plan
    cdef bytes key, value, position
    for plan in plans.values():
        if plan is not None and <Py_ssize_t>plan[8] > most:
            most = plan[8]
    block = <void**>malloc(sizeof(void*) * 6 * (most + 1))  # six arrays of column spans
    if block == NULL:
        raise MemoryError()
    ptrs, lens = <const char**>block, <Py_ssize_t*>(block + (most + 1))
    old, old_lens = <const char**>(block + 2 * (most + 1)), <Py_ssize_t*>(block + 3 * (most + 1))
    rptrs, rlens = <const char**>(block + 4 * (most + 1)), <Py_ssize_t*>(block + 5 * (most + 1))
    try:
        while i < count:
            message = <bytes>messages[i]  # XLogData: 'w', start LSN, WAL end, time, pgoutput
            if PyBytes_GET_SIZE(message) < 32:
                break
            s = <const unsigned char*>PyBytes_AS_STRING(message) + 25
            size = PyBytes_GET_SIZE(message) - 25
            kind = s[0]
            if kind != 0x49 and kind != 0x55 and kind != 0x44:  # I, U, D
                break
            plan = plans.get(load_be(s + 1, 4))
            if plan is None:
                break
            width = plan[8]
            if kind == 0x44:
                if s[5] != 0x4B and s[5] != 0x4F:
                    break
            elif s[5] != 0x4E:  # an update with an old tuple (key change, FULL identity)
                break
            if _scan(s, size, 6, width, ptrs, lens) < 0:
                break
            if plan[11] is not None:  # column rules: the logged columns, transformed
                hashes = []
                try:
                    width = _ruled(<tuple>plan[11], ptrs, lens, rptrs, rlens, hashes)
                except Exception:  # the event path decides (and explains)
                    break
                cptrs, clens = rptrs, rlens
            else:
                cptrs, clens = ptrs, lens
            unchanged = False
            for at in range(width):
                if clens[at] == -2:
                    unchanged = True
                    break
            lsn = load_be(s - 24, 8)
            try:
                key = _key_chars(<tuple>plan[2], cptrs, clens)
                keep = None  # the previous value ``old`` points into
                if unchanged:
                    if kind != 0x55:
                        break
                    keep = _fill_from(plan, clens, key, commit_lsn, ordinal, previous, recent,
                                      old, old_lens)
                    if keep is None:
                        break
                begin = SCRATCH_PREFIX
                PyByteArray_Resize(out, begin)
                put_bytes(out, <bytes>plan[3])
                if kind == 0x44:
                    put_byte(out, 2)
                    _row_chars(<tuple>plan[1], cptrs, clens, out)
                    put_byte(out, 0)
                elif unchanged:
                    put_byte(out, 0)
                    put_byte(out, 2)
                    _row_filled(<tuple>plan[1], cptrs, clens, old, old_lens, out)
                else:
                    put_byte(out, 0)
                    put_byte(out, 2)
                    _row_chars(<tuple>plan[1], cptrs, clens, out)
            except Exception:  # the typed path decides (and explains)
                PyByteArray_Resize(out, begin)
                break
            topic = plan[0]
            per = per_table.get(topic, 0) + 1
            ordinal += 1
            per_table[topic] = per
            # the source block
            put_bytes(out, <bytes>plan[4])
            put_long(out, commit_ms)
            put_bytes(out, <bytes>plan[5])
            lsn_n = snprintf(lsn_text, 40, "%llX/%llX", <unsigned long long>(lsn >> 32),
                             <unsigned long long>(lsn & 0xFFFFFFFFULL))
            put_byte(out, 2)
            put_long(out, PyBytes_GET_SIZE(commit_text) + lsn_n + 7)
            put(out, b'["', 2)
            put_bytes(out, commit_text)
            put(out, b'","', 3)
            put(out, lsn_text, lsn_n)
            put(out, b'"]', 2)
            _opt_long(out, commit_ms * 1000)
            _opt_long(out, commit_ms * 1000000)
            put_bytes(out, <bytes>plan[6])
            _opt_long(out, xid)
            _opt_long(out, <long long>lsn)
            put_byte(out, 0)  # xmin
            # the transaction block, op, processing times, unavailable columns
            put_bytes(out, txn_prefix)
            put_long(out, ordinal)
            put_long(out, per)
            put(out, b"\x02c" if kind == 0x49 else b"\x02u" if kind == 0x55 else b"\x02d", 2)
            put_bytes(out, times)
            put_byte(out, 0)
            value = PyBytes_FromStringAndSize(PyByteArray_AS_STRING(out) + begin,
                                              PyByteArray_GET_SIZE(out) - begin)
            position = _position(commit_lsn, <unsigned long long>ordinal)
            records.append(tuple.__new__(record, (topic, key, value, position)))
            if recent is not None:
                recent[(topic, key)] = None if kind == 0x44 else value
            if kind == 0x44:
                records.append(tuple.__new__(record, (topic, key, None, position)))
            touched[topic] = plan[9]
            events += 1
            i += 1
    finally:
        free(block)
        txn.ordinal = ordinal
    return i, events


# ------------------------------------------------------------------- COPY text rows -> records
# Compiled twin of rowcodec.encode_copy (see there for the contract).

from libc.string cimport memchr
from libc.stdlib cimport realloc


cdef inline int _octal(unsigned char c):
    return c - 48 if 48 <= c <= 55 else -1


cdef Py_ssize_t _unescape(const unsigned char* s, Py_ssize_t n, char* out):
    """COPY text format's backslash escapes decoded into ``out`` (at least ``n`` bytes)."""
    cdef Py_ssize_t i = 0, o = 0, k
    cdef int value, digit
    cdef unsigned char c
    while i < n:
        c = s[i]
        if c != 92 or i + 1 >= n:
            out[o] = <char>c
            o += 1
            i += 1
            continue
        c = s[i + 1]
        i += 2
        if c == 98:
            out[o] = 8
        elif c == 102:
            out[o] = 12
        elif c == 110:
            out[o] = 10
        elif c == 114:
            out[o] = 13
        elif c == 116:
            out[o] = 9
        elif c == 118:
            out[o] = 11
        elif _octal(c) >= 0:
            value = _octal(c)
            k = 0
            while k < 2 and i < n and _octal(s[i]) >= 0:
                value = value * 8 + _octal(s[i])
                i += 1
                k += 1
            out[o] = <char>(value & 0xFF)
        elif c == 120 and i < n and _hex(<char>s[i]) >= 0:
            value = _hex(<char>s[i])
            i += 1
            if i < n and _hex(<char>s[i]) >= 0:
                value = value * 16 + _hex(<char>s[i])
                i += 1
            out[o] = <char>value
        else:
            out[o] = <char>c
        o += 1
    return o


def encode_copy(tuple plan, bytes data, Py_ssize_t start, long long number, list records, record,
                bytes times):
    """See rowcodec.encode_copy."""
    cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data), at = start, end, field, i, n
    cdef Py_ssize_t width = plan[5]
    cdef const unsigned char* line_end
    cdef const unsigned char* tab
    cdef void** block = <void**>malloc(sizeof(void*) * 4 * (width + 1))  # column spans
    cdef const char** ptrs = <const char**>block
    cdef Py_ssize_t* lens = <Py_ssize_t*>(block + (width + 1))
    cdef const char** rptrs = <const char**>(block + 2 * (width + 1))
    cdef Py_ssize_t* rlens = <Py_ssize_t*>(block + 3 * (width + 1))
    cdef const char** cptrs
    cdef Py_ssize_t* clens
    cdef char* scratch = NULL
    cdef Py_ssize_t scratch_size = 0, used
    cdef unsigned long long lsn = plan[6]
    cdef bytearray out = _scratch()
    cdef bytes key, position
    cdef long long rows = 0
    topic = plan[0]
    if block == NULL:
        raise MemoryError()
    try:
        while at < size:
            line_end = <const unsigned char*>memchr(s + at, 10, size - at)
            if line_end == NULL:
                break  # a row cut short: the caller keeps it for the next call
            end = line_end - s
            if scratch_size < end - at:
                scratch_size = (end - at) * 2 + 64
                scratch = <char*>realloc(scratch, scratch_size)
                if scratch == NULL:
                    raise MemoryError()
            used = 0
            field = 0
            i = at
            while True:
                tab = <const unsigned char*>memchr(s + i, 9, end - i)
                n = (tab - s if tab != NULL else end) - i
                if field < width:
                    if n == 2 and s[i] == 92 and s[i + 1] == 78:  # \N
                        lens[field] = -1
                    elif memchr(s + i, 92, n) != NULL:
                        lens[field] = _unescape(s + i, n, scratch + used)
                        ptrs[field] = scratch + used
                        used += lens[field]
                    else:
                        ptrs[field] = <const char*>s + i
                        lens[field] = n
                field += 1
                if tab == NULL:
                    break
                i = tab - s + 1
            if field != width:
                break  # the event path explains
            try:
                cptrs, clens = ptrs, lens
                if plan[8] is not None:  # column rules: the logged columns, transformed
                    hashes = []
                    _ruled(<tuple>plan[8], ptrs, lens, rptrs, rlens, hashes)
                    cptrs, clens = rptrs, rlens
                PyByteArray_Resize(out, SCRATCH_PREFIX)
                put_bytes(out, <bytes>plan[3])
                put(out, b"\x00\x02", 2)
                _row_chars(<tuple>plan[1], cptrs, clens, out)
                key = _key_chars(<tuple>plan[2], cptrs, clens)
            except Exception:  # the event path decides (and explains)
                break
            put_bytes(out, <bytes>plan[4])
            put_bytes(out, times)
            put_byte(out, 0)
            number += 1
            position = _pg_position(lsn, 0, <unsigned long long>number)  # a snapshot row
            value = PyBytes_FromStringAndSize(PyByteArray_AS_STRING(out) + SCRATCH_PREFIX,
                                              PyByteArray_GET_SIZE(out) - SCRATCH_PREFIX)
            records.append(tuple.__new__(record, (topic, key, value, position)))
            rows += 1
            at = end + 1
    finally:
        free(block)
        free(scratch)
    return at, number



# ------------------------------------------------------------------- replication stream drain
# libpq's own functions, from the libpq psycopg loaded (replication.bind_libpq finds it): a
# PGconn must only ever be handled by the library that made it.

ctypedef int (*_GetCopyData)(void* conn, char** buffer, int async_) noexcept nogil
ctypedef int (*_ConsumeInput)(void* conn) noexcept nogil
ctypedef void (*_FreeMem)(void* ptr) noexcept nogil

cdef _GetCopyData _pq_get_copy_data = NULL
cdef _ConsumeInput _pq_consume_input = NULL
cdef _FreeMem _pq_freemem = NULL

# drain's answers (replication.DRAIN_*)
DEF DRAIN_IDLE = 0
DEF DRAIN_REPLY = 1
DEF DRAIN_ENDED = 2
DEF DRAIN_BROKEN = 3


def bind_libpq(size_t get_copy_data, size_t consume_input, size_t freemem):
    """Take the addresses of libpq's ``PQgetCopyData``, ``PQconsumeInput`` and ``PQfreemem``."""
    global _pq_get_copy_data, _pq_consume_input, _pq_freemem
    _pq_get_copy_data = <_GetCopyData>get_copy_data
    _pq_consume_input = <_ConsumeInput>consume_input
    _pq_freemem = <_FreeMem>freemem


def drain(size_t conn, list batch, Py_ssize_t limit, unsigned long long received):
    """The compiled twin of replication.ReplicationStream._drain (raw messages; the same
    contract): returns (DRAIN_*, the highest WAL end received)."""
    cdef char* buffer = NULL
    cdef int size
    cdef bint consumed = False
    cdef unsigned long long wal_end
    cdef void* pgconn = <void*>conn
    if _pq_get_copy_data == NULL:
        raise RuntimeError("libpq is not bound (bind_libpq)")
    while len(batch) < limit:
        size = _pq_get_copy_data(pgconn, &buffer, 1)
        if size > 0:
            consumed = False
            try:
                if buffer[0] == 0x77 and size >= 25:  # 'w'
                    wal_end = load_be(<const unsigned char*>buffer + 9, 8)
                    if wal_end > received:
                        received = wal_end
                    batch.append(buffer[:size])
                elif buffer[0] == 0x6B and size >= 18 and buffer[17]:  # 'k', reply requested
                    return DRAIN_REPLY, received
            finally:
                _pq_freemem(buffer)
            continue
        if size < 0:
            return DRAIN_ENDED, received
        if consumed:
            return DRAIN_IDLE, received
        if not _pq_consume_input(pgconn):
            return DRAIN_BROKEN, received
        consumed = True
    return DRAIN_IDLE, received
