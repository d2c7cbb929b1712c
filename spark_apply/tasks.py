"""Apply tasks: what one Spark task does with its share of a batch, on an executor (the
executor runner's, ``spark_apply/runners/executors.py``), and the fold and write every runner
shares (:func:`fold_raw`, :func:`apply_changes`).

A batch is a list of offset ranges (``topic``, ``partition``, ``start <= offset < end``) planned
by the apply loop (``spark_apply/planning.py``). :func:`plan_tasks` splits the
ranges into :class:`ApplyTask` s and Spark runs :func:`run_task` for each, on the executors; a
task reads its records *itself*, through the log contract (``cdc/log/base.py``: a local log on
the same machine or a shared filesystem, or Kafka), folds them and writes them into the
follower. No record crosses into the JVM or reaches the driver: the driver sees the ranges and
one small :class:`TaskReport` per task.

Contracts, stated exactly:

* **Every key in one task.** A task owns either whole partitions of the log (the log puts each
  key in one partition: ``cdc/log/partitioner.py``), or — ``count > 1`` — every range of the
  batch but only the keys whose :meth:`Sink.owner` is its ``index``: sinks that must not be
  written by two tasks in the same place (Delta: one file partition, its bucket) say which
  keys belong together. Either way a key's records of the batch are all folded in one task, so
  the fold is the same as over the whole batch.
* **The fold** is ``spark_apply/fold.py``'s: per (topic, key) the record with the highest
  (position, offset) wins; truncates never compete; ``Sink.folds`` False keeps every record
  (truncates dropped) in (position, offset) order per key. Only winners are decoded (a
  truncate's key, ``{}``, is decoded as it comes, so a truncate never hides a record).
* **The gate.** Each write is the sink's per-key compare-and-set (``cdc/sink.py``): a task
  replayed after a failure, a speculative duplicate, or a task still writing after its worker
  was declared lost cannot overwrite newer data.
* **Watermarks** are *not* written by tasks: the apply loop writes them after every task of the
  batch succeeded (``spark_apply/jobs.py``), then the follower's progress record.
* **Latency** (``spark_apply/latency.py``) is measured for the changes a task applies (the
  winners whose op is ``c``/``u``/``d``), from their commit at the source to the end of the
  task's writes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdc.reading import Decode, Range, RawRecord, balance, open_log, raw_records
from cdc.sink import ApplyStats, Change, Sink, newest_per_key, open_sink
from spark_apply.latency import LatencyHistogram

if TYPE_CHECKING:
    from cdc.config import Config

#: ops whose ``source_ts_ms`` is a commit at the source (latency is measured for them)
COMMITS = frozenset({"c", "u", "d"})
#: the key of a truncate record (table-level)
TABLE_KEY = b"{}"


@dataclass(frozen=True)
class ApplyTask:
    """One task's share of a micro-batch: ``ranges`` (whole, or only the keys ``index`` of
    ``count`` owns when ``count > 1``)."""

    ranges: tuple[Range, ...]
    index: int = 0
    count: int = 1
    #: the log holds more of the follower's records after the batch (``Batch.behind``)
    behind: bool = False


@dataclass
class TaskReport:
    """What one task did (small: it travels to the driver)."""

    records: int = 0
    changes: int = 0
    written: int = 0
    deleted: int = 0
    skipped: int = 0
    #: rows the sink's storage engine read (:attr:`cdc.sink.ApplyStats.scanned`)
    scanned: int = 0
    #: :attr:`cdc.sink.ApplyStats.revisited`
    revisited: int = 0
    newest_ts_ms: int | None = None
    records_by_topic: dict[str, int] = field(default_factory=dict)
    latency_by_topic: dict[str, LatencyHistogram] = field(default_factory=dict)
    read_seconds: float = 0.0
    #: CPU seconds of reading and decoding done where the batch was written (a follower's
    #: process, an executor task), beside the apply loop's own read (``ApplyJob.read_cpu_seconds``)
    read_cpu_seconds: float = 0.0
    sink_seconds: float = 0.0
    #: :attr:`cdc.sink.ApplyStats.phases`
    phases: dict[str, float] = field(default_factory=dict)

    def merge(self, other: TaskReport) -> None:
        add_counts(self, other)
        if other.newest_ts_ms is not None and (self.newest_ts_ms is None
                                               or other.newest_ts_ms > self.newest_ts_ms):
            self.newest_ts_ms = other.newest_ts_ms
        for topic, histogram in other.latency_by_topic.items():
            mine = self.latency_by_topic.setdefault(topic, LatencyHistogram())
            mine.merge(histogram)
        self.read_seconds += other.read_seconds
        self.read_cpu_seconds += other.read_cpu_seconds
        self.sink_seconds += other.sink_seconds
        add_phases(self.phases, other.phases)


#: the counts a report carries and a follower's progress sums (:func:`add_counts`)
COUNTS = ("records", "changes", "written", "deleted", "skipped", "scanned", "revisited")


def add_counts(total: Any, more: TaskReport) -> None:
    """Add ``more``'s :data:`COUNTS` and records per topic into ``total`` (a report, or a
    follower's progress)."""
    for name in COUNTS:
        setattr(total, name, getattr(total, name) + getattr(more, name))
    for topic, count in more.records_by_topic.items():
        total.records_by_topic[topic] = total.records_by_topic.get(topic, 0) + count


def add_phases(total: dict[str, float], more: dict[str, float]) -> None:
    """Add ``more``'s seconds per phase into ``total``."""
    for phase, seconds in more.items():
        total[phase] = total.get(phase, 0.0) + seconds


def plan_tasks(ranges: Sequence[Range], tasks: int, split_keys: bool,
               behind: bool = False) -> list[ApplyTask]:
    """At most ``tasks`` tasks over ``ranges``. ``split_keys`` (the sink's
    ``Sink.placement`` is ``BY_OWNER``): every task reads every range and keeps the keys it owns;
    otherwise whole ranges are spread over the tasks, balanced by length (largest first).
    ``behind``: the batch's (:attr:`ApplyTask.behind`)."""
    if not ranges:
        return []
    if split_keys and tasks > 1:
        whole = tuple(ranges)
        return [ApplyTask(whole, index, tasks, behind) for index in range(tasks)]
    return [ApplyTask(tuple(group), behind=behind) for group in balance(ranges, tasks)]


# ------------------------------------------------------------------------- the follower handle

@dataclass(frozen=True)
class FollowerHandle:
    """What an executor needs to open a follower's sink and read the log: pickled into every
    task. ``secrets`` holds the values of the environment variables the config names for
    passwords (read on the driver: executors of a cluster do not share its environment)."""

    config: Any
    name: str
    log: str
    #: a token unique to the ``cdc apply`` run: a worker keeps one sink per token and name
    token: str
    secrets: tuple[tuple[str, str], ...] = ()

    def sink(self) -> Sink:
        """This process's sink of the follower (opened on first use, then kept)."""
        key = (self.token, self.name)
        sink = _SINKS.get(key)
        if sink is None:
            for variable, value in self.secrets:
                os.environ.setdefault(variable, value)
            for old in [k for k in _SINKS if k[1] == self.name]:
                _SINKS.pop(old).close()
            sink = _SINKS[key] = open_target(self.config, self.name)
        return sink


def open_target(config: Config, name: str, host: Any = None, stops_host: bool = False) -> Sink:
    """What ``cdc apply`` writes for ``name``: a view's sink (``views/host.py``: its steps run
    where its state is held open -- ``host``, this process's own, or the live host of its
    lease) or a follower's own (:func:`cdc.sink.open_sink`)."""
    if name in config.views:
        from views.host import HostedView

        return HostedView(config, name, host, stops_host)
    return open_sink(config, name)


_SINKS: dict[tuple[str, str], Sink] = {}


# ----------------------------------------------------------------------------------- the task

def run_task(handle: FollowerHandle, task: ApplyTask, sink: Sink | None = None) -> TaskReport:
    """Read, fold and write ``task``'s records into the follower (see the module docstring);
    ``sink``: the one to write with (default: this process's, :meth:`FollowerHandle.sink`)."""
    reader, decoder = open_log(handle.log)
    if sink is None:
        sink = handle.sink()
        sink.refresh()
    records = raw_records(reader, task.ranges, _owner_filter(task, sink))
    return apply_records(handle, records, decoder.change, sink, task.behind)


def apply_records(handle: FollowerHandle, records: Iterable[RawRecord], decode: Decode,
                  sink: Sink | None = None, behind: bool = False) -> TaskReport:
    """Fold ``records`` (every record of the keys they hold), decode the winners with
    ``decode`` (``None``: a truncate, dropped), write them into the follower; the report."""
    started, cpu = time.monotonic(), time.thread_time()
    if sink is None:
        sink = handle.sink()
        sink.refresh()
    report = TaskReport()
    changes = fold_raw(records, decode, not sink.folds, report)
    report.read_seconds = time.monotonic() - started
    report.read_cpu_seconds = time.thread_time() - cpu
    return apply_changes(sink, changes, report, behind)


def apply_changes(sink: Sink, changes: Sequence[Change], report: TaskReport,
                  behind: bool = False) -> TaskReport:
    """Write ``changes`` (folded for ``sink``) behind its version gate; ``report`` completed
    with what the sink did and the changes' latency (commit at the source -> written).
    ``behind``: the log holds more of the follower's records right after the batch
    (``Sink.apply_behind``; an empty batch that ends a backlog is ``Sink.caught_up``)."""
    began = time.monotonic()
    stats = ApplyStats()
    if changes:
        stats = sink.apply_behind(changes) if behind else sink.apply(changes)
    elif not behind:
        sink.caught_up()
    applied = time.time()
    report.sink_seconds = time.monotonic() - began
    report.changes = len(changes)
    report.written, report.deleted, report.skipped = stats.written, stats.deleted, stats.skipped
    report.scanned, report.revisited = stats.scanned, stats.revisited
    report.phases = dict(stats.phases)
    stamps: dict[str, list[int]] = {}
    for change in changes:
        if change.ts_ms is not None and change.op in COMMITS:
            stamps.setdefault(change.topic, []).append(change.ts_ms)
    for topic, values in stamps.items():
        histogram = report.latency_by_topic.setdefault(topic, LatencyHistogram())
        histogram.add_stamps(values, applied)
    return report


#: a fold's winner, not yet decoded: ``(range, key, position, payload)`` (payload ``None``: a
#: tombstone) -- small and plain, it crosses to a follower's process cheaply (``Change`` objects
#: cost twice their decoding to pickle and unpickle)
Winner = tuple[Range, bytes, bytes, "bytes | None"]


@dataclass
class Folded:
    """A fold of raw records before decoding (:func:`fold_winners`); :func:`decode_folded`
    turns it into changes."""

    #: every position of every key (a sink keeping history), or the newest per key
    history: bool
    #: the winners in the order their changes come out
    winners: list[Winner] = field(default_factory=list)
    #: records of the table key (``{}``), in (topic, position, offset) order: truncates (dropped
    #: when decoded: they never compete) or a keyless table's row, folded once decoded
    table_keyed: list[Winner] = field(default_factory=list)

    def only(self, topics: frozenset[str]) -> Folded:
        """The part of the fold whose topics are in ``topics``."""
        return Folded(self.history, [w for w in self.winners if w[0].topic in topics],
                      [w for w in self.table_keyed if w[0].topic in topics])


def fold_raw(records: Iterable[RawRecord], decode: Decode, history: bool,
             report: TaskReport) -> list[Change]:
    """The changes of ``records``: :func:`fold_winners`, then :func:`decode_folded`."""
    return decode_folded(fold_winners(records, history, report), decode, report)


def fold_winners(records: Iterable[RawRecord], history: bool, report: TaskReport) -> Folded:
    """The fold of ``records``, undecoded: per (topic, key) the winner; or (``history``) every
    position of every key in (key, position) order, the first record of each (a delete's
    tombstone, at the delete's position, adds nothing). Records of the table key wait for
    decoding (:attr:`Folded.table_keyed`). Counts records per topic into ``report``."""
    best: dict[tuple[str, bytes], tuple[bytes, int, Any, Range]] = {}
    everything: list[tuple[str, bytes, bytes, int, Any, Range]] = []
    table_keyed: list[tuple[str, bytes, int, Winner]] = []
    counts: dict[str, int] = {}
    for item, key, position, offset, payload in records:
        topic = item.topic
        counts[topic] = counts.get(topic, 0) + 1
        if key == TABLE_KEY:  # maybe a truncate: table-level, never competes
            table_keyed.append((topic, position, offset, (item, key, position, payload)))
        elif history:
            everything.append((topic, key, position, offset, payload, item))
        else:
            group = (topic, key)
            current = best.get(group)
            if current is None or (position, offset) > current[:2]:
                best[group] = (position, offset, payload, item)
    for topic, count in counts.items():
        report.records += count
        report.records_by_topic[topic] = report.records_by_topic.get(topic, 0) + count
    table_keyed.sort(key=lambda r: r[:3])
    keyed = [entry[3] for entry in table_keyed]
    if history:
        everything.sort(key=lambda r: (r[0], r[1], r[2], r[3]))
        # one change per (topic, key, position): a delete's tombstone carries its position
        return Folded(True, [(item, key, position, payload)
                             for index, (_, key, position, _, payload, item)
                             in enumerate(everything)
                             if index == 0 or everything[index][:3] != everything[index - 1][:3]],
                      keyed)
    return Folded(False, [(item, key, position, payload)
                          for (_, key), (position, _, payload, item) in best.items()], keyed)


def decode_folded(folded: Folded, decode: Decode, report: TaskReport) -> list[Change]:
    """The changes of ``folded``, decoded by ``decode`` (``None``: a truncate, dropped); the
    newest commit among them into ``report``."""
    changes = [change for item, key, position, payload in folded.winners
               if (change := decode(item, key, position, payload)) is not None]
    if folded.table_keyed:
        rows = [change for item, key, position, payload in folded.table_keyed
                if (change := decode(item, key, position, payload)) is not None]
        if folded.history:  # the first of each position, as for every other key
            changes.extend(change for index, change in enumerate(rows)
                           if index == 0 or (change.topic, change.position)
                           != (rows[index - 1].topic, rows[index - 1].position))
        else:
            changes.extend(newest_per_key(rows))
    for change in changes:
        if change.ts_ms is not None and (report.newest_ts_ms is None
                                         or change.ts_ms > report.newest_ts_ms):
            report.newest_ts_ms = change.ts_ms
    return changes


def _owner_filter(task: ApplyTask, sink: Sink) -> Any:
    """``(topic, key bytes) -> bool``: the keys ``task`` owns (None: all of them)."""
    if task.count <= 1:
        return None
    owner, index, count = sink.owner, task.index, task.count
    return lambda topic, key: owner(topic, key, count) == index
