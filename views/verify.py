"""``cdc verify --view NAME [--follower F]``: is a materialized view equal to its SQL run on
the leader now?

Stated exactly:

1. **Target.** The leader's log is marked now (as ``cdc verify`` does for tables:
   :meth:`cdc.source.Leader.target`), and verify waits until each follower's watermark of the
   view (``view:<name>``) reaches the mark: the view then reflects every transaction committed
   before verify started.
2. **Compare.** The view's SQL runs on the leader, as written, in one read-only transaction;
   its rows (keyed by the view's key, values in the JSON form) are compared with the
   follower's rows, in chunks of ``chunk_size`` keys (:meth:`Sink.read`), then every key the
   follower holds is checked against the leader's set (*extra*). Keys match **by value**: a
   key column that holds numbers on the leader is compared as a number, whatever its type on
   either side (PostgreSQL's ``extract`` gives ``numeric`` 1997, the view's state ``BIGINT``
   1997; ``1.50`` equals ``1.5``).
3. **Recheck.** The leader cannot answer for the past, so while it keeps changing a key may
   differ only because the follower has not applied the newest transactions yet. Differing
   keys are rechecked — new mark, wait, run the SQL again — until they are gone or the same
   keys differ the same way twice in a row (at most ``rounds`` rounds). What remains is
   reported.

A pass means: at one moment after the last mark, every row the view's SQL gave on the leader
was in the follower with equal values, and the follower held no other key. Columns computed in
floating point (``views/types.py``: AVG, division, DOUBLE inputs) compare within a relative
tolerance of 1e-9; all others exactly (decimals by value: ``1.50`` equals ``1.5``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from cdc.errors import CdcError
from cdc.sink import Sink, row_text
from cdc.source import Leader, connector_for
from cdc.verify import Difference, wait_for_follower
from views.definition import approximate_columns
from views.sink import declared_columns, schema_store, view_plan, view_topic, watermark_name
from views.types import json_form, same_cell

if TYPE_CHECKING:
    from cdc.config import Config

_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@dataclass
class ViewVerifyResult:
    """What verify found for one view in one follower."""

    view: str
    follower: str
    rows: int = 0
    follower_keys: int = 0
    rounds: int = 0
    approximate: tuple[str, ...] = ()
    waited_seconds: float = 0.0
    leader_seconds: float = 0.0
    differences: list[Difference] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not self.differences


class _ViewWatermark(Sink):
    """A follower's sink whose watermark is the view's (for :func:`wait_for_follower`)."""

    def __init__(self, inner: Sink, view: str, source: str) -> None:
        self.inner, self.view, self.source = inner, view, source
        self.name = f"{inner.name} (view {view})"

    def watermark(self, source: str) -> dict[str, Any] | None:
        return self.inner.watermark(watermark_name(self.view))

    def apply(self, changes: Any) -> Any:  # pragma: no cover - never written through
        raise NotImplementedError

    def set_watermark(self, source: str, offset: Mapping[str, Any]) -> None:  # pragma: no cover
        raise NotImplementedError

    def read(self, topic: str, keys: Sequence[str]) -> dict[str, dict[str, str]]:
        return self.inner.read(topic, keys)

    def keys(self, topic: str) -> Iterator[str]:
        return self.inner.keys(topic)


@dataclass
class LeaderView:
    """The view's SQL run on the leader: each row by its key *by value*
    (:func:`canonical_key`), with the key's JSON text as the leader gives it."""

    #: canonical key -> row in JSON form
    rows: dict[str, dict[str, Any]]
    #: canonical key -> the key's JSON text from the leader's values
    texts: dict[str, str]
    #: the key columns that hold numbers on the leader
    numeric: frozenset[str]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def _number_text(value: Any) -> str:
    """A number's value as text, whatever its type: ``1997``, ``Decimal('1997')``,
    ``"1997.0"`` and ``1997.0`` all give ``1997``; ``"1.50"`` gives ``1.5``."""
    try:
        number = Decimal(str(value))
    except ArithmeticError:
        return str(value)
    if not number.is_finite():
        return str(number)
    text = format(number.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def canonical_key(values: Mapping[str, Any], numeric: frozenset[str]) -> str:
    """A key compared by value: each of the ``numeric`` columns as :func:`_number_text` (the
    leader's ``numeric`` 1997 and the follower's ``BIGINT`` 1997 are one key), the others in
    their JSON form (a leader's ``date`` is its ISO text, as the follower holds it)."""
    return _COMPACT.encode({column: _number_text(value)
                            if column in numeric and value is not None else json_form(value)
                            for column, value in values.items()})


def _follower_canonical(key_text: str, numeric: frozenset[str]) -> str:
    try:
        values = json.loads(key_text)
    except ValueError:
        return key_text
    return canonical_key(values, numeric) if isinstance(values, dict) else key_text


def leader_view(leader: Leader, sql: str, key: Sequence[str],
                time_zone: str = "UTC") -> LeaderView:
    """The view's SQL run on the leader (in a session in ``time_zone``), keyed by value."""
    names, rows = leader.query(sql, time_zone)
    missing = [column for column in key if column not in names]
    if missing:
        raise CdcError(f"the view's SQL on the leader has no columns {missing} (it has "
                       f"{', '.join(names)})", "correct the view's key or SQL")
    positions = [names.index(column) for column in key]
    numeric = frozenset(column for column, i in zip(key, positions, strict=True)
                        if any(_is_number(row[i]) for row in rows))
    out = LeaderView({}, {}, numeric)
    for row in rows:
        values = {column: row[i] for column, i in zip(key, positions, strict=True)}
        canonical = canonical_key(values, numeric)
        out.texts[canonical] = _COMPACT.encode({c: json_form(v) for c, v in values.items()})
        out.rows[canonical] = {name: json_form(value)
                               for name, value in zip(names, row, strict=True)}
    return out


def _differences(leader: LeaderView, held: Mapping[str, Mapping[str, str]],
                 keys: Sequence[str], tolerant: Sequence[str]) -> list[Difference]:
    """``keys`` (canonical) compared: ``held`` is the follower's rows by canonical key."""
    out: list[Difference] = []
    for key in keys:
        want, have = leader.rows.get(key), held.get(key)
        if want is None and have is None:
            continue
        shown = leader.texts.get(key, key)
        if want is None:
            out.append(Difference(shown, "extra"))
        elif have is None:
            out.append(Difference(shown, "missing"))
        else:
            text = row_text(want)
            columns = tuple(sorted(
                name for name in set(text) | set(have)
                if text.get(name) is None or have.get(name) is None
                or not same_cell(text[name], have[name], name in tolerant)))
            if columns:
                out.append(Difference(shown, "different", columns))
    return out


def compare_view(leader: LeaderView, held: Mapping[str, Mapping[str, Any]],
                 tolerant: Sequence[str]) -> list[Difference]:
    """Every difference between the leader's rows and ``held`` (all of a follower's rows of
    the view, by their key's JSON text, in JSON form or text), by value: keys the leader
    lacks are *extra*."""
    by_value = {_follower_canonical(text, leader.numeric): row_text(dict(row))
                for text, row in held.items()}
    keys = list(leader.rows)
    return (_differences(leader, by_value, keys, tolerant)
            + [Difference(text, "extra") for text in held
               if _follower_canonical(text, leader.numeric) not in leader.rows])


class _FollowerKeys:
    """The follower's keys of the view, by canonical key (its own JSON text kept to read)."""

    def __init__(self, sink: Sink, topic: str) -> None:
        self.sink, self.topic = sink, topic
        self.texts: list[str] = list(sink.keys(topic))
        self.by_value: dict[str, str] = {}

    def index(self, numeric: frozenset[str]) -> None:
        self.by_value = {_follower_canonical(text, numeric): text for text in self.texts}

    def read(self, keys: Sequence[str]) -> dict[str, dict[str, str]]:
        """The follower's rows of canonical ``keys`` (those it holds)."""
        texts = {self.by_value[key]: key for key in keys if key in self.by_value}
        found = self.sink.read(self.topic, list(texts)) if texts else {}
        return {texts[text]: row for text, row in found.items() if text in texts}


def verify_view(config: Config, name: str, follower: str, sink: Sink, console: Console, *,
                timeout: float, chunk_size: int = 1000, rounds: int = 5) -> ViewVerifyResult:
    """The three stages for view ``name`` in ``follower`` (whose storage is ``sink``)."""
    view = config.views[name]
    plan = view_plan(config, name)
    topic = view_topic(view.source, name)
    result = ViewVerifyResult(name, follower)
    result.approximate = tuple(approximate_columns(plan, _double_columns(config, name)))
    marked = _ViewWatermark(sink, name, view.source)
    leader = connector_for(config.source(view.source)).leader()
    try:
        rows = _round(config, leader, marked, view.sql, plan.key, timeout, console, result)
        held = _FollowerKeys(sink, topic)
        held.index(rows.numeric)
        result.follower_keys = len(held.texts)
        keys = list(rows.rows)
        differing: list[Difference] = []
        for start in range(0, len(keys), chunk_size):
            chunk = keys[start:start + chunk_size]
            differing += _differences(rows, held.read(chunk), chunk, result.approximate)
        differing += [Difference(held.by_value[key], "extra") for key in held.by_value
                      if key not in rows.rows]
        result.rows = len(rows.rows)
        previous: list[Difference] | None = None
        while differing and differing != previous and result.rounds < rounds:
            previous = differing
            rows = _round(config, leader, marked, view.sql, plan.key, timeout, console, result)
            recheck = [_follower_canonical(d.key, rows.numeric) for d in differing]
            held = _FollowerKeys(sink, topic)  # keys the follower gained or lost meanwhile
            held.index(rows.numeric)
            differing = _differences(rows, held.read(recheck), recheck, result.approximate)
        result.differences = differing
        return result
    finally:
        leader.close()


def _round(config: Config, leader: Leader, sink: Sink, sql: str, key: Sequence[str],
           timeout: float, console: Console, result: ViewVerifyResult) -> LeaderView:
    """Mark, wait for the follower, run the SQL on the leader."""
    target = leader.target()
    began = time.monotonic()
    wait_for_follower(config, sink, {leader.name: target}, timeout, console)
    result.waited_seconds += time.monotonic() - began
    began = time.monotonic()
    rows = leader_view(leader, sql, key, config.views[result.view].time_zone)
    result.leader_seconds += time.monotonic() - began
    result.rounds += 1
    return rows


def _double_columns(config: Config, name: str) -> dict[str, set[str]]:
    """Per base table (``schema.table``), its columns the view's state holds as DOUBLE."""
    view = config.views[name]
    store = schema_store(config)
    out: dict[str, set[str]] = {}
    for table in view_plan(config, name).captured_tables:
        columns = declared_columns(store, view.source, table) or []
        out[str(table)] = {column for column, kind in columns if kind == "DOUBLE"}
    return out


def print_view_report(result: ViewVerifyResult, console: Console, limit: int) -> None:
    table = Table(title=f"view {result.view} in follower {result.follower}")
    for column in ("leader rows", "follower keys", "rounds", "differing", "leader s"):
        table.add_column(column, justify="right")
    table.add_row(f"{result.rows:,}", f"{result.follower_keys:,}", str(result.rounds),
                  str(len(result.differences)), f"{result.leader_seconds:.2f}")
    console.print(table)
    if result.approximate:
        console.print(f"compared within a relative 1e-9: {', '.join(result.approximate)}")
    for difference in result.differences[:limit]:
        console.print(f"  {difference.key}: {difference.describe()}", highlight=False)
    if result.equal:
        console.print(f"[green]view {result.view} in {result.follower} equals the leader[/]")
    else:
        console.print(f"[red]view {result.view} in {result.follower}: "
                      f"{len(result.differences)} keys differ[/]")
