"""Group commit: many small appends share one durable commit.

:meth:`GroupCommitter.append` blocks until its records are durable, like
:meth:`ChangeLogWriter.append`, but appends from several threads (or several calls of one producer
using :meth:`submit`) that arrive within ``interval`` seconds are written and synced together, so
the cost of a sync is paid once per group instead of once per append.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from cdc.log.base import AppendResult, ChangeLogWriter, Record


class GroupCommitter:
    """A flusher thread in front of a :class:`ChangeLogWriter`.

    A group is flushed when ``max_records`` records are pending or the oldest pending append has
    waited ``interval`` seconds, whichever comes first. Source offsets submitted with later
    appends of a group win (they are merged per source, in submission order).
    """

    def __init__(self, log: ChangeLogWriter, interval: float = 0.05,
                 max_records: int = 20_000) -> None:
        self.log = log
        self.interval = interval
        self.max_records = max_records
        self._cond = threading.Condition()
        self._pending: list[tuple[Sequence[Record], Mapping[str, Any] | None, Future[Any]]] = []
        self._pending_records = 0
        self._oldest: float | None = None
        self._stopping = False
        self.groups = 0
        self._thread = threading.Thread(target=self._run, name="cdc-group-commit", daemon=True)
        self._thread.start()

    def submit(self, records: Sequence[Record],
               source_offsets: Mapping[str, Any] | None = None) -> Future[list[AppendResult]]:
        """Queue an append; the future resolves once it is durable (or fails)."""
        future: Future[list[AppendResult]] = Future()
        with self._cond:
            if self._stopping:
                raise RuntimeError("the group committer is closed")
            self._pending.append((records, source_offsets, future))
            self._pending_records += len(records)
            if self._oldest is None:
                self._oldest = time.monotonic()
            self._cond.notify_all()
        return future

    def append(self, records: Sequence[Record],
               source_offsets: Mapping[str, Any] | None = None) -> list[AppendResult]:
        """Append and wait until durable."""
        return self.submit(records, source_offsets).result()

    def _take_group(self) -> list[tuple[Sequence[Record], Mapping[str, Any] | None,
                                        Future[Any]]] | None:
        with self._cond:
            while True:
                if self._pending:
                    assert self._oldest is not None
                    wait = self._oldest + self.interval - time.monotonic()
                    if self._stopping or wait <= 0 or self._pending_records >= self.max_records:
                        group, self._pending = self._pending, []
                        self._pending_records, self._oldest = 0, None
                        return group
                    self._cond.wait(wait)
                elif self._stopping:
                    return None
                else:
                    self._cond.wait()

    def _run(self) -> None:
        while True:
            group = self._take_group()
            if group is None:
                return
            records: list[Record] = []
            offsets: dict[str, Any] = {}
            for batch, source_offsets, _ in group:
                records.extend(batch)
                if source_offsets:
                    offsets.update(source_offsets)
            try:
                results = self.log.append(records, offsets or None)
            except BaseException as exc:  # hand the failure to every waiter of the group
                for _, _, future in group:
                    future.set_exception(exc)
                continue
            self.groups += 1
            start = 0
            for batch, _, future in group:
                future.set_result(results[start : start + len(batch)])
                start += len(batch)

    def close(self) -> None:
        """Flush what is pending, then stop the flusher thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
