"""The fold every follower shares: per key, the newest record of a micro-batch.

Input: rows of the Spark source's fixed schema (``spark_apply/source.py``), one per log record::

    topic, partition, offset, timestamp_ms, source, table, key, position, op, after, source_ts_ms

``op`` is ``c``/``u``/``r`` (``after`` holds the row's JSON form), ``d`` (``after`` NULL), NULL
for a tombstone, ``t`` for a truncate, or ``w`` for a *watermark row* (``source`` = the source
name, ``after`` = JSON of the source offset the batch reached; ``topic``/``key``/``position``
NULL).

Semantics, stated exactly. :func:`fold_records` is their plain statement in Python, the
reference; what ``cdc apply`` runs is the executor tasks' fold on raw record bytes
(``spark_apply/tasks.py``: ``fold_raw``, which decodes only the winners), and the tests check
the two agree (``tests/test_fold.py``):

* Records are grouped by ``(topic, key)``; the group's winner is the record with the highest
  ``position`` (bytes compared unsigned, left to right); on equal positions the highest
  ``offset`` wins — a delete and its tombstone share a position, and the tombstone comes later.
* The winner becomes one :class:`~cdc.sink.Change`: ``row`` = ``json.loads(after)`` for
  ``c``/``u``/``r``, ``None`` for a delete or tombstone.
* Truncate records (``op = 't'``, key ``{}``) are dropped: they are table-level, and the
  per-key tombstones written after them do the work.
* Watermark rows never compete with records: per source, the one with the highest
  :func:`watermark_order` is kept (on equal order the last one seen).
* Commit times for the latency measurement (``spark_apply/latency.py``): per topic, the
  ``source_ts_ms`` of every record of the batch whose op is ``c``/``u``/``d`` (a commit at the
  source; snapshot reads, truncates and tombstones excluded), folded away or not.

A winner is only the newest *in its batch*; whether it is newer than what the follower holds is
the sink's version gate (``cdc/sink.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cdc.offsets import offset_order
from cdc.sink import Change

#: ``op`` of a watermark row
WATERMARK = "w"
#: ``op`` of a truncate (table-level; dropped by the fold)
TRUNCATE = "t"
_UPSERTS = frozenset({"c", "u", "r"})
#: ops whose ``source_ts_ms`` is a commit at the source (what latency is measured for)
COMMITS = ("c", "u", "d")


@dataclass
class FoldResult:
    """One micro-batch, folded."""

    #: at most one change per (topic, key), in no particular order
    changes: list[Change] = field(default_factory=list)
    #: per source, the newest source offset the batch reached (absent: no watermark row)
    watermarks: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: log records in the batch (watermark rows not counted)
    records: int = 0
    #: the newest ``source_ts_ms`` (commit time at the source) among them, if any
    newest_ts_ms: int | None = None
    #: per topic, the commit times (``source_ts_ms``) of the batch's c/u/d records; topics
    #: without any are absent
    stamps: dict[str, Any] = field(default_factory=dict)
    #: per topic, the log records of the batch (truncates and tombstones included)
    records_by_topic: dict[str, int] = field(default_factory=dict)


#: how source offsets order (:func:`cdc.offsets.offset_order`)
watermark_order = offset_order


def _get(row: Any, name: str) -> Any:
    return row[name]


def fold_records(rows: Iterable[Any], records: int | None = None,
                 newest_ts_ms: int | None = None) -> FoldResult:
    """The fold in pure Python over source-schema rows (mappings or Spark ``Row`` objects).

    ``records`` and ``newest_ts_ms`` override what the rows say (for input already folded).
    """
    best: dict[tuple[str, str], tuple[bytes, int, Any]] = {}
    marks: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}
    seen = 0
    newest: int | None = None
    stamps: dict[str, list[int]] = {}
    per_topic: dict[str, int] = {}
    for row in rows:
        op = _get(row, "op")
        if op == WATERMARK:
            keep_watermark(marks, _get(row, "source"), _get(row, "after"))
            continue
        seen += 1
        topic = _get(row, "topic")
        per_topic[topic] = per_topic.get(topic, 0) + 1
        ts = _get(row, "source_ts_ms")
        if ts is not None and (newest is None or ts > newest):
            newest = ts
        if ts is not None and op in COMMITS:
            stamps.setdefault(topic, []).append(ts)
        if op == TRUNCATE:
            continue
        group = (_get(row, "topic"), _get(row, "key"))
        rank = (bytes(_get(row, "position")), int(_get(row, "offset")))
        current = best.get(group)
        if current is None or rank > current[:2]:
            best[group] = (*rank, row)
    result = FoldResult(records=seen if records is None else records,
                        newest_ts_ms=newest if records is None else newest_ts_ms)
    result.changes = [_change(row) for _, _, row in best.values()]
    result.watermarks = {source: offset for source, (_, offset) in marks.items()}
    if records is None:
        result.stamps = dict(stamps)
        result.records_by_topic = per_topic
    return result


def keep_watermark(marks: dict[str, tuple[tuple[int, ...], dict[str, Any]]], source: str,
                   after: str) -> None:
    """Keep ``after`` (JSON of a source offset) in ``marks`` if it orders at or after the one
    kept for ``source``."""
    offset = json.loads(after)
    order = watermark_order(offset)
    current = marks.get(source)
    if current is None or order >= current[0]:
        marks[source] = (order, offset)


def _change(row: Any) -> Change:
    op = _get(row, "op")
    after = _get(row, "after")
    image = json.loads(after) if op in _UPSERTS and after is not None else None
    ts = _get(row, "source_ts_ms")
    return Change(topic=_get(row, "topic"), source=_get(row, "source"),
                  table=_get(row, "table"), key=_get(row, "key"),
                  position=bytes(_get(row, "position")), row=image, op=op or "",
                  ts_ms=None if ts is None else int(ts))
