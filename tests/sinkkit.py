"""Shared sink-test kit: a mini change log of source-schema rows, the reference fold, batch
application through the public Sink API, and the sinks of the contract suite.

Rows are those of the Spark source's fixed schema (``spark_apply/source.py``); batches reach
the sinks through the apply tasks' own fold (``spark_apply/tasks.py``), as in ``cdc apply``. Used by
``tests/test_sink_contract.py`` (every sink kind), ``tests/test_fold.py`` and the kind-specific
sink tests. Kept light to import: the racing-writer children (multiprocessing "spawn") import
only this module.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from cdc.events import TableId
from cdc.position import Position
from cdc.sink import ApplyStats, Change, Sink, row_text
from spark_apply.fold import fold_records

TOPIC = "src.public.items"
TABLE = TableId("public", "items")
#: every sink kind of the contract suite
KINDS = ("redis", "delta-scd1", "delta-scd2", "search", "sql-sqlite", "sql-postgres",
         "plugin-lite")
#: the out-of-tree follower kind (``kind: lite``), installed as a package of its own
PLUGIN_SOURCE = Path(__file__).parent / "plugin" / "cdc_lite.py"


def pos(seq: int, ordinal: int = 1) -> bytes:
    return Position.postgres(seq, ordinal).to_bytes()


def key_json(key: int) -> str:
    return json.dumps({"id": key}, separators=(",", ":"))


class MiniLog:
    """One partition of one topic: records with increasing offsets, as source-schema rows.

    ``ts``: how ``source_ts_ms`` is made — ``"offset"`` (``1_000 + offset``) or ``"position"``
    (commit times follow the positions: a replayed record keeps its own)."""

    def __init__(self, topic: str = TOPIC, ts: Literal["offset", "position"] = "offset") -> None:
        self.rows: list[dict[str, Any]] = []
        self.topic = topic
        self.ts = ts

    def add(self, key: int, position: bytes, op: str | None, after: dict[str, Any] | None = None,
            topic: str | None = None) -> None:
        topic = topic or self.topic
        if op is None:
            stamp = None
        elif self.ts == "offset":
            stamp = 1_000 + len(self.rows)
        else:
            stamp = 1_000_000 + Position.from_bytes(position).parts[0] * 10
        self.rows.append({
            "topic": topic, "partition": 0, "offset": len(self.rows), "timestamp_ms": 0,
            "source": topic.split(".")[0], "table": topic.split(".", 1)[1],
            "key": "{}" if op == "t" else key_json(key), "position": position, "op": op,
            "after": None if after is None else json.dumps(after, separators=(",", ":")),
            "source_ts_ms": stamp})

    def upsert(self, key: int, position: bytes, v: int, op: str = "u") -> None:
        self.add(key, position, op, {"id": key, "v": v})

    def delete(self, key: int, position: bytes) -> None:
        self.add(key, position, "d")
        self.add(key, position, None)  # the tombstone shares the delete's position

    def watermark(self, lsn: int, source: str | None = None) -> None:
        self.rows.append({"topic": None, "partition": None, "offset": None,
                          "timestamp_ms": None, "source": source or self.topic.split(".")[0],
                          "table": None, "key": None, "position": None, "op": "w",
                          "after": json.dumps({"lsn": lsn}), "source_ts_ms": None})


def random_log(seed: int, keys: int = 40, changes: int = 600, topic: str = TOPIC,
               ts: Literal["offset", "position"] = "offset") -> MiniLog:
    """Inserts, updates and deletes (with tombstones) of ``keys`` keys, in position order; a
    watermark every 97 changes."""
    rng = random.Random(seed)
    log = MiniLog(topic, ts)
    live: set[int] = set()
    for seq in range(1, changes + 1):
        key = rng.randint(1, keys)
        if key in live and rng.random() < 0.25:
            log.delete(key, pos(seq))
            live.discard(key)
        else:
            log.upsert(key, pos(seq), seq, "u" if key in live else "c")
            live.add(key)
        if seq % 97 == 0:
            log.watermark(seq)
    return log


def expected_rows(log: MiniLog | Sequence[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The reference: per key the record with the highest (position, offset); deleted keys
    absent; rows as follower text."""
    rows = log.rows if isinstance(log, MiniLog) else log
    latest: dict[str, tuple[bytes, int, str | None]] = {}
    for row in rows:
        if row["op"] in ("w", "t"):
            continue
        rank = (row["position"], row["offset"])
        if row["key"] not in latest or rank > latest[row["key"]][:2]:
            latest[row["key"]] = (*rank, row["after"])
    return {key: row_text(json.loads(after)) for key, (_, _, after) in latest.items()
            if after is not None}


def history(rows: Sequence[dict[str, Any]]) -> list[Change]:
    """The reference of what a sink with ``folds`` False gets: every position of every key but
    watermarks and truncates, ordered per key by (position, offset); of records sharing a
    position (a delete and its tombstone) the first."""
    records = [row for row in rows if row["op"] not in ("w", "t")]
    records.sort(key=lambda r: (r["topic"], r["key"], bytes(r["position"]), r["offset"]))
    firsts = [r for i, r in enumerate(records) if i == 0 or (
        r["topic"], r["key"], bytes(r["position"])) != (
        records[i - 1]["topic"], records[i - 1]["key"], bytes(records[i - 1]["position"]))]
    return [decode_row(None, b"", r["position"], r) for r in firsts]  # type: ignore[misc]


def decode_row(item: Any, key: bytes, position: bytes, row: dict[str, Any]) -> Change | None:
    """A source-schema row as the tasks decode a record (``None`` for a truncate)."""
    if row["op"] == "t":
        return None
    return Change(row["topic"], row["source"], row["table"], row["key"], bytes(position),
                  json.loads(row["after"]) if row["op"] in ("c", "u", "r") else None,
                  row["op"] or "", row["source_ts_ms"])


def tasks_fold(rows: Sequence[dict[str, Any]], history: bool = False) -> tuple[list[Change], Any]:
    """What ``cdc apply``'s tasks fold ``rows`` into (``spark_apply/tasks.py``: ``fold_raw``
    over raw records, watermark rows left out): (changes, the task's report)."""
    from cdc.reading import Range
    from spark_apply.tasks import TaskReport, fold_raw

    records = [(Range(row["topic"], 0, 0, 0, row["source"], row["table"]),
                row["key"].encode(), bytes(row["position"]), row["offset"], row)
               for row in rows if row["op"] != "w"]
    report = TaskReport()
    return fold_raw(records, decode_row, history, report), report


def changes_of(sink: Sink, rows: Sequence[dict[str, Any]]) -> tuple[list[Change],
                                                                    dict[str, Any]]:
    """What ``cdc apply`` gives ``sink`` for the batch ``rows``: the tasks' fold (changes),
    then the batch's watermarks."""
    return tasks_fold(rows, history=not sink.folds)[0], fold_records(rows).watermarks


def apply_in_batches(sink: Sink, rows: Sequence[dict[str, Any]], size: int,
                     start: int = 0) -> tuple[int, int]:
    """Apply ``rows[start:]`` in batches of ``size`` as the batch handler does (changes, then
    the batch's watermarks); (applied = written + deleted, skipped)."""
    applied = skipped = 0
    for begin in range(start, len(rows), size):
        changes, marks = changes_of(sink, rows[begin:begin + size])
        stats = sink.apply(changes)
        for source, offset in marks.items():
            sink.set_watermark(source, offset)
        applied += stats.written + stats.deleted
        skipped += stats.skipped
    return applied, skipped


def held_rows(sink: Sink, topic: str = TOPIC) -> dict[str, dict[str, str]]:
    """Everything the follower holds for ``topic``, through keys() and read(); every key once."""
    keys = list(sink.keys(topic))
    assert len(keys) == len(set(keys)), "keys() gave a key twice"
    return sink.read(topic, sorted(keys))


def v_of(sink: Sink, key: int, topic: str = TOPIC) -> int | None:
    row = sink.read(topic, [key_json(key)]).get(key_json(key))
    return None if row is None else int(row["v"])


# ------------------------------------------------------------------------------- the sinks

def build_sink(kind: str, settings: dict[str, str]) -> Sink:
    """A sink of ``kind`` (one of :data:`KINDS`) on ``settings`` (``redis_url``; ``root``: a
    directory for files). Two calls with the same settings open the same follower."""
    root = Path(settings.get("root", "."))
    if kind == "redis":
        from sinks.redis import RedisSink

        return RedisSink("cache", settings["redis_url"])
    if kind in ("delta-scd1", "delta-scd2"):
        from sinks.delta import DeltaSink

        return DeltaSink("wh", root / "wh", tables={TOPIC: ("src", TABLE)},
                         mode="scd1" if kind == "delta-scd1" else "scd2", buckets=4,
                         log_path=root / "log")
    if kind == "search":
        from sinks.search import SearchSink

        return SearchSink("idx", root / "search", tables={}, text_fields={},
                          writer_memory=32 * 1024**2, tombstone_retention=3600.0,
                          log_path=root / "log", shards=3)
    if kind == "sql-sqlite":
        from sinks.sql import SqlSink

        return SqlSink("db", f"sqlite:///{root / 'follower.db'}", tables={TOPIC: ("src", TABLE)})
    if kind == "sql-postgres":
        from sinks.sql import SqlSink

        return SqlSink("db", settings["url"], tables={TOPIC: ("src", TABLE)})
    if kind == "plugin-lite":
        return _plugin_sink(root, settings.get("plugin"))
    raise ValueError(f"no sink kind {kind!r}")


def install_plugin(directory: Path) -> Path:
    """Make ``directory`` an installed package holding the ``lite`` follower kind: its module
    and a dist-info whose entry point registers it in ``cdc.followers``, as ``pip install``
    would leave them; returns ``directory`` (put it on ``sys.path`` to install it)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cdc_lite.py").write_text(PLUGIN_SOURCE.read_text())
    info = directory / "cdc_lite-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cdc-lite\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[cdc.followers]\nlite = cdc_lite:LiteFollowerConfig\n")
    return directory


def _plugin_sink(root: Path, plugin: str | None) -> Sink:
    """The ``lite`` follower ``ext`` under ``root``, opened as ``cdc apply`` opens any: from a
    config naming its kind. ``plugin``: the directory :func:`install_plugin` made (put on
    ``sys.path`` here, e.g. in a racing writer's process)."""
    import sys

    from cdc.config import forget_kinds, parse_config
    from cdc.sink import open_sink

    if plugin is not None and plugin not in sys.path:
        sys.path.insert(0, plugin)
        forget_kinds()
    config = parse_config({"followers": {"ext": {"kind": "lite", "path": "lite"}}}, root)
    return open_sink(config, "ext")


def race_writer(kind: str, settings: dict[str, str], conn: Any, barrier: Any) -> None:
    """A racing writer (a child process): opens its own sink, then per message ``(changes,
    delay)`` waits at ``barrier`` with the other writer, sleeps ``delay`` seconds and applies
    the changes; answers ``("ok", (written, deleted, skipped))`` or ``("error", text)``.
    ``None`` ends it."""
    sink = build_sink(kind, settings)
    try:
        while True:
            message = conn.recv()
            if message is None:
                return
            changes, delay = message
            sink.refresh()  # what a task does before it writes
            barrier.wait(timeout=60)
            if delay:
                time.sleep(delay)
            try:
                stats: ApplyStats = sink.apply(changes)
            except Exception as exc:  # reported to the test, which fails on it
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
                continue
            conn.send(("ok", (stats.written, stats.deleted, stats.skipped)))
    finally:
        sink.close()
