"""The settings of a ``kind: delta`` follower (registered in ``cdc.followers``; light: the
sink's libraries are imported only when ``sinks/delta.py`` opens it)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from cdc.config import Duration, FollowerConfig


class DeltaFollowerConfig(FollowerConfig):
    """A Delta Lake warehouse: one Delta table per source table (``sinks/delta.py``)."""

    kind: Literal["delta"]
    sink: ClassVar[str] = "sinks.delta:DeltaSink"
    #: the directory holding the tables (relative: against the config file's directory)
    path: Path
    #: scd1: the current state of each row; scd2: its whole history (valid_from/valid_to)
    mode: Literal["scd1", "scd2"] = "scd1"
    #: each table is partitioned into this many buckets by a hash of the key, so a MERGE
    #: rewrites only the files of the buckets a batch touches
    buckets: int = Field(16, ge=1, le=4096)
    #: admission control: bigger batches amortise a MERGE's fixed cost
    max_records_per_batch: int = Field(500_000, ge=1)
    #: a MERGE per table per batch rewrites the files it touches: fewer, larger batches (at a
    #: 100 ms trigger Delta's own latency doubled, docs/benchmarks.md)
    trigger_interval: Duration = Field(1.0, ge=0)
