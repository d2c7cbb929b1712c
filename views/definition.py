"""A view's SQL, understood: which captured tables it reads, which of its constructs are
maintained incrementally, and the queries the engine runs on the base tables' current state.

The user writes the view once, in the leader's own dialect (PostgreSQL or MySQL/MariaDB): the
same text runs on the leader (``cdc verify --view``) and, translated by sqlglot, on the view's
state (DuckDB: ``views/state.py``). :func:`analyze` parses it, rewrites it into an equivalent
*normal form*, and records one :class:`Operator` per construct it meets, each incremental or
not (with why, and the nearest rewrite that is):

* **normal form** (same rows on every state): a non-recursive ``WITH`` is inlined as subqueries
  in FROM; ``EXISTS``, ``IN`` and correlated scalar subqueries in the WHERE become grouped
  subqueries in FROM (:func:`_decorrelate`); a subquery in FROM that selects, filters and
  projects (no aggregate, window, DISTINCT or LIMIT) is merged into the query around it;
  ``SELECT DISTINCT`` becomes a GROUP BY of every output column.
* **incremental**: ``SELECT``s (alone, or branches of UNION [ALL]) over captured tables joined
  with INNER, LEFT, RIGHT and FULL equi-joins (a RIGHT or FULL join as the first join; an
  outer join's ``ON`` holds at least one equality between its two sides), with GROUP BY/HAVING
  and any deterministic aggregate, or with window functions that share PARTITION BY
  expressions (no GROUP BY then). Each key column is an output column whose expression is no
  aggregate and no window; with GROUP BY, each is one of the grouping expressions. SUM and
  COUNT without GROUP BY (an AVG's parts too) are kept as running totals: a one-row table of
  the state that each batch moves by the changed tuples' contributions, new minus old
  (:func:`_split_global_aggregate`).

A batch of base-table changes is then applied by **keyed recomputation** (``docs/views.md``).
Every tuple of the view's joins belongs to one *scope*: its key (the key expressions' values)
or, with windows, its partition (the PARTITION BY values) — the rows a tuple can change are
exactly its scope's.

1. the *lineage query* finds the scope of every joined tuple that involves a changed row (its
   old image in the state before the batch, its new image after), plus — per outer join —
   the tuples null-extended on a side whose join values equal a changed row's of that side
   (a match appearing retracts them, one vanishing creates them). Each branch reads the
   changed rows and joins them to the whole tables (the other references), so its work
   follows the change;
2. with windows, the keys of every tuple of those partitions (before and after);
3. the *restricted query* recomputes the view for exactly those scopes, from the new state
   (the filter sits below grouping and windows, so whole groups and partitions are kept);
4. the engine compares with what the view held for those keys: changed rows are upserted,
   keys no longer produced are deleted.

Anything else is **recomputed**: the whole query runs on the new state after each batch that
touched its tables and the result is compared with the view's rows. Still exact; the work is
proportional to the tables. :attr:`ViewPlan.reason` says why, :attr:`ViewPlan.operators` per
construct.

A function whose value changes by itself (``now()``, ``random()``) is refused: no follower of
the log can keep such a view equal to the leader.

Table references resolve against the view's source: ``schema.table`` as captured, or a bare
table name that exactly one captured table has.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

import sqlglot
from sqlglot import exp

from cdc.errors import ConfigError
from cdc.events import TableId
from cdc.logical import LogicalKind
from views.collation import duckdb_collation, duckdb_knows, extreme_name, order_by_icu
from views.decimals import exact_quotient, part_of_average
from views.mariadb_decimals import exact_divisions as mariadb_divisions
from views.postgres_decimals import SLASH, leader_numeric
from views.postgres_decimals import exact_divisions as postgres_divisions

T = TypeVar("T")

#: the state's own columns in every base table (never a leader column: ``_cdc`` is reserved)
KEY_COLUMN = "_cdc_key"
#: the temporary tables the engine fills before running the lineage/restricted queries
#: the changed rows' images in the current state (before the batch's write: their old rows;
#: after it: their new rows), with every column of the state's table
LINEAGE = "_cdc_lineage_{index}"
IMAGES = "_cdc_images_{index}"     # the old and new images of those rows (the table's columns)
AFFECTED = "_cdc_affected"        # (k0, k1, ...): the view keys to recompute
#: a table's changes of the batch, typed (:data:`KEY_COLUMN`, ``views.state.KEY_HASH``,
#: ``views.state.POSITION``, ``views.state.DELETED``, its columns: names no captured column
#: can take); after the gate, only those newer than the state's
NEW = "_cdc_new_{index}"
#: a one-row subquery's old and new row side by side (its columns, then each as ``<name>__new``;
#: NULLs for a row absent): what :func:`_flip_branch` reads
FLIP = "_cdc_flip_{index}"
FLIP_NEW = "{name}__new"
SCOPES = "_cdc_scopes"            # (s0, s1, ...): with windows, the partitions to recompute
#: the schema of the state's tables that hold an aggregating subquery's rows (``s0``, ``s1``...)
SUB_SCHEMA = "_cdc_sub"
#: the hidden output columns of an ORDER BY ... LIMIT view's ORDER BY values (:class:`TopK`)
ORDER_COLUMN = "_cdc_o{index}"
#: marks the SELECT that reads an aggregate's running totals (:func:`_split_global_aggregate`)
_TOTALS = "cdc_totals"
#: marks the aggregating subquery that computes them
_RUNNING = "cdc_running_totals"
#: marks a subquery grouped by a constant (one row, none over no rows): a scalar subquery over
#: a whole table, NOT IN's NULL flag (:func:`_decorrelate`)
_ONE_ROW = "cdc_one_row"
#: the alias of the running totals' table in that SELECT, and its columns: a SUM's total of
#: its non-NULL values and their count, a COUNT's count
_TOTALS_ALIAS = "_cdc_t"
_GROUP_COLUMN = "cdc_all"
_SUM_COLUMN = "cdc_sum{index}"
_COUNT_COLUMN = "cdc_count{index}"

@dataclass(frozen=True)
class Described:
    """What the log's schema says of a captured column that a view's SQL must heed."""

    #: a ``character(n)`` column (``cdc.logical.blank_padded_length``): n
    padded: int | None = None
    #: text the leader orders by this ICU locale (``cdc.logical.icu_locales``)
    icu_locale: str = ""
    #: its type in the state (``views.types.duckdb_type``: ``DECIMAL(8,2)``, ``BIGINT`` ...)
    state_type: str = ""
    #: its logical kind (``cdc.logical.LogicalKind``'s value: ``int32``, ``decimal`` ...)
    kind: str = ""


#: what ``analyze`` knows of the captured tables: per table, each column and what it says
Catalog = Mapping[TableId, Mapping[str, Described]]

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


@dataclass(frozen=True)
class Operator:
    """One construct of a view, and how a batch maintains it."""

    #: what it is, as a user would name it (``LEFT JOIN``, ``COUNT(DISTINCT)``, ``window
    #: function (PARTITION BY o.customer_id)``)
    construct: str
    #: True: a batch's work on it follows the groups (partitions, keys) its changes touch
    incremental: bool
    #: why not (empty when incremental)
    reason: str = ""
    #: the nearest rewrite that is incremental (empty when incremental)
    rewrite: str = ""

    def describe(self) -> str:
        if self.incremental:
            return f"{self.construct}: incremental"
        return f"{self.construct}: recomputed whole ({self.reason}; instead: {self.rewrite})"


@dataclass(frozen=True)
class TopK:
    """A view's ``ORDER BY ... LIMIT n [OFFSET m]``, kept incrementally (``views/state.py``).

    The view's queries (:attr:`ViewPlan.full_sql`, :attr:`ViewPlan.restricted_sql`) are its
    SELECT without the ORDER BY, LIMIT and OFFSET, with one more output per ORDER BY item
    (:data:`ORDER_COLUMN`: its value, as the leader orders it); the state keeps every row of that
    query and, in order, its first ``offset + limit`` rows plus a buffer. The followers hold
    the rows at places ``offset + 1 .. offset + limit``. Rows equal in every ORDER BY item are
    ordered by their key's text: the rows shown equal the leader's except where rows tie at
    the last place shown (or at the OFFSET), where the leader picks any of them."""

    #: the hidden output columns, one per ORDER BY item
    columns: tuple[str, ...]
    #: the ORDER BY over those columns (DuckDB SQL, without ``ORDER BY``), directions and NULL
    #: placement as the leader's
    order: str
    limit: int
    offset: int


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
    #: with window functions: the query giving the partitions (``s0, s1, ...``) of the tuples
    #: that involve a changed row; ``lineage_sql`` then gives the keys in :data:`SCOPES`
    scope_lineage_sql: str | None = None
    #: with aggregating subqueries in FROM: the lineage branches that read only the captured
    #: tables' changes (run before the batch's write) and those that read the subqueries'
    #: changes (run after the captured tables' write, before the subqueries'); see
    #: ``views/state.py``
    lineage_early_sql: str | None = None
    lineage_late_sql: str | None = None
    #: an aggregate's running totals (:func:`_split_global_aggregate`): the query of the
    #: contributions of the tuples a batch's changes reach (on the state before the batch's
    #: write, then after it), one row shaped as the totals' row
    delta_sql: str | None = None
    #: when the totals also read subqueries' tables: the contributions before the batch, in
    #: two halves -- of the tuples the captured tables' changes reach (run before their
    #: write), and of those only the subqueries' changes reach (after it, before theirs)
    delta_early_sql: str | None = None
    delta_late_sql: str | None = None
    #: ORDER BY ... LIMIT kept incrementally (None: no LIMIT, or one recomputed with the view)
    top: TopK | None = None
    #: per one-row subquery it reads (its index in :attr:`tables`) whose columns only its WHERE
    #: compares: the lineage branch of the keys whose comparison flips when that row changes
    #: (:func:`_flip_branch`), instead of that subquery's own branches
    flip_sql: dict[int, str] = field(default_factory=dict)
    #: each aggregating subquery in FROM, kept as a table of the state (``_cdc_sub.s<i>``):
    #: its own plan over captured tables, keyed by its GROUP BY columns
    subviews: dict[TableId, ViewPlan] = field(default_factory=dict)
    #: the session time zone its ``timestamptz`` values are computed and shown in (the
    #: view's ``time_zone``)
    time_zone: str = "UTC"
    #: the most memory its state's DuckDB may use (the view's ``memory_limit``)
    memory_limit: str = "1GB"
    #: per captured table, its ``character(n)`` columns and n: the state holds their values
    #: without the trailing blanks (``views/state.py``)
    padded: dict[TableId, dict[str, int]] = field(default_factory=dict)
    #: per captured table, the columns whose text the state orders by the leader's ICU locale
    #: (``views/collation.py``), and that locale
    icu: dict[TableId, dict[str, str]] = field(default_factory=dict)
    #: every construct met, in order, each incremental or not
    operators: list[Operator] = field(default_factory=list)
    #: each output column's expression (as written)
    outputs: dict[str, exp.Expr] = field(default_factory=dict)
    #: the query in its normal form, in the leader's names (what ``views/check.py`` reads)
    tree: exp.Query | None = None
    #: per table, the columns the SQL names (qualified, or unqualified with one table)
    referenced: dict[TableId, set[str]] = field(default_factory=dict)

    @property
    def captured_tables(self) -> list[TableId]:
        """The captured tables the view reads (``tables`` without the subqueries' own)."""
        return [table for table in self.tables if table.schema != SUB_SCHEMA]

    @property
    def blocking(self) -> list[Operator]:
        """The constructs that make the view recomputed whole."""
        return [operator for operator in self.operators if not operator.incremental]


def analyze(name: str, sql: str, key: Sequence[str], dialect: str,
            captured: Sequence[TableId],
            catalog: Callable[[], Catalog] | None = None) -> ViewPlan:
    """Parse and classify view ``name`` (see the module docstring); ``captured``: the tables
    its source captures; ``catalog()``: their columns where known (:data:`Catalog`): a column
    named without its table is resolved to the one table of its SELECT that has it
    (:func:`_qualify_columns`), ``character(n)`` columns keep the leader's semantics
    (:func:`_blank_padding`), text the leader orders by an ICU locale is ordered so
    (:func:`_icu_order`), and MariaDB's quotients are computed as MariaDB computes them
    (:func:`_mariadb_divisions`). A :class:`ViewDefinitionError` for SQL that cannot be a view."""
    written = _parse(name, sql, dialect)
    _resolve_tables(name, written, captured, {})  # names checked as written
    volatile = _volatile(written)
    if volatile:
        raise ViewDefinitionError(
            f"view {name} calls {volatile}, whose value changes without any change to the "
            "tables: no follower of the change log can keep such a view equal to the leader",
            f"remove it from views.{name}.sql (compute it when reading the view instead)")
    operators: list[Operator] = []
    subqueries: dict[TableId, exp.Select] = {}
    if dialect == "mysql":
        _mariadb_division(written)
    else:
        _postgres_division(written)
        _postgres_extract(written)
    described = dict(catalog()) if catalog is not None else {}
    tree = _normalize(written.copy(), operators, subqueries, captured, described)
    for select in [*tree.find_all(exp.Select), *subqueries.values()]:
        _order_by_outputs(select)
    padded = {table: lengths for table, columns in described.items()
              if (lengths := {c: f.padded for c, f in columns.items() if f.padded})}
    if padded:
        _blank_padding(tree, subqueries, [*captured, *subqueries], padded)
    ordered = {table: {c: f.icu_locale for c, f in columns.items() if f.icu_locale}
               for table, columns in described.items()}
    icu = _icu_collations(ordered)
    if icu:
        _icu_order(tree, subqueries, [*captured, *subqueries], icu)
    kinds = {table: {c: f.kind for c, f in columns.items()} for table, columns in described.items()}
    _per_select(tree, subqueries, captured, kinds, _round_doubles)
    if dialect == "mysql":
        state_types = {table: {c: f.state_type for c, f in columns.items()}
                       for table, columns in described.items()}
        _per_select(tree, subqueries, captured, state_types, _mariadb_wall_clock)
        _per_select(tree, subqueries, captured, state_types, mariadb_divisions)
    else:
        _per_select(tree, subqueries, captured, kinds, _postgres_elapsed)
        _per_select(tree, subqueries, captured,
                         {table: {c: leader_numeric(f.kind, f.state_type)
                                  for c, f in columns.items()}
                          for table, columns in described.items()}, postgres_divisions)
    _split_global_aggregate(tree, subqueries, captured, kinds)
    indexes: dict[TableId, int] = {}
    known = [*captured, *subqueries]
    references = _resolve_tables(name, tree, known, indexes)
    subviews = {table: _subview(name, table, inner, known, indexes, operators,
                                {t for t, i in subqueries.items() if i.meta.get(_ONE_ROW)})
                for table, inner in subqueries.items()}
    columns = _output_columns(name, tree)
    _check_key(name, key, columns)
    limited = tree.copy()
    top = _top_k(tree, operators)
    branches = _set_branches(tree, operators)
    one_row = {table for table, inner in subqueries.items() if inner.meta.get(_ONE_ROW)}
    compiled = [_compile(name, branch, _resolve_tables(name, branch, known, indexes),
                         [columns.index(column) for column in key], operators,
                         len(branches) > 1, AFFECTED, one_row if len(branches) == 1 else ())
                for branch in branches]
    if subviews and (len(compiled) != 1 or compiled[0].scope_lineage is not None):
        operators.append(Operator("aggregating subquery beside a UNION or a window", False,
                                  "their lineage would need the subquery's old rows",
                                  "make the subquery a view of its own"))
    plan = ViewPlan(name, "incremental", "", list(indexes), references, columns, list(key),
                    _state_sql(tree, references), top=top, subviews=subviews,
                    operators=operators)
    plan.padded = {table: lengths for table, lengths in padded.items()  # the tables it reads
                   if table in captured and table in indexes}
    plan.icu = {table: {column: locale for column, locale in locales.items()
                        if column in icu.get(table, {})}
                for table, locales in ordered.items()
                if table in captured and table in indexes and locales}
    blocking = plan.blocking
    if blocking:
        plan.mode, plan.reason = "recompute", f"{blocking[0].construct}: {blocking[0].reason}"
        if top is not None:  # recomputed whole with its LIMIT
            tree, plan.top = limited, None
            plan.full_sql = _state_sql(tree, references)
    plan.outputs = {column: expression for column, expression in _outputs(tree).items()
                    if column in columns}
    plan.tree = limited
    plan.referenced = _referenced(tree, references)
    for sub in subviews.values():
        for table, read in sub.referenced.items():
            if table.schema != SUB_SCHEMA:
                plan.referenced.setdefault(table, set()).update(read)
    if not blocking:
        _set_queries(plan, tree, compiled)
    return plan


def _subview(name: str, table: TableId, inner: exp.Select, known: Sequence[TableId],
             indexes: dict[TableId, int], operators: list[Operator],
             one_row: Collection[TableId] = ()) -> ViewPlan:
    """The plan of an aggregating subquery in FROM, kept in the state as ``table``: keyed by
    its GROUP BY columns, which must all be among its outputs. It may read the tables of
    subqueries of its own (``known``: the captured tables and every subquery's; those it
    reads come before it in ``ViewPlan.subviews``)."""
    label = f"{name} (subquery {table.table})"
    columns = _output_columns(label, inner)
    projections = {column: projection.unalias()
                   for column, projection in zip(columns, inner.selects, strict=True)}
    grouped = {_canonical(expression) for expression in _grouping(inner)}
    key = [column for column, expression in projections.items()
           if _canonical(expression) in grouped]
    operators.append(Operator("subquery in FROM that aggregates", True))
    if len(key) < len(grouped):
        operators.append(Operator("aggregating subquery without its GROUP BY columns in its "
                                  "SELECT", False, "its rows cannot be told apart",
                                  "add every GROUP BY column to the subquery's SELECT"))
    references = _resolve_tables(label, inner, known, indexes)
    if len(key) < len(grouped):
        return ViewPlan(label, "recompute", "", list(dict.fromkeys(r.table for r in references)),
                        references, columns, key or columns, _state_sql(inner, references))
    own: list[Operator] = []
    compiled = _compile(label, inner, references, [columns.index(c) for c in key], own,
                        False, f"{AFFECTED}_{table.table}", one_row)
    operators.extend(op for op in own if not op.incremental)
    plan = ViewPlan(label, "incremental", "", list(dict.fromkeys(r.table for r in references)),
                    references, columns, key, _state_sql(inner, references), operators=own)
    plan.referenced = _referenced(inner, references)
    plan.outputs = _outputs(inner)
    plan.tree = inner
    if compiled.scope_lineage is None and not plan.blocking:
        plan.lineage_sql, plan.restricted_sql = compiled.lineage, compiled.restricted
        plan.lineage_early_sql, plan.lineage_late_sql = compiled.early, compiled.late
        plan.flip_sql = compiled.flips
        if inner.meta.get(_RUNNING):
            plan.delta_sql = _delta_sql(inner, references)
            if compiled.late is not None:  # it reads subqueries: the old tuples in halves
                plan.delta_early_sql = _delta_sql(
                    inner, references, lambda ref: ref.table.schema != SUB_SCHEMA)
                plan.delta_late_sql = _delta_sql(
                    inner, references, lambda ref: ref.table.schema == SUB_SCHEMA,
                    [ref for ref in references if ref.table.schema != SUB_SCHEMA])
    return plan


def _delta_sql(inner: exp.Select, references: Sequence[BaseTable],
               reached: Callable[[BaseTable], bool] | None = None,
               unchanged: Sequence[BaseTable] = ()) -> str:
    """The running totals' contributions of the tuples a batch's changes reach (each tuple
    once: the branches of :func:`_lineage_union` are told apart by every reference's key),
    shaped as the totals' row (:func:`_split_global_aggregate`): the changes of the
    references ``reached`` accepts (all by default), in tuples whose rows of ``unchanged``
    (captured tables) are none the batch changed."""
    keys: list[exp.Expr] = [_quoted_alias_column(ref.alias, KEY_COLUMN) for ref in references]
    arguments: list[exp.Expr] = []
    totals: list[exp.Expr] = [exp.Literal.number(0).as_(_GROUP_COLUMN)]
    for projection in inner.expressions[1:]:
        node = projection.unalias()  # COUNT(x), or COALESCE(SUM(x), 0)
        counted = isinstance(node, exp.Count)
        aggregate = node if counted else node.find(exp.Sum)
        assert aggregate is not None
        argument = aggregate.this
        if isinstance(argument, exp.Star):
            total: exp.Expr = exp.Count(this=exp.Star())
        else:
            texts = [known.sql() for known in arguments]
            if argument.sql() not in texts:  # a SUM's argument is its COUNT's too
                texts.append(argument.sql())
                arguments.append(argument)
            column = exp.column(f"d{len(keys) + texts.index(argument.sql())}", table="_d")
            total = exp.Count(this=column) if counted else exp.Coalesce(
                this=exp.Sum(this=column), expressions=[exp.Literal.number(0)])
        totals.append(total.as_(projection.alias))
    union = _lineage_union(inner, references, [*keys, *arguments],
                           _joins(inner, references, []), "d", reached)
    if not union:  # no tuple: every total 0
        union = "SELECT " + ", ".join(f"NULL AS d{i}" for i in range(len(keys) + len(arguments))) \
            + " WHERE false"
    query = exp.select(*totals).from_(f"({union}) AS _d")
    for ref in unchanged:
        query = query.where(f"_d.d{references.index(ref)} NOT IN (SELECT {KEY_COLUMN} FROM "
                            f"{NEW.format(index=ref.index)})", copy=False)
    return str(query.sql(dialect="duckdb"))


def _top_k(tree: exp.Query, operators: list[Operator]) -> TopK | None:
    """A SELECT's ``ORDER BY ... LIMIT n [OFFSET m]`` (n and m numbers) taken off ``tree`` as a
    :class:`TopK`, each ORDER BY item becoming a hidden output; None (``tree`` unchanged) for
    anything else (recomputed: :data:`_LIMIT`)."""
    if not isinstance(tree, exp.Select) or tree.meta.get(_TOTALS):
        return None
    order, limit, offset = (tree.args.get(arg) for arg in ("order", "limit", "offset"))
    counts = [part.expression if part is not None else exp.Literal.number(0)
              for part in (limit, offset)]
    if order is None or limit is None or \
            not all(isinstance(c, exp.Literal) and c.is_int for c in counts):
        return None
    columns, ordering = [], []
    for index, ordered in enumerate(order.expressions):
        column = ORDER_COLUMN.format(index=index)
        columns.append(column)
        tree.select(ordered.this.copy().as_(column, quoted=True), copy=False)
        ranked = ordered.copy()
        ranked.set("this", exp.column(exp.to_identifier(column, quoted=True)))
        ordering.append(ranked.sql(dialect="duckdb"))
    for arg in ("order", "limit", "offset"):
        tree.set(arg, None)
    operators.append(Operator("ORDER BY ... LIMIT (the first rows, a buffer past them kept)",
                              True))
    return TopK(tuple(columns), ", ".join(ordering), int(counts[0].name), int(counts[1].name))


def _set_queries(plan: ViewPlan, tree: exp.Query, compiled: Sequence[_Branch]) -> None:
    if len(compiled) == 1 and compiled[0].scope_lineage is not None:
        plan.scope_lineage_sql = compiled[0].scope_lineage
    if plan.subviews:
        plan.lineage_early_sql, plan.lineage_late_sql = compiled[0].early, compiled[0].late
        plan.flip_sql = compiled[0].flips
    plan.lineage_sql = " UNION ".join(branch.lineage for branch in compiled)
    joiner = " UNION ALL " if isinstance(tree, exp.Union) and not tree.args.get("distinct") \
        else " UNION "
    plan.restricted_sql = joiner.join(f"({branch.restricted})" if len(compiled) > 1
                                      else branch.restricted for branch in compiled)


def _outputs(tree: exp.Query) -> dict[str, exp.Expr]:
    return {projection.alias_or_name: projection.unalias() for projection in tree.selects}


def _referenced(tree: exp.Query, references: Sequence[BaseTable]) -> dict[TableId, set[str]]:
    tables = {ref.alias: ref.table for ref in references}
    only = references[0].table if len({ref.table for ref in references}) == 1 else None
    aliases = {projection.alias for select in _selects(tree) for projection in select.selects
               if projection.alias}
    out: dict[TableId, set[str]] = {}
    for column in tree.find_all(exp.Column):
        table = tables.get(column.table) if column.table else only
        if table is not None and (column.table or column.name not in aliases):
            out.setdefault(table, set()).add(column.name)
    return out


def _selects(tree: exp.Query) -> list[exp.Select]:
    if isinstance(tree, exp.SetOperation):
        return [*_selects(tree.this), *_selects(tree.expression)]
    return [tree] if isinstance(tree, exp.Select) else []


#: expressions whose value is computed in floating point
_FLOATING = (exp.Avg, exp.Stddev, exp.StddevPop, exp.StddevSamp, exp.Variance, exp.VariancePop,
             exp.Div, exp.IntDiv)


def approximate_columns(plan: ViewPlan, doubles: Mapping[str, set[str]]) -> list[str]:
    """The output columns computed in floating point: an AVG, a standard deviation or
    variance, a division, a cast to a float type, or a base column held as DOUBLE
    (``doubles``: per ``schema.table``, such columns). ``cdc verify --view`` compares them
    with a tolerance."""
    tables = {ref.alias: str(ref.table) for ref in plan.references}
    doubles = {**doubles, **{str(table): set(approximate_columns(sub, doubles))
                             for table, sub in plan.subviews.items()}}
    out: list[str] = []
    for column, expression in plan.outputs.items():
        floating = any(not exact_quotient(node) for node in expression.find_all(*_FLOATING)) or any(
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
        raise ViewDefinitionError(f"view {name}: its SQL does not parse: {_parse_problem(exc)}",
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


def _parse_problem(exc: sqlglot.errors.ParseError) -> str:
    """The parser's first complaint in a user's words: what is wrong, at which line and column,
    near which text (never the parser's class names)."""
    error = exc.errors[0] if exc.errors else {}
    description = str(error.get("description") or str(exc).splitlines()[0])
    near = str(error.get("highlight") or "").strip()
    missing = re.match(r"Required keyword: '\w+' missing for <class '[\w.]*?(\w+)'>",
                       description)
    if missing:
        what = f"{missing[1].upper()} is incomplete"
    elif description.startswith("Invalid expression / Unexpected token"):
        what = f"unexpected {near!r}" if near else "unexpected text"
    else:
        what = description.rstrip(".")
    where = f" (line {error['line']}, column {error['col']}" if error.get("line") else " ("
    return f"{what}{where}{', near ' + repr(near) if near else ''})".replace(" ()", "")


def _resolve_tables(name: str, tree: exp.Expr, captured: Sequence[TableId],
                    indexes: dict[TableId, int]) -> list[BaseTable]:
    """Every table reference, resolved to a captured table (else a clear error); ``indexes``
    numbers the distinct tables in order of first reference (and is extended)."""
    by_name: dict[str, list[TableId]] = {}
    for table in captured:
        by_name.setdefault(table.table, []).append(table)
    out: list[BaseTable] = []
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
    """The table references of ``tree`` that name tables (not its CTEs), in the order they
    are written (a depth-first walk: FROM, then the joins)."""
    ctes = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    return [node for node in tree.find_all(exp.Table, bfs=False)
            if node.db or node.name not in ctes]


def _output_columns(name: str, tree: exp.Query) -> list[str]:
    columns: list[str] = []
    for projection in tree.selects:
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


def _volatile(tree: exp.Expr) -> str:
    for node in tree.find_all(exp.Func):
        if isinstance(node, _VOLATILE):
            return node.sql()
        if isinstance(node, exp.Anonymous) and str(node.name).lower() in _VOLATILE_NAMES:
            return node.sql()
    return ""


# ----------------------------------------------------------------------- normal form

def _normalize(tree: exp.Query, operators: list[Operator],
               subqueries: dict[TableId, exp.Select], captured: Sequence[TableId],
               catalog: Catalog) -> exp.Query:
    """``tree`` rewritten into the normal form of the module docstring (same rows); each
    aggregating subquery in FROM is replaced by a table of :data:`SUB_SCHEMA` (added to
    ``subqueries``)."""
    _apply_column_lists(tree)
    if catalog and _unqualified_in_joins(tree):
        _qualify_columns(tree, captured, catalog)
    tree = _inline_ctes(tree, operators)
    for select in _selects(tree):
        _having_scalar(select)
        _decorrelate(select)
        _merge_subqueries(select, operators, subqueries)
        _distinct_as_group(select, operators)
    return tree


#: the alias of a subquery in WHERE made a subquery in FROM (:func:`_decorrelate`) and its
#: columns: the correlated (or IN's) values, and a scalar subquery's value
_SEMI_ALIAS = "_cdc_e{index}"
_SEMI_KEY = "cdc_k{index}"
_SEMI_VALUE = "cdc_v"
#: the least and greatest value of the column a subquery compares with ``<>`` to the outer row
_SEMI_LEAST, _SEMI_GREATEST = "cdc_min", "cdc_max"
#: comparisons whose one side may be a scalar subquery :func:`_decorrelate` joins
_SCALAR_COMPARED = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
#: what a scalar subquery's value may be made of besides its aggregates (NULL when they are)
_NULL_PRESERVING = (exp.Column, exp.Literal, exp.Paren, exp.Add, exp.Sub, exp.Mul, exp.Div,
                    exp.Neg, exp.Cast)


#: the alias of a grouped SELECT moved into FROM by :func:`_having_scalar`, and its hidden
#: outputs (the HAVING's sides compared with scalar subqueries)
_HAVING_ALIAS = "_cdc_g"
_HAVING_SIDE = "cdc_h{index}"


def _having_scalar(select: exp.Select) -> None:
    """A grouped SELECT whose HAVING compares an aggregate with a scalar subquery (TPC-H
    Q11's threshold: ``HAVING sum(v) > (SELECT sum(v) * 0.0001 ...)``) becomes a SELECT of its
    groups -- itself without those comparisons, each compared side a hidden output -- that
    compares them in its WHERE, where :func:`_decorrelate` joins the subqueries: the groups
    are kept as a table of the state, and only groups change when rows do. Left as it is
    when the ORDER BY names anything but output columns."""
    having = select.args.get("having")
    if having is None or select.args.get("group") is None:
        return
    conjuncts = list(having.this.flatten()) if isinstance(having.this, exp.And) else [having.this]
    compared = [c for c in conjuncts if isinstance(c, _SCALAR_COMPARED)
                and any(isinstance(side, exp.Subquery) for side in (c.this, c.expression))]
    outputs = [projection.alias_or_name for projection in select.selects]
    order = select.args.get("order")
    if not compared or len(set(outputs)) != len(outputs) or "*" in outputs or (
            order is not None and not all(isinstance(o.this, exp.Column) and not o.this.table
                                          and o.this.name in outputs
                                          for o in order.expressions)):
        return
    inner = select.copy()
    for arg in ("order", "limit", "offset"):
        inner.set(arg, None)
    rest = [c.copy() for c in conjuncts if c not in compared]
    inner.set("having", exp.Having(this=exp.and_(*rest)) if rest else None)
    conditions = []
    for index, comparison in enumerate(compared):
        side = "expression" if isinstance(comparison.this, exp.Subquery) else "this"
        hidden = _HAVING_SIDE.format(index=index)
        inner.select(comparison.args[side].copy().as_(hidden), copy=False)
        condition = comparison.copy()
        condition.set(side, exp.column(hidden, table=_HAVING_ALIAS))
        conditions.append(condition)
    select.set("expressions", [exp.column(exp.to_identifier(name, quoted=True),
                                          table=_HAVING_ALIAS).as_(name, quoted=True)
                               for name in outputs])
    select.set("from_", exp.From(this=exp.Subquery(
        this=inner, alias=exp.TableAlias(this=exp.to_identifier(_HAVING_ALIAS)))))
    for arg in ("joins", "group", "having"):
        select.set(arg, None)
    select.set("where", exp.Where(this=exp.and_(*conditions)))


def _decorrelate(select: exp.Select, prefix: str = "") -> None:
    """Each conjunct of ``select``'s WHERE that is ``EXISTS (...)``, ``x IN (SELECT ...)`` or
    a comparison with a scalar subquery, whose subquery reads tables (no nested subquery,
    window or LIMIT) and refers to ``select`` only through equalities, becomes a subquery in
    FROM that groups by the correlated values (so it holds each once: an aggregating subquery
    the state keeps like a view), comma-joined, with those equalities in the WHERE:

    * ``EXISTS (SELECT ... WHERE i = o AND local)`` joins ``(SELECT i ... WHERE local GROUP BY
      i)`` on ``i = o``: a row has a match exactly when the subquery has one;
    * ``x IN (SELECT y ... WHERE local)`` (uncorrelated) joins the distinct ``y``s on ``y =
      x`` (NULL matches nothing either way; a grouped subquery selecting its GROUP BY value is
      joined as it is);
    * ``x op (SELECT f(agg) ... WHERE i = o AND local)``, ``agg`` not a COUNT and ``f`` plain
      arithmetic (NULL over no rows, as the scalar subquery is), joins ``(SELECT i, f(agg)
      ... GROUP BY i)`` and compares ``x`` with its value: no group is a NULL comparison, a
      row dropped either way. Uncorrelated (TPC-H Q22's average), the subquery is grouped by
      the constant 1 and LEFT JOINed on it: one row, none over no rows (a NULL comparison
      again); its one group is recomputed when its tables change, and a new value revisits
      only the rows whose comparison with it flips (:func:`_flip_branch`);
    * ``NOT EXISTS (SELECT ... WHERE i = o AND local)`` is a LEFT JOIN of the same grouped
      subquery, keeping the rows it does not match (``cdc_k0 IS NULL``: a NULL ``o`` matches
      nothing, as it satisfies no ``i = o``);
    * ``[NOT] EXISTS`` correlated by equalities and one ``c <> v`` (``c`` the subquery's, ``v``
      the outer row's; TPC-H Q21): the grouped subquery also keeps ``min(c)`` and ``max(c)``;
      a group has a row whose ``c <> v`` holds exactly when ``min(c) <> v OR max(c) <> v`` does
      (both ignore NULLs; a NULL ``v`` holds for none).

    * ``x NOT IN (SELECT y ... WHERE local)`` (uncorrelated) holds when no ``y`` is ``x``, NULL
      or compared with a NULL ``x``, or when there is no ``y`` at all: two LEFT JOINs, the
      distinct ``y``s on ``y = x`` and one row saying whether a ``y`` is NULL (``GROUP BY 1``:
      absent when there is none; its one group recomputed when the subquery's tables change,
      its row changing only when that answer does).

    A subquery in FROM is decorrelated first, then merged or kept as a table of the state
    (:func:`_merge_subqueries`); so is a subquery in WHERE before it is joined (TPC-H Q20's IN
    holds an IN and a correlated scalar subquery), its aliases under ``prefix``. Conjuncts
    under OR stay (recomputed whole)."""
    where = select.args.get("where")
    if where is None or not select.args.get("from_"):
        return
    outer = {node.alias_or_name for node in [select.args["from_"].this,
                                             *(j.this for j in select.args.get("joins") or [])]}
    conjuncts = list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]
    kept: list[exp.Expr] = []
    joined = 0
    for conjunct in conjuncts:
        alias = prefix + _SEMI_ALIAS.format(index=joined)
        made = _semi_join(conjunct, outer, alias)
        if made is None:
            kept.append(conjunct.copy())
            continue
        joins, conditions = made
        for name, inner, on in joins:
            join = exp.Join(this=exp.Subquery(
                this=inner, alias=exp.TableAlias(this=exp.to_identifier(name))))
            if on:  # an anti-join: the rows the subquery does not match
                join.set("side", "LEFT")
                join.set("on", exp.and_(*on))
            select.append("joins", join)
        kept.extend(conditions)
        joined += 1
    if joined:
        select.set("where", exp.Where(this=exp.and_(*kept)))


#: the subqueries in FROM that replace a conjunct (each: its alias, SELECT and, for a LEFT
#: JOIN, its ON), and the WHERE conditions that replace it
_Joined = tuple[list[tuple[str, exp.Select, list[exp.Expr]]], list[exp.Expr]]


def _semi_join(conjunct: exp.Expr, outer: set[str], alias: str) -> _Joined | None:
    """What replaces ``conjunct`` (see :func:`_decorrelate`); None when it cannot."""
    negated = isinstance(conjunct, exp.Not)
    positive = (conjunct.this if negated else conjunct).copy()
    for sub in [node for node in positive.find_all(exp.Select)
                if node.find_ancestor(exp.Select) is None]:
        _decorrelate(sub, f"{alias}_")  # its subquery's own subqueries joined first
    if isinstance(positive, exp.Exists) and isinstance(positive.this, exp.Select):
        made = _exists_join(positive.this, outer, alias, negated)
        return None if made is None else ([(alias, made[0], made[2])], made[1])
    if isinstance(positive, exp.In) and isinstance(positive.args.get("query"), exp.Subquery) \
            and isinstance(positive.args["query"].this, exp.Select):
        sub = positive.args["query"].this
        found = _correlation(sub, outer)
        if found is None or found.pairs or found.unequal or len(sub.expressions) != 1:
            return None
        value = sub.expressions[0].unalias()
        if sub.args.get("group") is None:
            inner = _grouped(sub, [value], found.local)
        elif not negated and _canonical(value) in {_canonical(e) for e in _grouping(sub)}:
            inner = sub.copy()
            inner.set("expressions", [value.copy().as_(_SEMI_KEY.format(index=0))])
        else:
            return None
        matched = _matched_on(alias, [positive.this])
        if not negated:
            return [(alias, inner, [])], matched
        return _not_in(sub, found.local, value, positive.this, alias, inner, matched)
    if negated:
        return None
    if isinstance(positive, _SCALAR_COMPARED):
        sides = [positive.this, positive.expression]
        scalar = [side for side in sides if isinstance(side, exp.Subquery)]
        if len(scalar) != 1 or not isinstance(scalar[0].this, exp.Select):
            return None
        sub = scalar[0].this
        found = _correlation(sub, outer)
        if found is None or found.unequal or len(sub.expressions) != 1 \
                or sub.args.get("group") is not None or not _null_when_empty(sub.expressions[0]):
            return None
        compared = positive.copy()
        compared.set("this" if positive.this is scalar[0] else "expression",
                     exp.column(_SEMI_VALUE, table=alias))
        value = sub.expressions[0].unalias().as_(_SEMI_VALUE)
        if not found.pairs:  # over the whole subquery: one row (none over no rows)
            one = exp.Literal.number(1)
            inner = _grouped(sub, [one], found.local, value)
            inner.meta[_ONE_ROW] = True
            return [(alias, inner, _matched_on(alias, [one]))], [compared]
        inner = _grouped(sub, [inner for inner, _ in found.pairs], found.local, value)
        return [(alias, inner, [])], [
            *_matched_on(alias, [outer_side for _, outer_side in found.pairs]), compared]
    return None


def _not_in(sub: exp.Select, local: Sequence[exp.Expr], value: exp.Expr, tested: exp.Expr,
            alias: str, distinct: exp.Select, matched: list[exp.Expr]) -> _Joined:
    """``tested NOT IN (sub)`` as two LEFT JOINs (see :func:`_decorrelate`)."""
    nulls = f"{alias}z"
    one = exp.Literal.number(1)
    flag = exp.Select(expressions=[one.copy().as_(_SEMI_KEY.format(index=0)), exp.LogicalOr(
        this=exp.Is(this=value.copy(), expression=exp.Null())).as_(_SEMI_VALUE)])
    flag.set("from_", sub.args["from_"].copy())
    flag.set("joins", [join.copy() for join in sub.args.get("joins") or []] or None)
    if local:
        flag.set("where", exp.Where(this=exp.and_(*[c.copy() for c in local])))
    flag = flag.group_by(one.copy(), copy=False)
    flag.meta[_ONE_ROW] = True
    none = exp.Is(this=exp.column(_SEMI_KEY.format(index=0), table=nulls),
                  expression=exp.Null())
    unmatched = exp.and_(
        exp.Not(this=exp.Is(this=tested.copy(), expression=exp.Null())),
        exp.Is(this=exp.column(_SEMI_KEY.format(index=0), table=alias), expression=exp.Null()),
        exp.Not(this=exp.column(_SEMI_VALUE, table=nulls)))
    return ([(alias, distinct, matched),
             (nulls, flag, [exp.EQ(this=exp.column(_SEMI_KEY.format(index=0), table=nulls),
                                   expression=one.copy())])],
            [exp.paren(exp.or_(none, exp.paren(unmatched)))])


def _exists_join(sub: exp.Select, outer: set[str], alias: str, negated: bool
                 ) -> tuple[exp.Select, list[exp.Expr], list[exp.Expr]] | None:
    """``[NOT] EXISTS (sub)`` as a join to ``sub`` grouped by its correlated values (see
    :func:`_decorrelate`)."""
    found = _correlation(sub, outer)
    if found is None or not found.pairs or sub.args.get("group") is not None \
            or len(found.unequal) > 1:
        return None
    values: list[exp.Expr] = []
    unequal: exp.Expr | None = None
    if found.unequal:
        compared, other = found.unequal[0]
        values = [exp.Min(this=compared.copy()).as_(_SEMI_LEAST),
                  exp.Max(this=compared.copy()).as_(_SEMI_GREATEST)]
        unequal = exp.paren(exp.or_(*[exp.NEQ(this=exp.column(name, table=alias),
                                              expression=other.copy())
                                      for name in (_SEMI_LEAST, _SEMI_GREATEST)]))
    inner = _grouped(sub, [inner for inner, _ in found.pairs], found.local, *values)
    matched = _matched_on(alias, [outer_side for _, outer_side in found.pairs])
    if not negated:
        return inner, [*matched, *([unequal] if unequal is not None else [])], []
    if unequal is None:
        return inner, [exp.Is(this=exp.column(_SEMI_KEY.format(index=0), table=alias),
                              expression=exp.Null())], matched
    return inner, [exp.Not(this=exp.Coalesce(this=unequal, expressions=[exp.false()]))], matched


class _Correlated(NamedTuple):
    """A subquery's references to the outer query, and its own conjuncts."""

    #: the equalities, as (inner side, outer side)
    pairs: list[tuple[exp.Expr, exp.Expr]]
    #: the ``<>`` comparisons, as (inner side, outer side)
    unequal: list[tuple[exp.Expr, exp.Expr]]
    local: list[exp.Expr]


def _correlation(sub: exp.Select, outer: set[str]) -> _Correlated | None:
    """A subquery's correlated equalities and ``<>`` comparisons and its own conjuncts, or
    None when it refers to the outer query otherwise, names a column without its table, has a
    subquery outside its FROM (those in FROM are kept as tables of the state), or windows,
    limits or is DISTINCT."""
    if any(sub.args.get(arg) for arg in ("limit", "offset", "qualify", "distinct", "with_")) \
            or any(node is not sub and not _in_from(node, sub)
                   for node in sub.find_all(exp.Select)) \
            or any(True for _ in sub.find_all(exp.Window)) or not sub.args.get("from_"):
        return None
    nodes = [sub.args["from_"].this, *(join.this for join in sub.args.get("joins") or [])]
    if not all(isinstance(node, exp.Table) or (isinstance(node, exp.Subquery) and node.alias)
               for node in nodes):
        return None
    inner = {node.alias_or_name for node in nodes}
    columns = [column for column in sub.find_all(exp.Column)
               if column.find_ancestor(exp.Select) is sub]
    if any(not column.table for column in columns):
        return None
    where = sub.args.get("where")
    conjuncts = [] if where is None else list(where.this.flatten()) \
        if isinstance(where.this, exp.And) else [where.this]
    in_where = {id(column) for node in conjuncts for column in node.find_all(exp.Column)}
    if any(column.table not in inner for column in columns if id(column) not in in_where):
        return None  # the outer query named in the SELECT, a join's ON or GROUP BY
    found = _Correlated([], [], [])
    for conjunct in conjuncts:
        named = {column.table for column in conjunct.find_all(exp.Column)}
        if named <= inner:
            found.local.append(conjunct)
            continue
        if not named - inner <= outer or not isinstance(conjunct, exp.EQ | exp.NEQ):
            return None
        left = {column.table for column in conjunct.this.find_all(exp.Column)}
        right = {column.table for column in conjunct.expression.find_all(exp.Column)}
        if left and left <= inner and right and not right & inner:
            pair = (conjunct.this, conjunct.expression)
        elif right and right <= inner and left and not left & inner:
            pair = (conjunct.expression, conjunct.this)
        else:
            return None
        (found.pairs if isinstance(conjunct, exp.EQ) else found.unequal).append(pair)
    return found


def _grouped(sub: exp.Select, keys: Sequence[exp.Expr], local: Sequence[exp.Expr],
             *values: exp.Expr) -> exp.Select:
    """``sub``'s tables, filtered by ``local``, grouped by ``keys`` (``cdc_k0`` ...), with
    ``values`` (named) after them."""
    inner = exp.Select(expressions=[key.copy().as_(_SEMI_KEY.format(index=index))
                                    for index, key in enumerate(keys)]
                       + [value.copy() for value in values])
    inner.set("from_", sub.args["from_"].copy())
    inner.set("joins", [join.copy() for join in sub.args.get("joins") or []] or None)
    if local:
        inner.set("where", exp.Where(this=exp.and_(*[c.copy() for c in local])))
    return inner.group_by(*[key.copy() for key in keys], copy=False)


def _matched_on(alias: str, outer_sides: Sequence[exp.Expr]) -> list[exp.Expr]:
    """The subquery ``alias``'s key columns equal to ``outer_sides``."""
    return [exp.EQ(this=exp.column(_SEMI_KEY.format(index=index), table=alias),
                   expression=side.copy()) for index, side in enumerate(outer_sides)]


def _null_when_empty(projection: exp.Expr) -> bool:
    """Whether a scalar subquery's value is NULL over no rows when its aggregates are (no
    COUNT; only arithmetic, casts and literals around them)."""
    aggregates = [node for node in projection.find_all(exp.AggFunc)]
    if not aggregates or any(isinstance(node, exp.Count) for node in aggregates):
        return False
    return all(isinstance(node, (*_NULL_PRESERVING, exp.AggFunc, exp.Alias, exp.Identifier,
                                 exp.DataType, exp.Star))
               or node.find_ancestor(exp.AggFunc) is not None
               for node in projection.walk())


def _mariadb_division(tree: exp.Expr) -> None:
    """MariaDB's ``a DIV 0`` is NULL (DuckDB's ``//`` raises): the divisor becomes
    ``NULLIF(b, 0)``. (``/`` and ``MOD`` get the same from sqlglot's translation.)"""
    for node in list(tree.find_all(exp.IntDiv)):
        node.set("expression", exp.Nullif(this=node.expression.copy(),
                                          expression=exp.Literal.number(0)))


def _per_select(tree: exp.Query, subqueries: Mapping[TableId, exp.Select],
                tables: Sequence[TableId], types: Mapping[TableId, Mapping[str, T]],
                rewrite: Callable[[exp.Select, Callable[[exp.Column], T | None]], None]) -> None:
    """``rewrite(select, type_of)`` for every SELECT (the leaders' quotients and AVGs:
    ``views/mariadb_decimals.py``, ``views/postgres_decimals.py``; rounding of doubles; MariaDB's
    date arithmetic), ``type_of(column)`` what ``types`` says of a captured table's column
    (None: not a captured column, or unknown)."""
    for select in [*tree.find_all(exp.Select), *(s for sub in subqueries.values()
                                                 for s in sub.find_all(exp.Select))]:
        rewrite(select, _type_of(select, tables, types))


def _type_of(select: exp.Select, tables: Sequence[TableId],
             types: Mapping[TableId, Mapping[str, T]]) -> Callable[[exp.Column], T | None]:
    """What ``types`` says of a column of ``select``'s captured tables (None: not one of
    them, or unknown); a column without its table is the one table's."""
    aliases = _aliases_of(select, tables)

    def type_of(column: exp.Column) -> T | None:
        table = aliases.get(column.table) if column.table else \
            next(iter(aliases.values())) if len(aliases) == 1 else None
        return None if table is None else types.get(table, {}).get(column.name)

    return type_of


def _round_doubles(select: exp.Select, kind_of: Callable[[exp.Column], str | None]) -> None:
    """``round`` of a double rounds half to even on both leaders (PostgreSQL's
    ``round(float8)`` is ``rint()``; MariaDB's ``ROUND`` of a double too, with places or not),
    DuckDB's ``round`` half away from zero: it becomes DuckDB's ``round_even`` (``select``
    only, not its subqueries). A double: a ``float64`` column, a cast to a float type, or
    arithmetic with one."""
    for node in list(select.find_all(exp.Round)):
        if node.find_ancestor(exp.Select) is not select or not _double(node.this, kind_of):
            continue
        places = node.args.get("decimals")
        node.replace(exp.Anonymous(this="round_even", expressions=[
            node.this.copy(), places.copy() if places is not None else exp.Literal.number(0)]))


def _double(node: exp.Expr, kind_of: Callable[[exp.Column], str | None]) -> bool:
    """Whether ``node`` is a double by :func:`_round_doubles`' rule."""
    if isinstance(node, exp.Column):
        return kind_of(node) == LogicalKind.FLOAT64.value
    if isinstance(node, exp.Cast):
        return node.to.is_type(*exp.DataType.FLOAT_TYPES)
    if isinstance(node, exp.Paren | exp.Neg | exp.Abs):
        return _double(node.this, kind_of)
    if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div | exp.IntDiv | exp.Mod):
        return _double(node.this, kind_of) or _double(node.expression, kind_of)
    return False


#: date arithmetic: an operand and an INTERVAL
_DATE_ARITHMETIC = (exp.Add, exp.Sub, exp.DateAdd, exp.DateSub)


def _mariadb_wall_clock(select: exp.Select, type_of: Callable[[exp.Column], str | None]
                        ) -> None:
    """MariaDB's date arithmetic (``select`` only, not its subqueries): an interval added to
    a ``TIMESTAMP`` (a point in time; ``TIMESTAMPTZ`` in the state) is added to its wall-clock
    time in the session's time zone, giving a ``DATETIME`` -- the operand becomes ``CAST(...
    AS TIMESTAMP)``, the state's wall-clock time in the view's time zone; one of days, weeks,
    months, quarters or years added to a ``DATE`` gives a ``DATE`` (DuckDB's: a TIMESTAMP),
    so the sum is cast back."""
    for node in list(select.find_all(*_DATE_ARITHMETIC)):
        if node.find_ancestor(exp.Select) is not select:
            continue
        operand, interval = node.this, node.expression
        if isinstance(node, exp.DateAdd | exp.DateSub):
            unit = node.args.get("unit")
        elif isinstance(interval, exp.Interval):
            unit = interval.args.get("unit")
        else:
            continue
        kind = (type_of(operand) or "") if isinstance(operand, exp.Column) else ""
        if kind == "TIMESTAMPTZ":
            node.set("this", exp.Cast(this=operand.copy(), to=exp.DataType.build("TIMESTAMP")))
        elif kind == "DATE" and unit is not None and unit.name.upper() in _DATE_UNITS:
            node.replace(exp.Cast(this=node.copy(), to=exp.DataType.build("DATE")))


#: the interval units that keep a MariaDB DATE a DATE
_DATE_UNITS = frozenset({"DAY", "WEEK", "MONTH", "QUARTER", "YEAR"})


def _postgres_division(tree: exp.Expr) -> None:
    """PostgreSQL's ``/`` of two integers truncates (``-7 / 2`` is ``-3``), and DuckDB's ``/``
    gives a DOUBLE (``-3.5``): it becomes DuckDB's ``//``, which truncates integers and
    divides floats as ``/`` does, marked as PostgreSQL's ``/``: a quotient of exact numbers
    is then computed as PostgreSQL does (``views/postgres_decimals.py``); any other stays a
    DOUBLE, compared with a tolerance by ``cdc verify`` (:func:`approximate_columns`)."""
    for node in list(tree.find_all(exp.Div)):
        divided = exp.IntDiv(this=node.this.copy(), expression=node.expression.copy())
        divided.meta[SLASH] = True
        node.replace(divided)


#: PostgreSQL's ``extract`` fields whose value has a fraction: DuckDB's is an integer
#: (``second``) or a double (``epoch``)
_MICROSECONDS = exp.DataType.build("DECIMAL(38, 0)")
_ONE_MICROSECOND = exp.Cast(this=exp.Literal.string("0.000001"),
                            to=exp.DataType.build("DECIMAL(7, 6)"))


def _postgres_extract(tree: exp.Expr) -> None:
    """PostgreSQL's ``extract`` is a ``numeric``: ``second`` with its fraction (``30.500000``;
    DuckDB's ``second`` is 30) and ``epoch`` to the microsecond (DuckDB's: a double). Both
    become microseconds (DuckDB's ``microsecond``: of the minute; ``epoch_us``) times
    ``0.000001``, a DECIMAL with PostgreSQL's 6 places (``date_part`` too: sqlglot reads it as
    ``extract``; PostgreSQL's ``date_part`` is a double of the same value)."""
    for node in list(tree.find_all(exp.Extract)):
        field = node.this.name.lower() if isinstance(node.this, exp.Var | exp.Identifier) \
            else ""
        if field in ("second", "seconds"):
            micros: exp.Expr = exp.Extract(this=exp.var("MICROSECOND"),
                                           expression=node.expression.copy())
        elif field == "epoch":
            micros = exp.Anonymous(this="epoch_us", expressions=[node.expression.copy()])
        else:
            continue
        node.replace(exp.Paren(this=exp.Mul(this=exp.Cast(this=micros, to=_MICROSECONDS.copy()),
                                            expression=_ONE_MICROSECOND.copy())))


#: PostgreSQL's difference of two instants: the elapsed microseconds as whole days and time
#: (``interval_justify_hours``); DuckDB's subtracts them as wall-clock readings in the session's
#: time zone (an hour off across a DST change). The macro is ``views.types.ELAPSED_MACRO``
_TIMES = frozenset({LogicalKind.TIMESTAMP.value, LogicalKind.TIMESTAMPTZ.value,
                    LogicalKind.DATE.value})
_TIME_TYPES = (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ, exp.DataType.Type.DATE)


def _postgres_elapsed(select: exp.Select, kind_of: Callable[[exp.Column], str | None]) -> None:
    """``a - b`` of two instants, at least one a ``timestamptz`` (a column or a cast), becomes
    ``cdc_pg_elapsed(a, b)``: PostgreSQL's interval between them (``select`` only)."""
    def kind(node: exp.Expr) -> str | None:
        if isinstance(node, exp.Column):
            return kind_of(node)
        if isinstance(node, exp.Cast) and node.to.this in _TIME_TYPES:
            zoned = node.to.this is exp.DataType.Type.TIMESTAMPTZ
            return str((LogicalKind.TIMESTAMPTZ if zoned else LogicalKind.TIMESTAMP).value)
        return None

    for node in list(select.find_all(exp.Sub)):
        if node.find_ancestor(exp.Select) is not select:
            continue
        kinds = (kind(node.this), kind(node.expression))
        if LogicalKind.TIMESTAMPTZ.value in kinds and all(k in _TIMES for k in kinds):
            node.replace(exp.Anonymous(this="cdc_pg_elapsed",
                                       expressions=[node.this.copy(), node.expression.copy()]))


def _apply_column_lists(tree: exp.Query) -> None:
    """A column list -- ``WITH t (a, b) AS (...)``, ``(SELECT ...) AS t (a, b)`` -- written
    into the query it names: its output columns take those names (``AS a``, ``AS b``) and the
    list goes (the same rows and names; what follows sees named columns)."""
    for node in [*tree.find_all(exp.CTE), *tree.find_all(exp.Subquery)]:
        alias = node.args.get("alias")
        if not isinstance(alias, exp.TableAlias) or not isinstance(node.this, exp.Query):
            continue
        names = alias.args.get("columns")
        if not names:
            continue
        for select in _branches(node.this):
            if len(select.expressions) != len(names):
                raise ViewDefinitionError(
                    f"the column list ({', '.join(n.name for n in names)}) of "
                    f"{alias.name or 'a subquery'} names {len(names)} columns, its query "
                    f"gives {len(select.expressions)}",
                    "name as many columns as the query selects")
            select.set("expressions", [
                exp.alias_(projection.unalias().copy(), name.copy())
                for projection, name in zip(select.expressions, names, strict=True)])
        alias.set("columns", None)


def _unqualified_in_joins(tree: exp.Query) -> bool:
    """Whether a SELECT of several tables names a column without its table."""
    return any(select.args.get("joins") and any(
        not column.table and column.find_ancestor(exp.Select) is select
        for column in select.find_all(exp.Column)) for select in tree.find_all(exp.Select))


def _qualify_columns(tree: exp.Query, captured: Sequence[TableId], catalog: Catalog) -> None:
    """Each unqualified column of a SELECT (``c_custkey = o_custkey``) qualified with the one
    table, WITH or subquery of that SELECT's FROM and joins that has such a column -- as the
    leader resolves it -- so that the plan is the qualified form's. A name none or several of
    them have is left as written (the leader refuses an ambiguous one; an output alias or an
    outer query's column is not a table's); so is every column of ORDER BY (where an output
    name comes first)."""
    ctes = {cte.alias_or_name: cte.this for cte in tree.find_all(exp.CTE)}
    by_name: dict[str, list[TableId]] = {}
    for table in captured:
        by_name.setdefault(table.table, []).append(table)

    def columns_of(node: exp.Expr) -> set[str]:
        if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Query):
            return {p.alias_or_name for p in node.this.selects}
        if not isinstance(node, exp.Table):
            return set()
        if not node.db and node.name in ctes:
            return {p.alias_or_name for p in ctes[node.name].selects}
        found = [TableId(node.db, node.name)] if node.db else by_name.get(node.name, [])
        return set(catalog.get(found[0], ())) if len(found) == 1 else set()

    for select in list(tree.find_all(exp.Select)):
        if not select.args.get("from_"):
            continue
        scope = [select.args["from_"].this, *(j.this for j in select.args.get("joins") or [])]
        owners: dict[str, list[str]] = {}
        for node in scope:
            for name in columns_of(node):
                owners.setdefault(name, []).append(node.alias_or_name)
        for column in list(select.find_all(exp.Column)):
            if column.table or column.find_ancestor(exp.Select) is not select \
                    or column.find_ancestor(exp.Order) is not None:
                continue
            found = owners.get(column.name, [])
            if len(found) == 1:
                column.set("table", exp.to_identifier(found[0]))


def _blank_padding(tree: exp.Query, subqueries: Mapping[TableId, exp.Select],
                   tables: Sequence[TableId], padded: dict[TableId, dict[str, int]]) -> None:
    """PostgreSQL's ``character(n)`` in the state: its values are held without their trailing
    blanks (``views/state.py``), so comparing, grouping, joining, ``IN``, ``length`` and
    ``||`` see what the leader sees (it ignores them, and drops them on the way to text).
    Where the leader keeps them, the blanks are put back (``rpad(c, n)``): a view column that
    is such a column or its MIN/MAX, and the operand of LIKE, a regular expression,
    ``concat()`` and ``octet_length``. An aggregating subquery's columns of that kind are
    padded columns of its table in turn (``padded`` is extended)."""
    for table, inner in subqueries.items():
        aliases = _aliases_of(inner, tables)
        _trim_literals(inner, aliases, padded)
        _pad_operands(inner, aliases, padded)
        lengths = {projection.alias_or_name: n for projection in inner.selects
                   if (n := _padded_output(projection.unalias(), aliases, padded))}
        if lengths:
            padded[table] = lengths
    for select in _branches(tree):
        aliases = _aliases_of(select, tables)
        _trim_literals(select, aliases, padded)
        _pad_operands(select, aliases, padded)
        select.set("expressions", [_pad_output(projection, aliases, padded)
                                   for projection in select.expressions])


def _order_by_outputs(select: exp.Select) -> None:
    """ORDER BY an output column's name or position orders by that column's expression, as
    the leader resolves it (a bare name is an output column first): the rules that follow
    (``character(n)``, collations) then see the column that is ordered."""
    order = select.args.get("order")
    if order is None:
        return
    outputs = {projection.alias_or_name: projection.unalias() for projection in select.selects}
    for ordered in order.expressions:
        item = ordered.this
        if isinstance(item, exp.Column) and not item.table and item.name in outputs:
            ordered.set("this", outputs[item.name].copy())
        elif isinstance(item, exp.Literal) and item.is_int \
                and 1 <= int(item.name) <= len(select.selects):
            ordered.set("this", select.selects[int(item.name) - 1].unalias().copy())


def _icu_collations(orders: Mapping[TableId, Mapping[str, str]]
                    ) -> dict[TableId, dict[str, str]]:
    """Per table, the DuckDB ICU collation of each column ordered by an ICU locale that one
    maps (``views.collation.duckdb_collation``; the others are left to the check's refusal)."""
    out: dict[TableId, dict[str, str]] = {}
    for table, locales in orders.items():
        mapped = {column: collation for column, locale in locales.items()
                  if (collation := duckdb_collation(locale, duckdb_knows)) is not None}
        if mapped:
            out[table] = mapped
    return out


def _icu_order(tree: exp.Query, subqueries: Mapping[TableId, exp.Select],
               tables: Sequence[TableId], icu: dict[TableId, dict[str, str]]) -> None:
    """Text the leader orders by an ICU locale is ordered so in the state
    (``views/collation.py``). An aggregating subquery's column that is such a column, or its
    MIN/MAX, is such a column of its table in turn (``icu`` is extended)."""
    def order(select: exp.Select) -> None:
        aliases = _aliases_of(select, tables)
        order_by_icu(select, lambda column: _icu_of(column, aliases, icu))

    for table, inner in subqueries.items():
        aliases = _aliases_of(inner, tables)
        outputs = {projection.alias_or_name: collation for projection in inner.selects
                   if (collation := _icu_of(projection.unalias(), aliases, icu))}
        for select in list(inner.find_all(exp.Select)):
            order(select)
        if outputs:
            icu[table] = outputs
    for select in list(tree.find_all(exp.Select)):
        order(select)


def _icu_of(node: exp.Expr, aliases: Mapping[str, TableId],
            icu: Mapping[TableId, Mapping[str, str]]) -> str | None:
    """The DuckDB ICU collation of ``node`` when it is an ICU-ordered column or its MIN/MAX."""
    if isinstance(node, exp.Min | exp.Max):
        node = node.this
    if not isinstance(node, exp.Column):
        return None
    table = aliases.get(node.table) if node.table else \
        next(iter(aliases.values())) if len(aliases) == 1 else None
    return None if table is None else icu.get(table, {}).get(node.name)


def _aliases_of(select: exp.Select, tables: Sequence[TableId]) -> dict[str, TableId]:
    """Alias -> table of the tables in a SELECT's FROM and joins."""
    by_name: dict[str, list[TableId]] = {}
    for table in tables:
        by_name.setdefault(table.table, []).append(table)
    out: dict[str, TableId] = {}
    if not select.args.get("from_"):
        return out
    for node in [select.args["from_"].this, *(j.this for j in select.args.get("joins") or [])]:
        if isinstance(node, exp.Table):
            found = [TableId(node.db, node.name)] if node.db else by_name.get(node.name, [])
            if len(found) == 1:
                out[node.alias_or_name] = found[0]
    return out


def _padding_of(node: exp.Expr, aliases: Mapping[str, TableId],
                padded: Mapping[TableId, Mapping[str, int]]) -> int | None:
    """n when ``node`` is a column of a ``character(n)`` column, else None."""
    if not isinstance(node, exp.Column):
        return None
    table = aliases.get(node.table) if node.table else \
        next(iter(aliases.values())) if len(aliases) == 1 else None
    return None if table is None else padded.get(table, {}).get(node.name)


def _padded_output(node: exp.Expr, aliases: Mapping[str, TableId],
                   padded: Mapping[TableId, Mapping[str, int]]) -> int | None:
    """n when a view column ``node`` is, on the leader, a ``character(n)`` value: such a
    column, or its MIN or MAX."""
    if isinstance(node, exp.Min | exp.Max):
        node = node.this
    return _padding_of(node, aliases, padded)


def _rpad(node: exp.Expr, n: int) -> exp.Expr:
    padding = exp.Anonymous(this="rpad", expressions=[node, exp.Literal.number(n),
                                                      exp.Literal.string(" ")])
    padding.meta[_PADDING] = True
    return padding


#: marks the ``rpad`` nodes :func:`_blank_padding` wrote (a padded key column is its column)
_PADDING = "cdc_blank_padding"


def _unpadded(expression: exp.Expr) -> exp.Expr:
    """A view column's expression without the blanks :func:`_blank_padding` put back."""
    return expression.expressions[0] if expression.meta.get(_PADDING) else expression


def _pad_output(projection: exp.Expr, aliases: Mapping[str, TableId],
                padded: Mapping[TableId, Mapping[str, int]]) -> exp.Expr:
    n = _padded_output(projection.unalias(), aliases, padded)
    if n is None:
        return _pad_branches(projection, aliases, padded)
    return exp.alias_(_rpad(projection.unalias().copy(), n),
                      exp.to_identifier(projection.alias_or_name))


def _value_branches(node: exp.Expr) -> list[exp.Expr]:
    """The expressions whose value a COALESCE, CASE, NULLIF, GREATEST/LEAST or IF gives."""
    if isinstance(node, exp.Coalesce | exp.Greatest | exp.Least):
        return [node.this, *node.expressions]
    if isinstance(node, exp.Case):
        return [*(branch.args["true"] for branch in node.args.get("ifs") or []),
                *([node.args["default"]] if node.args.get("default") else [])]
    if isinstance(node, exp.If):
        return [node.args["true"], *([node.args["false"]] if node.args.get("false") else [])]
    if isinstance(node, exp.Nullif):
        return [node.this]
    return []


def _pad_branches(projection: exp.Expr, aliases: Mapping[str, TableId],
                  padded: Mapping[TableId, Mapping[str, int]]) -> exp.Expr:
    """A view column that is a COALESCE, CASE ... of ``character(n)`` columns and string
    literals is a ``character`` value on the leader, each column's value with its blanks
    (``coalesce(c, '-')`` gives ``'ab   '``): those columns are padded. With a ``text`` branch
    the leader's result is text, blanks dropped, as the state holds them."""
    branches = _value_branches(projection.unalias())
    lengths = [_padding_of(branch, aliases, padded) for branch in branches]
    if not any(lengths) or not all(
            n or isinstance(branch, exp.Null) or (isinstance(branch, exp.Literal)
                                                  and branch.is_string)
            for branch, n in zip(branches, lengths, strict=True)):
        return projection
    for branch, n in zip(branches, lengths, strict=True):
        if n:
            branch.replace(_rpad(branch.copy(), n))
    return projection


#: where the leader keeps a ``character(n)`` value's blanks: these operations' operands
_KEEPS_BLANKS = (exp.Like, exp.ILike, exp.RegexpLike, exp.RegexpILike, exp.Concat)


def _pad_operands(select: exp.Select, aliases: Mapping[str, TableId],
                  padded: Mapping[TableId, Mapping[str, int]]) -> None:
    for node in list(select.find_all(*_KEEPS_BLANKS, exp.Anonymous)):
        if isinstance(node, exp.Anonymous) and str(node.name).lower() != "octet_length":
            continue
        if node.find_ancestor(exp.Select) is not select:
            continue
        for operand in [node.this, *node.expressions] if isinstance(
                node, exp.Concat | exp.Anonymous) else [node.this]:
            n = _padding_of(operand, aliases, padded) if isinstance(operand, exp.Expr) \
                else None
            if n is not None:
                operand.replace(_rpad(operand.copy(), n))


#: comparisons: a string literal compared with a ``character(n)`` column is ``character`` too
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ,
                exp.NullSafeNEQ)


def _trim_literals(select: exp.Select, aliases: Mapping[str, TableId],
                   padded: Mapping[TableId, Mapping[str, int]]) -> None:
    """``c = 'B '``, ``c IN ('a ', 'b')``, ``c BETWEEN 'a ' AND 'b'`` with ``c`` a
    ``character(n)`` column: the leader reads the literals as ``character`` values, whose
    trailing blanks do not count; the state holds ``c`` without them, so the literals lose
    theirs too."""
    for node in list(select.find_all(*_COMPARISONS, exp.In, exp.Between)):
        sides = [node.this, node.expression] if isinstance(node, _COMPARISONS) else [node.this]
        if node.find_ancestor(exp.Select) is not select or not any(
                _padding_of(side, aliases, padded) for side in sides):
            continue
        others = ([node.expression, node.this] if isinstance(node, _COMPARISONS)
                  else node.expressions if isinstance(node, exp.In)
                  else [node.args.get("low"), node.args.get("high")])
        for other in others:
            if isinstance(other, exp.Literal) and other.is_string:
                other.replace(exp.Literal.string(other.this.rstrip(" ")))


def _branches(query: exp.Query) -> list[exp.Select]:
    """The SELECTs whose rows a query gives (each branch of a UNION / INTERSECT / EXCEPT)."""
    if isinstance(query, exp.SetOperation):
        return [*_branches(query.this), *_branches(query.expression)]
    if isinstance(query, exp.Subquery) and isinstance(query.this, exp.Query):
        return _branches(query.this)
    return [query] if isinstance(query, exp.Select) else []


def _inline_ctes(tree: exp.Query, operators: list[Operator]) -> exp.Query:
    with_ = tree.args.get("with_")
    if with_ is None:
        return tree
    if with_.args.get("recursive"):
        operators.append(Operator("WITH RECURSIVE", False, "a recursive query's result depends "
                                  "on all of its rows", "keep the hierarchy's closure in a "
                                  "table on the leader, or recompute"))
        return tree
    ctes = {cte.alias_or_name: cte.this for cte in with_.expressions}
    tree.set("with_", None)
    for _ in range(len(ctes) + 1):  # a CTE may name an earlier one
        found = [node for node in tree.find_all(exp.Table)
                 if not node.db and node.name in ctes]
        if not found:
            break
        for node in found:
            node.replace(exp.Subquery(this=ctes[node.name].copy(),
                                      alias=exp.TableAlias(this=exp.to_identifier(
                                          node.alias_or_name))))
    operators.append(Operator("WITH", True))
    return tree


def _plain(select: exp.Expr, subqueries: bool = False) -> bool:
    """A SELECT that only filters and projects its FROM and joins (and may have
    ``subqueries``)."""
    return isinstance(select, exp.Select) and not any(
        select.args.get(arg) for arg in ("group", "having", "distinct", "limit", "offset",
                                         "qualify", "with_")) \
        and not _has_aggregate(select.expressions) \
        and not any(True for _ in select.find_all(exp.Window)) \
        and (subqueries or not any(True for _ in select.find_all(exp.Subquery)))


def _aggregating(select: exp.Expr, subqueries: bool = False) -> bool:
    """A GROUP BY over tables (no window, LIMIT, DISTINCT ON or nested subquery, unless
    ``subqueries``): kept in the state as a table of its own, maintained like a view."""
    return isinstance(select, exp.Select) and select.args.get("group") is not None \
        and not any(select.args.get(arg) for arg in ("limit", "offset", "qualify", "with_")) \
        and not any(True for _ in select.find_all(exp.Window)) \
        and (subqueries or not any(True for _ in select.find_all(exp.Subquery)))


def _split_global_aggregate(tree: exp.Query, subqueries: dict[TableId, exp.Select],
                            tables: Sequence[TableId],
                            kinds: Mapping[TableId, Mapping[str, str]]) -> None:
    """An aggregate without GROUP BY over captured tables -- SUM and COUNT of exact values (an
    AVG's parts too; no DISTINCT, FILTER or double: a running sum of doubles drifts) -- becomes
    two SELECTs with the same rows: an aggregating subquery of its *running totals* (one row,
    a table of the state: per SUM the sum of its non-NULL values and their count, per COUNT
    its count), which a batch moves by the contributions of the tuples its changes reach, new
    minus old (``ViewPlan.delta_sql``); and ``tree`` over that row: a SUM is its total, NULL
    when it counted none; a COUNT its count (0 over none). Both keep DuckDB's types of the
    aggregates they replace (a SUM of DECIMAL(38, s) or HUGEINT stays one; COUNT is BIGINT).
    Run after the leaders' rewrites, so the expressions around the aggregates (a quotient of
    two SUMs, an AVG's exact quotient) are kept as they are."""
    if not isinstance(tree, exp.Select) or tree.args.get("group") is not None \
            or not isinstance(tree.args.get("from_"), exp.From) \
            or any(tree.args.get(arg) for arg in ("limit", "offset", "qualify", "distinct")) \
            or any(True for _ in tree.find_all(exp.Window, exp.Subquery)) \
            or (any(table.db == SUB_SCHEMA for table in tree.find_all(exp.Table))
                and any(join.side for join in tree.args.get("joins") or [])):
        return  # over a subquery's table: inner joins only (see ViewPlan.delta_late_sql)
    kind_of = _type_of(tree, tables, kinds)
    aggregates = [node for node in tree.find_all(exp.AggFunc)]
    if not aggregates or not all(_summable(node, kind_of) for node in aggregates):
        return
    unique: dict[str, exp.AggFunc] = {}
    for node in aggregates:
        unique.setdefault(node.sql(), node)
    index_of = {text: index for index, text in enumerate(unique)}
    totals: list[exp.Expr] = [exp.Literal.number(0).as_(_GROUP_COLUMN)]
    for index, node in enumerate(unique.values()):
        if isinstance(node, exp.Sum):
            totals.append(exp.Coalesce(this=node.copy(), expressions=[exp.Literal.number(0)])
                          .as_(_SUM_COLUMN.format(index=index)))
        totals.append(exp.Count(this=node.this.copy()).as_(_COUNT_COLUMN.format(index=index)))
    inner = exp.Select(expressions=totals)
    inner.set("from_", tree.args["from_"].copy())
    inner.set("joins", [join.copy() for join in tree.args.get("joins") or []] or None)
    where = tree.args.get("where")
    inner.set("where", where.copy() if where is not None else None)
    inner = inner.group_by(exp.column(_GROUP_COLUMN), copy=False)  # one group, or none
    inner.meta[_RUNNING] = True
    table = TableId(SUB_SCHEMA, f"s{len(subqueries)}")
    subqueries[table] = inner
    for node in aggregates:
        node.replace(_from_totals(node, index_of[node.sql()]))
    tree.set("from_", exp.From(this=exp.Table(
        this=exp.to_identifier(table.table), db=exp.to_identifier(SUB_SCHEMA),
        alias=exp.TableAlias(this=exp.to_identifier(_TOTALS_ALIAS)))))
    tree.set("joins", None)
    tree.set("where", None)
    tree.meta[_TOTALS] = True


def _summable(node: exp.AggFunc, kind_of: Callable[[exp.Column], str | None]) -> bool:
    """Whether :func:`_split_global_aggregate` can keep ``node`` as a running total."""
    if not isinstance(node, (exp.Sum, exp.Count)) or isinstance(node.this, exp.Distinct) \
            or isinstance(node.parent, exp.Filter) \
            or any(True for _ in node.this.find_all(exp.AggFunc)):
        return False
    return isinstance(node, exp.Count) or not _double(node.this, kind_of)


def _from_totals(node: exp.AggFunc, index: int) -> exp.Expr:
    """``node`` computed from the running totals' row (its columns ``index``)."""
    count = exp.Sum(this=exp.column(_COUNT_COLUMN.format(index=index), table=_TOTALS_ALIAS))
    if isinstance(node, exp.Sum):
        total = exp.Sum(this=exp.column(_SUM_COLUMN.format(index=index), table=_TOTALS_ALIAS))
        total.meta.update(node.meta)  # an AVG's part stays one (check-config names the AVG)
        return exp.Case(ifs=[exp.If(this=exp.GT(this=count, expression=exp.Literal.number(0)),
                                    true=total)])
    count.meta.update(node.meta)
    return exp.Cast(this=exp.Coalesce(this=count, expressions=[exp.Literal.number(0)]),
                    to=exp.DataType.build("BIGINT"))


def _merge_subqueries(select: exp.Select, operators: list[Operator],
                      subqueries: dict[TableId, exp.Select]) -> None:
    """Each subquery in FROM (or a join) that only filters and projects one table (in FROM:
    any joins) becomes that table, its columns replaced by their expressions and its filter
    moved to the WHERE (or to the ON of a LEFT join that supplies its nulls); one that
    aggregates becomes a table of the state that holds its rows (:data:`SUB_SCHEMA`)."""
    joins = select.args.get("joins") or []
    slots: list[exp.Expr] = [select.args["from_"].this, *(join.this for join in joins)] \
        if select.args.get("from_") else []
    for position, node in enumerate(slots):
        if not isinstance(node, exp.Subquery):
            continue
        inner = node.this
        if isinstance(inner, exp.Select) and (_plain(inner, True) or _aggregating(inner, True)):
            _decorrelate(inner, f"{node.alias_or_name}_")  # its subqueries in WHERE joined,
            _merge_subqueries(inner, operators, subqueries)  # its own kept first
        if _aggregating(inner):
            table = TableId(SUB_SCHEMA, f"s{len(subqueries)}")
            subqueries[table] = inner
            node.replace(exp.Table(this=exp.to_identifier(table.table),
                                   db=exp.to_identifier(SUB_SCHEMA),
                                   alias=exp.TableAlias(this=exp.to_identifier(
                                       node.alias_or_name))))
            continue
        join = joins[position - 1] if position else None
        side = (join.side or "").upper() if join is not None else ""
        single = _plain(inner) and not inner.args.get("joins")
        if not _plain(inner) or (position and (not single or side in ("RIGHT", "FULL"))):
            operators.append(_subquery_operator(inner, position, side))
            continue
        _merge_one(select, node, inner, join)
        operators.append(Operator("subquery in FROM", True))


def _subquery_operator(inner: exp.Expr, position: int, side: str) -> Operator:
    if not _plain(inner):
        return Operator("subquery in FROM that windows, limits or nests", False,
                        "its rows are computed over whole tables",
                        "join the tables directly, or make the subquery a view of its own")
    if side in ("RIGHT", "FULL"):
        return Operator(f"subquery on the null side of a {side} JOIN", False,
                        "its filter cannot move out of the join",
                        "join the table itself and put the filter into the ON")
    return Operator("subquery with joins after the first table", False,
                    "its joins cannot be reordered into the query's",
                    "write the subquery's joins into the query, or move it into FROM")


def _merge_one(select: exp.Select, node: exp.Subquery, inner: exp.Select,
               join: exp.Join | None) -> None:
    alias = node.alias_or_name
    renames: dict[str, str] = {}
    inner = inner.copy()
    inner_tables = [inner.args["from_"].this, *(j.this for j in inner.args.get("joins") or [])]
    for table in inner_tables:
        if not isinstance(table, exp.Table):
            return
        renames[table.alias_or_name] = alias if len(inner_tables) == 1 \
            else f"{alias}__{table.alias_or_name}"
    only = next(iter(renames.values())) if len(renames) == 1 else None
    for column in inner.find_all(exp.Column):
        if column.table in renames:
            column.set("table", exp.to_identifier(renames[column.table]))
        elif not column.table and only is not None:
            column.set("table", exp.to_identifier(only))
    for table in inner_tables:
        table.set("alias", exp.TableAlias(this=exp.to_identifier(renames[table.alias_or_name])))
    outputs = {projection.alias_or_name: projection.unalias() for projection in inner.selects}
    single_ref = len(select.args.get("joins") or []) == 0
    for projection in select.expressions:  # an output keeps its name
        if isinstance(projection, exp.Column) and projection.name in outputs and \
                (projection.table == alias or (not projection.table and single_ref)):
            projection.replace(exp.alias_(projection.copy(), projection.name))
    for column in list(select.find_all(exp.Column)):
        if column.find_ancestor(exp.Subquery) is node:
            continue
        if (column.table == alias or (not column.table and single_ref)) and \
                column.name in outputs:
            column.replace(outputs[column.name].copy())
    node.replace(inner.args["from_"].this)
    if inner.args.get("joins"):  # in FROM: its joins come first
        select.set("joins", [*inner.args["joins"], *(select.args.get("joins") or [])])
    condition = inner.args.get("where")
    if condition is None:
        return
    if join is not None and (join.side or "").upper() == "LEFT":
        join.set("on", exp.and_(join.args.get("on") or exp.true(), condition.this))
    else:
        select.where(condition.this, copy=False)


def _distinct_as_group(select: exp.Select, operators: list[Operator]) -> None:
    distinct = select.args.get("distinct")
    if distinct is None or select.args.get("group") or _has_aggregate(select.expressions) \
            or any(True for _ in select.find_all(exp.Window)):
        return
    if distinct.args.get("on") is not None:
        operators.append(Operator("DISTINCT ON", False, "it keeps one row per group by an "
                                  "order", "a window function: row_number() OVER (PARTITION "
                                  "BY ... ORDER BY ...) in a subquery, filtered to 1"))
        return
    select.set("distinct", None)
    select.set("group", exp.Group(expressions=[projection.unalias().copy()
                                               for projection in select.expressions]))
    operators.append(Operator("SELECT DISTINCT", True))


# ------------------------------------------------------------------------ classification

def _set_branches(tree: exp.Query, operators: list[Operator]) -> list[exp.Select]:
    """The SELECTs whose rows make the view: one, or a UNION [ALL]'s branches."""
    if not isinstance(tree, exp.SetOperation):
        return [tree] if isinstance(tree, exp.Select) else []
    if tree.args.get("limit") or tree.args.get("offset"):
        operators.append(_LIMIT)
    if isinstance(tree, exp.Union):
        operators.append(Operator("UNION" if tree.args.get("distinct") else "UNION ALL", True))
        return [*_set_branches(tree.this, operators), *_set_branches(tree.expression,
                                                                     operators)]
    what = type(tree).__name__.upper()
    operators.append(Operator(what, False, f"{what} compares whole results",
                              "INTERSECT as a JOIN on the compared columns, EXCEPT as a LEFT "
                              "JOIN ... WHERE the right side's key IS NULL"))
    return []


_LIMIT = Operator("LIMIT/OFFSET", False, "which rows make the cut depends on all rows",
                  "drop the LIMIT and limit when reading the view, or rank with row_number() "
                  "OVER (PARTITION BY ...) and filter")


@dataclass
class _Join:
    """One join of a SELECT: its position (1 = the first join), side, and, per side that it
    null-extends, the pairs (that side's column, the expression over the other side)."""

    position: int
    side: str
    #: null-extended reference position -> [(its column, the expression it must equal)]
    null_sides: dict[int, list[tuple[str, exp.Expr]]] = field(default_factory=dict)


@dataclass
class _Branch:
    """One SELECT's compiled queries (see :func:`_compile`)."""

    lineage: str
    restricted: str
    scope_lineage: str | None = None
    #: with aggregating subqueries: the lineage branches of the captured tables' changes, and
    #: those of the subqueries' changes
    early: str | None = None
    late: str | None = None
    #: :attr:`ViewPlan.flip_sql`
    flips: dict[int, str] = field(default_factory=dict)


def _compile(name: str, select: exp.Select, references: Sequence[BaseTable],
             key_positions: Sequence[int], operators: list[Operator], in_union: bool,
             affected: str, one_row: Collection[TableId] = ()) -> _Branch:
    """Classify ``select`` (its operators appended to ``operators``) and, when every one so
    far is incremental, build its lineage and restricted queries (``one_row``: the subqueries'
    tables that hold one row at most: :func:`_flip_branch`)."""
    _classify(select, operators)
    joins = _joins(select, references, operators)
    projections = [projection.unalias() for projection in select.expressions]
    key_exprs = _key_expressions(name, select, [select.expressions[i].alias_or_name
                                                for i in key_positions],
                                 [projections[i] for i in key_positions])
    scope = _window_scope(select, operators, in_union)
    if any(not operator.incremental for operator in operators):
        return _Branch("", "")
    if scope is None:
        flipped = [position for position in range(len(references))
                   if _flips(select, references, position, one_row)]
        others = [ref for position, ref in enumerate(references) if position not in flipped]
        branch = _Branch(_lineage_union(select, references, key_exprs, joins, "k",
                                        lambda ref: ref in others),
                         _restricted(select, references, key_exprs, affected, "k"),
                         flips={references[position].index: _flip_branch(
                             select, references, key_exprs, position) for position in flipped})
        if any(ref.table.schema == SUB_SCHEMA for ref in references):  # the two halves too
            branch.early = _lineage_union(select, references, key_exprs, joins, "k",
                                          lambda ref: ref.table.schema != SUB_SCHEMA)
            branch.late = _lineage_union(select, references, key_exprs, joins, "k",
                                         lambda ref: ref.table.schema == SUB_SCHEMA
                                         and ref in others)
        return branch
    keys = _keys_of(_state_tree(select, references), key_exprs, "k").where(
        _exists_in(SCOPES, scope, "s"), copy=False)
    return _Branch(str(keys.sql(dialect="duckdb")),
                   _restricted(select, references, scope, SCOPES, "s"),
                   _lineage_union(select, references, scope, joins, "s"))


def _flips(select: exp.Select, references: Sequence[BaseTable], position: int,
           one_row: Collection[TableId]) -> bool:
    """Whether reference ``position`` is a one-row subquery's joined after the first table
    whose columns ``select`` reads only in its WHERE and in that join's ON (on its own
    columns alone): a new row of it changes which tuples the WHERE keeps, nothing else."""
    if position == 0 or references[position].table not in one_row:
        return False
    alias = references[position].alias
    join = (select.args.get("joins") or [])[position - 1]
    where, on = select.args.get("where"), join.args.get("on")
    if on is not None and any(column.table != alias for column in on.find_all(exp.Column)):
        return False
    return all(_inside(column, where) or _inside(column, on)
               for column in select.find_all(exp.Column) if column.table == alias)


def _inside(node: exp.Expr, container: exp.Expr | None) -> bool:
    while node is not None:
        if node is container:
            return True
        node = node.parent  # type: ignore[assignment]  # None above the root
    return False


def _flip_branch(select: exp.Select, references: Sequence[BaseTable], exprs: Sequence[exp.Expr],
                 position: int) -> str:
    """The keys of the tuples the WHERE keeps with one-row subquery ``position``'s old row
    and not with its new one, or the other way round (:data:`FLIP`: NULLs for a row absent,
    as its LEFT JOIN gives): TPC-H Q22's customers between the old and new average. The
    WHERE's other conjuncts, the joins among the other tables, are kept as they are."""
    ref = references[position]
    tree = _state_tree(select, references, {position: FLIP.format(index=ref.index)})
    tree.args["joins"][position - 1].set("on", exp.true())  # its one row, old and new
    where = tree.args["where"].this
    conjuncts = list(where.flatten()) if isinstance(where, exp.And) else [where]
    mine = [c for c in conjuncts
            if any(column.table == ref.alias for column in c.find_all(exp.Column))]
    rest = [c for c in conjuncts if all(c is not m for m in mine)]
    old = exp.and_(*[c.copy() for c in mine])
    new = old.copy()
    for column in new.find_all(exp.Column):
        if column.table == ref.alias:
            column.set("this", exp.to_identifier(FLIP_NEW.format(name=column.name), quoted=True))
    flipped = exp.NEQ(this=exp.Coalesce(this=exp.paren(old), expressions=[exp.false()]),
                      expression=exp.Coalesce(this=exp.paren(new), expressions=[exp.false()]))
    tree.set("where", exp.Where(this=exp.and_(*rest, flipped)))
    return str(_keys_of(tree, exprs, "k").sql(dialect="duckdb"))


def _classify(select: exp.Select, operators: list[Operator]) -> None:
    """The operators of ``select`` other than its joins and windows."""
    operators.append(Operator("SELECT (filter, projection)", True))
    for node in select.find_all(exp.Select):
        if node is not select and not _in_from(node, select):
            operators.append(Operator("subquery in WHERE or SELECT", False,
                                      "its result depends on rows outside the changed ones' "
                                      "groups ([NOT] EXISTS, IN and correlated scalar "
                                      "subqueries are kept when ANDed in the WHERE and "
                                      "correlated by equalities of qualified columns)",
                                      "write NOT IN as NOT EXISTS when neither side can be "
                                      "NULL, a scalar subquery over a whole table as a JOIN "
                                      "to an aggregating view"))
            break
    if select.args.get("limit") or select.args.get("offset"):
        operators.append(_LIMIT)
    group = select.args.get("group")
    if group is not None:
        operators.append(Operator("GROUP BY", True))
        if select.args.get("having") is not None:
            operators.append(Operator("HAVING", True))
    aggregates = [node for node in select.find_all(exp.AggFunc)
                  if node.find_ancestor(exp.Window) is None]
    for construct in dict.fromkeys(_aggregate_name(node) for node in aggregates):
        if group is not None:
            operators.append(Operator(construct, True))
        elif select.meta.get(_TOTALS):
            operators.append(Operator(f"{construct} without GROUP BY (a running total)", True))
        else:
            operators.append(Operator(f"{construct} without GROUP BY", False,
                                      "one row over the whole table: each change recomputes "
                                      "it from every row (only SUM, COUNT and AVG of exact "
                                      "numbers are kept as running totals)",
                                      "GROUP BY a column, so a change recomputes its group "
                                      "only"))


def _in_from(node: exp.Expr, select: exp.Select) -> bool:
    """Whether ``node`` is inside a subquery in FROM or a join of ``select`` (those are
    classified where they are merged)."""
    while node.parent is not None and node is not select:
        if isinstance(node, exp.Subquery) and isinstance(node.parent, (exp.From, exp.Join)) \
                and node.parent.parent is select:
            return True
        node = node.parent
    return False


def _aggregate_name(node: exp.AggFunc) -> str:
    if part_of_average(node):
        return "AVG"
    if (extreme := extreme_name(node)) is not None:
        return extreme
    if isinstance(node, exp.Count) and isinstance(node.this, exp.Distinct):
        return "COUNT(DISTINCT)"
    if isinstance(node, exp.Anonymous):
        return str(node.name).upper()
    return node.sql_name() if hasattr(node, "sql_name") else type(node).__name__.upper()


def _window_scope(select: exp.Select, operators: list[Operator], in_union: bool
                  ) -> list[exp.Expr] | None:
    """With window functions, the PARTITION BY expressions all of them share (an
    operator that is not incremental when there are none); ``None`` without windows."""
    windows = [node for node in select.find_all(exp.Window)]
    if not windows:
        return None
    if select.args.get("group") is not None or any(
            node.find_ancestor(exp.Window) is None for node in select.find_all(exp.AggFunc)):
        operators.append(Operator("window function over GROUP BY", False,
                                  "its partitions are made of groups", "compute the groups in "
                                  "one view and rank them in the reader, or partition the "
                                  "window over the base rows"))
        return []
    if select.args.get("distinct") is not None:
        operators.append(Operator("SELECT DISTINCT over window values", False,
                                  "equal rows of different partitions merge",
                                  "add the PARTITION BY columns to the output and the key"))
        return []
    if in_union:
        operators.append(Operator("window function in a UNION branch", False,
                                  "the branches' partitions differ", "make the windowed "
                                  "SELECT a view of its own"))
        return []
    shared: dict[str, exp.Expr] | None = None
    for window in windows:
        here = {_canonical(e): e for e in window.args.get("partition_by") or []}
        shared = here if shared is None else {k: v for k, v in shared.items() if k in here}
    if not shared:
        operators.append(Operator("window function without PARTITION BY", False,
                                  "every row's value depends on the whole table",
                                  "add PARTITION BY (only the partitions a change touches "
                                  "are recomputed)"))
        return []
    text = ", ".join(e.sql() for e in shared.values())
    operators.append(Operator(f"window function (PARTITION BY {text})", True))
    return list(shared.values())


def _has_aggregate(nodes: Sequence[exp.Expr]) -> bool:
    return any(True for node in nodes for _ in node.find_all(exp.AggFunc))


def _key_expressions(name: str, select: exp.Select, key: Sequence[str],
                     out: Sequence[exp.Expr]) -> list[exp.Expr]:
    """The expression of each key column; with GROUP BY, each must be a grouping expression."""
    for column, expression in zip(key, out, strict=True):
        if any(True for _ in expression.find_all(exp.Window)):
            raise ViewDefinitionError(f"view {name}: key column {column} is a window "
                                      "function's value", "key the view by columns of its rows")
        if _has_aggregate([expression]):
            raise ViewDefinitionError(f"view {name}: key column {column} is an aggregate",
                                      "key a view by the GROUP BY columns")
    group = select.args.get("group")
    if group is not None:
        grouped = {_canonical(expression) for expression in _grouping(select)}
        loose = [column for column, expression in zip(key, out, strict=True)
                 if _canonical(_unpadded(expression)) not in grouped]
        if loose:
            raise ViewDefinitionError(f"view {name}: key columns {loose} are not GROUP BY "
                                      "expressions, so one key could span several groups",
                                      f"key the view by GROUP BY columns (views.{name}.key)")
    return list(out)


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


def _joins(select: exp.Select, references: Sequence[BaseTable],
           operators: list[Operator]) -> list[_Join]:
    """Each join of ``select`` classified (its operator appended), with the equalities that
    say which tuples an outer join null-extends."""
    aliases = [ref.alias for ref in references]
    out: list[_Join] = []
    for position, join in enumerate(select.args.get("joins") or [], start=1):
        side = (join.side or "").upper()
        kind = (join.kind or "").upper()
        construct = f"{side} JOIN" if side else ("CROSS JOIN" if kind == "CROSS" or
                                                 join.args.get("on") is None else "INNER JOIN")
        refused = _join_refusal(join, side, kind, position)
        if refused is not None:
            operators.append(Operator(construct, False, *refused))
            continue
        entry = _Join(position, side)
        nulls = {"LEFT": [position], "RIGHT": [0], "FULL": [position, 0]}.get(side, [])
        for null in nulls:
            others = set(aliases[:position]) if null == position else {aliases[position]}
            pairs = _equalities(join.args.get("on"), aliases[null], others)
            if not pairs:
                operators.append(Operator(construct, False, f"its {side} JOIN of "
                                          f"{aliases[position]} has no equality between its "
                                          "two sides", "join ON an equality of columns (a = "
                                          "b AND ...), other conditions beside it"))
                break
            entry.null_sides[null] = pairs
        else:
            operators.append(Operator(construct, True))
        out.append(entry)
    return out


def _join_refusal(join: exp.Join, side: str, kind: str, position: int
                  ) -> tuple[str, str] | None:
    if join.args.get("using"):
        return ("JOIN ... USING merges the two columns", "write ON a.x = b.x")
    if kind in ("ANTI", "SEMI", "NATURAL"):
        return (f"a {kind} JOIN", "a LEFT JOIN ... WHERE the right key IS [NOT] NULL, or ON")
    if side in ("RIGHT", "FULL") and position > 1:
        return (f"a {side} JOIN after the first join null-extends several tables at once",
                f"make it the first join (FROM a {side} JOIN b ..., then the others)")
    return None


def _equalities(condition: exp.Expr | None, mine: str, others: set[str]
                ) -> list[tuple[str, exp.Expr]]:
    """The terms ``mine.col = expr`` of ``condition`` (an AND of terms) whose ``expr`` reads
    only ``others``, or is a constant (``ON z.k = 1``: every tuple matches the same rows)."""
    pairs: list[tuple[str, exp.Expr]] = []
    if condition is None:
        return pairs
    for term in condition.flatten() if isinstance(condition, exp.And) else [condition]:
        if not isinstance(term, exp.EQ):
            continue
        for here, there in ((term.this, term.expression), (term.expression, term.this)):
            if isinstance(here, exp.Column) and here.table == mine and \
                    _aliases_in(there) <= others and (_aliases_in(there) or _constant(there)):
                pairs.append((here.name, there))
                break
    return pairs


def _constant(expression: exp.Expr) -> bool:
    return all(isinstance(node, exp.Literal | exp.Paren | exp.Neg | exp.Cast | exp.DataType)
               for node in expression.walk())


# --------------------------------------------------------------------------- the queries

def _state_tree(tree: exp.Query, references: Sequence[BaseTable],
                replace: Mapping[int, str] | None = None) -> exp.Select:
    """``tree`` with every table reference naming the state's table (``schema.table``,
    quoted), its alias kept; the reference at the position in ``replace`` names that
    (temporary) table instead, and the joins keep only tuples that have its row (an outer
    join that would null-extend it becomes the join that does not: :func:`_keep_side`)."""
    copy = tree.copy()
    for position, (node, ref) in enumerate(zip(_table_nodes(copy), references, strict=True)):
        alias = exp.TableAlias(this=exp.to_identifier(ref.alias, quoted=True))
        if replace is not None and position in replace:
            node.replace(exp.Table(this=exp.to_identifier(replace[position]), alias=alias))
            _keep_side(copy, position)
            continue
        node.replace(exp.Table(this=exp.to_identifier(ref.table.table, quoted=True),
                               db=exp.to_identifier(ref.table.schema, quoted=True),
                               alias=alias))
    return copy  # type: ignore[return-value]  # a Select wherever one is needed


#: the join that keeps the tuples having the (left composite's / right table's) row
_KEEP_LEFT = {"RIGHT": None, "FULL": "LEFT"}
_KEEP_RIGHT = {"LEFT": None, "FULL": "RIGHT"}


def _keep_side(select: exp.Expr, position: int) -> None:
    """Make the joins of ``select`` keep only tuples that have reference ``position``'s row:
    its own join keeps its side (LEFT → INNER, FULL → RIGHT), the later ones the left
    composite it is in (RIGHT → INNER, FULL → LEFT)."""
    if not isinstance(select, exp.Select):
        return
    for number, join in enumerate(select.args.get("joins") or [], start=1):
        if number < position:
            continue
        table = _KEEP_RIGHT if number == position else _KEEP_LEFT
        side = (join.side or "").upper()
        if side in table:
            join.set("side", table[side])
            if table[side] is None:
                join.set("kind", None)


def _keys_of(select: exp.Select, exprs: Sequence[exp.Expr], prefix: str) -> exp.Select:
    """``select`` projecting ``exprs`` as ``<prefix>0, <prefix>1, ...``, per joined tuple."""
    for arg in ("group", "having", "order", "distinct", "qualify"):
        select.set(arg, None)
    select.set("expressions", [expression.copy().as_(f"{prefix}{i}")
                               for i, expression in enumerate(exprs)])
    return select


def _lineage_union(select: exp.Select, references: Sequence[BaseTable],
                   exprs: Sequence[exp.Expr], joins: Sequence[_Join], prefix: str,
                   only: Callable[[BaseTable], bool] | None = None) -> str:
    """The scopes (``exprs``) of every tuple involving a changed row, or null-extended where
    a changed row's join values match (see the module docstring), as a UNION of branches:

    * per table reference, the joins with that reference reading only the changed rows'
      images in the current state (:data:`LINEAGE`), the joins keeping its side, the others
      the whole tables — so each branch joins a few rows against the tables;
    * with outer joins, one branch over the whole tables filtered to the tuples
      null-extended on a side whose join values equal a changed row's old or new ones (the
      engine's plan turns the filter into a semi-join on the other side's table).

    ``only``: just the branches of the references (changed rows, null-extended sides) it
    accepts (the empty string when none)."""
    branches = [_keys_of(_state_tree(select, references,
                                     {position: LINEAGE.format(index=ref.index)}), exprs, prefix)
                for position, ref in enumerate(references) if only is None or only(ref)]
    extended: list[exp.Expr] = []
    for join in joins:
        for null, pairs in join.null_sides.items():
            ref = references[null]
            if only is not None and not only(ref):
                continue
            images = exp.to_identifier(IMAGES.format(index=ref.index))
            match = exp.and_(*[exp.EQ(this=exp.column(exp.to_identifier(column, quoted=True),
                                                      table="_m"), expression=other.copy())
                               for column, other in pairs])
            exists = exp.Exists(this=exp.select("1").from_(exp.Table(
                this=images, alias=exp.TableAlias(this="_m"))).where(match))
            extended.append(exp.and_(exp.Is(this=_quoted_alias_column(ref.alias, KEY_COLUMN),
                                            expression=exp.Null()), exists))
    if extended:
        branches.append(_keys_of(_state_tree(select, references), exprs, prefix).where(
            exp.paren(exp.or_(*extended)), copy=False))
    return " UNION ".join(str(branch.sql(dialect="duckdb")) for branch in branches)


def _quoted_alias_column(alias: str, column: str) -> exp.Column:
    return exp.column(exp.to_identifier(column, quoted=True),
                      table=exp.to_identifier(alias, quoted=True))


def _exists_in(table: str, exprs: Sequence[exp.Expr], prefix: str) -> exp.Exists:
    """``EXISTS`` a row of ``table`` whose ``<prefix>i`` columns equal ``exprs`` (NULL equal
    to NULL)."""
    match = exp.and_(*[exp.NullSafeEQ(this=exp.column(f"{prefix}{i}", table="_a"),
                                      expression=expression.copy())
                       for i, expression in enumerate(exprs)])
    return exp.Exists(this=exp.select("1").from_(exp.Table(
        this=exp.to_identifier(table), alias=exp.TableAlias(this="_a"))).where(match))


def _restricted(select: exp.Select, references: Sequence[BaseTable],
                exprs: Sequence[exp.Expr], table: str, prefix: str) -> str:
    """The view's query over only the tuples whose scope (``exprs``) is in ``table``: the
    filter is part of the WHERE, so whole groups and partitions are kept."""
    restricted = _state_tree(select, references)
    restricted.set("order", None)
    if select.meta.get(_TOTALS):  # its one row from the totals, and only if they moved
        restricted = restricted.having(_exists_in(table, exprs, prefix), copy=False)
    elif not _filter_first(restricted, exprs, table, prefix):
        restricted = restricted.where(_exists_in(table, exprs, prefix), copy=False)
    return str(restricted.sql(dialect="duckdb"))


def _filter_first(select: exp.Select, exprs: Sequence[exp.Expr], table: str,
                  prefix: str) -> bool:
    """When ``exprs`` read one inner-joined table reference of ``select`` only, filter that
    reference's rows before the joins (``(SELECT * FROM t AS a WHERE EXISTS ...) AS a``):
    DuckDB applies a correlated EXISTS over the whole join otherwise, after joining every
    row (TPC-H Q21: the supplier's name, filtered after lineitem x orders x two subqueries).
    An outer join's null-extended side is never filtered first (its NULLs would change)."""
    aliases = {column.table for expression in exprs
               for column in expression.find_all(exp.Column)}
    joins = select.args.get("joins") or []
    if len(aliases) != 1 or "" in aliases or any(
            (join.side or "").upper() in ("RIGHT", "FULL") for join in joins):
        return False
    alias = aliases.pop()
    for node in _table_nodes(select):
        if node.alias_or_name != alias:
            continue
        parent = node.parent
        inner = isinstance(parent, exp.From) or (
            isinstance(parent, exp.Join) and not parent.side)
        if not inner or parent is None or parent.parent is not select:
            return False
        filtered = exp.select("*").from_(node.copy()).where(_exists_in(table, exprs, prefix))
        node.replace(exp.Subquery(this=filtered, alias=exp.TableAlias(
            this=exp.to_identifier(alias, quoted=True))))
        return True
    return False


def _state_sql(tree: exp.Query, references: Sequence[BaseTable]) -> str:
    return _state_tree(tree, references).sql(dialect="duckdb")
