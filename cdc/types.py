"""Column types: one neutral catalogue that connectors map their database types onto.

Each logical type says three things, in one place, so snapshot and streaming paths can never
disagree: its Avro schema, how a Python value becomes an Avro datum, and how an Avro datum becomes
JSON (``cdc log dump``). Encodings follow Debezium's where Debezium has one; the choices that
Debezium leaves open are stated here and in ``docs/types.md``:

* **unconstrained NUMERIC** (no precision/scale): Avro ``string`` holding the exact decimal text,
  including ``NaN``, ``Infinity`` and ``-Infinity`` (Debezium's ``decimal.handling.mode=string``).
* **NUMERIC(p, s)**: Avro ``bytes`` with ``logicalType: decimal`` (Debezium's ``precise`` mode);
  the special values ``NaN``/``Infinity``/``-Infinity`` go to a second union branch, ``string``.
* **64-bit unsigned integers** (MySQL ``BIGINT UNSIGNED``): ``decimal(20, 0)`` bytes, never a
  wrapped ``long`` (Debezium's ``bigint.unsigned.handling.mode=precise``).
* **timestamp without time zone**: ``long`` microseconds since the epoch
  (``io.debezium.time.MicroTimestamp``); ``infinity`` is ``2**63 - 1`` and ``-infinity`` is
  ``-2**63`` — PostgreSQL's own internal sentinels.
* **timestamp with time zone**: ISO-8601 ``string`` in UTC ending in ``Z``
  (``io.debezium.time.ZonedTimestamp``); infinities are the strings ``infinity``/``-infinity``.
* **date**: ``int`` days since the epoch (``io.debezium.time.Date``); infinities are
  ``2**31 - 1`` and ``-2**31``. Dates and timestamps outside Python's years 1-9999 (PostgreSQL's
  BC dates, years past 9999) are passed as ``int`` days / microseconds since the epoch and print
  as ISO 8601 expanded years (``-0043-03-15`` is 44 BC: astronomical year numbering).
* **interval**: Debezium's ``io.debezium.time.Interval`` string ``P<y>Y<m>M<d>DT<h>H<m>M<s>S``
  (``interval.handling.mode=string``): exact, unlike the approximate ``MicroDuration``.
* **time with time zone**: ``io.debezium.time.ZonedTime`` string in UTC, ``HH:MM:SS.ffffffZ``.
* **arrays** may nest up to :data:`MAX_DIMENSIONS` levels (PostgreSQL's limit): each level's item
  union holds the element type and the next level's array, so one column schema takes 1-D and
  multidimensional values alike.

Avro ``logicalType`` is only used for decimals: dates and times carry Debezium's ``connect.name``
instead, so readers never choke on the infinity sentinels.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import re
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, InvalidOperation
from typing import Any, NamedTuple

from cdc.errors import EncodingError

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
EPOCH = dt.datetime(1970, 1, 1)
EPOCH_DATE = dt.date(1970, 1, 1)
DAY_MICROS = 86_400_000_000
#: the deepest array nesting a column schema takes (PostgreSQL's MAXDIM)
MAX_DIMENSIONS = 6


class Interval(NamedTuple):
    """A PostgreSQL-style interval: its three independent fields, each with its own sign."""

    months: int
    days: int
    micros: int
#: exact arithmetic for any decimal PostgreSQL can hold (131072 digits before the point)
_WIDE = Context(prec=140_000, Emax=MAX_EMAX, Emin=MIN_EMIN)


@dataclass(frozen=True)
class ColumnType:
    """A logical type. ``name`` is one of :data:`TYPE_NAMES`; ``params`` refine it."""

    name: str
    #: decimal: its digits; bits: its length; time and timestamp: the fractional-second digits
    #: the column declares when fewer than six (``None``: six, the most either database keeps) —
    #: what ``log.time_precision: adaptive`` reads (:mod:`cdc.connect`)
    precision: int | None = None
    scale: int | None = None
    #: allowed values of an enum
    values: tuple[str, ...] = ()
    #: element type of an array
    element: ColumnType | None = None
    #: the source database's own name for the type, kept for documentation and schema history
    source_type: str = ""
    #: text ordered by the leader otherwise than by code point, where a follower can order it
    #: the same way: ``icu:<locale>`` (:func:`cdc.logical.icu_collation`); empty otherwise
    collation: str = ""

    def __post_init__(self) -> None:
        if self.name not in _CODECS:
            raise EncodingError(f"unknown column type {self.name!r}",
                                f"use one of: {', '.join(sorted(_CODECS))}")
        if self.name == "array" and self.element is None:
            raise EncodingError("an array type needs an element type")

    def avro(self) -> Any:
        """The Avro schema of a non-null value of this type."""
        return _CODECS[self.name].avro(self)

    def to_avro(self, value: Any) -> Any:
        """The Avro datum for a non-null Python value."""
        return _CODECS[self.name].to_avro(self, value)

    def to_json(self, datum: Any) -> Any:
        """The JSON value for a non-null Avro datum (numerics as strings, times ISO-8601)."""
        return _CODECS[self.name].to_json(self, datum)

    def json_converter(self) -> Callable[[Any], Any] | None:
        """What :meth:`to_json` does as one callable of the datum, or ``None`` when it returns
        every datum unchanged (strings, integers, booleans...): lets a hot loop skip the call."""
        convert = _CODECS[self.name].to_json
        if convert is _as_is:
            return None
        return lambda datum: convert(self, datum)

    def from_json(self, value: Any) -> Any:
        """The Python value of a JSON form made by :meth:`to_json` (used for keys read back)."""
        if value is None:
            return None
        return _from_json(self, value)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.precision is not None:
            out["precision"] = self.precision
        if self.scale is not None:
            out["scale"] = self.scale
        if self.values:
            out["values"] = list(self.values)
        if self.element is not None:
            out["element"] = self.element.describe()
        if self.source_type:
            out["source_type"] = self.source_type
        if self.collation:
            out["collation"] = self.collation
        return out

    @classmethod
    def from_description(cls, data: dict[str, Any]) -> ColumnType:
        element = data.get("element")
        return cls(
            name=data["name"],
            precision=data.get("precision"),
            scale=data.get("scale"),
            values=tuple(data.get("values", ())),
            element=cls.from_description(element) if element else None,
            source_type=data.get("source_type", ""),
            collation=data.get("collation", ""),
        )


def _as_is(_ctype: ColumnType, datum: Any) -> Any:
    return datum



@dataclass(frozen=True)
class _Codec:
    avro: Callable[[ColumnType], Any]
    to_avro: Callable[[ColumnType, Any], Any]
    to_json: Callable[[ColumnType, Any], Any] = field(default=_as_is)


def _fail(ctype: ColumnType, value: Any, why: str = "") -> EncodingError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return EncodingError(
        f"cannot encode {shown} ({type(value).__name__}) as {ctype.name}"
        + (f": {why}" if why else ""),
        "this is a bug in the connector's type mapping; please report it with the column type",
    )


# -- integers and floats -----------------------------------------------------------------------
def _int_codec(bits: int, avro_type: str, connect: str | None) -> _Codec:
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

    def to_avro(ctype: ColumnType, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _fail(ctype, value, f"expected an integer in [{low}, {high}]")
        return value

    schema: Any = {"type": avro_type, "connect.type": connect} if connect else avro_type
    return _Codec(lambda _t: schema, to_avro)


def _float_to_avro(ctype: ColumnType, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise _fail(ctype, value, "expected a number")
    return float(value)


#: the JSON form of a float that JSON has no number for: these strings (:func:`_float_to_json`)
SPECIAL_FLOATS: dict[str, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _float_to_json(_t: ColumnType, datum: Any) -> Any:
    if math.isnan(datum):
        return "NaN"
    if math.isinf(datum):
        return "Infinity" if datum > 0 else "-Infinity"
    return datum


def _boolean_to_avro(ctype: ColumnType, value: Any) -> Any:
    if not isinstance(value, bool):
        raise _fail(ctype, value, "expected a bool")
    return value


# -- decimals ----------------------------------------------------------------------------------
def _as_decimal(ctype: ColumnType, value: Any) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, bool):
        raise _fail(ctype, value, "expected a decimal")
    if isinstance(value, int | str):
        try:
            return Decimal(value)
        except InvalidOperation:
            raise _fail(ctype, value, "not a decimal number") from None
    raise _fail(ctype, value, "expected a Decimal, int or str (never a float: it loses digits)")


def _special(number: Decimal) -> str | None:
    if number.is_nan():
        return "NaN"
    if number.is_infinite():
        return "Infinity" if number > 0 else "-Infinity"
    return None


def _decimal_avro(ctype: ColumnType) -> Any:
    return [
        {"type": "bytes", "logicalType": "decimal", "precision": ctype.precision,
         "scale": ctype.scale or 0},
        "string",
    ]


def _decimal_to_avro(ctype: ColumnType, value: Any) -> Any:
    number = _as_decimal(ctype, value)
    special = _special(number)
    if special:
        return special
    scale = ctype.scale or 0
    quantized = number.quantize(Decimal(1).scaleb(-scale), context=_WIDE)
    if quantized != number:
        raise _fail(ctype, value, f"has more than {scale} fractional digits")
    return quantized


def _decimal_to_json(_t: ColumnType, datum: Any) -> Any:
    return datum if isinstance(datum, str) else format(datum, "f")


def _numeric_to_avro(ctype: ColumnType, value: Any) -> Any:
    number = _as_decimal(ctype, value)
    return _special(number) or format(number, "f")


def _uint64_to_avro(ctype: ColumnType, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise _fail(ctype, value, "expected an integer in [0, 2**64)")
    return Decimal(value)


# -- text, bytes, json, uuid, enum -------------------------------------------------------------
def _string_to_avro(ctype: ColumnType, value: Any) -> Any:
    if not isinstance(value, str):
        raise _fail(ctype, value, "expected a str")
    return value


def _bytes_to_avro(ctype: ColumnType, value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise _fail(ctype, value, "expected bytes")


def _bytes_to_json(_t: ColumnType, datum: Any) -> Any:
    return base64.b64encode(datum).decode("ascii")


def _json_to_avro(ctype: ColumnType, value: Any) -> Any:
    if isinstance(value, str):
        return value  # already JSON text, kept byte for byte as the source sent it
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _fail(ctype, value, str(exc)) from None


def _uuid_to_avro(ctype: ColumnType, value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, str):
        try:
            return str(uuid.UUID(value))
        except ValueError:
            raise _fail(ctype, value, "not a UUID") from None
    raise _fail(ctype, value, "expected a UUID")


# -- dates and times ---------------------------------------------------------------------------
def _infinity(value: Any) -> int:
    """+1 / -1 for the strings 'infinity' / '-infinity' (any case), else 0."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("infinity", "+infinity"):
            return 1
        if text == "-infinity":
            return -1
    return 0


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date; ``year`` is astronomical (0 = 1 BC)."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """(astronomical year, month, day) of ``days`` since 1970-01-01, for any number of days."""
    days += 719_468
    era = days // 146_097
    day_of_era = days - era * 146_097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36_524
                   - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * shifted + 2) // 5 + 1
    month = shifted + 3 if shifted < 10 else shifted - 9
    return year_of_era + era * 400 + (month <= 2), month, day


def _iso_date(days: int) -> str:
    """ISO 8601 date; years outside 0000-9999 in the expanded form (``-0043``, ``+10000``)."""
    year, month, day = civil_from_days(days)
    shown = f"{year:04d}" if 0 <= year <= 9999 else f"+{year}" if year > 0 else f"-{-year:04d}"
    return f"{shown}-{month:02d}-{day:02d}"


def _iso_datetime(micros: int) -> str:
    days, micros = divmod(micros, DAY_MICROS)
    return f"{_iso_date(days)}T{_clock(micros)}"


def _clock(micros: int) -> str:
    seconds, micro = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{hour:02d}:{minute:02d}:{second:02d}.{micro:06d}"


_ISO_DATE = re.compile(r"([+-]?\d{4,})-(\d\d)-(\d\d)")
_ISO_DATETIME = re.compile(r"([+-]?\d{4,})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?Z?")


def _days_of_iso(text: str) -> int:
    match = _ISO_DATE.fullmatch(text)
    if match is None:
        raise ValueError(f"not an ISO 8601 date: {text!r}")
    return days_from_civil(int(match[1]), int(match[2]), int(match[3]))


def _micros_of_iso(text: str) -> int:
    match = _ISO_DATETIME.fullmatch(text)
    if match is None:
        raise ValueError(f"not an ISO 8601 date-time: {text!r}")
    year, month, day, hour, minute, second = (int(part) for part in match.groups()[:6])
    fraction = int((match[7] or "").ljust(6, "0"))
    return (days_from_civil(year, month, day) * 86_400 + (hour * 60 + minute) * 60
            + second) * 1_000_000 + fraction


def _plain_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _date_to_avro(ctype: ColumnType, value: Any) -> Any:
    sign = _infinity(value)
    if sign:
        return INT32_MAX if sign > 0 else INT32_MIN
    if _plain_int(value):
        if not INT32_MIN < value < INT32_MAX:
            raise _fail(ctype, value, "days since 1970 beyond a 32-bit int")
        return value  # days since the epoch already (dates outside Python's years 1-9999)
    if isinstance(value, dt.datetime) or not isinstance(value, dt.date):
        raise _fail(ctype, value, "expected a date")
    return (value - EPOCH_DATE).days


def _date_to_json(_t: ColumnType, datum: Any) -> Any:
    if datum == INT32_MAX:
        return "infinity"
    if datum == INT32_MIN:
        return "-infinity"
    try:
        return (EPOCH_DATE + dt.timedelta(days=datum)).isoformat()
    except OverflowError:
        return _iso_date(datum)


def _time_to_avro(ctype: ColumnType, value: Any) -> Any:
    if isinstance(value, dt.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + (
            value.microsecond
        )
    if isinstance(value, dt.timedelta):  # MySQL TIME can exceed a day; PostgreSQL has 24:00:00
        return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    raise _fail(ctype, value, "expected a time")


def _time_to_json(_t: ColumnType, datum: Any) -> Any:
    sign = "-" if datum < 0 else ""
    return sign + _clock(abs(datum))


def _timetz_to_avro(ctype: ColumnType, value: Any) -> Any:
    """``HH:MM:SS.ffffffZ`` in UTC (Debezium's ZonedTime); an ``int`` is UTC micros already."""
    if _plain_int(value):
        return _clock(value % DAY_MICROS) + "Z"
    if not isinstance(value, dt.time) or value.utcoffset() is None:
        raise _fail(ctype, value, "expected a time with a UTC offset")
    offset = value.utcoffset()
    assert offset is not None
    local = _time_to_avro(ctype, value)
    shift = (offset.days * 86_400 + offset.seconds) * 1_000_000 + offset.microseconds
    return _clock((local - shift) % DAY_MICROS) + "Z"


def _micros_since_epoch(moment: dt.datetime) -> int:
    delta = moment - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _timestamp_to_avro(ctype: ColumnType, value: Any) -> Any:
    sign = _infinity(value)
    if sign:
        return INT64_MAX if sign > 0 else INT64_MIN
    if _plain_int(value):
        if not INT64_MIN < value < INT64_MAX:
            raise _timestamp_out_of_range(value)
        return value  # microseconds since the epoch already
    if not isinstance(value, dt.datetime):
        raise _fail(ctype, value, "expected a datetime")
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return _micros_since_epoch(value)


def _timestamp_out_of_range(micros: int) -> EncodingError:
    """A timestamp (without time zone) the encoding cannot hold: not a bug, a limit."""
    return EncodingError(
        f"timestamp {_iso_datetime(micros)} is out of the encoding's range: a timestamp is a "
        "64-bit count of microseconds since 1970-01-01 (Debezium's MicroTimestamp), which "
        f"holds PostgreSQL's timestamps from 4713 BC only up to {_iso_datetime(INT64_MAX - 1)} "
        "(PostgreSQL accepts them up to 294276-12-31; see docs/types.md)",
        "correct the value in the source table, or change the column to timestamptz or text "
        "(their encodings are strings, without this limit); a change already in the WAL cannot "
        "be skipped: after fixing the table run `cdc bootstrap` again to re-snapshot it")


def _timestamp_to_json(_t: ColumnType, datum: Any) -> Any:
    if datum == INT64_MAX:
        return "infinity"
    if datum == INT64_MIN:
        return "-infinity"
    try:
        moment = EPOCH + dt.timedelta(microseconds=datum)
    except OverflowError:
        return _iso_datetime(datum)
    return moment.isoformat(timespec="microseconds")


def _timestamptz_to_avro(ctype: ColumnType, value: Any) -> Any:
    sign = _infinity(value)
    if sign:
        return "infinity" if sign > 0 else "-infinity"
    if _plain_int(value):
        return _iso_datetime(value) + "Z"  # UTC microseconds since the epoch
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise _fail(ctype, value, "expected a timezone-aware datetime")
    utc = value.astimezone(dt.UTC).replace(tzinfo=None)
    return utc.isoformat(timespec="microseconds") + "Z"


def _toward_zero(value: int, unit: int) -> tuple[int, int]:
    """(quotient, remainder) with the quotient truncated toward zero, as PostgreSQL and Java do."""
    quotient = abs(value) // unit * (1 if value >= 0 else -1)
    return quotient, value - quotient * unit


def interval_text(value: Interval) -> str:
    """Debezium's ``io.debezium.time.Interval`` text: ``P<y>Y<m>M<d>DT<h>H<m>M<s>S``."""
    years, months = _toward_zero(value.months, 12)
    hours, rest = _toward_zero(value.micros, 3_600_000_000)
    minutes, rest = _toward_zero(rest, 60_000_000)
    whole, fraction = divmod(abs(rest), 1_000_000)
    seconds = ("-" if rest < 0 else "") + str(whole) + (
        "." + f"{fraction:06d}".rstrip("0") if fraction else "")
    return f"P{years}Y{months}M{value.days}DT{hours}H{minutes}M{seconds}S"


_INTERVAL_TEXT = re.compile(r"P(-?\d+)Y(-?\d+)M(-?\d+)DT(-?\d+)H(-?\d+)M(-?)(\d+)(?:\.(\d{1,6}))?S")


def parse_interval_text(text: str) -> Interval:
    """The :class:`Interval` of a text made by :func:`interval_text`."""
    match = _INTERVAL_TEXT.fullmatch(text)
    if match is None:
        raise ValueError(f"not an interval text: {text!r}")
    years, months, days, hours, minutes = (int(part) for part in match.groups()[:5])
    seconds = int(match[7]) * 1_000_000 + int((match[8] or "").ljust(6, "0"))
    micros = (hours * 60 + minutes) * 60_000_000 + (-seconds if match[6] else seconds)
    return Interval(years * 12 + months, days, micros)


def _interval_to_avro(ctype: ColumnType, value: Any) -> Any:
    if isinstance(value, Interval):
        return interval_text(value)
    if isinstance(value, dt.timedelta):
        return interval_text(Interval(0, 0, (value.days * 86_400 + value.seconds) * 1_000_000
                                      + value.microseconds))
    raise _fail(ctype, value, "expected an Interval or a timedelta")


# -- bits, geometry ----------------------------------------------------------------------------
def _bits_avro(ctype: ColumnType) -> Any:
    return {"type": "bytes", "connect.name": "io.debezium.data.Bits", "connect.version": 1,
            "connect.parameters": {"length": str(ctype.precision)}}


def _bits_to_avro(ctype: ColumnType, value: Any) -> Any:
    """A bit string (``"0101"``) as Debezium's Bits: the number it spells, little-endian, in
    ceil(length / 8) bytes."""
    if not isinstance(value, str) or not value or value.strip("01"):
        raise _fail(ctype, value, "expected a string of 0s and 1s")
    length = ctype.precision or len(value)
    if len(value) != length:
        raise _fail(ctype, value, f"expected exactly {length} bits")
    return int(value, 2).to_bytes((length + 7) // 8, "little")


def _bits_to_json(ctype: ColumnType, datum: Any) -> Any:
    length = ctype.precision or len(datum) * 8
    return format(int.from_bytes(datum, "little"), f"0{length}b")


_POINT_AVRO = {
    "type": "record", "name": "Point", "namespace": "io.debezium.data.geometry",
    "connect.name": "io.debezium.data.geometry.Point", "connect.version": 1,
    "fields": [
        {"name": "x", "type": "double"},
        {"name": "y", "type": "double"},
        {"name": "wkb", "type": ["null", "bytes"], "default": None},
        {"name": "srid", "type": ["null", "int"], "default": None},
    ],
}
_WKB_POINT = struct.Struct("<BIdd")


def _point_to_avro(ctype: ColumnType, value: Any) -> Any:
    """An ``(x, y)`` tuple (or a dict with x and y) as Debezium's geometry Point struct."""
    if isinstance(value, dict):
        value = (value.get("x"), value.get("y"))
    if not isinstance(value, tuple) or len(value) != 2:
        raise _fail(ctype, value, "expected an (x, y) tuple")
    x, y = (_float_to_avro(ctype, part) for part in value)
    return {"x": x, "y": y, "wkb": _WKB_POINT.pack(1, 1, x, y), "srid": None}


def _point_to_json(_t: ColumnType, datum: Any) -> Any:
    wkb = datum.get("wkb")
    return {"x": _float_to_json(_t, datum["x"]), "y": _float_to_json(_t, datum["y"]),
            "wkb": None if wkb is None else base64.b64encode(wkb).decode("ascii"),
            "srid": datum.get("srid")}


# -- arrays ------------------------------------------------------------------------------------
def _array_avro(ctype: ColumnType) -> Any:
    assert ctype.element is not None
    inner = ctype.element.avro()
    branches = inner if isinstance(inner, list) else [inner]
    items: list[Any] = ["null", *branches]
    if ctype.element.name != "array":  # nested lists are more dimensions of the same element
        for _ in range(MAX_DIMENSIONS - 1):
            items = ["null", *branches, {"type": "array", "items": items}]
    return {"type": "array", "items": items}


def _array_to_avro(ctype: ColumnType, value: Any) -> Any:
    assert ctype.element is not None
    if not isinstance(value, list | tuple):
        raise _fail(ctype, value, "expected a list")
    element = ctype.element
    if element.name == "array":
        return [None if item is None else element.to_avro(item) for item in value]
    return _dimension_to_avro(ctype, element, value, 1)


def _dimension_to_avro(ctype: ColumnType, element: ColumnType, value: Any, depth: int) -> Any:
    if depth > MAX_DIMENSIONS:
        raise _fail(ctype, value, f"more than {MAX_DIMENSIONS} dimensions")
    return [None if item is None
            else _dimension_to_avro(ctype, element, item, depth + 1) if type(item) is list
            else element.to_avro(item) for item in value]


def _array_to_json(ctype: ColumnType, datum: Any) -> Any:
    assert ctype.element is not None
    element = ctype.element
    if element.name == "array":
        return [None if item is None else element.to_json(item) for item in datum]
    return _dimension_to_json(element, datum)


def _dimension_to_json(element: ColumnType, datum: Any) -> Any:
    return [None if item is None
            else _dimension_to_json(element, item) if type(item) is list
            else element.to_json(item) for item in datum]


# -- MySQL SET, YEAR ---------------------------------------------------------------------------
def _enumset_to_avro(ctype: ColumnType, value: Any) -> Any:
    """Debezium's ``io.debezium.data.EnumSet``: the members, comma-joined in definition order.

    A ``str`` is taken as already joined (MySQL's own text, e.g. ``"a,c"``); a set, list or tuple
    of members is joined in the order of ``ctype.values`` (any member not among them is refused).
    """
    if isinstance(value, str):
        return value
    if not isinstance(value, set | frozenset | list | tuple) or not all(
            isinstance(member, str) for member in value):
        raise _fail(ctype, value, "expected a str or a set of member strings")
    members = set(value)
    if not ctype.values:
        return ",".join(sorted(members))
    unknown = members.difference(ctype.values)
    if unknown:
        raise _fail(ctype, value, f"not members of the set: {sorted(unknown)}")
    return ",".join(member for member in ctype.values if member in members)


_YEAR_LOW, _YEAR_HIGH = 0, 9999


def _year_to_avro(ctype: ColumnType, value: Any) -> Any:
    if not _plain_int(value) or not _YEAR_LOW <= value <= _YEAR_HIGH:
        raise _fail(ctype, value, "expected a year number 0-9999")
    return value


def _connect(avro_type: str, name: str) -> Callable[[ColumnType], Any]:
    return lambda _t: {"type": avro_type, "connect.name": name}


_CODECS: dict[str, _Codec] = {
    "boolean": _Codec(lambda _t: "boolean", _boolean_to_avro),
    "int16": _int_codec(16, "int", "int16"),
    "int32": _int_codec(32, "int", None),
    "int64": _int_codec(64, "long", None),
    "uint64": _Codec(
        lambda _t: {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 0,
                    "connect.name": "org.apache.kafka.connect.data.Decimal"},
        _uint64_to_avro,
        lambda _t, d: format(d, "f"),
    ),
    "float32": _Codec(lambda _t: "float", _float_to_avro, _float_to_json),
    "float64": _Codec(lambda _t: "double", _float_to_avro, _float_to_json),
    "decimal": _Codec(_decimal_avro, _decimal_to_avro, _decimal_to_json),
    "numeric": _Codec(_connect("string", "io.debezium.data.VariableScaleDecimal"),
                      _numeric_to_avro),
    "string": _Codec(lambda _t: "string", _string_to_avro),
    "bytes": _Codec(lambda _t: "bytes", _bytes_to_avro, _bytes_to_json),
    "bits": _Codec(_bits_avro, _bits_to_avro, _bits_to_json),
    "json": _Codec(_connect("string", "io.debezium.data.Json"), _json_to_avro),
    "xml": _Codec(_connect("string", "io.debezium.data.Xml"), _string_to_avro),
    "ltree": _Codec(_connect("string", "io.debezium.data.Ltree"), _string_to_avro),
    "uuid": _Codec(_connect("string", "io.debezium.data.Uuid"), _uuid_to_avro),
    "enum": _Codec(
        lambda t: {"type": "string", "connect.name": "io.debezium.data.Enum",
                   "cdc.values": list(t.values)},
        _string_to_avro,
    ),
    "date": _Codec(_connect("int", "io.debezium.time.Date"), _date_to_avro, _date_to_json),
    "time": _Codec(_connect("long", "io.debezium.time.MicroTime"), _time_to_avro, _time_to_json),
    "timetz": _Codec(_connect("string", "io.debezium.time.ZonedTime"), _timetz_to_avro),
    "timestamp": _Codec(_connect("long", "io.debezium.time.MicroTimestamp"), _timestamp_to_avro,
                        _timestamp_to_json),
    "timestamptz": _Codec(_connect("string", "io.debezium.time.ZonedTimestamp"),
                          _timestamptz_to_avro),
    "interval": _Codec(_connect("string", "io.debezium.time.Interval"), _interval_to_avro),
    "point": _Codec(lambda _t: _POINT_AVRO, _point_to_avro, _point_to_json),
    "array": _Codec(_array_avro, _array_to_avro, _array_to_json),
    "enumset": _Codec(
        lambda t: {"type": "string", "connect.name": "io.debezium.data.EnumSet",
                   "cdc.values": list(t.values)},
        _enumset_to_avro,
    ),
    "year": _Codec(_connect("int", "io.debezium.time.Year"), _year_to_avro),
}

TYPE_NAMES = tuple(sorted(_CODECS))


def _from_json(ctype: ColumnType, value: Any) -> Any:
    name = ctype.name
    if name in ("decimal", "numeric", "uint64"):
        number = Decimal(value)
        return int(number) if name == "uint64" else number
    if name == "bytes":
        return base64.b64decode(value)
    if name == "date":
        if _infinity(value):
            return value
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            return _days_of_iso(value)
    if name in ("timestamp", "timestamptz"):
        if _infinity(value):
            return value
        try:
            return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return _micros_of_iso(value)
    if name == "time":
        if value.startswith("24:"):
            return dt.timedelta(days=1)
        return dt.time.fromisoformat(value)
    if name == "timetz":
        return _micros_of_iso("1970-01-01T" + value)
    if name == "interval":
        return parse_interval_text(value)
    if name == "point":
        return tuple(_from_json(ColumnType("float64"), value[axis]) for axis in ("x", "y"))
    if name in ("float32", "float64") and isinstance(value, str):
        return float(value.replace("Infinity", "inf"))
    if name == "array":
        assert ctype.element is not None
        return _array_from_json(ctype.element, value)
    return value


def _array_from_json(element: ColumnType, value: Any) -> Any:
    if element.name == "array":
        return [element.from_json(item) for item in value]
    return [_array_from_json(element, item) if type(item) is list else element.from_json(item)
            for item in value]


_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def canonical_text(value: Any) -> str:
    """A JSON-form value as the text a follower stores: strings as they are, everything else
    (numbers, booleans, lists, objects) as compact JSON."""
    kind = type(value)
    if kind is str:
        return value  # type: ignore[no-any-return]
    if kind is int:
        return str(value)  # what json.dumps gives for an int (bool is not int here)
    if kind is bool:
        return "true" if value else "false"
    if isinstance(value, str):
        return str(value)
    return _COMPACT.encode(value)
