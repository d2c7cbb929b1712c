"""Benchmark: durable appends to the local change log, against a raw file append of the same bytes.

Run with ``make bench`` or ``.venv/bin/python bench/log_append.py [--records N] [--profile]``.

Every measurement writes the *same* pre-built records — change events of the synthetic ``shop``
workload encoded by :class:`~cdc.avro.EventCodec` (Avro values, JSON keys, positions) — with
durability on, into a fresh directory on the project's filesystem:

* **log append (direct)**: ``LocalChangeLog.append`` with 100 / 1,000 / 10,000 records a commit;
* **group commit**: ``GroupCommitter`` with 1 / 4 / 16 producer threads, each appending 10 records
  at a time and waiting for the acknowledgement; with the configured ``log.commit_interval``
  (50 ms) and with interval 0 (flush as soon as the flusher is free);
* **raw append** (the physical limit): the identical ``encode_record`` bytes appended with
  ``os.write`` to 8 plain files (one per partition, as the log partitions them) or to 1 file,
  with one ``os.fdatasync`` per touched file and batch;
* two diagnostics: the log with ``fsync=False`` (its pure CPU cost) and the raw 8-file append
  with the 8 fdatasyncs run in parallel like the log does.

Building the records is not timed. The best of ``--repeat`` runs is reported for the direct and
raw modes. The last line of stdout is one JSON object with the headline numbers.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))  # `bench` is not an installed package

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import print_summary, progress_bar, work_directory  # noqa: E402
from cdc.avro import EventCodec  # noqa: E402
from cdc.log.base import Record  # noqa: E402
from cdc.log.group_commit import GroupCommitter  # noqa: E402
from cdc.log.local import LocalChangeLog  # noqa: E402
from cdc.log.partitioner import partition_for  # noqa: E402
from cdc.log.schemas import SchemaStore  # noqa: E402
from cdc.log.segment import encode_record  # noqa: E402
from cdc_app.console import make_console  # noqa: E402
from cdc_app.synthetic import ORDERS, Workload  # noqa: E402

PARTITIONS = 8
BATCHES = (100, 1_000, 10_000)
THREADS = (1, 4, 16)
GROUP_BATCH = 10  # records per GroupCommitter.append of one producer
DEFAULT_INTERVAL = 0.02  # log.commit_interval's default (cdc/config.py)
DEFAULT_MAX_RECORDS = 20_000  # log.commit_max_records's default
WORKLOAD_KEYS = 10_000
REFERENCE = "raw, 8 files"

MODE_DIRECT = "log append (direct)"
MODE_NOSYNC = "log append, fsync off (diagnostic)"
MODE_GROUP = f"group commit, interval {DEFAULT_INTERVAL * 1000:.0f} ms"
MODE_GROUP0 = "group commit, interval 0"
MODE_RAW8 = REFERENCE
MODE_RAW8P = "raw, 8 files, parallel fdatasync (diagnostic)"
MODE_RAW1 = "raw, 1 file"


@dataclass
class Result:
    mode: str
    batch: str
    records: int
    commits: int
    seconds: list[float] = field(default_factory=list)
    reference_batch: int | None = None  # which raw 8-file row the ratio compares with

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def rate(self) -> float:
        return self.records / self.best

    @property
    def worst_rate(self) -> float:
        return self.records / max(self.seconds)


# ------------------------------------------------------------------------------ machine facts


def filesystem(path: Path) -> str:
    """``<type> on <device> at <mount point>`` for the filesystem holding ``path``."""
    real = os.path.realpath(path)
    best: tuple[str, str, str] | None = None
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                device, mount, fstype = line.split()[:3]
                mount = mount.replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and (best is None or len(mount) >= len(best[0])):
                    best = (mount, fstype, device)
    except OSError:
        return "unknown"
    if best is None:
        return "unknown"
    mount, fstype, device = best
    return f"{fstype} on {device} at {mount}"


def fdatasync_latency(directory: Path, samples: int = 200) -> tuple[float, float]:
    """Median and p99 (ms) of ``fdatasync`` after appending 4 KiB to a file in ``directory``."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    block = b"x" * 4096
    times = []
    try:
        for _ in range(samples):
            os.write(fd, block)
            started = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    times.sort()
    return statistics.median(times) * 1000, times[int(len(times) * 0.99) - 1] * 1000


# ------------------------------------------------------------------------------ the records


def build_records(count: int, scratch: Path, advance: Callable[[int], None],
                  store: Any = None, keys: int = WORKLOAD_KEYS) -> list[Record]:
    """``count`` records of the synthetic workload over ``keys`` distinct keys, encoded exactly
    as the capture path does (schemas registered in ``store``, else a fresh store under
    ``scratch``)."""
    if store is None:
        store_dir = scratch / "schemas"
        store_dir.mkdir()
        store = SchemaStore(store_dir, writable=True)
    codec = EventCodec(store)
    workload = Workload(keys=keys)
    records: list[Record] = []
    while len(records) < count:
        before = len(records)
        records.extend(codec.records(workload.next_event()))  # a delete adds a tombstone
        advance(min(len(records), count) - before)
    return records[:count]


def frame(records: Sequence[Record]) -> list[tuple[int, bytes]]:
    """Per record, its partition and its framed bytes exactly as the log would write them."""
    now_ms = int(time.time() * 1000)
    next_offset = [0] * PARTITIONS
    out = []
    for record in records:
        partition = partition_for(record.key, PARTITIONS)
        pieces = encode_record(next_offset[partition], now_ms, record.key, record.value,
                               record.position)
        next_offset[partition] += 1
        out.append((partition, b"".join(pieces)))
    return out


# ------------------------------------------------------------------------------ the modes


def open_log(root: Path, name: str, fsync: bool = True) -> LocalChangeLog:
    log = LocalChangeLog(Path(tempfile.mkdtemp(dir=root, prefix=name)), partitions=PARTITIONS,
                         fsync=fsync)
    log.ensure_topic(ORDERS.topic, {"source": "shop", "table": str(ORDERS.table)})
    return log


def discard(log: LocalChangeLog, expected: int) -> None:
    """Check that the log holds ``expected`` records, then close and delete it."""
    held = sum(log.end_offsets(ORDERS.topic).values())
    log.close()
    shutil.rmtree(log.path)
    if held != expected:
        raise RuntimeError(f"the log holds {held} records, {expected} were appended")


def direct_append(log: LocalChangeLog, records: Sequence[Record], batch: int) -> float:
    started = time.perf_counter()
    for start in range(0, len(records), batch):
        log.append(records[start : start + batch], {"shop": {"seq": start + batch}})
    return time.perf_counter() - started


def run_direct(root: Path, records: Sequence[Record], batch: int, fsync: bool = True) -> float:
    log = open_log(root, f"direct-{batch}-", fsync)
    try:
        seconds = direct_append(log, records, batch)
    except BaseException:
        log.close()
        raise
    discard(log, len(records))
    return seconds


def run_group(root: Path, records: Sequence[Record], threads: int, interval: float,
              budget: float) -> tuple[int, float, int]:
    """(records acknowledged, seconds, groups committed) within ``budget`` seconds."""
    log = open_log(root, f"group-{threads}-")
    committer = GroupCommitter(log, interval=interval, max_records=DEFAULT_MAX_RECORDS)
    share = len(records) // threads
    chunks = [records[i * share : (i + 1) * share] for i in range(threads)]

    def produce(index: int, chunk: Sequence[Record], deadline: float) -> int:
        done = 0
        for start in range(0, len(chunk), GROUP_BATCH):
            if time.perf_counter() >= deadline:
                break
            batch = chunk[start : start + GROUP_BATCH]
            committer.append(batch, {f"producer-{index}": {"seq": start}})
            done += len(batch)
        return done

    try:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="producer") as pool:
            started = time.perf_counter()
            deadline = started + budget
            futures = [pool.submit(produce, index, chunk, deadline)
                       for index, chunk in enumerate(chunks)]
            acked = sum(future.result() for future in futures)
            seconds = time.perf_counter() - started
    finally:
        committer.close()
    groups = committer.groups
    discard(log, acked)
    return acked, seconds, groups


def run_raw(root: Path, framed: Sequence[tuple[int, bytes]], batch: int, files: int,
            pool: ThreadPoolExecutor | None = None) -> float:
    """Append the framed bytes to ``files`` plain files, one fdatasync per touched file a batch."""
    directory = Path(tempfile.mkdtemp(dir=root, prefix=f"raw{files}-{batch}-"))
    fds = [os.open(directory / f"{index}.seg", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
           for index in range(files)]
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dir_fd)  # the files exist durably before timing, like the log's segments
    os.close(dir_fd)
    try:
        started = time.perf_counter()
        for start in range(0, len(framed), batch):
            chunk = framed[start : start + batch]
            if files == 1:
                os.write(fds[0], b"".join([data for _, data in chunk]))
                os.fdatasync(fds[0])
                continue
            buckets: list[list[bytes]] = [[] for _ in range(files)]
            for partition, data in chunk:
                buckets[partition].append(data)
            touched = []
            for fd, bucket in zip(fds, buckets, strict=True):
                if bucket:
                    os.write(fd, b"".join(bucket))
                    touched.append(fd)
            if pool is None:
                for fd in touched:
                    os.fdatasync(fd)
            else:
                for future in [pool.submit(os.fdatasync, fd) for fd in touched]:
                    future.result()
        seconds = time.perf_counter() - started
    finally:
        for fd in fds:
            os.close(fd)
    total = sum(len(data) for _, data in framed)
    written = sum(path.stat().st_size for path in directory.iterdir())
    shutil.rmtree(directory)
    if written != total:
        raise RuntimeError(f"raw append wrote {written} bytes, expected {total}")
    return seconds


# ------------------------------------------------------------------------------ reporting


def results_table(results: list[Result], frame_bytes: float) -> Table:
    reference = {r.reference_batch: r.rate for r in results
                 if r.mode == REFERENCE and r.reference_batch is not None}
    table = Table(title="local change log: durable append throughput (best of the runs)")
    table.add_column("mode")
    table.add_column("batch", justify="right")
    table.add_column("records/commit", justify="right")
    table.add_column("records/s", justify="right")
    table.add_column("worst run", justify="right", style="dim")
    table.add_column("MB/s", justify="right")
    table.add_column(f"x {REFERENCE}", justify="right")
    for result in results:
        ratio = "-"
        if result.reference_batch in reference:
            ratio = f"{result.rate / reference[result.reference_batch]:.2f}"
        worst = f"{result.worst_rate:,.0f}" if len(result.seconds) > 1 else "-"
        table.add_row(result.mode, result.batch, f"{result.records / result.commits:,.0f}",
                      f"{result.rate:,.0f}", worst, f"{result.rate * frame_bytes / 1e6:,.1f}",
                      ratio)
    return table


def profile_direct(root: Path, records: Sequence[Record], batch: int) -> None:
    """cProfile of the direct append (main thread; the fsync pool shows up as waiting)."""
    console = make_console()
    log = open_log(root, "profile-")
    profiler = cProfile.Profile()
    try:
        seconds = profiler.runcall(direct_append, log, records, batch)
    finally:
        log.close()
    shutil.rmtree(log.path)
    console.rule(f"cProfile: direct append, batch {batch:,} ({len(records) / seconds:,.0f} "
                 "records/s under the profiler)")
    sys.stdout.flush()
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(15)
    stats.sort_stats("tottime").print_stats(10)
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000, help="records per run (50,000)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to create the temporary logs (default: <project>/.bench-tmp; "
                             "use a directory on the filesystem you want to measure, not tmpfs)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per direct/raw measurement; the best is reported (3)")
    parser.add_argument("--group-seconds", type=float, default=3.0,
                        help="time budget per group-commit measurement (3 s)")
    parser.add_argument("--profile", action="store_true",
                        help="also cProfile the direct append at batch 1,000")
    args = parser.parse_args(argv)
    if args.records < max(BATCHES) or args.repeat < 1:
        parser.error(f"--records must be at least {max(BATCHES)} and --repeat at least 1")

    console = make_console()
    with work_directory(args.dir, "log-append-") as root:
        return run(args, console, root)


def run(args: argparse.Namespace, console: Console, root: Path) -> int:
    n = args.records
    fs = filesystem(root)
    nproc = os.cpu_count() or 1
    if fs.split()[0] in ("tmpfs", "ramfs"):
        console.print(f"[yellow]warning[/]: {root} is on {fs}: fsync costs nothing there; "
                      "pass --dir on a disk-backed filesystem")
    fsync_median, fsync_p99 = fdatasync_latency(root)
    console.print(f"records: {n:,}   directory: {root}   filesystem: {fs}   nproc: {nproc}   "
                  f"fdatasync (4 KiB append): median {fsync_median:.3f} ms, "
                  f"p99 {fsync_p99:.3f} ms   python {sys.version.split()[0]}")

    results: list[Result] = []
    runs = (2 * len(BATCHES) * args.repeat  # direct, fsync off
            + 3 * len(BATCHES) * args.repeat  # raw 8, raw 8 parallel, raw 1
            + 2 * len(THREADS))  # group commit, two intervals
    progress_console = make_console(stderr=True)
    with progress_bar(progress_console, 48, info=False) as bar:
        build = bar.add_task("building records (not timed)", total=n)
        records = build_records(n, root, lambda done: bar.advance(build, done))
        framed = frame(records)
        frame_bytes = sum(len(data) for _, data in framed) / n
        task = bar.add_task("measuring", total=runs)

        def measure(mode: str, batch: int, reference: int | None,
                    once: Callable[[], float]) -> None:
            result = Result(mode, f"{batch:,}", n, -(-n // batch), reference_batch=reference)
            for repeat in range(args.repeat):
                bar.update(task, description=f"{mode} {batch:,} ({repeat + 1}/{args.repeat})")
                result.seconds.append(once())
                bar.advance(task)
            results.append(result)

        for batch in BATCHES:
            measure(MODE_DIRECT, batch, batch, partial(run_direct, root, records, batch))
        for batch in BATCHES:
            measure(MODE_NOSYNC, batch, batch,
                    partial(run_direct, root, records, batch, fsync=False))
        for label, interval in ((MODE_GROUP, DEFAULT_INTERVAL), (MODE_GROUP0, 0.0)):
            for threads in THREADS:
                bar.update(task, description=f"{label}, {threads} threads")
                acked, seconds, groups = run_group(root, records, threads, interval,
                                                   args.group_seconds)
                results.append(Result(label, f"{GROUP_BATCH} x {threads} thr", acked,
                                      max(groups, 1), [seconds]))
                bar.advance(task)
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="raw-fsync") as pool:
            for batch in BATCHES:
                measure(MODE_RAW8, batch, batch, partial(run_raw, root, framed, batch, PARTITIONS))
                measure(MODE_RAW8P, batch, batch,
                        partial(run_raw, root, framed, batch, PARTITIONS, pool))
                measure(MODE_RAW1, batch, batch, partial(run_raw, root, framed, batch, 1))

    order = [MODE_DIRECT, MODE_GROUP, MODE_GROUP0, MODE_RAW8, MODE_RAW1, MODE_NOSYNC, MODE_RAW8P]
    results.sort(key=lambda r: order.index(r.mode))  # stable: batch order kept within a mode
    console.print(results_table(results, frame_bytes))
    console.print(f"average framed record: {frame_bytes:,.0f} bytes (header 35 + position + key + "
                  "Avro value); MB/s counts these bytes only (state.json is extra)")

    if args.profile:
        profile_direct(root, records, 1_000)

    def rate(mode: str, batch: str) -> float:
        return next(r.rate for r in results if r.mode == mode and r.batch == batch)

    def by_batch(mode: str) -> dict[str, int]:
        return {str(b): round(rate(mode, f"{b:,}")) for b in BATCHES}

    def by_threads(mode: str) -> dict[str, int]:
        return {str(t): round(rate(mode, f"{GROUP_BATCH} x {t} thr")) for t in THREADS}

    log_rate, raw_rate = rate(MODE_DIRECT, "1,000"), rate(MODE_RAW8, "1,000")
    summary = {
        "log_appends_per_s": round(log_rate),
        "raw_appends_per_s": round(raw_rate),
        "ratio": round(log_rate / raw_rate, 3),
        "group_commit_appends_per_s": by_threads(MODE_GROUP),
        "group_commit_interval_s": DEFAULT_INTERVAL,
        "group_commit_interval0_appends_per_s": by_threads(MODE_GROUP0),
        "log_appends_per_s_by_batch": by_batch(MODE_DIRECT),
        "raw_appends_per_s_by_batch": by_batch(MODE_RAW8),
        "raw_1file_appends_per_s_by_batch": by_batch(MODE_RAW1),
        "raw_parallel_sync_appends_per_s_by_batch": by_batch(MODE_RAW8P),
        "log_nosync_appends_per_s_by_batch": by_batch(MODE_NOSYNC),
        "record_bytes_avg": round(frame_bytes, 1),
        "fdatasync_ms": {"median": round(fsync_median, 3), "p99": round(fsync_p99, 3)},
        "fs": fs,
        "nproc": nproc,
        "records": n,
        "repeat": args.repeat,
    }
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
