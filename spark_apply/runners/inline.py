"""The runner that writes in the apply process itself: a sink placed on the driver, and views in
local mode (their work runs in DuckDB, which releases the GIL; a view in a process of its own
would cost ~100 MB each)."""

from __future__ import annotations

from cdc.sink import Sink
from spark_apply.runners.base import Runner
from spark_apply.shared_read import Batch
from spark_apply.tasks import TaskReport, apply_changes


class InlineRunner(Runner):
    """``Sink.apply`` of the batch's changes, in this process, with the loop's own sink."""

    def __init__(self, name: str, sink: Sink) -> None:
        super().__init__(name)
        self.sink = sink

    def run(self, batch: Batch) -> TaskReport:
        self.sink.refresh()
        report = TaskReport(records=batch.report.records,
                            records_by_topic=dict(batch.report.records_by_topic),
                            newest_ts_ms=batch.report.newest_ts_ms,
                            read_seconds=batch.report.read_seconds)
        return apply_changes(self.sink, batch.changes or [], report)
