"""What a follower's Spark checkpoint says about where it resumes.

A streaming checkpoint holds ``offsets/<batch>`` (written when a batch is planned: a version
line, a metadata line, then one line per source with the source's end offset as JSON) and
``commits/<batch>`` (written once the batch's writes succeeded). A restarted query resumes
after the newest *committed* batch — a planned batch without its commit is run again from the
same start — so where a follower resumes reading is the end offset of its newest committed
batch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _batches(directory: Path) -> list[int]:
    try:
        return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    except FileNotFoundError:
        return []


def resume_offsets(checkpoint: Path) -> dict[str, Any] | None:
    """The cdc source's offset (``{"topics": {topic: {partition: offset}}, ...}``) a query on
    ``checkpoint`` resumes from; None when it starts from offset 0 (no committed batch)."""
    committed = _batches(checkpoint / "commits")
    if not committed:
        return None
    try:
        lines = (checkpoint / "offsets" / str(committed[-1])).read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines[2:]:
        try:
            offset = json.loads(line)
        except ValueError:
            continue
        if isinstance(offset, dict) and "topics" in offset:
            return offset
    return None


def remove_torn_writes(checkpoint: Path) -> list[str]:
    """Delete the temporary files a killed query left in ``offsets/`` and ``commits/`` (Spark
    writes ``.<batch>.<uuid>.tmp`` and renames it; a SIGKILL between the two leaves it). They
    never hold data Spark reads, but Spark 4 refuses to start batch 0 while ``offsets/`` holds
    anything (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``). The names removed."""
    removed = []
    for part in ("offsets", "commits"):
        directory = checkpoint / part
        if not directory.is_dir():
            continue
        for path in directory.iterdir():
            name = path.name
            if name.startswith(".") and (name.endswith(".tmp") or name.endswith(".tmp.crc")):
                path.unlink(missing_ok=True)
                removed.append(f"{part}/{name}")
    return removed

