"""Views: incremental maintenance against recomputing the same SQL in Spark, and the SQL
follower's speed into PostgreSQL. One run; the JSON of the results is the last line of stdout.

The view is issue 14's join + aggregate::

    SELECT c.id AS customer_id, c.name, count(*) AS orders, sum(o.amount) AS revenue
    FROM public.orders o JOIN public.customers c ON o.customer_id = c.id GROUP BY c.id, c.name

over ``--orders`` orders (default 2,000,000) and ``--customers`` customers (100,000), written
to a local change log with the project's codec and writer (no capture). The change mix of each
``--changes`` (50,000) round, one change per transaction: 60 % order updates (amount changed;
one in three also moves the order to another customer), 15 % new orders, 15 % deleted orders,
10 % customer renames.

Phases (one SparkSession: ``local[2,3]``, or with ``--master cluster`` a throwaway standalone
cluster of 2 workers x 1 core, where each view batch runs as an executor task):

1. **Build**: the view from offset 0 of the log (``cdc apply --once --view``), and a Delta SCD1
   follower of the base tables (what a Spark recomputation reads). Reported, not a goal.
2. **Incremental**: first an *empty round* (one change that changes no view row: an order's
   ``sku``, which the view does not read), then a round of ``--changes`` changes; each time
   ``cdc apply --once --view`` until the view's follower (Delta) is current.
   ``incremental_s``: the micro-batches' time (the batch handler's: reading the log, the
   view's step, the writes into the follower), i.e.
   from the changes being in the log to the follower being current, without the query's start
   and stop, which a running ``cdc apply`` does not pay (``incremental_wall_s`` has them).
3. **Recompute**: append another round, then bring the base tables' Delta follower current
   (its micro-batches' time, as above) and run the same SQL in Spark over them (translated by
   sqlglot; decimals cast back from the follower's text), overwriting a Delta table with the
   result. ``recompute_s`` is the sum. The incremental view then takes this round too, and its
   rows must equal Spark's (``view_equals_spark``).
4. **SQL follower**: ``--sql-changes`` (200,000) order changes (half inserts, half updates) of a
   separate log into a throwaway PostgreSQL database through ``kind: sql``; changes/s.

``incremental_speedup`` = recompute seconds / the round's full micro-batch seconds (goal >= 100
at 10M orders and 1,000-change rounds); ``view_changes_per_s`` = changes / incremental seconds
(goal >= 20,000 at the default 50,000-change rounds); ``empty_round_s``: the empty round's
micro-batch seconds; ``marginal_s`` = incremental - empty (goal: at 10M orders at most twice
its value at 1M, two runs); ``state_rows_scanned``: the rows the view's state read in the round
(DuckDB's own profiler), ``touched_rows`` the base rows of the groups the round touched (each
changed order's old and new customer and every renamed customer: their orders and the
customer), ``scan_ratio`` the first over the second; ``driver_peak_rss_mb``: the driver's JVM
peak resident memory plus what the driver's Python grew by in the incremental rounds (the
bench's own model of the tables lives in the same Python and is left out).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import NO_DSN, BenchEnv, console, goal, print_json, uptime  # noqa: E402
from cdc.avro import EventCodec  # noqa: E402
from cdc.events import (  # noqa: E402
    ChangeEvent,
    Column,
    Op,
    TableId,
    TableSchema,
    TransactionInfo,
)
from cdc.position import Position  # noqa: E402
from cdc.types import ColumnType  # noqa: E402

SOURCE = "shop"
SQL = ("SELECT c.id AS customer_id, c.name, count(*) AS orders, sum(o.amount) AS revenue "
       "FROM public.orders o JOIN public.customers c ON o.customer_id = c.id "
       "GROUP BY c.id, c.name")
CUSTOMERS = TableSchema(
    source=SOURCE, database="shop", table=TableId("public", "customers"),
    columns=(Column("id", ColumnType("int64", source_type="bigint"), nullable=False),
             Column("name", ColumnType("string", source_type="text"), nullable=False),
             Column("region", ColumnType("string", source_type="text"))),
    key=("id",))
ORDERS = TableSchema(
    source=SOURCE, database="shop", table=TableId("public", "orders"),
    columns=(Column("id", ColumnType("int64", source_type="bigint"), nullable=False),
             Column("customer_id", ColumnType("int64", source_type="bigint"), nullable=False),
             Column("amount", ColumnType("decimal", 12, 2, source_type="numeric(12,2)"),
                    nullable=False),
             Column("sku", ColumnType("string", source_type="text"), nullable=False)),
    key=("id",))
MIX = "60% order updates (1 in 3 moves the order to another customer), 15% inserts, " \
      "15% deletes, 10% customer renames; one change per transaction"


class Shop:
    """The two tables' model and their change events (deterministic for a seed)."""

    def __init__(self, customers: int, orders: int, seed: int = 11) -> None:
        self.random = random.Random(seed)
        self.customers = customers
        self.orders: dict[int, tuple[int, Decimal, str]] = {}
        self.next_order = 1
        self.position = 0
        self.size = orders

    def _event(self, table: TableSchema, op: Op, after: dict[str, Any] | None,
               before: dict[str, Any] | None = None) -> ChangeEvent:
        self.position += 1
        return ChangeEvent(table, op, Position.test(self.position), ts_ms=int(time.time() * 1000),
                           before=before, after=after,
                           source_info={"txId": self.position, "lsn": self.position * 64},
                           transaction=TransactionInfo(str(self.position), 1, 1))

    def _order(self, key: int) -> dict[str, Any]:
        customer, amount, sku = self.orders[key]
        return {"id": key, "customer_id": customer, "amount": amount, "sku": sku}

    def _new_order(self) -> int:
        key = self.next_order
        self.next_order += 1
        self.orders[key] = (self.random.randint(1, self.customers),
                            Decimal(self.random.randrange(1, 1_000_000)).scaleb(-2),
                            f"sku{self.random.randrange(50)}")
        return key

    def initial(self) -> Iterator[ChangeEvent]:
        for key in range(1, self.customers + 1):
            yield self._event(CUSTOMERS, Op.READ, {"id": key, "name": f"customer {key}",
                                                   "region": ("n", "s", "e")[key % 3]})
        for _ in range(self.size):
            yield self._event(ORDERS, Op.READ, self._order(self._new_order()))

    def untouched_change(self) -> ChangeEvent:
        """One order's ``sku`` changed: no view row changes (the view does not read it)."""
        key = next(iter(self.orders))
        customer, amount, sku = self.orders[key]
        self.orders[key] = (customer, amount, sku + "x")
        return self._event(ORDERS, Op.UPDATE, self._order(key))

    def touched_rows(self, customers: set[int]) -> int:
        """The base rows of the groups of ``customers``: their orders and themselves."""
        return sum(1 for customer, _, _ in self.orders.values() if customer in customers) + \
            len(customers)

    def changes(self, count: int, touched: set[int] | None = None) -> Iterator[ChangeEvent]:
        """``count`` changes of the mix; the customers whose group they touch go into
        ``touched`` (an order's old and new customer, a renamed customer)."""
        touched = set() if touched is None else touched
        rnd = self.random
        keys = list(self.orders)
        for _ in range(count):
            roll = rnd.random()
            if roll < 0.6:
                key = rnd.choice(keys)
                if key not in self.orders:
                    continue
                customer, amount, sku = self.orders[key]
                touched.add(customer)
                if rnd.random() < 1 / 3:
                    customer = rnd.randint(1, self.customers)
                touched.add(customer)
                self.orders[key] = (customer, amount + 1, sku)
                yield self._event(ORDERS, Op.UPDATE, self._order(key))
            elif roll < 0.75:
                key = self._new_order()
                keys.append(key)
                touched.add(self.orders[key][0])
                yield self._event(ORDERS, Op.CREATE, self._order(key))
            elif roll < 0.9:
                key = rnd.choice(keys)
                if key not in self.orders:
                    continue
                before = self._order(key)
                touched.add(self.orders[key][0])
                del self.orders[key]
                yield self._event(ORDERS, Op.DELETE, None, before)
            else:
                key = rnd.randint(1, self.customers)
                touched.add(key)
                yield self._event(CUSTOMERS, Op.UPDATE, {"id": key, "name": f"renamed {key} "
                                                         f"{self.position}", "region": "w"})


def append(settings: dict[str, Any], events: Iterator[ChangeEvent], total: int,
           label: str, chunk: int = 5000) -> float:
    """Append ``events`` to the log of ``settings`` (with a progress bar); seconds."""
    from cdc.log.open import writer_from

    started = time.perf_counter()
    writer = writer_from(settings)
    try:
        codec = EventCodec(writer.schemas())
        for table in (CUSTOMERS, ORDERS):
            writer.ensure_topic(table.topic, {"source": SOURCE, "table": str(table.table)})
        out = writer.for_source(SOURCE)
        batch: list[Any] = []
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(label, total=total)
            for event in events:
                batch.extend(codec.records(event))
                if len(batch) >= chunk:
                    out.append(batch, _offset(event))
                    progress.advance(task, len(batch))
                    batch = []
            if batch:
                out.append(batch, _offset(event))
                progress.advance(task, len(batch))
    finally:
        writer.close()
    return time.perf_counter() - started


def _offset(event: ChangeEvent) -> dict[str, Any]:
    lsn = int(event.source_info["lsn"])
    return {SOURCE: {"lsn": lsn, "lsn_text": f"0/{lsn:X}"}}


def write_config(env: BenchEnv, settings: dict[str, Any], followers: dict[str, Any],
                 views: dict[str, Any], name: str) -> Path:
    document = {"log": settings,
                "sources": [{"name": SOURCE, "kind": "postgres", "dsn": NO_DSN,
                             "tables": ["public.customers", "public.orders"]}],
                "followers": followers, "views": views,
                "spark": {"master": env.spark_master_url, "conf": env.spark_conf}}
    path = env.root / f"cdc-{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def spark_recompute(env: BenchEnv, base: Path, out: Path) -> Any:
    """The view's SQL in Spark over the base tables' Delta follower, written over ``out``."""
    from sinks.delta import table_dir
    from spark_apply.views_check import spark_sql, temp_view_name

    spark = env.spark
    casts = {"orders": "CAST(id AS BIGINT) AS id, CAST(customer_id AS BIGINT) AS customer_id, "
                       "CAST(amount AS DECIMAL(12,2)) AS amount, sku",
             "customers": "CAST(id AS BIGINT) AS id, name, region"}
    for table, columns in casts.items():
        path = table_dir(base, f"{SOURCE}.public.{table}")
        spark.sql(f"SELECT {columns} FROM delta.`{path}` WHERE NOT _cdc_deleted") \
            .createOrReplaceTempView(temp_view_name(TableId("public", table)))
    frame = spark.sql(spark_sql(SQL, "postgres"))
    frame.write.format("delta").mode("overwrite").save(str(out))
    return frame


def view_rows_delta(path: Path) -> dict[int, tuple[str, int, str]]:
    """The incremental view's live rows in its Delta follower."""
    from deltalake import DeltaTable

    data = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return {int(row["customer_id"]): (str(row["name"]), int(row["orders"]),
                                      str(Decimal(str(row["revenue"]))))
            for row in data if not row["_cdc_deleted"]}


def spark_rows(path: Path) -> dict[int, tuple[str, int, str]]:
    from deltalake import DeltaTable

    data = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return {int(row["customer_id"]): (str(row["name"]), int(row["orders"]),
                                      str(Decimal(str(row["revenue"])))) for row in data}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from sinks.delta import table_dir
    from views.sink import view_topic

    results: dict[str, Any] = {"orders": args.orders, "customers": args.customers,
                               "changes": args.changes, "mix": MIX, "view_sql": SQL,
                               "uptime_start": uptime()}
    with BenchEnv(master=args.master) as env:
        env.start_spark("bench-views")
        settings = {"path": str(env.root / "log"), "partitions": 8, "fsync": False}
        shop = Shop(args.customers, args.orders)
        results["log_build_s"] = round(append(settings, shop.initial(),
                                              args.customers + args.orders, "initial rows"), 1)
        followers = {
            "base": {"kind": "delta", "path": str(env.root / "base"), "buckets": 16,
                     "max_records_per_batch": 5_000_000, "tables": ["public.customers",
                                                                    "public.orders"],
                     "checkpoint": str(env.root / "ck-base")},
            "warehouse": {"kind": "delta", "path": str(env.root / "warehouse"),
                          "tables": ["public.customers"],
                          "checkpoint": str(env.root / "ck-warehouse")}}
        views = {"revenue": {"source": SOURCE, "sql": SQL, "key": ["customer_id"],
                             "followers": ["warehouse"], "max_records_per_batch": args.batch,
                             "checkpoint": str(env.root / "ck-view"),
                             "state": str(env.root / "view.duckdb")}}
        config = write_config(env, settings, followers, views, "views")
        console.print("building the view from offset 0 ...")
        results["view_build_s"] = round(env.apply_once(config, ["revenue"])[0], 1)
        seconds, _ = env.apply_once(config, ["base"])
        results["base_tables_build_s"] = round(seconds, 1)

        console.print(f"an empty round, then incremental: {args.changes:,} changes ...")
        driver = DriverMemory(env)
        append(settings, iter([shop.untouched_change()]), 1, "empty round")
        _, job = env.apply_once(config, ["revenue"])
        empty = job.progress["revenue"].seconds
        touched: set[int] = set()
        results["append_s"] = round(append(settings, shop.changes(args.changes, touched),
                                           args.changes, "changes"), 2)
        wall, job = env.apply_once(config, ["revenue"])
        progress = job.progress["revenue"]
        incremental = progress.seconds  # the micro-batches' handler time
        touched_rows = shop.touched_rows(touched)
        results.update(incremental_s=round(incremental, 3), incremental_wall_s=round(wall, 2),
                       empty_round_s=round(empty, 3),
                       marginal_s=round(incremental - empty, 3),
                       incremental_batches=progress.batches,
                       incremental_read_fold_s=round(progress.fold_seconds, 2),
                       incremental_sink_s=round(progress.sink_seconds, 2),
                       incremental_phases_s={phase: round(seconds, 3) for phase, seconds
                                             in progress.phases.items()},
                       view_rows_written=progress.written, view_rows_deleted=progress.deleted,
                       state_rows_scanned=progress.scanned, touched_groups=len(touched),
                       touched_rows=touched_rows,
                       scan_ratio=round(progress.scanned / max(1, touched_rows), 1),
                       driver_peak_rss_mb=driver.peak_mb())

        console.print(f"recompute in Spark: {args.changes:,} changes ...")
        append(settings, shop.changes(args.changes), args.changes, "changes")
        wall, job = env.apply_once(config, ["base"])
        base_s = job.progress["base"].seconds
        started = time.perf_counter()
        spark_recompute(env, env.root / "base", env.root / "recomputed")
        sql_s = time.perf_counter() - started
        recompute = base_s + sql_s
        results.update(recompute_s=round(recompute, 2), recompute_base_tables_s=round(base_s, 2),
                       recompute_sql_write_s=round(sql_s, 2),
                       recompute_wall_s=round(wall + sql_s, 2))
        env.apply_once(config, ["revenue"])
        view_path = table_dir(env.root / "warehouse", view_topic(SOURCE, "revenue"))
        results["view_equals_spark"] = view_rows_delta(view_path) == \
            spark_rows(env.root / "recomputed")
        results["incremental_speedup"] = round(recompute / incremental, 2)
        results["view_changes_per_s"] = round(args.changes / incremental)
        if not args.skip_sql:
            results.update(sql_follower(env, args.sql_changes))
    results["uptime_end"] = uptime()
    results["goals"] = {"incremental_speedup": goal(results["incremental_speedup"], 100),
                        "view_changes_per_s": goal(results["view_changes_per_s"], 20_000)}
    return results


class DriverMemory:
    """The driver's memory as ``cdc apply`` uses it: the peak resident size of its JVM (Spark's
    driver) plus how much its Python grew from now on (the bench's model of the tables lives in
    the same Python, so its absolute size says nothing of the apply)."""

    def __init__(self, env: BenchEnv) -> None:
        self.jvm = env.spark.sparkContext._gateway.proc.pid  # noqa: SLF001 - py4j's JVM
        self.python_start = _status_kb(os.getpid(), "VmRSS")

    def peak_mb(self) -> int:
        jvm = _status_kb(self.jvm, "VmHWM")
        grown = max(0, _status_kb(os.getpid(), "VmHWM") - self.python_start)
        return round((jvm + grown) / 1024)


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def sql_follower(env: BenchEnv, changes: int) -> dict[str, Any]:
    """``changes`` order changes (half inserts, half updates) into a throwaway PostgreSQL
    database through ``kind: sql``."""
    import psycopg

    from cdc_app.servers.postgres import ThrowawayPostgres

    console.print(f"SQL follower: {changes:,} changes into PostgreSQL ...")
    with ThrowawayPostgres() as pg:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE reporting")
        url = pg.dsn("reporting").replace("postgresql://", "postgresql+psycopg://", 1)
        settings = {"path": str(env.root / "sql-log"), "partitions": 8, "fsync": False}
        shop = Shop(1000, changes // 2, seed=3)
        events = list(shop.initial())[1000:]  # the orders' inserts
        events += [event for event in shop.changes(changes) if event.op is Op.UPDATE
                   and event.schema is ORDERS][: changes - len(events)]
        append(settings, iter(events), len(events), "sql follower's changes")
        followers = {"reporting": {"kind": "sql", "url": url, "tables": ["public.orders"],
                                   "checkpoint": str(env.root / "ck-sql")}}
        config = write_config(env, settings, followers, {}, "sql")
        seconds, job = env.apply_once(config, ["reporting"])
        progress = job.progress["reporting"]
    return {"sql_follower_changes": len(events), "sql_follower_s": round(seconds, 2),
            "sql_follower_changes_per_s": round(len(events) / seconds),
            "sql_follower_sink_s": round(progress.sink_seconds, 2)}


def report(results: dict[str, Any]) -> None:
    table = Table(title="views: incremental vs recompute in Spark")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name in ("view_build_s", "base_tables_build_s", "empty_round_s", "incremental_s",
                 "marginal_s", "recompute_s", "incremental_speedup", "view_changes_per_s",
                 "state_rows_scanned", "touched_rows", "scan_ratio", "driver_peak_rss_mb",
                 "view_equals_spark", "sql_follower_changes_per_s"):
        if name in results:
            table.add_row(name, str(results[name]))
    console.print(table)
    print_json(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--orders", type=int, default=2_000_000)
    parser.add_argument("--customers", type=int, default=100_000)
    parser.add_argument("--changes", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=100_000,
                        help="the view's max_records_per_batch (its default)")
    parser.add_argument("--sql-changes", type=int, default=200_000)
    parser.add_argument("--skip-sql", action="store_true")
    parser.add_argument("--master", default="local", choices=["local", "cluster"],
                        help="cluster: a throwaway standalone cluster, 2 workers x 1 core")
    report(run(parser.parse_args()))


if __name__ == "__main__":
    main()
