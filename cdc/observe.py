"""What capture tells an observer about itself (``cdc capture --metrics-port``:
:mod:`cdc_app.metrics`).

The core calls these hooks at most once per commit, flush, idle wait, error or snapshot
progress step — never once per event — so an observer must be cheap but need not be fast
per event. The default observer does nothing; :class:`cdc_app.metrics.CaptureMetrics` turns the
calls into Prometheus metrics. Hooks may be called from a capture thread or from the
dispatcher's background commit thread, and must never raise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cdc.log.base import Record
    from cdc.offsets import SourceOffset


class CaptureObserver:
    """The hooks of capture and bootstrap; every one a no-op here."""

    def committed(self, source: str, records: Sequence[Record], seconds: float,
                  newest_commit_ms: int | None) -> None:
        """The log committed ``records`` of ``source`` in ``seconds``; ``newest_commit_ms`` is
        the source commit time (ms since the epoch) of the newest transaction in them, if any
        began since the previous commit."""

    def durable(self, source: str, offset: SourceOffset) -> None:
        """``offset`` of ``source`` is durable in the log (and now confirmed to the server)."""

    def idle(self, source: str) -> None:
        """The source had nothing more to send: capture has caught up with it."""

    def error(self, source: str, kind: str) -> None:
        """A failure of kind ``kind`` (its exception class) interrupted ``source``."""

    def state(self, source: str, state: str, detail: str = "") -> None:
        """``source`` is now ``state``: ``snapshotting`` (its bootstrap copies the tables),
        ``streaming``, ``reconnecting`` (``detail``: the error that interrupted it) or
        ``stopped``. Called at every flush too: it must be cheap."""

    def snapshot_event(self, source: str, event: str, table: str) -> None:
        """An incremental snapshot of ``source`` notifies, as Debezium's notifications do:
        ``started`` / ``table_done`` / ``failed`` for ``table``, ``completed`` (no table left
        running; ``table`` empty)."""

    def snapshot_progress(self, source: str, table: str, rows: int,
                          estimated: int | None) -> None:
        """The snapshot of ``table`` has copied ``rows`` of about ``estimated``."""


#: the observer of a capture nobody watches
NO_OBSERVER = CaptureObserver()
