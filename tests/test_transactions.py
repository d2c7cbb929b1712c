"""Transaction boundaries in the log: Debezium's BEGIN/END events in ``<source>.transaction``,
the source's cut, and Spark micro-batches that never hold part of a source transaction."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from cdc.log.open import reader_from
from cdc.position import Position
from cdc.transactions import decode_event, transaction_topic
from tests.pgkit import Capture, Database, cdc, output, wait_caught_up, write_config

TABLES = ["public.a", "public.b"]


def _settings(log: Path) -> dict[str, Any]:
    return {"backend": "local", "path": str(log)}


@pytest.fixture
def captured(pg_db: Database, tmp_path: Path) -> tuple[Database, Path]:
    """A source with two tables, bootstrapped and streamed: 40 multi-table transactions of 1
    to 13 changes (inserts, updates, deletes), one of 30."""
    pg_db.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    pg_db.execute("CREATE TABLE b (id int PRIMARY KEY, v text)")
    pg_db.execute("INSERT INTO a SELECT g, 'seed' FROM generate_series(1, 5) g")
    config = write_config(tmp_path, pg_db, TABLES)
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    capture = Capture(config, tmp_path / "capture.log").start()
    try:
        with pg_db.connect() as conn:
            conn.autocommit = False
            next_id = 100
            for n in range(40):
                size = 1 + (n * 7) % 13
                for i in range(size):
                    table = "a" if (n + i) % 2 else "b"
                    conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", (next_id, f"t{n}"))
                    next_id += 1
                if n % 5 == 4:
                    conn.execute("UPDATE a SET v = %s WHERE id <= 5", (f"u{n}",))
                    conn.execute("DELETE FROM b WHERE id = %s", (next_id - 1,))
                conn.commit()
            for i in range(30):
                conn.execute("INSERT INTO a VALUES (%s, 'big')", (next_id + i,))
            conn.commit()
        wait_caught_up(pg_db, tmp_path / "log")
    finally:
        capture_code = capture.terminate()
    assert capture_code == 0, (tmp_path / "capture.log").read_text()
    return pg_db, tmp_path / "log"


def _records_by_transaction(log: Path, source: str) -> dict[int, int]:
    """Streamed records per source transaction (by commit LSN), tombstones included."""
    reader = reader_from(_settings(log))
    assert reader is not None
    counts: Counter[int] = Counter()
    for table in TABLES:
        topic = f"{source}.{table}"
        for partition in range(reader.committed().topics[topic].partitions):
            for record in reader.iter_partition(topic, partition):
                position = Position.from_bytes(record.position)
                if position.parts[1] == 1:  # streamed, not snapshot
                    counts[position.parts[0]] += 1
    return dict(counts)


def test_begin_and_end_events_count_every_change(captured: tuple[Database, Path]) -> None:
    db, log = captured
    reader = reader_from(_settings(log))
    assert reader is not None
    topic = transaction_topic(db.source)
    state = reader.committed()
    assert state.topics[topic].partitions == 1
    events = [(record, decode_event(record.value))
              for record in reader.iter_partition(topic, 0) if record.value is not None]
    begins = [e for _, e in events if e["status"] == "BEGIN"]
    ends = [e for _, e in events if e["status"] == "END"]
    assert len(begins) == len(ends) == 41
    # BEGIN, END, BEGIN, END ... in that order, each pair with one id
    assert [e["status"] for _, e in events] == ["BEGIN", "END"] * 41
    assert [e["id"] for e in begins] == [e["id"] for e in ends]
    # END's counts equal the changes logged with that transaction id, per table
    logged: dict[str, Counter[str]] = defaultdict(Counter)
    for table in TABLES:
        data_topic = f"{db.source}.{table}"
        for partition in range(state.topics[data_topic].partitions):
            for record in reader.iter_partition(data_topic, partition):
                if record.value is None:
                    continue
                envelope = json.loads(next(iter(_dump(reader, data_topic, partition,
                                                      record.offset))))["value"]
                if envelope["transaction"]:
                    logged[envelope["transaction"]["id"]][table] += 1
    for end in ends:
        per_table = {c["data_collection"]: c["event_count"] for c in end["data_collections"]}
        assert per_table == dict(logged[end["id"]]), end["id"]
        assert end["event_count"] == sum(per_table.values())
    # END says where its transaction ends; the stored cut covers every data record
    cut = reader.source_offsets()[db.source]["cut"]
    for table in TABLES:
        data_topic = f"{db.source}.{table}"
        assert cut[data_topic] == {str(p): end for p, end in
                                   enumerate(state.ends[data_topic])}
    last_end = ends[-1]["ends"]
    assert last_end and all(int(n) <= cut[t][p] for t, parts in last_end.items()
                            for p, n in parts.items())


def _dump(reader: Any, topic: str, partition: int, offset: int) -> Any:
    from cdc_app.logview import dump_lines

    lines = dump_lines(reader, [topic], partition, offset)
    yield next(lines)


def test_spark_batches_hold_whole_transactions(spark: Any, captured: tuple[Database, Path],
                                               tmp_path: Path) -> None:
    db, log = captured
    sizes = _records_by_transaction(log, db.source)
    assert max(sizes.values()) > 7 and min(sizes.values()) < 7
    batches: list[list[dict[str, Any]]] = []

    def collect(frame: Any, batch_id: int) -> None:
        batches.append([row.asDict() for row in frame.collect()])

    query = (spark.readStream.format("cdc").option("path", str(log))
             .option("sources", db.source).option("maxRecordsPerTrigger", "7").load()
             .writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(300) and query.exception() is None
    seen: Counter[int] = Counter()
    streamed_batches = 0
    for batch in batches:
        rows = [r for r in batch if r["op"] != "w"]
        assert not any(r["topic"].endswith(".transaction") for r in rows)
        per_txn: Counter[int] = Counter()
        for row in rows:
            position = Position.from_bytes(bytes(row["position"]))
            if position.parts[1] == 1:
                per_txn[position.parts[0]] += 1
        # every transaction in the batch is whole in it: no follower state holds part of one
        for lsn, count in per_txn.items():
            assert count == sizes[lsn], (lsn, count, sizes[lsn])
        seen.update(per_txn)
        if per_txn:
            streamed_batches += 1
            # the budget is kept unless one transaction alone exceeds it
            assert len(rows) <= 7 or len(per_txn) == 1
    assert seen == sizes  # every transaction once
    assert streamed_batches >= 15


def test_transaction_events_are_fastavros_bytes(tmp_path: Path) -> None:
    """Transaction events are written by the project's compiled Avro writer: the bytes are
    fastavro's, for BEGIN and END, with and without tables and ends."""
    from cdc.log.schemas import SchemaStore
    from cdc.transactions import BEGIN, END, OpenTransaction, TransactionEvents

    events = TransactionEvents("shop", SchemaStore(tmp_path, writable=True))
    assert events._writer is not None
    cases = [(BEGIN, {}, None), (END, {}, {}),
             (END, {"public.a": 3, "public.é": 2**40}, {"shop.public.a": {"0": 5, "7": 10**12}})]
    for status, counts, ends in cases:
        txn = OpenTransaction("12:3456789", 1_700_000_000_123, b"\x01" * 25, dict(counts))
        compiled = events.record(status, txn, b"pos", ends)
        writer, events._writer = events._writer, None
        try:
            assert events.record(status, txn, b"pos", ends) == compiled
        finally:
            events._writer = writer
