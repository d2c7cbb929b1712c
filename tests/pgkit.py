"""Helpers for tests against real throwaway PostgreSQL clusters: databases, configs, running the
``cdc`` command, a concurrent write load with an audit trail, and checking the log against it."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from cdc.avro import EventCodec
from cdc.log.base import ChangeLogReader
from cdc.log.open import reader_from
from cdc.position import Position, parse_lsn
from cdc_app.servers.postgres import ThrowawayPostgres
from tests.kills import Kill, Watch, cpu_ticks

PROJECT = Path(__file__).resolve().parent.parent
SECRET_PASSWORD = "s3cr3t-Pa55word-xyzzy"


def start_cluster(**settings: str) -> ThrowawayPostgres:
    pg = ThrowawayPostgres(settings=dict(settings)).start()
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE cdc_password LOGIN REPLICATION PASSWORD '{SECRET_PASSWORD}'")
        conn.execute("CREATE ROLE norepl LOGIN")
    return pg


@dataclass
class Database:
    """A fresh database on a cluster, with a unique source name (and so a unique slot)."""

    pg: ThrowawayPostgres
    name: str
    source: str

    def dsn(self, user: str = "postgres", password: str | None = None) -> str:
        return self.pg.dsn(self.name, user, password)

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn(), autocommit=True)

    def execute(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def slot(self) -> dict[str, Any] | None:
        rows = self.execute("SELECT active, confirmed_flush_lsn::text, restart_lsn::text "
                            "FROM pg_replication_slots WHERE slot_name = %s",
                            (f"cdc_{self.source}",))
        if not rows:
            return None
        active, confirmed, restart = rows[0]
        return {"active": active, "confirmed": parse_lsn(confirmed) if confirmed else None,
                "restart": parse_lsn(restart) if restart else None}

    def current_lsn(self) -> int:
        return parse_lsn(self.execute("SELECT pg_current_wal_insert_lsn()::text")[0][0])

    def drop(self) -> None:
        with psycopg.connect(self.pg.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                         "WHERE database = %s AND active_pid IS NOT NULL", (self.name,))
            for _ in range(50):
                try:
                    conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM "
                                 "pg_replication_slots WHERE database = %s", (self.name,))
                    break
                except psycopg.errors.ObjectInUse:
                    time.sleep(0.1)
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def new_database(pg: ThrowawayPostgres) -> Database:
    suffix = uuid.uuid4().hex[:8]
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "db_{suffix}"')
    return Database(pg, f"db_{suffix}", f"s{suffix}")


def write_config(directory: Path, db: Database, tables: list[str], *, dsn: str | None = None,
                 log_path: Path | None = None, extra: str = "",
                 log_options: dict[str, Any] | None = None, **source: Any) -> Path:
    """A cdc.yaml for one postgres source; returns its path."""
    lines = [
        "log:",
        f"  path: {log_path or directory / 'log'}",
        "  partitions: 4",
        "  commit_interval: 20ms",
        *(f"  {key}: {json.dumps(value)}" for key, value in (log_options or {}).items()),
        "sources:",
        f"  - name: {db.source}",
        "    kind: postgres",
        f"    dsn: {json.dumps(dsn or db.dsn())}",
        f"    tables: {json.dumps(tables)}",
    ]
    source.setdefault("heartbeat_interval", "500ms")
    for key, value in source.items():
        lines.append(f"    {key}: {json.dumps(value)}")
    path = directory / "cdc.yaml"
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def cdc(*args: str, timeout: float = 120, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """Run the ``cdc`` command line; never raises on a non-zero exit."""
    return subprocess.run([sys.executable, "-m", "cdc_app.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=PROJECT,
                          env={**os.environ, **(env or {})})


def output(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


#: daemons the tests started (`cdc capture`, `cdc apply`): a test that fails halfway leaves
#: them running; the conftest kills what is left after each test
DAEMONS: list[subprocess.Popen[bytes]] = []


def kill_leftover_daemons() -> int:
    """SIGKILL every daemon a test started that still runs; how many there were."""
    left = [p for p in DAEMONS if p.poll() is None]
    for process in left:
        process.kill()
        process.wait(30)
    DAEMONS.clear()
    return len(left)


class Capture:
    """A ``cdc capture`` process, started in the background."""

    def __init__(self, config: Path, log_file: Path) -> None:
        self.config = config
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Capture:
        with open(self.log_file, "ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cdc_app.cli", "capture", "--config", str(self.config)],
                stdout=err, stderr=err, cwd=PROJECT)
        DAEMONS.append(self.process)
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def terminate(self, timeout: float = 30) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class SentLsn:
    """The LSN the server sent to the capture process of ``db``'s source so far (its walsender's
    ``sent_lsn``: the process's own position in the stream), or None while none is connected.
    One connection, reused: :class:`tests.kills.Watch` samples it many times a second."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._conn: psycopg.Connection[Any] | None = None

    def __call__(self) -> int | None:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.db.dsn(), autocommit=True)
        row = self._conn.execute(
            "SELECT s.sent_lsn::text FROM pg_replication_slots r JOIN pg_stat_replication s "
            "ON s.pid = r.active_pid WHERE r.slot_name = %s",
            (f"cdc_{self.db.source}",)).fetchone()
        return parse_lsn(row[0]) if row and row[0] else None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def capture_watch(db: Database, capture: Capture, into: str = "") -> Watch:
    """A :class:`tests.kills.Watch` of ``db``'s capture process. Its position is the pair (LSN
    the server sent it, CPU ticks it used): a kill lands in flight when the process worked in
    the second before (it may lag the walsender, which then waits) and the server had sent it
    WAL past the LSN the log stored (where the restart resumes)."""
    sent = SentLsn(db)

    def position() -> tuple[int, int] | None:
        lsn = sent()
        if lsn is None or capture.process is None:
            return None
        return lsn, cpu_ticks([capture.process.pid])

    return Watch(f"capture daemon (PostgreSQL{' into ' + into if into else ''})", position,
                 ahead=lambda at, committed: at[0] > committed,
                 moved=lambda before, now: now[1] > before[1], close=sent.close)


def kill_capture(watch: Watch, capture: Capture, phase: str, log: LogAt, source: str
                 ) -> Kill:
    """SIGKILL ``capture`` through ``watch``; asserts it landed while changes were in flight."""
    from tests.kills import process_freeze

    assert capture.process is not None
    return watch.kill(phase, capture.kill,
                      lambda: int((stored_offset(log, source) or {}).get("lsn", 0)), aim=30,
                      freeze=process_freeze(capture.process.pid))


def snapshot_watch(log: Path, topic: str) -> Watch:
    """A :class:`tests.kills.Watch` of a ``cdc bootstrap`` process: its position is how many
    snapshot records of ``topic`` it has logged so far."""
    from cdc.log.local import LocalChangeLogReader

    def logged() -> int:
        return sum(LocalChangeLogReader(log).end_offsets(topic).values())

    return Watch("bootstrap", logged)


def kill_bootstrap(watch: Watch, process: subprocess.Popen[Any], log: Path, source: str,
                   leader: str) -> Kill:
    """SIGKILL a bootstrap through ``watch``: in flight when it logged records in the second
    before and the log still says "bootstrapping" (a restart snapshots again from the start:
    it resumes from 0 records)."""

    def resumes_from() -> int:
        state = (stored_offset(log, source) or {}).get("state")
        return 0 if state == "bootstrapping" else watch.position()

    def kill() -> None:
        process.kill()
        process.wait()

    return watch.kill(f"mid-snapshot ({leader})", kill, resumes_from)


class ApplyProcess:
    """``cdc apply --follower F`` (continuous) in the background."""

    def __init__(self, config: Path, log_file: Path, follower: str = "cache") -> None:
        with open(log_file, "ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cdc_app.cli", "apply", "--config", str(config),
                 "--follower", follower], stdout=err, stderr=err, cwd=PROJECT)
        DAEMONS.append(self.process)
        self.log_file = log_file

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(30)


#: where a test's log is: a local log's directory, or log settings (``{"backend": "kafka",
#: ...}`` as in the config, for :func:`cdc.log.open.reader_from`)
LogAt = Path | dict[str, Any]


def log_reader(log: LogAt) -> ChangeLogReader | None:
    """A reader of ``log`` (None if nothing was committed to it yet); close it when done."""
    settings = {"backend": "local", "path": str(log)} if isinstance(log, Path) else log
    return reader_from(settings, missing_ok=True)


def stored_offset(log: LogAt, source: str) -> dict[str, Any] | None:
    reader = log_reader(log)
    if reader is None:
        return None
    try:
        offset: dict[str, Any] | None = reader.source_offsets().get(source)
    finally:
        reader.close()
    return offset


def wait_for(predicate: Any, timeout: float = 60, what: str = "condition",
             interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_progressing(predicate: Any, progress: Any, stall: float, what: str,
                     interval: float = 0.5) -> None:
    """Until ``predicate()`` holds, for as long as ``progress()`` keeps changing: fail only
    when it stood still for ``stall`` seconds (a follower draining a backlog whose size
    depends on how slow the machine was, e.g. a load that ran through a long kill phase)."""
    last, moved = progress(), time.monotonic()
    while not predicate():
        now = progress()
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall:
            raise AssertionError(f"no progress for {stall:g} s waiting for {what} "
                                 f"(progress stood at {last!r})")
        time.sleep(interval)


def wait_caught_up(db: Database, log: LogAt, timeout: float = 120) -> None:
    """Until the log's stored LSN passes the server's current LSN as of now (heartbeats
    carry it past when the captured tables are idle)."""
    target = db.current_lsn()
    wait_for(lambda: int((stored_offset(log, db.source) or {}).get("lsn", 0)) >= target,
             timeout, f"capture to reach LSN {target:X}")


# ---------------------------------------------------------------------- reading the log back

@dataclass
class LoggedEvent:
    position: Position
    key: str
    op: str  # r c u d, or "tombstone"
    envelope: dict[str, Any] | None


def read_topic(log: LogAt, topic: str) -> list[LoggedEvent]:
    """Every committed record of ``topic``, partition by partition (any backend)."""
    reader = log_reader(log)
    out: list[LoggedEvent] = []
    if reader is None:
        return out
    try:
        codec = EventCodec(reader.schemas())
        info = reader.committed().topics.get(topic)
        for partition in range(info.partitions if info else 0):
            for record in reader.iter_partition(topic, partition):
                envelope = (None if record.value is None
                            else codec.decode_value(record.value).envelope)
                out.append(LoggedEvent(Position.from_bytes(record.position),
                                       record.key.decode(),
                                       envelope["op"] if envelope else "tombstone", envelope))
    finally:
        reader.close()
    return out
    for partition in range(reader.topic(topic).partitions):
        for record in reader.iter_partition(topic, partition):
            envelope = None if record.value is None else codec.decode_value(record.value).envelope
            out.append(LoggedEvent(Position.from_bytes(record.position), record.key.decode(),
                                   envelope["op"] if envelope else "tombstone", envelope))
    return out


def latest_rows(events: list[LoggedEvent]) -> dict[str, dict[str, Any]]:
    """Fold by position: the live row per key (deleted keys absent)."""
    latest: dict[str, tuple[Position, dict[str, Any] | None]] = {}
    for event in events:
        if event.op == "t":
            continue
        current = latest.get(event.key)
        if current is not None and event.position < current[0]:
            continue
        row = event.envelope["after"] if event.envelope and event.op != "d" else None
        latest[event.key] = (event.position, row)
    return {key: row for key, (_, row) in latest.items() if row is not None}


def table_rows(db: Database, table: str, key: str = "id") -> dict[str, dict[str, Any]]:
    """The table as JSON-encoded rows keyed like the log's keys (text form of every column)."""
    with db.connect() as conn:
        cursor = conn.execute(f"SELECT to_jsonb(t) FROM {table} t")
        rows = [r[0] for r in cursor.fetchall()]
    return {json.dumps({key: row[key]}, separators=(",", ":")): row for row in rows}


# ---------------------------------------------------------------------------- the write load

LOAD_SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, amount numeric(12,2), note text,
                    updated timestamptz NOT NULL DEFAULT now());
CREATE TABLE audit (seq bigserial PRIMARY KEY, id int NOT NULL, v int NOT NULL,
                    op text NOT NULL);
"""


def big_text(key: int, version: int) -> str:
    """2.5 kB of text that differs per (key, version) and compresses poorly."""
    seed = random.Random(key * 1_000_003 + version)
    return "".join(seed.choice("abcdefghijklmnopqrstuvwxyz0123456789 ") for _ in range(2500))


@dataclass
class Load:
    """Concurrent transactions of 1-4 inserts/updates/deletes on ``items``; each change also
    writes an ``audit`` row in the same transaction (the independent oracle)."""

    db: Database
    threads: int = 2
    deletes: bool = True
    first_id: int = 1_000_000
    #: every so many transactions, one of 300 changes (0: never)
    bulk_every: int = 0
    #: share of changes that move a row to a new primary key (an UPDATE of ``id``)
    key_changes: float = 0.0
    #: seconds each thread sleeps after a transaction (0: as fast as it can)
    pause: float = 0.0
    #: varies the threads' random choices (thread i uses seed * 1000 + i)
    seed: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    committed: int = 0
    errors: list[BaseException] = field(default_factory=list)
    _workers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        for index in range(self.threads):
            worker = threading.Thread(target=self._run, args=(index,), daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def finish(self) -> None:
        self.stop.set()
        for worker in self._workers:
            worker.join(60)
        if self.errors:
            raise self.errors[0]

    def _run(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        live: dict[int, int] = {}
        next_id = self.first_id + index
        try:
            with self.db.connect() as conn:
                while not self.stop.is_set():
                    big = self.bulk_every and self.committed % self.bulk_every == index
                    with conn.transaction():
                        for _ in range(300 if big else rng.randint(1, 4)):
                            next_id = self._change(conn, rng, live, next_id)
                    self.committed += 1
                    if self.pause:
                        self.stop.wait(self.pause)
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.errors.append(exc)

    def _change(self, conn: psycopg.Connection[Any], rng: random.Random, live: dict[int, int],
                next_id: int) -> int:
        roll = rng.random()
        if not live or roll < 0.35:
            key, next_id = next_id, next_id + self.threads
            conn.execute("INSERT INTO items (id, v, amount, note) VALUES (%s, 1, %s, %s)",
                         (key, rng.randint(0, 10**8) / 100, big_text(key, 1)))
            conn.execute("INSERT INTO audit (id, v, op) VALUES (%s, 1, 'c')", (key,))
            live[key] = 1
        elif roll < 0.35 + self.key_changes:
            key, new, next_id = rng.choice(list(live)), next_id, next_id + self.threads
            live[new] = live.pop(key) + 1  # an update of the key: delete + create in the log
            conn.execute("UPDATE items SET id = %s, v = %s WHERE id = %s", (new, live[new], key))
            conn.execute("INSERT INTO audit (id, v, op) VALUES (%s, 0, 'd'), (%s, %s, 'c')",
                         (key, new, live[new]))
        elif roll < 0.85 or not self.deletes:
            key = rng.choice(list(live))
            live[key] += 1
            if rng.random() < 0.5:  # the note stays: PostgreSQL does not send it (TOAST)
                conn.execute("UPDATE items SET v = %s, amount = %s, updated = now() "
                             "WHERE id = %s", (live[key], rng.randint(0, 10**8) / 100, key))
            else:
                conn.execute("UPDATE items SET v = %s, amount = %s, note = %s, updated = now() "
                             "WHERE id = %s", (live[key], rng.randint(0, 10**8) / 100,
                                               big_text(key, live[key]), key))
            conn.execute("INSERT INTO audit (id, v, op) VALUES (%s, %s, 'u')", (key, live[key]))
        else:
            key = rng.choice(list(live))
            version = live.pop(key)
            conn.execute("DELETE FROM items WHERE id = %s", (key,))
            conn.execute("INSERT INTO audit (id, v, op) VALUES (%s, %s, 'd')", (key, version))
        return next_id


def check_against_audit(db: Database, events: list[LoggedEvent]) -> dict[str, int]:
    """The log's change history of ``items``, per key, must equal the audit trail exactly.

    Duplicates (replays after a crash) must carry the same position and the same content; after
    removing them, each key's events in position order must be the audit's (op, version)
    sequence for that key — starting after the snapshot row if the key was snapshotted. The
    latest row per key must equal the table. Returns figures for the test report.
    """
    return check_history(db.execute("SELECT id, v, op FROM audit ORDER BY seq"),
                         table_rows(db, "items"), events)


def check_history(audit_rows: Any, table: dict[str, dict[str, Any]],
                  events: list[LoggedEvent]) -> dict[str, int]:
    """:func:`check_against_audit` on rows already read: ``audit_rows`` (id, v, op) in commit
    order and ``table`` the current rows of ``items`` by key text (any leader)."""
    audit: dict[str, list[tuple[str, int | None]]] = defaultdict(list)
    for key, version, op in audit_rows:
        audit[json.dumps({"id": key}, separators=(",", ":"))].append((op, version))
    by_key: dict[str, dict[Position, LoggedEvent]] = defaultdict(dict)
    duplicates = 0
    for event in events:
        if event.op == "tombstone":
            continue
        seen = by_key[event.key].get(event.position)
        if seen is not None:
            duplicates += 1
            assert _content(seen) == _content(event), f"replay of {event.key} differs"
            continue
        by_key[event.key][event.position] = event
    for key in set(audit) | set(by_key):
        ordered = [by_key[key][p] for p in sorted(by_key[key])]
        # a delete's before image holds only the key (default replica identity): no version
        chain = [(e.op, None if e.op == "d" else int((e.envelope or {})["after"]["v"]))
                 for e in ordered]
        expected = [(op, None if op == "d" else v) for op, v in audit.get(key, [])]
        if chain and chain[0][0] == "r":
            snapshot_version = chain[0][1]
            starts = [i for i, (op, v) in enumerate(expected)
                      if op in ("c", "u") and v == snapshot_version]
            assert starts, f"{key}: snapshot version {snapshot_version} not in the audit"
            expected = expected[starts[0] + 1:]
            chain = chain[1:]
        assert chain == expected, f"{key}: log history {chain} != audit {expected}"
    logged = latest_rows(events)
    assert set(logged) == set(table), (
        f"keys differ: only in log {sorted(set(logged) - set(table))[:5]}, "
        f"only in table {sorted(set(table) - set(logged))[:5]}")
    for key, row in table.items():
        got = logged[key]
        assert (int(got["v"]), got["note"], got["amount"]) == (
            row["v"], row["note"], f"{row['amount']:.2f}" if not isinstance(row["amount"], str)
            else row["amount"]), f"{key}: log row differs from the table"
    return {"keys": len(table), "audit_changes": sum(len(v) for v in audit.values()),
            "duplicates": duplicates, "events": len(events)}


def _content(event: LoggedEvent) -> Any:
    envelope = dict(event.envelope or {})
    for volatile in ("ts_ms", "ts_us", "ts_ns"):
        envelope.pop(volatile, None)
    return envelope


def assert_follower_equals_log_and_table(sink: Any, db: Database, log: LogAt, topic: str,
                                         table: str = "public.items") -> int:
    """Redis holds exactly the table's keys, each row equal (as text) to the log's newest
    image of that key, whose v and note equal the table's. Returns the row count."""
    from cdc.sink import row_text

    expected = latest_rows(read_topic(log, topic))
    rows = table_rows(db, table)
    held_keys = set(sink.keys(topic))
    assert held_keys == set(rows), (sorted(held_keys - set(rows))[:5],
                                     sorted(set(rows) - held_keys)[:5])
    held = sink.read(topic, sorted(held_keys))
    for key, row in rows.items():
        assert held[key] == row_text(expected[key]), key
        assert (int(held[key]["v"]), held[key].get("note")) == (row["v"], row["note"]), key
    return len(rows)


def append_synthetic(log: LogAt, workload: Any, changes: int) -> None:
    """``changes`` events of the synthetic ``shop`` workload (:class:`cdc_app.synthetic.Workload`)
    appended to ``log`` (either backend) with the source offset ``{"lsn": workload.seq}``."""
    from cdc.log.open import writer_from
    from cdc_app.synthetic import ORDERS

    settings = {"backend": "local", "path": str(log)} if isinstance(log, Path) else log
    writer = writer_from({"partitions": 4, "fsync": False, **settings}).for_source("shop")
    try:
        codec = EventCodec(writer.schemas())
        writer.ensure_topic(ORDERS.topic, {"source": "shop", "table": str(ORDERS.table),
                                           "connector": "postgresql"})
        records = [r for event in workload.events(changes) for r in codec.records(event)]
        writer.append(records, {"shop": {"lsn": workload.seq}})
    finally:
        writer.close()


def verify_followers(config: Path, names: Sequence[str], timeout: str = "300s"
                     ) -> dict[str, subprocess.CompletedProcess[str]]:
    """``cdc verify`` of each follower in ``names`` (results by name; asserted later with
    :func:`assert_verified`, once the processes around it are stopped)."""
    return {name: cdc("verify", "--config", str(config), "--follower", name, "--timeout",
                      timeout, timeout=420) for name in names}


def assert_verified(verified: dict[str, subprocess.CompletedProcess[str]]) -> None:
    """Every follower verified equal to the leader (exit 0 and the verdict printed)."""
    for name, result in verified.items():
        assert result.returncode == 0, f"follower {name}: {output(result)}"
        assert "follower equals the leader" in result.stdout, name


def prober_rows(stdout: str) -> dict[str, tuple[int, int]]:
    """The demo's prober table (``commit -> visible to a reader``): per follower, (probes,
    unseen)."""
    import re

    table = stdout[stdout.index("commit -> visible to a reader"):]
    rows = re.findall(r"^│ (\w+) \(\w+\)\s*│[^│]*│[^│]*│[^│]*│\s*([\d,]+) │\s*([\d,]+) │", table,
                      re.M)
    return {name: (int(probes.replace(",", "")), int(unseen.replace(",", "")))
            for name, probes, unseen in rows}
