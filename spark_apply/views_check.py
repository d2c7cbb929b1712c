"""``cdc check-config --connect``'s Spark check of a view: the view's SQL, translated from the
leader's dialect by sqlglot, is analysed by Spark SQL over empty tables of the base tables'
types (no job runs: analysis only). So the same text runs on the leader, on the view's state
(DuckDB, ``views/check.py``) and in Spark (where a user may recompute it, as
``bench/views.py`` does)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from cdc.errors import CdcError
from cdc.events import TableId

#: DuckDB state types (``views/types.py``) -> Spark SQL types
_SPARK_TYPES = {"BOOLEAN": "boolean", "BIGINT": "bigint", "DOUBLE": "double", "DATE": "date",
                "TIMESTAMP": "timestamp", "VARCHAR": "string"}


def spark_type(duckdb_type: str) -> str:
    decimal = re.fullmatch(r"DECIMAL\((\d+),\s*(\d+)\)", duckdb_type.upper())
    if decimal:
        return f"decimal({decimal.group(1)},{decimal.group(2)})"
    return _SPARK_TYPES.get(duckdb_type.upper(), "string")


def temp_view_name(table: TableId) -> str:
    return f"cdc_{table.schema}__{table.table}".replace('"', "")


def spark_sql(sql: str, dialect: str) -> str:
    """``sql`` (the leader's dialect) in Spark's, each table named :func:`temp_view_name`."""
    import sqlglot
    from sqlglot import exp

    from views.definition import DIALECTS

    tree = sqlglot.parse_one(sql, read=DIALECTS.get(dialect, dialect))
    for node in list(tree.find_all(exp.Table)):
        if not node.db:
            continue
        alias = node.alias or node.name
        node.replace(exp.Table(this=exp.to_identifier(temp_view_name(TableId(node.db,
                                                                             node.name))),
                               alias=exp.TableAlias(this=exp.to_identifier(alias))))
    return str(tree.sql(dialect="spark"))


def check_in_spark(spark: Any, name: str, sql: str, dialect: str,
                   tables: Mapping[TableId, Sequence[tuple[str, str]]]) -> list[str]:
    """Analyse view ``name`` in Spark over empty tables (``tables``: columns and DuckDB types);
    its output columns. A :class:`CdcError` naming the problem when Spark refuses it."""
    for table, columns in tables.items():
        schema = ", ".join(f"`{column}` {spark_type(kind)}" for column, kind in columns)
        spark.createDataFrame([], schema).createOrReplaceTempView(temp_view_name(table))
    translated = spark_view_sql(sql, dialect, list(tables))
    try:
        return list(spark.sql(translated).columns)
    except Exception as exc:  # noqa: BLE001 - Spark's AnalysisException and parse errors
        first = str(exc).strip().splitlines()[0][:300]
        raise CdcError(f"view {name}: Spark SQL refuses its SQL (translated from the leader's "
                       f"dialect): {first}",
                       f"write views.{name}.sql in SQL the leader and Spark both understand "
                       "(standard functions and operators)") from None


def spark_view_sql(sql: str, dialect: str, tables: Sequence[TableId]) -> str:
    """A view's ``sql`` (bare table names among ``tables`` allowed) in Spark's dialect."""
    return spark_sql(_qualified(sql, dialect, tables), dialect)


def _qualified(sql: str, dialect: str, tables: Sequence[TableId]) -> str:
    """``sql`` with bare table names qualified by their captured schema."""
    import sqlglot
    from sqlglot import exp

    from views.definition import DIALECTS

    by_name = {table.table: table for table in tables}
    tree = sqlglot.parse_one(sql, read=DIALECTS.get(dialect, dialect))
    for node in tree.find_all(exp.Table):
        if not node.db and node.name in by_name:
            node.set("db", exp.to_identifier(by_name[node.name].schema))
    return str(tree.sql(dialect=DIALECTS.get(dialect, dialect)))
