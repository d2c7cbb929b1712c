"""Incremental snapshots (``cdc snapshot``, ``cdc/incremental.py``) against a real PostgreSQL,
MariaDB, Redis and Kafka, while capture streams a write load.

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
* The same on MariaDB (watermarks in a signal table; a missing one fails the snapshot alone),
  and over a Kafka log.
* Requests refused with the fix: a table not captured, a snapshot of a table already under way,
  a request with no daemon is queued and said so.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cdc.config import load_config
from cdc_app.snapshots import stored_progress
from tests.pgkit import (
    LOAD_SCHEMA,
    Capture,
    Database,
    Load,
    capture_watch,
    cdc,
    kill_capture,
    latest_rows,
    output,
    read_topic,
    table_rows,
    wait_caught_up,
    wait_for,
    write_config,
)
from tests.sparkkit import InProcessApply

pytestmark = pytest.mark.timeout(600)

ITEMS, EXTRA = 3000, 2000
CHUNK = 41  # small: the SIGKILL must land while a re-snapshot runs


class Churn:
    """Random updates, deletes and re-inserts of the first rows of ``items`` and ``extra``
    (the rows the snapshots copy), until stopped."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.changes = 0
        #: (time, table, op, key, rows changed) of every change (for a failure's report)
        self.history: list[tuple[float, str, str, int, int]] = []
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


def _verified_by_redis(config: Path, tmp_path: Path) -> InProcessApply:
    """``cdc apply`` of the Redis follower started (in this process, on the shared session),
    then ``cdc verify`` of it exits 0; the running apply (stop it at the end)."""
    applier = InProcessApply(config, tmp_path / "apply.log", "cache")
    verified = cdc("verify", "--config", str(config), "--follower", "cache",
                   "--timeout", "180s", timeout=300)
    assert verified.returncode == 0, output(verified) + applier.log_file.read_text()[-3000:]
    return applier


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
        missed = pg_db.execute("DELETE FROM items WHERE id % 70 = 1 AND id <= 3000 "
                               "RETURNING id")  # the load may have moved some away before
        pg_db.execute(f"ALTER PUBLICATION {publication} ADD TABLE items")

        asked = cdc("snapshot", "--config", str(config), "--table", "public.items")
        assert asked.returncode == 0, output(asked)
        assert "takes it within a second" in asked.stdout, output(asked)

        wait_for(lambda: (getattr(_progress(config, source, "public.items"), "rows", 0)
                          > 400), 120, "a few chunks of the re-snapshot")
        capture.kill()  # mid-snapshot
        before = _progress(config, source, "public.items")
        assert before.active and before.rows > 400, before
        again = cdc("snapshot", "--config", str(config), "--table", "public.items")
        assert again.returncode != 0 and "already under way" in again.stderr, output(again)
        capture = Capture(config, tmp_path / "capture.log").start()
        seen: list[int] = []

        def done() -> bool:
            progress = _progress(config, source, "public.items")
            seen.append(progress.rows)
            return not progress.active

        wait_for(done, 180, "the re-snapshot to finish after the restart")
        assert min(seen) >= before.rows, (before, seen[:5])  # resumed, not started over
        after = _progress(config, source, "public.items")
        # the deletes the log missed (less any id the load wrote again since)
        again_written = pg_db.execute("SELECT count(*) FROM items WHERE id = ANY(%s)",
                                      ([row[0] for row in missed],))[0][0]
        assert len(missed) >= 30 and after.tombstones >= len(missed) - again_written, (
            after, len(missed), again_written)
        status = cdc("status", "--config", str(config), "--json")
        assert '"phase": "done"' in status.stdout, output(status)
        shown = cdc("status", "--config", str(config))
        assert f"snapshot {source} public.items: done, {after.rows:,}" in shown.stdout, \
            output(shown)

        churn.finish()
        load.finish()
        wait_caught_up(pg_db, log)
        for table in ("items", "extra"):
            _equal(pg_db, log, table)
        applier = _verified_by_redis(config, tmp_path)
    finally:
        churn.stop.set()
        load.stop.set()
        applier_code = applier.terminate() if applier is not None else 0
        capture_code = capture.terminate()
    assert applier_code == 0, applier.log_file.read_text()[-3000:] if applier else ""
    assert capture_code == 0, (tmp_path / "capture.log").read_text()[-3000:]
    text = (tmp_path / "capture.log").read_text()
    assert "incremental snapshot of public.items done" in text
    assert "Traceback" not in text, text[-3000:]
    print(f"\nchurn changes {churn.changes}, load transactions {load.committed}, "
          f"items: {after.rows} rows in {after.chunks} chunks, {after.tombstones} tombstones")


def test_snapshot_requests_are_refused_with_the_fix(pg_db: Database, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE u (id int PRIMARY KEY)")
    config = write_config(tmp_path, pg_db, ["public.t", "public.u"])
    missing = cdc("snapshot", "--config", str(config), "--table", "public.nope")
    assert missing.returncode != 0, output(missing)
    assert "does not capture public.nope" in missing.stderr and "Traceback" not in missing.stderr
    queued = cdc("snapshot", "--config", str(config), "--table", "public.t")
    assert queued.returncode == 0, output(queued)
    assert "no `cdc capture` is running" in queued.stdout and "starts when it" in queued.stdout
    twice = cdc("snapshot", "--config", str(config), "--table", "public.t")
    assert twice.returncode != 0 and "queued" in twice.stderr, output(twice)
    waiting = cdc("snapshot", "--config", str(config), "--table", "public.u", "--wait")
    assert waiting.returncode != 0, output(waiting)
    assert "no `cdc capture` is running for source" in waiting.stderr, output(waiting)



def test_mariadb_incremental_snapshots_through_a_signal_table(
        mysql_db: Any, tmp_path: Path, redis_url: str) -> None:
    """The same on MariaDB: watermarks are rows of the signal table in the binlog. Without the
    table (and no right to create it) the snapshot fails alone, naming the fix, while capture
    streams on; with it, a new table and a re-snapshot of changes the binlog never saw
    (``sql_log_bin = 0``) come out equal, across a SIGKILL."""
    import os

    from tests import mykit

    db = mysql_db
    os.environ.update(db.env())
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v int, note varchar(40))")
    db.execute("CREATE TABLE extra (id int PRIMARY KEY, label varchar(20), n int)")
    db.execute(f"INSERT INTO items SELECT seq, 1, CONCAT('n', seq) FROM seq_1_to_{ITEMS}")
    db.execute(f"INSERT INTO extra SELECT seq, CONCAT('l', seq), 0 FROM seq_1_to_{EXTRA}")
    followers = f"followers:\n  cache:\n    kind: redis\n    url: {redis_url}\n"
    first = mykit.write_config(tmp_path, db, ["items"], extra=followers,
                               snapshot_chunk_size=CHUNK)
    booted = cdc("bootstrap", "--config", str(first))
    assert booted.returncode == 0, output(booted)
    config = mykit.write_config(tmp_path, db, ["items", "extra"], extra=followers,
                                snapshot_chunk_size=CHUNK)
    items, extra = db.table("items"), db.table("extra")
    log = tmp_path / "log"
    capture = Capture(config, tmp_path / "capture.log").start()
    churn = MariaChurn(db).start()
    applier = None
    try:
        wait_for(lambda: getattr(_progress(config, db.source, extra), "phase", "") == "failed",
                 60, "the snapshot to fail for want of a signal table")
        failed = _progress(config, db.source, extra)
        assert "cannot create the signal table" in failed.error, failed
        assert "GRANT INSERT, UPDATE" in failed.error and capture.alive()
        db.execute(f"CREATE TABLE {db.name}.cdc_signal (id varchar(64) PRIMARY KEY, "
                   "payload varchar(2048) NOT NULL)")
        db.execute(f"GRANT INSERT, UPDATE ON {db.name}.cdc_signal TO '{db.user}'@'%'")
        asked = cdc("snapshot", "--config", str(config), "--table", extra, "--wait",
                    timeout=180)
        assert asked.returncode == 0, output(asked)
        assert f"{extra}: " in asked.stdout and "rows in" in asked.stdout

        hidden = db.connect()  # changes the binlog never sees
        with hidden.cursor() as cursor:
            cursor.execute("SET SESSION sql_log_bin = 0")
            cursor.execute(f"UPDATE items SET v = v + 100 WHERE id % 50 = 0 AND id <= {ITEMS}")
            cursor.execute(f"DELETE FROM items WHERE id % 70 = 1 AND id <= {ITEMS}")
        hidden.close()
        asked = cdc("snapshot", "--config", str(config), "--table", items)
        assert asked.returncode == 0, output(asked)
        with mykit.capture_watch(db, capture) as watch:
            wait_for(lambda: getattr(_progress(config, db.source, items), "rows", 0) > 400,
                     120, "a few chunks of the re-snapshot")
            watch.wait_moving()
            mykit.kill_capture(watch, capture, "incremental snapshot", log, db)
        before = _progress(config, db.source, items)
        assert before.active, before
        capture = Capture(config, tmp_path / "capture.log").start()
        seen: list[int] = []

        def done() -> bool:
            progress = _progress(config, db.source, items)
            seen.append(progress.rows)
            return not progress.active

        wait_for(done, 180, "the re-snapshot to finish after the restart")
        assert min(seen) >= before.rows, (before, seen[:5])
        assert _progress(config, db.source, items).phase == "done"
        churn.finish()
        mykit.wait_caught_up(db, log)
        for table in ("items", "extra"):
            held = latest_rows(read_topic(log, f"{db.source}.{db.table(table)}"))
            keys = {f'{{"id":{row[0]}}}' for row in db.execute(f"SELECT id FROM {table}")}
            stale = sorted(set(held) ^ keys)[:4]
            assert set(held) == keys, (table, stale, [h for h in churn.history if h[1] == table
                                                      and f'{{"id":{h[3]}}}' in stale])
        applier = _verified_by_redis(config, tmp_path)
    finally:
        churn.stop.set()
        applier_code = applier.terminate() if applier is not None else 0
        capture_code = capture.terminate()
    assert applier_code == 0, applier.log_file.read_text()[-3000:] if applier else ""
    assert capture_code == 0, (tmp_path / "capture.log").read_text()[-3000:]
    assert "Traceback" not in (tmp_path / "capture.log").read_text()


class MariaChurn(Churn):
    """:class:`Churn` on MariaDB."""

    def _run(self) -> None:
        rng = random.Random(9)
        try:
            conn = self.db.connect()
            with conn.cursor() as cursor:
                while not self.stop.is_set():
                    table, top = rng.choice([("items", ITEMS), ("extra", EXTRA)])
                    key = rng.randint(1, top)
                    roll = rng.random()
                    column = "v" if table == "items" else "n"
                    if roll < 0.6:
                        op = "u"
                        cursor.execute(f"UPDATE {table} SET {column} = {column} + 1 "
                                       "WHERE id = %s", (key,))
                    elif roll < 0.8:
                        op = "d"
                        cursor.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
                    else:
                        op = "c"
                        cursor.execute(f"INSERT IGNORE INTO {table} (id, {column}) "
                                       "VALUES (%s, 7)", (key,))
                    self.history.append((time.time(), table, op, key, cursor.rowcount))
                    self.changes += 1
                    self.stop.wait(0.002)
            conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.errors.append(exc)


def test_incremental_snapshots_over_a_kafka_log(kafka_broker: Any, pg_db: Database,
                                                tmp_path: Path) -> None:
    """The same windows over the Kafka backend: a new table and a re-snapshot that repairs
    missed deletes, under churn; the log's current keys equal the tables'."""
    from tests.kafkakit import kafka_yaml

    pg_db.execute(LOAD_SCHEMA)
    pg_db.execute("CREATE TABLE extra (id int PRIMARY KEY, label text, n int)")
    pg_db.execute(f"INSERT INTO items (id, v, note) SELECT g, 1, 'n' || g "
                  f"FROM generate_series(1, {ITEMS}) g")
    pg_db.execute(f"INSERT INTO extra SELECT g, 'l' || g, 0 FROM generate_series(1, {EXTRA}) g")
    options = kafka_yaml(kafka_broker)
    first = write_config(tmp_path, pg_db, ["public.items"], log_options=options,
                         snapshot_chunk_size=CHUNK * 5)
    assert cdc("bootstrap", "--config", str(first)).returncode == 0
    config = write_config(tmp_path, pg_db, ["public.items", "public.extra"],
                          log_options=options, snapshot_chunk_size=CHUNK * 5)
    log = {**options, "path": str(tmp_path / "log")}
    capture = Capture(config, tmp_path / "capture.log").start()
    churn = Churn(pg_db).start()
    try:
        wait_for(lambda: getattr(_progress(config, pg_db.source, "public.extra"), "phase",
                                 "") == "done", 120, "the snapshot of the new table")
        publication = f"cdc_{pg_db.source}"
        pg_db.execute(f"ALTER PUBLICATION {publication} DROP TABLE items")
        pg_db.execute(f"DELETE FROM items WHERE id % 70 = 1 AND id <= {ITEMS}")
        pg_db.execute(f"ALTER PUBLICATION {publication} ADD TABLE items")
        asked = cdc("snapshot", "--config", str(config), "--table", "public.items", "--wait",
                    timeout=180)
        assert asked.returncode == 0, output(asked)
        churn.finish()
        wait_caught_up(pg_db, log)
        for table in ("items", "extra"):
            held = latest_rows(read_topic(log, f"{pg_db.source}.public.{table}"))
            assert set(held) == set(table_rows(pg_db, f"public.{table}")), table
    finally:
        churn.stop.set()
        capture_code = capture.terminate()
    assert capture_code == 0, (tmp_path / "capture.log").read_text()[-3000:]


def test_a_snapshot_of_a_table_no_longer_captured_fails_alone(pg_db: Database,
                                                              tmp_path: Path) -> None:
    """Capture stopped mid-snapshot, the table taken out of ``tables``: restarted, capture
    marks that snapshot failed with the fix and streams on."""
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE u (id int PRIMARY KEY)")
    pg_db.execute("INSERT INTO u SELECT generate_series(1, 20000)")
    both = write_config(tmp_path, pg_db, ["public.t", "public.u"], snapshot_chunk_size=50)
    assert cdc("bootstrap", "--config", str(both)).returncode == 0
    capture = Capture(both, tmp_path / "capture.log").start()
    asked = cdc("snapshot", "--config", str(both), "--table", "public.u")
    assert asked.returncode == 0, output(asked)
    with capture_watch(pg_db, capture) as watch:
        wait_for(lambda: getattr(_progress(both, pg_db.source, "public.u"), "rows", 0) > 0, 60,
                 "the snapshot to start")
        watch.wait_moving()
        kill_capture(watch, capture, "incremental snapshot", tmp_path / "log", pg_db.source)
    assert _progress(both, pg_db.source, "public.u").active
    only_t = write_config(tmp_path, pg_db, ["public.t"], snapshot_chunk_size=50)
    capture = Capture(only_t, tmp_path / "capture.log").start()
    try:
        wait_for(lambda: _progress(only_t, pg_db.source, "public.u").phase == "failed", 60,
                 "the snapshot to fail")
        failed = _progress(only_t, pg_db.source, "public.u")
        assert "no longer in the source's tables" in (failed.error or ""), failed
        pg_db.execute("INSERT INTO t VALUES (1)")
        wait_caught_up(pg_db, tmp_path / "log")
        assert '{"id":1}' in latest_rows(read_topic(tmp_path / "log",
                                                    f"{pg_db.source}.public.t"))
    finally:
        capture_code = capture.terminate()
    text = (tmp_path / "capture.log").read_text()
    assert capture_code == 0, text[-3000:]
    # Debezium-style notifications in the log (and the metrics: tests/test_monitoring.py)
    assert "incremental snapshot of public.u failed" in text
    assert "incremental snapshots completed (public.u failed)" in text


def test_a_chunk_of_records_and_events_is_logged_in_position_order(tmp_path: Path) -> None:
    """A chunk may hold rows as finished records (the compiled COPY loop) and as events (rows
    it declined): at the high watermark both are logged, in the chunk's key order, with the
    watermark's positions 1, 2, 3 ... (records through ``add_batch``, events through ``add``),
    and a key the stream changed inside the window is left out whichever form it had."""
    from cdc.events import ChangeEvent, Column, ColumnType, Op, TableId, TableSchema
    from cdc.incremental import IncrementalSnapshots, SnapshotQueue
    from cdc.log.base import Record
    from cdc.position import Position
    from cdc.source import EncodedBatch, Watermark

    table = TableId("public", "t")
    schema = TableSchema("src", "db", table, (Column("id", ColumnType("int64")),), ("id",))
    placeholder = Position.postgres(0, 0, snapshot=True)

    def event(key: int) -> ChangeEvent:
        return ChangeEvent(schema, Op.READ, placeholder, 0, after={"id": key})

    def record(key: int) -> Record:
        return Record(schema.topic, b'{"id":%d}' % key, b"value %d" % key,
                      placeholder.to_bytes())

    rows: list[ChangeEvent | Record] = [record(1), record(2), event(3), record(4), event(5),
                                        record(6)]

    class Stream:  # the two calls a chunk window makes of its source
        marks: list[str] = []

        def watermark(self, payload: str) -> None:
            self.marks.append(payload)

        def estimate_rows(self, _: TableId) -> int:
            return len(rows)

        def chunk(self, *_: Any) -> tuple[TableSchema, list[ChangeEvent | Record], None]:
            return schema, rows, None

    snapshots = IncrementalSnapshots(
        "src", [table], SnapshotQueue(tmp_path, "src"), None, 100,
        lambda e: b'{"id":%d}' % e.after["id"], lambda topic: set())
    snapshots.add([table], "request-1")
    stream = Stream()
    snapshots.step(stream)  # type: ignore[arg-type]
    low, high = stream.marks
    logged: list[tuple[bytes, bytes]] = []
    batches = []

    def add(e: ChangeEvent) -> None:
        logged.append((b'{"id":%d}' % e.after["id"], e.position.to_bytes()))

    def add_batch(batch: EncodedBatch) -> None:
        batches.append(len(batch.records))
        logged.extend((r.key, r.position) for r in batch.records)

    def position(commit: int) -> Any:
        return lambda ordinal: Position.postgres(commit, ordinal, snapshot=True)
    snapshots.reached(Watermark(low, position(100)), add, lambda *_: None, add_batch)
    snapshots.saw(EncodedBatch([record(2)], (schema,), 1))  # streamed inside the window
    snapshots.saw(event(5))
    snapshots.reached(Watermark(high, position(200)), add, lambda *_: None, add_batch)
    assert [key for key, _ in logged] == [b'{"id":1}', b'{"id":3}', b'{"id":4}', b'{"id":6}']
    assert [p for _, p in logged] == [Position.postgres(200, i, snapshot=True).to_bytes()
                                      for i in (1, 2, 3, 4)]
    assert batches == [1, 2]  # record 1, (event 3), records 4 and 6 (event 5 was dropped)
    assert snapshots.running[str(table)].rows == 4
