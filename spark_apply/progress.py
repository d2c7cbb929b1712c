"""A follower's own progress record: how far into the log it has applied.

``cdc apply`` keeps one record per follower (and per view) in the follower's progress folder
(``followers.<name>.checkpoint``; default ``<log dir's parent>/state/apply/<name>``), in the
file ``progress.json``. It is the only place apply's progress lives: no Spark checkpoint is
read or written.

Contract, stated exactly:

* ``offsets["topics"][topic][partition]`` is the *next* offset to read — one past the last
  offset whose record the follower has applied (or skipped by its version gate). A topic or
  partition missing from it starts at 0. ``offsets["watermarks"]``, when present, are the
  source offsets the batch that ended there was complete up to (``spark_apply/planning.py``).
* The record is written **after** the batch's writes and its watermarks succeeded, atomically
  (a temporary file, fsync, rename, fsync of the folder): a crash before it leaves the previous
  record, and the batch is read again — the version gate makes the replay change nothing.
  So the record never claims more than the follower holds; it may claim less.
* A record of a newer format is refused (:func:`cdc.errors.check_format`), never guessed at.
* Beside it, ``planned.json`` says which batch is being written (its number, start and end
  offsets), written when the batch is handed to the follower's runner — without fsync: it is
  for people and tests looking at a running apply (``cdc status``), never read to resume.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc.errors import CdcError, check_format

#: the progress record's file in a follower's progress folder
FILE = "progress.json"
#: the batch being written, beside the record (informational: never read to resume)
PLANNED = "planned.json"
#: the record's layout version (this version writes and reads format 1)
FORMAT = 1


class ProgressError(CdcError):
    """A follower's progress record cannot be read or written."""


@dataclass
class Progress:
    """One follower's record (see the module docstring)."""

    offsets: dict[str, Any] = field(default_factory=lambda: {"topics": {}})
    #: batches applied since the record was created
    batches: int = 0
    #: when it was last written (ms since the epoch; 0: never)
    updated_ms: int = 0

    @property
    def started(self) -> bool:
        """Whether any batch was applied (a follower without one reads the log from 0)."""
        return self.batches > 0


def path_of(folder: Path) -> Path:
    return folder / FILE


def load(folder: Path) -> Progress:
    """The record in ``folder`` (an empty one when there is none yet)."""
    path = path_of(folder)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Progress()
    except OSError as exc:
        raise ProgressError(f"cannot read the progress record {path}: {exc.strerror}",
                            "make the folder readable by the user running cdc apply") from None
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except ValueError:
        raise ProgressError(f"the progress record {path} is not valid JSON",
                            "restore it from a backup, or delete the folder to rebuild the "
                            "follower from offset 0 (the version gate keeps that exact)") from None
    check_format(data.get("format", 1), FORMAT, f"the progress record {path}",
                 error=ProgressError)
    offsets = data.get("offsets")
    if not isinstance(offsets, dict) or not isinstance(offsets.get("topics"), dict):
        raise ProgressError(f"the progress record {path} has no offsets",
                            "delete the folder to rebuild the follower from offset 0")
    return Progress(offsets, int(data.get("batches", 0)), int(data.get("updated_ms", 0)))


def save(folder: Path, progress: Progress) -> None:
    """Write ``progress`` atomically and durably (see the module docstring)."""
    path = path_of(folder)
    progress.updated_ms = int(time.time() * 1000)
    body = json.dumps({"format": FORMAT, "offsets": progress.offsets,
                       "batches": progress.batches, "updated_ms": progress.updated_ms},
                      sort_keys=True, separators=(",", ":"))
    temporary = folder / f".{FILE}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(temporary, "w") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise ProgressError(f"cannot write the progress record {path}: {exc.strerror}",
                            "free space on that disk or make the folder writable; the batch is "
                            "applied again on restart (the version gate keeps it exact)") from None


def applied_offsets(folder: Path) -> dict[str, Any] | None:
    """The log offsets a follower whose progress folder is ``folder`` resumes from
    (``{"topics": {topic: {partition: next offset}}, ...}``); None when it starts from offset 0
    (no batch applied yet, or no readable record)."""
    try:
        progress = load(folder)
    except ProgressError:
        return None
    return progress.offsets if progress.started else None


def save_planned(folder: Path, batch: int, start: dict[str, Any], end: dict[str, Any]) -> None:
    """Say that batch number ``batch`` (``start`` to ``end``) is being written (see the module
    docstring: no fsync, best effort)."""
    body = json.dumps({"format": FORMAT, "batch": batch, "start": start, "end": end,
                       "planned_ms": int(time.time() * 1000)}, sort_keys=True,
                      separators=(",", ":"))
    temporary = folder / f".{PLANNED}.tmp"
    with contextlib.suppress(OSError):
        temporary.write_text(body)
        os.replace(temporary, folder / PLANNED)


def load_planned(folder: Path) -> dict[str, Any] | None:
    """The batch being written (or last written) as :func:`save_planned` said; None if none."""
    try:
        data = json.loads((folder / PLANNED).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
