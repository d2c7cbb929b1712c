"""Transaction boundaries in the log: Debezium's transaction events and each source's *cut*.

Every source has a one-partition topic ``<source>.transaction`` holding Debezium's transaction
events: ``BEGIN`` (status, id, ts_ms) when a source transaction's first change is logged and
``END`` (plus ``event_count`` and ``data_collections``: the changes per table) in the same
commit as its last change. END also carries ``ends`` (ours, not Debezium's): for every partition
the transaction wrote, the offset just past its last record there — so a reader can stop at the
end of any transaction without reading the data.

The source offset committed with every append carries the source's *cut*
(:data:`cdc.log.base.CUT_KEY`): the ends of all its topics (the transaction topic included) as
of its last boundary — the end of the last whole transaction, or the last snapshot checkpoint.
A reader that stops at a cut never holds part of a source transaction.

Keys are ``{"id": "<transaction id>"}`` (JSON, as every key); values are Avro in Confluent's
framing under the subject ``<source>.transaction-value``.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import fastavro

from cdc.avro import MAGIC, fixed_schema
from cdc.avrowriter import Unsupported, Writer, compile_parts
from cdc.log.base import AppendResult, Record, SchemaRegistry
from cdc.speedups import pure_python

#: the suffix of a source's transaction topic
TOPIC_SUFFIX = "transaction"
BEGIN = "BEGIN"
END = "END"
_FRAME_SIZE = 5

Ends = dict[str, dict[str, int]]  # topic -> partition (as text) -> next offset


def transaction_topic(source: str) -> str:
    """The topic of ``source``'s transaction events (Debezium's ``<prefix>.transaction``)."""
    return f"{source}.{TOPIC_SUFFIX}"


def is_transaction_topic(meta: Mapping[str, Any]) -> bool:
    """Whether a topic (by its meta) holds transaction events, not rows."""
    return meta.get("kind") == "transactions"


@dataclass
class OpenTransaction:
    """A source transaction whose changes are being logged."""

    id: str
    ts_ms: int
    position: bytes
    #: changes per table (Debezium's data collection name: ``schema.table``)
    counts: dict[str, int] = field(default_factory=dict)
    #: the BEGIN event is in the log already (written by an earlier append)
    begun: bool = False
    #: where its records are so far: topic -> partition -> next offset
    ends: dict[str, dict[str, int]] = field(default_factory=dict)


class TransactionEvents:
    """Encodes (and decodes) one source's transaction events."""

    def __init__(self, source: str, store: SchemaRegistry) -> None:
        self.source = source
        self.topic = transaction_topic(source)
        self.schema = fixed_schema("transaction_event.avsc")
        self._parsed = fastavro.parse_schema(self.schema)
        self._store = store
        self._header: bytes | None = None
        self._writer: Writer | None
        try:  # the project's compiled writer: fastavro's bytes, a fraction of its time
            self._writer = compile_parts(self.schema)[0]
        except Unsupported:
            self._writer = None

    def _frame(self) -> bytes:
        if self._header is None:
            registered = self._store.register(f"{self.topic}-value", self.schema)
            self._header = bytes([MAGIC]) + int(registered.id).to_bytes(4, "big")
        return self._header

    def record(self, status: str, txn: OpenTransaction, position: bytes,
               ends: Ends | None = None) -> Record:
        value: dict[str, Any] = {"status": status, "id": txn.id, "ts_ms": txn.ts_ms,
                                 "event_count": None, "data_collections": None, "ends": None}
        if status == END:
            value["event_count"] = sum(txn.counts.values())
            value["data_collections"] = [{"data_collection": name, "event_count": count}
                                         for name, count in sorted(txn.counts.items())]
            value["ends"] = ends or {}
        key = json.dumps({"id": txn.id}, separators=(",", ":")).encode()
        if self._writer is not None:
            data = bytearray(self._frame())
            self._writer(value, data)
            return Record(self.topic, key, bytes(data), position)
        out = io.BytesIO()
        out.write(self._frame())
        fastavro.schemaless_writer(out, self._parsed, value)
        return Record(self.topic, key, out.getvalue(), position)

    def decode(self, value: bytes) -> dict[str, Any]:
        """A transaction event's fields (the schema is fixed, whatever the id)."""
        result = fastavro.schemaless_reader(io.BytesIO(value[_FRAME_SIZE:]), self._parsed,
                                            self._parsed)
        assert isinstance(result, dict)
        return result


def decode_event(value: bytes) -> dict[str, Any]:
    """A transaction event's fields, without a registry (the schema is fixed)."""
    parsed = _PARSED.get("schema")
    if parsed is None:
        parsed = _PARSED["schema"] = fastavro.parse_schema(fixed_schema("transaction_event.avsc"))
    result = fastavro.schemaless_reader(io.BytesIO(value[_FRAME_SIZE:]), parsed, parsed)
    assert isinstance(result, dict)
    return result


_PARSED: dict[str, Any] = {}


def advance(ends: Ends, results: Sequence[AppendResult]) -> None:
    """Move ``ends`` past every record in ``results`` (in place)."""
    for result in results:
        parts = ends.setdefault(result.topic, {})
        key = str(result.partition)
        if parts.get(key, 0) <= result.offset:
            parts[key] = result.offset + 1


if not pure_python():
    with contextlib.suppress(ImportError):  # the compiled twin (cdc/_fast.pyx), when built
        from cdc._fast import advance  # type: ignore[import-not-found,no-redef,unused-ignore] # noqa: F811


def touched(results: Sequence[AppendResult]) -> Ends:
    """The ends of just the partitions ``results`` wrote."""
    ends: Ends = {}
    advance(ends, results)
    return ends
