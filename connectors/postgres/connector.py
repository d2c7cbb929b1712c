"""The PostgreSQL connector on the source contract (:mod:`cdc.source`).

It puts together what the rest of this package knows — pgoutput and its offsets (``source.py``),
the exported snapshot (``snapshot.py``), the slot and the catalog (``catalog.py``), the leader's
checksums (``checksum.py``) — behind :class:`PostgresConnector`, registered for
``kind: postgres`` in ``pyproject.toml``'s ``cdc.connectors`` entry points.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg

from cdc.avro import EventCodec, fixed_schema
from cdc.config import SourceConfig
from cdc.errors import ConfigError
from cdc.events import ChangeEvent, TableId, TableSchema
from cdc.offsets import BOOTSTRAPPING, SourceOffset
from cdc.position import Position, format_lsn
from cdc.preflight import Part
from cdc.source import (
    Connector,
    EncodedBatch,
    EnvelopeSource,
    Leader,
    ServerStatus,
    SnapshotSource,
    StreamingSource,
)
from connectors.postgres import catalog
from connectors.postgres.connection import SourceError, SourceUnavailable
from connectors.postgres.replication import ReplicationError, quote_ident
from connectors.postgres.settings import PostgresSourceConfig
from connectors.postgres.snapshot import SnapshotSession
from connectors.postgres.source import (
    PostgresOffset,
    PostgresSource,
    PostgresStream,
    owned_slot,
)

if TYPE_CHECKING:
    from cdc.columns import ColumnPolicies


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

    def __init__(self, config: SourceConfig) -> None:
        super().__init__(config)
        self.pg_config = _pg_config(config)

    @classmethod
    def envelope(cls) -> EnvelopeSource:
        return ENVELOPE

    def snapshot(self, codec: EventCodec | None = None) -> SnapshotSource:
        return PostgresSnapshot(self.pg_config, codec)

    @classmethod
    def stream_type(cls) -> type[PostgresStream]:
        return PostgresStream

    def stream(self, offset: SourceOffset, codec: EventCodec | None = None) -> StreamingSource:
        assert isinstance(offset, PostgresOffset)
        config = self.pg_config
        stream = PostgresSource(config).stream(offset, self.leader, codec)
        try:
            _check_slot(config, stream.catalog_conn, offset.lsn)
            # a table newly added to `tables` joins the stream before its incremental snapshot
            catalog.ensure_publication(stream.catalog_conn, config.publication_name,
                                       stream.source.tables)
        except BaseException:
            stream.close()
            raise
        return stream

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

    def drop(self, stored: SourceOffset | None) -> list[str]:
        config = self.pg_config
        slot, publication = config.slot_name, config.publication_name
        ours = owned_slot(stored) == slot
        dropped = []
        with PostgresSource(config).connect() as conn:
            info = catalog.slot_info(conn, slot)
            if info is not None and not ours:
                raise SourceError(
                    f"source {self.name!r}: replication slot {slot!r} was not created by this "
                    "log (another tool's, or a log that is gone): cdc leaves it alone",
                    "if nothing reads from it any more, drop it yourself: SELECT "
                    f"pg_drop_replication_slot('{slot}')")
            if info is not None and info.active:
                raise SourceError(f"source {self.name!r}: slot {slot!r} is in use: a capture "
                                  "streams from it", f"stop `cdc capture` of {self.name} first")
            if info is not None:
                catalog.drop_slot(conn, slot)
                dropped.append(f"replication slot {slot}")
            exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s",
                                  (publication,)).fetchone()
            if exists and isinstance(stored, PostgresOffset):
                conn.execute(f"DROP PUBLICATION {quote_ident(publication)}")
                dropped.append(f"publication {publication}")
        return dropped

    def preflight(self, stored: SourceOffset | None, log_read: bool = True) -> Part:
        from connectors.postgres.preflight import preflight_part

        return preflight_part(self.pg_config, stored, log_read)

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
        stored = self.stored
        self.session.owned_slot = owned_slot(stored)
        self.tables = {t: c.schema for t, c in self.session.check().items()}
        return self.tables

    def open(self) -> str:
        self.session.open()
        return (f"slot {self.config.slot_name} created at "
                f"{format_lsn(self.session.consistent_lsn)}")

    def estimate_rows(self, table: TableId) -> int | None:
        return self.session.estimate_rows(table)

    def use_column_rules(self, columns: ColumnPolicies) -> None:
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
