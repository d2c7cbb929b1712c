"""The local log: offsets, reads from any offset, atomic source offsets, recovery, locking."""

import os
import threading
import time
from pathlib import Path

import pytest

from cdc.errors import LogCorruptError, LogError, LogLockedError
from cdc.log.group_commit import GroupCommitter
from cdc.log.local import LocalChangeLog, LocalChangeLogReader
from cdc.log.segment import list_segments
from tests.conftest import TOPIC, expected_value, make_record


def all_records(reader: LocalChangeLogReader, topic: str = TOPIC) -> dict:
    return {p: reader.read(topic, p) for p in range(reader.topic(topic).partitions)}


def test_offsets_start_at_zero_and_strictly_increase(log_dir: Path) -> None:
    with LocalChangeLog(log_dir, partitions=3) as log:
        log.ensure_topic(TOPIC, {"table": "public.items"})
        for start in range(0, 300, 30):
            log.append([make_record(seq, seq % 17) for seq in range(start, start + 30)])
        by_partition = all_records(log)
    assert sum(len(r) for r in by_partition.values()) == 300
    for records in by_partition.values():
        assert [r.offset for r in records] == list(range(len(records)))
    # per key, records are in append (= sequence) order
    seqs_by_key: dict[bytes, list[int]] = {}
    for records in by_partition.values():
        for record in records:
            seqs_by_key.setdefault(record.key, []).append(int(record.value.split(b":")[0]))
    assert all(seqs == sorted(seqs) for seqs in seqs_by_key.values())


def test_read_from_any_offset_with_limits(log_dir: Path) -> None:
    with LocalChangeLog(log_dir, partitions=1, segment_bytes=1000) as log:
        log.ensure_topic(TOPIC)
        for seq in range(120):  # one record per append, so segments roll often
            log.append([make_record(seq, seq)])
    reader = LocalChangeLogReader(log_dir)
    assert len(list_segments(log_dir / "topics" / TOPIC / "0")) > 5
    for start in (0, 1, 17, 59, 119):
        records = reader.read(TOPIC, 0, start, 10)
        assert [r.offset for r in records] == list(range(start, min(start + 10, 120)))
        assert records[0].value == expected_value(start, start)
    assert reader.read(TOPIC, 0, 120) == []
    assert [r.offset for r in reader.iter_partition(TOPIC, 0, 3, batch=7)] == list(range(3, 120))
    assert reader.end_offsets(TOPIC) == {0: 120}


def test_a_flipped_byte_is_a_clear_corruption_error(log_dir: Path) -> None:
    """A committed record whose bytes changed on disk: reads stop at it with the segment, the
    byte and the offset named (never garbage, never a bare traceback); records before it read."""
    with LocalChangeLog(log_dir, partitions=1) as log:
        log.ensure_topic(TOPIC)
        log.append([make_record(seq, seq) for seq in range(50)])
    segment = list_segments(log_dir / "topics" / TOPIC / "0")[0].path
    located = LocalChangeLogReader(log_dir).read(TOPIC, 0, 0)
    assert len(located) == 50
    data = bytearray(segment.read_bytes())
    at = data.index(expected_value(30, 30))  # record 30's value
    data[at + 3] ^= 0x01
    segment.write_bytes(bytes(data))
    reader = LocalChangeLogReader(log_dir)
    assert [r.offset for r in reader.read(TOPIC, 0, 0, 30)] == list(range(30))
    with pytest.raises(LogCorruptError) as raised:
        reader.read(TOPIC, 0, 25)
    assert "checksum mismatch" in str(raised.value) and str(segment) in str(raised.value)
    assert "(offset 30)" in str(raised.value) and "restore the log" in raised.value.fix


def test_source_offsets_are_committed_with_the_records(log_dir: Path) -> None:
    with LocalChangeLog(log_dir) as log:
        log.ensure_topic(TOPIC)
        log.append([make_record(1, 1)], {"a": {"lsn": 1}})
        log.append([make_record(2, 2)], {"b": {"pos": 9}})
        log.append([make_record(3, 3)], {"a": {"lsn": 3}})
    reader = LocalChangeLogReader(log_dir)
    assert reader.source_offsets() == {"a": {"lsn": 3}, "b": {"pos": 9}}


def test_uncommitted_bytes_are_invisible_and_cut_on_recovery(log_dir: Path) -> None:
    with LocalChangeLog(log_dir, partitions=1) as log:
        log.ensure_topic(TOPIC)
        log.append([make_record(seq, seq) for seq in range(10)], {"s": {"seq": 9}})
    segment = list_segments(log_dir / "topics" / TOPIC / "0")[-1].path
    committed = segment.stat().st_size
    # a writer died after writing (even complete, valid) records but before committing them
    from cdc.log.segment import encode_record
    with open(segment, "ab") as handle:
        handle.write(b"".join(encode_record(10, 0, b'{"id":10}', b"uncommitted", b"\x00" * 9)))
        handle.write(b"\x55" * 13)  # and a torn one
    reader = LocalChangeLogReader(log_dir)
    assert len(reader.read(TOPIC, 0)) == 10
    with LocalChangeLog(log_dir, partitions=1) as log:
        assert segment.stat().st_size == committed
        result = log.append([make_record(11, 11)])
        assert result[0].offset == 10  # the uncommitted offset is reused: nobody ever saw it
    assert LocalChangeLogReader(log_dir).read(TOPIC, 0)[-1].value == expected_value(11, 11)


def test_uncommitted_topic_and_rolled_segment_are_removed(log_dir: Path) -> None:
    with LocalChangeLog(log_dir, partitions=1) as log:
        log.ensure_topic(TOPIC)
        log.append([make_record(1, 1)])
    (log_dir / "topics" / "ghost.topic" / "0").mkdir(parents=True)
    stray = log_dir / "topics" / TOPIC / "0" / f"{5:020d}-0000.seg"
    stray.write_bytes(b"junk")
    with LocalChangeLog(log_dir, partitions=1):
        pass
    assert not (log_dir / "topics" / "ghost.topic").exists()
    assert not stray.exists()


def test_a_second_writer_is_refused(log_dir: Path) -> None:
    with LocalChangeLog(log_dir), pytest.raises(LogLockedError, match=f"pid {os.getpid()}"):
        LocalChangeLog(log_dir)
    LocalChangeLog(log_dir).close()  # released on close


def test_unwritable_directory_gives_a_clear_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root ignores permissions: use a path below a regular file instead
        blocker = tmp_path / "file"
        blocker.write_text("x")
        with pytest.raises(LogError, match="cannot create the log directory"):
            LocalChangeLog(blocker / "log")
        return
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    with pytest.raises(LogError, match="not writable|permission"):
        LocalChangeLog(locked / "log")


def test_missing_log_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="no change log"):
        LocalChangeLogReader(tmp_path / "nothing")


def test_append_to_unknown_topic_is_refused(log_dir: Path) -> None:
    with LocalChangeLog(log_dir) as log, pytest.raises(LogError, match="unknown topic"):
        log.append([make_record(1, 1, topic="nope")])


def test_reader_follows_a_concurrent_writer(log_dir: Path) -> None:
    log = LocalChangeLog(log_dir, partitions=2, segment_bytes=4096)
    log.ensure_topic(TOPIC)
    total = 3000
    done = threading.Event()

    def write() -> None:
        for start in range(0, total, 50):
            log.append([make_record(seq, seq % 300) for seq in range(start, start + 50)])
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    reader = LocalChangeLogReader(log_dir)
    next_offset = {0: 0, 1: 0}
    seen = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        finished = done.is_set()
        for partition in (0, 1):
            for record in reader.read(TOPIC, partition, next_offset[partition], 200):
                assert record.offset == next_offset[partition]
                seq, key = (int(x) for x in record.value.split(b":")[:2])
                assert record.value == expected_value(seq, key)
                next_offset[partition] += 1
                seen += 1
        if finished and seen == total:
            break
    assert seen == total
    writer.join()
    log.close()


def test_group_commit_shares_syncs_between_threads(log_dir: Path) -> None:
    log = LocalChangeLog(log_dir, partitions=4)
    log.ensure_topic(TOPIC)
    committer = GroupCommitter(log, interval=0.02, max_records=10_000)
    results: dict[int, list] = {}

    def producer(index: int) -> None:
        out = []
        for round_ in range(20):
            seq = index * 1000 + round_
            out.extend(committer.append([make_record(seq, seq)], {f"p{index}": round_}))
        results[index] = out

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    committer.close()
    assert committer.groups < 160, "appends from concurrent producers should share commits"
    reader = LocalChangeLogReader(log_dir)
    for index, out in results.items():
        for round_, result in enumerate(out):
            stored = reader.read(TOPIC, result.partition, result.offset, 1)[0]
            assert stored.value == expected_value(index * 1000 + round_, index * 1000 + round_)
    assert reader.source_offsets() == {f"p{i}": 19 for i in range(8)}
    log.close()


def test_failed_append_reports_and_leaves_the_log_usable(log_dir: Path) -> None:
    log = LocalChangeLog(log_dir, partitions=1)
    log.ensure_topic(TOPIC)
    log.append([make_record(1, 1)])
    fd, _ = log._fds[(TOPIC, 0)]
    os.close(fd)  # make the next write fail with EBADF
    with pytest.raises(LogError, match="cannot append"):
        log.append([make_record(2, 2)])
    del log._fds[(TOPIC, 0)]
    log.append([make_record(3, 3)])
    log.close()
    records = LocalChangeLogReader(log_dir).read(TOPIC, 0)
    assert [r.value for r in records] == [expected_value(1, 1), expected_value(3, 3)]


def test_append_time_lower_bound_reads_only_the_segment_start(log_dir: Path) -> None:
    """``appended_no_earlier_than`` (used by the stale-follower check) is the append time of
    the first record of the segment holding the offset: never later than the record's own."""
    with LocalChangeLog(log_dir, partitions=1, segment_bytes=1000) as log:
        log.ensure_topic(TOPIC)
        for seq in range(60):
            log.append([make_record(seq, seq)])
            if seq % 20 == 19:
                time.sleep(0.05)  # later segments hold later append times
    reader = LocalChangeLogReader(log_dir)
    segments = list_segments(log_dir / "topics" / TOPIC / "0")
    assert len(segments) > 3
    stamps = {r.offset: r.timestamp_ms for r in reader.read(TOPIC, 0, 0)}
    for offset in range(60):
        bound = reader.appended_no_earlier_than(TOPIC, 0, offset)
        base = max(s.base for s in segments if s.base <= offset)
        assert bound == stamps[base] <= stamps[offset]
    assert reader.appended_no_earlier_than("no.such.topic", 0, 5) is None
