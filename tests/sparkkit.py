"""Helpers for tests that SIGKILL Spark processes (``cdc apply``'s driver, an executor, a
worker): where the queries stand, read from their checkpoints, as positions for
:class:`tests.kills.Watch`."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.kills import Watch, cpu_ticks, descendants


def _last(folder: Path) -> int:
    try:
        ids = [int(name) for name in os.listdir(folder) if name.isdigit()]
    except OSError:
        return -1
    return max(ids, default=-1)


def batches(roots: Iterable[Path]) -> tuple[int, int]:
    """(batches planned, batches committed) summed over the streaming queries whose checkpoints
    are under ``roots`` (Spark writes ``offsets/N`` when it plans batch N and ``commits/N`` once
    its ``foreachBatch`` returned; a planned batch not committed is replayed at the restart)."""
    planned = committed = 0
    for root in roots:
        for offsets in Path(root).rglob("offsets"):
            planned += _last(offsets) + 1
            committed += _last(offsets.parent / "commits") + 1
    return planned, committed


def driver_watch(roots: list[Path], writes: Any = None) -> Watch:
    """A :class:`Watch` of a ``cdc apply`` driver whose queries checkpoint under ``roots``. Its
    position is (batches planned, batches committed, ``writes()``: writes its sinks made, if
    given): a kill lands in flight when any of them advanced in the second before and a planned
    batch is not committed (the restart resumes from the committed ones and replays it)."""
    def position() -> tuple[int, int, int]:
        planned, committed = batches(roots)
        return planned, committed, writes() if writes is not None else 0

    return Watch("cdc apply (driver)", position,
                 ahead=lambda at, committed: at[0] > committed,
                 moved=lambda before, now: sum(now) > sum(before))


def committed_batches(roots: list[Path]) -> int:
    return batches(roots)[1]


def tree_watch(kind: str, pids: Any, roots: list[Path], min_ticks: int = 5) -> Watch:
    """A :class:`Watch` of a Spark executor or worker (``pids()``: its root processes). Its
    position is (CPU ticks of its processes and their children, batches planned by the
    driver): a kill lands in flight when it used at least ``min_ticks`` (1/100 s) of CPU in the
    second before, doing task work, and the driver had a batch planned and not committed (the
    tasks of which Spark runs again elsewhere)."""
    def position() -> tuple[int, int]:
        tree = [pid for root in pids() for pid in descendants(root)]
        return cpu_ticks(tree), batches(roots)[0]

    return Watch(kind, position, ahead=lambda at, committed: at[1] > committed,
                 moved=lambda before, now: now[0] - before[0] >= min_ticks)
