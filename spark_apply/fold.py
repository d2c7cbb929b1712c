"""The fold every follower shares: per key, the newest record of a micro-batch.

Input: rows of the Spark source's fixed schema (``spark_apply/source.py``), one per log record::

    topic, partition, offset, timestamp_ms, source, table, key, position, op, after, source_ts_ms

``op`` is ``c``/``u``/``r`` (``after`` holds the row's JSON form), ``d`` (``after`` NULL), NULL
for a tombstone, ``t`` for a truncate, or ``w`` for a *watermark row* (``source`` = the source
name, ``after`` = JSON of the source offset the batch reached; ``topic``/``key``/``position``
NULL).

Semantics, stated exactly (the Spark transformation :func:`fold_frame`, the pure-Python
:func:`fold_records` and the Arrow fold on the driver :func:`fold_arrow` — what ``cdc apply``
runs — give the same answer; :func:`collect_fold` turns :func:`fold_frame`'s rows into the
others' result):

* Records are grouped by ``(topic, key)``; the group's winner is the record with the highest
  ``position`` (bytes compared unsigned, left to right); on equal positions the highest
  ``offset`` wins — a delete and its tombstone share a position, and the tombstone comes later.
* The winner becomes one :class:`~sinks.base.Change`: ``row`` = ``json.loads(after)`` for
  ``c``/``u``/``r``, ``None`` for a delete or tombstone.
* Truncate records (``op = 't'``, key ``{}``) are dropped: they are table-level, and the
  per-key tombstones written after them do the work.
* Watermark rows never compete with records: per source, the one with the highest
  :func:`watermark_order` is kept (on equal order the last one seen).
* Commit times for the latency measurement (``spark_apply/latency.py``): per topic, the
  ``source_ts_ms`` of every record of the batch whose op is ``c``/``u``/``d`` (a commit at the
  source; snapshot reads, truncates and tombstones excluded), folded away or not.

A winner is only the newest *in its batch*; whether it is newer than what the follower holds is
the sink's version gate (``sinks/base.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdc.offsets import offset_order
from sinks.base import Change

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

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
    #: per topic, the commit times (``source_ts_ms``) of the batch's c/u/d records: a list
    #: (pure fold) or a numpy array (:func:`collect_fold`); topics without any are absent
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

    ``records`` and ``newest_ts_ms`` override what the rows say (used by :func:`collect_fold`,
    whose input is already folded).
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
            _keep_watermark(marks, _get(row, "source"), _get(row, "after"))
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


def _keep_watermark(marks: dict[str, tuple[tuple[int, ...], dict[str, Any]]], source: str,
                    after: str) -> None:
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


# ------------------------------------------------------------------------------------- Spark

#: columns :func:`fold_frame` returns (``records``: log records the group stood for;
#: ``source_ts_ms``: the newest of the group; ``stamps``: the group's commit times, see the
#: module docstring)
FOLDED_COLUMNS = ("topic", "key", "position", "offset", "op", "after", "source", "table",
                  "records", "source_ts_ms", "stamps")


def fold_frame(batch: DataFrame) -> DataFrame:
    """The fold as a Spark transformation: one row per (topic, key) — the winner, with
    ``records`` = how many log records (truncates included) its group held; a group of only
    truncates has no winner and comes out with NULL ``position`` and ``op`` — plus every
    watermark row unchanged (``records`` 0). Pick the newest watermark per source with
    :func:`collect_fold`; the watermark rows are at most a few per batch."""
    from pyspark.sql import functions as F

    op = F.coalesce(F.col("op"), F.lit(""))
    data = batch.where(op != WATERMARK)
    winners = (
        data.groupBy("topic", "key")
        # max ignores NULLs: truncates never win, and a group of only truncates has no winner
        .agg(F.max(F.when(op != TRUNCATE, F.struct("position", "offset", "op", "after",
                                                   "source", "table"))).alias("w"),
             F.count(F.lit(1)).alias("records"), F.max("source_ts_ms").alias("source_ts_ms"),
             # collect_list skips the NULLs: only commits' times
             F.collect_list(F.when(op.isin(*COMMITS), F.col("source_ts_ms"))).alias("stamps"))
        .select("topic", "key", "w.position", "w.offset", "w.op", "w.after", "w.source",
                "w.table", "records", "source_ts_ms", "stamps")
    )
    marks = batch.where(op == WATERMARK).select(
        "topic", "key", "position", "offset", "op", "after", "source", "table",
        F.lit(0).cast("long").alias("records"), "source_ts_ms",
        F.lit(None).cast("array<bigint>").alias("stamps"))
    return winners.unionByName(marks)


def collect_fold(folded: DataFrame) -> FoldResult:
    """Bring :func:`fold_frame`'s rows to the driver as a :class:`FoldResult` (the pure
    fold over already-folded rows changes nothing but picks the watermarks)."""
    import pyarrow.compute as pc

    arrow = folded.toArrow()
    result = FoldResult(stamps=_stamps_by_topic(arrow))
    marks_mask = pc.fill_null(pc.equal(arrow.column("op"), WATERMARK), False)
    data = arrow.filter(pc.invert(marks_mask))
    for topic, count in zip(*_sums_by_topic(data), strict=True):
        result.records_by_topic[topic] = count
    result.records = sum(result.records_by_topic.values())
    newest = pc.max(data.column("source_ts_ms")).as_py() if data.num_rows else None
    result.newest_ts_ms = None if newest is None else int(newest)
    # the rows are one per (topic, key) already: no ranking left to do
    columns = data.select(["topic", "source", "table", "key", "position", "op", "after",
                           "source_ts_ms"])
    result.changes = [_change(row) for row in columns.to_pylist()
                      if row["position"] is not None]
    marks: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}
    for row in arrow.filter(marks_mask).select(["source", "after"]).to_pylist():
        _keep_watermark(marks, row["source"], row["after"])
    result.watermarks = {source: offset for source, (_, offset) in marks.items()}
    return result


def fold_arrow(batch: Any, history: bool = False) -> FoldResult:
    """The fold of a raw micro-batch collected to the driver as Arrow (``batch.toArrow()``, the
    source schema): the same answer as :func:`fold_records`, computed with Arrow kernels — the
    records sorted by ``(topic, key, position, offset)`` and each group's last one kept
    (truncates never compete) — so only the winners become Python objects. For small and mid-
    sized batches this is several times cheaper than :func:`fold_frame`'s shuffle; the batch
    must fit in the driver's memory (admission control bounds it).

    ``history=True`` keeps every record (truncates still dropped) in the same order instead of
    each group's last: for sinks that do not fold (``Sink.folds`` False, e.g. SCD2)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ops = pc.fill_null(batch.column("op"), "")
    marks_mask = pc.equal(ops, WATERMARK)
    data = batch.filter(pc.invert(marks_mask))
    data_ops = pc.fill_null(data.column("op"), "")
    result = FoldResult(records=data.num_rows)
    if data.num_rows:
        counts = data.group_by("topic").aggregate([([], "count_all")])
        result.records_by_topic = dict(zip(counts.column("topic").to_pylist(),
                                           counts.column("count_all").to_pylist(), strict=True))
        newest = pc.max(data.column("source_ts_ms")).as_py()
        result.newest_ts_ms = None if newest is None else int(newest)
        commits = data.filter(pc.and_(pc.is_in(data_ops, pa.array(COMMITS)),
                                      pc.is_valid(data.column("source_ts_ms"))))
        for topic in pc.unique(commits.column("topic")).to_pylist():
            result.stamps[topic] = commits.filter(pc.equal(commits.column("topic"), topic)) \
                .column("source_ts_ms").to_numpy()
    candidates = data.filter(pc.not_equal(data_ops, TRUNCATE)).select(
        ["topic", "key", "position", "offset", "op", "after", "source", "table",
         "source_ts_ms"])
    if candidates.num_rows:
        ordered = candidates.take(pc.sort_indices(candidates, sort_keys=[
            ("topic", "ascending"), ("key", "ascending"), ("position", "ascending"),
            ("offset", "ascending")]))
        topics, keys = (ordered.column(name).combine_chunks() for name in ("topic", "key"))
        count = ordered.num_rows
        # a row is its group's last when the next row's (topic, key) differs
        last = pc.or_(pc.not_equal(topics.slice(0, count - 1), topics.slice(1)),
                      pc.not_equal(keys.slice(0, count - 1), keys.slice(1)))
        last = pa.concat_arrays([pc.fill_null(last, True), pa.array([True])])
        kept = ordered if history else ordered.filter(last)
        result.changes = [_change(row) for row in kept.to_pylist()]
    marks: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}
    for row in batch.filter(marks_mask).select(["source", "after"]).to_pylist():
        _keep_watermark(marks, row["source"], row["after"])
    result.watermarks = {source: offset for source, (_, offset) in marks.items()}
    return result


def _sums_by_topic(data: Any) -> tuple[list[str], list[int]]:
    """(topics, summed ``records``) of :func:`fold_frame`'s non-watermark rows."""
    if not data.num_rows:
        return [], []
    summed = data.group_by("topic").aggregate([("records", "sum")])
    return summed.column("topic").to_pylist(), [int(n) for n in
                                                summed.column("records_sum").to_pylist()]


def _stamps_by_topic(arrow: Any) -> dict[str, Any]:
    """Per topic, the ``stamps`` lists of :func:`fold_frame`'s Arrow table flattened into one
    int64 numpy array (topics without commits left out)."""
    import pyarrow.compute as pc

    topics, lists = arrow.column("topic"), arrow.column("stamps")
    out: dict[str, Any] = {}
    for topic in pc.unique(topics).to_pylist():
        if topic is None:
            continue
        flat = pc.list_flatten(pc.filter(lists, pc.equal(topics, topic)))
        if len(flat):
            out[topic] = flat.to_numpy()
    return out
