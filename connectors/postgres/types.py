"""PostgreSQL types: which logical type each column gets, and how its text form is parsed.

Both the snapshot (COPY text format) and the stream (pgoutput text tuples) hand us the type's
*text output*, produced with the same session settings (:data:`SESSION_OPTIONS`: ISO dates, UTC,
ISO 8601 intervals, full float precision, hex bytea, the C locale's money format), so one parser
per type serves both paths and their encodings cannot differ.

The mapping (documented with every encoding in ``docs/types.md``) follows Debezium's PostgreSQL
connector: ``bit(1)`` is a boolean and ``bit(n)`` Debezium's Bits bytes, ``money`` a decimal with
2 fraction digits, ``interval`` Debezium's ISO 8601 ``Interval`` string, ``timetz`` a UTC
``ZonedTime`` string, ``point`` Debezium's geometry ``Point`` struct, ``xml`` and ``ltree`` strings
with Debezium's semantic names, and every other type (inet, cidr, macaddr, ranges, multiranges,
geometric types, tsvector, extension and composite types...) its text form as a string. Domains
map to their base type; arrays (of any of these, any number of dimensions) to arrays.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from cdc.logical import blank_padded
from cdc.types import DAY_MICROS, ColumnType, Interval, days_from_civil

#: GUCs for every connection whose text output we parse (replication and snapshot alike)
SESSION_OPTIONS = ("-c DateStyle=ISO,YMD -c TimeZone=UTC -c IntervalStyle=iso_8601 "
                   "-c extra_float_digits=3 -c bytea_output=hex -c lc_monetary=C")

Parser = Callable[[str], Any]


def _bool(text: str) -> bool:
    return text == "t"


def _bit1(text: str) -> bool:
    return text == "1"


def _bytea(text: str) -> bytes:
    return bytes.fromhex(text[2:]) if text.startswith("\\x") else text.encode()


def _money(text: str) -> Decimal:
    """``-$1,234.56`` (lc_monetary=C) as ``Decimal('-1234.56')``."""
    negative = text.startswith("-") or text.startswith("(")
    number = Decimal("".join(char for char in text if char.isdigit() or char == "."))
    return -number if negative else number


_DATE = re.compile(r"(\d{4,})-(\d\d)-(\d\d)( BC)?")
_TIMESTAMP = re.compile(
    r"(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
    r"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?( BC)?")
_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?")


def _year(digits: str, bc: str | None) -> int:
    """The astronomical year (1 BC is year 0)."""
    return 1 - int(digits) if bc else int(digits)


def _date(text: str) -> Any:
    """A ``date``; BC dates and years past 9999 (outside Python's range) as days since 1970."""
    if len(text) == 10:
        return dt.date.fromisoformat(text)
    if text in ("infinity", "-infinity"):
        return text
    match = _DATE.fullmatch(text)
    if match is None:
        raise ValueError(f"unexpected date output {text!r}")
    return days_from_civil(_year(match[1], match[4]), int(match[2]), int(match[3]))


def _timestamp(text: str) -> Any:
    """A ``datetime`` (aware for timestamptz); outside Python's years 1-9999, microseconds since
    1970-01-01 00:00 UTC as an ``int``."""
    if text[4:5] == "-" and not text.endswith("BC"):
        return dt.datetime.fromisoformat(text)
    if text in ("infinity", "-infinity"):
        return text
    match = _TIMESTAMP.fullmatch(text)
    if match is None:
        raise ValueError(f"unexpected timestamp output {text!r}")
    days = days_from_civil(_year(match[1], match[12]), int(match[2]), int(match[3]))
    seconds = days * 86_400 + (int(match[4]) * 60 + int(match[5])) * 60 + int(match[6])
    if match[8]:
        offset = (int(match[9]) * 60 + int(match[10] or 0)) * 60 + int(match[11] or 0)
        seconds -= offset if match[8] == "+" else -offset
    return seconds * 1_000_000 + int((match[7] or "").ljust(6, "0"))


def _time(text: str) -> Any:
    if text.startswith("24:"):  # PostgreSQL allows 24:00:00, a datetime.time does not
        return dt.timedelta(days=1)
    return dt.time.fromisoformat(text)


def _timetz(text: str) -> int:
    """Microseconds since midnight UTC (the offset applied, modulo a day)."""
    match = _TIME.fullmatch(text)
    if match is None or not match[5]:
        raise ValueError(f"unexpected timetz output {text!r}")
    local = ((int(match[1]) * 60 + int(match[2])) * 60 + int(match[3])) * 1_000_000 + int(
        (match[4] or "").ljust(6, "0"))
    offset = ((int(match[6]) * 60 + int(match[7] or 0)) * 60 + int(match[8] or 0)) * 1_000_000
    return (local - offset if match[5] == "+" else local + offset) % DAY_MICROS


_INTERVAL = re.compile(r"P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)D)?"
                       r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?)(\d+)(?:\.(\d{1,6}))?S)?)?")


def _interval(text: str) -> Interval:
    """IntervalStyle iso_8601 output (``P1Y2M3DT4H5M6.5S``, ``P-1Y-2M``, ``PT0S``)."""
    match = _INTERVAL.fullmatch(text)
    if match is None:
        raise ValueError(f"unexpected interval output {text!r} (is IntervalStyle iso_8601?)")
    years, months, days, hours, minutes = (int(part or 0) for part in match.groups()[:5])
    seconds = int(match[7] or 0) * 1_000_000 + int((match[8] or "").ljust(6, "0"))
    micros = (hours * 60 + minutes) * 60_000_000 + (-seconds if match[6] else seconds)
    return Interval(years * 12 + months, days, micros)


def _point(text: str) -> tuple[float, float]:
    x, y = text[1:-1].split(",")
    return float(x), float(y)


# How a type's text form goes straight to Avro bytes in the fast row encoder
# (connectors/postgres/rowcodec.py and its compiled twin): every kind but GENERIC writes exactly
# the bytes ``parse`` + ``ColumnType.to_avro`` + the Avro writer would, for the text forms
# PostgreSQL produces under SESSION_OPTIONS, and falls back to GENERIC for anything unusual
# (infinities, BC dates, NaN in a decimal...).
GENERIC, LONG, BOOL, DOUBLE, FLOAT, STRING, UUID, NUMERIC_TEXT, DECIMAL, TIMESTAMPTZ, \
    TIMESTAMP, DATE, BYTEA = range(13)


@dataclass(frozen=True)
class PgType:
    """How one PostgreSQL type maps: the logical type, the text parser, the fast-path kind."""

    column_type: ColumnType
    parse: Parser
    kind: int = GENERIC


#: ``character(n)``'s type OID, and the header PostgreSQL counts in its type modifier (n + 4)
BPCHAR = 1042
VARHDRSZ = 4


def _simple(name: str, parse: Parser, source: str, kind: int = GENERIC) -> PgType:
    return PgType(ColumnType(name, source_type=source), parse, kind)


# OIDs of built-in types (pg_type.dat); stable across versions. Types that need a type modifier
# (numeric, bit, varbit) are in :func:`pg_type`; built-ins not listed here come from the catalog
# as their text form.
BUILTIN: dict[int, PgType] = {
    16: _simple("boolean", _bool, "boolean", BOOL),
    21: _simple("int16", int, "smallint", LONG),
    23: _simple("int32", int, "integer", LONG),
    20: _simple("int64", int, "bigint", LONG),
    26: _simple("int64", int, "oid", LONG),
    700: _simple("float32", float, "real", FLOAT),
    701: _simple("float64", float, "double precision", DOUBLE),
    790: PgType(ColumnType("decimal", 19, 2, source_type="money"), _money),
    25: _simple("string", str, "text", STRING),
    1043: _simple("string", str, "character varying", STRING),
    BPCHAR: _simple("string", str, "character", STRING),
    19: _simple("string", str, "name", STRING),
    18: _simple("string", str, "char", STRING),
    17: _simple("bytes", _bytea, "bytea", BYTEA),
    1082: _simple("date", _date, "date", DATE),
    1083: _simple("time", _time, "time"),
    1266: _simple("timetz", _timetz, "timetz"),
    1114: _simple("timestamp", _timestamp, "timestamp", TIMESTAMP),
    1184: _simple("timestamptz", _timestamp, "timestamptz", TIMESTAMPTZ),
    1186: _simple("interval", _interval, "interval"),
    114: _simple("json", str, "json", STRING),
    3802: _simple("json", str, "jsonb", STRING),
    142: _simple("xml", str, "xml", STRING),
    2950: _simple("uuid", str, "uuid", UUID),
    600: _simple("point", _point, "point"),
    869: _simple("string", str, "inet", STRING),
    650: _simple("string", str, "cidr", STRING),
    829: _simple("string", str, "macaddr", STRING),
    774: _simple("string", str, "macaddr8", STRING),
    3904: _simple("string", str, "int4range", STRING),
    3926: _simple("string", str, "int8range", STRING),
    3906: _simple("string", str, "numrange", STRING),
    3908: _simple("string", str, "tsrange", STRING),
    3910: _simple("string", str, "tstzrange", STRING),
    3912: _simple("string", str, "daterange", STRING),
}
NUMERIC, BIT, VARBIT = 1700, 1560, 1562
#: time and timestamp: their type modifier is the declared fractional-second digits
FRACTIONAL = (1083, 1114)
#: built-ins whose mapping depends on the type modifier
MODIFIED = (NUMERIC, BIT, VARBIT)

#: array type OID -> element type OID, for the built-in arrays (others come from the catalog)
ARRAYS = {1000: 16, 1005: 21, 1007: 23, 1016: 20, 1028: 26, 1021: 700, 1022: 701, 791: 790,
          1009: 25, 1015: 1043, 1014: 1042, 1003: 19, 1002: 18, 1001: 17, 1182: 1082,
          1183: 1083, 1270: 1266, 1115: 1114, 1185: 1184, 1187: 1186, 199: 114, 3807: 3802,
          143: 142, 2951: 2950, 1017: 600, 1041: 869, 651: 650, 1040: 829, 775: 774,
          3905: 3904, 3927: 3926, 3907: 3906, 3909: 3908, 3911: 3910, 3913: 3912,
          1231: NUMERIC, 1561: BIT, 1563: VARBIT, 1020: 603}
#: element types whose arrays separate elements with ';' (typdelim), not ','
SEMICOLON_DELIMITED = {603}  # box

#: extension types with a Debezium semantic type, by type name
EXTENSIONS = {"ltree": "ltree"}


def numeric_type(type_modifier: int) -> PgType:
    """``numeric(p, s)`` from the type modifier; unconstrained numeric when it is -1."""
    if type_modifier < 4:
        return PgType(ColumnType("numeric", source_type="numeric"), Decimal, NUMERIC_TEXT)
    packed = type_modifier - 4
    precision, scale = (packed >> 16) & 0xFFFF, packed & 0xFFFF
    if scale > precision or scale >= 0x8000:  # negative scales (PG 15+) lose nothing as text
        return PgType(ColumnType("numeric", source_type=f"numeric({precision},{scale})"),
                      Decimal, NUMERIC_TEXT)
    return PgType(ColumnType("decimal", precision, scale,
                             source_type=f"numeric({precision},{scale})"), Decimal, DECIMAL)


def bit_type(type_oid: int, type_modifier: int) -> PgType:
    """``bit(1)`` a boolean, ``bit(n)`` Debezium's Bits bytes; ``bit varying`` the bit string
    itself (its length is part of the value, which Bits bytes would lose)."""
    if type_oid == VARBIT or type_modifier < 1:
        shown = "bit varying" if type_oid == VARBIT else "bit"
        if type_modifier > 0:
            shown += f"({type_modifier})"
        return PgType(ColumnType("string", source_type=shown), str, STRING)
    if type_modifier == 1:
        return PgType(ColumnType("boolean", source_type="bit(1)"), _bit1)
    return PgType(ColumnType("bits", precision=type_modifier,
                             source_type=f"bit({type_modifier})"), str)


def parse_array(text: str, element: Parser, delimiter: str = ",") -> list[Any]:
    """A PostgreSQL array literal (``{1,2,NULL}``, ``{{"a b",c},{d,NULL}}``) as nested lists."""
    value, _ = _array(text, 0, element, delimiter)
    return value


def _array(text: str, at: int, element: Parser, delimiter: str) -> tuple[list[Any], int]:
    if text[at] == "[":  # explicit bounds, e.g. [0:1]={1,2}: the bounds are dropped
        at = text.index("=", at) + 1
    assert text[at] == "{"
    at += 1
    items: list[Any] = []
    ends = delimiter + "}"
    while at < len(text):
        char = text[at]
        if char == "}":
            return items, at + 1
        if char == delimiter:
            at += 1
            continue
        if char == "{":
            nested, at = _array(text, at, element, delimiter)
            items.append(nested)
        elif char == '"':
            at += 1
            chunk = []
            while text[at] != '"':
                if text[at] == "\\":
                    at += 1
                chunk.append(text[at])
                at += 1
            at += 1
            items.append(element("".join(chunk)))
        else:
            end = at
            while text[end] not in ends:
                end += 1
            raw = text[at:end].strip()
            items.append(None if raw == "NULL" else element(raw))
            at = end
    raise ValueError(f"unterminated array literal {text!r}")


def pg_type(type_oid: int, type_modifier: int, catalog: dict[int, dict[str, Any]]) -> PgType:
    """The mapping for a column of type ``type_oid``.

    ``catalog`` describes non-built-in types by OID: ``{"kind": "enum", "values": [...]}``,
    ``{"kind": "domain", "base": oid, "base_modifier": n}``,
    ``{"kind": "array", "element": oid, "delimiter": ","}`` or
    ``{"kind": "other", "name": "ltree"}``.
    """
    found = BUILTIN.get(type_oid)
    if found is not None:
        if type_oid == BPCHAR and type_modifier > VARHDRSZ:  # character(n): blank-padded to n
            return PgType(ColumnType("string", source_type=blank_padded(
                type_modifier - VARHDRSZ)), found.parse, found.kind)
        if type_oid in FRACTIONAL and 0 <= type_modifier < 6:
            return PgType(ColumnType(found.column_type.name, type_modifier,
                                     source_type=f"{found.column_type.source_type}"
                                                 f"({type_modifier})"),
                          found.parse, found.kind)
        return found
    if type_oid == NUMERIC:
        return numeric_type(type_modifier)
    if type_oid in (BIT, VARBIT):
        return bit_type(type_oid, type_modifier)
    element_oid = ARRAYS.get(type_oid)
    info = catalog.get(type_oid, {})
    delimiter = ";" if element_oid in SEMICOLON_DELIMITED else ","
    if element_oid is None and info.get("kind") == "array":
        element_oid = int(info["element"])
        delimiter = str(info.get("delimiter") or ",")
    if element_oid is not None:
        # an array's type modifier is its element's: numeric(10,2)[], bit(8)[]
        element = pg_type(element_oid, type_modifier, catalog)
        parse_element = element.parse
        return PgType(ColumnType("array", element=element.column_type,
                                 source_type=f"{element.column_type.source_type}[]"),
                      lambda text: parse_array(text, parse_element, delimiter))
    kind = info.get("kind")
    name = str(info.get("name", type_oid))
    if kind == "enum":
        return PgType(ColumnType("enum", values=tuple(info["values"]), source_type=name), str,
                      STRING)
    if kind == "domain":
        return pg_type(int(info["base"]), int(info.get("base_modifier", -1)), catalog)
    if name in EXTENSIONS:
        return PgType(ColumnType(EXTENSIONS[name], source_type=name), str, STRING)
    # anything else (ranges, geometric types, tsvector, hstore, citext, composites...) travels
    # as its text form
    return PgType(ColumnType("string", source_type=name), str, STRING)
