"""``cdc check-config`` for views: how each view is maintained and why, and — with
``--connect`` — that its SQL runs on the leader (``EXPLAIN``) and on the view's state (DuckDB,
the translated lineage and restricted queries over empty tables typed from the log's schemas),
and that it groups or joins on no loosely compared text column (MariaDB's ``_ci`` and PAD
SPACE collations: the leader would merge ``'A'``, ``'a'`` and ``'a '`` where a follower keeps
them apart)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from cdc.errors import CdcError
from cdc.events import TableId
from cdc.source import Leader
from views.definition import AFFECTED, IMAGES, KEY_COLUMN, LINEAGE, SCOPES, ViewPlan
from views.sink import declared_columns, schema_store, view_plan

if TYPE_CHECKING:
    from cdc.config import Config


class ViewCheckError(CdcError):
    """A view's SQL does not run somewhere it must."""


@dataclass
class ViewCheck:
    name: str
    plan: ViewPlan
    #: what was checked and passed (``leader EXPLAIN``, ``DuckDB``)
    checked: list[str] = field(default_factory=list)
    #: what could not be checked, and why
    skipped: list[str] = field(default_factory=list)
    #: the base tables' columns and state types (from the log's schemas), once known
    tables: dict[TableId, list[tuple[str, str]]] = field(default_factory=dict)


def check_view(config: Config, name: str, leader: Leader | None) -> ViewCheck:
    """Classify view ``name``; with ``leader``, run the checks of the module docstring (a
    :class:`ViewCheckError` naming the place and the fix when one fails)."""
    plan = view_plan(config, name)
    result = ViewCheck(name, plan)
    if leader is None:
        return result
    view = config.views[name]
    leader.query(f"EXPLAIN {view.sql}")
    result.checked.append("leader EXPLAIN")
    _refuse_loose_collations(name, plan, leader)
    store = schema_store(config)
    tables = {table: declared_columns(store, view.source, table)
              for table in plan.captured_tables}
    missing = [str(table) for table, columns in tables.items() if columns is None]
    if missing:
        result.skipped.append(f"DuckDB: no schema in the log yet for {', '.join(missing)} "
                              "(run `cdc capture` first)")
        return result
    result.tables = {t: c or [] for t, c in tables.items()}
    _run_on_empty_state(name, plan, result.tables)
    result.checked.append("DuckDB")
    return result


def _grouped_or_joined(plan: ViewPlan) -> set[tuple[str, str]]:
    """(alias, column) of the columns the view groups, keys or joins on."""
    out: set[tuple[str, str]] = set()
    for column in plan.key:
        expression = plan.outputs.get(column)
        if expression is not None:
            out |= {(c.table, c.name) for c in expression.find_all(exp.Column)}
    for expression in plan.join_conditions:
        out |= {(c.table, c.name) for c in expression.find_all(exp.Column)}
    return out


def _refuse_loose_collations(name: str, plan: ViewPlan, leader: Leader) -> None:
    loose: list[str] = []
    insensitive = {table: leader.loosely_compared_columns(table)
                   for table in plan.captured_tables}
    for part in (plan, *plan.subviews.values()):  # an aggregating subquery groups too
        tables = {ref.alias: ref.table for ref in part.references}
        for alias, column in sorted(_grouped_or_joined(part)):
            table = tables.get(alias) if alias else (part.tables[0] if len(part.tables) == 1
                                                     else None)
            if table is not None and column in insensitive.get(table, set()):
                loose.append(f"{table}.{column}")
    if loose:
        raise ViewCheckError(
            f"view {name} groups, keys or joins on text the leader compares loosely "
            f"({', '.join(loose)}): a case-insensitive or PAD SPACE collation makes 'a', 'A' "
            "and 'a ' one value there, followers compare bytes",
            "give those columns a binary NO PAD collation on the leader (ALTER TABLE ... "
            "MODIFY column ... COLLATE utf8mb4_nopad_bin: utf8mb4_bin still ignores trailing "
            "blanks), so both compare bytes")


def _run_on_empty_state(name: str, plan: ViewPlan,
                        tables: dict[TableId, list[tuple[str, str]]]) -> None:
    import duckdb

    db = duckdb.connect()
    try:
        for table, columns in tables.items():
            data = ", ".join(f'"{column}" {kind}' for column, kind in columns)
            _create_state_table(db, plan.tables.index(table), table, data)
        for table, sub in plan.subviews.items():  # typed by its SQL over those tables
            data = ", ".join(f'"{row[0]}" {row[1]}'
                             for row in db.execute(f"DESCRIBE {sub.full_sql}").fetchall())
            _create_state_table(db, plan.tables.index(table), table, data)
            _create_affected(db, f"{AFFECTED}_{table.table}", sub)
        _create_affected(db, AFFECTED, plan)
        if plan.scope_lineage_sql is not None:
            db.execute(f"CREATE TEMP TABLE {SCOPES} AS {plan.scope_lineage_sql} LIMIT 0"
                       ).fetchall()
        for part in (*plan.subviews.values(), plan):
            for sql in (part.full_sql, part.scope_lineage_sql, part.lineage_sql,
                        part.lineage_early_sql, part.lineage_late_sql, part.restricted_sql):
                if sql:
                    db.execute(f"EXPLAIN {sql}").fetchall()
    except duckdb.Error as exc:
        raise ViewCheckError(f"view {name}: its SQL does not run on the view's state (DuckDB, "
                             f"translated from the leader's dialect): {exc}",
                             f"write views.{name}.sql in SQL both understand (standard "
                             "functions and operators)") from None
    finally:
        db.close()


def _create_state_table(db: Any, index: int, table: TableId, data: str) -> None:
    """An empty state table of ``table`` (its columns ``data``), and its lineage tables."""
    db.execute(f'CREATE SCHEMA IF NOT EXISTS "{table.schema}"').fetchall()
    db.execute(f'CREATE TABLE "{table.schema}"."{table.table}" ("{KEY_COLUMN}" VARCHAR, '
               f"{data})").fetchall()
    db.execute(f"CREATE TEMP TABLE {LINEAGE.format(index=index)} "
               f'("{KEY_COLUMN}" VARCHAR, {data})').fetchall()
    db.execute(f"CREATE TEMP TABLE {IMAGES.format(index=index)} ({data})").fetchall()


def _create_affected(db: Any, name: str, plan: ViewPlan) -> None:
    keys = ", ".join(f'"{column}" AS k{i}' for i, column in enumerate(plan.key))
    db.execute(f"CREATE TEMP TABLE {name} AS SELECT {keys} FROM ({plan.full_sql}) LIMIT 0"
               ).fetchall()
