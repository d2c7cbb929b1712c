"""``cdc demo``: PostgreSQL (or MariaDB: ``--source mysql``) -> change log -> ``cdc apply`` ->
Redis, Delta and search, live, then ``cdc verify`` for each follower.

A throwaway PostgreSQL cluster (initdb on a free port, wal_level=logical) or MariaDB server
(mariadbd on a free port, row binlog) gets a small shop schema and data; what differs per leader
kind (server, schema and data, the config's source, the workload's SQL, the server's current log
position) is a :class:`DemoLeader`. Three followers of three kinds run side by side in one ``cdc
apply`` (local mode: one read of the log, a process per follower): ``cache`` (a throwaway
``redis-server``), ``warehouse`` (Delta tables, SCD1, under the demo directory) and ``search``
(a Tantivy index there). While a workload keeps writing:
``cdc bootstrap`` snapshots the tables into a fresh log, then
``cdc capture`` streams the rest and ``cdc apply --follower cache --follower warehouse
--follower search`` runs continuously in this process. Once every follower has caught up, the
workload writes for ``seconds`` more (the latencies reported are of the changes committed in
that window), then stops; ``cdc verify`` waits for capture and each follower's watermark and
compares every table. The summary: per follower and table, rows, events applied and
commit -> applied latency p50/p99. The config it writes (``<dir>/cdc.yaml``) works with every
``cdc`` command while the demo runs (``cdc search``, ``cdc warehouse``, ``cdc verify``...; with
MariaDB, set ``CDC_DEMO_MYSQL_PASSWORD`` before the demo: the capture user's password, random
otherwise).
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import shutil
import signal
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
import pymysql
from pymysql.constants import CLIENT
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from cdc.avro import EventCodec
from cdc.config import Config, load_config
from cdc.coordinator import bootstrap, open_log, run_capture
from cdc.errors import CdcError
from cdc.log.base import ChangeLogWriter
from cdc.offsets import offset_order, offset_text, reached
from cdc.verify import VerifyReport
from cdc_app import logs
from cdc_app.console import make_console
from cdc_app.screens import apply_table, print_report
from cdc_app.servers.mysql import ThrowawayMariaDB
from cdc_app.servers.postgres import ThrowawayPostgres
from cdc_app.servers.redis import ThrowawayRedis

if TYPE_CHECKING:
    from spark_apply.jobs import ApplyJob
    from spark_apply.latency import LatencyHistogram

#: the followers the demo writes into its config, and their kinds
FOLLOWERS = {"cache": "Redis", "warehouse": "Delta (SCD1)", "search": "Tantivy",
             "reporting": "SQL (SQLite)"}
#: the demo's view, kept in these followers
VIEW = "revenue_by_customer"
VIEW_FOLLOWERS = ("warehouse", "reporting")
#: at most this long for the follower to catch up with the backlog before the measured window
CATCH_UP_S = 120.0

#: the environment variable holding the MariaDB capture user's password (set it before
#: ``cdc demo --source mysql`` to choose the password and use other ``cdc`` commands meanwhile)
MYSQL_PASSWORD_ENV = "CDC_DEMO_MYSQL_PASSWORD"


class WorkloadSession(Protocol):
    """A connection the workload writes through: ``execute`` with ``%s`` parameters, in
    ``transaction()`` blocks (a psycopg connection is one)."""

    def execute(self, sql: str, params: tuple[Any, ...], /) -> Any: ...

    def transaction(self) -> AbstractContextManager[Any]: ...


class DemoLeader(ABC):
    """What differs per leader kind: the throwaway server (a context manager: started on entry,
    deleted on exit), the shop schema and data, the config's source, the workload's connection
    and SQL, and the server's current log position."""

    #: how messages and the summary name the leader
    title: str
    #: how the live view names a position in the leader's log
    position_name: str
    #: where bootstrap hands off to the stream
    handoff: str
    #: the captured tables, as the config names them (customers, orders)
    tables: tuple[str, str]
    #: the workload's statements (``%s`` parameters): ``place`` (id, customer, amount),
    #: ``status`` (status, id), ``cancel`` (id: a delete), ``rename`` (customer id)
    statements: dict[str, str]

    @abstractmethod
    def __enter__(self) -> DemoLeader: ...

    @abstractmethod
    def __exit__(self, *exc: object) -> None: ...

    @abstractmethod
    def describe(self) -> str:
        """``throwaway <server> on 127.0.0.1:PORT (...)``."""

    @abstractmethod
    def create_shop(self) -> None:
        """The ``shop`` database: customers (2,000 rows), orders (30,000 rows)."""

    @abstractmethod
    def source_yaml(self) -> str:
        """The config's ``sources:`` entry (named ``shop``), indented for the list."""

    @abstractmethod
    def session(self) -> AbstractContextManager[WorkloadSession]:
        """A connection to the shop database for the workload."""

    @abstractmethod
    def position(self) -> tuple[int, ...]:
        """The server's current log position, as an offset order (:func:`offset_order`)."""

    @abstractmethod
    def probe_connection(self) -> dict[str, Any]:
        """How the latency prober (``cdc_app/probe.py``) connects to the shop database:
        ``{"dsn": ...}`` or ``{"mysql": {PyMySQL's connect() arguments}}``."""


class PostgresDemoLeader(DemoLeader):
    title = "PostgreSQL"
    position_name = "LSN"
    handoff = "the slot's consistent point"
    tables = ("public.customers", "public.orders")
    statements = {
        "place": "INSERT INTO orders (id, customer_id, amount, items) VALUES (%s, %s, %s, '[]')",
        "status": "UPDATE orders SET status = %s WHERE id = %s",
        "cancel": "DELETE FROM orders WHERE id = %s",
        "rename": "UPDATE customers SET name = name || '*' WHERE id = %s",
    }
    SCHEMA = """
CREATE TYPE order_status AS ENUM ('new', 'paid', 'shipped', 'cancelled');
CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, email text,
                        created timestamptz NOT NULL DEFAULT now());
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL REFERENCES customers,
                     status order_status NOT NULL DEFAULT 'new', amount numeric(12,2) NOT NULL,
                     items jsonb, placed timestamptz NOT NULL DEFAULT now(), note text);
INSERT INTO customers (id, name, email)
  SELECT g, 'customer ' || g, 'c' || g || '@example.com' FROM generate_series(1, 2000) g;
INSERT INTO orders (id, customer_id, amount, items, note)
  SELECT g, 1 + g % 2000, (g % 9973) * 1.01, jsonb_build_array(jsonb_build_object('sku', g % 97,
         'qty', 1 + g % 5)), repeat('n', 50) FROM generate_series(1, 30000) g;
"""

    def __init__(self) -> None:
        # (its data lives in a fresh temporary directory the unprivileged server user can reach)
        self.server = ThrowawayPostgres()
        self.dsn = ""

    def __enter__(self) -> PostgresDemoLeader:
        self.server.__enter__()
        self.dsn = self.server.dsn("shop")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)

    def describe(self) -> str:
        return f"throwaway PostgreSQL on 127.0.0.1:{self.server.port} (wal_level=logical)"

    def create_shop(self) -> None:
        with psycopg.connect(self.server.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE shop")
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(self.SCHEMA)

    def source_yaml(self) -> str:
        return f"""\
  - name: shop
    kind: postgres
    dsn: {self.dsn}
    tables: [{', '.join(self.tables)}]
    heartbeat_interval: 1s
"""

    def session(self) -> AbstractContextManager[WorkloadSession]:
        return psycopg.connect(self.dsn, autocommit=True)

    def position(self) -> tuple[int, ...]:
        from cdc.position import parse_lsn

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        return (parse_lsn(row[0]) if row else 0,)

    def probe_connection(self) -> dict[str, Any]:
        return {"dsn": self.dsn}


class MariaDbDemoLeader(DemoLeader):
    title = "MariaDB"
    position_name = "binlog position"
    handoff = "the snapshot's binlog position"
    tables = ("shop.customers", "shop.orders")
    statements = {
        "place": "INSERT INTO orders (id, customer_id, amount, items) VALUES (%s, %s, %s, '[]')",
        "status": "UPDATE orders SET status = %s WHERE id = %s",
        "cancel": "DELETE FROM orders WHERE id = %s",
        "rename": "UPDATE customers SET name = CONCAT(name, '*') WHERE id = %s",
    }
    SCHEMA = """
CREATE TABLE customers (id BIGINT PRIMARY KEY, name TEXT NOT NULL, email TEXT,
                        created DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6));
CREATE TABLE orders (id BIGINT PRIMARY KEY, customer_id BIGINT NOT NULL,
                     status ENUM('new', 'paid', 'shipped', 'cancelled') NOT NULL DEFAULT 'new',
                     amount DECIMAL(12,2) NOT NULL, items JSON,
                     placed TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), note TEXT,
                     FOREIGN KEY (customer_id) REFERENCES customers (id));
INSERT INTO customers (id, name, email)
  SELECT seq, CONCAT('customer ', seq), CONCAT('c', seq, '@example.com') FROM seq_1_to_2000;
INSERT INTO orders (id, customer_id, amount, items, note)
  SELECT seq, 1 + seq % 2000, (seq % 9973) * 1.01, JSON_ARRAY(JSON_OBJECT('sku', seq % 97,
         'qty', 1 + seq % 5)), REPEAT('n', 50) FROM seq_1_to_30000;
"""
    #: the capture user: the binlog dump and positions on the server, reading the shop
    USER = "cdc"

    def __init__(self) -> None:
        # flushed to the OS at each commit, not fsynced (the demo's PostgreSQL has fsync off)
        self.server = ThrowawayMariaDB(flush_log_at_trx_commit=2, sync_binlog=0)
        self.password = os.environ.get(MYSQL_PASSWORD_ENV) or secrets.token_urlsafe(18)

    def __enter__(self) -> MariaDbDemoLeader:
        self.server.__enter__()
        os.environ[MYSQL_PASSWORD_ENV] = self.password  # read by this process's cdc commands
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)

    def describe(self) -> str:
        return (f"throwaway MariaDB on 127.0.0.1:{self.server.port} (row binlog; capture user "
                f"{self.USER}, password in ${MYSQL_PASSWORD_ENV})")

    def create_shop(self) -> None:
        self.server.execute("CREATE DATABASE shop CHARACTER SET utf8mb4")
        self.server.execute(f"CREATE USER '{self.USER}'@'%%' IDENTIFIED BY %s", (self.password,))
        self.server.execute(f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO "
                            f"'{self.USER}'@'%'")
        self.server.execute(f"GRANT SELECT, SHOW VIEW ON shop.* TO '{self.USER}'@'%'")
        conn = pymysql.connect(**self.server.connection_settings(database="shop", tcp=False),
                               autocommit=True, client_flag=CLIENT.MULTI_STATEMENTS)
        try:
            with conn.cursor() as cursor:
                cursor.execute(self.SCHEMA)
                while cursor.nextset():
                    pass
        finally:
            conn.close()

    def source_yaml(self) -> str:
        return f"""\
  - name: shop
    kind: mysql
    dsn: {self.server.url_for(self.USER, "shop")}
    password_env: {MYSQL_PASSWORD_ENV}
    tables: [{', '.join(self.tables)}]
    heartbeat_interval: 1s
"""

    @contextmanager
    def session(self) -> Iterator[WorkloadSession]:
        conn = self.server.root_connect("shop")
        try:
            yield _MySqlSession(conn)
        finally:
            conn.close()

    def probe_connection(self) -> dict[str, Any]:
        return {"mysql": self.server.connection_settings(database="shop", tcp=True)}

    def position(self) -> tuple[int, ...]:
        from connectors.mysql.catalog import file_sequence

        file, pos = self.server.binlog_position()
        return (file_sequence(file), pos)


class _MySqlSession:
    """A PyMySQL connection (autocommit) as a :class:`WorkloadSession`."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, params: tuple[Any, ...], /) -> Any:
        with self.conn.cursor() as cursor:
            return cursor.execute(sql, params)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.conn.begin()
        try:
            yield
        except BaseException:
            self.conn.rollback()
            raise
        self.conn.commit()


#: ``cdc demo --source``: the leader kinds
LEADERS: dict[str, type[DemoLeader]] = {"postgres": PostgresDemoLeader,
                                        "mysql": MariaDbDemoLeader}


def run_db_demo(directory: str, seconds: float, source: str = "postgres") -> None:
    console = make_console()
    # warnings and errors above the live tables (rich places them), never through them; the
    # JVM's lines come the same way (cdc/jvm)
    logs.to_console(console, logging.WARNING)
    root = Path(directory).resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    leader = LEADERS[source]()
    console.rule(f"[bold]cdc demo: {leader.title} -> change log -> cdc apply -> Redis, Delta, "
                 "search")
    with leader, ThrowawayRedis() as cache:
        console.print(f"{leader.describe()}, "
                      f"throwaway Redis on 127.0.0.1:{cache.port} (follower cache); Delta "
                      f"tables (follower warehouse) and a search index (follower search) "
                      f"under {root}")
        leader.create_shop()
        console.print("shop schema: customers (2,000 rows), orders (30,000 rows)")
        config_path = _write_config(root, leader, cache.url)
        console.print(f"config: {config_path}")
        config = load_config(config_path)
        workload = ShopWorkload(leader)
        follower = LiveApply(config)
        writer, codec = open_log(config)
        try:
            follower.start_spark()  # a cluster's: 10-20 s on 2 cores, overlaps the bootstrap
            workload.start()
            console.rule("bootstrap (snapshot while the workload writes)")
            report = bootstrap(config, config.sources[0], writer, codec, console)
            console.print(f"snapshot of {sum(report.rows.values()):,} rows durable in "
                          f"{report.seconds:.1f} s; streaming from {leader.handoff}")
            console.rule("capture + cdc apply " + " ".join(f"--follower {name}"
                                                            for name in FOLLOWERS)
                         + " (continuous)")
            follower.start_queries()
            verified = _capture_live(config, writer, codec, leader, workload, follower,
                                     seconds, console, _probe_spec(root, leader, cache.url))
        finally:
            workload.stop()
            follower.stop()
            writer.close()
        _summary(config, leader, follower, verified, workload, console)


#: the prober's probe rows: customers with negative ids (the workload's are positive)
PROBE_INSERT = ("INSERT INTO customers (id, name, email) "
                "VALUES (%(key)s, 'probe', 'probe@example.com')")


def _probe_spec(root: Path, leader: DemoLeader, redis_url: str) -> dict[str, Any]:
    """Where the latency prober (``cdc_app/probe.py``) commits and reads: customers rows, in
    each follower's documented layout (``docs/followers.md``)."""
    from sinks.delta import table_dir

    customers = leader.tables[0]
    topic = f"shop.{customers}"
    key_json = '{{"id":{key}}}'
    return {**leader.probe_connection(), "rate": 10, "first_key": -1, "insert": PROBE_INSERT,
            "followers": [
                {"name": "cache", "kind": "redis", "url": redis_url,
                 "key": f"{customers}:{{key}}"},
                {"name": "warehouse", "kind": "delta",
                 "path": str(table_dir(root / "warehouse", topic)), "key_json": key_json},
                {"name": "search", "kind": "search", "path": str(root / "search"),
                 "id": f"{topic}\n{key_json}"},
                {"name": "reporting", "kind": "sql",
                 "url": f"sqlite:///{root / 'reporting.sqlite'}",
                 "table": customers.split(".")[-1], "column": "id"}]}


class LiveApply:
    """``cdc apply`` of every demo follower running continuously in this process: a SparkSession
    (only on a cluster master) starts in a thread (:meth:`start_spark`), the apply loop once the
    log exists (:meth:`start_queries`); :meth:`stop` ends it like SIGTERM does."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.job: ApplyJob | None = None
        self.error: BaseException | None = None
        self._spark: Any = None
        self._spark_ready = threading.Event()
        self._thread: threading.Thread | None = None

    def start_spark(self) -> None:
        """Start the SparkSession in a thread, if a follower's runner needs one (in local mode
        none does: each follower writes in a process of its own, views in this one)."""
        if self.config.spark.master.startswith("local"):
            self._spark_ready.set()
            return

        def start() -> None:
            from spark_apply.session import start_spark

            try:
                self._spark = start_spark()
            except BaseException as exc:  # noqa: BLE001 - raised by start_queries
                self.error = exc
            finally:
                self._spark_ready.set()

        threading.Thread(target=start, daemon=True).start()

    def start_queries(self) -> None:
        from spark_apply.jobs import ApplyJob

        self._spark_ready.wait()
        if self.error is not None:
            raise self.error
        job = self.job = ApplyJob.prepare(self.config, [*FOLLOWERS, VIEW])
        job.start(self._spark, once=False)

        def wait() -> None:
            try:
                job.wait(None)
            except BaseException as exc:  # noqa: BLE001 - checked by the demo's loop
                self.error = exc

        self._thread = threading.Thread(target=wait, daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raise what stopped the follower, if anything did."""
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        if self.job is None:
            return
        self.job.request_stop()
        if self._thread is not None:
            self._thread.join(90)
        self.job.stop_queries()
        self.job.close()
        if self._spark is not None:
            self._spark.stop()


def _write_config(root: Path, leader: DemoLeader, redis_url: str) -> Path:
    path = root / "cdc.yaml"
    path.write_text(f"""\
# written by `cdc demo`; valid while the demo's {leader.title} runs
log:
  path: {root / 'log'}
  partitions: 8
sources:
{leader.source_yaml()}followers:
  cache:
    kind: redis
    url: {redis_url}
  warehouse:
    kind: delta
    path: {root / 'warehouse'}
    mode: scd1
    buckets: 4
  search:
    kind: search
    path: {root / 'search'}
    text_fields:
      {leader.tables[0]}: [name, email]
      {leader.tables[1]}: [status, note]
  reporting:
    kind: sql
    url: sqlite:///{root / 'reporting.sqlite'}
views:
  {VIEW}:
    source: shop
    sql: >-
      SELECT c.id AS customer_id, count(*) AS orders, sum(o.amount) AS revenue
      FROM {leader.tables[1]} o JOIN {leader.tables[0]} c ON o.customer_id = c.id
      GROUP BY c.id
    key: [customer_id]
    followers: [{', '.join(VIEW_FOLLOWERS)}]
    trigger_interval: 1s
""")
    return path


class ShopWorkload:
    """Orders placed, paid, shipped and cancelled; customers renamed; a thread of its own."""

    def __init__(self, leader: DemoLeader) -> None:
        self.leader = leader
        self.transactions = 0
        self.changes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        rng = random.Random(42)
        next_id = 100_000
        try:
            with self.leader.session() as conn:
                while not self._stop.is_set():
                    with conn.transaction():
                        for _ in range(rng.randint(1, 5)):
                            next_id = self._change(conn, rng, next_id)
                    self.transactions += 1
                    time.sleep(0.002)
        except BaseException as exc:  # noqa: BLE001 - shown in the summary
            self.error = exc

    def _change(self, conn: WorkloadSession, rng: random.Random, next_id: int) -> int:
        sql = self.leader.statements
        roll = rng.random()
        order = rng.randint(1, next_id)
        if roll < 0.4:
            conn.execute(sql["place"], (next_id, rng.randint(1, 2000),
                                        rng.randint(100, 100_000) / 100))
            next_id += 1
        elif roll < 0.8:
            conn.execute(sql["status"], (rng.choice(["paid", "shipped", "cancelled"]), order))
        elif roll < 0.9:
            conn.execute(sql["cancel"], (order,))
        else:
            conn.execute(sql["rename"], (rng.randint(1, 2000),))
        self.changes += 1
        return next_id


@dataclass
class LiveResult:
    """What the live phase measured."""

    #: per follower, what ``cdc verify`` found
    verify: dict[str, VerifyReport] = field(default_factory=dict)
    #: per follower and topic, the latency histogram when the measured window began
    baseline: dict[str, dict[str, LatencyHistogram]] = field(default_factory=dict)
    window_s: float = 0.0
    changes_in_window: int = 0
    #: per follower of the view, what ``cdc verify --view`` found
    views: dict[str, Any] = field(default_factory=dict)
    #: per follower, the prober's figures over the window (``cdc_app.probe.summarize``)
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)


def _verify_view(config: Config, console: Console) -> dict[str, Any]:
    """``cdc verify --view`` of the demo's view in each of its followers."""
    from cdc.sink import open_sink
    from views.sink import view_holds
    from views.verify import print_view_report, verify_view

    found: dict[str, Any] = {}
    for name in VIEW_FOLLOWERS:
        console.rule(f"cdc verify --view {VIEW} --follower {name}")
        sink = open_sink(config, name, view_holds("shop", VIEW))
        try:
            found[name] = verify_view(config, VIEW, name, sink, console, timeout=120)
        finally:
            sink.close()
        print_view_report(found[name], console, limit=10)
    return found


def _capture_live(config: Config, writer: ChangeLogWriter, codec: EventCodec,
                  leader: DemoLeader, workload: ShopWorkload, follower: LiveApply,
                  seconds: float, console: Console, probe_spec: dict[str, Any]) -> LiveResult:
    """Capture in a thread and the follower running: wait until the follower has caught up,
    measure ``seconds`` of workload with the latency prober beside it (``probe_spec``), stop
    the workload, then ``cdc verify`` (capture and apply still running: verify's heartbeat must
    travel through both)."""
    from cdc.sink import open_sink
    from cdc.verify import verify
    from cdc_app import probe

    stop = threading.Event()
    errors: list[BaseException] = []

    def capture() -> None:
        try:
            run_capture(config, config.sources, writer, codec, stop)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    assert follower.job is not None
    job = follower.job

    since: dict[str, Any] | None = None  # the latency's start: once the followers caught up

    def view(phase: str) -> Group:
        offset = writer.source_offsets().get("shop", {})
        return Group(f"{phase}\nworkload: {workload.transactions:,} transactions, "
                     f"{workload.changes:,} changes written | log: committed up to "
                     f"{leader.position_name} {offset_text(offset)}",
                     apply_table(job, since, latency=since is not None))

    result = LiveResult()
    prober: subprocess.Popen[bytes] | None = None
    try:
        with Live(view(""), console=console, refresh_per_second=4) as live:
            # started now (its clients take a second to load); its probes count from the
            # measured window on
            prober = _start_prober(config.base_dir, probe_spec)
            began = time.monotonic()
            # the log's position when every follower had a batch (an offset order)
            target: tuple[int, ...] | None = None
            while time.monotonic() - began < CATCH_UP_S:
                follower.check()
                if errors:
                    raise errors[0]
                progress = job.progress.values()
                if target is None and all(p.batches for p in progress):
                    target = offset_order(writer.source_offsets().get("shop"))
                if target is not None and all(reached(p.watermarks.get("shop"), target)
                                              for p in progress):
                    break
                waiting = not all(p.batches for p in progress)
                live.update(view(
                    "cdc apply is starting the followers' processes; changes wait in the log "
                    "meanwhile (latency is measured once the followers have caught up)"
                    if waiting else "the followers are catching up with the snapshot and the "
                    "backlog of the start (latency is measured once they have)"))
                time.sleep(0.25)
            result.baseline = {name: {t: h.copy() for t, h in p.latency_by_topic.items()}
                               for name, p in job.progress.items()}
            since = {name: p.latency.copy() for name, p in job.progress.items()}
            began, written = time.monotonic(), workload.changes
            window = (time.time(), 0.0)
            while time.monotonic() - began < seconds and thread.is_alive():
                follower.check()
                left = seconds - (time.monotonic() - began)
                live.update(view(f"measuring commit -> visible latency: {left:.0f} s left"))
                time.sleep(0.25)
            workload.stop()
            prober.send_signal(signal.SIGUSR1)  # no more probes: verify compares a still leader
            time.sleep(0.5)  # (an INSERT in flight commits meanwhile)
            window = (window[0], time.time())
            result.window_s = time.monotonic() - began
            result.changes_in_window = workload.changes - written
            live.update(view("workload stopped; waiting for capture to catch up"))
            _wait_caught_up(config, writer, leader, thread)
            live.update(view("workload stopped; capture caught up"))
        if not console.is_terminal:
            console.line()  # rich leaves the last line of a non-terminal Live open
        if errors:
            raise errors[0]
        console.print(f"workload wrote {workload.changes:,} changes in "
                      f"{workload.transactions:,} transactions; capture and apply kept up")
        for name in FOLLOWERS:
            console.rule(f"cdc verify --follower {name}")
            sink = open_sink(config, name)  # as `cdc verify` would: a reader beside the writer
            try:
                result.verify[name] = verify(config, name, sink, console, timeout=120)
            finally:
                sink.close()
            print_report(result.verify[name], console, limit=10)  # under its own heading
            follower.check()
        result.views = _verify_view(config, console)
        names = {f["name"]: f["kind"] for f in probe_spec["followers"]}
        prober.terminate()
        prober.wait(30)
        result.probes = probe.summarize(config.base_dir / PROBE_OUT, *window, names)
    finally:
        stop.set()
        thread.join(30)
        if prober is not None and prober.poll() is None:
            prober.kill()
    if errors:
        raise errors[0]
    return result


#: the prober's output, in the demo's directory
PROBE_OUT = "probe.jsonl"


def _start_prober(root: Path, spec: dict[str, Any]) -> subprocess.Popen[bytes]:
    """The latency prober (``cdc_app/probe.py``) as a process of its own; its errors go to
    ``probe.log`` in the demo's directory."""
    from cdc_app import probe

    (root / "probe.json").write_text(json.dumps(spec))
    with (root / "probe.log").open("w") as errors:
        return subprocess.Popen(probe.command(root / "probe.json", root / PROBE_OUT),
                                stdout=errors, stderr=errors, cwd=root)


def _wait_caught_up(config: Config, writer: ChangeLogWriter, leader: DemoLeader,
                    thread: threading.Thread) -> None:
    source = config.sources[0]
    target = leader.position()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and thread.is_alive():
        if reached(writer.source_offsets().get(source.name), target):
            return
        time.sleep(0.1)


def _probe_table(live: LiveResult) -> Table:
    """The prober's figures: commit -> visible to a reader, per follower."""
    table = Table(title="commit -> visible to a reader (the latency prober, cdc_app/probe.py)",
                  caption="probe rows committed on the leader 10 times a second in the "
                          f"measured {live.window_s:.0f} s, each follower polled every 20 ms "
                          "through its own client; a probe never seen counts as the slowest")
    for column in ("follower", "p50", "p99", "max", "probes", "unseen"):
        table.add_column(column, justify="left" if column == "follower" else "right")

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:,.0f} ms"

    for name, figures in live.probes.items():
        table.add_row(f"{name} ({figures['kind']})", secs(figures["p50_s"]),
                      secs(figures["p99_s"]), secs(figures["max_s"]),
                      f"{figures['probes']:,}", f"{figures['unseen']:,}")
    return table


def _summary(config: Config, leader: DemoLeader, follower: LiveApply, live: LiveResult,
             workload: ShopWorkload, console: Console) -> None:
    from spark_apply.latency import LatencyHistogram, format_seconds

    assert follower.job is not None
    table = Table(title=f"summary: {leader.title} -> log -> cdc apply -> followers",
                  caption=f"latency: commit at {leader.title} -> the apply task's write "
                          f"returned (as cdc apply measures it), per change, for the "
                          f"{live.changes_in_window:,} changes the workload "
                          f"committed in the {live.window_s:.0f} s after the followers had "
                          "caught up")
    for column in ("follower", "table", "rows", "events applied", "latency p50", "p99",
                   "verify"):
        table.add_column(column, justify="left" if column in ("follower", "table", "verify")
                         else "right")
    unequal = []
    for name, kind in FOLLOWERS.items():
        report, progress = live.verify[name], follower.job.progress[name]
        overall = LatencyHistogram()
        baseline = live.baseline.get(name, {})
        for result in report.tables:
            topic = f"shop.{result.table}"
            hist = progress.latency_by_topic.get(topic, LatencyHistogram())
            window = hist.since(baseline.get(topic, LatencyHistogram()))
            overall.merge(window)
            table.add_row(f"{name} ({kind})", str(result.table), f"{result.rows:,}",
                          f"{progress.records_by_topic.get(topic, 0):,}",
                          format_seconds(window.quantile(0.5)),
                          format_seconds(window.quantile(0.99)),
                          "[green]equal[/]" if result.differing == 0 else
                          f"[red]{result.differing:,} differ[/]")
        table.add_row(f"{name} ({kind})", "all", f"{report.rows:,}", f"{progress.records:,}",
                      format_seconds(overall.quantile(0.5)),
                      format_seconds(overall.quantile(0.99)),
                      "[green]equal[/]" if report.equal else "[red]differs[/]", style="bold",
                      end_section=True)
        if not report.equal:
            unequal.append(name)
    view_progress = follower.job.progress[VIEW]
    for name, checked in live.views.items():
        table.add_row(f"{name} ({FOLLOWERS[name]})", f"view {VIEW}", f"{checked.rows:,}",
                      f"{view_progress.written + view_progress.deleted:,} view rows",
                      "", "", "[green]equal[/]" if checked.equal else
                      f"[red]{len(checked.differences):,} differ[/]")
        if not checked.equal:
            unequal.append(f"{name} (view {VIEW})")
    console.print(table)
    console.print(_probe_table(live))
    if workload.error is not None:
        console.print(f"[yellow]workload error:[/] {workload.error}")
    if unequal:
        raise CdcError(f"follower(s) {', '.join(unequal)} do not equal the leader",
                       "this is a bug: please report it with the keys listed above")
    config_file = config.base_dir / "cdc.yaml"
    batches = sum(p.batches for p in follower.job.progress.values())
    console.print(f"[green]Redis, Delta, the search index, the SQL follower and the view "
                  f"{VIEW} equal {leader.title}[/] ({batches:,} micro-batches). Try:\n"
                  f"  cdc search --config {config_file} --follower search 'name:customer'\n"
                  f"  cdc log dump --config {config_file} | head\n"
                  f"  sqlite3 {config.base_dir / 'reporting.sqlite'} 'SELECT * FROM {VIEW} "
                  "ORDER BY revenue DESC LIMIT 5'",
                  highlight=False)
