"""The fast row path: a binlog rows event's bytes straight to Avro row images and key bytes.

python-mysql-replication decodes every value of every row into a Python object (its row loop
is the connector's bottleneck); the typed path then converts those (``types.binlog_converter``),
and the codec encodes them again. For tables whose every column has a *fast kind* (the common
types: integers, FLOAT/DOUBLE, DECIMAL, UTF-8 text, binary strings, ENUM, DATE, DATETIME(n),
TIMESTAMP(n), YEAR, MariaDB JSON) this module reads the rows event body itself and writes each
row's Avro ``Value`` record and its key bytes directly. The bytes equal the typed path's
(``tests/test_mysql_rowcodec.py`` checks both implementations against it); anything it does not
expect (a zero date in a key, a value outside a fast kind) raises :class:`Fallback` and the caller
takes the typed path for that event.

Two implementations of one contract: this file (pure Python, selected by ``CDC_PURE_PYTHON=1``)
and ``connectors/mysql/_fast`` (Cython), whose functions take the same plans.

Plans are plain tuples built by :func:`plan_for`:

* a column: ``(kind, prefix, a, b, labels)``: ``prefix`` is the union branch byte of the value
  (``-1``: the field is no union, so a null cannot be written), ``a``/``b`` the kind's
  parameters (byte sizes, fsp, precision/scale, signedness), ``labels`` the encoded ENUM labels;
* a key column: ``(json name prefix bytes, column index, kind)``.

The binary row format (MySQL's "rows event" body; MariaDB writes the same): per row a null
bitmap over the present columns, then the non-null values in column order; an update row is the
before image, then the after image.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Sequence
from typing import Any

from cdc.speedups import pure_python
from cdc.types import days_from_civil
from connectors.mysql.fallback import Fallback

# fast kinds
INT, UINT64, FLOAT, DOUBLE, DECIMAL, STRING, BYTES, ENUM, DATE, DATETIME2, TIMESTAMP2, YEAR = (
    range(1, 13))

# MySQL field types (binlog table map), as python-mysql-replication's FIELD_TYPE
_T_DECIMAL, _T_TINY, _T_SHORT, _T_LONG, _T_FLOAT, _T_DOUBLE = 0, 1, 2, 3, 4, 5
_T_LONGLONG, _T_INT24, _T_DATE, _T_YEAR = 8, 9, 10, 13
_T_VARCHAR, _T_TIMESTAMP2, _T_DATETIME2, _T_NEWDECIMAL, _T_ENUM = 15, 17, 18, 246, 247
_T_BLOB, _T_VAR_STRING, _T_STRING = 252, 253, 254
_INT_SIZES = {_T_TINY: 1, _T_SHORT: 2, _T_INT24: 3, _T_LONG: 4, _T_LONGLONG: 8}
_UTF8 = frozenset({"utf8", "utf8mb3", "utf8mb4", "ascii"})
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
#: logical types each fast kind may write
_KIND_TYPES = {INT: {"int16", "int32", "int64"}, UINT64: {"uint64"}, FLOAT: {"float32"},
               DOUBLE: {"float64"}, DECIMAL: {"decimal"}, STRING: {"string", "json"},
               BYTES: {"bytes"}, ENUM: {"enum"}, DATE: {"date"}, DATETIME2: {"timestamp"},
               TIMESTAMP2: {"timestamptz"}, YEAR: {"year", "int32"}}
_KEY_KINDS = frozenset({INT, UINT64, STRING})


Column = tuple[int, int, int, int, tuple[bytes, ...]]
KeyColumn = tuple[bytes, int, int]
Plan = tuple[tuple[Column, ...], tuple[KeyColumn, ...]]


def _original(column: Any, name: str) -> Any:
    original = getattr(column, "cdc_original", None) or {}
    return original.get(name, getattr(column, name, None))


def _column_kind(column: Any, my: Any, ctype: Any) -> tuple[int, int, int, tuple[bytes, ...]]:
    """(kind, a, b, labels) of one column, or kind 0 when it has no fast kind."""
    field_type = _original(column, "type")
    charset = _original(column, "character_set_name")
    kind, a, b, labels = 0, 0, 0, ()
    if field_type in _INT_SIZES:
        kind, a, b = INT, _INT_SIZES[field_type], int(bool(my.unsigned))
        if field_type == _T_LONGLONG and my.unsigned:
            kind = UINT64
    elif field_type == _T_FLOAT:
        kind = FLOAT
    elif field_type == _T_DOUBLE:
        kind = DOUBLE
    elif field_type == _T_NEWDECIMAL:
        kind, a, b = DECIMAL, int(column.precision), int(column.decimals)
    elif field_type in (_T_VARCHAR, _T_STRING, _T_VAR_STRING, _T_BLOB):
        size = int(column.length_size) if field_type == _T_BLOB else (
            2 if int(column.max_length) > 255 else 1)
        binary = charset in (None, "binary") or (my.charset or "binary") == "binary"
        if binary:
            pad = int(my.precision or 0) if my.data_type == "binary" else 0
            kind, a, b = BYTES, size, pad
        elif (my.charset or "").lower() in _UTF8:
            kind, a = STRING, size
    elif field_type == _T_ENUM:
        kind, a = ENUM, int(column.size)
        labels = tuple(value.encode() for value in my.values)
    elif field_type == _T_DATE:
        kind = DATE
    elif field_type == _T_DATETIME2:
        kind, a = DATETIME2, int(_original(column, "fsp") or 0)
    elif field_type == _T_TIMESTAMP2:
        kind, a = TIMESTAMP2, int(_original(column, "fsp") or 0)
    elif field_type == _T_YEAR:
        kind = YEAR
    if kind and ctype.name not in _KIND_TYPES[kind]:
        kind = 0
    return kind, a, b, labels


def _prefix(field_type: Any) -> int:
    """The union branch byte of a field's value (``-1``: no union)."""
    if not isinstance(field_type, list):
        return -1
    for index, branch in enumerate(field_type):
        if branch != "null":
            return index << 1
    return -1


def plan_for(columns: Sequence[Any], my_columns: Sequence[Any], value_fields: Sequence[Any],
             types: Sequence[Any], key: Sequence[str]) -> Plan | None:
    """The plan of one table version: ``columns`` are the table map's (python-mysql-replication
    ``Column`` objects, after ``types.prepare_table_map``), ``my_columns`` the captured
    :class:`~connectors.mysql.types.MyColumn` s, ``value_fields`` the registered Avro fields
    of the ``Value`` record, ``types`` the columns' logical types. None when some column or
    key column has no fast kind."""
    if not (len(columns) == len(my_columns) == len(value_fields) == len(types)):
        return None
    plan = []
    for column, my, field, ctype in zip(columns, my_columns, value_fields, types, strict=True):
        kind, a, b, labels = _column_kind(column, my, ctype)
        if not kind:
            return None
        prefix = _prefix(field["type"])
        if kind == DECIMAL:  # [bytes, string] or [null, bytes, string]
            prefix = 2 if prefix == 2 else 0
        plan.append((kind, prefix, a, b, labels))
    names = [my.name for my in my_columns]
    keys = []
    for position, name in enumerate(key):
        index = names.index(name)
        if plan[index][0] not in _KEY_KINDS:
            return None
        text = ("{" if position == 0 else ",") + json.dumps(name, ensure_ascii=False) + ":"
        keys.append((text.encode(), index, plan[index][0]))
    return tuple(plan), tuple(keys)


# ------------------------------------------------------------------------------ pure Python

def _write_long(n: int, out: bytearray) -> None:
    n = (n << 1) ^ (n >> 63)
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _unscaled_bytes(value: int, out: bytearray) -> None:
    data = value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)
    _write_long(len(data), out)
    out += data


def _decimal(data: bytes, pos: int, precision: int, scale: int) -> tuple[int, int]:
    """MySQL's packed DECIMAL at ``pos``: (unscaled value, next position)."""
    integral = precision - scale
    size = (integral // 9) * 4 + _DIG2BYTES[integral % 9] + (scale // 9) * 4 + _DIG2BYTES[
        scale % 9]
    raw = bytearray(data[pos:pos + size])
    if len(raw) != size:
        raise Fallback
    negative = not raw[0] & 0x80
    raw[0] ^= 0x80
    if negative:
        raw = bytearray(x ^ 0xFF for x in raw)
    value, offset = 0, 0
    for digits in ([integral % 9] if integral % 9 else []) + [9] * (integral // 9):
        width = _DIG2BYTES[digits]
        value = value * 10**digits + int.from_bytes(raw[offset:offset + width], "big")
        offset += width
    for digits in [9] * (scale // 9) + ([scale % 9] if scale % 9 else []):
        width = _DIG2BYTES[digits]
        value = value * 10**digits + int.from_bytes(raw[offset:offset + width], "big")
        offset += width
    return (-value if negative else value), pos + size


def _fraction(data: bytes, pos: int, fsp: int) -> tuple[int, int]:
    """The fractional seconds of a TIME2/DATETIME2/TIMESTAMP2 (microseconds, next position)."""
    width = (fsp + 1) // 2
    if not width:
        return 0, pos
    value = int.from_bytes(data[pos:pos + width], "big")
    return value * 10 ** (6 - 2 * width), pos + width


def _iso_utc(seconds: int, micros: int) -> bytes:
    days, rest = divmod(seconds, 86400)
    from cdc.types import civil_from_days

    year, month, day = civil_from_days(days)
    return (f"{year:04d}-{month:02d}-{day:02d}T{rest // 3600:02d}:{rest // 60 % 60:02d}:"
            f"{rest % 60:02d}.{micros:06d}Z").encode()


def _value(column: Column, data: bytes, pos: int, out: bytearray) -> int:
    """Write one non-null value's Avro bytes (its union branch included); the next position."""
    kind, prefix, a, b, labels = column
    start = len(out)
    if prefix >= 0:
        out.append(prefix)
    if kind == INT:
        value = int.from_bytes(data[pos:pos + a], "little", signed=not b)
        _write_long(value, out)
        return pos + a
    if kind == UINT64:
        _unscaled_bytes(int.from_bytes(data[pos:pos + 8], "little"), out)
        return pos + 8
    if kind == FLOAT:
        out += data[pos:pos + 4]
        return pos + 4
    if kind == DOUBLE:
        out += data[pos:pos + 8]
        return pos + 8
    if kind == DECIMAL:
        value, pos = _decimal(data, pos, a, b)
        _unscaled_bytes(value, out)
        return pos
    if kind in (STRING, BYTES):
        length = int.from_bytes(data[pos:pos + a], "little")
        pos += a
        text = data[pos:pos + length]
        if kind == BYTES and b and length < b:
            text += b"\x00" * (b - length)
        if kind == STRING:
            text.decode()  # the typed path would fail on invalid UTF-8: let it say so
        _write_long(len(text), out)
        out += text
        return pos + length
    if kind == ENUM:
        index = int.from_bytes(data[pos:pos + a], "little")
        label = labels[index - 1] if 0 < index <= len(labels) else b""
        _write_long(len(label), out)
        out += label
        return pos + a
    if kind == YEAR:
        year = data[pos]
        _write_long(year + 1900 if year else 0, out)
        return pos + 1
    if kind == DATE:
        packed = int.from_bytes(data[pos:pos + 3], "little")
        day, month, year = packed & 31, (packed >> 5) & 15, packed >> 9
        if not month or not day:
            _null(prefix, out, start)
        else:
            _write_long(days_from_civil(year, month, day), out)
        return pos + 3
    if kind == DATETIME2:
        packed = int.from_bytes(data[pos:pos + 5], "big") - 0x8000000000
        micros, after = _fraction(data, pos + 5, a)
        ymd, hms = packed >> 17, packed & 0x1FFFF
        year, month, day = (ymd >> 5) // 13, (ymd >> 5) % 13, ymd & 31
        if not month or not day:
            _null(prefix, out, start)
        else:
            seconds = days_from_civil(year, month, day) * 86400 + (hms >> 12) * 3600 + (
                (hms >> 6) & 63) * 60 + (hms & 63)
            _write_long(seconds * 1_000_000 + micros, out)
        return after
    if kind == TIMESTAMP2:
        seconds = int.from_bytes(data[pos:pos + 4], "big")
        micros, after = _fraction(data, pos + 4, a)
        if not seconds and not micros:
            _null(prefix, out, start)
        else:
            text = _iso_utc(seconds, micros)
            _write_long(len(text), out)
            out += text
        return after
    raise Fallback


def _null(prefix: int, out: bytearray, start: int) -> None:
    """A zero date where the typed path writes null: the null branch (or no fast path)."""
    if prefix < 0:
        raise Fallback
    del out[start:]
    out.append(0)


def _image(plan: tuple[Column, ...], data: bytes, pos: int, out: bytearray,
           offsets: list[int]) -> int:
    """One row image: the Avro ``Value`` record into ``out``; each column's start in ``data``
    (-1 for null) into ``offsets``; the next position."""
    count = len(plan)
    nulls = data[pos:pos + (count + 7) // 8]
    pos += (count + 7) // 8
    for index, column in enumerate(plan):
        if nulls[index >> 3] >> (index & 7) & 1:
            if column[1] < 0:
                raise Fallback
            out.append(0)
            offsets.append(-1)
            continue
        offsets.append(pos)
        pos = _value(column, data, pos, out)
    return pos


def _key(keys: tuple[KeyColumn, ...], plan: tuple[Column, ...], data: bytes,
         offsets: list[int]) -> bytes:
    out = bytearray()
    for prefix, index, kind in keys:
        pos = offsets[index]
        if pos < 0:
            raise Fallback
        out += prefix
        a, b = plan[index][2], plan[index][3]
        if kind == INT:
            out += str(int.from_bytes(data[pos:pos + a], "little", signed=not b)).encode()
        elif kind == UINT64:
            out += b'"' + str(int.from_bytes(data[pos:pos + 8], "little")).encode() + b'"'
        else:
            length = int.from_bytes(data[pos:pos + a], "little")
            text = data[pos + a:pos + a + length].decode()
            out += json.dumps(text, ensure_ascii=False).encode()
    out += b"}"
    return bytes(out)


def decode_rows(plan: Plan, data: bytes, pos: int, end: int, update: bool
                ) -> list[tuple[bytes, bytes, bytes | None, bytes | None]]:
    """Every row of a rows event body ``data[pos:end]``: ``(key, image, before key, before
    image)`` where ``image`` is the row's Avro ``Value`` (the after image; a delete's before
    image) and, for an update, ``before key``/``before image`` the before image's."""
    columns, keys = plan
    rows = []
    while pos < end:
        first, offsets = bytearray(), []
        pos = _image(columns, data, pos, first, offsets)
        first_key = _key(keys, columns, data, offsets)
        if not update:
            rows.append((first_key, bytes(first), None, None))
            continue
        second, offsets = bytearray(), []
        pos = _image(columns, data, pos, second, offsets)
        rows.append((_key(keys, columns, data, offsets), bytes(second), first_key,
                     bytes(first)))
    if pos != end:
        raise Fallback
    return rows


def build_records(decoded: Sequence[tuple[bytes, bytes, bytes | None, bytes | None]], kind: int,
                  topic: str, pieces: tuple[bytes, ...], total: int, per_table: int,
                  file_seq: int, start: int, record: Any) -> tuple[list[Any], int, int]:
    """The log records of one rows event's decoded rows (``kind``: 0 insert, 1 delete,
    2 update): ``(records, total order, per-table order)`` after them.

    ``pieces`` are the envelope's constant parts: ``(header, source block before its row,
    source block after it, transaction block prefix (union byte and id), times and the null
    unavailable_columns)``; ``record`` makes a record from ``(topic, key, value, position)``.
    A delete is followed by a tombstone at its position; an update that changed the key is a
    delete (and tombstone) of the old key and a create of the new one."""
    header, prefix, suffix, txn, tail = pieces
    records = []
    ordinal = 0

    def value(before: bytes | None, after: bytes | None, op: bytes, row: int) -> bytes:
        nonlocal total, per_table
        total += 1
        per_table += 1
        out = bytearray(header)
        if before is None:
            out.append(0)
        else:
            out.append(2)
            out += before
        if after is None:
            out.append(0)
        else:
            out.append(2)
            out += after
        out += prefix
        _write_long(row, out)
        out += suffix
        out += txn
        _write_long(total, out)
        _write_long(per_table, out)
        out += op
        out += tail
        return bytes(out)

    for row, (key, image, old_key, old_image) in enumerate(decoded):
        ordinal += 1
        position = position_bytes(file_seq, start, ordinal)
        if kind == 0:
            records.append(record(topic, key, value(None, image, b"\x02c", row), position))
        elif kind == 1:
            records.append(record(topic, key, value(image, None, b"\x02d", row), position))
            records.append(record(topic, key, None, position))
        elif old_key == key:
            records.append(record(topic, key, value(old_image, image, b"\x02u", row),
                                  position))
        else:
            records.append(record(topic, old_key, value(old_image, None, b"\x02d", row),
                                  position))
            records.append(record(topic, old_key, None, position))
            ordinal += 1
            records.append(record(topic, key, value(None, image, b"\x02c", row),
                                  position_bytes(file_seq, start, ordinal)))
    return records, total, per_table


def implementation() -> str:
    """``compiled`` when the Cython twin is in use, else ``pure``."""
    return "compiled" if decode_rows is not _pure_decode_rows else "pure"


# ------------------------------------------------------------------- snapshot rows (text)
#
# The snapshot reads rows with the text protocol (each value a length-encoded string, 0xFB for
# NULL); for tables whose every column has a text kind, :func:`encode_text_rows` turns a batch
# of raw row packets into Avro ``Value`` images and key bytes without a Python value per column.

T_INT, T_UINT64, T_FLOAT, T_DOUBLE, T_DECIMAL, T_STRING, T_BYTES, T_DATE, T_DATETIME, \
    T_TIMESTAMP, T_YEAR = range(1, 12)
_TEXT_KINDS = {
    "int16": T_INT, "int32": T_INT, "int64": T_INT, "uint64": T_UINT64, "float32": T_FLOAT,
    "float64": T_DOUBLE, "decimal": T_DECIMAL, "string": T_STRING, "json": T_STRING,
    "enum": T_STRING, "enumset": T_STRING, "bytes": T_BYTES, "date": T_DATE,
    "timestamp": T_DATETIME, "timestamptz": T_TIMESTAMP, "year": T_YEAR,
}
_TEXT_KEY_KINDS = frozenset({T_INT, T_UINT64, T_STRING})


def text_plan_for(my_columns: Sequence[Any], value_fields: Sequence[Any],
                  types: Sequence[Any], key: Sequence[str]) -> Plan | None:
    """The plan of a table's snapshot rows: per column ``(kind, prefix, scale or pad, 0, ())``;
    None when a column (or a key column) has no text kind."""
    if not (len(my_columns) == len(value_fields) == len(types)):
        return None
    plan = []
    for my, field, ctype in zip(my_columns, value_fields, types, strict=True):
        kind = _TEXT_KINDS.get(ctype.name, 0)
        if kind == T_BYTES and my.data_type not in ("binary", "varbinary", "tinyblob", "blob",
                                                    "mediumblob", "longblob"):
            kind = 0  # uuid, inet6 ... print as text
        if not kind:
            return None
        prefix = _prefix(field["type"])
        a = 0
        if kind == T_DECIMAL:
            prefix = 2 if prefix == 2 else 0
            a = int(ctype.scale or 0)
        elif kind == T_BYTES and my.data_type == "binary":
            a = int(my.precision or 0)
        plan.append((kind, prefix, a, 0, ()))
    names = [my.name for my in my_columns]
    keys = []
    for position, name in enumerate(key):
        index = names.index(name)
        if plan[index][0] not in _TEXT_KEY_KINDS:
            return None
        text = ("{" if position == 0 else ",") + json.dumps(name, ensure_ascii=False) + ":"
        keys.append((text.encode(), index, plan[index][0]))
    return tuple(plan), tuple(keys)


def _text_fields(data: bytes, count: int) -> list[bytes | None]:
    """The values of a text-protocol row packet."""
    out: list[bytes | None] = []
    pos = 0
    for _ in range(count):
        first = data[pos]
        if first == 0xFB:
            out.append(None)
            pos += 1
            continue
        if first < 0xFB:
            length, pos = first, pos + 1
        elif first == 0xFC:
            length, pos = int.from_bytes(data[pos + 1:pos + 3], "little"), pos + 3
        elif first == 0xFD:
            length, pos = int.from_bytes(data[pos + 1:pos + 4], "little"), pos + 4
        else:
            length, pos = int.from_bytes(data[pos + 1:pos + 9], "little"), pos + 9
        out.append(data[pos:pos + length])
        pos += length
    if pos != len(data):
        raise Fallback
    return out


def _text_moment(text: bytes) -> tuple[int, int, int, int] | None:
    """(days, seconds of the day, microseconds, has time) of ``YYYY-MM-DD[ HH:MM:SS[.f]]``;
    None for a zero date (zero month or day)."""
    if len(text) < 10 or text[4:5] != b"-" or text[7:8] != b"-":
        raise Fallback
    year, month, day = int(text[0:4]), int(text[5:7]), int(text[8:10])
    if not month or not day:
        return None
    seconds = micros = 0
    if len(text) > 10:
        if len(text) < 19:
            raise Fallback
        seconds = int(text[11:13]) * 3600 + int(text[14:16]) * 60 + int(text[17:19])
        if len(text) > 20:
            micros = int(text[20:26].ljust(6, b"0"))
    return days_from_civil(year, month, day), seconds, micros, len(text) > 10


def _text_value(column: Column, text: bytes, out: bytearray) -> None:
    kind, prefix, a = column[0], column[1], column[2]
    start = len(out)
    if prefix >= 0:
        out.append(prefix)
    if kind in (T_INT, T_YEAR):
        _write_long(int(text), out)
    elif kind == T_UINT64:
        _unscaled_bytes(int(text), out)
    elif kind == T_FLOAT:
        out += struct.pack("<f", float(text))
    elif kind == T_DOUBLE:
        out += struct.pack("<d", float(text))
    elif kind == T_DECIMAL:
        whole, _, fraction = text.partition(b".")
        if len(fraction) != a:
            raise Fallback
        _unscaled_bytes(int(whole + fraction), out)
    elif kind in (T_STRING, T_BYTES):
        if kind == T_STRING:
            text.decode()
        elif a and len(text) < a:
            text += b"\x00" * (a - len(text))
        _write_long(len(text), out)
        out += text
    else:
        moment = _text_moment(text)
        if moment is None:
            _null(prefix, out, start)
            return
        days, seconds, micros, _ = moment
        if kind == T_DATE:
            _write_long(days, out)
        elif kind == T_DATETIME:
            _write_long((days * 86400 + seconds) * 1_000_000 + micros, out)
        else:
            iso = _iso_utc(days * 86400 + seconds, micros)
            _write_long(len(iso), out)
            out += iso


def encode_text_rows(plan: Plan, packets: Sequence[bytes]) -> list[tuple[bytes, bytes]]:
    """``(key bytes, Avro Value image)`` of each text-protocol row packet."""
    columns, keys = plan
    count = len(columns)
    rows = []
    for data in packets:
        values = _text_fields(data, count)
        image = bytearray()
        for column, text in zip(columns, values, strict=True):
            if text is None:
                if column[1] < 0:
                    raise Fallback
                image.append(0)
            else:
                _text_value(column, text, image)
        key = bytearray()
        for prefix, index, kind in keys:
            text = values[index]
            if text is None:
                raise Fallback
            key += prefix
            if kind == T_INT:
                key += str(int(text)).encode()
            elif kind == T_UINT64:
                key += b'"' + str(int(text)).encode() + b'"'
            else:
                key += json.dumps(text.decode(), ensure_ascii=False).encode()
        key += b"}"
        rows.append((bytes(key), bytes(image)))
    return rows


_POSITION = struct.Struct(">BQQQ").pack


class PacketSplitter:
    """Splits the bytes a text-protocol result set's rows arrive in into row packets (the
    payloads), until its EOF packet; an error packet raises ``error(payload)``. A row of 16 MiB
    or more (split over several packets) raises :class:`Fallback`."""

    def __init__(self) -> None:
        self.buffer = b""
        self.done = False

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self.buffer + chunk
        rows: list[bytes] = []
        pos, size = 0, len(data)
        while size - pos >= 4:
            length = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
            if length == 0xFFFFFF:
                raise Fallback
            if size - pos - 4 < length:
                break
            payload = data[pos + 4:pos + 4 + length]
            pos += 4 + length
            if payload[:1] == b"\xfe" and length < 9:
                self.done = True
                break
            if payload[:1] == b"\xff":
                raise PacketError(payload)
            rows.append(payload)
        self.buffer = data[pos:]
        return rows


class PacketError(Exception):
    """An error packet in the middle of a result set (its payload)."""


def snapshot_records(plan: Plan, packets: Sequence[bytes], topic: str, header: bytes,
                     tail: bytes, file_seq: int, pos: int, first: int, record: Any
                     ) -> list[Any]:
    """The log records of a batch of snapshot row packets: value ``header + image + tail``,
    position ``(file_seq, pos, first + n)`` for the n-th row (from 1)."""
    return [record(topic, key, header + image + tail, position_bytes(file_seq, pos, first + n))
            for n, (key, image) in enumerate(encode_text_rows(plan, packets), 1)]


def position_bytes(file_seq: int, pos: int, ordinal: int) -> bytes:
    """:meth:`cdc.position.Position.mysql` ``(file_seq, pos, ordinal)`` as bytes."""
    return _POSITION(2, file_seq, pos, ordinal)


_pure_decode_rows = decode_rows
_pure_build_records = build_records
_pure_encode_text_rows = encode_text_rows
_pure_snapshot_records = snapshot_records
if not pure_python():
    with contextlib.suppress(ImportError):  # the compiled twin, when built
        from connectors.mysql._fast import (  # type: ignore[import-not-found,no-redef]
            build_records,
            decode_rows,
            encode_text_rows,
            snapshot_records,
        )
