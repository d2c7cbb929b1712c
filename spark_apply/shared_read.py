"""One read of the log, many followers: a planned :class:`~spark_apply.planning.Read` read and
decoded once, and each follower's batch cut from it.

Contracts, stated exactly:

* **Read once.** The read's ranges are read once through the log contract.
* **Per share, the same fold as a task's.** A share's records (``start <= offset < end`` of its
  topics) are folded by :func:`spark_apply.tasks.fold_winners` — per (topic, key) the newest by
  (position, offset), or every position in order for a follower whose sink keeps history
  (``Sink.folds`` False) — once per fold kind, then each follower gets the fold of its own
  topics, in the form its runner takes (:class:`~spark_apply.runners.base.Takes`):
  - ``CHANGES`` (runners in this process: views, driver sinks): decoded here, each record at
    most once however many take it (decoded changes are shared, never modified) — and, with a
    :class:`Decoded` kept by the run, at most once across its reads while it is among the
    newest decoded (groups of followers at their own offsets, as views being built, read the
    same records one after the other);
  - ``FOLDED`` (a follower's own process): the undecoded winners, pickled once per fold however
    many processes take it (:class:`Shipment`); each process decodes what it writes. Measured:
    unpickling a decoded change costs about twice its decoding, so decoding where the writes
    are is the cheaper way to hand a change to another process. A ``FOLDED`` follower that is
    the share's only reader gets its ranges instead (no shipment): nobody shares its read, so
    its own processes read them, beside the loop and in parallel;
  - ``RANGES`` (tasks on executors, Spark's Kafka source): only the ranges — they read for
    themselves, and the read skips records nobody here needs.
"""

from __future__ import annotations

import enum
import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdc.log.base import ChangeLogReader, Committed
from cdc.reading import Decoder, Range, RawRecord, raw_records
from cdc.sink import Change
from spark_apply.planning import Read, Share
from spark_apply.tasks import Folded, TaskReport, decode_folded, fold_winners


class Takes(enum.Enum):
    """What a runner takes of a batch (``spark_apply/runners/base.py``: ``Runner.takes``)."""

    #: the decoded changes (``Batch.changes``)
    CHANGES = "changes"
    #: the undecoded fold (``Batch.shipment``)
    FOLDED = "folded"
    #: only the ranges (``Batch.ranges``): it reads them itself
    RANGES = "ranges"


class Shipment:
    """A fold handed to follower processes: pickled once, however many take it."""

    def __init__(self, folded: Folded) -> None:
        self.folded = folded
        self._pickled: bytes | None = None
        self._lock = threading.Lock()

    def pickled(self) -> bytes:
        """The fold's pickle (made on the first call)."""
        with self._lock:
            if self._pickled is None:
                self._pickled = pickle.dumps(self.folded, protocol=pickle.HIGHEST_PROTOCOL)
            return self._pickled


@dataclass
class Batch:
    """One follower's batch: what its runner gets."""

    name: str
    #: its ranges (offsets ``start <= offset < end`` of its topics)
    ranges: list[Range]
    #: its progress offsets once the batch is applied (``spark_apply/progress.py``)
    end: dict[str, Any]
    #: source -> offset: its watermarks once the batch is applied (empty: none moves)
    watermarks: dict[str, Any]
    #: the decoded changes, folded for its sink (runners that take ``CHANGES``)
    changes: list[Change] | None = None
    #: the undecoded fold for its sink (runners that take ``FOLDED``)
    shipment: Shipment | None = None
    #: what reading and folding cost and counted (records per topic, newest commit)
    report: TaskReport = field(default_factory=TaskReport)
    #: the log held more of the follower's records after ``end`` when it was planned (the
    #: batch does not reach the complete end: ``Sink.apply_behind``)
    behind: bool = False


def _ranges_of(share: Share, topics: frozenset[str]) -> list[Range]:
    return [item for item in share.ranges if item.topic in topics]


#: :class:`Decoded`'s default: the changes kept (a lineitem change is ~1.5 KB: ~225 MB)
DECODED_KEPT = 150_000

Mark = tuple[str, int, bytes, bytes, bool]


class Decoded:
    """Changes decoded by one run's reads, the newest ``kept`` of them, for the next reads
    (used by one thread at a time: the loop's reader)."""

    def __init__(self, kept: int = DECODED_KEPT) -> None:
        self.kept = kept
        self._seen: OrderedDict[Mark, Change | None] = OrderedDict()
        self.hits = 0

    def get(self, mark: Mark) -> tuple[bool, Change | None]:
        """(found, its change) for the record ``mark`` names."""
        if mark in self._seen:
            self.hits += 1
            return True, self._seen[mark]
        return False, None

    def put(self, mark: Mark, change: Change | None) -> None:
        self._seen[mark] = change
        while len(self._seen) > self.kept:  # the oldest first (O(1): a plain dict's first key
            self._seen.popitem(last=False)  # is found past every slot deleted before it)


def cut(log: ChangeLogReader, decoder: Decoder, state: Committed, read: Read,
        takes: Callable[[str], Takes], history: Callable[[str], bool],
        kept: Decoded | None = None) -> dict[str, Batch]:
    """Every member's :class:`Batch` of ``read`` (see the module docstring). ``takes``: what a
    follower's runner takes; ``history``: whether its sink keeps every position (``Sink.folds``
    False); ``kept``: the changes earlier reads decoded (default: none kept)."""
    started = time.monotonic()
    forms = {member.name: _form(share, member.name, takes) for share in read.shares
             for member in share.members}
    needed = [share for share in read.shares
              if any(forms[member.name] is not Takes.RANGES for member in share.members)]
    records: list[RawRecord] = []
    if needed:
        topics = frozenset().union(*(share.topics for share in needed))
        records = list(raw_records(log, [item for item in read.ranges if item.topic in topics]))
    decode = _cached(decoder, kept)
    out: dict[str, Batch] = {}
    for share in read.shares:
        folds: dict[bool, tuple[Folded, TaskReport]] = {}
        decoded: dict[bool, list[Change]] = {}
        shipped: dict[bool, Shipment] = {}
        mine = [record for record in records if share.holds(record[0], record[3])] \
            if share in needed else []
        for member in share.members:
            topics = member.topics(state)
            batch = out[member.name] = Batch(
                member.name, _ranges_of(share, topics), share.end_of(member, state),
                share.watermarks_of(member), behind=not share.reaches_the_end())
            form = forms[member.name]
            if form is Takes.RANGES:
                continue
            kind = history(member.name)
            if kind not in folds:
                report = TaskReport()
                folds[kind] = (fold_winners(mine, kind, report), report)
            folded, report = folds[kind]
            whole = topics >= share.topics
            if form is Takes.CHANGES:
                if kind not in decoded:
                    decoded[kind] = decode_folded(folded, decode, TaskReport())
                changes = decoded[kind]
                batch.changes = changes if whole else [
                    change for change in changes if change.topic in topics]
            elif whole:
                batch.shipment = shipped.setdefault(kind, Shipment(folded))
            else:
                batch.shipment = Shipment(folded.only(topics))
            _count(batch, report, topics)
    seconds = time.monotonic() - started
    for batch in out.values():
        batch.report.read_seconds = seconds
    return out


def _form(share: Share, name: str, takes: Callable[[str], Takes]) -> Takes:
    """What ``name`` gets of ``share``: what its runner takes, but ``RANGES`` for a ``FOLDED``
    runner that alone reads the share (see the module docstring)."""
    form = takes(name)
    if form is Takes.FOLDED and all(takes(other.name) is Takes.RANGES
                                    for other in share.members if other.name != name):
        return Takes.RANGES
    return form


def _count(batch: Batch, report: TaskReport, topics: frozenset[str]) -> None:
    """``batch``'s own counts: records of its topics, the newest commit among its changes
    (decoded changes only: a shipped fold's is counted where it is decoded)."""
    mine = batch.report
    for topic, count in report.records_by_topic.items():
        if topic in topics:
            mine.records += count
            mine.records_by_topic[topic] = count
    stamps = [change.ts_ms for change in batch.changes or () if change.ts_ms is not None]
    mine.newest_ts_ms = max(stamps) if stamps else None


def _cached(decoder: Decoder, kept: Decoded | None
            ) -> Callable[[Range, bytes, bytes, bytes | None], Change | None]:
    """``decoder.change`` remembering its answers for the read (each record decoded once), and
    finding those of earlier reads in ``kept`` (which keeps this read's too)."""
    seen: dict[Mark, Change | None] = {}

    def decode(item: Range, key: bytes, position: bytes, payload: bytes | None) -> Change | None:
        mark = (item.topic, item.partition, key, position, payload is None)
        if mark in seen:
            return seen[mark]
        found, change = (False, None) if kept is None else kept.get(mark)
        if not found:
            change = decoder.change(item, key, position, payload)
            if kept is not None:
                kept.put(mark, change)
        seen[mark] = change
        return change
    return decode
