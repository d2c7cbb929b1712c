"""The leader side of ``cdc verify`` for MySQL/MariaDB: binlog-position targets, key-ordered
chunks with checksums computed in SQL, and exact rows for chunks whose checksums differ.

What a follower holds per row (``cdc/sink.py``) is ``{column: canonical_text(value)}`` of the
row's JSON form (``docs/types.md``, "MySQL and MariaDB"), keyed by the key's JSON text. This
module reproduces both *in MariaDB SQL*, per column type, so a chunk is summarised on the server:

* **key text**: compact JSON of the key columns in key order (``{"id":42}``), exactly the log's
  key bytes (:func:`cdc.events.encode_key`): strings escaped like Python's ``json.dumps``
  (``ensure_ascii=False``), numerics that are strings in JSON (``DECIMAL``, ``BIGINT UNSIGNED``)
  quoted;
* **row text** of one row: ``<len(key)>:<key>`` followed, for every column in table order, by
  ``|`` for a null column or ``|<len(text)>:<text>`` for a non-null one (lengths in characters,
  ``CHAR_LENGTH``); the row texts of a chunk are concatenated in key order (``GROUP_CONCAT``)
  and hashed with MD5 (hex). The same format in Python is :func:`cdc.verify.row_digest_text`.

Every text is ``utf8mb4`` with the collation ``utf8mb4_bin`` (columns of other character sets
are converted as the server converts them for a ``utf8mb4`` client, which is how the snapshot
reads them), so concatenation never mixes collations and MD5 hashes UTF-8 bytes.

Values whose JSON form is null although the column is not (zero dates, dates with a zero or
impossible month or day) are null here too. ``DOUBLE`` (and ``FLOAT``, read as ``CAST(col AS
DOUBLE)`` like the snapshot does) is printed like Python's ``repr``: MariaDB prints the same
shortest round-trip digits, only laid out differently (``1e15``, ``0.00001``), so the SQL takes
the digits and the decimal exponent from MariaDB's text and lays them out as Python does.
``DOUBLE(M,D)`` prints rounded to ``D`` decimals, while the binlog holds the stored double
(``-0.01`` is stored as ``-0.010000000000000009``): the snapshot and this SQL read it as
``CAST(col AS DOUBLE)``, the stored value, like the binlog.

The chunk query computes every row's texts once, in a derived table that ``LIMIT`` makes MariaDB
materialise (keyset pagination over the key, compared column by column so the range optimizer
uses the primary key; ENUM and SET keys by their numbers, as ``ORDER BY`` sorts them).

A chunk whose checksum cannot be trusted (``GROUP_CONCAT`` cut at ``group_concat_max_len``, a
row text longer than ``max_allowed_packet``: any warning) gets the checksum ``""``, which never
equals a follower's, so it is compared row by row: :meth:`MySqlLeader.rows` decodes rows exactly
as the snapshot does (its SELECT expressions and converters -> Avro -> JSON form), and that row
by row comparison is the authority.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import fastavro
import pymysql
from pymysql.constants import FIELD_TYPE

from cdc.avro import json_form, value_schema
from cdc.events import TableId, encode_key, topic_name
from cdc.source import Chunk, Leader, Target, TextComparison
from connectors.mysql import catalog
from connectors.mysql.connection import SourceError, connect, query, quote_ident, translate
from connectors.mysql.schema import CapturedTable, build
from connectors.mysql.settings import MySqlSourceConfig
from connectors.mysql.types import MyColumn, column_type, snapshot_expression

#: the session's GROUP_CONCAT limit (bytes): a chunk's row texts concatenated must fit
GROUP_CONCAT_MAX_LEN = 2**32 - 1
#: follower keys looked up per query in :meth:`MySqlLeader.absent`
ABSENT_BATCH = 500

# ------------------------------------------------------------------------- canonical text in SQL


@dataclass(frozen=True)
class Canon:
    """SQL for a non-null column value: its canonical text (what a follower stores; NULL when
    the JSON form is null, e.g. a zero date) and its JSON literal (what it is inside a key).
    ``exact`` is False when the SQL cannot always reproduce the JSON form."""

    text: str
    json: str
    exact: bool = True


def _lit(text: str) -> str:
    """A utf8mb4 string literal, independent of ``sql_mode`` (``NO_BACKSLASH_ESCAPES``)."""
    if text and all(c.isalnum() or c in " -_.:|,{}[]%+T" for c in text) and text.isascii():
        return f"'{text}'"
    return f"_utf8mb4 X'{text.encode().hex()}'"


def _u(expr: str) -> str:
    """``expr`` as utf8mb4 text with the binary collation (safe to concatenate with any)."""
    return f"CONVERT({expr} USING utf8mb4) COLLATE utf8mb4_bin"


def _number(text: str) -> Canon:
    return Canon(text, text)


def _plain_string(text: str) -> Canon:
    """A JSON string whose characters never need escaping (digits, dates, base64, ...)."""
    return Canon(text, f"CONCAT('\"', {text}, '\"')")


#: json.dumps(ensure_ascii=False)'s escapes: backslash and quote first, then control characters
_ESCAPES = [("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"),
            ("\b", "\\b"), ("\f", "\\f")] + [
    (chr(code), f"\\u{code:04x}") for code in range(0x20) if chr(code) not in "\n\r\t\b\f"]


def _json_quote(text: str) -> str:
    """SQL for the JSON string literal of the text ``text`` (exactly Python's ``json.dumps``)."""
    for raw, escaped in _ESCAPES:
        text = f"REPLACE({text}, {_lit(raw)}, {_lit(escaped)})"
    return f"CONCAT('\"', {text}, '\"')"


def _string(text: str) -> Canon:
    return Canon(text, _json_quote(text))


def _python_float(value: str) -> str:
    """Python's ``repr`` of a DOUBLE (never NaN or infinite in MariaDB) from MariaDB's text,
    which holds the same shortest round-trip digits: fixed notation for decimal exponents
    -4..15 (``1000000000000000.0``, ``0.0001``), else ``d.ddde+XX`` (``1e+16``, ``1e-05``)."""
    t = f"CAST({value} AS CHAR)"
    sign = f"IF(LEFT({t}, 1) = '-', '-', '')"
    unsigned = f"TRIM(LEADING '-' FROM {t})"
    mantissa = f"SUBSTRING_INDEX({unsigned}, 'e', 1)"
    exponent = (f"IF(LOCATE('e', {unsigned}) > 0, "
                f"CAST(SUBSTRING_INDEX({unsigned}, 'e', -1) AS SIGNED), 0)")
    whole = f"SUBSTRING_INDEX({mantissa}, '.', 1)"
    every = f"REPLACE({mantissa}, '.', '')"
    significant = f"TRIM(LEADING '0' FROM {every})"
    digits = f"TRIM(TRAILING '0' FROM {significant})"
    # digits before the point, counted from the first significant digit
    point = (f"(CHAR_LENGTH({whole}) + {exponent} - (CHAR_LENGTH({every}) - "
             f"CHAR_LENGTH({significant})))")
    count = f"CHAR_LENGTH({digits})"
    fixed = (f"CASE WHEN {point} <= 0 THEN CONCAT('0.', REPEAT('0', -{point}), {digits}) "
             f"WHEN {point} >= {count} THEN CONCAT({digits}, REPEAT('0', {point} - {count}), "
             f"'.0') ELSE CONCAT(LEFT({digits}, {point}), '.', SUBSTRING({digits}, {point} + 1))"
             " END")
    scientific = (f"CONCAT(LEFT({digits}, 1), IF({count} > 1, CONCAT('.', SUBSTRING({digits}, "
                  f"2)), ''), 'e', IF({point} - 1 < 0, '-', '+'), "
                  f"IF(ABS({point} - 1) < 10, '0', ''), ABS({point} - 1))")
    general = (f"CONCAT({sign}, CASE WHEN {digits} = '' THEN '0.0' WHEN {point} > -4 AND "
               f"{point} <= 16 THEN {fixed} ELSE {scientific} END)")
    # most values: MariaDB's fixed notation, at or above 0.0001, is Python's (with ".0" added
    # to an integer); the general layout is many string functions, taken only when needed
    usual = (f"LOCATE('e', {t}) = 0 AND {t} NOT LIKE '0.0000%' AND {t} NOT LIKE '-0.0000%' "
             f"AND {t} NOT LIKE '%.%0'")
    return (f"CASE WHEN {usual} THEN IF(LOCATE('.', {t}) = 0, CONCAT({t}, '.0'), {t}) "
            f"ELSE {general} END")


def _valid_date(value: str) -> str:
    """True when ``value`` (DATE/DATETIME/TIMESTAMP) has a real month and day: zero dates, zero
    months or days and impossible days (``ALLOW_INVALID_DATES``) are null in JSON."""
    year, month, day = f"YEAR({value})", f"MONTH({value})", f"DAYOFMONTH({value})"
    leap = f"(({year} % 4 = 0 AND {year} % 100 <> 0) OR {year} % 400 = 0)"
    last = f"ELT({month}, 31, IF({leap}, 29, 28), 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)"
    return f"(IFNULL({month}, 0) BETWEEN 1 AND 12 AND IFNULL({day}, 0) BETWEEN 1 AND {last})"


def _temporal(value: str, layout: str, suffix: str = "") -> Canon:
    text = f"DATE_FORMAT({value}, {_lit(layout)})"
    if suffix:
        text = f"CONCAT({text}, {_lit(suffix)})"
    return _plain_string(f"IF({_valid_date(value)}, {_u(text)}, NULL)")


def _time(value: str) -> Canon:
    """``[-]HH:MM:SS.ffffff`` (hours may pass 24 and take three digits)."""
    t = f"CAST({value} AS CHAR)"
    return _plain_string(_u(f"IF(LOCATE('.', {t}) = 0, CONCAT({t}, '.000000'), "
                            f"RPAD({t}, LOCATE('.', {t}) + 6, '0'))"))


def canonical_sql(column: MyColumn, x: str) -> Canon:
    """SQL reproducing ``canonical_text`` of the JSON form of column ``column``'s value ``x``
    (never null), as the snapshot decodes it (``connectors/mysql/types.py``)."""
    ctype = column_type(column)
    kind = column.data_type.lower()
    name = ctype.name
    if name in ("int16", "int32", "int64"):
        return _number(_u(f"CAST({x} AS CHAR)"))
    if name == "year":
        return _number(_u(f"CAST({x} + 0 AS CHAR)"))
    if name in ("uint64", "decimal"):
        return _plain_string(_u(f"CAST({x} AS CHAR)"))
    if name == "float32":  # as the snapshot reads it: CAST(col AS DOUBLE), the exact value
        return _number(_u(_python_float(f"CAST({x} AS DOUBLE)")))
    if name == "float64":
        if "(" in column.column_type:  # DOUBLE(M,D): as the snapshot reads it, the stored value
            x = f"CAST({x} AS DOUBLE)"
        return _number(_u(_python_float(x)))
    if name == "boolean":
        return _number(f"IF({x} + 0 = 0, 'false', 'true')")
    if name == "bits":
        return _plain_string(_u(f"LPAD(BIN({x} + 0), {ctype.precision or 1}, '0')"))
    if name == "bytes":
        return _plain_string(_u(f"REPLACE(TO_BASE64({x}), CHAR(10), '')"))
    if name == "date":
        return _temporal(x, "%Y-%m-%d")
    if name == "timestamp":
        return _temporal(x, "%Y-%m-%dT%H:%i:%s.%f")
    if name == "timestamptz":  # the session's time zone is UTC
        return _temporal(x, "%Y-%m-%dT%H:%i:%s.%f", "Z")
    if name == "time":
        return _time(x)
    if name == "uuid":
        return _plain_string(_u(f"LOWER(CAST({x} AS CHAR))"))
    if kind in ("inet6", "inet4"):
        return _plain_string(_u(f"CAST({x} AS CHAR)"))
    # text of any character set, ENUM, SET, MariaDB JSON: the text as a utf8mb4 client reads it
    return _string(_u(x))


# ------------------------------------------------------------------------------- key values

def _param(column: MyColumn, value: Any) -> Any:
    """The SQL parameter selecting a key column's value from its JSON form (a key text read
    back); ``ValueError`` when the JSON form cannot be one of the column's values."""
    if value is None:
        return None
    name = column_type(column).name
    if name in ("int16", "int32", "int64", "year"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(value)
        return value
    if name == "uint64":
        return int(str(value))
    if name == "decimal":
        try:
            return Decimal(str(value))
        except InvalidOperation:
            raise ValueError(value) from None
    if name in ("float32", "float64"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(value)
        return float(value)
    if name == "boolean":
        if not isinstance(value, bool):
            raise ValueError(value)
        return int(value)
    if not isinstance(value, str):
        raise ValueError(value)
    if name == "bits":
        return int(value, 2)
    if name == "bytes":
        return base64.b64decode(value, validate=True)
    if name == "timestamptz":
        return value.removesuffix("Z")
    return value  # text, enum, set, json, uuid, inet6, dates and times as MariaDB reads them


def _member_number(column: MyColumn, value: str) -> int:
    """The number MariaDB sorts an ENUM label (its index, 0 for ``''``) or a SET (its bitmask)
    by."""
    members = list(column.values)
    if column.data_type.lower() == "enum":
        return members.index(value) + 1 if value in members else 0
    return sum(1 << members.index(m) for m in value.split(",") if m in members) if value else 0


# ------------------------------------------------------------------------------- the leader

@dataclass
class LeaderTable:
    """One table as the leader has it now, with the SQL that summarises its chunks."""

    table: TableId
    topic: str
    captured: CapturedTable
    key: tuple[str, ...]
    canons: dict[str, Canon]
    #: SQL (over ``t.``) of the key's JSON text
    key_sql: str
    #: the chunk query's per-row select list (over ``t.``, see :func:`_texts_sql`)
    texts_sql: str
    #: SQL (over the aliases of ``texts_sql``, ``c.``) of the row's checksum text
    row_sql: str
    avro: Any = field(repr=False, default=None)

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.captured.schema.columns)

    @property
    def key_columns(self) -> tuple[MyColumn, ...]:
        by_name = {c.name: c for c in self.captured.columns}
        return tuple(by_name[name] for name in self.key)

    @property
    def inexact(self) -> tuple[str, ...]:
        return tuple(name for name, canon in self.canons.items() if not canon.exact)


def _key_sql(names: Sequence[str], canons: Mapping[str, Canon]) -> str:
    parts = []
    for index, name in enumerate(names):
        label = ("{" if index == 0 else ",") + json.dumps(name, ensure_ascii=False) + ":"
        column = f"t.{quote_ident(name)}"
        parts += [_lit(label), f"IF({column} IS NULL, 'null', IFNULL({canons[name].json}, 'null'))"]
    return f"CONCAT({', '.join(parts)}, '}}')"


def _texts_sql(key: Sequence[str], key_sql: str, canons: Mapping[str, Canon]) -> str:
    """Select list (over ``t.``) of the key columns (``cdc_p<i>``), the key text (``cdc_k``)
    and every column's canonical text (``cdc_t<i>``, NULL when null): the chunk query
    materialises them once per row."""
    items = [f"t.{quote_ident(name)} AS cdc_p{i}" for i, name in enumerate(key)]
    items.append(f"{key_sql} AS cdc_k")
    items += [f"IF(t.{quote_ident(name)} IS NULL, NULL, {canon.text}) AS cdc_t{i}"
              for i, (name, canon) in enumerate(canons.items())]
    return ", ".join(items)


def _row_sql(count: int) -> str:
    """The row's checksum text (see the module docstring) over :func:`_texts_sql`'s aliases
    (``c.``)."""
    terms = ["CHAR_LENGTH(c.cdc_k), ':', c.cdc_k"]
    terms += [f"IFNULL(CONCAT('|', CHAR_LENGTH(c.cdc_t{i}), ':', c.cdc_t{i}), '|')"
              for i in range(count)]
    return f"CONCAT({', '.join(terms)})"


class MySqlLeader(Leader):
    """A MySQL/MariaDB source seen by ``cdc verify``: one autocommit session with the
    snapshot's settings (utf8mb4, ``time_zone '+00:00'``, PyMySQL's default conversions);
    every method raises :class:`SourceError` with a fix on failure."""

    def __init__(self, source: MySqlSourceConfig) -> None:
        self.source = source
        self.name = source.name
        self.conn: Any = connect(source)
        self._tables: dict[TableId, LeaderTable] = {}
        try:
            query(self.conn, f"SET SESSION group_concat_max_len = {GROUP_CONCAT_MAX_LEN}")
        except pymysql.err.MySQLError as exc:
            self.conn.close()
            raise translate(source, exc) from None

    def close(self) -> None:
        with contextlib.suppress(pymysql.err.Error):  # already closed
            self.conn.close()

    def text_comparisons(self, table: TableId) -> dict[str, TextComparison]:
        try:
            rows = query(self.conn, "SELECT column_name, collation_name FROM "
                                    "information_schema.columns WHERE table_schema = %s AND "
                                    "table_name = %s", (table.schema, table.table))
        except pymysql.err.MySQLError as exc:
            raise translate(self.source, exc) from None
        return {str(name): TextComparison(str(collation), True) for name, collation in rows
                if collation and not _byte_collation(str(collation).lower())}

    def query(self, sql: str, time_zone: str = "UTC") -> tuple[list[str], list[tuple[Any, ...]]]:
        zone = _zone(time_zone)
        try:
            with self.conn.cursor() as cursor:
                if zone is not dt.UTC:
                    self._set_time_zone(cursor, time_zone)
                try:
                    return self._zoned_rows(cursor, sql, zone)
                finally:
                    if zone is not dt.UTC:
                        cursor.execute("SET time_zone = '+00:00'")
        except pymysql.err.MySQLError as exc:
            raise SourceError(f"source {self.name!r}: the query failed on the leader: "
                              f"{exc.args[-1] if exc.args else exc}",
                              "correct the SQL (it runs on the leader as written)") from None

    @staticmethod
    def _zoned_rows(cursor: Any, sql: str, zone: dt.tzinfo
                    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """``sql``'s names and rows, a TIMESTAMP as the point in time it is (capture logs it as
        a timestamptz; DATETIME stays a wall-clock time). MariaDB shows a TIMESTAMP as
        wall-clock time in the session's time zone, which names two instants in the hour a
        change of summer time repeats: outside UTC each is read as ``UNIX_TIMESTAMP`` too."""
        if zone is dt.UTC:
            cursor.execute(sql)
            described, rows = cursor.description or [], cursor.fetchall()
            zoned = [column[1] == FIELD_TYPE.TIMESTAMP for column in described]
            return [str(column[0]) for column in described], [
                tuple(_zoned(value, zone) if at_zone else value
                      for value, at_zone in zip(row, zoned, strict=True)) for row in rows]
        cursor.execute(f"SELECT * FROM ({sql}) AS cdc_q LIMIT 0")
        described = cursor.description or []
        names = [str(column[0]) for column in described]
        zoned = [i for i, column in enumerate(described) if column[1] == FIELD_TYPE.TIMESTAMP]
        seconds = "".join(f", UNIX_TIMESTAMP(cdc_q.`{names[i].replace('`', '``')}`)"
                          for i in zoned)
        cursor.execute(f"SELECT cdc_q.*{seconds} FROM ({sql}) AS cdc_q")
        out = []
        for row in cursor.fetchall():
            values = list(row[:len(names)])
            for i, epoch in zip(zoned, row[len(names):], strict=True):
                values[i] = None if epoch is None else _instant(epoch, zone)
            out.append(tuple(values))
        return names, out

    def _set_time_zone(self, cursor: Any, time_zone: str) -> None:
        try:
            cursor.execute("SET time_zone = %s", (time_zone,))
        except pymysql.err.MySQLError:
            raise SourceError(
                f"source {self.name!r}: the server does not know time zone {time_zone!r} (its "
                "time zone tables are empty)",
                "load them: mariadb-tzinfo-to-sql /usr/share/zoneinfo | mariadb -u root mysql "
                "(or set the view's time_zone to UTC)") from None

    # -- positions ------------------------------------------------------------------------------
    def target(self) -> Target:
        """The server's binlog position now: every transaction committed before this call ends
        at or before it, and capture checkpoints past it after its next transaction or idle
        heartbeat."""
        file, pos = catalog.current_position(self.conn, self.name)
        return Target((catalog.file_sequence(file), pos), f"{file}:{pos}")

    def columns(self, table: TableId) -> tuple[str, ...]:
        return self.table(table).columns

    def inexact(self, table: TableId) -> tuple[str, ...]:
        return self.table(table).inexact

    def estimate_rows(self, table: TableId) -> int | None:
        rows = self._query("SELECT table_rows FROM information_schema.tables WHERE "
                           f"table_schema = {self.conn.escape(table.schema)} AND "
                           f"table_name = {self.conn.escape(table.table)}", table)
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    # -- tables ----------------------------------------------------------------------------------
    def table(self, table: TableId) -> LeaderTable:
        found = self._tables.get(table)
        if found is None:
            found = self._tables[table] = self._describe(table)
        return found

    def _describe(self, table: TableId) -> LeaderTable:
        try:
            info = catalog.table_info(self.conn, self.name, table)
        except pymysql.err.MySQLError as exc:
            raise translate(self.source, exc) from None
        captured = build(self.source, table, info.columns, info.primary_key)
        canons = {c.name: canonical_sql(c, f"t.{quote_ident(c.name)}") for c in captured.columns}
        key = captured.schema.key
        key_sql = _key_sql(key, canons)
        record = value_schema(captured.schema)["fields"][0]["type"][1]
        return LeaderTable(table, topic_name(self.name, table), captured, key, canons, key_sql,
                           _texts_sql(key, key_sql, canons), _row_sql(len(canons)),
                           fastavro.parse_schema(record))

    # -- chunks ----------------------------------------------------------------------------------
    def _order(self, leader: LeaderTable, alias: str = "t.", descending: bool = False) -> str:
        return ", ".join(f"{alias}{quote_ident(name)}" + (" DESC" if descending else "")
                         for name in leader.key)

    def _compare(self, leader: LeaderTable, op: str, values: Sequence[Any],
                 alias: str = "t.") -> str:
        """``(key columns) op (values)`` for ``op`` ``>`` or ``<=`` in the order ``ORDER BY``
        sorts them, spelt out column by column (for the range optimizer). ENUM and SET sort by
        their numbers, so they are compared as numbers."""
        columns, literals = [], []
        for column, value in zip(leader.key_columns, values, strict=True):
            expr = f"{alias}{quote_ident(column.name)}"
            kind = column.data_type.lower()
            if kind in ("enum", "set") and isinstance(value, str):
                expr, value = f"({expr} + 0)", _member_number(column, value)
            columns.append(expr)
            literals.append(self.conn.escape(value))
        strict = op.rstrip("=")
        terms = []
        for i in range(len(columns)):
            equal = [f"{columns[j]} = {literals[j]}" for j in range(i)]
            last = op if i == len(columns) - 1 else strict
            terms.append("(" + " AND ".join([*equal, f"{columns[i]} {last} {literals[i]}"]) + ")")
        return "(" + " OR ".join(terms) + ")"

    def chunks(self, table: TableId, size: int) -> Iterator[Chunk]:
        """Every row of ``table`` in key order, ``size`` rows per chunk, each summarised in SQL
        (keyset pagination: a chunk starts after the previous chunk's last key)."""
        leader = self.table(table)
        qualified = catalog.qualified(table)
        order = self._order(leader)
        by_alias = ", ".join(f"c.cdc_p{i}" for i in range(len(leader.key)))
        after: tuple[Any, ...] | None = None
        while True:
            where = f"WHERE {self._compare(leader, '>', after)}" if after is not None else ""
            # LIMIT makes MariaDB materialise the derived table: each text is computed once
            chunk = (f"(SELECT {leader.texts_sql} FROM {qualified} AS t {where} "
                     f"ORDER BY {order} LIMIT {int(size)}) AS c")
            with self.conn.cursor() as cursor:
                try:
                    cursor.execute(
                        f"SELECT COUNT(*), GROUP_CONCAT(c.cdc_k ORDER BY {by_alias} "
                        f"SEPARATOR X'0A'), MD5(GROUP_CONCAT({leader.row_sql} ORDER BY "
                        f"{by_alias} SEPARATOR '')) FROM {chunk}")
                    row = cursor.fetchone()
                    # a cut GROUP_CONCAT or an over-long row text warns: never trust its MD5
                    warnings = getattr(cursor._result, "warning_count", 1)
                except pymysql.err.MySQLError as exc:
                    raise self._failed(table, exc) from None
            count = int(row[0])
            if count == 0:
                return
            checksum = "" if warnings or row[2] is None else str(row[2])
            listed = row[1].decode() if isinstance(row[1], bytes) else row[1]
            keys = str(listed).split("\n") if listed is not None else []
            if len(keys) != count:  # the key list was cut: read the keys themselves
                checksum = ""
                keys = [str(found[0]) for found in self._query(
                    f"SELECT c.cdc_k FROM {chunk} ORDER BY {by_alias}", table)]
            last = self._values(leader, keys[-1]) if keys else None
            if last is None or None in last:
                raise SourceError(f"source {self.name!r}: verify cannot page past the key "
                                  f"{keys[-1] if keys else '(none)'} of {table}: its JSON form "
                                  "is not a value of the key's columns (a zero date?)",
                                  "give the table a key without zero dates, or leave it out of "
                                  "the follower's tables for verify")
            yield Chunk(keys, checksum, after, last)
            if len(keys) < size:
                return
            after = last

    def _values(self, leader: LeaderTable, key: str) -> tuple[Any, ...] | None:
        """The key columns' values (as SQL parameters) of a key JSON text; None if it is not a
        key of this table's shape."""
        try:
            parsed = json.loads(key)
            if not isinstance(parsed, dict) or list(parsed) != list(leader.key):
                return None
            return tuple(_param(column, parsed[column.name]) for column in leader.key_columns)
        except (ValueError, TypeError):
            return None

    # -- exact rows ------------------------------------------------------------------------------
    def rows(self, table: TableId, chunk: Chunk) -> dict[str, dict[str, Any]]:
        """The rows of ``chunk``'s key range now, in their JSON form (``{key text: row}``),
        decoded exactly as the snapshot decodes them (its SELECT expressions and converters,
        then Avro)."""
        leader = self.table(table)
        captured = leader.captured
        columns = ", ".join(snapshot_expression(c) for c in captured.columns)
        conditions = [self._compare(leader, "<=", chunk.last, alias="")]
        if chunk.after is not None:
            conditions.insert(0, self._compare(leader, ">", chunk.after, alias=""))
        sql = (f"SELECT {columns} FROM {catalog.qualified(table)} "
               f"WHERE {' AND '.join(conditions)} ORDER BY {self._order(leader, alias='')}")
        schema = captured.schema
        out: dict[str, dict[str, Any]] = {}
        for values in self._query(sql, table):
            row = captured.snapshot_row(values)
            out[encode_key(schema, schema.key_of(row)).decode()] = self.json_form(leader, row)
        return out

    def json_form(self, leader: LeaderTable, row: Mapping[str, Any]) -> dict[str, Any]:
        """A decoded row as the log's readers see it: through Avro and back, then JSON."""
        return json_form(leader.captured.schema, leader.avro, row)

    # -- keys the leader lacks -------------------------------------------------------------------
    def absent(self, table: TableId, keys: Sequence[str]) -> list[str]:
        """Those of ``keys`` (key JSON texts) that no row of ``table`` has now: each key's
        values are read back from its JSON text and looked up through the key's index (in
        batches); a key is present when a row's key text equals it exactly."""
        leader = self.table(table)
        found: set[str] = set()
        wanted = []
        for key in keys:
            values = self._values(leader, key)
            if values is not None:
                wanted.append(values)
        columns = [f"t.{quote_ident(name)}" for name in leader.key]
        for start in range(0, len(wanted), ABSENT_BATCH):
            batch = wanted[start:start + ABSENT_BATCH]
            if len(columns) == 1:
                where = f"{columns[0]} IN ({', '.join(self.conn.escape(v[0]) for v in batch)})"
            else:
                where = " OR ".join(
                    "(" + " AND ".join(f"{c} = {self.conn.escape(v)}"
                                       for c, v in zip(columns, values, strict=True)) + ")"
                    for values in batch)
            sql = f"SELECT {leader.key_sql} FROM {catalog.qualified(table)} AS t WHERE {where}"
            found.update(str(row[0]) for row in self._query(sql, table))
        return [key for key in keys if key not in found]

    # -- errors ----------------------------------------------------------------------------------
    def _query(self, sql: str, table: TableId) -> list[tuple[Any, ...]]:
        try:
            return query(self.conn, sql)
        except pymysql.err.MySQLError as exc:
            raise self._failed(table, exc) from None

    def _failed(self, table: TableId, exc: pymysql.err.MySQLError) -> SourceError:
        if isinstance(exc, pymysql.err.OperationalError) and exc.args and exc.args[0] in (
                2003, 2006, 2013, 2055):
            return translate(self.source, exc)
        text = str(exc.args[-1] if exc.args else exc).strip().splitlines()
        first = text[0] if text else type(exc).__name__
        return SourceError(f"source {self.name!r}: reading {table} for verify failed: {first}",
                           f"check that the capture user can SELECT {table} "
                           f"(GRANT SELECT ON {catalog.qualified(table)} TO it) and that the "
                           "server is MariaDB 10.5 or later (or MySQL 8)")


def _byte_collation(name: str) -> bool:
    """Whether a collation compares byte by byte, blanks kept: a binary NO PAD one (MariaDB's
    ``_nopad_bin``; MySQL 8's ``_0900_bin``). Every other compares loosely: case- or
    accent-insensitive (``_ci``, ``_ai``), by a language's rules, or PAD SPACE (every MariaDB
    collation but the ``_nopad_`` ones -- 10.11's information_schema has no PAD_ATTRIBUTE --,
    ``utf8mb4_bin`` too)."""
    return name == "binary" or (name.endswith("_bin") and ("_nopad_" in name
                                                           or "_0900_" in name))


def _zone(name: str) -> dt.tzinfo:
    """The zone ``name`` (``dt.UTC`` itself for UTC)."""
    import zoneinfo

    return dt.UTC if name == "UTC" else zoneinfo.ZoneInfo(name)


def _instant(epoch: Any, zone: dt.tzinfo) -> dt.datetime:
    """``UNIX_TIMESTAMP``'s seconds (a DECIMAL with the fraction) as a datetime in ``zone``."""
    whole = int(epoch)
    micros = int((Decimal(str(epoch)) - whole) * 1_000_000)
    return (_EPOCH + dt.timedelta(seconds=whole, microseconds=micros)).astimezone(zone)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _zoned(value: Any, zone: dt.tzinfo) -> Any:
    """A TIMESTAMP value read in a session in ``zone``, as an aware datetime."""
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=zone)
    return value
