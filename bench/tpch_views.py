"""Benchmark: the 22 TPC-H queries as views, each round of changes kept by the view engine,
against the same SQL recomputed whole by DuckDB over the same state (the engine's own
recomputation: a lower bound for any engine that recomputes, Spark included). One run; the JSON
of the results is the last line.

``.venv/bin/python bench/tpch_views.py [--scale 0.1] [--rounds 3] [--orders 100]
[--updates 300] [--queries q01,q02,...]``

TPC-H's data at ``--scale`` (``tpchgen-cli``, the spec's types as ``tests/test_tpch_views.py``
declares them, ``CHAR(n)`` values blank-padded as PostgreSQL's log carries them) is loaded into
each view's state by one batch; then ``--rounds`` rounds, each RF1 (``--orders`` new orders
with 1-7 lineitems), RF2 (``--orders`` orders deleted with their lineitems) and ``--updates``
updates of the columns the queries filter and sum on (about 1,000 changes a round by default),
applied with :meth:`views.state.ViewState.apply`. Per query: its plan's mode, the median
round's seconds, DuckDB's rows scanned (its profiler) and the keys recomputed (of them revisited
because a scalar subquery's value moved), the recomputation's seconds, and whether the view's
rows equal the recomputation after the last round, and its state file's size (against one
copy of every table: what a state shared by the views would hold). No servers, no Spark: the
engine's own cost (``bench/tpch.py``, issue 45's point 3, adds capture, a Delta follower, Spark
and PostgreSQL).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402

from cdc.events import TableId  # noqa: E402
from tests.test_tpch_views import QUERIES, TABLES  # noqa: E402
from views.definition import Described, analyze  # noqa: E402
from views.state import BaseChange, ViewState  # noqa: E402

SCHEMA = "public"
#: the spec's types as the log describes them: (logical kind, the state's type)
KINDS = {"INTEGER": ("int32", "INTEGER"), "DECIMAL(15,2)": ("decimal", "DECIMAL(15,2)"),
         "DATE": ("date", "DATE")}


def _described(kind: str) -> Described:
    if kind in KINDS:
        return Described(kind=KINDS[kind][0], state_type=KINDS[kind][1])
    padded = int(kind[5:-1]) if kind.startswith("CHAR(") else None
    return Described(padded=padded, kind="string", state_type="VARCHAR")


CATALOG = {TableId(SCHEMA, name): {column: _described(kind) for column, kind in columns}
           for name, (columns, _key) in TABLES.items()}


def _value(text: str, kind: str) -> Any:
    if kind == "INTEGER":
        return int(text)
    if kind.startswith("CHAR("):
        return text.ljust(int(kind[5:-1]))
    return text  # decimals and dates: their JSON form is their text


class Data:
    """The tables' live rows (per table: key text -> row) and a clock of positions."""

    def __init__(self, directory: Path) -> None:
        self.rows: dict[str, dict[str, dict[str, Any]]] = {}
        for name, (columns, _key) in TABLES.items():
            table: dict[str, dict[str, Any]] = {}
            for line in (directory / f"{name}.tbl").read_text().splitlines():
                texts = line.split("|")
                row = {column: _value(text, kind)
                       for (column, kind), text in zip(columns, texts, strict=False)}
                table[self.key(name, row)] = row
            self.rows[name] = table
        self.position = 1

    @staticmethod
    def key(table: str, row: dict[str, Any]) -> str:
        return json.dumps({column: row[column] for column in TABLES[table][1]},
                          separators=(",", ":"))

    def change(self, table: str, key: str, row: dict[str, Any] | None) -> BaseChange:
        self.position += 1
        if row is None:
            self.rows[table].pop(key, None)
        else:
            self.rows[table][key] = row
        return BaseChange(TableId(SCHEMA, table), key, self.position.to_bytes(8, "big"), row)

    def load(self) -> list[BaseChange]:
        return [BaseChange(TableId(SCHEMA, table), key, self.position.to_bytes(8, "big"), row)
                for table, rows in self.rows.items() for key, row in rows.items()]


def _round(data: Data, rng: random.Random, orders: int, updates: int) -> list[BaseChange]:
    """RF1, RF2 and updates, each key's newest change once (a batch as the apply gives it)."""
    changes: dict[tuple[str, str], BaseChange] = {}

    def put(table: str, key: str, row: dict[str, Any] | None) -> None:
        changes[(table, key)] = data.change(table, key, row)

    lineitems = data.rows["lineitem"]
    order_keys = [row["o_orderkey"] for row in data.rows["orders"].values()]
    next_order = max(order_keys) + 1
    parts, suppliers = len(data.rows["part"]), len(data.rows["supplier"])
    customers = len(data.rows["customer"])
    for _ in range(orders):  # RF1
        ordered = date(1992, 1, 1) + timedelta(days=rng.randrange(2405))
        order = {"o_orderkey": next_order, "o_custkey": rng.randint(1, customers),
                 "o_orderstatus": "O", "o_totalprice": f"{rng.uniform(1000, 400000):.2f}",
                 "o_orderdate": str(ordered), "o_orderpriority": "3-MEDIUM".ljust(15),
                 "o_clerk": "Clerk#000000001", "o_shippriority": 0, "o_comment": "new"}
        put("orders", data.key("orders", order), order)
        for number in range(1, rng.randint(1, 7) + 1):
            shipped = ordered + timedelta(days=rng.randint(1, 121))
            line = {"l_orderkey": next_order, "l_partkey": rng.randint(1, parts),
                    "l_suppkey": rng.randint(1, suppliers), "l_linenumber": number,
                    "l_quantity": f"{rng.randint(1, 50)}.00",
                    "l_extendedprice": f"{rng.uniform(900, 100000):.2f}",
                    "l_discount": f"{rng.randint(0, 10) / 100:.2f}",
                    "l_tax": f"{rng.randint(0, 8) / 100:.2f}", "l_returnflag": "N",
                    "l_linestatus": "O", "l_shipdate": str(shipped),
                    "l_commitdate": str(ordered + timedelta(days=rng.randint(30, 90))),
                    "l_receiptdate": str(shipped + timedelta(days=rng.randint(1, 30))),
                    "l_shipinstruct": "NONE".ljust(25), "l_shipmode": "MAIL".ljust(10),
                    "l_comment": "new line"}
            put("lineitem", data.key("lineitem", line), line)
        next_order += rng.randint(1, 8)
    by_order: dict[int, list[str]] = {}
    for key, row in lineitems.items():
        by_order.setdefault(row["l_orderkey"], []).append(key)
    for order_key in rng.sample(order_keys, orders):  # RF2
        for key in by_order.pop(order_key, []):
            put("lineitem", key, None)
        put("orders", json.dumps({"o_orderkey": order_key}, separators=(",", ":")), None)
    keys = list(lineitems)
    for _ in range(updates):
        key = rng.choice(keys)
        if key not in lineitems:
            continue
        row = dict(lineitems[key])
        if rng.random() < 0.5:
            row["l_discount"] = f"{rng.randint(0, 10) / 100:.2f}"
        else:
            row["l_quantity"] = f"{rng.randint(1, 50)}.00"
        put("lineitem", key, row)
    return list(changes.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--orders", type=int, default=100)
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--queries", default=",".join(name for name, *_ in QUERIES))
    args = parser.parse_args()
    console = Console(stderr=True)
    wanted = args.queries.split(",")
    results: dict[str, Any] = {"scale": args.scale, "rounds": args.rounds, "queries": {}}
    with tempfile.TemporaryDirectory() as folder:
        tool = Path(sys.executable).parent / "tpchgen-cli"
        subprocess.run([str(tool), "tbl", "--scale-factor", str(args.scale), "--output-dir",
                        folder, "--quiet"], check=True)
        data = Data(Path(folder))
        load = data.load()
        rng = random.Random(45)
        rounds = [_round(data, rng, args.orders, args.updates) for _ in range(args.rounds)]
        results["load_changes"] = len(load)
        results["round_changes"] = [len(batch) for batch in rounds]
        captured = [TableId(SCHEMA, name) for name in TABLES]
        with Progress(console=console) as progress:
            task = progress.add_task("queries", total=len(wanted))
            for name, sql, key, _limited in QUERIES:
                if name not in wanted:
                    continue
                progress.update(task, description=f"{name}: load and {args.rounds} rounds")
                plan = analyze(name, sql, key, "postgres", captured, lambda: CATALOG)
                state = ViewState(Path(folder) / f"{name}.duckdb", plan,
                                  lambda table: [(c, CATALOG[table][c].state_type)
                                                 for c, _k in TABLES[table.table][0]])
                results["queries"][name] = _measure(state, load, rounds)
                state.close()
                results["queries"][name]["state_mb"] = _megabytes(state.path)
                progress.advance(task)
            progress.update(task, description="one copy of every table")
            results["shared_copy_mb"] = _shared_copy(Path(folder), load, captured)
    _report(console, results)
    print(json.dumps(results))


def _megabytes(path: Path) -> float:
    return round(path.stat().st_size / 1e6, 1)


def _shared_copy(folder: Path, load: list[BaseChange], captured: list[TableId]) -> float:
    """The size of one copy of every table (the state of a view that reads them all, loaded
    by the same batch): what a state shared by every view would hold."""
    sql = " UNION ALL ".join(f"SELECT '{name}' AS t, count(*) AS n FROM {name}"
                             for name in TABLES)
    plan = analyze("all_tables", sql, ["t"], "postgres", captured, lambda: CATALOG)
    state = ViewState(folder / "all_tables.duckdb", plan,
                      lambda table: [(c, CATALOG[table][c].state_type)
                                     for c, _k in TABLES[table.table][0]])
    state.apply(load)
    state.close()
    return _megabytes(state.path)


def _measure(state: ViewState, load: list[BaseChange], rounds: list[list[BaseChange]]
             ) -> dict[str, Any]:
    started = time.perf_counter()
    state.apply(load)
    state.drained()
    loaded = time.perf_counter() - started
    seconds, scanned, affected, revisited = [], [], [], []
    phases: dict[str, list[float]] = {}
    for batch in rounds:
        started = time.perf_counter()
        result = state.apply(batch)
        state.drained()
        seconds.append(time.perf_counter() - started)
        scanned.append(result.scanned)
        affected.append(result.affected)
        revisited.append(result.revisited)
        for phase, spent in result.phases.items():
            phases.setdefault(phase, []).append(spent)
    started = time.perf_counter()
    recomputed = state.recompute()
    recompute = time.perf_counter() - started
    round_s = statistics.median(seconds)
    return {"mode": state.plan.mode, "load_s": round(loaded, 2), "round_s": round(round_s, 4),
            "recompute_s": round(recompute, 4), "speedup": round(recompute / round_s, 1),
            "scanned": int(statistics.median(scanned)), "affected": sum(affected),
            "revisited": sum(revisited), "equal": state.rows() == recomputed,
            "phases_s": {phase: round(statistics.median(spent), 4)
                         for phase, spent in phases.items()}}


def _report(console: Console, results: dict[str, Any]) -> None:
    table = Table(title=f"TPC-H at scale {results['scale']}: a round of "
                        f"{statistics.median(results['round_changes']):,.0f} changes")
    for column in ("query", "mode", "round s", "recompute s", "speedup", "rows scanned",
                   "keys (revisited)", "equal"):
        table.add_column(column, justify="left" if column in ("query", "mode") else "right")
    for name, one in results["queries"].items():
        table.add_row(name, one["mode"], f"{one['round_s']:.3f}", f"{one['recompute_s']:.3f}",
                      f"{one['speedup']}x", f"{one['scanned']:,}",
                      f"{one['affected']} ({one['revisited']})", str(one["equal"]))
    console.print(table)
    private = sum(one["state_mb"] for one in results["queries"].values())
    results["private_states_mb"] = round(private, 1)
    console.print(f"state files: {private:,.1f} MB for the {len(results['queries'])} views, "
                  f"one copy of every table {results['shared_copy_mb']:,.1f} MB "
                  f"({private / max(results['shared_copy_mb'], 0.1):.1f}x)")
    speedups = [one["speedup"] for one in results["queries"].values()]
    if speedups:
        results["median_speedup"] = round(statistics.median(speedups), 1)
        console.print(f"median speedup over DuckDB's recomputation: "
                      f"{results['median_speedup']}x (slowest: {min(speedups)}x)")


if __name__ == "__main__":
    main()
