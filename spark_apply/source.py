"""The Spark data source over the change log: ``spark.readStream.format("cdc")``.

A Python data source (Spark 4's ``pyspark.sql.datasource`` API; no JVM jars) with a streaming
reader (admission control, ``Trigger.AvailableNow``) and a batch reader (everything committed when
the query is planned). Register it with :func:`register` (``spark_apply.session`` does).

Options
-------
``path``
    a local log's directory (``load(path)`` sets it too), or
``log``
    the log's settings as JSON (``cdc.log.open.log_settings``: any backend). One of the two.
``topics``
    comma-separated topic names to read. Every one must exist when the query starts.
``sources``
    comma-separated source names: read every topic whose ``meta["source"]`` is one of them,
    including topics created after the query started (re-evaluated at every micro-batch).
    Neither ``topics`` nor ``sources``: every topic of the log, including later ones.
``maxRecordsPerTrigger``
    admission control: a micro-batch spans at most this many *offsets* across all partitions
    read (so at most this many records; fewer where compaction removed some). The budget is
    shared fairly: each partition with pending records gets an equal share, and what a partition
    does not need goes to the others. Ignored when Spark asks for everything (``Trigger.Once``).
``splits``
    at most this many Spark tasks per micro-batch (default 2); the offset ranges are spread over
    them, balanced by length.
Output: one row per log record, the fixed schema :data:`SCHEMA` whatever the table
------------------------------------------------------------------------------------------
``topic`` string, ``partition`` int, ``offset`` long, ``timestamp_ms`` long (when the log appended
the record, ms since the epoch), ``source`` string and ``table`` string (the topic's
``meta["source"]`` and ``meta["table"]``), ``key`` string (the key bytes decoded: compact JSON of
the key columns), ``position`` binary (the record's position bytes: comparing them compares the
positions), ``op`` string (``c``/``u``/``d``/``r``/``t``; NULL for a tombstone), ``after`` string
(compact JSON of the after image in its JSON form, ``docs/types.md``; NULL for deletes,
tombstones and truncates), ``source_ts_ms`` long (the envelope's ``source.ts_ms``, the commit
time at the source; NULL for tombstones).

**Watermark rows.** A micro-batch whose end offsets equal the log's complete end offsets, as read
from one committed log state (not cut short by ``maxRecordsPerTrigger`` or an AvailableNow
target), also records that state's ``source_offsets`` of the sources read in its end offset, and
emits one extra row per such source: ``op = 'w'``, ``source`` = the source name, ``after`` =
compact JSON (sorted keys) of that source's offset dict; ``topic``, ``partition``, ``offset``,
``timestamp_ms``, ``table``, ``key``, ``position`` and ``source_ts_ms`` are NULL. Because the log
commits records and source offsets atomically, every change that source committed before that
offset, in the topics read, is in this batch or an earlier one. The sources read are those named
by ``sources``, otherwise those of the topics read; a source with no offset in the state gets no
row. When only the source offsets moved (an idle source advanced by heartbeats), the latest offset
still moves, so a batch holding just the watermark rows runs. Every complete batch re-emits the
watermarks (a follower's watermark only moves forward, so repeats are harmless).

Offsets (stored by Spark in the checkpoint, as JSON)
----------------------------------------------------
``{"topics": {topic: {"<partition>": next_offset, ...}, ...}, "watermarks": {source: {...}}}``.
Each number is the *next* offset to read in that partition — one past the last offset the batch
covered — so a batch ``(start, end]`` reads offsets ``start[p] <= offset < end[p]``; a topic or
partition missing from ``start`` starts at 0. ``watermarks`` is present only on complete ends (see
above). Restarting from the checkpoint therefore resumes exactly: no offset is read twice and none
is skipped; offsets compaction removed are simply absent. Spark replays an uncommitted batch with
the same offsets (at-least-once delivery into sinks; the followers' version gate makes it exact).
The reader never acknowledges anything upstream, so it does not rely on ``commit(end)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from cdc.errors import ConfigError, LogError
from cdc.log.base import CUT_KEY, ChangeLogReader, Committed
from cdc.log.open import reader_from
from cdc.reading import CHUNK, Range, balance, open_log, plan_ranges, read_range
from cdc.transactions import END, decode_event, is_transaction_topic

NAME = "cdc"
#: the rows' schema, fixed whatever the table (the fold and the sinks rely on it exactly)
SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp_ms", LongType()),
    StructField("source", StringType()),
    StructField("table", StringType()),
    StructField("key", StringType()),
    StructField("position", BinaryType()),
    StructField("op", StringType()),
    StructField("after", StringType()),
    StructField("source_ts_ms", LongType()),
])
#: ``op`` of a watermark row
WATERMARK_OP = "w"
OPTIONS = ("path", "log", "topics", "sources", "maxrecordspertrigger", "splits")

Offsets = dict[str, dict[str, int]]  # topic -> partition (as text) -> next offset


class SourceOptionError(ConfigError):
    """An option of the ``cdc`` Spark source is missing or invalid."""


@dataclass(frozen=True)
class SourceOptions:
    """The validated options (see the module docstring)."""

    #: the log's settings as JSON (a local ``path`` becomes ``{"backend": "local", ...}``)
    log: str
    topics: tuple[str, ...] | None = None
    sources: tuple[str, ...] | None = None
    max_records: int | None = None
    splits: int = 2


def _names(value: str | None, option: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
    if not names:
        raise SourceOptionError(f"the cdc source option {option!r} is empty",
                                f"list one or more names separated by commas, or leave {option} "
                                "out to read every topic")
    return names


def _positive(value: str | None, option: str, default: int | None) -> int | None:
    if value is None:
        return default
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number <= 0:
        raise SourceOptionError(f"the cdc source option {option} must be a positive integer, "
                                f"got {value!r}", f"set {option} to e.g. 10000 or leave it out")
    return number


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the source's options (names are case-insensitive) and check the log exists.

    Raises :class:`SourceOptionError` for a bad option and :class:`~cdc.errors.LogError` when
    ``path`` holds no change log, or a topic named in ``topics`` does not exist.
    """
    given = {str(key).lower(): value for key, value in options.items()}
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise SourceOptionError(f"the cdc source has no option {', '.join(unknown)}",
                                "its options are path, topics, sources, maxRecordsPerTrigger, "
                                "splits")
    path = (given.get("path") or "").strip()
    log = (given.get("log") or "").strip()
    if not path and not log:
        raise SourceOptionError("the cdc source needs the change log's directory or settings",
                                'pass .option("path", "<log dir>"), .load("<log dir>") or '
                                '.option("log", <log settings as JSON>)')
    if not log:
        log = json.dumps({"backend": "local", "path": path})
    try:
        settings = json.loads(log)
        reader = reader_from(settings)
    except ValueError as exc:
        raise SourceOptionError(f"the cdc source option log is not valid: {exc}",
                                "pass cdc.log.open.log_settings(config) as JSON") from None
    assert reader is not None
    topics, sources = _names(given.get("topics"), "topics"), _names(given.get("sources"),
                                                                    "sources")
    if topics is not None and sources is not None:
        raise SourceOptionError("the cdc source takes either topics or sources, not both",
                                "drop one of the two options")
    parsed = SourceOptions(log, topics, sources,
                           _positive(given.get("maxrecordspertrigger"), "maxRecordsPerTrigger",
                                     None),
                           _positive(given.get("splits"), "splits", 2) or 2)
    state = reader.committed()
    missing = [topic for topic in topics or () if topic not in state.topics]
    if missing:
        raise LogError(f"the change log at {reader.where} has no topic {', '.join(missing)}",
                       f"known topics: {', '.join(sorted(state.topics)) or 'none yet'}; or "
                       "read by source name with the sources option")
    return parsed


# ------------------------------------------------------------------------------ offset logic

def selected_topics(state: Committed, options: SourceOptions) -> list[str]:
    """The topics ``options`` selects in ``state``, sorted by name."""
    if options.topics is not None:
        chosen = {topic for topic in options.topics if topic in state.topics}
        sources = {state.topics[topic].meta.get("source") for topic in chosen}
        chosen |= {name for name, info in state.topics.items()
                   if is_transaction_topic(info.meta) and info.meta.get("source") in sources}
        return sorted(chosen)
    if options.sources is not None:
        wanted = set(options.sources)
        return sorted(name for name, info in state.topics.items()
                      if info.meta.get("source") in wanted)
    return sorted(state.topics)


def _canonical(value: Any) -> Any:
    """``value`` with every dict's keys sorted, so equal offsets serialize to equal JSON."""
    return json.loads(json.dumps(value, sort_keys=True))


def complete_end(state: Committed, options: SourceOptions) -> dict[str, Any]:
    """The end offset of everything complete in ``state``: every selected topic's next
    offsets at its source's cut (the end of the source's last whole transaction in the log;
    a log without cuts: everything committed), and the watermarks (source offsets without
    the cut) of the sources read."""
    topics = selected_topics(state, options)
    ends = {}
    for topic in topics:
        source = str(state.topics[topic].meta.get("source"))
        cut = state.cut(source)
        if cut is None or is_transaction_topic(state.topics[topic].meta):
            ends[topic] = {str(index): end for index, end in enumerate(state.ends[topic])}
        else:  # a topic not in its source's cut holds only records of an unfinished transaction
            ends[topic] = {str(index): int(cut.get(topic, {}).get(str(index), 0))
                           for index in range(state.topics[topic].partitions)}
    if options.sources is not None:
        sources = set(options.sources)
    else:
        sources = {str(state.topics[topic].meta.get("source")) for topic in topics}
    marks = {source: {k: v for k, v in state.source_offsets[source].items() if k != CUT_KEY}
             for source in sorted(sources) if source in state.source_offsets}
    return {"topics": ends, "watermarks": _canonical(marks)}


def fair_share(pending: Mapping[tuple[str, str], int], budget: int,
               rotate: int = 0) -> dict[tuple[str, str], int]:
    """How many offsets each partition may advance: at most ``pending[p]`` each, ``budget`` in
    all, split evenly (water-filling: what a partition does not need goes to the others). When
    the budget is smaller than the number of partitions, the ones served first are chosen by
    ``rotate`` (the caller passes something that changes every batch, so none starves)."""
    keys = sorted(key for key, count in pending.items() if count > 0)
    if keys:
        shift = rotate % len(keys)
        keys = keys[shift:] + keys[:shift]
    take = dict.fromkeys(keys, 0)
    remaining = budget
    while remaining > 0 and keys:
        share = max(1, remaining // len(keys))
        for key in list(keys):
            step = min(share, pending[key] - take[key], remaining)
            take[key] += step
            remaining -= step
            if take[key] == pending[key]:
                keys.remove(key)
            if remaining == 0:
                break
    return take


def _whole_transactions(begun: Offsets, topics: Sequence[str], cuts: Iterable[Offsets],
                        budget: int) -> dict[tuple[str, str], int]:
    """How far each of ``topics`` (one source's) may advance: to the furthest of ``cuts`` (the
    ends after each of its transactions, in order) within ``budget`` offsets, or to the first
    one when even that is larger (a transaction is never split)."""
    chosen: Offsets | None = None
    for cut in cuts:
        size = sum(max(0, int(end) - int(begun.get(topic, {}).get(partition, 0)))
                   for topic, parts in cut.items() if topic in topics
                   for partition, end in parts.items())
        if chosen is not None and size > budget:
            break
        chosen = cut
    take: dict[tuple[str, str], int] = {}
    for topic, parts in (chosen or {}).items():
        for partition, end in parts.items():
            at = int(begun.get(topic, {}).get(partition, 0))
            take[(topic, partition)] = max(0, int(end) - at)
    return take


def next_end(start: Mapping[str, Any], complete: Mapping[str, Any],
             max_records: int | None,
             boundaries: Mapping[tuple[str, ...], Iterable[Offsets]] | None = None
             ) -> dict[str, Any]:
    """The end offset of the next batch from ``start`` towards ``complete`` (see
    :func:`complete_end`), advancing at most ``max_records`` offsets (``None``: no limit).

    ``boundaries``: per source (the tuple of its topics), the ends after each of its
    transactions between ``start`` and ``complete``, in order (:func:`transaction_cuts`). A
    source with boundaries advances to one of them (never into a transaction); the budget is
    shared evenly between such sources; other topics share it partition by partition.

    Topics in ``start`` that are no longer selected keep their offsets. Raises
    :class:`~cdc.errors.LogError` when ``start`` is past the log's end (the log was replaced).
    """
    begun: Offsets = {topic: dict(parts) for topic, parts in start.get("topics", {}).items()}
    target: Offsets = complete["topics"]
    pending: dict[tuple[str, str], int] = {}
    for topic, parts in target.items():
        for partition, stop in parts.items():
            at = int(begun.get(topic, {}).get(partition, 0))
            if at > stop:
                raise LogError(
                    f"the checkpoint resumes {topic} partition {partition} at offset {at}, but "
                    f"the change log ends at {stop}: the log was replaced or restored from an "
                    "older copy",
                    "delete the streaming checkpoint (and rebuild the followers from offset 0)")
            pending[(topic, partition)] = stop - at
    if max_records is None or sum(pending.values()) <= max_records:
        take = pending
    else:
        take = {}
        groups = list(boundaries or {})
        budget = max(1, max_records // max(1, len(groups))) if groups else max_records
        free = [key for key in pending if not any(key[0] in g for g in groups)]
        for group in groups:  # one source: stop at the end of one of its transactions
            take.update(_whole_transactions(begun, group, boundaries[group], budget))  # type: ignore[index]
        if free:
            rotate = sum(int(n) for parts in begun.values() for n in parts.values())
            share = fair_share({key: pending[key] for key in free},
                               max_records if not groups else budget, rotate)
            take.update(share)
    ends: Offsets = {topic: dict(parts) for topic, parts in begun.items()}
    for topic, partition in pending:
        ends.setdefault(topic, {})[partition] = (
            int(begun.get(topic, {}).get(partition, 0)) + take.get((topic, partition), 0))
    ends = {topic: dict(sorted(ends[topic].items(), key=lambda item: int(item[0])))
            for topic in sorted(ends)}
    end: dict[str, Any] = {"topics": ends}
    if all(take.get(key, 0) == count for key, count in pending.items()):
        end["watermarks"] = complete["watermarks"]
    return end


def transaction_cuts(log: ChangeLogReader, state: Committed, start: Mapping[str, Any],
                     complete: Mapping[str, Any]) -> dict[tuple[str, ...], Iterator[Offsets]]:
    """Per source with transaction events between ``start`` and ``complete``: the ends after
    each of its transactions, read lazily from its transaction topic's END events."""
    out: dict[tuple[str, ...], Iterator[Offsets]] = {}
    wanted: Offsets = complete["topics"]
    for txn_topic, parts in wanted.items():
        info = state.topics.get(txn_topic)
        if info is None or not is_transaction_topic(info.meta):
            continue
        source = info.meta.get("source")
        topics = tuple(sorted(name for name in wanted if name != txn_topic and state.topics.get(
            name) is not None and state.topics[name].meta.get("source") == source))
        begin = int(start.get("topics", {}).get(txn_topic, {}).get("0", 0))
        stop = int(parts.get("0", 0))
        if stop > begin and topics:
            out[(*topics, txn_topic)] = _cuts(log, txn_topic, begin, stop, start, wanted)
    return out


def _cuts(log: ChangeLogReader, txn_topic: str, begin: int, stop: int,
          start: Mapping[str, Any], complete: Offsets) -> Iterator[Offsets]:
    acc: Offsets = {topic: {p: int(n) for p, n in parts.items()}
                    for topic, parts in start.get("topics", {}).items()}
    for record in log.iter_partition(txn_topic, 0, begin, batch=1000):
        if record.offset >= stop:
            return
        if record.value is None:
            continue
        event = decode_event(record.value)
        if event["status"] != END:
            continue
        for topic, parts in (event.get("ends") or {}).items():
            limit = complete.get(topic, {})
            for partition, end in parts.items():
                if int(end) > int(limit.get(partition, 0)):
                    return  # committed after the state read (not complete there yet)
                mine = acc.setdefault(topic, {})
                mine[partition] = max(int(mine.get(partition, 0)), int(end))
        acc.setdefault(txn_topic, {})["0"] = record.offset + 1
        yield {topic: dict(parts) for topic, parts in acc.items()}


class CdcPartition(InputPartition):
    """One Spark task's share of a batch: offset ranges, and maybe the watermark rows."""

    def __init__(self, ranges: list[Range], watermarks: dict[str, Any] | None) -> None:
        super().__init__(None)
        self.ranges = ranges
        self.watermarks = watermarks

    def __repr__(self) -> str:
        return f"CdcPartition({self.ranges!r}, watermarks={self.watermarks!r})"


def plan(state: Committed, start: Mapping[str, Any], end: Mapping[str, Any],
         splits: int) -> list[CdcPartition]:
    """The tasks that read ``(start, end]``: the non-empty ranges (:func:`cdc.reading.plan_ranges`)
    spread over at most ``splits`` partitions, balanced by length; ``end``'s watermark rows go
    to the first."""
    out = [CdcPartition(group, None) for group in balance(plan_ranges(state, start, end), splits)]
    watermarks = end.get("watermarks")
    if watermarks:
        if out:
            out[0].watermarks = watermarks
        else:
            out.append(CdcPartition([], watermarks))
    return out


# ----------------------------------------------------------------------------------- reading

def _arrow_batch(rows: list[tuple[Any, ...]]) -> Any:
    """``rows`` (tuples in :data:`SCHEMA` order) as one Arrow record batch."""
    import pyarrow as pa

    kinds = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(),
             "binary": pa.binary()}
    columns = list(zip(*rows, strict=True))
    arrays = [pa.array(column, type=kinds[field.dataType.simpleString()])
              for column, field in zip(columns, SCHEMA.fields, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, names=SCHEMA.fieldNames())


def watermark_after(offset: Mapping[str, Any]) -> str:
    """A watermark row's ``after``: compact JSON of the source offset, keys sorted."""
    return json.dumps(offset, sort_keys=True, separators=(",", ":"))


def read_partition(settings: str, partition: CdcPartition) -> Iterator[Any]:
    """The rows of one task, as Arrow record batches of at most :data:`CHUNK` rows."""
    log, decoder = open_log(settings)
    rows: list[tuple[Any, ...]] = []
    for item in partition.ranges:
        for records in read_range(log, item):
            for record in records:
                op = after = source_ts = None
                if record.value is not None:
                    op, after, source_ts = decoder.decode(record.value)
                rows.append((item.topic, item.partition, record.offset, record.timestamp_ms,
                             item.source, item.table, record.key.decode(), record.position, op,
                             after, source_ts))
            if len(rows) >= CHUNK:
                yield _arrow_batch(rows)
                rows = []
    for source, offset in (partition.watermarks or {}).items():
        rows.append((None, None, None, None, source, None, None, None, WATERMARK_OP,
                     watermark_after(offset), None))
    if rows:
        yield _arrow_batch(rows)


# ----------------------------------------------------------------------------- Spark classes

class CdcStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader. Lives in one driver-side Python process for the whole query
    (latestOffset, partitions, commit) and is pickled to the executors for :meth:`read`."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._log: ChangeLogReader | None = None
        #: the complete end recorded by prepareForTriggerAvailableNow (None: run continuously)
        self._target: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_log": None, "_target": None}

    def _state(self) -> Committed:
        if self._log is None:
            self._log = open_log(self.options.log)[0]
        return self._log.committed()

    def initialOffset(self) -> dict[str, Any]:
        """Every partition from offset 0 (a topic missing from an offset starts at 0)."""
        return {"topics": {}}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = complete_end(self._state(), self.options)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records is None:
            return super().getDefaultReadLimit()
        return ReadMaxRows(self.options.max_records)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        state = self._state()
        complete = self._target or complete_end(state, self.options)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        boundaries = None
        if max_rows is not None:
            assert self._log is not None
            boundaries = transaction_cuts(self._log, state, start, complete)
        end = next_end(start, complete, max_rows, boundaries)
        if _canonical(end) == _canonical(start):
            return start
        return end

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._target or complete_end(self._state(), self.options)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[CdcPartition]:
        return plan(self._state(), start, end, self.options.splits)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, CdcPartition)
        return read_partition(self.options.log, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the log keeps records for other readers; Spark's checkpoint is the
        only place this reader's progress lives."""


class CdcBatchReader(DataSourceReader):
    """The batch reader: everything committed when the query is planned, with the watermarks
    of that state."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        state = open_log(self.options.log)[0].committed()
        return plan(state, {"topics": {}}, complete_end(state, self.options), self.options.splits)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, CdcPartition)
        return read_partition(self.options.log, partition)


class CdcDataSource(DataSource):
    """``format("cdc")``: the change log as a stream (or a table) of :data:`SCHEMA` rows."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = parse_options(options)

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> CdcStreamReader:
        return CdcStreamReader(self.parsed)

    def reader(self, schema: StructType) -> CdcBatchReader:
        return CdcBatchReader(self.parsed)


def register(spark: Any) -> None:
    """Make ``format("cdc")`` available in ``spark``."""
    spark.dataSource.register(CdcDataSource)
