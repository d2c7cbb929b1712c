"""The settings of a ``kind: postgres`` source (registered in ``cdc.connectors``; light: no
driver is imported, so reading a config costs nothing of the connector)."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from cdc.config import Size, SourceConfig


class PostgresSourceConfig(SourceConfig):
    """A PostgreSQL leader (``connectors/postgres/``): pgoutput over a replication slot."""

    kind: Literal["postgres"]
    connector: ClassVar[str] = "connectors.postgres.connector:PostgresConnector"
    dsn_schemes: ClassVar[tuple[str, ...]] = ("postgresql", "postgres")
    #: replication slot and publication names (default: cdc_<name>)
    slot: str | None = None
    publication: str | None = None
    #: ``cdc status`` warns when the slot retains more WAL than this
    warn_retained_wal: Size = Field(1024**3, ge=0)

    @property
    def slot_name(self) -> str:
        return self.slot or "cdc_" + re.sub(r"[^a-z0-9_]", "_", self.name.lower())

    @property
    def publication_name(self) -> str:
        return self.publication or f"cdc_{self.name}"

    @field_validator("slot")
    @classmethod
    def _slot_ok(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z0-9_]{1,63}", value):
            raise ValueError("replication slot names may hold only lower-case letters, digits "
                             "and '_' (max 63)")
        return value
