"""Kafka Connect's JSON form of the log's records (``log.format: json``).

A Kafka Connect worker reading with ``JsonConverter`` and ``schemas.enable=true`` — Debezium's
default output, and what Debezium's own JDBC sink consumes — expects every key and value as
``{"schema": <Connect schema>, "payload": <value>}``. The log is written in Avro inside cdc (the
codec, the connectors' fast paths, the followers' readers all speak it); this module is the one
place that turns a record into Connect's JSON form and back, exactly:

* **Values.** The Avro envelope (``cdc/avro.py``) maps onto a Connect schema field by field:
  records are structs (named by their ``connect.name``, else their Avro full name), ``["null",
  X]`` is an optional ``X``, ``int``/``long``/``float``/``double``/``string``/``bytes``/
  ``boolean`` are ``int32``/``int64``/``float``/``double``/``string``/``bytes``/``boolean``
  (``int16`` where the Avro type says ``connect.type``), ``connect.name``/``connect.version``
  become the schema's ``name``/``version`` (``io.debezium.time.MicroTimestamp`` ...), bytes are
  base64 text. Decimals follow ``log.decimal_handling`` (:data:`DECIMAL_MODES`):

  - ``precise``: ``NUMERIC(p, s)`` and ``BIGINT UNSIGNED`` are Connect's ``Decimal`` (base64 of
    the unscaled two's-complement bytes, ``scale`` and ``connect.decimal.precision``
    parameters); an unconstrained ``NUMERIC`` is Debezium's ``VariableScaleDecimal`` struct
    (``scale``, ``value``). ``NaN`` and ``±Infinity`` have no such form: a change holding one
    stops capture with an :class:`~cdc.errors.EncodingError` naming ``string`` as the fix —
    Debezium's own rule for this mode; nothing is written, nothing is lost.
  - ``string``: every decimal is its exact text (``"12.50"``, ``"NaN"``).

  Times follow ``log.time_precision`` (:data:`TIME_MODES`), Debezium's ``time.precision.mode``
  where it loses nothing:

  - ``micro``: every ``time`` and ``timestamp`` is ``MicroTime`` / ``MicroTimestamp``.
  - ``adaptive``: a ``timestamp`` column declaring at most 3 fractional digits (``timestamp(3)``,
    MySQL's ``DATETIME``) is ``io.debezium.time.Timestamp`` (int64 milliseconds; PostgreSQL's
    infinities keep their sentinels ``±(2**63 - 1)``), a ``time`` column of at most 3 digits is
    ``io.debezium.time.Time`` (int32 milliseconds); more digits stay micro. A MySQL ``TIME``
    beyond ±596 hours has no int32 form: a change holding one stops capture naming
    ``adaptive_time_microseconds`` as the fix (nothing is written, nothing is lost).
  - ``adaptive_time_microseconds``: timestamps as ``adaptive``, every ``time`` ``MicroTime``
    (Debezium's default for MySQL).

  The column's declared digits come from its ``cdc.type`` (:class:`cdc.types.ColumnType`'s
  ``precision``); an array's elements stay micro. Dates are ``Date`` and zoned times
  ``ZonedTimestamp`` / ``ZonedTime`` in every mode.

  The envelope struct carries the value's schema id in its parameters
  (``cdc.schema.id``): reading a value back finds its Avro schema by that id, and the JSON
  payload becomes the very Avro datum it was made from (:meth:`ConnectJson.to_avro`).
* **Keys** keep depending on the key's values only (compaction, tombstones, partitioning and
  ownership rely on it; ``docs/semantics``): the payload is the canonical key bytes
  (:func:`cdc.events.encode_key`) unchanged, and the key's Connect schema is made from those
  bytes alone — one fixed rule, the widest Connect type per JSON kind: integers ``int64``,
  other numbers ``double``, booleans ``boolean``, everything else (text, decimals, times,
  uuids: their JSON form) ``string``. A key column retyped ``INT`` → ``BIGINT`` keeps its
  bytes, so a tombstone still shadows every older record of its key. The struct is named
  ``<kafka topic>.Key``. :func:`canonical_key` gives the canonical bytes back, byte for byte.

Records that are neither (a value not in Confluent's framing, a key that is not a JSON object)
pass through unchanged both ways; a reader tells the forms apart by their first bytes
(:data:`VALUE_PREFIX`, :data:`KEY_PREFIX`), so a reader needs no setting to read a log.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal
from typing import Any

import fastavro

from cdc.errors import EncodingError, SchemaError
from cdc.log.base import SchemaRegistry
from cdc.types import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, ColumnType

#: ``log.decimal_handling``: how decimals appear in Connect's JSON form
DECIMAL_MODES = ("precise", "string")
#: ``log.time_precision``: how times and timestamps appear in it (see the module docstring)
TIME_MODES = ("micro", "adaptive", "adaptive_time_microseconds")
#: every value in Connect's JSON form starts with these bytes
VALUE_PREFIX = b'{"schema":{"type":"struct",'
#: every key in Connect's JSON form starts with these bytes (a canonical key never does: its
#: values are scalars)
KEY_PREFIX = b'{"schema":{"type":"struct","fields":['
#: the parameter of the envelope struct that holds the value's schema id
SCHEMA_ID = "cdc.schema.id"
#: ... and the decimal handling it was written with
DECIMALS = "cdc.decimal.handling"
#: ... and its time precision (absent: ``micro``)
TIMES = "cdc.time.precision"
#: ... and, set to ``true``, that its ``before`` holds only the key (see ConnectJson.record)
REMOVAL = "cdc.removal"
_MAGIC = 0
_PAYLOAD = b',"payload":'
_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_VARIABLE = "io.debezium.data.VariableScaleDecimal"
_SPECIAL = ("NaN", "Infinity", "-Infinity")
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False,
                          allow_nan=False).encode
_decoder = json.JSONDecoder()
#: exact decimal arithmetic (the default context rounds to 28 digits)
_EXACT = Context(prec=200_000, Emax=MAX_EMAX, Emin=MIN_EMIN)

#: Avro datum -> Connect payload value (and back)
Convert = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


def _optional(convert: Convert) -> Convert:
    if convert is _identity:
        return convert
    return lambda value: None if value is None else convert(value)


# -- decimals ----------------------------------------------------------------------------------
def _unscaled(number: Decimal, scale: int) -> bytes:
    integer = int(number.scaleb(scale, context=_EXACT))
    length = max(1, (integer + (integer < 0)).bit_length() // 8 + 1)
    return integer.to_bytes(length, "big", signed=True)


def _special_refused(column: str, text: str) -> EncodingError:
    return EncodingError(f"{column} holds {text}, which log.decimal_handling: precise cannot "
                         "carry (Kafka Connect's Decimal has no NaN or infinity)",
                         "set log.decimal_handling: string for this log (a new log: bootstrap "
                         "again into new topics), or keep such values out of the column")


class _Decimals:
    """Conversions of one decimal column (``scale`` None: unconstrained) both ways."""

    def __init__(self, mode: str, scale: int | None, column: str) -> None:
        self.mode, self.scale, self.column = mode, scale, column

    def out(self, value: Any) -> Any:
        if self.mode == "string":
            return value if isinstance(value, str) else format(value, "f")
        if isinstance(value, str) and value in _SPECIAL:
            raise _special_refused(self.column, value)
        number = Decimal(value)
        if self.scale is None:  # VariableScaleDecimal
            exponent = number.as_tuple().exponent
            scale = max(0, -exponent) if isinstance(exponent, int) else 0
            return {"scale": scale, "value": _b64(_unscaled(number, scale))}
        return _b64(_unscaled(number, self.scale))

    def back(self, value: Any) -> Any:
        if self.mode == "string":
            if value in _SPECIAL:
                return value
            return value if self.scale is None else Decimal(value)
        if self.scale is None:
            unscaled = int.from_bytes(base64.b64decode(value["value"]), "big", signed=True)
            return format(Decimal(unscaled).scaleb(-int(value["scale"]), context=_EXACT), "f")
        unscaled = int.from_bytes(base64.b64decode(value), "big", signed=True)
        return Decimal(unscaled).scaleb(-self.scale, context=_EXACT)


# -- times -------------------------------------------------------------------------------------
_MILLIS_AT_MOST = 3


class _Millis:
    """A ``time`` or ``timestamp`` column of at most 3 fractional digits as milliseconds (the
    Avro datum is microseconds), both ways; a timestamp's infinity sentinels stay as they are."""

    def __init__(self, column: str, kind: str) -> None:
        self.column, self.kind = column, kind
        self.low, self.high = (INT32_MIN, INT32_MAX) if kind == "time" else (INT64_MIN, INT64_MAX)

    def out(self, micros: int) -> int:
        if self.kind == "timestamp" and micros in (INT64_MAX, INT64_MIN):
            return micros
        millis, rest = divmod(micros, 1000)
        if rest:
            raise EncodingError(f"{self.column} holds a {self.kind} with digits below the "
                                "millisecond, though its column declares at most 3",
                                "this is a bug in the connector's type mapping; please report "
                                "it with the column type")
        if not self.low <= millis <= self.high:
            shown = ColumnType("time").to_json(micros)
            raise EncodingError(f"{self.column} holds the time {shown}, "
                                "beyond io.debezium.time.Time's 32-bit milliseconds (±596 "
                                "hours), which log.time_precision: adaptive writes",
                                "set log.time_precision: adaptive_time_microseconds for this "
                                "log (a new log: bootstrap again into new topics)")
        return millis

    def back(self, millis: int) -> int:
        if self.kind == "timestamp" and millis in (INT64_MAX, INT64_MIN):
            return millis
        return int(millis) * 1000


def _millis_schema(ctype: dict[str, Any], mode: str) -> dict[str, Any] | None:
    """The Connect schema of a column of type ``ctype`` (its ``cdc.type``) when ``mode`` writes
    it as milliseconds, else None."""
    digits = ctype.get("precision")
    if mode == "micro" or digits is None or digits > _MILLIS_AT_MOST:
        return None
    if ctype.get("name") == "timestamp":
        return {"type": "int64", "name": "io.debezium.time.Timestamp", "version": 1}
    if ctype.get("name") == "time" and mode == "adaptive":
        return {"type": "int32", "name": "io.debezium.time.Time", "version": 1}
    return None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _decimal_schema(mode: str, scale: int | None, precision: int | None) -> dict[str, Any]:
    if mode == "string":
        return {"type": "string"}
    if scale is None:
        return {"type": "struct", "name": _VARIABLE, "version": 1,
                "fields": [{"type": "int32", "optional": False, "field": "scale"},
                           {"type": "bytes", "optional": False, "field": "value"}]}
    parameters = {"scale": str(scale)}
    if precision is not None:
        parameters["connect.decimal.precision"] = str(precision)
    return {"type": "bytes", "name": _DECIMAL, "version": 1, "parameters": parameters}


def _decimal_of(avro_type: Any) -> tuple[int, int | None] | None:
    """(scale, precision) of an Avro decimal (or a union of one and ``string``), else None."""
    branches = avro_type if isinstance(avro_type, list) else [avro_type]
    for branch in branches:
        if isinstance(branch, dict) and branch.get("logicalType") == "decimal":
            return int(branch.get("scale", 0)), branch.get("precision")
    return None


# -- schemas -----------------------------------------------------------------------------------
_PRIMITIVES = {"boolean": "boolean", "int": "int32", "long": "int64", "float": "float",
               "double": "double", "string": "string", "bytes": "bytes"}


class _Mapper:
    """Builds the Connect schema of an Avro schema and the conversions of its data."""

    def __init__(self, mode: str, times: str = "micro") -> None:
        self.mode, self.times = mode, times
        #: Avro full name -> (the record's Avro schema, its namespace)
        self.named: dict[str, tuple[dict[str, Any], str | None]] = {}

    def node(self, avro_type: Any, namespace: str | None, column: str
             ) -> tuple[dict[str, Any], Convert, Convert]:
        """(Connect schema without ``optional``/``field``, Avro → payload, payload → Avro)."""
        decimal = _decimal_of(avro_type)
        if decimal is not None or (isinstance(avro_type, dict)
                                   and avro_type.get("connect.name") == _VARIABLE):
            scale, precision = decimal if decimal is not None else (None, None)
            codec = _Decimals(self.mode, scale, column)
            return _decimal_schema(self.mode, scale, precision), codec.out, codec.back
        if isinstance(avro_type, list):
            return self._union(avro_type, namespace, column)
        if isinstance(avro_type, str):
            if avro_type in _PRIMITIVES:
                return self._primitive(avro_type, {})
            full = avro_type if "." in avro_type or not namespace else f"{namespace}.{avro_type}"
            found = self.named.get(full) or self.named.get(avro_type)
            if found is None:
                raise SchemaError(f"the Avro type {avro_type!r} is not defined before its use",
                                  "this is a bug in cdc's schemas; please report it")
            return self._record(found[0], found[1], column)
        kind = avro_type.get("type")
        if kind == "record":
            return self._record(avro_type, namespace, column)
        if kind == "array":
            items, out, back = self.node(avro_type["items"], namespace, column)
            items = {**items, "optional": _nullable(avro_type["items"])}
            return ({"type": "array", "items": items},
                    lambda v: [out(i) for i in v], lambda v: [back(i) for i in v])
        if kind == "map":
            values, out, back = self.node(avro_type["values"], namespace, column)
            values = {**values, "optional": _nullable(avro_type["values"])}
            return ({"type": "map", "keys": {"type": "string", "optional": False},
                     "values": values},
                    lambda v: {k: out(i) for k, i in v.items()},
                    lambda v: {k: back(i) for k, i in v.items()})
        if kind == "enum":
            return {"type": "string"}, _identity, _identity
        if kind == "fixed":
            return self._primitive("bytes", avro_type)
        if kind in _PRIMITIVES:
            return self._primitive(kind, avro_type)
        raise SchemaError(f"the Avro type {avro_type!r} has no Kafka Connect form",
                          "use log.format: avro for this log")

    @staticmethod
    def _primitive(kind: str, props: dict[str, Any]) -> tuple[dict[str, Any], Convert, Convert]:
        schema: dict[str, Any] = {"type": props.get("connect.type") or _PRIMITIVES[kind]}
        if props.get("connect.name"):
            schema["name"] = props["connect.name"]
        if props.get("connect.version") is not None:
            schema["version"] = props["connect.version"]
        if kind == "bytes":
            return schema, _b64, base64.b64decode
        if kind in ("float", "double"):
            return schema, _float_out, _float_back
        return schema, _identity, _identity

    def _record(self, record: dict[str, Any], namespace: str | None, column: str
                ) -> tuple[dict[str, Any], Convert, Convert]:
        own = record.get("namespace", namespace)
        full = record["name"] if "." in record["name"] or not own else f"{own}.{record['name']}"
        self.named.setdefault(full, (record, own))
        fields = []
        outs: list[tuple[str, Convert]] = []
        backs: list[tuple[str, Convert]] = []
        for field in record["fields"]:
            name = field["name"]
            column = field.get("cdc.column", name)
            schema, out, back = self._field(field, own, column)
            fields.append({**schema, "optional": _nullable(field["type"]), "field": name})
            outs.append((name, _optional(out)))
            backs.append((name, _optional(back)))
        connect: dict[str, Any] = {"type": "struct", "fields": fields,
                                   "name": record.get("connect.name") or full}
        if record.get("connect.version") is not None:
            connect["version"] = record["connect.version"]

        def out_record(value: dict[str, Any]) -> dict[str, Any]:
            return {name: convert(value.get(name)) for name, convert in outs}

        def back_record(value: dict[str, Any]) -> dict[str, Any]:
            return {name: convert(value.get(name)) for name, convert in backs}
        return connect, out_record, back_record

    def _field(self, field: dict[str, Any], namespace: str | None, column: str
               ) -> tuple[dict[str, Any], Convert, Convert]:
        """A record field's node: milliseconds where :attr:`times` says so, else its type's."""
        millis = _millis_schema(field.get("cdc.type") or {}, self.times)
        if millis is None:
            return self.node(field["type"], namespace, column)
        codec = _Millis(column, field["cdc.type"]["name"])
        return millis, codec.out, codec.back

    def _union(self, branches: list[Any], namespace: str | None, column: str
               ) -> tuple[dict[str, Any], Convert, Convert]:
        rest = [b for b in branches if b != "null"]
        if len(rest) == 1:
            return self.node(rest[0], namespace, column)
        # an array's items: the element, and the next dimension's array (cdc/types.py)
        arrays = [b for b in rest if isinstance(b, dict) and b.get("type") == "array"]
        if len(rest) == 2 and len(arrays) == 1:
            element = next(b for b in rest if b is not arrays[0])
            schema, out, back = self.node(element, namespace, column)

            def flat(value: Any) -> Any:
                if isinstance(value, list):
                    raise EncodingError(f"{column} holds a multidimensional array, which has "
                                        "no Kafka Connect form", "use log.format: avro for "
                                        "this log")
                return out(value)
            return schema, flat, back
        raise SchemaError(f"the Avro union {branches!r} of {column} has no Kafka Connect form",
                          "use log.format: avro for this log")


def _nullable(avro_type: Any) -> bool:
    return isinstance(avro_type, list) and "null" in avro_type


def _float_out(value: float) -> Any:
    if value != value or value in (float("inf"), float("-inf")):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    return value


def _float_back(value: Any) -> float:
    return float(value) if not isinstance(value, str) else float(value.replace("Infinity",
                                                                               "inf"))


# -- values ------------------------------------------------------------------------------------
class _Plan:
    """One value schema's Connect form: the ``schema`` part's bytes and the conversions."""

    def __init__(self, schema_id: int, avro: Any, mode: str, times: str = "micro") -> None:
        mapper = _Mapper(mode, times)
        connect, self.out, self.back = mapper.node(avro, None, "the value")
        connect["parameters"] = {**connect.get("parameters", {}), SCHEMA_ID: str(schema_id),
                                 DECIMALS: mode}
        if times != "micro":  # absent in micro: logs written before the setting read the same
            connect["parameters"][TIMES] = times
        self.schema_bytes = _dumps({**connect, "optional": False}).encode()
        if not (b'{"schema":' + self.schema_bytes).startswith(VALUE_PREFIX):
            raise SchemaError("a value schema is not a record", "use log.format: avro")
        self.parsed = fastavro.parse_schema(avro)
        self.header = bytes([_MAGIC]) + schema_id.to_bytes(4, "big")
        self.connect = connect
        self.avro = avro
        self._removal: tuple[bytes, dict[str, tuple[str, Any]]] | None = None

    def removal(self) -> tuple[bytes, dict[str, tuple[str, Any]]]:
        """For a delete without images: the ``schema`` part's bytes with the ``before``
        struct's non-key fields optional (so it can hold the key alone), and per key column
        (its ``cdc.column`` name) its Avro field name and type."""
        if self._removal is None:
            connect = json.loads(json.dumps(self.connect))
            connect["parameters"][REMOVAL] = "true"
            keys = set(self.avro.get("cdc.key", ()))
            value = self.avro["fields"][0]["type"][1]
            columns = {f.get("cdc.column", f["name"]): (f["name"], ColumnType.from_description(
                f["cdc.type"])) for f in value["fields"] if f.get("cdc.column", f["name"]) in keys}
            before = next(f for f in connect["fields"] if f["field"] == "before")
            key_fields = {name for name, _ in columns.values()}
            for field in before["fields"]:
                field["optional"] = field["optional"] or field["field"] not in key_fields
            self._removal = (_dumps({**connect, "optional": False}).encode(), columns)
        return self._removal


class ConnectJson:
    """Turns log records into Kafka Connect's JSON form and back (see the module docstring).

    ``store`` is the log's schema store (Avro schemas by id); ``decimal_handling`` one of
    :data:`DECIMAL_MODES`, ``time_precision`` one of :data:`TIME_MODES` (used when writing;
    reading follows each value's own schema)."""

    def __init__(self, store: SchemaRegistry, decimal_handling: str = "precise",
                 time_precision: str = "micro") -> None:
        if decimal_handling not in DECIMAL_MODES:
            raise SchemaError(f"unknown decimal handling {decimal_handling!r}",
                              f"use one of {', '.join(DECIMAL_MODES)}")
        if time_precision not in TIME_MODES:
            raise SchemaError(f"unknown time precision {time_precision!r}",
                              f"use one of {', '.join(TIME_MODES)}")
        self.store = store
        self.mode, self.times = decimal_handling, time_precision
        self._read_plans: dict[tuple[int, str, str], _Plan] = {}
        self._key_schemas: dict[tuple[str, tuple[tuple[str, str], ...]], bytes] = {}

    def _plan(self, schema_id: int, mode: str, times: str) -> _Plan:
        plan = self._read_plans.get((schema_id, mode, times))
        if plan is None:
            plan = _Plan(schema_id, self.store.get(schema_id).schema, mode, times)
            self._read_plans[(schema_id, mode, times)] = plan
        return plan

    def value(self, value: bytes | None, key: bytes = b"{}") -> bytes | None:
        """A log value (Confluent's framing) of the record keyed ``key`` in Connect's JSON
        form (see :meth:`record`)."""
        if value is None or len(value) < 5 or value[0] != _MAGIC:
            return value
        plan = self._plan(int.from_bytes(value[1:5], "big"), self.mode, self.times)
        datum = fastavro.schemaless_reader(io.BytesIO(value[5:]), plan.parsed, None)
        assert isinstance(datum, dict)
        schema_bytes = plan.schema_bytes
        if datum.get("op") == "d" and datum.get("before") is None and key != b"{}":
            schema_bytes, columns = plan.removal()
            values = json.loads(key)
            before: dict[str, Any] = dict.fromkeys(
                f["name"] for f in plan.avro["fields"][0]["type"][1]["fields"])
            for column, (field, ctype) in columns.items():
                before[field] = ctype.to_avro(ctype.from_json(values[column]))
            datum["before"] = before
        payload = _dumps(plan.out(datum)).encode()
        return b'{"schema":' + schema_bytes + _PAYLOAD + payload + b"}"

    def record(self, kafka_topic: str, key: bytes, value: bytes | None
               ) -> tuple[bytes, bytes | None]:
        """A log record's key and value in Connect's JSON form. A delete without images (a row
        known by its key only: :meth:`cdc.events.ChangeEvent.removal`) gets a ``before`` image
        holding the key's columns, which is what Kafka Connect sinks delete by (Debezium's JDBC
        sink cannot read a delete without one); its envelope says so (``cdc.removal``) and
        reading it back gives the record as written."""
        return self.key(kafka_topic, key), self.value(value, key)

    def to_avro(self, value: bytes | None) -> bytes | None:
        """A value in Connect's JSON form back in Confluent's framing, as it was written."""
        if value is None or not value.startswith(VALUE_PREFIX):
            return value
        text = value.decode()
        schema, end = _decoder.raw_decode(text, 10)
        try:
            schema_id = int(schema["parameters"][SCHEMA_ID])
        except (KeyError, TypeError, ValueError):
            raise SchemaError("a Connect JSON value has no cdc.schema.id parameter",
                              "the topic holds records cdc did not write; check log.* ") from None
        mode = "string" if _has_string_decimals(schema) else "precise"
        times = str(schema.get("parameters", {}).get(TIMES, "micro"))
        if times not in TIME_MODES:
            raise SchemaError(f"a Connect JSON value says {TIMES}: {times!r}, which this cdc "
                              "does not know", "run the cdc version that wrote the log")
        plan = self._plan(schema_id, mode, times)
        if not text.startswith(_PAYLOAD.decode(), end):
            raise SchemaError("a Connect JSON value is not {schema, payload}",
                              "the topic holds records cdc did not write")
        payload = _decoder.decode(text[end + len(_PAYLOAD):-1])
        datum = plan.back(payload)
        if schema.get("parameters", {}).get(REMOVAL) == "true":
            datum["before"] = None  # a delete without images (see ConnectJson.record)
        out = io.BytesIO()
        out.write(plan.header)
        fastavro.schemaless_writer(out, plan.parsed, datum)
        return out.getvalue()

    def key(self, kafka_topic: str, key: bytes) -> bytes:
        """Canonical key bytes (a JSON object) in Connect's JSON form; anything else as is."""
        if not key.startswith(b"{"):
            return key
        values = json.loads(key)
        if not isinstance(values, dict):
            return key
        kinds = tuple((name, _key_type(value)) for name, value in values.items())
        schema = self._key_schemas.get((kafka_topic, kinds))
        if schema is None:
            fields = [{"type": kind, "optional": False, "field": name} for name, kind in kinds]
            schema = _dumps({"type": "struct", "fields": fields, "optional": False,
                             "name": f"{kafka_topic}.Key"}).encode()
            self._key_schemas[(kafka_topic, kinds)] = schema
        return b'{"schema":' + schema + _PAYLOAD + key + b"}"


def _has_string_decimals(schema: dict[str, Any]) -> bool:
    """Whether a value's Connect schema was written with ``decimal_handling: string``: the
    mode is recorded in the envelope's parameters."""
    return bool(schema.get("parameters", {}).get(DECIMALS) == "string")


def _key_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    raise EncodingError(f"a key value {value!r} has no Kafka Connect key form",
                        "use log.format: avro for this log")


def canonical_key(key: bytes) -> bytes:
    """The canonical key bytes of a key in Connect's JSON form (anything else as is)."""
    if not key.startswith(KEY_PREFIX):
        return key
    text = key.decode()
    _, end = _decoder.raw_decode(text, 10)
    if not text.startswith(_PAYLOAD.decode(), end) or not text.endswith("}"):
        raise SchemaError("a Connect JSON key is not {schema, payload}",
                          "the topic holds records cdc did not write")
    return text[end + len(_PAYLOAD):-1].encode()
