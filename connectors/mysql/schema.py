"""Captured MySQL/MariaDB tables: their :class:`~cdc.events.TableSchema` and value converters,
built from information_schema (snapshot) or from a binlog table map (stream).

Column names and base types of a streamed change come from its own table-map event
(``binlog_row_metadata=FULL``), never from today's information_schema: an old event is read with
the columns it was written with. information_schema only *refines* a table map's description
(a MariaDB ``UUID`` or ``INET6`` looks like ``BINARY(16)`` in a table map) when its column list
agrees with the table map's, names and base types alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc.events import Column, TableId, TableSchema
from connectors.mysql.connection import SourceError
from connectors.mysql.settings import MySqlSourceConfig
from connectors.mysql.types import MyColumn, binlog_converter, column_type, snapshot_converter

CONNECTOR = "mysql"


@dataclass
class CapturedTable:
    """One version of a captured table: schema, columns and per-column converters."""

    schema: TableSchema
    columns: tuple[MyColumn, ...]
    #: (column name, converter or None) for snapshot rows (PyMySQL values), in column order
    snapshot: list[tuple[str, Callable[[Any], Any] | None]] = field(init=False)
    #: the same for binlog rows (pymysqlreplication values)
    binlog: list[tuple[str, Callable[[Any], Any] | None]] = field(init=False)

    def __post_init__(self) -> None:
        self.snapshot = [(c.name, snapshot_converter(c)) for c in self.columns]
        self.binlog = [(c.name, binlog_converter(c)) for c in self.columns]

    def snapshot_row(self, values: Sequence[Any]) -> dict[str, Any]:
        return {name: value if convert is None or value is None else convert(value)
                for (name, convert), value in zip(self.snapshot, values, strict=True)}

    def binlog_row(self, values: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, convert in self.binlog:
            value = values.get(name)
            out[name] = value if convert is None or value is None else convert(value)
        return out


def build(source: MySqlSourceConfig, table: TableId, columns: Sequence[MyColumn],
          primary_key: Sequence[str]) -> CapturedTable:
    """A table version from its columns; the key is the configured one, else the primary key."""
    kept = tuple(columns)  # VIRTUAL generated columns too: MariaDB logs their values
    names = {c.name for c in kept}
    configured = source.keys.get(str(table)) or source.keys.get(_config_name(source, table))
    key = tuple(configured or primary_key)
    if not key:
        raise SourceError(f"source {source.name!r}: table {table} has no primary key, so its "
                          "changes cannot be keyed",
                          f"add a primary key, or configure its key columns: keys: "
                          f"{{{table}: [col, ...]}}")
    missing = [k for k in key if k not in names]
    if missing:
        raise SourceError(f"source {source.name!r}: key column(s) {missing} of {table} are not "
                          "among its (stored) columns", "correct keys: in the config")
    schema_columns = tuple(Column(c.name, column_type(c), nullable=c.name not in key)
                           for c in kept)
    schema = TableSchema(source.name, table.schema, table, schema_columns, key,
                         connector=CONNECTOR)
    return CapturedTable(schema, kept)


def _config_name(source: MySqlSourceConfig, table: TableId) -> str:
    for name in source.tables:
        if TableId.parse(name) == table:
            return name
    return str(table)
