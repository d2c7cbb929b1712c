"""The settings of a ``kind: search`` follower (registered in ``cdc.followers``; light: the
sink's libraries are imported only when ``sinks/search.py`` opens it)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from cdc.config import Duration, FollowerConfig, Size, check_table_names
from cdc.events import TableId


class SearchFollowerConfig(FollowerConfig):
    """An embedded Tantivy full-text index (``sinks/search.py``)."""

    kind: Literal["search"]
    sink: ClassVar[str] = "sinks.search:SearchSink"
    #: the index directory (relative: against the config file's directory)
    path: Path
    #: per table (schema.table), the columns indexed as full text (tokenized); default:
    #: every string column of the table. Every column is stored either way.
    text_fields: dict[str, list[str]] = Field(default_factory=dict)
    #: memory for Tantivy's index writers of one apply call (split over the shards it writes)
    writer_memory: Size = Field(64 * 1024**2, ge=16 * 1024**2)
    #: index shards, fixed when the index is created: keys are spread over them by hash and
    #: each is written by the apply task that owns its keys, so this bounds how many tasks
    #: write at once; a query reads every shard
    shards: int = Field(4, ge=1, le=256)
    #: a batch commits every shard it writes: fewer, larger batches than Redis's and SQL's
    #: (at 50 ms under 5,000 changes/s search's p50 rose from 0.76 to 0.98 s,
    #: docs/benchmarks.md)
    trigger_interval: Duration = Field(0.25, ge=0)

    @field_validator("text_fields")
    @classmethod
    def _text_tables_ok(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        check_table_names(list(value))
        return value

    def check_followed(self, name: str, tables: set[TableId]) -> None:
        stray = [t for t in self.text_fields if TableId.parse(t) not in tables]
        if stray:
            raise ValueError(f"followers.{name}.text_fields: {stray} are not tables this "
                             "follower follows (correct the names, or remove them)")
