"""Where a view's SQL compares text, and the leader's ICU order in the view's state.

The view's state (DuckDB) compares text code point by code point (UTF-8's byte order). The
leader compares it under the column's collation. :func:`compared` says where a column's text is
compared and how (equality or order) — the rule ``views/check.py`` refuses loose collations by.

A deterministic ICU collation (PostgreSQL's ``und-x-icu``, ``de-x-icu``, or a database created
with ``--locale-provider=icu``) orders by ICU's rules and breaks ties by the bytes; equality is
the bytes'. The state orders such text the same way through DuckDB's ICU extension: each place
where the SQL orders the column's text (``<``, ``BETWEEN``, MIN/MAX, ORDER BY, a window's ORDER
BY) compares :func:`icu_key` instead — ICU's sort key, a blank (below every hex digit: no key is
then a prefix of another) and the text (the tie-break) — and MIN/MAX become ``arg_min``/
``arg_max`` by that key. Equality, grouping and joins are untouched. The capture records the
locale in the log's schema (``cdc.logical.icu_locales``), so every state orders alike; a locale
DuckDB does not know, or one with options (``-u-kn`` numeric order, ``-u-ks`` strength), is not
mapped and such views stay refused at check time.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from sqlglot import exp

#: where the leader compares text for equality under the column's collation
EQUALITY = (exp.EQ, exp.NEQ, exp.NullSafeEQ, exp.NullSafeNEQ, exp.In, exp.Like, exp.ILike,
            exp.RegexpLike, exp.Group, exp.Distinct, exp.Union, exp.Intersect, exp.Except)
#: ... and for order
ORDERING = (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Between, exp.Min, exp.Max, exp.Ordered,
            exp.Greatest, exp.Least)
#: case mapping, which PostgreSQL's C and POSIX collations limit to ASCII letters
CASE_MAPPING = (exp.Upper, exp.Lower, exp.Initcap)
#: what ends a text value's collation: a number, a truth value, a count (not DISTINCT)
COLLATION_ENDS = (exp.Length, exp.Is, exp.Count, exp.Extract, exp.Cast, exp.Unicode)

#: marks the sort keys :func:`icu_key` writes (their text is ordered as the leader orders it)
_ICU_KEY = "cdc_icu_key"
#: marks the ``arg_min``/``arg_max`` that stand for a MIN/MAX (its name, for the operators)
_ICU_EXTREME = "cdc_icu_extreme"


def compared(column: exp.Column) -> str | None:
    """Where the leader compares ``column``'s text under its collation: ``"="`` (equality:
    a comparison, IN, LIKE, GROUP BY, DISTINCT, PARTITION BY), ``"<"`` (order: MIN/MAX,
    ORDER BY, <, BETWEEN) or None (only projected, turned into a number first, or ordered
    through an :func:`icu_key`, which orders as the leader does)."""
    found = _context(column)
    return None if found is None else found[0]


def ordering_node(column: exp.Column) -> exp.Expr | None:
    """The node that orders ``column``'s text, or None where nothing orders it
    (:func:`compared` is not ``"<"``)."""
    found = _context(column)
    return None if found is None or found[0] != "<" else found[1]


def ordered_by_icu(column: exp.Column) -> bool:
    """Whether ``column`` is ordered through an :func:`icu_key` (the leader's ICU order)."""
    node: exp.Expr = column
    while node.parent is not None and not isinstance(node, exp.Select):
        if node.parent.meta.get(_ICU_KEY):
            return True
        node = node.parent
    return False


def _context(column: exp.Column) -> tuple[str, exp.Expr] | None:
    """(how ``column``'s text is compared, the node that compares it), or None."""
    node: exp.Expr = column
    while node.parent is not None and not isinstance(node, exp.Select):
        parent = node.parent
        if parent.meta.get(_ICU_KEY):
            return None
        if isinstance(parent, exp.Count) and isinstance(node, exp.Distinct):
            return "=", parent
        if isinstance(parent, COLLATION_ENDS):
            return None
        if isinstance(parent, ORDERING):
            return "<", parent
        if isinstance(parent, EQUALITY) or (isinstance(parent, exp.Window)
                                            and node.arg_key == "partition_by"):
            return "=", parent
        node = parent
    return None


#: an ICU locale this module maps: a language, optionally a region (``de``, ``en-US``,
#: ``sr_RS``); ``und`` and ``root`` are ICU's root order
_LOCALE = re.compile(r"(?P<language>[a-zA-Z]{2,3})(?:[-_](?P<region>[a-zA-Z]{2}|[0-9]{3}))?")


def duckdb_collation(locale: str, known: Callable[[str], bool]) -> str | None:
    """DuckDB's ICU collation that orders as ICU ``locale`` does, or None (``known(name)``:
    whether DuckDB has a collation of that name). The root locale is DuckDB's ``en`` (English
    has no tailoring of ICU's root order); a region falls back to its language, as ICU's own
    locale fallback does; scripts, variants and options are not mapped."""
    if locale.lower() in ("und", "root", ""):
        return "en"
    match = _LOCALE.fullmatch(locale)
    if match is None:
        return None
    language, region = str(match["language"]).lower(), str(match["region"] or "").lower()
    for name in ([f"{language}_{region}"] if region else []) + [language]:
        if known(name):
            return name
    return None


def duckdb_knows(name: str) -> bool:
    """Whether DuckDB (with its ICU extension, built into the Python package) has collation
    ``name``."""
    return name in _duckdb_collations()


@functools.cache
def _duckdb_collations() -> frozenset[str]:
    import duckdb

    with duckdb.connect() as db:
        return frozenset(str(row[0]) for row in db.execute("PRAGMA collations").fetchall())


def icu_key(text: exp.Expr, collation: str) -> exp.Expr:
    """``text``'s sort key under DuckDB's ICU ``collation``, ties broken by the text itself
    (NULL for NULL): its byte order is the leader's order of ``text``."""
    key = exp.Paren(this=exp.DPipe(this=exp.DPipe(this=exp.Anonymous(
        this="icu_sort_key", expressions=[text.copy(), exp.Literal.string(collation)]),
        expression=exp.Literal.string(" ")), expression=text.copy()))
    key.meta[_ICU_KEY] = True
    return key


def extreme_name(node: exp.Expr) -> str | None:
    """``MIN``/``MAX`` for an ``arg_min``/``arg_max`` :func:`order_by_icu` wrote, else None."""
    name = node.meta.get(_ICU_EXTREME)
    return str(name) if name else None


def order_by_icu(select: exp.Select, collation_of: Callable[[exp.Column], str | None]) -> None:
    """Every place ``select`` (not its subqueries) orders the text of a column that
    ``collation_of`` maps to a DuckDB ICU collation compares its :func:`icu_key` instead;
    repeated until none is left (``min(c) < 'x'`` orders twice)."""
    while True:
        todo: dict[int, tuple[exp.Expr, str]] = {}
        for column in select.find_all(exp.Column):
            if column.find_ancestor(exp.Select) is not select:
                continue
            collation = collation_of(column)
            found = ordering_node(column) if collation is not None else None
            if found is not None and collation is not None:
                todo.setdefault(id(found), (found, collation))
        if not [node for node, collation in todo.values() if _keyed(node, collation)]:
            return


def _keyed(node: exp.Expr, collation: str) -> bool:
    """``node`` orders by the ICU keys of its text operands; False when it cannot (GREATEST,
    LEAST: left to the check's refusal)."""
    if isinstance(node, exp.Min | exp.Max):
        name = "MIN" if isinstance(node, exp.Min) else "MAX"
        kind = exp.ArgMin if isinstance(node, exp.Min) else exp.ArgMax
        extreme = kind(this=node.this.copy(), expression=icu_key(node.this, collation))
        extreme.meta[_ICU_EXTREME] = name
        node.replace(extreme)
        return True
    if isinstance(node, exp.Ordered):
        node.set("this", icu_key(node.this, collation))
        return True
    if isinstance(node, exp.Between):
        for part in ("this", "low", "high"):
            node.set(part, icu_key(node.args[part], collation))
        return True
    if isinstance(node, exp.GT | exp.GTE | exp.LT | exp.LTE):
        node.set("this", icu_key(node.this, collation))
        node.set("expression", icu_key(node.expression, collation))
        return True
    return False
