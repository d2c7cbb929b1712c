"""MySQL/MariaDB capture under faults and odd settings, each against a real server: the server in
another time zone, a session that switches itself to STATEMENT format or a MINIMAL row image, the
server restarted mid-stream, the stored binlog purged, RESET MASTER, a clashing server_id. Every
refusal names the problem and the fix; nothing is skipped silently; no password is printed."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pymysql
from pymysqlreplication import BinLogStreamReader

from tests.kills import Watch
from tests.mykit import MyDatabase, binlog_order, new_database, wait_caught_up, write_config
from tests.pgkit import Capture, cdc, latest_rows, output, read_topic, stored_offset, wait_for


def _bootstrap(db: MyDatabase, tmp_path: Path, tables: list[str]) -> Path:
    config = write_config(tmp_path, db, tables)
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    return config


def _exits(capture: Capture, timeout: float = 30) -> int:
    """The capture's exit code; killed (and the test failed) if it runs past ``timeout``."""
    assert capture.process is not None
    try:
        return capture.process.wait(timeout)
    except subprocess.TimeoutExpired:
        capture.kill()
        raise AssertionError(f"capture still ran after {timeout} s") from None


def test_server_time_zone_does_not_change_values(mariadb_factory, tmp_path: Path) -> None:
    server = mariadb_factory(time_zones=True,
                             options={"default_time_zone": "America/New_York"})
    db = new_database(server)
    try:
        db.execute("CREATE TABLE t (id INT PRIMARY KEY, ts TIMESTAMP(6) NULL, dt DATETIME(6))")
        row = "'2024-03-10 06:59:59.123456', '2024-03-10 02:30:00.5'"
        db.execute(f"INSERT INTO t VALUES (1, {row})")  # read by the snapshot
        config = _bootstrap(db, tmp_path, ["t"])
        capture = Capture(config, tmp_path / "capture.log").start()
        db.execute(f"INSERT INTO t VALUES (2, {row})")  # read from the binlog
        wait_caught_up(db, tmp_path / "log")
        assert capture.terminate() == 0
        events = {e.key: e for e in read_topic(tmp_path / "log", f"{db.source}.{db.name}.t")}
        snap, streamed = events['{"id":1}'], events['{"id":2}']
        assert snap.op == "r" and streamed.op == "c"
        assert snap.envelope and streamed.envelope
        # the session of the writer is in New York: 06:59:59 EDT... is 10:59:59 UTC (DST began
        # at 02:00 that day; 06:59 is after it: UTC-4)
        assert snap.envelope["after"]["ts"] == "2024-03-10T10:59:59.123456Z"
        assert snap.envelope["after"]["dt"] == "2024-03-10T02:30:00.500000"
        assert {k: v for k, v in streamed.envelope["after"].items() if k != "id"} == {
            k: v for k, v in snap.envelope["after"].items() if k != "id"}
    finally:
        db.drop()


def test_statement_format_session_stops_capture(mysql_db: MyDatabase, tmp_path: Path) -> None:
    db = mysql_db
    db.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    config = _bootstrap(db, tmp_path, ["t"])
    capture = Capture(config, tmp_path / "capture.log").start()
    db.execute("INSERT INTO t VALUES (1, 1)")
    wait_caught_up(db, tmp_path / "log")
    conn = db.connect()
    with conn.cursor() as cursor:
        cursor.execute("SET SESSION binlog_format = 'STATEMENT'")
        cursor.execute("UPDATE t SET v = 2 WHERE id = 1")
    conn.close()
    assert _exits(capture) != 0
    text = (tmp_path / "capture.log").read_text()
    assert "binlog_format" in text and "STATEMENT" in text and "re-bootstrap" in text, text
    assert "Traceback" not in text and db.password not in text
    before = stored_offset(tmp_path / "log", db.source)
    # refused again on restart: the statement is never skipped
    again = Capture(config, tmp_path / "capture2.log").start()
    assert _exits(again) != 0
    assert stored_offset(tmp_path / "log", db.source) == before


def test_minimal_row_image_session_stops_capture(mysql_db: MyDatabase, tmp_path: Path) -> None:
    db = mysql_db
    db.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT, w TEXT)")
    db.execute("INSERT INTO t VALUES (1, 1, 'keep me')")
    config = _bootstrap(db, tmp_path, ["t"])
    capture = Capture(config, tmp_path / "capture.log").start()
    conn = db.connect()
    with conn.cursor() as cursor:
        cursor.execute("SET SESSION binlog_row_image = 'MINIMAL'")
        cursor.execute("UPDATE t SET v = 2 WHERE id = 1")
    conn.close()
    assert _exits(capture) != 0
    text = (tmp_path / "capture.log").read_text()
    assert "not a whole row image" in text and "binlog_row_image" in text, text
    assert "Traceback" not in text


def test_server_restart_mid_stream_loses_nothing(mariadb_factory, tmp_path: Path) -> None:
    server = mariadb_factory()
    db = new_database(server)
    try:
        db.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
        config = _bootstrap(db, tmp_path, ["t"])
        capture = Capture(config, tmp_path / "capture.log").start()
        stop = threading.Event()
        done = {"n": 0}
        grouped = threading.Event()  # from the second kill on: transactions of 20 writes

        def writer() -> None:
            while not stop.is_set():
                try:
                    conn = db.connect()
                    with conn.cursor() as cursor:
                        while not stop.is_set():
                            size = 20 if grouped.is_set() else 1
                            if size > 1:
                                cursor.execute("BEGIN")
                            for _ in range(size):
                                n = done["n"] + 1
                                cursor.execute("REPLACE INTO t VALUES (%s, %s)", (n % 50, n))
                                done["n"] = n
                            if size > 1:
                                cursor.execute("COMMIT")
                except pymysql.err.MySQLError:
                    time.sleep(0.1)  # the server is restarting

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        topic = f"{db.source}.{db.name}.t"
        log = tmp_path / "log"

        def stored() -> tuple[int, int]:
            return tuple((stored_offset(log, db.source) or {}).get("order") or (0, 0))  # type: ignore

        # SIGKILL mid-stream: committed transactions survive (flushed to the OS); a kill lands
        # in flight when the server's binlog grew in the second before and held changes past
        # the position capture had stored at that moment (where it would resume)
        with Watch("MariaDB server", lambda: binlog_order(db)) as watch:
            for phase in ("autocommit writes", "mid-transaction writes"):
                # mid-stream: capture has logged some of the writes (its start-up takes seconds
                # on a loaded machine; killed before it connects, it would have nothing to
                # reconnect)
                logged = len(read_topic(log, topic))
                wait_for(lambda n=logged: len(read_topic(log, topic)) > n, 90,
                         "capture streaming")
                watch.wait_moving()
                # the committed position is read just before the SIGKILL: capture keeps
                # draining what the server had sent it (and commits it) after the server died
                watch.kill(phase, server.kill, stored, aim=30, read_before=True)
                time.sleep(0.5)
                server.start()
                grouped.set()
        stop.set()
        thread.join()
        wait_caught_up(db, tmp_path / "log", timeout=90)
        assert capture.alive(), (tmp_path / "capture.log").read_text()
        assert capture.terminate() == 0
        text = (tmp_path / "capture.log").read_text()
        assert "reconnecting" in text, text
        events = read_topic(tmp_path / "log", f"{db.source}.{db.name}.t")
        table = {f'{{"id":{i}}}': {"id": i, "v": v} for i, v in db.execute("SELECT id, v FROM t")}
        assert latest_rows(events) == table and done["n"] > 0
    finally:
        db.drop()


def test_purged_binlog_and_reset_master_are_refused(mariadb_factory, tmp_path: Path) -> None:
    server = mariadb_factory()
    db = new_database(server)
    try:
        db.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        config = _bootstrap(db, tmp_path, ["t"])
        db.execute("INSERT INTO t VALUES (1)")
        stored = (stored_offset(tmp_path / "log", db.source) or {})["file"]

        def purged() -> bool:  # MariaDB keeps a binlog InnoDB still needs for recovery
            server.execute("FLUSH BINARY LOGS")
            newest = server.binlog_position()[0]
            server.execute(f"PURGE BINARY LOGS TO '{newest}'")
            return stored not in {row[0] for row in server.execute("SHOW BINARY LOGS")}

        wait_for(purged, 60, "the stored binlog to be purged", interval=0.5)
        result = cdc("capture", "--config", str(config))
        assert result.returncode != 0
        assert "was purged" in output(result) and "cdc bootstrap" in output(result)
        # bootstrap again, then RESET MASTER: the binlog sequence goes backwards
        config = _bootstrap(db, tmp_path, ["t"])
        server.execute("FLUSH BINARY LOGS")
        capture = Capture(config, tmp_path / "capture.log").start()
        db.execute("INSERT INTO t VALUES (2)")
        wait_caught_up(db, tmp_path / "log")
        assert capture.terminate() == 0
        server.execute("RESET MASTER")
        db.execute("INSERT INTO t VALUES (3)")
        result = cdc("capture", "--config", str(config))
        assert result.returncode != 0
        assert "RESET MASTER" in output(result) and "cdc bootstrap" in output(result), \
            output(result)
    finally:
        db.drop()


def test_clashing_server_id_stops_capture(mysql_db: MyDatabase, tmp_path: Path) -> None:
    db = mysql_db
    db.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    config = _bootstrap(db, tmp_path, ["t"])
    capture = Capture(config, tmp_path / "capture.log").start()
    wait_for(lambda: "streaming from" in (tmp_path / "capture.log").read_text(), 30,
             "capture to stream")
    time.sleep(0.5)
    other = BinLogStreamReader(connection_settings=db.capture_settings(),
                               server_id=db.server_id, blocking=True)
    try:
        next(iter(other))  # registering with the same id kicks capture's dump connection
        db.execute("INSERT INTO t VALUES (1)")
        assert _exits(capture, 60) != 0
    finally:
        other.close()
    text = (tmp_path / "capture.log").read_text()
    assert "server_id" in text and "unique" in text, text


def test_renaming_a_captured_table_away_stops_capture(mysql_db: MyDatabase,
                                                      tmp_path: Path) -> None:
    db = mysql_db
    db.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    db.execute("CREATE TABLE other (id INT PRIMARY KEY)")
    config = _bootstrap(db, tmp_path, ["t"])
    capture = Capture(config, tmp_path / "capture.log").start()
    db.execute("RENAME TABLE other TO other2")  # not captured: fine
    db.execute("INSERT INTO t VALUES (1)")
    wait_caught_up(db, tmp_path / "log")
    assert capture.alive()
    db.execute("ALTER TABLE t ADD COLUMN v INT, RENAME TO t_old")
    assert _exits(capture) != 0
    text = (tmp_path / "capture.log").read_text()
    assert f"captured table {db.name}.t was renamed to {db.name}.t_old" in text, text
    assert "Traceback" not in text


def test_table_map_without_column_names_stops_capture(mariadb_factory, tmp_path: Path) -> None:
    server = mariadb_factory()
    db = new_database(server)
    try:
        db.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
        config = _bootstrap(db, tmp_path, ["t"])
        capture = Capture(config, tmp_path / "capture.log").start()
        db.execute("INSERT INTO t VALUES (1, 1)")
        wait_caught_up(db, tmp_path / "log")
        assert capture.terminate() == 0
        # written while capture is stopped: the first table map capture then reads has no names
        # (a running capture would go on decoding with the names of the table's earlier map)
        server.execute("SET GLOBAL binlog_row_metadata = 'MINIMAL'")
        db.execute("INSERT INTO t VALUES (2, 2)")
        server.execute("SET GLOBAL binlog_row_metadata = 'FULL'")  # too late for that event
        capture = Capture(config, tmp_path / "capture.log").start()
        assert _exits(capture) != 0
        text = (tmp_path / "capture.log").read_text()
        assert "carries no column names" in text and "binlog.0" in text, text
        assert "binlog_row_metadata" in text and "Traceback" not in text
    finally:
        db.drop()


def test_unsupported_column_added_mid_stream_stops_capture(mysql_db: MyDatabase,
                                                           tmp_path: Path) -> None:
    db = mysql_db
    db.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    config = _bootstrap(db, tmp_path, ["t"])
    capture = Capture(config, tmp_path / "capture.log").start()
    db.execute("ALTER TABLE t ADD COLUMN g POINT")
    db.execute("INSERT INTO t VALUES (1, POINT(1, 2))")
    assert _exits(capture) != 0
    text = (tmp_path / "capture.log").read_text()
    assert f"{db.name}.t.g" in text and "Traceback" not in text, text
    assert stored_offset(tmp_path / "log", db.source) is not None
