"""One huge transaction (N inserts plus updates and deletes of earlier rows, committed at once)
streams through ``cdc capture``: SIGKILLed in the middle of it and restarted, the log must hold
every change of the transaction exactly once per position (replays identical), equal the table,
and the daemon's peak RSS must stay under 300 MB in both runs.

N is ``CDC_HUGE_ROWS`` (default 300,000; the issue's 2,000,000 is measured by
``bench/pg_huge_txn.py``)."""

from __future__ import annotations

import os
import struct
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cdc.avro import EventCodec
from cdc.log.local import LocalChangeLogReader
from cdc.log.schemas import SchemaStore
from cdc.position import format_lsn
from cdc.status import read_status
from tests.pgkit import (
    Capture,
    Database,
    cdc,
    output,
    stored_offset,
    table_rows,
    wait_caught_up,
    wait_for,
    write_config,
)

pytestmark = [
    pytest.mark.timeout(900),
    # opt-in until its duration on 2 cores is measured: CDC_HUGE_ROWS=300000 pytest ...
    pytest.mark.skipif("CDC_HUGE_ROWS" not in os.environ,
                       reason="set CDC_HUGE_ROWS to run the huge-transaction test"),
]

ROWS = int(os.environ.get("CDC_HUGE_ROWS", "300000"))
RSS_LIMIT_MB = 300
BOOTSTRAP_ROWS = 1000  # ids 1..1000 exist before the transaction; it inserts 1001..1000+N
FIRST = BOOTSTRAP_ROWS + 1
LAST = BOOTSTRAP_ROWS + ROWS
# after the inserts, in the same transaction: updates and deletes of earlier rows, both
# snapshotted ones and ones this transaction inserted
UPDATED = [*range(1, 51), *range(FIRST, FIRST + 50), LAST]
DELETED = [*range(51, 61), *range(FIRST + 50, FIRST + 60)]
TRANSACTION = [
    "INSERT INTO huge (id, v, note) SELECT g, 1, "
    f"  rpad(g::text || ':' || md5(g::text), 100, md5(g::text)) "
    f"FROM generate_series({FIRST}, {LAST}) g",
    "UPDATE huge SET v = v + 10 WHERE id <= 50",
    f"UPDATE huge SET v = 2, note = 'updated ' || id WHERE id BETWEEN {FIRST} AND {FIRST + 49}",
    f"UPDATE huge SET v = 3 WHERE id = {LAST}",
    f"DELETE FROM huge WHERE id BETWEEN 51 AND 60 OR id BETWEEN {FIRST + 50} AND {FIRST + 59}",
]
CHANGES = ROWS + len(UPDATED) + len(DELETED)  # events of the transaction
RECORDS = CHANGES + len(DELETED)  # each delete is followed by a tombstone
POSITION = struct.Struct(">QQQ")


def vm_hwm_mb(pid: int) -> float:
    """Peak resident set (VmHWM) of a live process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def topic_records(log: Path, topic: str) -> int:
    reader = LocalChangeLogReader(log)
    if topic not in {t.name for t in reader.topics()}:
        return 0
    return sum(reader.end_offsets(topic).values())


def key(row_id: int) -> str:
    return f'{{"id":{row_id}}}'


@dataclass
class Scan:
    """What one pass over the topic found (kept small: a 2M-row run reads 2.8M records)."""

    records: int = 0
    duplicates: int = 0
    txn_lsns: set[int] = field(default_factory=set)
    #: (commit LSN, ordinal, tombstone?) -> (key, op, hash of the envelope without its
    #: processing time ts_ms/us/ns), for the streamed records (a delete and its tombstone
    #: share a position)
    unique: dict[tuple[int, int, bool], tuple[str, str, int]] = field(default_factory=dict)
    #: key -> (position bytes, after image or None when deleted): the live row per key
    latest: dict[str, tuple[bytes, dict[str, Any] | None]] = field(default_factory=dict)


def scan_topic(log: Path, topic: str) -> Scan:
    """Read the topic once: fold the latest row per key (like ``pgkit.latest_rows``) and check
    that every replayed record of the stream (same commit LSN and ordinal) has the same key,
    op and content as the first one."""
    reader = LocalChangeLogReader(log)
    codec = EventCodec(SchemaStore(log))
    scan = Scan()
    for partition in range(reader.topic(topic).partitions):
        for record in reader.iter_partition(topic, partition):
            scan.records += 1
            # a postgres position: a tag byte, then big-endian (LSN, phase, ordinal), so its
            # bytes order like the position
            position = record.position
            row_key = record.key.decode()
            envelope = None if record.value is None else codec.decode_value(record.value).envelope
            op = envelope["op"] if envelope else "tombstone"
            current = scan.latest.get(row_key)
            if current is None or position >= current[0]:
                after = envelope["after"] if envelope and op != "d" else None
                scan.latest[row_key] = (position, after)
            if op == "r":
                continue
            lsn, _, ordinal = POSITION.unpack_from(position, 1)
            scan.txn_lsns.add(lsn)
            # hash of the content without the processing time (same process: stable)
            digest = hash(repr([(k, v) for k, v in (envelope or {}).items()
                                if k not in ("ts_ms", "ts_us", "ts_ns")]))
            entry = (row_key, op, digest)
            kept = scan.unique.setdefault((lsn, ordinal, op == "tombstone"), entry)
            if kept is not entry:
                scan.duplicates += 1
                assert kept == entry, (
                    f"the replay of change {ordinal} ({row_key} {op}) differs from the first")
    return scan


def test_huge_transaction_survives_sigkill_in_its_middle(pg_db: Database,
                                                         tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE huge (id bigint PRIMARY KEY, v int NOT NULL, note text)")
    pg_db.execute(f"INSERT INTO huge SELECT g, 1, repeat('b', 100) "
                  f"FROM generate_series(1, {BOOTSTRAP_ROWS}) g")
    config = write_config(tmp_path, pg_db, ["public.huge"])
    log = tmp_path / "log"
    topic = f"{pg_db.source}.public.huge"
    booted = cdc("bootstrap", "--config", str(config))
    assert booted.returncode == 0, output(booted)
    capture = Capture(config, tmp_path / "capture.log").start()
    wait_for(lambda: (read_status(log, pg_db.source) or {}).get("state") == "streaming", 60,
             "capture to stream")
    wait_caught_up(pg_db, log, timeout=60)  # and idle
    before = topic_records(log, topic)

    started = time.monotonic()
    with pg_db.connect() as conn, conn.transaction():
        for statement in TRANSACTION:
            conn.execute(statement)
    committed = time.monotonic()

    # SIGKILL once the transaction is clearly in the middle of being written to the log
    peak_first = 0.0
    assert capture.process is not None
    first_pid = capture.process.pid

    def in_the_middle() -> bool:
        nonlocal peak_first
        assert capture.alive(), (tmp_path / "capture.log").read_text()[-3000:]
        peak_first = max(peak_first, vm_hwm_mb(first_pid))
        return topic_records(log, topic) - before >= RECORDS * 0.4

    wait_for(in_the_middle, 300, "capture to write 40% of the transaction")
    peak_first = max(peak_first, vm_hwm_mb(first_pid))
    capture.kill()
    killed = time.monotonic()
    at_kill = topic_records(log, topic) - before
    stored_at_kill = int((stored_offset(log, pg_db.source) or {}).get("lsn", 0))
    assert 0 < at_kill < RECORDS, f"not killed mid-transaction: {at_kill} of {RECORDS} written"

    capture.start()
    assert capture.process is not None
    second_pid = capture.process.pid
    peak_second = 0.0

    def caught_up_to(target: int) -> bool:
        nonlocal peak_second
        assert capture.alive(), (tmp_path / "capture.log").read_text()[-3000:]
        peak_second = max(peak_second, vm_hwm_mb(second_pid))
        return int((stored_offset(log, pg_db.source) or {}).get("lsn", 0)) >= target

    target = pg_db.current_lsn()
    wait_for(lambda: caught_up_to(target), 600, f"capture to reach LSN {target:X}")
    drained = time.monotonic()
    wait_caught_up(pg_db, log, timeout=60)
    peak_second = max(peak_second, vm_hwm_mb(second_pid))
    assert capture.terminate() == 0, (tmp_path / "capture.log").read_text()[-3000:]

    # the log against the table, and every change of the transaction
    read_from = time.monotonic()
    scan = scan_topic(log, topic)
    checked = time.monotonic()
    assert len(scan.txn_lsns) == 1, f"expected one transaction, found {len(scan.txn_lsns)}"
    txn_lsn = scan.txn_lsns.pop()
    assert stored_at_kill < txn_lsn, "the offset moved past the transaction before it was whole"
    changes = {o: kept for (_, o, tombstone), kept in scan.unique.items() if not tombstone}
    assert sorted(changes) == list(range(1, CHANGES + 1)), "ordinals of the changes have gaps"
    ops = Counter((k, op) for k, op, _ in changes.values())
    expected = Counter({(key(i), "c"): 1 for i in range(FIRST, LAST + 1)})
    expected.update((key(i), "u") for i in UPDATED)
    expected.update((key(i), "d") for i in DELETED)
    extra, missing = ops - expected, expected - ops  # (explicit: pytest's diff of 2M keys)
    assert not extra and not missing, f"changes differ: {len(extra)} unexpected, e.g. " \
        f"{list(extra)[:5]}; {len(missing)} missing, e.g. {list(missing)[:5]}"
    tombstones = sorted(k for (_, _, tombstone), (k, _, _) in scan.unique.items() if tombstone)
    assert tombstones == sorted(key(i) for i in DELETED)
    logged = {k: row for k, (_, row) in scan.latest.items() if row is not None}
    table = table_rows(pg_db, "huge")
    wrong = sorted(k for k in logged.keys() | table.keys() if logged.get(k) != table.get(k))
    assert not wrong, f"{len(wrong)} keys' latest rows differ from the table, e.g. " + "; ".join(
        f"{k}: log {logged.get(k)} table {table.get(k)}" for k in wrong[:3])
    slot = pg_db.slot()
    assert slot and slot["confirmed"] == (stored_offset(log, pg_db.source) or {})["lsn"]

    first_s, second_s = killed - committed, drained - killed
    print(f"\nhuge transaction: {ROWS:,} inserts + {len(UPDATED)} updates + {len(DELETED)} "
          f"deletes = {RECORDS:,} records, written by one transaction in "
          f"{committed - started:.1f} s (commit LSN {format_lsn(txn_lsn)})\n"
          f"  first run: SIGKILL after {first_s:.1f} s with {at_kill:,} records in the log "
          f"({at_kill / max(first_s, 1e-9):,.0f} records/s), peak RSS {peak_first:.0f} MB\n"
          f"  restart: the whole transaction again in {second_s:.1f} s "
          f"({RECORDS / second_s:,.0f} records/s), peak RSS {peak_second:.0f} MB\n"
          f"  {scan.records:,} records in the topic, {scan.duplicates:,} replayed duplicates "
          f"(same position and content); {len(changes):,} distinct changes; reading the log "
          f"back took {checked - read_from:.1f} s")
    assert peak_first < RSS_LIMIT_MB and peak_second < RSS_LIMIT_MB, (
        f"peak RSS {peak_first:.0f} / {peak_second:.0f} MB >= {RSS_LIMIT_MB} MB")
