"""What the leader's catalog says: server settings, roles, tables, keys, types, publications and
slots. Every check that can fail raises a :class:`SourceError` naming the problem and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from cdc.events import Column, TableId, TableSchema
from cdc.logical import icu_collation
from connectors.postgres.connection import SourceError
from connectors.postgres.replication import quote_ident
from connectors.postgres.requirements import REQUIRED, ROLE_ATTRIBUTE
from connectors.postgres.types import BUILTIN, MODIFIED, PgType, pg_type


def qualified(table: TableId) -> str:
    return f"{quote_ident(table.schema)}.{quote_ident(table.table)}"


@dataclass(frozen=True)
class TableInfo:
    """A captured table as the catalog describes it now."""

    oid: int
    table: TableId
    replica_identity: str
    #: (name, type oid, type modifier, not null) in column order
    columns: tuple[tuple[str, int, int, bool], ...]
    primary_key: tuple[str, ...]


def check_server(conn: psycopg.Connection[Any], source: str) -> None:
    """Every setting of :data:`~connectors.postgres.requirements.REQUIRED`."""
    for name, wanted, why, fix in REQUIRED:
        row = conn.execute(f"SHOW {name}").fetchone()
        if row is None or str(row[0]) != wanted:
            raise SourceError(f"source {source!r}: {name} is {row[0] if row else '?'}, not "
                              f"{wanted}: {why}", fix)


def check_role(conn: psycopg.Connection[Any], source: str) -> None:
    """The role may replicate: the REPLICATION attribute, a superuser, or — on Amazon RDS and
    Aurora, where neither is granted — membership in ``rds_replication``."""
    row = conn.execute(
        "SELECT rolreplication OR rolsuper OR COALESCE((SELECT pg_has_role(current_user, oid, "
        "'MEMBER') FROM pg_roles WHERE rolname = 'rds_replication'), false), current_user "
        "FROM pg_roles WHERE rolname = current_user").fetchone()
    if row is None or not row[0]:
        user = row[1] if row else "?"
        raise SourceError(f"source {source!r}: role {user!r} lacks the REPLICATION attribute",
                          f"ALTER ROLE {quote_ident(str(user))} {ROLE_ATTRIBUTE}; (as a superuser)")


def table_info(conn: psycopg.Connection[Any], source: str, table: TableId) -> TableInfo:
    row = conn.execute(
        "SELECT c.oid, c.relreplident, c.relkind FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (table.schema, table.table)).fetchone()
    if row is None:
        raise SourceError(f"source {source!r}: table {table} does not exist",
                          "create it, or remove it from the source's tables")
    oid, identity, kind = row
    if kind not in ("r", "p"):
        raise SourceError(f"source {source!r}: {table} is not a table (relkind {kind!r})",
                          "capture tables only; remove it from the source's tables")
    columns = conn.execute(
        "SELECT attname, atttypid, atttypmod, attnotnull FROM pg_attribute "
        "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (oid,)).fetchall()
    key = conn.execute(
        "SELECT a.attname FROM pg_index i JOIN LATERAL unnest(i.indkey) WITH ORDINALITY "
        "AS k(attnum, ord) ON true JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = k.attnum WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord",
        (oid,)).fetchall()
    return TableInfo(int(oid), table, str(identity),
                     tuple((str(n), int(t), int(m), bool(nn)) for n, t, m, nn in columns),
                     tuple(str(k[0]) for k in key))


def key_columns(info: TableInfo, source: str, configured: list[str] | None) -> tuple[str, ...]:
    """The key columns of a table, or a clear refusal for a table that has none."""
    if configured:
        names = {name for name, *_ in info.columns}
        unknown = [c for c in configured if c not in names]
        if unknown:
            raise SourceError(f"source {source!r}: configured key column(s) {unknown} are not "
                              f"columns of {info.table}", "fix keys: in the config")
        if not info.primary_key and info.replica_identity != "f":
            raise SourceError(
                f"source {source!r}: {info.table} has no primary key, so PostgreSQL sends only "
                "the new row for updates and nothing for deletes",
                f"ALTER TABLE {qualified(info.table)} REPLICA IDENTITY FULL;")
        return tuple(configured)
    if info.primary_key:
        return info.primary_key
    raise SourceError(
        f"source {source!r}: table {info.table} has no primary key, so its changes cannot be "
        "keyed (and PostgreSQL refuses to publish its updates and deletes)",
        f"add a primary key, or run ALTER TABLE {qualified(info.table)} REPLICA IDENTITY FULL; "
        f"and configure its key columns under the source's keys: {{{info.table}: [col, ...]}}")


def type_catalog(conn: psycopg.Connection[Any], oids: set[int]) -> dict[int, dict[str, Any]]:
    """Descriptions of the non-built-in types among ``oids`` (enums, domains, arrays, others),
    and of the types those refer to (a domain's base type, an array's element type)."""
    wanted = sorted(oid for oid in oids if oid not in BUILTIN and oid not in MODIFIED)
    out: dict[int, dict[str, Any]] = {}
    while wanted:
        rows = conn.execute(
            "SELECT t.oid, t.typname, t.typtype, t.typbasetype, t.typtypmod, t.typelem, "
            "t.typcategory, (SELECT array_agg(e.enumlabel ORDER BY e.enumsortorder) FROM pg_enum e "
            "WHERE e.enumtypid = t.oid), (SELECT el.typdelim FROM pg_type el "
            "WHERE el.oid = t.typelem) FROM pg_type t WHERE t.oid = ANY(%s)",
            (wanted,)).fetchall()
        more: set[int] = set()
        for oid, name, kind, base, base_mod, element, category, labels, delimiter in rows:
            if kind == "e":
                out[oid] = {"kind": "enum", "name": name, "values": list(labels or [])}
            elif kind == "d":
                out[oid] = {"kind": "domain", "name": name, "base": base, "base_modifier": base_mod}
                more.add(int(base))
            elif category == "A" and element:
                out[oid] = {"kind": "array", "name": name, "element": element,
                            "delimiter": str(delimiter or ",")}
                more.add(int(element))
            else:
                out[oid] = {"kind": "other", "name": name}
        wanted = sorted(o for o in more if o not in out and o not in BUILTIN and o not in MODIFIED)
    return out


#: each collatable column of a relation: its collation's name, provider (``c`` libc, ``i`` ICU,
#: ``b`` builtin: the database's for ``default``; ``datlocprovider`` exists from PostgreSQL 15,
#: libc before), whether it is deterministic, and its locale (libc's ``collcollate``; ICU's
#: ``colliculocale`` in PostgreSQL 15 and 16, ``colllocale`` from 17, ``collcollate`` before)
_COLLATIONS = """
    SELECT a.attname, c.collname,
           CASE WHEN c.collprovider = 'd'
                THEN coalesce(to_jsonb(d) ->> 'datlocprovider', 'c') ELSE c.collprovider::text END,
           c.collisdeterministic,
           CASE WHEN c.collprovider = 'd' AND coalesce(to_jsonb(d) ->> 'datlocprovider', 'c') = 'c'
                THEN d.datcollate
                WHEN c.collprovider = 'd'
                THEN coalesce(to_jsonb(d) ->> 'datlocale', to_jsonb(d) ->> 'daticulocale')
                WHEN c.collprovider = 'c' THEN c.collcollate
                ELSE coalesce(to_jsonb(c) ->> 'colllocale', to_jsonb(c) ->> 'colliculocale',
                              c.collcollate) END
    FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
    JOIN pg_database d ON d.datname = current_database()
    WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped"""


@dataclass(frozen=True)
class ColumnCollation:
    """How the leader compares one collatable column (:data:`_COLLATIONS`)."""

    column: str
    name: str
    provider: str
    deterministic: bool
    locale: str


def column_collations(conn: psycopg.Connection[Any], relation: int) -> list[ColumnCollation]:
    """The collatable columns of relation ``relation`` (an OID) and their collations."""
    return [ColumnCollation(str(column), str(name), str(provider), bool(deterministic),
                            str(locale or ""))
            for column, name, provider, deterministic, locale
            in conn.execute(_COLLATIONS, (relation,)).fetchall()]


def with_icu_orders(conn: psycopg.Connection[Any], relation: int, names: Sequence[str],
                    mapped: list[PgType]) -> list[PgType]:
    """``mapped`` (the columns ``names`` in order) with the ICU locale of each text column
    whose deterministic ICU collation orders it (``icu:<locale>``, :data:`cdc.logical.ICU`):
    the log's schema carries it, so a view's state orders such a column as the leader does."""
    ordered = {row.column: row.locale for row in column_collations(conn, relation)
               if row.provider == "i" and row.deterministic and row.locale}
    if not ordered:
        return mapped
    return [replace(mapping, column_type=replace(
                mapping.column_type, collation=icu_collation(ordered[name])))
            if name in ordered and mapping.column_type.name == "string" else mapping
            for name, mapping in zip(names, mapped, strict=True)]


def table_schema(conn: psycopg.Connection[Any], source: str, database: str, info: TableInfo,
                 key: tuple[str, ...]) -> tuple[TableSchema, list[PgType]]:
    """The :class:`TableSchema` of ``info`` and each column's parser, in column order."""
    types = type_catalog(conn, {oid for _, oid, _, _ in info.columns})
    mapped = with_icu_orders(
        conn, info.oid, [name for name, *_ in info.columns],
        [pg_type(oid, modifier, types) for _, oid, modifier, _ in info.columns])
    columns = tuple(Column(name, mapping.column_type, nullable=not not_null)
                    for (name, _, _, not_null), mapping in zip(info.columns, mapped, strict=True))
    schema = TableSchema(source, database, info.table, columns, key, connector="postgresql")
    return schema, mapped


# -- publications and slots --------------------------------------------------------------------

def ensure_publication(conn: psycopg.Connection[Any], name: str, tables: list[TableId]) -> None:
    """Create the publication for exactly ``tables``, or set its table list if it exists."""
    listed = ", ".join(qualified(t) for t in tables)
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
    try:
        if exists:
            current = {TableId(s, t) for s, t in conn.execute(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (name,)).fetchall()}
            if current != set(tables):
                conn.execute(f"ALTER PUBLICATION {quote_ident(name)} SET TABLE {listed}")
        else:
            conn.execute(f"CREATE PUBLICATION {quote_ident(name)} FOR TABLE {listed}")
    except psycopg.errors.InsufficientPrivilege as exc:
        raise SourceError(f"cannot create or alter publication {name!r}: {exc}",
                          "run as the tables' owner, or have an admin create the publication "
                          f"with CREATE PUBLICATION {quote_ident(name)} FOR TABLE {listed};"
                          ) from None


@dataclass(frozen=True)
class SlotInfo:
    name: str
    plugin: str | None
    database: str | None
    active: bool
    confirmed_flush_lsn: int | None
    restart_lsn: int | None
    wal_status: str | None


def _lsn(value: Any) -> int | None:
    if value is None:
        return None
    high, low = str(value).split("/")
    return (int(high, 16) << 32) | int(low, 16)


def slot_info(conn: psycopg.Connection[Any], name: str) -> SlotInfo | None:
    row = conn.execute(
        "SELECT slot_name, plugin, database, active, confirmed_flush_lsn::text, "
        "restart_lsn::text, wal_status FROM pg_replication_slots WHERE slot_name = %s",
        (name,)).fetchone()
    if row is None:
        return None
    return SlotInfo(row[0], row[1], row[2], bool(row[3]), _lsn(row[4]), _lsn(row[5]), row[6])


def check_free_slot(conn: psycopg.Connection[Any], source: str) -> None:
    row = conn.execute("SELECT current_setting('max_replication_slots')::int, "
                       "(SELECT count(*) FROM pg_replication_slots)").fetchone()
    if row is not None and row[1] >= row[0]:
        raise SourceError(
            f"source {source!r}: all {row[0]} replication slots are in use",
            "drop an unused slot (SELECT pg_drop_replication_slot('name')) or raise "
            "max_replication_slots and restart PostgreSQL")


def drop_slot(conn: psycopg.Connection[Any], name: str) -> None:
    conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                 "WHERE slot_name = %s", (name,))
