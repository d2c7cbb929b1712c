"""Benchmark: one huge PostgreSQL transaction through ``cdc capture``: drain time and peak RSS.

Run with ``.venv/bin/python bench/pg_huge_txn.py [--rows N] [--keep] [--dir D]``.

One throwaway server (``cdc_app.servers.postgres.ThrowawayPostgres``, the same settings as
``bench/pg_capture.py``), one table ``public.huge (id bigint PRIMARY KEY, v int, note text)``
with 1,000 rows, bootstrapped into a fresh log; ``cdc capture`` (default settings: 50 ms commit
interval, 20,000 records a group) is started and idle. Then ONE transaction inserts ``--rows``
rows (a 100-byte note each) and updates and deletes some earlier rows (snapshotted ones and
ones it inserted itself), and commits. Timed from the commit until the log's stored offset
passes the commit's end (every record of the transaction durable), with the daemon's ``VmHWM``
(peak resident set) and ``VmRSS`` polled from ``/proc`` meanwhile, then SIGTERM. PostgreSQL sends
nothing of a transaction before its commit (pgoutput protocol 1), and spills it to disk past
``logical_decoding_work_mem``; its replay of the spill is inside the timed span.

Prints a table and, as the last line, one JSON object
``{"rows", "seconds", "rows_per_s", "peak_rss_mb", ...}``.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))  # `bench` is not an installed package

import psycopg  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import (  # noqa: E402
    add_run_options,
    capture_command,
    cpu_seconds,
    current_lsn,
    print_summary,
    proc_status,
    progress_bar,
    run_cdc,
    stored_lsn,
    tail,
    work_directory,
    write_config,
)
from cdc.log.local import LocalChangeLogReader  # noqa: E402
from cdc.position import format_lsn  # noqa: E402
from cdc.status import status_path  # noqa: E402
from cdc_app.console import make_console  # noqa: E402
from cdc_app.servers.postgres import ThrowawayPostgres  # noqa: E402

DATABASE = "bench"
SOURCE = "huge"
TABLE = "public.huge"
TOPIC = f"{SOURCE}.{TABLE}"
RSS_GOAL_MB = 300
BOOTSTRAP_ROWS = 1000


def transaction(rows: int) -> tuple[list[str], int, int]:
    """The statements of the one transaction; (statements, updates, deletes)."""
    first, last = BOOTSTRAP_ROWS + 1, BOOTSTRAP_ROWS + rows
    statements = [
        f"INSERT INTO {TABLE} (id, v, note) SELECT g, 1, "
        "rpad(g::text || ':' || md5(g::text), 100, md5(g::text)) "
        f"FROM generate_series({first}, {last}) g",
        f"UPDATE {TABLE} SET v = v + 10 WHERE id <= 50",
        f"UPDATE {TABLE} SET v = 2, note = 'updated ' || id "
        f"WHERE id BETWEEN {first} AND {first + 49}",
        f"UPDATE {TABLE} SET v = 3 WHERE id = {last}",
        f"DELETE FROM {TABLE} WHERE id BETWEEN 51 AND 60 OR id BETWEEN {first + 50} "
        f"AND {first + 59}",
    ]
    return statements, 50 + 50 + 1, 10 + 10  # (needs rows >= 60)


# ------------------------------------------------------------------------------ helpers


def memory_mb(pid: int) -> tuple[float | None, float | None]:
    """(VmRSS, VmHWM) of a live process, in MB."""
    status = proc_status(pid)
    out = []
    for name in ("VmRSS", "VmHWM"):
        value = status.get(name, "").strip()
        out.append(int(value.split()[0]) / 1024 if value else None)
    return out[0], out[1]


def topic_records(log: Path) -> int:
    if not (log / "state.json").exists():
        return 0
    reader = LocalChangeLogReader(log)
    if TOPIC not in {t.name for t in reader.topics()}:
        return 0
    return sum(reader.end_offsets(TOPIC).values())


def streaming(log: Path, pid: int) -> bool:
    """Whether the capture process ``pid`` says it is streaming (its status file)."""
    try:
        status = json.loads(status_path(log, SOURCE).read_text())
    except (OSError, ValueError):
        return False
    return bool(status.get("pid") == pid and status.get("state") == "streaming")


# ------------------------------------------------------------------------------ the run


def run(args: argparse.Namespace, work: Path, pg: ThrowawayPostgres) -> int:
    console, bars = make_console(), make_console(stderr=True)
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DATABASE}")
    dsn = pg.dsn(DATABASE)
    statements, updates, deletes = transaction(args.rows)
    changes = args.rows + updates + deletes
    records = changes + deletes  # a tombstone after each delete
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, v int NOT NULL, note text)")
        conn.execute(f"INSERT INTO {TABLE} SELECT g, 1, repeat('b', 100) "
                     f"FROM generate_series(1, {BOOTSTRAP_ROWS}) g")
        row = conn.execute("SHOW server_version").fetchone()
        work_mem = conn.execute("SHOW logical_decoding_work_mem").fetchone()
    log = work / "log"
    config = write_config(work / "cdc.yaml", log, SOURCE, "postgres", dsn, [TABLE])
    console.print(f"PostgreSQL {row[0] if row else '?'} on port {pg.port} "
                  f"(logical_decoding_work_mem {work_mem[0] if work_mem else '?'}); "
                  f"work directory {work}", highlight=False)
    run_cdc(work, ["bootstrap", "--config", str(config)], "bootstrap", 300)

    out = work / "capture.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(capture_command(config, __file__), stdout=sink,
                                stderr=subprocess.STDOUT, cwd=PROJECT)
    try:
        return measure(args, console, bars, dsn, log, out, proc, statements, changes, records,
                       updates, deletes)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def measure(args: argparse.Namespace, console: Any, bars: Any, dsn: str, log: Path, out: Path,
            proc: subprocess.Popen[bytes], statements: list[str], changes: int, records: int,
            updates: int, deletes: int) -> int:
    def alive() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"cdc capture exited {proc.returncode}:\n{tail(out)}")

    with psycopg.connect(dsn, autocommit=True) as conn:
        target = current_lsn(conn)
        deadline = time.monotonic() + 120
        while not (streaming(log, proc.pid) and stored_lsn(log, SOURCE) >= target):  # and idle
            alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"capture did not start streaming:\n{tail(out)}")
            time.sleep(0.1)
        idle_rss, _ = memory_mb(proc.pid)
        before = topic_records(log)
        start_lsn = current_lsn(conn)

        with progress_bar(bars, 34) as bar:
            task = bar.add_task("writing the transaction", total=len(statements), info="")
            started = time.perf_counter()
            with conn.transaction():
                for done, statement in enumerate(statements, 1):
                    conn.execute(statement)
                    bar.update(task, completed=done, info=statement.split()[0])
            committed = time.perf_counter()
        endpos = current_lsn(conn)
        written_s = committed - started
        console.print(f"one transaction: {args.rows:,} inserts + {updates} updates + {deletes} "
                      f"deletes = {records:,} records to log, written in {written_s:.1f} s; "
                      f"{(endpos - start_lsn) / 1e6:,.0f} MB of WAL; endpos {format_lsn(endpos)}",
                      highlight=False)

        # the drain: from the commit until the stored offset passes its end
        peak = 0.0
        first_at: float | None = None
        timeline: list[tuple[float, int, float]] = []  # (seconds, records, VmRSS MB)
        done = 0
        with progress_bar(bars, 34) as bar:
            task = bar.add_task("cdc capture draining it", total=records, info="")
            deadline = committed + args.timeout
            while True:
                alive()
                rss, hwm = memory_mb(proc.pid)
                peak = max(peak, hwm or 0.0)
                done = topic_records(log) - before
                now = time.perf_counter()
                if done and first_at is None:
                    first_at = now
                timeline.append((now - committed, done, rss or 0.0))
                bar.update(task, completed=done,
                           info=f"RSS {rss or 0:,.0f} MB, peak {peak:,.0f} MB, "
                                f"{done / max(now - committed, 1e-9):,.0f}/s")
                if stored_lsn(log, SOURCE) >= endpos:
                    break
                if now > deadline:
                    raise RuntimeError(f"timed out with {done:,} of {records:,} records")
                time.sleep(0.1)
            drained = time.perf_counter()
        rss, hwm = memory_mb(proc.pid)
        peak = max(peak, hwm or 0.0)
        cpu = cpu_seconds(proc.pid)
        done = topic_records(log) - before
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        spill = conn.execute("SELECT spill_txns, spill_count, spill_bytes FROM "
                             "pg_stat_replication_slots WHERE slot_name = %s",
                             (f"cdc_{SOURCE}",)).fetchone()

    seconds = drained - committed
    first_s = (first_at - committed) if first_at is not None else None
    rate = args.rows / seconds
    stream_rate = done / (drained - first_at) if first_at is not None and drained > first_at \
        else None
    marks = {}
    for fraction in (0.25, 0.5, 0.75, 1.0):
        sample = next((s for s in timeline if s[1] >= records * fraction), timeline[-1])
        marks[f"{int(fraction * 100)}%"] = round(sample[2])
    problems = []
    if done != records:
        problems.append(f"the log got {done:,} records, expected {records:,}")
    if code != 0:
        problems.append(f"capture exited {code} after SIGTERM:\n{tail(out)}")

    table = Table(title=f"One {args.rows:,}-row transaction through cdc capture")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("records logged (inserts, updates, deletes, tombstones)",
                  f"{done:,} of {records:,}")
    table.add_row("transaction written and committed", f"{written_s:.1f} s")
    table.add_row("commit -> first record in the log",
                  f"{first_s:.1f} s" if first_s is not None else "-")
    table.add_row("commit -> whole transaction durable", f"{seconds:.1f} s")
    table.add_row("rows/s (inserted rows / that)", f"{rate:,.0f}")
    table.add_row("records/s once records flow", f"{stream_rate:,.0f}" if stream_rate else "-")
    table.add_row("capture CPU (user+sys)", f"{cpu:.0f} s" if cpu is not None else "-")
    table.add_row("capture RSS idle before the commit", f"{idle_rss or 0:.0f} MB")
    table.add_row("capture RSS at 25/50/75/100% of the records",
                  " / ".join(f"{v}" for v in marks.values()) + " MB")
    table.add_row("capture peak RSS (VmHWM)",
                  f"[{'green' if peak < RSS_GOAL_MB else 'red'}]{peak:.0f} MB[/] "
                  f"(goal < {RSS_GOAL_MB} MB)")
    if spill is not None:
        table.add_row("server: spilled txns / spills / bytes",
                      f"{spill[0]} / {spill[1]:,} / {int(spill[2]) / 1e6:,.0f} MB")
    table.add_row("capture exit code after SIGTERM", str(code))
    console.print(table)
    for problem in problems:
        console.print(f"[red]{problem}[/]", highlight=False)
    print_summary({
        "rows": args.rows, "seconds": round(seconds, 2), "rows_per_s": round(rate),
        "peak_rss_mb": round(peak, 1), "records": done, "expected_records": records,
        "write_s": round(written_s, 2), "first_record_s": round(first_s, 2) if first_s else None,
        "records_per_s_flowing": round(stream_rate) if stream_rate else None,
        "cpu_s": round(cpu, 1) if cpu is not None else None,
        "rss_mb_at": marks, "idle_rss_mb": round(idle_rss or 0, 1), "exit_code": code,
        "spill_bytes": int(spill[2]) if spill else None,
    })
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000,
                        help="rows the one transaction inserts (2,000,000)")
    add_run_options(parser, 3600, "seconds the drain may take")
    args = parser.parse_args(argv)
    if args.rows < 100:
        parser.error("--rows must be at least 100")
    pg = ThrowawayPostgres()
    with work_directory(args.dir, "pg-huge-txn-", args.keep, pg) as work:
        pg.start()
        return run(args, work, pg)


if __name__ == "__main__":
    sys.exit(main())
