"""The fold (spark_apply/fold.py) and the version gate, against a real redis-server.

Batches are built as rows of the Spark source's schema and folded in pure Python (fast); one
test checks that the Spark transformation gives the same answer on the shared session.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

from cdc.position import Position
from sinks.redis import DELETED_PREFIX, RedisSink
from spark_apply.fold import fold_records

TOPIC = "src.public.items"


def pos(seq: int, ordinal: int = 1) -> bytes:
    return Position.postgres(seq, ordinal).to_bytes()


class MiniLog:
    """One partition of one topic: records with increasing offsets, as source-schema rows."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, key: int, position: bytes, op: str | None, after: dict[str, Any] | None = None,
            topic: str = TOPIC) -> None:
        self.rows.append({
            "topic": topic, "partition": 0, "offset": len(self.rows), "timestamp_ms": 0,
            "source": "src", "table": "public.items",
            "key": "{}" if op == "t" else json.dumps({"id": key}, separators=(",", ":")),
            "position": position, "op": op,
            "after": None if after is None else json.dumps(after, separators=(",", ":")),
            "source_ts_ms": None if op is None else 1_000 + len(self.rows)})

    def upsert(self, key: int, position: bytes, v: int, op: str = "u") -> None:
        self.add(key, position, op, {"id": key, "v": v})

    def delete(self, key: int, position: bytes) -> None:
        self.add(key, position, "d")
        self.add(key, position, None)  # the tombstone shares the delete's position

    def watermark(self, lsn: int, source: str = "src") -> None:
        self.rows.append({"topic": None, "partition": None, "offset": None,
                          "timestamp_ms": None, "source": source, "table": None, "key": None,
                          "position": None, "op": "w", "after": json.dumps({"lsn": lsn}),
                          "source_ts_ms": None})


@pytest.fixture
def sink(redis_url: str) -> RedisSink:
    return RedisSink("cache", redis_url)


def state(sink: RedisSink) -> dict[str, Any]:
    """Everything the follower holds: hashes with all fields, markers, watermarks."""
    out: dict[str, Any] = {}
    for name in sink.client.scan_iter(count=1000):
        kind = sink.client.type(name)
        out[name] = sink.client.hgetall(name) if kind == "hash" else sink.client.get(name)
    return out


def apply_in_batches(sink: RedisSink, rows: list[dict[str, Any]], size: int,
                     start: int = 0) -> tuple[int, int]:
    """Fold and apply ``rows[start:]`` in batches of ``size``; (applied, skipped)."""
    applied = skipped = 0
    for begin in range(start, len(rows), size):
        folded = fold_records(rows[begin:begin + size])
        stats = sink.apply(folded.changes)
        for source, offset in folded.watermarks.items():
            sink.set_watermark(source, offset)
        applied += stats.written + stats.deleted
        skipped += stats.skipped
    return applied, skipped


def v_of(sink: RedisSink, key: int) -> int | None:
    key_json = json.dumps({"id": key}, separators=(",", ":"))
    row = sink.read(TOPIC, [key_json]).get(key_json)
    return None if row is None else int(row["v"])


# ------------------------------------------------------------------------------ fold only

def test_fold_keeps_highest_position_then_highest_offset() -> None:
    log = MiniLog()
    log.upsert(1, pos(5), 50)
    log.upsert(1, pos(3), 30)  # older position at a later offset (a replay): loses
    log.delete(2, pos(4))       # delete and tombstone tie on position: the tombstone wins
    log.add(0, pos(6), "t")     # truncate: dropped
    log.watermark(10)
    log.watermark(7)            # older watermark later in the batch: the newest is kept
    log.watermark(3, source="other")
    folded = fold_records(log.rows)
    by_key = {c.key: c for c in folded.changes}
    assert set(by_key) == {'{"id":1}', '{"id":2}'}
    assert by_key['{"id":1}'].row == {"id": 1, "v": 50}
    assert by_key['{"id":1}'].position == pos(5)
    assert by_key['{"id":2}'].row is None and by_key['{"id":2}'].position == pos(4)
    assert folded.watermarks == {"src": {"lsn": 10}, "other": {"lsn": 3}}
    assert folded.records == 5  # 4 records + the truncate; watermark rows not counted
    assert folded.newest_ts_ms == 1_004  # the truncate's; tombstones carry none
    # commit times for the latency: every c/u/d record, the one folded away too
    assert folded.stamps == {TOPIC: [1_000, 1_001, 1_002]}
    assert folded.records_by_topic == {TOPIC: 5}


def test_fold_matches_a_reference_on_random_logs() -> None:
    rng = random.Random(7)
    log = MiniLog()
    for seq in range(1, 400):
        key = rng.randint(1, 25)
        if rng.random() < 0.2:
            log.delete(key, pos(seq))
        else:
            log.upsert(key, pos(rng.randint(1, seq)), seq)  # some out of order
    newest: dict[str, tuple[bytes, int, Any]] = {}
    for row in log.rows:
        rank = (row["position"], row["offset"])
        if row["key"] not in newest or rank > newest[row["key"]][:2]:
            newest[row["key"]] = (*rank, row["after"])
    folded = {c.key: c.row for c in fold_records(log.rows).changes}
    assert folded == {k: None if a is None else json.loads(a) for k, (_, _, a) in newest.items()}


def _same_fold(got: Any, want: Any) -> None:
    """Two FoldResults agree on everything (changes in any order, stamps as sorted lists)."""
    assert sorted(got.changes, key=lambda c: (c.topic, c.key)) == sorted(
        want.changes, key=lambda c: (c.topic, c.key))
    assert got.watermarks == want.watermarks
    assert (got.records, got.newest_ts_ms, got.records_by_topic) == (
        want.records, want.newest_ts_ms, want.records_by_topic)
    assert {t: sorted(list(v)) for t, v in got.stamps.items()} == {
        t: sorted(v) for t, v in want.stamps.items()}


def test_arrow_fold_equals_pure_fold() -> None:
    """fold_arrow (the batch handler's fold) on the source schema's Arrow form: out-of-order
    positions, a delete and its tombstone tying, truncates, a truncate-only key, two topics,
    watermarks, and an empty batch."""
    import pyarrow as pa

    from spark_apply.fold import fold_arrow
    from spark_apply.source import SCHEMA

    schema = pa.schema([(f.name, {"string": pa.string(), "int": pa.int32(),
                                  "bigint": pa.int64(), "binary": pa.binary()}[
                                      f.dataType.simpleString()]) for f in SCHEMA.fields])
    rng = random.Random(11)
    log = random_log(5, keys=30, changes=500)
    for seq in range(501, 560):  # out-of-order replays and a second topic
        log.upsert(rng.randint(1, 30), pos(rng.randint(1, seq)), seq)
        log.add(rng.randint(1, 9), pos(seq), "c", {"id": 1}, topic="src.public.other")
    log.add(0, pos(600), "t")
    log.add(0, pos(601), "t", topic="src.public.only_truncates")
    log.watermark(3, source="other")
    for rows in (log.rows, log.rows[:1], []):
        _same_fold(fold_arrow(pa.Table.from_pylist(rows, schema=schema)), fold_records(rows))


# ---------------------------------------------------------------------- fold + version gate

def test_out_of_order_within_a_batch(sink: RedisSink) -> None:
    log = MiniLog()
    log.upsert(1, pos(5), 5)
    log.upsert(1, pos(9), 9)
    log.upsert(1, pos(7), 7)
    apply_in_batches(sink, log.rows, 10)
    assert v_of(sink, 1) == 9
    assert sink.client.hget("public.items:1", "_cdc_position") == pos(9).hex()


def test_out_of_order_across_batches_is_gated(sink: RedisSink) -> None:
    log = MiniLog()
    log.upsert(1, pos(9), 9)
    log.upsert(1, pos(5), 5)
    applied, skipped = apply_in_batches(sink, log.rows, 1)
    assert (applied, skipped) == (1, 1)
    assert v_of(sink, 1) == 9


def random_log(seed: int, keys: int = 40, changes: int = 600) -> MiniLog:
    rng = random.Random(seed)
    log = MiniLog()
    live: set[int] = set()
    for seq in range(1, changes + 1):
        key = rng.randint(1, keys)
        if key in live and rng.random() < 0.25:
            log.delete(key, pos(seq))
            live.discard(key)
        else:
            log.upsert(key, pos(seq), seq, "u" if key in live else "c")
            live.add(key)
        if seq % 97 == 0:
            log.watermark(seq)
    return log


def expected_rows(log: MiniLog) -> dict[str, dict[str, str]]:
    latest: dict[str, tuple[bytes, int, str | None]] = {}
    for row in log.rows:
        if row["op"] in ("w", "t"):
            continue
        rank = (row["position"], row["offset"])
        if row["key"] not in latest or rank > latest[row["key"]][:2]:
            latest[row["key"]] = (*rank, row["after"])
    return {key: {c: str(v) for c, v in json.loads(after).items()}
            for key, (_, _, after) in latest.items() if after is not None}


def held_rows(sink: RedisSink) -> dict[str, dict[str, str]]:
    keys = sorted(sink.keys(TOPIC))
    return sink.read(TOPIC, keys)


def test_replay_from_offset_zero_changes_nothing(sink: RedisSink) -> None:
    log = random_log(1)
    apply_in_batches(sink, log.rows, 37)
    assert held_rows(sink) == expected_rows(log)
    before = state(sink)
    applied, skipped = apply_in_batches(sink, log.rows, 53)  # from 0, other batch bounds
    assert applied == 0 and skipped > 0
    assert state(sink) == before
    assert sink.watermark("src") == {"lsn": 582}


def test_restart_mid_log_and_duplicate_batches(sink: RedisSink) -> None:
    log = random_log(2)
    # a crash after batch 3 was written but before it was committed replays it
    size = 50
    for begin in range(0, len(log.rows), size):
        batch = log.rows[begin:begin + size]
        first = sink.apply(fold_records(batch).changes)
        after_first = state(sink)
        second = sink.apply(fold_records(batch).changes)
        assert second.written == second.deleted == 0
        assert second.skipped == first.written + first.deleted + first.skipped
        assert state(sink) == after_first
    assert held_rows(sink) == expected_rows(log)


def test_delete_then_reinsert(sink: RedisSink) -> None:
    log = MiniLog()
    log.upsert(1, pos(1), 1, "c")
    log.delete(1, pos(2))
    log.upsert(1, pos(3), 3, "c")
    # one batch: only the re-insert reaches Redis
    apply_in_batches(sink, log.rows, 100)
    assert v_of(sink, 1) == 3
    assert not sink.client.exists(DELETED_PREFIX + "public.items:1")
    # one record per batch: the delete leaves a marker, the re-insert removes it
    sink.client.flushall()
    apply_in_batches(sink, log.rows[:3], 1)
    assert v_of(sink, 1) is None
    assert sink.client.get(DELETED_PREFIX + "public.items:1") == pos(2).hex()
    assert list(sink.keys(TOPIC)) == []
    # a late older record cannot resurrect the row while the marker lives
    applied, skipped = apply_in_batches(sink, log.rows[:1], 1)
    assert (applied, skipped) == (0, 1) and v_of(sink, 1) is None
    apply_in_batches(sink, log.rows[3:], 1)
    assert v_of(sink, 1) == 3
    assert not sink.client.exists(DELETED_PREFIX + "public.items:1")


def test_tombstone_after_retention(redis_url: str) -> None:
    sink = RedisSink("cache", redis_url, tombstone_retention=0.3)
    log = MiniLog()
    log.upsert(1, pos(1), 1, "c")
    log.delete(1, pos(2))
    apply_in_batches(sink, log.rows, 1)
    marker = DELETED_PREFIX + "public.items:1"
    assert 0 < sink.client.pttl(marker) <= 300
    assert apply_in_batches(sink, log.rows[:1], 1) == (0, 1)  # gated by the marker
    deadline = time.monotonic() + 5
    while sink.client.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sink.client.exists(marker), "the marker outlived its retention"
    # past the retention the marker is gone: the log's compaction has dropped older records by
    # then, so only a newer record can arrive — and it applies
    later = MiniLog()
    later.upsert(1, pos(4), 4, "c")
    assert apply_in_batches(sink, later.rows, 1) == (1, 0)
    assert v_of(sink, 1) == 4


def test_zero_retention_leaves_no_marker(redis_url: str) -> None:
    sink = RedisSink("cache", redis_url, tombstone_retention=0)
    log = MiniLog()
    log.upsert(1, pos(1), 1, "c")
    log.delete(1, pos(2))
    apply_in_batches(sink, log.rows, 1)
    assert state(sink) == {}


# ------------------------------------------------------------------------------ Spark fold

def test_spark_fold_equals_pure_fold(spark: Any) -> None:
    from spark_apply.fold import collect_fold, fold_arrow, fold_frame
    from spark_apply.source import SCHEMA

    log = random_log(3, keys=30, changes=300)
    log.add(0, pos(301), "t")
    log.upsert(5, pos(3), -1)  # an old record at a later offset
    frame = spark.createDataFrame([tuple(r[f] for f in SCHEMA.fieldNames()) for r in log.rows],
                                  SCHEMA)
    got = collect_fold(fold_frame(frame))
    want = fold_records(log.rows)
    assert sorted(got.changes, key=lambda c: c.key) == sorted(want.changes, key=lambda c: c.key)
    assert got.watermarks == want.watermarks == {"src": {"lsn": 291}}
    assert got.records == want.records == len([r for r in log.rows if r["op"] != "w"])
    assert got.newest_ts_ms == want.newest_ts_ms == 1_000 + len(log.rows) - 1
    assert set(got.stamps) == set(want.stamps) == {TOPIC}
    assert got.records_by_topic == want.records_by_topic == {TOPIC: got.records}
    assert sorted(got.stamps[TOPIC].tolist()) == sorted(want.stamps[TOPIC])
    assert len(want.stamps[TOPIC]) == len([r for r in log.rows if r["op"] in ("c", "u", "d")])
    _same_fold(fold_arrow(frame.toArrow()), want)  # what the batch handler runs


def test_gate_orders_positions_like_bytes(sink: RedisSink) -> None:
    """The Lua gate compares hex chunks as numbers: check it against Python's byte order on
    positions that differ in every part and in high bits."""
    rng = random.Random(5)
    values = [Position.postgres(rng.choice([0, 1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 4])
                                + rng.randint(0, 3), rng.randint(0, 2**64 - 1)).to_bytes()
              for _ in range(60)]
    for first, second in zip(values, values[1:], strict=False):
        sink.client.flushall()
        log = MiniLog()
        log.upsert(1, first, 1)
        log.upsert(1, second, 2)
        apply_in_batches(sink, log.rows, 1)
        assert v_of(sink, 1) == (2 if second > first else 1), (first.hex(), second.hex())
