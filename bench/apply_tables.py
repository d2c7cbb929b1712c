"""Benchmark: ``cdc apply`` into a Delta (SCD1/SCD2) or search follower, at several table sizes.

Run through ``bench/apply.py --follower delta|search [--mode scd1|scd2] [--table-rows
100000,2000000] [--changes N] [--batch B] [--buckets K] [--master local|cluster] [--log
local|kafka] [--skip-spark-merge] [--py-spy FILE]`` (``make bench-apply-tables``); the run's
set-up (logs, Spark session or cluster, Kafka broker) is ``bench/common.py``'s ``BenchEnv``.

One run, one SparkSession. For each table size P:

1. a fresh log gets P inserts of the synthetic ``shop.public.orders`` table (6 columns, a
   ~100-byte note), written directly with the project's codec and log writer (not capture);
2. ``cdc apply --once`` folds them into a fresh follower: the *initial load* (rows/s);
3. the log gets N (``--changes``) updates of N *distinct* random existing keys (so folding cannot
   collapse the work and every change meets an existing row: the MERGE's worst case);
4. ``cdc apply --once`` again: **changes/s at table size P** (the figure with the goal), with the
   tasks' own split (read + decode + fold vs. the sink's writes: *task CPU-ish seconds, summed
   over tasks*, which run in parallel — the search follower's one task runs on the driver) and,
   for Delta, the number of live data files afterwards;
5. the limit beside it, on the same rows: a plain Delta append of the N updated rows
   (``deltalake.write_deltalake``, one commit) or a Tantivy bulk add of N documents (one writer,
   one commit);
6. Delta SCD1, largest size, when the session has delta-spark (``--skip-spark-merge`` skips it):
   **delta-spark's ``MERGE INTO delta.`path```** of the same N changes into a copy of the same
   table taken before step 3 — the source rows are the ones the follower wrote (same columns,
   same gate ``s._cdc_position > t._cdc_position``), handed from Python to the JVM with
   ``spark.createDataFrame`` (what a driver-side MERGE of a batch must do; timed) and merged on
   bucket + key (timed apart). The copy is then checked to hold the N updated rows.

The goals (default path: Spark local mode, local log): Delta SCD1 ``sizes[-1].changes_per_s``
>= 50,000 at 2M rows; search >= 25,000. The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import random
import shutil
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import (
    BenchEnv,
    PySpy,
    append_log,
    console,
    delta_follower,
    goal,
    load,
    order_row,
    print_json,
    search_follower,
)
from cdc.events import Op

#: issue 13's goals at the largest table size (default path)
GOALS = {"delta": 50_000, "search": 25_000}


def follower_settings(args: argparse.Namespace, path: Path, batch: int) -> dict[str, Any]:
    if args.follower == "delta":
        return delta_follower(path, batch, args.mode, args.buckets)
    return search_follower(path, batch, {"public.orders": ["customer", "status", "note"]})


def delta_files(root: Path) -> int:
    from deltalake import DeltaTable

    return sum(len(DeltaTable(str(path.parent)).file_uris())
               for path in root.rglob("_delta_log") if path.is_dir())


def delta_table_dir(root: Path) -> Path:
    """The one Delta table under a follower's directory."""
    found = [path.parent for path in root.rglob("_delta_log") if path.is_dir()]
    if len(found) != 1:
        raise SystemExit(f"expected one Delta table under {root}, found {found}")
    return found[0]


def updated_rows(keys: list[int], first_position: int) -> Any:
    import pyarrow as pa

    rows = [order_row(key, first_position + index) for index, key in enumerate(keys)]
    for row in rows:
        row["amount"] = str(row["amount"])
        row["placed_at"] = row["placed_at"].isoformat()
    return pa.Table.from_pylist(rows)


def delta_append_limit(root: Path, table: Any) -> float:
    from deltalake import write_deltalake

    target = root / "append-limit"
    started = time.perf_counter()
    write_deltalake(str(target), table, mode="append")
    seconds = time.perf_counter() - started
    shutil.rmtree(target, ignore_errors=True)
    return float(table.num_rows / seconds)


def tantivy_bulk_limit(root: Path, table: Any) -> float:
    import tantivy

    builder = tantivy.SchemaBuilder()
    builder.add_text_field("doc", stored=True, tokenizer_name="raw")
    builder.add_json_field("row", stored=True)
    schema = builder.build()
    target = root / "bulk-limit"
    target.mkdir()
    index = tantivy.Index(schema, path=str(target))
    rows = table.to_pylist()
    started = time.perf_counter()
    writer = index.writer(256 * 1024 * 1024)
    for row in rows:
        writer.add_document(tantivy.Document(doc=str(row["id"]), row=row))
    writer.commit()
    writer.wait_merging_threads()
    seconds = time.perf_counter() - started
    shutil.rmtree(target, ignore_errors=True)
    return len(rows) / seconds


def spark_merges(args: argparse.Namespace, env: BenchEnv) -> bool:
    """Whether this run measures delta-spark's MERGE (Delta SCD1, delta-spark's jars in the
    session, not ``--skip-spark-merge``)."""
    return (args.follower == "delta" and args.mode == "scd1" and not args.skip_spark_merge
            and "DeltaSparkSessionExtension" in (env.spark.conf.get("spark.sql.extensions", "")
                                                 or ""))


MERGE_SQL = ("MERGE INTO delta.`{target}` t USING {source} s "
             "ON t._cdc_bucket = s._cdc_bucket AND t._cdc_key = s._cdc_key "
             "WHEN MATCHED AND s._cdc_position > t._cdc_position THEN UPDATE SET * "
             "WHEN NOT MATCHED THEN INSERT *")


def warm_spark_merge(env: BenchEnv, follower: Path) -> None:
    """delta-spark's first MERGE in a session loads and compiles much (tens of seconds on a
    loaded machine): one untimed MERGE of the warm-up table's rows into a copy of it."""
    table = delta_table_dir(follower)
    copy = env.root / "spark-merge-warm"
    shutil.copytree(table, copy)
    env.spark.sql(MERGE_SQL.format(target=copy, source=f"delta.`{table}`"))
    shutil.rmtree(copy, ignore_errors=True)


def spark_merge(env: BenchEnv, follower_table: Path, copy: Path, since_ms: int,
                changes: int) -> dict[str, Any]:
    """delta-spark's MERGE of the rows the follower wrote at or after ``since_ms`` (the N
    changes) into ``copy`` (the table before them): changes/s with and without the
    Python -> JVM hand-over of the source rows."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from sinks.delta import APPLIED

    source = DeltaTable(str(follower_table)).to_pyarrow_table(
        filters=[(APPLIED, ">=", since_ms)])
    if source.num_rows != changes:
        raise SystemExit(f"the follower table has {source.num_rows:,} rows written by the "
                         f"update run, not {changes:,}")
    plain = pa.schema([pa.field(f.name, pa.string()) if (pa.types.is_large_string(f.type) or
                                                           pa.types.is_string_view(f.type))
                       else f for f in source.schema])
    source = source.cast(plain)
    spark = env.spark
    spark.sparkContext.setJobDescription("bench: delta-spark MERGE INTO")
    before = load()
    started = time.perf_counter()
    frame = spark.createDataFrame(source)  # the batch's rows into the JVM
    frame.createOrReplaceTempView("cdc_bench_source")
    handed = time.perf_counter()
    spark.sql(MERGE_SQL.format(target=copy, source="cdc_bench_source"))
    done = time.perf_counter()
    merged = spark.read.format("delta").load(str(copy)).filter(f"{APPLIED} >= {since_ms}").count()
    if merged != changes:
        raise SystemExit(f"delta-spark's MERGE left {merged:,} updated rows, not {changes:,}")
    return {"spark_merge_per_s": round(changes / (done - started)),
            "spark_merge_only_per_s": round(changes / (done - handed)),
            "spark_merge_s": round(done - started, 2),
            "spark_create_dataframe_s": round(handed - started, 2),
            "spark_merge_load": round(max(before, load()), 2)}


def one_size(args: argparse.Namespace, env: BenchEnv, size: int, last: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"table_rows": size}
    log = env.log(f"log-{size}")
    console.print(f"[bold]table of {size:,} rows[/]: writing the {env.log_backend} log ...")
    append_log(log, range(size), Op.CREATE, 1)
    follower = env.root / f"follower-{size}"
    config = env.config(f"size-{size}", log, {"bench": follower_settings(args, follower,
                                                                           args.batch)})
    seconds, job = env.apply_once(config, ["bench"])
    out["initial_load_rows_per_s"] = round(size / seconds)
    console.print(f"  initial load: {size:,} rows in {seconds:.1f} s "
                  f"({size / seconds:,.0f}/s, {job.progress['bench'].batches} batches)")
    changes = min(args.changes, size)
    keys = random.Random(size).sample(range(size), changes)
    merge_copy = None
    if last and spark_merges(args, env):
        merge_copy = env.root / "spark-merge-copy"
        shutil.copytree(delta_table_dir(follower), merge_copy)
    append_log(log, keys, Op.UPDATE, size + 1)
    since_ms = int(time.time() * 1000)
    before = load()
    with PySpy(args.py_spy if last else None) as spy:
        seconds, job = env.apply_once(config, ["bench"])
    progress = job.progress["bench"]
    written = progress.written
    in_batches = env.batch_seconds(job, "bench")
    out.update(changes=changes, changes_per_s=round(changes / seconds), apply_s=round(seconds, 2),
               batches_s=None if in_batches is None else round(in_batches, 2),
               batches=progress.batches, written=written,
               task_read_fold_cpu_s=round(progress.fold_seconds, 2),
               task_sink_cpu_s=round(progress.sink_seconds, 2),
               load=round(max(before, load()), 2))
    if last and args.py_spy:
        env.results["py_spy"] = spy.summary()
    console.print(f"  {changes:,} updates of distinct keys in {seconds:.2f} s = "
                  f"{changes / seconds:,.0f}/s (task CPU-ish seconds, summed over tasks: "
                  f"read+fold {progress.fold_seconds:.1f} s, sink {progress.sink_seconds:.1f} s; "
                  f"{written:,} written)")
    if written != changes and args.mode != "scd2":
        raise SystemExit(f"the follower wrote {written:,} of {changes:,} changes")
    table = updated_rows(keys, size + 1)
    if args.follower == "delta":
        out["files_after"] = delta_files(follower)
        out["limit_per_s"] = round(delta_append_limit(env.root, table))
        console.print(f"  plain Delta append of the same rows: {out['limit_per_s']:,}/s; "
                      f"{out['files_after']} live files in the follower")
    else:
        out["limit_per_s"] = round(tantivy_bulk_limit(env.root, table))
        console.print(f"  Tantivy bulk add of the same rows: {out['limit_per_s']:,}/s")
    out["ratio"] = round(out["changes_per_s"] / out["limit_per_s"], 3)
    if merge_copy is not None:
        out.update(spark_merge(env, delta_table_dir(follower), merge_copy, since_ms, changes))
        console.print(f"  delta-spark MERGE INTO of the same changes: "
                      f"{out['spark_merge_per_s']:,}/s with createDataFrame "
                      f"({out['spark_merge_only_per_s']:,}/s the MERGE alone)")
        shutil.rmtree(merge_copy, ignore_errors=True)
    shutil.rmtree(Path(log.settings["path"]), ignore_errors=True)
    return out


def run(args: argparse.Namespace, env: BenchEnv) -> None:
    sizes = [int(size) for size in str(args.table_rows).split(",")]
    results = env.results
    results.update(follower=args.follower, batch=args.batch, changes=args.changes,
                   mode=args.mode if args.follower == "delta" else None,
                   buckets=args.buckets if args.follower == "delta" else None)
    env.start_spark("bench-apply-tables")
    env.warm_up({"bench": follower_settings(args, env.root / "warm-follower", 1000)})
    if spark_merges(args, env):
        warm_spark_merge(env, env.root / "warm-follower")
    results["sizes"] = [one_size(args, env, size, index == len(sizes) - 1)
                        for index, size in enumerate(sizes)]
    target = GOALS[args.follower]
    if env.default_path and (args.follower == "search" or args.mode == "scd1"):
        results["goals"] = {"changes_per_s": goal(results["sizes"][-1]["changes_per_s"],
                                                  target)}


def report(results: dict[str, Any]) -> None:
    kind = results["follower"]
    where = f"{results['master']} master, {results['log']} log"
    title = f"cdc apply -> {kind}" + (f" ({results['mode']}, {results['buckets']} buckets)"
                                      if kind == "delta" else "")
    table = Table(title=f"{title} (one run; {where})")
    limit = "limit" + (" (Delta append)" if kind == "delta" else " (Tantivy bulk add)")
    for column in ("table rows", "initial load", "changes/s", "task s: read+fold / sink",
                   limit, "ratio", "delta-spark MERGE (alone)", "goal"):
        table.add_column(column, justify="right")
    default = results["master"] == "local" and results["log"] == "local"
    for size in results["sizes"]:
        merge = (f"{size['spark_merge_per_s']:,}/s ({size['spark_merge_only_per_s']:,}/s)"
                 if "spark_merge_per_s" in size else "-")
        table.add_row(f"{size['table_rows']:,}", f"{size['initial_load_rows_per_s']:,}/s",
                      f"{size['changes_per_s']:,}/s",
                      f"{size['task_read_fold_cpu_s']} / {size['task_sink_cpu_s']}",
                      f"{size['limit_per_s']:,}/s", f"{size['ratio']}", merge,
                      f">= {GOALS[kind]:,}/s" if default else "(no goal)")
    Console(width=140).print(table)
    text = results.pop("py_spy", "")
    if text:
        print("--- py-spy record --subprocesses of the largest size's update apply ---")
        print(text)
    print_json(results)
