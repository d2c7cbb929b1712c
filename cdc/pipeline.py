"""The dispatcher: one way into the log for snapshot and streaming sources alike.

Sources hand it events and checkpoints; it encodes events as records, buffers them, and commits
them to the log together with the newest source offset whose changes are all in the commit.
Only after :meth:`Dispatcher.flush` returns may the source be told that the offset is durable.

Memory stays bounded: the buffer is flushed when it holds ``max_records`` records (or
``max_bytes`` of record values) even in the middle of a transaction. Such a flush carries the
*previous* checkpoint as source offset, so a crash replays the transaction from its start; the
replayed records carry the same positions, which followers' version gates ignore.

Transaction boundaries (:mod:`cdc.transactions`): a streamed change that starts a source
transaction logs a BEGIN event; the checkpoint that ends it logs the END event in the same
commit as its last change. Every commit with a source offset also stores the source's *cut*, the
ends of its topics at the last boundary, so readers can stop where no transaction is open.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cdc.avro import EventCodec, Filler, TableCodec
from cdc.columns import ColumnPolicies, check_history, check_key
from cdc.errors import CdcError
from cdc.events import ChangeEvent, Op, TableSchema
from cdc.images import PreviousImages, may_be_partial
from cdc.log.base import CUT_KEY, AppendResult, ChangeLogWriter, Record, StoredRecord
from cdc.log.partitioner import partition_for
from cdc.observe import NO_OBSERVER, CaptureObserver
from cdc.offsets import SourceOffset
from cdc.position import Position
from cdc.source import EncodedBatch
from cdc.speedups import pure_python
from cdc.transactions import (
    BEGIN,
    END,
    Ends,
    OpenTransaction,
    TransactionEvents,
    advance,
    transaction_topic,
)

log = logging.getLogger(__name__)


def value_bytes(records: list[Record]) -> int:
    """The bytes of the records' values (tombstones count 0)."""
    return sum([len(r.value) for r in records if r.value is not None])


VALUE_BYTES = value_bytes
if not pure_python():
    with contextlib.suppress(ImportError):  # the compiled twin, when built
        from cdc._fast import (  # type: ignore[import-not-found,no-redef,unused-ignore]
            value_bytes as VALUE_BYTES,  # noqa: N812
        )

#: a point in the buffer: (index, BEGIN / END / "CHECK", the transaction, its position)
Marker = tuple[int, str, OpenTransaction | None, bytes]
CHECK = "CHECK"

#: the key of records about a whole table (a TRUNCATE), not one row
TABLE_KEY = b"{}"


@dataclass
class DispatchStats:
    events: int = 0
    records: int = 0
    commits: int = 0
    #: events with columns that could not be filled from a previous image
    unavailable: int = 0
    started: float = field(default_factory=time.monotonic)


class Dispatcher:
    """Buffers encoded events for one source and commits them with its source offset."""

    def __init__(self, log: ChangeLogWriter, codec: EventCodec, source: str,
                 max_records: int = 20_000, interval: float = 0.05,
                 image_cache_bytes: int = 48 * 1024**2,
                 columns: ColumnPolicies | None = None, max_bytes: int = 16 * 1024**2) -> None:
        self.log = log
        #: the source's column filters and transforms, applied before anything is encoded
        self.columns = columns
        self.codec = codec
        self.source = source
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.interval = interval
        self._buffer: list[Record] = []
        self._buffered_bytes = 0  # of the buffered records' values
        self._pending_offset: SourceOffset | None = None
        self._oldest: float | None = None
        self._topics: dict[str, int] = {}  # topic -> partitions
        self.stats = DispatchStats()
        #: a commit running in the background: (future, its records, its source offset)
        self._inflight: tuple[Future[list[AppendResult]], list[Record], SourceOffset | None
                              ] | None = None
        self._committer: ThreadPoolExecutor | None = None
        self.images = PreviousImages(log, codec, image_cache_bytes)
        self.transactions = TransactionEvents(source, codec.store)
        #: the source transaction being logged (its END not yet buffered)
        self._open: OpenTransaction | None = None
        #: transaction starts, ends and checkpoints in the buffer, in order
        self._markers: list[Marker] = []
        self._cut: Ends = {}
        #: ends of records committed after the cut (an unfinished transaction's)
        self._uncut: Ends = {}
        #: told of each commit (metrics: ``cdc capture --metrics-port``)
        self.observer: CaptureObserver = NO_OBSERVER
        #: the commit time at the source of the newest transaction begun since the last flush
        self._newest_commit_ms: int | None = None
        self._load_cut()

    def _load_cut(self) -> None:
        """The cut as the log has it (after a failure: whatever was really committed)."""
        stored = self.log.source_offsets().get(self.source)
        cut = stored.get(CUT_KEY) if isinstance(stored, dict) else None
        if isinstance(cut, dict):
            self._cut = copy.deepcopy(cut)
        else:  # a log from before cuts: everything committed counts as complete
            state = self.log.committed()
            self._cut = {name: {str(p): end for p, end in enumerate(state.ends[name])}
                         for name, info in state.topics.items()
                         if info.meta.get("source") == self.source
                         and info.meta.get("kind") != "transactions"}
        self._uncut = {}
        self._open = None
        self._markers = []

    def _begin(self, txn_id: str, ts_ms: int, position: Position | bytes, table: str,
               count: int = 1) -> None:
        """Count a streamed change of transaction ``txn_id`` (its first change at
        ``position``), starting it if it is new."""
        txn = self._open
        if txn is None or txn.id != txn_id:
            if txn is None:
                self._ensure_transaction_topic()
            txn = self._open = OpenTransaction(
                txn_id, ts_ms, position if isinstance(position, bytes) else position.to_bytes())
            self._newest_commit_ms = ts_ms
            self._markers.append((len(self._buffer), BEGIN, txn, txn.position))
        txn.counts[table] = txn.counts.get(table, 0) + count

    def _ensure_transaction_topic(self) -> None:
        topic = transaction_topic(self.source)
        if topic not in self._topics:
            info = self.log.ensure_topic(topic, {"source": self.source, "kind": "transactions"},
                                         partitions=1)
            self._topics[topic] = info.partitions

    def _boundary(self, position: bytes | None) -> None:
        """Everything buffered so far is whole transactions: end the open one here."""
        txn, self._open = self._open, None
        if txn is not None:
            self._markers.append((len(self._buffer), END, txn, position or txn.position))
        else:
            self._markers.append((len(self._buffer), CHECK, None, b""))

    def add(self, event: ChangeEvent) -> list[Record]:
        """Buffer ``event``; return its records (the event, plus a tombstone after a delete).

        Columns the source did not send (``event.unchanged``) are filled from the key's previous
        image; those that cannot be are named in the envelope and counted in
        ``stats.unavailable``. A table with column rules (:mod:`cdc.columns`) is logged as they
        say: the event is rebuilt first, its schema and images transformed.
        """
        if self.columns is not None:
            policy = self.columns.get(event.schema.table)
            if policy is not None and not policy.produced(event.schema):
                event = policy.event(event)
        self.ensure_topic(event.schema)
        fill = None
        if event.unchanged:
            image_of = event.replaces or event
            key = self.codec.key_bytes(image_of)
            fill = self._counting(self.images.filler(event.schema.topic, key, event.unchanged,
                                                     image_of.position.to_bytes()))
        records = self.codec.records(event, fill)
        if event.replaces is not None:
            self.add(event.replaces)
        if event.transaction is not None:
            self._begin(event.transaction.id, event.ts_ms, event.position,
                        str(event.schema.table))
        if self._oldest is None:
            self._oldest = time.monotonic()
        self.stats.events += 1
        self._buffered_bytes += sum(len(r.value) for r in records if r.value is not None)
        if event.op is Op.TRUNCATE:
            self._buffer.extend(records)
            self._tombstone_live_keys(event.schema, event.position)
            return records
        if may_be_partial(event.schema):
            first = records[0]
            self.images.remember(first.topic, first.key,
                                 None if event.op is Op.DELETE else first.value)
        self._buffer.extend(records)
        return records

    def logged_key(self, event: ChangeEvent) -> bytes:
        """The key bytes :meth:`add` logs ``event`` under: the column rules' (a hashed key)
        when the table has rules and the event is not in their output schema yet."""
        if self.columns is not None:
            policy = self.columns.get(event.schema.table)
            if (policy is not None and policy.transforms_key(event.schema.key)
                    and not policy.produced(event.schema)):
                event = policy.event(event)
        return self.codec.key_bytes(event)

    def _tombstone_live_keys(self, schema: TableSchema, truncated_at: Position) -> int:
        """A tombstone for every key of the table live just before ``truncated_at``.

        The live keys are decided from the records *older* than the TRUNCATE only (in the log
        and in the buffer), so a replay after a crash finds exactly the same keys; the
        tombstones carry the TRUNCATE's own position (they are that one change). One partition
        at a time, so memory grows with a partition's keys, not the table's.
        """
        self._finish_inflight()  # the log must hold everything older
        topic, limit = schema.topic, truncated_at.to_bytes()
        partitions = self._topics[topic]
        in_log = {t.name for t in self.log.topics()}
        count = 0
        for partition in range(partitions):
            latest: dict[bytes, tuple[bytes, bool]] = {}
            records: list[Record | StoredRecord] = []
            if topic in in_log:
                records.extend(self.log.iter_partition(topic, partition))
            records.extend(r for r in list(self._buffer)
                           if r.topic == topic and partition_for(r.key, partitions) == partition)
            for record in records:
                if record.key == TABLE_KEY or record.position >= limit:
                    continue
                seen = latest.get(record.key)
                if seen is None or record.position >= seen[0]:
                    latest[record.key] = (record.position, record.value is not None)
            for key in sorted(k for k, (_, live) in latest.items() if live):
                self.add_tombstone(schema, key, truncated_at)
                count += 1
        return count

    def _counting(self, fill: Filler) -> Filler:
        def counted(codec: TableCodec, after: dict[str, Any]) -> list[str]:
            missing = fill(codec, after)
            if missing:
                self.stats.unavailable += 1
            return missing
        return counted

    def add_batch(self, batch: EncodedBatch) -> None:
        """Buffer a source's already-encoded records (and its checkpoint, if it has one)."""
        partial: set[str] = set()
        for schema in batch.schemas:
            policy = self.columns.get(schema.table) if self.columns is not None else None
            if policy is not None and not policy.produced(schema):
                raise CdcError(f"source {self.source!r}: the connector encoded rows of "
                               f"{schema.table} itself, not as its column rules make them",
                               "report this bug; the rows were not logged")
            self.ensure_topic(schema)
            if not batch.whole_rows and may_be_partial(schema):
                partial.add(schema.topic)
        records = batch.records
        if partial:
            self.images.remember_all(records, partial)
        self._buffered_bytes += VALUE_BYTES(records)
        if batch.transaction is not None and records:
            first = records[0].position
            if len(batch.schemas) == 1:  # every change has one record with a value
                schema = batch.schemas[0]
                self._begin(batch.transaction, batch.ts_ms, first, str(schema.table),
                            batch.events)
            else:
                tables = {schema.topic: str(schema.table) for schema in batch.schemas}
                counts: dict[str, int] = {}
                for record in records:
                    if record.value is not None:
                        counts[record.topic] = counts.get(record.topic, 0) + 1
                for topic, count in counts.items():
                    self._begin(batch.transaction, batch.ts_ms, first, tables[topic], count)
        self._buffer.extend(records)
        self.stats.events += batch.events
        if self._oldest is None:
            self._oldest = time.monotonic()
        if batch.offset is not None:
            self._pending_offset = batch.offset
            self._boundary(records[-1].position if records else None)

    def add_tombstone(self, schema: TableSchema, key: bytes, position: Position) -> None:
        """Buffer the removal of ``key`` of ``schema``'s table (a row known only by its key: a
        TRUNCATE's live keys, rows gone while a slot was lost, rows an incremental snapshot
        found gone): a delete event without images, then the key's tombstone, both at
        ``position`` — what a delete is everywhere else. The delete event is for consumers that
        skip tombstones (Kafka Connect sinks such as Debezium's JDBC sink do): each key's
        removal is then in its own partition's order, which a TRUNCATE's one record (keyed
        ``{}``, in one partition) cannot be for a topic of several partitions."""
        self.ensure_topic(schema)
        removal = ChangeEvent.removal(schema, position, int(time.time() * 1000))
        value = self.codec.encode(removal)
        self._buffer.append(Record(schema.topic, key, value, position.to_bytes()))
        self._buffer.append(Record(schema.topic, key, None, position.to_bytes()))
        self._buffered_bytes += len(value)
        self.images.remember(schema.topic, key, None)
        if self._oldest is None:
            self._oldest = time.monotonic()

    def ensure_topic(self, schema: TableSchema) -> None:
        topic = schema.topic
        if topic not in self._topics:
            logged = [v.schema for v in self.codec.store.versions(f"{topic}-value")]
            check_key(schema, logged)
            policy = self.columns.get(schema.table) if self.columns is not None else None
            if policy is not None:
                check_history(policy, topic, logged)
            info = self.log.ensure_topic(topic, {"source": self.source,
                                                 "table": str(schema.table),
                                                 "connector": schema.connector})
            self._topics[topic] = info.partitions

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def checkpoint(self, offset: SourceOffset) -> None:
        """Everything added so far is complete up to ``offset`` (the source's resume point; a
        plain mapping is stored as it is, for tests and tools without a connector)."""
        self._pending_offset = offset
        self._boundary(self._buffer[-1].position if self._buffer else None)
        if self._oldest is None:
            self._oldest = time.monotonic()

    def due(self) -> bool:
        """Whether a flush is due: the buffer is full, or the oldest item waited ``interval``
        and no commit is running (while one runs, the next keeps filling: a log whose commits
        take longer than ``interval`` — Kafka's round trips — gets larger commits instead of
        a capture thread waiting)."""
        if len(self._buffer) >= self.max_records or self._buffered_bytes >= self.max_bytes:
            return True
        if self._inflight is not None and not self._inflight[0].done():
            return False
        return self._oldest is not None and time.monotonic() - self._oldest >= self.interval

    def flush(self, wait: bool = True) -> SourceOffset | None:
        """Commit the buffer with the pending offset; return the newest source offset that is
        durable now and was not returned before (None if there is none).

        ``wait=True``: returns once everything added so far is durable (the offset returned is
        the pending one, if any). ``wait=False``: the commit runs in the background while the
        caller goes on adding (its fsyncs overlap the next batch's work); what it returns is
        the offset of the *previous* background commit, which is durable by then, and the
        caller acknowledges that one. At most one commit runs at a time, in order.
        """
        done = self._finish_inflight()
        offset = self._pending_offset
        if not self._buffer and offset is None:
            return done
        offsets = None if offset is None else {
            self.source: offset.dump() if isinstance(offset, SourceOffset) else dict(offset)}
        records = self._buffer
        finish = self._finisher(self._markers, self._open, offsets)
        self.stats.records += len(records)
        self.stats.commits += 1
        self._buffer = []
        self._buffered_bytes = 0
        self._markers = []
        self._pending_offset = None
        self._oldest = None
        newest, self._newest_commit_ms = self._newest_commit_ms, None
        self.images.committing()
        if wait:
            self.images.appended(records, self._append(records, offsets, finish, newest))
            return offset if offset is not None else done
        if self._committer is None:
            self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdc-commit")
        self._inflight = (self._committer.submit(self._append, records, offsets, finish, newest),
                          records, offset)
        return done

    def _append(self, records: list[Record], offsets: dict[str, Any] | None, finish: Any,
                newest_commit_ms: int | None) -> list[AppendResult]:
        """One commit to the log, timed for the observer (once per commit)."""
        started = time.perf_counter()
        results = self.log.append(records, offsets, finish)
        self.observer.committed(self.source, records, time.perf_counter() - started,
                                newest_commit_ms)
        return results

    def _finisher(self, markers: list[Marker], still_open: OpenTransaction | None,
                  offsets: dict[str, Any] | None) -> Any:
        """The ``finish`` step of one append (see :meth:`ChangeLogWriter.append`): the
        transaction events, placed after the records they describe, and the source offset
        with the new cut. Runs in the commit (maybe in the background), in commit order."""
        source = self.source
        events = self.transactions

        def finish(results: list[AppendResult]) -> tuple[list[Record], dict[str, Any] | None]:
            more: list[Record] = []
            cut_at = None
            last = 0
            txn: OpenTransaction | None = None
            for index, kind, marker_txn, position in markers:
                if txn is not None:
                    advance(txn.ends, results[last:index])
                last = index
                if kind == BEGIN:
                    txn = marker_txn
                    assert txn is not None
                    if not txn.begun:
                        txn.begun = True
                        more.append(events.record(BEGIN, txn, position))
                elif kind == END:
                    ended = txn or marker_txn
                    assert ended is not None
                    if txn is None:  # begun in an earlier append
                        advance(ended.ends, results[:index])
                    more.append(events.record(END, ended, position, ended.ends))
                    txn = None
                    cut_at = index
                else:
                    cut_at = index
            if txn is None and still_open is not None and not markers:
                txn = still_open  # a big transaction's middle: no marker in this append
            if txn is not None:
                advance(txn.ends, results[last:])
            new = offsets
            if cut_at is not None:
                advance(self._uncut, results[:cut_at])
                for topic, parts in self._uncut.items():
                    mine = self._cut.setdefault(topic, {})
                    for partition, end in parts.items():
                        mine[partition] = max(mine.get(partition, 0), end)
                self._uncut = {}
                advance(self._uncut, results[cut_at:])
            else:
                advance(self._uncut, results)
            if offsets is not None:
                new = {source: {**offsets[source], CUT_KEY: copy.deepcopy(self._cut)}}
            return more, new

        return finish

    def _finish_inflight(self) -> SourceOffset | None:
        """Wait for the background commit (re-raising its error); its offset, if any."""
        if self._inflight is None:
            return None
        future, records, offset = self._inflight
        self._inflight = None
        self.images.appended(records, future.result())
        return offset

    def discard(self) -> None:
        """Forget what is buffered (it was never acknowledged; the source sends it again).
        A commit already running in the background is waited for (it may succeed or fail:
        either way its offset was never acknowledged). Call :meth:`resync` before adding
        again: it reads what the log really holds (the log may be unreachable just now)."""
        try:
            self._finish_inflight()
        except Exception as exc:  # noqa: BLE001 - whatever it was, the source resends it
            log.debug("source %s: the background commit failed too: %s", self.source, exc)
        finally:
            self.images.forget_all()  # it may hold images of what is discarded
            self._buffer = []
            self._buffered_bytes = 0
            self._markers = []
            self._open = None
            self._pending_offset = None
            self._oldest = None

    def resync(self) -> None:
        """Take the transaction cut from the log (after :meth:`discard`: whatever a failed
        commit really left there)."""
        self._load_cut()
