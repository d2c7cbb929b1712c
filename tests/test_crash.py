"""Crash safety: a child appending in a loop is SIGKILLed at random moments, 20 times.

Afterwards every acknowledged record must be readable at the offset it was acknowledged with,
with exactly the bytes that were appended; nothing torn is visible; and because the child
resumes from the source offset committed *with* the records, the log holds every sequence number
exactly once (no gap, no duplicate): records and source offsets are atomic.
"""

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cdc.log.compaction import compact
from cdc.log.local import LocalChangeLogReader
from cdc.position import Position
from tests.conftest import TOPIC, expected_value
from tests.crash_child import KEYS, SIZES
from tests.kills import Watch, process_freeze, process_io

ROOT = Path(__file__).resolve().parent.parent
KILLS = 20


def run_child(log_dir: Path, seed: int, delay: float) -> tuple[int, list[tuple[int, int, int]]]:
    """Run the appending child, SIGKILL it after ``delay`` seconds (through tests/kills.py:
    the child's own position is the highest sequence it took on, ``TAKE``), and return where
    it started and what it acknowledged."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.crash_child", str(log_dir), str(seed)],
        stdout=subprocess.PIPE, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    ready = child.stdout.readline().decode()
    assert ready.startswith("READY"), ready
    start = int(ready.split()[1])
    lines: list[str] = []
    taken = [start]

    def read() -> None:
        assert child.stdout is not None
        for raw in child.stdout:
            line = raw.decode()
            lines.append(line)
            if line.startswith("TAKE ") and line.endswith("\n"):
                taken.append(int(line.split()[1]))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with Watch("log appender", lambda: taken[-1]) as watch:
        time.sleep(delay)
        phase = "just restarted" if delay < 0.25 else "streaming"
        # aimed with the child stopped (SIGSTOP) at each look: it cannot commit what it took
        # between the look that saw it in flight and the SIGKILL
        watch.kill(phase, lambda: child.send_signal(signal.SIGKILL),
                   lambda: LocalChangeLogReader(log_dir).source_offsets().get(
                       "gen", {}).get("seq", 0), aim=10, freeze=process_freeze(child.pid))
    child.wait()
    reader.join(10)
    acks = []
    for line in lines:
        if not line.endswith("\n"):  # the last piece may be cut mid-line
            continue
        kind, *fields = line.split()
        if kind == "ACK":
            seq, partition, offset = map(int, fields)
            acks.append((seq, partition, offset))
    return start, acks


@pytest.mark.slow
def test_sigkill_during_appends_loses_nothing_acknowledged(tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    rnd = random.Random(2026)
    acknowledged: dict[int, tuple[int, int]] = {}
    resumed_from = []
    for kill in range(KILLS):
        start, acks = run_child(log_dir, seed=kill, delay=rnd.uniform(0.05, 0.6))
        resumed_from.append(start)
        # a restart resumes after the last acknowledged record, never before it
        assert start >= max(acknowledged, default=0)
        for seq, partition, offset in acks:
            acknowledged[seq] = (partition, offset)
    assert len(acknowledged) > 1000, "the child should have appended a good deal"

    reader = LocalChangeLogReader(log_dir)
    seen: dict[int, tuple[int, int]] = {}
    for partition in range(4):
        records = reader.read(TOPIC, partition)
        assert [r.offset for r in records] == list(range(len(records))), "offsets have gaps"
        for record in records:
            seq = Position.from_bytes(record.position).parts[0]
            assert seq not in seen, f"sequence {seq} appended twice"
            key = seq % KEYS
            assert record.key == f'{{"id":{key}}}'.encode()
            if seq % 13 == 0:
                assert record.value is None
            else:
                assert record.value in {expected_value(seq, key, size) for size in SIZES}
            seen[seq] = (partition, record.offset)
    assert sorted(seen) == list(range(1, len(seen) + 1)), "a committed sequence is missing"
    for seq, where in acknowledged.items():
        assert seen.get(seq) == where, f"acknowledged record {seq} lost or moved"
    assert reader.source_offsets()["gen"]["seq"] == len(seen)
    assert len(set(resumed_from)) > KILLS // 2, "kills should land at many different moments"
    print(f"\n{KILLS} kills, {len(seen):,} records committed, {len(acknowledged):,} acknowledged "
          f"and all found; {len(seen) - len(acknowledged):,} committed but not yet acknowledged")

    # and the crashed log still compacts to exactly one record per live key
    compact(log_dir, tombstone_retention=3600)
    live = {}
    reader = LocalChangeLogReader(log_dir)
    for partition in range(4):
        for record in reader.read(TOPIC, partition):
            live[record.key] = Position.from_bytes(record.position).parts[0]
    newest = {}
    for seq in sorted(seen):
        newest[f'{{"id":{seq % KEYS}}}'.encode()] = seq
    assert live == newest


COMPACT_ONCE = """
import os, signal, sys
from cdc.log.compaction import compact
stop_at, calls = int(sys.argv[2]), 0
real_fsync = os.fsync

def fsync(fd):  # every durable step of a compaction ends in an fsync: stop before the chosen one
    global calls
    calls += 1
    if calls == stop_at:
        os.kill(os.getpid(), signal.SIGSTOP)  # the test SIGKILLs it here, stopped mid-compaction
    real_fsync(fd)

os.fsync = fsync
print("START", flush=True)
compact(sys.argv[1], tombstone_retention=3600, roll=False)
print("DONE", calls, flush=True)
"""


def io_bytes(pid: int) -> int:
    """What a compaction has done: the bytes it read (scanning segments) and wrote (rewriting
    them); a segment dropped whole is only read."""
    return process_io(pid, "rchar") + process_io(pid, "wchar")


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.slow
def test_sigkill_during_compaction_keeps_the_log_whole(tmp_path: Path) -> None:
    from cdc.log.local import LocalChangeLog
    from tests.conftest import make_record

    log_dir = tmp_path / "log"
    next_seq = 0

    def add_versions(count: int) -> None:
        nonlocal next_seq
        with LocalChangeLog(log_dir, partitions=2, segment_bytes=16 * 1024) as log:
            log.ensure_topic(TOPIC)
            for start in range(next_seq, next_seq + count, 2000):
                log.append([make_record(seq, seq % 3000, tombstone=seq % 17 == 0)
                            for seq in range(start, start + 2000)])
            log.roll_all()
        next_seq += count

    def snapshot() -> dict[bytes, tuple[int, int]]:
        reader = LocalChangeLogReader(log_dir)
        latest = {}
        for partition in (0, 1):
            previous = -1
            for record in reader.iter_partition(TOPIC, partition):
                assert record.offset > previous
                previous = record.offset
                latest[record.key] = (record.offset, Position.from_bytes(record.position).parts[0])
        return latest

    rnd = random.Random(5)
    fsyncs = 0  # fsyncs a whole compaction of one round makes here: counted first
    for round_ in range(11):
        add_versions(40_000)  # fresh garbage, so every compaction has real work to do
        truth = snapshot()
        # aimed by the fsyncs it makes (a file written but not renamed, a rename or a removal not
        # yet made durable): the child stops itself before the chosen one, somewhere between 5 %
        # and 90 % of a compaction, so the SIGKILL lands inside it however busy the machine is
        stop_at = 0 if round_ == 0 else max(1, round(rnd.uniform(0.05, 0.9) * fsyncs))
        child = subprocess.Popen([sys.executable, "-c", COMPACT_ONCE, str(log_dir), str(stop_at)],
                                 stdout=subprocess.PIPE, cwd=ROOT, text=True,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "START"
        if round_ == 0:  # calibration: let it finish
            done, count = child.stdout.read().split()
            assert done == "DONE"
            fsyncs = int(count)
            assert fsyncs > 20
        else:
            with Watch("log compaction", lambda c=child: io_bytes(c.pid),
                       ahead=lambda _, done: not done) as watch:
                deadline = time.monotonic() + 60
                while not _stopped(child.pid):
                    assert child.poll() is None and time.monotonic() < deadline, \
                        "the compaction never reached its chosen fsync"
                    time.sleep(0.002)
                kill = watch.kill("first half" if stop_at < fsyncs / 2 else "second half",
                                  lambda c=child: c.send_signal(signal.SIGKILL))
            kill.settle("DONE" in child.stdout.read(), "the compaction had finished")
        child.wait()
        assert snapshot() == truth
    report = compact(log_dir, tombstone_retention=3600, roll=False)
    assert snapshot() == truth
    assert report.records_after == len(truth)
    leftovers = [p.name for p in log_dir.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []
