"""Incremental snapshots (``cdc snapshot``, ``cdc/incremental.py``) against a real PostgreSQL
and a real Redis, while capture streams a write load.

* A table added to ``tables`` after the bootstrap is snapshotted by ``cdc capture`` on its own,
  chunk by chunk, while its rows are updated, deleted and re-inserted, inside and outside the
  chunk windows.
* A re-snapshot of a table whose changes the log partly missed (its publication dropped it for a
  while: updates and deletes never streamed) repairs it: the chunks bring the current rows, the
  sweep tombstones the keys the table lost.
* ``cdc capture`` is SIGKILLed in the middle of the re-snapshot; restarted, it resumes from the
  last chunk the log holds (the stored progress never goes back).
* Afterwards the log's current rows equal the tables', and ``cdc verify`` of a Redis follower
  exits 0.
* Requests refused with the fix: a table not captured, a snapshot of a table already under way,
  a connector without incremental snapshots; a request with no daemon is queued and said so.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest

from cdc.config import load_config
from cdc.snapshots import stored_progress
from tests.pgkit import (
    LOAD_SCHEMA,
    ApplyProcess,
    Capture,
    Database,
    Load,
    cdc,
    latest_rows,
    output,
    read_topic,
    table_rows,
    wait_caught_up,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.timeout(600)

ITEMS, EXTRA = 3000, 2000
CHUNK = 97


class Churn:
    """Random updates, deletes and re-inserts of the first rows of ``items`` and ``extra``
    (the rows the snapshots copy), until stopped."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.changes = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Churn:
        self.thread.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(60)
        if self.errors:
            raise self.errors[0]

    def _run(self) -> None:
        rng = random.Random(5)
        try:
            with self.db.connect() as conn:
                while not self.stop.is_set():
                    table, top = rng.choice([("items", ITEMS), ("extra", EXTRA)])
                    key = rng.randint(1, top)
                    roll = rng.random()
                    if roll < 0.6:
                        column = "v" if table == "items" else "n"
                        conn.execute(f"UPDATE {table} SET {column} = {column} + 1 "
                                     "WHERE id = %s", (key,))
                    elif roll < 0.8:
                        conn.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
                    elif table == "items":
                        conn.execute("INSERT INTO items (id, v, note) VALUES (%s, 7, 'back') "
                                     "ON CONFLICT DO NOTHING", (key,))
                    else:
                        conn.execute("INSERT INTO extra VALUES (%s, 'back', 7) "
                                     "ON CONFLICT DO NOTHING", (key,))
                    self.changes += 1
                    self.stop.wait(0.002)
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.errors.append(exc)


def _progress(config: Path, source: str, table: str) -> Any:
    return stored_progress(load_config(config), source).get(table)


def _equal(db: Database, log: Path, table: str) -> None:
    held = latest_rows(read_topic(log, f"{db.source}.public.{table}"))
    rows = table_rows(db, f"public.{table}")
    assert set(held) == set(rows), (sorted(set(held) - set(rows))[:5],
                                     sorted(set(rows) - set(held))[:5])


def test_incremental_snapshots_while_streaming_survive_sigkill_and_verify(
        pg_db: Database, tmp_path: Path, redis_url: str) -> None:
    pg_db.execute(LOAD_SCHEMA)
    pg_db.execute("CREATE TABLE extra (id int PRIMARY KEY, label text, n int)")
    pg_db.execute(f"INSERT INTO items (id, v, note) SELECT g, 1, 'n' || g "
                  f"FROM generate_series(1, {ITEMS}) g")
    pg_db.execute(f"INSERT INTO extra SELECT g, 'l' || g, 0 FROM generate_series(1, {EXTRA}) g")
    followers = f"followers:\n  cache:\n    kind: redis\n    url: {redis_url}\n"
    first = write_config(tmp_path, pg_db, ["public.items", "public.audit"], extra=followers,
                         snapshot_chunk_size=CHUNK)
    booted = cdc("bootstrap", "--config", str(first))
    assert booted.returncode == 0, output(booted)
    # `extra` joins the config later: capture snapshots it by itself
    config = write_config(tmp_path, pg_db, ["public.items", "public.audit", "public.extra"],
                          extra=followers, snapshot_chunk_size=CHUNK)
    log, source = tmp_path / "log", pg_db.source
    capture = Capture(config, tmp_path / "capture.log").start()
    load = Load(pg_db, threads=1, key_changes=0.1, pause=0.003).start()
    churn = Churn(pg_db).start()
    applier = None
    try:
        wait_for(lambda: (_progress(config, source, "public.extra") or
                          type("P", (), {"phase": ""})).phase == "done", 120,
                 "the snapshot of the new table")
        # the log misses some of items' changes: its publication drops it for a while
        publication = f"cdc_{source}"
        pg_db.execute(f"ALTER PUBLICATION {publication} DROP TABLE items")
        pg_db.execute("UPDATE items SET v = v + 100 WHERE id % 50 = 0 AND id <= 3000")
        pg_db.execute("DELETE FROM items WHERE id % 70 = 1 AND id <= 3000")
        pg_db.execute(f"ALTER PUBLICATION {publication} ADD TABLE items")

        asked = cdc("snapshot", "--config", str(config), "--table", "public.items")
        assert asked.returncode == 0, output(asked)
        assert "takes it within a second" in asked.stdout, output(asked)
        again = cdc("snapshot", "--config", str(config), "--table", "public.items")
        assert again.returncode != 0 and "already under way" in again.stderr, output(again)

        wait_for(lambda: (getattr(_progress(config, source, "public.items"), "rows", 0)
                          > 600), 120, "a few chunks of the re-snapshot")
        capture.kill()  # mid-snapshot
        before = _progress(config, source, "public.items")
        assert before.active and before.rows > 600, before
        capture = Capture(config, tmp_path / "capture.log").start()
        seen: list[int] = []

        def done() -> bool:
            progress = _progress(config, source, "public.items")
            seen.append(progress.rows)
            return not progress.active

        wait_for(done, 180, "the re-snapshot to finish after the restart")
        assert min(seen) >= before.rows, (before, seen[:5])  # resumed, not started over
        after = _progress(config, source, "public.items")
        assert after.tombstones >= 40, after  # the deletes the log missed
        status = cdc("status", "--config", str(config), "--json")
        assert '"phase": "done"' in status.stdout, output(status)

        churn.finish()
        load.finish()
        wait_caught_up(pg_db, log)
        for table in ("items", "extra"):
            _equal(pg_db, log, table)
        applier = ApplyProcess(config, tmp_path / "apply.log")
        verified = cdc("verify", "--config", str(config), "--follower", "cache",
                       "--timeout", "180s", timeout=300)
        assert verified.returncode == 0, output(verified) + applier.log_file.read_text()[-3000:]
    finally:
        churn.stop.set()
        load.stop.set()
        if applier is not None:
            assert applier.terminate() == 0, applier.log_file.read_text()[-3000:]
        assert capture.terminate() == 0, (tmp_path / "capture.log").read_text()[-3000:]
    text = (tmp_path / "capture.log").read_text()
    assert "incremental snapshot of public.items done" in text
    assert "Traceback" not in text, text[-3000:]
    print(f"\nchurn changes {churn.changes}, load transactions {load.committed}, "
          f"items: {after.rows} rows in {after.chunks} chunks, {after.tombstones} tombstones")


def test_snapshot_requests_are_refused_with_the_fix(pg_db: Database, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(tmp_path, pg_db, ["public.t"])
    missing = cdc("snapshot", "--config", str(config), "--table", "public.nope")
    assert missing.returncode != 0, output(missing)
    assert "does not capture public.nope" in missing.stderr and "Traceback" not in missing.stderr
    queued = cdc("snapshot", "--config", str(config), "--table", "public.t")
    assert queued.returncode == 0, output(queued)
    assert "no `cdc capture` is running" in queued.stdout and "starts when it" in queued.stdout
    twice = cdc("snapshot", "--config", str(config), "--table", "public.t")
    assert twice.returncode != 0 and "queued" in twice.stderr, output(twice)
    waiting = cdc("snapshot", "--config", str(config), "--table", "public.t", "--wait")
    assert waiting.returncode != 0, output(waiting)

    mysql = tmp_path / "my.yaml"
    mysql.write_text(f"log:\n  path: {tmp_path / 'mylog'}\nsources:\n  - name: m\n"
                     "    kind: mysql\n    dsn: mysql://u@127.0.0.1:1/d\n    tables: [d.t]\n")
    refused = cdc("snapshot", "--config", str(mysql), "--table", "d.t")
    assert refused.returncode != 0, output(refused)
    assert "no incremental snapshots yet" in refused.stderr
    assert "cdc bootstrap --source m" in refused.stderr
