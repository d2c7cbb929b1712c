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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple


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


class ChangeLogReader(ABC):
    """Read side of a change log. Safe to use while another process appends or compacts."""

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
    def ensure_topic(self, topic: str, meta: Mapping[str, Any] | None = None) -> TopicInfo:
        """Create ``topic`` with the configured partition count if it does not exist yet."""

    @abstractmethod
    def append(self, records: Sequence[Record],
               source_offsets: Mapping[str, Any] | None = None) -> list[AppendResult]:
        """Append ``records`` in order and, in the same atomic commit, set ``source_offsets``
        (merged per source name). Returns once durable; the results are in input order."""

    @abstractmethod
    def close(self) -> None:
        """Release the writer lock and files. Does not lose anything already appended."""
