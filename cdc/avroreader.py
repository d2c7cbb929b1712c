"""A fast reader for the one thing the capture path reads back: an envelope's ``after`` image.

Filling unchanged TOAST values (``cdc/images.py``) needs the previous after image of a key, and
fastavro's general reader decodes the whole envelope (~40 us for a 12-column row). This reader
is compiled once per envelope schema into closures that skip ``before`` when it is null and
decode the ``after`` record's fields. It supports the field types the connectors' flat rows use
(null unions of long/int, string, bytes, double, float, boolean, and ``decimal`` bytes, whose
value it returns as the unscaled bytes — which the Avro writers re-encode byte for byte);
:func:`compile_after_reader` returns None for anything else and the caller uses fastavro.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

#: (data, position) -> (value, next position)
FieldReader = Callable[[bytes, int], tuple[Any, int]]
#: a log value (header included) -> its after image (None: deleted), or raises
AfterReader = Callable[[bytes], dict[str, Any] | None]

_DOUBLE = struct.Struct("<d").unpack_from
_FLOAT = struct.Struct("<f").unpack_from


class NotReadable(Exception):
    """The value needs fastavro (e.g. a non-null ``before`` image)."""


def read_long(data: bytes, at: int) -> tuple[int, int]:
    byte = data[at]
    at += 1
    n = byte & 0x7F
    shift = 7
    while byte & 0x80:
        byte = data[at]
        at += 1
        n |= (byte & 0x7F) << shift
        shift += 7
    return (n >> 1) ^ -(n & 1), at


def _string(data: bytes, at: int) -> tuple[Any, int]:
    size, at = read_long(data, at)
    return data[at : at + size].decode(), at + size


def _bytes(data: bytes, at: int) -> tuple[Any, int]:
    size, at = read_long(data, at)
    return data[at : at + size], at + size


def _double(data: bytes, at: int) -> tuple[Any, int]:
    return _DOUBLE(data, at)[0], at + 8


def _float(data: bytes, at: int) -> tuple[Any, int]:
    return _FLOAT(data, at)[0], at + 4


def _boolean(data: bytes, at: int) -> tuple[Any, int]:
    return data[at] == 1, at + 1


_PRIMITIVES: dict[str, FieldReader] = {"long": read_long, "int": read_long, "string": _string,
                                       "bytes": _bytes, "double": _double, "float": _float,
                                       "boolean": _boolean}


def _branch(schema: Any) -> FieldReader | None:
    if isinstance(schema, str):
        return _PRIMITIVES.get(schema)
    if isinstance(schema, dict) and isinstance(schema.get("type"), str):
        if schema.get("logicalType") == "decimal" and schema["type"] == "bytes":
            return _bytes  # the unscaled bytes: the writers take them as they are
        if "logicalType" not in schema:
            return _PRIMITIVES.get(schema["type"])
    return None


def _field(schema: Any) -> FieldReader | None:
    branches = schema if isinstance(schema, list) else [schema]
    readers = [None if b == "null" else _branch(b) for b in branches]
    if any(r is None and b != "null" for r, b in zip(readers, branches, strict=True)):
        return None
    if not isinstance(schema, list):
        return readers[0]
    table = tuple(readers)

    def read(data: bytes, at: int) -> tuple[Any, int]:
        index, at = read_long(data, at)
        reader = table[index]
        return (None, at) if reader is None else reader(data, at)
    return read


def compile_after_reader(envelope: dict[str, Any]) -> AfterReader | None:
    """A reader of ``after`` for values of ``envelope`` (as built by cdc.avro.value_schema);
    None when its Value record has a field type this module does not read."""
    fields = envelope.get("fields", [])
    if len(fields) < 2 or [f["name"] for f in fields[:2]] != ["before", "after"]:
        return None
    value = fields[0]["type"][1] if isinstance(fields[0]["type"], list) else None
    if not isinstance(value, dict) or value.get("type") != "record":
        return None
    plan: list[tuple[str, FieldReader]] = []
    for field in value["fields"]:
        reader = _field(field["type"])
        if reader is None:
            return None
        plan.append((field["name"], reader))

    def read(data: bytes) -> dict[str, Any] | None:
        if data[5] != 0:  # after the wire-format header: before (null), then after
            raise NotReadable("a before image")
        if data[6] == 0:
            return None
        at = 7
        out: dict[str, Any] = {}
        for name, reader in plan:
            out[name], at = reader(data, at)
        return out
    return read
