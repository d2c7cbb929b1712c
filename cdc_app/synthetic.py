"""A synthetic "shop" table and change workload, for the demo, tests and benchmarks.

It produces real :class:`~cdc.events.ChangeEvent` s (with ``test`` positions) so the log and the
codec can be exercised before, and independently of, any database connector. The generator keeps
its own model of the table (``rows``): the truth a compacted log must agree with.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from cdc.events import ChangeEvent, Column, Op, TableId, TableSchema, TransactionInfo
from cdc.position import Position
from cdc.types import ColumnType

ORDERS = TableSchema(
    source="shop",
    database="shop",
    table=TableId("public", "orders"),
    columns=(
        Column("id", ColumnType("int64", source_type="bigint"), nullable=False),
        Column("customer", ColumnType("string", source_type="text"), nullable=False),
        Column("amount", ColumnType("decimal", 12, 2, source_type="numeric(12,2)")),
        Column("status", ColumnType("enum", values=("new", "paid", "shipped"),
                                    source_type="order_status")),
        Column("placed_at", ColumnType("timestamptz", source_type="timestamptz")),
        Column("note", ColumnType("string", source_type="text")),
    ),
    key=("id",),
)


@dataclass
class Workload:
    """Inserts, updates and deletes over ``keys`` order ids, deterministic for a seed."""

    keys: int = 1000
    seed: int = 7
    note_bytes: int = 100
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    seq: int = 0

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)

    def _row(self, key: int) -> dict[str, Any]:
        rnd = self.random
        return {
            "id": key,
            "customer": f"customer-{rnd.randrange(10_000)}",
            "amount": Decimal(rnd.randrange(1, 10_000_000)).scaleb(-2),
            "status": rnd.choice(("new", "paid", "shipped")),
            "placed_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
            + dt.timedelta(seconds=rnd.randrange(30_000_000)),
            "note": "x" * self.note_bytes,
        }

    def next_event(self) -> ChangeEvent:
        """One change: insert a missing key, else update it (or, one time in ten, delete it)."""
        self.seq += 1
        key = self.random.randrange(self.keys)
        before = self.rows.get(key)
        if before is None:
            op, after = Op.CREATE, self._row(key)
        elif self.random.random() < 0.1:
            op, after = Op.DELETE, None
        else:
            op, after = Op.UPDATE, self._row(key)
        if after is None:
            del self.rows[key]
        else:
            self.rows[key] = after
        return ChangeEvent(
            ORDERS, op, Position.test(self.seq), ts_ms=1_790_000_000_000 + self.seq,
            before=before, after=after,
            source_info={"txId": self.seq, "lsn": self.seq * 64},
            transaction=TransactionInfo(str(self.seq), 1, 1),
        )

    def events(self, count: int) -> Iterator[ChangeEvent]:
        for _ in range(count):
            yield self.next_event()
