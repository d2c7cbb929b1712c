"""The snapshot half of a bootstrap: a fresh slot and a consistent read of every table in it.

Contract, stated exactly:

* :meth:`SnapshotSession.open` drops the source's slot if it exists and creates it again with
  ``EXPORT_SNAPSHOT``; a second connection imports that snapshot *before the replication
  connection runs anything else*, so the rows it reads are exactly the database as of the slot's
  consistent point. A new snapshot is never paired with an old slot.
* Every snapshot row's position is ``(consistent point, snapshot, n)`` with ``n`` counting from 1
  across all tables; streaming from the slot yields only transactions that commit after the
  consistent point, whose positions sort after every snapshot row.
* :meth:`SnapshotSession.resume_offset` is the source offset to store once every row is durable:
  streaming resumes *after* the consistent point.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from cdc.avro import EventCodec
from cdc.events import ChangeEvent, TableId
from cdc.position import format_lsn
from cdc.source import EncodedBatch
from connectors.postgres import catalog
from connectors.postgres.connection import SourceError
from connectors.postgres.source import CapturedTable, PostgresSource


class SnapshotSession:
    """``with SnapshotSession(source) as snap: for table in snap.tables: snap.rows(table)``."""

    def __init__(self, source: PostgresSource, codec: EventCodec | None = None) -> None:
        self.source = source
        self.codec = codec
        #: the runner's column rules (SnapshotSource.use_column_rules), applied by the
        #: compiled COPY loop as the dispatcher would
        self.columns: Any = None
        self.consistent_lsn = 0
        self.snapshot_name = ""
        self.ts_ms = 0
        self.tables: dict[TableId, CapturedTable] = {}
        self._catalog: psycopg.Connection[Any] | None = None
        self._replication: psycopg.Connection[Any] | None = None
        self._reader: psycopg.Connection[Any] | None = None
        self._row_number = 0
        #: the slot this log's stored offset names (it committed that name before creating
        #: the slot): the only existing slot :meth:`open` may drop and recreate
        self.owned_slot: str | None = None

    def check(self) -> dict[TableId, CapturedTable]:
        """Validate server, role, tables and keys and set up the publication; no slot yet.
        An existing slot of the configured name is refused unless it is :attr:`owned_slot`."""
        self._catalog = self.source.connect()
        self.tables = self.source.check(self._catalog)
        slot = self.source.config.slot_name
        existing = catalog.slot_info(self._catalog, slot)
        if existing is None:
            catalog.check_free_slot(self._catalog, self.source.name)
        elif slot != self.owned_slot:
            raise SourceError(
                f"source {self.source.name!r}: replication slot {slot!r} already exists "
                f"(plugin {existing.plugin}, database {existing.database}) and this log did "
                "not create it — another tool's (Debezium's?) or a cdc log that is gone; "
                "bootstrap would drop it",
                f"give the source a slot of its own (sources: slot: <name>), or, if nothing "
                f"reads from it any more, drop it: SELECT pg_drop_replication_slot('{slot}')")
        catalog.ensure_publication(self._catalog, self.source.config.publication_name,
                                   list(self.tables))
        return self.tables

    def open(self) -> None:
        """Recreate the slot and start the snapshot transaction."""
        if self._catalog is None:
            self.check()
        assert self._catalog is not None
        slot = self.source.config.slot_name
        existing = catalog.slot_info(self._catalog, slot)
        deadline = time.monotonic() + 10
        while existing is not None and existing.active and time.monotonic() < deadline:
            time.sleep(0.2)  # a killed predecessor's connection may take a moment to go away
            existing = catalog.slot_info(self._catalog, slot)
        if existing is not None and existing.active:
            raise SourceError(
                f"source {self.source.name!r}: slot {slot!r} is in use by another connection",
                "stop the process streaming from it (another `cdc capture`?) and retry")
        if existing is not None:
            catalog.drop_slot(self._catalog, slot)
        catalog.check_free_slot(self._catalog, self.source.name)
        self._reader = self.source.connect()
        self._replication = self.source.connect(replication=True)
        self.consistent_lsn, self.snapshot_name = self.source.create_slot(self._replication)
        self._reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        self._reader.execute(f"SET TRANSACTION SNAPSHOT '{self.snapshot_name}'")
        self.ts_ms = int(time.time() * 1000)

    def estimate_rows(self, table: TableId) -> int | None:
        """Rows ``table`` holds in the snapshot: the planner's estimate, or an exact count when
        the table was never analysed. ``None`` if unknown."""
        assert self._reader is not None
        row = self._reader.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
            (catalog.qualified(table),)).fetchone()
        if row is not None and row[0] is not None and int(row[0]) >= 0:
            return int(row[0])
        counted = self._reader.execute(
            f"SELECT count(*) FROM {catalog.qualified(table)}").fetchone()
        return int(counted[0]) if counted else None

    def rows(self, table: TableId) -> Iterator[ChangeEvent | EncodedBatch]:
        """Every row of ``table`` in the snapshot, as op ``r`` events (or already encoded)."""
        assert self._reader is not None
        captured = self.tables[table]
        for item in self.source.snapshot_rows(self._reader, captured, self.consistent_lsn,
                                              self._row_number, self.ts_ms, self.codec,
                                              self.columns):
            self._row_number += item.events if isinstance(item, EncodedBatch) else 1
            yield item

    def next_row_number(self) -> int:
        """Claim a position ordinal for a record the caller makes itself (a vanished key)."""
        self._row_number += 1
        return self._row_number

    def resume_offset(self) -> dict[str, Any]:
        return {"state": "streaming", "slot": self.source.config.slot_name,
                "lsn": self.consistent_lsn, "lsn_text": format_lsn(self.consistent_lsn),
                "snapshot_lsn": format_lsn(self.consistent_lsn)}

    def close(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(Exception):
                self._reader.execute("COMMIT")
        for conn in (self._reader, self._replication, self._catalog):
            if conn is not None:
                with contextlib.suppress(Exception):  # a broken connection may fail to close
                    conn.close()
        self._reader = self._replication = self._catalog = None

    def __enter__(self) -> SnapshotSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
