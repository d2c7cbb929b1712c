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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cdc.config import Config, SourceConfig
from cdc.errors import CdcError
from cdc.offsets import offset_order, offset_text
from cdc.source import connector_for
from cdc.transactions import is_transaction_topic

STATUS_DIR = "status"
#: a status file older than this belongs to a process that is gone
STALE_AFTER_S = 10.0


def status_path(log_path: Path, source: str) -> Path:
    return log_path / STATUS_DIR / f"{source}.json"


def follower_status_path(log_path: Path, follower: str) -> Path:
    """Where ``cdc apply`` says how follower (or view) ``follower`` is doing."""
    return log_path / STATUS_DIR / "followers" / f"{follower}.json"


def follower_status_file(log_path: Path, follower: str) -> StatusFile:
    return StatusFile(log_path, follower, follower_status_path(log_path, follower))


class StatusFile:
    """Writes one source's (or follower's) status, with an events/s rate over the last
    interval."""

    def __init__(self, log_path: Path, source: str, path: Path | None = None) -> None:
        self.path = path or status_path(log_path, source)
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


def read_status(log_path: Path, source: str, path: Path | None = None
                ) -> dict[str, Any] | None:
    """The last status a capture wrote, with ``running`` telling whether it is still alive."""
    path = path or status_path(log_path, source)
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    alive = pid_alive(int(data.get("pid", 0)))
    data["running"] = alive and time.time() - float(data.get("updated", 0)) < STALE_AFTER_S
    return data


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (one of another user counts as running; a zombie, dead
    but not yet reaped by its parent, does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


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
    from cdc.incremental import describe_progress, progress_of

    row["snapshots"] = {table: describe_progress(p) for table, p in progress_of(stored).items()}
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


#: reads a follower's progress record: where it resumes (spark_apply/progress.py's
#: ``applied_offsets``, handed in by the command line: the core imports no Spark code)
CheckpointReader = Callable[[Path], Mapping[str, Any] | None]


def records_behind(config: Config, name: str, ends: Mapping[str, Mapping[int, int]],
                   done: Mapping[str, Any] | None) -> tuple[int, int]:
    """(records read, records past them) of follower ``name``'s topics: ``done`` is what its
    progress record says its last finished batch read (``{"topics": {topic: {partition: next
    offset}}}``, None: nothing), ``ends`` the log's end offsets per topic and partition."""
    applied = (done or {}).get("topics", {})
    read = behind = 0
    for topic in config.follower_topics(name):
        mine = applied.get(topic, {})
        read += sum(int(v) for v in mine.values())
        for partition, end in ends.get(topic, {}).items():
            behind += max(0, end - int(mine.get(str(partition), 0)))
    return read, behind


def follower_status(config: Config, name: str, ends: Mapping[str, Mapping[int, int]],
                    checkpoint_offsets: CheckpointReader | None) -> dict[str, Any]:
    """One follower's (or view's) row of ``cdc status``: what its progress record says it has read,
    how many records of its topics are past that, and what its ``cdc apply`` last said."""
    follower = config.follower(name)
    checkpoint = config.follower_checkpoint(name)
    row: dict[str, Any] = {"follower": name, "kind": follower.kind,
                           "view": name in config.views, "checkpoint": str(checkpoint)}
    done = (checkpoint_offsets(checkpoint) if checkpoint_offsets else None) or {}
    read, behind = records_behind(config, name, ends, done)
    row["records_read"] = read if checkpoint_offsets else None
    row["lag_records"] = behind if checkpoint_offsets else None
    live = read_status(config.log_path, name, follower_status_path(config.log_path, name))
    row["apply"] = ("running" if live and live["running"] else
                    "stopped" if live or done else "never ran")
    row["changes_per_s"] = live.get("events_per_s") if live and live["running"] else 0.0
    for key in ("batches", "lag_s", "last_error"):
        row[key] = live.get(key) if live else None
    row["watermarks"] = {source: {"position": offset_text(offset), "order": offset_order(offset)}
                         for source, offset in sorted(((live or {}).get("watermarks")
                                                       or done.get("watermarks") or {}).items())}
    return row


def collect(config: Config, checkpoint_offsets: CheckpointReader | None = None
            ) -> dict[str, Any]:
    """Everything ``cdc status`` shows: the log, each source, each follower and view."""
    from cdc.log.open import open_reader

    offsets: dict[str, Any] = {}
    ends: dict[str, dict[int, int]] = {}
    reader = open_reader(config, missing_ok=True)
    log: dict[str, Any] = {"backend": config.log.backend, "path": str(config.log_path),
                           "bytes": 0, "topics": 0, "records_appended": 0}
    if reader is not None:
        try:
            offsets = reader.source_offsets()
            log["path"] = reader.where
            topics = [t for t in reader.topics() if not is_transaction_topic(t.meta)]
            ends = {t.name: reader.end_offsets(t.name) for t in topics}
            log["topics"] = len(topics)
            log["records_appended"] = sum(sum(parts.values()) for parts in ends.values())
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
        "followers": [follower_status(config, name, ends, checkpoint_offsets)
                      for name in [*config.followers, *config.views]],
    }
