"""Column types of a view's state and the JSON form of the view's values.

The base tables' state (``views/state.py``) types each column by its logical kind
(``cdc/logical.py``) in the topic's newest Avro value schema, so that the view's SQL computes as
on the leader (sums of decimals stay exact, dates compare as dates). Change rows arrive as JSON
forms (``docs/types.md``) and are cast from their text in DuckDB (:func:`duckdb_type`):

=====================================================  =================================
logical kind (column types)                            state column
=====================================================  =================================
BOOLEAN                                                BOOLEAN
INT16, INT32, INT64 (year too)                         BIGINT
FLOAT64 (float32 too)                                  DOUBLE
DECIMAL(p, s), p <= 38 (uint64: 20, 0; also NaN)       DECIMAL(p, s)
DECIMAL(p, s), p > 38                                  DOUBLE (approximate)
NUMERIC (unconstrained)                                DOUBLE (approximate)
DATE                                                   DATE
TIMESTAMP                                              TIMESTAMP
TIMESTAMPTZ                                            TIMESTAMPTZ (the state's time zone: UTC)
any other (text, JSON, uuid, times, arrays, ...)       VARCHAR (the JSON form's text)
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

from cdc.logical import Logical, LogicalKind
from views.postgres_decimals import define_macros

#: ``cdc verify --view``: |a - b| <= this * max(|a|, |b|) for approximate columns
RELATIVE_TOLERANCE = 1e-9


#: logical kind -> state column type (DECIMAL: :func:`duckdb_type`; any other: VARCHAR)
_TYPES = {LogicalKind.BOOLEAN: "BOOLEAN", LogicalKind.INT16: "BIGINT",
          LogicalKind.INT32: "BIGINT", LogicalKind.INT64: "BIGINT",
          LogicalKind.FLOAT64: "DOUBLE", LogicalKind.NUMERIC: "DOUBLE",
          LogicalKind.DATE: "DATE", LogicalKind.TIMESTAMP: "TIMESTAMP",
          LogicalKind.TIMESTAMPTZ: "TIMESTAMPTZ"}


#: the write-ahead log's size at which DuckDB checkpoints a view's state (a state held open
#: between batches checkpoints when this much was written, and at close: views/host.py)
CHECKPOINT_THRESHOLD = "64MB"


def set_up_state(db: Any, time_zone: str = "UTC", memory_limit: str | None = None) -> Any:
    """``db`` (a DuckDB connection to a view's state) set up as every one is: ``timestamptz``
    values computed in the view's ``time_zone`` (``extract``, ``date_trunc``, comparisons with
    a ``timestamp`` literal), as ``cdc verify``'s leader session computes them, and
    PostgreSQL's exact quotient defined (``views/postgres_decimals.py``); at most
    ``memory_limit`` of memory (the view's: DuckDB's own default is 80% of the machine *per
    database*, and one process holds many views' states; past it DuckDB spills to
    ``<state>.tmp``). Returns ``db``."""
    db.execute("SET TimeZone = ?", [time_zone])
    if memory_limit is not None:
        db.execute("SET memory_limit = ?", [memory_limit])
    db.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
    define_macros(db)
    db.execute(ELAPSED_MACRO)
    return db


#: PostgreSQL's ``timestamptz`` difference (``views/definition.py``: ``_postgres_elapsed``):
#: the elapsed microseconds, as whole days (toward zero) and the rest
ELAPSED_MACRO = (
    "CREATE OR REPLACE TEMP MACRO cdc_pg_elapsed(a, b) AS "
    "to_days(CAST((epoch_us(CAST(a AS TIMESTAMPTZ)) - epoch_us(CAST(b AS TIMESTAMPTZ))) "
    "// 86400000000 AS INTEGER)) + to_microseconds((epoch_us(CAST(a AS TIMESTAMPTZ)) - "
    "epoch_us(CAST(b AS TIMESTAMPTZ))) % 86400000000)")


def duckdb_type(logical: Logical) -> str:
    """The state column type of a column of logical kind ``logical`` (the module docstring)."""
    if logical.kind is LogicalKind.DECIMAL and (logical.precision or 0) <= 38:
        return f"DECIMAL({logical.precision},{logical.scale or 0})"
    if logical.kind is LogicalKind.DECIMAL:
        return "DOUBLE"
    return _TYPES.get(logical.kind, "VARCHAR")


def follower_kind(state_type: str) -> LogicalKind:
    """The logical kind of a view column's values in its followers, from its DuckDB type: its
    JSON form's kind, as :func:`cdc.logical.guess_kind` names it for the values (booleans,
    integers and floats as themselves; decimals, dates and everything else as text)."""
    name = state_type.upper().split("(")[0].strip()
    if name == "BOOLEAN":
        return LogicalKind.BOOLEAN
    if name in _INTEGERS:
        return LogicalKind.INT64
    if name in ("DOUBLE", "FLOAT", "REAL"):
        return LogicalKind.FLOAT64
    return LogicalKind.TEXT


_INTEGERS = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT",
                       "UINTEGER"})


def json_form(value: Any) -> Any:
    """A query result value (DuckDB's or the leader driver's) in the JSON form followers
    store: decimals as their text, floats as numbers (NaN/Infinity as strings), dates and
    timestamps as ISO text with microseconds; a zoned one with its offset in the session's
    time zone (``+01:00``), in UTC as the log shows it (``Z``)."""
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
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        if value.utcoffset():
            return value.isoformat(timespec="microseconds")
        utc = value.replace(tzinfo=None)  # the log's form: UTC, Z
        return utc.isoformat(timespec="microseconds") + "Z"
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="microseconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.time):
        return value.isoformat(timespec="microseconds")
    if isinstance(value, dt.timedelta):
        return iso_duration(value)
    if isinstance(value, bytes | bytearray | memoryview):
        import base64

        return base64.b64encode(bytes(value)).decode()
    return str(value)


def iso_duration(value: dt.timedelta) -> str:
    """An interval of days and time as PostgreSQL prints it under ``IntervalStyle iso_8601``
    (what ``cdc verify`` reads from it): whole days, then hours, minutes and seconds, each
    part signed as the whole and truncated toward zero (``P90DT1H30M``, ``PT-1H``,
    ``PT1.5S``, ``PT0S``) -- the form of a difference of two timestamps."""
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    sign = -1 if micros < 0 else 1
    days, rest = divmod(abs(micros), 86_400_000_000)
    hours, rest = divmod(rest, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds = Decimal(rest).scaleb(-6).normalize()
    time = "".join(f"{sign * amount}{unit}" for amount, unit in ((hours, "H"), (minutes, "M"))
                   if amount)
    if seconds:
        time += f"{'-' if sign < 0 else ''}{seconds:f}S"
    text = "P" + (f"{sign * days}D" if days else "") + (f"T{time}" if time else "")
    return text if text != "P" else "PT0S"


def same_cell(leader: str, follower: str, tolerant: bool) -> bool:
    """Whether two cell texts hold the same value: equal text, equal decimals ("1.50" and
    "1.5"), or — ``tolerant`` — numbers within :data:`RELATIVE_TOLERANCE`, or within half a
    unit of the leader's last decimal place (the leader rounded it to its scale: MariaDB's
    AVG of a DECIMAL keeps 4 more places than the column, the follower's is a double)."""
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
    exponent = a.as_tuple().exponent
    rounded = Decimal(1).scaleb(exponent) / 2 if isinstance(exponent, int) and exponent < 0 \
        else Decimal(0)
    return abs(a - b) <= max(rounded, Decimal(RELATIVE_TOLERANCE) * max(abs(a), abs(b)))
