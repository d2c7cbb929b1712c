"""A view as ``cdc apply`` runs it: a sink of its base tables' changes whose output is written
into its followers.

``cdc apply`` keeps each view like a follower, over its source's topics. Each batch holds
whole source transactions (batches are planned on the log's transaction boundaries), and a view
takes it in *one* call (:attr:`ViewSink.placement`): in the apply process in local mode, one
task on an executor on a cluster, so the view never reflects part of a transaction. The call
opens the view's state (a DuckDB file, beside the log by default; on storage every executor
reaches on a cluster), and closes it before it ends: the next batch may run elsewhere. Per
batch:

1. the outbox left by a crash, if any, is written into every follower first;
2. :meth:`ViewState.apply` gates the changes into the base tables' state and records the
   view's changed rows in the outbox, in one transaction;
3. the outbox is written into every follower (each behind its own version gate), then
   emptied; after the batch the watermark goes to every follower under the name
   ``view:<view>`` (``cdc verify --view`` waits on it).

The followers hold the view as a table named after it (topic ``<source>.views.<view>``): a
SQL follower's table ``<view>``, a Delta table, Redis hashes, search documents.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdc.events import TableId, topic_name
from cdc.heap import collector_paused
from cdc.logical import icu_locales, logical_columns, padded_columns
from cdc.sink import ApplyStats, Change, Placement, Sink, row_text
from views.definition import Described, ViewDefinitionError, ViewPlan, analyze
from views.state import BaseChange, BatchResult, ViewChange, ViewError, ViewState, state_meta
from views.types import duckdb_type, follower_kind

if TYPE_CHECKING:
    from cdc.config import Config

#: the schema part of a view's topic and table id in its followers
VIEW_SCHEMA = "views"


def view_topic(source: str, view: str) -> str:
    """The topic name a view's rows go under in its followers."""
    return topic_name(source, TableId(VIEW_SCHEMA, view))


def view_holds(source: str, view: str) -> dict[str, tuple[str, TableId]]:
    """What a follower of the view holds for it: ``{topic: (source, views.<view>)}``."""
    return {view_topic(source, view): (source, TableId(VIEW_SCHEMA, view))}


def watermark_name(view: str) -> str:
    """The name a view's followers hold its watermark under."""
    return f"view:{view}"


def view_plan(config: Config, name: str) -> ViewPlan:
    """The analyzed definition of view ``name`` (a ViewDefinitionError if it cannot be one)."""
    view = config.views[name]
    source = config.source(view.source)
    captured = [TableId.parse(text) for text in source.tables]
    schemas = functools.cache(lambda: _newest_schemas(config, view.source, captured))
    plan = analyze(name, view.sql, view.key, str(getattr(source, "kind", "postgres")), captured,
                   lambda: _catalog(schemas()))
    _refuse_ruled_columns(name, plan, source.columns)
    plan.time_zone = view.time_zone
    plan.memory_limit = view.memory_limit
    if view.incremental == "strict" and plan.blocking:
        raise ViewDefinitionError(
            f"view {name} is set incremental: strict, but "
            + "; ".join(f"its {op.construct} would be recomputed whole ({op.reason})"
                        for op in plan.blocking),
            "; ".join(f"{op.construct}: {op.rewrite}" for op in plan.blocking)
            + f" (or remove views.{name}.incremental to let it be recomputed)")
    return plan


def _newest_schemas(config: Config, source: str, tables: Sequence[TableId]
                    ) -> dict[TableId, Any]:
    """The captured tables' newest value schemas in the log (a table not captured yet:
    absent)."""
    store = schema_store(config)
    return {table: schema for table in tables
            if (schema := _newest_schema(store, source, table)) is not None}


def _catalog(schemas: Mapping[TableId, Any]) -> dict[TableId, dict[str, Described]]:
    """The tables' columns and what their schemas say (:class:`Described`)."""
    out: dict[TableId, dict[str, Described]] = {}
    for table, schema in schemas.items():
        lengths, locales = padded_columns(schema), icu_locales(schema)
        out[table] = {column: Described(lengths.get(column), locales.get(column, ""),
                                        duckdb_type(logical), logical.kind.value)
                      for column, logical in logical_columns(schema).items()}
    return out


def _newest_schema(store: Any, source: str, table: TableId) -> Any:
    """``table``'s newest value schema in ``store`` (None: none yet)."""
    versions = [] if store is None else store.versions(f"{topic_name(source, table)}-value")
    return versions[-1].schema if versions else None


def _refuse_ruled_columns(name: str, plan: ViewPlan, columns: Mapping[str, Any]) -> None:
    """A view may not read a column its source leaves out of the log or transforms there
    (cdc/columns.py): the view would compute over hashes or masks while ``cdc verify --view``
    runs its SQL on the leader's clear values."""
    from cdc.columns import table_rules

    for text, setting in columns.items():
        rules = table_rules(text, setting)
        read = plan.referenced.get(rules.table, set())
        hidden = sorted(c for c in read
                        if not rules.kept(c) or c in (rules.transforms or {}))
        if hidden:
            raise ViewDefinitionError(
                f"view {name} reads {', '.join(f'{rules.table}.{c}' for c in hidden)}, which "
                "the source's column rules leave out of the log or transform there: the view "
                "would not equal its SQL on the leader",
                f"remove those columns from views.{name}.sql, or their rules under the "
                f"source's columns: {text}")


def schema_store(config: Config) -> Any:
    """The log's schema store (``None`` when there is no log yet)."""
    from cdc.log.open import log_settings, schema_store_from

    return schema_store_from(log_settings(config))


def declared_columns(store: Any, source: str, table: TableId) -> list[tuple[str, str]] | None:
    """``(column, DuckDB type)`` of ``table`` from its newest value schema in ``store``
    (``None``: no schema yet)."""
    schema = _newest_schema(store, source, table)
    if schema is None:
        return None
    return [(column, duckdb_type(logical))
            for column, logical in logical_columns(schema).items()]


#: one change of a batch as a view takes it: ``(topic, key, position, row or None)``
BatchRow = tuple[str, str, bytes, "Mapping[str, Any] | None"]


def batch_rows(changes: Sequence[Change]) -> list[BatchRow]:
    """What a view reads of ``changes``."""
    return [(change.topic, change.key, change.position, change.row) for change in changes]


@dataclass
class _Shared:
    """One follower's sink, shared by every view of this process that it holds (a search
    index has one writer), used under ``lock`` (each view's query is a thread)."""

    sink: Sink
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


_SHARED: dict[tuple[str, str], _Shared] = {}
_SHARED_GUARD = threading.Lock()


def _acquire(config: Config, follower: str) -> _Shared:
    """The shared sink of ``follower`` holding every view of ``config`` it holds."""
    from cdc.sink import open_sink

    key = (str(config.log_path), follower)
    with _SHARED_GUARD:
        shared = _SHARED.get(key)
        if shared is None:
            holds: dict[str, tuple[str, TableId]] = {}
            for name, view in config.views.items():
                if follower in view.followers:
                    holds.update(view_holds(view.source, name))
            shared = _SHARED[key] = _Shared(open_sink(config, follower, holds))
        shared.users += 1
        return shared


def _release(config: Config, follower: str) -> None:
    key = (str(config.log_path), follower)
    with _SHARED_GUARD:
        shared = _SHARED.get(key)
        if shared is None:
            return
        shared.users -= 1
        if shared.users <= 0:
            del _SHARED[key]
            shared.sink.close()


class ViewSink(Sink):
    """View ``name`` of ``config``: its state, its followers' sinks."""

    folds = True
    #: one call per micro-batch (whole transactions) in one executor task, never split
    placement = Placement.WHOLE_BATCH

    def __init__(self, config: Config, name: str, keep_open: bool = False) -> None:
        self.name = name
        #: the state stays open between steps (its host holds the lease: views/host.py)
        self.keep_open = keep_open
        self._state: ViewState | None = None
        self.config = config
        self.view = config.views[name]
        self.plan = view_plan(config, name)
        self.topic = view_topic(self.view.source, name)
        self.topics = {topic_name(self.view.source, table): table
                       for table in self.plan.captured_tables}
        #: the topics the view's query reads (``cdc apply`` passes only these ranges)
        self.read_topics = sorted(self.topics)
        self._shared = {follower: _acquire(config, follower) for follower in self.view.followers}
        self._store: Any = None

    # ------------------------------------------------------------------------- set-up
    def check(self) -> None:
        for shared in self._shared.values():
            with shared.lock:
                shared.sink.check()
        with self.opened() as state:
            self._flush(state)
            columns = {name: follower_kind(kind) for name, kind in state.output_types()}
        for shared in self._shared.values():  # an empty view is an empty table
            with shared.lock:
                shared.sink.declare(self.topic, columns, self.plan.key)

    @contextlib.contextmanager
    def opened(self) -> Iterator[ViewState]:
        """The view's state, open for one step (a batch, a watermark, a read) and closed
        after it: the file is locked while open, and the next batch's task may run in another
        process or on another machine. With :attr:`keep_open` (a host's view), opened once and
        kept until :meth:`close`."""
        if self.keep_open:
            if self._state is None:
                self._state = self._open()
            try:
                yield self._state
            except BaseException:  # opened again by the next step: nothing half-done kept
                self._state.close()
                self._state = None
                raise
            return
        state = self._open()
        try:
            yield state
        finally:
            state.close()

    def _open(self) -> ViewState:
        return ViewState(self.config.view_state(self.name), self.plan, self._columns_of)

    def _meta(self, name: str, value: str | None = None) -> str | None:
        """Meta value ``name`` of the state (or, given ``value``, set it): through the open
        state when it is kept open, else by a meta-only open of the file."""
        if self._state is None:
            return state_meta(self.config.view_state(self.name), self.name, name, value)
        if value is not None:
            self._state.set_meta(name, value)
            return value
        return self._state.meta(name)

    def _columns_of(self, table: TableId) -> list[tuple[str, str]]:
        if self._store is None:
            self._store = schema_store(self.config)
        columns = declared_columns(self._store, self.view.source, table)
        if columns is None:
            self._store = None  # read again next time: capture may have registered it
            raise ViewError(f"view {self.name}: the log has no schema for {table} yet",
                            f"run `cdc capture` for source {self.view.source} first (its "
                            "snapshot registers every table's schema)")
        return columns

    # -------------------------------------------------------------------------- apply
    def apply(self, changes: Sequence[Change]) -> ApplyStats:
        return self.apply_rows(batch_rows(changes))

    def apply_behind(self, changes: Sequence[Change]) -> ApplyStats:
        """A batch of a backlog: while the view is not computed yet (being built), only its
        base tables are written (``ViewState.apply``'s ``defer``)."""
        return self.apply_rows(batch_rows(changes), behind=True)

    def caught_up(self) -> None:
        """The end of a backlog without changes of the view's tables: a view left stale by
        :meth:`apply_behind` is computed now."""
        with self.opened() as state:
            stale = state.is_stale()
        if stale:
            self.apply_rows([])

    def apply_rows(self, rows: Sequence[BatchRow], behind: bool = False) -> ApplyStats:
        """:meth:`apply` (``behind``: :meth:`apply_behind`) of a batch given as
        :func:`batch_rows` (how a state host is sent it: plain tuples pickle about four times
        faster than changes)."""
        with collector_paused():  # a batch's short-lived rows: cdc/heap.py
            return self._apply(rows, behind)

    def _apply(self, changes: Sequence[BatchRow], behind: bool) -> ApplyStats:
        started = time.perf_counter()
        with self.opened() as state:
            opened = time.perf_counter()
            self._flush(state)  # a batch's outbox a crash left unwritten
            leftover = time.perf_counter() - opened
            result = self._commit_state(state, changes, behind)
            committed = time.perf_counter()
            self._flush(state)
            flushed = time.perf_counter()
        phases = {"open": opened - started, **result.phases,
                  "followers": leftover + flushed - committed,
                  "close": time.perf_counter() - flushed}
        return ApplyStats(written=result.upserts, deleted=result.deletes,
                          skipped=result.skipped, scanned=result.scanned,
                          revisited=result.revisited, phases=phases)

    def _commit_state(self, state: ViewState, changes: Sequence[BatchRow],
                      behind: bool = False) -> BatchResult:
        """Step 2 of a batch: its changes of the view's base tables gated into the state, the
        view's changed rows recorded in the outbox, in one transaction (committed on return;
        the followers are written after)."""
        base = [BaseChange(self.topics[topic], key, position, row)
                for topic, key, position, row in changes if topic in self.topics]
        self._refuse_lost_columns(base)
        return state.apply(base, defer=behind)

    def _refuse_lost_columns(self, changes: Sequence[BaseChange]) -> None:
        """A row without a column the view reads: the leader dropped or renamed it, and the
        view's SQL no longer runs there; this view stops (the other followers go on)."""
        for change in changes:
            wanted = self.plan.referenced.get(change.table, set())
            if change.row is not None and not wanted <= change.row.keys():
                lost = sorted(wanted - change.row.keys())
                raise ViewError(
                    f"view {self.name} reads {', '.join(f'{change.table}.{c}' for c in lost)}, "
                    "which the leader's table no longer has (dropped or renamed by a schema "
                    "change): the view stopped at the change that lacks it; other followers "
                    "go on", f"correct views.{self.name}.sql, then delete the view's state "
                    f"{self.config.view_state(self.name)} and its progress folder "
                    f"{self.config.follower_checkpoint(self.name)} to rebuild it from the log")

    def _flush(self, state: ViewState) -> None:
        """Write the outbox into every follower, then empty it."""
        pending = state.pending()
        if not pending:
            return
        changes = [self._change(item) for item in pending]
        for shared in self._shared.values():
            with shared.lock:
                shared.sink.refresh()
                shared.sink.apply(changes)
        state.drained()

    def _change(self, item: ViewChange) -> Change:
        return Change(topic=self.topic, source=self.view.source, table=f"{VIEW_SCHEMA}.{self.name}",
                      key=item.key, position=item.position, row=item.row,
                      op="d" if item.row is None else "u")

    # ------------------------------------------------------------------------ watermarks
    def set_watermark(self, source: str, offset: Mapping[str, Any]) -> None:
        if source != self.view.source:
            return
        for shared in self._shared.values():
            with shared.lock:
                shared.sink.set_watermark(watermark_name(self.name), offset)
        self._meta("watermark", json.dumps(dict(offset)))

    def watermark(self, source: str) -> dict[str, Any] | None:
        if source != self.view.source:
            return None
        text = self._meta("watermark")
        return None if text is None else dict(json.loads(text))

    # --------------------------------------------------------------------------- reading
    def read(self, topic: str, keys: Sequence[str]) -> dict[str, dict[str, str]]:
        with self.opened() as state:
            rows = state.rows()
        return {key: row_text(rows[key]) for key in keys if key in rows}

    def keys(self, topic: str) -> Iterator[str]:
        with self.opened() as state:
            return iter(sorted(state.rows()))

    def close(self) -> None:
        if self._state is not None:
            self._state.close()
            self._state = None
        for follower in self._shared:
            _release(self.config, follower)
        self._shared = {}
