"""What the MySQL/MariaDB leader must offer, checked before anything changes, and its tables.

Every check names the problem and the statement that fixes it. Nothing here writes to the server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pymysql

from cdc.events import TableId
from connectors.mysql.connection import SourceError, query, quote_ident, variables
from connectors.mysql.requirements import PRIVILEGES, REQUIRED

if TYPE_CHECKING:
    from connectors.mysql.types import MyColumn

@dataclass(frozen=True)
class Server:
    """The leader's identity and flavour."""

    version: str
    mariadb: bool
    server_id: int
    #: MySQL's @@server_uuid (MariaDB has none)
    server_uuid: str | None


def server_info(conn: Any, source: str) -> Server:
    """Identity and binlog settings of the server; :class:`SourceError` for each setting CDC
    cannot work with."""
    version = str(query(conn, "SELECT VERSION()")[0][0])
    found = variables(conn, "server_id", "server_uuid", *(name for name, *_ in REQUIRED))
    for name, wanted, why, fix in REQUIRED:
        value = found.get(name)
        if value is None:
            raise SourceError(f"source {source!r}: the server has no {name} setting ({why}); "
                              f"it is {version}", fix)
        if value.upper() != wanted:
            raise SourceError(f"source {source!r}: {name} is {value}, not {wanted}: {why}", fix)
    return Server(version, "mariadb" in version.lower(), int(found.get("server_id", 0)),
                  found.get("server_uuid") or None)


def check_privileges(conn: Any, source: str, user: str) -> None:
    """REPLICATION SLAVE (the binlog dump) and REPLICATION CLIENT / BINLOG MONITOR (binlog
    positions) on ``*.*``."""
    grants = " ".join(str(row[0]).upper() for row in query(conn, "SHOW GRANTS"))
    global_grants = " ".join(g for g in re.findall(r"GRANT (.*?) ON \*\.\*", grants))
    has_all = "ALL PRIVILEGES" in global_grants
    missing = [name for name, aliases in PRIVILEGES
               if not has_all and not any(alias in global_grants for alias in aliases)]
    if missing:
        raise SourceError(f"source {source!r}: user {user!r} lacks {' and '.join(missing)}",
                          f"GRANT {', '.join(missing)} ON *.* TO '{user}'@'%'")


def replica_connected(conn: Any, server_id: int) -> bool | None:
    """Whether a replica with ``server_id`` is connected to the server now (a running capture
    of the source, or another replica); None when the user may not look (SHOW SLAVE HOSTS)."""
    try:
        hosts = query(conn, "SHOW SLAVE HOSTS")
    except pymysql.err.MySQLError:
        return None
    return any(int(row[0]) == server_id for row in hosts)


def binlog_files(conn: Any, source: str) -> list[tuple[str, int]]:
    """``SHOW BINARY LOGS``: (file, size) oldest first."""
    try:
        return [(str(row[0]), int(row[1])) for row in query(conn, "SHOW BINARY LOGS")]
    except pymysql.err.MySQLError as exc:
        raise SourceError(f"source {source!r}: cannot list the binary logs ({exc.args[-1]})",
                          "GRANT REPLICATION CLIENT ON *.* TO the capture user") from None


def current_position(conn: Any, source: str) -> tuple[str, int]:
    """The server's binlog file and position now (``SHOW MASTER STATUS``)."""
    try:
        rows = query(conn, "SHOW MASTER STATUS")
    except pymysql.err.MySQLError as exc:
        raise SourceError(f"source {source!r}: cannot read the binlog position "
                          f"({exc.args[-1]})",
                          "GRANT REPLICATION CLIENT ON *.* TO the capture user") from None
    if not rows:
        raise SourceError(f"source {source!r}: the server reports no binary log",
                          "start it with log_bin")
    return str(rows[0][0]), int(rows[0][1])


def expires_binlogs(conn: Any) -> bool:
    """Whether the server purges binlogs by age (``binlog_expire_logs_seconds`` or
    ``expire_logs_days`` set)."""
    found = variables(conn, "binlog_expire_logs_seconds", "expire_logs_days")
    return any(float(value or 0) > 0 for value in found.values())


def file_sequence(name: str) -> int:
    """The number at the end of a binlog file name (``mysql-bin.000042`` -> 42)."""
    match = re.search(r"\.(\d+)$", name)
    if match is None:
        raise SourceError(f"binlog file name {name!r} does not end in a sequence number",
                          "report it: cdc expects the server's usual NAME.000001 naming")
    return int(match.group(1))


# ----------------------------------------------------------------------------------- tables

@dataclass(frozen=True)
class TableInfo:
    table: TableId
    columns: tuple[MyColumn, ...]
    primary_key: tuple[str, ...]


def table_info(conn: Any, source: str, table: TableId) -> TableInfo:
    """Columns and primary key of ``table`` now; :class:`SourceError` if it does not exist or
    cannot be read."""
    from connectors.mysql.types import (
        CHECK_CLAUSES_SQL,
        INFO_SCHEMA_COLUMNS_SQL,
        column_from_info_schema,
        mariadb_json_columns,
    )

    rows = query(conn, INFO_SCHEMA_COLUMNS_SQL, (table.schema, table.table))
    if not rows:
        raise SourceError(f"source {source!r}: table {table} does not exist (or the capture "
                          "user cannot see it)",
                          f"create it, correct the name under tables:, or GRANT SELECT ON "
                          f"{quote_ident(table.schema)}.* TO the capture user")
    try:
        query(conn, f"SELECT 1 FROM {qualified(table)} LIMIT 0")
    except pymysql.err.MySQLError as exc:
        raise SourceError(f"source {source!r}: cannot read {table} ({exc.args[-1]})",
                          f"GRANT SELECT ON {qualified(table)} TO the capture user") from None
    try:
        checks = [str(row[0]) for row in query(conn, CHECK_CLAUSES_SQL,
                                               (table.schema, table.table))]
    except pymysql.err.MySQLError:  # MySQL's CHECK_CONSTRAINTS has no TABLE_NAME
        checks = []
    json_columns = mariadb_json_columns(checks)
    columns = tuple(column_from_info_schema(row, str(table), json_columns) for row in rows)
    key = tuple(c.name for c in columns if c.primary_key)
    if key:  # in the primary key's own order
        key = tuple(str(row[0]) for row in query(
            conn, "SELECT column_name FROM information_schema.key_column_usage WHERE "
                  "table_schema = %s AND table_name = %s AND constraint_name = 'PRIMARY' "
                  "ORDER BY ordinal_position", (table.schema, table.table)))
    return TableInfo(table, columns, key)


def key_columns(info: TableInfo, source: str, configured: list[str] | None) -> tuple[str, ...]:
    """The key: the configured columns, else the primary key; refuse a table with neither."""
    names = {c.name for c in info.columns}
    if configured:
        unknown = [c for c in configured if c not in names]
        if unknown:
            raise SourceError(f"source {source!r}: keys for {info.table} name column(s) "
                              f"{unknown} it does not have",
                              f"use some of: {', '.join(sorted(names))}")
        return tuple(configured)
    if not info.primary_key:
        raise SourceError(f"source {source!r}: table {info.table} has no primary key, so its "
                          "changes cannot be keyed",
                          f"add one (ALTER TABLE {qualified(info.table)} ADD PRIMARY KEY ...), or "
                          f"configure its key columns: keys: {{{info.table}: [col, ...]}}")
    return info.primary_key


def cascades(conn: Any, tables: list[TableId]) -> list[str]:
    """Foreign keys with ON DELETE/UPDATE CASCADE (or SET NULL/DEFAULT) whose child or parent is
    captured: InnoDB applies those changes without writing them to the binlog."""
    out = []
    captured = {(t.schema, t.table) for t in tables}
    rows = query(conn, "SELECT constraint_schema, table_name, constraint_name, "
                       "unique_constraint_schema, referenced_table_name, delete_rule, update_rule "
                       "FROM information_schema.referential_constraints")
    for schema, child, name, parent_schema, parent, on_delete, on_update in rows:
        rules = [f"ON {what} {rule}" for what, rule in (("DELETE", on_delete),
                                                       ("UPDATE", on_update))
                 if str(rule).upper() in ("CASCADE", "SET NULL", "SET DEFAULT")]
        if rules and ((schema, child) in captured or (parent_schema, parent) in captured):
            out.append(f"foreign key {name} of {schema}.{child} -> {parent_schema}.{parent} "
                       f"has {' and '.join(rules)}: InnoDB never writes the rows it changes that "
                       f"way to the binlog, so {schema}.{child}'s followers miss them (make the "
                       "application delete/update the child rows itself, or re-snapshot)")
    return out


def qualified(table: TableId) -> str:
    return f"{quote_ident(table.schema)}.{quote_ident(table.table)}"
