"""Per-change end-to-end latency: commit at the source -> applied in the follower.

For every change event a batch applies (ops ``c``/``u``/``d``: a commit at the source; snapshot
reads ``r``, truncates and tombstones are not counted), the latency is *the moment the batch's
sink writes and watermarks finished* minus the event's ``source_ts_ms`` (the commit time the
source recorded), in seconds, clamped at 0 (clock steps).

:class:`LatencyHistogram` keeps them in fixed logarithmic buckets, so recording a batch is one
``numpy`` pass and memory is constant: bucket 0 holds ``[0, 1 ms)``, bucket ``i >= 1`` holds
``[1 ms * GROWTH**(i-1), 1 ms * GROWTH**i)``, and the last bucket also everything above (about
10 hours). :meth:`LatencyHistogram.quantile` returns the *upper edge* of the bucket holding the
quantile, so it over-states the true value by less than ``GROWTH - 1`` (4 %), never under-states.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: ratio between a bucket's upper and lower edges
GROWTH = 1.04
#: lower edge of bucket 1 (seconds); bucket 0 is [0, FLOOR)
FLOOR = 0.001
#: buckets in all (the last one is open-ended, from about 10 h)
BUCKETS = 2 + math.ceil(math.log(36_000 / FLOOR) / math.log(GROWTH))
_LOG_GROWTH = math.log(GROWTH)


def upper_edge(bucket: int) -> float:
    """The upper edge (seconds) of ``bucket`` (for the last, open-ended one: its lower edge)."""
    return FLOOR * GROWTH ** min(bucket, BUCKETS - 2)


class LatencyHistogram:
    """Counts of latencies (seconds) per bucket (see the module docstring)."""

    def __init__(self) -> None:
        self.counts = np.zeros(BUCKETS, dtype=np.int64)

    @property
    def total(self) -> int:
        """How many latencies were recorded."""
        return int(self.counts.sum())

    def add_stamps(self, stamps_ms: Any, applied_s: float) -> None:
        """Record, for each commit time in ``stamps_ms`` (ms since the epoch, any array-like of
        integers), the latency ``applied_s - stamp / 1000``."""
        stamps = np.asarray(stamps_ms, dtype=np.float64)
        if stamps.size:
            self.add(applied_s - stamps / 1000.0)

    def add(self, seconds: Any) -> None:
        """Record latencies given in seconds (negative ones count as 0)."""
        values = np.asarray(seconds, dtype=np.float64)
        if not values.size:
            return
        scaled = np.log(np.maximum(values, FLOOR) / FLOOR) / _LOG_GROWTH
        index = np.where(values < FLOOR, 0, np.floor(scaled).astype(np.int64) + 1)
        self.counts += np.bincount(np.clip(index, 0, BUCKETS - 1), minlength=BUCKETS)

    def merge(self, other: LatencyHistogram) -> None:
        self.counts += other.counts

    def quantile(self, q: float) -> float | None:
        """The latency (seconds) at quantile ``q`` (0 < q <= 1): the upper edge of the first
        bucket where at least ``q`` of all recorded latencies lie; ``None`` when empty."""
        total = self.total
        if total == 0:
            return None
        cumulative = np.cumsum(self.counts)
        bucket = int(np.searchsorted(cumulative, q * total, side="left"))
        return upper_edge(min(bucket, BUCKETS - 1))

    def copy(self) -> LatencyHistogram:
        out = LatencyHistogram()
        out.counts = self.counts.copy()
        return out

    def since(self, earlier: LatencyHistogram) -> LatencyHistogram:
        """The latencies recorded after ``earlier`` (a :meth:`copy` of this one) was taken."""
        out = LatencyHistogram()
        out.counts = self.counts - earlier.counts
        return out


def format_seconds(value: float | None) -> str:
    """``0.123 s`` / ``12.3 s`` / ``-``."""
    if value is None:
        return "-"
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
