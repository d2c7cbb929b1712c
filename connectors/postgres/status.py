"""What the leader says about a source's slot, for ``cdc status``."""

from __future__ import annotations

from typing import Any

from cdc.config import SourceConfig
from cdc.position import format_lsn, parse_lsn
from connectors.postgres import catalog
from connectors.postgres.connection import connect


def slot_status(source: SourceConfig) -> dict[str, Any]:
    """Slot existence, confirmed LSN, lag and retained WAL in bytes."""
    with connect(source) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        current = parse_lsn(row[0]) if row else 0
        slot = catalog.slot_info(conn, source.slot_name)
    if slot is None:
        return {"slot_exists": False, "server_lsn": format_lsn(current)}
    confirmed = slot.confirmed_flush_lsn or 0
    restart = slot.restart_lsn or 0
    return {"slot_exists": True, "slot_active": slot.active, "server_lsn": format_lsn(current),
            "confirmed_lsn": format_lsn(confirmed), "lag_bytes": max(current - confirmed, 0),
            "retained_bytes": max(current - restart, 0), "wal_status": slot.wal_status}
