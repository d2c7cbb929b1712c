"""A follower stopped for longer than the log keeps tombstones may have missed deletes: refused
before it resumes, with the fix (rebuild it).

The rule: the records a follower would read next (from its progress record,
``spark_apply/progress.py``) must have been appended within the log's tombstone retention
(:func:`cdc.log.base.stale_partitions`); otherwise a delete's tombstone it never saw may be
compacted away, and the follower would keep the row forever.
"""

from __future__ import annotations

import time
from pathlib import Path

from cdc.config import Config
from cdc.errors import CdcError
from cdc.log.base import stale_partitions
from cdc.log.open import must_read
from cdc.transactions import is_transaction_topic
from spark_apply import progress as records


class FollowerStaleError(CdcError):
    """A follower stopped for longer than the log keeps tombstones: it must be rebuilt."""


def refuse_if_stale(config: Config, name: str, checkpoint: Path) -> None:
    """Raise :class:`FollowerStaleError` if follower ``name`` would resume behind what the log
    still guarantees (:func:`cdc.log.base.stale_partitions`)."""
    resume = records.applied_offsets(checkpoint)
    if resume is None:
        return
    reader = must_read(config)
    try:
        topics = reader.committed().topics
        rows = {topic: parts for topic, parts in resume.get("topics", {}).items()
                if topic in topics and not is_transaction_topic(topics[topic].meta)}
        stale = stale_partitions(reader, rows, int(time.time() * 1000))
    finally:
        reader.close()
    if not stale:
        return
    first = stale[0]
    age = (time.time() * 1000 - first.appended_ms) / 1000
    raise FollowerStaleError(
        f"follower {name} stopped too long ago: it would resume {first.topic} partition "
        f"{first.partition} at offset {first.resume}, and the next record there was appended "
        f"{age / 3600:.1f} h ago, longer than the log keeps tombstones "
        f"({first.retention / 3600:g} h); deletes it never saw may be compacted away "
        f"({len(stale)} partition(s) so)",
        f"rebuild this follower: stop `cdc apply`, empty the follower and delete its progress "
        f"folder {checkpoint}, then run `cdc apply` (it reads the log from offset 0); raise "
        "log.tombstone_retention if followers may stop this long")
