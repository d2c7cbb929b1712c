"""A view's state: its base tables' current rows, the view's rows and an outbox, in one DuckDB
file; and the batch step that keeps the view exact (``views/definition.py`` says how).

Contracts, stated exactly:

* **One transaction per batch.** :meth:`ViewState.apply` gates the batch's changes into the
  base tables, recomputes the affected view rows, compares them with the rows the view holds,
  and records the differences in the *outbox* — all in one DuckDB transaction. A crash
  leaves the state before the batch or after it, never between.
* **Version gate on the base tables.** A change is applied only if its position is strictly
  newer than the position the state holds for its key (a row, or the marker of a delete in
  ``_cdc_gone``). So a batch replayed after a crash changes nothing and produces no output.
* **The outbox is drained before anything else.** :meth:`ViewState.pending` returns its rows;
  the caller writes them into every target follower (each behind its own version gate) and
  then calls :meth:`ViewState.drained`. A crash in between leaves the outbox full, and it is
  written again: the followers' gates make the second write a no-op.
* **View positions only grow.** Each batch's view changes carry the newest position of the
  batch's applied changes, or — if that is not newer than the last one used — the last one
  with a zero byte appended (which orders just after it). So a key the view rewrites in a
  later batch always passes the followers' gate.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc.errors import CdcError, check_format
from cdc.events import TableId
from cdc.sink import canonical_text
from views.definition import (
    AFFECTED,
    FLIP,
    FLIP_NEW,
    IMAGES,
    KEY_COLUMN,
    LINEAGE,
    NEW,
    SCOPES,
    SUB_SCHEMA,
    ViewPlan,
)
from views.types import json_form, set_up_state

if TYPE_CHECKING:
    import duckdb

POSITION = "_cdc_pos"
#: a base table's 32-bit hash of its key text (:func:`key_hash`): the batch's rows are found by
#: it, as a scan of one small integer column (a semi-join on the key text hashes every key of
#: the table: 2.5x slower at 10M rows; 64 bits: 1.3x, random values do not compress)
KEY_HASH = "_cdc_h"
#: the rows DuckDB's profiler says a query's scans read
_ROWS_SCANNED = re.compile(r'"total_rows_scanned":\s*(\d+)')
#: the version of the state file's layout, in ``_cdc_meta`` (``format``; a file without it was
#: written before formats were marked: format 1). Format 2 added :data:`KEY_HASH` to the base
#: tables (a format-1 file is upgraded in place when opened)
FORMAT = 2
#: a view's ORDER BY ... LIMIT (``views.definition.TopK``): every row of the view without its
#: LIMIT with its ORDER BY values (``_cdc_rank``), and the first rows in that order
#: (``_cdc_top``: ``pos`` 1, 2, ...; ``shown``: the places the followers hold). The first rows
#: kept are ``offset + limit`` and at least this many more (or as many more as ``limit``)
TOP_BUFFER = 100
#: the state's named values (format, definition, position, watermark ...)
_META_TABLE = "CREATE TABLE IF NOT EXISTS _cdc_meta (name VARCHAR PRIMARY KEY, value VARCHAR)"
_META_READ = "SELECT value FROM _cdc_meta WHERE name = ?"
_META_WRITE = "INSERT OR REPLACE INTO _cdc_meta VALUES (?, ?)"
#: how long a batch's task waits for the state file another process holds open
LOCK_WAIT_S = 120.0
#: up to this many keys, a batch's rows are looked up in the index on their hashes (DuckDB's
#: ``index_scan_max_count``: a longer list of constants is scanned for, not looked up)
HASH_LIST_MAX = 2048
#: above this share of a table's rows touched by one batch, the view is recomputed whole
RECOMPUTE_SHARE = 0.25
#: in a :data:`NEW` table: the change is a delete
DELETED = "_cdc_deleted"
#: the state's rows of the batch's keys of a table, before the batch (_cdc_rowid, then the
#: table's columns)
HELD = "_cdc_held_{index}"
ROWID = "_cdc_rowid"
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
#: a string as JSON text (the json module's C encoder, as ``ensure_ascii=False`` uses)
_STRING: Callable[[str], str] = json.encoder.encode_basestring
#: the json module's C encoder as ``_COMPACT`` configures it, made once (``_COMPACT.encode``
#: makes one per call): ``"".join(_ENCODE(value, 0))`` is ``_COMPACT.encode(value)`` for a
#: dict of JSON forms
_ENCODE: Callable[[Any, int], Sequence[str]] = (
    json.encoder.c_make_encoder(  # type: ignore[attr-defined]
        None, None, _STRING, None, ":", ",", False, False, False)
    if getattr(json.encoder, "c_make_encoder", None) is not None
    else lambda value, _: [_COMPACT.encode(value)])
#: DuckDB result types whose Python values are their JSON form (decimals: cast to text)
_AS_IS = frozenset({"BIGINT", "INTEGER", "SMALLINT", "TINYINT", "HUGEINT", "UBIGINT",
                    "UINTEGER", "USMALLINT", "UTINYINT", "UHUGEINT", "VARCHAR", "BOOLEAN",
                    "DECIMAL"})


class ViewError(CdcError):
    """A view cannot be maintained (its message names the view and the fix)."""


@dataclass(frozen=True)
class BaseChange:
    """One base-table key's newest change in a batch."""

    table: TableId
    key: str
    position: bytes
    #: the new row (JSON form), or ``None`` for a delete
    row: Mapping[str, Any] | None


@dataclass(frozen=True)
class ViewChange:
    """One view row to write (``row`` None: delete the key)."""

    key: str
    position: bytes
    row: dict[str, Any] | None


@dataclass
class BatchResult:
    applied: int = 0
    skipped: int = 0
    affected: int = 0
    upserts: int = 0
    deletes: int = 0
    recomputed: bool = False
    #: only the base tables were written: the view is computed by a later batch (``defer``)
    deferred: bool = False
    #: rows DuckDB's scans read for the batch (its profiler, summed over the batch's queries)
    scanned: int = 0
    #: keys recomputed because a one-row subquery's value moved and their comparison with it
    #: flipped (``ViewPlan.flip_sql``: a scalar subquery over a whole table)
    revisited: int = 0
    #: seconds per step: gate, lineage (with the base tables' write), recompute (the view's
    #: SQL on the affected keys), diff, record (view rows and outbox), commit
    phases: dict[str, float] = field(default_factory=dict)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _table_sql(table: TableId) -> str:
    return f"{_quote(table.schema)}.{_quote(table.table)}"


class ViewState:
    """The DuckDB state of view ``plan.name`` at ``path``; ``columns_of(table)`` gives a base
    table's ``[(column, DuckDB type)]`` (from the log's schema store)."""

    def __init__(self, path: Path, plan: ViewPlan,
                 columns_of: Callable[[TableId], list[tuple[str, str]]]) -> None:

        self.plan = plan
        self.path = path
        self.columns_of = columns_of
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = _connect(path, plan.name, plan.time_zone, plan.memory_limit)
        #: rows read by the scans of every query so far (DuckDB's profiler: cheap, always on)
        self.scanned = 0
        self.db.execute("SET enable_profiling = 'no_output'")
        self._lock = threading.Lock()
        #: (index, table) of the captured tables, and of the aggregating subqueries' tables
        self._captured = [(i, t) for i, t in enumerate(plan.tables) if t.schema != SUB_SCHEMA]
        #: in the order of ``plan.subviews``: a subquery after those it reads
        self._subs = [(plan.tables.index(t), t) for t in plan.subviews]
        #: the temporary tables of affected keys filled so far in this batch
        self._affected: set[str] = set()
        #: the keys a moved one-row subquery made recomputed in this batch (:meth:`_flip`)
        self._revisited = 0
        self.columns: dict[TableId, list[tuple[str, str]]] = {}
        #: the view's output columns and DuckDB types
        self._output: list[tuple[str, str]] | None = None
        #: the start of a one-column key's JSON text (``{"id":``)
        self._key_prefix = "{" + _STRING(plan.key[0]) + ":"
        #: the outbox's content when this process knows it (None: read it from the state)
        self._outbox: list[ViewChange] | None = None
        self._lap_at = 0.0
        try:
            self._create()
        except BaseException:
            self.db.close()
            raise

    # ------------------------------------------------------------------------- set-up
    def _create(self) -> None:
        db = self.db
        # each base table has an index on its key hashes (KEY_HASH): loaded whole by the first
        # lookup after an open and rewritten by each checkpoint, it pays now that the state is
        # held open between batches and checkpointed at DuckDB's threshold (views/host.py); keys
        # stay unique: every write deletes the batch's keys, then inserts them
        db.execute("CREATE TABLE IF NOT EXISTS _cdc_gone (tbl VARCHAR, k VARCHAR, pos BLOB)")
        db.execute("CREATE TABLE IF NOT EXISTS _cdc_view (k VARCHAR, row VARCHAR)")
        db.execute("CREATE TABLE IF NOT EXISTS _cdc_outbox (seq BIGINT, k VARCHAR, row VARCHAR, "
                   "pos BLOB)")
        db.execute(_META_TABLE)
        stored = self.meta("format")
        check_format(int(stored) if stored and stored.isdigit() else (stored or FORMAT), FORMAT,
                     f"view {self.plan.name}: its state {self.path}", error=ViewError,
                     fix="run the cdc version that wrote it (or a newer one), or delete the "
                     "file to rebuild the view from the log")
        for _, table in [*self._captured, *self._subs]:  # a subquery's columns: DESCRIBE
            self._ensure_table(table)
        if stored != str(FORMAT):  # new, unmarked, or upgraded just now
            self.set_meta("format", str(FORMAT))
        padding = json.dumps({str(t): sorted(c) for t, c in sorted(
            self.plan.padded.items(), key=lambda item: str(item[0]))})
        if (self.meta("padded") or "{}") != padding:
            # character(n) columns are held without their trailing blanks (views/definition.py:
            # _blank_padding): rows held before are stripped here, then the view recomputed
            for table, columns in self.plan.padded.items():
                for column in columns:
                    self._q(f"UPDATE {_table_sql(table)} SET {_quote(column)} = "
                            f"rtrim({_quote(column)}, ' ')")
            self.set_meta("padded", padding)
            self.set_meta("stale", "1")
        definition = self._definition()
        if self.meta("sql") != definition or \
                (self.meta("time_zone") or "UTC") != self.plan.time_zone:
            # a new definition: the next batch recomputes the whole view and compares
            self._keep_shown_only()
            self.set_meta("sql", definition)
            self.set_meta("time_zone", self.plan.time_zone)
            self.set_meta("stale", "1")
        if self.plan.top is not None:
            self._create_top()

    def _definition(self) -> str:
        """What the state was computed for: the view's SQL over it, and its LIMIT."""
        top = self.plan.top
        return self.plan.full_sql if top is None else \
            f"{self.plan.full_sql} ORDER BY {top.order} LIMIT {top.limit} OFFSET {top.offset}"

    def _tables(self) -> set[str]:
        return {str(row[0]) for row in self._q(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'")}

    def _keep_shown_only(self) -> None:
        """Before a new definition: the view's rows become those the followers hold (an
        earlier ORDER BY ... LIMIT's shown rows), and its ranking goes."""
        if "_cdc_top" in self._tables():
            self._q("DELETE FROM _cdc_view WHERE k NOT IN (SELECT k FROM _cdc_top WHERE shown)")
            self._q("DROP TABLE _cdc_top")
            self._q("DROP TABLE IF EXISTS _cdc_rank")

    def _create_top(self) -> None:
        """The ranking tables of an ORDER BY ... LIMIT (see :data:`TOP_BUFFER`); made new, the
        rows the view holds are marked shown (the next batch, stale, ranks them all)."""
        if "_cdc_top" in self._tables():
            return
        top = self.plan.top
        assert top is not None
        kinds = {str(row[0]): str(row[1]) for row in self._q(f"DESCRIBE {self.plan.full_sql}")}
        ordered = ", ".join(f"{_quote(c)} {kinds[c]}" for c in top.columns)
        self._q(f"CREATE TABLE _cdc_rank (k VARCHAR, {ordered})")
        self._q(f"CREATE TABLE _cdc_top (k VARCHAR, {ordered}, pos BIGINT, shown BOOLEAN)")
        self._q("INSERT INTO _cdc_top (k, shown) SELECT k, true FROM _cdc_view")

    def _ensure_table(self, table: TableId, extra: Iterable[str] = ()) -> None:
        """Create the state table of ``table``, or add the columns it lacks."""
        declared = self.columns_of(table) if table.schema != SUB_SCHEMA else [
            (str(row[0]), str(row[1]))
            for row in self._q(f"DESCRIBE {self.plan.subviews[table].full_sql}")]
        have = {name for name, _ in self.columns.get(table, [])}
        if not have:
            self._q(f"CREATE SCHEMA IF NOT EXISTS {_quote(table.schema)}")
            rows = self._q(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position",
                [table.schema, table.table])
            if not rows:
                data = "".join(f", {_quote(name)} {kind}" for name, kind in declared)
                self._q(f"CREATE TABLE {_table_sql(table)} ({_quote(KEY_COLUMN)} VARCHAR, "
                        f"{_quote(KEY_HASH)} UINTEGER, {_quote(POSITION)} BLOB{data})")
                rows = [(KEY_COLUMN, "VARCHAR"), (KEY_HASH, "UINTEGER"), (POSITION, "BLOB"),
                        *declared]
            if KEY_HASH not in {name for name, _ in rows}:  # format 1: upgraded in place
                self._q(f"ALTER TABLE {_table_sql(table)} ADD COLUMN {_quote(KEY_HASH)} UINTEGER")
                self._q(f"UPDATE {_table_sql(table)} SET {_quote(KEY_HASH)} = "
                        f"{key_hash(_quote(KEY_COLUMN))}")
            self.columns[table] = [(name, kind) for name, kind in rows
                                   if name not in (KEY_COLUMN, KEY_HASH, POSITION)]
            have = {name for name, _ in self.columns[table]}
            self._q(f"CREATE INDEX IF NOT EXISTS {_hash_index(table)} ON {_table_sql(table)} "
                    f"({_quote(KEY_HASH)})")
        wanted = dict(declared)
        for name in extra:
            wanted.setdefault(name, "VARCHAR")
        held = dict(self.columns[table])
        for name, kind in wanted.items():  # timestamptz was held as its text before
            if kind == "TIMESTAMPTZ" and held.get(name) == "VARCHAR":
                # DuckDB retypes no column of a table with an index: dropped, made again
                self._q(f"DROP INDEX IF EXISTS {_quote(table.schema)}.{_hash_index(table)}")
                self._q(f"ALTER TABLE {_table_sql(table)} ALTER {_quote(name)} SET DATA TYPE "
                        "TIMESTAMPTZ")
                self._q(f"CREATE INDEX {_hash_index(table)} ON {_table_sql(table)} "
                        f"({_quote(KEY_HASH)})")
                self.columns[table] = [(n, kind if n == name else k)
                                       for n, k in self.columns[table]]
                self.set_meta("stale", "1")
        for name, kind in wanted.items():
            if name not in have:
                self._q(f"ALTER TABLE {_table_sql(table)} ADD COLUMN {_quote(name)} "
                                f"{kind}")
                self.columns[table].append((name, kind))
                have.add(name)

    def _q(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run ``sql``; its rows (fetched: DuckDB wants every result finished). The rows its
        scans read count into :attr:`scanned`."""
        rows = self.db.execute(sql, params or []).fetchall()
        self._count_scanned()
        return rows

    def _count_scanned(self) -> None:
        found = _ROWS_SCANNED.search(self.db.get_profiling_information(format="json"))
        if found:
            self.scanned += int(found.group(1))

    def meta(self, name: str) -> str | None:
        rows = self._q(_META_READ, [name])
        return str(rows[0][0]) if rows else None

    def set_meta(self, name: str, value: str) -> None:
        self._q(_META_WRITE, [name, value])

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------------- outbox
    def pending(self) -> list[ViewChange]:
        """The outbox: view changes recorded but not yet confirmed written (kept in memory
        too once this process knows the outbox's whole content: no read back)."""
        if self._outbox is not None:
            return list(self._outbox)
        rows = self._q("SELECT k, row, pos FROM _cdc_outbox ORDER BY seq")
        self._outbox = [ViewChange(key, bytes(position), None if row is None else json.loads(row))
                        for key, row, position in rows]
        return list(self._outbox)

    def drained(self) -> None:
        """Every change of :meth:`pending` is written into every target."""
        self._q("DELETE FROM _cdc_outbox")
        self._outbox = []

    # ---------------------------------------------------------------------------- apply
    def apply(self, changes: Sequence[BaseChange], defer: bool = False) -> BatchResult:
        """One batch (whole source transactions; at most one change per table and key), in
        one transaction (see the module docstring). The outbox must be empty.

        ``defer``: more batches follow right behind this one (a backlog). While the view is
        *stale* (its rows not computed from the base tables yet: a new state, a new
        definition), such a batch only gates its changes into the base tables and leaves the
        view stale: the first batch without ``defer`` computes the view once, from all of them,
        instead of every batch of the backlog maintaining it. A view that is not stale is
        maintained as always."""
        with self._lock:
            scanned = self.scanned
            self._lap_at = time.perf_counter()
            self._q("BEGIN TRANSACTION")
            try:
                result, recorded = self._apply(changes, defer)
            except BaseException as exc:
                self._q("ROLLBACK")
                import duckdb

                if isinstance(exc, duckdb.OutOfMemoryException):
                    raise ViewError(
                        f"view {self.plan.name}: its state ran out of memory "
                        f"({self.plan.memory_limit}: {str(exc).splitlines()[0]})",
                        f"raise views.{self.plan.name}.memory_limit (the views of one `cdc "
                        "apply` add up) and run `cdc apply` again: the view resumes where it "
                        "stopped") from None
                raise
            self._q("COMMIT")
            self._lap(result, "commit")
            if self._outbox is not None:
                self._outbox.extend(recorded)
            result.scanned = self.scanned - scanned
            return result

    def _apply(self, changes: Sequence[BaseChange], defer: bool
               ) -> tuple[BatchResult, list[ViewChange]]:
        import duckdb

        result = BatchResult()
        by_table: dict[TableId, list[BaseChange]] = {}
        for change in changes:
            by_table.setdefault(change.table, []).append(change)
        counts = self._stage_new(by_table)
        won = self._gate(counts)
        self._lap(result, "gate")
        result.applied = sum(won.values())
        result.skipped = sum(counts.values()) - result.applied
        stale = self.is_stale()
        if not result.applied and not stale:
            return result, []
        if stale and defer:
            self._write_base(self._captured)
            self._lap(result, "base")
            result.deferred = True
            return result, []
        try:
            full = stale or self.plan.mode == "recompute" or self._mostly_touched(won)
            self._affected = set()
            self._revisited = 0
            if full:
                self._write_base(self._captured)
                for table in self.plan.subviews:
                    self._refill_subview(table)
                self._lap(result, "lineage")
                rows = self._run(self.plan.full_sql)
                self._lap(result, "recompute")
                fresh, upserts, deletes = self._diff(rows, None)
            else:
                if self.plan.subviews:
                    self._lineage_through_subviews()
                else:
                    self._lineage(before=True)
                    self._write_base(self._captured)
                    self._lineage(before=False)
                affected = self._distinct_affected()
                result.affected, result.revisited = len(affected), self._revisited
                self._lap(result, "lineage")
                rows = self._run(self.plan.restricted_sql or "")
                self._lap(result, "recompute")
                fresh, upserts, deletes = self._diff(rows, affected)
            shown = None if self.plan.top is None else \
                self._rank(fresh, upserts, deletes, full)
            newest = self._newest_position()
            self._lap(result, "diff")
        except duckdb.OutOfMemoryException:
            raise
        except duckdb.Error as exc:
            raise ViewError(f"view {self.plan.name}: its SQL failed on the state ({exc})",
                            "a base table's schema may have changed under the view (a dropped "
                            "or retyped column): correct the view's SQL, then delete its state "
                            f"{self.path} and checkpoint to rebuild it") from None
        result.recomputed = full
        position = self._next_position(newest)
        recorded = self._record(upserts, deletes, position, shown)
        if stale:
            self.set_meta("stale", "0")
        result.upserts = sum(change.row is not None for change in recorded)
        result.deletes = len(recorded) - result.upserts
        self._lap(result, "record")
        return result, recorded

    def _lap(self, result: BatchResult, phase: str) -> None:
        """The seconds since the last lap (or the batch's start) go to ``phase``."""
        now = time.perf_counter()
        result.phases[phase] = result.phases.get(phase, 0.0) + now - self._lap_at
        self._lap_at = now

    def _lineage(self, before: bool) -> None:
        """Stage the changed rows (:meth:`_stage`), then add to :data:`AFFECTED` the keys the
        lineage query finds on the state as it is now (``before`` the batch's write, then
        after it). With windows, the partitions first (:data:`SCOPES`: those found before,
        then those found either time), and the keys are those of every tuple in them."""
        self._stage(before, self._captured)
        scoped = self.plan.scope_lineage_sql
        if scoped:
            self._affect(SCOPES, scoped)
            if not before:
                self._q(f"CREATE OR REPLACE TEMP TABLE {SCOPES} AS "
                        f"SELECT DISTINCT * FROM {SCOPES}")
        self._affect(AFFECTED, self.plan.lineage_sql or "")

    def _affect(self, table: str, sql: str) -> None:
        """Add ``sql``'s rows to the temporary table ``table`` (made by the batch's first)."""
        if not sql:
            return
        if table in self._affected:
            self._q(f"INSERT INTO {table} {sql}")
        else:
            self._q(f"CREATE OR REPLACE TEMP TABLE {table} AS {sql}")
            self._affected.add(table)

    def _lineage_through_subviews(self) -> None:
        """The lineage of a view with aggregating subqueries in FROM (each kept as a table of
        the state, maintained like a view of its own):

        1. before the write, the lineage branches of the captured tables' changes, the view's
           and each subquery's (on the old state, the subqueries' old rows included);
        2. the captured tables are written; then per subquery, those it reads first
           (:meth:`_settle`): its affected keys after the write, its rows recomputed for them
           and compared with its table: its changes;
        3. the branches of the subqueries' changes, on the new captured tables (a tuple that
           also involved a changed captured row was found in 1), then the subqueries' tables
           are written;
        4. every branch on the new state."""
        self._stage(True, self._captured)
        for table, sub in self.plan.subviews.items():
            if sub.delta_sql:  # running totals: the reached tuples' contributions, old
                self._q(f"CREATE OR REPLACE TEMP TABLE {_contributions(table, True)} AS "
                        f"{sub.delta_early_sql or sub.delta_sql}")
            else:
                nested = sub.lineage_late_sql is not None  # reads subqueries: their half later
                self._affect(_sub_affected(table),
                             (sub.lineage_early_sql if nested else sub.lineage_sql) or "")
        self._affect(AFFECTED, self.plan.lineage_early_sql or "")
        newest = self._newest_position()
        self._write_base(self._captured)
        self._stage(False, self._captured)
        self._settle(self.plan, AFFECTED, newest)

    def _settle(self, plan: ViewPlan, affected: str, newest: bytes) -> None:
        """Steps 2 to 4 of :meth:`_lineage_through_subviews` for the subqueries ``plan`` (the
        view, or a subquery) reads, adding to ``affected`` the keys of ``plan`` their changes
        reach; the subqueries each of them reads first."""
        reads = {reference.table for reference in plan.references}
        subs = [(index, table) for index, table in self._subs if table in reads]
        for _, table in subs:
            sub = self.plan.subviews[table]
            if sub.lineage_late_sql is not None:  # it reads subqueries
                self._settle(sub, _sub_affected(table), newest)
            elif not sub.delta_sql:
                self._affect(_sub_affected(table), sub.lineage_sql or "")
            if sub.delta_sql:
                self._q(f"CREATE OR REPLACE TEMP TABLE {_contributions(table, False)} AS "
                        f"{sub.delta_sql}")
                self._stage_totals(table, newest)
            else:
                self._stage_subview(table, newest)
        self._stage(True, subs)
        for index, sql in plan.flip_sql.items():
            self._flip(index, sql, affected)
        if plan.delta_late_sql:  # running totals: the old tuples only subqueries reach
            totals = self._table_of(plan)
            before = _contributions(totals, True)
            names = [name for name, _ in self.columns[totals]]
            summed = ", ".join(f"sum({_quote(name)}) AS {_quote(name)}" for name in names[1:])
            self._q(f"CREATE OR REPLACE TEMP TABLE {before} AS SELECT 0 AS {_quote(names[0])}, "
                    f"{summed} FROM (SELECT * FROM {before} UNION ALL {plan.delta_late_sql})")
        else:
            self._affect(affected, plan.lineage_late_sql or "")
        self._write_base(subs, markers=False)
        self._stage(False, subs)
        if not plan.delta_sql:
            self._affect(affected, plan.lineage_sql or "")

    def _flip(self, index: int, sql: str, affected: str) -> None:
        """Add to ``affected`` the keys whose comparison with one-row subquery ``index``'s
        row flips with this batch's change of it (``views.definition.FLIP``: staged from its
        old row and its new one), if it changed; counted in :attr:`BatchResult.revisited`."""
        new = NEW.format(index=index)
        if not self._q(f"SELECT count(*) FROM {new}")[0][0]:
            return
        names = [name for name, _ in self.columns[self.plan.tables[index]]]
        self._q(f"CREATE OR REPLACE TEMP TABLE {FLIP.format(index=index)} AS SELECT "
                + ", ".join([*(f"o.{_quote(n)}" for n in names), *(
                    f"n.{_quote(n)} AS {_quote(FLIP_NEW.format(name=n))}" for n in names)])
                + f" FROM (SELECT 1) _one LEFT JOIN {LINEAGE.format(index=index)} o ON true "
                f"LEFT JOIN (SELECT * FROM {new} WHERE NOT {DELETED}) n ON true")
        self._q(f"CREATE OR REPLACE TEMP TABLE _cdc_flipped AS {sql}")
        self._revisited += int(self._q("SELECT count(*) FROM _cdc_flipped")[0][0])
        self._affect(affected, "SELECT * FROM _cdc_flipped")

    def _table_of(self, sub: ViewPlan) -> TableId:
        """The state's table of subquery plan ``sub``."""
        return next(table for table, plan in self.plan.subviews.items() if plan is sub)

    @staticmethod
    def _sub_key(columns: Sequence[str]) -> str:
        """The text ``_cdc_key`` of a subquery's row: its key columns (``columns``: their
        expressions, in the key's order) as a JSON list of their texts."""
        texts = ", ".join(f"CAST({column} AS VARCHAR)" for column in columns)
        return f"CAST(to_json(list_value({texts})) AS VARCHAR)"

    def _stage_subview(self, table: TableId, position: bytes) -> None:
        """The changes of subquery ``table``'s rows for its affected keys, staged as a captured
        table's are (``_cdc_new_<i>``, ``_cdc_held_<i>``): rows recomputed that differ from
        the held ones, and deletes of held keys no longer produced."""
        sub = self.plan.subviews[table]
        index = self.plan.tables.index(table)
        new, held = NEW.format(index=index), HELD.format(index=index)
        columns = self.columns[table]
        names = [_quote(name) for name, _ in columns]
        affected = _sub_affected(table)
        keys = self._sub_key([f"k{i}" for i in range(len(sub.key))])
        row_key = self._sub_key([f"r.{_quote(column)}" for column in sub.key])
        self._held(table, held, f"SELECT DISTINCT {keys} AS k FROM {affected}")
        self._q(f"CREATE OR REPLACE TEMP TABLE {new} AS SELECT {KEY_COLUMN}, "
                f"{key_hash(KEY_COLUMN)} AS {KEY_HASH}, ?::BLOB AS {POSITION}, "
                f"false AS {DELETED}, " + ", ".join(names) + f" FROM (SELECT {row_key} AS "
                f"{KEY_COLUMN}, " + ", ".join(f"r.{n}" for n in names)
                + f" FROM ({sub.restricted_sql}) r)", [position])
        self._q(f"INSERT INTO {new} ({KEY_COLUMN}, {KEY_HASH}, {POSITION}, {DELETED}) "
                f"SELECT o.{KEY_COLUMN}, o.{KEY_HASH}, ?, true FROM {held} o "
                f"WHERE o.{KEY_COLUMN} NOT IN (SELECT {KEY_COLUMN} FROM {new})", [position])
        same = " AND ".join(f"o.{n} IS NOT DISTINCT FROM {new}.{n}" for n in names)
        self._q(f"DELETE FROM {new} WHERE NOT {DELETED} AND EXISTS (SELECT 1 FROM {held} o "
                f"WHERE o.{KEY_COLUMN} = {new}.{KEY_COLUMN} AND {same})")

    def _stage_totals(self, table: TableId, position: bytes) -> None:
        """The running totals' row of subquery ``table`` moved by the batch, staged as a
        captured table's change (``_cdc_new_<i>``, ``_cdc_held_<i>``): each total plus the
        reached tuples' contributions after the write minus those before; nothing staged
        when none moved (``views/definition.py``: ``_split_global_aggregate``)."""
        index = self.plan.tables.index(table)
        new, held = NEW.format(index=index), HELD.format(index=index)
        names = [name for name, _ in self.columns[table]]
        key = self._sub_key(["0"])
        self._held(table, held, f"SELECT {key} AS k")
        after, before = _contributions(table, False), _contributions(table, True)
        totals = ", ".join(
            f"0 AS {_quote(name)}" if position_in_row == 0 else
            f"coalesce(h.{_quote(name)}, 0) + a.{_quote(name)} - b.{_quote(name)} "
            f"AS {_quote(name)}" for position_in_row, name in enumerate(names))
        moved = " OR ".join(f"a.{_quote(name)} IS DISTINCT FROM b.{_quote(name)}"
                            for name in names[1:])
        self._q(f"CREATE OR REPLACE TEMP TABLE {new} AS SELECT k.k AS {KEY_COLUMN}, "
                f"{key_hash('k.k')} AS {KEY_HASH}, ?::BLOB AS {POSITION}, false AS {DELETED}, "
                f"{totals} FROM (SELECT {key} AS k) k CROSS JOIN {after} a CROSS JOIN {before} b "
                f"LEFT JOIN {held} h ON h.{KEY_COLUMN} = k.k WHERE {moved}", [position])

    def _refill_subview(self, table: TableId) -> None:
        """Subquery ``table``'s rows recomputed whole (the view is recomputed whole)."""
        sub = self.plan.subviews[table]
        names = ", ".join(_quote(name) for name, _ in self.columns[table])
        key = self._sub_key([f"r.{_quote(column)}" for column in sub.key])
        self._q(f"DELETE FROM {_table_sql(table)}")
        self._q(f"INSERT INTO {_table_sql(table)} ({_quote(KEY_COLUMN)}, {_quote(KEY_HASH)}, "
                f"{_quote(POSITION)}, {names}) SELECT {KEY_COLUMN}, {key_hash(KEY_COLUMN)}, "
                f"''::BLOB, {names} FROM (SELECT {key} AS {KEY_COLUMN}, r.* "
                f"FROM ({sub.full_sql}) r)")

    def _gate(self, counts: Mapping[TableId, int]) -> dict[TableId, int]:
        """Per table, keep in its staged changes only those strictly newer than what the state
        holds for their keys (a row, or a delete's marker); the state's rows of the batch's
        keys go to ``_cdc_held_<i>`` (one scan of the table). The number kept per table."""
        won: dict[TableId, int] = {}
        for index, table in self._captured:
            new, held = NEW.format(index=index), HELD.format(index=index)
            if not counts.get(table):  # nothing to look up: no scan
                self._q(f"CREATE OR REPLACE TEMP TABLE {held} AS SELECT rowid AS {ROWID}, * "
                        f"FROM {_table_sql(table)} LIMIT 0")
                won[table] = 0
                continue
            self._held(table, held, f"SELECT {KEY_COLUMN} AS k FROM {new}")
            self._q(f"DELETE FROM {new} USING {held} o WHERE o.{KEY_COLUMN} = "
                    f"{new}.{KEY_COLUMN} AND o.{POSITION} >= {new}.{POSITION}")
            self._q(f"DELETE FROM {new} USING _cdc_gone g WHERE g.tbl = ? AND "
                    f"g.k = {new}.{KEY_COLUMN} AND g.pos >= {new}.{POSITION}", [str(table)])
            won[table] = int(self._q(f"SELECT count(*) FROM {new}")[0][0])
        return won

    def _held(self, table: TableId, held: str, keys: str) -> None:
        """The temporary table ``held``: the rows of ``table`` whose key is one of ``keys`` (a
        query of one column ``k``) with their row ids, found by their key hashes, then checked
        by their key text (32 bits: at 10M rows a batch of 1,000 keys finds about two rows of
        other keys, dropped here). Up to :data:`HASH_LIST_MAX` hashes, as a list of constants,
        which DuckDB looks up in the table's index on the hash (kept loaded while the state is
        held open: views/host.py); more, by a scan of the hash column joined to them."""
        hashes = [int(row[0]) for row in
                  self._q(f"SELECT DISTINCT {key_hash('k')} FROM ({keys})")]
        found = f"IN ({', '.join(map(str, hashes))})" if 0 < len(hashes) <= HASH_LIST_MAX \
            else f"IN (SELECT {key_hash('k')} FROM ({keys}))"
        self._q(f"CREATE OR REPLACE TEMP TABLE {held} AS SELECT rowid AS {ROWID}, * "
                f"FROM {_table_sql(table)} WHERE {KEY_HASH} {found}")
        self._q(f"DELETE FROM {held} WHERE {KEY_COLUMN} NOT IN (SELECT k FROM ({keys}))")

    def _newest_position(self) -> bytes:
        """The newest position of the batch's changes that passed the gate."""
        newest = b""
        for index, _ in self._captured:
            found = self._q(f"SELECT max({POSITION}) FROM {NEW.format(index=index)}")[0][0]
            if found is not None and bytes(found) > newest:
                newest = bytes(found)
        return newest

    def _mostly_touched(self, won: Mapping[TableId, int]) -> bool:
        for table, count in won.items():
            if count < 1000:
                continue
            rows = int(self._q(f"SELECT count(*) FROM {_table_sql(table)}")[0][0])
            if count > RECOMPUTE_SHARE * max(1, rows):
                return True
        return False

    def is_stale(self) -> bool:
        """Whether the view's rows are not computed from the base tables yet (the next batch
        without ``defer`` computes them whole)."""
        return self.meta("stale") == "1"

    def _stage_new(self, by_table: Mapping[TableId, list[BaseChange]]) -> dict[TableId, int]:
        """Per table, the batch's changes typed (:data:`NEW`);
        the number of changes per table."""
        import pyarrow as pa

        counts: dict[TableId, int] = {}
        for index, table in self._captured:
            batch = by_table.get(table, [])
            counts[table] = len(batch)
            extra = {column for change in batch if change.row for column in change.row}
            known = {name for name, _ in self.columns[table]}
            if not extra <= known:
                self._ensure_table(table, sorted(extra - known))
            columns = self.columns[table]
            rows = [change.row for change in batch]
            staged: dict[str, Any] = {
                "k": pa.array([c.key for c in batch], pa.string()),
                "pos": pa.array([c.position for c in batch], pa.binary()),
                "gone": pa.array([row is None for row in rows], pa.bool_())}
            structs = _as_struct(rows)
            for number, (name, _) in enumerate(columns):
                staged[f"c{number}"] = _staged_column(structs, name, rows)
            self.db.register("_cdc_staged", pa.table(staged))
            try:
                padded = self.plan.padded.get(table, {})
                casts = "".join(
                    f", rtrim(CAST(c{number} AS VARCHAR), ' ') AS {_quote(name)}"
                    if name in padded else f", CAST(c{number} AS {kind}) AS {_quote(name)}"
                    for number, (name, kind) in enumerate(columns))
                self._q(f"CREATE OR REPLACE TEMP TABLE {NEW.format(index=index)} AS "
                        f"SELECT k AS {KEY_COLUMN}, {key_hash('k')} AS {KEY_HASH}, "
                        f"pos AS {POSITION}, gone AS {DELETED}{casts} FROM _cdc_staged")
            finally:
                self.db.unregister("_cdc_staged")
        return counts

    def _stage(self, before: bool, tables: Sequence[tuple[int, TableId]]) -> None:
        """Each table's changed rows as the lineage query reads them (``_cdc_lineage_<i>``):
        ``before`` the write their rows in the state, after it their new rows; and (once, for
        LEFT JOINs) their old and new images together."""
        for index, table in tables:
            new, held = NEW.format(index=index), HELD.format(index=index)
            names = [_quote(name) for name, _ in self.columns[table]]
            columns = ", ".join(names)
            old = (f"SELECT {columns} FROM {held} WHERE {KEY_COLUMN} IN "
                   f"(SELECT {KEY_COLUMN} FROM {new})")
            if before:
                self._q(f"CREATE OR REPLACE TEMP TABLE {IMAGES.format(index=index)} AS {old} "
                        f"UNION ALL SELECT {columns} FROM {new} WHERE NOT {DELETED}")
                self._q(f"CREATE OR REPLACE TEMP TABLE {LINEAGE.format(index=index)} AS "
                        f"SELECT {_quote(KEY_COLUMN)}, {_quote(POSITION)}, {columns} FROM "
                        f"{held} WHERE {KEY_COLUMN} IN (SELECT {KEY_COLUMN} FROM {new})")
            else:
                self._q(f"CREATE OR REPLACE TEMP TABLE {LINEAGE.format(index=index)} AS "
                        f"SELECT {KEY_COLUMN}, {POSITION}, {columns} FROM {new} "
                        f"WHERE NOT {DELETED}")

    def _write_base(self, tables: Sequence[tuple[int, TableId]], markers: bool = True) -> None:
        """The gated changes into ``tables``: rows replaced (the held rows deleted by their
        row ids), deletes leave a marker (with ``markers``: a subquery's table needs none, its
        changes are made here, never replayed)."""
        for index, table in tables:
            new, held = NEW.format(index=index), HELD.format(index=index)
            names = [_quote(name) for name, _ in self.columns[table]]
            self._q(f"DELETE FROM {_table_sql(table)} WHERE rowid IN (SELECT {ROWID} FROM "
                    f"{held} WHERE {KEY_COLUMN} IN (SELECT {KEY_COLUMN} FROM {new}))")
            self._q(f"DELETE FROM _cdc_gone WHERE tbl = ? AND k IN "
                    f"(SELECT {KEY_COLUMN} FROM {new})",
                    [str(table)])
            self._q(f"INSERT INTO {_table_sql(table)} ({_quote(KEY_COLUMN)}, "
                    f"{_quote(KEY_HASH)}, {_quote(POSITION)}" + "".join(f", {n}" for n in names)
                    + f") SELECT {KEY_COLUMN}, {KEY_HASH}, {POSITION}"
                    + "".join(f", {n}" for n in names) + f" FROM {new} WHERE NOT {DELETED}")
            if markers:
                self._q(f"INSERT INTO _cdc_gone SELECT ?, {KEY_COLUMN}, {POSITION} FROM "
                        f"{new} WHERE {DELETED}",
                        [str(table)])

    def _distinct_affected(self) -> list[tuple[Any, ...]]:
        self._q(f"CREATE OR REPLACE TEMP TABLE {AFFECTED} AS "
                        f"SELECT DISTINCT * FROM {AFFECTED}")
        return self._q(f"SELECT * FROM {AFFECTED}")

    def _run(self, sql: str) -> tuple[list[str], list[str], list[tuple[Any, ...]]]:
        """``sql``'s column names, DuckDB types and rows; decimals come as their text (their
        JSON form, made by DuckDB rather than per value in Python)."""
        top = self.plan.top
        if top is not None:  # kept numbered, with its ORDER BY values, for _rank
            self._q(f"CREATE OR REPLACE TEMP TABLE _cdc_fresh AS SELECT row_number() OVER () "
                    f"AS _cdc_n, * FROM ({sql})")
            hidden = ", ".join(_quote(column) for column in top.columns)
            sql = f"SELECT * EXCLUDE (_cdc_n, {hidden}) FROM _cdc_fresh ORDER BY _cdc_n"
        decimals = [name for name, kind in self.output_types()
                    if kind.upper().startswith("DECIMAL")]
        if decimals:
            casts = ", ".join(f"CAST({_quote(name)} AS VARCHAR) AS {_quote(name)}"
                              for name in decimals)
            sql = f"SELECT * REPLACE ({casts}) FROM ({sql}) AS _cdc_v"
        cursor = self.db.execute(sql)
        names = [str(d[0]) for d in cursor.description or []]
        types = [kind for _, kind in self.output_types()]
        rows = cursor.fetchall()
        self._count_scanned()
        return names, types, rows

    def output_types(self) -> list[tuple[str, str]]:
        """The view's columns and their DuckDB types, as its SQL declares them."""
        if self._output is None:
            hidden = self.plan.top.columns if self.plan.top is not None else ()
            self._output = [(str(row[0]), str(row[1]))
                            for row in self._q(f"DESCRIBE {self.plan.full_sql}")
                            if row[0] not in hidden]
        return self._output

    def _forms(self, names: Sequence[str], types: Sequence[str]
               ) -> Callable[[Sequence[Any]], dict[str, Any]]:
        """A function from a result row (of :meth:`_run`) to ``{name: JSON form}``: columns
        whose values already are their JSON form (integers, text, booleans, decimals as text)
        are taken as they are, the others through :func:`json_form`."""
        converted = [i for i, kind in enumerate(types)
                     if kind.upper().split("(")[0] not in _AS_IS]
        if not converted:
            return lambda values: dict(zip(names, values, strict=True))

        def forms(values: Sequence[Any]) -> dict[str, Any]:
            row = dict(zip(names, values, strict=True))
            for i in converted:
                row[names[i]] = json_form(values[i])
            return row
        return forms

    def _key_text(self, values: Sequence[Any]) -> str:
        """The key's JSON text (compact, as ``json.dumps`` gives it). A key column may hold NULL
        (``null``): a NULL group is a group, as on the leader."""
        if len(values) == 1 and type(values[0]) is int:  # the common case, directly
            return f"{self._key_prefix}{values[0]}}}"
        return "".join(_ENCODE({name: json_form(value) for name, value
                                in zip(self.plan.key, values, strict=True)}, 0))

    def _diff(self, result: tuple[list[str], list[str], list[tuple[Any, ...]]],
              affected: list[tuple[Any, ...]] | None
              ) -> tuple[list[str], dict[str, tuple[str, dict[str, Any]]], list[str]]:
        """The keys of ``result``'s rows (in its order), the rows to upsert (key -> (row JSON,
        row)) and the keys to delete, comparing ``result`` with the view's rows (all of them
        when ``affected`` is None)."""
        import pyarrow as pa

        names, types, rows = result
        positions = [names.index(column) for column in self.plan.key]
        forms = self._forms(names, types)
        fresh: dict[str, tuple[str, dict[str, Any]]] = {}
        for values in rows:
            row = forms(values)
            key = self._key_text([values[i] for i in positions])
            if key in fresh:
                raise ViewError(f"view {self.plan.name}: two rows have the key {key}",
                                f"the view's key ({', '.join(self.plan.key)}) must identify one "
                                "row: add the missing GROUP BY or join columns to the key")
            fresh[key] = ("".join(_ENCODE(row, 0)), row)
        if affected is None:
            held = dict(self._q("SELECT k, row FROM _cdc_view"))
        else:
            keys = [self._key_text(values) for values in affected]
            self.db.register("_cdc_keys", pa.table({"k": pa.array(keys, pa.string())}))
            try:
                held = dict(self._q("SELECT v.k, v.row FROM _cdc_view v "
                                    "JOIN _cdc_keys USING (k)"))
            finally:
                self.db.unregister("_cdc_keys")
        upserts = {key: new for key, new in fresh.items() if held.get(key) != new[0]}
        deletes = [key for key in held if key not in fresh]
        return list(fresh), upserts, deletes

    def _rank(self, fresh: Sequence[str], upserts: Mapping[str, tuple[str, dict[str, Any]]],
              deletes: Sequence[str], full: bool
              ) -> tuple[dict[str, tuple[str, dict[str, Any]]], list[str]]:
        """An ORDER BY ... LIMIT's round (:data:`TOP_BUFFER`): the ranking of the rows just
        computed (``fresh``: their keys, in ``_cdc_fresh``'s order) and of the deleted keys
        updated, the first rows found again, and what the followers must change: the shown
        rows that are new or changed, and the keys no longer shown.

        The first rows are found again from the ones kept, without the computed keys, plus
        the computed rows that order before the last one kept (every row not kept orders
        after it); when fewer than ``offset + limit`` remain, from the whole ranking."""
        import pyarrow as pa

        top = self.plan.top
        assert top is not None
        cap = top.offset + top.limit + max(top.limit, TOP_BUFFER)
        ordered = ", ".join(_quote(column) for column in top.columns)
        self._register_keys(fresh)
        self.db.register("_cdc_dropped", pa.table({"k": pa.array(deletes, pa.string())}))
        computed = (f"SELECT k._cdc_k AS k, {', '.join(f'f.{_quote(c)}' for c in top.columns)} "
                    "FROM _cdc_fresh f JOIN _cdc_keys k USING (_cdc_n)")
        try:
            was_shown = {str(row[0]) for row in self._q("SELECT k FROM _cdc_top WHERE shown")}
            if full:
                self._q("DELETE FROM _cdc_rank")
            else:
                self._q("DELETE FROM _cdc_rank WHERE k IN (SELECT _cdc_k FROM _cdc_keys "
                        "UNION ALL SELECT k FROM _cdc_dropped)")
            self._q(f"INSERT INTO _cdc_rank {computed}")
            found = None if full else self._first_again(computed, ordered, cap)
            if found is None:
                self._q(f"CREATE OR REPLACE TEMP TABLE _cdc_first AS SELECT k, {ordered} "
                        f"FROM _cdc_rank ORDER BY {top.order}, k LIMIT {cap}")
                found = int(self._q("SELECT count(*) FROM _cdc_rank")[0][0]) <= cap
            self.set_meta("top_all", "1" if found else "0")
            self._q(f"CREATE OR REPLACE TABLE _cdc_top AS SELECT *, pos > {top.offset} AND "
                    f"pos <= {top.offset + top.limit} AS shown FROM (SELECT *, row_number() "
                    f"OVER (ORDER BY {top.order}, k) AS pos FROM _cdc_first)")
            shown = {str(row[0]) for row in self._q("SELECT k FROM _cdc_top WHERE shown")}
        finally:
            self.db.unregister("_cdc_keys")
            self.db.unregister("_cdc_dropped")
        entering = sorted(shown - was_shown - upserts.keys())
        unchanged = {key: (text, json.loads(text)) for key, text in self._q(
            "SELECT k, row FROM _cdc_view WHERE k IN (SELECT unnest(?))", [entering])
        } if entering else {}
        return ({key: upserts[key] if key in upserts else unchanged[key]
                 for key in sorted(shown) if key in upserts or key not in was_shown},
                sorted(was_shown - shown))

    def _register_keys(self, keys: Sequence[str]) -> None:
        """``_cdc_keys``: the key text (``_cdc_k``) of each row of ``_cdc_fresh`` by its number
        (``_cdc_n``, from 1 in the order :meth:`_run` fetched them)."""
        import pyarrow as pa

        self.db.register("_cdc_keys", pa.table({
            "_cdc_n": pa.array(range(1, len(keys) + 1), pa.int64()),
            "_cdc_k": pa.array(keys, pa.string())}))

    def _first_again(self, computed: str, ordered: str, cap: int) -> bool | None:
        """The first rows found from those kept (see :meth:`_rank`) into ``_cdc_first``, and
        whether they are all the view's rows; None when too few are certain."""
        top = self.plan.top
        assert top is not None
        held_all = self.meta("top_all") == "1"
        last = "" if held_all else (f" UNION ALL SELECT k, {ordered}, 1 FROM _cdc_top "
                                    "WHERE pos = (SELECT max(pos) FROM _cdc_top)")
        self._q(f"CREATE OR REPLACE TEMP TABLE _cdc_candidates AS SELECT *, row_number() OVER "
                f"(ORDER BY {top.order}, k, b) AS p FROM (SELECT k, {ordered}, 0 AS b FROM "
                "_cdc_top WHERE k NOT IN (SELECT _cdc_k FROM _cdc_keys UNION ALL SELECT k FROM "
                f"_cdc_dropped) UNION ALL SELECT *, 0 FROM ({computed}){last})")
        certain = int(self._q("SELECT coalesce(min(p) FILTER (WHERE b = 1), count(*) + 1) - 1 "
                              "FROM _cdc_candidates")[0][0])
        if not held_all and certain < top.offset + top.limit:
            return None
        self._q(f"CREATE OR REPLACE TEMP TABLE _cdc_first AS SELECT k, {ordered} "
                f"FROM _cdc_candidates WHERE p <= {min(certain, cap)}")
        return held_all and certain <= cap

    def _next_position(self, newest: bytes) -> bytes:
        last = bytes.fromhex(self.meta("position") or "")
        position = newest if newest > last else last + b"\x00"
        self.set_meta("position", position.hex())
        return position

    def _record(self, upserts: Mapping[str, tuple[str, dict[str, Any]]],
                deletes: Sequence[str], position: bytes,
                shown: tuple[Mapping[str, tuple[str, dict[str, Any]]], Sequence[str]] | None
                ) -> list[ViewChange]:
        """The view's new rows, and the outbox (``shown``'s upserts and deletes when the
        followers hold only some rows: :meth:`_rank`); the outbox's new changes."""
        view = self._changes_table("_cdc_out", upserts, deletes)
        outbox = view if shown is None else self._changes_table("_cdc_out_shown", *shown)
        try:
            if view:
                self._q(f"DELETE FROM _cdc_view WHERE k IN (SELECT k FROM {view})")
                self._q(f"INSERT INTO _cdc_view SELECT k, row FROM {view} "
                        "WHERE row IS NOT NULL")
            if outbox:
                self._q(f"INSERT INTO _cdc_outbox SELECT seq, k, row, ? FROM {outbox}",
                        [position])
        finally:
            for table in {view, outbox} - {""}:
                self.db.unregister(table)
        upserts, deletes = shown or (upserts, deletes)
        return [*(ViewChange(key, position, row) for key, (_, row) in upserts.items()),
                *(ViewChange(key, position, None) for key in deletes)]

    def _changes_table(self, name: str, upserts: Mapping[str, tuple[str, dict[str, Any]]],
                       deletes: Sequence[str]) -> str:
        """Upserts then deletes as the registered table ``name`` (seq, k, row: NULL for a
        delete); "" when there are none."""
        import pyarrow as pa

        keys = [*upserts, *deletes]
        if not keys:
            return ""
        rows = [text for text, _ in upserts.values()] + [None] * len(deletes)
        self.db.register(name, pa.table({
            "seq": pa.array(range(len(keys)), pa.int64()), "k": pa.array(keys, pa.string()),
            "row": pa.array(rows, pa.string())}))
        return name

    # ------------------------------------------------------------------------- reading
    def rows(self) -> dict[str, dict[str, Any]]:
        """The view's rows as the state holds them (key -> row JSON form)."""
        shown = "" if self.plan.top is None else \
            " WHERE k IN (SELECT k FROM _cdc_top WHERE shown)"
        return {key: json.loads(row)
                for key, row in self._q(f"SELECT k, row FROM _cdc_view{shown}")}

    def recompute(self) -> dict[str, dict[str, Any]]:
        """The view computed whole from the base tables now (what the rows must equal): an
        aggregating subquery's rows, or running totals, computed from them too, not read from
        the tables the batches keep."""
        fresh: dict[str, str] = {}

        def computed(sql: str) -> str:  # each subquery's table read as its SQL computed now
            for table, name in fresh.items():
                sql = sql.replace(table, name)
            return sql
        for table, sub in self.plan.subviews.items():  # a subquery after those it reads
            name = f"_cdc_fresh_{table.table}"
            self._q(f"CREATE OR REPLACE TEMP VIEW {name} AS {computed(sub.full_sql)}")
            fresh[_table_sql(table)] = name
        sql = computed(self.plan.full_sql)
        names, types, rows = self._run(sql)
        positions = [names.index(column) for column in self.plan.key]
        forms = self._forms(names, types)
        view = {self._key_text([row[i] for i in positions]): forms(row) for row in rows}
        top = self.plan.top
        if top is None:
            return view
        self._register_keys(list(view))
        try:
            first = self._q(f"SELECT _cdc_k FROM _cdc_fresh JOIN _cdc_keys USING (_cdc_n) "
                            f"ORDER BY {top.order}, _cdc_k LIMIT {top.limit} OFFSET {top.offset}")
        finally:
            self.db.unregister("_cdc_keys")
        return {str(key): view[str(key)] for (key,) in first}



def key_hash(key: str) -> str:
    """The SQL of the 32-bit hash of the key text ``key`` (an SQL expression) that
    :data:`KEY_HASH` holds: 32 bits of its MD5, a function whose value no DuckDB version may
    change (the state file keeps it)."""
    return f"CAST(md5_number_lower({key}) >> 32 AS UINTEGER)"


#: Arrow's types of a column of JSON-form values converted in one pass (no per-value Python):
#: strings as they are, integers and booleans as themselves (the state's CAST reads them as it
#: reads their text), or no value at all
_STAGED_AS_IS = frozenset({"string", "int64", "bool", "null"})


#: the structs of the last large batches (:func:`_as_struct`), by the identities of their rows:
#: the views of one process that read a table are handed the very same row objects of a batch
#: (the loop reads and decodes the log once), and each would infer the same struct — a fifth of
#: a build batch's time, per view. An entry holds its rows, so their identities stay theirs
_STRUCTS: dict[tuple[int, ...], tuple[Sequence[Any], Any]] = {}
_STRUCTS_KEPT = 4
_STRUCTS_FROM = 1000
_STRUCTS_LOCK = threading.Lock()


def _as_struct(rows: Sequence[Mapping[str, Any] | None]) -> Any:
    """The batch's rows as one Arrow struct array (Arrow infers each field's type over every
    row, in one pass), or None when a field's values mix types Arrow cannot put in one. A batch
    of :data:`_STRUCTS_FROM` rows or more whose row objects another view staged just before
    gets that struct (:data:`_STRUCTS`)."""
    import pyarrow as pa

    key = tuple(map(id, rows)) if len(rows) >= _STRUCTS_FROM else None
    if key is not None:
        with _STRUCTS_LOCK:
            known = _STRUCTS.get(key)
        if known is not None:
            return known[1]
    try:
        structs = pa.array([{} if row is None else row for row in rows])
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        structs = None
    if key is not None:
        with _STRUCTS_LOCK:
            _STRUCTS[key] = (rows, structs)
            while len(_STRUCTS) > _STRUCTS_KEPT:
                del _STRUCTS[next(iter(_STRUCTS))]
    return structs


def _staged_column(structs: Any, name: str, rows: Sequence[Mapping[str, Any] | None]) -> Any:
    """Column ``name`` of the batch's rows: as Arrow inferred it when its values are all
    strings, all integers or all booleans (or missing, :data:`_STAGED_AS_IS`); otherwise each
    value's text (:func:`_cell`)."""
    import pyarrow as pa

    if structs is not None:
        kind = structs.type  # no batch row has a field: not a struct (an empty batch)
        if not pa.types.is_struct(kind) or kind.get_field_index(name) < 0:
            return pa.nulls(len(structs), pa.string())
        column = structs.field(name)
        if str(column.type) in _STAGED_AS_IS:
            return column
    return pa.array([None if row is None else _cell(row.get(name)) for row in rows],
                    pa.string())


def _cell(value: Any) -> str | None:
    """A JSON-form value as the text DuckDB casts into the column's type."""
    return None if value is None else canonical_text(value)


def _connect(path: Path, name: str, time_zone: str = "UTC",
             memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """A read-write connection to the state file (its session in ``time_zone``, using at most
    ``memory_limit``), waiting up to :data:`LOCK_WAIT_S` while another process holds it (the
    task of the batch before, a speculative duplicate)."""
    import duckdb

    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            connection = duckdb.connect(str(path))
            set_up_state(connection, time_zone, memory_limit)
            return connection
        except duckdb.Error as exc:
            if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                raise ViewError(f"view {name}: cannot open its state {path} ({exc})",
                                "is another `cdc apply` running this view? Stop it; or delete "
                                "the file to rebuild the view from the log") from None
            time.sleep(0.05)


def state_meta(path: Path, view: str, name: str, value: str | None = None) -> str | None:
    """Meta value ``name`` of view ``view``'s state at ``path`` — or, given ``value``, set it —
    without opening the rest of the state (the driver's watermark, once a batch is written:
    no table checked, nothing loaded)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = _connect(path, view)
    try:
        db.execute(_META_TABLE)
        if value is not None:
            db.execute(_META_WRITE, [name, value])
            return value
        row = db.execute(_META_READ, [name]).fetchone()
        return None if row is None else str(row[0])
    finally:
        db.close()


def _hash_index(table: TableId) -> str:
    """The name of ``table``'s index on its key hashes (in the table's schema)."""
    return _quote(f"{table.table}__cdc_h")


def _contributions(table: TableId, before: bool) -> str:
    """The temporary table of running totals ``table``'s contributions (its ``delta_sql``),
    ``before`` the batch's write or after it."""
    return f"_cdc_{'before' if before else 'after'}_{table.table}"


def _sub_affected(table: TableId) -> str:
    """The temporary table of subquery ``table``'s affected keys (its plan's restricted
    query reads it: ``views/definition.py``)."""
    return f"{AFFECTED}_{table.table}"
