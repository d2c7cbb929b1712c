"""The replication stream's drain: the compiled one (libpq's own functions, called from
``connectors/postgres/_fast.pyx``) hands over exactly the messages the pure-Python one does.

Both read the same changes from two slots of a real server: many small transactions, one big
one, and rows with multi-kilobyte values (larger than one socket read: libpq holds partial
messages between reads). Each side keeps what it received as ``batches(raw=True)`` yields it;
the start LSN and the pgoutput message must be the same, message for message (the send time and
the server's WAL end at sending legitimately differ).
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
import pytest

from connectors.postgres import replication
from connectors.postgres.replication import ReplicationStream, compiled_drain, xlog_data
from tests.pgkit import Database

pytestmark = pytest.mark.timeout(300)


def _stream(db: Database, slot: str) -> tuple[psycopg.Connection[Any], ReplicationStream]:
    conn = psycopg.connect(db.dsn(), autocommit=True, replication="database")
    return conn, ReplicationStream(conn, slot, "drainpub", 0, status_interval=1.0)


def _read_until(stream: ReplicationStream, commits: int, deadline: float
                ) -> tuple[list[tuple[int, bytes]], list[int]]:
    """(start LSN, pgoutput message) of everything up to the ``commits``-th Commit; and the
    sizes of the batches it came in. The first read waits a second after the stream started,
    so the walsender has sent more than one message by then."""
    seen: list[tuple[int, bytes]] = []
    batches: list[int] = []
    stream.start()
    time.sleep(1)
    for batch in stream.batches(timeout=0.2, raw=True):
        assert time.monotonic() < deadline, f"only {len(seen)} messages arrived"
        if batch is None:
            continue
        batches.append(len(batch))
        for raw in batch:
            message = xlog_data(raw)
            seen.append((message.start_lsn, message.payload))
            if message.payload[:1] == b"C":
                commits -= 1
                if commits == 0:  # what a batch holds past it depends on timing: not compared
                    return seen, batches
    raise AssertionError("the stream ended")


def test_the_compiled_drain_reads_exactly_what_the_python_one_does(
        pg_db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.environ.get("CDC_PURE_PYTHON") == "1":
        pytest.skip("the compiled paths are switched off")
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, body text, n bigint)")
    pg_db.execute("CREATE PUBLICATION drainpub FOR TABLE t")
    for slot in ("drain_c", "drain_py"):
        pg_db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    small = 60
    with pg_db.connect() as conn:
        for txn in range(small):  # small transactions: Begin, a few rows, Commit
            conn.execute("INSERT INTO t SELECT i, md5(i::text), i FROM generate_series("
                         "%(a)s, %(a)s + 4) AS i", {"a": txn * 5})
        # one big transaction of rows far larger than one socket read (~8 kB)
        conn.execute("INSERT INTO t SELECT i, repeat(md5(i::text), 700), i "
                     "FROM generate_series(100000, 101999) AS i")
        conn.execute("UPDATE t SET n = n + 1 WHERE id >= 100000")
    commits = small + 2
    deadline = time.monotonic() + 120

    compiled_conn, compiled_stream = _stream(pg_db, "drain_c")
    try:
        assert compiled_drain(compiled_conn.pgconn) is not None, \
            "the compiled drain could not bind libpq"
        compiled, compiled_batches = _read_until(compiled_stream, commits, deadline)
    finally:
        compiled_conn.close()
    monkeypatch.setattr(replication, "compiled_drain", lambda pgconn: None)
    python_conn, python_stream = _stream(pg_db, "drain_py")
    try:
        python, _ = _read_until(python_stream, commits, deadline)
    finally:
        python_conn.close()

    # a Relation (or Type) message is sent again whenever the walsender's relation cache was
    # invalidated, which a busy cluster's shared invalidation queue can do at any moment in
    # either session (seen once: 4,426 messages against 4,425): compare them as a set, and
    # everything else message for message
    def data(seen: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        return [(lsn, payload) for lsn, payload in seen if payload[:1] not in (b"R", b"Y")]

    def metadata(seen: list[tuple[int, bytes]]) -> set[bytes]:
        return {payload for _, payload in seen if payload[:1] in (b"R", b"Y")}

    assert len(data(compiled)) == len(data(python))
    assert data(compiled) == data(python)
    assert metadata(compiled) == metadata(python) and metadata(compiled)
    # 2,000 inserts and 2,000 updates of ~22 kB rows (TOASTed: the updates send them unchanged)
    assert sum(1 for _, payload in compiled if payload[:1] == b"I") == small * 5 + 2000
    assert sum(1 for _, payload in compiled if payload[:1] == b"U") == 2000
    assert max(len(payload) for _, payload in compiled) > 20_000
    # what had arrived when it was called: the drain does not stop at one message (how much
    # arrives later depends on how fast the walsender decodes, i.e. on the machine's load)
    assert compiled_batches[0] > 10, "the drain should take what arrived together"
    assert compiled_stream.received_lsn >= compiled[-1][0]


@pytest.mark.parametrize("drain", ["compiled", "python"])
def test_a_keepalive_that_asks_for_a_reply_gets_one(
        pg_db: Database, monkeypatch: pytest.MonkeyPatch, drain: str) -> None:
    """With ``wal_sender_timeout`` at 2 s and our own status updates far apart, the walsender
    asks for a reply after ~1 s and drops a connection that gives none after 2 s: the stream
    must answer from inside the drain and stay up over 5 idle seconds."""
    if drain == "compiled" and os.environ.get("CDC_PURE_PYTHON") == "1":
        pytest.skip("the compiled paths are switched off")
    if drain == "python":
        monkeypatch.setattr(replication, "compiled_drain", lambda pgconn: None)
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pg_db.execute("CREATE PUBLICATION drainpub FOR TABLE t")
    pg_db.execute("SELECT pg_create_logical_replication_slot('drain_ka', 'pgoutput')")
    conn = psycopg.connect(pg_db.dsn(), autocommit=True, replication="database",
                           options="-c wal_sender_timeout=2s")
    try:
        stream = ReplicationStream(conn, "drain_ka", "drainpub", 0, status_interval=3600)
        stream.start()
        answered = []
        real_send = stream.send_status

        def send_status(force: bool = False) -> None:
            answered.append(force)
            real_send(force)

        monkeypatch.setattr(stream, "send_status", send_status)
        idle_until = time.monotonic() + 5
        inserted = False
        for batch in stream.batches(timeout=0.2, raw=True):
            if time.monotonic() >= idle_until and not inserted:
                pg_db.execute("INSERT INTO t VALUES (1)")
                inserted = True
            if batch and any(xlog_data(raw).payload[:1] == b"I" for raw in batch):
                break
            assert time.monotonic() < idle_until + 30, "the row never arrived"
        assert answered, "no keepalive asked for a reply in 5 s"
    finally:
        conn.close()
