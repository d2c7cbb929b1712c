"""PostgreSQL types: which logical type each column gets, and how its text form is parsed.

Both the snapshot (COPY text format) and the stream (pgoutput text tuples) hand us the type's
*text output*, produced with the same session settings (:data:`SESSION_OPTIONS`: ISO dates, UTC,
full float precision), so one parser per type serves both paths and their encodings cannot
differ.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from cdc.types import ColumnType

#: GUCs for every connection whose text output we parse (replication and snapshot alike)
SESSION_OPTIONS = ("-c DateStyle=ISO,YMD -c TimeZone=UTC -c IntervalStyle=iso_8601 "
                   "-c extra_float_digits=3 -c bytea_output=hex")

Parser = Callable[[str], Any]


def _bool(text: str) -> bool:
    return text == "t"


def _bytea(text: str) -> bytes:
    return bytes.fromhex(text[2:]) if text.startswith("\\x") else text.encode()


def _date(text: str) -> Any:
    if text in ("infinity", "-infinity"):
        return text
    return dt.date.fromisoformat(text)


def _timestamp(text: str) -> Any:
    if text in ("infinity", "-infinity"):
        return text
    return dt.datetime.fromisoformat(text)


def _time(text: str) -> dt.time:
    return dt.time.fromisoformat(text)


@dataclass(frozen=True)
class PgType:
    """How one PostgreSQL type maps: the logical type and the text parser."""

    column_type: ColumnType
    parse: Parser


def _simple(name: str, parse: Parser, source: str) -> PgType:
    return PgType(ColumnType(name, source_type=source), parse)


# OIDs of built-in types (pg_type.dat); stable across versions.
BUILTIN: dict[int, PgType] = {
    16: _simple("boolean", _bool, "boolean"),
    21: _simple("int16", int, "smallint"),
    23: _simple("int32", int, "integer"),
    20: _simple("int64", int, "bigint"),
    26: _simple("int64", int, "oid"),
    700: _simple("float32", float, "real"),
    701: _simple("float64", float, "double precision"),
    25: _simple("string", str, "text"),
    1043: _simple("string", str, "character varying"),
    1042: _simple("string", str, "character"),
    19: _simple("string", str, "name"),
    18: _simple("string", str, "char"),
    17: _simple("bytes", _bytea, "bytea"),
    1082: _simple("date", _date, "date"),
    1083: _simple("time", _time, "time"),
    1114: _simple("timestamp", _timestamp, "timestamp"),
    1184: _simple("timestamptz", _timestamp, "timestamptz"),
    114: _simple("json", str, "json"),
    3802: _simple("json", str, "jsonb"),
    2950: _simple("uuid", str, "uuid"),
}

#: array type OID -> element type OID, for the built-in arrays we map
ARRAYS = {1000: 16, 1005: 21, 1007: 23, 1016: 20, 1021: 700, 1022: 701, 1009: 25, 1015: 1043,
          1014: 1042, 1001: 17, 1182: 1082, 1115: 1114, 1185: 1184, 2951: 2950, 1231: 1700,
          199: 114, 3807: 3802}


def numeric_type(type_modifier: int) -> PgType:
    """``numeric(p, s)`` from the type modifier; unconstrained numeric when it is -1."""
    if type_modifier < 4:
        return PgType(ColumnType("numeric", source_type="numeric"), Decimal)
    packed = type_modifier - 4
    precision, scale = (packed >> 16) & 0xFFFF, packed & 0xFFFF
    if scale > precision or scale >= 0x8000:  # negative scales (PG 15+) lose nothing as text
        return PgType(ColumnType("numeric", source_type=f"numeric({precision},{scale})"),
                      Decimal)
    return PgType(ColumnType("decimal", precision, scale,
                             source_type=f"numeric({precision},{scale})"), Decimal)


def parse_array(text: str, element: Parser) -> list[Any]:
    """A PostgreSQL array literal (``{1,2,NULL}``, ``{{"a b",c},{d,NULL}}``) as nested lists."""
    value, _ = _array(text, 0, element)
    return value


def _array(text: str, at: int, element: Parser) -> tuple[list[Any], int]:
    if text[at] == "[":  # explicit bounds, e.g. [0:1]={1,2}: the bounds are dropped
        at = text.index("=", at) + 1
    assert text[at] == "{"
    at += 1
    items: list[Any] = []
    while at < len(text):
        char = text[at]
        if char == "}":
            return items, at + 1
        if char == ",":
            at += 1
            continue
        if char == "{":
            nested, at = _array(text, at, element)
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
            while text[end] not in ",}":
                end += 1
            raw = text[at:end].strip()
            items.append(None if raw == "NULL" else element(raw))
            at = end
    raise ValueError(f"unterminated array literal {text!r}")


def pg_type(type_oid: int, type_modifier: int, catalog: dict[int, dict[str, Any]]) -> PgType:
    """The mapping for a column of type ``type_oid``.

    ``catalog`` describes non-built-in types by OID: ``{"kind": "enum", "values": [...]}``,
    ``{"kind": "domain", "base": oid, "base_modifier": n}``,
    ``{"kind": "array", "element": oid}`` or ``{"kind": "other", "name": "ltree"}``.
    """
    if type_oid == 1700:
        return numeric_type(type_modifier)
    found = BUILTIN.get(type_oid)
    if found is not None:
        return found
    element_oid = ARRAYS.get(type_oid)
    info = catalog.get(type_oid, {})
    if element_oid is None and info.get("kind") == "array":
        element_oid = int(info["element"])
    if element_oid is not None:
        element = pg_type(element_oid, -1 if element_oid != 1700 else type_modifier, catalog)
        parse_element = element.parse
        return PgType(ColumnType("array", element=element.column_type,
                                 source_type=f"{element.column_type.source_type}[]"),
                      lambda text: parse_array(text, parse_element))
    kind = info.get("kind")
    if kind == "enum":
        return PgType(ColumnType("enum", values=tuple(info["values"]),
                                 source_type=str(info.get("name", "enum"))), str)
    if kind == "domain":
        return pg_type(int(info["base"]), int(info.get("base_modifier", -1)), catalog)
    # anything else (ltree, inet, ranges, ...) travels as its text form
    return PgType(ColumnType("string", source_type=str(info.get("name", type_oid))), str)
