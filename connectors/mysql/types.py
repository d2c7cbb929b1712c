"""MySQL/MariaDB types: which logical type each column gets, and how the two readers' values
become the one Python value :meth:`cdc.types.ColumnType.to_avro` takes.

The snapshot reads rows with PyMySQL's default conversions (:data:`SNAPSHOT_CONNECT_ARGS`: text
protocol, ``utf8mb4``, session ``time_zone '+00:00'``; FLOAT columns selected as
``CAST(col AS DOUBLE)``, see :func:`snapshot_expression`); the stream reads the row binlog with
pymysqlreplication. The two disagree on many types, so each column gets one converter per path
(:func:`snapshot_converter`, :func:`binlog_converter`) that normalises both to the same value;
``tests/test_mysql_types.py`` checks every type both ways against stated values.

pymysqlreplication's own decoding is wrong or lossy for some binlog formats (negative TIME with
a fraction, SET ``''``, latin1 bytes 0x81/0x8D/0x8F/0x90/0x9D, year-0 dates, ...), so
:func:`prepare_table_map` must be called on every ``TableMapEvent`` before its rows are read: it
makes pymysqlreplication hand over those columns' raw bytes, which the binlog converters decode
exactly. The mapping and every quirk are documented in ``docs/types.md`` ("MySQL and MariaDB").
"""

from __future__ import annotations

import calendar
import codecs
import datetime as dt
import json
import math
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from cdc.errors import CdcError
from cdc.types import DAY_MICROS, ColumnType, days_from_civil

Converter = Callable[[Any], Any]

#: PyMySQL ``connect()`` arguments the snapshot must use (with the default ``conv``, i.e. none
#: given, and ``use_unicode`` left on): every text column arrives as ``str`` in utf8mb4,
#: TIMESTAMPs in UTC
SNAPSHOT_CONNECT_ARGS: dict[str, Any] = {
    "charset": "utf8mb4",
    "init_command": "SET time_zone = '+00:00'",
}

SPATIAL_TYPES = frozenset({
    "geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
    "multipolygon", "geometrycollection", "geomcollection",
})
TEXT_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext"})
BINARY_TYPES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
ZERO_DATE_TYPES = frozenset({"date", "datetime", "timestamp"})


@dataclass(frozen=True)
class MyColumn:
    """One column as MySQL/MariaDB describes it (information_schema.COLUMNS, or a binlog table
    map)."""

    name: str
    #: lower-case DATA_TYPE: 'tinyint', 'int', 'bigint', 'decimal', 'varchar', 'enum', 'set',
    #: 'json', 'uuid', 'inet6', 'bit', 'datetime', 'timestamp', 'time', 'year', 'date', 'blob',
    #: 'binary', ... (a binlog table map says 'binary' for UUID and INET6: see :func:`refine`)
    data_type: str
    #: COLUMN_TYPE, e.g. "int(10) unsigned", "enum('a','b')", "tinyint(1)"
    column_type: str = ""
    unsigned: bool = False
    #: NUMERIC_PRECISION, or bit length for BIT, or CHARACTER_MAXIMUM_LENGTH for binary(n)
    precision: int | None = None
    #: NUMERIC_SCALE, or DATETIME_PRECISION for datetime/timestamp/time
    scale: int | None = None
    #: CHARACTER_SET_NAME ('binary' or None for binary types)
    charset: str | None = None
    #: ENUM / SET members in order
    values: tuple[str, ...] = ()
    #: '', 'VIRTUAL', 'STORED'
    generated: str = ""
    nullable: bool = True
    #: part of the primary key (a table map's SIMPLE_PRIMARY_KEY, or information_schema's
    #: COLUMN_KEY = 'PRI')
    primary_key: bool = False
    #: ``db.table``, for error messages only
    table: str = ""

    @property
    def where(self) -> str:
        return f"{self.table}.{self.name}" if self.table else self.name


# ----------------------------------------------------------------------------- the mapping

def column_type(column: MyColumn) -> ColumnType:
    """The logical type of ``column`` (``docs/types.md``, "MySQL and MariaDB")."""
    kind = column.data_type.lower()
    source = column.column_type or kind

    def of(name: str, **params: Any) -> ColumnType:
        return ColumnType(name, source_type=source, **params)

    if kind in ("tinyint", "smallint"):
        return of("int32" if kind == "smallint" and column.unsigned else "int16")
    if kind in ("mediumint",):
        return of("int32")
    if kind in ("int", "integer"):
        return of("int64" if column.unsigned else "int32")
    if kind == "bigint":
        return of("uint64" if column.unsigned else "int64")
    if kind in ("decimal", "numeric", "dec", "fixed"):
        precision = column.precision if column.precision is not None else 10
        return of("decimal", precision=precision, scale=column.scale or 0)
    if kind == "float":
        return of("float32")
    if kind in ("double", "real", "double precision"):
        return of("float64")
    if kind == "bit":
        length = column.precision or 1
        return of("boolean") if length == 1 else of("bits", precision=length)
    if kind in ("bool", "boolean"):
        return of("int16")  # MySQL's BOOL is TINYINT(1): Debezium's default INT16
    if kind in TEXT_TYPES:
        return of("string")
    if kind in BINARY_TYPES:
        return of("bytes")
    if kind == "enum":
        return of("enum", values=column.values)
    if kind == "set":
        return of("enumset", values=column.values)
    if kind == "json":
        return of("json")
    if kind == "date":
        return of("date")
    fraction = column.scale if column.scale is not None and column.scale < 6 else None
    if kind == "datetime":
        return of("timestamp", precision=fraction)
    if kind == "timestamp":
        return of("timestamptz")
    if kind == "time":
        return of("time", precision=fraction)
    if kind == "year":
        return of("year")
    if kind == "uuid":
        return of("uuid")
    if kind in ("inet6", "inet4"):
        return of("string")
    if kind in SPATIAL_TYPES:
        raise CdcError(
            f"column {column.where} has the spatial type {source}: unsupported type",
            "exclude the table from the source's `tables`, or change the column to a "
            "supported type (e.g. store ST_AsBinary(col) in a BLOB or ST_AsText(col) in TEXT)")
    raise CdcError(f"column {column.where} has the type {source}, which MySQL/MariaDB capture "
                   "does not know: unsupported type",
                   "exclude the table from the source's `tables`, or change the column to a "
                   "supported type (docs/types.md lists them)")


def avro_optional(column: MyColumn) -> bool:
    """Whether the column's Avro schema must take null: nullable columns, and DATE / DATETIME /
    TIMESTAMP columns even when NOT NULL, since their zero dates ('0000-00-00') become null."""
    return column.nullable or column.data_type.lower() in ZERO_DATE_TYPES


def quote_identifier(name: str) -> str:
    """```name``` with backticks doubled."""
    return "`" + name.replace("`", "``") + "`"


def snapshot_expression(column: MyColumn) -> str:
    """The SELECT expression the snapshot reads ``column`` with: the column itself, except
    FLOAT, whose text form keeps only 6 significant digits (``3.14159`` for the stored
    ``3.1415927``): ``CAST(col AS DOUBLE)`` gives its exact value."""
    quoted = quote_identifier(column.name)
    kind = column.data_type.lower()
    if kind == "float" or kind in ("double", "real") and "(" in column.column_type:
        # DOUBLE(M,D) prints rounded to D decimals too, while the binlog has the stored double
        return f"CAST({quoted} AS DOUBLE)"
    return quoted


# ------------------------------------------------------------------------- shared helpers

def _date_days(year: int, month: int, day: int) -> int | None:
    """Days since 1970 of a MySQL date; None for zero dates and dates with a zero (or, under
    ALLOW_INVALID_DATES, an impossible) month or day, which Debezium emits as null."""
    if month < 1 or month > 12 or day < 1:
        return None
    if day > calendar.monthrange(year if year > 0 else 2000, month)[1]:
        return None
    return days_from_civil(year, month, day)


def _datetime_micros(year: int, month: int, day: int, hour: int, minute: int, second: int,
                     micro: int) -> int | None:
    days = _date_days(year, month, day)
    if days is None:
        return None
    return days * DAY_MICROS + ((hour * 60 + minute) * 60 + second) * 1_000_000 + micro


def _date_value(days: int) -> Any:
    """A ``date`` when Python has one, else the int days ``to_avro`` takes (year 0)."""
    try:
        return dt.date(1970, 1, 1) + dt.timedelta(days=days)
    except OverflowError:
        return days


_TEXT_DATETIME = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)(?:[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?")


def _text_micros(text: str) -> int | None:
    """A DATE/DATETIME/TIMESTAMP PyMySQL left as text (zero dates, zero month or day, year 0)."""
    match = _TEXT_DATETIME.fullmatch(text.strip())
    if match is None:
        raise CdcError(f"cannot read the MySQL date/time {text!r}",
                       "this is a bug in the MySQL type mapping; please report it")
    year, month, day = int(match[1]), int(match[2]), int(match[3])
    hour, minute, second = (int(match[i] or 0) for i in (4, 5, 6))
    micro = int((match[7] or "").ljust(6, "0"))
    return _datetime_micros(year, month, day, hour, minute, second, micro)


def _bits_text(length: int) -> Converter:
    """bytes (big-endian, as PyMySQL gives BIT) -> the bit string of ``length`` bits."""
    return lambda value: format(int.from_bytes(value, "big"), f"0{length}b")


def _bytes(value: Any) -> bytes:
    """A binary value; pymysqlreplication gives an empty one as ``''`` (CPython decodes empty
    bytes to ``''`` without looking the pretend codec 'binary' up)."""
    if isinstance(value, str):
        return value.encode("latin-1")
    return bytes(value)


def _pad(length: int) -> Converter:
    return lambda value: _bytes(value).ljust(length, b"\0")


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.UTC)


# ----------------------------------------------------------------------------- snapshot

def snapshot_converter(column: MyColumn) -> Converter | None:
    """PyMySQL value (default conversions, :data:`SNAPSHOT_CONNECT_ARGS`, the column read with
    :func:`snapshot_expression`) -> the value ``column_type(column).to_avro`` takes; ``None``
    when the value is right as it is. Never called for NULL."""
    ctype = column_type(column)
    kind = column.data_type.lower()
    if ctype.name == "boolean":
        return lambda value: value != b"\0" and value not in (0, "0")
    if ctype.name == "bits":
        return _bits_text(ctype.precision or 1)
    if kind == "binary" and column.precision:
        return _pad(column.precision)  # PyMySQL already has the padding; kept for safety
    if kind == "date":
        def date(value: Any) -> Any:
            if isinstance(value, dt.date):
                return value
            micros = _text_micros(value)
            return None if micros is None else _date_value(micros // DAY_MICROS)
        return date
    if kind in ("datetime", "timestamp"):
        aware = kind == "timestamp"

        def moment(value: Any) -> Any:
            if isinstance(value, dt.datetime):
                return _utc(value) if aware else value
            return _text_micros(value)  # int micros (year 0) or None (zero dates)
        return moment
    if kind == "set":
        return None  # MySQL's text is already the members in definition order
    if kind == "json":
        return lambda value: value if isinstance(value, str) else bytes(value).decode()
    return None


# ------------------------------------------------------------------------------- binlog

def binlog_converter(column: MyColumn) -> Converter | None:
    """pymysqlreplication row value -> the same value :func:`snapshot_converter` gives.

    Expects the table map to have gone through :func:`prepare_table_map` (temporal and SET
    columns as raw bit strings, text columns as raw bytes); the values pymysqlreplication
    decodes itself are taken too, with their quirks normalised where that is possible."""
    ctype = column_type(column)
    kind = column.data_type.lower()
    if ctype.name == "boolean":
        return lambda value: value in ("1", 1, True)
    if ctype.name == "bits":
        length = ctype.precision or 1
        return lambda value: value.zfill(length) if isinstance(value, str) else (
            _bits_text(length)(value))
    if kind in ("int", "integer", "tinyint", "smallint", "mediumint", "bigint", "decimal",
                "numeric", "double", "float", "real", "enum"):
        return None
    if kind == "year":
        return lambda value: 0 if value == 1900 else value  # YEAR 0000 is stored as 0
    if kind in TEXT_TYPES or (kind == "json" and column.charset not in (None, "binary")):
        # MariaDB's JSON is a LONGTEXT: its text, as stored
        decode = python_decoder(column)
        strip = kind == "char"

        def text(value: Any) -> Any:
            if isinstance(value, bytes | bytearray):
                value = decode(bytes(value))
            return value.rstrip(" ") if strip else value
        return text
    if kind == "json":  # MySQL's binary JSON, parsed by pymysqlreplication
        return lambda value: value if isinstance(value, str) else mysql_json_text(value)
    if kind in BINARY_TYPES:
        if kind == "binary" and column.precision:
            return _pad(column.precision)  # the binlog drops BINARY(n)'s trailing zero bytes
        return _bytes
    if kind == "uuid":
        return lambda value: str(uuid.UUID(bytes=_bytes(value).ljust(16, b"\0")))
    if kind == "inet6":
        return lambda value: inet6_text(_bytes(value).ljust(16, b"\0"))
    if kind == "inet4":
        return lambda value: ".".join(str(b) for b in _bytes(value).ljust(4, b"\0"))
    if kind == "set":
        members = column.values

        def enumset(value: Any) -> Any:
            if isinstance(value, str):  # raw bitmask bytes, little-endian
                mask = int.from_bytes(_raw(value), "little")
                return ",".join(m for i, m in enumerate(members) if mask >> i & 1)
            return ctype.to_avro(value)  # pymysqlreplication's set of members
        return enumset
    if kind == "date":
        return lambda value: _raw_date(_raw(value)) if isinstance(value, str) else value
    if kind == "datetime":
        return lambda value: (_raw_datetime(_raw(value)) if isinstance(value, str)
                              else value)
    if kind == "timestamp":
        def timestamp(value: Any) -> Any:
            if isinstance(value, str):
                return _raw_timestamp(_raw(value))
            if value == dt.datetime(1970, 1, 1):  # 0: the zero TIMESTAMP (min is 00:00:01)
                return None
            return _utc(value) if value.tzinfo is None else value
        return timestamp
    if kind == "time":
        return lambda value: _raw_time(_raw(value)) if isinstance(value, str) else value
    return None


def _raw(bit_string: str) -> bytes:
    """The bytes a raw column (read as BIT by :func:`prepare_table_map`) held, in order."""
    return int(bit_string, 2).to_bytes(len(bit_string) // 8, "big")


def _fraction(raw: bytes) -> int:
    """Microseconds of a temporal's fractional bytes (1: hundredths, 2: 1/10000 s, 3: µs)."""
    if not raw:
        return 0
    return int.from_bytes(raw, "big") * (10_000, 100, 1)[len(raw) - 1]


def _raw_date(raw: bytes) -> Any:
    packed = int.from_bytes(raw, "little")
    days = _date_days(packed >> 9, packed >> 5 & 0xF, packed & 0x1F)
    return None if days is None else _date_value(days)


def _raw_datetime(raw: bytes) -> Any:
    """DATETIME2: 1 sign bit, 17 bits year*13+month, 5 day, 5 hour, 6 minute, 6 second
    (big-endian), then the fraction: int micros since the epoch, or None for zero dates."""
    packed = int.from_bytes(raw[:5], "big") - (1 << 39)
    year_month = packed >> 22 & 0x1FFFF
    return _datetime_micros(year_month // 13, year_month % 13, packed >> 17 & 0x1F,
                            packed >> 12 & 0x1F, packed >> 6 & 0x3F, packed & 0x3F,
                            _fraction(raw[5:]))


def _raw_timestamp(raw: bytes) -> Any:
    seconds = int.from_bytes(raw[:4], "big")
    if seconds == 0:
        return None  # the zero TIMESTAMP '0000-00-00 00:00:00'
    return (dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
            + dt.timedelta(seconds=seconds, microseconds=_fraction(raw[4:])))


def _raw_time(raw: bytes) -> dt.timedelta:
    """TIME2: the packed value ``±(hour<<12 | minute<<6 | second) << fraction bits | fraction``
    plus an offset of half the range (big-endian); negative values are the two's complement of
    the whole, fraction included (pymysqlreplication splits them and gets some wrong)."""
    frac_bytes = len(raw) - 3
    packed = int.from_bytes(raw, "big") - (1 << (8 * len(raw) - 1))
    sign = -1 if packed < 0 else 1
    packed = abs(packed)
    hms = packed >> (8 * frac_bytes)
    fraction = _fraction((packed & ((1 << (8 * frac_bytes)) - 1)).to_bytes(frac_bytes, "big"))
    micros = (((hms >> 12 & 0x3FF) * 60 + (hms >> 6 & 0x3F)) * 60 + (hms & 0x3F)) * 1_000_000
    return sign * dt.timedelta(microseconds=micros + fraction)


# --------------------------------------------------------------------------- charsets

def _mysql_latin1_table() -> str:
    """MySQL's latin1 is cp1252 with its 5 holes (0x81, 0x8D, 0x8F, 0x90, 0x9D) mapped to the
    same code points: Python's cp1252 refuses those bytes, Python's latin-1 misreads 0x80-0x9F."""
    chars = []
    for byte in range(256):
        try:
            chars.append(bytes([byte]).decode("cp1252"))
        except UnicodeDecodeError:
            chars.append(chr(byte))
    return "".join(chars)


_LATIN1 = _mysql_latin1_table()

#: MySQL character set -> Python codec (None: our own latin1 table)
CHARSET_CODECS: dict[str, str | None] = {
    "utf8mb4": "utf-8", "utf8mb3": "utf-8", "utf8": "utf-8", "ascii": "ascii",
    "latin1": None, "latin2": "iso8859_2", "latin5": "iso8859_9", "latin7": "iso8859_13",
    "greek": "iso8859_7", "hebrew": "iso8859_8", "cp1250": "cp1250", "cp1251": "cp1251",
    "cp1256": "cp1256", "cp1257": "cp1257", "cp850": "cp850", "cp852": "cp852",
    "cp866": "cp866", "cp932": "cp932", "koi8r": "koi8_r", "koi8u": "koi8_u",
    "ucs2": "utf-16-be", "utf16": "utf-16-be", "utf16le": "utf-16-le", "utf32": "utf-32-be",
    "sjis": "shift_jis", "ujis": "euc_jp", "eucjpms": "euc_jp", "gbk": "gbk",
    "gb2312": "gb2312", "gb18030": "gb18030", "big5": "big5", "euckr": "euc_kr",
    "tis620": "tis_620", "macroman": "mac_roman", "macce": "mac_latin2",
}


def python_decoder(column: MyColumn) -> Callable[[bytes], str]:
    """bytes in the column's character set -> str, exactly as the server converts to utf8mb4."""
    charset = (column.charset or "utf8mb4").lower()
    if charset not in CHARSET_CODECS:
        raise CdcError(f"column {column.where} uses the character set {charset}, which "
                       "capture cannot decode from the binlog",
                       "convert the column to utf8mb4 (ALTER TABLE ... CONVERT TO CHARACTER SET "
                       "utf8mb4), or exclude the table")
    codec = CHARSET_CODECS[charset]
    if codec is None:
        return lambda raw: codecs.charmap_decode(raw, "strict", _LATIN1)[0]
    return lambda raw: raw.decode(codec)


# --------------------------------------------------------------------------- INET6, JSON

def inet6_text(raw: bytes) -> str:
    """MariaDB's INET6 text (MySQL's INET6_NTOA): the longest run of zero groups (the first of
    equal runs, even a single group) is ``::``; IPv4-compatible ``::a.b.c.d`` and IPv4-mapped
    ``::ffff:a.b.c.d`` addresses end in dotted quads."""
    words = [int.from_bytes(raw[i:i + 2], "big") for i in range(0, 16, 2)]
    gap_pos, gap_len, run_pos, run_len = -1, 0, -1, 0
    for i, word in enumerate([*words, 1]):  # the sentinel closes a trailing run
        if word == 0:
            if run_pos < 0:
                run_pos, run_len = i, 0
            run_len += 1
        elif run_pos >= 0:
            if run_len > gap_len:
                gap_pos, gap_len = run_pos, run_len
            run_pos = -1
    out = ""
    i = 0
    while i < 8:
        if i == gap_pos:
            out += "::" if i == 0 else ":"
            i += gap_len
            continue
        if i == 6 and gap_pos == 0 and (gap_len == 6 or (gap_len == 5 and words[5] == 0xFFFF)):
            out += ".".join(str(b) for b in raw[12:])
            break
        out += format(words[i], "x") + (":" if i != 7 else "")
        i += 1
    return out


def _json_double(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        raise CdcError(f"JSON double {value} has no JSON text", "this is a bug; please report it")
    text = repr(value)
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent)}"
    return text


def mysql_json_text(value: Any) -> str:
    """MySQL 8's text for a binary JSON value as pymysqlreplication parses it (dicts keyed by
    bytes, strings as bytes): ``{"a": 1, "b": [1, 2]}``, ``", "`` and ``": "`` separators, keys
    in stored order (MySQL sorts them), as ``SELECT json_col`` prints it."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{mysql_json_text(key)}: {mysql_json_text(item)}"
                               for key, item in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(mysql_json_text(item) for item in value) + "]"
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8")
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _json_double(value)
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime):
        return json.dumps(value.isoformat(sep=" ", timespec="microseconds"))
    if isinstance(value, dt.date | dt.time):
        return json.dumps(value.isoformat())
    raise CdcError(f"cannot turn the binlog JSON value {value!r} into JSON text",
                   "partial JSON updates (binlog_row_value_options=PARTIAL_JSON) are not "
                   "supported: set binlog_row_value_options='' on the server")


def mariadb_json_columns(check_clauses: Iterable[str]) -> set[str]:
    """The columns a MariaDB table's JSON alias made: MariaDB's JSON is LONGTEXT with the check
    ``json_valid(`col`)`` (information_schema.CHECK_CONSTRAINTS.CHECK_CLAUSE); the catalog
    gives those columns ``data_type='json'``."""
    found = set()
    for clause in check_clauses:
        match = re.fullmatch(r"\s*json_valid\(`((?:[^`]|``)+)`\)\s*", clause or "")
        if match:
            found.add(match[1].replace("``", "`"))
    return found


# ------------------------------------------------------------------------ binlog table maps

#: pymysqlreplication FIELD_TYPE codes
_TINY, _SHORT, _LONG, _FLOAT, _DOUBLE, _TIMESTAMP, _LONGLONG, _INT24 = 1, 2, 3, 4, 5, 7, 8, 9
_DATE, _TIME, _DATETIME, _YEAR, _NEWDATE, _VARCHAR, _BIT = 10, 11, 12, 13, 14, 15, 16
_TIMESTAMP2, _DATETIME2, _TIME2 = 17, 18, 19
_JSON, _NEWDECIMAL, _ENUM, _SET, _BLOB, _VAR_STRING, _STRING, _GEOMETRY = (
    245, 246, 247, 248, 252, 253, 254, 255)
_SIMPLE = {_TINY: "tinyint", _SHORT: "smallint", _INT24: "mediumint", _LONG: "int",
           _LONGLONG: "bigint", _FLOAT: "float", _DOUBLE: "double", _NEWDECIMAL: "decimal",
           _DATE: "date", _NEWDATE: "date", _TIME: "time", _TIME2: "time",
           _DATETIME: "datetime", _DATETIME2: "datetime", _TIMESTAMP: "timestamp",
           _TIMESTAMP2: "timestamp", _YEAR: "year", _JSON: "json", _ENUM: "enum", _SET: "set",
           _BIT: "bit", _GEOMETRY: "geometry"}
_BLOBS = {1: ("tinytext", "tinyblob"), 2: ("text", "blob"), 3: ("mediumtext", "mediumblob"),
          4: ("longtext", "longblob")}


def _charset_of(collation: str | None) -> str | None:
    if not collation:
        return None
    return "binary" if collation == "binary" else collation.split("_", 1)[0]


def columns_from_table_map(table_map_event: Any) -> list[MyColumn]:
    """What a binlog ``TableMapEvent`` (``binlog_row_metadata=FULL``) says about its columns:
    names, base types, signedness, charset, enum/set values, precision/scale/fsp, nullability
    and the primary key. A table map cannot tell UUID, INET6 and BINARY(16) apart (all three are
    ``binary(16)``), nor MariaDB's JSON from LONGTEXT, nor generated columns from others:
    :func:`refine` takes those from information_schema."""
    table = f"{table_map_event.schema}.{table_map_event.table}"
    nulls = bytes(table_map_event.null_bitmask)
    out = []
    for index, col in enumerate(table_map_event.columns):
        original = getattr(col, "cdc_original", None) or {}
        code = original.get("type", col.type)
        strings = code in (_VARCHAR, _VAR_STRING, _STRING, _BLOB)
        charset = (_charset_of(col.collation_name) if strings or code in (_ENUM, _SET)
                   else None)
        if strings and charset is None:
            charset = "binary"
        binary = charset == "binary"
        precision: int | None = None
        scale: int | None = None
        values: tuple[str, ...] = ()
        if code in (_VARCHAR, _VAR_STRING):
            kind = "varbinary" if binary else "varchar"
            precision = col.max_length
        elif code == _STRING:
            kind = "binary" if binary else "char"
            precision = col.max_length
        elif code == _BLOB:
            kind = _BLOBS.get(col.length_size, ("longtext", "longblob"))[1 if binary else 0]
        elif code in _SIMPLE:
            kind = _SIMPLE[code]
        else:
            raise CdcError(f"column {table}.{col.name} has the binlog type code {code}, which "
                           "capture does not know: unsupported type",
                           "exclude the table from the source's `tables`")
        if code == _NEWDECIMAL:
            precision, scale = col.precision, col.decimals
        elif code == _BIT:
            precision = original.get("bits", getattr(col, "bits", None))
        elif code in (_TIME2, _DATETIME2, _TIMESTAMP2):
            scale = original.get("fsp", col.fsp)
        elif code in (_TIME, _DATETIME, _TIMESTAMP):
            scale = 0
        if code == _ENUM:
            values = tuple((col.enum_values or [""])[1:])
        elif code == _SET:
            values = tuple(col.set_values or ())
        out.append(MyColumn(
            name=col.name, data_type=kind, unsigned=bool(col.unsigned), precision=precision,
            scale=scale, charset=charset, values=values,
            nullable=bool(nulls[index // 8] >> (index % 8) & 1),
            primary_key=bool(col.is_primary), table=table))
    return out


def prepare_table_map(table_map_event: Any) -> list[MyColumn]:
    """Call on every ``TableMapEvent`` before reading the rows of the events it maps: returns
    :func:`columns_from_table_map`, then makes pymysqlreplication read some columns raw, for
    :func:`binlog_converter` to decode exactly:

    * DATE, TIME(fsp), DATETIME(fsp), TIMESTAMP(fsp) and SET columns are read as BIT strings of
      their stored bytes (pymysqlreplication gets negative TIMEs with fractions wrong, year-0
      dates become None, and an empty SET becomes None, like NULL);
    * text columns come as bytes (pymysqlreplication decodes latin1 as cp1252 and fails on the
      bytes 0x81, 0x8D, 0x8F, 0x90 and 0x9D, and returns raw bytes for charsets it cannot
      name anyway).

    The event's ``Column`` objects are the ones its rows events read with; the originals are
    kept in ``column.cdc_original``. Idempotent."""
    columns = columns_from_table_map(table_map_event)
    for col in table_map_event.columns:
        if getattr(col, "cdc_original", None):
            continue
        size = None
        if col.type == _DATE:
            size = 3
        elif col.type in (_TIME2, _DATETIME2, _TIMESTAMP2):
            size = {_TIME2: 3, _DATETIME2: 5, _TIMESTAMP2: 4}[col.type] + (col.fsp + 1) // 2
        elif col.type == _SET:
            size = col.size
        if size is not None:
            col.cdc_original = {"type": col.type, "fsp": getattr(col, "fsp", None)}
            col.type, col.bits, col.bytes = _BIT, 8 * size, size
        elif (col.type in (_VARCHAR, _VAR_STRING, _STRING, _BLOB)
              and _charset_of(col.collation_name) not in (None, "binary")):
            col.cdc_original = {"type": col.type, "character_set_name": col.character_set_name}
            col.character_set_name = "binary"  # pymysqlreplication: no such codec -> bytes
    return columns


_FAMILIES = {"uuid": "binary", "inet6": "binary", "inet4": "binary", "json": "longtext",
             "integer": "int", "numeric": "decimal", "real": "double", "bool": "tinyint",
             "boolean": "tinyint"}


def _family(data_type: str) -> str:
    kind = data_type.lower()
    return _FAMILIES.get(kind, kind)


def refine(binlog_columns: Sequence[MyColumn], info_schema_columns: Sequence[MyColumn]
           ) -> list[MyColumn]:
    """The binlog's columns, each replaced by information_schema's description when the two
    agree on position, name and base type (so UUID, INET6, MariaDB JSON and generated columns
    get their real types); a column that disagrees (the table changed since information_schema
    was read) keeps the binlog's description. The binlog's primary key and nullability win."""
    out = []
    for index, column in enumerate(binlog_columns):
        info = info_schema_columns[index] if index < len(info_schema_columns) else None
        if (info is not None and info.name == column.name
                and (_family(info.data_type) == _family(column.data_type)
                     or _json_longtext(info, column))):
            out.append(replace(info, primary_key=column.primary_key or info.primary_key,
                               nullable=column.nullable, charset=column.charset,
                               table=info.table or column.table))
        else:
            out.append(column)
    return out


def _json_longtext(info: MyColumn, binlog: MyColumn) -> bool:
    """MariaDB JSON (a LONGTEXT) may be described as json by the catalog."""
    return info.data_type.lower() == "json" and binlog.data_type in TEXT_TYPES


# ------------------------------------------------------------------- information_schema

#: the columns of a table as :func:`column_from_info_schema` reads them (params: schema, table)
INFO_SCHEMA_COLUMNS_SQL = (
    "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE, "
    "DATETIME_PRECISION, CHARACTER_MAXIMUM_LENGTH, CHARACTER_SET_NAME, EXTRA, IS_NULLABLE, "
    "COLUMN_KEY FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
    "ORDER BY ORDINAL_POSITION")
#: MariaDB's check clauses of a table (params: schema, table), for :func:`mariadb_json_columns`
CHECK_CLAUSES_SQL = (
    "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS "
    "WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s")

_QUOTED = re.compile(r"'((?:[^']|'')*)'")


def _members(column_type_text: str) -> tuple[str, ...]:
    """The members of ``enum('a','b''c')`` / ``set(...)`` (quotes doubled inside)."""
    inner = column_type_text[column_type_text.index("(") + 1:column_type_text.rindex(")")]
    return tuple(match.replace("''", "'")
                 for match in _QUOTED.findall(inner))


def column_from_info_schema(row: Sequence[Any], table: str = "",
                            json_columns: Iterable[str] = ()) -> MyColumn:
    """A :class:`MyColumn` from one row of :data:`INFO_SCHEMA_COLUMNS_SQL`; ``json_columns``
    (:func:`mariadb_json_columns`) marks MariaDB's JSON columns (LONGTEXT with json_valid)."""
    (name, data_type, type_text, num_precision, num_scale, dt_precision, char_length,
     charset, extra, is_nullable, column_key) = row
    kind = str(data_type).lower()
    type_text = str(type_text)
    if name in set(json_columns) and kind == "longtext":
        kind = "json"
    precision: int | None = None
    scale: int | None = None
    if kind in ("decimal", "numeric", "bit"):
        precision = None if num_precision is None else int(num_precision)
        scale = None if num_scale is None or kind == "bit" else int(num_scale)
    elif kind in ("binary", "char", "varchar", "varbinary"):
        precision = None if char_length is None else int(char_length)
    elif kind in ("datetime", "timestamp", "time"):
        scale = int(dt_precision or 0)
    extra_text = str(extra or "").upper()
    generated = ("VIRTUAL" if "VIRTUAL" in extra_text
                 else "STORED" if "STORED" in extra_text or "PERSISTENT" in extra_text else "")
    return MyColumn(
        name=str(name), data_type=kind, column_type=type_text,
        unsigned="unsigned" in type_text.lower(), precision=precision, scale=scale,
        charset=None if charset is None else str(charset),
        values=_members(type_text) if kind in ("enum", "set") else (),
        generated=generated, nullable=str(is_nullable).upper() == "YES",
        primary_key=str(column_key).upper() == "PRI", table=table)
