"""What a running capture says about itself, and ``cdc status``.

Each capture process writes ``<log>/status/<source>.json`` about once a second (atomically:
write, then rename). ``cdc status`` joins that with what the leader says about the source
(through its connector) and what the log holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from cdc.config import Config, SourceConfig
from cdc.errors import CdcError
from cdc.offsets import offset_text
from cdc.source import connector_for

STATUS_DIR = "status"
#: a status file older than this belongs to a process that is gone
STALE_AFTER_S = 10.0


def status_path(log_path: Path, source: str) -> Path:
    return log_path / STATUS_DIR / f"{source}.json"


class StatusFile:
    """Writes one source's status, with an events/s rate over the last interval."""

    def __init__(self, log_path: Path, source: str) -> None:
        self.path = status_path(log_path, source)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.time()
        self._last_write = 0.0
        self._last_events = 0
        self.rate = 0.0

    def update(self, state: str, events: int, force: bool = False, **extra: Any) -> None:
        now = time.monotonic()
        elapsed = now - self._last_write
        if not force and elapsed < 1.0:
            return
        if self._last_write and elapsed > 0:
            self.rate = (events - self._last_events) / elapsed
        self._last_write, self._last_events = now, events
        data = {"pid": os.getpid(), "state": state, "started": self.started,
                "updated": time.time(), "events": events, "events_per_s": round(self.rate, 1),
                **extra}
        tmp = self.path.with_suffix(".tmp")
        with contextlib.suppress(OSError):  # status is advisory: never stop capture for it
            tmp.write_text(json.dumps(data))
            tmp.replace(self.path)


def read_status(log_path: Path, source: str) -> dict[str, Any] | None:
    """The last status a capture wrote, with ``running`` telling whether it is still alive."""
    path = status_path(log_path, source)
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    alive = _pid_alive(int(data.get("pid", 0)))
    data["running"] = alive and time.time() - float(data.get("updated", 0)) < STALE_AFTER_S
    return data


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def directory_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


def source_status(config: Config, source: SourceConfig,
                  stored: dict[str, Any] | None) -> dict[str, Any]:
    """One row of ``cdc status``: the stored offset, the running capture, the server's view
    (:meth:`cdc.source.Connector.status`)."""
    row: dict[str, Any] = {"source": source.name, "kind": source.kind,
                           "stored_position": offset_text(stored) if stored else None,
                           "offset_state": (stored or {}).get("state", "not bootstrapped")}
    if stored and "lsn" in stored:
        row["stored_lsn"] = offset_text(stored)
    live = read_status(config.log_path, source.name)
    row["capture"] = ("running" if live and live["running"] else "stopped")
    row["events_per_s"] = live.get("events_per_s") if live and live["running"] else 0.0
    row["events"] = live.get("events") if live else None
    row["last_error"] = live.get("last_error") if live else None
    row["unavailable_images"] = int((stored or {}).get("unavailable_images", 0))
    row["warnings"] = []
    try:
        connector = connector_for(source)
        server = connector.status(connector.load_offset(stored) if stored else None)
    except CdcError as exc:
        row["server"] = exc.problem
    else:
        row.update(server.fields)
        row["warnings"] = server.warnings
    return row


def collect(config: Config) -> dict[str, Any]:
    from cdc.log.open import open_reader

    offsets: dict[str, Any] = {}
    reader = open_reader(config, missing_ok=True)
    log: dict[str, Any] = {"backend": config.log.backend, "path": str(config.log_path),
                           "bytes": 0}
    if reader is not None:
        try:
            offsets = reader.source_offsets()
            log["path"] = reader.where
            if config.log.backend == "local":
                log["bytes"] = directory_bytes(config.log_path)
            else:
                log["bytes"] = sum(reader.partition_stats(t.name, p).bytes
                                   for t in reader.topics() for p in range(t.partitions))
        finally:
            reader.close()
    return {
        "log": log,
        "sources": [source_status(config, s, offsets.get(s.name)) for s in config.sources],
    }


def _bytes(value: Any) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(size) < 1024 or unit == "TB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return str(value)


def print_status(status: dict[str, Any], console: Console) -> None:
    table = Table(title=f"capture status (log {status['log']['path']}, "
                        f"{_bytes(status['log']['bytes'])})")
    for column in ("source", "kind", "capture", "stored position", "server confirmed", "lag",
                   "retained", "events/s", "events"):
        table.add_column(column, justify="right" if column in ("lag", "retained", "events/s",
                                                                "events") else "left")
    warnings = []
    for row in status["sources"]:
        state = row["capture"] if row["offset_state"] == "streaming" else row["offset_state"]
        table.add_row(row["source"], row["kind"], state, row.get("stored_position") or "-",
                      row.get("position") or "-", _bytes(row.get("lag_bytes")),
                      _bytes(row.get("retained_bytes")), f"{row['events_per_s'] or 0:,.0f}",
                      f"{row['events']:,}" if row.get("events") is not None else "-")
        if row.get("server"):
            warnings.append(f"{row['source']}: {row['server']}")
        warnings.extend(f"{row['source']}: {warning}" for warning in row.get("warnings", []))
        if row.get("unavailable_images"):
            warnings.append(
                f"{row['source']}: {row['unavailable_images']:,} change(s) lack values the "
                "source did not send (PostgreSQL's unchanged TOAST) and no earlier image of the "
                "row had; their records name them in unavailable_columns. Set REPLICA IDENTITY "
                "FULL on the table, or re-bootstrap, to have whole rows again")
        if row.get("last_error") and row["capture"] == "running":
            warnings.append(f"{row['source']}: {row['last_error']}")
    console.print(table)
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
