"""The fold: the reference (``spark_apply/fold.py``) states it; the executor tasks' fold on raw
records (``spark_apply/tasks.py``) gives the same answer, and the history the non-folding sinks
get is every position of every key in order.

Batches are built as rows of the Spark source's schema (``tests/sinkkit.py``). What the sinks
do with a fold (the version gate, replays, deletes...) is the contract suite's,
``tests/test_sink_contract.py``, run for every sink kind.
"""

from __future__ import annotations

import json
import random
from typing import Any

from spark_apply.fold import fold_records
from tests.sinkkit import TOPIC, MiniLog, history, pos, random_log, tasks_fold

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


def _random_batch(seed: int) -> list[dict[str, Any]]:
    """Out-of-order positions (replays), deletes tying with their tombstones, a second topic,
    truncates (one of a key of its own) and watermarks."""
    rng = random.Random(seed)
    log = random_log(seed, keys=30, changes=500)
    for seq in range(501, 560):
        log.upsert(rng.randint(1, 30), pos(rng.randint(1, seq)), seq)
        log.add(rng.randint(1, 9), pos(seq), "c", {"id": 1}, topic="src.public.other")
    log.add(0, pos(600), "t")
    log.add(0, pos(601), "t", topic="src.public.only_truncates")
    log.watermark(3, source="other")
    return log.rows


def test_the_tasks_fold_equals_the_reference() -> None:
    """``fold_raw`` (what the executor tasks run, on raw bytes, decoding winners only) gives
    the reference's changes and counts, on random batches, a one-record batch and none."""
    for seed in (5, 6, 7):
        rows = _random_batch(seed)
        for batch in (rows, rows[:1], []):
            changes, report = tasks_fold(batch)
            want = fold_records(batch)
            order = lambda c: (c.topic, c.key)  # noqa: E731
            assert sorted(changes, key=order) == sorted(want.changes, key=order)
            assert (report.records, report.records_by_topic) == (want.records,
                                                                  want.records_by_topic)
            assert report.newest_ts_ms == max((c.ts_ms for c in changes if c.ts_ms is not None),
                                              default=None)


def test_the_tasks_history_is_every_position_in_order() -> None:
    """``fold_raw(history=True)`` (what sinks with ``folds`` False get, e.g. Delta scd2): every
    position of every key but truncates and watermarks, per key in (position, offset) order,
    a delete's tombstone not repeated."""
    rows = _random_batch(13)
    changes, _ = tasks_fold(rows, history=True)
    assert changes == history(rows)  # both sorted by (topic, key, position)
    assert [c.ts_ms for c in changes] == [c.ts_ms for c in history(rows)]  # not in ==
    distinct = {(r["topic"], r["key"], bytes(r["position"])) for r in rows
                if r["op"] not in ("w", "t")}
    assert len(changes) == len(distinct)
    assert any(r["op"] is None for r in rows)  # tombstones were there to be dropped


def test_newest_per_key_is_the_folds_rule_on_changes() -> None:
    """cdc.sink.newest_per_key, used by every sink that takes an unfolded batch: the highest
    position per (topic, key); on equal positions the later change (the tombstone after its
    delete); the input itself when it already holds one change per key."""
    from cdc.sink import Change, newest_per_key

    def change(topic: str, key: int, seq: int, row: Any, op: str) -> Change:
        return Change(topic, "src", "public.items", f'{{"id":{key}}}', pos(seq), row, op)

    other = "src.public.other"
    delete = change(TOPIC, 1, 5, None, "d")
    tombstone = change(TOPIC, 1, 5, None, "")
    batch = [change(TOPIC, 1, 3, {"id": 1}, "u"), delete, tombstone, change(TOPIC, 1, 4, {}, "u"),
             change(other, 1, 2, {"id": 1}, "c"), change(TOPIC, 2, 9, {"id": 2}, "c")]
    newest = newest_per_key(batch)
    assert [(c.topic, c.key) for c in newest] == [(TOPIC, '{"id":1}'), (other, '{"id":1}'),
                                                  (TOPIC, '{"id":2}')]
    assert newest[0] is tombstone and newest_per_key([delete, tombstone])[0] is tombstone
    assert newest_per_key([tombstone, delete])[0] is delete  # the later one, not the first
    unique = newest[1:]
    assert newest_per_key(unique) is unique
