"""Compaction: latest record per key, tombstone retention, offsets kept, safe beside readers."""

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cdc.log import local
from cdc.log.compaction import compact
from cdc.log.local import LocalChangeLog, LocalChangeLogReader
from cdc.log.segment import SegmentFile, list_segments
from cdc.position import Position
from tests.conftest import TOPIC, expected_value, make_record


def fold(reader: LocalChangeLogReader, topic: str = TOPIC) -> dict[bytes, tuple[int, bytes | None]]:
    """Latest (offset, value) per key, reading every partition from offset 0."""
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for partition in range(reader.topic(topic).partitions):
        for record in reader.iter_partition(topic, partition):
            latest[record.key] = (record.offset, record.value)
    return latest


def test_keeps_the_latest_record_per_key_at_its_offset(log_dir: Path) -> None:
    with LocalChangeLog(log_dir, partitions=2, segment_bytes=2048) as log:
        log.ensure_topic(TOPIC)
        appended = []
        for start in range(0, 1000, 100):
            batch = [make_record(seq, seq % 37) for seq in range(start, start + 100)]
            appended.extend(zip(batch, log.append(batch), strict=True))
    before = fold(LocalChangeLogReader(log_dir))
    report = compact(log_dir, tombstone_retention=3600)
    assert report.offline and report.segments_rewritten > 0
    reader = LocalChangeLogReader(log_dir)
    survivors = {p: reader.read(TOPIC, p) for p in (0, 1)}
    assert sum(len(v) for v in survivors.values()) == 37
    assert fold(reader) == before
    # offsets are the original ones, and the end offsets did not move
    original = {(r.partition, r.offset): rec.value for rec, r in appended}
    for partition, records in survivors.items():
        for record in records:
            assert original[(partition, record.offset)] == record.value
    assert sum(reader.end_offsets(TOPIC).values()) == 1000
    # appending continues after the old end
    with LocalChangeLog(log_dir, partitions=2) as log:
        result = log.append([make_record(1000, 0)])[0]
    assert result.offset == reader.end_offsets(TOPIC)[result.partition] - 1
    assert result.offset > max(r.offset for r in survivors[result.partition])


def test_tombstones_are_kept_for_the_retention_then_dropped(log_dir: Path) -> None:
    with LocalChangeLog(log_dir, partitions=1) as log:
        log.ensure_topic(TOPIC)
        log.append([make_record(1, 1), make_record(2, 2), make_record(3, 1)])
        log.append([make_record(4, 1, tombstone=True)])
        appended_ms = LocalChangeLogReader(log_dir).read(TOPIC, 0)[-1].timestamp_ms
    hour = 3600
    compact(log_dir, tombstone_retention=hour, now_ms=appended_ms + 10 * 60_000)
    records = LocalChangeLogReader(log_dir).read(TOPIC, 0)
    assert [(r.offset, r.is_tombstone) for r in records] == [(1, False), (3, True)]
    compact(log_dir, tombstone_retention=hour, now_ms=appended_ms + 2 * hour * 1000)
    records = LocalChangeLogReader(log_dir).read(TOPIC, 0)
    assert [(r.offset, r.key) for r in records] == [(1, b'{"id":2}')]
    assert LocalChangeLogReader(log_dir).end_offsets(TOPIC) == {0: 4}


def test_a_key_recreated_after_its_tombstone_survives(log_dir: Path) -> None:
    with LocalChangeLog(log_dir, partitions=1) as log:
        log.ensure_topic(TOPIC)
        log.append([make_record(1, 1), make_record(2, 1, tombstone=True), make_record(3, 1)])
    compact(log_dir, tombstone_retention=0)
    records = LocalChangeLogReader(log_dir).read(TOPIC, 0)
    assert [(r.offset, r.value) for r in records] == [(2, expected_value(3, 1))]


def test_online_compaction_leaves_the_active_segment_to_the_writer(log_dir: Path) -> None:
    log = LocalChangeLog(log_dir, partitions=1, segment_bytes=1024)
    log.ensure_topic(TOPIC)
    for seq in range(60):
        log.append([make_record(seq, seq % 3)])
    report = compact(log_dir, tombstone_retention=0)
    assert not report.offline and report.segments_rewritten > 0
    records = log.read(TOPIC, 0)
    # every key's latest record survives, older ones in closed segments are gone
    assert {r.key for r in records} == {b'{"id":0}', b'{"id":1}', b'{"id":2}'}
    assert len(records) < 60
    assert records[-1].offset == 59
    log.append([make_record(60, 0)])
    assert log.read(TOPIC, 0)[-1].offset == 60
    log.close()


COMPACTOR = """
import sys, time
from cdc.log.compaction import compact
from cdc.errors import LogLockedError
deadline = time.monotonic() + float(sys.argv[2])
runs = 0
while time.monotonic() < deadline:
    try:
        compact(sys.argv[1], tombstone_retention=3600, roll=False)
        runs += 1
    except LogLockedError:
        pass
print(runs)
"""


def test_readers_see_a_consistent_log_while_compaction_runs(log_dir: Path) -> None:
    """A writer appends, another process compacts in a loop, a reader re-reads from 0.

    Every pass must (a) return valid records in strictly increasing offsets, and (b) for every
    key, fold to a version at least as new as the newest one committed before the pass began —
    compaction must never hide a record whose replacement a reader has not reached yet.
    """
    log = LocalChangeLog(log_dir, partitions=2, segment_bytes=4096)
    log.ensure_topic(TOPIC)
    committed: dict[bytes, int] = {}  # key -> newest committed seq (writer's view)
    lock = threading.Lock()
    stop = threading.Event()

    def write() -> None:
        seq = 0
        while not stop.is_set() and seq < 30_000:
            batch = [make_record(seq + i, (seq + i) % 200, tombstone=(seq + i) % 11 == 0)
                     for i in range(40)]
            log.append(batch)
            with lock:
                for i, record in enumerate(batch):
                    committed[record.key] = seq + i
            seq += 40

    writer = threading.Thread(target=write)
    writer.start()
    compactor = subprocess.Popen([sys.executable, "-c", COMPACTOR, str(log_dir), "6"],
                                 stdout=subprocess.PIPE, text=True)
    reader = LocalChangeLogReader(log_dir)
    passes = 0
    try:
        while compactor.poll() is None:
            with lock:
                floor = dict(committed)
            latest_seq: dict[bytes, int] = {}
            for partition in (0, 1):
                previous = -1
                for record in reader.iter_partition(TOPIC, partition, batch=500):
                    assert record.offset > previous
                    previous = record.offset
                    seq = Position.from_bytes(record.position).parts[0]
                    key = int(record.key[6:-1])
                    if record.value is not None:
                        assert record.value == expected_value(seq, key)
                    latest_seq[record.key] = seq
            for key, seq in floor.items():
                assert latest_seq.get(key, -1) >= seq, (key, seq, latest_seq.get(key))
            passes += 1
    finally:  # also when a pass fails: no writer left appending, no compactor running
        stop.set()
        writer.join()
        if compactor.poll() is None:
            compactor.kill()
            compactor.wait()
    runs = int(compactor.stdout.read().strip() or 0)
    log.close()
    assert compactor.returncode == 0
    assert runs >= 3 and passes >= 3, (runs, passes)
    # compaction really happened while we read
    assert compact(log_dir, 3600).records_after < sum(LocalChangeLogReader(log_dir)
                                                      .end_offsets(TOPIC).values())


@pytest.mark.parametrize("located", [False, True], ids=["iter_partition", "read_located"])
def test_a_read_goes_on_when_compaction_from_a_newer_state_empties_its_range(
        log_dir: Path, monkeypatch: pytest.MonkeyPatch, located: bool) -> None:
    """A read takes the committed state, then lists the segments. If, in between, newer versions
    of every key it could reach are committed past that state's end and an online compaction
    (working from the newer state) drops the old ones, the read finds nothing below its end.
    It must go on to the newer records: an empty read would end ``iter_partition`` (or an index
    catching up with read_located) there, and those keys would be missing altogether."""
    log = LocalChangeLog(log_dir, partitions=1)
    log.ensure_topic(TOPIC)
    log.append([make_record(seq, seq) for seq in range(4)])  # offsets 0-3, keys 0-3
    reader = LocalChangeLogReader(log_dir)
    listed: list[Path] = []

    def compacted_meanwhile(directory: Path) -> list[SegmentFile]:
        listed.append(directory)
        monkeypatch.setattr(local, "list_segments", list_segments)
        assert reader.state().topics[TOPIC].parts[0].next_offset == 4  # the read's state
        log.append([make_record(seq, seq - 4) for seq in range(4, 8)])  # offsets 4-7
        log.roll_all()
        report = compact(log_dir, tombstone_retention=3600, roll=False)
        assert (report.segments_rewritten, report.records_after) == (1, 4)
        return list_segments(directory)

    monkeypatch.setattr(local, "list_segments", compacted_meanwhile)
    if located:
        records = [record for record, _ in reader.read_located(TOPIC, 0)]
    else:
        records = list(reader.iter_partition(TOPIC, 0))
    assert [(r.offset, r.value) for r in records] == [
        (seq, expected_value(seq, seq - 4)) for seq in range(4, 8)]
    assert len(listed) == 1  # the interleaving did happen
    log.close()


def test_compaction_of_an_empty_log(log_dir: Path) -> None:
    LocalChangeLog(log_dir).close()
    report = compact(log_dir, 0)
    assert report.records_before == 0
