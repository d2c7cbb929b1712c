"""``cdc verify``: is a follower equal to the leader?

Three stages, stated exactly:

1. **Target.** For every source the follower follows, the leader's log is marked *now*
   (:meth:`cdc.source.Leader.target`: PostgreSQL writes a heartbeat message). Every transaction
   committed before verify started ends at or before the mark, and capture checkpoints the
   log's source offset past it once it has read it — even when the captured tables are idle.
2. **Wait.** Until the follower's watermark (:meth:`Sink.watermark`, per source) reaches the
   target, showing the log's source offset and the watermark beside the target. After
   ``timeout`` seconds :class:`VerifyTimeout` names the stage that is behind: *capture* (the
   log's source offset has not reached the target) or *apply* (the log has, the follower's
   watermark has not).
3. **Compare**, table by table, in chunks of ``chunk_size`` rows in primary-key order. The
   leader summarises each chunk in SQL (``connectors/postgres/checksum.py``): the chunk's key
   texts and an MD5 over its rows' canonical texts; the follower's rows for those keys
   (:meth:`Sink.read`) are summarised the same way in Python (:func:`row_digest_text`). Only a
   chunk whose checksums differ is fetched again, decoded exactly like the snapshot decodes
   rows, and compared row by row: that comparison is the authority and names each differing
   key (*missing* on the follower, or *different* with the columns that differ). Finally every
   key the follower holds for the table (:meth:`Sink.keys`, streamed in batches) is looked up on
   the leader: those it lacks are *extra*.

The leader keeps running while verify reads it: a row changed after the target may show as a
difference until the follower has applied it too (run verify again). On a quiet leader the
answer is exact.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from cdc.columns import ColumnPolicies
from cdc.config import Config
from cdc.errors import CdcError
from cdc.events import TableId
from cdc.offsets import offset_order, offset_text
from cdc.sink import Sink, row_text
from cdc.source import Chunk, Leader, Target, TextComparison, connector_for
from cdc.status import CheckpointReader, records_behind

#: follower keys looked up on the leader per query
EXTRA_BATCH = 1000


class VerifyTimeout(CdcError):
    """The follower did not reach the target position in time."""

    exit_code = 3


@dataclass(frozen=True)
class Difference:
    """One key on which leader and follower disagree."""

    key: str
    kind: Literal["missing", "extra", "different"]
    #: for ``different``: the columns whose values differ (present on one side only included)
    columns: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.kind == "missing":
            return "missing on the follower"
        if self.kind == "extra":
            return "extra on the follower (the leader has no such row)"
        return "different: " + ", ".join(self.columns)


@dataclass
class TableResult:
    """What verify found in one table."""

    source: str
    table: TableId
    topic: str
    #: leader rows summarised by checksum
    rows: int = 0
    chunks: int = 0
    #: chunks whose checksums differed, compared again row by row
    rechecked: int = 0
    #: keys the follower holds for the table (scanned for extras)
    follower_keys: int = 0
    missing: int = 0
    extra: int = 0
    different: int = 0
    #: the first differences found (at most the report's limit)
    differences: list[Difference] = field(default_factory=list)
    #: columns without an exact SQL form (their chunks are always compared by rows)
    inexact: tuple[str, ...] = ()
    #: seconds spent summarising chunks on the leader
    leader_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def differing(self) -> int:
        return self.missing + self.extra + self.different

    def add(self, difference: Difference, limit: int) -> None:
        if difference.kind == "missing":
            self.missing += 1
        elif difference.kind == "extra":
            self.extra += 1
        else:
            self.different += 1
        if len(self.differences) < limit:
            self.differences.append(difference)


@dataclass
class VerifyReport:
    follower: str
    #: per source: (the target, the follower's watermark reached, shown)
    targets: dict[str, tuple[Target, str]] = field(default_factory=dict)
    waited_seconds: float = 0.0
    tables: list[TableResult] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return all(result.differing == 0 for result in self.tables)

    @property
    def rows(self) -> int:
        return sum(result.rows for result in self.tables)

    @property
    def leader_seconds(self) -> float:
        return sum(result.leader_seconds for result in self.tables)


# ------------------------------------------------------------------------------- checksums

def row_digest_text(key: str, row: Mapping[str, str], columns: Sequence[str]) -> str:
    """The text one row contributes to its chunk's checksum: ``<len(key)>:<key>``, then per
    column in table order ``|`` (null, i.e. absent) or ``|<len(text)>:<text>`` (lengths in
    code points). The leader's SQL builds the same text (``connectors/postgres/checksum.py``)."""
    parts = [f"{len(key)}:{key}"]
    for column in columns:
        text = row.get(column)
        parts.append("|" if text is None else f"|{len(text)}:{text}")
    return "".join(parts)


def chunk_checksum(texts: Sequence[str]) -> str:
    """MD5 (hex) of the row texts joined (UTF-8), as the leader's ``md5(string_agg(...))``."""
    return hashlib.md5("".join(texts).encode(), usedforsecurity=False).hexdigest()


def follower_checksum(keys: Sequence[str], rows: Mapping[str, Mapping[str, str]],
                      columns: Sequence[str]) -> str | None:
    """The follower's checksum of a chunk; ``None`` when it certainly differs (a key absent, or
    a row holding a column the leader does not have)."""
    known = set(columns)
    texts = []
    for key in keys:
        row = rows.get(key)
        if row is None or not known.issuperset(row):
            return None
        texts.append(row_digest_text(key, row, columns))
    return chunk_checksum(texts)


def compare_rows(leader: Mapping[str, Mapping[str, Any]],
                 follower: Mapping[str, Mapping[str, str]]) -> Iterator[Difference]:
    """Row by row: every leader key (JSON-form rows) against the follower's text rows, in the
    leader's key order. Follower keys the leader lacks are not reported here (see extras)."""
    for key, row in leader.items():
        held = follower.get(key)
        if held is None:
            yield Difference(key, "missing")
            continue
        want = row_text(row)
        columns = sorted(name for name in set(want) | set(held) if want.get(name) != held.get(name))
        if columns:
            yield Difference(key, "different", tuple(columns))


# ------------------------------------------------------------------------------- stages

class RuledLeader(Leader):
    """A leader whose tables have column rules (:mod:`cdc.columns`), read as the log holds
    them: the same columns kept and the same transforms applied, in Python, to the rows the
    leader decodes. Such a table's chunk checksums are computed here from those rows (the SQL
    checksum covers the leader's clear values); a hashed key's absent keys are decided against
    the hashed keys the chunks saw."""

    def __init__(self, inner: Leader, policies: ColumnPolicies) -> None:
        self.inner = inner
        self.name = inner.name
        self.policies = policies
        #: outer chunk id -> (outer chunk, the leader's chunk)
        self._chunks: dict[int, tuple[Chunk, Chunk]] = {}
        #: per table with a hashed key: every log key its chunks held
        self._seen: dict[TableId, set[str]] = {}

    def target(self) -> Target:
        return self.inner.target()

    def estimate_rows(self, table: TableId) -> int | None:
        return self.inner.estimate_rows(table)

    def columns(self, table: TableId) -> tuple[str, ...]:
        policy = self.policies.get(table)
        names = self.inner.columns(table)
        return names if policy is None else tuple(n for n in names if policy.rules.kept(n))

    def inexact(self, table: TableId) -> tuple[str, ...]:
        return self.inner.inexact(table)

    def chunks(self, table: TableId, size: int) -> Iterator[Chunk]:
        policy = self.policies.get(table)
        if policy is None:
            yield from self.inner.chunks(table, size)
            return
        columns = self.columns(table)
        for chunk in self.inner.chunks(table, size):
            rows = self._ruled_rows(table, chunk)
            texts = [row_digest_text(key, row_text(row), columns) for key, row in rows.items()]
            outer = Chunk(list(rows), chunk_checksum(texts), chunk.after, chunk.last)
            self._chunks = {id(outer): (outer, chunk)}  # verify asks for the current one only
            yield outer

    def _ruled_rows(self, table: TableId, chunk: Chunk) -> dict[str, dict[str, Any]]:
        policy = self.policies.get(table)
        assert policy is not None
        rows: dict[str, dict[str, Any]] = {}
        for key, row in self.inner.rows(table, chunk).items():
            values = json.loads(key)
            ruled_key = key
            if policy.transforms_key(list(values)):
                ruled = policy.json_row(values)
                ruled_key = json.dumps(ruled, separators=(",", ":"), ensure_ascii=False)
                self._seen.setdefault(table, set()).add(ruled_key)
            rows[ruled_key] = policy.json_row(row)
        return rows

    def rows(self, table: TableId, chunk: Chunk) -> dict[str, dict[str, Any]]:
        found = self._chunks.get(id(chunk))
        if found is None or found[0] is not chunk:
            return self.inner.rows(table, chunk)
        return self._ruled_rows(table, found[1])

    def absent(self, table: TableId, keys: Sequence[str]) -> list[str]:
        if table not in self._seen:
            return self.inner.absent(table, keys)
        seen = self._seen[table]
        return [key for key in keys if key not in seen]

    def query(self, sql: str, time_zone: str = "UTC") -> tuple[list[str], list[tuple[Any, ...]]]:
        return self.inner.query(sql, time_zone)

    def text_comparisons(self, table: TableId) -> dict[str, TextComparison]:
        return self.inner.text_comparisons(table)

    def close(self) -> None:
        self.inner.close()


def leader_for(config: Config, source: str) -> Leader:
    """The leader of ``source`` as ``cdc verify`` reads it (through its column rules)."""
    source_config = config.source(source)
    leader = connector_for(source_config).leader()
    policies = source_config.column_policies() if source_config.columns else None
    return leader if policies is None else RuledLeader(leader, policies)


def _leaders(config: Config, follower: str) -> dict[str, Leader]:
    leaders: dict[str, Leader] = {}
    try:
        for name in config.follower_sources(follower):
            leaders[name] = leader_for(config, name)
    except BaseException:
        for leader in leaders.values():
            leader.close()
        raise
    return leaders


def _at(offset: Mapping[str, Any] | None, target: Target) -> bool:
    order = offset_order(offset)
    return bool(order) and order >= target.order


def _unread(config: Config, follower: str, reader: Any, applied: CheckpointReader | None
            ) -> int | None:
    """Records of ``follower``'s topics in the log past what its last finished batch read
    (None: unknown — no way to read its progress record)."""
    if applied is None or reader is None:
        return None
    ends = {topic: reader.end_offsets(topic) for topic in config.follower_topics(follower)}
    return records_behind(config, follower, ends,
                          applied(config.follower_checkpoint(follower)))[1]


def wait_for_follower(config: Config, sink: Sink, targets: Mapping[str, Target], timeout: float,
                      console: Console, poll: float = 0.2,
                      applied: CheckpointReader | None = None) -> dict[str, str]:
    """Block until ``sink`` holds every change of each source up to its target; return the
    watermarks reached (shown). It does once its watermark reaches the target, or — with
    ``applied``, the reader of its progress record, for a follower applied in batches (``cdc apply
    --once``) — once the log has reached the target and no record of the follower's tables is
    past its last finished batch: later records are the source's heartbeats only, which move
    the log but change none of its rows. :class:`VerifyTimeout` after ``timeout`` seconds,
    naming the stage behind for each source that is late."""
    from cdc.log.open import open_reader

    reader = open_reader(config, missing_ok=True)
    deadline = time.monotonic() + timeout
    with console.status("waiting for the follower") as status:
        while True:
            offsets = reader.source_offsets() if reader is not None else {}
            logged = {s: offsets.get(s) for s in targets}
            marks = {s: sink.watermark(s) for s in targets}
            late = [s for s, target in targets.items() if not _at(marks[s], target)]
            if late and all(_at(logged[s], targets[s]) for s in late) and \
                    _unread(config, sink.name, reader, applied) == 0:
                late = []  # the log's offsets were read first: nothing of it is unapplied
            if not late:
                return {s: offset_text(marks[s]) for s in targets}
            left = deadline - time.monotonic()
            status.update(" · ".join(
                f"[bold]{s}[/]: target {targets[s].text}, log {offset_text(logged[s])}, "
                f"follower {offset_text(marks[s])}" for s in targets)
                + f" ({max(left, 0):.0f} s left)")
            if left <= 0:
                raise _timeout(sink.name, targets, logged, marks, late, timeout,
                               _unread(config, sink.name, reader, applied))
            time.sleep(poll)


def _timeout(follower: str, targets: Mapping[str, Target],
             logged: Mapping[str, Mapping[str, Any] | None],
             marks: Mapping[str, Mapping[str, Any] | None], late: list[str],
             timeout: float, unread: int | None = None) -> VerifyTimeout:
    capture = [s for s in late if not _at(logged[s], targets[s])]
    apply = [s for s in late if s not in capture]
    lines = [f"source {s}: target {targets[s].text}, log {offset_text(logged[s])}, "
             f"follower {offset_text(marks[s])}" for s in late]
    if capture:
        stage = (f"capture is behind: the change log's offset for source(s) "
                 f"{', '.join(capture)} did not reach the target within {timeout:g} s")
        fix = ("start `cdc capture` (check `cdc status`), then run verify again; a busy "
               "source may need a longer --timeout")
    else:
        stage = (f"apply is behind: the log reached the target but follower {follower}'s "
                 f"watermark did not within {timeout:g} s"
                 + (f" ({unread:,} record(s) of its tables are past its last finished batch)"
                    if unread else ""))
        fix = (f"`cdc apply --follower {follower}` must run: start it, or run `cdc apply "
               f"--once --follower {follower}` again; then run verify again (a large backlog "
               "may need a longer --timeout)")
    if capture and apply:
        stage += f"; apply is behind too for {', '.join(apply)}"
    return VerifyTimeout(stage + "\n  " + "\n  ".join(lines), fix)


def compare_table(leader: Leader, sink: Sink, topic: str, table: TableId, *,
                  chunk_size: int, limit: int,
                  advance: Callable[[int], None] = lambda rows: None) -> TableResult:
    """Stage 3 for one table (see the module docstring)."""
    started = time.monotonic()
    columns = leader.columns(table)
    result = TableResult(leader.name, table, topic, inexact=leader.inexact(table))
    chunks = leader.chunks(table, chunk_size)
    while True:
        began = time.monotonic()
        chunk = next(chunks, None)
        result.leader_seconds += time.monotonic() - began
        if chunk is None:
            break
        result.chunks += 1
        result.rows += len(chunk.keys)
        _compare_chunk(leader, sink, result, chunk, columns, limit)
        advance(len(chunk.keys))
    _find_extras(leader, sink, result, limit)
    result.seconds = time.monotonic() - started
    return result


def _compare_chunk(leader: Leader, sink: Sink, result: TableResult, chunk: Chunk,
                   columns: Sequence[str], limit: int) -> None:
    held = sink.read(result.topic, chunk.keys)
    if follower_checksum(chunk.keys, held, columns) == chunk.checksum:
        return
    result.rechecked += 1
    rows = leader.rows(result.table, chunk)
    unseen = [key for key in rows if key not in held]
    if unseen:  # rows written into the chunk's key range since it was summarised
        held = {**held, **sink.read(result.topic, unseen)}
    for difference in compare_rows(rows, held):
        result.add(difference, limit)


def _find_extras(leader: Leader, sink: Sink, result: TableResult, limit: int) -> None:
    batch: list[str] = []
    for key in sink.keys(result.topic):
        result.follower_keys += 1
        batch.append(key)
        if len(batch) >= EXTRA_BATCH:
            _extras(leader, result, batch, limit)
            batch = []
    _extras(leader, result, batch, limit)


def _extras(leader: Leader, result: TableResult, keys: list[str], limit: int) -> None:
    for key in leader.absent(result.table, keys):
        result.add(Difference(key, "extra"), limit)


def verify(config: Config, follower: str, sink: Sink, console: Console, *, timeout: float,
           chunk_size: int = 1000, limit: int = 20,
           applied: CheckpointReader | None = None) -> VerifyReport:
    """All three stages for ``follower`` (whose storage is ``sink``; ``applied`` reads its
    progress record: see :func:`wait_for_follower`)."""
    if chunk_size < 1:
        raise CdcError(f"--chunk-size must be at least 1 (got {chunk_size})",
                       "e.g. --chunk-size 1000")
    topics = config.follower_topics(follower)
    report = VerifyReport(follower)
    leaders = _leaders(config, follower)
    try:
        targets = {name: leader.target() for name, leader in leaders.items()}
        began = time.monotonic()
        reached = wait_for_follower(config, sink, targets, timeout, console, applied=applied)
        report.waited_seconds = time.monotonic() - began
        report.targets = {s: (targets[s], reached[s]) for s in targets}
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("rows"), TimeElapsedColumn(), console=console,
                      transient=True) as progress:
            for topic, (source, table) in topics.items():
                leader = leaders[source]
                task = progress.add_task(str(table), total=leader.estimate_rows(table))

                def advance(rows: int, task: TaskID = task) -> None:
                    progress.advance(task, rows)

                result = compare_table(leader, sink, topic, table, chunk_size=chunk_size,
                                       limit=limit, advance=advance)
                report.tables.append(result)
    finally:
        for leader in leaders.values():
            leader.close()
    return report
