"""The differential fuzzer's world: a real leader (a fresh PostgreSQL or MariaDB database),
``cdc capture`` into a local log, and one view state per query fed from that log exactly as
``cdc apply`` feeds a view (``cdc.reading``'s decoder, the newest change per key, one call per
batch of whole transactions). After each batch every accepted query's state is compared with
the same SQL run by the leader (``views.verify``: by value, floats within the stated
tolerance). Nothing is synthesized: every change the views see went through the leader's
replication stream and the capture process.

A query the views refuse (``check-config --connect``'s checks: :func:`views.check.check_view`)
is counted as refused, never compared: refusing is allowed, computing differently is not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc.errors import CdcError
from cdc.events import TableId, topic_name
from tests.fuzz_views.grammar import Batches, Queries, Query, schema

#: a mismatch: (query, batch number, what differs)
Mismatch = tuple[Query, int, str]


@dataclass
class Report:
    seed: int
    dialect: str
    comparisons: int = 0
    batches: int = 0
    time_zone: str = "UTC"
    refused: dict[str, str] = field(default_factory=dict)
    accepted: list[str] = field(default_factory=list)
    #: the accepted queries kept incrementally (the others are recomputed whole)
    incremental: list[str] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    #: per incremental query, the keys its batches recomputed, and of them those revisited
    #: because a scalar subquery's value moved (``BatchResult.revisited``)
    affected: dict[str, int] = field(default_factory=dict)
    revisited: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        return (f"fuzz_views seed {self.seed} ({self.dialect}, {self.time_zone}): "
                f"{self.comparisons} (query, batch) "
                f"comparisons over {self.batches} batches, {len(self.accepted)} queries "
                f"compared, {len(self.refused)} refused at check time, "
                f"{len(self.mismatches)} mismatches")


class Leader:
    """A fresh database on a running server, in one dialect."""

    def __init__(self, dialect: str, server: Any) -> None:
        self.dialect = dialect
        if dialect == "postgres":
            from tests.pgkit import new_database
            self.db: Any = new_database(server)
        else:
            from tests.mykit import new_database as new_my_database
            self.db = new_my_database(server)

    def tables(self, names: Sequence[str]) -> list[str]:
        if self.dialect == "postgres":
            return [f"public.{name}" for name in names]
        return [self.db.table(name) for name in names]

    def table_id(self, name: str) -> TableId:
        return TableId("public" if self.dialect == "postgres" else self.db.name, name)

    def write(self, statements: Sequence[str]) -> None:
        """``statements`` in one transaction."""
        if self.dialect == "postgres":
            with self.db.connect() as conn, conn.transaction():
                for statement in statements:
                    conn.execute(statement)
            return
        conn = self.db.connect()
        try:
            conn.begin()
            with conn.cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement)
            conn.commit()
        finally:
            conn.close()

    def config(self, directory: Path, tables: Sequence[str], extra: str) -> Path:
        if self.dialect == "postgres":
            from tests.pgkit import write_config
        else:
            from tests.mykit import write_config  # type: ignore[assignment]
        return write_config(directory, self.db, list(tables), extra=extra)

    def caught_up(self, log: Path) -> None:
        if self.dialect == "postgres":
            from tests.pgkit import wait_caught_up
        else:
            from tests.mykit import wait_caught_up  # type: ignore[assignment]
        wait_caught_up(self.db, log, 60)

    def drop(self) -> None:
        with contextlib.suppress(Exception):
            if self.dialect == "postgres":
                self.db.drop()
            else:
                self.db.execute(f"DROP DATABASE IF EXISTS `{self.db.name}`")


class World:
    """The leader, capture and the views of one case: ``schema``, its initial rows and
    ``queries``; :meth:`step` writes one batch and compares. ``in_process=False``: no view is
    kept here (the caller checks another follower of the same log, e.g. ``cdc apply``'s)."""

    def __init__(self, case: Case, server: Any, directory: Path,
                 plant: Callable[[], Any] | None = None, in_process: bool = True) -> None:
        from tests.pgkit import Capture, cdc, output

        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.leader = Leader(case.dialect, server)
        self.time_zone = case.time_zone
        if case.dialect == "mysql" and case.time_zone != "UTC":
            server.load_time_zones([case.time_zone])
        self.names = _table_names(case.ddl)
        self.queries = {query.name: query for query in case.queries}
        self.report = Report(0, case.dialect, time_zone=case.time_zone)
        self.capture: Any = None
        self.states: dict[str, Any] = {}
        self._reader: Any = None
        self._offsets: dict[str, dict[str, int]] = {}
        try:
            self.leader.write([*case.ddl, *case.initial])
            views = "".join(
                f"  {q.name}:\n    source: {self.leader.db.source}\n    sql: {json.dumps(q.sql)}"
                f"\n    key: {json.dumps(list(q.key))}\n    followers: [lite]\n"
                f"    time_zone: {case.time_zone}\n"
                for q in case.queries)
            extra = (f"followers:\n  lite:\n    kind: sql\n    url: sqlite:///{directory}/"
                     f"lite.sqlite\nviews:\n{views}")
            self.config_path = self.leader.config(directory, self.leader.tables(self.names), extra)
            booted = cdc("bootstrap", "--config", str(self.config_path))
            assert booted.returncode == 0, output(booted)
            self.capture = Capture(self.config_path, directory / "capture.log").start()
            self._caught_up()
            self._open_views(plant, in_process)
            self._apply_new()
        except BaseException:
            self.close()
            raise

    # -------------------------------------------------------------------------- set-up
    def _open_views(self, plant: Callable[[], Any] | None, in_process: bool) -> None:
        from cdc.config import load_config
        from cdc.log.open import log_settings, reader_from
        from cdc.verify import leader_for
        from views.check import check_view
        from views.sink import declared_columns, schema_store
        from views.state import ViewState

        self.config = load_config(self.config_path)
        self.verifier = leader_for(self.config, self.leader.db.source)
        store = schema_store(self.config)
        source = self.leader.db.source

        def columns_of(table: TableId) -> list[tuple[str, str]]:
            return declared_columns(store, source, table) or []

        with plant() if plant is not None else contextlib.nullcontext():
            for name in self.queries if in_process else ():
                try:
                    plan = check_view(self.config, name, self.verifier).plan
                except CdcError as exc:
                    self.report.refused[name] = str(exc)
                    continue
                self.states[name] = ViewState(self.directory / f"{name}.duckdb", plan,
                                              columns_of)
                self.report.accepted.append(name)
                if plan.mode == "incremental":
                    self.report.incremental.append(name)
        self._reader = reader_from(log_settings(self.config))
        from cdc.avro import EventCodec
        from cdc.reading import Decoder
        self._decoder = Decoder(EventCodec(self._reader.schemas()))

    def _apply_new(self) -> None:
        """Every record the log committed since the last call, into every view's state."""
        from cdc.reading import plan_ranges, raw_records
        from cdc.sink import newest_per_key
        from views.state import BaseChange

        committed = self._reader.committed()
        end = {"topics": {topic: {str(p): at for p, at in enumerate(ends)}
                          for topic, ends in committed.ends.items()}}
        ranges = plan_ranges(committed, {"topics": self._offsets}, end)
        self._offsets = end["topics"]
        topics = {topic_name(self.leader.db.source, self.leader.table_id(name)):
                  self.leader.table_id(name) for name in self.names}
        changes = []
        for item, key, position, _offset, value in raw_records(self._reader, ranges):
            if item.topic in topics:
                change = self._decoder.change(item, key, position, value)
                if change is not None:
                    changes.append(change)
        base = [BaseChange(topics[c.topic], c.key, c.position, c.row)
                for c in newest_per_key(changes)]
        from views.state import ViewError

        for name, state in list(self.states.items()):
            try:
                result = state.apply(base)
            except ViewError as exc:  # accepted at check time, then stopped: a failure
                self.report.mismatches.append((self.queries[name], self.report.batches,
                                               f"the view stopped: {exc}"))
                state.close()
                del self.states[name]
                continue
            if not result.recomputed:
                self.report.affected[name] = self.report.affected.get(name, 0) + result.affected
                self.report.revisited[name] = \
                    self.report.revisited.get(name, 0) + result.revisited
            state.drained()

    def _caught_up(self) -> None:
        try:
            self.leader.caught_up(self.directory / "log")
        except AssertionError as exc:
            said = (self.directory / "capture.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"{exc}; cdc capture said:\n{said}") from None

    # ---------------------------------------------------------------------------- steps
    def step(self, statements: Sequence[str], number: int) -> list[Mismatch]:
        """One batch written, captured, applied; every view compared with the leader."""
        if statements:
            self.leader.write(statements)
        self._caught_up()
        self._apply_new()
        self.report.batches += 1
        return self.compare(number)

    def compare(self, number: int) -> list[Mismatch]:
        from views.definition import approximate_columns
        from views.verify import compare_view, leader_view

        found: list[Mismatch] = []
        for name, state in list(self.states.items()):
            query = self.queries[name]
            try:
                leader = leader_view(self.verifier, query.sql, list(query.key), self.time_zone)
            except CdcError as exc:
                if "collation" not in str(exc):  # anything else: how verify reads the leader
                    found.append((query, number, f"the leader's answer could not be read: {exc}"))
                    continue
                # the leader refuses it when it runs (two collations at once)
                self.report.refused[name] = f"the leader: {exc}"
                self.report.accepted.remove(name)
                self.states.pop(name).close()
                continue
            tolerant = approximate_columns(state.plan, {})
            differences = compare_view(leader, state.rows(), tolerant)
            self.report.comparisons += 1
            if differences:
                shown = "; ".join(f"{d.key}: {d.describe()}" for d in differences[:5])
                found.append((query, number, shown))
        self.report.mismatches += found
        return found

    def close(self) -> None:
        for state in self.states.values():
            with contextlib.suppress(Exception):
                state.close()
        if getattr(self, "verifier", None) is not None:
            with contextlib.suppress(Exception):
                self.verifier.close()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                self._reader.close()
        if self.capture is not None and self.capture.alive():
            self.capture.kill()
        self.leader.drop()


# ------------------------------------------------------------------------------- a run

@dataclass
class Case:
    """Everything one world needs, as text: what a regression test replays."""

    dialect: str
    ddl: list[str]
    initial: list[str]
    batches: list[list[str]]
    queries: list[Query]
    #: the views' ``time_zone`` (and the leader session's that ``cdc verify`` runs their SQL in)
    time_zone: str = "UTC"


#: the views' time zones a case may get (UTC half the time; zones with summer time and not)
TIME_ZONES = ("UTC", "UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata")


def generate(seed: int, dialect: str, batches: int, queries: int) -> Case:
    rng = random.Random(f"{dialect}-{seed}")
    the_schema = schema(rng, dialect)
    writer = Batches(the_schema)
    initial = writer.initial(rng)
    maker = Queries(rng, the_schema)
    made = [maker.query(i) for i in range(queries)]
    zone = random.Random(f"{dialect}-{seed}-zone").choice(TIME_ZONES)
    return Case(dialect, the_schema.ddl(), initial,
                [writer.batch(rng) for _ in range(batches)], made, zone)


def _table_names(ddl: Sequence[str]) -> list[str]:
    words = [statement.split() for statement in ddl]
    return [said[2] for said in words if [w.upper() for w in said[:2]] == ["CREATE", "TABLE"]]


def run_case(case: Case, server: Any, directory: Path, *, deadline: float | None = None,
             plant: Callable[[], Any] | None = None, progress: Callable[[str], None] | None = None,
             until_mismatch: bool = False) -> Report:
    """``case`` played: a world, then each batch and a comparison after it (and one after the
    snapshot). Stops early at ``deadline`` (``time.monotonic()``), and with ``until_mismatch``
    after the first comparison round that found a difference."""
    world = World(case, server, directory, plant)
    try:
        world.compare(0)
        for number, statements in enumerate(case.batches, 1):
            if deadline is not None and time.monotonic() > deadline:
                break
            if until_mismatch and world.report.mismatches:
                break
            world.step(statements, number)
            if progress is not None:
                progress(world.report.summary())
        return world.report
    finally:
        world.close()
        shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------------------- shrinking

def shrink(case: Case, query: Query, server: Any, directory: Path, budget: float = 120
           ) -> Case:
    """The smallest case found within ``budget`` seconds that still fails ``query``: the other
    queries dropped, then batches, then statements one at a time (each try a fresh world)."""
    deadline = time.monotonic() + budget
    best = dataclasses.replace(case, queries=[query])
    attempt = 0

    def fails(candidate: Case) -> bool:
        nonlocal attempt
        attempt += 1
        report = run_case(candidate, server, directory / f"shrink{attempt}")
        return bool(report.mismatches)

    if not fails(best):
        return best
    # the batches after the first failing one are never needed; then drop whole batches
    for index in reversed(range(len(best.batches))):
        if time.monotonic() > deadline:
            return best
        candidate = dataclasses.replace(
            best, batches=best.batches[:index] + best.batches[index + 1:])
        if fails(candidate):
            best = candidate
    for where in _statement_slots(best):
        if time.monotonic() > deadline:
            break
        candidate = _without(best, where)
        if candidate is not None and fails(candidate):
            best = candidate
    return best


def _statement_slots(case: Case) -> Iterator[tuple[int, int]]:
    """(batch, statement) from the last, so removing one leaves the others' indexes valid;
    batch -1 is the initial rows."""
    for batch in reversed(range(len(case.batches))):
        for statement in reversed(range(len(case.batches[batch]))):
            yield batch, statement
    for statement in reversed(range(len(case.initial))):
        yield -1, statement


def _without(case: Case, where: tuple[int, int]) -> Case | None:
    batch, statement = where
    if batch == -1:
        if statement >= len(case.initial):
            return None
        return dataclasses.replace(
            case, initial=case.initial[:statement] + case.initial[statement + 1:])
    if batch >= len(case.batches) or statement >= len(case.batches[batch]):
        return None
    batches = [list(b) for b in case.batches]
    del batches[batch][statement]
    return dataclasses.replace(case, batches=batches)


def as_pytest(case: Case, name: str) -> str:
    """``case`` as a ready regression test for ``tests/fuzz_views/test_regressions.py``."""
    fixture = "pg_cluster" if case.dialect == "postgres" else "mariadb_server"
    query = case.queries[0]
    return (f"def test_{name}(tmp_path: Path, {fixture}: Any) -> None:\n"
            f"    replay(Case({case.dialect!r},\n"
            f"                {case.ddl!r},\n"
            f"                {case.initial!r},\n"
            f"                {case.batches!r},\n"
            f"                [Query({query.name!r}, {query.sql!r}, {query.key!r}, "
            f"{query.limited!r})]"
            + (f",\n                time_zone={case.time_zone!r}" if case.time_zone != "UTC"
               else "") + "),\n"
            f"           {fixture}, tmp_path)\n")


def replay(case: Case, server: Any, directory: Path) -> Report:
    """A regression case: every comparison equal (or the query refused at check time)."""
    report = run_case(case, server, directory)
    assert not report.mismatches, "\n".join(f"{q.name} after batch {n}: {text}"
                                            for q, n, text in report.mismatches)
    return report
