"""Tools nobody here wrote read the log: Apache Kafka Connect (standalone, from Maven's jars)
running Debezium's own JDBC sink connector with Kafka's JsonConverter consumes the topics of a
log in ``format: json`` — of a PostgreSQL source and of a MariaDB source — into a PostgreSQL
target, and the target's tables equal the leader's, every row: under updates, deletes, a
primary-key change, a TRUNCATE, an unchanged TOAST column (PostgreSQL) and an ``ADD COLUMN``
mid-run. One worker JVM for the module."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_app.servers.connect import ThrowawayConnect
from tests.kafkakit import kafka_yaml, latest
from tests.pgkit import Capture, Database, cdc, new_database, output, wait_caught_up, write_config

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def connect_worker(kafka_broker: Any) -> Any:
    """One Kafka Connect worker (a JVM) for the module's tests; each adds its own connector."""
    with ThrowawayConnect(kafka_broker.bootstrap_servers) as worker:
        yield worker

LEADER_SCHEMA = """
CREATE TABLE orders (id int PRIMARY KEY, customer text NOT NULL, amount numeric(10,2),
                     placed timestamp(3), note text, big text);
CREATE TABLE lines (order_id int, line int, sku varchar(20), qty bigint,
                    PRIMARY KEY (order_id, line));
"""


def _sink(target: Database, topics: list[str]) -> dict[str, str]:
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
        # a key column retyped mid-run, then a row from before the retype deleted
        conn.execute("ALTER TABLE orders ALTER COLUMN id TYPE bigint")
        conn.execute("DELETE FROM orders WHERE id = 1")


def _check_key_one_kept_its_bytes(broker: Any, topic: str) -> None:
    """Every record of key ``id = 1`` in Kafka — from before and after ``INT`` → ``BIGINT`` —
    has the same key bytes, and the last is the tombstone: compaction keeps it alone."""
    import json

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "retype",
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    records, ended = [], set()
    while len(ended) < len(partitions):
        for message in consumer.consume(500, timeout=1.0):
            if message.error():
                ended.add(message.partition())
            elif json.loads(message.key())["payload"] == {"id": 1}:
                records.append((message.offset(), message.key(), message.value()))
    consumer.close()
    records.sort()
    values = [json.loads(v)["payload"]["op"] if v else None for _, _, v in records]
    assert len({key for _, key, _ in records}) == 1, records
    assert values[0] == "c" and values[-2:] == ["d", None], values
    schemas = {json.loads(v)["schema"]["fields"][1]["fields"][0]["type"]
               for _, _, v in records if v}  # after.id: int32 before the retype, int64 after
    assert schemas == {"int32", "int64"}, schemas


def _converge(connect: ThrowawayConnect, name: str, same: Any, timeout: float = 15) -> None:
    def converged() -> bool:
        try:
            return bool(same())
        except psycopg.errors.UndefinedColumn:  # the sink has not added a new column yet
            return False

    deadline = time.monotonic() + timeout
    while not converged() and time.monotonic() < deadline:
        connect.check(name)
        time.sleep(0.5)
    connect.check(name)


def test_debezium_jdbc_sink_through_kafka_connect_copies_a_postgres_source(
        pg_cluster: Any, pg_db: Database, kafka_broker: Any, connect_worker: ThrowawayConnect,
        tmp_path: Path) -> None:
    pg_db.execute(LEADER_SCHEMA)
    # Debezium's default time.precision.mode: `placed` is a Timestamp in milliseconds
    options = {**kafka_yaml(kafka_broker), "format": "json", "time_precision": "adaptive"}
    config = write_config(tmp_path, pg_db, ["public.orders", "public.lines"],
                          log_options=options)
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    capture = Capture(config, tmp_path / "capture.log").start()
    target = new_database(pg_cluster)
    topics = [f"{pg_db.source}.public.orders", f"{pg_db.source}.public.lines"]
    tables = (("orders", "id"), ("lines", "order_id, line"))
    name = f"pg-{pg_db.source}"
    try:
        connect_worker.add(name, _sink(target, topics))
        connect_worker.wait_running(name, timeout=120)
        _workload(pg_db, random.Random(30))
        wait_caught_up(pg_db, {**options, "path": str(tmp_path / "log")}, 120)
        _converge(connect_worker, name, lambda: all(
            _rows(target, t, k) == _rows(pg_db, t, k) for t, k in tables))
        for table, key in tables:
            leader, copy = _rows(pg_db, table, key), _rows(target, table, key)
            assert copy == leader, (table, connect_worker.log_tail())
        assert len(_rows(target, "orders", "id")) == 37
        _check_key_one_kept_its_bytes(kafka_broker, topics[0])
        assert _rows(target, "lines", "order_id, line")[0]["sku"] == "after-truncate"
    finally:
        connect_worker.request("DELETE", f"/connectors/{name}")
        capture.terminate()
        target.drop()


MARIADB_SCHEMA = """
CREATE TABLE orders (id int PRIMARY KEY, customer varchar(40) NOT NULL, amount decimal(10,2),
                     placed datetime(6), note text, flag tinyint(1), big bigint unsigned,
                     shipped datetime);
CREATE TABLE order_lines (order_id int, line int, sku varchar(20), qty bigint,
                    PRIMARY KEY (order_id, line));
"""
ORDER_COLUMNS = "id, customer, amount, placed, note"


def _my_workload(db: Any) -> None:
    with db.connect() as conn, conn.cursor() as cursor:
        for i in range(1, 31):
            cursor.execute("INSERT INTO orders VALUES (%s, %s, %s, '2024-05-06 07:08:09.123456', "
                           "%s, %s, %s, '2024-05-06 07:08:09' + INTERVAL %s SECOND)",
                           (i, f"c{i % 7}", f"{i * 3.25:.2f}", f"n{i}", i % 2, 2**63 + i, i))
            cursor.execute("INSERT INTO order_lines VALUES (%s, 1, %s, %s), (%s, 2, %s, %s)",
                           (i, f"sku{i}", i, i, f"sku{i}b", 2 * i))
        cursor.execute("UPDATE orders SET amount = amount + 1, note = 'upd' WHERE MOD(id, 3) = 1")
        cursor.execute("DELETE FROM orders WHERE id IN (2, 4, 8)")
        cursor.execute("UPDATE orders SET id = 1000 + id WHERE id = 7")  # a key change
        cursor.execute("ALTER TABLE orders ADD COLUMN status varchar(10)")  # mid-run
        cursor.execute("UPDATE orders SET status = 'shipped' WHERE MOD(id, 2) = 1")
        cursor.execute("TRUNCATE order_lines")
        cursor.execute("INSERT INTO order_lines VALUES (1, 1, 'after-truncate', 9)")


def _my_rows(db: Any, table: str, columns: str, key: str) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in db.execute(f"SELECT {columns} FROM {table} ORDER BY {key}")]


def _target_rows(target: Database, table: str, columns: str, key: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(target.dsn(), autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if exists is None or exists[0] is None:
            return []
        return [tuple(row) for row in conn.execute(
            f"SELECT {columns} FROM {table} ORDER BY {key}").fetchall()]


def test_debezium_jdbc_sink_through_kafka_connect_copies_a_mariadb_source(
        pg_cluster: Any, mysql_db: Any, kafka_broker: Any, connect_worker: ThrowawayConnect,
        tmp_path: Path) -> None:
    from tests.mykit import wait_caught_up as my_caught_up
    from tests.mykit import write_config as my_config

    mysql_db.script(MARIADB_SCHEMA)
    # Debezium's default for MySQL: `placed` (6 digits) MicroTimestamp, `shipped` Timestamp
    options = {**kafka_yaml(kafka_broker), "format": "json",
               "time_precision": "adaptive_time_microseconds"}
    config = my_config(tmp_path, mysql_db, ["orders", "order_lines"], log_options=options)
    result = cdc("bootstrap", "--config", str(config), env=mysql_db.env())
    assert result.returncode == 0, output(result)
    capture = Capture(config, tmp_path / "capture.log").start()
    target = new_database(pg_cluster)
    topics = [f"{mysql_db.source}.{mysql_db.name}.orders",
              f"{mysql_db.source}.{mysql_db.name}.order_lines"]
    compared = (("orders", f"{ORDER_COLUMNS}, flag, big, shipped, status", "id"),
                ("order_lines", "order_id, line, sku, qty", "order_id, line"))
    name = f"my-{mysql_db.source}"
    try:
        connect_worker.add(name, _sink(target, topics))
        connect_worker.wait_running(name, timeout=120)
        _my_workload(mysql_db)
        my_caught_up(mysql_db, {**options, "path": str(tmp_path / "log")}, 120)
        _converge(connect_worker, name, lambda: all(
            _target_rows(target, t, c, k) == _my_rows(mysql_db, t, c, k) for t, c, k in compared))
        for table, columns, key in compared:
            leader, copy = _my_rows(mysql_db, table, columns, key), _target_rows(
                target, table, columns, key)
            assert copy == leader, (table, connect_worker.log_tail())
        # our own reader of the json log: the latest row per key is the leader's
        logged = latest({**options, "path": str(tmp_path / "log")}, topics[1])
        assert sorted((r["order_id"], r["line"]) for r in logged.values()) == [(1, 1)]
        assert len(_my_rows(mysql_db, "orders", "id", "id")) == 27
    finally:
        connect_worker.request("DELETE", f"/connectors/{name}")
        capture.terminate()
        target.drop()


def test_a_log_keeps_its_schemas_in_apicurio_registry(
        pg_db: Database, kafka_broker: Any, tmp_path: Path) -> None:
    """``log.schema_registry`` pointed at a third-party registry (Apicurio Registry 3, its
    Confluent-compatible API): the registry assigns the ids the values carry; our own reader and
    confluent-kafka's SchemaRegistryClient + AvroDeserializer, both asking Apicurio, decode every
    value across two schema versions; a schema the registry refuses as incompatible stops
    capture with the registry's reason and the fix."""
    import json
    import urllib.request

    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    from cdc_app.servers.apicurio import ThrowawayApicurio
    from tests.pgkit import table_rows, wait_for

    pg_db.execute("CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, "
                  "amount numeric(12,2), note text)")
    pg_db.execute("INSERT INTO items SELECT g, 1, g * 1.25, 'n' || g "
                  "FROM generate_series(1, 200) g")
    with ThrowawayApicurio() as registry:
        options = {**kafka_yaml(kafka_broker), "schema_registry": {"url": registry.url}}
        settings = {**options, "path": str(tmp_path / "log")}
        config = write_config(tmp_path, pg_db, ["public.items"], log_options=options)
        result = cdc("bootstrap", "--config", str(config))
        assert result.returncode == 0, output(result)
        capture = Capture(config, tmp_path / "capture.log").start()
        topic = f"{pg_db.source}.public.items"
        try:
            pg_db.execute("UPDATE items SET v = 2 WHERE id % 3 = 0")
            pg_db.execute("DELETE FROM items WHERE id % 10 = 0")
            pg_db.execute("ALTER TABLE items ADD COLUMN extra text")  # a second version
            pg_db.execute("UPDATE items SET v = 3, extra = 'x' || id WHERE id % 4 = 0")
            wait_caught_up(pg_db, settings, 120)
            logged = latest(settings, topic)  # our reader, schemas from Apicurio
            table = table_rows(pg_db, "items")
            assert {k: r["v"] for k, r in logged.items()} == {k: r["v"] for k, r in table.items()}

            client = SchemaRegistryClient({"url": registry.url})
            assert client.get_versions(f"{topic}-value") == [1, 2]
            decode = AvroDeserializer(client)
            consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers,
                                 "group.id": "apicurio", "isolation.level": "read_committed",
                                 "enable.partition.eof": True})
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
            newest: dict[bytes, Any] = {}
            ids, ended = set(), set()
            while len(ended) < len(partitions):
                for message in consumer.consume(500, timeout=1.0):
                    if message.error():
                        ended.add(message.partition())
                    elif message.value() is not None:
                        ids.add(int.from_bytes(message.value()[1:5], "big"))
                        newest[message.key()] = decode(message.value())
                    else:
                        newest.pop(message.key(), None)
            consumer.close()
            assert len(ids) == 2 and ids <= {r.schema_id for r in (
                client.get_version(f"{topic}-value", 1), client.get_version(f"{topic}-value", 2))}
            assert {k.decode(): e["after"]["v"] for k, e in newest.items()} == {
                k: r["v"] for k, r in table.items()}

            # the registry refuses a schema: capture stops with its reason and the fix
            request = urllib.request.Request(
                f"{registry.url}/config/{topic}-value", method="PUT",
                data=json.dumps({"compatibility": "BACKWARD"}).encode(),
                headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
            urllib.request.urlopen(request, timeout=10).close()
            pg_db.execute("ALTER TABLE items ALTER COLUMN v TYPE text")  # long -> string
            pg_db.execute("UPDATE items SET v = 'four' WHERE id = 1")
            wait_for(lambda: not capture.alive(), 60, "capture to stop on the refusal")
            said = (tmp_path / "capture.log").read_text()
            assert "refused the new schema" in said and "ncompatible" in said, said[-2000:]
            assert '"compatibility": "NONE"' in said
        finally:
            if capture.alive():
                capture.terminate()
