"""Avro schemas and encoding of change events (fastavro).

Per table, :func:`value_schema` builds Debezium's ``Envelope`` around a ``Value`` record of the
table's columns, with the ``source`` block of the table's connector
(:class:`cdc.source.EnvelopeSource`) and the ``transaction`` block read from ``cdc/schemas/``.
:class:`EventCodec` registers those schemas in the :class:`~cdc.log.schemas.SchemaStore` (a new
version whenever the columns change) and turns events into log records and back.

Column names that are not valid Avro names (spaces, quotes, dots, leading digits...) are adjusted
like Debezium's ``field.name.adjustment.mode=avro`` (invalid characters become ``_``; collisions
get a numeric suffix); the original name is kept in the field's ``cdc.column`` property and is
what every decoded row uses.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import fastavro

from cdc import __version__
from cdc.avroreader import AfterReader, NotReadable, compile_after_reader
from cdc.avrowriter import Unsupported, Writer, compile_parts, write_long
from cdc.errors import EncodingError, SchemaError
from cdc.events import ChangeEvent, Column, Op, TableSchema, encode_key
from cdc.log.base import Record, SchemaRegistry
from cdc.log.schemas import RegisteredSchema
from cdc.source import EnvelopeSource, envelope_source
from cdc.speedups import pure_python
from cdc.types import ColumnType

SCHEMAS_DIR = Path(__file__).resolve().parent / "schemas"
MAGIC = 0
_FRAME = struct.Struct(">bI")
_INVALID = re.compile(r"[^A-Za-z0-9_]")


@cache
def fixed_schema(file_name: str) -> Any:
    """A fixed part of the envelope from ``cdc/schemas/``."""
    path = SCHEMAS_DIR / file_name
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SchemaError(f"the envelope schema {path} is missing",
                          "reinstall the project (pip install -e .)") from None


def avro_name(name: str) -> str:
    """``name`` made a valid Avro name."""
    adjusted = _INVALID.sub("_", name)
    if not adjusted or adjusted[0].isdigit():
        adjusted = "_" + adjusted
    return adjusted


def field_names(columns: tuple[Column, ...]) -> list[str]:
    """Valid, distinct Avro field names for ``columns``, in order."""
    used: set[str] = set()
    out = []
    for column in columns:
        candidate = base = avro_name(column.name)
        suffix = 1
        while candidate in used:
            suffix += 1
            candidate = f"{base}_{suffix}"
        used.add(candidate)
        out.append(candidate)
    return out


def _namespace(schema: TableSchema) -> str:
    return ".".join(avro_name(part) for part in (schema.source, schema.table.schema,
                                                 schema.table.table))


def _defined_once(avro_type: Any, defined: set[str]) -> Any:
    """``avro_type`` with each named type after its first definition replaced by its full name:
    Avro allows one definition per name (two point columns share Debezium's Point record)."""
    if isinstance(avro_type, list):
        return [_defined_once(branch, defined) for branch in avro_type]
    if not isinstance(avro_type, dict):
        return avro_type
    if avro_type.get("type") == "array":
        return {**avro_type, "items": _defined_once(avro_type["items"], defined)}
    if avro_type.get("type") in ("record", "enum", "fixed"):
        full = ".".join(part for part in (avro_type.get("namespace"), avro_type["name"]) if part)
        if full in defined:
            return full
        defined.add(full)
        if avro_type["type"] == "record":
            return {**avro_type, "fields": [{**f, "type": _defined_once(f["type"], defined)}
                                            for f in avro_type["fields"]]}
    return avro_type


def _fields(columns: tuple[Column, ...]) -> list[dict[str, Any]]:
    out = []
    defined: set[str] = set()
    for column, name in zip(columns, field_names(columns), strict=True):
        avro_type = _defined_once(column.type.avro(), defined)
        field: dict[str, Any] = {"name": name, "cdc.type": column.type.describe()}
        if column.nullable:
            branches = avro_type if isinstance(avro_type, list) else [avro_type]
            field["type"] = ["null", *branches]
            field["default"] = None
        else:
            field["type"] = avro_type
        if name != column.name:
            field["cdc.column"] = column.name
        if column.transform:
            field["cdc.transform"] = column.transform
        out.append(field)
    return out


def value_schema(schema: TableSchema) -> dict[str, Any]:
    """Debezium's envelope for ``schema``'s table."""
    namespace = _namespace(schema)
    source = envelope_source(schema.connector).schema
    value = {"type": "record", "name": "Value", "namespace": namespace,
             "fields": _fields(schema.columns)}
    optional_long = {"type": ["null", "long"], "default": None}
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": namespace,
        "connect.name": f"{namespace}.Envelope",
        "cdc.key": list(schema.key),
        "fields": [
            {"name": "before", "type": ["null", value], "default": None},
            {"name": "after", "type": ["null", f"{namespace}.Value"], "default": None},
            {"name": "source", "type": source},
            {"name": "transaction", "type": ["null", fixed_schema("transaction.avsc")],
             "default": None},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", **optional_long},
            {"name": "ts_us", **optional_long},
            {"name": "ts_ns", **optional_long},
            # extra (not Debezium's): columns whose value is missing from ``after`` because the
            # source did not send it and no previous image had it; null when the row is whole
            {"name": "unavailable_columns",
             "type": ["null", {"type": "array", "items": "string"}], "default": None},
        ],
    }


def json_form(schema: TableSchema, record: Any, row: Any) -> dict[str, Any]:
    """A decoded row as the log's readers see it: through Avro (``record``: the parsed
    ``Value`` record of ``schema``) and back, then each column's JSON form. What ``cdc verify``
    compares a follower's rows with."""
    names = field_names(schema.columns)
    datum = {name: None if row[column.name] is None else column.type.to_avro(row[column.name])
             for column, name in zip(schema.columns, names, strict=True)}
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, record, datum)
    buffer.seek(0)
    back = fastavro.schemaless_reader(buffer, record, None)
    assert isinstance(back, dict)
    return {column.name: None if back[name] is None else column.type.to_json(back[name])
            for column, name in zip(schema.columns, names, strict=True)}


def key_schema(schema: TableSchema) -> dict[str, Any]:
    """The Avro schema of the key's columns (the key *bytes* are canonical JSON)."""
    columns = tuple(schema.column(name) for name in schema.key)
    return {"type": "record", "name": "Key", "namespace": _namespace(schema),
            "fields": _fields(columns)}


# ----------------------------------------------------------------------------------- encoding

Converter = Callable[[Any], Any]


@dataclass
class TableCodec:
    """Everything needed to encode events of one table schema version."""

    schema: TableSchema
    registered: RegisteredSchema
    parsed: Any
    #: (column name, avro field name, converter) per column
    columns: list[tuple[str, str, Converter]]
    #: the compiled writer of the envelope (None: the schema needs fastavro's general writer)
    writer: Writer | None = None
    #: the compiled writers of every record's fields, by the record's full name
    parts: dict[str, list[tuple[str, Writer]]] | None = None

    def __post_init__(self) -> None:
        #: Avro field name -> column index
        self.field_index = {field: i for i, (_, field, _) in enumerate(self.columns)}
        self.header = _FRAME.pack(MAGIC, self.registered.id)
        #: (Value field types, Value field writers) for the connectors' raw row encoders
        self.value_fields: list[dict[str, Any]] = (
            self.registered.schema["fields"][0]["type"][1]["fields"])
        self.value_writers: list[Writer] | None = None
        if self.parts is not None:
            value_name = f"{_namespace(self.schema)}.Value"
            found = self.parts.get(value_name)
            if found is not None and [n for n, _ in found] == [f["name"] for f in
                                                                  self.value_fields]:
                self.value_writers = [w for _, w in found]

    @property
    def schema_id(self) -> int:
        return self.registered.id

    def row(self, row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row is None:
            return None
        out: dict[str, Any] = {}
        for column, field, convert in self.columns:
            value = row.get(column)
            if value is None:
                out[field] = None
                continue
            try:
                out[field] = convert(value)
            except EncodingError as exc:
                raise EncodingError(f"{self.schema.table}.{column}: {exc.problem}",
                                    exc.fix) from None
        return out


#: completes an after image in place; returns the columns it could not fill
Filler = Callable[[TableCodec, dict[str, Any]], list[str]]

_ENVELOPE_FIELDS = ["before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns",
                    "unavailable_columns"]
#: the envelope's ``op`` field (an Avro string of one character)
_OPS = {op: b"\x02" + op.value.encode() for op in Op}


def envelope_tail(out: bytearray, pieces: tuple[bytes, bytes, bytes], sequence: str | None,
                  lsn: int | None, txn_prefix: bytes | None, total: int, dco: int, op: bytes,
                  times: bytes) -> None:
    """Append an envelope from ``source`` to ``ts_ns``: the source block's fixed ``pieces``
    around its two varying fields (:attr:`cdc.source.EnvelopeSource.varying`: an optional
    string such as PostgreSQL's ``sequence``, then an optional long such as its ``lsn``), the
    transaction block (``txn_prefix``: its
    union byte and id, or None for no block; then ``total`` and ``dco``), the ``op`` bytes and
    the ``times`` bytes (ts_ms, ts_us, ts_ns)."""
    out += pieces[0]
    if sequence is None:
        out.append(0)
    else:
        data = sequence.encode()
        out.append(2)
        write_long(len(data), out)
        out += data
    out += pieces[1]
    if lsn is None:
        out.append(0)
    else:
        out.append(2)
        write_long(lsn, out)
    out += pieces[2]
    if txn_prefix is None:
        out.append(0)
    else:
        out += txn_prefix
        write_long(total, out)
        write_long(dco, out)
    out += op
    out += times


ENVELOPE_TAIL: Callable[..., None] = envelope_tail
if not pure_python():
    with contextlib.suppress(ImportError):  # the compiled twin (cdc/_fast.pyx), when built
        from cdc._fast import (  # type: ignore[import-not-found,no-redef,unused-ignore]
            envelope_tail as ENVELOPE_TAIL,  # noqa: N811
        )


def _no_reader(value: bytes) -> dict[str, Any] | None:
    raise NotReadable("no reader")


def _no_writer(value: Any, out: bytearray) -> None:
    raise ValueError("no writer")


def _once(fill: Filler) -> Filler:
    """``fill`` that runs once: a second call (the typed path after the fast one declined)
    replays the values and the answer of the first."""
    done: list[tuple[dict[str, Any], list[str]]] = []

    def replay(codec: TableCodec, after: dict[str, Any]) -> list[str]:
        if not done:
            filled: dict[str, Any] = {}
            done.append((filled, fill(codec, filled)))
        after.update(done[0][0])
        return list(done[0][1])
    return replay


@dataclass
class DecodedValue:
    """A value read back from the log, as JSON-friendly Python objects."""

    schema_id: int
    envelope: dict[str, Any]


class EventCodec:
    """Encodes :class:`ChangeEvent` s as log records and decodes log values back to JSON."""

    def __init__(self, store: SchemaRegistry) -> None:
        self.store = store
        self._pieces: dict[tuple[Any, ...], tuple[TableCodec, tuple[bytes, bytes, bytes] | None]]
        self._pieces = {}
        self._txn: tuple[str, bytes] = ("", b"")
        self._times: tuple[int, bytes] = (-1, b"")
        self._unavailable_writer: Writer = _no_writer
        self._spec: EnvelopeSource | None = None
        self._lock = threading.Lock()
        self._cached_keys: tuple[str, ...] = ()
        self._after_readers: dict[int, AfterReader | None] = {}
        self._codecs: dict[str, TableCodec] = {}
        self._by_identity: dict[int, TableCodec] = {}
        self._parsed: dict[int, tuple[Any, list[tuple[str, str, ColumnType]]]] = {}

    def table(self, schema: TableSchema) -> TableCodec:
        """The codec for ``schema``, registering a new schema version when the columns changed."""
        by_identity = self._by_identity.get(id(schema))
        if by_identity is not None and by_identity.schema is schema:
            return by_identity
        with self._lock:  # sources may register from their own threads
            return self._register(schema)

    def _register(self, schema: TableSchema) -> TableCodec:
        fingerprint = json.dumps(schema.describe(), sort_keys=True)
        codec = self._codecs.get(fingerprint)
        if codec is None:
            envelope = value_schema(schema)
            registered = self.store.register(f"{schema.topic}-value", envelope)
            self.store.register(f"{schema.topic}-key", key_schema(schema))
            columns: list[tuple[str, str, Converter]] = [
                (column.name, field, column.type.to_avro)
                for column, field in zip(schema.columns, field_names(schema.columns), strict=True)
            ]
            parsed = fastavro.parse_schema(envelope)
            try:
                writer: Writer | None
                writer, parts = compile_parts(envelope)
            except Unsupported:
                writer, parts = None, None
            codec = TableCodec(schema, registered, parsed, columns, writer, parts)
            self._codecs[fingerprint] = codec
        by_identity = TableCodec(schema, codec.registered, codec.parsed, codec.columns,
                                 codec.writer, codec.parts)
        self._by_identity[id(schema)] = by_identity
        return by_identity

    def source_block(self, event: ChangeEvent) -> dict[str, Any]:
        """Debezium's ``source`` block of ``event``: the fields every connector has, the
        connector's defaults, then the event's own ``source_info``."""
        schema = event.schema
        block: dict[str, Any] = {
            "version": __version__, "connector": schema.connector, "name": schema.source,
            "ts_ms": event.ts_ms, "snapshot": "false", "db": schema.database,
            "sequence": None, "ts_us": event.ts_ms * 1000, "ts_ns": event.ts_ms * 1_000_000,
        }
        block.update(envelope_source(schema.connector).defaults(schema))
        block.update(event.source_info)
        return block

    def encode(self, event: ChangeEvent, fill: Filler | None = None) -> bytes:
        """The log value of ``event``.

        ``fill(codec, after)`` completes an after image whose ``event.unchanged`` columns the
        source did not send, in place (by Avro field name, Avro form), and returns the names of
        those it could not fill; it is called at most once per event.

        Events with raw images (``event.raw``) take the fast path: the connector writes the
        row images' bytes itself and the fixed parts of the envelope come from caches; the
        bytes are exactly those of the typed path, which is used whenever the fast one
        declines.
        """
        codec = self.table(event.schema)
        if fill is not None:
            fill = _once(fill)
        if event.raw is not None and codec.writer is not None:
            value = self._encode_raw(event, codec, fill)
            if value is not None:
                return value
        return self._encode_typed(event, codec, fill)

    def _encode_typed(self, event: ChangeEvent, codec: TableCodec, fill: Filler | None
                      ) -> bytes:
        processed = event.processed_ms if event.processed_ms is not None else int(
            time.time() * 1000)
        after = codec.row(event.after)
        unavailable = None
        if event.unchanged and after is not None:
            unavailable = list(event.unchanged) if fill is None else fill(codec, after) or None
        datum = {
            "before": codec.row(event.before),
            "after": after,
            "source": self.source_block(event),
            "transaction": event.transaction.to_dict() if event.transaction else None,
            "op": event.op.value,
            "ts_ms": processed,
            "ts_us": processed * 1000,
            "ts_ns": processed * 1_000_000,
            "unavailable_columns": unavailable,
        }
        header = codec.header
        if codec.writer is not None:
            out = bytearray(header)
            try:
                codec.writer(datum, out)
                return bytes(out)
            except (ValueError, TypeError, KeyError, AttributeError, struct.error):
                pass  # a value the fast path does not know: fastavro decides (or explains)
        buffer = io.BytesIO()
        buffer.write(header)
        try:
            fastavro.schemaless_writer(buffer, codec.parsed, datum)
        except (ValueError, TypeError) as exc:
            raise EncodingError(f"cannot encode a change of {event.schema.table}: {exc}",
                                "this is a bug in the connector; please report it") from None
        return buffer.getvalue()

    # -- the fast path -----------------------------------------------------------------------
    def _encode_raw(self, event: ChangeEvent, codec: TableCodec, fill: Filler | None
                    ) -> bytes | None:
        """The value of an event with raw images, or None when the typed path must do it."""
        pieces = self._source_pieces(codec, event)
        raw = event.raw
        if pieces is None or raw is None:
            return None
        filled: dict[str, Any] | None = None
        unavailable = None
        if event.unchanged and event.op is not Op.DELETE:
            filled = {}
            unavailable = list(event.unchanged) if fill is None else fill(codec, filled) or None
        out = bytearray(codec.header)
        if not raw.encode_images(codec, out, filled):
            return None
        source_info = event.source_info
        transaction = event.transaction
        txn_prefix = None
        if transaction is not None:
            if self._txn[0] != transaction.id:
                data = transaction.id.encode()
                prefix = bytearray(b"\x02")
                write_long(len(data), prefix)
                self._txn = (transaction.id, bytes(prefix) + data)
            txn_prefix = self._txn[1]
        processed = event.processed_ms if event.processed_ms is not None else int(
            time.time() * 1000)
        if self._times[0] != processed:
            times = bytearray()
            for value in (processed, processed * 1000, processed * 1_000_000):
                times.append(2)
                write_long(value, times)
            self._times = (processed, bytes(times))
        spec = self._spec
        assert spec is not None  # set by _source_pieces
        ENVELOPE_TAIL(out, pieces, source_info.get(spec.varying[0]),
                      source_info.get(spec.varying[1]),
                      txn_prefix, transaction.total_order if transaction else 0,
                      transaction.data_collection_order if transaction else 0, _OPS[event.op],
                      self._times[1])
        if unavailable is None:
            out.append(0)
        else:
            self._unavailable_writer(unavailable, out)
        return bytes(out)

    def _source_pieces(self, codec: TableCodec, event: ChangeEvent
                       ) -> tuple[bytes, bytes, bytes] | None:
        """The ``source`` block's bytes around its two varying fields, cached per table codec,
        commit time and the values of the block's other per-event fields; None when the
        connector has no fast path or the block is not of the usual shape."""
        spec = self._spec
        if spec is None or spec.connector != event.schema.connector:
            spec = self._spec = envelope_source(event.schema.connector)
            self._cached_keys = tuple(sorted(spec.fast_keys - set(spec.varying)))
        source_info = event.source_info
        key = (id(codec), event.ts_ms, *[source_info.get(k) for k in self._cached_keys])
        cached = self._pieces.get(key)
        if cached is not None and cached[0] is codec:
            return cached[1]
        pieces = self._make_pieces(codec, event, spec)
        if len(self._pieces) > 256:
            self._pieces.clear()
        self._pieces[key] = (codec, pieces)
        return pieces

    def _make_pieces(self, codec: TableCodec, event: ChangeEvent, spec: EnvelopeSource
                     ) -> tuple[bytes, bytes, bytes] | None:
        if (codec.parts is None or len(spec.varying) != 2
                or not set(event.source_info) <= spec.fast_keys):
            return None
        envelope = codec.parts.get(f"{_namespace(codec.schema)}.Envelope")
        record = spec.schema
        source = codec.parts.get(f"{record.get('namespace')}.{record['name']}")
        if envelope is None or source is None or [n for n, _ in envelope] != _ENVELOPE_FIELDS:
            return None
        self._unavailable_writer = envelope[-1][1]
        block = self.source_block(event)
        pieces: list[bytes] = []
        current = bytearray()
        for name, writer in source:
            if name in spec.varying:
                pieces.append(bytes(current))
                current = bytearray()
            else:
                writer(block[name], current)
        pieces.append(bytes(current))
        if [n for n, _ in source if n in spec.varying] != list(spec.varying):
            return None
        return pieces[0], pieces[1], pieces[2]

    def source_parts(self, codec: TableCodec, event: ChangeEvent, varying: Sequence[str]
                     ) -> list[bytes] | None:
        """For connectors that write whole envelopes themselves: the bytes of ``event``'s
        ``source`` block between the ``varying`` fields (``len(varying) + 1`` pieces, in the
        block's field order), written by the registered schema's writers; None when the codec
        has no compiled writers, the envelope is not of the usual shape
        (before, after, source, transaction, op, ts_ms, ts_us, ts_ns, unavailable_columns), or
        the block's fields are not in ``varying``'s order."""
        if codec.parts is None:
            return None
        spec = envelope_source(event.schema.connector)
        envelope = codec.parts.get(f"{_namespace(codec.schema)}.Envelope")
        record = spec.schema
        source = codec.parts.get(f"{record.get('namespace')}.{record['name']}")
        if envelope is None or source is None or [n for n, _ in envelope] != _ENVELOPE_FIELDS:
            return None
        if [n for n, _ in source if n in varying] != list(varying):
            return None
        block = self.source_block(event)
        pieces: list[bytes] = []
        current = bytearray()
        for name, writer in source:
            if name in varying:
                pieces.append(bytes(current))
                current = bytearray()
            else:
                writer(block[name], current)
        pieces.append(bytes(current))
        return pieces

    # -- records -----------------------------------------------------------------------------
    def key_bytes(self, event: ChangeEvent) -> bytes:
        """The key bytes of ``event`` (:func:`encode_key`; ``{}`` for a truncate)."""
        if event.op is Op.TRUNCATE:
            return b"{}"
        if event.raw is not None:
            return event.raw.key_bytes()
        key_values = event.key
        return encode_key(event.schema, key_values) if key_values is not None else b"{}"

    def records(self, event: ChangeEvent, fill: Filler | None = None) -> list[Record]:
        """The log records for ``event``: the event itself, plus a tombstone after a delete.

        A truncate has no key of its own; it is keyed by the empty JSON object so it has a
        place in the topic (its tombstones per key are the connector's job). ``fill``: see
        :meth:`encode`.
        """
        topic = event.schema.topic
        position = event.position.to_bytes()
        key = self.key_bytes(event)
        value = self.encode(event, fill)
        if event.op is Op.DELETE:
            return [Record(topic, key, value, position), Record(topic, key, None, position)]
        return [Record(topic, key, value, position)]

    def decode_raw(self, value: bytes) -> tuple[int, dict[str, Any]]:
        """The schema id and the envelope of a log value in Avro form (as encoded)."""
        if len(value) < _FRAME.size or value[0] != MAGIC:
            raise SchemaError("a log value does not start with the Avro wire-format header",
                              "the log was written by something else; check log.path")
        _, schema_id = _FRAME.unpack_from(value)
        parsed, _ = self._reader(schema_id)
        datum = fastavro.schemaless_reader(io.BytesIO(value[_FRAME.size :]), parsed, None)
        assert isinstance(datum, dict)
        return schema_id, datum

    def decode_after(self, value: bytes) -> tuple[int, dict[str, Any] | None]:
        """The schema id and the after image (Avro form, by field name) of a log value.

        Faster than :meth:`decode_raw` for flat rows (see cdc/avroreader.py); ``decimal``
        values come back as their unscaled bytes, which every writer here re-encodes to the
        same bytes as the ``Decimal`` fastavro would return."""
        if len(value) < _FRAME.size or value[0] != MAGIC:
            return self._after_of(self.decode_raw(value))
        schema_id = _FRAME.unpack_from(value)[1]
        reader = self._after_readers.get(schema_id, _no_reader)
        if reader is _no_reader:
            reader = compile_after_reader(self.store.get(schema_id).schema)
            self._after_readers[schema_id] = reader
        if reader is not None:
            try:
                return schema_id, reader(value)
            except (NotReadable, IndexError, UnicodeDecodeError, struct.error):
                pass
        return self._after_of(self.decode_raw(value))

    @staticmethod
    def _after_of(decoded: tuple[int, dict[str, Any]]) -> tuple[int, dict[str, Any] | None]:
        return decoded[0], decoded[1].get("after")

    def columns_of(self, schema_id: int) -> list[tuple[str, str, ColumnType]]:
        """(column name, Avro field name, type) per column of a registered value schema."""
        return self._reader(schema_id)[1]

    # -- decoding ----------------------------------------------------------------------------
    def _reader(self, schema_id: int) -> tuple[Any, list[tuple[str, str, ColumnType]]]:
        cached = self._parsed.get(schema_id)
        if cached is None:
            envelope = self.store.get(schema_id).schema
            value = envelope["fields"][0]["type"][1]
            columns = [
                (f.get("cdc.column", f["name"]), f["name"], ColumnType.from_description(
                    f["cdc.type"]))
                for f in value["fields"]
            ]
            cached = (fastavro.parse_schema(envelope), columns)
            self._parsed[schema_id] = cached
        return cached

    def decode_value(self, value: bytes) -> DecodedValue:
        """The envelope of a log value, JSON-friendly (numerics as strings, times ISO-8601)."""
        schema_id, datum = self.decode_raw(value)
        columns = self.columns_of(schema_id)
        for image in ("before", "after"):
            row = datum.get(image)
            if row is not None:
                datum[image] = {
                    column: None if row[field] is None else ctype.to_json(row[field])
                    for column, field, ctype in columns
                }
        return DecodedValue(schema_id, datum)
