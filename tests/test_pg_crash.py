"""SIGKILL the capture daemon (and a bootstrap) at random moments under a concurrent write load;
afterwards the log must hold every change the audit trail holds, in order, and equal the table."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdc.log.local import LocalChangeLogReader
from tests.pgkit import (
    LOAD_SCHEMA,
    PROJECT,
    Capture,
    Database,
    Load,
    capture_watch,
    cdc,
    check_against_audit,
    kill_bootstrap,
    kill_capture,
    latest_rows,
    output,
    read_topic,
    snapshot_watch,
    stored_offset,
    table_rows,
    wait_caught_up,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.timeout(600)

KILLS = 10


def test_capture_survives_sigkill_under_load(pg_db: Database, tmp_path: Path) -> None:
    pg_db.execute(LOAD_SCHEMA)
    pg_db.execute("INSERT INTO items (id, v, amount, note) SELECT g, 1, g, repeat('y', 2100) "
                  "FROM generate_series(1, 2000) g")
    pg_db.execute("INSERT INTO audit (id, v, op) SELECT g, 1, 'c' FROM generate_series(1, 2000) g")
    # small groups: kills also land between the flushes of one large transaction
    config = write_config(tmp_path, pg_db, ["public.items"],
                          log_options={"commit_max_records": 250})
    log = tmp_path / "log"
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    load = Load(pg_db, threads=3, bulk_every=25).start()
    rng = random.Random(20261122)
    capture = Capture(config, tmp_path / "capture.log").start()
    def stored_lsn() -> int:
        return int((stored_offset(log, pg_db.source) or {}).get("lsn", 0))

    lsns = [stored_lsn()]
    with capture_watch(pg_db, capture) as watch:
        for _ in range(KILLS):
            delay = rng.uniform(0.2, 4.0)  # a restart under load takes ~2 s to commit
            time.sleep(delay)
            assert capture.alive(), (tmp_path / "capture.log").read_text()[-3000:]
            watch.wait_moving()
            phase = "just restarted" if delay < 1.5 else "streaming"
            if phase == "streaming":  # streaming: it has committed since it restarted (on a
                # slow machine a restart can take longer than the delay to commit at all)
                wait_for(lambda: stored_lsn() > lsns[-1], 120, "the restarted capture to commit")
            kill_capture(watch, capture, phase, log, pg_db.source)
            lsns.append(stored_lsn())
            time.sleep(rng.uniform(0, 0.3))
            capture.start()
    load.finish()
    wait_caught_up(pg_db, log, timeout=180)
    assert capture.terminate() == 0
    assert lsns == sorted(lsns) and lsns[-1] > lsns[0]  # capture progressed between kills
    figures = check_against_audit(pg_db, read_topic(log, f"{pg_db.source}.public.items"))
    print(f"\ncrash test: {KILLS} SIGKILLs, {load.committed} transactions, "
          f"{figures['audit_changes']} audited changes, {figures['events']} log events, "
          f"{figures['duplicates']} replayed duplicates (same position and content), "
          f"{figures['keys']} live keys equal to the table")
    slot = pg_db.slot()
    assert slot and slot["confirmed"] == stored_offset(log, pg_db.source)["lsn"]  # type: ignore


def test_bootstrap_killed_mid_snapshot_is_redone(pg_db: Database, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE big (id int PRIMARY KEY, pad text)")
    pg_db.execute("INSERT INTO big SELECT g, repeat('z', 200) FROM generate_series(1, 150000) g")
    pg_db.execute("ANALYZE big")
    config = write_config(tmp_path, pg_db, ["public.big"],
                          log_options={"commit_max_records": 1000})
    log = tmp_path / "log"
    topic = f"{pg_db.source}.public.big"
    process = subprocess.Popen([sys.executable, "-m", "cdc_app.cli", "bootstrap", "--config",
                                str(config)], cwd=PROJECT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)

    def partly_snapshotted() -> bool:  # cheap (no decoding): the snapshot is fast
        offset = stored_offset(log, pg_db.source) or {}
        if offset.get("state") != "bootstrapping":
            return False
        return sum(LocalChangeLogReader(log).end_offsets(topic).values()) > 3000

    with snapshot_watch(log, topic) as watch:
        wait_for(partly_snapshotted, 60, "a partial snapshot", interval=0.005)
        kill_bootstrap(watch, process, log, pg_db.source, "PostgreSQL")
    assert len(read_topic(log, topic)) < 150_000  # it really died mid-snapshot
    refused = cdc("capture", "--config", str(config), timeout=60)
    assert refused.returncode == 1 and "bootstrap did not finish" in output(refused)
    assert "Traceback" not in output(refused)
    # rows deleted meanwhile, some of them already in the partial snapshot
    pg_db.execute("DELETE FROM big WHERE id <= 500 OR id % 1000 = 0")
    redo = cdc("bootstrap", "--config", str(config), timeout=300)
    assert redo.returncode == 0, output(redo)
    assert "vanished keys tombstoned" in redo.stdout
    rows = latest_rows(read_topic(log, topic))
    assert rows == table_rows(pg_db, "big")
    assert (stored_offset(log, pg_db.source) or {}).get("state") == "streaming"
