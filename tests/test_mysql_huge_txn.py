"""One huge MariaDB transaction (N inserts plus updates and deletes, committed at once) streams
through ``cdc capture`` with bounded memory: SIGKILLed in the middle of it and restarted, the log
holds every change exactly once per position (replays identical), equals the table, and the
daemon's peak RSS stays under 300 MB in both runs.

N is ``CDC_HUGE_ROWS`` (default 150,000); ``bench/mysql_capture.py --huge-rows`` measures the
issue's 2,000,000."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cdc.avro import EventCodec
from cdc.log.local import LocalChangeLogReader
from cdc.log.schemas import SchemaStore
from tests.kills import Watch
from tests.mykit import MyDatabase, wait_caught_up, write_config
from tests.pgkit import Capture, cdc, stored_offset, wait_for
from tests.test_pg_huge_txn import RSS_LIMIT_MB
from tests.test_pg_huge_txn import vm_hwm_mb as peak_rss_mb

ROWS = int(os.environ.get("CDC_HUGE_ROWS", "150000"))
pytestmark = pytest.mark.timeout(300 + ROWS // 1000)


def test_huge_transaction_bounded_memory_and_sigkill(mysql_db: MyDatabase,
                                                      tmp_path: Path) -> None:
    db = mysql_db
    db.execute("CREATE TABLE huge (id INT PRIMARY KEY, v INT, note VARCHAR(120))")
    db.execute("INSERT INTO huge SELECT seq, 1, 'before' FROM seq_1_to_1000")
    config = write_config(tmp_path, db, ["huge"], log_options={"commit_max_records": 5000})
    log = tmp_path / "log"
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    before = stored_offset(log, db.source)
    db.script(
        "START TRANSACTION;"
        "INSERT INTO huge SELECT seq, 1, CONCAT(seq, ':', MD5(seq)) "
        f"FROM seq_1001_to_{1000 + ROWS};"
        "UPDATE huge SET v = v + 10 WHERE id <= 50;"
        "DELETE FROM huge WHERE id BETWEEN 51 AND 60 OR id BETWEEN 1051 AND 1060;"
        "COMMIT")
    topic = f"{db.source}.{db.name}.huge"
    reader = LocalChangeLogReader(log)

    def logged() -> int:
        if topic not in {t.name for t in reader.topics()}:
            return 0
        return sum(reader.end_offsets(topic).values())

    capture = Capture(config, tmp_path / "capture.log").start()
    with Watch("capture daemon (MariaDB)", logged) as watch:  # records it wrote to the log
        wait_for(lambda: logged() > 1000 + ROWS // 3, 120, "a third of the transaction logged")
        assert stored_offset(log, db.source) == before  # mid-transaction: the offset waits
        assert capture.process is not None
        first_rss = peak_rss_mb(capture.process.pid)
        # the restart resumes from the transaction's start while the offset stayed put
        watch.kill("huge transaction", capture.kill,
                   lambda: 0 if stored_offset(log, db.source) == before else 10**12)
    capture = Capture(config, tmp_path / "capture2.log").start()
    assert capture.process is not None
    pid = capture.process.pid
    peak = 0.0

    def done() -> bool:
        nonlocal peak
        peak = max(peak, peak_rss_mb(pid))
        order = tuple((stored_offset(log, db.source) or {}).get("order") or (0, 0))
        return order > tuple(before["order"])  # type: ignore[index]

    wait_for(done, 300, "the transaction's commit to be stored")
    wait_caught_up(db, log)
    assert capture.terminate() == 0, output_of(tmp_path)
    assert first_rss < RSS_LIMIT_MB and peak < RSS_LIMIT_MB, (first_rss, peak)
    codec = EventCodec(SchemaStore(log))
    latest: dict[bytes, tuple[bytes, bytes | None]] = {}
    seen: dict[tuple[bytes, bytes, bool], bytes | None] = {}
    for partition in range(reader.topic(topic).partitions):
        for record in reader.iter_partition(topic, partition):
            identity = (record.key, record.position, record.value is None)
            if identity in seen:  # a replay after the kill: identical but for processing time
                assert (seen[identity] is None) == (record.value is None)
                continue
            seen[identity] = record.value
            held = latest.get(record.key)
            if held is None or record.position >= held[0]:
                latest[record.key] = (record.position, record.value)
    rows = {}
    for key, (_, value) in latest.items():
        if value is None:
            continue
        after = codec.decode_value(value).envelope["after"]
        rows[key] = (after["v"], after["note"])
    table = {json.dumps({"id": i}, separators=(",", ":")).encode(): (v, n)
             for i, v, n in db.execute("SELECT id, v, note FROM huge")}
    assert rows == table
    print(f"\nmysql huge transaction: {ROWS:,} rows, peak RSS {first_rss:.0f} MB / {peak:.0f} MB")


def output_of(tmp_path: Path) -> str:
    return (tmp_path / "capture2.log").read_text()[-3000:]
