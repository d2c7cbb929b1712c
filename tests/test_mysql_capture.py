"""MySQL/MariaDB capture end to end on a real throwaway MariaDB: bootstrap (consistent snapshot,
no lock) then streaming from exactly its position, positions in total order, PK changes, TRUNCATE,
resume after a restart of capture, and an unbootstrapped or misnamed source refused."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from cdc.position import Position
from tests.kafkakit import kafka_yaml
from tests.mykit import MyDatabase, wait_caught_up, write_config
from tests.pgkit import Capture, LogAt, cdc, latest_rows, output, read_topic


def _rows(db: MyDatabase, table: str) -> dict[str, dict[str, object]]:
    out = {}
    for ident, name, qty in db.execute(f"SELECT id, name, qty FROM {table}"):
        out[json.dumps({"id": ident}, separators=(",", ":"))] = {"id": ident, "name": name,
                                                                 "qty": qty}
    return out


@pytest.mark.parametrize("backend", ["local", "kafka"])
def test_bootstrap_then_stream_from_exactly_the_snapshot(mysql_db: MyDatabase, tmp_path: Path,
                                                          backend: str,
                                                          request: pytest.FixtureRequest) -> None:
    db = mysql_db
    db.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), qty INT)")
    db.execute("INSERT INTO items SELECT seq, CONCAT('item ', seq), seq FROM seq_1_to_3000")
    options = kafka_yaml(request.getfixturevalue("kafka_broker")) if backend == "kafka" else {}
    config = write_config(tmp_path, db, ["items"], log_options=options)
    log: LogAt = {**options, "path": str(tmp_path / "log")} if options else tmp_path / "log"
    stop = threading.Event()
    written = {"n": 0}

    def writer() -> None:  # concurrent writes while the snapshot runs
        conn = db.connect()
        with conn.cursor() as cursor:
            while not stop.is_set():
                n = written["n"] = written["n"] + 1
                cursor.execute("UPDATE items SET qty = qty + 1 WHERE id = %s", (n % 3000 + 1,))
                cursor.execute("INSERT INTO items VALUES (%s, 'new', 0)", (10_000 + n,))
                if n % 7 == 0:
                    cursor.execute("DELETE FROM items WHERE id = %s", (n % 3000 + 1,))
        conn.close()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    time.sleep(0.2)
    result = cdc("bootstrap", "--config", str(config), env=db.env())
    assert result.returncode == 0, output(result)
    assert "consistent snapshot at binlog" in result.stdout
    capture = Capture(config, tmp_path / "capture.log").start()
    time.sleep(1.0)
    stop.set()
    thread.join()
    db.execute("UPDATE items SET id = 99999 WHERE id = 10001")  # a primary-key change
    wait_caught_up(db, log)
    assert capture.terminate() == 0, (tmp_path / "capture.log").read_text()
    events = read_topic(log, f"{db.source}.{db.name}.items")
    snapshot = [e for e in events if e.op == "r"]
    streamed = [e for e in events if e.op != "r"]
    assert snapshot and streamed and written["n"] > 10
    assert max(e.position for e in snapshot) < min(e.position for e in streamed)
    # no duplicate: each position once per key and op (a delete and its tombstone share one)
    seen = {(e.position, e.key, e.op) for e in events}
    assert len(seen) == len(events)
    assert latest_rows(events) == _rows(db, "items")
    ops = [(e.op, e.key) for e in sorted(streamed, key=lambda e: (e.position, e.op))]
    assert ("d", '{"id":10001}') in ops and ("c", '{"id":99999}') in ops
    first = next(e for e in events if e.op == "c")
    assert first.envelope is not None
    source = first.envelope["source"]
    assert source["connector"] == "mysql" and source["db"] == db.name
    assert source["table"] == "items" and source["file"].rsplit(".", 1)[1].isdigit()
    assert source["gtid"] and source["server_id"] == 1
    assert first.envelope["transaction"]["id"] == source["gtid"]


def test_truncate_restart_and_resume(mysql_db: MyDatabase, tmp_path: Path) -> None:
    db = mysql_db
    db.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), qty INT)")
    db.execute("INSERT INTO items VALUES (1, 'a', 1), (2, 'b', 2)")
    config = write_config(tmp_path, db, ["items"])
    assert cdc("bootstrap", "--config", str(config), env=db.env()).returncode == 0
    capture = Capture(config, tmp_path / "capture.log").start()
    db.execute("INSERT INTO items VALUES (3, 'c', 3)")
    db.execute("TRUNCATE TABLE items")
    db.execute("INSERT INTO items VALUES (4, 'd', 4)")
    wait_caught_up(db, tmp_path / "log")
    assert capture.terminate() == 0
    db.execute("INSERT INTO items VALUES (5, 'e', 5)")  # while capture is stopped
    db.execute("UPDATE items SET qty = 40 WHERE id = 4")
    capture = Capture(config, tmp_path / "capture2.log").start()
    wait_caught_up(db, tmp_path / "log")
    assert capture.terminate() == 0
    events = read_topic(tmp_path / "log", f"{db.source}.{db.name}.items")
    assert latest_rows(events) == _rows(db, "items")
    truncate = [e for e in events if e.op == "t"]
    assert len(truncate) == 1
    tombstoned = {e.key for e in events if e.op == "tombstone" and e.position == truncate[0]
                  .position}
    assert tombstoned == {'{"id":1}', '{"id":2}', '{"id":3}'}
    positions = [e.position for e in events if e.op in ("c", "u")]
    assert len(positions) == len(set(positions))  # nothing delivered twice after the restart
    assert all(p.kind == "mysql" for p in positions)
    status = cdc("status", "--config", str(config), "--json", env=db.env())
    row = json.loads(status.stdout)["sources"][0]
    assert row["kind"] == "mysql" and row["offset_state"] == "streaming", row
    assert row["lag_bytes"] == 0 or row["lag_bytes"] < 4096, row


def test_capture_before_bootstrap_and_unknown_table_are_refused(mysql_db: MyDatabase,
                                                                 tmp_path: Path) -> None:
    db = mysql_db
    db.execute("CREATE TABLE items (id INT PRIMARY KEY)")
    config = write_config(tmp_path, db, ["items"])
    result = cdc("capture", "--config", str(config), env=db.env())
    assert result.returncode != 0 and "cdc bootstrap" in output(result)
    config = write_config(tmp_path, db, ["missing"])
    result = cdc("bootstrap", "--config", str(config), env=db.env())
    assert result.returncode != 0
    assert "does not exist" in output(result) and "Traceback" not in output(result)
    assert db.password not in output(result)
    assert Position.mysql(1, 2, 3) < Position.mysql(1, 3, 0)


def test_every_type_is_the_same_from_snapshot_and_stream(mysql_db: MyDatabase,
                                                         tmp_path: Path) -> None:
    """Through the whole connector (not just the converters): rows read by the bootstrap and
    the same rows read from the binlog give the same after images, as stated literally in
    tests/test_mysql_types.py."""
    from tests.test_mysql_types import DDL, EXPECTED, MAX_ROW, MIN_ROW, NULL_ROW, TABLE

    db = mysql_db
    db.execute("SET SESSION sql_mode = ''")
    db.script("SET SESSION sql_mode = ''; " + DDL)

    def insert(offset: int) -> None:
        conn = db.connect()
        with conn.cursor() as cursor:
            cursor.execute("SET SESSION sql_mode = ''")
            for row in (MAX_ROW, MIN_ROW, NULL_ROW):
                row = {**row, "id": row["id"] + offset}
                names = ", ".join("`" + n.replace("`", "``") + "`" for n in row)
                marks = ", ".join(["%s"] * len(row))
                cursor.execute(f"INSERT INTO `{TABLE}` ({names}) VALUES ({marks})",
                               list(row.values()))
        conn.close()

    insert(0)
    config = write_config(tmp_path, db, [f'{db.name}."{TABLE}"'])
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    capture = Capture(config, tmp_path / "capture.log").start()
    insert(10)
    wait_caught_up(db, tmp_path / "log")
    assert capture.terminate() == 0, (tmp_path / "capture.log").read_text()
    events = {e.key: e for e in read_topic(tmp_path / "log", f"{db.source}.{db.name}.{TABLE}")}
    for ident, expected in EXPECTED.items():
        snap = events[f'{{"id":{ident}}}']
        streamed = events[f'{{"id":{ident + 10}}}']
        assert snap.op == "r" and streamed.op == "c"
        assert snap.envelope and streamed.envelope
        assert {**snap.envelope["after"], "id": ident} == expected
        assert {**streamed.envelope["after"], "id": ident} == expected
