"""The fold (spark_apply/fold.py): the pure-Python, Arrow and Spark folds agree, and the
history the non-folding sinks get is every record in (position, offset) order per key.

Batches are built as rows of the Spark source's schema (``tests/sinkkit.py``) and folded in
pure Python (fast); one test checks that the Spark transformation gives the same answer on the
shared session. What the sinks do with a fold (the version gate, replays, deletes...) is the
contract suite's, ``tests/test_sink_contract.py``, run for every sink kind.
"""

from __future__ import annotations

import json
import random
from typing import Any

from spark_apply.fold import fold_records
from tests.sinkkit import TOPIC, MiniLog, history, pos, random_log

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


def _source_arrow_schema() -> Any:
    import pyarrow as pa

    from spark_apply.source import SCHEMA

    return pa.schema([(f.name, {"string": pa.string(), "int": pa.int32(),
                                "bigint": pa.int64(), "binary": pa.binary()}[
                                    f.dataType.simpleString()]) for f in SCHEMA.fields])


def test_arrow_fold_equals_pure_fold() -> None:
    """fold_arrow (the batch handler's fold) on the source schema's Arrow form: out-of-order
    positions, a delete and its tombstone tying, truncates, a truncate-only key, two topics,
    watermarks, and an empty batch."""
    import pyarrow as pa

    from spark_apply.fold import fold_arrow

    schema = _source_arrow_schema()
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


def test_arrow_history_is_every_record_in_position_then_offset_order() -> None:
    """fold_arrow(history=True) (what sinks with ``folds`` False get, e.g. Delta scd2) keeps
    every record but truncates and watermarks, ordered per key by (position, offset): out of
    order positions, deletes tying with their tombstones, two topics; the watermarks as the
    fold's."""
    import pyarrow as pa

    from spark_apply.fold import fold_arrow

    rng = random.Random(13)
    log = random_log(6, keys=20, changes=300, ts="position")
    for seq in range(301, 340):
        log.upsert(rng.randint(1, 20), pos(rng.randint(1, seq)), seq)  # replays, out of order
        log.add(rng.randint(1, 5), pos(seq), "c", {"id": 1}, topic="src.public.other")
    log.add(0, pos(400), "t")
    schema = _source_arrow_schema()
    for rows in (log.rows, log.rows[:3], []):
        got = fold_arrow(pa.Table.from_pylist(rows, schema=schema), history=True)
        want = history(rows)
        assert got.changes == want  # both sorted by (topic, key, position, offset)
        assert len(want) == len([r for r in rows if r["op"] not in ("w", "t")])
        assert [c.ts_ms for c in got.changes] == [c.ts_ms for c in want]  # not in ==
        assert got.watermarks == fold_records(rows).watermarks


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
