"""Benchmark: ``cdc apply`` against issue 13's and 28's goals — throughput into Redis, Delta and
search, and commit -> visible latency of four follower kinds in one ``cdc apply``.

Run with ``make bench-apply`` / ``make bench-apply-tables`` or ``.venv/bin/python bench/apply.py
--follower redis|delta|search [--master local|cluster|URL] [--log local|kafka]
[--format avro|json] [--changes N] [--batch B] [--rate R] [--seconds S] [--trigger T]
[--profile] [--py-spy FILE] [--skip-latency] [--skip-throughput] [--skip-references]``.

The goals (one run, 2 cores, the *default path*: Spark local mode ``local[2,3]`` and a local
log; the JSON's ``goals`` says which are met):

* ``redis_changes_per_s`` >= 50,000 (``--follower redis``);
* Delta SCD1 at 2M rows ``sizes[-1].changes_per_s`` >= 50,000 (``--follower delta``);
* search ``sizes[-1].changes_per_s`` >= 25,000 (``--follower search``);
* commit -> visible to a reader, per follower kind (Redis, Delta, search, SQL in one ``cdc
  apply``), p50 < 0.3 s and p99 < 1 s at 5,000 changes/s (``--follower redis``).

``--master cluster`` starts a throwaway Spark standalone cluster (2 workers x 1 core,
``cdc_app.servers.spark``) and runs the throughput phase on it; ``--log kafka`` puts the log in a
throwaway Kafka broker (written with ``KafkaChangeLog``, read by Spark's Kafka source). These
variants skip the latency phase and the references and report no goals.

One run, throwaway servers (``cdc_app.servers``), one SparkSession (``bench/common.py``):

**Throughput into Redis** (``--changes`` inserts over distinct keys, so folding cannot collapse
the work)

1. the log: ``--changes`` inserts of the synthetic ``shop.public.orders`` table (6 columns, a
   ~100-byte note), one key each, written *directly* with the project's codec and log writer (8
   partitions, no fsync) — not through PostgreSQL capture (``bench/pg_capture.py``'s business);
2. the SparkSession is started (timed apart) and warmed up by ``cdc apply --once`` of a
   1,000-record log (Python workers up);
3. ``cdc apply --once`` in-process (:func:`spark_apply.jobs.run_apply`, follower ``cache``,
   ``max_records_per_batch`` = ``--batch``) into a fresh ``redis-server``: changes/s = changes /
   the wall time of ``run_apply`` (query start, every micro-batch, stop; Spark start-up
   excluded). The micro-batches are offset ranges; the executors' tasks read, fold and write
   (``spark_apply/tasks.py``). Every key is then checked to be in Redis. The tasks' own split
   (read + decode + fold vs. the sink's writes) is *task CPU-ish seconds, summed over tasks*
   (tasks run in parallel: the sums exceed the wall time);
4. references beside it (default path only, ``--skip-references`` drops them): the executor
   task path alone in this process (:func:`spark_apply.tasks.run_task` over the whole log, one
   task, no Spark), its read + decode + fold alone (CPU time), :meth:`RedisSink.apply` alone (the
   folded changes in ``--batch`` slices into the flushed server) and ``redis-benchmark -t hset
   -P 64 -n 1000000`` against the same server (pipelined HSETs, no script, no version gate).

**Latency** (default path; ``--skip-latency`` skips it; issue 28)

5. a throwaway PostgreSQL, table ``public.items``; ``cdc bootstrap --follow`` (capture) as a
   subprocess; ``cdc apply`` continuous in-process with **one follower of each kind**: ``cache``
   (Redis), ``warehouse`` (Delta SCD1), ``search`` and ``db`` (SQL into a second PostgreSQL
   database) — every setting the product's default but what names a place (``--trigger``
   overrides the trigger and leaves the default path). A paced writer commits ``--rate``
   changes/s (100 transactions/s, each 80 % inserts of new keys and 20 % updates of recent ones)
   for ``--seconds`` (default 300); ``cdc log compact`` and ``cdc warehouse optimize`` run once a
   minute, as a cron job would (the product runs neither by itself).
6. **the prober** (``cdc_app/probe.py``: a process of its own that imports nothing of the
   product) commits 10 probe rows/s of its own (negative keys) and reads each follower through its
   public client every 20 ms; a probe's latency is the wall clock when the read that found it
   returned minus when its ``COMMIT`` returned. Figures per follower kind over the probes
   committed in the last ``--window`` seconds (default 60), a probe never seen counting as the
   slowest: ``latency_by_kind``; ``latency_p50_s``/``latency_p99_s`` are the worst kind's.
   Beside them: commit -> log (the log records' append time minus their commit time) and each
   follower's micro-batch durations and their parts (Spark's ``durationMs``).
   Before the load, **the floor** (``--idle``, default 30 s; ``floor`` in the JSON): the prober
   alone, so each micro-batch carries a probe row or two: the same figures, what a near-empty
   batch costs and what a reader then sees.

**Delta and search** (``--follower delta|search``): ``bench/apply_tables.py`` (table sizes,
the limits beside them, and delta-spark's ``MERGE INTO`` of the same changes).

``--profile`` adds a cProfile of the executor task path alone (no Spark); ``--py-spy FILE``
records ``py-spy record --subprocesses`` (driver, Spark's Python workers) over the measured
``cdc apply --once`` and prints its top functions. ``uptime`` is recorded at the start and end
and the 1-minute load beside each figure. The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import redis  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import (  # noqa: E402
    BenchEnv,
    Log,
    PySpy,
    append_log,
    console,
    goal,
    load,
    print_json,
    redis_follower,
    whole_log,
)
from cdc.config import load_config  # noqa: E402
from cdc.events import Op  # noqa: E402
from cdc_app.servers.postgres import ThrowawayPostgres  # noqa: E402
from cdc_app.servers.redis import ThrowawayRedis  # noqa: E402


def parse_triggers(text: str | None) -> dict[str, float]:
    """``--trigger``: ``0.1`` (every follower: key ``*``) or ``redis=0.05,sql=0.05`` (per kind)."""
    if not text:
        return {}
    if "=" not in text:
        return {"*": float(text)}
    return {kind.strip(): float(value) for kind, value in
            (part.split("=", 1) for part in text.split(","))}


# ------------------------------------------------------------------------------ throughput


def throughput(args: argparse.Namespace, env: BenchEnv, server: ThrowawayRedis,
               results: dict[str, Any]) -> None:
    log = env.log("log")
    console.print(f"writing {args.changes:,} changes over distinct keys into a fresh "
                  f"{env.log_backend} log ...")
    seconds = append_log(log, range(args.changes), Op.CREATE, 1)
    results["log_write_s"] = round(seconds, 1)
    console.print(f"  log written in {seconds:.1f} s (direct codec, not capture)")
    env.warm_up({"cache": redis_follower(server.url, 1000)})
    redis.Redis.from_url(server.url).flushall()

    config = env.config("throughput", log, {"cache": redis_follower(server.url, args.batch)})
    before = load()
    with PySpy(args.py_spy) as spy:
        seconds, job = env.apply_once(config, ["cache"])
    p = job.progress["cache"]
    held = redis.Redis.from_url(server.url).dbsize() - 1  # minus the watermark hash
    if p.written != args.changes or held != args.changes:
        raise SystemExit(f"apply wrote {p.written:,} and Redis holds {held:,} of "
                         f"{args.changes:,} changes")
    in_batches = env.batch_seconds(job, "cache")
    results["throughput_batches"] = batch_durations(job.progress["cache"])
    results.update(redis_changes_per_s=round(args.changes / seconds), apply_s=round(seconds, 2),
                   batches_s=None if in_batches is None else round(in_batches, 2),
                   apply_batches=p.batches, apply_load=round(max(before, load()), 2),
                   task_read_fold_cpu_s=round(p.fold_seconds, 2),
                   task_sink_cpu_s=round(p.sink_seconds, 2))
    if args.py_spy:
        results["py_spy"] = spy.summary()
    console.print(f"  cdc apply --once: {args.changes:,} changes in {seconds:.2f} s "
                  f"({p.batches} batches; task CPU-ish seconds, summed over tasks: "
                  f"{p.fold_seconds:.1f} s read+fold, {p.sink_seconds:.1f} s Redis) = "
                  f"{args.changes / seconds:,.0f}/s")
    if env.default_path and not args.skip_references:
        references(args, env, server, log, config, results)


def task_alone(config_path: Path, log: Log, url: str, profile: bool
               ) -> tuple[float, float, str]:
    """:func:`run_task` over the whole log in this process (one task, no Spark) into the
    flushed server: (changes/s, seconds, profile text)."""
    from cdc.sink import open_sink
    from spark_apply.tasks import ApplyTask, FollowerHandle, run_task

    config = load_config(config_path)
    _, _, ranges = whole_log(log.settings)
    handle = FollowerHandle(config, "cache", json.dumps(log.settings), "bench-task-alone")
    sink = open_sink(config, "cache")
    redis.Redis.from_url(url).flushall()
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    report = run_task(handle, ApplyTask(tuple(ranges)), sink)
    if profiler is not None:
        profiler.disable()
    seconds = time.perf_counter() - started
    sink.close()
    return report.changes / seconds, seconds, _profile_text(profiler, 25)


def read_fold_alone(log: Log) -> tuple[list[Any], float]:
    """The task path's read + decode + fold over the whole log (``tasks.fold_raw``), no sink:
    (the changes, CPU seconds)."""
    from cdc.reading import raw_records
    from spark_apply.tasks import TaskReport, fold_raw

    reader, decoder, ranges = whole_log(log.settings)
    cpu = time.process_time()
    changes = fold_raw(raw_records(reader, ranges), decoder.change, False, TaskReport())
    return changes, time.process_time() - cpu


def default_batch(follower: str) -> int:
    """The follower kind's default ``max_records_per_batch`` (the default path)."""
    from cdc.config import follower_kinds

    kind = follower_kinds()[follower]
    return int(kind.model_fields["max_records_per_batch"].default)


def sink_only(url: str, changes: list[Any], batch: int) -> float:
    """RedisSink.apply of ``changes`` in ``batch`` slices into the flushed server: changes/s."""
    from sinks.redis import RedisSink

    redis.Redis.from_url(url).flushall()
    sink = RedisSink("cache", url)
    started = time.perf_counter()
    for start in range(0, len(changes), batch):
        sink.apply(changes[start:start + batch])
    seconds = time.perf_counter() - started
    sink.close()
    return len(changes) / seconds


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


def references(args: argparse.Namespace, env: BenchEnv, server: ThrowawayRedis, log: Log,
               config: Path, results: dict[str, Any]) -> None:
    before = load()
    rate, seconds, profile = task_alone(config, log, server.url, args.profile)
    results.update(task_alone_per_s=round(rate), task_alone_load=round(max(before, load()), 2),
                   task_profile=profile)
    console.print(f"  executor task path alone (one task, no Spark): {rate:,.0f}/s")
    before = load()
    changes, cpu = read_fold_alone(log)
    results.update(read_fold_per_core_s=round(len(changes) / cpu),
                   read_fold_load=round(max(before, load()), 2))
    before = load()
    rate = sink_only(server.url, changes, args.batch)
    results.update(sink_only_per_s=round(rate), sink_only_load=round(max(before, load()), 2))
    console.print(f"  read + decode + fold alone {results['read_fold_per_core_s']:,}/s per "
                  f"core; RedisSink.apply alone {rate:,.0f}/s")
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


def capture_latency(log: Log, since: float) -> dict[str, Any]:
    """Commit -> appended to the log (the log record's ``timestamp_ms`` minus its
    ``source_ts_ms``) p50/p99 for the c/u/d records committed after ``since`` (epoch s)."""
    from cdc.reading import read_range
    from spark_apply.latency import LatencyHistogram

    reader, decoder, ranges = whole_log(log.settings)
    hist = LatencyHistogram()
    for item in ranges:
        for chunk in read_range(reader, item):
            for record in chunk:
                if record.value is None:
                    continue
                op, _, ts = decoder.decode_image(record.value)
                if op in ("c", "u", "d") and ts is not None and ts >= since * 1000:
                    hist.add([(record.timestamp_ms - ts) / 1000])
    return {"capture_p50_s": _rounded(hist.quantile(0.5)),
            "capture_p99_s": _rounded(hist.quantile(0.99))}


def batch_durations(progress: Any, since: float = 0.0) -> dict[str, Any]:
    """Median and max of a follower's batches' durations (the apply loop's own timing, from
    handing the batch to its runner to its progress record), and the median of its parts
    (read + decode + fold: the loop's one read; sink: the follower's writes), over its recent
    batches (``FollowerProgress.recent``) started at ``since`` (epoch s) or later."""
    batches = [b for b in progress.recent if b["started"] >= since]
    if not batches:
        return {}

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    total = [b["seconds"] for b in batches]
    return {"batches_seen": len(batches), "batch_p50_s": round(median(total), 3),
            "batch_max_s": round(max(total), 3),
            "parts_p50_s": {"read_fold": round(median([b["read_s"] for b in batches]), 3),
                            "sink": round(median([b["sink_s"] for b in batches]), 3)}}


def handler_split(progress: Any) -> dict[str, Any]:
    """Per batch on average over the whole run, from the apply job's own progress: the
    handler's seconds, and the tasks' read + fold and sink seconds (summed over tasks)."""
    batches = max(1, progress.batches)
    return {"batches": progress.batches,
            "handler_s_per_batch": round(progress.seconds / batches, 3),
            "read_fold_s_per_batch": round(progress.fold_seconds / batches, 3),
            "sink_s_per_batch": round(progress.sink_seconds / batches, 3),
            "records_per_batch": round(progress.records / batches)}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


#: the latency phase's followers, one of each kind, all in one ``cdc apply`` (issue 28)
LIVE_FOLLOWERS = {"cache": "redis", "warehouse": "delta", "search": "search", "db": "sql"}
#: how often the latency phase runs the shipped maintenance commands (as a cron job would)
MAINTENANCE_EVERY_S = 60.0


def probe_spec(dsn: str, follower_dsn: str, redis_url: str, root: Path, topic: str
               ) -> dict[str, Any]:
    """What the prober (``cdc_app/probe.py``) commits and where it reads each follower, from
    the followers' documented layouts (``docs/followers.md``)."""
    from sinks.delta import table_dir

    return {"dsn": dsn, "rate": 10, "first_key": -1,
            "insert": "INSERT INTO items VALUES (%(key)s, 0, 'probe', now())",
            "followers": [
                {"name": "cache", "kind": "redis", "url": redis_url, "key": "public.items:{key}"},
                {"name": "warehouse", "kind": "delta",
                 "path": str(table_dir(root / "warehouse", topic)),
                 "key_json": '{{"id":{key}}}'},
                {"name": "search", "kind": "search", "path": str(root / "search"),
                 "id": topic + '\n{{"id":{key}}}'},
                {"name": "db", "kind": "sql", "url": follower_dsn, "table": "items",
                 "column": "id"}]}


def maintenance(config_path: Path, out: Any) -> None:
    """The shipped maintenance, once: ``cdc log compact`` and ``cdc warehouse optimize``."""
    cdc = str(Path(sys.executable).parent / "cdc")
    for command in (["log", "compact"], ["warehouse", "optimize", "--follower", "warehouse"]):
        subprocess.run([cdc, *command, "--config", str(config_path)], stdout=out, stderr=out,
                       check=False, timeout=600)


def latency(args: argparse.Namespace, env: BenchEnv, server: ThrowawayRedis,
            results: dict[str, Any]) -> None:
    from cdc.log.local import LocalChangeLogReader
    from cdc_app import probe
    from spark_apply.jobs import ApplyJob

    redis.Redis.from_url(server.url).flushall()
    with ThrowawayPostgres() as pg:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE bench")
            conn.execute("CREATE DATABASE follower")
        dsn = pg.dsn("bench")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v int NOT NULL, "
                         "note text, at timestamptz NOT NULL)")
        log = env.log("live")
        log.settings.pop("fsync")  # capture as configured by default (fsynced)
        log.settings.pop("partitions")
        if args.commit_interval is not None:
            log.settings["commit_interval"] = f"{args.commit_interval}s"
        log_dir = Path(log.settings["path"])
        # every setting the product's default but what names the place (issue 28, point 5)
        followers: dict[str, dict[str, Any]] = {
            "cache": {"kind": "redis", "url": server.url},
            "warehouse": {"kind": "delta", "path": str(env.root / "warehouse")},
            "search": {"kind": "search", "path": str(env.root / "search"),
                       "text_fields": {"public.items": ["note"]}},
            "db": {"kind": "sql", "url": pg.dsn("follower").replace(
                "postgresql://", "postgresql+psycopg://", 1)}}
        triggers = parse_triggers(args.trigger)
        for follower in followers.values():
            seconds = triggers.get(follower["kind"], triggers.get("*"))
            if seconds is not None:
                follower["trigger_interval"] = f"{seconds}s"
        config_path = env.config("live", log, followers, dsn=dsn, table="public.items",
                                 heartbeat=None)
        capture_log = (env.root / "capture.log").open("w")  # closed with the process below
        capture = subprocess.Popen([str(Path(sys.executable).parent / "cdc"), "bootstrap",
                                    "--config", str(config_path), "--follow"],
                                   stdout=subprocess.DEVNULL, stderr=capture_log)
        job = None
        prober = None
        writer = PacedWriter(dsn, args.rate)
        spec_path, probe_out = env.root / "probe.json", env.root / "probe.jsonl"
        spec_path.write_text(json.dumps(probe_spec(dsn, pg.dsn("follower"), server.url,
                                                   env.root, f"{log.source}.public.items")))
        try:
            deadline = time.monotonic() + 120
            while not (log_dir / "state.json").exists() or not LocalChangeLogReader(
                    log_dir).source_offsets().get(log.source):
                if capture.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("capture did not start: "
                                     + (env.root / "capture.log").read_text()[-2000:])
                time.sleep(0.2)
            job = ApplyJob.prepare(load_config(config_path), list(LIVE_FOLLOWERS))
            job.start(env.spark, once=False)
            waiter = threading.Thread(target=job.wait, daemon=True)
            waiter.start()
            progress = job.progress
            while any(progress[name].batches == 0 for name in LIVE_FOLLOWERS):
                time.sleep(0.1)
            prober_log = (env.root / "probe.log").open("w")
            prober = subprocess.Popen(probe.command(spec_path, probe_out),
                                      stdout=prober_log, stderr=prober_log, cwd=env.root)
            if args.idle > 0:
                results["floor"] = idle_floor(args.idle, job, probe_out)
            console.print(f"capture and continuous apply of {', '.join(LIVE_FOLLOWERS)} "
                          f"running; writing {args.rate:,} changes/s for {args.seconds:.0f} s, "
                          f"probes measured over the last {args.window:.0f} s ...")
            writer.thread.start()
            loads: list[float] = []
            began = time.monotonic()
            window_start = time.time() + args.seconds - args.window
            written_at_window = None
            next_maintenance = began + MAINTENANCE_EVERY_S
            maintenance_out = (env.root / "maintenance.log").open("w")
            while time.monotonic() - began < args.seconds:
                time.sleep(1)
                if time.time() >= window_start and written_at_window is None:
                    written_at_window = (writer.changes, time.monotonic())
                    loads = []
                loads.append(load())
                if time.monotonic() >= next_maintenance:
                    maintenance(config_path, maintenance_out)
                    next_maintenance = time.monotonic() + MAINTENANCE_EVERY_S
                if writer.error is not None:
                    raise SystemExit(f"writer failed: {writer.error}")
            window_end = time.time()
            achieved = None
            if written_at_window is not None:
                achieved = ((writer.changes - written_at_window[0])
                            / (time.monotonic() - written_at_window[1]))
            writer.stop.set()
            writer.thread.join(10)
            time.sleep(10)  # the probes of the window's end reach every follower
            prober.send_signal(signal.SIGTERM)
            prober.wait(30)
            by_name = probe.summarize(probe_out, window_start, window_end, LIVE_FOLLOWERS)
            by_kind = by_follower_kind(by_name)
            worst = max(by_kind.values(), key=lambda f: (f["p99_s"] is None,
                                                         f["p99_s"] or 0.0))
            worst_p50 = max(by_kind.values(), key=lambda f: (f["p50_s"] is None,
                                                             f["p50_s"] or 0.0))
            results.update(capture_latency(log, window_start))
            results["batches_by_follower"] = {
                name: {**batch_durations(job.progress[name]),
                       **handler_split(progress[name])} for name in LIVE_FOLLOWERS}
            results.update(
                latency_by_kind=by_kind, latency_p50_s=worst_p50["p50_s"],
                latency_p99_s=worst["p99_s"], latency_seconds=args.seconds,
                latency_window_s=args.window,
                latency_rate_per_s=None if achieved is None else round(achieved),
                latency_late_ticks=writer.late_ticks,
                latency_load=round(sum(loads) / max(1, len(loads)), 2),
                latency_batches={name: progress[name].batches for name in LIVE_FOLLOWERS},
                trigger_s=args.trigger,
                latency_followers=LIVE_FOLLOWERS)
            for kind, figures in by_kind.items():
                console.print(f"  {kind}: p50 {figures['p50_s']} s, p99 {figures['p99_s']} s "
                              f"({figures['probes']} probes, {figures['unseen']} unseen)")
        finally:
            writer.stop.set()
            if prober is not None and prober.poll() is None:
                prober.kill()
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


def by_follower_kind(by_name: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The prober's figures per follower (``probe.summarize``) keyed by the follower's kind."""
    return {figures["kind"]: {k: v for k, v in figures.items() if k != "kind"}
            for figures in by_name.values()}


def idle_floor(seconds: float, job: Any, probe_out: Path) -> dict[str, Any]:
    """The floor: ``seconds`` with only the prober writing (10 one-row transactions/s, an
    otherwise idle leader), the probes of all but the first 5 s — what a reader sees when each
    micro-batch carries a row or two — and the followers' micro-batches meanwhile (Spark's
    ``durationMs``: what a near-empty batch costs)."""
    from cdc_app import probe

    console.print(f"the floor: {seconds:.0f} s of probes alone ...")
    started = time.time()
    time.sleep(seconds)
    ended = time.time()
    by_name = probe.summarize(probe_out, started + 5, ended - 2, LIVE_FOLLOWERS)
    floor: dict[str, Any] = {
        "seconds": seconds,
        "latency_by_kind": by_follower_kind(by_name),
        "batches_by_follower": {name: batch_durations(job.progress[name], since=started + 5)
                                for name in LIVE_FOLLOWERS}}
    for kind, figures in floor["latency_by_kind"].items():
        console.print(f"  floor {kind}: p50 {figures['p50_s']} s, p99 {figures['p99_s']} s")
    return floor


# ------------------------------------------------------------------------------ report

def goals(results: dict[str, Any]) -> dict[str, Any]:
    """Issue 28's goals this run measured (default path only): per follower kind, the
    prober's p50 < 300 ms and p99 < 1 s over the window."""
    out: dict[str, Any] = {}
    if "redis_changes_per_s" in results:
        out["redis_changes_per_s"] = goal(results["redis_changes_per_s"], 50_000)
    for kind, figures in results.get("latency_by_kind", {}).items():
        out[f"latency_{kind}_p50_s"] = goal(figures["p50_s"], 0.3, below=True)
        out[f"latency_{kind}_p99_s"] = goal(figures["p99_s"], 1.0, below=True)
    return out


def report(results: dict[str, Any]) -> None:
    out = Console(width=120)  # piped output would otherwise wrap at 80 columns
    where = f"{results['master']} master, {results['log']} log"
    table = Table(title=f"cdc apply -> Redis (one run; {where})")
    for column in ("measure", "value", "load (1 min)", "goal"):
        table.add_column(column, justify="left" if column == "measure" else "right")

    def rate(name: str) -> str:
        value = results.get(name)
        return "-" if value is None else f"{value:,}/s"

    def secs(name: str) -> str:
        value = results.get(name)
        return "-" if value is None else f"{value:.3f} s"

    default = results["master"] == "local" and results["log"] == "local"
    rows = [
        ("SparkSession start-up (not counted)", secs("spark_start_s"), "", ""),
        ("cdc apply --once into Redis", rate("redis_changes_per_s"),
         results.get("apply_load", ""), ">= 50,000/s" if default else "(no goal)"),
        ("  micro-batches alone (no query start/stop): s",
         f"{results.get('batches_s', '-')} s", "", ""),
        ("  task CPU-ish s, summed over tasks: read+fold / Redis",
         f"{results.get('task_read_fold_cpu_s', '-')} / {results.get('task_sink_cpu_s', '-')} s",
         "", ""),
        ("executor task path alone (1 task, no Spark)", rate("task_alone_per_s"),
         results.get("task_alone_load", ""), ""),
        ("read + decode + fold alone, per core", rate("read_fold_per_core_s"),
         results.get("read_fold_load", ""), ""),
        ("RedisSink.apply alone", rate("sink_only_per_s"), results.get("sink_only_load", ""),
         ""),
        ("redis-benchmark hset -P 64", rate("redis_benchmark_per_s"),
         results.get("redis_benchmark_load", ""), ""),
        ("commit -> visible to a reader (prober), worst kind p50 / p99",
         f"{secs('latency_p50_s')} / {secs('latency_p99_s')}", results.get("latency_load", ""),
         "< 0.3 s / < 1 s"),
        *[(f"  {kind}: p50 / p99 / max (probes, unseen)",
           f"{f['p50_s']} / {f['p99_s']} / {f['max_s']} s ({f['probes']}, {f['unseen']})", "",
           "") for kind, f in results.get("latency_by_kind", {}).items()],
        ("  at (achieved writer rate)", rate("latency_rate_per_s"), "", "5,000/s"),
        ("  of which commit -> log (capture) p50 / p99",
         f"{results.get('capture_p50_s', '-')} / {results.get('capture_p99_s', '-')} s", "", ""),
        *[(f"  {name}: micro-batch p50 / max; handler (addBatch) p50",
           f"{b.get('batch_p50_s', '-')} / {b.get('batch_max_s', '-')} s; "
           f"{b.get('parts_p50_s', {}).get('addBatch', '-')} s", "", "")
          for name, b in results.get("batches_by_follower", {}).items()],
    ]
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    out.print(table)
    for key, title in (("task_profile", "cProfile of the executor task path alone (tottime)"),
                       ("py_spy", "py-spy record --subprocesses of cdc apply --once")):
        text = results.pop(key, "")
        if text:  # plain print: rich would wrap the lines at 80 columns when piped
            print(f"--- {title} ---")
            print(text)
    for name in ("latency_p50_s", "latency_p99_s", "latency_max_s"):
        if results.get(name) is not None:
            results[name] = round(results[name], 3)
    if default:
        results["goals"] = goals(results)
    print_json(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--follower", default="redis", choices=["redis", "delta", "search"])
    parser.add_argument("--master", default="local",
                        help="local (local[2,3], the default path), cluster (a throwaway "
                             "standalone cluster, 2 workers x 1 core) or a master URL")
    parser.add_argument("--log", default="local", choices=["local", "kafka"],
                        help="where the log is: local files, or a throwaway Kafka broker")
    parser.add_argument("--format", default="avro", choices=["avro", "json"],
                        help="--log kafka: the log's format (json: Kafka Connect's form)")
    parser.add_argument("--mode", default="scd1", choices=["scd1", "scd2"],
                        help="delta: SCD1 (current state) or SCD2 (history)")
    parser.add_argument("--buckets", type=int, default=16, help="delta: hash buckets")
    parser.add_argument("--table-rows", default="100000,2000000",
                        help="delta/search: table sizes to measure at, comma-separated")
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=None,
                        help="max_records_per_batch of the follower (default: the follower "
                             "kind's own, as a user gets it: Redis and search 100,000, Delta "
                             "500,000)")
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=300.0,
                        help="latency phase: how long the load and the probes run")
    parser.add_argument("--window", type=float, default=60.0,
                        help="latency phase: the probes of the last WINDOW seconds count")
    parser.add_argument("--idle", type=float, default=30.0,
                        help="latency phase: seconds of probes alone before the load (the "
                             "floor: near-empty micro-batches); 0 skips it")
    parser.add_argument("--trigger", default=None,
                        help="latency phase: every follower's trigger interval in seconds, or "
                             "per kind: redis=0.05,sql=0.05 (default: the "
                             "product's; a value here is not the default path)")
    parser.add_argument("--commit-interval", type=float, default=None, metavar="SECONDS",
                        help="latency: capture's log.commit_interval (default: the product's)")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile of the executor task path alone")
    parser.add_argument("--py-spy", type=Path, default=None, metavar="FILE",
                        help="py-spy record --subprocesses (raw) of the measured apply")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-references", action="store_true")
    parser.add_argument("--skip-spark-merge", action="store_true",
                        help="delta: skip delta-spark's MERGE INTO of the same changes")
    args = parser.parse_args()
    if args.batch is None:
        args.batch = default_batch(args.follower)
    if args.format != "avro" and args.log != "kafka":
        parser.error("--format json is for --log kafka")
    with BenchEnv(master=args.master, log_backend=args.log, log_format=args.format) as env:
        if args.follower != "redis":  # bench/apply_tables.py: table sizes, MERGE / index costs
            from bench.apply_tables import run

            run(args, env)
            results = env.results
        else:
            results = env.results
            results.update(follower="redis", changes=args.changes, batch=args.batch)
            with ThrowawayRedis() as server:
                env.start_spark("bench-apply")
                if not args.skip_throughput:
                    throughput(args, env, server, results)
                if not args.skip_latency and env.default_path:
                    latency(args, env, server, results)
    if args.follower == "redis":
        report(results)
    else:
        from bench.apply_tables import report as tables_report

        tables_report(results)


if __name__ == "__main__":
    main()
