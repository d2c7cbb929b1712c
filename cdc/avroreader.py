"""The project's one Avro reader for change-event envelopes: compiled once per schema.

Two things read log values: the Spark apply tasks (``spark_apply/source.py``, ``tasks.py``: the
op, the after image and ``source.ts_ms`` of every value) and capture, which reads back the
previous after image of a key to fill unchanged TOAST values (``cdc/images.py``). fastavro decodes
the whole envelope (the before image, the source block, the transaction block...) and builds
objects for all of it; here an envelope schema is turned once into generated Python that *skips*
what is not needed and builds only the after image (:func:`compile_projection`,
:func:`compile_after_reader`), or into a node tree that ``cdc/_fast.pyx`` walks, building the
image straight into its JSON form (:func:`compile_program`). Values are exactly what fastavro
returns (``tests/test_spark_source.py`` checks random envelopes of every column type).

Supported: null, boolean, int, long, float, double, bytes, string, enum, fixed, record, array,
map, union, and the ``decimal`` logical type on bytes (the same set as ``cdc/avrowriter.py``).
Anything else raises :class:`cdc.avrowriter.Unsupported`, and the caller decodes with fastavro.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from decimal import Context
from typing import Any

from cdc.avrowriter import Unsupported
from cdc.speedups import pure_python

#: (buffer, position) -> (value, next position)
Reader = Callable[[bytes, int], tuple[Any, int]]
#: (buffer, position) -> next position
Skipper = Callable[[bytes, int], int]
#: (value bytes, where the envelope starts: 5, after the frame) -> (op, after image by Avro field
#: name or None, source ts_ms or None)
Projection = Callable[[bytes, int], tuple[str, dict[str, Any] | None, int | None]]

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


_FLOAT = struct.Struct("<f").unpack_from
_DOUBLE = struct.Struct("<d").unpack_from
_PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")


# Generated-code snippets per primitive: read into ``v``, or skip, advancing ``pos``.
_LONG = ["b = buf[pos]", "if b < 128: v = (b >> 1) ^ -(b & 1); pos += 1",
         "else: v, pos = rl(buf, pos)"]
_READ = {
    "null": ["v = None"],
    "boolean": ["v = buf[pos] == 1", "pos += 1"],
    "int": _LONG,
    "long": _LONG,
    "float": ["v = pf(buf, pos)[0]", "pos += 4"],
    "double": ["v = pd(buf, pos)[0]", "pos += 8"],
    "bytes": [*_LONG, "v, pos = buf[pos:pos + v], pos + v"],
    "string": [*_LONG, "v, pos = buf[pos:pos + v].decode(), pos + v"],
}
_SKIP_LONG = ["while buf[pos] > 127: pos += 1", "pos += 1"]
_SKIP_BYTES = ["b = buf[pos]", "if b < 128: pos += 1 + (b >> 1)",
               "else: v, pos = rl(buf, pos); pos += v"]
_SKIP = {
    "null": [],
    "boolean": ["pos += 1"],
    "int": _SKIP_LONG,
    "long": _SKIP_LONG,
    "float": ["pos += 4"],
    "double": ["pos += 8"],
    "bytes": _SKIP_BYTES,
    "string": _SKIP_BYTES,
}
_SCOPE: dict[str, Any] = {"rl": read_long, "pf": _FLOAT, "pd": _DOUBLE}

#: ``cdc._fast.run_program`` (runs a :func:`compile_program` program), when built; None:
#: the generated Python of :func:`compile_projection` is used
RUN_PROGRAM: Callable[[Any, bytes, int], tuple[Any, Any, Any]] | None = None
if not pure_python():
    with contextlib.suppress(ImportError):
        from cdc._fast import (  # type: ignore[import-not-found,no-redef,unused-ignore]
            run_program as RUN_PROGRAM,  # noqa: F401
        )


def _function(name: str, args: str, body: list[str], scope: dict[str, Any]) -> Any:
    source = "\n".join([f"def {name}({args}):", *("    " + line for line in body)])
    namespace = dict(scope)
    exec(source, namespace)  # noqa: S102 - our own generated source, from schema field names
    return namespace[name]


class _Compiler:
    def __init__(self, decimal_bytes: bool = False) -> None:
        #: read ``decimal`` bytes as the unscaled bytes (what the Avro writers re-encode byte
        #: for byte), not as a Decimal
        self.decimal_bytes = decimal_bytes
        self.named: dict[str, Any] = {}  # full name -> schema (for references)
        self.readers: dict[str, Reader] = {}
        self.skippers: dict[str, Skipper] = {}

    def _full(self, schema: dict[str, Any], namespace: str | None) -> tuple[str, str | None]:
        name = schema["name"]
        if "." in name:
            return name, name.rsplit(".", 1)[0]
        space = schema.get("namespace", namespace)
        return (f"{space}.{name}" if space else name), space

    def _kind(self, schema: Any) -> str:
        if isinstance(schema, list):
            return "union"
        if isinstance(schema, str):
            return schema if schema in _PRIMITIVES else "named"
        kind = schema["type"]
        if isinstance(kind, dict | list):
            return self._kind(kind)
        logical = schema.get("logicalType")
        if logical == "decimal" and kind == "bytes":
            return "decimal"
        if logical is not None:  # fastavro would convert it: leave it to fastavro
            raise Unsupported(f"logical type {logical!r} on {kind}")
        if kind not in _PRIMITIVES and kind not in ("record", "enum", "fixed", "array", "map"):
            raise Unsupported(f"type {kind!r}")
        return str(kind)

    def _lookup(self, name: str, namespace: str | None) -> str:
        for candidate in (f"{namespace}.{name}" if namespace else name, name):
            if candidate in self.named:
                return candidate
        raise Unsupported(f"unknown named type {name!r}")

    # -- snippets: generated lines that read (or skip) one value into ``v`` --------------------
    def lines(self, schema: Any, namespace: str | None, skip: bool, scope: dict[str, Any]
              ) -> list[str]:
        while isinstance(schema, dict) and isinstance(schema.get("type"), dict | list):
            schema = schema["type"]
        kind = self._kind(schema)
        if kind in _PRIMITIVES:
            return list((_SKIP if skip else _READ)[kind])
        if kind == "union":
            return self._union_lines(schema, namespace, skip, scope)
        function = self.skipper(schema, namespace) if skip else self.reader(schema, namespace)
        key = f"f{len(scope)}"
        scope[key] = function
        return [f"pos = {key}(buf, pos)"] if skip else [f"v, pos = {key}(buf, pos)"]

    def _union_lines(self, branches: list[Any], namespace: str | None, skip: bool,
                     scope: dict[str, Any]) -> list[str]:
        if len(branches) > 63:
            raise Unsupported("a union of more than 63 branches")
        out = ["i = buf[pos] >> 1", "pos += 1"]
        for index, branch in enumerate(branches):
            body = self.lines(branch, namespace, skip, scope) or ["pass"]
            out.append(f"{'if' if index == 0 else 'elif'} i == {index}:")
            out.extend("    " + line for line in body)
        out.append("else: raise ValueError('union branch out of range')")
        return out

    # -- functions per type ----------------------------------------------------------------
    def reader(self, schema: Any, namespace: str | None) -> Reader:
        kind = self._kind(schema)
        if kind == "named":
            full = self._lookup(schema, namespace)
            return lambda buf, pos: self.readers[full](buf, pos)
        if kind == "record":
            reader: Reader = self._record(schema, namespace, None)
            return reader
        scope = dict(_SCOPE)
        if kind == "decimal" and self.decimal_bytes:
            body = [*_READ["bytes"], "return v, pos"]
        elif kind == "decimal":
            scope["ctx"] = Context(prec=int(schema["precision"]))
            scope["scale"] = -int(schema.get("scale", 0))
            body = [*_LONG, "n = int.from_bytes(buf[pos:pos + v], 'big', signed=True)",
                    "return ctx.create_decimal(n).scaleb(scale, ctx), pos + v"]
        elif kind in ("enum", "fixed"):
            return self._simple_named(schema, namespace)[0]
        elif kind in ("array", "map"):
            inner = schema["items" if kind == "array" else "values"]
            item = self.lines(inner, namespace, False, scope)
            body = ["out = []" if kind == "array" else "out = {}", "while True:",
                    *("    " + line for line in _LONG), "    if v == 0: return out, pos",
                    # a negative count is followed by the block's byte size
                    "    if v < 0: n = -v; s, pos = rl(buf, pos); v = n",
                    "    for _ in range(v):"]
            if kind == "map":
                body += ["        " + line for line in _READ["string"]] + ["        k = v"]
            body += ["        " + line for line in item]
            body.append("        out.append(v)" if kind == "array" else "        out[k] = v")
        else:
            body = [*self.lines(schema, namespace, False, scope), "return v, pos"]
        generated: Reader = _function("read", "buf, pos", body, scope)
        return generated

    def skipper(self, schema: Any, namespace: str | None) -> Skipper:
        kind = self._kind(schema)
        if kind == "named":
            full = self._lookup(schema, namespace)
            return lambda buf, pos: self.skippers[full](buf, pos)
        if kind == "record":
            skipper: Skipper = self._record(schema, namespace, set())
            return skipper
        scope = dict(_SCOPE)
        if kind in ("decimal",):
            body = ["v, pos = rl(buf, pos)", "return pos + v"]
        elif kind in ("enum", "fixed"):
            return self._simple_named(schema, namespace)[1]
        elif kind in ("array", "map"):
            inner = schema["items" if kind == "array" else "values"]
            item = self.lines(inner, namespace, True, scope)
            body = ["while True:", "    v, pos = rl(buf, pos)", "    if v == 0: return pos",
                    "    if v < 0:", "        v, pos = rl(buf, pos)", "        pos += v",
                    "        continue", "    for _ in range(v):"]
            if kind == "map":
                body += ["        " + line for line in _SKIP["string"]]
            body += ["        " + line for line in item] + ["        pass"]
        else:
            body = [*self.lines(schema, namespace, True, scope), "return pos"]
        generated: Skipper = _function("skip", "buf, pos", body, scope)
        return generated

    def _simple_named(self, schema: dict[str, Any], namespace: str | None
                      ) -> tuple[Reader, Skipper]:
        """Reader and skipper of an enum or fixed type, registered under its name."""
        full, _ = self._full(schema, namespace)
        self.named[full] = schema
        scope = dict(_SCOPE)
        if schema["type"] == "enum":
            scope["symbols"] = tuple(schema["symbols"])
            read = _function("read", "buf, pos", [*_LONG, "return symbols[v], pos"], scope)
            skip = _function("skip", "buf, pos", ["v, pos = rl(buf, pos)", "return pos"], scope)
        else:
            size = int(schema["size"])
            read = _function("read", "buf, pos", [f"return buf[pos:pos + {size}], pos + {size}"],
                             scope)
            skip = _function("skip", "buf, pos", [f"return pos + {size}"], scope)
        self.readers[full], self.skippers[full] = read, skip
        return read, skip

    def _record(self, schema: dict[str, Any], namespace: str | None,
                keep: set[str] | None) -> Any:
        """A record reader (``keep is None``: every field into a dict), or a skipper
        (``keep`` empty). Registers both forms under the record's name for references."""
        full, space = self._full(schema, namespace)
        first = full not in self.named
        self.named[full] = schema
        scope = dict(_SCOPE)
        skip = keep is not None
        body = [] if skip else ["out = {}"]
        for field in schema["fields"]:
            body.extend(self.lines(field["type"], space, skip, scope))
            if not skip:
                body.append(f"out[{field['name']!r}] = v")
        body.append("return pos" if skip else "return out, pos")
        generated = _function("record", "buf, pos", body, scope)
        if skip:
            self.skippers[full] = generated
            if first:
                self.readers[full] = self._record(schema, namespace, None)
        else:
            self.readers[full] = generated
            if first:
                self.skippers[full] = self._record(schema, namespace, set())
        return generated


def compile_projection(envelope: dict[str, Any], decimal_bytes: bool = False) -> Projection:
    """The projection reader of an envelope schema (a record with ``op``, ``after`` and a
    ``source`` record holding ``ts_ms``). Raises :class:`Unsupported` for what it cannot read.
    ``decimal_bytes``: decimals as their unscaled bytes instead of Decimals."""
    compiler = _Compiler(decimal_bytes)
    namespace = envelope.get("namespace")
    names = [field["name"] for field in envelope["fields"]]
    if not {"op", "after", "source"} <= set(names):
        raise Unsupported("not a change-event envelope")
    scope = dict(_SCOPE)
    body = ["after = ts = None"]
    for field in envelope["fields"]:
        name = field["name"]
        if name == "source" and compiler._kind(field["type"]) == "record":
            body.extend(_source_lines(compiler, field["type"], namespace, scope))
            continue
        body.extend(compiler.lines(field["type"], namespace, name not in ("op", "after"),
                                   scope))
        if name == "op":
            body.append("op = v")
        elif name == "after":
            body.append("after = v")
    body.append("return op, after, ts")
    projection: Projection = _function("project", "buf, pos", body, scope)
    return projection


def _source_lines(compiler: _Compiler, schema: dict[str, Any], namespace: str | None,
                  scope: dict[str, Any]) -> list[str]:
    """Lines that walk the source block inline, keeping ``ts_ms`` in ``ts``."""
    _, space = compiler._full(schema, namespace)
    compiler._record(schema, namespace, None)  # so later references to it resolve
    out = []
    for field in schema["fields"]:
        keep = field["name"] == "ts_ms"
        out.extend(compiler.lines(field["type"], space, not keep, scope))
        if keep:
            out.append("ts = v")
    return out


# ------------------------------------------------------------------------ the compiled program
# ``cdc/_fast.pyx``'s ``run_program`` reads a value with a tree of nodes ``(code, a, b, c)``
# instead of generated Python: the same walk (inline skips of ``before``'s nulls, the source
# block, the tail), the after image built straight into its JSON form by column name (what
# ``cdc.reading.row_builder`` makes of the projection's image). Codes (mirrored there):
N_NULL, N_BOOL, N_LONG, N_FLOAT, N_DOUBLE, N_BYTES, N_STRING = range(7)
S_LONG, S_BYTES, S_FIXED = 7, 8, 9  # skips
N_UNION = 10  # (code, branch nodes)
S_RECORD = 11  # (code, field skip nodes)
N_PY, S_PY = 12, 13  # (code, generated Python reader / skipper): everything else
N_DECTEXT = 14  # (code, scale, precision, fallback: unscaled int -> text): decimal bytes as text
N_CONVERT = 15  # (code, node, to_json): to_json of the node's value unless None
N_ROW = 16  # (code, column names, field nodes): a record as {column: value}

_PRIMITIVE_READ = {"null": N_NULL, "boolean": N_BOOL, "int": N_LONG, "long": N_LONG,
                   "float": N_FLOAT, "double": N_DOUBLE, "bytes": N_BYTES, "string": N_STRING}
_PRIMITIVE_SKIP: dict[str, tuple[int, ...]] = {
    "null": (N_NULL,), "boolean": (S_FIXED, 1), "int": (S_LONG,), "long": (S_LONG,),
    "float": (S_FIXED, 4), "double": (S_FIXED, 8), "bytes": (S_BYTES,), "string": (S_BYTES,)}

#: a program: ``(slot, node)`` steps; slot 0 = op, 1 = after, 2 = source ts_ms, -1 = skipped
Program = tuple[tuple[int, tuple[Any, ...]], ...]


def _decimal_text(precision: int, scale: int) -> Callable[[int], str]:
    """What ``format(Decimal, "f")`` of the decimal reader's value gives, from the unscaled
    integer (the compiled path's fallback for wide or over-precise values)."""
    ctx = Context(prec=precision)
    return lambda n: format(ctx.create_decimal(n).scaleb(-scale, ctx), "f")


def _node(compiler: _Compiler, schema: Any, namespace: str | None, skip: bool,
          text: bool = False) -> tuple[Any, ...]:
    """The node reading (or skipping) ``schema``; ``text``: decimals as their JSON text."""
    while isinstance(schema, dict) and isinstance(schema.get("type"), dict | list):
        schema = schema["type"]
    kind = compiler._kind(schema)
    if kind in _PRIMITIVES:
        return _PRIMITIVE_SKIP[kind] if skip else (_PRIMITIVE_READ[kind],)
    if kind == "union":
        if len(schema) > 63:
            raise Unsupported("a union of more than 63 branches")
        return (N_UNION, tuple(_node(compiler, branch, namespace, skip, text)
                               for branch in schema))
    if kind == "record" and skip:
        _, space = compiler._full(schema, namespace)
        compiler._record(schema, namespace, set())  # registers it for later references
        return (S_RECORD, tuple(_node(compiler, field["type"], space, True)
                                for field in schema["fields"]))
    if kind == "decimal":
        scale = int(schema.get("scale", 0))
        if skip:
            return (S_BYTES,)
        if text and scale >= 0:
            return (N_DECTEXT, scale, int(schema["precision"]),
                    _decimal_text(int(schema["precision"]), scale))
    if skip:
        return (S_PY, compiler.skipper(schema, namespace))
    return (N_PY, compiler.reader(schema, namespace))


def _leaves(node: tuple[Any, ...]) -> set[int]:
    return set().union(*map(_leaves, node[1])) if node[0] == N_UNION else {node[0]}


def _row_node(compiler: _Compiler, schema: Any, namespace: str | None,
              columns: list[tuple[str, str, Any]]) -> tuple[Any, ...]:
    """The after image's node: ``{column: JSON form}`` as ``cdc.reading.row_builder`` makes it."""
    if isinstance(schema, str) and compiler._kind(schema) == "named":
        schema = compiler.named[compiler._lookup(schema, namespace)]
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise Unsupported("the after image is not a record")
    _, space = compiler._full(schema, namespace)
    if [field["name"] for field in schema["fields"]] != [name for _, name, _ in columns]:
        raise Unsupported("the after record's fields are not the columns")
    nodes = []
    for field, (_, _, ctype) in zip(schema["fields"], columns, strict=True):
        convert = ctype.json_converter()
        if convert is not None and ctype.name == "decimal":  # to_json: text as is, else "f"
            node = _node(compiler, field["type"], space, False, text=True)
            if _leaves(node) <= {N_NULL, N_STRING, N_DECTEXT}:
                nodes.append(node)
                continue
        node = _node(compiler, field["type"], space, False)
        nodes.append(node if convert is None else (N_CONVERT, node, convert))
    return (N_ROW, tuple(column for column, _, _ in columns), tuple(nodes))


def compile_program(envelope: dict[str, Any], columns: list[tuple[str, str, Any]]) -> Program:
    """The program of an envelope schema for ``cdc._fast.run_program``: ``(op, after image in
    its JSON form by column, source ts_ms)``, as :func:`compile_projection` and
    ``cdc.reading.row_builder`` together. Raises :class:`Unsupported` like it."""
    compiler = _Compiler()
    namespace = envelope.get("namespace")
    if not {"op", "after", "source"} <= {field["name"] for field in envelope["fields"]}:
        raise Unsupported("not a change-event envelope")
    steps: list[tuple[int, tuple[Any, ...]]] = []
    for field in envelope["fields"]:
        name, schema = field["name"], field["type"]
        if name == "source" and compiler._kind(schema) == "record":
            _, space = compiler._full(schema, namespace)
            compiler._record(schema, namespace, None)  # so later references to it resolve
            steps += [(2 if inner["name"] == "ts_ms" else -1,
                       _node(compiler, inner["type"], space, inner["name"] != "ts_ms"))
                      for inner in schema["fields"]]
        elif name == "after":
            while isinstance(schema, dict) and isinstance(schema.get("type"), dict | list):
                schema = schema["type"]
            branches = schema if isinstance(schema, list) else [schema]
            if len(branches) > 63:
                raise Unsupported("a union of more than 63 branches")
            nodes = tuple((N_NULL,) if branch == "null"
                          else _row_node(compiler, branch, namespace, columns)
                          for branch in branches)
            steps.append((1, (N_UNION, nodes) if isinstance(schema, list) else nodes[0]))
        else:
            steps.append((0 if name == "op" else -1,
                          _node(compiler, schema, namespace, name != "op")))
    return tuple(steps)


#: a log value (header included) -> its after image (None: deleted), or raises
AfterReader = Callable[[bytes], dict[str, Any] | None]


class NotReadable(Exception):
    """The value cannot be read by the compiled reader (the caller uses fastavro)."""


def compile_after_reader(envelope: dict[str, Any]) -> AfterReader | None:
    """A reader of ``after`` (by Avro field name; decimals as their unscaled bytes, which the
    Avro writers re-encode byte for byte) for values of ``envelope``: the capture path reads
    back previous images with it (``cdc/images.py``). None when the schema has a type this
    module does not read."""
    try:
        project = compile_projection(envelope, decimal_bytes=True)
    except (Unsupported, KeyError, TypeError, ValueError):
        return None

    def read(data: bytes) -> dict[str, Any] | None:
        return project(data, 5)[1]
    return read
