"""The apply loop's planner and its one read (``spark_apply/planning.py``,
``spark_apply/shared_read.py``) on real local logs: followers at the same offsets share one read
and every record is decoded once however many take it; a follower a little behind joins the
lead's read and ends where the lead ends (then they are one group), one far behind reads alone
within its own budget; a batch where only the source's offset moved carries the watermark and
nothing else; each follower's changes equal the fold of exactly its own range."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc.reading import Decoder, open_log
from cdc.sink import Change
from spark_apply.planning import Member, Read, plan_cycle
from spark_apply.shared_read import Batch, Decoded, Takes, cut
from spark_apply.tasks import TaskReport, decode_folded
from tests.test_spark_source import SOURCE, Log


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    opened = Log(tmp_path / "log", keys=40)
    yield opened
    opened.writer.close()


def member(name: str, start: dict[str, Any] | None = None, budget: int = 10**9,
           only: frozenset[str] | None = None) -> Member:
    return Member(name, start or {"topics": {}}, frozenset({SOURCE}), only, budget)


class Counting(Decoder):
    """A decoder counting the records it decodes."""

    def __init__(self, inner: Decoder) -> None:
        super().__init__(inner.codec)
        self.calls = 0

    def change(self, item: Any, key: bytes, position: bytes, value: bytes | None
               ) -> Change | None:
        self.calls += 1
        return super().change(item, key, position, value)


def plan(log: Log, members: list[Member]) -> tuple[list[Read], Any, Any]:
    reader, _ = open_log(f'{{"backend": "local", "path": "{log.path}"}}')
    state = reader.committed()
    return plan_cycle(reader, state, members), reader, state


def batches(log: Log, read: Read, decoder: Decoder | None = None,
            takes: Takes = Takes.CHANGES) -> dict[str, Batch]:
    reader, plain = open_log(f'{{"backend": "local", "path": "{log.path}"}}')
    return cut(reader, decoder or plain, reader.committed(), read, lambda _: takes,
               lambda _: False)


def span(start: dict[str, Any], end: dict[str, Any]) -> int:
    """Offsets from ``start`` to ``end``."""
    return sum(int(stop) - int(start.get("topics", {}).get(topic, {}).get(partition, 0))
               for topic, parts in end["topics"].items() for partition, stop in parts.items())


def fold_of(log: Log, start: dict[str, Any], end: dict[str, Any]) -> dict[str, bytes]:
    """key -> position of the newest record of each key in ``start <= offset < end``."""
    reader, _ = open_log(f'{{"backend": "local", "path": "{log.path}"}}')
    best: dict[str, tuple[bytes, int]] = {}
    for topic, parts in end["topics"].items():
        for partition, stop in parts.items():
            at = int(start.get("topics", {}).get(topic, {}).get(partition, 0))
            for record in reader.iter_partition(topic, int(partition), at):
                if record.offset >= stop:
                    break
                key = record.key.decode()
                if key not in best or (record.position, record.offset) > best[key]:
                    best[key] = (bytes(record.position), record.offset)
    return {key: position for key, (position, _) in best.items()}


def test_followers_at_one_offset_share_one_read_and_decode_each_record_once(log: Log) -> None:
    log.append(300)
    members = [member("a"), member("b"), member("c")]
    reads, _, _ = plan(log, members)
    assert len(reads) == 1 and [len(share.members) for share in reads[0].shares] == [3]
    reader, plain = open_log(f'{{"backend": "local", "path": "{log.path}"}}')
    counting = Counting(plain)
    got = batches(log, reads[0], counting)
    expected = fold_of(log, {"topics": {}}, reads[0].shares[0].end)
    for name in ("a", "b", "c"):
        changes = got[name].changes or []
        assert {c.key: c.position for c in changes} == expected
        assert got[name].report.records == span({"topics": {}}, reads[0].shares[0].end) > 300
        assert got[name].watermarks == {SOURCE: {"seq": 300}}
    assert got["a"].changes is got["b"].changes or got["a"].changes == got["b"].changes
    assert counting.calls == len(expected)  # three followers, each winner decoded once


def test_followers_in_processes_share_one_undecoded_fold_pickled_once(log: Log) -> None:
    """``Takes.FOLDED`` (a follower's own process): nothing is decoded in the loop, the three
    followers get one shipment, and what it unpickles to decodes to the same changes."""
    log.append(300)
    reads, _, _ = plan(log, [member("a"), member("b"), member("c")])
    reader, plain = open_log(f'{{"backend": "local", "path": "{log.path}"}}')
    counting = Counting(plain)
    got = batches(log, reads[0], counting, Takes.FOLDED)
    assert counting.calls == 0 and all(got[name].changes is None for name in "abc")
    shipment = got["a"].shipment
    assert shipment is not None and got["b"].shipment is shipment is got["c"].shipment
    assert shipment.pickled() is shipment.pickled()  # pickled once
    report = TaskReport()
    changes = decode_folded(pickle.loads(shipment.pickled()), plain.change, report)
    assert {c.key: c.position for c in changes} == fold_of(log, {"topics": {}},
                                                           reads[0].shares[0].end)
    assert report.newest_ts_ms == max(c.ts_ms for c in changes if c.ts_ms is not None)


def test_a_follower_a_little_behind_joins_the_read_one_far_behind_reads_alone(
        log: Log) -> None:
    log.append(200)
    (first,), _, state = plan(log, [member("lead")])
    lead_at = first.shares[0].end
    (partial,), _, state = plan(log, [member("near", budget=150)])
    near_at = partial.shares[0].end  # part of the way: 150 offsets
    log.append(40)
    members = [member("lead", lead_at), member("near", near_at, budget=10**6),
               member("far", budget=50)]
    reads, _, state = plan(log, members)
    assert len(reads) == 2
    joint, alone = reads
    assert {m.name for share in joint.shares for m in share.members} == {"lead", "near"}
    ends = {m.name: share.end for share in joint.shares for m in share.members}
    assert ends["lead"]["topics"] == ends["near"]["topics"]  # next cycle: one group
    assert [m.name for m in alone.shares[0].members] == ["far"]
    far_end = alone.shares[0].end
    assert sum(sum(p.values()) for p in far_end["topics"].values()) <= 50
    assert "watermarks" not in far_end  # not complete: no watermark claimed

    got = {**batches(log, joint), **batches(log, alone)}
    assert got["lead"].report.records == span(lead_at, ends["lead"]) >= 40
    assert got["near"].report.records == span(near_at, ends["near"]) > 40
    for name, start in (("lead", lead_at), ("near", near_at), ("far", {"topics": {}})):
        share_end = far_end if name == "far" else ends[name]
        assert {c.key: c.position for c in got[name].changes or []} == fold_of(log, start,
                                                                               share_end)

    # applied as planned, lead and near now agree: one group, one read, one share
    after = [member("lead", got["lead"].end), member("near", got["near"].end),
             member("far", got["far"].end, budget=50)]
    log.append(10)
    reads, _, _ = plan(log, after)
    names = [[m.name for m in share.members] for read in reads for share in read.shares]
    assert ["lead", "near"] in names and len(reads) == 2


def test_groups_reading_the_same_records_in_turn_decode_them_once(log: Log) -> None:
    """Two followers at their own offsets (views being built) read the same records in two
    reads: with the run's ``Decoded`` the second read decodes nothing and hands out the very
    changes of the first; with room for fewer, they are decoded again; the batches are the
    same either way. The first batch of a backlog is ``behind``, the one reaching the end
    is not."""
    log.append(120)
    (first,), _, _ = plan(log, [member("fast", budget=60)])
    assert first.shares[0].reaches_the_end() is False
    reader, plain = open_log(f'{{"backend": "local", "path": "{log.path}"}}')
    state = reader.committed()
    for kept, decoded_again in ((Decoded(), 0), (Decoded(kept=10), None)):
        counting = Counting(plain)
        one = cut(reader, counting, state, first, lambda _: Takes.CHANGES, lambda _: False,
                  kept)["fast"]
        assert one.behind and counting.calls == len(one.changes or []) > 10
        (again,), _, _ = plan(log, [member("slow", budget=60)])
        calls = counting.calls
        two = cut(reader, counting, state, again, lambda _: Takes.CHANGES, lambda _: False,
                  kept)["slow"]
        assert [c.key for c in two.changes or []] == [c.key for c in one.changes or []]
        if decoded_again == 0:
            assert counting.calls == calls and kept.hits == len(one.changes or [])
            assert all(a is b for a, b in zip(one.changes or [], two.changes or [], strict=True))
        else:  # a sequential read through a smaller store: decoded again (same changes)
            assert 0 < counting.calls - calls <= len(one.changes or [])
    (whole,), _, _ = plan(log, [member("all")])
    assert whole.shares[0].reaches_the_end() and not batches(log, whole)["all"].behind


def test_only_the_source_offset_moved_gives_a_watermark_batch(log: Log) -> None:
    log.append(100)
    (read,), _, _ = plan(log, [member("a")])
    done = batches(log, read)["a"].end
    assert plan(log, [member("a", done)])[0] == []  # nothing new: nothing planned
    log.writer.append([], {SOURCE: {"seq": 100, "heartbeat": 1}})
    (read,), _, _ = plan(log, [member("a", done)])
    batch = batches(log, read)["a"]
    assert batch.ranges == [] and batch.changes == []
    assert batch.watermarks == {SOURCE: {"heartbeat": 1, "seq": 100}}
    assert batch.end["watermarks"] == batch.watermarks


def test_a_quiet_batch_does_not_make_the_next_wait_for_the_trigger() -> None:
    """``trigger_interval`` spaces a follower's batches after a batch of ``QUIET_BATCH`` records
    or more (under load: changes batched up); after a quiet one the next starts as soon as the
    loop sees a change (at a trickle: no wait)."""
    from types import SimpleNamespace

    from spark_apply.jobs import QUIET_BATCH, ApplyJob, _Follower

    loop = SimpleNamespace(waiting=set(), failed_views=set(), _once=False)
    follower = _Follower("search", lambda _start: None, None, interval=0.25,  # type: ignore
                         started=100.0)
    for records, soon in ((QUIET_BATCH, False), (QUIET_BATCH - 1, True), (0, True)):
        follower.last_records = records
        assert ApplyJob._eligible(loop, follower, 100.1) is soon  # type: ignore[arg-type]
        assert ApplyJob._eligible(loop, follower, 100.3)  # type: ignore[arg-type]
