"""Small micro-batches in local mode, applied without a Spark job: one process per follower.

In local mode (``local[N]``) a Spark job's launch — scheduling, a Python worker's round trip,
the task's closure — costs more than the work of a batch of a few thousand changes, and the
driver's own Python process cannot do that work for several followers at once (one GIL). So
``cdc apply`` gives each executor-placed follower a :class:`LocalApplier`: a child process of the
driver that runs :func:`~spark_apply.tasks.run_task` over a whole small batch with the
follower's sink (opened once, kept), exactly as an executor's task would. Which batches go there
is :class:`~spark_apply.jobs.BatchHandler`'s decision (``driver_batch_records``); on a cluster
master none do.

Contracts, stated exactly:

* **One task at a time.** A follower's query runs one micro-batch at a time, and the batch is
  one task here, so the child is the batch's only writer — as a task is — and its writes pass
  the sink's version gate like any task's.
* **Failures.** A task's exception comes back as its traceback text, which the driver turns
  into the :class:`~cdc.errors.CdcError` it names (as for a failed Spark task). A child that
  dies mid-task (killed, out of memory) is replaced and the task rerun once (the gate makes a
  rerun harmless); a second death fails the batch.
* **No orphans.** The child ends when :meth:`LocalApplier.close` closes its pipe, and when the
  driver dies (its end of the pipe is closed by the kernel): a child outlives a killed driver by
  at most the task it was running, whose writes are gated like a zombie task's.
* ``spawn``, not ``fork``: the driver holds a JVM gateway and threads that a fork would copy
  half-way. A child costs its imports once (about a second), when the first small batch comes.
"""

from __future__ import annotations

import multiprocessing
import traceback
from typing import Any

from spark_apply.tasks import ApplyTask, FollowerHandle, TaskReport, run_task


class LocalApplier:
    """The child process applying one follower's small batches (see the module docstring)."""

    def __init__(self, handle: FollowerHandle) -> None:
        self.handle = handle
        self._conn: Any = None
        self._process: Any = None

    def run(self, task: ApplyTask) -> TaskReport:
        """``run_task(handle, task)`` in the child; its report. Raises ``RuntimeError`` with
        the task's traceback if it failed."""
        for attempt in (1, 2):
            self._start()
            try:
                self._conn.send(task)
                kind, value = self._conn.recv()
            except (EOFError, BrokenPipeError, ConnectionResetError):
                self._reap()
                if attempt == 2:
                    raise RuntimeError(f"follower {self.handle.name}: its local apply process "
                                       "died twice in one batch") from None
                continue
            if kind == "error":
                raise RuntimeError(value)
            report: TaskReport = value
            return report
        raise AssertionError("unreachable")

    def _start(self) -> None:
        if self._process is not None and self._process.is_alive():
            return
        self._reap()
        context = multiprocessing.get_context("spawn")
        from pyspark import cloudpickle  # as Spark ships a task's handle (its config
        # class is built at run time from the registered plugins: plain pickle refuses it)

        self._conn, child = context.Pipe()
        pickled = cloudpickle.dumps(self.handle)  # type: ignore[no-untyped-call]
        process = context.Process(target=_serve, args=(pickled, child),
                                  daemon=True, name=f"cdc-apply-{self.handle.name}")
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
        """End the child (it finishes nothing: no task runs between batches)."""
        self._reap()


def _serve(pickled: bytes, conn: Any) -> None:
    """The child's loop: a task in, its report (or traceback) out, until the pipe closes."""
    import pickle

    handle: FollowerHandle = pickle.loads(pickled)  # noqa: S301 - our own driver's
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer: tuple[str, Any] = ("ok", run_task(handle, task))
        except BaseException:  # noqa: BLE001 - the driver raises it
            answer = ("error", traceback.format_exc())
        try:
            conn.send(answer)
        except (BrokenPipeError, OSError):
            return
