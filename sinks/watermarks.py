"""A follower's watermarks in one small JSON file (for sinks without a store of their own that
could hold them: the Delta and search followers).

Format (``version`` 1)::

    {"version": 1, "sources": {"<source>": {"offset": {...}, "order": [...]}}}

``offset`` is the source offset exactly as :meth:`Sink.set_watermark` got it; ``order`` is its
:func:`cdc.offsets.offset_order`, kept so that a watermark only ever moves forward: an
offset whose order is below the stored one (same shape) is ignored. Every write replaces the
file atomically and durably: a temp file beside it, fsync, rename over it, fsync of the
directory — a crash leaves the old file or the new one, never a torn one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cdc.errors import CdcError, check_format

FORMAT = 1


class WatermarkFile:
    """The watermarks of follower ``follower`` at ``path``; failures raise ``error`` (the
    sink's own :class:`CdcError` subclass) naming the file and the fix."""

    def __init__(self, path: Path, follower: str, error: type[CdcError]) -> None:
        self.path = path
        self.follower = follower
        self.error = error

    def entries(self) -> dict[str, Any]:
        """``{source: {"offset": ..., "order": [...]}}`` as stored (empty without a file)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise self.error(f"follower {self.follower}: cannot read {self.path} ({exc})",
                             "restore it, or delete it (`cdc apply` writes it again after "
                             "its next batch)") from None
        version = data.get("version", FORMAT) if isinstance(data, dict) else FORMAT
        check_format(version, FORMAT, f"follower {self.follower}: the watermarks {self.path}",
                     fix="run the cdc version that wrote the follower (or a newer one)",
                     error=self.error)
        sources = data.get("sources") if isinstance(data, dict) else None
        return dict(sources) if isinstance(sources, dict) else {}

    def get(self, source: str) -> dict[str, Any] | None:
        """The stored offset of ``source`` (``None``: never set)."""
        held = self.entries().get(source)
        if not isinstance(held, dict) or not isinstance(held.get("offset"), dict):
            return None
        return dict(held["offset"])

    def advance(self, source: str, offset: Mapping[str, Any]) -> None:
        """Store ``offset`` for ``source`` unless the stored one orders after it. Several
        writers may share the file (a follower and the views it holds, in threads or
        processes): the read-modify-write holds a lock, so none loses another's entry."""
        with _locked(self.path):
            self._advance(source, offset)

    def _advance(self, source: str, offset: Mapping[str, Any]) -> None:
        from cdc.offsets import offset_order

        order = list(offset_order(offset))
        sources = self.entries()
        held = sources.get(source)
        if isinstance(held, dict):
            before = list(held.get("order") or [])
            if order and len(before) == len(order) and order < before:
                return
        sources[source] = {"offset": dict(offset), "order": order}
        text = json.dumps({"version": FORMAT, "sources": sources}, sort_keys=True, indent=1)
        try:
            replace_file(self.path, text)
        except OSError as exc:
            raise self.error(f"follower {self.follower}: cannot write {self.path} "
                             f"({exc.strerror})", "free disk space or fix the directory's "
                             "permissions; the batch is replayed on restart") from None


_THREAD_LOCKS: dict[Path, threading.Lock] = {}
_GUARD = threading.Lock()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """This thread alone, and this process alone (``flock`` on ``<file>.lock``), for ``path``."""
    with _GUARD:
        lock = _THREAD_LOCKS.setdefault(path, threading.Lock())
    with lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            os.close(handle)


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically and durably: a temp file beside it, fsync, rename
    over ``path``, fsync of the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
