"""Tools nobody here wrote read the log: Apache Kafka Connect (standalone, from Maven's jars)
running Debezium's own JDBC sink connector with Kafka's JsonConverter consumes the topics of a
log in ``format: json`` into a PostgreSQL target, and the target's tables equal the leader's —
under updates, deletes, a primary-key change, a TRUNCATE, an unchanged TOAST column and an
``ADD COLUMN`` mid-run."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_app.servers.connect import ThrowawayConnect
from tests.kafkakit import kafka_yaml
from tests.pgkit import Capture, Database, cdc, new_database, output, wait_caught_up, write_config

pytestmark = pytest.mark.timeout(600)

LEADER_SCHEMA = """
CREATE TABLE orders (id int PRIMARY KEY, customer text NOT NULL, amount numeric(10,2),
                     placed timestamp, note text, big text);
CREATE TABLE lines (order_id int, line int, sku varchar(20), qty bigint,
                    PRIMARY KEY (order_id, line));
"""


def _sink(name: str, target: Database, topics: list[str]) -> dict[str, str]:
    """Debezium's JDBC sink as its documentation sets it up for a Debezium source."""
    return {
        "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
        "tasks.max": "1",
        "connection.url": f"jdbc:postgresql://127.0.0.1:{target.pg.port}/{target.name}",
        "connection.username": "postgres", "connection.password": "unused",
        "insert.mode": "upsert", "delete.enabled": "true",
        # a TRUNCATE reaches the sink as a delete per key, each in its key's partition order;
        # the one `t` record sits in one partition and would be applied out of order
        "truncate.enabled": "false",
        "primary.key.mode": "record_key", "schema.evolution": "basic",
        "collection.name.format": "${source.table}", "use.time.zone": "UTC",
        "topics": ",".join(topics),
    }


def _rows(db: Database, table: str, key: str) -> list[Any]:
    with psycopg.connect(db.dsn(), autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if exists is None or exists[0] is None:
            return []
        return [row[0] for row in conn.execute(
            f"SELECT to_jsonb(t) FROM {table} t ORDER BY {key}").fetchall()]


def _workload(db: Database, rng: random.Random) -> None:
    big = "".join(rng.choice("abcdefghij0123456789") for _ in range(6000))  # TOASTed
    with db.connect() as conn:
        for i in range(1, 41):
            conn.execute("INSERT INTO orders VALUES (%s, %s, %s, now(), %s, %s)",
                         (i, f"c{i % 7}", f"{i * 3.25:.2f}", f"n{i}", big if i % 5 == 0 else None))
            conn.execute("INSERT INTO lines VALUES (%s, 1, %s, %s), (%s, 2, %s, %s)",
                         (i, f"sku{i}", i, i, f"sku{i}b", 2 * i))
        for i in range(1, 41, 3):
            conn.execute("UPDATE orders SET amount = amount + 1, note = 'upd' WHERE id = %s",
                         (i,))
        # the TOASTed column unchanged: pgoutput leaves it out; the log fills it in
        conn.execute("UPDATE orders SET note = 'toast kept' WHERE id IN (5, 10, 15)")
        conn.execute("DELETE FROM orders WHERE id IN (2, 4, 8)")
        conn.execute("UPDATE orders SET id = 1000 + id WHERE id = 7")  # a key change
        conn.execute("DELETE FROM lines WHERE order_id = 3")
        conn.execute("ALTER TABLE orders ADD COLUMN status text")  # mid-run
        conn.execute("UPDATE orders SET status = 'shipped' WHERE id % 2 = 1")
        conn.execute("INSERT INTO orders (id, customer, status) VALUES (500, 'late', 'new')")
        conn.execute("TRUNCATE lines")
        conn.execute("INSERT INTO lines VALUES (1, 1, 'after-truncate', 9)")
        conn.execute("UPDATE lines SET qty = 3000000000 WHERE order_id = 1")


def test_debezium_jdbc_sink_through_kafka_connect_copies_a_postgres_source(
        pg_cluster: Any, pg_db: Database, kafka_broker: Any, tmp_path: Path) -> None:
    pg_db.execute(LEADER_SCHEMA)
    options = {**kafka_yaml(kafka_broker), "format": "json"}
    config = write_config(tmp_path, pg_db, ["public.orders", "public.lines"],
                          log_options=options)
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    capture = Capture(config, tmp_path / "capture.log").start()
    target = new_database(pg_cluster)
    topics = [f"{pg_db.source}.public.orders", f"{pg_db.source}.public.lines"]
    try:
        with ThrowawayConnect(kafka_broker.bootstrap_servers) as connect:
            connect.add("pg-sink", _sink("pg-sink", target, topics))
            connect.wait_running("pg-sink", timeout=120)
            _workload(pg_db, random.Random(30))
            wait_caught_up(pg_db, {**options, "path": str(tmp_path / "log")}, 120)
            deadline = time.monotonic() + 120
            while True:
                connect.check("pg-sink")
                same = all(_rows(target, t, k) == _rows(pg_db, t, k) for t, k in
                           (("orders", "id"), ("lines", "order_id, line")))
                if same or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            for table, key in (("orders", "id"), ("lines", "order_id, line")):
                leader, copy = _rows(pg_db, table, key), _rows(target, table, key)
                assert copy == leader, (table, connect.log_tail())
            assert len(_rows(target, "orders", "id")) == 38
            assert _rows(target, "lines", "order_id, line")[0]["sku"] == "after-truncate"
    finally:
        capture.terminate()
        target.drop()
