"""What each follower (or view) of a ``cdc apply`` has done so far: counts, latency, recent
batches — updated by the loop after each batch, read by the live table, ``cdc status`` files,
the metrics and the benchmarks."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from cdc.errors import CdcError
from spark_apply.latency import LatencyHistogram
from spark_apply.tasks import TaskReport, add_counts, add_phases

#: batches each follower's progress remembers (:attr:`FollowerProgress.recent`)
RECENT = 200


@dataclass
class FollowerProgress:
    """What one follower has done so far (updated after each of its batches)."""

    name: str
    batches: int = 0
    records: int = 0
    changes: int = 0
    written: int = 0
    deleted: int = 0
    skipped: int = 0
    #: rows the sink's storage engine read (a view's state: :attr:`ApplyStats.scanned`)
    scanned: int = 0
    #: a view's keys recomputed as a scalar subquery's value moved (:attr:`ApplyStats.revisited`)
    revisited: int = 0
    #: seconds from the newest applied record's commit at the source to its apply
    lag_s: float | None = None
    #: per change event (c/u/d) applied: commit at the source -> batch applied
    #: (``spark_apply/latency.py``), over all topics and per topic
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    latency_by_topic: dict[str, LatencyHistogram] = field(default_factory=dict)
    #: per topic, log records read (truncates and tombstones included)
    records_by_topic: dict[str, int] = field(default_factory=dict)
    watermarks: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: time of its batches; of it, reading + folding and the sink's writes
    seconds: float = 0.0
    fold_seconds: float = 0.0
    sink_seconds: float = 0.0
    #: CPU seconds of reading and decoding in its own processes or tasks
    #: (:attr:`TaskReport.read_cpu_seconds`)
    read_cpu_seconds: float = 0.0
    #: of the sink's seconds, per phase where it measures them (:attr:`ApplyStats.phases`)
    phases: dict[str, float] = field(default_factory=dict)
    #: the last :data:`RECENT` batches: when each started (epoch s), its seconds, of them
    #: read + fold and the sink's, its records (``bench/apply.py`` reports them)
    recent: deque[dict[str, float]] = field(default_factory=lambda: deque(maxlen=RECENT))
    #: a CdcError its batch raised (re-raised by the job with its fix)
    error: CdcError | None = None
    #: told of each applied batch, failure and restart (``cdc apply --metrics-port``:
    #: :class:`cdc_app.metrics.ApplyMetrics`)
    observer: Any = None

    def record(self, total: TaskReport, watermarks: dict[str, Any], seconds: float) -> None:
        """Count one applied batch."""
        self.batches += 1
        self.recent.append({"started": time.time() - seconds, "seconds": seconds,
                            "read_s": total.read_seconds, "sink_s": total.sink_seconds,
                            "records": total.records})
        add_counts(self, total)
        self.watermarks.update(watermarks)
        self.seconds += seconds
        self.fold_seconds += total.read_seconds
        self.sink_seconds += total.sink_seconds
        self.read_cpu_seconds += total.read_cpu_seconds
        add_phases(self.phases, total.phases)
        for topic, histogram in total.latency_by_topic.items():
            self.latency.merge(histogram)
            self.latency_by_topic.setdefault(topic, LatencyHistogram()).merge(histogram)
        if total.newest_ts_ms is not None:
            self.lag_s = max(0.0, time.time() - total.newest_ts_ms / 1000)
        elif watermarks:
            self.lag_s = 0.0
        if self.observer is not None:
            self.observer.batch(self, total, seconds)
