"""The runner that writes in the apply process itself: a sink placed on the driver, and views in
local mode (their work runs in DuckDB, which releases the GIL; a view in a process of its own
would cost ~100 MB each).

Views share :data:`VIEW_SLOTS`: at most one view per core writes a batch at a time. Twenty-two
views building their state from one large batch at once would hold 22 batches' worth of
DuckDB memory together (~55 MB a view measured at the peak) and gain nothing on two cores.
"""

from __future__ import annotations

import os
import threading

from cdc.sink import Sink
from spark_apply.runners.base import Runner
from spark_apply.shared_read import Batch
from spark_apply.tasks import TaskReport, apply_changes

#: the views of one apply process writing at the same time, at most (one per core)
VIEW_SLOTS = threading.BoundedSemaphore(max(1, os.cpu_count() or 1))


class InlineRunner(Runner):
    """``Sink.apply`` of the batch's changes, in this process, with the loop's own sink
    (``slots``: a semaphore the runner holds while it writes, shared with its peers)."""

    def __init__(self, name: str, sink: Sink,
                 slots: threading.BoundedSemaphore | None = None) -> None:
        super().__init__(name)
        self.sink = sink
        self.slots = slots

    def run(self, batch: Batch) -> TaskReport:
        if self.slots is None:
            return self._run(batch)
        with self.slots:
            return self._run(batch)

    def _run(self, batch: Batch) -> TaskReport:
        self.sink.refresh()
        report = TaskReport(records=batch.report.records,
                            records_by_topic=dict(batch.report.records_by_topic),
                            newest_ts_ms=batch.report.newest_ts_ms,
                            read_seconds=batch.report.read_seconds)
        return apply_changes(self.sink, batch.changes or [], report, batch.behind)
