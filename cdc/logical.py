"""Logical column kinds: what a follower's column holds, decided once for every follower.

Followers type their columns from a column's :class:`Logical` kind, never from the Avro schema
or the values themselves; each keeps only its table from kind to physical type (Delta/Arrow in
``sinks/delta.py``, SQLAlchemy in ``sinks/sql.py``, DuckDB in ``views/types.py``). Stated
exactly:

* **With a schema** (:func:`logical_columns`), a column's kind is :func:`logical_type` of its
  field's ``cdc.type`` (a field without one: ``TEXT``). Column types that every follower stores
  alike share a kind: ``year`` is ``INT32``; ``float32`` is ``FLOAT64`` (its JSON form is the
  float32's exact double); ``uint64`` is ``DECIMAL(20, 0)``; a ``decimal`` without a precision
  is ``NUMERIC``; an ``array`` is ``JSON``; every type not named in :class:`LogicalKind`
  (string, enum, interval, timetz, bits, point...) is ``TEXT``.
* **Without a schema** (a view's topic), :func:`guess_kind` of the values: ``BOOLEAN``,
  ``INT64``, ``FLOAT64`` or ``TEXT``. A float's NaN and infinities are the JSON form's strings
  (:data:`~cdc.types.SPECIAL_FLOATS`), so ``[1.0, "NaN"]`` is ``FLOAT64``; such strings without
  any float (``["NaN"]``) are ``TEXT``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, NamedTuple

from cdc.types import INT64_MAX, INT64_MIN, SPECIAL_FLOATS, ColumnType


class LogicalKind(enum.Enum):
    """What a column holds; its values are JSON forms (``docs/types.md``)."""

    BOOLEAN = "boolean"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    #: a double; NaN and ±Infinity as :data:`~cdc.types.SPECIAL_FLOATS`
    FLOAT64 = "float64"
    #: decimal text with at most ``precision`` digits, exactly ``scale`` after the point
    DECIMAL = "decimal"
    #: decimal text of any precision and scale, also ``NaN`` and ``±Infinity``
    NUMERIC = "numeric"
    DATE = "date"
    TIME = "time"
    TIMESTAMP = "timestamp"
    TIMESTAMPTZ = "timestamptz"
    UUID = "uuid"
    #: a JSON document: a ``json`` column's text, or an array's list
    JSON = "json"
    #: base64 text of the bytes
    BYTES = "bytes"
    #: anything else, held as :func:`~cdc.types.canonical_text` of the JSON form
    TEXT = "text"


class Logical(NamedTuple):
    """A column's logical kind; ``precision`` and ``scale`` are set for ``DECIMAL`` only."""

    kind: LogicalKind
    precision: int | None = None
    scale: int | None = None


#: column type name -> kind, where the name alone decides (any other name: TEXT)
_BY_NAME = {**{kind.value: kind for kind in LogicalKind}, "year": LogicalKind.INT32,
            "float32": LogicalKind.FLOAT64, "array": LogicalKind.JSON}


def logical_type(ctype: ColumnType) -> Logical:
    """The logical kind of a column of type ``ctype`` (see the module docstring)."""
    if ctype.name == "uint64":
        return Logical(LogicalKind.DECIMAL, 20, 0)
    if ctype.name == "decimal" and ctype.precision is not None:
        return Logical(LogicalKind.DECIMAL, ctype.precision, ctype.scale or 0)
    if ctype.name == "decimal":
        return Logical(LogicalKind.NUMERIC)
    return Logical(_BY_NAME.get(ctype.name, LogicalKind.TEXT))


def logical_columns(schema: Any) -> dict[str, Logical]:
    """Column name -> logical kind, in order, of the row record of an envelope value schema
    (:func:`cdc.avro.value_schema`; the original column name: ``cdc.column`` where the Avro name
    was adjusted); empty for anything else."""
    return {field.get("cdc.column", field["name"]): _field_logical(field)
            for field in _row_fields(schema)}


def _row_fields(schema: Any) -> list[dict[str, Any]]:
    """The fields of the row record of an envelope value schema ([] for anything else)."""
    for envelope_field in schema.get("fields", []) if isinstance(schema, dict) else []:
        if envelope_field.get("name") not in ("before", "after"):
            continue
        branches = envelope_field["type"]
        for branch in branches if isinstance(branches, list) else [branches]:
            if isinstance(branch, dict) and branch.get("type") == "record":
                return list(branch["fields"])
    return []


def _field_logical(field: dict[str, Any]) -> Logical:
    described = field.get("cdc.type")
    if not isinstance(described, dict):
        return Logical(LogicalKind.TEXT)
    return logical_type(ColumnType.from_description(described))


def guess_kind(values: Sequence[Any]) -> LogicalKind:
    """The kind of a column without a schema, from its values (JSON forms): ``BOOLEAN`` when
    every non-null value is a bool; ``INT64`` when every one is an int (not a bool) in 64 bits;
    ``FLOAT64`` when every one is a float or a string of :data:`~cdc.types.SPECIAL_FLOATS` and
    one at least is a float; else, and with no non-null value, ``TEXT``."""
    types = set(map(type, values))
    types.discard(type(None))
    if types == {bool}:
        return LogicalKind.BOOLEAN
    if types == {int}:
        fits = all(INT64_MIN <= value <= INT64_MAX for value in values if value is not None)
        return LogicalKind.INT64 if fits else LogicalKind.TEXT
    if float in types and types <= {float, str} and all(
            value in SPECIAL_FLOATS for value in values if type(value) is str):
        return LogicalKind.FLOAT64
    return LogicalKind.TEXT


#: ``source_type`` of a blank-padded column: PostgreSQL's ``character(n)``
_PADDED = "character({})"


def blank_padded(length: int) -> str:
    """The ``source_type`` of a column blank-padded to ``length`` characters (PostgreSQL's
    ``character(n)``: every value holds exactly n characters, trailing blanks added)."""
    return _PADDED.format(length)


def blank_padded_length(ctype: ColumnType) -> int | None:
    """n for a column of PostgreSQL's ``character(n)`` (:func:`blank_padded`), else None. Its
    trailing blanks are insignificant: PostgreSQL compares, groups and converts such values to
    text without them, and gives them back padded to n."""
    source = ctype.source_type or ""
    prefix, _, rest = source.partition("(")
    if prefix != _PADDED.split("(")[0] or not rest.endswith(")") or not rest[:-1].isdigit():
        return None
    return int(rest[:-1])


#: :attr:`ColumnType.collation` of text the leader orders by an ICU locale (PostgreSQL's
#: deterministic ICU collations: ICU's order, ties broken by the bytes)
ICU = "icu:"


def icu_collation(locale: str) -> str:
    """The :attr:`ColumnType.collation` of text ordered by ICU ``locale`` (e.g. ``und``,
    ``de-DE``)."""
    return f"{ICU}{locale}"


def icu_locales(schema: Any) -> dict[str, str]:
    """Column name -> ICU locale of the columns of an envelope value schema whose text the
    leader orders by that locale (:func:`icu_collation`)."""
    out: dict[str, str] = {}
    for field in _row_fields(schema):
        described = field.get("cdc.type")
        collation = described.get("collation", "") if isinstance(described, dict) else ""
        if collation.startswith(ICU):
            out[field.get("cdc.column", field["name"])] = collation[len(ICU):]
    return out


def padded_columns(schema: Any) -> dict[str, int]:
    """Column name -> n of the ``character(n)`` columns of an envelope value schema."""
    out: dict[str, int] = {}
    for field in _row_fields(schema):
        described = field.get("cdc.type")
        if isinstance(described, dict):
            length = blank_padded_length(ColumnType.from_description(described))
            if length is not None:
                out[field.get("cdc.column", field["name"])] = length
    return out
