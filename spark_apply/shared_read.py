"""One read of the log, many followers: a planned :class:`~spark_apply.planning.Read` read and
decoded once, and each follower's batch cut from it.

Contracts, stated exactly:

* **Read once.** The read's ranges are read once through the log contract; every record is
  decoded at most once however many followers take it (decoded changes are shared, never
  modified).
* **Per share, the same fold as a task's.** A share's records (``start <= offset < end`` of its
  topics) are folded by :func:`spark_apply.tasks.fold_raw` — per (topic, key) the newest by
  (position, offset), or every position in order for a follower whose sink keeps history
  (``Sink.folds`` False) — once per fold kind, then each follower gets the changes of its own
  topics.
* **Runners that read for themselves** (tasks on executors, Spark's Kafka source) get only their
  ranges: the read skips records nobody here needs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdc.log.base import ChangeLogReader, Committed
from cdc.reading import Decoder, Range, RawRecord, raw_records
from cdc.sink import Change
from spark_apply.planning import Read, Share
from spark_apply.tasks import TaskReport, fold_raw


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
    #: the decoded changes, folded for its sink (None: its runner reads the ranges itself)
    changes: list[Change] | None = None
    #: what reading and folding cost and counted (records per topic, newest commit)
    report: TaskReport = field(default_factory=TaskReport)


def _ranges_of(share: Share, topics: frozenset[str]) -> list[Range]:
    return [item for item in share.ranges if item.topic in topics]


def cut(log: ChangeLogReader, decoder: Decoder, state: Committed, read: Read,
        wants_changes: Callable[[str], bool], history: Callable[[str], bool]
        ) -> dict[str, Batch]:
    """Every member's :class:`Batch` of ``read`` (see the module docstring). ``wants_changes``:
    whether a follower's runner takes decoded changes; ``history``: whether its sink keeps
    every position (``Sink.folds`` False)."""
    started = time.monotonic()
    needed = [share for share in read.shares
              if any(wants_changes(member.name) for member in share.members)]
    records: list[RawRecord] = []
    if needed:
        topics = frozenset().union(*(share.topics for share in needed))
        records = list(raw_records(log, [item for item in read.ranges if item.topic in topics]))
    decode = _cached(decoder)
    out: dict[str, Batch] = {}
    for share in read.shares:
        folded: dict[bool, tuple[list[Change], TaskReport]] = {}
        mine = [record for record in records if share.holds(record[0], record[3])] \
            if share in needed else []
        for member in share.members:
            topics = member.topics(state)
            batch = Batch(member.name, _ranges_of(share, topics), share.end_of(member, state),
                          share.watermarks_of(member))
            if wants_changes(member.name):
                kind = history(member.name)
                if kind not in folded:
                    report = TaskReport()
                    folded[kind] = (fold_raw(mine, decode, kind, report), report)
                changes, report = folded[kind]
                batch.changes = changes if topics >= share.topics else [
                    change for change in changes if change.topic in topics]
                _count(batch, report, topics)
            out[member.name] = batch
    seconds = time.monotonic() - started
    for batch in out.values():
        batch.report.read_seconds = seconds
    return out


def _count(batch: Batch, report: TaskReport, topics: frozenset[str]) -> None:
    """``batch``'s own counts: records of its topics, the newest commit among its changes."""
    mine = batch.report
    for topic, count in report.records_by_topic.items():
        if topic in topics:
            mine.records += count
            mine.records_by_topic[topic] = count
    stamps = [change.ts_ms for change in batch.changes or () if change.ts_ms is not None]
    mine.newest_ts_ms = max(stamps) if stamps else None


def _cached(decoder: Decoder) -> Callable[[Range, bytes, bytes, bytes | None], Change | None]:
    """``decoder.change`` remembering its answers for the read (each record decoded once)."""
    seen: dict[tuple[str, int, bytes, bytes, bool], Change | None] = {}

    def decode(item: Range, key: bytes, position: bytes, payload: bytes | None) -> Change | None:
        mark = (item.topic, item.partition, key, position, payload is None)
        if mark in seen:
            return seen[mark]
        change = seen[mark] = decoder.change(item, key, position, payload)
        return change
    return decode
