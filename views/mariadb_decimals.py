"""MariaDB's exact division, computed in the view's state as MariaDB computes it.

MariaDB divides exact numbers (integers, decimals) in decimal arithmetic, where DuckDB's ``/``
gives a double. Its rules, as probed on MariaDB 10.11 with ``div_precision_increment`` 4
(``tests/test_views.py`` compares with the server's own answers):

* **shown scale** ``D``: a quotient shows 4 more places than its dividend (``-10 / 3`` is
  ``-3.3333``), an ``AVG`` 4 more than its argument; ``*`` adds the operands' scales, ``+``,
  ``-`` and ``%`` keep the larger. A view column is the value rounded (half away from zero) to
  its shown scale.
* **held digits** ``I``: the quotient itself is computed to more places and *truncated*: whole
  9-digit words, ``ceil((F1 + F2 + max(0, 4 - (F1 - f1) - (F2 - f2))) / 9) * 9`` places for
  operands holding ``f1`` and ``f2`` places (``F = 9 * ceil(f / 9)``, MariaDB's ``decimal_div``).
  Arithmetic goes on with those digits: ``2 / 3 * 3000000000`` is ``1999999998.0000``, and ``IN``
  compares them (``1 / 3 IN (0.3333)`` is false).
* **comparisons** (``=``, ``<>``, ``<``, ``>``, ``<=``, ``>=``) with a quotient or an AVG as an
  operand compare it rounded to its shown scale: ``1 / 3 = 0.3333`` is true.

In the state each such quotient is an integer division of the operands' unscaled values
(``HUGEINT``, truncating like MariaDB), scaled back into a ``DECIMAL(38, I)``; sums, products
and differences of decimals are exact in DuckDB already. A quotient of anything else (a float, a
string, a window's AVG, a column of an aggregating subquery) keeps DuckDB's double, and ``cdc
verify`` compares such view columns with a tolerance.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from views.decimals import HUGEINT, average_parts, mark_exact, unscaled

#: the places MariaDB adds to a quotient (``div_precision_increment``'s default)
DIV_INCREMENT = 4
#: MariaDB's decimal word: held digits come in whole words
_WORD = 9
#: the state holds at most this many places (DuckDB's DECIMAL(38, s) keeps 38 digits in all)
_MAX_HELD = 27
#: marks a rewritten quotient or AVG with its shown scale (for comparisons)
_SHOWN = "cdc_mariadb_shown_scale"
_INTEGERS = frozenset({"BIGINT", "INTEGER", "SMALLINT", "TINYINT", "HUGEINT", "UBIGINT",
                       "UINTEGER", "USMALLINT", "UTINYINT"})
#: the comparisons at which MariaDB rounds a quotient to its shown scale (not IN, not <=>)
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


@dataclass(frozen=True)
class _Exact:
    """An exact value's held places and shown scale."""

    held: int
    shown: int


def exact_divisions(select: exp.Select, type_of: Callable[[exp.Column], str | None]) -> None:
    """``select`` (not its subqueries) computes MariaDB's quotients and AVGs as MariaDB does
    (the module docstring); ``type_of(column)``: a column's state type (``DECIMAL(8,2)``,
    ``BIGINT`` ...), None when unknown."""
    rewrite = _Rewrite(type_of)
    for node in [select.args.get("where"), select.args.get("having"),
                 *(join.args.get("on") for join in select.args.get("joins") or [])]:
        if node is not None:
            rewrite.exact(node)
    projections = []
    for index in range(len(select.expressions)):
        found = rewrite.exact(select.expressions[index].unalias())
        projection = select.expressions[index]  # rewritten in place, or replaced as a whole
        expression = projection.unalias()
        if found is not None and rewrite.divided(expression):
            projection = exp.alias_(_rounded(expression, found.shown), projection.alias_or_name)
        projections.append(projection)
    select.set("expressions", projections)
    for comparison in list(select.find_all(*_COMPARISONS)):
        if comparison.find_ancestor(exp.Select) is not select:
            continue
        for part in ("this", "expression"):
            operand = comparison.args.get(part)
            if operand is not None and _SHOWN in operand.meta:
                comparison.set(part, _rounded(operand, int(operand.meta[_SHOWN])))


class _Rewrite:
    def __init__(self, type_of: Callable[[exp.Column], str | None]) -> None:
        self.type_of = type_of

    @staticmethod
    def divided(node: exp.Expr) -> bool:
        return any(_SHOWN in found.meta for found in node.find_all(exp.Expr))

    def exact(self, node: exp.Expr) -> _Exact | None:
        """``node``'s held and shown places when MariaDB computes it exactly (its quotients and
        AVGs rewritten on the way, also inside what is not exact), else None."""
        if isinstance(node, exp.Subquery | exp.Select):
            return None  # a subquery's own SELECT is rewritten on its own
        if isinstance(node, exp.Paren | exp.Neg | exp.Abs | exp.Sum | exp.Min | exp.Max):
            return self.exact(node.this)
        if isinstance(node, exp.Add | exp.Sub | exp.Mod | exp.Mul):
            left, right = self.exact(node.this), self.exact(node.expression)
            if left is None or right is None:
                return None
            if isinstance(node, exp.Mul):
                return _Exact(left.held + right.held, left.shown + right.shown)
            return _Exact(max(left.held, right.held), max(left.shown, right.shown))
        if isinstance(node, exp.Div):
            left, right = self.exact(node.this), self.exact(node.expression)
            return None if left is None or right is None else \
                self._quotient(node, node.this, left, node.expression, right)
        if isinstance(node, exp.Avg) and not isinstance(node.parent, exp.Window) \
                and not isinstance(node.this, exp.Distinct):
            argument = self.exact(node.this)
            if argument is None:
                return None
            total, count = average_parts(node)
            return self._quotient(node, total, argument, count, _Exact(0, 0))
        if isinstance(node, exp.Round) and isinstance(node.args.get("decimals"), exp.Literal):
            digits = int(node.args["decimals"].name)
            inner = self.exact(node.this)
            return _Exact(digits, digits) if inner is not None and digits >= 0 else None
        for child in list(node.iter_expressions()):  # not exact itself: its quotients are
            self.exact(child)
        if isinstance(node, exp.Count | exp.IntDiv):
            return _Exact(0, 0)
        if isinstance(node, exp.Literal) and node.is_number:
            text = node.name.lower()
            return None if "e" in text else _Exact(*[len(text.partition(".")[2])] * 2)
        if isinstance(node, exp.Column):
            kind = (self.type_of(node) or "").upper()
            found = re.fullmatch(r"DECIMAL\(\d+,\s*(\d+)\)", kind)
            if found:
                return _Exact(int(found[1]), int(found[1]))
            return _Exact(0, 0) if kind in _INTEGERS else None
        return None

    @staticmethod
    def _quotient(node: exp.Expr, dividend: exp.Expr, left: _Exact, divisor: exp.Expr,
                  right: _Exact) -> _Exact | None:
        held = _held(left.held, right.held)
        if held > _MAX_HELD:
            return None
        done = _Exact(held, left.shown + DIV_INCREMENT)
        node.replace(_divided(dividend, left.held, divisor, right.held, done))
        return done


def _held(left: int, right: int) -> int:
    """The places MariaDB holds of a quotient of operands holding ``left`` and ``right``."""
    words = [_WORD * -(-places // _WORD) for places in (left, right)]
    increment = max(0, DIV_INCREMENT - (words[0] - left) - (words[1] - right))
    return _WORD * -(-(words[0] + words[1] + increment) // _WORD)


def _divided(dividend: exp.Expr, left: int, divisor: exp.Expr, right: int,
             done: _Exact) -> exp.Expr:
    """MariaDB's quotient: truncated to ``done.held`` places, NULL for a zero divisor."""
    shift = done.held - left + right
    numerator = exp.Mul(this=unscaled(dividend, left),
                        expression=exp.Cast(this=exp.Literal.string(str(10 ** shift)),
                                            to=HUGEINT.copy()))
    quotient = exp.IntDiv(this=exp.Paren(this=numerator), expression=exp.Nullif(
        this=unscaled(divisor, right), expression=exp.Literal.number(0)))
    unit = exp.Cast(this=exp.Literal.string(f"0.{'0' * (done.held - 1)}1" if done.held
                                            else "1"),
                    to=exp.DataType.build(f"DECIMAL({done.held + 1}, {done.held})"))
    value = exp.Paren(this=exp.Mul(
        this=exp.Cast(this=quotient, to=exp.DataType.build("DECIMAL(38, 0)")), expression=unit))
    value.meta[_SHOWN] = done.shown
    return mark_exact(value)


def _rounded(node: exp.Expr, shown: int) -> exp.Expr:
    """``node`` rounded (half away from zero) to ``shown`` places, as a DECIMAL."""
    return exp.Cast(this=exp.Round(this=node.copy(), decimals=exp.Literal.number(shown)),
                    to=exp.DataType.build(f"DECIMAL(38, {shown})"))
