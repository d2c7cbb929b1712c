"""The runner contract: how one follower's planned batches are written.

``cdc apply`` chooses one runner per follower (and per view) when it starts
(:func:`spark_apply.runners.choose`) and keeps it: the batch's shape never changes the choice.
The loop (``spark_apply/jobs.py``) plans and reads; a runner only writes.

Contract, stated exactly:

* :meth:`Runner.run` gets one :class:`~spark_apply.shared_read.Batch` at a time (never two of
  the same follower at once) and returns only once every change of it is written behind the
  sink's version gate, with one :class:`~spark_apply.tasks.TaskReport` for the whole batch; a
  failure raises (a :class:`~cdc.errors.CdcError` naming the fix where it is one of ours) and
  counts nothing as applied.
* It does **not** write watermarks or progress: the loop does, after ``run`` returned.
* What a runner gets of the loop's one read is its :attr:`Runner.takes`
  (``spark_apply/shared_read.py``): the decoded changes (``batch.changes``, folded for its sink),
  the undecoded fold (``batch.shipment``: it decodes what it writes; a runner that alone reads
  its share gets only the ranges instead), or only the ranges, which it reads itself.
* Writing a batch twice is harmless (the gate): after a crash the loop replays from the
  follower's progress record.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from spark_apply.shared_read import Batch, Takes
from spark_apply.tasks import TaskReport


class Runner(ABC):
    """Writes one follower's batches (see the module docstring)."""

    #: what :meth:`run` needs of the batch (the module docstring)
    takes: Takes = Takes.CHANGES
    #: True: it runs Spark jobs (the loop starts a SparkSession for it)
    needs_spark: bool = False

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def run(self, batch: Batch) -> TaskReport:
        """Write ``batch``; its report (see the module docstring)."""

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release what the runner holds (processes, connections); idempotent."""
