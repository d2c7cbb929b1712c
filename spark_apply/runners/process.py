"""The runner of local mode: a follower's writes in a process of its own beside the apply
process, fed the batch's fold undecoded (``Takes.FOLDED``: it decodes what it writes).

On one machine a Spark job's launch (scheduling, a Python worker's round trip, the task's
closure) costs more than a batch of a few thousand changes, and the apply process's one GIL
cannot write several followers at once; so each follower gets a child process that holds its
sink (opened once, kept), decodes the winners of the loop's one read and writes them. The
winners cross the pipe as plain tuples of bytes, pickled once however many children take them
(``spark_apply/shared_read.py``: ``Shipment``); decoded changes would cost more to unpickle than
to decode.

Contracts, stated exactly:

* **One batch at a time.** The loop never gives a follower two batches at once, so the child is
  the only writer of its follower — as a task is — and its writes pass the sink's version gate.
* **Failures.** A failure comes back as its traceback text; :meth:`ProcessRunner.run` raises the
  :class:`~cdc.errors.CdcError` it names (``spark_apply/errors.py``), else a ``RuntimeError``.
  A child that dies mid-batch (killed, out of memory) is replaced and the batch written again
  once (the gate makes that harmless); a second death fails the batch.
* **No orphans.** The child ends when :meth:`close` closes its pipe, and when the apply process
  dies (the kernel closes its end of the pipe): it outlives a killed parent by at most the
  batch it was writing, whose writes are gated like a zombie task's.
* ``spawn``, not ``fork``: the parent may hold a JVM gateway and threads that a fork would copy
  half-way. A child costs its imports once (about a second), started when apply starts
  (:meth:`ProcessRunner.warm`).
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from typing import Any

from spark_apply.errors import raise_task_failure
from spark_apply.runners.base import Runner
from spark_apply.shared_read import Batch, Shipment, Takes
from spark_apply.tasks import Folded, FollowerHandle, TaskReport, apply_changes, decode_folded

#: nothing to write: the batch only moves watermarks
_NOTHING = Shipment(Folded(False))


class ProcessRunner(Runner):
    """The child process writing one follower's batches (see the module docstring)."""

    takes = Takes.FOLDED

    def __init__(self, handle: FollowerHandle) -> None:
        super().__init__(handle.name)
        self.handle = handle
        self._conn: Any = None
        self._process: Any = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else int(self._process.pid)

    def run(self, batch: Batch) -> TaskReport:
        base = TaskReport(records=batch.report.records,
                          records_by_topic=dict(batch.report.records_by_topic),
                          read_seconds=batch.report.read_seconds)
        folded = (batch.shipment or _NOTHING).pickled()
        for attempt in (1, 2):
            self._start()
            try:
                self._conn.send(base)
                self._conn.send_bytes(folded)
                kind, value = self._conn.recv()
            except (EOFError, BrokenPipeError, ConnectionResetError):
                self._reap()
                if attempt == 2:
                    raise RuntimeError(f"follower {self.name}: its apply process died twice in "
                                       "one batch") from None
                continue
            if kind == "error":
                raise_task_failure(self.name, value)
            report: TaskReport = value
            return report
        raise AssertionError("unreachable")

    def warm(self) -> None:
        """Start the child now (its imports overlap the loop's first read) rather than at the
        first batch."""
        self._start()

    def _start(self) -> None:
        if self._process is not None and self._process.is_alive():
            return
        self._reap()
        context = multiprocessing.get_context("spawn")
        from pyspark import cloudpickle  # the config's class is built at run time from the
        # registered plugins: plain pickle refuses it

        self._conn, child = context.Pipe()
        pickled = cloudpickle.dumps(self.handle)  # type: ignore[no-untyped-call]
        process = context.Process(target=_serve, args=(pickled, child),
                                  daemon=True, name=f"cdc-apply-{self.name}")
        process.start()
        self._process = process
        child.close()  # only the child holds that end: its death is our EOF

    def _reap(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._process is not None:
            self._process.join(5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)
            self._process = None

    def close(self) -> None:
        """End the child (no batch runs between the loop's calls)."""
        self._reap()


def _serve(pickled: bytes, conn: Any) -> None:
    """The child's loop: a batch in, its report (or traceback) out, until the pipe closes."""
    import pickle

    from cdc.reading import open_log

    handle: FollowerHandle = pickle.loads(pickled)  # noqa: S301 - our own parent's
    while True:
        try:
            report: TaskReport = conn.recv()
            folded: Folded = pickle.loads(conn.recv_bytes())  # noqa: S301 - as above
        except (EOFError, OSError):
            return
        try:
            started = time.monotonic()
            changes = decode_folded(folded, open_log(handle.log)[1].change, report)
            report.read_seconds += time.monotonic() - started
            sink = handle.sink()
            sink.refresh()
            answer: tuple[str, Any] = ("ok", apply_changes(sink, changes, report))
        except BaseException:  # noqa: BLE001 - the parent raises it
            answer = ("error", traceback.format_exc())
        try:
            conn.send(answer)
        except (BrokenPipeError, OSError):
            return
