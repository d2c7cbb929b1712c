"""``cdc demo``: PostgreSQL -> change log -> Spark -> Redis, Delta and search, live, then
``cdc verify`` for each follower.

A throwaway PostgreSQL cluster (initdb on a free port, wal_level=logical) gets a small shop
schema and data. Three followers of three kinds run side by side in one Spark application:
``cache`` (a throwaway ``redis-server``), ``warehouse`` (Delta tables, SCD1, under the demo
directory) and ``search`` (a Tantivy index there). While a workload keeps writing:
``cdc bootstrap`` snapshots the tables into a fresh log (the SparkSession starts meanwhile), then
``cdc capture`` streams the rest and ``cdc apply --follower cache --follower warehouse
--follower search`` runs continuously in this process. Once every follower has caught up, the
workload writes for ``seconds`` more (the latencies reported are of the changes committed in
that window), then stops; ``cdc verify`` waits for capture and each follower's watermark and
compares every table. The summary: per follower and table, rows, events applied and
commit -> applied latency p50/p99. The config it writes (``<dir>/cdc.yaml``) works with every
``cdc`` command while the demo runs (``cdc search``, ``cdc warehouse``, ``cdc verify``...).
"""

from __future__ import annotations

import logging
import random
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from cdc.avro import EventCodec
from cdc.config import Config, load_config
from cdc.console import make_console
from cdc.coordinator import bootstrap, open_log, run_capture
from cdc.errors import CdcError
from cdc.log.local import LocalChangeLog
from cdc.offsets import offset_text
from cdc.servers.postgres import ThrowawayPostgres
from cdc.servers.redis import ThrowawayRedis
from cdc.verify import VerifyReport

if TYPE_CHECKING:
    from spark_apply.jobs import ApplyJob
    from spark_apply.latency import LatencyHistogram

#: the followers the demo writes into its config, and their kinds
FOLLOWERS = {"cache": "Redis", "warehouse": "Delta (SCD1)", "search": "Tantivy"}
#: at most this long for the follower to catch up with the backlog before the measured window
CATCH_UP_S = 120.0

SHOP_SCHEMA = """
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


def run_pg_demo(directory: str, seconds: float) -> None:
    console = make_console()
    root = Path(directory).resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    console.rule("[bold]cdc demo: PostgreSQL -> change log -> Spark -> Redis, Delta, search")
    # (its data lives in a fresh temporary directory the unprivileged server user can reach)
    with ThrowawayPostgres() as pg, ThrowawayRedis() as cache:
        console.print(f"throwaway PostgreSQL on 127.0.0.1:{pg.port} (wal_level=logical), "
                      f"throwaway Redis on 127.0.0.1:{cache.port} (follower cache); Delta "
                      f"tables (follower warehouse) and a search index (follower search) "
                      f"under {root}")
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE shop")
        with psycopg.connect(pg.dsn("shop"), autocommit=True) as conn:
            conn.execute(SHOP_SCHEMA)
        console.print("shop schema: customers (2,000 rows), orders (30,000 rows)")
        config_path = _write_config(root, pg.dsn("shop"), cache.url)
        console.print(f"config: {config_path}")
        config = load_config(config_path)
        workload = ShopWorkload(pg.dsn("shop"))
        follower = LiveApply(config)
        writer, codec = open_log(config)
        try:
            follower.start_spark()  # 10-20 s on 2 cores: overlaps the bootstrap
            workload.start()
            console.rule("bootstrap (snapshot while the workload writes; Spark starts meanwhile)")
            report = bootstrap(config, config.sources[0], writer, codec, console)
            console.print(f"snapshot of {sum(report.rows.values()):,} rows durable in "
                          f"{report.seconds:.1f} s; streaming from the slot's consistent point")
            console.rule("capture + cdc apply " + " ".join(f"--follower {name}"
                                                            for name in FOLLOWERS)
                         + " (continuous)")
            follower.start_queries()
            verified = _capture_live(config, writer, codec, workload, follower, seconds,
                                     console)
        finally:
            workload.stop()
            follower.stop()
            writer.close()
        _summary(config, follower, verified, workload, console)


class LiveApply:
    """``cdc apply`` of every demo follower running continuously in this process: the SparkSession
    starts in a thread (:meth:`start_spark`), the queries once the log exists
    (:meth:`start_queries`); :meth:`stop` ends them like SIGTERM does."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.job: ApplyJob | None = None
        self.error: BaseException | None = None
        self._spark: Any = None
        self._spark_ready = threading.Event()
        self._thread: threading.Thread | None = None

    def start_spark(self) -> None:
        logging.getLogger("py4j").setLevel(logging.WARNING)  # its INFO lines would interleave

        def start() -> None:
            from spark_apply.jobs import start_spark

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
        job = self.job = ApplyJob.prepare(self.config, list(FOLLOWERS))
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


def _write_config(root: Path, dsn: str, redis_url: str) -> Path:
    path = root / "cdc.yaml"
    path.write_text(f"""\
# written by `cdc demo`; valid while the demo's PostgreSQL runs
log:
  path: {root / 'log'}
  partitions: 8
sources:
  - name: shop
    kind: postgres
    dsn: {dsn}
    tables: [public.customers, public.orders]
    heartbeat_interval: 1s
followers:
  cache:
    kind: redis
    url: {redis_url}
    trigger_interval: 250ms
  warehouse:
    kind: delta
    path: {root / 'warehouse'}
    mode: scd1
    buckets: 4
    trigger_interval: 1s
  search:
    kind: search
    path: {root / 'search'}
    text_fields:
      public.customers: [name, email]
      public.orders: [status, note]
    trigger_interval: 500ms
""")
    return path


class ShopWorkload:
    """Orders placed, paid, shipped and cancelled; customers renamed; a thread of its own."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
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
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self._stop.is_set():
                    with conn.transaction():
                        for _ in range(rng.randint(1, 5)):
                            next_id = self._change(conn, rng, next_id)
                    self.transactions += 1
                    time.sleep(0.002)
        except BaseException as exc:  # noqa: BLE001 - shown in the summary
            self.error = exc

    def _change(self, conn: psycopg.Connection[Any], rng: random.Random, next_id: int) -> int:
        roll = rng.random()
        order = rng.randint(1, next_id)
        if roll < 0.4:
            conn.execute("INSERT INTO orders (id, customer_id, amount, items) VALUES "
                         "(%s, %s, %s, '[]')", (next_id, rng.randint(1, 2000),
                                                rng.randint(100, 100_000) / 100))
            next_id += 1
        elif roll < 0.8:
            conn.execute("UPDATE orders SET status = %s WHERE id = %s",
                         (rng.choice(["paid", "shipped", "cancelled"]), order))
        elif roll < 0.9:
            conn.execute("DELETE FROM orders WHERE id = %s", (order,))
        else:
            conn.execute("UPDATE customers SET name = name || '*' WHERE id = %s",
                         (rng.randint(1, 2000),))
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


def _capture_live(config: Config, writer: LocalChangeLog, codec: EventCodec,
                  workload: ShopWorkload, follower: LiveApply, seconds: float,
                  console: Console) -> LiveResult:
    """Capture in a thread and the follower running: wait until the follower has caught up,
    measure ``seconds`` of workload, stop the workload, then ``cdc verify`` (capture and apply
    still running: verify's heartbeat must travel through both)."""
    from cdc.verify import verify
    from sinks import open_sink

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

    def view(phase: str) -> Group:
        offset = writer.source_offsets().get("shop", {})
        return Group(f"{phase}\nworkload: {workload.transactions:,} transactions, "
                     f"{workload.changes:,} changes written | log: committed up to LSN "
                     f"{offset_text(offset)}", job.table())

    result = LiveResult()
    try:
        with Live(view(""), console=console, refresh_per_second=4) as live:
            began = time.monotonic()
            target: int | None = None  # the log's LSN when every follower had a batch
            while time.monotonic() - began < CATCH_UP_S:
                follower.check()
                if errors:
                    raise errors[0]
                progress = job.progress.values()
                if target is None and all(p.batches for p in progress):
                    target = int(writer.source_offsets().get("shop", {}).get("lsn", 0))
                reached = min(int(p.watermarks.get("shop", {}).get("lsn", -1)) for p in progress)
                if target is not None and reached >= target:
                    break
                live.update(view("the followers are catching up with the snapshot and "
                                 "backlog"))
                time.sleep(0.25)
            result.baseline = {name: {t: h.copy() for t, h in p.latency_by_topic.items()}
                               for name, p in job.progress.items()}
            began, written = time.monotonic(), workload.changes
            while time.monotonic() - began < seconds and thread.is_alive():
                follower.check()
                left = seconds - (time.monotonic() - began)
                live.update(view(f"measuring commit -> applied latency: {left:.0f} s left"))
                time.sleep(0.25)
            workload.stop()
            result.window_s = time.monotonic() - began
            result.changes_in_window = workload.changes - written
            live.update(view("workload stopped; waiting for capture to catch up"))
            _wait_caught_up(config, writer, thread)
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
            follower.check()
    finally:
        stop.set()
        thread.join(30)
    if errors:
        raise errors[0]
    return result


def _wait_caught_up(config: Config, writer: LocalChangeLog, thread: threading.Thread) -> None:
    from cdc.position import parse_lsn

    source = config.sources[0]
    with psycopg.connect(source.dsn.reveal(), autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    target = parse_lsn(row[0]) if row else 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and thread.is_alive():
        if int(writer.source_offsets().get(source.name, {}).get("lsn", 0)) >= target:
            return
        time.sleep(0.1)


def _summary(config: Config, follower: LiveApply, live: LiveResult, workload: ShopWorkload,
             console: Console) -> None:
    from cdc.verify import print_report
    from spark_apply.latency import LatencyHistogram, format_seconds

    assert follower.job is not None
    table = Table(title="summary: PostgreSQL -> log -> Spark -> followers",
                  caption=f"latency: commit at PostgreSQL -> applied in the follower, per "
                          f"change, for the {live.changes_in_window:,} changes the workload "
                          f"committed in the {live.window_s:.0f} s after the followers had "
                          "caught up")
    for column in ("follower", "table", "rows", "events applied", "latency p50", "p99",
                   "verify"):
        table.add_column(column, justify="left" if column in ("follower", "table", "verify")
                         else "right")
    unequal = []
    for name, kind in FOLLOWERS.items():
        report, progress = live.verify[name], follower.job.progress[name]
        print_report(report, console, limit=10)
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
    console.print(table)
    if workload.error is not None:
        console.print(f"[yellow]workload error:[/] {workload.error}")
    if unequal:
        raise CdcError(f"follower(s) {', '.join(unequal)} do not equal the leader",
                       "this is a bug: please report it with the keys listed above")
    config_file = config.base_dir / "cdc.yaml"
    batches = sum(p.batches for p in follower.job.progress.values())
    console.print(f"[green]Redis, Delta and the search index equal PostgreSQL[/] ({batches:,} "
                  f"micro-batches). Try:\n  cdc search --config {config_file} --follower "
                  f"search 'name:customer'\n  cdc log dump --config {config_file} | head",
                  highlight=False)
