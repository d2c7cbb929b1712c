"""A follower kind from outside the project, for tests/test_sink_contract.py: ``kind: lite``
keeps rows in one SQLite file (stdlib only). The test installs it as a package of its own (a
dist-info with an entry point in ``cdc.followers``, on a temporary ``sys.path``), so it proves
that a third party adds a kind through the public contracts alone: :class:`cdc.config.
FollowerConfig` for its settings, :class:`cdc.sink.Sink` for its storage. Not imported from
this directory: the test copies it out."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from cdc.config import Config, FollowerConfig
from cdc.errors import CdcError
from cdc.offsets import offset_order
from cdc.sink import ApplyStats, Change, Sink, Topics, row_text

SCHEMA = ("CREATE TABLE IF NOT EXISTS rows (topic TEXT, key TEXT, position BLOB, row TEXT, "
          "deleted_ms INTEGER, PRIMARY KEY (topic, key))",
          "CREATE TABLE IF NOT EXISTS marks (source TEXT PRIMARY KEY, offset TEXT)")


class LiteFollowerConfig(FollowerConfig):
    """``kind: lite``: ``path`` is the directory of the SQLite file."""

    kind: Literal["lite"]
    sink: ClassVar[str] = "cdc_lite:LiteSink"
    path: Path


class LiteSink(Sink):
    """Each apply is one SQLite write transaction, so the per-key gate is atomic across
    processes; a delete keeps its row as a marker (``row`` NULL) for the retention."""

    @classmethod
    def from_settings(cls, config: Config, name: str, settings: FollowerConfig,
                      topics: Topics) -> LiteSink:
        assert isinstance(settings, LiteFollowerConfig)
        return cls(name, config.resolve(settings.path), settings.tombstone_retention)

    def __init__(self, name: str, path: Path, retention: float = 3600.0) -> None:
        self.name = name
        self.path = path
        self.retention_ms = int(retention * 1000)
        self._db: sqlite3.Connection | None = None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(self.path / "rows.db", timeout=60, isolation_level=None)
                for statement in SCHEMA:
                    db.execute(statement)
            except (OSError, sqlite3.Error) as exc:
                raise CdcError(f"follower {self.name}: cannot open {self.path}: {exc}",
                               "set the follower's path to a writable directory") from None
            self._db = db
        return self._db

    def check(self) -> None:
        self._conn()

    def apply(self, changes: Sequence[Change]) -> ApplyStats:
        db, stats = self._conn(), ApplyStats()
        now = time.time_ns() // 1_000_000
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM rows WHERE deleted_ms < ?", (now - self.retention_ms,))
            for change in changes:
                held = db.execute("SELECT position FROM rows WHERE topic = ? AND key = ?",
                                  (change.topic, change.key)).fetchone()
                if held is not None and bytes(held[0]) >= change.position:
                    stats.skipped += 1
                    continue
                row = None if change.row is None else json.dumps(row_text(change.row))
                db.execute("INSERT OR REPLACE INTO rows VALUES (?, ?, ?, ?, ?)",
                           (change.topic, change.key, change.position, row,
                            now if row is None else None))
                if row is None:
                    stats.deleted += 1
                else:
                    stats.written += 1
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return stats

    def set_watermark(self, source: str, offset: Mapping[str, Any]) -> None:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            held = self.watermark(source)
            if held is None or offset_order(held) <= offset_order(offset):
                db.execute("INSERT OR REPLACE INTO marks VALUES (?, ?)",
                           (source, json.dumps(dict(offset))))
        finally:
            db.execute("COMMIT")

    def watermark(self, source: str) -> dict[str, Any] | None:
        held = self._conn().execute("SELECT offset FROM marks WHERE source = ?",
                                    (source,)).fetchone()
        return None if held is None else dict(json.loads(held[0]))

    def read(self, topic: str, keys: Sequence[str]) -> dict[str, dict[str, str]]:
        db = self._conn()
        found = {}
        for key in keys:
            held = db.execute("SELECT row FROM rows WHERE topic = ? AND key = ? AND row IS NOT "
                              "NULL", (topic, key)).fetchone()
            if held is not None:
                found[key] = json.loads(held[0])
        return found

    def keys(self, topic: str) -> Iterator[str]:
        for (key,) in self._conn().execute(
                "SELECT key FROM rows WHERE topic = ? AND row IS NOT NULL", (topic,)):
            yield key

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
