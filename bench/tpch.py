"""Benchmark: TPC-H end to end. PostgreSQL holds TPC-H at ``--scale`` (default 1: 6M lineitems),
``cdc capture`` tails it, one continuous ``cdc apply`` keeps the 22 queries as views (their
``ORDER BY ... LIMIT`` kept) in a Delta follower; rounds of about 1,000 changes each go through;
per query, the round's seconds against the same query recomputed by Spark over the followed
tables and by PostgreSQL itself, in the same run. The JSON of the results is the last line.

``.venv/bin/python bench/tpch.py [--scale 1] [--rounds 5] [--orders 60] [--updates 400]
[--queries q01,q02,...] [--spark-runs 1] [--pg-timeout 600]``

Phases:

1. **Leader**: ``tpchgen-cli`` writes the tables (the spec's generator); a throwaway PostgreSQL
   gets them by ``COPY`` with the spec's types (``tests/test_tpch_views.py``: ``CHAR(n)``,
   ``DECIMAL(15,2)``, ``DATE``), indexes on the foreign keys PostgreSQL's own plans need
   (without one on ``l_partkey`` Q17 and Q20 run for hours), ``ANALYZE``.
2. **Capture**: ``cdc bootstrap`` (the snapshot into the log), then ``cdc capture`` runs.
3. **Build**: ``cdc apply --once`` of the 22 views from offset 0 (reported, not a goal), and of
   ``base``, a Delta follower of the 8 tables (what Spark's recomputation reads).
4. **Rounds**: a continuous ``cdc apply`` of the 22 views runs (in this process; Spark's local
   mode, each view's state held open by the apply: ``views/host.py``). Each round writes the
   spec's refresh functions to the leader, ``--orders`` new orders with 1-7 lineitems (RF1, an
   order a transaction) and ``--orders`` orders deleted with their lineitems (RF2, one
   transaction), then ``--updates`` updates of the columns the queries filter, group and sum on
   (transactions of 10), and waits until every view applied the leader's position. In the
   ``--rounds`` measured rounds the views are held (the bench's hook into the apply loop) while
   the round is written and captured, then released one at a time: each takes the round in one
   batch, alone on the machine, as Spark's recomputation of it runs. Per query: the round's
   seconds (the view's batch time, median over rounds), the rows its state read (DuckDB's
   profiler), the keys it recomputed (of them revisited because a scalar subquery's value
   moved). Then ``--latency-rounds`` rounds are written as they commit with every view running:
   ``together_s`` is from the round's first write to every view applied, and commit -> visible
   per change its commit at the leader to its view's batch finished
   (``spark_apply/latency.py``), over every view.
5. **Equality**: while the apply still runs, ``cdc verify --view``'s check for each view (the
   leader's answer to the view's SQL against the follower's rows, modulo ties at a top-k's k-th
   place).
6. **Recompute**: ``base`` brought current (its seconds reported, not charged to Spark), then
   each query in Spark over ``base`` (the column types cast back from the follower's text, the
   ``CHAR(n)`` values' padding trimmed as PostgreSQL compares them), collected to the driver:
   the best of ``--spark-runs``; and each query in PostgreSQL (``statement_timeout``
   ``--pg-timeout``).

``speedup_spark`` = Spark's seconds / the view's round seconds (goal: median >= 100, every query
>= 10); ``speedup_pg`` the same against PostgreSQL; ``commit_to_visible_p50_s`` (goal < 2 s).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import (  # noqa: E402
    capture_command,
    current_lsn,
    goal,
    print_json,
    progress_bar,
    run_cdc,
    stop,
    stored_lsn,
    tail,
    uptime,
)
from tests.test_tpch_views import QUERIES, TABLES, Refresh, _ddl, _one_line  # noqa: E402

console = Console(stderr=True)
SOURCE = "tpch"
#: foreign-key indexes for PostgreSQL's own plans (its recomputation and verify's answers)
INDEXES = ("lineitem (l_partkey)", "lineitem (l_suppkey)", "orders (o_custkey)",
           "partsupp (ps_suppkey)", "customer (c_nationkey)", "supplier (s_nationkey)")


# ------------------------------------------------------------------------------- the leader

def queries(scale: float, wanted: list[str]) -> list[tuple[str, str, tuple[str, ...]]]:
    """The 22 queries (``wanted`` of them), Q11's FRACTION set for ``scale`` (0.0001 / SF)."""
    out = []
    for name, sql, key, _limited in QUERIES:
        if name not in wanted:
            continue
        text = _one_line(sql)
        if name == "q11":
            text = re.sub(r"\* 0\.\d+\b", f"* {0.0001 / scale:.10f}", text)
        out.append((name, text, key))
    return out


def generate(scale: float, folder: Path) -> None:
    tool = Path(sys.executable).parent / "tpchgen-cli"
    subprocess.run([str(tool), "tbl", "--scale-factor", str(scale), "--output-dir",
                    str(folder), "--quiet"], check=True)


def load_leader(dsn: str, folder: Path) -> dict[str, int]:
    """The spec's tables, their rows by COPY, indexes, ANALYZE; rows per table."""
    counts = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in _ddl():
            conn.execute(statement)
        with progress_bar(console, info=False) as progress:
            task = progress.add_task("COPY into PostgreSQL", total=len(TABLES))
            for name in TABLES:
                rows = 0
                with conn.cursor() as cursor, cursor.copy(
                        f"COPY {name} FROM STDIN (FORMAT text, DELIMITER '|')") as copy, \
                        open(folder / f"{name}.tbl", encoding="utf-8") as lines:
                    for line in lines:
                        copy.write(line[:-2] + "\n")  # without the generator's trailing '|'
                        rows += 1
                counts[name] = rows
                progress.advance(task)
        for number, columns in enumerate(INDEXES):
            conn.execute(f"CREATE INDEX tpch_fk_{number} ON {columns}")
        conn.execute("ANALYZE")
    return counts


class Changes(Refresh):
    """The test's refresh functions (RF1, RF2, updates) over the leader's keys, read from the
    leader (the rows themselves stay there)."""

    def __init__(self, dsn: str, seed: int) -> None:  # noqa: D107 - Refresh's fields
        self.rng = random.Random(seed)
        with psycopg.connect(dsn) as conn:
            self.prices = {key: str(price) for key, price in
                           conn.execute("SELECT p_partkey, p_retailprice FROM part")}
            counts = conn.execute("SELECT (SELECT count(*) FROM supplier), "
                                  "(SELECT count(*) FROM customer)").fetchone()
            assert counts is not None
            self.suppliers, self.customers = counts
            self.lines: dict[int, list[int]] = {}
            with conn.cursor().copy("COPY (SELECT l_orderkey, l_linenumber FROM lineitem) "
                                    "TO STDOUT") as copy:
                for order, line in copy.rows():
                    self.lines.setdefault(int(order), []).append(int(line))
            self.partsupp = [tuple(row) for row in
                             conn.execute("SELECT ps_partkey, ps_suppkey FROM partsupp")]
        self.next_order = max(self.lines) + 1

    def round(self, orders: int, updates: int) -> list[list[str]]:
        """One round's transactions, each a list of statements."""
        inserted = self.rf1(orders)
        out = [inserted[at:at + 2] for at in range(0, len(inserted), 2)]  # order + its lines
        out.append(self.rf2(orders))
        changed = self.updates(updates)
        out += [changed[at:at + 10] for at in range(0, len(changed), 10)]
        return out


def write(conn: psycopg.Connection[Any], transactions: list[list[str]]) -> int:
    """The transactions, each committed; rows changed."""
    changed = 0
    for statements in transactions:
        with conn.transaction():
            for statement in statements:
                changed += max(conn.execute(statement).rowcount, 0)
    return changed


# ------------------------------------------------------------------------------ the pipeline

def write_config(root: Path, dsn: str, chosen: list[tuple[str, str, tuple[str, ...]]],
                 view_memory: str) -> Path:
    tables = [f"public.{name}" for name in TABLES]
    document = {
        "log": {"path": str(root / "log"), "partitions": 8, "fsync": False,
                "commit_interval": "20ms"},
        "sources": [{"name": SOURCE, "kind": "postgres", "dsn": dsn, "tables": tables,
                     "heartbeat_interval": "1s"}],
        "followers": {
            "base": {"kind": "delta", "path": str(root / "base"), "tables": tables,
                     "max_records_per_batch": 5_000_000, "checkpoint": str(root / "ck-base")},
            "warehouse": {"kind": "delta", "path": str(root / "warehouse"),
                          "tables": ["public.region"], "checkpoint": str(root / "ck-wh")}},
        "views": {name: {"source": SOURCE, "sql": sql, "key": list(key),
                         "followers": ["warehouse"], "state": str(root / f"{name}.duckdb"),
                         "checkpoint": str(root / f"ck-{name}"), "memory_limit": view_memory}
                  for name, sql, key in chosen},
        "spark": {"master": "local[2,3]"}}
    path = root / "cdc.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def wait_captured(conn: psycopg.Connection[Any], log: Path, timeout: float = 600) -> int:
    """Until the log holds the leader's current position; that position."""
    target = current_lsn(conn)
    deadline = time.monotonic() + timeout
    while stored_lsn(log, SOURCE) < target:
        if time.monotonic() > deadline:
            raise RuntimeError(f"capture did not reach {target:X} in {timeout:.0f} s")
        time.sleep(0.05)
    return target


class Apply:
    """A continuous ``cdc apply`` of the views on a thread of this process. :meth:`hold` keeps
    all but the named views from starting batches (the bench's hook into the apply loop's
    eligibility test), so one view's batch can be timed alone."""

    def __init__(self, config: Any, names: list[str]) -> None:
        self.job: Any = None
        self.error: BaseException | None = None
        self.released: set[str] | None = None  # None: every view runs
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(config, names), daemon=True)
        self.thread.start()

    def _run(self, config: Any, names: list[str]) -> None:
        from spark_apply.jobs import run_apply

        def seen(job: Any) -> None:
            if self.job is None:
                eligible = job._eligible  # noqa: SLF001 - the bench's hook

                def held(f: Any, now: float) -> bool:
                    return (self.released is None or f.name in self.released) and \
                        eligible(f, now)

                job._eligible = held  # noqa: SLF001
                self.job = job

        try:
            run_apply(config, names, once=False, screen=seen, stop=self.stopping)
        except BaseException as exc:  # noqa: BLE001 - reported by wait()
            self.error = exc

    def hold(self, released: set[str] | None) -> None:
        """Only ``released`` views start batches from now on (None: all)."""
        self.released = released

    def progress(self) -> dict[str, Any]:
        while self.job is None:
            self._alive()
            time.sleep(0.05)
        progress: dict[str, Any] = self.job.progress
        return progress

    def _alive(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"cdc apply stopped: {self.error}") from self.error
        if not self.thread.is_alive():
            raise RuntimeError("cdc apply stopped")

    def wait_applied(self, lsn: int, names: list[str] | None = None,
                     timeout: float = 900) -> None:
        """Until every view (of ``names``) applied the source's position ``lsn``."""
        deadline = time.monotonic() + timeout
        while True:
            progress = self.progress()
            behind = [name for name in names or list(progress)
                      if int((progress[name].watermarks.get(SOURCE) or {}).get("lsn", 0)) < lsn]
            if not behind:
                return
            self._alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"views behind after {timeout:.0f} s: {', '.join(behind)}")
            time.sleep(0.01)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(300)


def rounds(args: argparse.Namespace, apply: Apply, conn: psycopg.Connection[Any], log: Path,
           changes: Changes, names: list[str]) -> dict[str, Any]:
    """The measured rounds, then the latency rounds (see the module docstring)."""
    from spark_apply.latency import LatencyHistogram

    per_view: dict[str, dict[str, Any]] = {
        n: {"s": [], "scanned": [], "keys": [], "revisited": [], "batches": []} for n in names}
    latency = LatencyHistogram()
    changed: list[int] = []
    together: list[float] = []
    apply.wait_applied(wait_captured(conn, log))
    with progress_bar(console, info=False) as bar:
        task = bar.add_task("rounds, each view alone", total=args.rounds)
        for _ in range(args.rounds):
            apply.hold(set())
            changed.append(write(conn, changes.round(args.orders, args.updates)))
            lsn = wait_captured(conn, log)
            for name in names:
                before = _counters(apply)[name]
                apply.hold({name})
                apply.wait_applied(lsn, [name])
                after = _counters(apply)[name]
                for index, field in enumerate(("s", "scanned", "keys", "revisited", "batches")):
                    per_view[name][field].append(after[index] - before[index])
                phases = per_view[name].setdefault("phases", {})
                for phase, spent in after[6].items():
                    phases.setdefault(phase, []).append(spent - before[6].get(phase, 0.0))
            apply.hold(None)
            bar.advance(task)
        task = bar.add_task("rounds as they commit, views together", total=args.latency_rounds)
        for _ in range(args.latency_rounds):
            start = _counters(apply)
            started = time.perf_counter()
            changed.append(write(conn, changes.round(args.orders, args.updates)))
            apply.wait_applied(wait_captured(conn, log))
            together.append(time.perf_counter() - started)
            for name, p in apply.progress().items():
                latency.merge(p.latency.since(start[name][5]))
            bar.advance(task)
    return {"per_view": per_view, "latency": latency, "changed": changed,
            "together_s": together}


def _counters(apply: Apply) -> dict[str, tuple[Any, ...]]:
    """Per view: seconds, rows scanned, keys written, revisited, batches, latencies, seconds
    per phase."""
    return {n: (p.seconds, p.scanned, p.written + p.deleted, p.revisited, p.batches,
                p.latency.copy(), dict(p.phases)) for n, p in apply.progress().items()}


def verify_all(config: Any, names: list[str]) -> dict[str, Any]:
    """``cdc verify --view``'s check of each view: equal, or the first differences."""
    from cdc.sink import open_sink
    from views.sink import view_holds
    from views.verify import verify_view

    out: dict[str, Any] = {}
    quiet = Console(quiet=True)  # verify's own report is not printed here
    with progress_bar(console, info=False) as bar:
        task = bar.add_task("verify against PostgreSQL", total=len(names))
        for name in names:
            sink = open_sink(config, "warehouse", view_holds(SOURCE, name))
            try:
                result = verify_view(config, name, "warehouse", sink, quiet, timeout=600)
            finally:
                sink.close()
            out[name] = True if result.equal else \
                [f"{d.key}: {d.describe()}" for d in result.differences[:3]]
            bar.advance(task)
    return out


# ---------------------------------------------------------------------------- recomputing

def spark_recompute(root: Path, chosen: list[tuple[str, str, tuple[str, ...]]],
                    runs: int) -> dict[str, float | None]:
    """Each query in Spark over the ``base`` follower's Delta tables: best of ``runs`` (None:
    Spark failed it)."""
    from cdc.events import TableId
    from sinks.delta import table_dir
    from spark_apply.session import spark_session
    from spark_apply.views_check import spark_view_sql, temp_view_name

    # the driver's default 1 GB does not hold the broadcast joins Spark plans at scale 0.3+
    spark = spark_session(master="local[2]", app_name="bench-tpch-recompute",
                          conf={"spark.driver.memory": "6g"})
    tables = [TableId("public", name) for name in TABLES]
    for table in tables:
        columns = []
        for column, kind in TABLES[table.table][0]:
            if kind.startswith("CHAR("):
                columns.append(f"rtrim({column}) AS {column}")
            elif kind == "INTEGER":
                columns.append(f"CAST({column} AS INT) AS {column}")
            elif kind != "DATE" and not kind.startswith("DECIMAL"):
                columns.append(column)
            else:
                columns.append(f"CAST({column} AS {kind}) AS {column}")
        path = table_dir(root / "base", f"{SOURCE}.public.{table.table}")
        spark.sql(f"SELECT {', '.join(columns)} FROM delta.`{path}` WHERE NOT _cdc_deleted") \
            .createOrReplaceTempView(temp_view_name(table))
    out: dict[str, float | None] = {}
    with progress_bar(console, info=False) as bar:
        task = bar.add_task("recompute in Spark", total=len(chosen) * runs)
        spark.sql(spark_view_sql(chosen[0][1], "postgres", tables)).collect()  # JIT warm-up
        for name, sql, _key in chosen:
            translated = spark_view_sql(sql, "postgres", tables)
            best: float | None = float("inf")
            for _ in range(runs):
                started = time.perf_counter()
                try:
                    spark.sql(translated).collect()
                except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                    console.print(f"  {name}: Spark failed: {str(exc).splitlines()[0][:200]}")
                    best = None
                    break
                best = min(best or float("inf"), time.perf_counter() - started)
                bar.advance(task)
            out[name] = best
    spark.stop()
    return out


def pg_recompute(dsn: str, chosen: list[tuple[str, str, tuple[str, ...]]], timeout: float
                 ) -> dict[str, float | None]:
    """Each query in PostgreSQL (None: over ``timeout`` seconds)."""
    out: dict[str, float | None] = {}
    with psycopg.connect(dsn, autocommit=True) as conn, progress_bar(console, info=False) as bar:
        conn.execute(f"SET statement_timeout = '{int(timeout * 1000)}ms'")
        task = bar.add_task("recompute in PostgreSQL", total=len(chosen))
        for name, sql, _key in chosen:
            started = time.perf_counter()
            try:
                conn.execute(sql).fetchall()
                out[name] = time.perf_counter() - started
            except psycopg.errors.QueryCanceled:
                out[name] = None
            bar.advance(task)
    return out


# ------------------------------------------------------------------------------------ run

def run(args: argparse.Namespace) -> dict[str, Any]:
    from cdc.config import load_config
    from cdc_app.servers.postgres import ThrowawayPostgres
    from spark_apply.jobs import run_apply

    wanted = args.queries.split(",")
    chosen = queries(args.scale, wanted)
    names = [name for name, _sql, _key in chosen]
    results: dict[str, Any] = {"scale": args.scale, "rounds": args.rounds, "orders": args.orders,
                               "updates": args.updates, "view_memory": args.view_memory,
                               "uptime_start": uptime()}
    with tempfile.TemporaryDirectory(prefix="cdc-bench-tpch-", dir=args.work) as folder, \
            ThrowawayPostgres(settings={"shared_buffers": "512MB", "work_mem": "64MB",
                                        "max_wal_size": "4GB"}) as pg:
        root = Path(folder)
        (root / "tbl").mkdir()
        started = time.perf_counter()
        console.print(f"TPC-H at scale {args.scale}: generating ...")
        generate(args.scale, root / "tbl")
        with psycopg.connect(pg.dsn("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE tpch")
        dsn = pg.dsn("tpch")
        results["rows"] = load_leader(dsn, root / "tbl")
        results["leader_load_s"] = round(time.perf_counter() - started, 1)
        changes = Changes(dsn, 45)
        config_path = write_config(root, dsn, chosen, args.view_memory)
        config = load_config(config_path)

        console.print("cdc bootstrap (the snapshot) ...")
        _, _, seconds = run_cdc(root, ["bootstrap", "--config", str(config_path)], "bootstrap",
                                timeout=3600)
        results["bootstrap_s"] = round(seconds, 1)
        capture_out = open(root / "capture.out", "wb")  # noqa: SIM115 - closed below
        capture = subprocess.Popen(capture_command(config_path, __file__), stdout=capture_out,
                                   stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            console.print(f"building the {len(names)} views from offset 0 ...")
            started = time.perf_counter()
            job = run_apply(config, names, once=True)
            results["views_build_s"] = round(time.perf_counter() - started, 1)
            results["build_per_view_s"] = {n: round(job.progress[n].seconds, 1) for n in names}
            console.print(f"  {results['views_build_s']} s")

            apply = Apply(config, names)
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    measured = rounds(args, apply, conn, root / "log", changes, names)
                results["verify"] = verify_all(config, names)
            finally:
                apply.close()
            console.print("bringing the base tables' follower current ...")
            started = time.perf_counter()
            run_apply(config, ["base"], once=True)
            results["base_follower_s"] = round(time.perf_counter() - started, 1)
        finally:
            stop(capture)
            capture_out.close()
            results["capture_tail"] = tail(root / "capture.out", 5)
        _save(args, results, measured)
        spark = spark_recompute(root, chosen, args.spark_runs)
        postgres = pg_recompute(dsn, chosen, args.pg_timeout)
        state_mb = {n: round((root / f"{n}.duckdb").stat().st_size / 1e6, 1) for n in names}
    results.update(figures(measured, spark, postgres, state_mb, results["verify"]))
    results["uptime_end"] = uptime()
    return results


def _save(args: argparse.Namespace, results: dict[str, Any], measured: dict[str, Any]) -> None:
    """What the run measured so far, into ``--partial`` (a failure later keeps it)."""
    if args.partial:
        Path(args.partial).write_text(json.dumps(
            {**results, "per_view": measured["per_view"], "together_s": measured["together_s"],
             "p50": measured["latency"].quantile(0.5), "p99": measured["latency"].quantile(0.99)},
            default=str))


def figures(measured: dict[str, Any], spark: dict[str, float | None],
            postgres: dict[str, float | None], state_mb: dict[str, float],
            verify: dict[str, Any]) -> dict[str, Any]:
    per_query = {}
    for name, one in measured["per_view"].items():
        round_s = statistics.median(one["s"])
        pg_s = postgres.get(name)
        spark_s = spark.get(name)
        per_query[name] = {
            "round_s": round(round_s, 4),
            "spark_s": None if spark_s is None else round(spark_s, 3),
            "pg_s": None if pg_s is None else round(pg_s, 3),
            "speedup_spark": None if spark_s is None else round(spark_s / max(round_s, 1e-6), 1),
            "speedup_pg": None if pg_s is None else round(pg_s / max(round_s, 1e-6), 1),
            "rows_scanned": int(statistics.median(one["scanned"])),
            "batches": int(statistics.median(one["batches"])),
            "phases_s": {phase: round(statistics.median(spent), 4)
                         for phase, spent in one.get("phases", {}).items()},
            "keys": int(sum(one["keys"])), "revisited": int(sum(one["revisited"])),
            "state_mb": state_mb[name], "equal": verify[name]}
    speedups = [one["speedup_spark"] for one in per_query.values()
                if one["speedup_spark"] is not None] or [0.0]
    latency = measured["latency"]
    p50, p99 = latency.quantile(0.5), latency.quantile(0.99)
    out = {"queries": per_query, "round_changes": measured["changed"],
           "median_speedup_spark": round(statistics.median(speedups), 1),
           "min_speedup_spark": min(speedups),
           "commit_to_visible_p50_s": p50, "commit_to_visible_p99_s": p99,
           "together_s": [round(x, 2) for x in measured["together_s"]],
           "all_equal": all(one["equal"] is True for one in per_query.values()),
           "private_states_mb": round(sum(state_mb.values()), 1)}
    out["goals"] = {"median_speedup_spark": goal(out["median_speedup_spark"], 100),
                    "min_speedup_spark": goal(out["min_speedup_spark"], 10),
                    "commit_to_visible_p50_s": goal(p50, 2, below=True)}
    return out


def report(results: dict[str, Any]) -> None:
    table = Table(title=f"TPC-H at scale {results['scale']}: a round of "
                        f"~{statistics.median(results['round_changes']):,.0f} changes")
    for column in ("query", "round s", "Spark s", "PostgreSQL s", "vs Spark", "vs PG",
                   "rows scanned", "keys (revisited)", "state MB", "equal"):
        table.add_column(column, justify="left" if column == "query" else "right")
    for name, one in results["queries"].items():
        table.add_row(name, f"{one['round_s']:.3f}",
                      "failed" if one["spark_s"] is None else f"{one['spark_s']:.2f}",
                      "timeout" if one["pg_s"] is None else f"{one['pg_s']:.2f}",
                      "-" if one["speedup_spark"] is None else f"{one['speedup_spark']}x",
                      "-" if one["speedup_pg"] is None else f"{one['speedup_pg']}x",
                      f"{one['rows_scanned']:,}", f"{one['keys']} ({one['revisited']})",
                      f"{one['state_mb']:,.1f}", "yes" if one["equal"] is True else "NO")
    console.print(table)
    console.print(f"median speedup over Spark {results['median_speedup_spark']}x (slowest "
                  f"{results['min_speedup_spark']}x); commit -> visible p50 "
                  f"{results['commit_to_visible_p50_s']} s, p99 "
                  f"{results['commit_to_visible_p99_s']} s; views equal to PostgreSQL: "
                  f"{results['all_equal']}")
    print_json(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--orders", type=int, default=60, help="RF1 and RF2 orders a round")
    parser.add_argument("--updates", type=int, default=400, help="updates a round")
    parser.add_argument("--latency-rounds", type=int, default=3,
                        help="rounds written as they commit, for commit -> visible")
    parser.add_argument("--queries", default=",".join(name for name, *_ in QUERIES))
    parser.add_argument("--spark-runs", type=int, default=1)
    parser.add_argument("--view-memory", default="1GB",
                        help="each view's memory_limit (22 views add up: 400MB at SF1 on 23 GB)")
    parser.add_argument("--pg-timeout", type=float, default=600)
    parser.add_argument("--partial", default=None, help="a file for the results measured "
                        "before the recomputations (kept if a later phase fails)")
    parser.add_argument("--work", default=None, help="the run's folder's parent (default: "
                        "the system's temporary folder)")
    started = time.perf_counter()
    results = run(parser.parse_args())
    results["total_s"] = round(time.perf_counter() - started, 1)
    # this process ran apply (its views' states) and Spark's driver side: its peak resident set
    results["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    report(results)


if __name__ == "__main__":
    main()
