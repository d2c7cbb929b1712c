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
            _write_bytes(value, out)
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
        #: full record name -> (field name, writer) per field, in order
        self.fields: dict[str, list[tuple[str, Writer]]] = {}

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
        compiled: list[Writer] = []

        def write(value: dict[str, Any], out: bytearray) -> None:  # until compiled below
            compiled[0](value, out)

        self.writers[full] = write  # recursive references resolve to this
        self.writers[schema["name"]] = write
        for field in schema["fields"]:
            fields.append((field["name"], self.compile(field["type"], space)))
        self.fields[full] = fields
        compiled.append(_generate_record(schema["fields"], fields))
        return compiled[0]

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
        if len(branches) > 63:
            raise Unsupported("a union of more than 63 branches")
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
                out.append(null_index << 1)
                return
            found = by_class.get(value.__class__)
            if found is None:
                raise ValueError(f"no branch of {branches!r} for {value!r}")
            out.append(found[0] << 1)  # the branch index as a long (unions are short)
            found[1](value, out)
        return write


_INLINE = {
    "long": ["n = (v << 1) ^ (v >> 63)", "if n < 128: out.append(n)", "else: wl(v, out)"],
    "string": ["b = v.encode()", "n = len(b) << 1", "if n < 128: out.append(n)",
               "else: wl(n >> 1, out)", "out += b"],
    "double": ["out += pd(v)"],
    "float": ["out += pf(v)"],
    "boolean": ["out.append(1 if v else 0)"],
}
_INLINE["int"] = _INLINE["long"]


def _plain(schema: Any) -> str | None:
    """The primitive a field type is, when it can be written inline (no logical type)."""
    if isinstance(schema, str):
        return schema if schema in _INLINE else None
    if isinstance(schema, dict) and "logicalType" not in schema and isinstance(
            schema.get("type"), str):
        return schema["type"] if schema["type"] in _INLINE else None
    return None


def _generate_record(fields: list[dict[str, Any]], writers: list[tuple[str, Writer]]) -> Writer:
    """Python source for one record's writer, with primitive and nullable-primitive fields
    inlined (a value of an unexpected type raises, and the caller falls back to fastavro)."""
    lines = ["def write(value, out):"]
    scope: dict[str, Any] = {"wl": write_long, "pd": _DOUBLE, "pf": _FLOAT}
    for index, (field, (name, writer)) in enumerate(zip(fields, writers, strict=True)):
        lines.append(f"    v = value.get({name!r})")
        kind, branches = _plain(field["type"]), field["type"]
        if kind is not None:
            lines.extend("    " + line for line in _INLINE[kind])
        elif (isinstance(branches, list) and len(branches) == 2 and "null" in branches
              and _plain(branches[1 - branches.index("null")]) is not None):
            null_at = branches.index("null")
            inner = _plain(branches[1 - null_at])
            assert inner is not None
            lines.append(f"    if v is None: out.append({2 * null_at})")
            lines.append("    else:")
            lines.append(f"        out.append({2 * (1 - null_at)})")
            lines.extend("        " + line for line in _INLINE[inner])
        else:
            scope[f"w{index}"] = writer
            lines.append(f"    w{index}(v, out)")
    if len(lines) == 1:
        lines.append("    pass")
    exec("\n".join(lines), scope)  # noqa: S102 - our own generated source, no user text
    generated: Writer = scope["write"]
    return generated


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


def compile_parts(schema: Any) -> tuple[Writer, dict[str, list[tuple[str, Writer]]]]:
    """:func:`compile_writer`, plus the writers of every record's fields by the record's full
    name (``{"ns.Value": [(field name, writer), ...]}``): writing a record's fields one after
    the other with them gives exactly the record's bytes."""
    compiler = _Compiler()
    return compiler.compile(schema), compiler.fields
