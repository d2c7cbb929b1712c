"""The fast row path: PostgreSQL text tuples (pgoutput, COPY) straight to Avro bytes.

The typed path turns every column's text into a Python value (``PgType.parse``), that into an
Avro datum (``ColumnType.to_avro``), and a dict of those into bytes (``cdc/avrowriter.py``).
For the types whose text form PostgreSQL prints canonically (``PgType.kind`` other than
``GENERIC``) this module writes the Avro bytes from the text directly, and for every other column
runs exactly the typed path's three steps for that one column. The result is byte-for-byte what
the typed path writes (``tests/test_rowcodec.py`` checks both implementations against it on
every type and on edge values); a text that does not have the expected shape (infinities, BC
dates, NaN in a decimal, a value the typed path would reject) is handed to the column's typed
steps, and any error makes the caller fall back to the typed path for the whole event, so error
messages stay the typed path's.

Two implementations of the same contract: this file (pure Python) and the compiled
``connectors/postgres/_fast`` (Cython, built by ``pip install -e .`` when a C compiler is
there). The compiled one is used when it imports and ``CDC_PURE_PYTHON`` is not set to ``1``.

Plans (built once per table schema and codec by :func:`row_plan` and :func:`key_plan`) are
plain tuples so both implementations read the same data:

* a column: ``(kind, prefix, alt, scale, parse, to_avro, write)`` where ``prefix`` is the union
  branch byte of the value's branch (``-1``: the field is not a union), ``alt`` the byte of the
  ``string`` branch of a decimal (its NaN/Infinity), ``write`` the compiled Avro writer of the
  whole field (its union included);
* a key column: ``(json name prefix, index, kind, parse, ctype)``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from cdc.speedups import pure_python
from cdc.types import days_from_civil
from connectors.postgres import types as pgt

UNCHANGED: Any = None  # set below from pgoutput (kept import-cycle free)
_PLAIN_NUMERIC = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
_PLAIN_DECIMAL = re.compile(r"-?[0-9]+(?:\.([0-9]*))?")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_DOUBLE = __import__("struct").Struct("<d").pack
_FLOAT = __import__("struct").Struct("<f").pack
_SPECIALS = ("NaN", "Infinity", "-Infinity")

#: logical type names each fast kind is valid for (anything else is planned GENERIC)
KIND_TYPES: dict[int, frozenset[str]] = {
    pgt.LONG: frozenset({"int16", "int32", "int64"}),
    pgt.BOOL: frozenset({"boolean"}),
    pgt.DOUBLE: frozenset({"float64"}),
    pgt.FLOAT: frozenset({"float32"}),
    pgt.STRING: frozenset({"string", "json", "xml", "ltree", "enum"}),
    pgt.UUID: frozenset({"uuid"}),
    pgt.NUMERIC_TEXT: frozenset({"numeric"}),
    pgt.DECIMAL: frozenset({"decimal"}),
    pgt.TIMESTAMPTZ: frozenset({"timestamptz"}),
    pgt.TIMESTAMP: frozenset({"timestamp"}),
    pgt.DATE: frozenset({"date"}),
    pgt.BYTEA: frozenset({"bytes"}),
}

Column = tuple[int, int, int, int, Callable[[str], Any], Callable[[Any], Any],
               Callable[[Any, bytearray], None]]
KeyColumn = tuple[str, int, int, Callable[[str], Any], Any]


def _branches(field_type: Any) -> tuple[int, int]:
    """(value branch byte, string branch byte) of a field type; -1 when it is no union."""
    if not isinstance(field_type, list):
        return -1, -1
    value = alt = -1
    for index, branch in enumerate(field_type):
        if branch == "null":
            continue
        if branch == "string" and any(isinstance(b, dict) and b.get("logicalType") == "decimal"
                                      for b in field_type):
            alt = index << 1
        elif value == -1:
            value = index << 1
    return value, alt


def row_plan(parsers: Sequence[pgt.PgType], value_fields: list[dict[str, Any]],
             writers: Sequence[Callable[[Any, bytearray], None]],
             types: Sequence[Any]) -> tuple[Column, ...]:
    """The plan of a table's ``Value`` record: one entry per column, in column order.

    ``value_fields`` are the Avro fields of the record (as registered), ``writers`` their
    compiled writers, ``types`` the columns' :class:`~cdc.types.ColumnType` s.
    """
    plan = []
    for parser, field, write, ctype in zip(parsers, value_fields, writers, types, strict=True):
        kind = parser.kind if ctype.name in KIND_TYPES.get(parser.kind, ()) else pgt.GENERIC
        prefix, alt = _branches(field["type"])
        if kind == pgt.DECIMAL and (prefix == -1) != (alt == -1):
            kind = pgt.GENERIC
        if kind == pgt.DECIMAL and prefix == -1:  # [bytes, string]: not nullable
            prefix, alt = 0, 2
        scale = ctype.scale or 0
        plan.append((kind, prefix, alt, scale, parser.parse, ctype.to_avro, write))
    return tuple(plan)


def key_plan(names: Sequence[str], key: Sequence[str], parsers: Sequence[pgt.PgType],
             types: Sequence[Any]) -> tuple[KeyColumn, ...]:
    """The plan of the key bytes (:func:`cdc.events.encode_key`) from a text tuple."""
    out = []
    for position, name in enumerate(key):
        index = list(names).index(name)
        prefix = ("{" if position == 0 else ",") + json.dumps(name, ensure_ascii=False) + ":"
        kind = parsers[index].kind
        if types[index].name not in KIND_TYPES.get(kind, ()):
            kind = pgt.GENERIC
        out.append((prefix, index, kind, parsers[index].parse, types[index]))
    return tuple(out)


# ------------------------------------------------------------------------------ pure Python

def _write_long(n: int, out: bytearray) -> None:
    n = (n << 1) ^ (n >> 63)
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _write_text(text: str, out: bytearray) -> None:
    data = text.encode()
    _write_long(len(data), out)
    out += data


def _timestamptz(text: str) -> str | None:
    """``YYYY-MM-DD HH:MM:SS[.f]+00`` as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``; None otherwise."""
    size = len(text)
    if size < 22 or size > 29 or text[4] != "-" or text[10] != " " or text[-3:] != "+00":
        return None
    if size == 22:
        return text[:10] + "T" + text[11:19] + ".000000Z"
    if text[19] != "." or size < 24:
        return None
    return text[:10] + "T" + text[11:19] + "." + text[20:-3].ljust(6, "0") + "Z"


def _timestamp(text: str) -> int | None:
    """``YYYY-MM-DD HH:MM:SS[.f]`` as microseconds since the epoch; None otherwise."""
    size = len(text)
    if size < 19 or size > 26 or text[4] != "-" or text[10] != " " or (
            size > 19 and (text[19] != "." or size == 20)):
        return None
    days = days_from_civil(int(text[:4]), int(text[5:7]), int(text[8:10]))
    seconds = days * 86_400 + int(text[11:13]) * 3600 + int(text[14:16]) * 60 + int(text[17:19])
    return seconds * 1_000_000 + (int(text[20:].ljust(6, "0")) if size > 19 else 0)


def _decimal(text: str, scale: int) -> bytes | None:
    """The unscaled two's complement bytes of a decimal text with at most ``scale`` fraction
    digits; None for anything else."""
    match = _PLAIN_DECIMAL.fullmatch(text)
    if match is None:
        return None
    fraction = match[1]
    digits = len(fraction) if fraction is not None else 0
    if digits > scale:
        return None
    unscaled = int(text.replace(".", "", 1) if fraction is not None else text) * 10 ** (
        scale - digits)
    data: bytes = unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)
    return data


def encode_row(plan: tuple[Column, ...], values: Sequence[object], out: bytearray,
               filled: dict[int, Any] | None) -> None:
    """Append the Avro bytes of one row's fields (no union byte of the image itself).

    ``values``: text, ``None`` (NULL) or :data:`UNCHANGED` per column. An unchanged column is
    written from ``filled[index]`` (an Avro datum) when present, else as null. Raises on any
    value the plan cannot encode (the caller falls back to the typed path).
    """
    if len(values) != len(plan):
        raise ValueError("a tuple of another width than the table")
    for column, text in zip(plan, values, strict=True):
        kind, prefix, alt, scale, parse, to_avro, write = column
        if text is None:
            write(None, out)
            continue
        if text is UNCHANGED:
            raise ValueError("an unchanged TOAST value (use encode_row_filled)")
        if kind == pgt.GENERIC:
            write(to_avro(parse(text)), out)  # type: ignore[arg-type]
            continue
        assert isinstance(text, str)
        if prefix >= 0 and kind != pgt.DECIMAL:
            out.append(prefix)
        if kind == pgt.LONG:
            _write_long(int(text), out)
        elif kind == pgt.STRING:
            _write_text(text, out)
        elif kind == pgt.TIMESTAMPTZ:
            formatted = _timestamptz(text)
            if formatted is None:
                _generic_after_prefix(column, text, out, prefix)
            else:
                _write_text(formatted, out)
        elif kind == pgt.DECIMAL:
            unscaled = _decimal(text, scale)
            if unscaled is not None:
                out.append(prefix)
                _write_long(len(unscaled), out)
                out += unscaled
            elif text in _SPECIALS:
                out.append(alt)
                _write_text(text, out)
            else:
                _generic_after_prefix(column, text, out, -1)
        elif kind == pgt.BOOL:
            out.append(1 if text == "t" else 0)
        elif kind == pgt.DOUBLE:
            out += _DOUBLE(float(text))
        elif kind == pgt.FLOAT:
            out += _FLOAT(float(text))
        elif kind == pgt.DATE:
            if len(text) == 10 and text[4] == "-":
                _write_long(days_from_civil(int(text[:4]), int(text[5:7]), int(text[8:10])),
                            out)
            else:
                _generic_after_prefix(column, text, out, prefix)
        elif kind == pgt.TIMESTAMP:
            micros = _timestamp(text)
            if micros is None:
                _generic_after_prefix(column, text, out, prefix)
            else:
                _write_long(micros, out)
        elif kind == pgt.UUID:
            if _UUID.fullmatch(text) is None:
                _generic_after_prefix(column, text, out, prefix)
            else:
                _write_text(text, out)
        elif kind == pgt.NUMERIC_TEXT:
            if _PLAIN_NUMERIC.fullmatch(text) is None and text not in _SPECIALS:
                _generic_after_prefix(column, text, out, prefix)
            else:
                _write_text(text, out)
        elif kind == pgt.BYTEA:
            if text.startswith("\\x"):
                data = bytes.fromhex(text[2:])
                _write_long(len(data), out)
                out += data
            else:
                _generic_after_prefix(column, text, out, prefix)
        else:
            raise ValueError(f"unknown kind {kind}")


_fallbacks = 0


def fallbacks() -> int:
    """How many values of a fast kind went through their typed steps (a diagnostic)."""
    return _fallbacks


def _generic_after_prefix(column: Column, text: str, out: bytearray, prefix: int) -> None:
    """The typed steps for one value whose union byte was already written: take it back."""
    global _fallbacks
    _fallbacks += 1
    if prefix >= 0:
        del out[-1]
    column[6](column[5](column[4](text)), out)


def encode_row_filled(plan: tuple[Column, ...], values: Sequence[object], out: bytearray,
                      filled: dict[int, Any] | None) -> None:
    """:func:`encode_row` for a tuple with unchanged columns (written from ``filled``)."""
    unchanged = UNCHANGED
    for index, (column, text) in enumerate(zip(plan, values, strict=True)):
        if text is unchanged:
            column[6](None if filled is None else filled.get(index), out)
        else:
            encode_row((column,), (text,), out, None)


def key_json(plan: tuple[KeyColumn, ...], values: Sequence[object]) -> bytes:
    """The key bytes of a text tuple (see :func:`cdc.events.encode_key`)."""
    parts = []
    for prefix, index, kind, parse, ctype in plan:
        text = values[index]
        parts.append(prefix)
        if text is None or text is UNCHANGED:
            parts.append("null")
        elif kind == pgt.LONG:
            parts.append(str(int(text)))  # type: ignore[call-overload]
        elif kind == pgt.STRING:
            parts.append(json.dumps(text, ensure_ascii=False))
        else:
            parts.append(json.dumps(ctype.to_json(ctype.to_avro(parse(text))),  # type: ignore[arg-type]
                                    separators=(",", ":"), ensure_ascii=False))
    parts.append("}")
    return "".join(parts).encode()


class TextRows:
    """:class:`cdc.events.RawImages` of a PostgreSQL change: the text tuples as received.

    ``table`` is the connector's ``CapturedTable`` (its parsers, plans and typed ``row()``);
    ``old``/``new`` the before/after tuples (``None``: no such image).
    """

    __slots__ = ("table", "old", "new")

    def __init__(self, table: Any, old: Sequence[object] | None,
                 new: Sequence[object] | None) -> None:
        self.table = table
        self.old = old
        self.new = new

    def rows(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        row = self.table.row
        return (None if self.old is None else row(self.old),
                None if self.new is None else row(self.new))

    def key_bytes(self) -> bytes:
        values = self.new if self.new is not None else self.old
        assert values is not None
        return KEY_JSON(self.table.key_plan(), values)

    def encode_images(self, codec: Any, out: bytearray, filled: dict[str, Any] | None) -> bool:
        """Append the ``before`` and ``after`` fields of the envelope (union byte included);
        False (``out`` untouched) when this codec has no plan for the table or a value needs
        the typed path. ``filled`` (by Avro field name) is given exactly when the event has
        unchanged columns: those are written from it, or as null when it lacks them."""
        plan = self.table.row_plan(codec)
        if plan is None:
            return False
        mark = len(out)
        try:
            if self.old is None:
                out.append(0)
            else:
                out.append(2)
                ENCODE_ROW(plan, self.old, out, None)
            if self.new is None:
                out.append(0)
            elif filled is not None:  # the event has unchanged columns: values from ``filled``
                out.append(2)
                fields = codec.field_index
                ENCODE_ROW_FILLED(plan, self.new, out,
                                  {fields[name]: value for name, value in filled.items()})
            else:
                out.append(2)
                ENCODE_ROW(plan, self.new, out, None)
        except Exception:  # noqa: BLE001 - the typed path decides (and explains)
            del out[mark:]
            return False
        return True


# ------------------------------------------------------------ replication messages -> records

#: a relation's plan for :func:`encode_changes`: (topic, row plan, key plan, envelope header,
#: source block bytes before ``ts_ms``, between ``ts_ms`` and ``sequence``, between ``ts_ns``
#: and ``txId``, table id, column count (of the tuples), the table schema logged,
#: :func:`skip_plan` of its values or None, and the column rules or None: per logged column
#: ``(index in the tuple, code, argument)`` (see :func:`_ruled`)
ChangePlan = tuple[str, tuple[Column, ...], tuple[KeyColumn, ...], bytes, bytes, bytes, bytes,
                   Any, int, Any, Any, Any]
_OP_BYTES = {0x49: b"\x02c", 0x55: b"\x02u", 0x44: b"\x02d"}
_POSITION = __import__("struct").Struct(">BQQQ").pack


#: how a value's Avro bytes are skipped over (rowcodec.skip_plan): per union branch or type
SKIP_NOTHING, SKIP_VARINT, SKIP_BYTE, SKIP_4, SKIP_8, SKIP_BLOB = 0, 1, 2, 3, 4, 5
_SKIPS = {"null": SKIP_NOTHING, "boolean": SKIP_BYTE, "int": SKIP_VARINT, "long": SKIP_VARINT,
          "float": SKIP_4, "double": SKIP_8, "string": SKIP_BLOB, "bytes": SKIP_BLOB}


def _skip_code(avro_type: Any) -> int | None:
    if isinstance(avro_type, dict):
        if avro_type.get("type") == "enum":
            return SKIP_VARINT
        return _skip_code(avro_type.get("type"))
    return _SKIPS.get(avro_type) if isinstance(avro_type, str) else None


def skip_plan(value_fields: Sequence[dict[str, Any]]) -> tuple[tuple[int, ...], ...] | None:
    """How to step over each field of a ``Value`` record's bytes: ``(0, code)`` for a plain
    type, ``(1, code of branch 0, code of branch 1, ...)`` for a union; None when a field is of
    a type not stepped over this way (records, arrays, maps, fixed)."""
    out = []
    for field in value_fields:
        kind = field["type"]
        codes = [_skip_code(branch) for branch in kind] if isinstance(kind, list) else [
            _skip_code(kind)]
        if None in codes:
            return None
        out.append((int(isinstance(kind, list)), *codes))  # type: ignore[arg-type]
    return tuple(out)


def _read_long(data: bytes, at: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("a varint past the end")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), at


def _skip(column: tuple[int, ...], data: bytes, at: int) -> int:
    """The index just past one field's bytes at ``at`` (ValueError if they do not fit)."""
    if column[0]:
        branch, at = _read_long(data, at)
        if not 0 <= branch < len(column) - 1:
            raise ValueError("a union branch out of range")
        code = column[1 + branch]
    else:
        code = column[1]
    if code == SKIP_VARINT:
        _, at = _read_long(data, at)
    elif code == SKIP_BLOB:
        size, at = _read_long(data, at)
        if size < 0:
            raise ValueError("a negative length")
        at += size
    else:
        at += (0, 0, 1, 4, 8)[code]
    if at > len(data):
        raise ValueError("a value past the end")
    return at


def after_fields(skips: tuple[tuple[int, ...], ...], value: bytes) -> list[bytes] | None:
    """The Avro bytes of each field of a logged envelope's ``after`` image (union branch
    included), or None when it has none (a delete) or does not parse."""
    try:
        at = 5
        branch, at = _read_long(value, at)
        if branch == 1:  # a before image: step over it
            for column in skips:
                at = _skip(column, value, at)
        elif branch != 0:
            return None
        branch, at = _read_long(value, at)
        if branch != 1:
            return None
        fields = []
        for column in skips:
            end = _skip(column, value, at)
            fields.append(value[at:end])
            at = end
        return fields
    except (ValueError, IndexError):
        return None


def _raw_tuple(data: bytes, at: int, width: int) -> list[Any] | None:
    """A TupleData of exactly ``width`` text, null or unchanged-TOAST columns; None for
    anything else."""
    if at + 2 > len(data) or int.from_bytes(data[at:at + 2], "big") != width:
        return None
    at += 2
    values: list[str | None] = []
    for _ in range(width):
        if at >= len(data):
            return None
        kind = data[at]
        at += 1
        if kind == 0x74:
            length = int.from_bytes(data[at:at + 4], "big")
            if at + 4 + length > len(data):
                return None
            values.append(data[at + 4:at + 4 + length].decode())
            at += 4 + length
        elif kind == 0x6E:
            values.append(None)
        elif kind == 0x75:
            values.append(UNCHANGED)
        else:
            return None
    return values


def encode_changes(plans: dict[int, ChangePlan | None], messages: Sequence[Any], start: int,
                   txn: Any, records: list[Any], record: Callable[..., Any], times: bytes,
                   touched: dict[Any, Any],
                   previous: Callable[[str, bytes, bytes], bytes | None] | None = None,
                   recent: dict[tuple[str, bytes], bytes | None] | None = None
                   ) -> tuple[int, int]:
    """Encode the run of row changes at ``messages[start:]`` straight into log records.

    ``messages`` are XLogData messages as received (``w``, start LSN, WAL end, send time, the
    pgoutput message: :meth:`ReplicationStream.batches` with ``raw``) of the open
    transaction ``txn`` (the stream's ``_Transaction``: its ``ordinal`` is advanced here, its
    ``per_table`` counts by topic too). Inserts, deletes and plain updates (no old tuple) of a
    relation with a plan in ``plans`` (by relation oid) whose tuples hold only text and null
    values are encoded exactly as the event path encodes them
    (:meth:`cdc.avro.EventCodec.records` of the stream's ``ChangeEvent``, processing times
    ``times``), appended to ``records`` (made by
    ``record(topic, key, value, position)``; a delete adds its tombstone), and their tables'
    schemas put in ``touched`` (by topic).

    An update with unchanged TOAST values is encoded too when every one of them is found: the
    key's latest value is looked up in ``recent`` (``(topic, key) -> value``, None for a
    delete: the records this call made, kept up to date here), else by ``previous(topic, key,
    position)`` (see :meth:`cdc.source.StreamingSource.use_previous_images`); it must be of the
    same schema, and its ``after`` image's fields are copied as they are (the plan's
    :func:`skip_plan` steps over them).

    Stops at the first message that is anything else — another kind, a relation without a
    plan, an old tuple on an update, unchanged values not found, a value the fast kinds decline
    and whose typed steps fail — without consuming it.

    Returns ``(index of the first message not consumed, changes encoded)``.
    """
    index = start
    events = 0
    while index < len(messages):
        raw = messages[index]  # XLogData: 'w', start LSN, WAL end, send time, pgoutput
        lsn, data = int.from_bytes(raw[1:9], "big"), raw[25:]
        kind = data[0] if len(data) >= 7 else 0
        if kind not in _OP_BYTES:
            break
        plan = plans.get(int.from_bytes(data[1:5], "big"))
        if plan is None:
            break
        topic, row, key_plan, header, head, middle, tail, _, width, schema, _, rules = plan
        if (kind == 0x44) != (data[5] in (0x4B, 0x4F)) or (kind != 0x44 and data[5] != 0x4E):
            break
        values = _raw_tuple(data, 6, width)
        if values is None:
            break
        if rules is not None:
            try:
                values = [_ruled(values[index], code, argument)
                          for index, code, argument in rules]
            except Exception:  # noqa: BLE001 - the typed path decides (and explains)
                break
        out = bytearray(header)
        try:
            key = key_json(key_plan, values)
            old: list[bytes] | None = None
            if UNCHANGED in values:
                old = _unchanged_from(plan, values, key, txn, previous, recent)
                if old is None:
                    break
            if kind == 0x44:
                out.append(2)
                encode_row(row, values, out, None)
                out.append(0)
            else:
                out += b"\x00\x02"
                if old is None:
                    encode_row(row, values, out, None)
                else:
                    for column, text, field in zip(row, values, old, strict=True):
                        if text is UNCHANGED:
                            out += field
                        else:
                            encode_row((column,), (text,), out, None)
        except Exception:  # noqa: BLE001 - the typed path decides (and explains)
            break
        per = txn.per_table[topic] = txn.per_table.get(topic, 0) + 1
        txn.ordinal += 1
        out += head
        _write_long(txn.commit_ms, out)
        out += middle
        out.append(2)
        _write_text(f'["{txn.commit_text}","{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"]', out)
        for number in (txn.commit_ms * 1000, txn.commit_ms * 1_000_000):
            out.append(2)
            _write_long(number, out)
        out += tail
        for number in (txn.xid, lsn):
            out.append(2)
            _write_long(number, out)
        out.append(0)  # xmin
        out += txn.txn_prefix
        _write_long(txn.ordinal, out)
        _write_long(per, out)
        out += _OP_BYTES[kind]
        out += times
        out.append(0)  # no unavailable columns
        position = _POSITION(1, txn.commit_lsn, 1, txn.ordinal)
        value = bytes(out)
        records.append(record(topic, key, value, position))
        if recent is not None:
            recent[(topic, key)] = None if kind == 0x44 else value
        if kind == 0x44:
            records.append(record(topic, key, None, position))
        touched[topic] = schema
        events += 1
        index += 1
    return index, events


def _ruled(text: Any, code: int, argument: Any) -> Any:
    """A column rule (cdc/columns.py) applied to one text value: 0 keep, 1 null, 2 mask (with
    ``argument``'s UTF-8 text), 3 truncate to ``argument`` characters, 4 hash (``argument`` of
    the text); NULL and unchanged TOAST values stay as they are (as the event path leaves
    them)."""
    if code == 0 or text is None or text is UNCHANGED:
        return text
    if code == 1:
        return None
    if code == 2:
        return argument.decode()
    if code == 4:
        return argument(text)
    return text[:argument]


def _unchanged_from(plan: ChangePlan, values: Sequence[Any], key: bytes, txn: Any,
                    previous: Callable[[str, bytes, bytes], bytes | None] | None,
                    recent: dict[tuple[str, bytes], bytes | None] | None
                    ) -> list[bytes] | None:
    """The ``after`` fields of the key's latest value, when they can fill ``values``'
    unchanged columns (see encode_changes); None otherwise."""
    topic, key_plan, header, skips = plan[0], plan[2], plan[3], plan[10]
    if skips is None or previous is None or recent is None:
        return None
    if any(values[column[1]] is UNCHANGED for column in key_plan):
        return None
    found = recent.get((topic, key), _NOT_RECENT)
    if found is _NOT_RECENT:
        found = previous(topic, key, _POSITION(1, txn.commit_lsn, 1, txn.ordinal + 1))
    if not isinstance(found, bytes) or found[:5] != header:
        return None
    fields = after_fields(skips, found)
    if fields is None or any(  # a null there reads as "not available" on the event path
            text is UNCHANGED and field == b"\x00" and column[0] and column[1] == SKIP_NOTHING
            for text, field, column in zip(values, fields, skips, strict=True)):
        return None
    return fields


_NOT_RECENT = object()


# ------------------------------------------------------------------- COPY text rows -> records

#: a table's plan for :func:`encode_copy`: (topic, row plan, key plan, envelope header, the
#: envelope's bytes from its ``source`` block through ``op`` (the same for every row of a
#: snapshot), column count (of COPY's rows), the snapshot's LSN, the table schema logged, and
#: the column rules or None (as in :data:`ChangePlan`)
CopyPlan = tuple[str, tuple[Column, ...], tuple[KeyColumn, ...], bytes, bytes, int, int, Any,
                 Any]
_COPY_ESCAPE = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|(.))", re.DOTALL)
_COPY_LETTERS = {b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v"}


def _copy_unescape(match: re.Match[bytes]) -> bytes:
    octal, hexa, other = match.groups()
    if octal is not None:
        return bytes([int(octal, 8) & 0xFF])
    if hexa is not None:
        return bytes([int(hexa, 16)])
    return _COPY_LETTERS.get(other, other)  # type: ignore[no-any-return]


def copy_fields(line: bytes) -> tuple[str | None, ...]:
    """One row of ``COPY ... TO STDOUT`` (text format, without its newline) as text values."""
    return tuple(None if field == b"\\N" else _COPY_ESCAPE.sub(_copy_unescape, field).decode()
                 for field in line.split(b"\t"))


def encode_copy(plan: CopyPlan, data: bytes, start: int, number: int, records: list[Any],
                record: Callable[..., Any], times: bytes) -> tuple[int, int]:
    """Encode the complete rows of ``data[start:]`` (COPY text format) as snapshot records.

    Each row gets the next row ``number`` (from ``number + 1``) and position
    ``(LSN, snapshot, number)``, and is encoded exactly as the event path encodes the snapshot's
    ``ChangeEvent`` of it (processing times ``times``); records are appended to ``records``,
    made by ``record(topic, key, value, position)``. Stops at the first row that is cut short
    (its bytes are the next call's) or that the compiled loop declines — another column count,
    a value the fast kinds decline and whose typed steps fail — without consuming it.

    Returns ``(index of the first byte not consumed, the last row number used)``.
    """
    topic, row, key_plan, header, tail, width, lsn, _, rules = plan
    at = start
    while at < len(data):
        end = data.find(b"\n", at)
        if end < 0:
            break
        try:
            values: Sequence[Any] = copy_fields(data[at:end])
            if len(values) != width:
                break
            if rules is not None:
                values = [_ruled(values[index], code, argument)
                          for index, code, argument in rules]
            out = bytearray(header)
            out += b"\x00\x02"
            encode_row(row, values, out, None)
            key = key_json(key_plan, values)
        except Exception:  # noqa: BLE001 - the event path decides (and explains)
            break
        out += tail
        out += times
        out.append(0)
        number += 1
        records.append(record(topic, key, bytes(out), _POSITION(1, lsn, 0, number)))
        at = end + 1
    return at, number


def _pure() -> bool:
    return pure_python()


def implementation() -> str:
    """``"compiled"`` or ``"pure"``: which implementation :data:`ENCODE_ROW` & co. are."""
    return IMPLEMENTATION


ENCODE_ROW: Callable[..., None] = encode_row
ENCODE_CHANGES: Callable[..., tuple[int, int]] = encode_changes
ENCODE_COPY: Callable[..., tuple[int, int]] = encode_copy
ENCODE_ROW_FILLED: Callable[..., None] = encode_row_filled
KEY_JSON: Callable[..., bytes] = key_json
IMPLEMENTATION = "pure"
FALLBACKS: Callable[[], int] = fallbacks


def _bind() -> None:
    global UNCHANGED, ENCODE_ROW, ENCODE_ROW_FILLED, KEY_JSON, IMPLEMENTATION, FALLBACKS, \
        ENCODE_CHANGES, ENCODE_COPY
    from connectors.postgres import pgoutput

    UNCHANGED = pgoutput.UNCHANGED_TOAST
    if _pure():
        return
    try:
        from connectors.postgres import _fast  # type: ignore[attr-defined]
    except ImportError:
        return
    _fast.init(pgoutput.UNCHANGED_TOAST)
    ENCODE_ROW, ENCODE_ROW_FILLED, KEY_JSON = _fast.encode_row, _fast.encode_row_filled, \
        _fast.key_json
    FALLBACKS = _fast.fallbacks
    ENCODE_CHANGES = _fast.encode_changes
    ENCODE_COPY = _fast.encode_copy
    IMPLEMENTATION = "compiled"


_bind()
