"""Read rate of the ``cdc`` Spark source (spark_apply/source.py).

Writes ``--records`` synthetic order changes (distinct keys, 8 partitions) into a fresh log, then
measures: the decode path alone in this process (``read_partition``, no Spark), and a streaming
``availableNow`` query into Spark's ``noop`` sink (everything in one batch, and in batches of
``--max-per-trigger``). The last line is one JSON object with the rates.

    .venv/bin/python bench/spark_source.py --records 200000
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from cdc.avro import EventCodec
from cdc.log.local import LocalChangeLog, LocalChangeLogReader
from cdc.log.schemas import SchemaStore
from cdc_app.synthetic import ORDERS, Workload


def write_log(path: Path, records: int) -> None:
    log = LocalChangeLog(path, partitions=8, fsync=False)
    codec = EventCodec(SchemaStore(path, writable=True))
    log.ensure_topic(ORDERS.topic, {"source": "shop", "table": str(ORDERS.table)})
    workload = Workload(keys=records * 10, seed=1)  # mostly distinct keys: inserts
    batch: list = []
    for event in workload.events(records):
        batch.extend(codec.records(event))
        if len(batch) >= 5000:
            log.append(batch, {"shop": {"seq": workload.seq}})
            batch = []
    log.append(batch, {"shop": {"seq": workload.seq}})
    log.close()


def decode_only(path: Path) -> tuple[int, float, float]:
    """Rows, wall seconds and CPU seconds of reading the whole log in this process."""
    from spark_apply.source import SourceOptions, complete_end, plan, read_partition

    state = LocalChangeLogReader(path).state()
    started, cpu = time.perf_counter(), time.process_time()
    rows = 0
    for task in plan(state, {"topics": {}}, complete_end(state, SourceOptions(str(path))), 1):
        rows += sum(batch.num_rows for batch in read_partition(str(path), task))
    return rows, time.perf_counter() - started, time.process_time() - cpu


def stream(spark: object, path: Path, checkpoint: Path, max_per_trigger: int | None
           ) -> tuple[int, float, int]:
    reader = spark.readStream.format("cdc").option("path", str(path))  # type: ignore[attr-defined]
    if max_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", str(max_per_trigger))
    started = time.perf_counter()
    query = (reader.load().writeStream.format("noop")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    progress = query.recentProgress
    return sum(p["numInputRows"] for p in progress), elapsed, len(progress)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--max-per-trigger", type=int, default=50_000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cdc-bench-source-"))
    try:
        started = time.perf_counter()
        write_log(root / "log", args.records)
        print(f"wrote {args.records:,} records in {time.perf_counter() - started:.1f} s")
        rows, seconds, cpu = decode_only(root / "log")
        decode_rate = rows / cpu
        print(f"decode only (one process, no Spark): {rows:,} rows in {seconds:.2f} s "
              f"({cpu:.2f} s CPU) = {decode_rate:,.0f} rows/s per core")
        from spark_apply.session import spark_session

        started = time.perf_counter()
        spark = spark_session(app_name="bench-spark-source")
        print(f"SparkSession started in {time.perf_counter() - started:.1f} s")
        stream(spark, root / "log", root / "warmup", 1000)  # first batch of a session warms up
        results = {}
        for label, limit in (("one_batch", None), ("limited", args.max_per_trigger)):
            rows, seconds, batches = stream(spark, root / "log", root / f"ck-{label}", limit)
            results[label] = rows / seconds
            print(f"stream {label}: {rows:,} rows in {batches} batch(es), {seconds:.2f} s = "
                  f"{rows / seconds:,.0f} rows/s")
        spark.stop()
        print(json.dumps({"records": args.records, "decode_rows_per_s_per_core": round(decode_rate),
                          "stream_rows_per_s": round(results["one_batch"]),
                          "stream_limited_rows_per_s": round(results["limited"]),
                          "max_per_trigger": args.max_per_trigger}))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
