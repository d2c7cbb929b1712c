"""``cdc apply`` end to end through real Spark into the Delta (SCD1, SCD2) and search followers.

One in-process ``cdc apply --once`` of three followers on the shared ``spark`` fixture, over a
synthetic workload's log (inserts, updates, deletes, re-inserts over 300 keys); then more
changes and a second run; then a replay from offset 0 (the checkpoints removed) that must change
nothing. Each follower must hold exactly the log's newest row per key, as text.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from cdc.config import load_config
from cdc.synthetic import ORDERS, Workload
from sinks import open_sink
from sinks.base import Sink, row_text
from tests.pgkit import latest_rows, read_topic
from tests.test_apply import SOURCES, append_synthetic

FOLLOWERS = ("warehouse", "history", "search")


def write_tables_config(directory: Path) -> Path:
    common = {"max_records_per_batch": 400}
    config = directory / "cdc.yaml"
    config.write_text(json.dumps({
        "log": {"path": str(directory / "log"), "partitions": 4},
        "sources": [{**SOURCES["sources"][0], "tables": ["public.orders"]}],
        "followers": {
            "warehouse": {"kind": "delta", "path": "wh", "mode": "scd1", "buckets": 2, **common},
            "history": {"kind": "delta", "path": "hist", "mode": "scd2", "buckets": 2, **common},
            "search": {"kind": "search", "path": "idx", **common,
                       "text_fields": {"public.orders": ["customer", "note"]}},
        }}))
    return config


def held(sink: Sink) -> dict[str, dict[str, str]]:
    keys = sorted(sink.keys(ORDERS.topic))
    return sink.read(ORDERS.topic, keys)


def expected(log: Path) -> dict[str, dict[str, str]]:
    return {key: row_text(row) for key, row in latest_rows(read_topic(log, ORDERS.topic)).items()}


def apply_once(config_path: Path) -> Any:
    from spark_apply.jobs import run_apply

    return run_apply(load_config(config_path), list(FOLLOWERS), once=True, console=None)


def test_apply_into_delta_and_search_equals_the_log(tmp_path: Path, spark: Any) -> None:
    config_path = write_tables_config(tmp_path)
    log = tmp_path / "log"
    workload = Workload(keys=300)
    append_synthetic(log, workload, 1500)
    job = apply_once(config_path)
    config = load_config(config_path)
    sinks = {name: open_sink(config, name) for name in FOLLOWERS}
    try:
        want = expected(log)
        assert len(want) > 100
        for name, sink in sinks.items():
            assert job.progress[name].batches >= 3, name  # admission control: 400 per batch
            assert held(sink) == want, name
            assert sink.watermark("shop") == {"lsn": workload.seq}, name

        first = len(read_topic(log, ORDERS.topic))
        append_synthetic(log, workload, 700)  # a second run picks up where the first stopped
        job = apply_once(config_path)
        want, total = expected(log), len(read_topic(log, ORDERS.topic))
        for name, sink in sinks.items():
            assert job.progress[name].records == total - first, name
            assert held(sink) == want, name
            assert sink.watermark("shop") == {"lsn": workload.seq}, name

        for name in FOLLOWERS:  # a lost checkpoint: replay from offset 0 through the gate
            shutil.rmtree(config.follower_checkpoint(name))
        job = apply_once(config_path)
        for name, sink in sinks.items():
            progress = job.progress[name]
            assert progress.records == total, name
            assert (progress.written, progress.deleted) == (0, 0), name
            assert progress.skipped > 0, name
            assert held(sink) == want, name
    finally:
        for sink in sinks.values():
            sink.close()
