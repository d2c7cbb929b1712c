"""What the leader says about a source's slot, for ``cdc status``."""

from __future__ import annotations

from typing import Any

from cdc.config import SourceConfig
from cdc.position import format_lsn, parse_lsn
from connectors.postgres import catalog
from connectors.postgres.connection import connect


def slot_status(source: SourceConfig) -> dict[str, Any]:
    """Slot existence, confirmed LSN, lag and retained WAL in bytes, and the retained WAL's
    limit: with ``max_slot_wal_keep_size`` set, retained + the slot's ``safe_wal_size`` (the
    WAL that may still be written before the slot is lost); else ``warn_retained_wal``."""
    with connect(source) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        current = parse_lsn(row[0]) if row else 0
        slot = catalog.slot_info(conn, source.slot_name)
        safe = conn.execute("SELECT safe_wal_size FROM pg_replication_slots WHERE slot_name = "
                            "%s", (source.slot_name,)).fetchone() if slot is not None else None
    if slot is None:
        return {"slot_exists": False, "server_lsn": format_lsn(current)}
    confirmed = slot.confirmed_flush_lsn or 0
    retained = max(current - (slot.restart_lsn or 0), 0)
    limit = retained + int(safe[0]) if safe is not None and safe[0] is not None else int(
        getattr(source, "warn_retained_wal", 0) or 0) or None
    return {"slot_exists": True, "slot_active": slot.active, "server_lsn": format_lsn(current),
            "confirmed_lsn": format_lsn(confirmed), "lag_bytes": max(current - confirmed, 0),
            "retained_bytes": retained, "retained_limit_bytes": limit,
            "wal_status": slot.wal_status}
