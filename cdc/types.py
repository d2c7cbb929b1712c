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
  ``2**31 - 1`` and ``-2**31``.

Avro ``logicalType`` is only used for decimals: dates and times carry Debezium's ``connect.name``
instead, so readers never choke on the infinity sentinels.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, InvalidOperation
from typing import Any

from cdc.errors import EncodingError

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
EPOCH = dt.datetime(1970, 1, 1)
EPOCH_DATE = dt.date(1970, 1, 1)
#: exact arithmetic for any decimal PostgreSQL can hold (131072 digits before the point)
_WIDE = Context(prec=140_000, Emax=MAX_EMAX, Emin=MIN_EMIN)


@dataclass(frozen=True)
class ColumnType:
    """A logical type. ``name`` is one of :data:`TYPE_NAMES`; ``params`` refine it."""

    name: str
    precision: int | None = None
    scale: int | None = None
    #: allowed values of an enum
    values: tuple[str, ...] = ()
    #: element type of an array
    element: ColumnType | None = None
    #: the source database's own name for the type, kept for documentation and schema history
    source_type: str = ""

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
        )


@dataclass(frozen=True)
class _Codec:
    avro: Callable[[ColumnType], Any]
    to_avro: Callable[[ColumnType, Any], Any]
    to_json: Callable[[ColumnType, Any], Any] = field(default=lambda _t, d: d)


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


def _date_to_avro(ctype: ColumnType, value: Any) -> Any:
    sign = _infinity(value)
    if sign:
        return INT32_MAX if sign > 0 else INT32_MIN
    if isinstance(value, dt.datetime) or not isinstance(value, dt.date):
        raise _fail(ctype, value, "expected a date")
    return (value - EPOCH_DATE).days


def _date_to_json(_t: ColumnType, datum: Any) -> Any:
    if datum == INT32_MAX:
        return "infinity"
    if datum == INT32_MIN:
        return "-infinity"
    return (EPOCH_DATE + dt.timedelta(days=datum)).isoformat()


def _time_to_avro(ctype: ColumnType, value: Any) -> Any:
    if isinstance(value, dt.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + (
            value.microsecond
        )
    if isinstance(value, dt.timedelta):  # MySQL TIME can exceed a day
        return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    raise _fail(ctype, value, "expected a time")


def _time_to_json(_t: ColumnType, datum: Any) -> Any:
    sign = "-" if datum < 0 else ""
    micros = abs(datum)
    seconds, micro = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{sign}{hour:02d}:{minute:02d}:{second:02d}.{micro:06d}"


def _micros_since_epoch(moment: dt.datetime) -> int:
    delta = moment - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _timestamp_to_avro(ctype: ColumnType, value: Any) -> Any:
    sign = _infinity(value)
    if sign:
        return INT64_MAX if sign > 0 else INT64_MIN
    if not isinstance(value, dt.datetime):
        raise _fail(ctype, value, "expected a datetime")
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return _micros_since_epoch(value)


def _timestamp_to_json(_t: ColumnType, datum: Any) -> Any:
    if datum == INT64_MAX:
        return "infinity"
    if datum == INT64_MIN:
        return "-infinity"
    moment = EPOCH + dt.timedelta(microseconds=datum)
    return moment.isoformat(timespec="microseconds")


def _timestamptz_to_avro(ctype: ColumnType, value: Any) -> Any:
    sign = _infinity(value)
    if sign:
        return "infinity" if sign > 0 else "-infinity"
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise _fail(ctype, value, "expected a timezone-aware datetime")
    utc = value.astimezone(dt.UTC).replace(tzinfo=None)
    return utc.isoformat(timespec="microseconds") + "Z"


# -- arrays ------------------------------------------------------------------------------------
def _array_avro(ctype: ColumnType) -> Any:
    assert ctype.element is not None
    return {"type": "array", "items": ["null", ctype.element.avro()]}


def _array_to_avro(ctype: ColumnType, value: Any) -> Any:
    assert ctype.element is not None
    if not isinstance(value, list | tuple):
        raise _fail(ctype, value, "expected a list")
    element = ctype.element
    return [None if item is None else element.to_avro(item) for item in value]


def _array_to_json(ctype: ColumnType, datum: Any) -> Any:
    assert ctype.element is not None
    element = ctype.element
    return [None if item is None else element.to_json(item) for item in datum]


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
    "json": _Codec(_connect("string", "io.debezium.data.Json"), _json_to_avro),
    "uuid": _Codec(_connect("string", "io.debezium.data.Uuid"), _uuid_to_avro),
    "enum": _Codec(
        lambda t: {"type": "string", "connect.name": "io.debezium.data.Enum",
                   "cdc.values": list(t.values)},
        _string_to_avro,
    ),
    "date": _Codec(_connect("int", "io.debezium.time.Date"), _date_to_avro, _date_to_json),
    "time": _Codec(_connect("long", "io.debezium.time.MicroTime"), _time_to_avro, _time_to_json),
    "timestamp": _Codec(_connect("long", "io.debezium.time.MicroTimestamp"), _timestamp_to_avro,
                        _timestamp_to_json),
    "timestamptz": _Codec(_connect("string", "io.debezium.time.ZonedTimestamp"),
                          _timestamptz_to_avro),
    "array": _Codec(_array_avro, _array_to_avro, _array_to_json),
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
        return value if _infinity(value) else dt.date.fromisoformat(value)
    if name in ("timestamp", "timestamptz"):
        if _infinity(value):
            return value
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if name == "time":
        return dt.time.fromisoformat(value)
    if name in ("float32", "float64") and isinstance(value, str):
        return float(value.replace("Infinity", "inf"))
    if name == "array":
        assert ctype.element is not None
        return [ctype.element.from_json(item) for item in value]
    return value
