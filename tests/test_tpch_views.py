"""The 22 TPC-H queries as views over a real PostgreSQL (issue 43, point 6).

The data is TPC-H's own at scale factor 0.01 (``tpchgen-cli``, the spec's generator rewritten
in Rust: 86,805 rows in the 8 tables, with the spec's types: ``CHAR(n)``, ``DECIMAL(15,2)``,
``DATE``). Six batches of the spec's refresh functions (RF1: new orders with 1-7 lineitems;
RF2: orders deleted with their lineitems), random updates of the columns the queries filter,
group and sum on, and updates aimed at the few rows the narrow queries show (a top-10 order,
Q15's top supplier, ...) go through ``cdc capture`` into every view (the differential fuzzer's
harness, ``tests/fuzz_views/harness.py``): each query's answer changes in two to six of the six
batches. After the snapshot and after each batch, every view the engine accepts must equal the
leader's answer to the same SQL; a query refused at check time is listed, not compared.

The queries are the spec's, with its validation parameters (section 2.4, "Qualification"; Q11's
FRACTION is 0.0001 / SF as the spec says), in PostgreSQL's SQL with table aliases. A query that
returns one row gets a constant key column (``1 AS one``).
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz_views.grammar import Query
from tests.fuzz_views.harness import Case, run_case

SCALE = 0.01
SEED = 43
BATCHES = 4
ROWS_PER_INSERT = 2000

#: the spec's tables (clause 1.4), columns in the generator's order, and primary keys
TABLES: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "region": ((("r_regionkey", "INTEGER"), ("r_name", "CHAR(25)"),
                ("r_comment", "VARCHAR(152)")), ("r_regionkey",)),
    "nation": ((("n_nationkey", "INTEGER"), ("n_name", "CHAR(25)"), ("n_regionkey", "INTEGER"),
                ("n_comment", "VARCHAR(152)")), ("n_nationkey",)),
    "supplier": ((("s_suppkey", "INTEGER"), ("s_name", "CHAR(25)"), ("s_address", "VARCHAR(40)"),
                  ("s_nationkey", "INTEGER"), ("s_phone", "CHAR(15)"),
                  ("s_acctbal", "DECIMAL(15,2)"), ("s_comment", "VARCHAR(101)")),
                 ("s_suppkey",)),
    "customer": ((("c_custkey", "INTEGER"), ("c_name", "VARCHAR(25)"),
                  ("c_address", "VARCHAR(40)"), ("c_nationkey", "INTEGER"),
                  ("c_phone", "CHAR(15)"), ("c_acctbal", "DECIMAL(15,2)"),
                  ("c_mktsegment", "CHAR(10)"), ("c_comment", "VARCHAR(117)")), ("c_custkey",)),
    "part": ((("p_partkey", "INTEGER"), ("p_name", "VARCHAR(55)"), ("p_mfgr", "CHAR(25)"),
              ("p_brand", "CHAR(10)"), ("p_type", "VARCHAR(25)"), ("p_size", "INTEGER"),
              ("p_container", "CHAR(10)"), ("p_retailprice", "DECIMAL(15,2)"),
              ("p_comment", "VARCHAR(23)")), ("p_partkey",)),
    "partsupp": ((("ps_partkey", "INTEGER"), ("ps_suppkey", "INTEGER"),
                  ("ps_availqty", "INTEGER"), ("ps_supplycost", "DECIMAL(15,2)"),
                  ("ps_comment", "VARCHAR(199)")), ("ps_partkey", "ps_suppkey")),
    "orders": ((("o_orderkey", "INTEGER"), ("o_custkey", "INTEGER"),
                ("o_orderstatus", "CHAR(1)"), ("o_totalprice", "DECIMAL(15,2)"),
                ("o_orderdate", "DATE"), ("o_orderpriority", "CHAR(15)"),
                ("o_clerk", "CHAR(15)"), ("o_shippriority", "INTEGER"),
                ("o_comment", "VARCHAR(79)")), ("o_orderkey",)),
    "lineitem": ((("l_orderkey", "INTEGER"), ("l_partkey", "INTEGER"), ("l_suppkey", "INTEGER"),
                  ("l_linenumber", "INTEGER"), ("l_quantity", "DECIMAL(15,2)"),
                  ("l_extendedprice", "DECIMAL(15,2)"), ("l_discount", "DECIMAL(15,2)"),
                  ("l_tax", "DECIMAL(15,2)"), ("l_returnflag", "CHAR(1)"),
                  ("l_linestatus", "CHAR(1)"), ("l_shipdate", "DATE"),
                  ("l_commitdate", "DATE"), ("l_receiptdate", "DATE"),
                  ("l_shipinstruct", "CHAR(25)"), ("l_shipmode", "CHAR(10)"),
                  ("l_comment", "VARCHAR(44)")), ("l_orderkey", "l_linenumber")),
}

NUMERIC = ("INTEGER", "DECIMAL(15,2)")
SEGMENTS = ("AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY")
PRIORITIES = ("1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW")
SHIPMODES = ("REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB")
INSTRUCTIONS = ("DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN")
CONTAINERS = tuple(f"{size} {kind}" for size in ("SM", "LG", "MED", "JUMBO", "WRAP")
                   for kind in ("CASE", "BOX", "BAG", "JAR", "PKG", "PACK", "CAN", "DRUM"))
CURRENT = date(1995, 6, 17)  # the spec's CURRENTDATE: a lineitem's flag and status


def _one_line(sql: str) -> str:
    return " ".join(sql.split())  # no literal below holds two blanks in a row


def _where(sql: str) -> str:
    """The WHERE clause of a query with one (not its subqueries'), without its GROUP BY."""
    return sql.split(" WHERE ", 1)[1].split(" GROUP BY ", 1)[0]


#: (name, SQL, key, ORDER BY ... LIMIT)
QUERIES: tuple[tuple[str, str, tuple[str, ...], bool], ...] = (
    ("q01", """
SELECT l.l_returnflag, l.l_linestatus, sum(l.l_quantity) AS sum_qty,
  sum(l.l_extendedprice) AS sum_base_price,
  sum(l.l_extendedprice * (1 - l.l_discount)) AS sum_disc_price,
  sum(l.l_extendedprice * (1 - l.l_discount) * (1 + l.l_tax)) AS sum_charge,
  avg(l.l_quantity) AS avg_qty, avg(l.l_extendedprice) AS avg_price,
  avg(l.l_discount) AS avg_disc, count(*) AS count_order
FROM lineitem l
WHERE l.l_shipdate <= DATE '1998-12-01' - INTERVAL '90' DAY
GROUP BY l.l_returnflag, l.l_linestatus
ORDER BY l.l_returnflag, l.l_linestatus""", ("l_returnflag", "l_linestatus"), False),
    ("q02", """
SELECT s.s_acctbal, s.s_name, n.n_name, p.p_partkey, p.p_mfgr, s.s_address, s.s_phone,
  s.s_comment
FROM part p, supplier s, partsupp ps, nation n, region r
WHERE p.p_partkey = ps.ps_partkey AND s.s_suppkey = ps.ps_suppkey AND p.p_size = 15
  AND p.p_type LIKE '%BRASS' AND s.s_nationkey = n.n_nationkey
  AND n.n_regionkey = r.r_regionkey AND r.r_name = 'EUROPE'
  AND ps.ps_supplycost = (
    SELECT min(ps2.ps_supplycost) FROM partsupp ps2, supplier s2, nation n2, region r2
    WHERE p.p_partkey = ps2.ps_partkey AND s2.s_suppkey = ps2.ps_suppkey
      AND s2.s_nationkey = n2.n_nationkey AND n2.n_regionkey = r2.r_regionkey
      AND r2.r_name = 'EUROPE')
ORDER BY s.s_acctbal DESC, n.n_name, s.s_name, p.p_partkey
LIMIT 100""", ("s_name", "p_partkey"), True),
    ("q03", """
SELECT l.l_orderkey, sum(l.l_extendedprice * (1 - l.l_discount)) AS revenue, o.o_orderdate,
  o.o_shippriority
FROM customer c, orders o, lineitem l
WHERE c.c_mktsegment = 'BUILDING' AND c.c_custkey = o.o_custkey
  AND l.l_orderkey = o.o_orderkey AND o.o_orderdate < DATE '1995-03-15'
  AND l.l_shipdate > DATE '1995-03-15'
GROUP BY l.l_orderkey, o.o_orderdate, o.o_shippriority
ORDER BY revenue DESC, o.o_orderdate
LIMIT 10""", ("l_orderkey", "o_orderdate", "o_shippriority"), True),
    ("q04", """
SELECT o.o_orderpriority, count(*) AS order_count
FROM orders o
WHERE o.o_orderdate >= DATE '1993-07-01'
  AND o.o_orderdate < DATE '1993-07-01' + INTERVAL '3' MONTH
  AND EXISTS (SELECT * FROM lineitem l
              WHERE l.l_orderkey = o.o_orderkey AND l.l_commitdate < l.l_receiptdate)
GROUP BY o.o_orderpriority
ORDER BY o.o_orderpriority""", ("o_orderpriority",), False),
    ("q05", """
SELECT n.n_name, sum(l.l_extendedprice * (1 - l.l_discount)) AS revenue
FROM customer c, orders o, lineitem l, supplier s, nation n, region r
WHERE c.c_custkey = o.o_custkey AND l.l_orderkey = o.o_orderkey
  AND l.l_suppkey = s.s_suppkey AND c.c_nationkey = s.s_nationkey
  AND s.s_nationkey = n.n_nationkey AND n.n_regionkey = r.r_regionkey
  AND r.r_name = 'ASIA' AND o.o_orderdate >= DATE '1994-01-01'
  AND o.o_orderdate < DATE '1994-01-01' + INTERVAL '1' YEAR
GROUP BY n.n_name
ORDER BY revenue DESC""", ("n_name",), False),
    ("q06", """
SELECT 1 AS one, sum(l.l_extendedprice * l.l_discount) AS revenue
FROM lineitem l
WHERE l.l_shipdate >= DATE '1994-01-01'
  AND l.l_shipdate < DATE '1994-01-01' + INTERVAL '1' YEAR
  AND l.l_discount BETWEEN 0.06 - 0.01 AND 0.06 + 0.01 AND l.l_quantity < 24""",
     ("one",), False),
    ("q07", """
SELECT shipping.supp_nation, shipping.cust_nation, shipping.l_year,
  sum(shipping.volume) AS revenue
FROM (
  SELECT n1.n_name AS supp_nation, n2.n_name AS cust_nation,
    extract(year FROM l.l_shipdate) AS l_year,
    l.l_extendedprice * (1 - l.l_discount) AS volume
  FROM supplier s, lineitem l, orders o, customer c, nation n1, nation n2
  WHERE s.s_suppkey = l.l_suppkey AND o.o_orderkey = l.l_orderkey
    AND c.c_custkey = o.o_custkey AND s.s_nationkey = n1.n_nationkey
    AND c.c_nationkey = n2.n_nationkey
    AND ((n1.n_name = 'FRANCE' AND n2.n_name = 'GERMANY')
      OR (n1.n_name = 'GERMANY' AND n2.n_name = 'FRANCE'))
    AND l.l_shipdate BETWEEN DATE '1995-01-01' AND DATE '1996-12-31') AS shipping
GROUP BY shipping.supp_nation, shipping.cust_nation, shipping.l_year
ORDER BY shipping.supp_nation, shipping.cust_nation, shipping.l_year""",
     ("supp_nation", "cust_nation", "l_year"), False),
    ("q08", """
SELECT all_nations.o_year,
  sum(CASE WHEN all_nations.nation = 'BRAZIL' THEN all_nations.volume ELSE 0 END)
    / sum(all_nations.volume) AS mkt_share
FROM (
  SELECT extract(year FROM o.o_orderdate) AS o_year,
    l.l_extendedprice * (1 - l.l_discount) AS volume, n2.n_name AS nation
  FROM part p, supplier s, lineitem l, orders o, customer c, nation n1, nation n2, region r
  WHERE p.p_partkey = l.l_partkey AND s.s_suppkey = l.l_suppkey
    AND l.l_orderkey = o.o_orderkey AND o.o_custkey = c.c_custkey
    AND c.c_nationkey = n1.n_nationkey AND n1.n_regionkey = r.r_regionkey
    AND r.r_name = 'AMERICA' AND s.s_nationkey = n2.n_nationkey
    AND o.o_orderdate BETWEEN DATE '1995-01-01' AND DATE '1996-12-31'
    AND p.p_type = 'ECONOMY ANODIZED STEEL') AS all_nations
GROUP BY all_nations.o_year
ORDER BY all_nations.o_year""", ("o_year",), False),
    ("q09", """
SELECT profit.nation, profit.o_year, sum(profit.amount) AS sum_profit
FROM (
  SELECT n.n_name AS nation, extract(year FROM o.o_orderdate) AS o_year,
    l.l_extendedprice * (1 - l.l_discount) - ps.ps_supplycost * l.l_quantity AS amount
  FROM part p, supplier s, lineitem l, partsupp ps, orders o, nation n
  WHERE s.s_suppkey = l.l_suppkey AND ps.ps_suppkey = l.l_suppkey
    AND ps.ps_partkey = l.l_partkey AND p.p_partkey = l.l_partkey
    AND o.o_orderkey = l.l_orderkey AND s.s_nationkey = n.n_nationkey
    AND p.p_name LIKE '%green%') AS profit
GROUP BY profit.nation, profit.o_year
ORDER BY profit.nation, profit.o_year DESC""", ("nation", "o_year"), False),
    ("q10", """
SELECT c.c_custkey, c.c_name, sum(l.l_extendedprice * (1 - l.l_discount)) AS revenue,
  c.c_acctbal, n.n_name, c.c_address, c.c_phone, c.c_comment
FROM customer c, orders o, lineitem l, nation n
WHERE c.c_custkey = o.o_custkey AND l.l_orderkey = o.o_orderkey
  AND o.o_orderdate >= DATE '1993-10-01'
  AND o.o_orderdate < DATE '1993-10-01' + INTERVAL '3' MONTH
  AND l.l_returnflag = 'R' AND c.c_nationkey = n.n_nationkey
GROUP BY c.c_custkey, c.c_name, c.c_acctbal, c.c_phone, n.n_name, c.c_address, c.c_comment
ORDER BY revenue DESC
LIMIT 20""", ("c_custkey",), True),
    ("q11", f"""
SELECT ps.ps_partkey, sum(ps.ps_supplycost * ps.ps_availqty) AS value
FROM partsupp ps, supplier s, nation n
WHERE ps.ps_suppkey = s.s_suppkey AND s.s_nationkey = n.n_nationkey AND n.n_name = 'GERMANY'
GROUP BY ps.ps_partkey
HAVING sum(ps.ps_supplycost * ps.ps_availqty) > (
  SELECT sum(ps2.ps_supplycost * ps2.ps_availqty) * {0.0001 / SCALE:.4f}
  FROM partsupp ps2, supplier s2, nation n2
  WHERE ps2.ps_suppkey = s2.s_suppkey AND s2.s_nationkey = n2.n_nationkey
    AND n2.n_name = 'GERMANY')
ORDER BY value DESC""", ("ps_partkey",), False),
    ("q12", """
SELECT l.l_shipmode,
  sum(CASE WHEN o.o_orderpriority = '1-URGENT' OR o.o_orderpriority = '2-HIGH'
      THEN 1 ELSE 0 END) AS high_line_count,
  sum(CASE WHEN o.o_orderpriority <> '1-URGENT' AND o.o_orderpriority <> '2-HIGH'
      THEN 1 ELSE 0 END) AS low_line_count
FROM orders o, lineitem l
WHERE o.o_orderkey = l.l_orderkey AND l.l_shipmode IN ('MAIL', 'SHIP')
  AND l.l_commitdate < l.l_receiptdate AND l.l_shipdate < l.l_commitdate
  AND l.l_receiptdate >= DATE '1994-01-01'
  AND l.l_receiptdate < DATE '1994-01-01' + INTERVAL '1' YEAR
GROUP BY l.l_shipmode
ORDER BY l.l_shipmode""", ("l_shipmode",), False),
    ("q13", """
SELECT c_orders.c_count, count(*) AS custdist
FROM (
  SELECT c.c_custkey, count(o.o_orderkey)
  FROM customer c LEFT OUTER JOIN orders o
    ON c.c_custkey = o.o_custkey AND o.o_comment NOT LIKE '%special%requests%'
  GROUP BY c.c_custkey) AS c_orders (c_custkey, c_count)
GROUP BY c_orders.c_count
ORDER BY custdist DESC, c_orders.c_count DESC""", ("c_count",), False),
    ("q14", """
SELECT 1 AS one,
  100.00 * sum(CASE WHEN p.p_type LIKE 'PROMO%'
                    THEN l.l_extendedprice * (1 - l.l_discount) ELSE 0 END)
    / sum(l.l_extendedprice * (1 - l.l_discount)) AS promo_revenue
FROM lineitem l, part p
WHERE l.l_partkey = p.p_partkey AND l.l_shipdate >= DATE '1995-09-01'
  AND l.l_shipdate < DATE '1995-09-01' + INTERVAL '1' MONTH""", ("one",), False),
    ("q15", """
WITH revenue0 (supplier_no, total_revenue) AS (
  SELECT l.l_suppkey, sum(l.l_extendedprice * (1 - l.l_discount))
  FROM lineitem l
  WHERE l.l_shipdate >= DATE '1996-01-01'
    AND l.l_shipdate < DATE '1996-01-01' + INTERVAL '3' MONTH
  GROUP BY l.l_suppkey)
SELECT s.s_suppkey, s.s_name, s.s_address, s.s_phone, r.total_revenue
FROM supplier s, revenue0 r
WHERE s.s_suppkey = r.supplier_no
  AND r.total_revenue = (SELECT max(r2.total_revenue) FROM revenue0 r2)
ORDER BY s.s_suppkey""", ("s_suppkey",), False),
    ("q16", """
SELECT p.p_brand, p.p_type, p.p_size, count(DISTINCT ps.ps_suppkey) AS supplier_cnt
FROM partsupp ps, part p
WHERE p.p_partkey = ps.ps_partkey AND p.p_brand <> 'Brand#45'
  AND p.p_type NOT LIKE 'MEDIUM POLISHED%' AND p.p_size IN (49, 14, 23, 45, 19, 3, 36, 9)
  AND ps.ps_suppkey NOT IN (
    SELECT s.s_suppkey FROM supplier s WHERE s.s_comment LIKE '%Customer%Complaints%')
GROUP BY p.p_brand, p.p_type, p.p_size
ORDER BY supplier_cnt DESC, p.p_brand, p.p_type, p.p_size""",
     ("p_brand", "p_type", "p_size"), False),
    ("q17", """
SELECT 1 AS one, sum(l.l_extendedprice) / 7.0 AS avg_yearly
FROM lineitem l, part p
WHERE p.p_partkey = l.l_partkey AND p.p_brand = 'Brand#23' AND p.p_container = 'MED BOX'
  AND l.l_quantity < (
    SELECT 0.2 * avg(l2.l_quantity) FROM lineitem l2 WHERE l2.l_partkey = p.p_partkey)""",
     ("one",), False),
    ("q18", """
SELECT c.c_name, c.c_custkey, o.o_orderkey, o.o_orderdate, o.o_totalprice,
  sum(l.l_quantity) AS sum_qty
FROM customer c, orders o, lineitem l
WHERE o.o_orderkey IN (
    SELECT l2.l_orderkey FROM lineitem l2 GROUP BY l2.l_orderkey
    HAVING sum(l2.l_quantity) > 300)
  AND c.c_custkey = o.o_custkey AND o.o_orderkey = l.l_orderkey
GROUP BY c.c_name, c.c_custkey, o.o_orderkey, o.o_orderdate, o.o_totalprice
ORDER BY o.o_totalprice DESC, o.o_orderdate
LIMIT 100""", ("o_orderkey",), True),
    ("q19", """
SELECT 1 AS one, sum(l.l_extendedprice * (1 - l.l_discount)) AS revenue
FROM lineitem l, part p
WHERE (p.p_partkey = l.l_partkey AND p.p_brand = 'Brand#12'
       AND p.p_container IN ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG')
       AND l.l_quantity >= 1 AND l.l_quantity <= 1 + 10 AND p.p_size BETWEEN 1 AND 5
       AND l.l_shipmode IN ('AIR', 'AIR REG') AND l.l_shipinstruct = 'DELIVER IN PERSON')
   OR (p.p_partkey = l.l_partkey AND p.p_brand = 'Brand#23'
       AND p.p_container IN ('MED BAG', 'MED BOX', 'MED PKG', 'MED PACK')
       AND l.l_quantity >= 10 AND l.l_quantity <= 10 + 10 AND p.p_size BETWEEN 1 AND 10
       AND l.l_shipmode IN ('AIR', 'AIR REG') AND l.l_shipinstruct = 'DELIVER IN PERSON')
   OR (p.p_partkey = l.l_partkey AND p.p_brand = 'Brand#34'
       AND p.p_container IN ('LG CASE', 'LG BOX', 'LG PACK', 'LG PKG')
       AND l.l_quantity >= 20 AND l.l_quantity <= 20 + 10 AND p.p_size BETWEEN 1 AND 15
       AND l.l_shipmode IN ('AIR', 'AIR REG') AND l.l_shipinstruct = 'DELIVER IN PERSON')""",
     ("one",), False),
    ("q20", """
SELECT s.s_name, s.s_address
FROM supplier s, nation n
WHERE s.s_suppkey IN (
    SELECT ps.ps_suppkey FROM partsupp ps
    WHERE ps.ps_partkey IN (SELECT p.p_partkey FROM part p WHERE p.p_name LIKE 'forest%')
      AND ps.ps_availqty > (
        SELECT 0.5 * sum(l.l_quantity) FROM lineitem l
        WHERE l.l_partkey = ps.ps_partkey AND l.l_suppkey = ps.ps_suppkey
          AND l.l_shipdate >= DATE '1994-01-01'
          AND l.l_shipdate < DATE '1994-01-01' + INTERVAL '1' YEAR))
  AND s.s_nationkey = n.n_nationkey AND n.n_name = 'CANADA'
ORDER BY s.s_name""", ("s_name",), False),
    ("q21", """
SELECT s.s_name, count(*) AS numwait
FROM supplier s, lineitem l1, orders o, nation n
WHERE s.s_suppkey = l1.l_suppkey AND o.o_orderkey = l1.l_orderkey
  AND o.o_orderstatus = 'F' AND l1.l_receiptdate > l1.l_commitdate
  AND EXISTS (SELECT * FROM lineitem l2
              WHERE l2.l_orderkey = l1.l_orderkey AND l2.l_suppkey <> l1.l_suppkey)
  AND NOT EXISTS (SELECT * FROM lineitem l3
                  WHERE l3.l_orderkey = l1.l_orderkey AND l3.l_suppkey <> l1.l_suppkey
                    AND l3.l_receiptdate > l3.l_commitdate)
  AND s.s_nationkey = n.n_nationkey AND n.n_name = 'SAUDI ARABIA'
GROUP BY s.s_name
ORDER BY numwait DESC, s.s_name
LIMIT 100""", ("s_name",), True),
    ("q22", """
SELECT custsale.cntrycode, count(*) AS numcust, sum(custsale.c_acctbal) AS totacctbal
FROM (
  SELECT substring(c.c_phone FROM 1 FOR 2) AS cntrycode, c.c_acctbal
  FROM customer c
  WHERE substring(c.c_phone FROM 1 FOR 2) IN ('13', '31', '23', '29', '30', '18', '17')
    AND c.c_acctbal > (
      SELECT avg(c2.c_acctbal) FROM customer c2
      WHERE c2.c_acctbal > 0.00
        AND substring(c2.c_phone FROM 1 FOR 2) IN ('13', '31', '23', '29', '30', '18', '17'))
    AND NOT EXISTS (SELECT * FROM orders o WHERE o.o_custkey = c.c_custkey)) AS custsale
GROUP BY custsale.cntrycode
ORDER BY custsale.cntrycode""", ("cntrycode",), False),
)


# ------------------------------------------------------------------------------------ data

@pytest.fixture(scope="module")
def tpch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[list[str]]]:
    """TPC-H's rows at :data:`SCALE`, per table, as the generator's texts."""
    directory = tmp_path_factory.mktemp("tpch")
    tool = Path(sys.executable).parent / "tpchgen-cli"
    done = subprocess.run([str(tool), "tbl", "--scale-factor", str(SCALE), "--output-dir",
                           str(directory), "--quiet"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    tables = {}
    for name, (columns, _key) in TABLES.items():
        lines = (directory / f"{name}.tbl").read_text().splitlines()
        tables[name] = [line.split("|")[:len(columns)] for line in lines]
    return tables


def _literal(value: Any, kind: str) -> str:
    if kind in NUMERIC:
        return str(value)
    if kind == "DATE":
        return f"DATE '{value}'"
    return "'" + str(value).replace("'", "''") + "'"


def _inserts(name: str, rows: list[list[Any]]) -> Iterator[str]:
    columns = TABLES[name][0]
    for start in range(0, len(rows), ROWS_PER_INSERT):
        values = ", ".join(
            "(" + ", ".join(_literal(v, kind) for v, (_c, kind) in zip(row, columns,
                                                                       strict=True)) + ")"
            for row in rows[start:start + ROWS_PER_INSERT])
        yield f"INSERT INTO {name} VALUES {values}"


def _ddl() -> list[str]:
    return [f"CREATE TABLE {name} ("
            + ", ".join(f"{column} {kind} NOT NULL" for column, kind in columns)
            + f", PRIMARY KEY ({', '.join(key)}))"
            for name, (columns, key) in TABLES.items()]


# --------------------------------------------------------------------------------- batches

class Refresh:
    """RF1, RF2 and updates over the rows loaded, deterministic from ``seed``."""

    def __init__(self, tables: dict[str, list[list[str]]], seed: int) -> None:
        self.rng = random.Random(seed)
        self.prices = {int(row[0]): row[7] for row in tables["part"]}
        self.suppliers = len(tables["supplier"])
        self.customers = len(tables["customer"])
        self.lines: dict[int, list[int]] = {}
        for row in tables["lineitem"]:
            self.lines.setdefault(int(row[0]), []).append(int(row[3]))
        self.next_order = max(self.lines) + 1
        self.partsupp = [(int(row[0]), int(row[1])) for row in tables["partsupp"]]

    def _supplier(self, part: int) -> int:
        """One of the part's four suppliers (clause 4.2.3, L_SUPPKEY)."""
        s = self.suppliers
        return (part + self.rng.randrange(4) * (s // 4 + (part - 1) // s)) % s + 1

    def rf1(self, orders: int) -> list[str]:
        """New orders with 1-7 lineitems, keys beyond the largest; the first one big enough
        for Q18 (quantity over 300), some of customers that had none (Q13, Q22)."""
        rng = self.rng
        statements: list[str] = []
        for number in range(orders):
            key, self.next_order = self.next_order, self.next_order + rng.randint(1, 8)
            ordered = date(1992, 1, 1) + timedelta(days=rng.randrange(2405))
            big = number == 0
            lines: list[list[Any]] = []
            statuses: set[str] = set()
            total = 0.0
            for line in range(1, (7 if big else rng.randint(1, 7)) + 1):
                part = rng.randint(1, len(self.prices))
                quantity = rng.randint(45, 50) if big else rng.randint(1, 50)
                price = round(quantity * float(self.prices[part]), 2)
                discount, tax = rng.randint(0, 10) / 100, rng.randint(0, 8) / 100
                shipped = ordered + timedelta(days=rng.randint(1, 121))
                committed = ordered + timedelta(days=rng.randint(30, 90))
                received = shipped + timedelta(days=rng.randint(1, 30))
                flag = rng.choice("RA") if received <= CURRENT else "N"
                status = "O" if shipped > CURRENT else "F"
                statuses.add(status)
                total += price * (1 + tax) * (1 - discount)
                lines.append([key, part, self._supplier(part), line, quantity, f"{price:.2f}",
                              f"{discount:.2f}", f"{tax:.2f}", flag, status, shipped,
                              committed, received, rng.choice(INSTRUCTIONS),
                              rng.choice(SHIPMODES), "new line"])
            customer = rng.randint(1, self.customers)
            if rng.random() < 0.7:  # mostly customers with orders: the spec leaves every
                customer = rng.randrange(0, self.customers, 3) + 1  # third one without
            state = statuses.pop() if len(statuses) == 1 else "P"
            comment = rng.choice(("new order", "special new requests"))
            statements += _inserts("orders", [[key, customer, state, f"{total:.2f}", ordered,
                                               rng.choice(PRIORITIES),
                                               f"Clerk#{rng.randint(1, 10):09d}", 0, comment]])
            statements += _inserts("lineitem", lines)
            self.lines[key] = list(range(1, len(lines) + 1))
        return statements

    def rf2(self, orders: int) -> list[str]:
        """Existing orders deleted, their lineitems first."""
        keys = sorted(self.rng.sample(sorted(self.lines), orders))
        for key in keys:
            del self.lines[key]
        listed = ", ".join(map(str, keys))
        return [f"DELETE FROM lineitem WHERE l_orderkey IN ({listed})",
                f"DELETE FROM orders WHERE o_orderkey IN ({listed})"]

    def updates(self, count: int) -> list[str]:
        rng = self.rng
        out = []
        orders = sorted(self.lines)
        for _ in range(count):
            order = rng.choice(orders)
            line = rng.choice(self.lines[order])
            item = f"l_orderkey = {order} AND l_linenumber = {line}"
            part = rng.randint(1, len(self.prices))
            supplier = rng.randint(1, self.suppliers)
            customer = rng.randint(1, self.customers)
            ps_part, ps_supplier = rng.choice(self.partsupp)
            out.append(rng.choice((
                f"UPDATE lineitem SET l_discount = {rng.randint(0, 10) / 100:.2f} WHERE {item}",
                f"UPDATE lineitem SET l_quantity = {rng.randint(1, 50)} WHERE {item}",
                f"UPDATE lineitem SET l_shipmode = '{rng.choice(SHIPMODES)}' WHERE {item}",
                f"UPDATE lineitem SET l_receiptdate = l_commitdate + {rng.randint(-5, 5)} "
                f"WHERE {item}",
                f"UPDATE orders SET o_orderpriority = '{rng.choice(PRIORITIES)}' "
                f"WHERE o_orderkey = {order}",
                f"UPDATE orders SET o_orderdate = o_orderdate + {rng.randint(-60, 60)} "
                f"WHERE o_orderkey = {order}",
                f"UPDATE customer SET c_mktsegment = '{rng.choice(SEGMENTS)}' "
                f"WHERE c_custkey = {customer}",
                f"UPDATE customer SET c_acctbal = {rng.uniform(-999.99, 9999.99):.2f} "
                f"WHERE c_custkey = {customer}",
                f"UPDATE part SET p_brand = 'Brand#{rng.randint(1, 5)}{rng.randint(1, 5)}' "
                f"WHERE p_partkey = {part}",
                f"UPDATE part SET p_container = '{rng.choice(CONTAINERS)}' "
                f"WHERE p_partkey = {part}",
                f"UPDATE partsupp SET ps_supplycost = {rng.uniform(1, 1000):.2f} "
                f"WHERE ps_partkey = {ps_part} AND ps_suppkey = {ps_supplier}",
                f"UPDATE partsupp SET ps_availqty = {rng.randint(1, 9999)} "
                f"WHERE ps_partkey = {ps_part} AND ps_suppkey = {ps_supplier}",
                f"UPDATE supplier SET s_acctbal = {rng.uniform(-999.99, 9999.99):.2f} "
                f"WHERE s_suppkey = {supplier}",
                f"UPDATE supplier SET s_comment = 'Customer slow Complaints' "
                f"WHERE s_suppkey = {supplier}",
            )))
        return out

    def aimed(self) -> list[str]:
        """Updates aimed at the rows the narrow queries show (random ones rarely touch a
        top-10 order, the top supplier or Germany's part values): each picks its rows by a
        query's own SQL or predicate on the leader, at an offset drawn here."""
        rng = self.rng
        sql = {name: _one_line(text) for name, text, _key, _limited in QUERIES}
        nth = "ORDER BY 1, 2 OFFSET {} LIMIT 1"
        return [
            # q03, q10, q18, q21: a row of the top-N changes or leaves it
            f"UPDATE lineitem SET l_discount = {rng.randint(0, 10) / 100:.2f} WHERE l_orderkey "
            f"= (SELECT t.l_orderkey FROM ({sql['q03']}) t ORDER BY t.revenue DESC, "
            f"t.l_orderkey OFFSET {rng.randrange(10)} LIMIT 1)",
            "UPDATE lineitem SET l_returnflag = 'A' WHERE l_returnflag = 'R' AND l_orderkey IN "
            "(SELECT o.o_orderkey FROM orders o WHERE o.o_custkey = (SELECT t.c_custkey FROM "
            f"({sql['q10']}) t ORDER BY t.revenue DESC, t.c_custkey OFFSET "
            f"{rng.randrange(20)} LIMIT 1))",
            "UPDATE lineitem SET l_quantity = 1 WHERE l_linenumber = 1 AND l_orderkey = (SELECT "
            f"t.o_orderkey FROM ({sql['q18']}) t ORDER BY t.o_orderkey OFFSET "
            f"{rng.randrange(3)} LIMIT 1)",
            "UPDATE lineitem SET l_receiptdate = l_commitdate WHERE (l_orderkey, l_linenumber) "
            "= (SELECT l1.l_orderkey, l1.l_linenumber FROM supplier s, lineitem l1, orders o, "
            "nation n WHERE " + _where(sql["q21"]) + f" {nth.format(rng.randrange(3))})",
            # q15: the top supplier's quarter moves to the next one
            "UPDATE lineitem SET l_shipdate = l_shipdate + 91 WHERE l_suppkey = (SELECT "
            f"t.s_suppkey FROM ({sql['q15']}) t ORDER BY t.s_suppkey LIMIT 1) AND l_shipdate "
            ">= DATE '1996-01-01' AND l_shipdate < DATE '1996-04-01'",
            # q11: its top part's value drops, a German part's jumps over the threshold
            "UPDATE partsupp SET ps_supplycost = 1.00 WHERE ps_partkey = (SELECT t.ps_partkey "
            f"FROM ({sql['q11']}) t ORDER BY t.value DESC LIMIT 1)",
            "UPDATE partsupp SET ps_availqty = 9999, ps_supplycost = 1000.00 "
            "WHERE (ps_partkey, ps_suppkey) = (SELECT ps.ps_partkey, ps.ps_suppkey FROM "
            "partsupp ps, supplier s, nation n WHERE ps.ps_suppkey = s.s_suppkey AND "
            "s.s_nationkey = n.n_nationkey AND n.n_name = 'GERMANY' "
            f"{nth.format(rng.randrange(300))})",
            # q02: a European supplier of a brass part of size 15 becomes its cheapest, or not
            f"UPDATE partsupp SET ps_supplycost = {rng.choice(('1.00', '999.00'))} WHERE "
            "(ps_partkey, ps_suppkey) = (SELECT ps.ps_partkey, ps.ps_suppkey FROM part p, "
            "partsupp ps, supplier s, nation n, region r WHERE p.p_size = 15 AND p.p_type LIKE "
            "'%BRASS' AND ps.ps_partkey = p.p_partkey AND ps.ps_suppkey = s.s_suppkey AND "
            "s.s_nationkey = n.n_nationkey AND n.n_regionkey = r.r_regionkey AND r.r_name = "
            f"'EUROPE' {nth.format(rng.randrange(6))})",
            # q20: a Canadian supplier of a forest part has plenty, or none
            f"UPDATE partsupp SET ps_availqty = {rng.choice((1, 9999))} WHERE (ps_partkey, "
            "ps_suppkey) = (SELECT ps.ps_partkey, ps.ps_suppkey FROM partsupp ps, part p, "
            "supplier s, nation n WHERE ps.ps_partkey = p.p_partkey AND p.p_name LIKE "
            "'forest%' AND ps.ps_suppkey = s.s_suppkey AND s.s_nationkey = n.n_nationkey AND "
            f"n.n_name = 'CANADA' {nth.format(rng.randrange(3))})",
            # q07, q19: a lineitem each reads
            f"UPDATE lineitem SET l_discount = {rng.randint(0, 10) / 100:.2f} WHERE (l_orderkey, "
            "l_linenumber) = (SELECT l.l_orderkey, l.l_linenumber FROM supplier s, lineitem l, "
            "orders o, customer c, nation n1, nation n2 WHERE s.s_suppkey = l.l_suppkey AND "
            "o.o_orderkey = l.l_orderkey AND c.c_custkey = o.o_custkey AND s.s_nationkey = "
            "n1.n_nationkey AND c.c_nationkey = n2.n_nationkey AND n1.n_name IN ('FRANCE', "
            "'GERMANY') AND n2.n_name IN ('FRANCE', 'GERMANY') AND l.l_shipdate BETWEEN "
            f"DATE '1995-01-01' AND DATE '1996-12-31' {nth.format(rng.randrange(100))})",
            f"UPDATE lineitem SET l_discount = {rng.randint(0, 10) / 100:.2f} WHERE (l_orderkey, "
            "l_linenumber) = (SELECT l.l_orderkey, l.l_linenumber FROM lineitem l, part p "
            f"WHERE {_where(sql['q19'])} {nth.format(0)})",
            "UPDATE lineitem SET l_shipmode = 'AIR', l_shipinstruct = 'DELIVER IN PERSON' "
            "WHERE (l_orderkey, l_linenumber) = (SELECT l.l_orderkey, l.l_linenumber FROM "
            "lineitem l, part p WHERE p.p_partkey = l.l_partkey AND p.p_brand = 'Brand#12' AND "
            "p.p_container IN ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG') AND p.p_size BETWEEN "
            f"1 AND 5 AND l.l_quantity BETWEEN 1 AND 11 {nth.format(rng.randrange(10))})",
            # q08: a part a Brazilian supplier sold in America in 1995-96 becomes its type
            "UPDATE part SET p_type = 'ECONOMY ANODIZED STEEL' WHERE p_partkey = (SELECT "
            "l.l_partkey FROM lineitem l, supplier s, nation n2, orders o, customer c, nation "
            "n1, region r WHERE s.s_suppkey = l.l_suppkey AND s.s_nationkey = n2.n_nationkey "
            "AND n2.n_name = 'BRAZIL' AND l.l_orderkey = o.o_orderkey AND o.o_custkey = "
            "c.c_custkey AND c.c_nationkey = n1.n_nationkey AND n1.n_regionkey = r.r_regionkey "
            "AND r.r_name = 'AMERICA' AND o.o_orderdate BETWEEN DATE '1995-01-01' AND "
            f"DATE '1996-12-31' ORDER BY l.l_orderkey, l.l_linenumber "
            f"OFFSET {rng.randrange(20)} LIMIT 1)",
            # q17: a part becomes one it reads
            "UPDATE part SET p_brand = 'Brand#23', p_container = 'MED BOX' "
            f"WHERE p_partkey = {rng.randint(1, len(self.prices))}",
            # q22: a customer without orders, in one of its countries
            f"UPDATE customer SET c_acctbal = {rng.uniform(-999.99, 9999.99):.2f} WHERE "
            "c_custkey = (SELECT c.c_custkey FROM customer c WHERE substring(c.c_phone FROM 1 "
            "FOR 2) IN ('13', '31', '23', '29', '30', '18', '17') AND c.c_custkey % 3 = 0 "
            f"ORDER BY 1 OFFSET {rng.randrange(100)} LIMIT 1)",
        ]

    def batch(self) -> list[str]:
        return [*self.rf1(15), *self.rf2(15), *self.updates(60), *self.aimed()]


def tpch_case(tables: dict[str, list[list[str]]]) -> Case:
    refresh = Refresh(tables, SEED)
    initial = [statement for name in TABLES for statement in _inserts(name, tables[name])]
    return Case("postgres", _ddl(), initial, [refresh.batch() for _ in range(BATCHES)],
                [Query(name, _one_line(sql), key, limited)
                 for name, sql, key, limited in QUERIES])


# ------------------------------------------------------------------------------------ test

def test_tpch_queries_as_views_equal_postgres(tpch: dict[str, list[list[str]]],
                                              pg_cluster: Any, tmp_path: Path) -> None:
    case = tpch_case(tpch)
    started = time.monotonic()
    report = run_case(case, pg_cluster, tmp_path / "world")
    report.seed = SEED
    print(f"\n{report.summary()} in {time.monotonic() - started:.1f} s")
    print("refused at check time:" + ("" if report.refused else " none"))
    for name, why in sorted(report.refused.items()):
        print(f"  {name:4} {why}")
    assert not report.mismatches, "\n".join(f"{q.name} after batch {n}: {text}"
                                            for q, n, text in report.mismatches)
    assert not report.refused, report.refused  # all 22 run on the leader and the state
    print("incremental: " + " ".join(sorted(report.incremental)))
    print("keys recomputed over the batches (of them revisited as a scalar subquery moved): "
          + ", ".join(f"{name} {report.affected.get(name, 0)} ({report.revisited[name]})"
                      for name in sorted(report.revisited) if report.revisited[name]))
    # aggregates without GROUP BY are kept as running totals, [NOT] EXISTS, NOT IN and scalar
    # subqueries as joins to grouped subqueries, ORDER BY ... LIMIT as the first rows and a
    # buffer, subqueries within subqueries kept each as a table of the state: all 22
    assert set(report.incremental) == {name for name, *_ in QUERIES}, report.incremental
    assert len(report.accepted) == len(QUERIES)
    assert report.comparisons == len(report.accepted) * (BATCHES + 1), report.summary()


#: the queries ``cdc apply`` keeps in the end-to-end test: all 22, one apply reading the log once
#: for every view (blank-padded CHAR filters, keys of ``extract``, column lists, WITH, one-row
#: views, top-k ...)
THROUGH_APPLY = tuple(f"q{number:02d}" for number in range(1, 23))


@pytest.mark.slow
def test_tpch_views_kept_by_cdc_apply_survive_a_sigkill_and_verify(
        tpch: dict[str, list[list[str]]], pg_cluster: Any, tmp_path: Path) -> None:
    """The same data and batches with ``cdc apply`` keeping all 22 queries in a SQLite follower:
    SIGKILLed once after its first batches, restarted; then ``cdc verify --view`` exits 0 for
    each (the in-process views of the same batches are the test above)."""
    import contextlib
    import os
    import signal

    from tests.fuzz_views.harness import World
    from tests.pgkit import PROJECT, cdc, output, wait_for
    from tests.sparkkit import committed_batches

    full = tpch_case(tpch)
    case = Case(full.dialect, full.ddl, full.initial, full.batches[:4],
                [query for query in full.queries if query.name in THROUGH_APPLY])
    # the views kept in this process would repeat the test above (same batches): not kept
    world = World(case, pg_cluster, tmp_path / "world", in_process=False)
    roots = [tmp_path / "world" / "state" / "apply"]

    def start() -> subprocess.Popen[bytes]:
        views = [arg for name in THROUGH_APPLY for arg in ("--view", name)]
        return subprocess.Popen(
            [sys.executable, "-m", "cdc_app.cli", "apply", "--config", str(world.config_path),
             *views], cwd=PROJECT, stdout=subprocess.DEVNULL, start_new_session=True,
            stderr=open(tmp_path / "apply.log", "ab"))  # noqa: SIM115
    apply = start()
    try:
        for number, statements in enumerate(case.batches, 1):
            if number == 2:  # SIGKILL the whole apply (driver, JVM, workers) once it committed
                wait_for(lambda running=apply: committed_batches(roots) >= len(THROUGH_APPLY)
                         or running.poll() is not None, 240, "cdc apply's first batches")
                assert apply.poll() is None, (tmp_path / "apply.log").read_text()[-3000:]
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(apply.pid, signal.SIGKILL)
                apply.wait(30)
                apply = start()
            world.step(statements, number)
        views = [arg for name in THROUGH_APPLY for arg in ("--view", name)]
        verified = cdc("verify", "--config", str(world.config_path), *views, "--timeout", "240s",
                       timeout=600)
        assert verified.returncode == 0, output(verified)
        assert verified.stdout.count("equals the leader") == len(THROUGH_APPLY), output(verified)
        assert apply.poll() is None, (tmp_path / "apply.log").read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(apply.pid, signal.SIGTERM)
        apply.wait(120)
        world.close()
