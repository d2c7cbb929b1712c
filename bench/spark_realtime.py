"""Spark's real-time mode (``Trigger.RealTime``) with a Python ``ForeachWriter`` sink, Kafka
source, ``local[4]``, against a ``processingTime="0 seconds"`` micro-batch query and a Kafka ->
Kafka real-time query: latency from produce to ``process()`` (docs/followers.md, "Spark's
real-time mode: measured, not used"). Settings through ``PROBE_CONF`` (JSON of Spark confs, e.g.
``{"spark.buffer.size": "1"}``), ``PROBE_RT`` (the real-time trigger, default ``5 seconds``),
``PROBE_N`` (rows), ``PROBE_OUT`` (a folder for its files).

usage: bench/spark_realtime.py [modes...]   modes: rtm, mb, rtmfunc (default: rtm mb)
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from cdc_app.servers.kafka import ThrowawayKafka  # noqa: E402
from spark_apply.session import require_spark_jars, spark_session  # noqa: E402

OUT = os.environ.get("PROBE_OUT") or tempfile.mkdtemp(prefix="cdc-rtm-")
N = int(os.environ.get("PROBE_N", "200"))
GAP = 0.020
RT_DURATION = os.environ.get("PROBE_RT", "5 seconds")


class Writer:
    """A Python ForeachWriter: open/process/close."""

    def __init__(self, path: str, events: str) -> None:
        self.path = path
        self.events = events

    def open(self, partition_id, epoch_id):  # noqa: ANN001
        self.pid, self.epoch = partition_id, epoch_id
        self.f = open(self.path, "a")  # noqa: SIM115 - closed by close()
        with open(self.events, "a") as ev:
            ev.write(f"open {time.time():.4f} pid={partition_id} epoch={epoch_id} "
                     f"os_pid={os.getpid()}\n")
        return True

    def process(self, row):  # noqa: ANN001
        now = time.time()
        self.f.write(f"{row.value.decode()} {now:.6f} {self.pid} {self.epoch} "
                     f"{row.partition} {row.offset}\n")
        self.f.flush()

    def close(self, error):  # noqa: ANN001
        self.f.close()
        with open(self.events, "a") as ev:
            ev.write(f"close {time.time():.4f} pid={self.pid} epoch={self.epoch} error={error!r}\n")


def func_writer(path):  # noqa: ANN001
    def process_row(row):  # noqa: ANN001
        now = time.time()
        with open(path, "a") as f:
            f.write(f"{row.value.decode()} {now:.6f} -1 -1 {row.partition} {row.offset}\n")
    return process_row


def run(mode: str, spark, bootstrap: str, admin: AdminClient) -> dict:  # noqa: ANN001
    topic = f"rtm_{mode}_{int(time.time())}"
    for fut in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        fut.result(30)
    out = f"{OUT}/out_{mode}.txt"
    events = f"{OUT}/events_{mode}.txt"
    for p in (out, events):
        if os.path.exists(p):
            os.remove(p)
    ckpt = tempfile.mkdtemp(prefix=f"ckpt_{mode}_", dir=OUT)
    df = (spark.readStream.format("kafka")
          .option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", topic)
          .option("startingOffsets", "earliest")
          .load())
    if mode == "rtmudf":
        from pyspark.sql.functions import col, udf
        df = df.select(udf(lambda b: b, "binary")(col("value")).alias("value"),
                       "partition", "offset")
    w = df.writeStream.outputMode("update").option("checkpointLocation", ckpt)
    if mode == "rtmshort":
        w = w.trigger(realTime="1 second")
    elif mode.startswith("rtm"):
        w = w.trigger(realTime=RT_DURATION)
    else:
        w = w.trigger(processingTime="0 seconds")
    result: dict = {"mode": mode, "topic": topic}
    if mode == "rtmkafka":
        return run_kafka(w, df, topic, bootstrap, admin, result)
    w = w.foreach(func_writer(out) if mode.endswith("func") else Writer(out, events))
    if mode in ("rtmudf", "rtmshort"):
        try:
            q = w.start()
        except Exception as e:  # noqa: BLE001
            result["start_error"] = f"{type(e).__name__}: {e}"
            return result
        time.sleep(20)
        result["exception"] = str(q.exception()) if q.exception() else None
        result["active"] = q.isActive
        result["status"] = q.status
        q.stop()
        return result
    t0 = time.time()
    try:
        q = w.start()
    except Exception as e:  # noqa: BLE001
        result["start_error"] = f"{type(e).__name__}: {e}"
        return result
    result["start_s"] = round(time.time() - t0, 2)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "1"})
    try:
        # warm up: until a warm-up message arrives (or the query dies)
        deadline = time.time() + 90
        seen_warm = False
        i = 0
        while time.time() < deadline and not seen_warm:
            if q.exception() is not None or not q.isActive:
                break
            for p in (0, 1):
                producer.produce(topic, value=f"warm{i} {time.time():.6f}", partition=p)
            producer.flush(5)
            i += 1
            time.sleep(1)
            if os.path.exists(out):
                with open(out) as f:
                    seen_warm = sum(1 for line in f if line.startswith("warm")) >= 2
        result["warmup_s"] = round(time.time() - t0, 2)
        if q.exception() is not None or not q.isActive:
            result["query_error"] = str(q.exception())
            return result
        if not seen_warm:
            result["query_error"] = "no warm-up message reached process() in 90 s"
            result["status"] = q.status
            return result
        time.sleep(1)
        sent = {}
        for k in range(N):
            ts = time.time()
            producer.produce(topic, value=f"m{k} {ts:.6f}", partition=k % 2)
            producer.poll(0)
            producer.flush(1)
            sent[k] = ts
            nxt = ts + GAP
            while time.time() < nxt:
                time.sleep(0.001)
        # wait for all
        deadline = time.time() + 60
        lat: dict[int, float] = {}
        dup = 0
        while time.time() < deadline:
            lat.clear()
            dup = 0
            with open(out) as f:
                for line in f:
                    if not line.startswith("m"):
                        continue
                    parts = line.split()
                    k = int(parts[0][1:])
                    seconds = float(parts[2]) - float(parts[1])
                    if k in lat:
                        dup += 1
                    else:
                        lat[k] = seconds
            if len(lat) >= N:
                break
            if q.exception() is not None:
                break
            time.sleep(0.5)
        vals = sorted(v * 1000 for v in lat.values())
        result.update(received=len(lat), duplicates=dup)
        if vals:
            def pct(p):  # noqa: ANN001, ANN202
                return round(vals[min(len(vals) - 1, int(p / 100 * len(vals)))], 1)
            result.update(p50_ms=pct(50), p90_ms=pct(90), p99_ms=pct(99), max_ms=round(vals[-1], 1),
                          min_ms=round(vals[0], 1), mean_ms=round(statistics.mean(vals), 1))
        prog = q.recentProgress
        result["n_progress"] = len(prog)
        result["last_progress"] = prog[-1] if prog else None
        result["exception"] = str(q.exception()) if q.exception() else None
    finally:
        producer.flush(5)
        try:
            q.stop()
        except Exception as e:  # noqa: BLE001
            result["stop_error"] = str(e)
        result["commits"] = sorted(os.listdir(os.path.join(ckpt, "commits"))) \
            if os.path.isdir(os.path.join(ckpt, "commits")) else []
        result["offsets"] = sorted(os.listdir(os.path.join(ckpt, "offsets"))) \
            if os.path.isdir(os.path.join(ckpt, "offsets")) else []
    return result


def run_kafka(w, df, topic, bootstrap, admin, result):  # noqa: ANN001, ANN201
    """Real-time mode Kafka -> Kafka (no Python in the query): the engine's own latency,
    measured by a confluent_kafka consumer of the output topic."""
    from confluent_kafka import Consumer
    out_topic = topic + "_out"
    for fut in admin.create_topics([NewTopic(out_topic, 2, 1)]).values():
        fut.result(30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe" + topic,
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10})
    consumer.subscribe([out_topic])
    q = (df.selectExpr("value").writeStream.outputMode("update")
         .option("checkpointLocation", tempfile.mkdtemp(prefix="ckpt_k_", dir=OUT))
         .trigger(realTime=RT_DURATION).format("kafka")
         .option("kafka.bootstrap.servers", bootstrap).option("topic", out_topic).start())
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    lat: dict[int, float] = {}
    dup = 0
    try:
        # warm up
        deadline = time.time() + 90
        warm = False
        while time.time() < deadline and not warm and q.isActive:
            producer.produce(topic, value=f"warm {time.time():.6f}", partition=0)
            producer.flush(5)
            t_end = time.time() + 1
            while time.time() < t_end:
                m = consumer.poll(0.1)
                if m is not None and not m.error():
                    warm = True
        if not warm:
            result["query_error"] = str(q.exception())
            return result
        time.sleep(1)

        def take(m: Any) -> int:
            """Record a probe's latency; 1 if it was seen before (a duplicate)."""
            if m is None or m.error():
                return 0
            now = time.time()
            v = m.value().decode().split()
            if not v[0].startswith("m"):
                return 0
            i = int(v[0][1:])
            if i in lat:
                return 1
            lat[i] = now - float(v[1])
            return 0

        for k in range(N):
            ts = time.time()
            producer.produce(topic, value=f"m{k} {ts:.6f}", partition=k % 2)
            producer.flush(1)
            nxt = ts + GAP
            while time.time() < nxt:
                dup += take(consumer.poll(0.001))
        deadline = time.time() + 30
        while len(lat) < N and time.time() < deadline:
            dup += take(consumer.poll(0.05))
        vals = sorted(v * 1000 for v in lat.values())
        result.update(received=len(lat), duplicates=dup)
        if vals:
            def pct(p):  # noqa: ANN001, ANN202
                return round(vals[min(len(vals) - 1, int(p / 100 * len(vals)))], 1)
            result.update(p50_ms=pct(50), p90_ms=pct(90), p99_ms=pct(99), max_ms=round(vals[-1], 1),
                          min_ms=round(vals[0], 1))
        result["exception"] = str(q.exception()) if q.exception() else None
    finally:
        q.stop()
        consumer.close()
    return result


def main() -> None:
    modes = sys.argv[1:] or ["rtm", "mb"]
    require_spark_jars("kafka")
    broker = ThrowawayKafka().start()
    spark = None
    try:
        print("broker", broker.bootstrap_servers, f"{broker.start_seconds:.1f}s", flush=True)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        conf = json.loads(os.environ.get("PROBE_CONF", "{}"))
        spark = spark_session("local[4]", app_name="rtm-probe", conf=conf)
        print("spark", spark.version, flush=True)
        for mode in modes:
            try:
                r = run(mode, spark, broker.bootstrap_servers, admin)
            except Exception:  # noqa: BLE001
                r = {"mode": mode, "error": traceback.format_exc()}
            print("RESULT", json.dumps(r, indent=1, default=str), flush=True)
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        broker.cleanup()


if __name__ == "__main__":
    main()
