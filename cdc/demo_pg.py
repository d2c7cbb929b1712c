"""``cdc demo``: PostgreSQL capture, live.

A throwaway PostgreSQL cluster (initdb on a free port, wal_level=logical) gets a small shop
schema and data; ``cdc bootstrap`` snapshots it into a fresh log while a workload keeps writing;
``cdc capture`` streams the rest; then the log is folded per key and compared with the tables.
The config it writes (``<dir>/cdc.yaml``) works with every ``cdc`` command while the demo runs.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console
from rich.live import Live
from rich.table import Table

from cdc.avro import EventCodec
from cdc.config import Config, load_config
from cdc.console import make_console
from cdc.coordinator import bootstrap, open_log, run_capture
from cdc.errors import CdcError
from cdc.log.local import LocalChangeLog
from cdc.servers.postgres import ThrowawayPostgres

SHOP_SCHEMA = """
CREATE TYPE order_status AS ENUM ('new', 'paid', 'shipped', 'cancelled');
CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, email text,
                        created timestamptz NOT NULL DEFAULT now());
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL REFERENCES customers,
                     status order_status NOT NULL DEFAULT 'new', amount numeric(12,2) NOT NULL,
                     items jsonb, placed timestamptz NOT NULL DEFAULT now(), note text);
INSERT INTO customers (id, name, email)
  SELECT g, 'customer ' || g, 'c' || g || '@example.com' FROM generate_series(1, 2000) g;
INSERT INTO orders (id, customer_id, amount, items, note)
  SELECT g, 1 + g % 2000, (g % 9973) * 1.01, jsonb_build_array(jsonb_build_object('sku', g % 97,
         'qty', 1 + g % 5)), repeat('n', 50) FROM generate_series(1, 30000) g;
"""


def run_pg_demo(directory: str, seconds: float) -> None:
    console = make_console()
    root = Path(directory).resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    console.rule("[bold]cdc demo: PostgreSQL -> change log")
    # (its data lives in a fresh temporary directory the unprivileged server user can reach)
    with ThrowawayPostgres() as pg:
        console.print(f"throwaway PostgreSQL on 127.0.0.1:{pg.port} (wal_level=logical)")
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE shop")
        with psycopg.connect(pg.dsn("shop"), autocommit=True) as conn:
            conn.execute(SHOP_SCHEMA)
        console.print("shop schema: customers (2,000 rows), orders (30,000 rows)")
        config_path = _write_config(root, pg.dsn("shop"))
        console.print(f"config: {config_path}")
        config = load_config(config_path)
        workload = ShopWorkload(pg.dsn("shop"))
        writer, codec = open_log(config)
        try:
            workload.start()
            console.rule("bootstrap (snapshot while the workload writes)")
            report = bootstrap(config, config.sources[0], writer, codec, console)
            console.print(f"snapshot of {sum(report.rows.values()):,} rows durable in "
                          f"{report.seconds:.1f} s; streaming from the slot's consistent point")
            console.rule("capture")
            _capture_live(config, writer, codec, workload, seconds, console)
        finally:
            workload.stop()
            writer.close()
        _summary(config, pg.dsn("shop"), workload, console)


def _write_config(root: Path, dsn: str) -> Path:
    path = root / "cdc.yaml"
    path.write_text(f"""\
# written by `cdc demo`; valid while the demo's PostgreSQL runs
log:
  path: {root / 'log'}
  partitions: 8
sources:
  - name: shop
    kind: postgres
    dsn: {dsn}
    tables: [public.customers, public.orders]
    heartbeat_interval: 1s
""")
    return path


class ShopWorkload:
    """Orders placed, paid, shipped and cancelled; customers renamed; a thread of its own."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.transactions = 0
        self.changes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        rng = random.Random(42)
        next_id = 100_000
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self._stop.is_set():
                    with conn.transaction():
                        for _ in range(rng.randint(1, 5)):
                            next_id = self._change(conn, rng, next_id)
                    self.transactions += 1
                    time.sleep(0.002)
        except BaseException as exc:  # noqa: BLE001 - shown in the summary
            self.error = exc

    def _change(self, conn: psycopg.Connection[Any], rng: random.Random, next_id: int) -> int:
        roll = rng.random()
        order = rng.randint(1, next_id)
        if roll < 0.4:
            conn.execute("INSERT INTO orders (id, customer_id, amount, items) VALUES "
                         "(%s, %s, %s, '[]')", (next_id, rng.randint(1, 2000),
                                                rng.randint(100, 100_000) / 100))
            next_id += 1
        elif roll < 0.8:
            conn.execute("UPDATE orders SET status = %s WHERE id = %s",
                         (rng.choice(["paid", "shipped", "cancelled"]), order))
        elif roll < 0.9:
            conn.execute("DELETE FROM orders WHERE id = %s", (order,))
        else:
            conn.execute("UPDATE customers SET name = name || '*' WHERE id = %s",
                         (rng.randint(1, 2000),))
        self.changes += 1
        return next_id


def _capture_live(config: Config, writer: LocalChangeLog, codec: EventCodec,
                  workload: ShopWorkload, seconds: float, console: Console) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []

    def capture() -> None:
        try:
            run_capture(config, config.sources, writer, codec, stop)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    started = time.monotonic()
    with Live(console=console, refresh_per_second=4, transient=True) as live:
        while time.monotonic() - started < seconds and thread.is_alive():
            offset = writer.source_offsets().get("shop", {})
            live.update(f"workload: {workload.transactions:,} transactions, "
                        f"{workload.changes:,} changes written | log: committed up to LSN "
                        f"{offset.get('lsn_text', '?')}")
            time.sleep(0.25)
        workload.stop()
        live.update("workload stopped; waiting for capture to catch up")
        _wait_caught_up(config, writer, thread)
        stop.set()
        thread.join(30)
    if errors:
        raise errors[0]
    console.print(f"workload wrote {workload.changes:,} changes in {workload.transactions:,} "
                  "transactions; capture drained them and stopped (SIGTERM does the same)")


def _wait_caught_up(config: Config, writer: LocalChangeLog, thread: threading.Thread) -> None:
    from cdc.position import parse_lsn

    source = config.sources[0]
    with psycopg.connect(source.dsn.reveal(), autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    target = parse_lsn(row[0]) if row else 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and thread.is_alive():
        if int(writer.source_offsets().get(source.name, {}).get("lsn", 0)) >= target:
            return
        time.sleep(0.1)


def _summary(config: Config, dsn: str, workload: ShopWorkload, console: Console) -> None:
    from cdc.logview import fold_latest

    console.rule("what the log holds")
    table = Table()
    for column in ("topic", "records", "snapshot (r)", "creates", "updates", "deletes",
                   "tombstones", "live keys", "rows in table", "equal"):
        table.add_column(column, justify="left" if column == "topic" else "right")
    all_equal = True
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in ("customers", "orders"):
            topic = f"shop.public.{name}"
            counts, latest = fold_latest(config.log_path, topic)
            rows = {str(r[0]): r[1] for r in conn.execute(
                f"SELECT id, to_jsonb(t) FROM {name} t").fetchall()}
            equal = set(latest) == {f'{{"id":{k}}}' for k in rows} and all(
                _same(latest[f'{{"id":{k}}}'], row) for k, row in rows.items())
            all_equal &= equal
            table.add_row(topic, f"{counts['records']:,}", f"{counts['r']:,}",
                          f"{counts['c']:,}", f"{counts['u']:,}", f"{counts['d']:,}",
                          f"{counts['tombstones']:,}", f"{len(latest):,}", f"{len(rows):,}",
                          "[green]yes[/]" if equal else "[red]NO[/]")
    console.print(table)
    if workload.error is not None:
        console.print(f"[yellow]workload error:[/] {workload.error}")
    if not all_equal:
        raise CdcError("the log does not match the tables", "this is a bug: please report it")
    console.print("[green]the log, folded per key, equals both tables[/]. Try: "
                  f"cdc log dump --config {config.base_dir / 'cdc.yaml'} | head", highlight=False)


def _same(logged: dict[str, Any], row: dict[str, Any]) -> bool:
    """Compare a logged row with the table's JSON row on the columns both describe simply."""
    for column in ("name", "email", "status"):
        if column in row and logged.get(column) != row[column]:
            return False
    return not ("amount" in row and logged.get("amount") != f"{row['amount']:.2f}")
