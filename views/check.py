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
from views import collation
from views.definition import (
    AFFECTED,
    FLIP,
    FLIP_NEW,
    IMAGES,
    KEY_COLUMN,
    LINEAGE,
    NEW,
    SCOPES,
    ViewPlan,
)
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


def _refuse_loose_collations(name: str, plan: ViewPlan, leader: Leader) -> None:
    """A view that compares text the leader compares otherwise (its collation) is refused,
    naming each column and where: equality under a loose collation (case-insensitive,
    PAD SPACE), order under any collation but code point order."""
    from cdc.source import TextComparison

    found: dict[TableId, dict[str, TextComparison]] = {
        table: leader.text_comparisons(table) for table in plan.captured_tables}
    wrong: dict[str, str] = {}
    for part in (plan, *plan.subviews.values()):  # an aggregating subquery compares too
        if part.tree is None:
            continue
        tables = {ref.alias: ref.table for ref in part.references}
        keys = [c for k in part.key if (e := part.outputs.get(k)) is not None
                for c in e.find_all(exp.Column)]
        for column in [*part.tree.find_all(exp.Column), *keys]:
            table = tables.get(column.table) if column.table else (
                part.tables[0] if len(part.tables) == 1 else None)
            compared = found.get(table, {}).get(column.name) if table else None
            if compared is None:
                continue
            how = "=" if column in keys else collation.compared(column)
            ordered_here = plan.icu.get(table, {}).get(column.name) if table else None
            if ordered_here is not None and ordered_here != compared.icu_locale \
                    and collation.ordered_by_icu(column):
                wrong.setdefault(f"{table}.{column.name} ({compared.collation})",
                                 f"order (the log's schema says ICU locale {ordered_here!r}: "
                                 "run cdc capture until it records the column's new collation)")
            elif compared.ascii_case and column.find_ancestor(*collation.CASE_MAPPING) \
                    is not None:
                wrong.setdefault(f"{table}.{column.name} ({compared.collation})",
                                 "upper/lower (ASCII letters only on the leader)")
            elif how == "=" and compared.loose:
                wrong.setdefault(f"{table}.{column.name} ({compared.collation})", "equality")
            elif how == "<" and (compared.loose or compared.ordered):
                wrong.setdefault(f"{table}.{column.name} ({compared.collation})", "order")
    if wrong:
        raise ViewCheckError(
            f"view {name} compares text the leader compares by its collation, where the view's "
            f"state compares code points: "
            + "; ".join(f"{column}: {how}" for column, how in sorted(wrong.items()))
            + " (a case-insensitive or PAD SPACE collation makes 'a', 'A' and 'a ' one value; "
            "a language's collation orders 'B' before 'a'; under PostgreSQL's C collation "
            "upper('é') is 'é')",
            "give those columns a collation that compares code points on the leader "
            "(MariaDB: ALTER TABLE ... MODIFY column ... COLLATE utf8mb4_nopad_bin -- "
            "utf8mb4_bin still ignores trailing blanks; PostgreSQL: ALTER TABLE ... ALTER "
            "COLUMN ... TYPE ... COLLATE \"C.utf8\"), or leave them out of comparisons, "
            "grouping, ordering and upper/lower in the view (projecting them is fine)")


def _run_on_empty_state(name: str, plan: ViewPlan,
                        tables: dict[TableId, list[tuple[str, str]]]) -> None:
    import duckdb

    from views.types import set_up_state

    db = set_up_state(duckdb.connect())
    try:
        for table, columns in tables.items():
            data = ", ".join(f'"{column}" {kind}' for column, kind in columns)
            _create_state_table(db, plan.tables.index(table), table, data)
        for table, sub in plan.subviews.items():  # typed by its SQL over those tables
            described = db.execute(f"DESCRIBE {sub.full_sql}").fetchall()
            data = ", ".join(f'"{row[0]}" {row[1]}' for row in described)
            _create_state_table(db, plan.tables.index(table), table, data)
            db.execute(f"CREATE TEMP TABLE {FLIP.format(index=plan.tables.index(table))} ("
                       + ", ".join([data, *(f'"{FLIP_NEW.format(name=row[0])}" {row[1]}'
                                            for row in described)]) + ")").fetchall()
            _create_affected(db, f"{AFFECTED}_{table.table}", sub)
        _create_affected(db, AFFECTED, plan)
        if plan.scope_lineage_sql is not None:
            db.execute(f"CREATE TEMP TABLE {SCOPES} AS {plan.scope_lineage_sql} LIMIT 0"
                       ).fetchall()
        for part in (*plan.subviews.values(), plan):
            for sql in (part.full_sql, part.scope_lineage_sql, part.lineage_sql,
                        part.lineage_early_sql, part.lineage_late_sql, part.restricted_sql,
                        part.delta_sql, part.delta_early_sql, part.delta_late_sql,
                        *part.flip_sql.values()):
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
    db.execute(f'CREATE TEMP TABLE {NEW.format(index=index)} ("{KEY_COLUMN}" VARCHAR, {data})'
               ).fetchall()


def _create_affected(db: Any, name: str, plan: ViewPlan) -> None:
    keys = ", ".join(f'"{column}" AS k{i}' for i, column in enumerate(plan.key))
    db.execute(f"CREATE TEMP TABLE {name} AS SELECT {keys} FROM ({plan.full_sql}) LIMIT 0"
               ).fetchall()
