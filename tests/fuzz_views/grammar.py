"""What the differential fuzzer writes, all from one seed: a schema, change batches and the
queries — in the leader's own dialect (PostgreSQL or MariaDB).

* **Schema.** Two or three tables, ``f0`` (always: ``id`` and a ``CHAR(n)`` column) and
  ``f1``/``f2`` at random, each keyed by ``id`` with 2–5 more columns of the kinds below, most
  of them nullable. Text columns get a collation at random: on PostgreSQL ``"C"``, the
  database's default or the ICU ``"und-x-icu"`` and ``"sv-x-icu"`` (Swedish: ``ö`` after
  ``z``); on MariaDB ``utf8mb4_nopad_bin``,
  ``utf8mb4_bin`` (PAD SPACE) or ``utf8mb4_general_ci`` (case-insensitive, PAD SPACE).
* **Values** come from small pools, so that groups, joins and ties collide: blanks at the end,
  case variants, accented letters, zero and negative numbers, binary fractions in ``double``
  columns (exact sums), dates and times of day in ``timestamp`` / ``timestamptz`` (MariaDB:
  ``DATETIME`` / ``TIMESTAMP``), NULLs.
* **Batches**: inserts, updates (of values and of keys) and deletes, each batch one leader
  transaction.
* **Queries**: every construct the views accept — filters and projections, INNER/LEFT joins
  (and comma joins), GROUP BY with HAVING, aggregates without GROUP BY, DISTINCT, every
  aggregate, subqueries in FROM,
  windows with PARTITION BY, UNION ALL, CASE, string and date functions, ORDER BY ... LIMIT —
  each with the key a user would give it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

KINDS = ("int", "num", "char", "text", "date", "ts", "tstz", "float")
#: the kinds that hold numbers (sums, averages, arithmetic)
NUMERIC = ("int", "num", "float")
#: ... and points in time (extract, comparison with a literal)
TIMES = ("date", "ts", "tstz")


@dataclass(frozen=True)
class Column:
    name: str
    kind: str            # one of KINDS
    nullable: bool
    length: int = 0      # CHAR(n) / VARCHAR(n)
    collation: str = ""  # text and char columns: the collation written in the DDL ("": default)

    def ddl(self, dialect: str) -> str:
        pg = dialect == "postgres"
        kind = {"int": "int", "num": "numeric(8,2)" if pg else "decimal(8,2)",
                "char": f"char({self.length})", "text": f"varchar({self.length})",
                "date": "date", "ts": "timestamp(0)" if pg else "datetime",
                "tstz": "timestamptz(0)" if pg else "timestamp",
                "float": "double precision" if pg else "double"}[self.kind]
        if self.kind == "tstz" and not pg:  # no automatic default or ON UPDATE on MariaDB
            kind += " NULL DEFAULT NULL" if self.nullable else " DEFAULT '2024-01-01 00:00:00'"
        if self.collation:
            kind += (f' COLLATE "{self.collation}"' if dialect == "postgres"
                     else f" CHARACTER SET utf8mb4 COLLATE {self.collation}")
        return f"{self.name} {kind}" + ("" if self.nullable else " NOT NULL")


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]  # ``id`` first

    def ddl(self, dialect: str) -> str:
        body = ", ".join(["id int PRIMARY KEY", *(c.ddl(dialect) for c in self.columns[1:])])
        return f"CREATE TABLE {self.name} ({body})"

    def of(self, kind: str) -> list[Column]:
        return [c for c in self.columns[1:] if c.kind == kind]


@dataclass
class Schema:
    dialect: str
    tables: list[Table]

    def ddl(self) -> list[str]:
        return [table.ddl(self.dialect) for table in self.tables]


TEXTS = ("a", "A", "a ", "ab", "Ab", "b", "", "é", "xyz", " a", "B ", "ö", "Z")
NUMBERS = ("0.00", "1.50", "-2.25", "3.00", "10.10", "1.5")
DAYS = ("2024-01-01", "2024-01-02", "2024-02-29", "2024-12-31", "2023-06-15")
#: with the hours around summer time's changes (UTC: Berlin's 2024-03-31 01:00, New York's
#: 2024-11-03 06:00) and a local day's edge
TIMES_OF_DAY = ("2024-01-01 00:00:00", "2024-01-01 12:30:00", "2024-02-29 23:59:59",
                "2023-06-15 08:00:00", "2024-12-31 23:00:00", "2024-03-31 00:30:00",
                "2024-03-31 01:30:00", "2024-11-03 05:30:00", "2024-11-03 06:30:00",
                "2024-06-30 22:30:00")
#: binary fractions: sums are exact in a double, so only AVG needs a tolerance
FLOATS = ("0.5", "1.25", "-2.0", "3.75", "0.0", "1024.5")

PG_COLLATIONS = ("", "C", "und-x-icu", "sv-x-icu")
MY_COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb4_nopad_bin", "utf8mb4_bin", "utf8mb4_general_ci")


def schema(rng: random.Random, dialect: str) -> Schema:
    collations = PG_COLLATIONS if dialect == "postgres" else MY_COLLATIONS
    tables = []
    for index in range(rng.choice((2, 3))):
        columns = [Column("id", "int", False)]
        kinds = ["int"] + (["char"] if index == 0 else []) + [
            rng.choice(KINDS) for _ in range(rng.randint(1, 3))]
        for number, kind in enumerate(kinds):
            length = rng.choice((3, 5)) if kind == "char" else 6 if kind == "text" else 0
            collation = rng.choice(collations) if kind in ("char", "text") else ""
            columns.append(Column(f"{'abcdefgh'[number]}{index}", kind,
                                  rng.random() < 0.7, length, collation))
        tables.append(Table(f"f{index}", tuple(columns)))
    return Schema(dialect, tables)


def literal(kind: str, value: str | int | None) -> str:
    if value is None:
        return "NULL"
    if kind in NUMERIC:
        return str(value)
    if kind == "date":
        return f"DATE '{value}'"
    if kind in ("ts", "tstz"):
        return f"TIMESTAMP '{value}'"
    return "'" + str(value).replace("'", "''") + "'"


def value(rng: random.Random, column: Column) -> str | int | None:
    if column.nullable and rng.random() < 0.2:
        return None
    if column.kind == "int":
        return rng.randint(-2, 5)
    if column.kind == "num":
        return rng.choice(NUMBERS)
    if column.kind == "date":
        return rng.choice(DAYS)
    if column.kind in ("ts", "tstz"):
        return rng.choice(TIMES_OF_DAY)
    if column.kind == "float":
        return rng.choice(FLOATS)
    return rng.choice(TEXTS)[:column.length]


def _row(rng: random.Random, table: Table, key: int) -> str:
    values = [str(key)] + [literal(c.kind, value(rng, c)) for c in table.columns[1:]]
    return f"({', '.join(values)})"


@dataclass
class Batches:
    """The leader's rows by table (ids), kept to write valid statements."""

    schema: Schema
    live: dict[str, set[int]] = field(default_factory=dict)

    def initial(self, rng: random.Random) -> list[str]:
        out = []
        for table in self.schema.tables:
            ids = sorted(rng.sample(range(1, 25), rng.randint(6, 14)))
            self.live[table.name] = set(ids)
            out += [f"INSERT INTO {table.name} VALUES {_row(rng, table, i)}" for i in ids]
        return out

    def batch(self, rng: random.Random) -> list[str]:
        out = []
        for _ in range(rng.randint(1, 6)):
            table = rng.choice(self.schema.tables)
            live = self.live[table.name]
            roll = rng.random()
            if roll < 0.3 or not live:
                free = [i for i in range(1, 30) if i not in live]
                if free:
                    key = rng.choice(free)
                    live.add(key)
                    out.append(f"INSERT INTO {table.name} VALUES {_row(rng, table, key)}")
            elif roll < 0.75:
                key = rng.choice(sorted(live))
                column = rng.choice(table.columns[1:])
                out.append(f"UPDATE {table.name} SET {column.name} = "
                           f"{literal(column.kind, value(rng, column))} WHERE id = {key}")
            elif roll < 0.85:
                key = rng.choice(sorted(live))
                free = [i for i in range(1, 30) if i not in live]
                if free:
                    new = rng.choice(free)
                    live.discard(key)
                    live.add(new)
                    out.append(f"UPDATE {table.name} SET id = {new} WHERE id = {key}")
            else:
                key = rng.choice(sorted(live))
                live.discard(key)
                out.append(f"DELETE FROM {table.name} WHERE id = {key}")
        return out


@dataclass(frozen=True)
class Query:
    name: str
    sql: str
    key: tuple[str, ...]
    #: an ORDER BY ... LIMIT: compared as the leader's first rows
    limited: bool = False


class Queries:
    """Random queries over ``schema`` in its dialect."""

    def __init__(self, rng: random.Random, schema: Schema) -> None:
        self.rng = rng
        self.schema = schema
        self.my = schema.dialect == "mysql"

    # ------------------------------------------------------------------ expressions
    def _column(self, table: Table, kinds: tuple[str, ...] = KINDS) -> Column | None:
        found = [c for c in table.columns[1:] if c.kind in kinds]
        return self.rng.choice(found) if found else None

    def predicate(self, alias: str, table: Table) -> str:
        rng = self.rng
        column = (self._column(table, ("char",)) if table.of("char") and rng.random() < 0.4
                  else self._column(table))
        assert column is not None
        ref = f"{alias}.{column.name}"
        roll = rng.random()
        if roll < 0.15:
            return f"{ref} IS {'NOT ' if rng.random() < 0.5 else ''}NULL"
        if column.kind in ("char", "text"):
            pool = [literal("text", v) for v in rng.sample(TEXTS, 3)]
            if roll < 0.45:
                return f"{ref} {rng.choice(('=', '<>', '<', '>='))} {pool[0]}"
            if roll < 0.65:
                return f"{ref} IN ({', '.join(pool)})"
            if roll < 0.8:
                return f"{ref} LIKE {rng.choice(('%a', 'a%', '_', '%b%', 'a '))!r}"
            return f"{self.length(ref)} {rng.choice(('=', '>'))} {rng.randint(0, 2)}"
        if column.kind == "date":
            return f"{ref} {rng.choice(('<', '>=', '='))} {literal('date', rng.choice(DAYS))}"
        if column.kind in ("ts", "tstz"):
            return f"{ref} {rng.choice(('<', '>=', '='))} " \
                   f"{literal(column.kind, rng.choice(TIMES_OF_DAY))}"
        number = rng.choice(("0", "1", "2", "-1", "1.5"))
        if roll < 0.6:
            return f"{ref} {rng.choice(('=', '<>', '<', '>', '<=', '>='))} {number}"
        return f"{ref} BETWEEN {rng.choice(('-1', '0'))} AND {rng.choice(('2', '3.5'))}"

    def length(self, ref: str) -> str:
        return f"char_length({ref})" if self.my else f"length({ref})"

    def interval(self, ref: str, kind: str) -> tuple[str, ...]:
        """Date arithmetic with intervals, and differences of dates and times."""
        since = literal(kind, DAYS[0] if kind == "date" else TIMES_OF_DAY[0])
        day = () if kind == "date" else (f"CAST({ref} AS DATE)",)
        if self.my:
            return (f"{ref} + INTERVAL 1 DAY", f"DATE_SUB({ref}, INTERVAL 90 DAY)",
                    f"DATE_ADD({ref}, INTERVAL 2 HOUR)", f"DATEDIFF({ref}, {since})", *day)
        return (f"{ref} + interval '1 day'", f"{ref} - interval '90' day",
                f"{ref} + interval '2 hours'", f"{ref} - {since}", *day,
                *((f"date_trunc('day', {ref})",) if day else ()))

    def concat(self, *parts: str) -> str:
        return f"concat({', '.join(parts)})" if self.my else " || ".join(parts)

    def scalar(self, alias: str, table: Table) -> str:
        """An expression over one of the table's columns (a projection)."""
        rng = self.rng
        column = self._column(table)
        assert column is not None
        ref = f"{alias}.{column.name}"
        if column.kind in NUMERIC:
            return rng.choice((ref, f"{ref} + 1", f"{ref} * 2", f"abs({ref})",
                               f"CASE WHEN {ref} > 1 THEN 'big' ELSE 'small' END",
                               f"coalesce({ref}, 0)", f"{ref} / 2", f"{ref} / 7.0",
                               f"round({ref} / 3, 2)" if column.kind == "num"
                               else f"{ref} % 3" if column.kind == "int" else f"round({ref})"))
        if column.kind in TIMES:
            return rng.choice((ref, f"extract(year from {ref})", f"extract(month from {ref})",
                               f"extract(day from {ref})", *self.interval(ref, column.kind))
                              + ((f"extract(hour from {ref})",) if column.kind != "date" else ()))
        return rng.choice((ref, f"upper({ref})", f"lower({ref})", self.length(ref),
                           self.concat(ref, "'|'"), f"coalesce({ref}, '-')",
                           f"CASE WHEN {ref} = 'a' THEN 1 ELSE 0 END"))

    def aggregate(self, alias: str, table: Table) -> str:
        rng = self.rng
        number = self._column(table, NUMERIC)
        any_column = self._column(table)
        assert any_column is not None
        choices = ["count(*)", f"count({alias}.{any_column.name})",
                   f"count(DISTINCT {alias}.{any_column.name})",
                   f"min({alias}.{any_column.name})", f"max({alias}.{any_column.name})"]
        if number is not None:
            ref = f"{alias}.{number.name}"
            choices += [f"sum({ref})", f"avg({ref})", f"max({ref}) - min({ref})",
                        f"sum(CASE WHEN {ref} > 0 THEN 1 ELSE 0 END)",
                        f"sum({ref}) / count(*)", f"avg({ref}) * 3"]
        return rng.choice(choices)

    # ---------------------------------------------------------------------- shapes
    def query(self, number: int) -> Query:
        shapes = [self.filtered, self.grouped, self.joined, self.distinct, self.windowed,
                  self.union, self.subquery, self.limited, self.comma_join, self.semi_join,
                  self.totalled]
        return self.rng.choice(shapes)(f"q{number}")

    def _where(self, alias: str, table: Table, chance: float = 0.7) -> str:
        if self.rng.random() > chance:
            return ""
        parts = [self.predicate(alias, table) for _ in range(self.rng.randint(1, 2))]
        return " WHERE " + f" {self.rng.choice(('AND', 'OR'))} ".join(parts)

    def filtered(self, name: str) -> Query:
        table = self.rng.choice(self.schema.tables)
        outputs = ", ".join(f"{self.scalar('t', table)} AS v{i}"
                            for i in range(self.rng.randint(1, 3)))
        return Query(name, f"SELECT t.id, {outputs} FROM {table.name} t"
                     + self._where("t", table), ("id",))

    def grouped(self, name: str) -> Query:
        table = self.rng.choice(self.schema.tables)
        column = self._column(table)
        assert column is not None
        group = f"t.{column.name}"
        if column.kind in TIMES and self.rng.random() < 0.5:
            group = f"extract(month from t.{column.name})"
        aggregates = ", ".join(f"{self.aggregate('t', table)} AS a{i}"
                               for i in range(self.rng.randint(1, 3)))
        having = self.rng.choice(("", "", " HAVING count(*) > 1",
                                  f" HAVING max(t.id) > {self.rng.randint(5, 20)}"))
        return Query(name, f"SELECT {group} AS g, {aggregates} FROM {table.name} t"
                     + self._where("t", table, 0.4) + f" GROUP BY {group}{having}", ("g",))

    def totalled(self, name: str) -> Query:
        """Aggregates without GROUP BY (one row, or none under a HAVING), over one table or a
        join (the engine keeps SUM and COUNT as partial aggregates per key-hash bucket)."""
        rng = self.rng
        if rng.random() < 0.5:
            table = rng.choice(self.schema.tables)
            alias, source, where = "t", f"{table.name} t", self._where("t", table, 0.6)
        else:
            left, table, on = self._pair()
            alias = "r"
            source = f"{left.name} l {rng.choice(('JOIN', 'LEFT JOIN'))} {table.name} r ON {on}"
            where = self._where("l", left, 0.4)
        aggregates = ", ".join(f"{self.aggregate(alias, table)} AS a{i}"
                               for i in range(rng.randint(1, 3)))
        having = rng.choice(("", "", " HAVING count(*) > 2"))
        return Query(name, f"SELECT 1 AS g, {aggregates} FROM {source}{where}{having}", ("g",))

    def _pair(self) -> tuple[Table, Table, str]:
        """Two tables and an equality between columns of one kind (ints when none match)."""
        left, right = self.rng.sample(self.schema.tables, 2)
        kinds = [k for k in KINDS if left.of(k) and right.of(k)]
        kind = self.rng.choice(kinds)
        on = f"l.{self.rng.choice(left.of(kind)).name} = r.{self.rng.choice(right.of(kind)).name}"
        return left, right, on

    def joined(self, name: str) -> Query:
        left, right, on = self._pair()
        join = self.rng.choice(("JOIN", "LEFT JOIN", "LEFT JOIN", "RIGHT JOIN")
                               + (() if self.my else ("FULL JOIN",)))
        select = f"l.id AS lid, r.id AS rid, {self.scalar('l', left)} AS v0, " \
                 f"{self.scalar('r', right)} AS v1"
        if self.rng.random() < 0.4:
            group = f"l.{self._column(left).name}"  # type: ignore[union-attr]
            return Query(name, f"SELECT {group} AS g, count(r.id) AS n, "
                         f"{self.aggregate('r', right)} AS a FROM {left.name} l {join} "
                         f"{right.name} r ON {on}" + self._where("l", left, 0.3)
                         + f" GROUP BY {group}", ("g",))
        return Query(name, f"SELECT {select} FROM {left.name} l {join} {right.name} r ON {on}"
                     + self._where("l", left, 0.4), ("lid", "rid"))

    def comma_join(self, name: str) -> Query:
        left, right, on = self._pair()
        return Query(name, f"SELECT l.id AS lid, r.id AS rid FROM {left.name} l, {right.name} r "
                     f"WHERE {on}", ("lid", "rid"))

    def semi_join(self, name: str) -> Query:
        """``IN``, ``NOT IN`` (NULLs make it empty) and ``[NOT] EXISTS`` subqueries."""
        left, right, on = self._pair()
        outer, inner = on.split(" = ")
        inner = inner.replace("r.", "u.")
        table = right.name
        test = self.rng.choice((
            f"{outer} IN (SELECT {inner} FROM {table} u)",
            f"{outer} NOT IN (SELECT {inner} FROM {table} u)",
            f"EXISTS (SELECT 1 FROM {table} u WHERE {inner} = {outer})",
            f"NOT EXISTS (SELECT 1 FROM {table} u WHERE {inner} = {outer})"))
        return Query(name, f"SELECT l.id, {self.scalar('l', left)} AS v FROM {left.name} l "
                     f"WHERE {test}", ("id",))

    def distinct(self, name: str) -> Query:
        table = self.rng.choice(self.schema.tables)
        column = self._column(table)
        assert column is not None
        return Query(name, f"SELECT DISTINCT t.{column.name} AS d FROM {table.name} t"
                     + self._where("t", table, 0.4), ("d",))

    def windowed(self, name: str) -> Query:
        table = self.rng.choice(self.schema.tables)
        part = self._column(table)
        assert part is not None
        function = self.rng.choice(("row_number()", "count(*)", "sum(t.id)", "rank()",
                                    "lag(t.id)", "dense_rank()"))
        return Query(name, f"SELECT t.id, {function} OVER (PARTITION BY t.{part.name} "
                     f"ORDER BY t.id) AS w FROM {table.name} t", ("id",))

    def union(self, name: str) -> Query:
        left, right = self.rng.sample(self.schema.tables, 2)
        return Query(name, f"SELECT 'l' AS side, t.id, t.{left.columns[1].name} AS n "
                     f"FROM {left.name} t" + self._where("t", left, 0.5)
                     + f" UNION ALL SELECT 'r' AS side, u.id, u.{right.columns[1].name} AS n "
                     f"FROM {right.name} u", ("side", "id"))

    def subquery(self, name: str) -> Query:
        left, right, on = self._pair()
        column = on.split(" = ")[1].split(".")[1]
        inner = (f"SELECT r.{column} AS jk, count(*) AS n, {self.aggregate('r', right)} AS a "
                 f"FROM {right.name} r GROUP BY r.{column}")
        outer_on = on.split(" = ")[0]
        return Query(name, f"SELECT l.id, s.n, s.a FROM {left.name} l JOIN ({inner}) s ON "
                     f"{outer_on} = s.jk", ("id",))

    def limited(self, name: str) -> Query:
        table = self.rng.choice(self.schema.tables)
        column = self._column(table)
        assert column is not None
        direction = self.rng.choice(("", " DESC"))
        return Query(name, f"SELECT t.id, t.{column.name} AS v FROM {table.name} t "
                     f"ORDER BY t.{column.name}{direction}, t.id LIMIT {self.rng.randint(2, 5)}",
                     ("id",), limited=True)
