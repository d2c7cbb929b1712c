"""The MySQL/MariaDB connector on the source contract (:mod:`cdc.source`)."""

from __future__ import annotations

from typing import Any

from cdc.avro import fixed_schema
from cdc.errors import CdcError
from cdc.events import TableSchema
from cdc.offsets import SourceOffset
from cdc.source import (
    Connector,
    EnvelopeSource,
    Leader,
    ServerStatus,
    SnapshotSource,
    StreamingSource,
)


def _source_defaults(schema: TableSchema) -> dict[str, Any]:
    return {"db": schema.table.schema, "table": schema.table.table, "server_id": 0,
            "gtid": None, "file": "", "pos": 0, "row": 0, "thread": None, "query": None}


ENVELOPE = EnvelopeSource(connector="mysql", schema=fixed_schema("source.mysql.avsc"),
                          defaults=_source_defaults)


class MySqlConnector(Connector):
    """``kind: mysql``: the row binlog as a replica, snapshots in a consistent-snapshot
    transaction."""

    kind = "mysql"
    offset_type = SourceOffset

    @classmethod
    def envelope(cls) -> EnvelopeSource:
        return ENVELOPE

    def _pending(self) -> CdcError:
        return CdcError(f"source {self.name!r}: MySQL/MariaDB capture is being built (#11)",
                        "capture PostgreSQL sources for now")

    def snapshot(self) -> SnapshotSource:
        raise self._pending()

    def stream(self, offset: SourceOffset) -> StreamingSource:
        raise self._pending()

    def bootstrapping_offset(self) -> SourceOffset:
        raise self._pending()

    def status(self, stored: SourceOffset | None) -> ServerStatus:
        raise self._pending()

    def leader(self) -> Leader:
        raise self._pending()
