"""The runner of local mode: a follower's writes in a process of its own beside the apply
process, fed the batch's fold undecoded (``Takes.FOLDED``: it decodes what it writes).

On one machine a Spark job's launch (scheduling, a Python worker's round trip, the task's
closure) costs more than a batch of a few thousand changes, and the apply process's one GIL
cannot write several followers at once; so each follower gets a child process that holds its
sink (opened once, kept), decodes the winners of the loop's one read and writes them. The
winners cross the pipe as plain tuples of bytes, pickled once however many children take them
(``spark_apply/shared_read.py``: ``Shipment``); decoded changes would cost more to unpickle than
to decode. A follower that alone reads its share gets only the ranges, and its children read
them themselves (``spark_apply/tasks.py``: ``run_task``, as an executor task does).

Contracts, stated exactly:

* **One batch at a time.** The loop never gives a follower two batches at once, so its children
  are the only writers of the follower — as tasks are — and their writes pass the sink's version
  gate.
* **Writers.** A batch of at least :data:`SPLIT_AT` winners is written by ``writers`` children
  at once (default: one per core), each the keys :meth:`Sink.owner` gives it — the rule that
  splits a batch between executor tasks (a Delta bucket, a search shard has one writer). Smaller
  batches go to the first child alone; the others start at the first large batch.
* **Failures.** A failure comes back as its traceback text; :meth:`ProcessRunner.run` raises the
  :class:`~cdc.errors.CdcError` it names (``spark_apply/errors.py``), else a ``RuntimeError``,
  once every child of the batch has answered. A child that dies mid-batch (killed, out of
  memory) is replaced and its part written again once (the gate makes that harmless); a second
  death fails the batch.
* **No orphans.** The child ends when :meth:`close` closes its pipe, and when the apply process
  dies (the kernel closes its end of the pipe): it outlives a killed parent by at most the
  batch it was writing, whose writes are gated like a zombie task's.
* ``spawn``, not ``fork``: the parent may hold a JVM gateway and threads that a fork would copy
  half-way. A child costs its imports once (about a second), started when apply starts
  (:meth:`ProcessRunner.warm`).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time
import traceback
from typing import Any

from cdc.heap import collector_paused, long_lived_heap
from cdc.reading import open_log
from spark_apply.errors import raise_task_failure
from spark_apply.runners.base import Runner
from spark_apply.shared_read import Batch, Shipment, Takes
from spark_apply.tasks import (
    ApplyTask,
    Folded,
    FollowerHandle,
    TaskReport,
    apply_changes,
    decode_folded,
    plan_tasks,
    run_task,
)

#: nothing to write: the batch only moves watermarks
_NOTHING = Shipment(Folded(False))
#: a batch of this many winners (or records, read by the children) or more is split between the
#: writers: a follower that far behind (4 s of changes at 5,000/s) gains from more cores; at the
#: live end one writer is faster -- with 4,000, Delta's and search's batches under a steady
#: 5,000 changes/s were split, and every follower's p50 rose (Redis 0.276 -> 0.333 s, search
#: 0.589 -> 0.874: each writer unpickles the whole fold, two MERGEs per batch; docs/benchmarks.md)
SPLIT_AT = 20_000
#: children writing one follower's large batch at once, by default
WRITERS = max(1, min(4, os.cpu_count() or 1))


class _Child:
    """One child process and the parent's end of its pipe."""

    def __init__(self, name: str, pickled_handle: bytes) -> None:
        self.name = name
        self.pickled_handle = pickled_handle
        self.conn: Any = None
        self.process: Any = None

    def start(self) -> None:
        if self.process is not None and self.process.is_alive():
            return
        self.reap()
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(self.pickled_handle, child),
                                       daemon=True, name=f"cdc-apply-{self.name}")
        self.process.start()
        child.close()  # only the child holds that end: its death is our EOF

    def send(self, report: TaskReport, index: int, count: int, task: ApplyTask | None,
             folded: bytes) -> bool:
        """Hand over a part (``task``: ranges to read; None: its part of ``folded``); False if
        the child is gone."""
        try:
            self.conn.send((report, index, count, task))
            if task is None:
                self.conn.send_bytes(folded)
        except (BrokenPipeError, ConnectionResetError, OSError):
            return False
        return True

    def answer(self) -> tuple[str, Any] | None:
        """The child's answer; None if it died first."""
        try:
            answer: tuple[str, Any] = self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            return None
        return answer

    def reap(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.process is not None:
            self.process.join(5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
            self.process = None


class ProcessRunner(Runner):
    """The child processes writing one follower's batches (see the module docstring)."""

    takes = Takes.FOLDED

    def __init__(self, handle: FollowerHandle, writers: int = WRITERS,
                 split_keys: bool = False) -> None:
        super().__init__(handle.name)
        self.handle = handle
        self.writers = max(1, writers)
        #: the sink's placement is ``BY_OWNER``: children reading ranges each read all of them
        #: and keep their keys (as executor tasks do); else each reads whole partitions
        self.split_keys = split_keys
        self._children: list[_Child] = []
        #: the handle as every child gets it (pickled once)
        self._pickled_handle: bytes | None = None

    @property
    def pids(self) -> list[int]:
        """The live children's process ids (the first writes every small batch)."""
        return [int(child.process.pid) for child in self._children
                if child.process is not None and child.process.is_alive()]

    def run(self, batch: Batch) -> TaskReport:
        shipment = batch.shipment
        if shipment is None and batch.ranges:  # it alone reads the share: its children read
            tasks = plan_tasks(batch.ranges, self.writers if _records(batch) >= SPLIT_AT else 1,
                               self.split_keys)
            parts: list[tuple[TaskReport, ApplyTask | None]] = [(TaskReport(), task)
                                                                for task in tasks]
            folded = b""
        else:
            shipment = shipment or _NOTHING
            count = self.writers if len(shipment.folded.winners) >= SPLIT_AT else 1
            parts = [(TaskReport(records=batch.report.records,
                                 records_by_topic=dict(batch.report.records_by_topic),
                                 read_seconds=batch.report.read_seconds), None)]
            parts += [(TaskReport(), None) for _ in range(1, count)]
            folded = shipment.pickled()
        answers = self._write(parts, folded)
        total = TaskReport()
        for index in range(len(parts)):
            kind, value = answers[index]
            if kind == "error":
                raise_task_failure(self.name, value)
            total.merge(value)
        return total

    def _write(self, parts: list[tuple[TaskReport, ApplyTask | None]], folded: bytes
               ) -> dict[int, tuple[str, Any]]:
        """Each part to a child of its own, at once; their answers (a part whose child died is
        given to a new child once)."""
        count = len(parts)
        answers: dict[int, tuple[str, Any]] = {}
        for _ in range(2):
            pending = [index for index in range(count) if index not in answers]
            sent = [index for index in pending
                    if self._child(index).send(parts[index][0], index, count, parts[index][1],
                                               folded)]
            for index in sent:
                answer = self._children[index].answer()
                if answer is not None:
                    answers[index] = answer
            if len(answers) == count:
                return answers
            for index in range(count):
                if index not in answers:
                    self._children[index].reap()
        raise RuntimeError(f"follower {self.name}: its apply process died twice in one batch")

    def _child(self, index: int) -> _Child:
        if len(self._children) <= index and self._pickled_handle is None:
            from pyspark import cloudpickle  # the config's class is built at run time from
            # the registered plugins: plain pickle refuses it

            self._pickled_handle = cloudpickle.dumps(self.handle)  # type: ignore[no-untyped-call]
        while len(self._children) <= index:
            assert self._pickled_handle is not None
            self._children.append(_Child(self.name, self._pickled_handle))
        child = self._children[index]
        child.start()
        return child

    def warm(self) -> None:
        """Start the first child now (its imports overlap the loop's first read) rather than
        at the first batch."""
        self._child(0)

    def close(self) -> None:
        """End the children (no batch runs between the loop's calls)."""
        for child in self._children:
            child.reap()


def _serve(pickled: bytes, conn: Any) -> None:
    """The child's loop: a part of a batch in, its report (or traceback) out, until the pipe
    closes."""
    handle: FollowerHandle = pickle.loads(pickled)  # noqa: S301 - our own parent's
    long_lived_heap()
    while True:
        try:
            report, index, count, task = conn.recv()
            part = conn.recv_bytes() if task is None else b""
        except (EOFError, OSError):
            return
        with collector_paused():
            answer = _write(handle, report, index, count, task, part)
            del part
        try:
            conn.send(answer)
        except (BrokenPipeError, OSError):
            return


def _write(handle: FollowerHandle, report: TaskReport, index: int, count: int,
           task: ApplyTask | None, pickled: bytes) -> tuple[str, Any]:
    """Write writer ``index`` of ``count``'s part of a batch: ``task``'s ranges read here, or
    its keys of the fold in ``pickled``; the answer to send (``ok`` and the report, or
    ``error`` and the traceback)."""
    try:
        sink = handle.sink()
        sink.refresh()
        if task is not None:
            return "ok", run_task(handle, task, sink)
        started, cpu = time.monotonic(), time.thread_time()
        folded: Folded = pickle.loads(pickled)  # noqa: S301 - our own parent's
        if count > 1:
            folded = _part(folded, sink.owner, index, count)
        changes = decode_folded(folded, open_log(handle.log)[1].change, report)
        report.read_seconds += time.monotonic() - started
        report.read_cpu_seconds += time.thread_time() - cpu
        return "ok", apply_changes(sink, changes, report)
    except BaseException:  # noqa: BLE001 - the parent raises it
        return "error", traceback.format_exc()


def _records(batch: Batch) -> int:
    """Records in ``batch``'s ranges."""
    return sum(item.end - item.start for item in batch.ranges)


def _part(folded: Folded, owner: Any, index: int, count: int) -> Folded:
    """Writer ``index`` of ``count``'s part of ``folded``: the keys ``owner`` gives it (the
    table key's records go to the first)."""
    return Folded(folded.history,
                  [w for w in folded.winners if owner(w[0].topic, w[1], count) == index],
                  folded.table_keyed if index == 0 else [])
