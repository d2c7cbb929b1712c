"""The change log: what every backend (local segment files, Kafka) promises.

A log is a set of *topics* (one per captured table), each split into a fixed number of
*partitions*; a record's partition is Kafka's murmur2 partition of its key bytes, so every change to
one key lands in one partition, in append order. Offsets inside a partition start at 0 and strictly
increase; compaction removes records but never renumbers the survivors.

Contracts, stated exactly:

* :meth:`ChangeLogWriter.append` returns only once the records **and** the source offsets passed
  with them are durable, atomically: after a crash either all of them are in the log or none is.
  Nothing that :meth:`append` returned for is ever lost.
* Readers see only committed records. A read that starts at offset ``n`` returns records with
  offsets ``>= n`` in increasing order; offsets compacted away are simply absent.
* :meth:`ChangeLogReader.end_offsets` gives, per partition, the offset the *next* append will get
  (one past the last committed record) — the resume point for a reader that has read everything.
  (Kafka's transaction markers take offsets too, so there the next record may land further on:
  readers must never assume offsets are dense.)
* :meth:`ChangeLogReader.committed` reads one committed state at once: topics, ends and the
  source offsets committed with them. A source's offset may hold a ``cut`` (see
  :data:`CUT_KEY`): the ends of that source's topics at its last *transaction boundary*; records
  past a source's cut belong to a source transaction not yet complete in the log.

Callers never name a backend: :func:`cdc.log.open.open_writer` and
:func:`cdc.log.open.open_reader` make one from the config.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cdc.errors import LogError

#: the key, in a source offset stored in the log, of that source's *cut*: ``{topic: {"<p>":
#: next offset}}`` for every partition of every topic of the source, as of the end of the last
#: whole source transaction (or snapshot chunk) in the log. Everything before a cut is complete.
CUT_KEY = "cut"


class Record(NamedTuple):
    """A record to append. ``value is None`` makes it a tombstone. (A named tuple: one is made
    per change, and tuples are the cheapest immutable objects to make.)"""

    topic: str
    key: bytes
    value: bytes | None
    position: bytes


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A record as read back from the log."""

    topic: str
    partition: int
    offset: int
    #: when the log appended it (ms since the epoch); drives tombstone retention
    timestamp_ms: int
    key: bytes
    value: bytes | None
    position: bytes

    @property
    def is_tombstone(self) -> bool:
        return self.value is None


class AppendResult(NamedTuple):
    """Where one appended record went."""

    topic: str
    partition: int
    offset: int
    #: where its bytes are, when the backend can say (the local log: segment file, first byte,
    #: size); lets a reader fetch it again with one read
    location: Any = None


@dataclass
class TopicInfo:
    """A topic's fixed settings and what it describes."""

    name: str
    partitions: int
    #: free-form description, e.g. {"source": "shop", "table": "public.orders"}
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class PartitionStats:
    topic: str
    partition: int
    start_offset: int
    end_offset: int
    records: int
    tombstones: int
    bytes: int
    segments: int


@dataclass
class CompactionReport:
    """What one compaction pass did."""

    segments_rewritten: int = 0
    records_before: int = 0
    records_after: int = 0
    tombstones_dropped: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    seconds: float = 0.0
    #: true when the writer lock was free, so active segments were rolled and compacted too
    offline: bool = False


@dataclass
class Committed:
    """One committed state of the log, read at once (:meth:`ChangeLogReader.committed`)."""

    topics: dict[str, TopicInfo]
    #: per topic, per partition: one past the last committed offset
    ends: dict[str, list[int]]
    #: the source offsets committed with those records, per source name
    source_offsets: dict[str, Any]

    def cut(self, source: str) -> dict[str, dict[str, int]] | None:
        """``source``'s cut (see :data:`CUT_KEY`), or None when the log holds none for it."""
        offset = self.source_offsets.get(source)
        cut = offset.get(CUT_KEY) if isinstance(offset, dict) else None
        return cut if isinstance(cut, dict) else None


class SchemaRegistry(ABC):
    """Versioned Avro schemas per subject (Confluent's ``<topic>-value`` / ``<topic>-key``),
    kept with the log. Every distinct schema has one global id; registering a schema already
    registered under a subject returns the existing id. :meth:`register` returns only once the
    registration is durable, so a committed record never refers to an unknown id."""

    @abstractmethod
    def register(self, subject: str, schema: Any) -> Any:
        """Register ``schema`` under ``subject``; the :class:`RegisteredSchema`."""

    @abstractmethod
    def get(self, schema_id: int) -> Any:
        """The registered schema with id ``schema_id``
        (:class:`~cdc.errors.SchemaError` if none)."""

    @abstractmethod
    def versions(self, subject: str) -> list[Any]:
        """Every schema of ``subject``, oldest (version 1) first."""

    @abstractmethod
    def subjects(self) -> list[str]:
        """Every subject, sorted."""


class ChangeLogReader(ABC):
    """Read side of a change log. Safe to use while another process appends or compacts."""

    #: which backend this is ("local", "kafka"), for messages
    backend = "?"
    #: where the log is, for messages (a directory, or broker addresses)
    where = "?"

    def committed(self) -> Committed:
        """The latest committed state (topics, ends and source offsets read at once)."""
        topics = {info.name: info for info in self.topics()}
        ends = {}
        for name, info in topics.items():
            found = self.end_offsets(name)
            ends[name] = [found.get(p, 0) for p in range(info.partitions)]
        return Committed(topics, ends, self.source_offsets())

    @abstractmethod
    def schemas(self) -> SchemaRegistry:
        """The schema registry kept with this log (read-only unless opened by a writer)."""

    @abstractmethod
    def partition_stats(self, topic: str, partition: int) -> PartitionStats:
        """Counts for ``cdc log stats`` (may read the whole partition)."""

    @abstractmethod
    def tombstone_retention(self, topic: str) -> float:
        """Seconds a tombstone stays readable after it was appended: a reader that stops for
        longer may miss deletes (it must rebuild from offset 0)."""

    def topic_bytes(self, topic: str) -> int | None:
        """The bytes ``topic`` takes in the log's storage, when the backend can say cheaply
        (``None`` otherwise: Kafka's brokers keep that to themselves); for metrics."""
        return None

    def appended_no_earlier_than(self, topic: str, partition: int, offset: int) -> int | None:
        """A lower bound (ms since the epoch) on when the first record held at or after
        ``offset`` was appended, found without reading up to it; ``None`` when the log cannot
        tell cheaply (the default: callers then read the record)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional: most readers hold nothing
        """Release connections and files (readers hold nothing that must be flushed)."""

    @abstractmethod
    def topics(self) -> list[TopicInfo]:
        """Every topic with at least one committed record, sorted by name."""

    @abstractmethod
    def end_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, one past the last committed offset (0 for an empty partition)."""

    @abstractmethod
    def read(self, topic: str, partition: int, start: int = 0,
             max_records: int | None = None) -> list[StoredRecord]:
        """Committed records with offset ``>= start``, in offset order, at most ``max_records``."""

    @abstractmethod
    def source_offsets(self) -> dict[str, Any]:
        """The source offsets committed with the latest append, per source name."""

    def iter_partition(self, topic: str, partition: int, start: int = 0,
                       batch: int = 10_000) -> Iterator[StoredRecord]:
        """Every committed record of a partition from ``start``, as of when iteration reaches it."""
        while True:
            records = self.read(topic, partition, start, batch)
            if not records:
                return
            yield from records
            start = records[-1].offset + 1


class ChangeLogWriter(ChangeLogReader):
    """Write side: exactly one writer per log at a time."""

    @abstractmethod
    def ensure_topic(self, topic: str, meta: Mapping[str, Any] | None = None,
                     partitions: int | None = None) -> TopicInfo:
        """Create ``topic`` if it does not exist yet, with ``partitions`` partitions (default:
        the configured count). An existing topic with another count is refused
        (:class:`~cdc.errors.LogError`), never repartitioned."""

    @abstractmethod
    def append(self, records: Sequence[Record],
               source_offsets: Mapping[str, Any] | None = None,
               finish: Finisher | None = None) -> list[AppendResult]:
        """Append ``records`` in order and, in the same atomic commit, set ``source_offsets``
        (merged per source name). Returns once durable; the results are in input order.

        ``finish``, if given, is called once every record has its place (its offset; no
        ``location`` yet) and before anything is committed, with those results. It returns
        records to append *after* them in the same commit (their results follow in the list
        returned) and the source offsets to commit instead of ``source_offsets`` (``None``:
        keep them). Transaction END events use it to say where their transaction ends.
        """

    def drop_topic(self, topic: str) -> None:
        """Remove ``topic`` and every record of it (``cdc source drop --topics``); nothing
        when there is no such topic. Irreversible: a follower that read it must be rebuilt or
        dropped, a reader in the middle of it fails."""
        raise LogError(f"this log ({type(self).__name__}) cannot drop topics",
                       "delete them with the log's own tools")

    def for_source(self, source: str) -> ChangeLogWriter:
        """The writer to use for ``source``'s appends. Where the backend has writers per source
        (Kafka: one transactional producer each), taking it *fences* any other process still
        writing for ``source``: that one's next append fails, and its open transaction is
        aborted. Call it before reading the source's stored offset."""
        return self

    @abstractmethod
    def close(self) -> None:
        """Release the writer lock and files. Does not lose anything already appended."""


#: see :meth:`ChangeLogWriter.append`: where ``records`` landed -> (more records, offsets)
Finisher = Callable[[Sequence[AppendResult]], tuple[Sequence[Record], Mapping[str, Any] | None]]


@dataclass(frozen=True)
class StalePartition:
    """A partition where a reader would resume behind what the log still guarantees (see
    :func:`stale_partitions`)."""

    topic: str
    partition: int
    #: where the reader resumes
    resume: int
    #: the first record it would read, and when that was appended (ms since the epoch)
    first_unread: int
    appended_ms: int
    retention: float


def stale_partitions(reader: ChangeLogReader, resume: Mapping[str, Mapping[str, int]],
                     now_ms: int) -> list[StalePartition]:
    """Partitions where a reader resuming at ``resume`` (topic -> partition (as text) ->
    offset) may have missed deletes.

    Compaction drops a tombstone once it is older than the topic's tombstone retention (Kafka:
    no sooner). A reader resuming at offset ``f > 0`` has read nothing from ``f`` on. If the
    first record the log still holds at or after ``f`` was appended more than the retention
    ago, so was everything between ``f`` and it (offsets grow with append time): tombstones
    among those may be gone, and with them deletes this reader never saw. ``f == 0`` is never
    stale: from offset 0 a compacted log yields exactly the latest state of every key it holds,
    and nothing of the others.

    What it cannot see: unread records that compaction already removed *entirely* leave no age
    behind. A reader whose unread old records were all superseded or dropped (while newer ones
    follow) is not flagged; readers should not stop for longer than the retention.
    """
    out: list[StalePartition] = []
    for topic, parts in resume.items():
        started = {int(p): int(f) for p, f in parts.items() if int(f) > 0}
        if not started:
            continue
        retention = reader.tombstone_retention(topic)
        oldest_ok = now_ms - int(retention * 1000)
        for partition, offset in sorted(started.items()):
            bound = reader.appended_no_earlier_than(topic, partition, offset)
            if bound is not None and bound >= oldest_ok:
                continue  # appended within the retention: no need to read up to it
            first = reader.read(topic, partition, offset, 1)
            if first and first[0].timestamp_ms < oldest_ok:
                out.append(StalePartition(topic, partition, offset, first[0].offset,
                                          first[0].timestamp_ms, retention))
    return out
