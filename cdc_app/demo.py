"""``cdc demo``: the change log at work, with no database needed yet.

A synthetic shop workload is appended through group commit (with a progress bar), read back,
compacted and checked: the latest record per key in the compacted log must equal the workload's
own model of the table.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import Future
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from cdc.avro import EventCodec
from cdc.errors import CdcError
from cdc.log.base import AppendResult, ChangeLogReader, Record
from cdc.log.compaction import compact
from cdc.log.group_commit import GroupCommitter
from cdc.log.open import reader_from, writer_from
from cdc_app.console import make_console
from cdc_app.logview import dump_lines, log_stats, print_stats
from cdc_app.synthetic import ORDERS, Workload


def run_demo(directory: str, rows: int, keys: int = 2000) -> None:
    console = make_console()
    path = Path(directory)
    shutil.rmtree(path, ignore_errors=True)
    console.rule("[bold]cdc demo: the local change log")
    console.print(f"log directory: {path.resolve()}  (8 partitions, fsync on, group commit 20 ms)")

    workload = Workload(keys=keys)
    settings = {"backend": "local", "path": str(path), "partitions": 8,
                "segment_bytes": 256 * 1024}
    log = writer_from(settings)
    codec = EventCodec(log.schemas())
    log.ensure_topic(ORDERS.topic, {"source": "shop", "table": str(ORDERS.table)})
    committer = GroupCommitter(log, interval=0.02, max_records=5000)
    started = time.perf_counter()
    pending: list[Record] = []
    futures: list[Future[list[AppendResult]]] = []
    acknowledged = 0
    with Progress(TextColumn("appending changes"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                  console=console) as progress:
        task = progress.add_task("append", total=rows, rate="")
        for index, event in enumerate(workload.events(rows), 1):
            pending.extend(codec.records(event))
            if len(pending) >= 500 or index == rows:
                futures.append(committer.submit(pending, {"shop": {"seq": workload.seq}}))
                pending = []
            while futures and (futures[0].done() or index == rows):
                acknowledged += len(futures.pop(0).result())  # raises if the append failed
            elapsed = time.perf_counter() - started
            if index % 500 == 0 or index == rows:
                progress.update(task, completed=min(acknowledged, rows),
                                rate=f"{acknowledged / elapsed:,.0f} records/s acknowledged")
    elapsed = time.perf_counter() - started
    groups = committer.groups
    committer.close()
    log.close()
    console.print(f"appended {rows:,} changes in {elapsed:.2f} s "
                  f"({rows / elapsed:,.0f}/s durable, {groups} group commits; "
                  "most of the time is Avro encoding)")

    console.rule("first records (cdc log dump)")
    reader = reader_from(settings)
    assert reader is not None
    for line in list(dump_lines(reader, partition=0))[:2]:
        console.print_json(line)

    console.rule("before compaction")
    print_stats(log_stats(reader), console)
    report = compact(path, tombstone_retention=0)
    console.rule("compaction")
    console.print(f"{report.records_before:,} -> {report.records_after:,} records, "
                  f"{report.tombstones_dropped:,} expired tombstones dropped, "
                  f"{report.bytes_before:,} -> {report.bytes_after:,} bytes "
                  f"in {report.seconds:.2f} s")
    console.rule("after compaction")
    print_stats(log_stats(reader), console)
    _check(reader, workload, console)


def _check(reader: ChangeLogReader, workload: Workload, console: Console) -> None:
    """The compacted log, folded per key, must equal the workload's model of the table."""
    codec = EventCodec(reader.schemas())
    latest: dict[str, dict[str, object] | None] = {}
    for partition in range(reader.committed().topics[ORDERS.topic].partitions):
        for record in reader.iter_partition(ORDERS.topic, partition):
            row = None
            if record.value is not None:
                row = codec.decode_value(record.value).envelope["after"]
            latest[record.key.decode()] = row
    live = {key: row for key, row in latest.items() if row is not None}
    expected = {json.dumps({"id": k}, separators=(",", ":")): row
                for k, row in workload.rows.items()}
    table = Table(title="follower check: compacted log vs the workload's table")
    table.add_column("rows in table", justify="right")
    table.add_column("live keys in log", justify="right")
    table.add_column("result")
    same_keys = set(live) == set(expected)
    same_values = same_keys and all(
        live[key]["amount"] == format(expected[key]["amount"], "f")
        and live[key]["customer"] == expected[key]["customer"]
        for key in expected)
    table.add_row(f"{len(expected):,}", f"{len(live):,}",
                  "[green]equal[/]" if same_values else "[red]DIFFERENT[/]")
    console.print(table)
    if not same_values:
        raise CdcError("the compacted log does not match the workload", "this is a bug: report it")
