"""Whole rows and table-level changes: unchanged TOAST values filled from previous images, the
explicit "unavailable" case, key changes, TRUNCATE tombstones, schema changes mid-stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdc.log.local import LocalChangeLog
from cdc.log.schemas import SchemaStore
from cdc.position import Position
from tests.pgkit import (
    Capture,
    Database,
    big_text,
    cdc,
    latest_rows,
    output,
    read_topic,
    stored_offset,
    table_rows,
    wait_caught_up,
    write_config,
)

pytestmark = pytest.mark.timeout(240)


def assert_log_equals_table(db: Database, log: Path, table: str) -> None:
    logged = latest_rows(read_topic(log, f"{db.source}.public.{table}"))
    expected = table_rows(db, table)
    assert logged.keys() == expected.keys()
    for key, row in expected.items():
        assert logged[key] == row, key


def test_unchanged_toast_values_are_filled(pg_db: Database, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v int, big text, small text)")
    pg_db.execute("ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")  # no compression
    for key in (1, 2, 3):
        pg_db.execute("INSERT INTO t VALUES (%s, 0, %s, 's')", (key, big_text(key, 0)))
    config = write_config(tmp_path, pg_db, ["public.t"])
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    log = tmp_path / "log"
    capture = Capture(config, tmp_path / "capture.log").start()
    pg_db.execute("UPDATE t SET v = 1 WHERE id = 1")             # image from the snapshot (log)
    pg_db.execute("INSERT INTO t VALUES (4, 0, %s, 's')", (big_text(4, 0),))
    pg_db.execute("UPDATE t SET v = 1 WHERE id = 4")             # image from the cache
    with pg_db.connect() as conn, conn.transaction():           # ... and from the buffer
        conn.execute("UPDATE t SET big = %s WHERE id = 2", (big_text(2, 1),))
        conn.execute("UPDATE t SET v = 2 WHERE id = 2")
    pg_db.execute("UPDATE t SET id = 30, v = 5 WHERE id = 3")  # key change: the old key's image
    wait_caught_up(pg_db, log)
    assert capture.terminate() == 0
    capture = Capture(config, tmp_path / "capture.log").start()  # a cold cache: the log again
    pg_db.execute("UPDATE t SET small = 'x' WHERE id = 2")
    pg_db.execute("UPDATE t SET v = 9 WHERE id = 30")
    wait_caught_up(pg_db, log)
    assert capture.terminate() == 0
    events = read_topic(log, f"{pg_db.source}.public.t")
    updates = [e for e in events if e.op in ("u", "c") and e.position.parts[1] == 1]
    assert len(updates) >= 7
    for event in updates:
        assert event.envelope is not None
        assert event.envelope["unavailable_columns"] is None, event
        assert event.envelope["after"]["big"] is not None, event
    assert_log_equals_table(pg_db, log, "t")


def test_replica_identity_full_fills_from_the_old_tuple(pg_db: Database, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v int, big text)")
    pg_db.execute("ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")
    pg_db.execute("ALTER TABLE t REPLICA IDENTITY FULL")
    pg_db.execute("INSERT INTO t VALUES (1, 0, %s)", (big_text(1, 0),))
    config = write_config(tmp_path, pg_db, ["public.t"])
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    log = tmp_path / "log"
    # the log's own image is gone (as after a lost record): only the old tuple can fill it
    _tombstone_in_log(log, f"{pg_db.source}.public.t", b'{"id":1}')
    capture = Capture(config, tmp_path / "capture.log").start()
    pg_db.execute("UPDATE t SET v = 1 WHERE id = 1")
    wait_caught_up(pg_db, log)
    assert capture.terminate() == 0
    update = next(e for e in read_topic(log, f"{pg_db.source}.public.t") if e.op == "u")
    assert update.envelope is not None and update.envelope["unavailable_columns"] is None
    assert update.envelope["after"]["big"] == big_text(1, 0)
    assert update.envelope["before"]["big"] == big_text(1, 0)


def _tombstone_in_log(log: Path, topic: str, key: bytes) -> None:
    """Shadow ``key``'s snapshot record, as if its image had been lost from the log."""
    with LocalChangeLog(log) as writer:
        offsets = writer.source_offsets()
        lsn = next(iter(offsets.values()))["lsn"]
        position = Position.postgres(int(lsn), 10**9, snapshot=True)
        from cdc.log.base import Record

        writer.append([Record(topic, key, None, position.to_bytes())], offsets)


def test_unavailable_values_are_explicit_and_warned(pg_db: Database, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v int, big text)")
    pg_db.execute("ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")
    pg_db.execute("INSERT INTO t VALUES (1, 0, %s), (2, 0, %s)", (big_text(1, 0), big_text(2, 0)))
    config = write_config(tmp_path, pg_db, ["public.t"])
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    log = tmp_path / "log"
    _tombstone_in_log(log, f"{pg_db.source}.public.t", b'{"id":1}')
    capture = Capture(config, tmp_path / "capture.log").start()
    pg_db.execute("UPDATE t SET v = 1 WHERE id IN (1, 2)")
    wait_caught_up(pg_db, log)
    assert capture.terminate() == 0
    updates = {e.key: e for e in read_topic(log, f"{pg_db.source}.public.t") if e.op == "u"}
    lost = updates['{"id":1}'].envelope
    assert lost is not None and lost["unavailable_columns"] == ["big"]
    assert lost["after"]["big"] is None and lost["after"]["v"] == 1
    kept = updates['{"id":2}'].envelope
    assert kept is not None and kept["unavailable_columns"] is None
    assert kept["after"]["big"] == big_text(2, 0)
    assert stored_offset(log, pg_db.source)["unavailable_images"] == 1  # type: ignore[index]
    status = cdc("status", "--config", str(config))
    text = output(status)
    assert status.returncode == 0 and "unavailable_columns" in text and "REPLICA IDENTITY FULL" \
        in text, text
    assert json.loads(cdc("status", "--config", str(config), "--json").stdout)[
        "sources"][0]["unavailable_images"] == 1


def test_truncate_tombstones_every_live_key(pg_db: Database, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg_db.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 50) g")
    config = write_config(tmp_path, pg_db, ["public.t"])
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    log = tmp_path / "log"
    capture = Capture(config, tmp_path / "capture.log").start()
    pg_db.execute("INSERT INTO t VALUES (51, 'streamed')")
    pg_db.execute("DELETE FROM t WHERE id = 2")
    with pg_db.connect() as conn, conn.transaction():
        conn.execute("INSERT INTO t VALUES (52, 'same txn, before')")
        conn.execute("TRUNCATE t")
        conn.execute("INSERT INTO t VALUES (53, 'same txn, after')")
    pg_db.execute("INSERT INTO t VALUES (1, 'back again')")
    wait_caught_up(pg_db, log)
    assert capture.terminate() == 0
    events = read_topic(log, f"{pg_db.source}.public.t")
    truncate = next(e for e in events if e.op == "t")
    at_truncate = {e.key for e in events if e.position == truncate.position and e.op == "tombstone"}
    live_before = {json.dumps({"id": i}, separators=(",", ":")) for i in range(1, 53) if i != 2}
    assert at_truncate == live_before  # every live key, and not the one deleted before
    assert_log_equals_table(pg_db, log, "t")
    # a follower rebuilt from the compacted log is right too
    assert cdc("log", "compact", "--config", str(config)).returncode == 0
    assert_log_equals_table(pg_db, log, "t")


def test_schema_changes_mid_stream(pg_db: Database, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, a int, b text, c int)")
    pg_db.execute("INSERT INTO t VALUES (1, 1, 'one', 1), (2, 2, 'two', 2)")
    config = write_config(tmp_path, pg_db, ["public.t"])
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    log = tmp_path / "log"
    capture = Capture(config, tmp_path / "capture.log").start()
    steps = [
        "ALTER TABLE t ADD COLUMN d text",
        "INSERT INTO t VALUES (3, 3, 'three', 3, 'dee')",
        "ALTER TABLE t ADD COLUMN e int NOT NULL DEFAULT 7",
        "UPDATE t SET a = 10 WHERE id = 1",
        "ALTER TABLE t DROP COLUMN c",
        "UPDATE t SET a = 20 WHERE id = 2",
        "ALTER TABLE t RENAME COLUMN b TO bee",
        "INSERT INTO t (id, a, bee) VALUES (4, 4, 'four')",
        "ALTER TABLE t ALTER COLUMN a TYPE numeric(10,2)",
        "UPDATE t SET a = 3.25 WHERE id = 3",
    ]
    for step in steps:
        pg_db.execute(step)
    wait_caught_up(pg_db, log)
    assert capture.alive()
    assert capture.terminate() == 0
    events = {e.key: e for e in read_topic(log, f"{pg_db.source}.public.t")
              if e.op != "tombstone" and e.position.parts[1] == 1}
    after = {key: e.envelope["after"] for key, e in events.items() if e.envelope}
    assert after['{"id":3}'] == {"id": 3, "a": "3.25", "bee": "three", "d": "dee", "e": 7}
    assert after['{"id":4}'] == {"id": 4, "a": 4, "bee": "four", "d": None, "e": 7}
    assert after['{"id":2}'] == {"id": 2, "a": 20, "b": "two", "d": None, "e": 7}
    assert after['{"id":1}'] == {"id": 1, "a": 10, "b": "one", "c": 1, "d": None, "e": 7}
    versions = SchemaStore(log).versions(f"{pg_db.source}.public.t-value")
    assert len(versions) >= 5  # snapshot, +d, +e, -c, b->bee, a retyped (some may coincide)


def test_status_warns_when_the_slot_retains_wal(pg_db: Database, pg_cluster: Any,
                                                tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(tmp_path, pg_db, ["public.t"], warn_retained_wal="64kB")
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    import psycopg

    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as other:  # capture is stopped
        other.execute("CREATE TABLE IF NOT EXISTS noise_status (x int)")
        other.execute("INSERT INTO noise_status SELECT generate_series(1, 20000)")
    result = cdc("status", "--config", str(config), "--json")
    row = json.loads(result.stdout)["sources"][0]
    assert row["retained_bytes"] > 64 * 1024
    text = output(cdc("status", "--config", str(config)))
    assert "retains" in text and "start `cdc capture`" in text, text
    lag = row["lag_bytes"]
    # once capture runs, heartbeats let the slot's confirmed position catch up
    capture = Capture(config, tmp_path / "capture.log").start()
    wait_caught_up(pg_db, tmp_path / "log")
    assert capture.terminate() == 0
    row = json.loads(cdc("status", "--config", str(config), "--json").stdout)["sources"][0]
    assert row["lag_bytes"] < min(lag, 64 * 1024), row
