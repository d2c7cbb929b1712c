"""A view's SQL, understood: which captured tables it reads, whether it can be maintained
incrementally, and the three queries the engine runs on the base tables' current state.

The user writes the view once, in the leader's own dialect (PostgreSQL or MySQL/MariaDB): the
same text runs on the leader (``cdc verify --view``) and, translated by sqlglot, on the view's
state (DuckDB: ``views/state.py``). :func:`analyze` parses it and decides:

* **incremental** — one ``SELECT`` (no set operation, CTE, subquery, window function, LIMIT,
  or DISTINCT without GROUP BY)
  over captured tables joined with INNER or LEFT equi-joins (a LEFT join's ``ON`` holds at
  least one equality between the joined table and the tables before it), with or without
  GROUP BY/HAVING and any deterministic aggregate. Each key column is an output column whose
  expression is not an aggregate; with GROUP BY, each is one of the grouping expressions, so
  one key value covers whole groups. Then a batch of base-table changes is applied by **keyed
  recomputation** (``docs/views.md``):

  1. the *lineage query* finds the view keys of every joined tuple that involves a changed row
     (its old image in the state before the batch, its new image after), plus — per LEFT join
     — the tuples null-extended on that table whose join values equal a changed row's old or
     new join values (a match appearing retracts them);
  2. the *restricted query* recomputes the view for exactly those keys, from the new state;
  3. the engine compares with what the view held for those keys: changed rows are upserted,
     keys no longer produced are deleted.

* **recompute** — anything else: the whole query runs on the new state after each batch that
  touched its tables and the result is compared with the view's rows. Still exact; the work is
  proportional to the tables. :attr:`ViewPlan.reason` says why.

A function whose value changes by itself (``now()``, ``random()``) is refused: no follower of
the log can keep such a view equal to the leader.

Table references resolve against the view's source: ``schema.table`` as captured, or a bare
table name that exactly one captured table has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp

from cdc.errors import ConfigError
from cdc.events import TableId

#: the state's own columns in every base table (never a leader column: ``_cdc`` is reserved)
KEY_COLUMN = "_cdc_key"
#: the temporary tables the engine fills before running the lineage/restricted queries
#: the changed rows' images in the current state (before the batch's write: their old rows;
#: after it: their new rows), with every column of the state's table
LINEAGE = "_cdc_lineage_{index}"
IMAGES = "_cdc_images_{index}"     # the old and new images of those rows (the table's columns)
AFFECTED = "_cdc_affected"        # (k0, k1, ...): the view keys to recompute

#: the leader kinds' sqlglot dialects
DIALECTS = {"postgres": "postgres", "mysql": "mysql"}

#: functions whose value changes without a change to the tables
_VOLATILE = (exp.CurrentDate, exp.CurrentDatetime, exp.CurrentTime, exp.CurrentTimestamp,
             exp.Rand, exp.Randn, exp.Uuid)
_VOLATILE_NAMES = frozenset({"now", "random", "rand", "uuid", "gen_random_uuid", "clock_timestamp",
                             "statement_timestamp", "timeofday", "sysdate", "current_user",
                             "localtime", "localtimestamp", "unix_timestamp", "utc_timestamp",
                             "txid_current", "nextval"})


class ViewDefinitionError(ConfigError):
    """A view's SQL or key cannot be used (the message names the view and the fix)."""


@dataclass(frozen=True)
class BaseTable:
    """One table reference of the view: its alias in the SQL and the captured table."""

    alias: str
    table: TableId
    #: its position in :attr:`ViewPlan.tables` (names the temporary tables)
    index: int


@dataclass
class ViewPlan:
    """What :func:`analyze` found out about a view."""

    name: str
    #: ``incremental`` or ``recompute``
    mode: str
    #: why ``recompute`` (empty when incremental)
    reason: str
    #: the distinct captured tables the view reads, in order of first reference
    tables: list[TableId]
    #: every table reference (a self-join references one table twice)
    references: list[BaseTable]
    #: the output columns, in order
    columns: list[str]
    #: the key columns (a subset of ``columns``), in the config's order
    key: list[str]
    #: the view in DuckDB's dialect over the state's tables
    full_sql: str
    #: the lineage and restricted queries (``None`` when ``mode`` is ``recompute``)
    lineage_sql: str | None = None
    restricted_sql: str | None = None
    #: each output column's expression (as written)
    outputs: dict[str, exp.Expr] = field(default_factory=dict)
    #: the joins' ON conditions (as written)
    join_conditions: list[exp.Expr] = field(default_factory=list)
    #: per table, the columns the SQL names (qualified, or unqualified with one table)
    referenced: dict[TableId, set[str]] = field(default_factory=dict)


def analyze(name: str, sql: str, key: Sequence[str], dialect: str,
            captured: Sequence[TableId]) -> ViewPlan:
    """Parse and classify view ``name`` (see the module docstring); ``captured``: the tables
    its source captures. A :class:`ViewDefinitionError` for SQL that cannot be a view."""
    tree = _parse(name, sql, dialect)
    references = _resolve_tables(name, tree, captured)
    volatile = _volatile(tree)
    if volatile:
        raise ViewDefinitionError(
            f"view {name} calls {volatile}, whose value changes without any change to the "
            "tables: no follower of the change log can keep such a view equal to the leader",
            f"remove it from views.{name}.sql (compute it when reading the view instead)")
    tables = list(dict.fromkeys(ref.table for ref in references))
    if not isinstance(tree, exp.Select):
        return _recompute(name, tree, key, references, tables,
                          "it is not a single SELECT (a set operation such as UNION)")
    columns = _output_columns(name, tree)
    _check_key(name, key, columns)
    reason = _not_incremental(tree)
    if reason:
        return _recompute(name, tree, key, references, tables, reason)
    key_exprs = _key_expressions(name, tree, key)
    joins = _left_join_equalities(tree, references)
    if isinstance(joins, str):
        return _recompute(name, tree, key, references, tables, joins)
    full = _state_sql(tree, references)
    plan = ViewPlan(name, "incremental", "", tables, references, columns, list(key), full)
    plan.lineage_sql = _lineage_sql(tree, references, key_exprs, joins)
    plan.restricted_sql = _restricted_sql(tree, references, key_exprs)
    plan.outputs = _outputs(tree)
    plan.join_conditions = _join_conditions(tree)
    plan.referenced = _referenced(tree, references)
    return plan


def _outputs(tree: exp.Query) -> dict[str, exp.Expr]:
    return {projection.alias_or_name: projection.unalias() for projection in tree.selects}


def _referenced(tree: exp.Query, references: Sequence[BaseTable]) -> dict[TableId, set[str]]:
    tables = {ref.alias: ref.table for ref in references}
    only = references[0].table if len({ref.table for ref in references}) == 1 else None
    aliases = {projection.alias for projection in tree.selects if projection.alias}
    out: dict[TableId, set[str]] = {}
    for column in tree.find_all(exp.Column):
        table = tables.get(column.table) if column.table else only
        if table is not None and (column.table or column.name not in aliases):
            out.setdefault(table, set()).add(column.name)
    return out


def _join_conditions(tree: exp.Query) -> list[exp.Expr]:
    return [join.args["on"] for select in tree.find_all(exp.Select)
            for join in select.args.get("joins") or [] if join.args.get("on") is not None]


#: expressions whose value is computed in floating point
_FLOATING = (exp.Avg, exp.Stddev, exp.StddevPop, exp.StddevSamp, exp.Variance, exp.VariancePop,
             exp.Div)


def approximate_columns(plan: ViewPlan, doubles: Mapping[str, set[str]]) -> list[str]:
    """The output columns computed in floating point: an AVG, a standard deviation or
    variance, a division, a cast to a float type, or a base column held as DOUBLE
    (``doubles``: per ``schema.table``, such columns). ``cdc verify --view`` compares them
    with a tolerance."""
    tables = {ref.alias: str(ref.table) for ref in plan.references}
    out: list[str] = []
    for column, expression in plan.outputs.items():
        floating = any(True for _ in expression.find_all(*_FLOATING)) or any(
            cast.to.is_type(*exp.DataType.FLOAT_TYPES) for cast in expression.find_all(exp.Cast))
        for reference in expression.find_all(exp.Column):
            held = doubles.get(tables.get(reference.table, ""), set()) if reference.table else \
                set().union(*doubles.values()) if doubles else set()
            floating = floating or reference.name in held
        if floating:
            out.append(column)
    return out


# --------------------------------------------------------------------------- parsing

def _parse(name: str, sql: str, dialect: str) -> exp.Query:
    try:
        trees = [tree for tree in sqlglot.parse(sql, read=DIALECTS.get(dialect, dialect))
                 if tree is not None]
    except sqlglot.errors.ParseError as exc:
        first = str(exc).splitlines()[0]
        raise ViewDefinitionError(f"view {name}: its SQL does not parse ({first})",
                                  f"correct views.{name}.sql (it is {dialect} SQL: the same "
                                  "text runs on the leader)") from None
    if len(trees) != 1:
        raise ViewDefinitionError(f"view {name}: its SQL holds {len(trees)} statements",
                                  f"write one SELECT in views.{name}.sql")
    tree = trees[0]
    if not isinstance(tree, exp.Query):
        raise ViewDefinitionError(f"view {name}: its SQL is not a query ({tree.key.upper()})",
                                  f"write a SELECT in views.{name}.sql")
    return tree


def _resolve_tables(name: str, tree: exp.Expr,
                    captured: Sequence[TableId]) -> list[BaseTable]:
    """Every table reference, resolved to a captured table (else a clear error)."""
    by_name: dict[str, list[TableId]] = {}
    for table in captured:
        by_name.setdefault(table.table, []).append(table)
    out: list[BaseTable] = []
    indexes: dict[TableId, int] = {}
    for node in _table_nodes(tree):
        if node.db:
            wanted = TableId(node.db, node.name)
            if wanted not in captured:
                raise ViewDefinitionError(
                    f"view {name} reads {wanted}, which its source does not capture",
                    "add the table to the source's tables, or correct the name")
        else:
            found = by_name.get(node.name, [])
            if len(found) != 1:
                what = "no captured table" if not found else \
                    f"{len(found)} captured tables ({', '.join(map(str, found))})"
                raise ViewDefinitionError(f"view {name} reads {node.name}, which names {what}",
                                          "qualify the table as schema.table, one the source "
                                          "captures")
            wanted = found[0]
        index = indexes.setdefault(wanted, len(indexes))
        out.append(BaseTable(node.alias_or_name, wanted, index))
    if not out:
        raise ViewDefinitionError(f"view {name} reads no table",
                                  f"select from the source's tables in views.{name}.sql")
    return out


def _table_nodes(tree: exp.Expr) -> list[exp.Table]:
    """The table references of ``tree`` that name tables (not its CTEs), in order."""
    ctes = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    return [node for node in tree.find_all(exp.Table) if node.db or node.name not in ctes]


def _output_columns(name: str, tree: exp.Select) -> list[str]:
    columns: list[str] = []
    for projection in tree.expressions:
        if isinstance(projection, exp.Star) or (isinstance(projection, exp.Column)
                                                and isinstance(projection.this, exp.Star)):
            raise ViewDefinitionError(f"view {name}: SELECT * leaves the view's columns to the "
                                      "tables' current columns",
                                      f"list the columns in views.{name}.sql")
        column = projection.alias_or_name
        if not column:
            raise ViewDefinitionError(f"view {name}: the output column {projection.sql()} has "
                                      "no name", "give it one with AS")
        columns.append(column)
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise ViewDefinitionError(f"view {name}: output columns {repeated} appear twice",
                                  "give each output column its own name with AS")
    return columns


def _check_key(name: str, key: Sequence[str], columns: Sequence[str]) -> None:
    if not key:
        raise ViewDefinitionError(f"view {name} has no key",
                                  f"set views.{name}.key to the output columns that identify "
                                  "a row (the GROUP BY columns of an aggregate)")
    missing = [column for column in key if column not in columns]
    if missing:
        raise ViewDefinitionError(f"view {name}: key columns {missing} are not output columns "
                                  f"(it has {', '.join(columns)})",
                                  f"correct views.{name}.key")


# ------------------------------------------------------------------------ classification

def _not_incremental(tree: exp.Select) -> str:
    """Why ``tree`` is outside the incremental class ('' when inside)."""
    if tree.args.get("with_") or tree.args.get("with"):
        return "it has a WITH clause"
    for node in tree.find_all(exp.Subquery, exp.Select):
        if node is not tree:
            return "it has a subquery"
    if any(True for _ in tree.find_all(exp.Window)):
        return "it has a window function"
    if tree.args.get("limit") or tree.args.get("offset"):
        return "it has LIMIT/OFFSET"
    if tree.args.get("distinct") and not tree.args.get("group"):
        return "it has SELECT DISTINCT (write GROUP BY instead)"
    for join in tree.args.get("joins") or []:
        side = (join.side or "").upper()
        if side in ("RIGHT", "FULL"):
            return f"it has a {side} JOIN (write it as a LEFT JOIN)"
        if join.args.get("using"):
            return "it has a JOIN ... USING (write ON a.x = b.x)"
        if (join.kind or "").upper() in ("ANTI", "SEMI", "NATURAL"):
            return f"it has a {join.kind.upper()} JOIN"
    if not tree.args.get("group") and _has_aggregate(tree.expressions):
        return "it aggregates without GROUP BY (one row for the whole table)"
    return ""


def _volatile(tree: exp.Expr) -> str:
    for node in tree.find_all(exp.Func):
        if isinstance(node, _VOLATILE):
            return node.sql()
        if isinstance(node, exp.Anonymous) and str(node.name).lower() in _VOLATILE_NAMES:
            return node.sql()
    return ""


def _has_aggregate(nodes: Sequence[exp.Expr]) -> bool:
    return any(True for node in nodes for _ in node.find_all(exp.AggFunc))


def _key_expressions(name: str, tree: exp.Select, key: Sequence[str]) -> list[exp.Expr]:
    """The expression of each key column; with GROUP BY, each must be a grouping expression."""
    by_column = {projection.alias_or_name: projection.unalias() for projection in tree.expressions}
    out = [by_column[column] for column in key]
    for column, expression in zip(key, out, strict=True):
        if _has_aggregate([expression]):
            raise ViewDefinitionError(f"view {name}: key column {column} is an aggregate",
                                      "key a view by the GROUP BY columns")
    group = tree.args.get("group")
    if group is not None:
        grouped = {_canonical(expression) for expression in _grouping(tree)}
        loose = [column for column, expression in zip(key, out, strict=True)
                 if _canonical(expression) not in grouped]
        if loose:
            raise ViewDefinitionError(f"view {name}: key columns {loose} are not GROUP BY "
                                      "expressions, so one key could span several groups",
                                      f"key the view by GROUP BY columns (views.{name}.key)")
    return out


def _grouping(tree: exp.Select) -> list[exp.Expr]:
    """The GROUP BY expressions, with ordinals and output aliases resolved."""
    projections = [projection.unalias() for projection in tree.expressions]
    by_alias = {projection.alias: projection.unalias() for projection in tree.expressions
                if projection.alias}
    out: list[exp.Expr] = []
    for item in tree.args["group"].expressions:
        if isinstance(item, exp.Literal) and item.is_int:
            out.append(projections[int(item.this) - 1])
        elif isinstance(item, exp.Column) and not item.table and item.name in by_alias:
            out.append(by_alias[item.name])
        else:
            out.append(item)
    return out


def _canonical(expression: exp.Expr) -> str:
    return expression.sql(dialect="duckdb", normalize=True)


def _aliases_in(expression: exp.Expr) -> set[str]:
    return {column.table for column in expression.find_all(exp.Column) if column.table}


def _left_join_equalities(tree: exp.Select, references: Sequence[BaseTable]
                          ) -> dict[int, list[tuple[str, exp.Expr]]] | str:
    """Per LEFT-joined reference (by its position in ``references``): the pairs (its column,
    the expression over earlier tables it must equal) of its ``ON``; a reason string when a
    LEFT join has no such equality."""
    aliases = [ref.alias for ref in references]
    out: dict[int, list[tuple[str, exp.Expr]]] = {}
    for position, join in enumerate(tree.args.get("joins") or [], start=1):
        if (join.side or "").upper() != "LEFT":
            continue
        mine = aliases[position]
        earlier = set(aliases[:position])
        pairs: list[tuple[str, exp.Expr]] = []
        condition = join.args.get("on")
        for term in condition.flatten() if isinstance(condition, exp.And) else [condition]:
            if not isinstance(term, exp.EQ):
                continue
            for here, there in ((term.this, term.expression), (term.expression, term.this)):
                if isinstance(here, exp.Column) and here.table == mine and \
                        _aliases_in(there) and _aliases_in(there) <= earlier:
                    pairs.append((here.name, there))
                    break
        if not pairs:
            return f"its LEFT JOIN of {mine} has no equality with the tables before it"
        out[position] = pairs
    if len(aliases) != 1 + len(tree.args.get("joins") or []):
        return "its FROM lists several tables (write them as JOINs)"
    return out


# --------------------------------------------------------------------------- the queries

def _state_tree(tree: exp.Query, references: Sequence[BaseTable],
                replace: Mapping[int, str] | None = None) -> exp.Select:
    """``tree`` with every table reference naming the state's table (``schema.table``,
    quoted), its alias kept; the references at the positions of ``replace`` name that
    (temporary) table instead, and a LEFT JOIN of one becomes an inner join."""
    copy = tree.copy()
    for position, (node, ref) in enumerate(zip(_table_nodes(copy), references, strict=True)):
        alias = exp.TableAlias(this=exp.to_identifier(ref.alias, quoted=True))
        if replace is not None and position in replace:
            parent = node.parent
            if isinstance(parent, exp.Join) and parent.this is node:
                parent.set("side", None)
            node.replace(exp.Table(this=exp.to_identifier(replace[position]), alias=alias))
            continue
        node.replace(exp.Table(this=exp.to_identifier(ref.table.table, quoted=True),
                               db=exp.to_identifier(ref.table.schema, quoted=True),
                               alias=alias))
    return copy  # type: ignore[return-value]  # a Select wherever one is needed


def _state_sql(tree: exp.Query, references: Sequence[BaseTable]) -> str:
    return _state_tree(tree, references).sql(dialect="duckdb")


def _quoted_alias_column(alias: str, column: str) -> exp.Column:
    return exp.column(exp.to_identifier(column, quoted=True),
                      table=exp.to_identifier(alias, quoted=True))


def _lineage_sql(tree: exp.Select, references: Sequence[BaseTable],
                 key_exprs: Sequence[exp.Expr],
                 joins: Mapping[int, list[tuple[str, exp.Expr]]]) -> str:
    """The keys of every tuple involving a changed row, or null-extended where a changed
    row's join values match (see the module docstring), as a UNION of branches, each
    ``SELECT <key exprs> FROM <the view's joins> WHERE <its filter>``:

    * per table reference, the joins with that reference reading only the changed rows'
      images in the current state (:data:`LINEAGE`; a LEFT JOIN of it becomes inner: a tuple
      involving one of its rows has that row), the others the whole tables — so each branch
      joins a few rows against the tables, instead of the whole join being filtered;
    * with LEFT JOINs, one branch over the whole tables, filtered to the tuples null-extended
      on a left-joined table whose join values equal a changed row's old or new ones."""

    def keys_of(select: exp.Select) -> exp.Select:
        for arg in ("group", "having", "order", "distinct"):
            select.set(arg, None)
        select.set("expressions", [expression.copy().as_(f"k{i}")
                                   for i, expression in enumerate(key_exprs)])
        return select

    branches = [keys_of(_state_tree(tree, references,
                                    {position: LINEAGE.format(index=ref.index)}))
                for position, ref in enumerate(references)]
    extended: list[exp.Expr | exp.Condition] = []
    for position, pairs in joins.items():
        ref = references[position]
        images = exp.to_identifier(IMAGES.format(index=ref.index))
        match = exp.and_(*[exp.EQ(this=exp.column(exp.to_identifier(column, quoted=True),
                                                  table="_m"), expression=other.copy())
                           for column, other in pairs])
        exists = exp.Exists(this=exp.select("1").from_(exp.Table(this=images,
                                                                 alias=exp.TableAlias(
                                                                     this="_m"))).where(match))
        extended.append(exp.and_(exp.Is(this=_quoted_alias_column(ref.alias, KEY_COLUMN),
                                        expression=exp.Null()), exists))
    if extended:
        branches.append(keys_of(_state_tree(tree, references)).where(
            exp.paren(exp.or_(*extended)), copy=False))
    return " UNION ".join(str(branch.sql(dialect="duckdb")) for branch in branches)


def _restricted_sql(tree: exp.Select, references: Sequence[BaseTable],
                    key_exprs: Sequence[exp.Expr]) -> str:
    """The view's query over only the tuples whose key is in the affected table."""
    match = exp.and_(*[exp.NullSafeEQ(this=exp.column(f"k{i}", table="_a"),
                                      expression=expression.copy())
                       for i, expression in enumerate(key_exprs)])
    exists = exp.Exists(this=exp.select("1").from_(exp.Table(
        this=exp.to_identifier(AFFECTED), alias=exp.TableAlias(this="_a"))).where(match))
    select = _state_tree(tree, references)
    select.set("order", None)
    select = select.where(exists, copy=False)
    return str(select.sql(dialect="duckdb"))


def _recompute(name: str, tree: exp.Query, key: Sequence[str],
               references: Sequence[BaseTable], tables: list[TableId], reason: str) -> ViewPlan:
    columns = [projection.alias_or_name for projection in tree.selects]
    _check_key(name, key, columns)
    plan = ViewPlan(name, "recompute", reason, tables, list(references), columns, list(key),
                    _state_sql(tree, references))
    plan.outputs = _outputs(tree)
    plan.join_conditions = _join_conditions(tree)
    plan.referenced = _referenced(tree, references)
    return plan
