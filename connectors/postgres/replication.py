"""The streaming replication protocol, at the libpq level through psycopg 3.

A replication connection (``replication=database``) runs ``START_REPLICATION SLOT ... LOGICAL``
and then exchanges copy messages: the server sends ``XLogData`` (``w``) carrying pgoutput
messages and primary keepalives (``k``); we send standby status updates (``r``) carrying the LSN
up to which everything is durable on our side, which becomes the slot's
``confirmed_flush_lsn``.

The flush LSN we report is the caller's business: it must only ever be an LSN whose changes are
already durable in the change log.
"""

from __future__ import annotations

import ctypes
import select
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import psycopg
from psycopg import pq

from cdc.errors import CdcError
from cdc.position import format_lsn
from cdc.speedups import pure_python
from connectors.postgres.pgoutput import PG_EPOCH_MICROS

_XLOG = struct.Struct(">QQq")
_KEEPALIVE = struct.Struct(">QqB")
_STATUS = struct.Struct(">cQQQqB")


#: what a drain of the copy stream ended at (ReplicationStream._drain)
DRAIN_IDLE, DRAIN_REPLY, DRAIN_ENDED, DRAIN_BROKEN = 0, 1, 2, 3


class ReplicationError(CdcError):
    """The replication connection failed or was closed by the server."""


class XLogData(NamedTuple):
    """One ``XLogData`` message (a tuple: cheap to make, one per change)."""

    start_lsn: int
    wal_end: int
    payload: bytes


def xlog_data(raw: bytes) -> XLogData:
    """A raw XLogData message (``batches(raw=True)``) as the tuple."""
    start, wal_end, _ = _XLOG.unpack_from(raw, 1)
    return XLogData(start, wal_end, raw[25:])


def compiled_drain(pgconn: Any) -> Callable[..., tuple[int, int]] | None:
    """The compiled drain (``connectors/postgres/_fast.pyx``), bound to the libpq that made
    ``pgconn``; None where it cannot be (not built, ``CDC_PURE_PYTHON=1``, or that libpq is
    not found in this process: then :meth:`ReplicationStream._drain` runs)."""
    if pure_python() or not getattr(pgconn, "pgconn_ptr", None):
        return None
    try:
        from connectors.postgres import _fast  # type: ignore[attr-defined]
    except ImportError:
        return None
    if not hasattr(_fast, "drain"):  # an extension built before the drain was
        return None
    if not _LIBPQ:
        _LIBPQ.append(_find_libpq())
    functions = _LIBPQ[0]
    if functions is None:
        return None
    _fast.bind_libpq(*functions)
    return _fast.drain  # type: ignore[no-any-return]


_LIBPQ: list[tuple[int, int, int] | None] = []


def _find_libpq() -> tuple[int, int, int] | None:
    """The addresses of ``PQgetCopyData``, ``PQconsumeInput`` and ``PQfreemem`` in the one
    libpq this process has loaded (psycopg's), or None when there is not exactly one."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps
                     if "/libpq" in line and ".so" in line.rsplit("/", 1)[-1]}
    except OSError:
        return None
    if len(paths) != 1:
        return None
    try:
        library = ctypes.CDLL(paths.pop())
        return tuple(  # type: ignore[return-value]
            ctypes.cast(getattr(library, name), ctypes.c_void_p).value or 0
            for name in ("PQgetCopyData", "PQconsumeInput", "PQfreemem"))
    except (OSError, AttributeError):
        return None


def _now_pg_micros() -> int:
    return int(time.time() * 1_000_000) - PG_EPOCH_MICROS


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class ReplicationStream:
    """One ``START_REPLICATION`` session on an open replication connection."""

    def __init__(self, connection: psycopg.Connection[object], slot: str, publication: str,
                 start_lsn: int = 0, status_interval: float = 10.0) -> None:
        self.connection = connection
        self.pgconn = connection.pgconn
        self.slot = slot
        self.publication = publication
        self.start_lsn = start_lsn
        self.status_interval = status_interval
        self.flushed_lsn = start_lsn
        self.received_lsn = start_lsn
        self._last_status = 0.0
        self.streaming = False

    def start(self) -> None:
        command = (
            f"START_REPLICATION SLOT {quote_ident(self.slot)} LOGICAL "
            f"{format_lsn(self.start_lsn)} (proto_version '1', "
            f"publication_names {quote_literal(quote_ident(self.publication))}, "
            "messages 'true')"
        )
        result = self.pgconn.exec_(command.encode())
        if result.status != pq.ExecStatus.COPY_BOTH:
            message = (result.error_message or b"").decode(errors="replace").strip()
            raise ReplicationError(f"START_REPLICATION on slot {self.slot!r} failed: {message}",
                                   "check that the slot and the publication exist")
        self.streaming = True

    def messages(self, timeout: float = 1.0) -> Iterator[XLogData | None]:
        """XLogData messages as they arrive; ``None`` after ``timeout`` seconds of silence."""
        for batch in self.batches(timeout):
            if batch is None:
                yield None
            else:
                yield from batch

    def batches(self, timeout: float = 1.0, limit: int = 2048, raw: bool = False
                ) -> Iterator[list[Any] | None]:
        """XLogData messages in lists of what arrived together (at most ``limit``, in order);
        ``None`` after ``timeout`` seconds of silence. ``raw``: each message as the bytes
        received (``w``, start LSN, WAL end, send time, then the pgoutput message at byte 25:
        :func:`xlog_data` makes the tuple) instead of an :class:`XLogData`.

        Keepalives are answered here (with the current flush LSN); status updates are also sent
        every ``status_interval`` seconds.
        """
        pgconn = self.pgconn
        drain = None if not raw else compiled_drain(pgconn)
        while True:
            batch: list[Any] = []
            while True:
                if drain is not None:
                    status, self.received_lsn = drain(pgconn.pgconn_ptr, batch, limit,
                                                      self.received_lsn)
                else:
                    status = self._drain(batch, limit, raw)
                if status == DRAIN_REPLY:
                    self.send_status(force=True)
                    continue
                if status == DRAIN_ENDED:
                    message = pgconn.error_message.decode(errors="replace").strip()
                    raise ReplicationError(
                        f"the replication stream ended: {message or 'server closed it'}",
                        "capture reconnects by itself; if the slot was dropped, run "
                        "`cdc bootstrap` again")
                if status == DRAIN_BROKEN:
                    pgconn.consume_input()  # raises the connection's error
                break
            self._maybe_status()
            if batch:
                yield batch
                continue
            ready, _, _ = select.select([pgconn.socket], [], [], timeout)
            if not ready:
                yield None
                continue
            pgconn.consume_input()

    def _drain(self, batch: list[Any], limit: int, raw: bool) -> int:
        """Append the XLogData messages libpq holds or the socket already has to ``batch``
        (as bytes when ``raw``, else as :class:`XLogData`), at most ``limit`` in all; stop
        when reading more would block (``DRAIN_IDLE``), at a keepalive that asks for a reply
        (``DRAIN_REPLY``: answer, then drain again), when the copy ended or failed
        (``DRAIN_ENDED``) or the socket read failed (``DRAIN_BROKEN``). The compiled twin
        (``connectors/postgres/_fast.pyx``: ``drain``) calls libpq itself and only knows
        ``raw``."""
        pgconn = self.pgconn
        consumed = False
        while len(batch) < limit:
            size, data = pgconn.get_copy_data(1)
            if size > 0:
                consumed = False
                kind = data[0]
                if kind == 0x77:  # 'w'
                    start, wal_end, _ = _XLOG.unpack_from(data, 1)
                    if wal_end > self.received_lsn:
                        self.received_lsn = wal_end
                    batch.append(bytes(data) if raw else
                                 XLogData(start, wal_end, bytes(data[25:])))
                elif kind == 0x6B and _KEEPALIVE.unpack_from(data, 1)[2]:  # 'k', reply asked
                    return DRAIN_REPLY
                continue
            if size < 0:  # -1: the copy ended; -2: an error
                return DRAIN_ENDED
            if consumed:  # libpq read what the socket had: no whole message more
                return DRAIN_IDLE
            # more may wait in the socket: take it too (bigger batches, less overhead per
            # batch); libpq's socket never blocks, so this reads only what is there
            try:
                pgconn.consume_input()
            except psycopg.OperationalError:
                return DRAIN_BROKEN
            consumed = True
        return DRAIN_IDLE

    def finish(self, timeout: float = 5.0) -> bool:
        """End the stream politely: a last status update, then ``CopyDone``, then drain what the
        server still sends until it ends its side too. True when it did within ``timeout``.

        Closing the socket while the server's data is still unread makes the kernel answer
        with a reset, and a reset may throw away our last status update before the walsender
        read it: the slot would then lag the log (harmless — we skip what we hold — but WAL
        stays pinned until the next run confirms again). Draining first avoids that.
        """
        if not self.streaming:
            return True
        self.streaming = False
        pgconn = self.pgconn
        deadline = time.monotonic() + timeout
        self.send_status(force=True)
        if pgconn.put_copy_end() != 1 or pgconn.flush() != 0:
            return False
        while (left := deadline - time.monotonic()) > 0:
            size, _ = pgconn.get_copy_data(1)
            if size > 0:
                continue
            if size < 0:
                break
            if select.select([pgconn.socket], [], [], min(left, 0.2))[0]:
                pgconn.consume_input()
        else:
            return False
        while (left := deadline - time.monotonic()) > 0:  # CommandComplete, ReadyForQuery
            pgconn.consume_input()
            if pgconn.is_busy():
                select.select([pgconn.socket], [], [], min(left, 0.2))
                continue
            if pgconn.get_result() is None:
                return True
        return False

    def confirm(self, lsn: int) -> None:
        """Everything up to ``lsn`` is durable on our side; tell the server soon."""
        if lsn > self.flushed_lsn:
            self.flushed_lsn = lsn

    def _maybe_status(self) -> None:
        if time.monotonic() - self._last_status >= self.status_interval:
            self.send_status(force=True)

    def send_status(self, force: bool = False) -> None:
        """Send a standby status update with the flush LSN."""
        lsn = self.flushed_lsn
        message = _STATUS.pack(b"r", lsn, lsn, lsn, _now_pg_micros(), 0)
        if self.pgconn.put_copy_data(message) != 1 or self.pgconn.flush() != 0:
            raise ReplicationError("cannot send a status update to the server",
                                   "capture reconnects by itself")
        self._last_status = time.monotonic()
