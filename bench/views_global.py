"""Benchmark: an aggregate without GROUP BY (TPC-H Q6's shape) kept by the view engine as
running totals, per round of changes, against the same SQL planned without them (recomputed
whole: what the engine did before) and against DuckDB running the query once over the table (the
physical limit of a recomputation). One run; the JSON of the results is the last line.

``.venv/bin/python bench/views_global.py [--shape q6|q14] [--rows N] [--changes C]
[--rounds R]``

The table ``public.lineitem`` (id, quantity int, price numeric(15,2), discount numeric(15,2),
shipped date, partkey) holds ``--rows`` rows (``--shape q14``: and ``public.part``, rows / 10
parts, a fifth of them PROMO, joined as TPC-H Q14 joins them), loaded into each view's state
by one batch; then
``--rounds`` rounds of ``--changes`` changes each (70 % updates of random rows, 15 % inserts,
15 % deletes), each applied with :meth:`views.state.ViewState.apply`. Per plan: the median
round's seconds and DuckDB's rows scanned (its profiler), and every round's view row compared
with the other plan's. No servers, no Spark: the engine's own cost.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
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
from rich.table import Table  # noqa: E402

from cdc.events import TableId  # noqa: E402
from views import definition  # noqa: E402
from views.state import BaseChange, ViewState  # noqa: E402

TABLE = TableId("public", "lineitem")
PART = TableId("public", "part")
COLUMNS = {TABLE: [("id", "BIGINT"), ("quantity", "INTEGER"), ("price", "DECIMAL(15,2)"),
                   ("discount", "DECIMAL(15,2)"), ("shipped", "DATE"), ("partkey", "BIGINT")],
           PART: [("id", "BIGINT"), ("type", "VARCHAR")]}
SQL = {"q6": ("SELECT 1 AS one, sum(l.price * l.discount) AS revenue, count(*) AS n "
              "FROM lineitem l WHERE l.shipped >= DATE '1994-01-01' "
              "AND l.shipped < DATE '1995-01-01' AND l.discount BETWEEN 0.05 AND 0.07 "
              "AND l.quantity < 24"),
       "q14": ("SELECT 1 AS one, 100.00 * sum(CASE WHEN p.type LIKE 'PROMO%' THEN l.price * "
               "(1 - l.discount) ELSE 0 END) / sum(l.price * (1 - l.discount)) AS promo "
               "FROM lineitem l, part p WHERE l.partkey = p.id "
               "AND l.shipped >= DATE '1995-09-01' AND l.shipped < DATE '1995-10-01'")}


def _row(rng: random.Random, key: int, parts: int) -> dict[str, Any]:
    return {"id": key, "quantity": rng.randint(1, 50),
            "price": f"{rng.randint(100, 10_000_000) / 100:.2f}",
            "discount": f"{rng.randint(0, 10) / 100:.2f}",
            "shipped": str(date(1992, 1, 1) + timedelta(days=rng.randint(0, 2500))),
            "partkey": rng.randint(1, parts)}


def _change(key: int, position: int, row: dict[str, Any] | None,
            table: TableId = TABLE) -> BaseChange:
    return BaseChange(table, json.dumps({"id": key}, separators=(",", ":")),
                      position.to_bytes(8, "big"), row)


def _plan(sql: str, split: bool) -> definition.ViewPlan:
    tables = [TABLE, PART]
    if split:
        return definition.analyze("v", sql, ["one"], "postgres", tables)
    kept = definition._split_global_aggregate
    definition._split_global_aggregate = lambda *_args: None  # type: ignore
    try:
        return definition.analyze("v", sql, ["one"], "postgres", tables)
    finally:
        definition._split_global_aggregate = kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SQL), default="q6")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--changes", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    console = Console(stderr=True)
    rng = random.Random(6)
    parts = max(1, args.rows // 10)
    live = {key: _row(rng, key, parts) for key in range(1, args.rows + 1)}
    position = 1
    load = [_change(key, position, row) for key, row in live.items()]
    if args.shape == "q14":
        load += [_change(key, position, {"id": key, "type": "PROMO BRUSHED" if key % 5 == 0
                                         else "STANDARD PLATED"}, PART)
                 for key in range(1, parts + 1)]
    rounds: list[list[BaseChange]] = []
    next_key = args.rows + 1
    for _ in range(args.rounds):
        batch: dict[int, BaseChange] = {}
        while len(batch) < args.changes:
            position += 1
            pick = rng.random()
            if pick < 0.15:
                key, row = next_key, _row(rng, next_key, parts)
                next_key += 1
            else:
                key = rng.choice(list(live)) if len(batch) % 50 == 0 else rng.randint(
                    1, next_key - 1)
                if key not in live or key in batch:
                    continue
                row = None if pick < 0.30 else _row(rng, key, parts)
            if row is None:
                live.pop(key, None)
            else:
                live[key] = row
            batch[key] = _change(key, position, row)
        rounds.append(list(batch.values()))
    results: dict[str, Any] = {"shape": args.shape, "rows": args.rows,
                               "changes": args.changes, "rounds": args.rounds}
    views: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, split in (("running totals", True), ("recomputed", False)):
            plan = _plan(SQL[args.shape], split)
            state = ViewState(Path(folder) / f"{name}.duckdb", plan, lambda t: COLUMNS[t])
            started = time.perf_counter()
            state.apply(load)
            state.drained()
            loaded = time.perf_counter() - started
            seconds, scanned, rows = [], [], []
            with console.status(f"{name}: {args.rounds} rounds of {args.changes:,} changes"):
                for batch in rounds:
                    started = time.perf_counter()
                    result = state.apply(batch)
                    seconds.append(time.perf_counter() - started)
                    scanned.append(result.scanned)
                    state.drained()
                    rows.append(next(iter(state.rows().values())))
            results[name] = {"mode": plan.mode, "load_s": round(loaded, 2),
                             "round_s_median": round(statistics.median(seconds), 4),
                             "scanned_median": int(statistics.median(scanned))}
            views[name] = rows
            if name == "recomputed":
                started = time.perf_counter()
                for _ in range(3):
                    state.db.execute(plan.full_sql).fetchall()
                results["duckdb_query_s"] = round((time.perf_counter() - started) / 3, 4)
            state.close()
    results["equal"] = views["running totals"] == views["recomputed"]
    results["speedup"] = round(results["recomputed"]["round_s_median"]
                               / results["running totals"]["round_s_median"], 1)
    table = Table(title=f"{args.shape}'s shape over {args.rows:,} rows, rounds of "
                        f"{args.changes:,} changes")
    for column in ("plan", "mode", "round s (median)", "rows scanned (median)"):
        table.add_column(column, justify="right" if "s" in column[-3:] else "left")
    for name in ("running totals", "recomputed"):
        one = results[name]
        table.add_row(name, one["mode"], f"{one['round_s_median']:.4f}",
                      f"{one['scanned_median']:,}")
    table.add_row("DuckDB runs the query once", "", f"{results['duckdb_query_s']:.4f}", "")
    console.print(table)
    console.print(f"speedup {results['speedup']}x; the view's rows equal after every round: "
                  f"{results['equal']}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
