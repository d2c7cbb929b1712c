"""The one read path of ``cdc apply``: a planned range of the change log, read and decoded.

Spark-free (the core): the Spark data source (``spark_apply/source.py``), the apply tasks on the
executors (``spark_apply/tasks.py``) and the Kafka reader's tasks (``spark_apply/kafka_read.py``)
all read through it, so a record is turned into a change one way only.

Contracts, stated exactly:

* **A micro-batch is planned once, from its offsets.** :func:`plan_ranges` turns the batch's
  ``(start, end]`` source offsets (as the ``cdc`` source stores them in the query's checkpoint:
  ``{"topics": {topic: {"<partition>": next_offset}}, "watermarks": {...}}``) into
  :class:`Range` s: per partition, offsets ``start <= offset < end`` — the *next* offset to read
  is stored, so the end is exclusive and a partition missing from ``start`` starts at 0.
  Transaction-event topics are never handed to followers (they are read for boundaries only).
* **Reading a range** (:func:`read_range`) yields every record the log still holds in it, in
  offset order, in chunks of at most :data:`CHUNK`; offsets compaction removed are absent (the
  newest record of every key stays: the log's contract).
* **Decoding** (:class:`Decoder`) turns a value into ``(op, after image in its JSON form, source
  ts_ms)`` with the compiled projection of its schema where there is one, else the codec —
  the same image either way. :func:`to_change` makes the follower's :class:`~cdc.sink.Change`:
  a tombstone (no value) is a delete at the record's position; a truncate is ``None`` (a
  table-level event, never applied as a row).
* **One reader and decoder per log per process** (:func:`open_log`): executors keep them for
  the life of the Python worker.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdc.avro import EventCodec
from cdc.avroreader import RUN_PROGRAM as _RUN_PROGRAM
from cdc.avroreader import Projection, compile_program, compile_projection
from cdc.avrowriter import Unsupported
from cdc.connect import VALUE_PREFIX, ConnectJson
from cdc.log.base import ChangeLogReader, Committed, StoredRecord
from cdc.sink import Change
from cdc.transactions import is_transaction_topic

#: records per log read (and per Arrow batch the Spark source hands over)
CHUNK = 8192


@dataclass(frozen=True)
class Range:
    """Offsets ``start <= offset < end`` of one partition, with the topic's meta."""

    topic: str
    partition: int
    start: int
    end: int
    source: str | None
    table: str | None


def plan_ranges(state: Committed, start: Mapping[str, Any], end: Mapping[str, Any]
                ) -> list[Range]:
    """The non-empty ranges of the batch ``(start, end]`` (see the module docstring), in the
    order of ``end``'s topics and partitions."""
    ranges = []
    for topic, parts in end.get("topics", {}).items():
        info = state.topics.get(topic)
        meta = info.meta if info is not None else {}
        if is_transaction_topic(meta):
            continue  # read for its boundaries only, never handed to followers
        for partition, stop in parts.items():
            begin = int(start.get("topics", {}).get(topic, {}).get(partition, 0))
            if stop > begin:
                ranges.append(Range(topic, int(partition), begin, int(stop),
                                    meta.get("source"), meta.get("table")))
    return ranges


def balance(ranges: Sequence[Range], groups: int) -> list[list[Range]]:
    """``ranges`` spread over at most ``groups`` non-empty groups, balanced by length (largest
    first, each to the group with the fewest offsets so far)."""
    out: list[list[Range]] = [[] for _ in range(max(1, min(groups, len(ranges))))]
    sizes = [0] * len(out)
    for item in sorted(ranges, key=lambda r: (r.start - r.end, r.topic, r.partition)):
        smallest = sizes.index(min(sizes))
        out[smallest].append(item)
        sizes[smallest] += item.end - item.start
    return [group for group in out if group]


def read_range(log: ChangeLogReader, item: Range) -> Iterator[list[StoredRecord]]:
    """The records of ``item`` (offsets ``start <= offset < end``), in chunks of at most
    :data:`CHUNK`; offsets compaction removed are simply absent."""
    at = item.start
    while at < item.end:
        records = log.read(item.topic, item.partition, at, min(CHUNK, item.end - at))
        if not records:
            return  # compaction removed everything left in the range
        if records[-1].offset >= item.end:
            records = [record for record in records if record.offset < item.end]
        yield records
        at = records[-1].offset + 1 if records else item.end


#: one record as the fold sees it: its range (topic, source, table), key bytes, position bytes,
#: offset, and a payload only a :data:`Decode` looks at (the value bytes, or a decoded row)
RawRecord = tuple[Range, bytes, bytes, int, Any]
#: turns a record's parts and payload into its change (``None``: a truncate)
Decode = Callable[[Range, bytes, bytes, Any], "Change | None"]


def raw_records(log: ChangeLogReader, ranges: Iterable[Range],
                owned: Callable[[str, bytes], bool] | None = None) -> Iterator[RawRecord]:
    """Every record of ``ranges`` as a :data:`RawRecord` (payload: the value bytes, ``None``
    for a tombstone); with ``owned``, only the keys it accepts."""
    for item in ranges:
        for chunk in read_range(log, item):
            for record in chunk:
                if owned is None or owned(item.topic, record.key):
                    yield item, record.key, record.position, record.offset, record.value


class Decoder:
    """What a row needs of a log value: ``(op, after image, source ts_ms)``.

    Reads with the compiled projection of the value's schema (``cdc/avroreader.py``: skips
    the before image and most of the envelope); a schema it cannot compile is decoded by
    :meth:`EventCodec.decode_value`. Either way the after image is turned into its JSON form by
    the column types' ``to_json``, exactly as :meth:`EventCodec.decode_value` does.
    """

    def __init__(self, codec: EventCodec) -> None:
        self.codec = codec
        self._plans: dict[int, tuple[Projection | None, Any]] = {}
        #: schema id -> the compiled program (``cdc/_fast.pyx``; None: not compiled)
        self._programs: dict[int, Any] = {}
        self._connect: ConnectJson | None = None

    def _plan(self, schema_id: int) -> tuple[Projection | None, Any]:
        """The projection of a value schema (``None``: fastavro) and its row builder (after
        image by Avro field name -> ``{column: JSON form}``)."""
        plan = self._plans.get(schema_id)
        if plan is None:
            columns = self.codec.columns_of(schema_id)
            try:
                projection: Projection | None = compile_projection(
                    self.codec.store.get(schema_id).schema)
            except (Unsupported, KeyError, TypeError, ValueError):
                projection = None
            plan = self._plans[schema_id] = (projection, row_builder(columns))
        return plan

    def _program(self, schema_id: int) -> Any:
        """The compiled program of a value schema, or None (no compiled twin, or a schema it
        cannot read: :meth:`_plan`'s path)."""
        program = None
        if _RUN_PROGRAM is not None and self._plan(schema_id)[0] is not None:
            try:
                program = compile_program(self.codec.store.get(schema_id).schema,
                                          self.codec.columns_of(schema_id))
            except (Unsupported, KeyError, TypeError, ValueError):
                program = None
        self._programs[schema_id] = program
        return program

    def decode_image(self, value: bytes) -> tuple[str, dict[str, Any] | None, int | None]:
        """``(op, after image in its JSON form or None, source ts_ms)`` of a log value."""
        if len(value) < 5 or value[0] != 0:
            if value.startswith(VALUE_PREFIX):  # Kafka Connect's JSON form (log.format: json)
                return self.decode_image(self._connect_json().to_avro(value) or b"")
            self.codec.decode_raw(value)  # raises the SchemaError that explains it
        schema_id = int.from_bytes(value[1:5], "big")
        try:
            program = self._programs[schema_id]
        except KeyError:
            program = self._program(schema_id)
        if program is not None and _RUN_PROGRAM is not None and type(value) is bytes:
            op, image, ts = _RUN_PROGRAM(program, value, 5)
            if image is None or op not in ("c", "u", "r"):
                return op, None, ts
            return op, image, ts
        projection, columns = self._plan(schema_id)
        if projection is None:
            envelope = self.codec.decode_value(value).envelope
            op, ts = envelope["op"], envelope["source"]["ts_ms"]
            return op, envelope["after"] if op in ("c", "u", "r") else None, ts
        op, image, ts = projection(value, 5)
        if image is None or op not in ("c", "u", "r"):
            return op, None, ts
        return op, columns(image), ts

    def _connect_json(self) -> ConnectJson:
        if self._connect is None:
            self._connect = ConnectJson(self.codec.store)
        return self._connect

    def decode(self, value: bytes) -> tuple[str, str | None, int | None]:
        """As :meth:`decode_image`, the image as compact JSON."""
        op, image, ts = self.decode_image(value)
        return op, None if image is None else dumps(image), ts

    def change(self, item: Range, key: bytes, position: bytes, value: bytes | None
               ) -> Change | None:
        """The record's change (a :data:`Decode`): see :func:`to_change`."""
        if value is None:
            return to_change(item, key, position, "", None, None)
        op, image, ts = self.decode_image(value)
        return to_change(item, key, position, op, image, ts)


def to_change(item: Range, key: bytes, position: bytes, op: str | None,
              image: dict[str, Any] | None, ts: int | None) -> Change | None:
    """The follower's change of one decoded record: ``op`` ``""`` is a tombstone (a delete at
    its position, no row); ``"t"`` (a truncate) is ``None``."""
    if op == "t":
        return None
    return Change(topic=item.topic, source=item.source or "", table=item.table or "",
                  key=key.decode(), position=bytes(position), row=image, op=op or "",
                  ts_ms=None if ts is None else int(ts))


def row_builder(columns: Sequence[tuple[str, str, Any]]) -> Any:
    """A generated function: after image by Avro field name -> ``{column: JSON form}`` (None
    stays None; the type's ``to_json`` otherwise, skipped where it returns the datum as is),
    columns in schema order. The same as ``{c: None if image[f] is None else t.to_json(image[f])
    for c, f, t in columns}``, without a call per column that changes nothing."""
    scope: dict[str, Any] = {}
    items = []
    for index, (column, name, ctype) in enumerate(columns):
        convert = ctype.json_converter()
        if convert is None:
            items.append(f"{column!r}: image[{name!r}]")
        else:
            scope[f"c{index}"] = convert
            items.append(f"{column!r}: None if (v := image[{name!r}]) is None else c{index}(v)")
    source = "def build(image):\n    return {" + ", ".join(items) + "}"
    exec(source, scope)  # noqa: S102 - our own generated source; names embedded with repr()
    return scope["build"]


#: compact JSON, non-ASCII kept (one encoder: json.dumps builds a new one per call otherwise)
dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode

_OPEN: dict[str, tuple[ChangeLogReader, Decoder]] = {}
_OPEN_LOCK = threading.Lock()
#: logs kept open per process; the least recently used one beyond is closed (an executor reads
#: one or two logs, a process running many applies, e.g. a test session, many)
KEPT_OPEN = 4


def open_log(settings: str) -> tuple[ChangeLogReader, Decoder]:
    """The reader and decoder of the log ``settings`` (JSON, ``cdc.log.open.log_settings``),
    kept open in this process for the next call (at most :data:`KEPT_OPEN` logs). The cache is
    safe across threads; a reader is not meant to be used by two threads at once — a thread that
    reads beside another opens its own (``cdc.log.open.reader_from``)."""
    from cdc.log.open import reader_from

    with _OPEN_LOCK:
        found = _OPEN.pop(settings, None)
        if found is None:
            reader = reader_from(json.loads(settings))
            assert reader is not None
            found = (reader, Decoder(EventCodec(reader.schemas())))
        _OPEN[settings] = found  # the most recently used last
        while len(_OPEN) > KEPT_OPEN:
            oldest = _OPEN.pop(next(iter(_OPEN)))[0]
            oldest.close()
        return found
