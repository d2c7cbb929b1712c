"""What the leaders' exact-division modules share (``views/mariadb_decimals.py``,
``views/postgres_decimals.py``): an operand's unscaled integer and the mark of a quotient
computed exactly -- not a double -- which ``cdc verify`` then compares without a tolerance."""

from __future__ import annotations

from sqlglot import exp

HUGEINT = exp.DataType.build("HUGEINT", dialect="duckdb")
#: marks an expression a leader's module computes exactly
_EXACT = "cdc_exact_quotient"
#: marks the SUM and COUNT an AVG was rewritten into
_OF_AVERAGE = "cdc_of_average"


def unscaled(node: exp.Expr, places: int) -> exp.Expr:
    """``node`` (exact, ``places`` places) times 10^places, as a HUGEINT."""
    decimal = exp.Cast(this=node.copy(), to=exp.DataType.build(f"DECIMAL(38, {places})"))
    scaled = exp.Mul(this=decimal, expression=exp.Literal.number(10 ** places)) if places \
        else decimal
    return exp.Cast(this=scaled, to=HUGEINT.copy())


def mark_exact(node: exp.Expr) -> exp.Expr:
    """``node``, marked as computed exactly (:func:`exact_quotient`)."""
    node.meta[_EXACT] = True
    return node


def exact_quotient(node: exp.Expr) -> bool:
    """Whether ``node`` is (inside) a quotient a leader's module computes exactly."""
    found: exp.Expr | None = node
    while found is not None:
        if _EXACT in found.meta:
            return True
        found = found.parent
    return False


def average_parts(node: exp.Expr) -> tuple[exp.Sum, exp.Count]:
    """The SUM and COUNT of AVG ``node``'s argument, marked as its parts
    (:func:`part_of_average`: ``check-config`` still names the AVG)."""
    total, count = exp.Sum(this=node.this.copy()), exp.Count(this=node.this.copy())
    total.meta[_OF_AVERAGE] = count.meta[_OF_AVERAGE] = True
    return total, count


def part_of_average(node: exp.Expr) -> bool:
    """Whether ``node`` is the SUM or COUNT of a rewritten AVG (:func:`average_parts`)."""
    return bool(node.meta.get(_OF_AVERAGE))
