"""The leader side of ``cdc verify`` for PostgreSQL: heartbeat targets, key-ordered chunks with
checksums computed in SQL, and exact rows for chunks whose checksums differ.

What a follower holds per row (``cdc/sink.py``) is ``{column: canonical_text(value)}`` of the
row's JSON form (``docs/types.md``), keyed by the key's JSON text. This module reproduces both
*in SQL*, per PostgreSQL type, so a chunk of rows can be summarised on the server:

* **key text**: compact JSON of the key columns in key order (``{"id":42}``), exactly the log's
  key bytes (:func:`cdc.events.encode_key`);
* **row text** of one row: ``<len(key)>:<key>`` followed, for every column in table order, by
  ``|`` for a null column or ``|<len(text)>:<text>`` for a non-null one (lengths in characters);
  the row texts of a chunk are concatenated in key order and hashed with MD5 (hex). The same
  format in Python is :func:`cdc.verify.row_digest_text` (the follower's side).

Where SQL cannot reproduce the JSON form of a value exactly (a point whose NaN has another bit
pattern than Python's, arrays of domains over array types, ...), its expression still yields
*some* text and the chunk's checksum then differs although the rows may be equal. That is
harmless: every chunk whose checksums differ is fetched again through
:meth:`PostgresLeader.rows`, which decodes rows exactly as the snapshot does (``COPY`` text ->
``connectors/postgres/types.py`` parsers -> Avro -> JSON form), and that row by row comparison
is the authority. :attr:`LeaderTable.inexact` names the columns whose types have no exact SQL
form at all.

Requires PostgreSQL 14 or later (``extract`` returning ``numeric``, ``trim_scale``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import fastavro
import psycopg
from psycopg.types.string import TextLoader

from cdc.avro import json_form, value_schema
from cdc.events import TableId, encode_key, topic_name
from cdc.position import format_lsn, parse_lsn
from cdc.source import Chunk, Leader, Target, TextComparison
from connectors.postgres import catalog
from connectors.postgres.connection import SourceError, connect
from connectors.postgres.replication import quote_ident, quote_literal
from connectors.postgres.settings import PostgresSourceConfig
from connectors.postgres.source import HEARTBEAT_PREFIX, CapturedTable, database_of
from connectors.postgres.types import ARRAYS, BIT, NUMERIC, VARBIT

# ------------------------------------------------------------------------- canonical text in SQL

@dataclass(frozen=True)
class Canon:
    """SQL for a non-null value: its canonical text (what a follower stores for a column) and
    its JSON literal (what it is inside a key or an array). ``exact`` is False when the SQL
    cannot always reproduce the JSON form (such values fall back to row comparison)."""

    text: str
    json: str
    exact: bool = True


def _number(text: str) -> Canon:
    return Canon(text, text)


def _plain_string(text: str) -> Canon:
    """A JSON string whose characters never need escaping (digits, dates, hex, ...)."""
    return Canon(text, f"('\"' || {text} || '\"')")


def _string(text: str) -> Canon:
    return Canon(text, f"to_json({text})::text")


def _float(value: str) -> Canon:
    """Python's ``repr`` of a float from PostgreSQL's shortest-exact output
    (``extra_float_digits`` > 0): ``1`` -> ``1.0``, ``1e+15`` -> ``1000000000000000.0``; NaN
    and infinities are the strings ``NaN``, ``Infinity``, ``-Infinity``."""
    t = f"({value})::float8::text"
    mantissa = f"split_part({t}, 'e', 1)"
    digits = f"replace(ltrim({mantissa}, '-'), '.', '')"
    sign = f"CASE WHEN left({t}, 1) = '-' THEN '-' ELSE '' END"
    # exponent 15: PostgreSQL switches to scientific notation one decade before Python does
    e15 = (f"{sign} || CASE WHEN length({digits}) <= 16 THEN rpad({digits}, 16, '0') || '.0' "
           f"ELSE left({digits}, 16) || '.' || substr({digits}, 17) END")
    number = (f"CASE WHEN right({t}, 4) = 'e+15' THEN {e15} WHEN {t} ~ '[.e]' THEN {t} "
              f"ELSE {t} || '.0' END")
    special = f"{t} IN ('NaN', 'Infinity', '-Infinity')"
    return Canon(f"(CASE WHEN {special} THEN {t} ELSE {number} END)",
                 f"(CASE WHEN {special} THEN '\"' || {t} || '\"' ELSE {number} END)")


def _year(year: str) -> str:
    """ISO 8601 year from PostgreSQL's ``extract(year ...)`` (BC years negative, no year 0):
    astronomical numbering, four digits, a sign outside 0000-9999."""
    astro = f"(CASE WHEN {year} < 0 THEN {year} + 1 ELSE {year} END)::bigint"
    return (f"CASE WHEN {astro} BETWEEN 0 AND 9999 THEN lpad({astro}::text, 4, '0') "
            f"WHEN {astro} > 0 THEN '+' || {astro}::text "
            f"ELSE '-' || lpad((-{astro})::text, 4, '0') END")


def _date(value: str) -> Canon:
    ordinary = f"({value} >= '0001-01-01'::date AND {value} < '10000-01-01'::date)"
    text = (f"(CASE WHEN NOT isfinite({value}) OR {ordinary} THEN {value}::text "
            f"ELSE ({_year(f'extract(year FROM {value})')}) || to_char({value}, '-MM-DD') END)")
    return _plain_string(text)


def _timestamp(value: str, zone: str) -> Canon:
    """``timestamp`` (zone ``''``) or ``timestamptz`` (zone ``'Z'``, the session is in UTC)."""
    low, high = ("'0001-01-01'::timestamp", "'10000-01-01'::timestamp") if not zone else (
        "'0001-01-01 00:00+00'::timestamptz", "'10000-01-01 00:00+00'::timestamptz")
    clock = "\"T\"HH24:MI:SS.US"
    text = (f"(CASE WHEN NOT isfinite({value}) THEN {value}::text "
            f"WHEN {value} >= {low} AND {value} < {high} "
            f"THEN to_char({value}, 'YYYY-MM-DD{clock}') || '{zone}' "
            f"ELSE ({_year(f'extract(year FROM {value})')}) || to_char({value}, '-MM-DD{clock}')"
            f" || '{zone}' END)")
    return _plain_string(text)


def _six_digits(clock: str) -> str:
    """``HH:MM:SS[.f]`` padded to six fraction digits."""
    return (f"(CASE WHEN position('.' IN {clock}) = 0 THEN {clock} || '.000000' "
            f"ELSE rpad({clock}, 15, '0') END)")


def _interval(value: str) -> Canon:
    """Debezium's ``P<y>Y<m>M<d>DT<h>H<m>M<s>S`` (each part truncated toward zero, seconds
    without trailing zeros)."""
    parts = [f"extract({part} FROM {value})::bigint::text || '{unit}'"
             for part, unit in (("year", "Y"), ("month", "M"), ("day", "DT"), ("hour", "H"),
                                ("minute", "M"))]
    seconds = f"trim_scale(extract(second FROM {value}))::text || 'S'"
    return _plain_string("('P' || " + " || ".join([*parts, seconds]) + ")")


def _le_bytes(float8: str) -> str:
    """The 8 bytes of a float8, little-endian (``float8send`` is big-endian)."""
    big = f"float8send({float8})"
    return " || ".join(f"substring({big} FROM {i} FOR 1)" for i in range(8, 0, -1))


def _point(value: str) -> Canon:
    """Debezium's Point as compact JSON: ``{"x":..,"y":..,"wkb":"<base64>","srid":null}``."""
    x, y = _float(f"({value})[0]"), _float(f"({value})[1]")
    wkb = (f"encode('\\x0101000000'::bytea || {_le_bytes(f'({value})[0]')} || "
           f"{_le_bytes(f'({value})[1]')}, 'base64')")
    text = (f"('{{\"x\":' || {x.json} || ',\"y\":' || {y.json} || ',\"wkb\":\"' || {wkb} "
            f"|| '\",\"srid\":null}}')")
    return Canon(text, text)


#: stands for an array's element while its element type's SQL is built
_ELEMENT = "\x1fELEMENT\x1f"


def _array(value: str, element: Canon) -> Canon:
    """An array as compact JSON lists (``[1,null]``, ``[[1,null],[null,3]]``, ``[]``).

    One dimension: the elements joined by commas. More (PostgreSQL stores them flat, row-major,
    with no empty sub-arrays): before flat element ``i`` > 0 go ``c`` closing brackets, a comma
    and ``c`` opening ones, where ``c`` counts the dimensions ``k`` >= 2 whose sub-array size
    ``P_k`` (the product of the lengths of dimensions ``k``.. last) divides ``i``."""
    item = f"CASE WHEN u.e IS NULL THEN 'null' ELSE {element.json.replace(_ELEMENT, 'u.e')} END"
    flat = (f"(SELECT '[' || coalesce(string_agg({item}, ',' ORDER BY u.o), '') || ']' "
            f"FROM unnest({value}) WITH ORDINALITY AS u(e, o))")
    lengths = [f"coalesce(array_length({value}, {j}), 1)" for j in range(1, 7)]
    sizes = ", ".join(f"{' * '.join(lengths[k - 1:])} AS p{k}" for k in range(2, 7))
    closes = " + ".join(f"(d.nd >= {k} AND (u.o - 1) % d.p{k} = 0)::int" for k in range(2, 7))
    nested = (f"(SELECT string_agg(CASE WHEN u.o = 1 THEN repeat('[', d.nd) ELSE "
              f"repeat(']', {closes}) || ',' || repeat('[', {closes}) END || {item}, '' "
              f"ORDER BY u.o) || repeat(']', max(d.nd)) FROM unnest({value}) WITH ORDINALITY "
              f"AS u(e, o), (SELECT array_ndims({value}) AS nd, {sizes}) AS d)")
    text = f"(CASE WHEN coalesce(array_ndims({value}), 1) = 1 THEN {flat} ELSE {nested} END)"
    return Canon(text, text, element.exact)


def _scalar(oid: int, modifier: int, types: Mapping[int, Mapping[str, Any]], x: str) -> Canon:
    """The canonical SQL of a non-array value ``x`` of type ``oid``."""
    if oid in (16,):
        return _number(f"(CASE WHEN {x} THEN 'true' ELSE 'false' END)")
    if oid in (21, 23, 20, 26):
        return _number(f"{x}::text")
    if oid in (700, 701):
        return _float(x)
    if oid == NUMERIC:
        return _plain_string(f"{x}::text")
    if oid == 790:  # money: decimal(19, 2); the C locale's text would carry '$' and commas
        return _plain_string(f"{x}::numeric::text")
    if oid == 17:
        return _plain_string(f"translate(encode({x}, 'base64'), E'\\n', '')")
    if oid == BIT and modifier == 1:
        return _number(f"(CASE WHEN {x} = B'1' THEN 'true' ELSE 'false' END)")
    if oid in (BIT, VARBIT, 2950):
        return _plain_string(f"{x}::text")
    if oid == 1042:  # char(n): the output function keeps the padding, a cast to text drops it
        return _string(f"format('%s', {x})")
    if oid == 1082:
        return _date(x)
    if oid == 1083:
        return _plain_string(_six_digits(f"{x}::text"))
    if oid == 1266:
        return _plain_string(_six_digits(f"({x} AT TIME ZONE 'UTC')::time::text") + " || 'Z'")
    if oid == 1114:
        return _timestamp(x, "")
    if oid == 1184:
        return _timestamp(x, "Z")
    if oid == 1186:
        return _interval(x)
    if oid == 600:
        return _point(x)
    info = types.get(oid, {})
    if info.get("kind") == "domain":
        return _canon(int(info["base"]), int(info.get("base_modifier", -1)), types, x)
    # text types, json, jsonb, xml, uuid, enums, network, ranges, geometry, extensions...
    return _string(f"format('%s', {x})")


def _element_of(oid: int, types: Mapping[int, Mapping[str, Any]]) -> int | None:
    element = ARRAYS.get(oid)
    info = types.get(oid, {})
    if element is None and info.get("kind") == "array":
        element = int(info["element"])
    return element


def _canon(oid: int, modifier: int, types: Mapping[int, Mapping[str, Any]], x: str) -> Canon:
    element = _element_of(oid, types)
    if element is None:
        return _scalar(oid, modifier, types, x)
    base, base_modifier = element, modifier
    while types.get(base, {}).get("kind") == "domain":
        base_modifier = int(types[base].get("base_modifier", -1))
        base = int(types[base]["base"])
    if _element_of(base, types) is not None:  # an array of a domain over an array type
        return Canon(f"{x}::text", f"{x}::text", exact=False)
    if base in _JSON_NATIVE or types.get(base, {}).get("kind") == "enum":
        return Canon(f"array_to_json({x})::text", f"array_to_json({x})::text")
    return _array(x, _scalar(base, base_modifier, types, _ELEMENT))


#: element types whose ``to_json`` is their JSON form (text types, integers, booleans, uuid):
#: their arrays are ``array_to_json`` (compact, any dimension), much cheaper than element SQL
_JSON_NATIVE = frozenset({16, 21, 23, 20, 26, 25, 1043, 19, 2950})


def canonical_sql(column_sql: str, type_oid: int, type_modifier: int,
                  types: Mapping[int, Mapping[str, Any]]) -> Canon:
    """SQL reproducing ``canonical_text`` of the JSON form of ``column_sql`` (never null)."""
    return _canon(type_oid, type_modifier, types, column_sql)


# ------------------------------------------------------------------------------- the leader

@dataclass
class LeaderTable:
    """One table as the leader has it now, with the SQL that summarises its chunks."""

    table: TableId
    topic: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    captured: CapturedTable
    #: per column, the SQL of its canonical text and JSON literal
    canons: dict[str, Canon]
    key_types: tuple[str, ...]
    key_sql: str
    #: select list: the key text and every column's canonical text (``x.cdc_verify_<i>``)
    texts_sql: str
    #: the row's checksum text over those aliases
    row_sql: str
    #: SQL (over ``j.k``, a key JSON text) giving the key's column values, in key order
    key_from_json: str
    avro: Any = field(repr=False, default=None)

    @property
    def inexact(self) -> tuple[str, ...]:
        """Columns whose type has no exact SQL form (their chunks are compared by rows)."""
        return tuple(name for name, canon in self.canons.items() if not canon.exact)


def _digest_sql(count: int) -> str:
    """The row text (see the module docstring) over the aliases of :func:`_texts_sql`."""
    terms = [f"CASE WHEN x.cdc_verify_{i} IS NULL THEN '|' "
             f"ELSE '|' || length(x.cdc_verify_{i}) || ':' || x.cdc_verify_{i} END"
             for i in range(count)]
    return " || ".join(["length(x.cdc_verify_key) || ':' || x.cdc_verify_key", *terms])


def _texts_sql(key_sql: str, canons: Mapping[str, Canon]) -> str:
    """Select list of the key text and each column's canonical text (NULL when null), each
    computed once per row (the chunk query evaluates it in a fenced LATERAL subquery)."""
    texts = [f"CASE WHEN {quote_ident(name)} IS NULL THEN NULL ELSE {canon.text} END "
             f"AS cdc_verify_{i}" for i, (name, canon) in enumerate(canons.items())]
    return ", ".join([f"{key_sql} AS cdc_verify_key", *texts])


#: libc locales that order by code point (UTF-8's byte order: the view's state's)
_CODE_POINT_LOCALES = frozenset({"C", "POSIX", "C.UTF-8", "C.utf8"})
#: ... of which these change the case of ASCII letters only (``upper('é')`` is ``'é'``)
_ASCII_LOCALES = frozenset({"C", "POSIX"})


class PostgresLeader(Leader):
    """A source database seen by ``cdc verify``. One autocommit connection with the snapshot's
    session settings; every method raises :class:`SourceError` with a fix on failure."""

    def __init__(self, source: PostgresSourceConfig) -> None:
        self.source = source
        self.name = source.name
        self.conn: psycopg.Connection[Any] = connect(source)
        self._tables: dict[TableId, LeaderTable] = {}

    def close(self) -> None:
        self.conn.close()

    def query(self, sql: str, time_zone: str = "UTC") -> tuple[list[str], list[tuple[Any, ...]]]:
        try:
            with self.conn.transaction():
                self.conn.execute("SET TRANSACTION READ ONLY")
                self.conn.execute("SELECT set_config('TimeZone', %s, true)", (time_zone,))
                cursor = self.conn.cursor()
                # the session's IntervalStyle is iso_8601 (capture parses it; psycopg cannot):
                # an interval comes back as that text, which verify compares canonically
                cursor.adapters.register_loader("interval", TextLoader)
                cursor.execute(sql)  # type: ignore[arg-type] - the user's own SQL
                names = [column.name for column in cursor.description or []]
                return names, list(cursor.fetchall())
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SourceError(f"source {self.name!r}: the query failed on the leader: {first}",
                              "correct the SQL (it runs on the leader as written)") from None

    def text_comparisons(self, table: TableId) -> dict[str, TextComparison]:
        try:
            found = self.conn.execute("SELECT to_regclass(%s)::oid",
                                      (catalog.qualified(table),)).fetchone()
            rows = catalog.column_collations(self.conn, int(found[0])) if found and found[0] \
                else []
        except psycopg.Error as exc:
            raise SourceError(f"source {self.name!r}: reading {table}'s collations failed: "
                              f"{str(exc).strip().splitlines()[0]}",
                              f"check that {table} exists and the source's user can see it"
                              ) from None
        out: dict[str, TextComparison] = {}
        for row in rows:
            shown = row.name if row.name != "default" else \
                f"the database's default ({row.locale})"
            if row.provider == "c" and row.locale in _ASCII_LOCALES:
                out[row.column] = TextComparison(shown, False, ordered=False, ascii_case=True)
            elif row.provider != "b" and not (row.provider == "c"
                                              and row.locale in _CODE_POINT_LOCALES):
                out[row.column] = TextComparison(
                    shown, not row.deterministic,
                    icu_locale=row.locale if row.provider == "i" else "")
        return out

    # -- positions ------------------------------------------------------------------------------
    def heartbeat(self) -> int:
        """Write a heartbeat message now and return the target LSN: every transaction committed
        before this call ends at or before it, and capture (even on idle tables) checkpoints
        the log's source offset to at least it once it has read the message."""
        row = self.conn.execute("SELECT pg_logical_emit_message(false, %s, %s)::text",
                                (HEARTBEAT_PREFIX, "verify")).fetchone()
        assert row is not None
        # a non-transactional message is not flushed by itself (before PostgreSQL 17), and
        # walsenders only send flushed WAL: commit a transaction with an xid to flush it
        self.conn.execute("SELECT txid_current()")
        return parse_lsn(str(row[0]))

    def target(self) -> Target:
        lsn = self.heartbeat()
        return Target((lsn,), format_lsn(lsn))

    def columns(self, table: TableId) -> tuple[str, ...]:
        return self.table(table).columns

    def inexact(self, table: TableId) -> tuple[str, ...]:
        return self.table(table).inexact

    def estimate_rows(self, table: TableId) -> int | None:
        """The planner's row count estimate for ``table`` (``None``: never analysed)."""
        row = self.conn.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                                (catalog.qualified(table),)).fetchone()
        return int(row[0]) if row is not None and row[0] is not None and row[0] >= 0 else None

    # -- tables ----------------------------------------------------------------------------------
    def table(self, table: TableId) -> LeaderTable:
        """The table's current columns and key, and the SQL summarising its rows."""
        found = self._tables.get(table)
        if found is None:
            found = self._tables[table] = self._describe(table)
        return found

    def _describe(self, table: TableId) -> LeaderTable:
        info = catalog.table_info(self.conn, self.name, table)
        key = catalog.key_columns(info, self.name, self.source.keys.get(str(table)))
        schema, parsers = catalog.table_schema(self.conn, self.name, database_of(self.source),
                                               info, key)
        types = catalog.type_catalog(self.conn, {oid for _, oid, _, _ in info.columns})
        canons = {name: canonical_sql(quote_ident(name), oid, modifier, types)
                  for name, oid, modifier, _ in info.columns}
        key_parts = [f"{quote_literal(json.dumps(name, ensure_ascii=False) + ':')} || "
                     f"{canons[name].json}" for name in key]
        key_sql = "('{' || " + " || ',' || ".join(key_parts) + " || '}')"
        row_sql = _digest_sql(len(canons))
        formatted = {str(name): str(kind) for name, kind in self.conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped", (info.oid,)).fetchall()}
        oids = {name: (oid, modifier) for name, oid, modifier, _ in info.columns}
        from_json = ", ".join(_key_from_json(name, *oids[name], formatted[name]) for name in key)
        record = value_schema(schema)["fields"][0]["type"][1]
        return LeaderTable(
            table, topic_name(self.name, table), tuple(c.name for c in schema.columns), key,
            CapturedTable(schema, parsers), canons,
            tuple(formatted[name] for name in key), key_sql, _texts_sql(key_sql, canons),
            row_sql, from_json,
            fastavro.parse_schema(record))

    # -- chunks ----------------------------------------------------------------------------------
    def _order(self, leader: LeaderTable) -> str:
        return ", ".join(quote_ident(name) for name in leader.key)

    def _after(self, leader: LeaderTable, op: str = ">", alias: str = "") -> str:
        values = ", ".join(f"%s::{kind}" for kind in leader.key_types)
        columns = ", ".join(alias + _esc(quote_ident(name)) for name in leader.key)
        return f"({columns}) {op} ({values})"

    def chunks(self, table: TableId, size: int) -> Iterator[Chunk]:
        """Every row of ``table`` in key order, ``size`` rows per chunk, each summarised in SQL.
        Keyset pagination: a chunk starts after the previous chunk's last key, so rows written
        meanwhile land in whichever chunk covers their key."""
        leader = self.table(table)
        order = _esc(self._order(leader))
        qualified = ", ".join(f"t.{_esc(quote_ident(name))}" for name in leader.key)
        descending = ", ".join(f"{_esc(quote_ident(name))} DESC" for name in leader.key)
        last_values = ", ".join(
            f"(array_agg({_esc(quote_ident(name))}::text ORDER BY {descending}))[1]"
            for name in leader.key)
        after: tuple[str, ...] | None = None
        while True:
            where = f"WHERE {self._after(leader, alias='t.')}" if after is not None else ""
            query = (f"WITH c AS MATERIALIZED (SELECT {qualified}, x.cdc_verify_key, "
                     f"{_esc(leader.row_sql)} AS cdc_verify_row "
                     f"FROM {_esc(catalog.qualified(table))} AS t, "
                     f"LATERAL (SELECT {_esc(leader.texts_sql)} OFFSET 0) AS x "
                     f"{where} ORDER BY {qualified} LIMIT %s) "
                     f"SELECT count(*), array_agg(cdc_verify_key ORDER BY {order}), "
                     f"md5(string_agg(cdc_verify_row, '' ORDER BY {order})), {last_values} "
                     "FROM c")
            row = self._one(query, (*(after or ()), size), table)
            count = int(row[0])
            if count == 0:
                return
            last = tuple(str(value) for value in row[3:])
            yield Chunk(list(row[1]), str(row[2]), after, last)
            if count < size:
                return
            after = last

    def _one(self, query: str, params: Sequence[Any], table: TableId) -> tuple[Any, ...]:
        try:
            row = self.conn.execute(query, params).fetchone()
        except psycopg.Error as exc:
            raise _query_failed(self.name, table, exc) from None
        assert row is not None
        return tuple(row)

    # -- exact rows ------------------------------------------------------------------------------
    def rows(self, table: TableId, chunk: Chunk) -> dict[str, dict[str, Any]]:
        """The rows of ``chunk``'s key range now, in their JSON form (``{key text: row}``),
        decoded exactly as the snapshot decodes them (COPY text, the same parsers, Avro)."""
        leader = self.table(table)
        columns = ", ".join(quote_ident(name) for name in leader.columns)
        conditions = [self._after(leader, "<=")]
        params: list[Any] = [*chunk.last]
        if chunk.after is not None:
            conditions.insert(0, self._after(leader))
            params[:0] = chunk.after
        query = (f"COPY (SELECT {_esc(columns)} FROM {_esc(catalog.qualified(table))} "
                 f"WHERE {' AND '.join(conditions)} ORDER BY {_esc(self._order(leader))}) "
                 "TO STDOUT")
        out: dict[str, dict[str, Any]] = {}
        schema = leader.captured.schema
        try:
            with self.conn.cursor() as cursor, cursor.copy(query, params) as copy:
                for values in copy.rows():
                    row = leader.captured.row(values)
                    key = encode_key(schema, schema.key_of(row)).decode()
                    out[key] = self.json_form(leader, row)
        except psycopg.Error as exc:
            raise _query_failed(self.name, table, exc) from None
        return out

    def json_form(self, leader: LeaderTable, row: Mapping[str, Any]) -> dict[str, Any]:
        """A decoded row as the log's readers see it: through Avro and back, then JSON."""
        return json_form(leader.captured.schema, leader.avro, row)

    # -- keys the leader lacks -------------------------------------------------------------------
    def absent(self, table: TableId, keys: Sequence[str]) -> list[str]:
        """Those of ``keys`` (key JSON texts) that no row of ``table`` has now.

        Each key's columns are read back from its JSON text and looked up through the primary
        key's index; a key whose JSON form is not valid input for its column type (a BC date,
        a non-JSON text) is looked up by comparing key texts instead (a full scan)."""
        if not keys:
            return []
        leader = self.table(table)
        # the keys as one JSON text (psycopg dumps a list item by item, in Python)
        listed = json.dumps(list(keys), ensure_ascii=False)
        found = f"{_esc(leader.key_sql)} = j.k"
        table_sql = _esc(catalog.qualified(table))
        keys_sql = "json_array_elements_text(%s::json) AS j(k)"
        indexed = (f"SELECT j.k FROM {keys_sql} WHERE NOT EXISTS (SELECT 1 "
                   f"FROM {table_sql} WHERE ({_esc(self._order(leader))}) = "
                   f"({_esc(leader.key_from_json)}) AND {found})")
        scan = (f"SELECT j.k FROM {keys_sql} WHERE NOT EXISTS (SELECT 1 "
                f"FROM {table_sql} WHERE {found})")
        try:
            return [str(row[0]) for row in self.conn.execute(indexed, (listed,))]
        except psycopg.errors.DataException:
            pass  # some key's JSON form is not input its type accepts: compare texts instead
        except psycopg.Error as exc:
            raise _query_failed(self.name, table, exc) from None
        try:
            return [str(row[0]) for row in self.conn.execute(scan, (listed,))]
        except psycopg.Error as exc:
            raise _query_failed(self.name, table, exc) from None


def _esc(fragment: str) -> str:
    """A SQL fragment made safe to sit beside ``%s`` placeholders."""
    return fragment.replace("%", "%%")


def _query_failed(source: str, table: TableId, exc: Exception) -> SourceError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return SourceError(f"source {source!r}: reading {table} for verify failed: {first}",
                       "check that the role can SELECT the table and that the server is "
                       "PostgreSQL 14 or later")


def _key_from_json(name: str, oid: int, modifier: int, formatted: str) -> str:
    """SQL turning the JSON form of key column ``name`` (in ``j.k``) back into its value."""
    text = f"(j.k::json ->> {quote_literal(name)})"
    if oid == 17:
        return f"decode({text}, 'base64')"
    if oid == BIT and modifier == 1:
        return f"(CASE {text} WHEN 'true' THEN B'1' ELSE B'0' END)::bit(1)"
    if oid == 790:
        return f"{text}::numeric::money"
    return f"{text}::{formatted}"
