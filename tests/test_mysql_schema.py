"""Schema changes mid-stream on MariaDB: each DDL kind makes a new schema version without
stopping capture, and the log's latest state per key equals the table afterwards. Column names of
old events come from their own table maps, never from today's information_schema."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cdc.log.schemas import SchemaStore
from tests.mykit import MyDatabase, wait_caught_up, write_config
from tests.pgkit import Capture, LoggedEvent, cdc, latest_rows, output, read_topic


@contextmanager
def capturing(db: MyDatabase, tmp_path: Path, tables: list[str]) -> Iterator[Path]:
    config = write_config(tmp_path, db, tables)
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    capture = Capture(config, tmp_path / "capture.log").start()
    try:
        yield tmp_path / "log"
        wait_caught_up(db, tmp_path / "log")
        assert capture.alive(), (tmp_path / "capture.log").read_text()
    finally:
        code = capture.terminate()
    assert code == 0, (tmp_path / "capture.log").read_text()


def table_json(db: MyDatabase, table: str) -> dict[str, dict[str, Any]]:
    conn = db.connect()
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT * FROM {table}")
            names = [d[0] for d in cursor.description]
            rows = cursor.fetchall()
    finally:
        conn.close()
    return {f'{{"id":{row[0]}}}': {n: (str(v) if v is not None and not isinstance(v, int)
                                        else v) for n, v in zip(names, row, strict=True)}
            for row in rows}


def normalised(events: list[LoggedEvent]) -> dict[str, dict[str, Any]]:
    return {key: {n: (str(v) if v is not None and not isinstance(v, int) else v)
                  for n, v in row.items()} for key, row in latest_rows(events).items()}


def columns_of(event: LoggedEvent) -> list[str]:
    assert event.envelope is not None
    image = event.envelope["after"] or event.envelope["before"]
    return list(image)


def test_add_drop_rename_modify_column(mysql_db: MyDatabase, tmp_path: Path) -> None:
    db = mysql_db
    db.execute("CREATE TABLE t (id INT PRIMARY KEY, a VARCHAR(10), b INT)")
    db.execute("INSERT INTO t VALUES (1, 'one', 1)")
    with capturing(db, tmp_path, ["t"]) as log:
        db.execute("INSERT INTO t VALUES (2, 'two', 2)")
        db.execute("ALTER TABLE t ADD COLUMN c DECIMAL(10,2) DEFAULT 1.50")
        db.execute("INSERT INTO t VALUES (3, 'three', 3, 3.25)")
        db.execute("UPDATE t SET b = 10 WHERE id = 1")  # an old row, the new shape
        db.execute("ALTER TABLE t DROP COLUMN a")
        db.execute("INSERT INTO t VALUES (4, 4, 4.00)")
        db.execute("ALTER TABLE t RENAME COLUMN b TO bee")
        db.execute("INSERT INTO t VALUES (5, 5, 5.00)")
        db.execute("ALTER TABLE t MODIFY COLUMN bee BIGINT")
        db.execute("INSERT INTO t VALUES (6, 9000000000, 6.00)")
    events = read_topic(log, f"{db.source}.{db.name}.t")
    by_key = {e.key: e for e in events if e.op in ("r", "c")}
    assert columns_of(by_key['{"id":1}']) == ["id", "a", "b"]
    assert columns_of(by_key['{"id":2}']) == ["id", "a", "b"]  # from its own table map
    assert columns_of(by_key['{"id":3}']) == ["id", "a", "b", "c"]
    assert by_key['{"id":3}'].envelope["after"]["c"] == "3.25"  # type: ignore[index]
    assert columns_of(by_key['{"id":4}']) == ["id", "b", "c"]
    assert columns_of(by_key['{"id":5}']) == ["id", "bee", "c"]
    assert by_key['{"id":6}'].envelope["after"]["bee"] == 9000000000  # type: ignore[index]
    # an ALTER logs no row events (MySQL rewrites the table silently, as Debezium sees it too):
    # each key's latest record is the image of its last change, in the shape of that moment
    assert normalised(events) == {
        '{"id":1}': {"id": 1, "a": "one", "b": 10, "c": "1.50"},
        '{"id":2}': {"id": 2, "a": "two", "b": 2},
        '{"id":3}': {"id": 3, "a": "three", "b": 3, "c": "3.25"},
        '{"id":4}': {"id": 4, "b": 4, "c": "4.00"},
        '{"id":5}': {"id": 5, "bee": 5, "c": "5.00"},
        '{"id":6}': {"id": 6, "bee": 9000000000, "c": "6.00"},
    }
    table = table_json(db, "t")
    assert set(table) == set(normalised(events))
    assert normalised(events)['{"id":6}'] == table['{"id":6}']
    versions = [s for s in SchemaStore(log).subjects() if s.endswith(".t-value")]
    assert versions, "a value subject for the table"
    assert len(SchemaStore(log).versions(versions[0])) >= 5  # one per shape


def test_drop_and_recreate_table_and_unrelated_ddl(mysql_db: MyDatabase, tmp_path: Path) -> None:
    db = mysql_db
    db.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))")
    db.execute("CREATE TABLE other (id INT PRIMARY KEY)")
    db.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    with capturing(db, tmp_path, ["t"]) as log:
        db.execute("CREATE TABLE brand_new (id INT PRIMARY KEY, x TEXT)")  # not captured
        db.execute("INSERT INTO brand_new VALUES (1, 'x')")
        db.execute("ALTER TABLE other ADD COLUMN y INT")
        db.execute("DROP TABLE t")
        db.execute("CREATE TABLE t (id INT PRIMARY KEY, w INT)")  # a new table, same name
        db.execute("INSERT INTO t VALUES (7, 70)")
    events = read_topic(log, f"{db.source}.{db.name}.t")
    assert [e.op for e in events if e.op == "t"] == ["t"]  # the drop
    assert normalised(events) == table_json(db, "t") == {'{"id":7}': {"id": 7, "w": 70}}
    created = next(e for e in events if e.key == '{"id":7}' and e.op == "c")
    assert columns_of(created) == ["id", "w"]
    assert not read_topic(log, f"{db.source}.{db.name}.brand_new")


def test_changes_after_unrelated_statements_are_still_captured(mysql_db: MyDatabase,
                                                                tmp_path: Path) -> None:
    """A statement that is no DML of a captured table (a CREATE TABLE of another table, a
    GRANT) must not make capture forget the captured tables' table maps: the binlog library
    sends a table id's map only once, so the changes after it were dropped without a word."""
    db = mysql_db
    db.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    db.execute("INSERT INTO t VALUES (1, 1)")
    with capturing(db, tmp_path, ["t"]) as log:
        db.execute("UPDATE t SET v = 2")  # capture maps t's table id
        db.execute("CREATE TABLE unrelated (id INT PRIMARY KEY)")
        db.execute(f"GRANT SELECT ON {db.name}.unrelated TO '{db.user}'@'%'")
        db.execute("UPDATE t SET v = 3")
        db.execute("INSERT INTO t VALUES (2, 5)")
    events = read_topic(log, f"{db.source}.{db.name}.t")
    assert normalised(events) == table_json(db, "t") == {
        '{"id":1}': {"id": 1, "v": 3}, '{"id":2}': {"id": 2, "v": 5}}
