"""PostgreSQL's exact division, computed in the view's state as PostgreSQL computes it.

PostgreSQL divides a ``numeric`` (or a ``numeric`` and an integer) exactly and rounds the
quotient, half away from zero, to a scale it picks **per value** (``select_div_scale`` in its
``numeric.c``): at least 16 significant digits and no fewer places than either operand shows::

    weight(x)      the power of 10000 of x's first base-10000 digit (0 for x = 0)
    first(x)       that digit, 1..9999 (0 for x = 0)
    qweight        weight(a) - weight(b) - (1 if first(a) <= first(b) else 0)
    scale(a / b)   max(16 - 4 * qweight, scale(a), scale(b))

so ``1.0 / 3`` is ``0.33333333333333333333`` (20 places) and ``200.0 / 3`` is
``66.666666666666666667`` (18). ``AVG`` of an integer or a ``numeric`` is ``SUM / COUNT`` by the
same rule; ``/`` of two integers truncates (``-7 / 2`` is ``-3``); ``SUM`` of a ``bigint`` is a
``numeric``, so ``sum(b) / count(*)`` divides exactly where ``sum(i)`` of an ``int`` truncates.

In the state such a quotient is computed by the macro ``cdc_pg_quotient`` (:data:`MACROS`,
defined on every state connection) over the operands' unscaled ``HUGEINT`` values and static
scales, and held as a ``DECIMAL(38, 24)``: the same value as the leader's (``cdc verify``
compares it exactly), shown with 24 places. A quotient whose scale would exceed 24 places (a
quotient under 10^-8) or whose value needs more than 38 digits stops the view with an error
that says so, never a rounded value. A quotient of anything else (a float, a quotient of a
quotient, a window's AVG) keeps DuckDB's double, compared with a tolerance.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from cdc.logical import LogicalKind
from views.decimals import HUGEINT, average_parts, mark_exact, unscaled

#: places the state holds of a quotient
HELD = 24
#: marks an ``IntDiv`` that was PostgreSQL's ``/`` (not ``div()``)
SLASH = "cdc_postgres_slash"

_UNIT = "0." + "0" * (HELD - 1) + "1"
_TOO_SMALL = ("a PostgreSQL quotient needs more than 24 places (it is under 10^-8): the view "
              "state holds 24 -- fix: round it in the view's SQL, e.g. round(a / b, 24), or "
              "divide floats (a::float8 / b)")
_TOO_LARGE = ("a PostgreSQL quotient is too large for the view state's DECIMAL(38, 24), or its "
              "dividend too long to divide in 38 digits -- fix: divide floats in the view's "
              "SQL (a::float8 / b), or scale the operands down")


def _sql_text(text: str) -> str:
    return text.replace("'", "''")


#: DuckDB macros for the state: PostgreSQL's ``select_div_scale`` and rounded quotient over
#: unscaled values ``a``, ``b`` of scales ``sa``, ``sb``
MACROS = (
    "CREATE OR REPLACE TEMP MACRO cdc_p10(n) AS "
    "CAST(rpad('1', CAST(n AS INTEGER) + 1, '0') AS HUGEINT)",
    "CREATE OR REPLACE TEMP MACRO cdc_pg_weight(x, s) AS CASE WHEN x = 0 THEN 0 ELSE "
    "CAST(floor((length(CAST(abs(x) AS VARCHAR)) - 1 - s) / 4) AS INTEGER) END",
    "CREATE OR REPLACE TEMP MACRO cdc_pg_first(x, s) AS CASE WHEN x = 0 THEN 0 "
    "WHEN s + 4 * cdc_pg_weight(x, s) >= 0 THEN abs(x) // cdc_p10(s + 4 * cdc_pg_weight(x, s)) "
    "ELSE abs(x) * cdc_p10(-(s + 4 * cdc_pg_weight(x, s))) END",
    "CREATE OR REPLACE TEMP MACRO cdc_pg_scale(a, b, sa, sb) AS greatest(16 - 4 * ("
    "cdc_pg_weight(a, sa) - cdc_pg_weight(b, sb) "
    "- CASE WHEN cdc_pg_first(a, sa) <= cdc_pg_first(b, sb) THEN 1 ELSE 0 END), sa, sb)",
    # the unscaled quotient at scale r: |a| 10^(r + sb - sa) / |b|, rounded half away from 0
    "CREATE OR REPLACE TEMP MACRO cdc_pg_rounded(a, b, sa, sb, r) AS "
    "(abs(a) * cdc_p10(r + sb - sa) * 2 + abs(b)) // (abs(b) * 2) * sign(a) * sign(b)",
    "CREATE OR REPLACE TEMP MACRO cdc_pg_quotient(a, b, sa, sb) AS CASE "
    f"WHEN cdc_pg_scale(a, b, sa, sb) > {HELD} THEN error('{_sql_text(_TOO_SMALL)}') "
    "WHEN length(CAST(abs(a) AS VARCHAR)) + cdc_pg_scale(a, b, sa, sb) + sb - sa > 37 "
    f"OR length(CAST(abs(cdc_pg_rounded(a, b, sa, sb, cdc_pg_scale(a, b, sa, sb))) AS VARCHAR))"
    f" - cdc_pg_scale(a, b, sa, sb) > {38 - HELD} THEN error('{_sql_text(_TOO_LARGE)}') "
    "ELSE CAST(cdc_pg_rounded(a, b, sa, sb, cdc_pg_scale(a, b, sa, sb)) "
    f"* cdc_p10({HELD} - cdc_pg_scale(a, b, sa, sb)) AS DECIMAL(38, 0)) "
    f"* CAST('{_UNIT}' AS DECIMAL({HELD + 1}, {HELD})) END",
)


def define_macros(db: object) -> None:
    """Define :data:`MACROS` on DuckDB connection ``db``."""
    for statement in MACROS:
        db.execute(statement)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Numeric:
    """An exact value as PostgreSQL types it."""

    #: ``int`` (int2, int4), ``bigint`` (int8) or ``numeric``
    type: str
    #: a ``numeric``'s scale (an integer's: 0)
    scale: int = 0

    @property
    def integer(self) -> bool:
        return self.type != "numeric"


def leader_numeric(kind: str, state_type: str) -> Numeric | None:
    """A captured column's type as PostgreSQL computes with it, from its logical kind
    (``cdc.logical.LogicalKind``'s value) and state type; None when not an exact number."""
    if kind in (LogicalKind.INT16.value, LogicalKind.INT32.value):
        return _INT
    if kind == LogicalKind.INT64.value:
        return _BIGINT
    found = re.fullmatch(r"DECIMAL\(\d+,\s*(\d+)\)", state_type)
    return Numeric("numeric", int(found[1])) if found else None


_INT = Numeric("int")
_BIGINT = Numeric("bigint")
_INTEGER_CASTS = {exp.DType.SMALLINT: _INT, exp.DType.INT: _INT, exp.DType.BIGINT: _BIGINT}


def exact_divisions(select: exp.Select, type_of: Callable[[exp.Column], Numeric | None]) -> None:
    """``select`` (not its subqueries) computes PostgreSQL's quotients and AVGs as PostgreSQL
    does (the module docstring); ``type_of(column)``: a captured column's type, None when it is
    not an exact number or unknown."""
    rewrite = _Rewrite(type_of)
    for node in list(select.iter_expressions()):
        rewrite.exact(node)


class _Rewrite:
    def __init__(self, type_of: Callable[[exp.Column], Numeric | None]) -> None:
        self.type_of = type_of

    def exact(self, node: exp.Expr) -> Numeric | None:
        """``node``'s type when PostgreSQL computes it exactly at a scale known here (its
        quotients and AVGs rewritten on the way, also inside what is not), else None."""
        if isinstance(node, exp.Subquery | exp.Select):
            return None  # a subquery's own SELECT is rewritten on its own
        if isinstance(node, exp.Paren | exp.Neg | exp.Abs | exp.Min | exp.Max):
            return self.exact(node.this)
        if isinstance(node, exp.Sum):
            inner = self.exact(node.this)
            return None if inner is None else _summed(inner)
        if isinstance(node, exp.Add | exp.Sub | exp.Mod | exp.Mul):
            return _arithmetic(node, self.exact(node.this), self.exact(node.expression))
        if isinstance(node, exp.IntDiv) and node.meta.get(SLASH):
            left, right = self.exact(node.this), self.exact(node.expression)
            if left is None or right is None:
                return None
            if left.integer and right.integer:
                mark_exact(node)  # truncates, as PostgreSQL's does
                return _BIGINT if _BIGINT in (left, right) else _INT
            node.replace(_quotient(node.this, left, node.expression, right))
            return None
        if isinstance(node, exp.Avg) and not isinstance(node.parent, exp.Window | exp.Filter) \
                and not isinstance(node.this, exp.Distinct):
            argument = self.exact(node.this)
            if argument is None:
                return None
            total, counted = average_parts(node)
            count = exp.Nullif(this=counted, expression=exp.Literal.number(0))
            node.replace(_quotient(total, _summed(argument), count, _BIGINT))
            return None
        return self._leaf(node)

    def _leaf(self, node: exp.Expr) -> Numeric | None:
        if isinstance(node, exp.Round) and isinstance(node.args.get("decimals"), exp.Literal):
            inner = self.exact(node.this)
            digits = int(node.args["decimals"].name)
            return Numeric("numeric", digits) if inner is not None and not inner.integer \
                and digits >= 0 else None
        for child in list(node.iter_expressions()):  # not exact itself: its quotients are
            self.exact(child)
        if isinstance(node, exp.Count):
            return _BIGINT
        if isinstance(node, exp.Cast):
            return _cast(node.to)
        if isinstance(node, exp.Literal) and node.is_number:
            return _literal(node.name.lower())
        if isinstance(node, exp.Column):
            return self.type_of(node)
        return None


def _summed(argument: Numeric) -> Numeric:
    """The type of a SUM of ``argument``: ``int`` sums to ``bigint``, ``bigint`` to ``numeric``."""
    return _BIGINT if argument.type == "int" else Numeric("numeric", argument.scale) \
        if argument.type == "bigint" else argument


def _arithmetic(node: exp.Expr, left: Numeric | None, right: Numeric | None) -> Numeric | None:
    """``+``, ``-``, ``*``, ``%`` of exact values: PostgreSQL's result type and scale."""
    if left is None or right is None:
        return None
    if left.integer and right.integer:
        return _BIGINT if _BIGINT in (left, right) else _INT
    if isinstance(node, exp.Mul):
        return Numeric("numeric", left.scale + right.scale)
    return Numeric("numeric", max(left.scale, right.scale))


def _cast(to: exp.DataType) -> Numeric | None:
    if to.this in _INTEGER_CASTS:
        return _INTEGER_CASTS[to.this]
    if to.this is exp.DType.DECIMAL:
        sizes = to.expressions
        return Numeric("numeric", int(sizes[1].name)) if len(sizes) == 2 else None
    return None


def _literal(text: str) -> Numeric | None:
    if "e" in text:
        return None
    if "." in text:
        return Numeric("numeric", len(text.partition(".")[2]))
    return _INT if abs(int(text)) < 2 ** 31 else _BIGINT if abs(int(text)) < 2 ** 63 \
        else Numeric("numeric")


def _quotient(dividend: exp.Expr, left: Numeric, divisor: exp.Expr, right: Numeric
              ) -> exp.Expr:
    """PostgreSQL's exact quotient, a DECIMAL(38, 24) (the ``cdc_pg_quotient`` macro)."""
    call = exp.Anonymous(this="cdc_pg_quotient", expressions=[
        unscaled(dividend, left.scale), exp.Cast(this=divisor.copy(), to=HUGEINT.copy())
        if right.integer else unscaled(divisor, right.scale),
        exp.Literal.number(left.scale), exp.Literal.number(right.scale)])
    return mark_exact(exp.Paren(this=call))
