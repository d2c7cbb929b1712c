"""What every follower promises: apply a folded batch behind a version gate.

Data reaches a sink one way: change log -> Spark source (``spark_apply/source.py``: offset
ranges) -> the apply tasks' fold (``spark_apply/tasks.py``, the rules stated in
``spark_apply/fold.py``: per key, the record with the highest position) -> :meth:`Sink.apply`.
A sink knows its own storage and nothing about connectors.

Contracts, stated exactly:

* **Version gate.** Every row a follower holds remembers the position of the record it reflects.
  :meth:`Sink.apply` writes a change only if its position is *strictly newer* than what the
  follower holds for that key (a row, or the marker a delete left behind). So re-applying a
  batch, replaying the log from offset 0, or restarting after a crash changes nothing.
* **Deletes.** A change with ``row is None`` (a delete or a tombstone) removes the row but leaves
  a small version marker holding its position for the sink's tombstone retention, so a late
  older record cannot resurrect the row. After the retention the marker may vanish; by then
  the log's compaction has dropped the older records too.
* **Watermarks.** :meth:`Sink.set_watermark` is called after a batch is applied with the
  source offset (as stored in the log's state: for PostgreSQL ``{"lsn": int, ...}``) that the
  batch reached: every change the source committed before that offset is applied. It only
  moves forward. ``cdc verify`` waits on :meth:`Sink.watermark`.
* **Where writes run** is the sink's :attr:`Sink.placement` (:class:`Placement`): on the Spark
  executors, several tasks at once (``spark_apply/tasks.py``), each a share of the log's
  partitions or — keys that must be written by one task together (one Delta file partition)
  share an :meth:`Sink.owner` — the keys it owns; or on the driver. On the executors
  :meth:`apply` must be safe to call from several processes at once, on disjoint keys, and the
  gate must be an atomic per-key compare-and-set: a replayed or speculative task, or one still
  writing after its worker was declared lost, races a newer one and must lose.
* **Rows as text.** What a follower holds per row, and what :meth:`Sink.read` returns, is
  ``{column: canonical_text(value)}`` for the non-null columns of the row's JSON form
  (``docs/types.md``); null columns are absent. ``cdc verify`` builds the same form from the
  leader, so the two compare exactly.
"""

from __future__ import annotations

import enum
import math
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdc.errors import ConfigError
from cdc.events import TableId
from cdc.preflight import Step

# the text of a JSON-form value lives with the types (capture's column hashes use it too)
from cdc.types import canonical_text as canonical_text

if TYPE_CHECKING:
    from cdc.config import Config, FollowerConfig
    from cdc.logical import LogicalKind

#: topic -> (source, table) of what a sink holds
Topics = dict[str, tuple[str, TableId]]


@dataclass(frozen=True, slots=True)
class Change:
    """One key's folded change: the newest record of that key in a batch."""

    #: the log topic (``<source>.<schema>.<table>``)
    topic: str
    #: the source name and the table (``schema.table`` as in the topic's meta)
    source: str
    table: str
    #: the key's JSON text: the log record's key bytes, decoded (``{"id":42}``)
    key: str
    #: the record's position bytes (they order like the position)
    position: bytes
    #: the after image in JSON form, or ``None`` when the key is deleted (delete or tombstone)
    row: Mapping[str, Any] | None
    #: the record's op: ``c``/``u``/``r`` (row set), ``d`` (delete), ``""`` (tombstone)
    op: str = ""
    #: the commit time at the source (ms since the epoch; ``None`` if the record has none)
    ts_ms: int | None = field(default=None, compare=False)


@dataclass
class ApplyStats:
    """What one :meth:`Sink.apply` did."""

    written: int = 0
    deleted: int = 0
    #: changes the version gate ignored (not newer than what the follower holds)
    skipped: int = 0
    #: rows the sink's own storage engine read to apply the batch, by its own count (a view:
    #: DuckDB's profiler over every query of the batch); 0 where not measured
    scanned: int = 0
    #: a view's keys recomputed only because a scalar subquery over a whole table changed
    #: its value and their comparison with it flipped
    revisited: int = 0
    #: seconds per step of the apply, where the sink measures them (a view: opening its state,
    #: the gate, the lineage, ..., writing its followers)
    phases: dict[str, float] = field(default_factory=dict)



def cell_text(value: Any) -> str:
    """A stored cell as follower text: what ``canonical_text`` gives for its JSON form (a
    float NaN or infinity is its JSON-form string)."""
    if type(value) is float:
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
    return canonical_text(value)


def row_text(row: Mapping[str, Any]) -> dict[str, str]:
    """A row's JSON form as follower text: ``canonical_text`` of every non-null column."""
    text = canonical_text
    return {column: value if value.__class__ is str else text(value)
            for column, value in row.items() if value is not None}


def newest_per_key(changes: Sequence[Change]) -> Sequence[Change]:
    """One change per ``(topic, key)``: the one with the highest ``position`` (bytes compared
    unsigned, left to right); **on equal positions the later one in** ``changes`` — a delete
    and its tombstone share a position and the tombstone comes later, the fold's rule
    (``spark_apply/fold.py``: the higher log offset). ``changes`` itself when it already holds
    one change per key (the fold's output always does); otherwise in first-seen key order."""
    newest: dict[tuple[str, str], Change] = {}
    for change in changes:
        held = newest.get((change.topic, change.key))
        if held is None or change.position >= held.position:
            newest[(change.topic, change.key)] = change
    return changes if len(newest) == len(changes) else list(newest.values())


def key_group(key: bytes, groups: int) -> int:
    """The one rule that groups keys (a Delta bucket, the task that owns a key):
    ``crc32(key's JSON bytes) % groups``, in ``range(groups)``. ``spark_apply/jobs.py`` computes
    the same in the JVM (``pmod(crc32(key), groups)``) to repartition by it."""
    return zlib.crc32(key) % groups


class Placement(enum.Enum):
    """Where ``cdc apply`` runs a sink's writes — the one thing it reads to decide.

    ``BY_PARTITION``: tasks on the executors, each a share of the batch's log partitions (a key
    lives in one partition, so each task folds whole keys; each record is read once).
    ``BY_OWNER``: tasks on the executors, each reading every range of the batch and keeping the
    keys whose :meth:`Sink.owner` is its index (keys written together stay together: one Delta
    file partition per task).
    ``DRIVER``: the driver writes, one share after the other (a store that allows a single
    writer; no follower kind of this project needs it: the search index is sharded).
    ``WHOLE_BATCH``: one task on an executor writes the whole batch in one :meth:`Sink.apply`
    call (a view: it needs the batch's changes of every table together; its state is on
    storage every executor reaches, opened by the task and closed before it ends)."""

    BY_PARTITION = "by-partition"
    BY_OWNER = "by-owner"
    DRIVER = "driver"
    WHOLE_BATCH = "whole-batch"

    @property
    def on_executors(self) -> bool:
        return self is not Placement.DRIVER

    @property
    def splits(self) -> bool:
        """The batch is split into several tasks (by partition or by owner)."""
        return self in (Placement.BY_PARTITION, Placement.BY_OWNER)


class Sink(ABC):
    """One follower's storage. A follower kind is a settings model (a
    :class:`cdc.config.FollowerConfig` registered in ``cdc.followers``, :mod:`cdc.plugins`)
    naming its Sink class, which :func:`open_sink` builds with :meth:`from_settings`."""

    name: str
    #: True: :meth:`apply` gets the fold (at most one change per key: the newest of the
    #: batch). False (history sinks, e.g. SCD2): every record of the batch except truncates,
    #: ordered per key by (position, log offset) — a delete and its tombstone share a
    #: position, the tombstone comes second — and the gate is still the sink's.
    folds: bool = True
    #: where ``cdc apply`` runs this sink's writes (the module docstring; :class:`Placement`)
    placement: Placement = Placement.BY_PARTITION
    #: the log topics ``cdc apply`` hands this sink when they are fewer than its follower's
    #: tables (a view: the tables its query reads); ``None``: the follower's tables
    read_topics: Sequence[str] | None = None

    @classmethod
    def from_settings(cls, config: Config, name: str, settings: FollowerConfig,
                      topics: Topics) -> Sink:
        """The sink of follower ``name`` configured by ``settings`` (this kind's model, within
        ``config``), holding ``topics``. Connect nothing yet: :meth:`check` does that. Every
        follower kind's sink implements it; a sink that is no kind of its own (a view writes
        through its followers' sinks) does not."""
        raise ConfigError(f"{cls.__qualname__} is not a follower kind's sink",
                          "name a Sink that implements from_settings in the kind's settings")

    def check(self) -> None:  # noqa: B027 (optional: sinks without a server have nothing to ask)
        """Raise a :class:`~cdc.errors.CdcError` with the fix if the follower cannot be
        written (server down, wrong password, directory not writable, wrong mode...)."""

    def preflight(self) -> list[Step]:
        """What ``cdc check-config --connect`` asks of the follower, creating nothing (the
        contract of :mod:`cdc.preflight`): its server reached, its directory writable or
        creatable. None by default (a kind without a server or a directory)."""
        return []

    def owner_groups(self, topic: str) -> int | None:
        """Keys of ``topic`` whose ``crc32(key) % groups`` is equal must be written by one task
        (e.g. one Delta bucket); ``None``: no such constraint."""
        return None

    def owner(self, topic: str, key: bytes, writers: int) -> int:
        """Which of ``writers`` tasks writes ``key`` (its JSON bytes) of ``topic``: in
        ``range(writers)``, the same for every call: ``crc32(key) % groups % writers`` with
        :meth:`owner_groups`, else ``crc32(key) % writers``. (Spark computes the same in the
        JVM: ``pmod(pmod(crc32(key), groups), writers)``.)"""
        groups = self.owner_groups(topic)
        return (key_group(key, groups) if groups else zlib.crc32(key)) % writers

    def refresh(self) -> None:  # noqa: B027 (optional: sinks that cache nothing)
        """Forget what this process cached about the follower's storage that another writer
        may have changed since (called by each task before it writes)."""

    def declare(self, topic: str, columns: Mapping[str, LogicalKind],  # noqa: B027
                key: Sequence[str]) -> None:
        """Make ``topic``'s table exist, empty, with ``columns`` (in order, each of the logical
        kind its values will have) keyed by ``key``, if it does not exist yet; an existing
        table is left as it is. A view's tables are declared before its first batch, so an
        empty view reads as an empty table. Followers without tables (Redis keys, search
        documents) have nothing to do."""

    @abstractmethod
    def apply(self, changes: Sequence[Change]) -> ApplyStats:
        """Write ``changes`` (at most one per key, unless ``folds`` is False) behind the
        version gate. Returns once the
        writes are done; a crash in the middle leaves each key either old or new."""

    def apply_behind(self, changes: Sequence[Change]) -> ApplyStats:
        """:meth:`apply` of a batch that the log already holds more of the follower's records
        right after (it catches up on a backlog). On return every change is held behind the
        version gate, as after :meth:`apply`; a sink may leave *derived* work that the next
        batch redoes to the batch that ends the backlog (a view being built writes its base
        tables and computes its rows once, then). Such a sink does that work at the latest in
        the first :meth:`apply` or :meth:`caught_up` after. Default: :meth:`apply`."""
        return self.apply(changes)

    def caught_up(self) -> None:  # noqa: B027 (optional: sinks that leave nothing for later)
        """Called instead of :meth:`apply` for a batch without changes for this sink that ends
        a backlog (the log held nothing more of its records when it was planned): the work
        :meth:`apply_behind` left is done now."""

    @abstractmethod
    def set_watermark(self, source: str, offset: Mapping[str, Any]) -> None:
        """Record that every change of ``source`` before ``offset`` is applied."""

    @abstractmethod
    def watermark(self, source: str) -> dict[str, Any] | None:
        """The last offset given to :meth:`set_watermark` for ``source`` (``None``: never)."""

    @abstractmethod
    def read(self, topic: str, keys: Sequence[str]) -> dict[str, dict[str, str]]:
        """The rows the follower holds for ``keys`` (key JSON texts) of ``topic``, as
        ``{key: {column: text}}``; absent keys are left out."""

    @abstractmethod
    def keys(self, topic: str) -> Iterator[str]:
        """Every key (JSON text) the follower holds a live row for in ``topic``'s table."""

    def close(self) -> None:  # noqa: B027 (optional hook: most sinks hold one connection)
        """Release connections."""


def open_sink(config: Config, name: str, topics: Topics | None = None) -> Sink:
    """The sink of follower ``name`` (:class:`~cdc.errors.ConfigError` if there is none, or if
    its kind has no sink), holding ``topics`` (default: the tables it follows). Nothing is
    connected yet: :meth:`Sink.check` does that. (A view is not a follower: it writes through
    its followers' sinks, ``views/sink.py``.)"""
    from cdc import plugins
    from cdc.config import FollowerConfig

    settings = config.follower(name)
    if not isinstance(settings, FollowerConfig):
        raise ConfigError(f"{name} is a view, not a follower: it has no sink of its own",
                          "pass a name under `followers:`")
    sink_class: type[Sink] = plugins.implementation(settings.sink, Sink, settings.kind)
    return sink_class.from_settings(config, name, settings,
                                    config.follower_topics(name) if topics is None else topics)
