"""Column types of a view's state and the JSON form of the view's values.

The base tables' state (``views/state.py``) types each column from the topic's newest Avro value
schema, so that the view's SQL computes as on the leader (sums of decimals stay exact, dates
compare as dates). Change rows arrive as JSON forms (``docs/types.md``) and are cast from their
text in DuckDB:

=====================================================  =================================
Avro (logical type / ``connect.name``)                 state column
=====================================================  =================================
``boolean``                                            BOOLEAN
``int``, ``long`` (int16/int32/int64, Year)            BIGINT
``float``, ``double``                                  DOUBLE
``bytes`` decimal(p, s), p <= 38 (also with NaN)       DECIMAL(p, s)
``bytes`` decimal(p, s), p > 38                        DOUBLE (approximate)
VariableScaleDecimal (unconstrained NUMERIC)           DOUBLE (approximate)
``io.debezium.time.Date``                              DATE
``io.debezium.time.MicroTimestamp``                    TIMESTAMP
anything else (text, JSON, uuid, times, arrays, ...)   VARCHAR (the JSON form's text)
=====================================================  =================================

A view column computed in floating point is *approximate* (``views/definition.py``:
``approximate_columns``): ``cdc verify --view`` compares
it with a relative tolerance (:data:`RELATIVE_TOLERANCE`); every other column exactly.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any

#: ``cdc verify --view``: |a - b| <= this * max(|a|, |b|) for approximate columns
RELATIVE_TOLERANCE = 1e-9


def duckdb_type(avro_type: Any) -> str:
    """The state column type of a value schema field (see the module docstring)."""
    branches = avro_type if isinstance(avro_type, list) else [avro_type]
    concrete = [branch for branch in branches if branch != "null"]
    for branch in concrete:  # a decimal (maybe with its NaN/Infinity string branch)
        if isinstance(branch, dict) and branch.get("logicalType") == "decimal":
            precision, scale = int(branch.get("precision", 38)), int(branch.get("scale", 0))
            return f"DECIMAL({precision},{scale})" if precision <= 38 else "DOUBLE"
    if len(concrete) != 1:
        return "VARCHAR"
    single = concrete[0]
    connect = ""
    if isinstance(single, dict):
        connect = str(single.get("connect.name", ""))
        single = single.get("type")
    if connect == "io.debezium.data.VariableScaleDecimal":
        return "DOUBLE"
    if connect == "io.debezium.time.Date":
        return "DATE"
    if connect == "io.debezium.time.MicroTimestamp":
        return "TIMESTAMP"
    if connect:
        return "VARCHAR"
    if single == "boolean":
        return "BOOLEAN"
    if single in ("int", "long"):
        return "BIGINT"
    if single in ("float", "double"):
        return "DOUBLE"
    return "VARCHAR"


def json_form(value: Any) -> Any:
    """A query result value (DuckDB's or the leader driver's) in the JSON form followers
    store: decimals as their text, floats as numbers (NaN/Infinity as strings), dates and
    timestamps as ISO text with microseconds."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="microseconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.time):
        return value.isoformat(timespec="microseconds")
    if isinstance(value, bytes | bytearray | memoryview):
        import base64

        return base64.b64encode(bytes(value)).decode()
    return str(value)


def same_cell(leader: str, follower: str, tolerant: bool) -> bool:
    """Whether two cell texts hold the same value: equal text, equal decimals ("1.50" and
    "1.5"), or — ``tolerant`` — numbers within :data:`RELATIVE_TOLERANCE`."""
    if leader == follower:
        return True
    try:
        a, b = Decimal(leader), Decimal(follower)
    except ArithmeticError:
        return False
    if a == b:
        return True
    if not tolerant or not (a.is_finite() and b.is_finite()):
        return False
    return abs(a - b) <= Decimal(RELATIVE_TOLERANCE) * max(abs(a), abs(b))
