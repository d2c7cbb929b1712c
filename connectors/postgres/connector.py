"""The PostgreSQL connector on the source contract (:mod:`cdc.source`).

It puts together what the rest of this package knows — pgoutput (``source.py``), the exported
snapshot (``snapshot.py``), the slot and the catalog (``catalog.py``), the leader's checksums
(``checksum.py``) — behind :class:`PostgresConnector`, registered for ``kind: postgres`` in
``pyproject.toml``'s ``cdc.connectors`` entry points.

Offsets (:class:`PostgresOffset`): ``lsn`` is the end LSN of the last transaction (or heartbeat
message) whose changes are all in the log; streaming resumes *after* it: a transaction whose
commit LSN is below it is skipped.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc.avro import EventCodec, fixed_schema
from cdc.config import SourceConfig
from cdc.errors import CdcError, ConfigError
from cdc.events import ChangeEvent, TableId, TableSchema
from cdc.log.base import Record
from cdc.offsets import BOOTSTRAPPING, SourceOffset
from cdc.position import Position, format_lsn
from cdc.source import (
    Checkpoint,
    Connector,
    EncodedBatch,
    EnvelopeSource,
    Leader,
    ServerStatus,
    SnapshotSource,
    StreamingSource,
    StreamItem,
)
from connectors.postgres import catalog
from connectors.postgres.connection import SourceError, SourceUnavailable
from connectors.postgres.replication import ReplicationError
from connectors.postgres.settings import PostgresSourceConfig
from connectors.postgres.snapshot import SnapshotSession
from connectors.postgres.source import HEARTBEAT_PREFIX, PostgresSource, PostgresStream
from connectors.postgres.source import Checkpoint as PgCheckpoint

log = logging.getLogger("cdc.capture")


@dataclass(frozen=True, kw_only=True)
class PostgresOffset(SourceOffset):
    """Where a PostgreSQL source stands: resume after ``lsn`` (see the module doc)."""

    kind = "postgres"

    lsn: int = 0
    slot: str = ""
    #: the consistent point of the snapshot the source was bootstrapped from
    snapshot_lsn: str | None = None
    #: when the bootstrap started (ms since the epoch), while bootstrapping
    started_ms: int | None = None

    def order(self) -> tuple[int, ...]:
        return (self.lsn,)

    def describe(self) -> str:
        return format_lsn(self.lsn)


def _source_defaults(schema: TableSchema) -> dict[str, Any]:
    return {"schema": schema.table.schema, "table": schema.table.table, "txId": None,
            "lsn": None, "xmin": None}


ENVELOPE = EnvelopeSource(
    connector="postgresql", schema=fixed_schema("source.postgresql.avsc"),
    defaults=_source_defaults, varying=("sequence", "lsn"),
    fast_keys=frozenset({"txId", "lsn", "xmin", "snapshot", "sequence"}))


def _pg_config(config: SourceConfig) -> PostgresSourceConfig:
    if not isinstance(config, PostgresSourceConfig):
        raise ConfigError(f"source {config.name!r} is not a PostgreSQL source",
                          "set its `kind:` to postgres")
    return config


class PostgresConnector(Connector):
    """``kind: postgres``: pgoutput over a replication slot, snapshots from its exported
    snapshot."""

    kind = "postgres"
    offset_type = PostgresOffset
    incremental_snapshots = True

    def __init__(self, config: SourceConfig) -> None:
        super().__init__(config)
        self.pg_config = _pg_config(config)

    @classmethod
    def envelope(cls) -> EnvelopeSource:
        return ENVELOPE

    def snapshot(self, codec: EventCodec | None = None) -> SnapshotSource:
        return PostgresSnapshot(self.pg_config, codec)

    def stream(self, offset: SourceOffset, codec: EventCodec | None = None) -> StreamingSource:
        assert isinstance(offset, PostgresOffset)
        return PostgresStreaming(self.pg_config, offset, codec)

    def bootstrapping_offset(self) -> SourceOffset:
        return PostgresOffset(state=BOOTSTRAPPING, slot=self.pg_config.slot_name,
                              started_ms=int(time.time() * 1000))

    def retryable(self) -> tuple[type[BaseException], ...]:
        return (SourceUnavailable, ReplicationError, psycopg.OperationalError,
                psycopg.InterfaceError)

    def status(self, stored: SourceOffset | None) -> ServerStatus:
        from connectors.postgres.status import slot_status

        fields = slot_status(self.pg_config)
        warnings = []
        if not fields.get("slot_exists", True):
            warnings.append(f"replication slot {self.pg_config.slot_name} is missing: run "
                            f"`cdc bootstrap --source {self.name}` again")
        retained = int(fields.get("retained_bytes") or 0)
        if retained > self.pg_config.warn_retained_wal:
            warnings.append(f"the slot retains {_bytes(retained)} of WAL; start `cdc capture` "
                            "so it can advance")
        return ServerStatus({"slot": self.pg_config.slot_name, **fields,
                             "position": fields.get("confirmed_lsn"),
                             "lag_bytes": fields.get("lag_bytes"),
                             "retained_bytes": fields.get("retained_bytes")}, warnings)

    def leader(self) -> Leader:
        from connectors.postgres.checksum import PostgresLeader

        return PostgresLeader(self.pg_config)


def _bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024:
            return f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} TB"


class PostgresSnapshot(SnapshotSource):
    """A fresh slot and its exported snapshot (``snapshot.py`` states the contract)."""

    def __init__(self, config: PostgresSourceConfig, codec: EventCodec | None = None) -> None:
        self.config = config
        self.session = SnapshotSession(PostgresSource(config), codec)
        self.tables: dict[TableId, TableSchema] = {}

    def check(self) -> dict[TableId, TableSchema]:
        self.tables = {t: c.schema for t, c in self.session.check().items()}
        return self.tables

    def open(self) -> str:
        self.session.open()
        return (f"slot {self.config.slot_name} created at "
                f"{format_lsn(self.session.consistent_lsn)}")

    def estimate_rows(self, table: TableId) -> int | None:
        return self.session.estimate_rows(table)

    def use_column_rules(self, columns: Any) -> None:
        self.session.columns = columns

    def rows(self, table: TableId) -> Iterator[ChangeEvent | EncodedBatch]:
        return self.session.rows(table)

    def vanished_position(self) -> Position:
        return Position.postgres(self.session.consistent_lsn, self.session.next_row_number(),
                                 snapshot=True)

    def resume_offset(self) -> SourceOffset:
        lsn = self.session.consistent_lsn
        return PostgresOffset(lsn=lsn, slot=self.config.slot_name, snapshot_lsn=format_lsn(lsn))

    def close(self) -> None:
        self.session.close()


class PostgresStreaming(StreamingSource):
    """A ``START_REPLICATION`` session from a stored offset, after checking the slot."""

    def __init__(self, config: PostgresSourceConfig, offset: PostgresOffset,
                 codec: EventCodec | None = None) -> None:
        self.config = config
        self.offset = offset
        self.pg = PostgresSource(config).stream(offset.lsn, status_interval=5.0, codec=codec)
        self._leader: Any = None
        try:
            _check_slot(config, self.pg.catalog_conn, offset.lsn)
            # a table newly added to `tables` joins the stream before its incremental snapshot
            catalog.ensure_publication(self.pg.catalog_conn, config.publication_name,
                                       self.pg.source.tables)
        except BaseException:
            self.pg.close()
            raise

    def describe(self) -> str:
        return format_lsn(self.offset.lsn)

    def items(self, idle_timeout: float) -> Iterator[StreamItem]:
        base, checkpoint = self.offset, PgCheckpoint
        for item in self.pg.events(idle_timeout=idle_timeout):
            if item.__class__ is checkpoint:
                yield Checkpoint(base.replace(lsn=item.lsn))  # type: ignore[union-attr]
            else:
                yield item  # type: ignore[misc]

    def use_previous_images(self, previous: Callable[[str, bytes, bytes], bytes | None]
                            ) -> None:
        self.pg.previous = previous

    def use_column_rules(self, columns: Any) -> None:
        self.pg.columns = columns

    def confirm(self, offset: SourceOffset) -> None:
        assert isinstance(offset, PostgresOffset)
        self.pg.confirm(offset.lsn)  # only now: the log holds everything up to it

    def watermark(self, payload: str) -> None:
        self.pg.watermark(payload)

    def chunk(self, table: TableId, after: Sequence[str] | None, size: int
              ) -> tuple[TableSchema, list[ChangeEvent | Record], list[str] | None]:
        return self.pg.chunk(table, after, size)

    def absent(self, table: TableId, keys: Sequence[bytes]) -> list[bytes]:
        if self._leader is None:
            from connectors.postgres.checksum import PostgresLeader

            self._leader = PostgresLeader(self.config)
        gone = self._leader.absent(table, [key.decode() for key in keys])
        return [text.encode() for text in gone]

    def estimate_rows(self, table: TableId) -> int | None:
        return self.pg.source.count_rows(self.pg.catalog_conn, table) or None

    def schema_of(self, table: TableId) -> TableSchema:
        return self.pg.captured[table].schema

    def heartbeat(self) -> None:
        self.pg.catalog_conn.execute("SELECT pg_logical_emit_message(false, %s, %s)",
                                     (HEARTBEAT_PREFIX, str(int(time.time() * 1000))))

    def close(self) -> None:
        if self._leader is not None:
            with contextlib.suppress(Exception):
                self._leader.close()
        _close(self.pg)


def _check_slot(config: PostgresSourceConfig, conn: psycopg.Connection[Any],
                stored_lsn: int) -> None:
    """Refuse to stream when the slot cannot serve from ``stored_lsn``."""
    name, slot = config.name, config.slot_name
    info = catalog.slot_info(conn, slot)
    again = f"run `cdc bootstrap --source {name}` again: it re-snapshots the tables " \
            "and tombstones keys deleted meanwhile"
    if info is None:
        raise SourceError(f"source {name!r}: replication slot {slot!r} no longer exists "
                          "(dropped while capture was stopped?), so changes made since "
                          "are gone from the WAL", again)
    if info.plugin != "pgoutput":
        raise SourceError(f"source {name!r}: slot {slot!r} uses plugin {info.plugin!r}, "
                          "not pgoutput", f"drop it, then {again}")
    if info.wal_status == "lost":
        raise SourceError(f"source {name!r}: slot {slot!r} lost WAL it needed "
                          "(max_slot_wal_keep_size exceeded)", again)
    if info.confirmed_flush_lsn is not None and info.confirmed_flush_lsn > stored_lsn:
        raise SourceError(
            f"source {name!r}: slot {slot!r} was advanced to "
            f"{format_lsn(info.confirmed_flush_lsn)} past the log's {format_lsn(stored_lsn)} "
            "by another consumer, so changes in between are lost", again)


def _close(stream: PostgresStream, timeout: float = 5.0) -> None:
    """Close the replication connection, wait (up to ``timeout`` s) until the server's walsender
    has let go of the slot, then close the rest.

    The walsender notices the closed socket asynchronously; without the wait, a capture that
    exited 0 could still show its slot ``active`` for a moment, and a capture restarted at once
    would be refused with "replication slot ... is active for PID ...". Before that, the
    stream is ended with ``CopyDone`` so the last confirmation is read, not reset away.
    """
    try:
        walsender = stream.replication_conn.info.backend_pid
        with contextlib.suppress(CdcError, psycopg.Error, OSError):
            if not stream.stream.finish(timeout / 2):
                log.info("the server did not end the stream within %.1f s; closing it", timeout / 2)
        stream.replication_conn.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and stream.catalog_conn.execute(
                "SELECT 1 FROM pg_replication_slots WHERE active_pid = %s",
                (walsender,)).fetchone():
            time.sleep(0.02)
    except (psycopg.Error, OSError) as exc:  # a broken connection: nothing to wait for
        log.debug("closing the stream: %s", exc)
    finally:
        stream.close()

