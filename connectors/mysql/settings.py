"""The settings of a ``kind: mysql`` source, MySQL or MariaDB (registered in
``cdc.connectors``; light: no driver is imported, so reading a config costs nothing of the
connector)."""

from __future__ import annotations

import zlib
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from cdc.config import Duration, SourceConfig, check_table_names
from cdc.events import TableId


class MySqlSourceConfig(SourceConfig):
    """A MySQL or MariaDB leader (``connectors/mysql/``): the row binlog, as a replica."""

    kind: Literal["mysql"]
    connector: ClassVar[str] = "connectors.mysql.connector:MySqlConnector"
    dsn_schemes: ClassVar[tuple[str, ...]] = ("mysql", "mariadb")
    #: the replica id capture registers with; it must differ from the server's own and from
    #: every other replica's (default: derived from the source name, stable across restarts)
    server_id: int | None = Field(None, ge=1, le=2**32 - 1)
    #: ``cdc status`` warns when the server's oldest binlog is within this many binlog files
    #: of the stored position (it will be purged soon)
    warn_purge_files: int = Field(2, ge=0)
    #: read timeout on the replication connection; the server sends a heartbeat event at half
    #: of it when idle
    read_timeout: Duration = Field(30.0, gt=1)
    #: the table incremental snapshots write their watermarks to (``database.table``; default:
    #: ``cdc_signal`` in the database of the first captured table). Capture creates it if it
    #: may; it must not be one of ``tables``
    signal_table: str | None = None

    @model_validator(mode="after")
    def _signal_not_captured(self) -> MySqlSourceConfig:
        if self.signal_table is not None:
            check_table_names([self.signal_table])
            if self.signal_table in self.tables:
                raise ValueError("signal_table is one of tables: it holds capture's own "
                                 "watermarks, so it must not be captured")
        return self

    @property
    def signal_table_id(self) -> TableId:
        """Where incremental snapshots write their watermarks (see ``signal_table``)."""
        if self.signal_table is not None:
            return TableId.parse(self.signal_table)
        return TableId(TableId.parse(self.tables[0]).schema, "cdc_signal")

    @property
    def replica_id(self) -> int:
        """``server_id``, or one derived from the name (in 1,000,000 .. 2^31)."""
        if self.server_id is not None:
            return self.server_id
        return 1_000_000 + zlib.crc32(self.name.encode()) % (2**31 - 1_000_000)
