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

from cdc.avro import EventCodec
from cdc.config import load_config
from cdc.log.local import LocalChangeLogReader
from cdc.log.schemas import SchemaStore
from cdc.sink import Sink, open_sink, row_text
from cdc_app.synthetic import ORDERS, Workload
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


def expected_history(log: Path) -> list[tuple[Any, ...]]:
    """SCD2 from the log by hand: per key, in (position, offset) order, every c/u/r record
    opens a version (closing the open one) and a delete or tombstone closes the open one;
    rows ``(key, position hex, end position hex | None, is_current, row text)``."""
    reader, codec = LocalChangeLogReader(log), EventCodec(SchemaStore(log))
    by_key: dict[str, list[tuple[bytes, int, dict[str, Any] | None]]] = {}
    for partition in range(reader.topic(ORDERS.topic).partitions):
        for record in reader.iter_partition(ORDERS.topic, partition):
            envelope = None if record.value is None else codec.decode_value(record.value).envelope
            after = envelope["after"] if envelope and envelope["op"] in "cur" else None
            by_key.setdefault(record.key.decode(), []).append(
                (bytes(record.position), record.offset, after))
    rows: list[tuple[Any, ...]] = []
    for key, records in by_key.items():
        versions: list[list[Any]] = []
        newest = b""
        for position, _, after in sorted(records, key=lambda r: (r[0], r[1])):
            if position <= newest:
                continue  # a tombstone shares its delete's position
            newest = position
            if versions and versions[-1][2] is None:
                versions[-1][2] = position.hex()  # the open version ends here
            if after is not None:
                versions.append([key, position.hex(), None, True, row_text(after)])
        for version in versions:
            version[3] = version[2] is None
        rows.extend(tuple(v) for v in versions)
    return sorted(rows)


def held_history(sink: Any) -> list[tuple[Any, ...]]:
    from sinks.delta import END_POSITION, IS_CURRENT, KEY, POSITION, cell_text

    table = sink.history(ORDERS.topic)
    data = [name for name in table.column_names if not name.startswith("_cdc_")
            and name not in ("valid_from", "valid_to", "is_current")]
    out = []
    for row in table.to_pylist():
        text = {name: cell_text(row[name]) for name in data if row[name] is not None}
        out.append((row[KEY], row[POSITION], row[END_POSITION], row[IS_CURRENT], text))
    return sorted(out)


def apply_once(config_path: Path) -> Any:
    from spark_apply.jobs import run_apply

    return run_apply(load_config(config_path), list(FOLLOWERS), once=True)


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
            assert name != "history" or job.progress[name].skipped == 0  # tombstones: no news
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

        history = held_history(sinks["history"])  # SCD2: the log's sequence of changes
        assert history == expected_history(log)
        assert sum(1 for row in history if row[3]) == len(want)  # one current row per live key

        for name in FOLLOWERS:  # a lost checkpoint: replay from offset 0 through the gate
            shutil.rmtree(config.follower_checkpoint(name))
        job = apply_once(config_path)
        for name, sink in sinks.items():
            progress = job.progress[name]
            assert progress.records == total, name
            assert (progress.written, progress.deleted) == (0, 0), name
            assert progress.skipped > 0, name
            assert held(sink) == want, name
        assert held_history(sinks["history"]) == history
    finally:
        for sink in sinks.values():
            sink.close()
