"""Benchmark: ``cdc apply`` into a Delta (SCD1/SCD2) or search follower, at several table sizes.

Run through ``bench/apply.py --follower delta|search [--mode scd1|scd2] [--table-rows
100000,2000000] [--changes N] [--batch B] [--buckets K]`` (``make bench-apply-tables``).

One run, one SparkSession. For each table size P:

1. a fresh log gets P inserts of the synthetic ``shop.public.orders`` table (6 columns, a 100-byte
   note), written directly with the project's codec (not through capture);
2. ``cdc apply --once`` folds them into a fresh follower: the *initial load* (rows/s);
3. the log gets N (``--changes``) updates of N *distinct* random existing keys (so folding cannot
   collapse the work and every change meets an existing row: the MERGE's worst case);
4. ``cdc apply --once`` again: **changes/s at table size P** (the figure with the goal), with the
   batch handler's split (read + fold in Spark vs. the sink's writes) and, for Delta, the number
   of live data files afterwards;
5. the limit beside it, on the same rows: a plain Delta append of the N updated rows
   (``deltalake.write_deltalake``, one commit) or a Tantivy bulk add of N documents (one writer,
   one commit).

The last line of stdout is one JSON object with the numbers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from cdc.avro import EventCodec
from cdc.config import load_config
from cdc.events import ChangeEvent, Op, TransactionInfo
from cdc.log.local import LocalChangeLog
from cdc.log.schemas import SchemaStore
from cdc.position import Position
from cdc.synthetic import ORDERS

TOPIC = ORDERS.topic
console = Console(stderr=True)


def order_row(key: int, version: int) -> dict[str, Any]:
    rnd = random.Random(key * 7 + version)
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return {"id": key, "customer": f"customer-{rnd.randrange(10_000)}",
            "amount": Decimal(rnd.randrange(1, 10_000_000)).scaleb(-2),
            "status": rnd.choice(("new", "paid", "shipped")),
            "placed_at": base + dt.timedelta(seconds=rnd.randrange(30_000_000)),
            "note": f"order {key} version {version} " + "x" * 80}


def events(keys: list[int], op: Op, first_position: int) -> Iterator[ChangeEvent]:
    now = int(time.time() * 1000)
    for index, key in enumerate(keys):
        position = first_position + index
        yield ChangeEvent(ORDERS, op, Position.test(position), ts_ms=now,
                          before=None, after=order_row(key, position),
                          source_info={"txId": position, "lsn": position * 64},
                          transaction=TransactionInfo(str(position), 1, 1))


def append_log(path: Path, keys: list[int], op: Op, first_position: int) -> float:
    """Append one event per key to the log at ``path`` (created if new); seconds taken."""
    started = time.perf_counter()
    log = LocalChangeLog(path, partitions=8, fsync=False)
    codec = EventCodec(SchemaStore(path, writable=True))
    log.ensure_topic(TOPIC, {"source": "shop", "table": str(ORDERS.table)})
    batch: list[Any] = []
    position = first_position
    for event in events(keys, op, first_position):
        batch.extend(codec.records(event))
        position += 1
        if len(batch) >= 5000:
            log.append(batch, {"shop": {"lsn": position * 64, "lsn_text": f"0/{position * 64:X}"}})
            batch = []
    log.append(batch, {"shop": {"lsn": position * 64, "lsn_text": f"0/{position * 64:X}"}})
    log.close()
    return time.perf_counter() - started


def write_config(root: Path, log_dir: Path, args: argparse.Namespace, size: int) -> Path:
    path = root / f"cdc-{size}.yaml"
    if args.follower == "delta":
        extra = f"    mode: {args.mode}\n    buckets: {args.buckets}\n"
    else:
        extra = "    text_fields:\n      public.orders: [customer, status, note]\n"
    path.write_text(f"""\
log:
  path: {log_dir}
  partitions: 8
sources:
  - name: shop
    kind: postgres
    dsn: postgresql://postgres@127.0.0.1:1/shop
    tables: [public.orders]
followers:
  bench:
    kind: {args.follower}
    path: {root / f'follower-{size}'}
    max_records_per_batch: {args.batch}
    checkpoint: {root / f'ck-{size}'}
{extra}""")
    return path


def apply_once(config_path: Path) -> tuple[float, Any]:
    from spark_apply.jobs import run_apply

    started = time.perf_counter()
    job = run_apply(load_config(config_path), ["bench"], once=True, console=None)
    return time.perf_counter() - started, job.progress["bench"]


def delta_files(root: Path) -> int:
    from deltalake import DeltaTable

    return sum(len(DeltaTable(str(path.parent)).file_uris())
               for path in root.rglob("_delta_log") if path.is_dir())


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
    return table.num_rows / seconds


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


def one_size(args: argparse.Namespace, root: Path, size: int) -> dict[str, Any]:
    out: dict[str, Any] = {"table_rows": size}
    log_dir = root / f"log-{size}"
    console.print(f"[bold]table of {size:,} rows[/]: writing the log ...")
    append_log(log_dir, list(range(size)), Op.CREATE, 1)
    config = write_config(root, log_dir, args, size)
    seconds, progress = apply_once(config)
    out["initial_load_rows_per_s"] = round(size / seconds)
    console.print(f"  initial load: {size:,} rows in {seconds:.1f} s "
                  f"({size / seconds:,.0f}/s, {progress.batches} batches)")
    changes = min(args.changes, size)
    keys = random.Random(size).sample(range(size), changes)
    append_log(log_dir, keys, Op.UPDATE, size + 1)
    seconds, progress2 = apply_once(config)
    written = progress2.written
    out.update(changes=changes, changes_per_s=round(changes / seconds), apply_s=round(seconds, 2),
               batches=progress2.batches, written=written,
               handler_fold_s=round(progress2.fold_seconds, 2),
               handler_sink_s=round(progress2.sink_seconds, 2))
    console.print(f"  {changes:,} updates of distinct keys in {seconds:.2f} s = "
                  f"{changes / seconds:,.0f}/s (handler: read+fold {progress2.fold_seconds:.1f} s, "
                  f"sink {progress2.sink_seconds:.1f} s; {written:,} written)")
    if written != changes and args.mode != "scd2":
        raise SystemExit(f"the follower wrote {written:,} of {changes:,} changes")
    table = updated_rows(keys, size + 1)
    if args.follower == "delta":
        out["files_after"] = delta_files(root / f"follower-{size}")
        out["limit_per_s"] = round(delta_append_limit(root, table))
        console.print(f"  plain Delta append of the same rows: {out['limit_per_s']:,}/s; "
                      f"{out['files_after']} live files in the follower")
    else:
        out["limit_per_s"] = round(tantivy_bulk_limit(root, table))
        console.print(f"  Tantivy bulk add of the same rows: {out['limit_per_s']:,}/s")
    out["ratio"] = round(out["changes_per_s"] / out["limit_per_s"], 3)
    shutil.rmtree(log_dir, ignore_errors=True)
    return out


def run(args: argparse.Namespace) -> None:
    from spark_apply.session import spark_session

    root = Path(tempfile.mkdtemp(prefix=f"cdc-bench-{args.follower}-"))
    sizes = [int(size) for size in str(args.table_rows).split(",")]
    results: dict[str, Any] = {"follower": args.follower, "batch": args.batch,
                               "mode": args.mode if args.follower == "delta" else None,
                               "buckets": args.buckets if args.follower == "delta" else None}
    try:
        started = time.perf_counter()
        spark = spark_session(app_name="bench-apply-tables")
        results["spark_start_s"] = round(time.perf_counter() - started, 1)
        warm = root / "warm"  # Python workers and the first query's set-up, not measured
        warm.mkdir()
        append_log(warm / "log", list(range(1000)), Op.CREATE, 1)
        apply_once(write_config(warm, warm / "log", args, 1000))
        results["sizes"] = [one_size(args, root, size) for size in sizes]
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(results)


def report(results: dict[str, Any]) -> None:
    kind = results["follower"]
    title = f"cdc apply -> {kind}" + (f" ({results['mode']}, {results['buckets']} buckets)"
                                      if kind == "delta" else "")
    table = Table(title=title + " (one run)")
    for column in ("table rows", "initial load", "changes/s", "read+fold / sink (s)",
                   "limit" + (" (Delta append)" if kind == "delta" else " (Tantivy bulk add)"),
                   "ratio", "goal"):
        table.add_column(column, justify="right")
    for size in results["sizes"]:
        table.add_row(f"{size['table_rows']:,}", f"{size['initial_load_rows_per_s']:,}/s",
                      f"{size['changes_per_s']:,}/s",
                      f"{size['handler_fold_s']} / {size['handler_sink_s']}",
                      f"{size['limit_per_s']:,}/s", f"{size['ratio']}",
                      ">= 50,000/s" if kind == "delta" else "")
    Console(width=120).print(table)
    print(json.dumps(results))
