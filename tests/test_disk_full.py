"""A full disk: a clear error, nothing acknowledged lost, and the log works again once space is
freed. Runs on a tiny tmpfs (needs root to mount; skipped otherwise)."""

import os
import subprocess
from pathlib import Path

import pytest

from cdc.errors import LogError
from cdc.log.local import LocalChangeLog, LocalChangeLogReader
from tests.conftest import TOPIC, expected_value, make_record


@pytest.fixture
def tiny_disk(tmp_path: Path):
    mount = tmp_path / "tiny"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)],
                            capture_output=True)
    if result.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_is_reported_and_loses_nothing(tiny_disk: Path) -> None:
    filler = tiny_disk / "filler"
    filler.write_bytes(os.urandom(96 * 1024))
    log = LocalChangeLog(tiny_disk / "log", partitions=2, segment_bytes=16 * 1024)
    log.ensure_topic(TOPIC)
    acknowledged = []
    seq = 0
    with pytest.raises(LogError) as caught:
        while True:
            batch = [make_record(s, s % 50, size=700) for s in range(seq, seq + 20)]
            for s, result in zip(range(seq, seq + 20), log.append(batch, {"s": seq + 19}),
                                 strict=True):
                acknowledged.append((s, result.partition, result.offset))
            seq += 20
    assert "disk is full" in str(caught.value) and "free space" in str(caught.value)
    assert len(acknowledged) > 100

    def check(reader: LocalChangeLogReader) -> None:
        stored = {(p, r.offset): r.value for p in (0, 1) for r in reader.read(TOPIC, p)}
        for s, partition, offset in acknowledged:
            assert stored[(partition, offset)] == expected_value(s, s % 50, 700)
        assert reader.source_offsets() == {"s": acknowledged[-1][0]}

    check(LocalChangeLogReader(tiny_disk / "log"))
    filler.unlink()  # the operator frees space
    batch = [make_record(s, s % 50, size=700) for s in range(seq, seq + 20)]
    for s, result in zip(range(seq, seq + 20), log.append(batch, {"s": seq + 19}), strict=True):
        acknowledged.append((s, result.partition, result.offset))
    log.close()
    check(LocalChangeLogReader(tiny_disk / "log"))
    with LocalChangeLog(tiny_disk / "log", partitions=2) as reopened:  # recovery is clean too
        check(reopened)
