"""A compiled-to-closures Avro binary writer for the schemas this project generates.

fastavro's ``schemaless_writer`` is general: every call re-dispatches on the schema and resolves
each union by validating the datum against its branches (a whole row, for the envelope's
``before``/``after``). Here a schema is turned once into nested closures that append to a
``bytearray``; unions pick their branch from the Python type of the value. The output is
byte-for-byte what fastavro writes (``tests/test_avrowriter.py`` checks that on every type),
and the log is still read back with fastavro.

Supported: null, boolean, int, long, float, double, bytes, string, enum, fixed, record, array,
map, union, and the ``decimal`` logical type on bytes. Anything else raises
:class:`Unsupported`, and the caller falls back to fastavro.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any

Writer = Callable[[Any, bytearray], None]

_FLOAT = struct.Struct("<f").pack
_DOUBLE = struct.Struct("<d").pack
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


class Unsupported(Exception):
    """The schema uses something this writer does not implement."""


def write_long(value: int, out: bytearray) -> None:
    n = (value << 1) ^ (value >> 63)
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _write_null(value: Any, out: bytearray) -> None:
    if value is not None:
        raise ValueError(f"{value!r} is not null")


def _write_boolean(value: Any, out: bytearray) -> None:
    out.append(1 if value else 0)


def _write_string(value: str, out: bytearray) -> None:
    data = value.encode()
    write_long(len(data), out)
    out += data


def _write_bytes(value: bytes, out: bytearray) -> None:
    write_long(len(value), out)
    out += value


def _write_float(value: float, out: bytearray) -> None:
    out += _FLOAT(value)


def _write_double(value: float, out: bytearray) -> None:
    out += _DOUBLE(value)


_PRIMITIVE_WRITERS: dict[str, Writer] = {
    "null": _write_null, "boolean": _write_boolean, "int": write_long, "long": write_long,
    "float": _write_float, "double": _write_double, "bytes": _write_bytes,
    "string": _write_string,
}


def _decimal_writer(scale: int) -> Writer:
    def write(value: Decimal | bytes, out: bytearray) -> None:
        if value.__class__ is bytes:  # already the unscaled two's complement bytes
            _write_bytes(value, out)  # type: ignore[arg-type]
            return
        assert isinstance(value, Decimal)
        sign, digits, exponent = value.as_tuple()
        assert isinstance(exponent, int)
        if -exponent > scale:
            raise ValueError(f"{value} has more than {scale} decimal places")
        unscaled = 0
        for digit in digits:
            unscaled = unscaled * 10 + digit
        unscaled *= 10 ** (exponent + scale)
        if sign:
            unscaled = -unscaled
        size = (unscaled.bit_length() + 8) // 8
        _write_bytes(unscaled.to_bytes(size, "big", signed=True), out)
    return write


class _Compiler:
    def __init__(self) -> None:
        self.named: dict[str, Any] = {}
        self.writers: dict[str, Writer] = {}

    def compile(self, schema: Any, namespace: str | None = None) -> Writer:
        if isinstance(schema, list):
            return self._union(schema, namespace)
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return _PRIMITIVE_WRITERS[schema]
            name = schema if "." in schema or not namespace else f"{namespace}.{schema}"
            found = self.writers.get(name) or self.writers.get(schema)
            if found is None:
                raise Unsupported(f"unknown named type {schema}")
            return found
        kind = schema["type"]
        if schema.get("logicalType") == "decimal" and kind == "bytes":
            return _decimal_writer(int(schema.get("scale", 0)))
        if isinstance(kind, (list, dict)):
            return self.compile(kind, namespace)
        if kind in _PRIMITIVES:
            return _PRIMITIVE_WRITERS[kind]
        if kind == "record":
            return self._record(schema, namespace)
        if kind == "array":
            return self._array(self.compile(schema["items"], namespace))
        if kind == "map":
            return self._map(self.compile(schema["values"], namespace))
        if kind == "enum":
            return self._enum(schema, namespace)
        if kind == "fixed":
            self._name(schema, namespace)
            return _write_fixed
        raise Unsupported(f"type {kind!r}")

    def _name(self, schema: dict[str, Any], namespace: str | None) -> tuple[str, str | None]:
        name = schema["name"]
        space = schema.get("namespace", namespace)
        if "." in name:
            space = name.rsplit(".", 1)[0]
            return name, space
        return (f"{space}.{name}" if space else name), space

    def _record(self, schema: dict[str, Any], namespace: str | None) -> Writer:
        full, space = self._name(schema, namespace)
        fields: list[tuple[str, Writer]] = []

        def write(value: dict[str, Any], out: bytearray) -> None:
            for name, field_writer in fields:
                field_writer(value.get(name), out)

        self.writers[full] = write  # recursive references resolve to this
        self.writers[schema["name"]] = write
        for field in schema["fields"]:
            fields.append((field["name"], self.compile(field["type"], space)))
        return write

    @staticmethod
    def _array(items: Writer) -> Writer:
        def write(value: list[Any], out: bytearray) -> None:
            if value:
                write_long(len(value), out)
                for item in value:
                    items(item, out)
            out.append(0)
        return write

    @staticmethod
    def _map(values: Writer) -> Writer:
        def write(value: dict[str, Any], out: bytearray) -> None:
            if value:
                write_long(len(value), out)
                for key, item in value.items():
                    _write_string(key, out)
                    values(item, out)
            out.append(0)
        return write

    def _enum(self, schema: dict[str, Any], namespace: str | None) -> Writer:
        full, _ = self._name(schema, namespace)
        index = {symbol: i for i, symbol in enumerate(schema["symbols"])}

        def write(value: str, out: bytearray) -> None:
            write_long(index[value], out)

        self.writers[full] = write
        return write

    def _union(self, branches: list[Any], namespace: str | None) -> Writer:
        """Branch by the value's Python type; ambiguous unions are unsupported."""
        by_class: dict[type, tuple[int, Writer]] = {}
        null_index: int | None = None
        for index, branch in enumerate(branches):
            kind = _kind(branch, self.named)
            writer = self.compile(branch, namespace)
            if kind == "null":
                null_index = index
                continue
            for cls in _CLASSES.get(kind, ()):
                if cls in by_class:
                    raise Unsupported(f"union {branches!r} is ambiguous for {cls.__name__}")
                by_class[cls] = (index, writer)
            if kind in ("record", "map"):
                if dict in by_class:
                    raise Unsupported("a union of two records or maps")
                by_class[dict] = (index, writer)
            if kind == "array":
                by_class[list] = (index, writer)
                by_class[tuple] = (index, writer)

        def write(value: Any, out: bytearray) -> None:
            if value is None:
                if null_index is None:
                    raise ValueError("null for a union without null")
                write_long(null_index, out)
                return
            found = by_class.get(value.__class__)
            if found is None:
                raise ValueError(f"no branch of {branches!r} for {value!r}")
            write_long(found[0], out)
            found[1](value, out)
        return write


def _write_fixed(value: bytes, out: bytearray) -> None:
    out += value


_CLASSES: dict[str, tuple[type, ...]] = {
    "boolean": (bool,), "int": (int,), "long": (int,), "float": (float,), "double": (float,),
    "bytes": (bytes,), "string": (str,), "enum": (str,), "fixed": (bytes,),
    "decimal": (Decimal, bytes),
}


def _kind(schema: Any, named: dict[str, Any]) -> str:
    if isinstance(schema, str):
        return schema if schema in _PRIMITIVES else "record"
    if isinstance(schema, dict):
        if schema.get("logicalType") == "decimal":
            return "decimal"
        kind = schema["type"]
        return kind if isinstance(kind, str) else _kind(kind, named)
    raise Unsupported(f"nested union {schema!r}")


def compile_writer(schema: Any) -> Writer:
    """A writer for ``schema`` (a JSON Avro schema, as given to fastavro.parse_schema)."""
    return _Compiler().compile(schema)
