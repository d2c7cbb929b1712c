"""PostgreSQL capture against a real throwaway cluster: bootstrap, streaming, stop/restart."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.pgkit import (
    LOAD_SCHEMA,
    Capture,
    Database,
    Load,
    cdc,
    check_against_audit,
    latest_rows,
    output,
    read_topic,
    stored_offset,
    table_rows,
    wait_caught_up,
    write_config,
)

pytestmark = pytest.mark.timeout(300)


def _seed(db: Database, rows: int) -> None:
    db.execute(LOAD_SCHEMA)
    db.execute("INSERT INTO items (id, v, amount, note) SELECT g, 1, g * 1.25, repeat('x', 30) "
               "FROM generate_series(1, %s) g", (rows,))
    db.execute("INSERT INTO audit (id, v, op) SELECT g, 1, 'c' FROM generate_series(1, %s) g",
               (rows,))


def test_bootstrap_under_load_then_capture_has_no_gap_and_no_duplicate(
        pg_db: Database, tmp_path: Path) -> None:
    _seed(pg_db, 20_000)
    config = write_config(tmp_path, pg_db, ["public.items"])
    # no deletes: a key created and deleted before the snapshot leaves no trace to check
    load = Load(pg_db, deletes=False).start()
    time.sleep(0.3)
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    assert "20,0" in result.stdout or "rows from 1 table" in result.stdout
    capture = Capture(config, tmp_path / "capture.log").start()
    time.sleep(1.5)
    load.finish()
    assert load.committed > 20
    wait_caught_up(pg_db, tmp_path / "log")
    assert capture.terminate() == 0, (tmp_path / "capture.log").read_text()
    events = read_topic(tmp_path / "log", f"{pg_db.source}.public.items")
    snapshot = [e for e in events if e.op == "r"]
    streamed = [e for e in events if e.op in ("c", "u", "d")]
    assert len(snapshot) >= 20_000 and streamed
    assert max(e.position for e in snapshot) < min(e.position for e in streamed)
    figures = check_against_audit(pg_db, events)
    assert figures["duplicates"] == 0  # nothing was killed: nothing may repeat


def test_sigterm_drains_and_slot_matches_log(pg_db: Database, tmp_path: Path) -> None:
    _seed(pg_db, 100)
    config = write_config(tmp_path, pg_db, ["public.items"])
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    capture = Capture(config, tmp_path / "capture.log").start()
    load = Load(pg_db, threads=1).start()
    time.sleep(1.0)
    assert capture.terminate() == 0
    load.finish()
    stored = stored_offset(tmp_path / "log", pg_db.source)
    slot = pg_db.slot()
    assert stored and slot and not slot["active"]
    # the server was told exactly what the log holds: never more
    assert slot["confirmed"] == stored["lsn"]
    capture = Capture(config, tmp_path / "capture.log").start()
    wait_caught_up(pg_db, tmp_path / "log")
    assert capture.terminate() == 0
    check_against_audit(pg_db, read_topic(tmp_path / "log", f"{pg_db.source}.public.items"))


def test_key_change_truncate_and_status(pg_db: Database, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, name text)")
    pg_db.execute("INSERT INTO t VALUES (1, 'one'), (2, 'two')")
    config = write_config(tmp_path, pg_db, ["public.t"])
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    capture = Capture(config, tmp_path / "capture.log").start()
    pg_db.execute("UPDATE t SET id = 10 WHERE id = 1")
    pg_db.execute("TRUNCATE t")
    pg_db.execute("INSERT INTO t VALUES (3, 'three')")
    wait_caught_up(pg_db, tmp_path / "log")
    status = cdc("status", "--config", str(config), "--json")
    assert status.returncode == 0, output(status)
    row = json.loads(status.stdout)["sources"][0]
    assert row["capture"] == "running" and row["slot_exists"] and row["lag_bytes"] >= 0
    assert row["events"] >= 4
    table = cdc("status", "--config", str(config))
    assert pg_db.source in table.stdout and "running" in table.stdout
    assert capture.terminate() == 0
    events = read_topic(tmp_path / "log", f"{pg_db.source}.public.t")
    streamed = sorted((e for e in events if e.op != "r"), key=lambda e: (e.position, e.op))
    ops = [(e.op, e.key) for e in streamed]
    assert ("d", '{"id":1}') in ops and ("tombstone", '{"id":1}') in ops
    assert ("c", '{"id":10}') in ops and ("t", "{}") in ops and ("c", '{"id":3}') in ops
    delete = next(e for e in streamed if e.op == "d")
    create = next(e for e in streamed if e.op == "c" and e.key == '{"id":10}')
    assert delete.position < create.position  # the old key goes first
    stopped = cdc("status", "--config", str(config), "--json")
    assert json.loads(stopped.stdout)["sources"][0]["capture"] == "stopped"


def test_idle_tables_still_advance_the_slot(pg_db: Database, pg_cluster, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(tmp_path, pg_db, ["public.t"], heartbeat_interval="200ms")
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    capture = Capture(config, tmp_path / "capture.log").start()
    before = pg_db.slot()
    assert before is not None
    import psycopg

    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as other:  # another database
        other.execute("CREATE TABLE IF NOT EXISTS noise (x int)")
        other.execute("INSERT INTO noise SELECT generate_series(1, 10000)")
    target = pg_db.current_lsn()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        slot = pg_db.slot()
        if slot and slot["confirmed"] and slot["confirmed"] >= target:
            break
        time.sleep(0.1)
    assert capture.terminate() == 0
    slot = pg_db.slot()
    assert slot and slot["confirmed"] >= target > before["confirmed"]


def test_no_primary_key_with_replica_identity_full_and_configured_key(
        pg_db: Database, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE nokey (code text NOT NULL, qty int)")
    pg_db.execute("ALTER TABLE nokey REPLICA IDENTITY FULL")
    pg_db.execute("INSERT INTO nokey VALUES ('a', 1), ('b', 2)")
    config = write_config(tmp_path, pg_db, ["public.nokey"], keys={"public.nokey": ["code"]})
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    capture = Capture(config, tmp_path / "capture.log").start()
    pg_db.execute("UPDATE nokey SET qty = 5 WHERE code = 'a'")
    pg_db.execute("DELETE FROM nokey WHERE code = 'b'")
    wait_caught_up(pg_db, tmp_path / "log")
    assert capture.terminate() == 0
    rows = latest_rows(read_topic(tmp_path / "log", f"{pg_db.source}.public.nokey"))
    assert rows == {'{"code":"a"}': {"code": "a", "qty": 5}}
    assert table_rows(pg_db, "nokey", key="code") == rows
