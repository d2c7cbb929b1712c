"""Views (``views/``): the SQL classified, the incremental engine equal to recomputation under
random batches, and end to end — PostgreSQL captured under a load with updates, deletes, key
changes and a TRUNCATE, ``cdc apply --view`` SIGKILLed mid-run and restarted, then
``cdc verify --view`` exits 0 for each view in each follower, and 1 naming the key after a
hand-made divergence."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import views.state
from cdc.events import TableId
from cdc.logical import blank_padded_length
from tests.faults import fault_env
from views.definition import Described, ViewDefinitionError, analyze, approximate_columns
from views.state import BaseChange, ViewError, ViewState

ORDERS, CUSTOMERS = TableId("public", "orders"), TableId("public", "customers")
CAPTURED = [ORDERS, CUSTOMERS]
COLUMNS = {ORDERS: [("id", "BIGINT"), ("customer_id", "BIGINT"), ("amount", "DECIMAL(12,2)"),
                    ("sku", "VARCHAR")],
           CUSTOMERS: [("id", "BIGINT"), ("name", "VARCHAR"), ("region", "VARCHAR")]}

#: the issue's join + aggregate view
REVENUE = ("SELECT c.id AS customer_id, c.name, count(*) AS orders, sum(o.amount) AS revenue "
           "FROM public.orders o JOIN public.customers c ON o.customer_id = c.id "
           "GROUP BY c.id, c.name")
#: MIN/MAX/COUNT(DISTINCT), whose old values cannot be derived from a delta
EXTREMES = ("SELECT o.customer_id, min(o.amount) AS lo, max(o.amount) AS hi, "
            "count(DISTINCT o.sku) AS skus, avg(o.amount) AS mean FROM orders o "
            "GROUP BY o.customer_id")
VIEWS: dict[str, tuple[str, list[str]]] = {
    "revenue": (REVENUE, ["customer_id"]),
    "extremes": (EXTREMES, ["customer_id"]),
    # a LEFT JOIN keyed by the preserved side, with a filter
    "lines": ("SELECT o.id, o.amount, c.name, c.region FROM orders o LEFT JOIN customers c "
              "ON c.id = o.customer_id WHERE o.amount > 10", ["id"]),
    # a LEFT JOIN whose group key comes from the null-supplying side: a match appearing must
    # retract the order from the 'none' group (the null-extension lineage)
    "by_region": ("SELECT coalesce(c.region, 'none') AS region, count(*) AS n, "
                  "sum(o.amount) AS total FROM orders o LEFT JOIN customers c "
                  "ON c.id = o.customer_id GROUP BY coalesce(c.region, 'none')", ["region"]),
    # groups that vanish (HAVING) and come back
    "busy": ("SELECT c.region, count(o.id) AS n FROM customers c LEFT JOIN orders o "
             "ON o.customer_id = c.id WHERE c.region IS NOT NULL GROUP BY c.region "
             "HAVING count(o.id) > 2", ["region"]),
    # a self-join through another table
    "pairs": ("SELECT a.id, b.id AS other FROM orders a JOIN customers c ON c.id = a.customer_id "
              "JOIN orders b ON b.customer_id = c.id AND b.sku = a.sku "
              "WHERE a.id < b.id", ["id", "other"]),
    # SELECT DISTINCT (maintained as a GROUP BY of its columns)
    "distinct_skus": ("SELECT DISTINCT o.sku FROM orders o WHERE o.sku IS NOT NULL", ["sku"]),
    # FULL JOIN: both sides null-extended, each retracted by a match appearing
    "full": ("SELECT coalesce(o.id, 0) AS oid, coalesce(c.id, 0) AS cid, o.amount, c.region "
             "FROM orders o FULL JOIN customers c ON c.id = o.customer_id", ["oid", "cid"]),
    # RIGHT JOIN, grouped by the preserved side
    "right": ("SELECT c.id AS cid, count(o.id) AS n, max(o.sku) AS top FROM orders o "
              "RIGHT JOIN customers c ON c.id = o.customer_id GROUP BY c.id", ["cid"]),
    # UNION ALL of two tables' rows
    "both": ("SELECT o.id AS id, 'order' AS kind, o.amount FROM orders o WHERE o.amount > 20 "
             "UNION ALL SELECT c.id, 'customer', NULL FROM customers c "
             "WHERE c.region IS NOT NULL", ["id", "kind"]),
    # window functions over one PARTITION BY (only the touched partitions recomputed)
    "running": ("SELECT o.id, o.customer_id, sum(o.amount) OVER (PARTITION BY o.customer_id "
                "ORDER BY o.id) AS run, rank() OVER (PARTITION BY o.customer_id ORDER BY "
                "o.amount DESC, o.id) AS r FROM orders o", ["id"]),
    # a window partitioned by a joined table's column (NULL is a partition too)
    "regional": ("SELECT o.id, c.region, count(*) OVER (PARTITION BY c.region) AS n "
                 "FROM orders o JOIN customers c ON c.id = o.customer_id", ["id"]),
    # a WITH and a subquery in FROM, merged into the query (the filter into the LEFT JOIN's ON)
    "derived": ("WITH big AS (SELECT o.id, o.customer_id, o.amount FROM orders o "
                "WHERE o.amount > 10) SELECT c.name, count(*) AS n, sum(big.amount) AS s "
                "FROM big JOIN customers c ON c.id = big.customer_id GROUP BY c.name", ["name"]),
    "north": ("SELECT o.id, x.name FROM orders o LEFT JOIN (SELECT c.id, c.name FROM "
              "customers c WHERE c.region = 'n') x ON x.id = o.customer_id", ["id"]),
    # aggregating subqueries in FROM, kept as tables of the state: grouped again above, a
    # table read inside and outside the subquery, and on a LEFT JOIN's null side
    "regions": ("SELECT coalesce(c.region, 'none') AS region, count(*) AS n, sum(t.total) AS s, "
                "max(t.total) AS best FROM customers c JOIN (SELECT o.customer_id, "
                "sum(o.amount) AS total FROM orders o GROUP BY o.customer_id) t "
                "ON t.customer_id = c.id GROUP BY coalesce(c.region, 'none')", ["region"]),
    "above_mean": ("SELECT o.id, o.amount, m.total, m.n FROM orders o JOIN (SELECT "
                   "p.customer_id, sum(p.amount) AS total, count(*) AS n FROM orders p "
                   "GROUP BY p.customer_id) m ON m.customer_id = o.customer_id "
                   "WHERE o.amount * m.n > m.total", ["id"]),
    "counted": ("SELECT c.id AS cid, coalesce(t.n, 0) AS n FROM customers c LEFT JOIN "
                "(SELECT o.customer_id, count(*) AS n FROM orders o WHERE o.sku <> 'a' "
                "GROUP BY o.customer_id) t ON t.customer_id = c.id", ["cid"]),
    # column lists naming a subquery's and a WITH's columns (TPC-H Q13 and Q15 write them)
    "named": ("WITH spend (cid, total) AS (SELECT o.customer_id, sum(o.amount) FROM orders o "
              "GROUP BY o.customer_id) SELECT per.n, count(*) AS customers, sum(s.total) AS "
              "spent FROM (SELECT c.id, count(o.id) FROM customers c LEFT JOIN orders o "
              "ON o.customer_id = c.id GROUP BY c.id) AS per (cid, n) LEFT JOIN spend s "
              "ON s.cid = per.cid GROUP BY per.n", ["n"]),
    # columns named without their table, resolved through the catalog (the tables' columns)
    "unqualified": ("SELECT name, count(sku) AS n, sum(amount) AS total FROM customers c "
                    "LEFT JOIN orders o ON c.id = customer_id GROUP BY name", ["name"]),
    # aggregates without GROUP BY, kept as partial sums per key-hash bucket: over a join, with
    # an AVG (its SUM and COUNT) and a quotient of sums; and a HAVING that empties the view
    "totals": ("SELECT 1 AS one, sum(o.amount) AS total, count(*) AS n, count(c.region) AS "
               "regions, avg(o.amount) AS mean, sum(o.amount) / count(*) AS per FROM orders o "
               "JOIN customers c ON c.id = o.customer_id WHERE o.sku <> 'e'", ["one"]),
    "if_many": ("SELECT 'all' AS k, count(*) AS n, sum(o.amount) AS total FROM orders o "
                "WHERE o.amount > 30 HAVING count(*) > 3", ["k"]),
    # subqueries in WHERE joined as aggregating subqueries: EXISTS, IN, and a correlated
    # scalar subquery (no group: a NULL comparison, the row dropped as the leader drops it)
    "buyers": ("SELECT c.id, c.name FROM customers c WHERE c.region IS NOT NULL AND EXISTS "
               "(SELECT * FROM orders o WHERE o.customer_id = c.id AND o.amount > 20)", ["id"]),
    "northern": ("SELECT o.id, o.amount FROM orders o WHERE o.customer_id IN (SELECT c.id "
                 "FROM customers c WHERE c.region = 'n')", ["id"]),
    "above_own_mean": ("SELECT o.id, o.amount FROM orders o WHERE o.amount > (SELECT "
                       "avg(p.amount) * 1.1 FROM orders p WHERE p.customer_id = o.customer_id "
                       "AND p.sku <> 'a')", ["id"]),
    # ORDER BY ... LIMIT: the first rows kept with a buffer past them (ties by the key), one
    # grouped, one past an OFFSET ordering NULLs first
    "top_spenders": ("SELECT o.customer_id, sum(o.amount) AS total, count(*) AS n FROM orders o "
                     "GROUP BY o.customer_id ORDER BY total DESC, n LIMIT 3", ["customer_id"]),
    "page": ("SELECT o.id, o.amount, c.region FROM orders o LEFT JOIN customers c "
             "ON c.id = o.customer_id ORDER BY c.region DESC, o.amount LIMIT 4 OFFSET 2", ["id"]),
    # NOT EXISTS as a LEFT JOIN keeping the unmatched rows; [NOT] EXISTS correlated by one <>
    # too (TPC-H Q21: another order of the customer's, none of another sku)
    "idle": ("SELECT c.id, c.name FROM customers c WHERE NOT EXISTS (SELECT * FROM orders o "
             "WHERE o.customer_id = c.id AND o.amount > 10)", ["id"]),
    "mixed": ("SELECT o.id, o.sku FROM orders o WHERE EXISTS (SELECT * FROM orders p WHERE "
              "p.customer_id = o.customer_id AND p.sku <> o.sku) AND NOT EXISTS (SELECT * FROM "
              "orders q WHERE q.customer_id = o.customer_id AND q.sku <> o.sku AND "
              "q.amount > 40)", ["id"]),
    # NOT IN with its NULL rule: a NULL region of bob's empties it, no bob at all keeps all
    "unlike_bob": ("SELECT c.id, c.region FROM customers c WHERE c.region NOT IN (SELECT "
                   "b.region FROM customers b WHERE b.name = 'bob')", ["id"]),
    # scalar subqueries over a whole table: in the WHERE (TPC-H Q22, inside a subquery in
    # FROM with a NOT EXISTS), and in a HAVING (Q11: the groups kept, compared in a WHERE)
    "above_mean_all": ("SELECT d.sku, count(*) AS n FROM (SELECT o.id, o.sku FROM orders o "
                       "WHERE o.amount > (SELECT avg(p.amount) FROM orders p WHERE p.sku <> "
                       "'a') AND NOT EXISTS (SELECT * FROM customers c WHERE c.id = "
                       "o.customer_id AND c.region = 'n')) d GROUP BY d.sku", ["sku"]),
    "heavy": ("SELECT o.customer_id, sum(o.amount) AS total FROM orders o GROUP BY "
              "o.customer_id HAVING sum(o.amount) > (SELECT sum(p.amount) * 0.1 FROM orders p) "
              "AND count(*) > 1", ["customer_id"]),
    # subqueries within subqueries, each kept as a table of the state: a scalar max over an
    # aggregating subquery (TPC-H Q15), an IN holding an IN and a correlated scalar (Q20)
    "best_customers": ("SELECT t.customer_id, t.total FROM (SELECT o.customer_id, "
                       "sum(o.amount) AS total FROM orders o GROUP BY o.customer_id) t WHERE "
                       "t.total = (SELECT max(u.total) FROM (SELECT p.customer_id, sum(p.amount) "
                       "AS total FROM orders p GROUP BY p.customer_id) u)", ["customer_id"]),
    "stocked": ("SELECT c.id, c.name FROM customers c WHERE c.id IN (SELECT o.customer_id FROM "
                "orders o WHERE o.sku IN (SELECT p.sku FROM orders p WHERE p.amount > 40) AND "
                "o.amount > (SELECT 0.5 * avg(q.amount) FROM orders q WHERE q.sku = o.sku))",
                ["id"]),
    # running totals over a join to a grouped subquery (TPC-H Q17: below a fifth of the
    # part's mean): the old tuples summed in two halves, captured changes' and the subquery's
    "below_own_mean": ("SELECT 1 AS one, sum(o.amount) AS total, count(*) AS n FROM orders o, "
                       "customers c WHERE c.id = o.customer_id AND o.amount < (SELECT "
                       "avg(p.amount) FROM orders p WHERE p.customer_id = o.customer_id)",
                       ["one"]),
    # outside the incremental class: recomputed whole
    "ranked_all": ("SELECT o.id, row_number() OVER (ORDER BY o.amount, o.id) AS r "
                   "FROM orders o", ["id"]),
}

#: per construct of docs/views.md's coverage table, the view of VIEWS that exercises it (in
#: the random engine test above, and against the leader on the cluster:
#: tests/test_spark_cluster.py)
CONSTRUCTS = {
    "INNER JOIN, GROUP BY, COUNT, SUM": "revenue",
    "MIN, MAX, COUNT(DISTINCT), AVG": "extremes",
    "LEFT JOIN (grouped by its null side)": "by_region",
    "RIGHT JOIN": "right",
    "FULL JOIN": "full",
    "GROUP BY with HAVING": "busy",
    "SELECT DISTINCT": "distinct_skus",
    "UNION ALL": "both",
    "WITH, subquery in FROM": "derived",
    "subquery in FROM on a LEFT JOIN's null side": "north",
    "window functions (PARTITION BY)": "running",
    "subqueries in FROM that aggregate": "regions",
    "an aggregating subquery over a table the query also reads": "above_mean",
    "an aggregating subquery on a LEFT JOIN's null side": "counted",
    "a window partitioned by a joined column": "regional",
    "column lists: AS t (a, b), WITH t (a, b) AS": "named",
    "columns without their table (resolved through the catalog)": "unqualified",
}


def catalog() -> dict[TableId, dict[str, Described]]:
    """The captured tables' columns (what ``views.sink.view_plan`` reads from the log)."""
    return {table: {column: Described(state_type=kind) for column, kind in columns}
            for table, columns in COLUMNS.items()}


# ----------------------------------------------------------------------------- the SQL

def test_views_are_classified_with_the_reason() -> None:
    plans = {name: analyze(name, sql, key, "postgres", CAPTURED, catalog)
             for name, (sql, key) in VIEWS.items()}
    assert {name for name, plan in plans.items() if plan.mode == "incremental"} == \
        set(VIEWS) - {"ranked_all"}
    assert "without PARTITION BY" in plans["ranked_all"].reason
    assert plans["revenue"].tables == [ORDERS, CUSTOMERS]
    assert plans["pairs"].tables == [ORDERS, CUSTOMERS]
    for sql, reason in [
        ("SELECT o.id, row_number() OVER (ORDER BY o.id) AS r FROM orders o", "window"),
        ("SELECT o.id FROM orders o WHERE o.customer_id IN (SELECT id FROM customers)",
         "subquery"),
        ("SELECT o.id FROM orders o LIMIT 5", "LIMIT"),
        ("SELECT o.id, c.name FROM orders o JOIN customers c ON c.id = o.customer_id "
         "FULL JOIN orders b ON b.id = o.id", "after the first join"),
        ("SELECT o.id, c.name FROM orders o LEFT JOIN customers c ON c.id > o.customer_id",
         "no equality"),
        ("SELECT o.id FROM orders o INTERSECT SELECT c.id FROM customers c", "INTERSECT"),
        ("SELECT 1 AS id, count(DISTINCT o.sku) AS n FROM orders o", "without GROUP BY"),
        ("SELECT 1 AS id, max(o.amount) AS n FROM orders o", "without GROUP BY"),
        ("SELECT o.customer_id AS id, rank() OVER (PARTITION BY o.customer_id ORDER BY "
         "count(*)) AS r FROM orders o GROUP BY o.customer_id", "over GROUP BY"),
        ("SELECT d.id FROM (SELECT o.customer_id AS id, count(*) AS n FROM orders o "
         "GROUP BY o.customer_id ORDER BY n LIMIT 3) d", "limits"),
        ("SELECT d.n AS id FROM (SELECT count(*) AS n FROM orders o GROUP BY o.customer_id) d",
         "GROUP BY columns"),
    ]:
        plan = analyze("v", sql, ["id"], "postgres", CAPTURED)
        assert plan.mode == "recompute" and reason.lower() in plan.reason.lower(), \
            (sql, plan.reason)
    assert approximate_columns(analyze("e", EXTREMES, ["customer_id"], "postgres", CAPTURED),
                               {}) == ["mean"]


def test_unqualified_columns_get_the_plan_of_the_qualified_form() -> None:
    """TPC-H writes ``c_custkey = o_custkey``: resolved through the catalog, the LEFT JOIN is
    planned as if each column named its table; without the catalog it is not (and a name
    several tables have is left for the leader to refuse)."""
    sql, key = VIEWS["unqualified"]
    qualified = ("SELECT c.name, count(o.sku) AS n, sum(o.amount) AS total FROM customers c "
                 "LEFT JOIN orders o ON c.id = o.customer_id GROUP BY c.name")
    resolved = analyze("u", sql, key, "postgres", CAPTURED, catalog)
    assert resolved.mode == "incremental", resolved.reason
    assert resolved.full_sql == analyze("q", qualified, key, "postgres", CAPTURED).full_sql
    assert analyze("u", sql, key, "postgres", CAPTURED).full_sql != resolved.full_sql
    ambiguous = analyze("a", "SELECT id, count(*) AS n FROM customers c JOIN orders o "
                        "ON c.id = o.customer_id GROUP BY id", ["id"], "postgres", CAPTURED,
                        catalog)
    assert "GROUP BY id" in ambiguous.full_sql  # both tables have an id: left as written


@pytest.mark.parametrize(("sql", "key", "message"), [
    ("SELECT o.id FROM public.invoices o", ["id"], "does not capture"),
    ("SELECT o.id FROM orders o", ["nope"], "not output columns"),
    ("SELECT * FROM orders", ["id"], "SELECT *"),
    ("SELECT o.customer_id, count(*) AS n FROM orders o GROUP BY o.customer_id", ["n"],
     "aggregate"),
    ("SELECT o.customer_id, o.sku, count(*) AS n FROM orders o GROUP BY o.customer_id, o.sku",
     ["customer_id"], None),  # allowed: a key may be part of the grouping (checked when run)
    ("SELECT o.sku, count(*) AS n FROM orders o GROUP BY o.sku, o.customer_id", ["n"],
     "aggregate"),
    ("SELEC o.id FROM orders o", ["id"],
     "does not parse: unexpected '.' (line 1, column 8, near '.')"),
    ("SELECT o.id, count(*) AS n FROM orders o GROUP BY o.id HAVING", ["id"],
     "HAVING is incomplete (line 1, column 61, near 'HAVING')"),
    ("SELECT o.id FROM orders o WHERE o.id > extract(epoch from now())", ["id"],
     "changes without any change"),
    ("DELETE FROM orders", ["id"], "not a query"),
    ("SELECT t.a FROM (SELECT o.id, o.sku FROM orders o) AS t (a)", ["a"],
     "names 1 columns, its query gives 2"),
])
def test_bad_views_are_refused_with_the_fix(sql: str, key: list[str], message: str | None
                                             ) -> None:
    if message is None:
        analyze("v", sql, key, "postgres", CAPTURED)
        return
    with pytest.raises(ViewDefinitionError) as error:
        analyze("v", sql, key, "postgres", CAPTURED)
    assert message in str(error.value) and error.value.fix


def test_a_view_reading_a_masked_or_left_out_column_is_refused() -> None:
    from cdc.config import parse_config
    from views.sink import view_plan

    def config(rules: dict[str, Any]) -> Any:
        return parse_config({
            "sources": [{"name": "shop", "kind": "postgres", "dsn": "postgresql://u@h/d",
                         "tables": ["public.orders", "public.customers"], "columns": rules,
                         "hash_key_env": "K"}],
            "followers": {"r": {"kind": "sql", "url": "sqlite:///r.db"}},
            "views": {"v": {"source": "shop", "key": ["customer_id"],
                            "sql": "SELECT c.id AS customer_id, c.name, sum(o.amount) AS s "
                                   "FROM orders o JOIN customers c ON o.customer_id = c.id "
                                   "GROUP BY c.id, c.name", "followers": ["r"]}}}, Path("."))

    for rules, hidden in (({"public.customers": {"transforms": {"name": "hash"}}},
                           "public.customers.name"),
                          ({"public.orders": {"exclude": ["amount"]}}, "public.orders.amount"),
                          ({"public.orders": {"include": ["id", "sku"]}},
                           "public.orders.amount, public.orders.customer_id")):
        with pytest.raises(ViewDefinitionError) as error:
            view_plan(config(rules), "v")
        assert f"view v reads {hidden}, which the source's column rules" in str(error.value)
        assert error.value.fix and "columns:" in error.value.fix
    # rules on columns the view does not read leave it alone
    view_plan(config({"public.customers": {"transforms": {"region": "mask"}}}), "v")


def test_incremental_strict_refuses_a_recomputed_construct_naming_the_rewrite() -> None:
    """``incremental: strict`` refuses a view any of whose constructs would be recomputed
    whole, naming each such construct and its nearest incremental rewrite; an incremental view
    passes, and every plan lists its constructs (what ``check-config`` prints)."""
    from cdc.config import parse_config
    from views.sink import view_plan

    def plan(sql: str, key: list[str], strict: bool) -> Any:
        view: dict[str, Any] = {"source": "shop", "key": key, "sql": sql, "followers": ["r"]}
        if strict:
            view["incremental"] = "strict"
        return view_plan(parse_config({
            "sources": [{"name": "shop", "kind": "postgres", "dsn": "postgresql://u@h/d",
                         "tables": ["public.orders", "public.customers"]}],
            "followers": {"r": {"kind": "sql", "url": "sqlite:///r.db"}},
            "views": {"v": view}}, Path(".")), "v")

    ranked = "SELECT o.id, row_number() OVER (ORDER BY o.amount) AS r FROM orders o"
    assert plan(ranked, ["id"], strict=False).mode == "recompute"
    with pytest.raises(ViewDefinitionError) as error:
        plan(ranked, ["id"], strict=True)
    assert "strict" in str(error.value) and "window function without PARTITION BY" in \
        str(error.value)
    assert error.value.fix and "PARTITION BY" in error.value.fix
    with pytest.raises(ViewDefinitionError) as error:
        plan("SELECT o.id FROM orders o WHERE o.amount > 5 OR o.customer_id NOT IN (SELECT "
             "c.id FROM customers c)", ["id"], strict=True)
    assert "subquery in WHERE" in str(error.value) and "JOIN" in (error.value.fix or "")
    running = plan(VIEWS["running"][0], ["id"], strict=True)
    assert [op.construct for op in running.operators] == [
        "SELECT (filter, projection)", "window function (PARTITION BY o.customer_id)"]
    assert all(op.incremental for op in plan(REVENUE, ["customer_id"], True).operators)


# ------------------------------------------------------------------ the engine, randomly

def _state(directory: Path, name: str, sql: str, key: list[str]) -> ViewState:
    plan = analyze(name, sql, key, "postgres", CAPTURED, catalog)
    return ViewState(directory / f"{name}.duckdb", plan, lambda table: COLUMNS[table])


def _random_batch(rng: random.Random, position: int) -> tuple[list[BaseChange], int]:
    changes: dict[tuple[TableId, str], BaseChange] = {}
    for _ in range(rng.randint(1, 40)):
        position += 1
        table = rng.choice(CAPTURED)
        number = rng.randint(1, 30 if table == ORDERS else 8)
        key = json.dumps({"id": number}, separators=(",", ":"))
        row: dict[str, Any] | None
        if rng.random() < 0.25:
            row = None
        elif table == ORDERS:
            row = {"id": number, "customer_id": rng.randint(1, 10),
                   "amount": f"{rng.randint(0, 5000) / 100:.2f}", "sku": rng.choice("abcde")}
        else:
            row = {"id": number, "name": rng.choice(["ann", "bob"]),
                   "region": rng.choice(["n", "s", None])}
        changes[(table, key)] = BaseChange(table, key, position.to_bytes(8, "big"), row)
    return list(changes.values()), position


#: the views the second seed leaves out (issue 45's subqueries, running totals over them and
#: LIMIT: the costliest per batch here; the TPC-H test and the fuzzer hold them against the
#: leader); the second seed also plays fewer batches (the suite's time: issue 45)
FIRST_SEED_ONLY = frozenset({"top_spenders", "page", "idle", "mixed", "unlike_bob",
                             "above_mean_all", "heavy", "best_customers", "stocked",
                             "below_own_mean"})


@pytest.mark.parametrize("seed", range(2))
def test_incremental_views_equal_recomputation_after_every_batch(tmp_path: Path,
                                                                 seed: int) -> None:
    """After each random batch, each view's rows equal its SQL recomputed whole on the same
    state, the outbox holds exactly the changed rows, and a replayed batch changes nothing."""
    rng = random.Random(seed)
    views = {name: view for name, view in VIEWS.items()
             if seed == 0 or name not in FIRST_SEED_ONLY}
    states = {name: _state(tmp_path, name, sql, key) for name, (sql, key) in views.items()}
    compacted: dict[tuple[TableId, str], BaseChange] = {}  # the log after compaction
    held: dict[str, dict[str, Any]] = {name: {} for name in views}
    last = {name: b"" for name in views}
    emitted = dict.fromkeys(views, 0)
    position = 0
    for _ in range(25 if seed == 0 else 15):
        batch, position = _random_batch(rng, position)
        compacted.update({(change.table, change.key): change for change in batch})
        for name, state in states.items():
            result = state.apply(batch)
            assert state.rows() == state.recompute(), name
            assert result.scanned > 0 or not result.applied  # DuckDB's own scan count
            assert set(result.phases) == ({"gate", "lineage", "recompute", "diff", "record",
                                           "commit"} if result.applied else {"gate", "commit"})
            pending = state.pending()
            assert len({change.position for change in pending}) <= 1
            for change in pending:  # what the followers would receive (their gate: newer)
                assert change.position > last[name] and result.applied
                if change.row is None:
                    held[name].pop(change.key)
                else:
                    held[name][change.key] = change.row
            last[name] = pending[0].position if pending else last[name]
            emitted[name] += len(pending)
            state.drained()
            assert held[name] == state.rows(), name
            again = state.apply(batch)
            assert again.applied == 0 and not state.pending()
    assert all(emitted.values()), emitted  # every view had rows to maintain
    for name, (sql, key) in views.items():  # rebuilt from offset 0 of the compacted log
        rebuilt = _state(tmp_path / "rebuilt", name, sql, key)
        rebuilt.apply(list(compacted.values()))
        assert rebuilt.rows() == states[name].rows(), name
        rebuilt.close()
    for state in states.values():
        state.close()


def test_the_first_rows_of_a_limit_follow_every_batch_through_a_small_buffer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ORDER BY ... LIMIT with a buffer of one row past the LIMIT (``TOP_BUFFER``): rows leave
    the first places, enter them from below the buffer, change in place; after each batch the
    followers' rows equal the view recomputed whole, and both ways of finding the first rows
    again were taken (from the rows kept, and from the whole ranking when too few were)."""
    monkeypatch.setattr(views.state, "TOP_BUFFER", 1)
    taken: list[bool] = []
    first_again = ViewState._first_again

    def spied(self: ViewState, computed: str, ordered: str, cap: int) -> bool | None:
        found = first_again(self, computed, ordered, cap)
        taken.append(found is not None)
        return found

    monkeypatch.setattr(ViewState, "_first_again", spied)
    rng = random.Random(7)
    states = [_state(tmp_path, name, sql, ["id"]) for name, sql in (
        ("cheapest", "SELECT o.id, o.amount FROM orders o ORDER BY o.amount, o.sku DESC LIMIT 3"),
        ("second_page", "SELECT o.id, o.sku FROM orders o WHERE o.amount > 5 "
                        "ORDER BY o.sku DESC, o.amount LIMIT 2 OFFSET 2"))]
    held: list[dict[str, Any]] = [{}, {}]
    position = 0
    for _ in range(40):
        batch, position = _random_batch(rng, position)
        for state, followed in zip(states, held, strict=True):
            state.apply(batch)
            for change in state.pending():
                if change.row is None:
                    followed.pop(change.key)
                else:
                    followed[change.key] = change.row
            state.drained()
            assert followed == state.rows() == state.recompute(), state.plan.name
            assert len(followed) <= (3 if state is states[0] else 2)
    assert True in taken and False in taken, taken
    for state in states:
        state.close()


def test_a_state_kept_whole_before_running_totals_continues_with_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A view of aggregates without GROUP BY whose state was made when such views were
    recomputed whole: opened with the running totals' plan, its next batch rebuilds the totals
    and the view equals its SQL recomputed, batch after batch."""
    import views.definition as definition

    sql = ("SELECT 1 AS one, sum(o.amount) AS total, count(*) AS n, avg(o.amount) AS mean "
           "FROM orders o JOIN customers c ON c.id = o.customer_id WHERE c.region IS NOT NULL")
    with monkeypatch.context() as patched:
        patched.setattr(definition, "_split_global_aggregate", lambda *_args: None)
        old = analyze("t", sql, ["one"], "postgres", CAPTURED, catalog)
    new = analyze("t", sql, ["one"], "postgres", CAPTURED, catalog)
    assert (old.mode, new.mode) == ("recompute", "incremental")
    rng, position = random.Random(5), 0
    state = ViewState(tmp_path / "t.duckdb", old, lambda table: COLUMNS[table])
    for _ in range(5):
        batch, position = _random_batch(rng, position)
        state.apply(batch)
        state.drained()
    before = state.rows()
    state.close()
    state = ViewState(tmp_path / "t.duckdb", new, lambda table: COLUMNS[table])
    try:
        assert state.rows() == before
        for _ in range(10):
            batch, position = _random_batch(rng, position)
            state.apply(batch)
            state.drained()
            assert state.rows() == state.recompute()
    finally:
        state.close()


def test_a_match_appearing_retracts_the_null_extended_tuple(tmp_path: Path) -> None:
    """LEFT JOIN lineage, deterministically: a customer appearing moves its order out of the
    'none' group (the null-extension branch), a region change moves it between groups (the
    branch reading the changed customer's images), a delete moves it back."""
    sql, key = VIEWS["by_region"]
    state = _state(tmp_path, "by_region", sql, key)
    orders = [BaseChange(ORDERS, f'{{"id":{i}}}', bytes([i]),
                         {"id": i, "customer_id": 4 + i, "amount": "1.00", "sku": "a"})
              for i in (1, 2)]
    steps: list[tuple[list[BaseChange], dict[str, int]]] = [
        (orders, {"none": 2}),
        ([BaseChange(CUSTOMERS, '{"id":5}', b"\x03", {"id": 5, "name": "x", "region": "n"})],
         {"none": 1, "n": 1}),
        ([BaseChange(CUSTOMERS, '{"id":5}', b"\x04", {"id": 5, "name": "x", "region": "s"})],
         {"none": 1, "s": 1}),
        ([BaseChange(CUSTOMERS, '{"id":5}', b"\x05", None)], {"none": 2}),
    ]
    for batch, expected in steps:
        state.apply(batch)
        rows = state.rows()
        assert {json.loads(k)["region"]: row["n"] for k, row in rows.items()} == expected
        assert rows == state.recompute()
        state.drained()
    state.close()


def test_view_state_carries_its_format_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    import duckdb

    from views.state import FORMAT, ViewError

    sql = "SELECT o.id, o.amount FROM orders o"
    state = _state(tmp_path, "v", sql, ["id"])
    assert state.meta("format") == str(FORMAT)
    state.set_meta("format", str(FORMAT + 1))
    state.close()
    with pytest.raises(ViewError, match=f"has format {FORMAT + 1}, written by a newer cdc"
                       ) as refused:
        _state(tmp_path, "v", sql, ["id"])
    assert "delete the file to rebuild the view" in str(refused.value)
    with duckdb.connect(str(tmp_path / "v.duckdb")) as db:  # unmarked: format 1, then marked
        db.execute("DELETE FROM _cdc_meta WHERE name = 'format'")
    _state(tmp_path, "v", sql, ["id"]).close()
    with duckdb.connect(str(tmp_path / "v.duckdb")) as db:
        assert db.execute("SELECT value FROM _cdc_meta WHERE name = 'format'").fetchall() == [
            (str(FORMAT),)]


def test_a_format_1_state_is_upgraded_in_place_and_keeps_its_rows(tmp_path: Path) -> None:
    import duckdb

    rng = random.Random(7)
    state = _state(tmp_path, "revenue", REVENUE, ["customer_id"])
    position = 0
    for _ in range(6):
        batch, position = _random_batch(rng, position)
        state.apply(batch)
        state.drained()
    state.close()
    with duckdb.connect(str(tmp_path / "revenue.duckdb")) as db:  # format 1: no key hashes
        for table in CAPTURED:  # (nor the index on them)
            db.execute(f'DROP INDEX "{table.schema}"."{table.table}__cdc_h"')
            db.execute(f'ALTER TABLE "{table.schema}"."{table.table}" DROP COLUMN _cdc_h')
        db.execute("UPDATE _cdc_meta SET value = '1' WHERE name = 'format'")
    state = _state(tmp_path, "revenue", REVENUE, ["customer_id"])
    assert state.meta("format") == "2"
    for _ in range(6):  # the rows written before are found by their filled-in hashes
        batch, position = _random_batch(rng, position)
        state.apply(batch)
        state.drained()
        assert state.rows() == state.recompute()
    for table in CAPTURED:
        keys, distinct = state.db.execute(
            f'SELECT count(*), count(DISTINCT _cdc_key) FROM "{table.schema}"."{table.table}"'
        ).fetchone() or (0, 0)
        assert keys == distinct > 0
    state.close()


def test_base_columns_named_like_the_states_own_are_kept_apart(tmp_path: Path) -> None:
    table = TableId("public", "t")
    columns = [("id", "BIGINT"), ("k", "VARCHAR"), ("h", "BIGINT"), ("pos", "BIGINT"),
               ("gone", "BOOLEAN")]
    plan = analyze("odd", "SELECT t.id, t.k, t.h, t.pos, t.gone FROM public.t t", ["id"],
                   "postgres", [table])
    state = ViewState(tmp_path / "odd.duckdb", plan, lambda _: columns)
    row = {"id": 1, "k": "kay", "h": 8, "pos": 9, "gone": False}
    state.apply([BaseChange(table, '{"id":1}', b"\x01", row)])
    assert list(state.rows().values()) == [row]
    state.apply([BaseChange(table, '{"id":1}', b"\x02", {**row, "gone": True})])
    assert list(state.rows().values()) == [{**row, "gone": True}]
    state.apply([BaseChange(table, '{"id":1}', b"\x03", None)])
    assert state.rows() == {}
    state.close()


def test_a_batchs_values_reach_the_state_whatever_their_json_types(tmp_path: Path) -> None:
    """A batch's rows go to the state column by column in one Arrow pass when a column's values
    are all strings, all integers or all booleans; a column mixing them (text and a number),
    holding objects, or missing from some rows takes the per-value path: the same rows."""
    table = TableId("public", "t")
    columns = [("id", "BIGINT"), ("note", "VARCHAR"), ("n", "DECIMAL(12,2)"), ("ok", "BOOLEAN")]
    plan = analyze("mixed", "SELECT t.id, t.note, t.n, t.ok FROM public.t t", ["id"],
                   "postgres", [table])
    state = ViewState(tmp_path / "mixed.duckdb", plan, lambda _: columns)
    rows = {1: {"id": 1, "note": "plain", "n": "2.50", "ok": True},
            2: {"id": 2, "note": 7, "n": 3, "ok": False},  # a number in the text column
            3: {"id": 3, "note": {"a": [1, "x"]}},  # an object; n and ok missing
            4: {"id": 4, "note": None, "n": None, "ok": None}}
    state.apply([BaseChange(table, f'{{"id":{key}}}', bytes([key]), row)
                 for key, row in rows.items()])
    assert state.rows() == {
        '{"id":1}': {"id": 1, "note": "plain", "n": "2.50", "ok": True},
        '{"id":2}': {"id": 2, "note": "7", "n": "3.00", "ok": False},
        '{"id":3}': {"id": 3, "note": '{"a":[1,"x"]}', "n": None, "ok": None},
        '{"id":4}': {"id": 4, "note": None, "n": None, "ok": None}}
    state.apply([BaseChange(table, '{"id":5}', b"\x05", {"id": 5, "note": "only", "n": 1,
                                                           "ok": False})])
    assert state.rows()['{"id":5}'] == {"id": 5, "note": "only", "n": "1.00", "ok": False}
    state.close()


def test_views_handed_the_same_rows_share_their_arrow_staging(tmp_path: Path) -> None:
    """Two views given one batch's very row objects (as the loop hands them in one process)
    stage them from one Arrow struct; rows that are other objects with equal values get
    their own — and both views hold exactly their rows."""
    from views.state import _as_struct

    rows = [{"id": n, "customer_id": n % 9, "amount": f"{n}.25", "sku": "ab"[n % 2]}
            for n in range(1, 1501)]
    batch = [BaseChange(ORDERS, f'{{"id":{row["id"]}}}', row["id"].to_bytes(4, "big"), row)
             for row in rows]
    assert _as_struct(rows) is _as_struct([change.row for change in batch])
    assert _as_struct(rows) is not _as_struct([dict(row) for row in rows])
    states = [_state(tmp_path, name, EXTREMES, ["customer_id"]) for name in ("one", "two")]
    for state in states:
        state.apply(batch)
        assert state.rows() == state.recompute() and len(state.rows()) == 9
    assert states[0].rows() == states[1].rows()
    for state in states:
        state.close()


def test_a_crash_before_the_outbox_is_drained_writes_it_again(tmp_path: Path) -> None:
    state = _state(tmp_path, "revenue", REVENUE, ["customer_id"])
    customer = BaseChange(CUSTOMERS, '{"id":1}', b"\x01", {"id": 1, "name": "ann", "region": "n"})
    order = BaseChange(ORDERS, '{"id":7}', b"\x02",
                       {"id": 7, "customer_id": 1, "amount": "2.50", "sku": "a"})
    state.apply([customer, order])
    state.close()  # "crash": the outbox was not drained
    reopened = _state(tmp_path, "revenue", REVENUE, ["customer_id"])
    pending = reopened.pending()
    assert [(c.key, c.row) for c in pending] == [
        ('{"customer_id":1}', {"customer_id": 1, "name": "ann", "orders": 1, "revenue": "2.50"})]
    reopened.drained()
    later = BaseChange(ORDERS, '{"id":7}', b"\x03", None)
    reopened.apply([later])
    assert [(c.key, c.row, c.position) for c in reopened.pending()] == [
        ('{"customer_id":1}', None, b"\x03")]
    reopened.close()


def test_a_backlog_builds_the_view_once_at_its_end(tmp_path: Path) -> None:
    """While the view is not computed yet, a batch with more behind it (``defer``) only writes
    the base tables: nothing to the outbox, the view stays stale (also across a reopen, as
    after a crash); the batch that ends the backlog computes it whole, equal to the view
    maintained batch by batch. A view already computed is maintained even when deferred."""
    rng = random.Random(7)
    batches, position = [], 1
    for _ in range(6):
        batch, position = _random_batch(rng, position)
        batches.append(batch)
    built = _state(tmp_path, "built", REVENUE, ["customer_id"])
    for batch in batches[:3]:
        result = built.apply(batch, defer=True)
        assert result.deferred and not built.pending() and built.is_stale()
    built.close()
    built = _state(tmp_path, "built", REVENUE, ["customer_id"])  # reopened mid-backlog
    assert built.is_stale() and not built.rows()
    built.apply(batches[3], defer=True)
    last = built.apply(batches[4])
    assert last.recomputed and not last.deferred and not built.is_stale()
    kept = _state(tmp_path, "kept", REVENUE, ["customer_id"])
    for batch in batches[:5]:
        kept.apply(batch)
        kept.drained()
    assert built.rows() == kept.rows() == built.recompute()
    assert {c.key: c.row for c in built.pending()} == kept.rows()
    built.drained()
    after = built.apply(batches[5], defer=True)  # computed already: maintained, not deferred
    assert not after.deferred and not after.recomputed and built.pending()
    assert built.rows() == built.recompute()
    built.close()
    kept.close()


def test_duplicate_keys_stop_the_view_with_the_fix(tmp_path: Path) -> None:
    lines = _state(tmp_path, "by_name", "SELECT c.name, c.id FROM customers c", ["name"])
    rows = [BaseChange(CUSTOMERS, f'{{"id":{i}}}', bytes([i]), {"id": i, "name": "ann"})
            for i in (1, 2)]
    with pytest.raises(ViewError, match="two rows have the key") as error:
        lines.apply(rows)
    assert error.value.fix and "key" in error.value.fix
    assert lines.rows() == {} and lines.pending() == []  # the batch was rolled back


def test_a_null_group_is_a_group(tmp_path: Path) -> None:
    """A NULL group key is a group, as on the leader (found by the fuzzer: the view stopped);
    it moves in and out of the NULL group like any other."""
    nulls = _state(tmp_path, "by_region", "SELECT c.region, count(*) AS n FROM customers c "
                   "GROUP BY c.region", ["region"])
    def change(number: int, position: int, region: str | None, gone: bool = False
               ) -> BaseChange:
        return BaseChange(CUSTOMERS, f'{{"id":{number}}}', bytes([position]),
                          None if gone else {"id": number, "name": "x", "region": region})

    nulls.apply([change(1, 1, None), change(2, 2, None), change(3, 3, "n")])
    assert nulls.rows() == {'{"region":null}': {"region": None, "n": 2},
                            '{"region":"n"}': {"region": "n", "n": 1}}
    nulls.drained()
    nulls.apply([change(1, 4, "n"), change(2, 5, None, gone=True)])
    assert nulls.rows() == {'{"region":"n"}': {"region": "n", "n": 2}}
    assert [(c.key, c.row) for c in nulls.pending()] == [
        ('{"region":"n"}', {"region": "n", "n": 2}), ('{"region":null}', None)]
    nulls.close()


# ------------------------------------------------------------------------ end to end

SHOP = """
    CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, region text);
    CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL, amount numeric(12,2)
                         NOT NULL, sku text NOT NULL);
    INSERT INTO customers SELECT g, 'c' || g, (ARRAY['n','s','e'])[1 + g % 3]
        FROM generate_series(1, 60) g;
    INSERT INTO orders SELECT g, 1 + g % 60, (g % 997) / 10.0, 'sku' || (g % 17)
        FROM generate_series(1, 3000) g;
"""


class ShopLoad:
    """Random transactions on the shop: inserts, updates, deletes, key changes."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.stop = threading.Event()
        self.transactions = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ShopLoad:
        self.thread.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(30)

    def _run(self) -> None:
        rng = random.Random(5)
        with self.db.connect() as conn:
            while not self.stop.is_set():
                with conn.transaction():
                    for _ in range(rng.randint(1, 6)):
                        self._change(conn, rng)
                self.transactions += 1
                time.sleep(0.005)

    @staticmethod
    def _change(conn: Any, rng: random.Random) -> None:
        roll = rng.random()
        order = rng.randint(1, 4000)
        if roll < 0.35:
            conn.execute("INSERT INTO orders VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO UPDATE "
                         "SET amount = excluded.amount", (order, rng.randint(1, 70),
                                                          rng.randint(0, 99999) / 100,
                                                          f"sku{rng.randint(0, 20)}"))
        elif roll < 0.6:
            conn.execute("UPDATE orders SET amount = amount + 1, customer_id = %s WHERE id = %s",
                         (rng.randint(1, 70), order))
        elif roll < 0.75:
            conn.execute("DELETE FROM orders WHERE id = %s", (order,))
        elif roll < 0.82:  # a primary key change
            conn.execute("UPDATE orders SET id = %s WHERE id = %s AND NOT EXISTS "
                         "(SELECT 1 FROM orders WHERE id = %s)",
                         (order + 5000, order, order + 5000))
        elif roll < 0.9:
            conn.execute("INSERT INTO customers VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE "
                         "SET name = excluded.name, region = excluded.region",
                         (rng.randint(1, 70), f"n{rng.randint(0, 9)}",
                          rng.choice(["n", "s", "e", None])))
        else:
            conn.execute("DELETE FROM customers WHERE id = %s", (rng.randint(1, 70),))


#: keyed by PostgreSQL's ``extract`` (``numeric`` on the leader, BIGINT in the view's state)
#: and a nullable column (the NULL region is a group)
BY_DAY = ("SELECT extract(day from make_date(2024, 1, 1 + c.id % 28)) AS day, c.region, "
          "count(*) AS customers FROM customers c "
          "GROUP BY extract(day from make_date(2024, 1, 1 + c.id % 28)), c.region")
#: a view without rows: a table without rows in every follower
NOBODY = "SELECT c.id, c.name, c.region FROM customers c WHERE c.id < 0"


@pytest.mark.slow
def test_views_in_every_follower_kind_verify_against_the_leader(
        tmp_path: Path, pg_db: Any, redis_url: str) -> None:
    from tests.pgkit import PROJECT, Capture, cdc, output, wait_caught_up, wait_for, write_config
    from tests.sparkkit import committed_batches, driver_watch, group_freeze

    pg_db.execute(SHOP)
    sqlite = tmp_path / "reporting.sqlite"
    extra = f"""followers:
  reporting:
    kind: sql
    url: sqlite:///{sqlite}
  warehouse:
    kind: delta
    path: {tmp_path / "warehouse"}
  cache:
    kind: redis
    url: {redis_url}
  search:
    kind: search
    path: {tmp_path / "search"}
views:
  revenue_by_customer:
    source: {pg_db.source}
    sql: {json.dumps(REVENUE)}
    key: [customer_id]
    followers: [reporting, warehouse, cache, search]
    max_records_per_batch: 2000
  order_extremes:
    source: {pg_db.source}
    sql: {json.dumps(EXTREMES)}
    key: [customer_id]
    followers: [reporting, warehouse, cache, search]
  customers_by_day:
    source: {pg_db.source}
    sql: {json.dumps(BY_DAY)}
    key: [day, region]
    followers: [reporting, warehouse, cache, search]
  nobody:
    source: {pg_db.source}
    sql: {json.dumps(NOBODY)}
    key: [id]
    followers: [reporting, warehouse, cache, search]
"""
    config = write_config(tmp_path, pg_db, ["public.customers", "public.orders"], extra=extra)
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    checked = cdc("check-config", "--config", str(config), "--connect")
    assert checked.returncode == 0, output(checked)
    assert checked.stdout.count(": incremental; key") == 4
    assert checked.stdout.count("runs: leader EXPLAIN, DuckDB, Spark SQL") == 4, output(checked)
    capture = Capture(config, tmp_path / "capture.log").start()

    stalled = tmp_path / "stalled"

    def start_apply(stall: bool = False) -> subprocess.Popen[bytes]:
        # tests/faults/sitecustomize.py: a batch stalls after its state commit
        env = fault_env(CDC_TEST_VIEW_STALL=str(stalled)) if stall else None
        return subprocess.Popen(
            [sys.executable, "-m", "cdc_app.cli", "apply", "--config", str(config), "--view",
             "revenue_by_customer", "--view", "order_extremes", "--view", "customers_by_day",
             "--view", "nobody"],
            cwd=PROJECT, env=env,
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "apply.log", "ab"),  # noqa: SIM115
            start_new_session=True)

    roots = [tmp_path / "state" / "apply"]

    def state_writes() -> int:  # the views' DuckDB state files, as they are written
        return sum(p.stat().st_mtime_ns for p in (tmp_path / "state").rglob("*.duckdb*"))

    def kill_apply(phase: str) -> None:
        def kill() -> None:
            # the whole process group (driver, JVM, Python workers), stopped to aim: a JVM
            # left running after its driver died could still commit the batch in flight
            # (seen: two commits landed between the look and the restart's read)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(apply.pid, signal.SIGKILL)
            apply.wait(30)
        watch.kill(phase, kill, lambda: committed_batches(roots), aim=60,
                   freeze=group_freeze(apply.pid))

    apply = start_apply()
    load = ShopLoad(pg_db).start()
    watch = driver_watch(roots, state_writes).start()
    try:
        _wait_for_rows(sqlite, "revenue_by_customer", timeout=120)
        watch.wait_moving()
        kill_apply("mid-batch (views)")  # mid-run, somewhere in a batch
        pg_db.execute("TRUNCATE orders")
        apply = start_apply(stall=True)  # stalls after a batch's state commit, outbox full
        deadline = time.monotonic() + 120
        while not stalled.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stalled.exists()
        # between the state's commit and the followers (the state was written just now)
        kill_apply("between a view's state commit and its followers")
        committed = committed_batches(roots)
        apply = start_apply()
        # under load until the restarted apply committed a batch of its own
        wait_for(lambda: committed_batches(roots) > committed or apply.poll() is not None,
                 180, "the restarted apply's first commit")
        assert apply.poll() is None, (tmp_path / "apply.log").read_text()[-3000:]
        load.finish()
        assert load.transactions > 50
        wait_caught_up(pg_db, tmp_path / "log")
        # customers_by_day's key is numeric on the leader (extract), BIGINT in the state:
        # verify matches keys by value
        for view, held_by in (("revenue_by_customer", 4), ("order_extremes", 4),
                              ("customers_by_day", 4), ("nobody", 4)):
            verified = cdc("verify", "--config", str(config), "--view", view, "--timeout",
                           "180s", timeout=400)
            assert verified.returncode == 0, output(verified)
            assert verified.stdout.count("equals the leader") == held_by, output(verified)
        live = pg_db.execute("SELECT count(DISTINCT customer_id) FROM orders o JOIN customers c "
                             "ON c.id = o.customer_id")[0][0]
        assert live > 10
        engine = sa.create_engine(f"sqlite:///{sqlite}")
        try:
            with engine.begin() as conn:
                assert conn.execute(sa.text(
                    "SELECT count(*) FROM revenue_by_customer")).scalar() == live
                columns = [c["name"] for c in sa.inspect(conn).get_columns("revenue_by_customer")]
                assert columns == ["customer_id", "name", "orders", "revenue"]
                # the empty view: a table, empty, with its SQL's columns
                assert conn.execute(sa.text("SELECT count(*) FROM nobody")).scalar() == 0
                assert [(c["name"], str(c["type"])) for c in sa.inspect(conn).get_columns(
                    "nobody")] == [("id", "BIGINT"), ("name", "TEXT"), ("region", "TEXT")]
                assert conn.execute(sa.text("SELECT count(*) FROM customers_by_day WHERE "
                                            "region IS NULL")).scalar() > 0
                first = conn.execute(sa.text("SELECT min(customer_id) FROM revenue_by_customer"
                                             )).scalar()
                conn.execute(sa.text("UPDATE revenue_by_customer SET orders = orders + 1 "
                                     "WHERE customer_id = :k"), {"k": first})
        finally:
            engine.dispose()
        from deltalake import DeltaTable

        from sinks.delta import table_dir
        from views.sink import view_topic
        empty = DeltaTable(str(table_dir(tmp_path / "warehouse", view_topic(pg_db.source,
                                                                            "nobody"))))
        assert empty.to_pyarrow_table().num_rows == 0
        assert {"id", "name", "region"} <= set(empty.schema().to_arrow().names)
        diverged = cdc("verify", "--config", str(config), "--view", "revenue_by_customer",
                       "--follower", "reporting", "--timeout", "60s", timeout=300)
        assert diverged.returncode == 1, output(diverged)
        assert f'{{"customer_id":{first}}}: different: orders' in diverged.stdout
    finally:
        watch.stop()
        load.finish()
        apply.send_signal(signal.SIGTERM)
        apply_code = apply.wait(120)
        capture_code = capture.terminate()
    assert apply_code == 0, (tmp_path / "apply.log").read_text()[-3000:]
    assert capture_code == 0


def test_check_config_runs_view_sql_on_the_leader(tmp_path: Path, pg_db: Any) -> None:
    from tests.pgkit import cdc, output, write_config

    pg_db.execute("CREATE TABLE shelf (id int PRIMARY KEY, label text)")
    extra = f"""followers:
  reporting:
    kind: sql
    url: sqlite:///{tmp_path / "r.sqlite"}
views:
  labels:
    source: {pg_db.source}
    sql: SELECT s.label, count(*) AS n FROM shelf s GROUP BY s.label
    key: [label]
    followers: [reporting]
  ranked:
    source: {pg_db.source}
    sql: SELECT s.id, rank() OVER (ORDER BY s.label) AS r FROM shelf s
    key: [id]
    followers: [reporting]
"""
    config = write_config(tmp_path, pg_db, ["public.shelf"], extra=extra)
    offline = cdc("check-config", "--config", str(config))
    assert offline.returncode == 0, output(offline)
    assert "view labels" in offline.stdout and "incremental" in offline.stdout
    assert "recomputed whole after each batch (window function without PARTITION BY" in \
        offline.stdout.replace("\n", " ")
    assert "GROUP BY: incremental" in offline.stdout  # each construct, one line each
    config.write_text(config.read_text().replace(
        "s.label, count(*) AS n FROM shelf s GROUP BY s.label",
        "s.title AS label, count(*) AS n FROM shelf s GROUP BY s.title"))
    bad = cdc("check-config", "--config", str(config), "--connect")
    assert bad.returncode != 0
    assert "the query failed on the leader" in bad.stderr and "title" in bad.stderr, output(bad)
    assert "Traceback" not in bad.stderr


@pytest.mark.slow
def test_a_schema_change_that_breaks_a_view_stops_that_view_only(tmp_path: Path,
                                                                 pg_db: Any) -> None:
    from tests.pgkit import PROJECT, Capture, cdc, output, wait_caught_up, write_config

    pg_db.execute("CREATE TABLE shelf (id int PRIMARY KEY, label text NOT NULL, n int);"
                  "INSERT INTO shelf SELECT g, 'l' || (g % 5), g FROM generate_series(1, 50) g;"
                  "CREATE TABLE other (id int PRIMARY KEY, v int)")
    sqlite = tmp_path / "r.sqlite"
    extra = f"""followers:
  reporting:
    kind: sql
    url: sqlite:///{sqlite}
    tables: [public.other]
views:
  labels:
    source: {pg_db.source}
    sql: SELECT s.label, count(*) AS n FROM shelf s GROUP BY s.label
    key: [label]
    followers: [reporting]
"""
    config = write_config(tmp_path, pg_db, ["public.shelf", "public.other"], extra=extra)
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    capture = Capture(config, tmp_path / "capture.log").start()
    log_file = tmp_path / "apply.log"
    apply = subprocess.Popen(
        [sys.executable, "-m", "cdc_app.cli", "apply", "--config", str(config), "--view", "labels",
         "--follower", "reporting"], cwd=PROJECT, stdout=subprocess.DEVNULL,
        stderr=open(log_file, "wb"), start_new_session=True)  # noqa: SIM115
    try:
        _wait_for_rows(sqlite, "labels", timeout=120)
        pg_db.execute("ALTER TABLE shelf DROP COLUMN label")
        pg_db.execute("INSERT INTO shelf SELECT g, g FROM generate_series(100, 120) g")
        pg_db.execute("INSERT INTO other SELECT g, g FROM generate_series(1, 30) g")
        wait_caught_up(pg_db, tmp_path / "log")
        deadline = time.monotonic() + 90
        while "view labels stopped" not in log_file.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "view labels stopped" in log_file.read_text()
        assert "public.shelf.label, which the leader's table no longer has" in \
            log_file.read_text()
        assert apply.poll() is None  # the follower goes on
        verified = cdc("verify", "--config", str(config), "--follower", "reporting",
                       "--timeout", "120s", timeout=300)
        assert verified.returncode == 0, output(verified)
    finally:
        apply.send_signal(signal.SIGTERM)
        code = apply.wait(120)
        capture_code = capture.terminate()
    assert capture_code == 0
    assert code == 1  # it ends with the view's error
    assert "correct views.labels.sql" in log_file.read_text()
    (tmp_path / "state" / "views" / "labels.duckdb").unlink()  # the state lost alone
    again = cdc("apply", "--config", str(config), "--view", "labels", "--once")
    assert again.returncode != 0 and "its state" in again.stderr and "is gone" in again.stderr
    assert "progress record" in again.stderr and "delete the folder" in again.stderr
    assert "Traceback" not in again.stderr


def _wait_for_rows(sqlite: Path, table: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sqlite.exists():
            engine = sa.create_engine(f"sqlite:///{sqlite}")
            try:
                with engine.connect() as conn:
                    if conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar():
                        return
            except sa.exc.OperationalError:
                pass
            finally:
                engine.dispose()
        time.sleep(0.5)
    raise AssertionError(f"no rows in {table} within {timeout} s")


def test_a_view_over_a_kafka_log_verifies_against_the_leader(
        tmp_path: Path, pg_db: Any, kafka_broker: Any, spark: Any) -> None:
    """The view's query reads a Kafka-backed log (its tables' topics, whole transactions per
    batch) like a local one: applied until caught up, then ``cdc verify --view`` passes."""
    from tests.kafkakit import kafka_yaml
    from tests.pgkit import Capture, cdc, output, wait_caught_up, write_config
    from tests.sparkkit import InProcessApply, apply_once

    pg_db.execute(SHOP)
    options = kafka_yaml(kafka_broker)
    sqlite = tmp_path / "reporting.sqlite"
    extra = f"""followers:
  reporting:
    kind: sql
    url: sqlite:///{sqlite}
  warehouse:
    kind: delta
    path: {tmp_path / "warehouse"}
views:
  revenue_by_customer:
    source: {pg_db.source}
    sql: {json.dumps(REVENUE)}
    key: [customer_id]
    followers: [reporting, warehouse]
    max_records_per_batch: 1500
"""
    config = write_config(tmp_path, pg_db, ["public.customers", "public.orders"],
                          log_options=options, extra=extra)
    settings = {**options, "path": str(tmp_path / "log")}
    bootstrapped = cdc("bootstrap", "--config", str(config))
    assert bootstrapped.returncode == 0, output(bootstrapped)
    capture = Capture(config, tmp_path / "capture.log").start()
    apply: InProcessApply | None = None
    try:
        pg_db.execute("UPDATE orders SET amount = amount + 1, customer_id = 1 + id % 7 "
                      "WHERE id % 5 = 0; DELETE FROM orders WHERE id % 11 = 0; "
                      "UPDATE orders SET id = id + 10000 WHERE id % 13 = 0; "
                      "UPDATE customers SET name = 'renamed ' || id WHERE id % 4 = 0; "
                      "DELETE FROM customers WHERE id IN (3, 6)")
        wait_caught_up(pg_db, settings, 120)
        apply_once(config, "revenue_by_customer")  # in this process, on the shared session
        engine = sa.create_engine(f"sqlite:///{sqlite}")
        try:
            with engine.connect() as conn:
                held = conn.execute(sa.text("SELECT count(*) FROM revenue_by_customer")).scalar()
        finally:
            engine.dispose()
        live = pg_db.execute("SELECT count(DISTINCT c.id) FROM orders o JOIN customers c "
                             "ON c.id = o.customer_id")[0][0]
        assert held == live and live > 40
        # verify marks the log now and waits for the view's watermark: apply continuously
        apply = InProcessApply(config, tmp_path / "apply.log", "revenue_by_customer")
        pg_db.execute("INSERT INTO orders VALUES (90001, 2, 12.34, 'x'), (90002, 5, 1.01, 'y')")
        verified = cdc("verify", "--config", str(config), "--view", "revenue_by_customer",
                       "--timeout", "120s", timeout=300)
        assert verified.returncode == 0, output(verified)
        assert verified.stdout.count("equals the leader") == 2, output(verified)
    finally:
        apply_code = apply.terminate() if apply is not None else 0
        capture_code = capture.terminate()
    assert apply_code == 0, (tmp_path / "apply.log").read_text()[-3000:] if apply else ""
    assert capture_code == 0, (tmp_path / "capture.log").read_text()[-3000:]


def test_verify_compares_floating_columns_within_the_leaders_rounding() -> None:
    """An approximate column equals the leader's value within 1e-9 relative, or within half
    a unit of the leader's last decimal place (MariaDB's AVG of a DECIMAL: scale + 4); never
    beyond, and exact columns stay exact."""
    from views.types import same_cell

    assert same_cell("12.345678", "12.34567812345", True)  # MariaDB AVG vs a double
    assert same_cell("0.3333333333333333", "0.33333333333333331", True)
    assert not same_cell("12.345678", "12.3457", True)
    assert not same_cell("12.345678", "12.34567812345", False)
    assert same_cell("1.50", "1.5", False)


def test_verify_matches_keys_by_value_across_number_types() -> None:
    """The leader's ``extract(year ...)`` is ``numeric`` (Decimal 1997), the view's state
    computes a BIGINT (1997): one key, compared by value; text keys stay text ("1997" and
    1997 are different keys only where the leader's column is not a number)."""
    from decimal import Decimal

    from views.verify import _follower_canonical, canonical_key

    numeric = frozenset({"year"})
    leader = canonical_key({"year": Decimal("1997"), "nation": "FRANCE"}, numeric)
    assert leader == _follower_canonical('{"year":1997,"nation":"FRANCE"}', numeric)
    assert leader == _follower_canonical('{"year":"1997.0","nation":"FRANCE"}', numeric)
    assert canonical_key({"amount": Decimal("1.50")}, frozenset({"amount"})) == \
        _follower_canonical('{"amount":"1.5"}', frozenset({"amount"}))
    assert canonical_key({"amount": Decimal("100")}, frozenset({"amount"})) == '{"amount":"100"}'
    assert leader != _follower_canonical('{"year":1998,"nation":"FRANCE"}', numeric)
    assert leader != _follower_canonical('{"year":1997,"nation":"FRANCE "}', numeric)
    text = frozenset()
    assert canonical_key({"code": "1997"}, text) != _follower_canonical('{"code":1997}', text)
    # a date key (found by the fuzzer: the leader's date was not JSON-encodable), a NULL group
    from datetime import date
    assert canonical_key({"day": date(2024, 2, 29), "g": None}, text) == \
        _follower_canonical('{"day":"2024-02-29","g":null}', text)


def test_a_view_over_one_table_ignores_character_columns_of_another(tmp_path: Path) -> None:
    """Found by the fuzzer: the state's blank-trimming step ran for every captured table with a
    ``character(n)`` column, also one the view does not read (no such table in its state)."""
    lengths = {ORDERS: {c: Described() for c in ("id", "customer_id", "amount", "sku")},
               CUSTOMERS: {"id": Described(), "name": Described(5), "region": Described()}}
    plan = analyze("plain", "SELECT o.id, o.amount FROM orders o", ["id"], "postgres", CAPTURED,
                   lambda: lengths)
    state = ViewState(tmp_path / "plain.duckdb", plan, lambda table: COLUMNS[table])
    try:
        state.apply([BaseChange(ORDERS, '{"id":1}', b"\x01", {"id": 1, "customer_id": 1,
                                                              "amount": "2.00", "sku": "a"})])
        assert state.rows() == {'{"id":1}': {"id": 1, "amount": "2.00"}}
    finally:
        state.close()


#: PostgreSQL's character(n) against the leader's own answers (TPC-H's CHAR columns: Q3, Q5,
#: Q12 and Q16 came out wrong while the state compared the padded text)
PADDED = """
    CREATE TABLE seg (id int PRIMARY KEY, seg char(10) NOT NULL, code char(3), note text);
    INSERT INTO seg VALUES (1, 'BUILDING', 'ab', 'x'), (2, 'MACHINERY', 'ab ', 'y'),
        (3, 'BUILDING ', 'cd', 'z'), (4, 'AUTO', 'a', 'BUILDING'), (5, 'AUTO', NULL, NULL),
        (6, 'HOUSEHOLD', 'b', 'q');
"""
PADDED_VIEWS: dict[str, tuple[str, list[str]]] = {
    "eq": ("SELECT s.id, s.seg, s.code FROM seg s WHERE s.seg = 'BUILDING'", ["id"]),
    "ne_in": ("SELECT s.id FROM seg s WHERE s.seg <> 'BUILDING' AND s.code IN ('ab', 'a')",
              ["id"]),
    "group": ("SELECT s.seg, count(*) AS n, min(s.code) AS lo, max(s.code) AS hi FROM seg s "
              "GROUP BY s.seg", ["seg"]),
    "distinct": ("SELECT DISTINCT s.code FROM seg s WHERE s.code IS NOT NULL", ["code"]),
    "text": ("SELECT s.id, length(s.seg) AS len, s.seg || '|' AS piped, "
             "concat(s.code, '|') AS joined, upper(s.code) AS up FROM seg s", ["id"]),
    "like": ("SELECT s.id FROM seg s WHERE s.code LIKE '%b' OR s.seg LIKE 'AUTO%'", ["id"]),
    "self_join": ("SELECT s.id, t.id AS other FROM seg s JOIN seg t ON t.code = s.code "
                  "WHERE s.id < t.id", ["id", "other"]),
    "sub": ("SELECT g.seg, g.n FROM (SELECT s.seg, count(*) AS n FROM seg s GROUP BY s.seg) g "
            "WHERE g.seg IN ('AUTO', 'BUILDING')", ["seg"]),
}


def test_character_n_columns_compute_as_the_leader(tmp_path: Path, pg_db: Any) -> None:
    """Each view over character(n) columns holds exactly the leader's answer to its SQL: the
    state fed the rows as capture gives them (padded), typed through the connector's own
    rule (``pg_type`` of the column's type modifier)."""
    from connectors.postgres.types import pg_type
    from views.types import json_form

    pg_db.execute(PADDED)
    table = TableId("public", "seg")
    described = {str(name): blank_padded_length(pg_type(int(oid), int(modifier), {})
                                                .column_type)
                 for name, oid, modifier in pg_db.execute(
                     "SELECT attname, atttypid, atttypmod FROM pg_attribute WHERE attrelid = "
                     "'seg'::regclass AND attnum > 0 ORDER BY attnum")}
    assert described == {"id": None, "seg": 10, "code": 3, "note": None}
    with pg_db.connect() as conn, conn.cursor() as cursor:
        cursor.execute("SELECT * FROM seg")
        names = [d.name for d in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    assert rows[0]["seg"] == "BUILDING  "  # padded, as capture reads it
    changes = [BaseChange(table, json.dumps({"id": row["id"]}, separators=(",", ":")),
                          bytes([row["id"]]), row) for row in rows]
    types = [("id", "BIGINT"), ("seg", "VARCHAR"), ("code", "VARCHAR"), ("note", "VARCHAR")]
    for name, (sql, key) in PADDED_VIEWS.items():
        plan = analyze(name, sql, key, "postgres", [table],
                       lambda: {table: {c: Described(n) for c, n in described.items()}})
        state = ViewState(tmp_path / f"{name}.duckdb", plan, lambda _t: types)
        try:
            state.apply(changes)
            with pg_db.connect() as conn, conn.cursor() as cursor:
                cursor.execute(sql)
                columns = [d.name for d in cursor.description]
                leader = {json.dumps({k: json_form(row[columns.index(k)]) for k in key},
                                     separators=(",", ":")):
                          {c: json_form(v) for c, v in zip(columns, row, strict=True)}
                          for row in cursor.fetchall()}
            assert leader, name
            assert state.rows() == leader, name
        finally:
            state.close()


def test_mariadb_division_by_zero_is_null_as_on_the_leader(tmp_path: Path, mysql_db: Any
                                                            ) -> None:
    """MariaDB answers NULL for ``DIV`` and ``MOD`` by zero, where DuckDB raises: the view
    equals MariaDB's own answer instead of stopping."""
    from views.types import json_form

    mysql_db.execute("CREATE TABLE t (id int PRIMARY KEY, a int, b int)")
    mysql_db.execute("INSERT INTO t VALUES (1, 7, 2), (2, 7, 0), (3, -7, 2), (4, 5, NULL)")
    table = TableId(mysql_db.name, "t")
    sql = "SELECT t.id, t.a DIV t.b AS q, t.a MOD t.b AS m, t.a % t.b AS r FROM t"
    plan = analyze("div", sql, ["id"], "mysql", [table])
    state = ViewState(tmp_path / "div.duckdb", plan,
                      lambda _t: [("id", "BIGINT"), ("a", "BIGINT"), ("b", "BIGINT")])
    try:
        rows = mysql_db.execute("SELECT id, a, b FROM t")
        state.apply([BaseChange(table, json.dumps({"id": i}, separators=(",", ":")),
                                bytes([i]), {"id": i, "a": a, "b": b}) for i, a, b in rows])
        leader = {json.dumps({"id": i}, separators=(",", ":")):
                  {"id": i, "q": json_form(q), "m": json_form(m), "r": json_form(r)}
                  for i, q, m, r in mysql_db.execute(sql)}
        assert leader['{"id":2}']["q"] is None
        assert state.rows() == leader
    finally:
        state.close()


def test_mariadb_division_and_avg_keep_the_leaders_scale(tmp_path: Path, mysql_db: Any) -> None:
    """MariaDB's ``/`` and ``AVG`` of exact numbers are DECIMALs with 4 more places than the
    dividend (``-10 / 3`` is ``-3.3333``, the AVG of a ``DECIMAL(8,2)`` has 6): the view's
    columns hold exactly MariaDB's values, not doubles (``-3.3333333333333335``), and its
    comparisons see the rounded value as MariaDB's do."""
    from decimal import Decimal

    mysql_db.execute("CREATE TABLE t (id int PRIMARY KEY, g int, a int, x decimal(8,2))")
    mysql_db.execute("INSERT INTO t VALUES (1, 1, -10, 10.10), (2, 1, 2, 1.00), "
                     "(3, 2, 7, 0.05), (4, 2, 1, NULL), (5, 1, 1, 2.00)")
    table = TableId(mysql_db.name, "t")
    types = [("id", "BIGINT"), ("g", "BIGINT"), ("a", "BIGINT"), ("x", "DECIMAL(8,2)")]
    described = {table: {c: Described(state_type=k) for c, k in types}}
    views = {"per_row": ("SELECT t.id, t.a / 3 AS q, t.x / t.a AS r, t.x / 32 AS h FROM t",
                         ["id"]),
             "per_group": ("SELECT t.g, avg(t.x) AS ax, avg(t.a) AS aa, sum(t.x) / count(*) "
                           "AS c, sum(t.a) / sum(t.x) * 100 AS p FROM t GROUP BY t.g", ["g"]),
             # MariaDB compares a division at its scale: 1 / 3 = 0.3333 is true there
             "compared": ("SELECT t.id, CASE WHEN t.a / 3 >= 0.6667 THEN 'y' ELSE 'n' END AS c "
                          "FROM t WHERE t.a / 3 = 0.3333 OR t.a / 3 > 0.666666667", ["id"]),
             # ... and holds 9 digits of it, truncated: 2 / 3 * 3000000000 is 1999999998.0000
             "held": ("SELECT t.id, t.a / 3 * 3000000000 AS m, t.x / 7 * 1000000000 AS n, "
                      "CASE WHEN t.a / 3 IN (0.3333, 0.333333333) THEN 'in' ELSE 'out' END AS i, "
                      "(t.a / 3) / 7 AS d, t.a / 3 + t.a / 3 AS s FROM t", ["id"]),
             "grouped": ("SELECT t.g, avg(t.a) * 1000000000 AS m, count(*) AS n FROM t "
                         "GROUP BY t.g HAVING avg(t.x) <> 0.336667", ["g"])}
    rows = mysql_db.execute("SELECT id, g, a, x FROM t")
    changes = [BaseChange(table, json.dumps({"id": i}, separators=(",", ":")), bytes([i]),
                          {"id": i, "g": g, "a": a, "x": None if x is None else str(x)})
               for i, g, a, x in rows]
    for name, (sql, key) in views.items():
        plan = analyze(name, sql, key, "mysql", [table], lambda: described)
        state = ViewState(tmp_path / f"{name}.duckdb", plan, lambda _t: types)
        try:
            state.apply(changes)
            held = {json.loads(k)[key[0]]: row for k, row in state.rows().items()}
            answers = list(mysql_db.execute(sql))
            assert sorted(held) == sorted(found[0] for found in answers), name
            for found in answers:
                row = held[found[0]]
                for column, value in zip(list(row)[1:], found[1:], strict=True):
                    held_value = row[column]
                    if isinstance(value, Decimal) and held_value is not None:
                        held_value = Decimal(str(held_value))
                    assert held_value == value and str(held_value) == str(value), \
                        (name, found[0], column, row[column], value)
        finally:
            state.close()


def test_icu_locales_map_to_duckdb_collations_or_to_none() -> None:
    """The root locale is DuckDB's ``en``; a region falls back to its language unless DuckDB
    has the region's own order; scripts and options (numeric order, strength) map to none, so
    views ordering such text stay refused."""
    from views.collation import duckdb_collation, duckdb_knows

    def mapped(locale: str) -> str | None:
        return duckdb_collation(locale, duckdb_knows)

    assert [mapped(x) for x in ("und", "root", "", "de-DE", "de-AT", "sv", "en_US", "zh-TW")] \
        == ["en", "en", "en", "de", "de_at", "sv", "en_us", "zh_tw"]
    assert [mapped(x) for x in ("und-u-kn-true", "zh-Hant-TW", "sr-Latn", "xx", "de@co=phonebk")
            ] == [None] * 5


def test_text_ordered_by_an_icu_locale_is_ordered_by_its_sort_key() -> None:
    """MIN/MAX, <, BETWEEN and ORDER BY over such a column compare ICU sort keys (ties by the
    bytes) in the state; equality and grouping stay the bytes'."""
    import duckdb

    table = TableId("public", "t")
    plan = analyze("icu", "SELECT t.g, min(t.name) AS lo, max(t.name) AS hi FROM t "
                   "WHERE t.name > 'a' AND t.name <> 'x' GROUP BY t.g", ["g"], "postgres",
                   [table], lambda: {table: {"id": Described(), "g": Described(),
                                             "name": Described(icu_locale="sv")}})
    assert plan.icu == {table: {"name": "sv"}} and plan.mode == "incremental"
    assert [op.construct for op in plan.operators][-2:] == ["MIN", "MAX"]
    assert "t.name <> 'x'" in plan.full_sql and "ICU_SORT_KEY(t.name, 'sv')" in plan.full_sql
    with duckdb.connect() as db:
        db.execute('CREATE SCHEMA public; CREATE TABLE public.t (id INT, g INT, name VARCHAR); '
                   "INSERT INTO public.t VALUES (1, 1, 'z'), (2, 1, 'ö'), (3, 1, 'B'), "
                   "(4, 1, 'b'), (5, 1, 'x'), (6, 1, NULL)")
        assert db.execute(plan.full_sql).fetchall() == [(1, "b", "ö")]  # Swedish: ö after z


def test_a_state_holding_timestamptz_as_text_is_converted(tmp_path: Path) -> None:
    """A state written before timestamptz was a TIMESTAMPTZ in it held the log's text: at the
    next start the column is converted in place and the view recomputed, so a comparison with
    a timestamp literal runs on it."""
    table = TableId("public", "ev")
    sql = "SELECT e.id, extract(hour from e.at) AS h FROM ev e WHERE e.at >= TIMESTAMP '2024-01-01'"
    row = {"id": 1, "at": "2024-01-01T12:30:00.000000Z"}
    change = BaseChange(table, '{"id":1}', b"\x01", row)
    old = analyze("ev", "SELECT e.id, e.at FROM ev e", ["id"], "postgres", [table])
    state = ViewState(tmp_path / "ev.duckdb", old, lambda _t: [("id", "BIGINT"), ("at", "VARCHAR")])
    state.apply([change])
    state.close()
    new = analyze("ev", sql, ["id"], "postgres", [table])
    state = ViewState(tmp_path / "ev.duckdb", new,
                      lambda _t: [("id", "BIGINT"), ("at", "TIMESTAMPTZ")])
    try:
        state.apply([])
        assert state.rows() == {'{"id":1}': {"id": 1, "h": 12}}
    finally:
        state.close()


def test_postgres_quotient_macro_equals_postgresql(pg_db: Any) -> None:
    """``cdc_pg_quotient`` (``views/postgres_decimals.py``) gives PostgreSQL's own quotient --
    its per-value scale (``select_div_scale``) and rounding, half away from zero -- for
    random operands across magnitudes, signs and scales, and every tie and carry the
    generator hits; asked of the server itself."""
    import random
    from decimal import Decimal

    import duckdb

    from views.postgres_decimals import HELD
    from views.types import set_up_state

    rng = random.Random(43)

    def number() -> tuple[str, int]:
        scale = rng.choice((0, 0, 1, 2, 4, 6))
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 14)))
        whole, places = digits[:-scale] or "0", digits[-scale:].rjust(scale, "0")
        text = f"{whole}.{places}" if scale else digits
        return ("-" if rng.random() < 0.3 else "") + text, scale

    pairs = []
    while len(pairs) < 400:
        (a, sa), (b, sb) = number(), number()
        if Decimal(b) != 0:
            pairs.append((a, sa, b, sb))
    pairs += [("1.0", 1, "3", 0), ("200.0", 1, "3", 0), ("1", 0, "1", 0), ("5", 0, "2", 0),
              ("-5", 0, "2", 0), ("9999", 0, "9999", 0), ("10000", 0, "9999", 0),
              ("0.05", 2, "1", 0), ("0", 0, "7", 0), ("1", 0, "3", 0)]
    leader = pg_db.execute("SELECT " + ", ".join(
        f"{a}::numeric(38,{sa}) / {b}::numeric(38,{sb})" for a, sa, b, sb in pairs))[0]
    db = set_up_state(duckdb.connect())
    compared = 0
    for (a, sa, b, sb), expected in zip(pairs, leader, strict=True):
        unscaled_a, unscaled_b = int(Decimal(a).scaleb(sa)), int(Decimal(b).scaleb(sb))
        exponent = expected.as_tuple().exponent
        assert isinstance(exponent, int)
        if -exponent > HELD or abs(expected) >= Decimal(10) ** (38 - HELD):
            with pytest.raises(duckdb.Error, match="PostgreSQL quotient"):
                db.execute(f"SELECT cdc_pg_quotient({unscaled_a}::HUGEINT, "
                           f"{unscaled_b}::HUGEINT, {sa}, {sb})").fetchone()
            continue
        held = db.execute(f"SELECT cdc_pg_quotient({unscaled_a}::HUGEINT, {unscaled_b}::HUGEINT, "
                          f"{sa}, {sb})").fetchone()[0]
        assert held == expected, (a, b, held, expected)
        compared += 1
    assert compared > 300


def test_postgres_division_and_avg_keep_the_leaders_values(tmp_path: Path, pg_db: Any) -> None:
    """PostgreSQL's ``/`` and ``AVG`` of exact numbers: a ``numeric`` at a per-value scale
    (``1.0 / 3`` has 20 places), integers truncating, ``sum`` of a ``bigint`` a ``numeric``
    (so ``sum(b) / count(*)`` does not truncate): the view's columns hold exactly
    PostgreSQL's values, not doubles, and compare as PostgreSQL's do."""
    from decimal import Decimal

    from views.definition import approximate_columns

    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, g int, a int, b bigint, x numeric(8,2))")
    pg_db.execute("INSERT INTO t VALUES (1, 1, -10, 7, 10.10), (2, 1, 2, 5, 1.00), "
                  "(3, 2, 7, -3, 0.05), (4, 2, 1, 4, NULL), (5, 1, 1, 9, 2.00)")
    table = TableId("public", "t")
    types = [("id", "BIGINT", "int32"), ("g", "BIGINT", "int32"), ("a", "BIGINT", "int32"),
             ("b", "BIGINT", "int64"), ("x", "DECIMAL(8,2)", "decimal")]
    described = {table: {c: Described(state_type=k, kind=kind) for c, k, kind in types}}
    views = {"per_row": ("SELECT t.id, t.a / 3 AS q, t.x / t.a AS r, t.x / 32 AS h, "
                         "t.b / 2 AS i, t.a / 3.0 AS f FROM t", ["id"]),
             "per_group": ("SELECT t.g, avg(t.x) AS ax, avg(t.a) AS aa, avg(t.b) AS ab, "
                           "sum(t.x) / count(*) AS c, sum(t.b) / count(*) AS sb, "
                           "sum(t.a) / count(*) AS sa, sum(t.a) / sum(t.x) * 100 AS p "
                           "FROM t GROUP BY t.g", ["g"]),
             "compared": ("SELECT t.id, CASE WHEN t.a / 3.0 >= 0.6666 THEN 'y' ELSE 'n' END "
                          "AS c FROM t WHERE t.a / 3.0 > 0.33333333333333333333 OR t.x / 3 "
                          "< 0.34", ["id"]),
             "grouped": ("SELECT t.g, round(avg(t.x), 3) AS r, count(*) AS n FROM t "
                         "GROUP BY t.g HAVING avg(t.b) <> 0.5", ["g"])}
    rows = pg_db.execute("SELECT id, g, a, b, x FROM t")
    changes = [BaseChange(table, json.dumps({"id": i}, separators=(",", ":")), bytes([i]),
                          {"id": i, "g": g, "a": a, "b": b, "x": None if x is None else str(x)})
               for i, g, a, b, x in rows]
    state_types = [(c, k) for c, k, _ in types]
    for name, (sql, key) in views.items():
        plan = analyze(name, sql, key, "postgres", [table], lambda: described)
        assert approximate_columns(plan, {}) == [], name
        # check-config names the AVG the state computes as SUM / COUNT
        assert ("AVG" in [op.construct for op in plan.operators]) == ("avg(" in sql), name
        state = ViewState(tmp_path / f"{name}.duckdb", plan, lambda _t: state_types)
        try:
            state.apply(changes)
            held = {json.loads(k)[key[0]]: row for k, row in state.rows().items()}
            answers = pg_db.execute(sql)
            assert sorted(held) == sorted(found[0] for found in answers), name
            for found in answers:
                row = held[found[0]]
                for column, value in zip(list(row)[1:], found[1:], strict=True):
                    held_value = row[column]
                    if isinstance(value, Decimal | int) and held_value is not None:
                        held_value = Decimal(str(held_value))
                    assert held_value == value, (name, found[0], column, row[column], value)
        finally:
            state.close()


def test_postgres_extract_keeps_its_fraction(tmp_path: Path, pg_db: Any) -> None:
    """PostgreSQL's ``extract(second ...)`` and ``extract(epoch ...)`` are ``numeric``s with the
    microseconds (``30.500000``); DuckDB's ``second`` is an integer and its ``epoch`` a double:
    the view holds PostgreSQL's values, a timestamp's, a timestamptz's and an interval's."""
    from decimal import Decimal

    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, ts timestamp, tz timestamptz)")
    pg_db.execute("INSERT INTO t VALUES (1, '2024-01-01 12:00:30.5', '2024-01-01 12:00:30.25Z'),"
                  " (2, '2024-02-29 23:59:59.123457', '1969-12-31 23:59:58.999999Z'), "
                  "(3, NULL, NULL)")
    table = TableId("public", "t")
    types = [("id", "BIGINT", "int32"), ("ts", "TIMESTAMP", "timestamp"),
             ("tz", "TIMESTAMPTZ", "timestamptz")]
    described = {table: {c: Described(state_type=k, kind=kind) for c, k, kind in types}}
    sql = ("SELECT t.id, extract(second from t.ts) AS s, extract(epoch from t.ts) AS e, "
           "extract(second from t.tz) AS zs, extract(epoch from t.tz) AS ze, "
           "date_part('second', t.ts) AS dp, extract(seconds from t.ts - t.tz) AS i, "
           "extract(minute from t.ts) AS m FROM t WHERE extract(second from t.ts) <> 30 "
           "OR t.ts IS NULL")
    changes = [BaseChange(table, json.dumps({"id": i}, separators=(",", ":")), bytes([i]),
                          {"id": i, "ts": ts, "tz": tz})
               for i, ts, tz in [(1, "2024-01-01T12:00:30.500000",
                                  "2024-01-01T12:00:30.250000Z"),
                                 (2, "2024-02-29T23:59:59.123457",
                                  "1969-12-31T23:59:58.999999Z"), (3, None, None)]]
    plan = analyze("x", sql, ["id"], "postgres", [table], lambda: described)
    state = ViewState(tmp_path / "x.duckdb", plan, lambda _t: [(c, k) for c, k, _ in types])
    try:
        state.apply(changes)
        held = {json.loads(k)["id"]: row for k, row in state.rows().items()}
        with pg_db.connect() as conn:
            conn.execute("SET TimeZone = 'UTC'")
            answers = conn.execute(sql).fetchall()
        assert sorted(held) == sorted(found[0] for found in answers) == [1, 2, 3]
        for found in answers:
            row = held[found[0]]
            for column, value in zip(list(row)[1:], found[1:], strict=True):
                mine = None if row[column] is None else Decimal(str(row[column]))
                theirs = None if value is None else Decimal(str(value))
                assert mine == theirs, (found[0], column, row[column], value)
    finally:
        state.close()


def test_postgres_round_of_a_double_is_half_to_even(tmp_path: Path, pg_db: Any) -> None:
    """PostgreSQL's ``round(float8)`` is ``rint()``: 2.5 rounds to 2 (DuckDB's ``round`` of a
    double: 3); ``round(numeric)`` rounds half away from zero in both. The view holds
    PostgreSQL's values, and keeps the rows PostgreSQL's WHERE keeps."""
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, f float8, x numeric(6,1))")
    rows = [(1, 2.5, "2.5"), (2, -2.5, "-2.5"), (3, 0.5, "0.5"), (4, 3.5, "3.5"), (5, None, None)]
    pg_db.execute("INSERT INTO t VALUES " + ", ".join(
        f"({i}, {'NULL' if f is None else f}, {'NULL' if x is None else x})" for i, f, x in rows))
    table = TableId("public", "t")
    types = [("id", "BIGINT", "int32"), ("f", "DOUBLE", "float64"), ("x", "DECIMAL(6,1)",
                                                                       "decimal")]
    described = {table: {c: Described(state_type=k, kind=kind) for c, k, kind in types}}
    sql = ("SELECT t.id, round(t.f) AS rf, round(t.f * 3) AS r3, round(t.x) AS rx FROM t "
           "WHERE round(t.f) <> 4 OR t.f IS NULL")
    changes = [BaseChange(table, json.dumps({"id": i}, separators=(",", ":")), bytes([i]),
                          {"id": i, "f": f, "x": x}) for i, f, x in rows]
    plan = analyze("r", sql, ["id"], "postgres", [table], lambda: described)
    state = ViewState(tmp_path / "r.duckdb", plan, lambda _t: [(c, k) for c, k, _ in types])
    try:
        state.apply(changes)
        held = {json.loads(k)["id"]: row for k, row in state.rows().items()}
        answers = pg_db.execute(sql)
        assert sorted(held) == sorted(found[0] for found in answers) == [1, 2, 3, 5]
        for found in answers:
            row = held[found[0]]
            for column, value in zip(list(row)[1:], found[1:], strict=True):
                assert (None if row[column] is None else float(row[column])) == \
                    (None if value is None else float(value)), (found[0], column, row, value)
    finally:
        state.close()


def test_mariadb_round_of_a_double_is_half_to_even(tmp_path: Path, mysql_db: Any) -> None:
    """MariaDB's ``ROUND`` of a DOUBLE rounds half to even too (``ROUND(2.5e0)`` is 2,
    ``ROUND(0.125e0, 2)`` 0.12), of a DECIMAL half away from zero (``ROUND(2.5)`` is 3)."""
    mysql_db.execute("CREATE TABLE t (id int PRIMARY KEY, f double, x decimal(6,3))")
    rows = [(1, 2.5, "2.500"), (2, -2.5, "-2.500"), (3, 0.125, "0.125"), (4, None, None)]
    mysql_db.execute("INSERT INTO t VALUES " + ", ".join(
        f"({i}, {'NULL' if f is None else f}, {'NULL' if x is None else x})" for i, f, x in rows))
    table = TableId(mysql_db.name, "t")
    types = [("id", "BIGINT", "int32"), ("f", "DOUBLE", "float64"), ("x", "DECIMAL(6,3)",
                                                                       "decimal")]
    described = {table: {c: Described(state_type=k, kind=kind) for c, k, kind in types}}
    sql = ("SELECT t.id, ROUND(t.f) AS rf, ROUND(t.f, 2) AS r2, ROUND(t.x) AS rx, "
           "ROUND(t.x, 2) AS x2 FROM t WHERE ROUND(t.f) <> 3 OR t.f IS NULL")
    changes = [BaseChange(table, json.dumps({"id": i}, separators=(",", ":")), bytes([i]),
                          {"id": i, "f": f, "x": x}) for i, f, x in rows]
    plan = analyze("r", sql, ["id"], "mysql", [table], lambda: described)
    state = ViewState(tmp_path / "r.duckdb", plan, lambda _t: [(c, k) for c, k, _ in types])
    try:
        state.apply(changes)
        held = {json.loads(k)["id"]: row for k, row in state.rows().items()}
        answers = list(mysql_db.execute(sql))
        assert sorted(held) == sorted(found[0] for found in answers) == [1, 2, 3, 4]
        for found in answers:
            row = held[found[0]]
            for column, value in zip(list(row)[1:], found[1:], strict=True):
                assert (None if row[column] is None else float(row[column])) == \
                    (None if value is None else float(value)), (found[0], column, row, value)
    finally:
        state.close()


def test_a_state_out_of_memory_names_the_views_memory_limit(tmp_path: Path) -> None:
    """DuckDB out of the view's ``memory_limit`` is a ViewError naming the setting to raise
    (not the schema-change fix of other SQL failures), and the batch left nothing behind."""
    table = TableId("public", "t")
    columns = [("id", "BIGINT"), ("g", "BIGINT"), ("s", "VARCHAR")]
    plan = analyze("tight", "SELECT t.s, count(DISTINCT t.g) AS n FROM public.t t GROUP BY t.s",
                   ["s"], "postgres", [table])
    plan.memory_limit = "8MB"
    state = ViewState(tmp_path / "tight.duckdb", plan, lambda _: columns)
    batch = [BaseChange(table, f'{{"id":{n}}}', n.to_bytes(8, "big"),
                        {"id": n, "g": n, "s": "x" * 200 + str(n % 50000)})
             for n in range(200_000)]
    with pytest.raises(ViewError) as raised:
        state.apply(batch)
    said = str(raised.value)
    assert "ran out of memory (8MB" in said and "views.tight.memory_limit" in said, said
    assert "schema" not in said and not state.rows() and not state.pending()
    state.close()
