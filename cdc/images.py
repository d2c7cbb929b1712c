"""Previous images: the latest after image of a key, to complete a change the source sent
partially (PostgreSQL does not send TOASTed values an UPDATE left unchanged).

Every event in the log must carry the whole row, because compaction throws older events away.
:class:`PreviousImages` answers "what was the last after image of this key?" from, in order:

1. the latest value of every key whose record is not in the log yet: those remembered since
   the last commit started, then those of the commit running in the background (two dicts; the
   second is dropped whole when its commit is durable);
2. a bounded in-memory LRU (``max_bytes`` of encoded values, kept as the logged bytes and
   decoded only when a change needs them) of values lookups read from the log — and, for a log
   without reads by location (Kafka, where a lookup is a round trip), of every value committed;
3. the log: a per-partition index ``key -> offset of its latest record`` (and, for the local
   log, where its bytes are, so a lookup is one small read). Records this process appends are
   indexed as they are committed (:meth:`PreviousImages.appended`); older ones by reading the
   partition, once, the first time one of its keys misses the cache (:class:`KeyIndex`: about
   32 bytes of memory per key of a table that can have partial changes, compiled).

Images are kept in Avro form (as encoded, by Avro field name) with their schema id, so a value
is re-encoded exactly as it was read. A value is taken only from a column of the same name and
the same type; anything else is reported as unavailable, never silently NULL.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from cdc.avro import EventCodec, TableCodec
from cdc.events import TableSchema
from cdc.log.base import AppendResult, ChangeLogReader, Record
from cdc.log.partitioner import partition_for
from cdc.speedups import pure_python

Image = tuple[int, dict[str, Any]]  # (schema id, after image by Avro field name)
#: a key's latest record in the log: its offset, and where its bytes are when the log says
IndexEntry = tuple[int, Any]

#: logical types whose values are fixed-width in every source (never TOASTed, always sent)
FIXED_WIDTH = frozenset({"boolean", "int16", "int32", "int64", "uint64", "float32", "float64",
                         "date", "time", "timestamp", "timestamptz", "uuid", "enum", "interval",
                         "money", "timetz"})
#: Python's cost of a cached image beyond its encoded size (dict, key, LRU entry)
ENTRY_OVERHEAD = 400


def may_be_partial(schema: TableSchema) -> bool:
    """Whether a source may leave some of this table's values unsent (variable-width ones)."""
    cached = _PARTIAL.get(id(schema))
    if cached is None or cached[0] is not schema:
        cached = (schema, any(c.type.name not in FIXED_WIDTH for c in schema.columns))
        _PARTIAL[id(schema)] = cached
    return cached[1]


_PARTIAL: dict[int, tuple[TableSchema, bool]] = {}
_MISSING = object()


class KeyIndex:
    """Where the latest record of each key of one partition is: ``key -> (offset, location)``
    (location: what the log's ``read_at`` takes, or None).

    The compiled twin (``cdc/_fast.pyx``) keeps 64-bit hashes of the keys, about 32 bytes a key
    (a million keys of a table whose updates may need previous images fit in ~50 MB); its
    ``get`` may then answer for another key with the same hash, so callers check the key of the
    record they read (this pure one answers for the key itself only).
    """

    def __init__(self) -> None:
        self._entries: dict[bytes, IndexEntry] = {}

    def put(self, key: bytes, offset: int, location: Any) -> None:
        self._entries[key] = (offset, location)

    def get(self, key: bytes) -> IndexEntry | None:
        return self._entries.get(key)

    def __len__(self) -> int:
        return len(self._entries)


if not pure_python():
    with contextlib.suppress(ImportError):  # the compiled twin, when built
        from cdc._fast import KeyIndex  # type: ignore[import-not-found,no-redef,assignment,unused-ignore] # noqa: F811


def index_appended(records: Sequence[Record], results: Sequence[AppendResult],
                   topics: set[str], indexes: dict[tuple[str, int], Any],
                   read_limit: dict[tuple[str, int], int], make: Callable[[], Any]) -> None:
    """Put each of ``records`` of ``topics`` into ``indexes[(topic, partition)]`` (a
    :class:`KeyIndex`, made with ``make()`` when missing: then ``read_limit[(topic,
    partition)]`` is set to that first record's offset) at its result's offset and location.
    ``results`` may go on past ``records`` (the transaction events a commit added)."""
    where: tuple[str, int] | None = None
    index: Any = None
    for (topic, key, _, _), (_, partition, offset, location) in zip(
            records, results[:len(records)], strict=True):
        if topic not in topics:
            continue
        if where is None or where[0] != topic or where[1] != partition:
            where = (topic, partition)
            index = indexes.get(where)
            if index is None:
                index = indexes[where] = make()
                read_limit[where] = offset  # older records (other runs) are read up to here
        index.put(key, offset, location)


def remember_all(records: list[Record], topics: set[str],
                 buffered: dict[str, dict[bytes, bytes | None]],
                 lru: OrderedDict[tuple[str, bytes], tuple[bytes | None, int]]) -> int:
    """Make each of ``records`` of ``topics`` its key's latest value in ``buffered[topic]``
    (made when missing), in order, and drop the key from ``lru``; the bytes dropped from it
    (the sizes it kept for them)."""
    dropped = 0
    for topic in topics:
        found = buffered.get(topic)
        if found is None:
            found = buffered[topic] = {}
        found.update([(r[1], r[2]) for r in records if r[0] == topic])
    if lru:
        for record in records:
            if record[0] in topics:
                old = lru.pop((record[0], record[1]), None)
                if old is not None:
                    dropped += old[1]
    return dropped


INDEX_APPENDED: Callable[..., None] = index_appended
REMEMBER_ALL: Callable[..., int] = remember_all
if not pure_python():
    with contextlib.suppress(ImportError):  # the compiled twins, when built
        from cdc._fast import (  # type: ignore[import-not-found,no-redef,unused-ignore]
            index_appended as INDEX_APPENDED,  # noqa: N812
        )
        from cdc._fast import (  # type: ignore[import-not-found,no-redef,unused-ignore]
            remember_all as REMEMBER_ALL,  # noqa: N812
        )


class PreviousImages:
    """Finds the latest after image of a key (see the module docstring for where it looks)."""

    def __init__(self, log: ChangeLogReader, codec: EventCodec,
                 max_bytes: int = 48 * 1024**2) -> None:
        self.log = log
        self.codec = codec
        self.max_bytes = max_bytes
        #: whether a record can be read back with one read by its location (the local log)
        self._cheap_reads = hasattr(log, "read_at")
        #: values read from the log by lookups (hot keys), and on a log without cheap reads
        #: every committed one: (topic, key) -> (value, size)
        self._lru: OrderedDict[tuple[str, bytes], tuple[bytes | None, int]] = OrderedDict()
        self._bytes = 0
        #: topic -> key -> the latest value remembered since the last commit started, and
        #: those of the commit running now: neither is in the log yet
        self._buffered: dict[str, dict[bytes, bytes | None]] = {}
        self._committing: dict[str, dict[bytes, bytes | None]] = {}
        self._index: dict[tuple[str, int], KeyIndex] = {}
        self._indexed_to: dict[tuple[str, int], int] = {}
        self.log_lookups = 0
        self.log_scans = 0
        self._partial_topics: set[str] = set()
        #: keys appended by this process: (topic, partition) -> key -> (offset, location)
        self._appended: dict[tuple[str, int], KeyIndex] = {}
        #: (topic, partition) -> the first offset this process appended there: the log is
        #: read (for older keys) only below it
        self._read_limit: dict[tuple[str, int], int] = {}
        self._compatible: dict[tuple[int, int], tuple[TableCodec, dict[str, tuple[str, str]]]] = {}

    # -- keeping the cache -------------------------------------------------------------------
    def remember(self, topic: str, key: bytes, value: bytes | None) -> None:
        """``value`` (the record as logged, not yet in the log) is now the latest of ``key``
        (``None``: the key was deleted). It is decoded only if a later change needs it."""
        self._partial_topics.add(topic)
        found = self._buffered.get(topic)
        if found is None:
            found = self._buffered[topic] = {}
        found[key] = value
        if self._lru:
            self._lru_drop(topic, key)

    def remember_all(self, records: list[Record], topics: set[str]) -> None:
        """:meth:`remember` each of ``records`` whose topic is in ``topics``, in order."""
        self._partial_topics.update(topics)
        self._bytes -= REMEMBER_ALL(records, topics, self._buffered, self._lru)

    def _lru_drop(self, topic: str, key: bytes) -> None:
        old = self._lru.pop((topic, key), None)
        if old is not None:
            self._bytes -= old[1]

    def _lru_keep(self, topic: str, key: bytes, value: bytes | None) -> None:
        """A value read from the log (the key's latest): kept for the next lookup."""
        if not self.max_bytes:
            return
        size = ENTRY_OVERHEAD + (0 if value is None else len(value))
        self._lru[(topic, key)] = (value, size)
        self._bytes += size
        while self._bytes > self.max_bytes and self._lru:
            _, (_, evicted) = self._lru.popitem(last=False)
            self._bytes -= evicted

    def committing(self) -> None:
        """What was remembered so far goes into a commit now (its records are in the log once
        :meth:`appended` is called for it; one commit runs at a time)."""
        self._committing, self._buffered = self._buffered, {}

    def appended(self, records: Sequence[Record], results: Sequence[AppendResult]) -> None:
        """``records`` (the running commit's) are now in the log at ``results``: index the keys
        of tables whose images this cache keeps, so later lookups find them in the log. A log
        without reads by location (Kafka: a lookup there is a round trip to a broker) keeps
        their values in the LRU instead, as the hot keys they are likely to be."""
        committed, self._committing = self._committing, {}
        if not self._cheap_reads:
            for topic, values in committed.items():
                for key, value in values.items():
                    self._lru_drop(topic, key)
                    self._lru_keep(topic, key, value)
        if self._partial_topics:
            INDEX_APPENDED(records, results, self._partial_topics, self._appended,
                           self._read_limit, KeyIndex)

    def forget_all(self) -> None:
        """Drop the cache (after discarding records that were never made durable)."""
        self._lru.clear()
        self._buffered.clear()
        self._committing.clear()
        self._bytes = 0

    # -- looking up --------------------------------------------------------------------------
    def latest(self, topic: str, key: bytes, before: bytes) -> Image | None:
        """The latest after image of ``key`` older than position ``before``; ``None`` if it
        has none (unknown or deleted).

        The cache and the buffer hold only what this process added, in position order, so
        their newest entry is older than the change being filled. The log may also hold
        records a crashed run wrote *after* the point being replayed: those are skipped.
        """
        return self._image_of(self.latest_value(topic, key, before))

    def latest_value(self, topic: str, key: bytes, before: bytes) -> bytes | None:
        """The value (as logged) of ``key``'s latest record older than position ``before``;
        ``None`` if it has none (unknown, or deleted: a tombstone). See :meth:`latest`."""
        for pending in (self._buffered, self._committing):
            found = pending.get(topic)
            if found is not None:
                value = found.get(key, _MISSING)
                if value is not _MISSING:
                    return value  # type: ignore[return-value]
        entry = (topic, key)
        cached = self._lru.get(entry)
        if cached is not None:
            self._lru.move_to_end(entry)
            return cached[0]
        value = self._from_log(topic, key, before)
        self._lru_keep(topic, key, value)
        return value

    def _image_of(self, value: bytes | None) -> Image | None:
        if value is None:
            return None
        schema_id, after = self.codec.decode_after(value)
        return None if after is None else (schema_id, after)

    def _from_log(self, topic: str, key: bytes, before: bytes) -> bytes | None:
        ends = self.log.end_offsets(topic)
        if not ends:
            return None
        self.log_lookups += 1
        partition = partition_for(key, len(ends))
        where = (topic, partition)
        appended = self._appended.get(where)
        found = appended.get(key) if appended is not None else None
        if found is None:
            end = min(ends[partition], self._read_limit.get(where, ends[partition]))
            found = self._catch_up(topic, partition, end).get(key)
        if found is None:
            return None
        offset, where = found
        if where is not None:
            record = self.log.read_at(topic, partition, where)  # type: ignore[attr-defined]
            if record is not None and record.offset == offset and record.key == key:
                if record.position < before:
                    return record.value  # type: ignore[no-any-return]
                return self._scan_for(topic, partition, key, before)
        for record in self.log.read(topic, partition, offset, 1):
            if record.offset == offset and record.key == key and record.position < before:
                return record.value
        return self._scan_for(topic, partition, key, before)

    def _scan_for(self, topic: str, partition: int, key: bytes, before: bytes) -> bytes | None:
        """The slow way, for replays after a crash: the key's newest record before ``before``
        found by reading the whole partition."""
        self.log_scans += 1
        best: tuple[bytes, bytes | None] | None = None
        for record in self.log.iter_partition(topic, partition):
            if record.key == key and record.position < before and (
                    best is None or record.position >= best[0]):
                best = (record.position, record.value)
        return None if best is None else best[1]

    def _catch_up(self, topic: str, partition: int, end: int) -> KeyIndex:
        """The partition's index, extended with the records committed since the last call
        (``end``: the partition's end offset now)."""
        where = (topic, partition)
        index = self._index.get(where)
        if index is None:
            index = self._index[where] = KeyIndex()
        start = self._indexed_to.get(where, 0)
        if start >= end:
            return index
        located = getattr(self.log, "read_located", None)
        if located is not None:  # the local log: remember where each record's bytes are
            while True:
                batch = located(topic, partition, start, 10_000)
                if not batch:
                    break
                for record, place in batch:
                    index.put(record.key, record.offset, place)
                start = batch[-1][0].offset + 1
        else:
            for record in self.log.iter_partition(topic, partition, start):
                index.put(record.key, record.offset, None)
                start = record.offset + 1
        self._indexed_to[where] = start
        return index

    # -- filling -----------------------------------------------------------------------------
    def filler(self, topic: str, key: bytes, unchanged: Sequence[str], position: bytes
               ) -> Callable[[TableCodec, dict[str, Any]], list[str]]:
        """A fill function for :meth:`EventCodec.encode` completing ``unchanged`` columns of
        the change at ``position``."""

        def fill(codec: TableCodec, after: dict[str, Any]) -> list[str]:
            previous = self.latest(topic, key, position)
            if previous is None:
                return list(unchanged)
            schema_id, image = previous
            sources = self._sources(schema_id, codec)
            missing = []
            for name in unchanged:
                old_field, new_field = sources.get(name, (None, None))
                value = image.get(old_field) if old_field is not None else None
                if value is None or new_field is None:
                    missing.append(name)
                else:
                    after[new_field] = value
            return missing

        return fill

    def _sources(self, schema_id: int, codec: TableCodec) -> dict[str, tuple[str, str]]:
        """Per column of ``codec`` that has a column of the same name and type in the image's
        schema ``schema_id``: (its Avro field there, its Avro field here)."""
        cached = self._compatible.get((schema_id, id(codec)))
        if cached is not None and cached[0] is codec:
            return cached[1]
        old_fields = {name: (field, ctype.describe())
                      for name, field, ctype in self.codec.columns_of(schema_id)}
        out = {}
        for column, (_, field, _) in zip(codec.schema.columns, codec.columns, strict=True):
            old = old_fields.get(column.name)
            if old is not None and old[1] == column.type.describe():
                out[column.name] = (old[0], field)
        self._compatible[(schema_id, id(codec))] = (codec, out)
        return out
