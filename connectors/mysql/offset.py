"""Where a MySQL/MariaDB source stands (its binlog file and position: the connector's module
doc says more), and the warning when the server is about to purge the binlog it stands in.
Shared by the connector and the streaming source, which import it, never each other's module
at load time."""

from __future__ import annotations

from dataclasses import dataclass

from cdc.offsets import SourceOffset
from connectors.mysql import catalog
from connectors.mysql.settings import MySqlSourceConfig


@dataclass(frozen=True, kw_only=True)
class MySqlOffset(SourceOffset):
    """Where a MySQL/MariaDB source stands (see the module doc)."""

    kind = "mysql"

    file: str = ""
    pos: int = 0
    file_seq: int = 0
    gtid: str | None = None
    server_id: int = 0
    server_uuid: str | None = None
    #: where the snapshot the source was bootstrapped from stood (``file:pos``)
    snapshot_at: str | None = None
    started_ms: int | None = None

    def order(self) -> tuple[int, ...]:
        return (self.file_seq, self.pos)

    def describe(self) -> str:
        return f"{self.file}:{self.pos}" if self.file else self.state


def purge_warnings(config: MySqlSourceConfig, files: list[tuple[str, int]],
                   stored: MySqlOffset, expiring: bool = True) -> list[str]:
    """A warning when the server's oldest binlog is close to the stored position (it may be
    purged before capture reads past it); ``expiring``: the server purges binlogs by age."""
    if not files or not stored.file or not expiring:
        return []
    oldest = catalog.file_sequence(files[0][0])
    if stored.file_seq - oldest <= config.warn_purge_files:
        return [f"the server's oldest binlog ({files[0][0]}) is within "
                f"{stored.file_seq - oldest} file(s) of the stored position {stored.describe()}; "
                "if it is purged before capture reads past it, the source must be "
                "re-bootstrapped: keep capture running, or raise binlog_expire_logs_seconds / "
                "expire_logs_days"]
    return []
