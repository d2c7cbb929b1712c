"""Connectors: what every source database's connector promises the capture runner.

A connector (``connectors/postgres/``, ``connectors/mysql/``) captures one leader database. It
has two sources that emit through one dispatcher (:mod:`cdc.pipeline`) into the change log, run by
:mod:`cdc.coordinator`: a :class:`SnapshotSource` (``cdc bootstrap``) and a
:class:`StreamingSource` (``cdc capture``). Where it stands is a typed
:class:`~cdc.offsets.SourceOffset`; where each change came from is its
:class:`~cdc.position.Position` (outside the value) and the envelope's ``source`` block
(:class:`EnvelopeSource`, inside it). ``cdc verify`` reads the leader through a :class:`Leader`;
``cdc status`` asks :meth:`Connector.status`.

Connectors are found by their ``kind`` (the ``kind`` of a ``sources:`` entry) through the
``cdc.connectors`` entry points (``pyproject.toml``), so the core never imports one.

Contracts, stated exactly:

* **Snapshot.** :meth:`SnapshotSource.check` does every check that can refuse *before* anything
  changes (in the log or on the server). After :meth:`SnapshotSource.open`, the rows of every
  table are read in one consistent snapshot of the database, and
  :meth:`SnapshotSource.resume_offset` is the point in the source's log that snapshot
  describes: every transaction committed before it is in the snapshot, every one after it is
  streamed. Snapshot rows get op ``r`` and positions that sort *before* every streamed change of
  the same source.
* **Stream.** :meth:`StreamingSource.items` yields changes in commit order and, after the last
  change of each transaction, a :class:`Checkpoint` whose offset points *just past* that
  transaction (the resume point, see :mod:`cdc.offsets`). Changes between two checkpoints are
  one or more whole transactions; nothing is yielded for a transaction that ends at or before
  the offset the stream was started from. ``None`` means "nothing arrived for a while": the
  runner flushes then.
* **Confirm only what is durable.** The runner calls :meth:`StreamingSource.confirm` with an
  offset only after the log holds every record yielded before that offset's checkpoint. A
  connector tells its server nothing earlier (PostgreSQL's slot, a MySQL heartbeat table ...),
  so a crash at any instant loses nothing: the server sends again whatever was not confirmed,
  and a change sent again carries the same position and content as its first copy.
* **Batches.** A source may yield an :class:`EncodedBatch` instead of one
  :class:`~cdc.events.ChangeEvent` per change: its records are already encoded (key, value,
  position), in position order, for row changes only (c/u/d/r and a delete's tombstone). A
  TRUNCATE is always a :class:`~cdc.events.ChangeEvent`, and so is any change whose image must
  be completed from the log (PostgreSQL's unchanged TOAST values) — unless the source completes
  it itself through :meth:`StreamingSource.use_previous_images`, every missing value found, and
  writes exactly the record the event path would.
* **Errors.** Exceptions in :meth:`Connector.retryable` mean "the server or network went away":
  the runner discards what it buffered (never confirmed), waits with backoff and streams again
  from the stored offset. Any other exception stops capture of that source; a
  :class:`~cdc.errors.CdcError` says what is wrong and how to fix it.
* **Heartbeats.** :meth:`StreamingSource.heartbeat` is called every ``heartbeat_interval`` while
  streaming. It makes the server put something into its own log that the stream then yields as
  a :class:`Checkpoint`, so an idle source's stored offset (and what the server retains for
  it) still moves.
* **Incremental snapshots.** A streaming session that is also an
  :class:`IncrementalSnapshotSource` takes them (its class states their contract); capture
  and ``cdc snapshot`` check for that type, never for methods.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from cdc.errors import ConfigError
from cdc.events import ChangeEvent, TableId, TableSchema
from cdc.offsets import SourceOffset
from cdc.position import Position
from cdc.preflight import Part, Step, Warn

if TYPE_CHECKING:
    from cdc.avro import EventCodec
    from cdc.columns import ColumnPolicies
    from cdc.config import SourceConfig
    from cdc.log.base import Record


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Everything yielded before this is whole transactions, complete up to ``offset``."""

    offset: SourceOffset


@dataclass(slots=True)
class EncodedBatch:
    """Row changes a source encoded itself (see the module doc, *Batches*).

    ``records`` go to the log as they are, in order; ``schemas`` are the tables they belong to
    (their topics are created first). ``events`` counts the changes (a delete and its tombstone
    are one). ``offset``: when not None, the batch ends a transaction and everything in it is
    complete up to ``offset`` (as if a :class:`Checkpoint` followed).
    """

    records: list[Record]
    schemas: Sequence[TableSchema]
    events: int
    last_position: Position | None = None
    offset: SourceOffset | None = None
    #: the source always sends whole rows for these tables (no change of theirs will ever
    #: need a previous image), so the dispatcher need not remember the images
    whole_rows: bool = False
    #: the id of the source transaction the records belong to (None: snapshot rows)
    transaction: str | None = None
    #: that transaction's commit time at the source (ms since the epoch)
    ts_ms: int = 0


@dataclass(frozen=True, slots=True)
class Watermark:
    """The stream passed a watermark capture wrote
    (:meth:`IncrementalSnapshotSource.watermark`), in commit order. ``position(i)`` is the
    position of the ``i``-th (from 1) record capture adds at this point: after everything
    yielded before the watermark, before everything after it."""

    payload: str
    position: Callable[[int], Position]


StreamItem = ChangeEvent | EncodedBatch | Checkpoint | Watermark | None


@dataclass(frozen=True)
class EnvelopeSource:
    """The connector's part of the envelope: Debezium's ``source`` block.

    ``schema`` is the Avro record of the block (Debezium's field names and types);
    ``defaults(table_schema)`` the values of its fields before the event's own
    ``source_info`` is laid over them. For the codec's fast path, ``varying`` names the two
    fields that change with every event — an optional string, then an optional long — with every
    other field cached per table, commit time and transaction; ``()`` turns the fast path off
    (the connector then encodes in batches, or every event takes the general path).
    """

    connector: str
    schema: dict[str, Any]
    defaults: Callable[[TableSchema], dict[str, Any]]
    varying: tuple[str, ...] = ()
    #: the keys ``source_info`` may hold for the fast path to apply
    fast_keys: frozenset[str] = frozenset()


class SnapshotSource(ABC):
    """The consistent read of every captured table that starts a source (``cdc bootstrap``).

    ``with connector.snapshot() as snap: snap.check(); snap.open(); for t in snap.tables:
    snap.rows(t)``; then store :meth:`resume_offset` with the last rows."""

    tables: dict[TableId, TableSchema]
    #: the offset this log committed for the source before this bootstrap (None: a new log),
    #: set before :meth:`check`. It says what on the server is *ours*: a snapshot replaces only
    #: what that offset names (a replication slot) and refuses, in :meth:`check`, to touch
    #: anything else (another tool's slot of the same name)
    stored: SourceOffset | None = None

    @abstractmethod
    def check(self) -> dict[TableId, TableSchema]:
        """Every check that can refuse (server settings, privileges, tables, keys, ownership
        of what the snapshot would replace), before anything changes; the schema of each
        captured table."""

    @abstractmethod
    def open(self) -> str:
        """Start the consistent snapshot; a line saying where it stands (for the console)."""

    @abstractmethod
    def estimate_rows(self, table: TableId) -> int | None:
        """How many rows ``table`` holds in the snapshot, for progress bars (None: unknown)."""

    @abstractmethod
    def rows(self, table: TableId) -> Iterator[ChangeEvent | EncodedBatch]:
        """Every row of ``table`` in the snapshot as op ``r``, streamed (never all in memory)."""

    @abstractmethod
    def vanished_position(self) -> Position:
        """A new snapshot position for a record the runner makes itself: the tombstone of a
        key the log holds that the snapshot did not see."""

    @abstractmethod
    def resume_offset(self) -> SourceOffset:
        """Where streaming starts: the snapshot's point in the source's log (state streaming)."""

    def warnings(self) -> list[str]:
        """Things the user should know that do not stop the bootstrap."""
        return []

    def use_column_rules(self, columns: ColumnPolicies) -> None:
        """Offered by the runner before :meth:`rows`: its column rules, as for
        :meth:`StreamingSource.use_column_rules`. The default ignores the offer."""
        return None

    @abstractmethod
    def close(self) -> None:
        """End the snapshot transaction and close connections. Safe to call twice."""

    def __enter__(self) -> SnapshotSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StreamingSource(ABC):
    """A live session streaming changes from a stored offset (``cdc capture``)."""

    @abstractmethod
    def items(self, idle_timeout: float) -> Iterator[StreamItem]:
        """Changes, batches and checkpoints in commit order; ``None`` after ``idle_timeout``
        seconds without any (see the module doc)."""

    @abstractmethod
    def confirm(self, offset: SourceOffset) -> None:
        """``offset`` is durable in the log: the server may forget what precedes it."""

    @abstractmethod
    def heartbeat(self) -> None:
        """Make the server write something the stream yields as a checkpoint."""

    def describe(self) -> str:
        """Where the stream started, for the log."""
        return ""

    def use_previous_images(self, previous: Callable[[str, bytes, bytes], bytes | None]
                            ) -> None:
        """Offered by the runner before :meth:`items`: ``previous(topic, key, position)`` is
        the value (as logged) of ``key``'s latest record before ``position`` (a position's
        bytes) in the log and in everything yielded and consumed so far; None when there is
        none (unknown key, or deleted). Records a source encodes itself but has not yielded yet
        are not in it: the source looks those up itself. The default ignores the offer."""
        return None

    def use_column_rules(self, columns: ColumnPolicies) -> None:
        """Offered by the runner before :meth:`items`: its column rules. A source may then
        encode rows of tables with rules itself, as :meth:`cdc.columns.TablePolicy.schema` and
        its transforms make them, in that policy's output schema (the only one the runner
        accepts for such a table). The default ignores the offer: those tables' changes come
        as events."""
        return None

    @abstractmethod
    def close(self) -> None:
        """End the session (after the last confirm), releasing what the server holds for it."""


class IncrementalSnapshotSource(ABC):
    """What a :class:`StreamingSource` also implements to take incremental snapshots
    (:mod:`cdc.incremental`: a table read in key-ordered chunks while the stream goes on, each
    chunk between two watermarks). Capture runs them only for a session that is an instance
    of this class, and ``cdc snapshot`` refuses a source whose connector's
    :meth:`Connector.stream_type` is not a subclass of it.

    Contracts, stated exactly:

    * **Between items.** Capture calls these methods on the session whose
      :meth:`StreamingSource.items` it is iterating, in its own thread, while that iteration
      is suspended between two items; they may use the session's connections, never consume
      its stream.
    * **Watermarks in commit order.** What :meth:`watermark` writes comes back from the same
      session's :meth:`StreamingSource.items` as one :class:`Watermark` (and again after a
      resume from an offset before it, like any change). Every change committed before the
      call started is yielded before it, every change committed after the call returned after
      it; one committed while the call runs may be yielded on either side.
    * **Chunks are read now.** :meth:`chunk` and :meth:`absent` read committed data as of one
      moment between their call and their return. So, called between a low and a high
      watermark, what they read reflects every change yielded before the low one, and every
      change it does not reflect is yielded after the low one.
    * **Paging.** ``after`` is opaque to the caller: None for the first chunk, then the
      ``last`` the previous chunk returned (stored in the source offset as JSON). A chunk
      holds the rows whose key is *strictly* greater than ``after`` in the table's key order;
      its ``last`` is None exactly when it holds fewer than ``size`` rows, so a table of
      ``k * size`` rows ends with an empty chunk.
    * **Errors.** A :class:`~cdc.errors.CdcError` means the table cannot be snapshotted: its
      snapshot stops with the error, capture and the other tables go on. The connector's
      :meth:`Connector.retryable` exceptions reconnect as usual (the open chunk is read again).
    """

    @abstractmethod
    def watermark(self, payload: str) -> None:
        """Write ``payload`` into the source's own log now, committed on its own (the stream
        yields it back as a :class:`Watermark`, see the class doc)."""

    @abstractmethod
    def chunk(self, table: TableId, after: Sequence[str] | None, size: int
              ) -> tuple[TableSchema, list[ChangeEvent | Record], list[str] | None]:
        """Up to ``size`` rows of ``table`` whose key is greater than ``after``, in key order
        (see *Paging*): the table's schema, one item per row, and the last row's key texts
        (None when fewer than ``size`` rows were left).

        An item is an op ``r`` event, or the row's finished log record (a source that encodes
        rows itself, as :class:`EncodedBatch` es do: then the schema returned is the one the
        records are logged in). Either way the position is a placeholder the caller replaces
        (an event's ``position``, a record's ``position`` field): a record's value does not
        depend on it."""

    @abstractmethod
    def estimate_rows(self, table: TableId) -> int | None:
        """About how many rows ``table`` has (progress and ETA only), or None: unknown."""

    @abstractmethod
    def schema_of(self, table: TableId) -> TableSchema:
        """``table``'s schema as this session knows it now (the one its tombstones get)."""

    @abstractmethod
    def absent(self, table: TableId, keys: Sequence[bytes]) -> list[bytes]:
        """Those of ``keys`` (log key bytes: the key's JSON text) that no row of ``table`` has
        now, in any order."""


@dataclass(frozen=True)
class Chunk:
    """One key-ordered chunk of a leader table for ``cdc verify``: its keys' JSON texts in key
    order, their rows' checksum (:func:`cdc.verify.row_digest_text` per row, MD5 of them
    concatenated), and the key values bounding it, ``(after, last]`` (``after`` None: from the
    table's start). Bounds are the leader's own (opaque to the core)."""

    keys: list[str]
    checksum: str
    after: tuple[object, ...] | None
    last: tuple[object, ...]


@dataclass(frozen=True)
class Target:
    """A point in the source's log that ``cdc verify`` waits for, as an offset order."""

    order: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class TextComparison:
    """How the leader compares one text column, where it differs from a view's state."""

    #: its collation, as the leader names it
    collation: str
    #: False: equal exactly when the bytes are (PostgreSQL's deterministic collations);
    #: True: equality differs too (case-insensitive, accent-insensitive or PAD SPACE:
    #: MariaDB's ``_ci`` and ``utf8mb4_bin``, PostgreSQL's nondeterministic collations)
    loose: bool
    #: ordered otherwise than by code point (a locale's order: libc's, ICU's)
    ordered: bool = True
    #: ``upper``/``lower`` change ASCII letters only (PostgreSQL's ``C`` and ``POSIX``)
    ascii_case: bool = False
    #: an ICU collation's locale (``und``, ``de-DE``): a view's state may order by it
    #: (``views/definition.py``); empty for any other collation
    icu_locale: str = ""


class Leader(ABC):
    """The leader database as ``cdc verify`` reads it: now, in key order, summarised in SQL."""

    name: str

    @abstractmethod
    def target(self) -> Target:
        """Mark the source's log *now*: every transaction committed before this call ends at or
        before the target, and capture checkpoints to at least it once it has read the mark,
        even when the captured tables are idle."""

    @abstractmethod
    def estimate_rows(self, table: TableId) -> int | None:
        """A row count estimate for progress bars."""

    @abstractmethod
    def columns(self, table: TableId) -> tuple[str, ...]:
        """The table's columns now, in table order (the checksum's column order)."""

    def inexact(self, table: TableId) -> tuple[str, ...]:
        """Columns whose canonical text SQL cannot always reproduce (chunks holding them may
        differ by checksum and are then compared by rows)."""
        return ()

    @abstractmethod
    def chunks(self, table: TableId, size: int) -> Iterator[Chunk]:
        """Every row in key order, ``size`` rows per chunk (keyset pagination)."""

    @abstractmethod
    def rows(self, table: TableId, chunk: Chunk) -> dict[str, dict[str, Any]]:
        """The rows now in ``chunk``'s key range: ``{key JSON text: row in JSON form}``,
        decoded exactly as the snapshot decodes rows. The authority when checksums differ."""

    @abstractmethod
    def absent(self, table: TableId, keys: Sequence[str]) -> list[str]:
        """Those of ``keys`` (key JSON texts) that no row of ``table`` has now."""

    def query(self, sql: str, time_zone: str = "UTC") -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one read-only query (a view's SQL, or ``EXPLAIN`` of it) now, in a session whose
        time zone is ``time_zone`` (an IANA name): its column names and rows, as the database
        driver gives them, zoned values in that zone (a :class:`CdcError` naming the problem
        on failure)."""
        raise NotImplementedError(f"source {self.name}: this connector runs no queries")

    def text_comparisons(self, table: TableId) -> dict[str, TextComparison]:
        """The text columns of ``table`` that the leader does not compare or case-map as a
        view's state does (code point by code point, blanks kept; Unicode's upper and lower
        case), by column; the others are absent."""
        return {}

    @abstractmethod
    def close(self) -> None: ...


@dataclass
class ServerStatus:
    """What the server says about a source, for ``cdc status``: ``fields`` are shown as they
    are (e.g. slot, confirmed LSN, lag bytes), ``warnings`` printed under the table."""

    fields: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


class Connector(ABC):
    """One configured source of one kind. Cheap to make: it connects only when asked."""

    #: the ``kind`` of its ``sources:`` entries
    kind: ClassVar[str]
    #: its offset type
    offset_type: ClassVar[type[SourceOffset]]

    def __init__(self, config: SourceConfig) -> None:
        self.config = config
        self.name = config.name

    @classmethod
    def envelope(cls) -> EnvelopeSource:
        """The envelope's ``source`` block of this connector's events."""
        raise NotImplementedError

    @classmethod
    def stream_type(cls) -> type[StreamingSource]:
        """The class of the sessions :meth:`stream` returns: an
        :class:`IncrementalSnapshotSource` too when they take incremental snapshots (so
        ``cdc snapshot`` can refuse before any stream exists)."""
        return StreamingSource

    @abstractmethod
    def snapshot(self, codec: EventCodec | None = None) -> SnapshotSource:
        """A snapshot source (not yet checked or opened); ``codec`` as for :meth:`stream`."""

    @abstractmethod
    def stream(self, offset: SourceOffset, codec: EventCodec | None = None) -> StreamingSource:
        """A streaming session resuming after ``offset`` (see the module doc). It checks that
        the server can still serve from ``offset`` and refuses (naming the fix, usually a new
        bootstrap) when it cannot: a slot or binlog that is gone, a server that changed.

        ``codec``: the runner's codec, for a source that yields :class:`EncodedBatch` es: it
        registers each table schema with ``codec.table(schema)`` (thread-safe) and writes
        values in that schema id's envelope; without one it yields change events only."""

    @abstractmethod
    def bootstrapping_offset(self) -> SourceOffset:
        """The offset committed before a snapshot starts (state ``bootstrapping``)."""

    def load_offset(self, data: dict[str, Any]) -> SourceOffset:
        return self.offset_type.load(data)

    def retryable(self) -> tuple[type[BaseException], ...]:
        """Exceptions meaning the server or the network went away (see the module doc)."""
        return ()

    @abstractmethod
    def status(self, stored: SourceOffset | None) -> ServerStatus:
        """The server's view of this source (raising :class:`~cdc.errors.CdcError` if it
        cannot be reached)."""

    @abstractmethod
    def leader(self) -> Leader:
        """The leader as ``cdc verify`` reads it (connected; close it when done)."""

    def drop(self, stored: SourceOffset | None) -> list[str]:
        """Remove what capture keeps on the source's server for this log (``cdc source drop``)
        and name what went. Only what this log made goes — ``stored`` is the log's offset of
        the source (None: it never bootstrapped it); another tool's slot is refused, naming
        it — and nothing while a capture streams from the server (refused with the fix).
        Nothing by default: a kind that keeps nothing on the server."""
        return []

    def preflight(self, stored: SourceOffset | None, log_read: bool = True) -> Part:
        """What ``cdc check-config --connect`` asks of this source, creating nothing (the
        contract of :mod:`cdc.preflight`): the server reached and its version, its settings for
        capture, the role's privileges, the slot (or server id) free or this log's own —
        ``stored`` is the log's offset of the source, None when the log holds none or, with
        ``log_read`` False, when the log could not be read (a slot that exists is then
        reported as unknown, not as another tool's) — and every table and its key. A kind
        without checks of its own says so, failing nothing."""
        return Part(f"source {self.name}", [Step(
            "checks", lambda: Warn(f"a {self.config.kind} source has no preflight checks"))])


# ------------------------------------------------------------------------------ the registry

def connector_class(kind: str) -> type[Connector]:
    """The connector class of source kind ``kind`` (its settings model names it);
    :class:`ConfigError` for an unknown kind or a broken plugin."""
    from cdc import config, plugins

    model = config.source_kinds().get(kind)
    if model is None:
        known = ", ".join(config.source_kinds()) or "none (is the project installed?)"
        raise ConfigError(f"no connector for source kind {kind!r} (known: {known})",
                          "correct the source's `kind:`, or reinstall the project "
                          "(pip install -e .) so its connectors are registered")
    found: type[Connector] = plugins.implementation(model.connector, Connector, kind)
    return found


def connector_for(config: SourceConfig) -> Connector:
    """The connector of one configured source."""
    return connector_class(config.kind)(config)


@functools.cache
def envelope_source(connector: str) -> EnvelopeSource:
    """The :class:`EnvelopeSource` whose Debezium connector name is ``connector``
    (``postgresql``, ``mysql``), looked up among the registered connectors."""
    from cdc.config import source_kinds

    for kind in source_kinds():
        spec = connector_class(kind).envelope()
        if spec.connector == connector:
            return spec
    raise ConfigError(f"no registered connector writes envelopes of connector {connector!r}",
                      "reinstall the project (pip install -e .)")
