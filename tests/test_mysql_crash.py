"""SIGKILL MySQL/MariaDB capture (and a bootstrap) at random moments under concurrent writers;
afterwards the log holds every change the audit trail holds (written in the same transactions:
an oracle independent of the binlog), in order, replays carry the same position and content,
and every key's latest state equals the table."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cdc.log.local import LocalChangeLogReader
from tests.mykit import MyDatabase, capture_watch, kill_capture, wait_caught_up, write_config
from tests.pgkit import (
    PROJECT,
    Capture,
    big_text,
    cdc,
    check_history,
    kill_bootstrap,
    latest_rows,
    output,
    read_topic,
    snapshot_watch,
    stored_offset,
    wait_for,
)

pytestmark = pytest.mark.timeout(600)

KILLS = 10
SCHEMA = """
CREATE TABLE items (id INT PRIMARY KEY, v INT NOT NULL, amount DECIMAL(12,2), note TEXT,
                    updated DATETIME(6));
CREATE TABLE audit (seq BIGINT AUTO_INCREMENT PRIMARY KEY, id INT NOT NULL, v INT NOT NULL,
                    op CHAR(1) NOT NULL)
"""


@dataclass
class Load:
    """Concurrent transactions of 1-4 inserts/updates/deletes (some of 300) on ``items``, each
    change audited in the same transaction."""

    db: MyDatabase
    threads: int = 3
    bulk_every: int = 25
    stop: threading.Event = field(default_factory=threading.Event)
    committed: int = 0
    errors: list[BaseException] = field(default_factory=list)
    _workers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        for index in range(self.threads):
            worker = threading.Thread(target=self._run, args=(index,), daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def finish(self) -> None:
        self.stop.set()
        for worker in self._workers:
            worker.join(60)
        if self.errors:
            raise self.errors[0]

    def _run(self, index: int) -> None:
        rng = random.Random(20261124 + index)
        live: dict[int, int] = {}
        next_id = 1_000_000 + index
        conn = self.db.connect()
        try:
            with conn.cursor() as cursor:
                while not self.stop.is_set():
                    big = self.bulk_every and self.committed % self.bulk_every == index
                    conn.begin()
                    for _ in range(300 if big else rng.randint(1, 4)):
                        next_id = self._change(cursor, rng, live, next_id)
                    conn.commit()
                    self.committed += 1
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.errors.append(exc)
        finally:
            conn.close()

    def _change(self, cursor: Any, rng: random.Random, live: dict[int, int],
                next_id: int) -> int:
        roll = rng.random()
        if not live or roll < 0.35:
            key, next_id = next_id, next_id + self.threads
            cursor.execute("INSERT INTO items VALUES (%s, 1, %s, %s, NOW(6))",
                           (key, rng.randint(0, 10**8) / 100, big_text(key, 1)[:300]))
            cursor.execute("INSERT INTO audit (id, v, op) VALUES (%s, 1, 'c')", (key,))
            live[key] = 1
        elif roll < 0.45:
            key, new, next_id = rng.choice(list(live)), next_id, next_id + self.threads
            live[new] = live.pop(key) + 1  # a key change: delete + create in the log
            cursor.execute("UPDATE items SET id = %s, v = %s WHERE id = %s",
                           (new, live[new], key))
            cursor.execute("INSERT INTO audit (id, v, op) VALUES (%s, 0, 'd'), (%s, %s, 'c')",
                           (key, new, live[new]))
        elif roll < 0.85:
            key = rng.choice(list(live))
            live[key] += 1
            cursor.execute("UPDATE items SET v = %s, amount = %s, note = %s, updated = NOW(6) "
                           "WHERE id = %s", (live[key], rng.randint(0, 10**8) / 100,
                                             big_text(key, live[key])[:300], key))
            cursor.execute("INSERT INTO audit (id, v, op) VALUES (%s, %s, 'u')", (key, live[key]))
        else:
            key = rng.choice(list(live))
            version = live.pop(key)
            cursor.execute("DELETE FROM items WHERE id = %s", (key,))
            cursor.execute("INSERT INTO audit (id, v, op) VALUES (%s, %s, 'd')", (key, version))
        return next_id


def _table(db: MyDatabase) -> dict[str, dict[str, Any]]:
    return {json.dumps({"id": i}, separators=(",", ":")): {"id": i, "v": v, "amount": a,
                                                          "note": n}
            for i, v, a, n in db.execute("SELECT id, v, amount, note FROM items")}


def test_capture_survives_sigkill_under_load(mysql_db: MyDatabase, tmp_path: Path) -> None:
    db = mysql_db
    db.script(SCHEMA)
    db.execute("INSERT INTO items SELECT seq, 1, seq, REPEAT('y', 300), NOW(6) "
               "FROM seq_1_to_2000")
    db.execute("INSERT INTO audit (id, v, op) SELECT seq, 1, 'c' FROM seq_1_to_2000")
    # small groups: kills also land between the flushes of one large transaction
    config = write_config(tmp_path, db, ["items"], log_options={"commit_max_records": 250})
    log = tmp_path / "log"
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    load = Load(db).start()
    rng = random.Random(20261124)
    capture = Capture(config, tmp_path / "capture.log").start()
    def stored_order() -> tuple[int, ...]:
        return tuple((stored_offset(log, db.source) or {}).get("order") or (0, 0))

    orders = [stored_order()]
    with capture_watch(db, capture) as watch:
        for _ in range(KILLS):
            delay = rng.uniform(0.2, 3.0)
            time.sleep(delay)
            assert capture.alive(), (tmp_path / "capture.log").read_text()[-3000:]
            watch.wait_moving()
            phase = "just restarted" if delay < 1.2 else "streaming"
            if phase == "streaming":  # streaming: it has committed since it restarted
                wait_for(lambda: stored_order() > orders[-1], 120,
                         "the restarted capture to commit")
            kill_capture(watch, capture, phase, log, db)
            orders.append(stored_order())
            time.sleep(rng.uniform(0, 0.3))
            capture.start()
    load.finish()
    wait_caught_up(db, log, timeout=180)
    assert capture.terminate() == 0
    assert orders == sorted(orders) and orders[-1] > orders[0]  # it progressed between kills
    figures = check_history(db.execute("SELECT id, v, op FROM audit ORDER BY seq"), _table(db),
                            read_topic(log, f"{db.source}.{db.name}.items"))
    print(f"\nmysql crash test: {KILLS} SIGKILLs, {load.committed} transactions, "
          f"{figures['audit_changes']} audited changes, {figures['events']} log events, "
          f"{figures['duplicates']} replayed duplicates (same position and content), "
          f"{figures['keys']} live keys equal to the table")


def test_bootstrap_killed_mid_snapshot_is_redone(mysql_db: MyDatabase, tmp_path: Path) -> None:
    db = mysql_db
    db.execute("CREATE TABLE big (id INT PRIMARY KEY, pad VARCHAR(200))")
    db.execute("INSERT INTO big SELECT seq, REPEAT('z', 200) FROM seq_1_to_150000")
    config = write_config(tmp_path, db, ["big"], log_options={"commit_max_records": 1000})
    log = tmp_path / "log"
    topic = f"{db.source}.{db.name}.big"
    process = subprocess.Popen([sys.executable, "-m", "cdc_app.cli", "bootstrap", "--config",
                                str(config)], cwd=PROJECT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)

    def partly_snapshotted() -> bool:
        offset = stored_offset(log, db.source) or {}
        if offset.get("state") != "bootstrapping":
            return False
        return sum(LocalChangeLogReader(log).end_offsets(topic).values()) > 3000

    with snapshot_watch(log, topic) as watch:
        wait_for(partly_snapshotted, 60, "a partial snapshot", interval=0.005)
        kill_bootstrap(watch, process, log, db.source, "MariaDB")
    assert len(read_topic(log, topic)) < 150_000  # it really died mid-snapshot
    refused = cdc("capture", "--config", str(config), timeout=60)
    assert refused.returncode == 1 and "bootstrap did not finish" in output(refused)
    assert "Traceback" not in output(refused)
    db.execute("DELETE FROM big WHERE id <= 500 OR id % 1000 = 0")  # some already snapshotted
    redo = cdc("bootstrap", "--config", str(config), timeout=300)
    assert redo.returncode == 0, output(redo)
    assert "vanished keys tombstoned" in redo.stdout
    table = {json.dumps({"id": i}, separators=(",", ":")): {"id": i, "pad": p}
             for i, p in db.execute("SELECT id, pad FROM big")}
    assert latest_rows(read_topic(log, topic)) == table
    assert (stored_offset(log, db.source) or {}).get("state") == "streaming"
