"""The per-change latency histogram (spark_apply/latency.py)."""

from __future__ import annotations

import random

from spark_apply.latency import BUCKETS, GROWTH, LatencyHistogram, format_seconds


def test_quantiles_bound_the_true_value_from_above_within_one_bucket() -> None:
    rng = random.Random(3)
    values = [rng.lognormvariate(-1.5, 1.2) for _ in range(20_000)]
    hist = LatencyHistogram()
    for start in range(0, len(values), 999):  # several batches
        hist.add(values[start:start + 999])
    assert hist.total == len(values)
    ordered = sorted(values)
    for q in (0.5, 0.9, 0.99):
        true = ordered[int(q * len(ordered)) - 1]
        got = hist.quantile(q)
        assert got is not None
        assert true <= got <= true * GROWTH * GROWTH, (q, true, got)


def test_stamps_edges_and_windows() -> None:
    hist = LatencyHistogram()
    assert hist.quantile(0.5) is None and format_seconds(None) == "-"
    hist.add_stamps([10_000, 10_000, 9_000], applied_s=10.5)  # 0.5 s, 0.5 s, 1.5 s
    assert 0.5 <= (hist.quantile(0.5) or 0) <= 0.5 * GROWTH
    assert 1.5 <= (hist.quantile(1.0) or 0) <= 1.5 * GROWTH
    before = hist.copy()
    hist.add([-3.0, 0.0, 1e9])  # clock step -> bucket 0; huge -> the open last bucket
    window = hist.since(before)
    assert window.total == 3 and int(window.counts[0]) == 2 and int(window.counts[-1]) == 1
    assert len(hist.counts) == BUCKETS
