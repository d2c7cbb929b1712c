"""Benchmark: the SQL follower's writes (``SqlSink.apply``) against the database's own bulk load.

Run with ``.venv/bin/python bench/sql_sink.py [--changes N] [--batch B]``. One run, on this
machine: a throwaway PostgreSQL (``cdc_app.servers``) and a SQLite file.

Per dialect: a table is created by a first batch, then ``--changes`` changes in batches of
``--batch`` go through :meth:`SqlSink.apply` (the version gate, the delete of the won keys, the
insert of their rows), each batch half updates of keys already written, half new keys: changes/s
= changes / wall time. The reference beside it, same rows, same process: PostgreSQL's ``COPY
... FROM STDIN`` into an empty table of the same columns (psycopg), SQLite's ``executemany`` of
plain ``INSERT``s in one transaction. The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from cdc.position import Position  # noqa: E402
from cdc.sink import Change  # noqa: E402
from cdc_app.servers.postgres import ThrowawayPostgres  # noqa: E402
from sinks.sql import SqlSink  # noqa: E402

TOPIC = "shop.public.items"
NOTE = "n" * 60
AT = "2026-11-28T01:00:00.123456Z"


def batch(start: int, size: int, seq: int) -> list[Change]:
    return [Change(TOPIC, "shop", "public.items", json.dumps({"id": k}, separators=(",", ":")),
                   Position.postgres(seq + k, 1).to_bytes(),
                   {"id": k, "v": k % 1000, "note": NOTE, "at": AT}, "c")
            for k in range(start, start + size)]


def through_sink(url: str, changes: int, size: int) -> float:
    """Changes/s of ``SqlSink.apply`` (the table created by a first, untimed batch)."""
    sink = SqlSink("db", url)
    try:
        sink.check()
        sink.apply(batch(0, size, 1))
        started = time.perf_counter()
        for i in range(changes // size):
            sink.apply(batch(i * size // 2, size, 10_000_000 * (i + 2)))
        return changes / (time.perf_counter() - started)
    finally:
        sink.close()


def postgres_copy(dsn: str, changes: int) -> float:
    rows = [(k, k % 1000, NOTE, AT) for k in range(changes)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE copied (id bigint PRIMARY KEY, v bigint, note text, "
                     "at timestamptz)")
        started = time.perf_counter()
        with conn.transaction(), conn.cursor() as cursor, \
                cursor.copy("COPY copied FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        return changes / (time.perf_counter() - started)


def sqlite_inserts(path: Path, changes: int) -> float:
    rows = [(k, k % 1000, NOTE, AT) for k in range(changes)]
    conn = sqlite3.connect(path)
    try:
        conn.execute("CREATE TABLE copied (id INTEGER PRIMARY KEY, v INTEGER, note TEXT, "
                     "at TEXT)")
        started = time.perf_counter()
        with conn:
            conn.executemany("INSERT INTO copied VALUES (?, ?, ?, ?)", rows)
        return changes / (time.perf_counter() - started)
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--changes", type=int, default=60_000)
    parser.add_argument("--batch", type=int, default=10_000)
    args = parser.parse_args()
    results: dict[str, Any] = {"changes": args.changes, "batch": args.batch}
    with ThrowawayPostgres() as pg:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE f")
        url = pg.dsn("f").replace("postgresql://", "postgresql+psycopg://", 1)
        results["postgres_sink_per_s"] = round(through_sink(url, args.changes, args.batch))
        results["postgres_copy_per_s"] = round(postgres_copy(pg.dsn("f"), args.changes))
    with tempfile.TemporaryDirectory() as folder:
        results["sqlite_sink_per_s"] = round(
            through_sink(f"sqlite:///{Path(folder) / 'f.db'}", args.changes, args.batch))
        results["sqlite_insert_per_s"] = round(sqlite_inserts(Path(folder) / "c.db",
                                                              args.changes))
    table = Table(title=f"SqlSink.apply, {args.changes:,} changes in batches of {args.batch:,}")
    for column in ("dialect", "SqlSink.apply", "bulk load (reference)", "ratio"):
        table.add_column(column, justify="left" if column == "dialect" else "right")
    for dialect, reference in (("postgres", "copy"), ("sqlite", "insert")):
        ours, limit = results[f"{dialect}_sink_per_s"], results[f"{dialect}_{reference}_per_s"]
        results[f"{dialect}_ratio"] = round(ours / limit, 3)
        table.add_row(dialect, f"{ours:,}/s", f"{limit:,}/s ({reference})",
                      f"{ours / limit:.2f}")
    Console(width=120).print(table)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
