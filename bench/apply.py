"""Benchmark: ``cdc apply`` into a Redis follower — throughput and end-to-end latency.

(``--follower delta|search``: the Delta and search followers at several table sizes, see
``bench/apply_tables.py``.)

Run with ``make bench-apply`` or ``.venv/bin/python bench/apply.py --follower redis
[--changes N] [--batch B] [--rate R] [--seconds S] [--trigger T] [--profile]
[--skip-latency] [--skip-throughput]``. ``--profile`` adds a cProfile of the sink alone; the
Spark side is best seen with ``py-spy record --subprocesses -p <pid>`` (the batch handler runs
in a py4j callback thread, which cProfile does not follow).

One run, throwaway servers (``cdc.servers``), one SparkSession:

**Throughput** (``--changes`` over distinct keys, so folding cannot collapse the work)

1. the log: ``--changes`` inserts of the synthetic ``shop.public.orders`` table (6 columns, a
   100-byte note), one key each, written *directly* with the project's codec and
   ``LocalChangeLog`` (8 partitions, no fsync) — not through PostgreSQL capture, whose own rate
   is ``bench/pg_capture.py``'s business;
2. the SparkSession is started (timed apart) and warmed up on a 1,000-record log;
3. ``cdc apply --once`` in-process (:func:`spark_apply.jobs.run_apply`, follower ``cache``,
   ``max_records_per_batch`` = ``--batch``) into a fresh ``redis-server``: changes/s = changes /
   the wall time of ``run_apply`` (query start, every micro-batch, stop; Spark start-up excluded).
   Every key is then checked to be in Redis;
4. beside it, to show where the time goes: the Spark source alone (the same stream into Spark's
   ``noop`` sink, same batch size), the source's decode alone in this process (no Spark), the
   fold + :meth:`RedisSink.apply` alone (no Spark: the changes decoded up front, applied into a
   flushed server in ``--batch`` slices) and ``redis-benchmark -t hset -P 64 -n 1000000`` against
   the same server (pipelined HSETs, no script, no version gate).

**Latency** (skipped with ``--skip-latency``)

5. a throwaway PostgreSQL, table ``public.items``; ``cdc bootstrap --follow`` (capture) as a
   subprocess; ``cdc apply`` continuous in-process (trigger interval ``--trigger``); a paced writer
   commits ``--rate`` changes/s (100 transactions/s, each 80 % inserts of new keys and 20 %
   updates of recent ones) for ``--seconds``. Latency is the apply job's own per-change
   measurement (``spark_apply/latency.py``: batch applied minus the commit's ``source_ts_ms``, for
   every c/u/d record), counted only for changes committed after a warm-up of ``--warmup``
   seconds, until the writer stops and the follower has applied everything.

``uptime``'s 1-minute load average is printed beside each figure (other work shares the cores).
The last line of stdout is one JSON object with the numbers.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import json
import os
import pstats
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import redis  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from cdc.avro import EventCodec  # noqa: E402
from cdc.config import load_config  # noqa: E402
from cdc.events import ChangeEvent, Op, TransactionInfo  # noqa: E402
from cdc.log.local import LocalChangeLog, LocalChangeLogReader  # noqa: E402
from cdc.log.schemas import SchemaStore  # noqa: E402
from cdc.position import Position  # noqa: E402
from cdc.servers.postgres import ThrowawayPostgres  # noqa: E402
from cdc.servers.redis import ThrowawayRedis  # noqa: E402
from cdc.synthetic import ORDERS  # noqa: E402

console = Console(stderr=True)


def load() -> float:
    return os.getloadavg()[0]


# ------------------------------------------------------------------------------ throughput

def distinct_events(count: int, first: int = 0) -> Iterator[ChangeEvent]:
    """``count`` inserts of keys ``first..first+count-1`` (deterministic rows)."""
    rnd = random.Random(first)
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    now = int(time.time() * 1000)
    for key in range(first, first + count):
        row = {"id": key, "customer": f"customer-{rnd.randrange(10_000)}",
               "amount": Decimal(rnd.randrange(1, 10_000_000)).scaleb(-2),
               "status": rnd.choice(("new", "paid", "shipped")),
               "placed_at": base + dt.timedelta(seconds=rnd.randrange(30_000_000)),
               "note": "x" * 100}
        yield ChangeEvent(ORDERS, Op.CREATE, Position.test(key + 1), ts_ms=now, before=None,
                          after=row, source_info={"txId": key, "lsn": key * 64},
                          transaction=TransactionInfo(str(key), 1, 1))


def write_log(path: Path, count: int) -> float:
    """Write the log; seconds taken."""
    started = time.perf_counter()
    log = LocalChangeLog(path, partitions=8, fsync=False)
    codec = EventCodec(SchemaStore(path, writable=True))
    log.ensure_topic(ORDERS.topic, {"source": "shop", "table": str(ORDERS.table)})
    batch: list[Any] = []
    for index, event in enumerate(distinct_events(count), 1):
        batch.extend(codec.records(event))
        if len(batch) >= 5000 or index == count:
            log.append(batch, {"shop": {"lsn": index * 64, "lsn_text": f"0/{index * 64:X}"}})
            batch = []
    log.close()
    return time.perf_counter() - started


def write_config(root: Path, log_dir: Path, redis_url: str, dsn: str, batch: int,
                 trigger: float, table: str = "public.orders") -> Path:
    path = root / f"cdc-{log_dir.name}.yaml"
    path.write_text(f"""\
log:
  path: {log_dir}
  partitions: 8
sources:
  - name: shop
    kind: postgres
    dsn: {dsn}
    tables: [{table}]
    heartbeat_interval: 1s
followers:
  cache:
    kind: redis
    url: {redis_url}
    max_records_per_batch: {batch}
    trigger_interval: {trigger}s
    checkpoint: {root / ('ck-' + log_dir.name)}
""")
    return path


def source_stream(spark: Any, path: Path, checkpoint: Path, batch: int) -> tuple[int, float]:
    """The cdc source into Spark's noop sink (availableNow): rows, seconds."""
    started = time.perf_counter()
    query = (spark.readStream.format("cdc").option("path", str(path))
             .option("maxRecordsPerTrigger", str(batch)).load()
             .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.perf_counter() - started
    return sum(p["numInputRows"] for p in query.recentProgress), seconds


def decoded_changes(path: Path) -> tuple[list[Any], float]:
    """Every record decoded by the source's reader (no Spark), then folded by the pure fold:
    (changes, CPU seconds of the decode alone)."""
    from spark_apply.fold import fold_records
    from spark_apply.source import SourceOptions, complete_end, plan, read_partition

    state = LocalChangeLogReader(path).state()
    cpu = time.process_time()
    rows: list[dict[str, Any]] = []
    for task in plan(state, {"topics": {}}, complete_end(state, SourceOptions(str(path))), 1):
        for batch in read_partition(str(path), task):
            rows.extend(batch.to_pylist())
    decode_cpu = time.process_time() - cpu
    return fold_records(rows).changes, decode_cpu


def sink_only(url: str, changes: list[Any], batch: int, profile: bool) -> tuple[float, str]:
    """RedisSink.apply of ``changes`` in ``batch`` slices into the flushed server: (changes/s,
    profile text)."""
    from sinks.redis import RedisSink

    redis.Redis.from_url(url).flushall()
    sink = RedisSink("cache", url)
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    for start in range(0, len(changes), batch):
        sink.apply(changes[start:start + batch])
    if profiler is not None:
        profiler.disable()
    seconds = time.perf_counter() - started
    sink.close()
    return len(changes) / seconds, _profile_text(profiler)


def _profile_text(profiler: cProfile.Profile | None, lines: int = 14) -> str:
    if profiler is None:
        return ""
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def redis_benchmark(port: int) -> float | None:
    """``redis-benchmark -t hset -P 64 -n 1000000 -q``'s requests/s (None: not installed)."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return None
    out = subprocess.run([binary, "-p", str(port), "-t", "hset", "-P", "64", "-n", "1000000",
                          "-q"], capture_output=True, text=True, timeout=300).stdout
    found = re.search(r"HSET: ([\d.]+) requests per second", out.replace("\r", "\n"))
    return float(found.group(1)) if found else None


def throughput(args: argparse.Namespace, root: Path, server: ThrowawayRedis, spark: Any,
               results: dict[str, Any]) -> None:
    from spark_apply.jobs import run_apply

    log_dir = root / "log"
    console.print(f"writing {args.changes:,} changes over distinct keys into a fresh log ...")
    seconds = write_log(log_dir, args.changes)
    results["log_write_s"] = round(seconds, 1)
    console.print(f"  log written in {seconds:.1f} s (direct codec, not capture)")
    warm = root / "warm"
    write_log(warm, 1000)
    for attempt in range(3):  # Python workers up; under heavy load their start can time out
        try:
            source_stream(spark, warm, root / f"ck-warm-{attempt}", 1000)
            break
        except Exception as exc:  # noqa: BLE001 - retried, then raised
            console.print(f"  warm-up query failed ({str(exc).splitlines()[0][:120]}); retrying")
            if attempt == 2:
                raise

    config = load_config(write_config(root, log_dir, server.url,
                                      "postgresql://postgres@127.0.0.1:1/shop", args.batch, 1.0))
    before = load()
    started = time.perf_counter()
    job = run_apply(config, ["cache"], once=True, console=None)
    seconds = time.perf_counter() - started
    p = job.progress["cache"]
    held = redis.Redis.from_url(server.url).dbsize() - 1  # minus the watermark hash
    if p.written != args.changes or held != args.changes:
        raise SystemExit(f"apply wrote {p.written:,} and Redis holds {held:,} of "
                         f"{args.changes:,} changes")
    results.update(redis_changes_per_s=round(args.changes / seconds), apply_s=round(seconds, 2),
                   apply_batches=p.batches, apply_load=round(max(before, load()), 2),
                   handler_fold_s=round(p.fold_seconds, 2),
                   handler_sink_s=round(p.sink_seconds, 2))
    console.print(f"  cdc apply --once: {args.changes:,} changes in {seconds:.2f} s "
                  f"({p.batches} batches; in the handler {p.fold_seconds:.1f} s read+fold, "
                  f"{p.sink_seconds:.1f} s Redis) = {args.changes / seconds:,.0f}/s")

    before = load()
    rows, seconds = source_stream(spark, log_dir, root / "ck-source", args.batch)
    results.update(source_only_per_s=round(rows / seconds), source_only_load=round(
        max(before, load()), 2))
    console.print(f"  Spark source -> noop: {rows:,} rows in {seconds:.2f} s")

    before = load()
    changes, decode_cpu = decoded_changes(log_dir)
    results.update(decode_per_core_s=round(len(changes) / decode_cpu),
                   decode_load=round(max(before, load()), 2))
    before = load()
    rate, profile = sink_only(server.url, changes, args.batch, args.profile)
    results.update(sink_only_per_s=round(rate), sink_only_load=round(max(before, load()), 2),
                   sink_profile=profile)
    console.print(f"  decode alone {results['decode_per_core_s']:,}/s per core; "
                  f"RedisSink.apply alone {rate:,.0f}/s")
    before = load()
    bench_rate = redis_benchmark(server.port)
    results.update(redis_benchmark_per_s=None if bench_rate is None else round(bench_rate),
                   redis_benchmark_load=round(max(before, load()), 2))
    console.print(f"  redis-benchmark hset -P 64: {bench_rate or 0:,.0f}/s")


# ------------------------------------------------------------------------------ latency

class PacedWriter:
    """``rate`` changes/s in 100 transactions/s (80 % inserts of new keys, 20 % updates)."""

    def __init__(self, dsn: str, rate: int) -> None:
        self.dsn = dsn
        self.per_tx = max(1, rate // 100)
        self.changes = 0
        self.late_ticks = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        inserts = max(1, self.per_tx * 4 // 5)
        updates = self.per_tx - inserts
        next_key = 1
        rnd = random.Random(5)
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                started = time.monotonic()
                tick = 0
                while not self.stop.is_set():
                    with conn.transaction():
                        conn.execute("INSERT INTO items SELECT g, mod(g, 1000), repeat('n', 60), "
                                     "now() FROM generate_series(%s::bigint, %s::bigint) g",
                                     (next_key, next_key + inserts - 1))
                        if updates and next_key > 1:
                            ids = [rnd.randrange(max(1, next_key - 5000), next_key)
                                   for _ in range(updates)]
                            conn.execute("UPDATE items SET v = v + 1, at = now() WHERE id = "
                                         "ANY(%s)", (sorted(set(ids)),))
                            self.changes += len(set(ids))
                    next_key += inserts
                    self.changes += inserts
                    tick += 1
                    delay = started + tick / 100 - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    else:
                        self.late_ticks += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            self.error = exc


def capture_latency(log_dir: Path, since: float) -> dict[str, Any]:
    """Commit -> appended to the log (the log record's ``timestamp_ms`` minus its
    ``source_ts_ms``) p50/p99 for the c/u/d records committed after ``since`` (epoch s)."""
    from spark_apply.latency import LatencyHistogram
    from spark_apply.source import SourceOptions, complete_end, plan, read_partition

    state = LocalChangeLogReader(log_dir).state()
    hist = LatencyHistogram()
    for task in plan(state, {"topics": {}}, complete_end(state, SourceOptions(str(log_dir))),
                     1):
        for batch in read_partition(str(log_dir), task):
            for row in batch.select(["op", "timestamp_ms", "source_ts_ms"]).to_pylist():
                ts = row["source_ts_ms"]
                if row["op"] in ("c", "u", "d") and ts is not None and ts >= since * 1000:
                    hist.add([(row["timestamp_ms"] - ts) / 1000])
    return {"capture_p50_s": _rounded(hist.quantile(0.5)),
            "capture_p99_s": _rounded(hist.quantile(0.99))}


def batch_durations(query: Any) -> dict[str, Any]:
    """Median and max of the micro-batches' durations (Spark's ``triggerExecution``) and of
    their ``addBatch`` part (the batch handler), and the median rows per batch."""
    progress = [p for p in query.recentProgress if p.get("numInputRows")]
    if not progress:
        return {}

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    total = [p["durationMs"].get("triggerExecution", 0) / 1000 for p in progress]
    handler = [p["durationMs"].get("addBatch", 0) / 1000 for p in progress]
    return {"batch_p50_s": round(median(total), 2), "batch_max_s": round(max(total), 2),
            "handler_p50_s": round(median(handler), 2),
            "rows_per_batch_p50": median([p["numInputRows"] for p in progress])}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def latency(args: argparse.Namespace, root: Path, server: ThrowawayRedis, spark: Any,
            results: dict[str, Any]) -> None:
    from spark_apply.jobs import ApplyJob

    redis.Redis.from_url(server.url).flushall()
    with ThrowawayPostgres() as pg:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE bench")
        dsn = pg.dsn("bench")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v int NOT NULL, "
                         "note text, at timestamptz NOT NULL)")
        log_dir = root / "live"
        config_path = write_config(root, log_dir, server.url, dsn, args.batch, args.trigger,
                                   "public.items")
        capture_log = (root / "capture.log").open("w")  # closed with the process below
        capture = subprocess.Popen([str(Path(sys.executable).parent / "cdc"), "bootstrap",
                                    "--config", str(config_path), "--follow"],
                                   stdout=subprocess.DEVNULL, stderr=capture_log)
        job = None
        writer = PacedWriter(dsn, args.rate)
        try:
            deadline = time.monotonic() + 120
            while not (log_dir / "state.json").exists() or not LocalChangeLogReader(
                    log_dir).state().source_offsets.get("shop"):
                if capture.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("capture did not start: "
                                     + (root / "capture.log").read_text()[-2000:])
                time.sleep(0.2)
            job = ApplyJob.prepare(load_config(config_path), ["cache"])
            job.start(spark, once=False)
            waiter = threading.Thread(target=job.wait, daemon=True)
            waiter.start()
            progress = job.progress["cache"]
            while progress.batches == 0:
                time.sleep(0.1)
            console.print(f"capture and continuous apply running; writing {args.rate:,} "
                          f"changes/s for {args.seconds:.0f} s ...")
            writer.thread.start()
            time.sleep(args.warmup)
            baseline = progress.latency.copy()
            loads = []
            began, began_wall = time.monotonic(), time.time()
            written_at_start = writer.changes
            while time.monotonic() - began < args.seconds - args.warmup:
                time.sleep(1)
                loads.append(load())
            writer.stop.set()
            writer.thread.join(10)
            achieved = (writer.changes - written_at_start) / (time.monotonic() - began)
            if writer.error is not None:
                raise SystemExit(f"writer failed: {writer.error}")
            with psycopg.connect(dsn, autocommit=True) as conn:
                total = conn.execute("SELECT count(*) FROM items").fetchone()[0]  # type: ignore
            deadline = time.monotonic() + 120
            client = redis.Redis.from_url(server.url)
            while client.dbsize() - 1 < total and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(2 * args.trigger + 1)  # the batch holding the last updates
            window = progress.latency.since(baseline)
            results.update(capture_latency(log_dir, began_wall))
            results.update(batch_durations(job.queries["cache"]))
            results.update(
                latency_p50_s=window.quantile(0.5), latency_p99_s=window.quantile(0.99),
                latency_max_s=window.quantile(1.0), latency_changes=window.total,
                latency_rate_per_s=round(achieved), latency_late_ticks=writer.late_ticks,
                latency_load=round(sum(loads) / max(1, len(loads)), 2),
                latency_batches=progress.batches, trigger_s=args.trigger)
            console.print(f"  {window.total:,} changes measured at {achieved:,.0f}/s: p50 "
                          f"{window.quantile(0.5) or 0:.3f} s, p99 "
                          f"{window.quantile(0.99) or 0:.3f} s")
        finally:
            writer.stop.set()
            if job is not None:
                job.request_stop()
                job.stop_queries()
                job.close()
            capture.send_signal(signal.SIGTERM)
            try:
                capture.wait(60)
            except subprocess.TimeoutExpired:
                capture.kill()
            capture_log.close()


# ------------------------------------------------------------------------------ report

def report(results: dict[str, Any]) -> None:
    out = Console(width=110)  # piped output would otherwise wrap at 80 columns
    table = Table(title="cdc apply -> Redis (one run)")
    for column in ("measure", "value", "load (1 min)", "goal"):
        table.add_column(column, justify="left" if column == "measure" else "right")

    def rate(name: str) -> str:
        value = results.get(name)
        return "-" if value is None else f"{value:,}/s"

    def secs(name: str) -> str:
        value = results.get(name)
        return "-" if value is None else f"{value:.3f} s"

    rows = [
        ("SparkSession start-up (not counted)", secs("spark_start_s"), "", ""),
        ("cdc apply --once into Redis", rate("redis_changes_per_s"),
         results.get("apply_load", ""), ">= 50,000/s"),
        ("  of which read+fold / Redis (handler s)",
         f"{results.get('handler_fold_s', '-')} / {results.get('handler_sink_s', '-')} s", "",
         ""),
        ("Spark source alone (noop sink)", rate("source_only_per_s"),
         results.get("source_only_load", ""), ""),
        ("source decode alone, per core", rate("decode_per_core_s"),
         results.get("decode_load", ""), ""),
        ("RedisSink.apply alone", rate("sink_only_per_s"), results.get("sink_only_load", ""),
         ""),
        ("redis-benchmark hset -P 64", rate("redis_benchmark_per_s"),
         results.get("redis_benchmark_load", ""), ""),
        ("commit -> Redis latency p50", secs("latency_p50_s"), results.get("latency_load", ""),
         "< 0.5 s"),
        ("commit -> Redis latency p99", secs("latency_p99_s"), "", "< 2 s"),
        ("  at (achieved writer rate)", rate("latency_rate_per_s"), "", "5,000/s"),
        ("  of which commit -> log (capture) p50 / p99",
         f"{results.get('capture_p50_s', '-')} / {results.get('capture_p99_s', '-')} s", "", ""),
        ("  micro-batch p50 / max (handler p50)",
         f"{results.get('batch_p50_s', '-')} / {results.get('batch_max_s', '-')} s "
         f"({results.get('handler_p50_s', '-')} s)", "", ""),
    ]
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    out.print(table)
    text = results.pop("sink_profile", "")
    if text:  # plain print: rich would wrap the lines at 80 columns when piped
        print("--- cProfile of RedisSink.apply alone (tottime) ---")
        print(text)
    for name in ("latency_p50_s", "latency_p99_s", "latency_max_s"):
        if results.get(name) is not None:
            results[name] = round(results[name], 3)
    print(json.dumps(results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--follower", default="redis", choices=["redis", "delta", "search"])
    parser.add_argument("--mode", default="scd1", choices=["scd1", "scd2"],
                        help="delta: SCD1 (current state) or SCD2 (history)")
    parser.add_argument("--buckets", type=int, default=16, help="delta: hash buckets")
    parser.add_argument("--table-rows", default="100000,2000000",
                        help="delta/search: table sizes to measure at, comma-separated")
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100_000,
                        help="max_records_per_batch of the follower")
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--trigger", type=float, default=0.2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    if args.follower != "redis":  # bench/apply_tables.py: table sizes, MERGE / index costs
        from bench.apply_tables import run

        run(args)
        return
    from spark_apply.session import spark_session

    root = Path(tempfile.mkdtemp(prefix="cdc-bench-apply-"))
    results: dict[str, Any] = {"changes": args.changes, "batch": args.batch}
    try:
        with ThrowawayRedis() as server:
            started = time.perf_counter()
            spark = spark_session(app_name="bench-apply")
            results["spark_start_s"] = round(time.perf_counter() - started, 1)
            if not args.skip_throughput:
                throughput(args, root, server, spark, results)
            if not args.skip_latency:
                latency(args, root, server, spark, results)
            spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(results)


if __name__ == "__main__":
    main()
