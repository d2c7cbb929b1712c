"""The compiled log kernels (cdc/log/_fast.pyx) give exactly the pure-Python results."""

from __future__ import annotations

import importlib
import random
import shutil
import struct
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cdc.log import partitioner, segment
from cdc.log.base import Record
from cdc.log.local import LocalChangeLog


def _compiled() -> ModuleType:
    try:
        return importlib.import_module("cdc.log._fast")
    except ImportError:
        if shutil.which("gcc") or shutil.which("cc"):
            pytest.fail("cdc/log/_fast is not built although a C compiler is here: run "
                        "`make setup` (pip install -e .) and check its output")
        pytest.skip("no C compiler: the compiled log kernels are not built")


def _compiled_core(name: str) -> Any:
    """``name`` of the compiled core kernels (cdc/_fast.pyx)."""
    try:
        return getattr(importlib.import_module("cdc._fast"), name)
    except (ImportError, AttributeError):
        if shutil.which("gcc") or shutil.which("cc"):
            pytest.fail("cdc/_fast is not built although a C compiler is here: run "
                        "`make setup` (pip install -e .) and check its output")
        pytest.skip("no C compiler: the compiled kernels are not built")


def _pure(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> ModuleType:
    """A fresh copy of ``module`` imported with CDC_PURE_PYTHON=1."""
    monkeypatch.setenv("CDC_PURE_PYTHON", "1")
    spec = importlib.util.find_spec(module.__name__)
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    return copy


def test_the_folded_crc32_is_zlibs() -> None:
    """Framing and verification checksum with cdc/log/crc32_fold.h: it must be zlib's CRC-32
    at every length (the fold takes runs of 64+ bytes, in 16-byte steps, zlib the rest), every
    alignment and every starting value; on a CPU without PCLMULQDQ it is zlib itself."""
    fast = _compiled()
    rng = random.Random(5)
    data = rng.randbytes(40_000)
    lengths = list(range(0, 300)) + [rng.randrange(300, 40_000 - 16) for _ in range(200)]
    for length in lengths:
        for start in (0, 1, 5, 8, 13):
            chunk = data[start:start + length]
            for value in (0, 0xFFFFFFFF, rng.getrandbits(32)):
                assert fast.crc32(chunk, value) == zlib.crc32(chunk, value), (length, start)
    assert fast.crc32(bytearray(b"x" * 100)) == zlib.crc32(b"x" * 100)
    assert fast.crc32(memoryview(data)[3:3000]) == zlib.crc32(data[3:3000])
    # chained as framing chains it: one call over the record equals the pieces in turn
    assert fast.crc32(data[1000:2000], fast.crc32(data[:1000])) == zlib.crc32(data[:2000])
    # the folded path is the one used wherever the CPU has the instruction it folds with
    flags = next((line.split(":", 1)[1].split() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), [])
    assert fast.crc32_accelerated() is ("pclmulqdq" in flags and "sse4_1" in flags), flags


def test_murmur2_and_partitions_match(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _compiled()
    pure = _pure(monkeypatch, partitioner)
    assert pure.murmur2 is not fast.murmur2
    rng = random.Random(11)
    keys = [b"", b"a", b"ab", b"abc", b"abcd", b'{"id":1}', "ü€😀".encode()]
    keys += [rng.randbytes(rng.randrange(0, 300)) for _ in range(3000)]
    for key in keys:
        assert fast.murmur2(key) == pure.murmur2(key), key
        for partitions in (1, 3, 8, 1000):
            assert fast.partition_for(key, partitions) == pure.partition_for(key, partitions)
    # Kafka's own value for a known key (the Java client's Utils.murmur2("21") = -973932308)
    assert fast.murmur2(b"21") == -973932308


def test_record_framing_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _compiled()
    pure = _pure(monkeypatch, segment)
    rng = random.Random(12)
    for n in range(2000):
        value = None if n % 7 == 0 else rng.randbytes(rng.randrange(0, 5000))
        args = (rng.randrange(0, 2**63), rng.randrange(-(2**63), 2**63),
                rng.randbytes(rng.randrange(0, 64)), value, rng.randbytes(rng.choice([9, 25])))
        framed = fast.encode_record_bytes(*args)
        assert framed == pure.encode_record_bytes(*args)
        length, crc = struct.unpack_from("<II", framed)
        assert length == len(framed) - 4 and crc == zlib.crc32(framed[8:])


def test_record_parsing_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    """parse_records: the same tuples, cursor and verdict from any cursor, with records cut
    short at the end, a CRC that fails (with and without ``verify``), and a length below the
    header's."""
    fast = _compiled()
    pure = _pure(monkeypatch, segment)
    assert pure.parse_records is not fast.parse_records
    rng = random.Random(13)
    framed = [pure.encode_record_bytes(
        rng.randrange(0, 2**63), rng.randrange(-(2**63), 2**63), rng.randbytes(rng.randrange(64)),
        None if n % 5 == 0 else rng.randbytes(rng.randrange(0, 3000)),
        rng.randbytes(rng.choice([0, 9, 25]))) for n in range(300)]
    buffer = b"".join(framed)
    cases = [(buffer, 0), (buffer[: len(buffer) - 7], 0), (buffer, len(framed[0])), (b"", 0),
             (buffer[:20], 0)]
    corrupt = bytearray(buffer)
    corrupt[sum(map(len, framed[:100])) + 40] ^= 0xFF  # inside record 100's body
    cases.append((bytes(corrupt), 0))
    short = bytearray(buffer)
    struct.pack_into("<I", short, sum(map(len, framed[:50])), 10)  # a length below the header
    cases.append((bytes(short), 0))
    for data, cursor in cases:
        for verify in (True, False):
            got = fast.parse_records(data, cursor, 1000, verify)
            assert got == pure.parse_records(data, cursor, 1000, verify)
    records, end, bad = fast.parse_records(buffer, 0, 1000, True)
    assert (len(records), end, bad) == (300, len(buffer), -1)
    assert [r[3] is None for r in records] == [n % 5 == 0 for n in range(300)]
    assert records[1][5] == 1000 + len(framed[0]) and records[1][6] == len(framed[1])
    assert fast.parse_records(bytes(corrupt), 0, 0, True)[1:] == (sum(map(len, framed[:100])),) * 2
    assert len(fast.parse_records(bytes(corrupt), 0, 0, False)[0]) == 300  # not checked
    assert fast.parse_records(bytes(short), 0, 0, False)[2] == sum(map(len, framed[:50]))


def test_append_results_locate_records(tmp_path: Path) -> None:
    """Each AppendResult says where its record's bytes are; read_at reads exactly it, also
    after a segment roll, and read_located agrees."""
    with LocalChangeLog(tmp_path / "log", partitions=3, segment_bytes=4000) as log:
        log.ensure_topic("t")
        results = []
        sent = []
        for batch in range(6):
            records = [Record("t", f'{{"k":{n}}}'.encode(), None if n % 5 == 0 else
                              bytes([n % 256]) * (n * 37 % 900), bytes([0]) + n.to_bytes(8, "big"))
                       for n in range(batch * 20, batch * 20 + 20)]
            results += log.append(records)
            sent += records
        for record, result in zip(sent, results, strict=True):
            stored = log.read_at("t", result.partition, result.location)
            assert stored is not None
            assert (stored.offset, stored.key, stored.value, stored.position) == (
                result.offset, record.key, record.value, record.position)
        for partition in range(3):
            for stored, where in log.read_located("t", partition):
                again = log.read_at("t", partition, where)
                assert again == stored
        assert log.read_at("t", 0, (tmp_path / "nowhere.seg", 0, 40)) is None


def test_background_flush_returns_offsets_once_durable(tmp_path: Path) -> None:
    """Dispatcher.flush(wait=False) commits in the background: it returns the previous
    commit's offset (durable by then), never one whose records are not in the log; records of
    a running commit stay visible to previous-image lookups; flush() waits for everything."""
    from cdc.avro import EventCodec
    from cdc.log.base import CUT_KEY
    from cdc.log.schemas import SchemaStore
    from cdc.pipeline import Dispatcher
    from cdc_app.synthetic import Workload

    with LocalChangeLog(tmp_path / "log", partitions=4) as log:
        dispatcher = Dispatcher(log, EventCodec(SchemaStore(tmp_path / "log", writable=True)),
                                "shop")
        workload = Workload(seed=3)
        returned = []
        for batch in range(5):
            for event in workload.events(50):
                dispatcher.add(event)
            dispatcher.checkpoint({"batch": batch})
            offset = dispatcher.flush(wait=False)
            returned.append(offset)
            if offset is not None:  # durable: in the committed source offsets
                assert log.source_offsets()["shop"]["batch"] >= offset["batch"]
            running = dispatcher._inflight
            assert running is not None and running[2] == {"batch": batch}
            images = dispatcher.images  # its records stay visible to image lookups
            partial = [r for r in running[1] if r.topic in images._partial_topics]
            assert partial and all(r.key in images._committing[r.topic] for r in partial)
        assert returned == [None, {"batch": 0}, {"batch": 1}, {"batch": 2}, {"batch": 3}]
        assert dispatcher.flush() == {"batch": 4}
        stored = dict(log.source_offsets()["shop"])
        cut = stored.pop(CUT_KEY)
        assert stored == {"batch": 4}
        ends = log.end_offsets("shop.public.orders")  # the last checkpoint is a boundary
        assert cut["shop.public.orders"] == {str(p): end for p, end in ends.items()}
        assert sum(log.end_offsets("shop.public.orders").values()) == dispatcher.stats.records
        assert dispatcher._inflight is None


def test_framing_a_commit_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    """frame_records (one call per commit) places and frames exactly as the pure one: the same
    partitions, offsets, blobs and locations, tombstones and empty keys too; blobs kept from an
    earlier commit are reused (and replaced when a view still holds one); each partition's
    base is asked for once per call, on first touch."""
    from cdc.log.base import AppendResult

    fast, pure = _compiled(), _pure(monkeypatch, segment)
    rng = random.Random(21)
    records = [Record(rng.choice(["a", "b.c"]), rng.randbytes(rng.randrange(0, 40)),
                      None if rng.random() < 0.1 else rng.randbytes(rng.randrange(0, 3000)),
                      rng.randbytes(25)) for _ in range(2000)]
    results = []
    for kernel in (fast, pure):
        blobs: dict[tuple[str, int], bytearray] = {("a", 1): bytearray(b"x" * 100)}
        held = memoryview(blobs[("a", 1)])  # a view still alive: that blob cannot grow
        for commit in range(2):  # the second commit reuses the first one's blobs
            offsets = {"a": [5, 0, 7], "b.c": [100]}
            used: dict[tuple[str, int], int] = {}
            asked: list[tuple[str, int]] = []

            def base_of(topic: str, partition: int, asked: list[tuple[str, int]] = asked
                        ) -> tuple[str, int]:
                asked.append((topic, partition))
                return f"file-{topic}-{partition}", 1000 * len(topic) + partition

            placed = kernel.frame_records(records, offsets, 1_700_000_000_000 + commit, blobs,
                                          used, AppendResult, base_of)
            assert sorted(asked) == sorted(used)  # once each, only those touched
            assert all(type(p) is AppendResult for p in placed)
            written = {where: bytes(blobs[where][:length]) for where, length in used.items()}
            results.append((commit, offsets, written, placed))
        held.release()
    assert results[:2] == results[2:]
    _, offsets, written, placed = results[1]
    assert sum(offsets["a"]) - 12 + offsets["b.c"][0] - 100 == len(records)
    for record, where in zip(records, placed, strict=True):  # each location holds its record
        assert where.location[0] == f"file-{where.topic}-{where.partition}"
        start = where.location[1] - 1000 * len(where.topic) - where.partition
        framed = written[(where.topic, where.partition)][start:start + where.location[2]]
        assert framed == segment.encode_record_bytes(where.offset, 1_700_000_000_001,
                                                     record.key, record.value, record.position)
    with pytest.raises(KeyError):
        fast.frame_records([Record("nowhere", b"k", b"v", b"p")], {}, 0, {}, {}, AppendResult,
                           base_of)


def test_key_index_answers_like_a_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled KeyIndex (previous images' per-partition index) gives the pure one's answers
    for every key put, across growth, overwrites and entries without a location, and nothing for
    keys never put; it stays small (the point of it)."""

    from cdc import images

    compiled = _compiled_core("KeyIndex")
    pure = _pure(monkeypatch, images).KeyIndex
    rng = random.Random(4)
    keys = list({rng.randbytes(rng.randrange(1, 30)) for _ in range(30_000)})
    fast_index, pure_index = compiled(), pure()
    paths = [Path(f"/log/t/0/{n:020d}.seg") for n in range(5)]
    for n, key in enumerate(keys + keys[:5000]):  # the last 5,000 are overwritten
        location = None if n % 7 == 0 else (rng.choice(paths), rng.randrange(2**39),
                                            rng.randrange(1, 2**31))
        fast_index.put(key, n, location)
        pure_index.put(key, n, location)
    assert len(fast_index) == len(pure_index) == len(keys)
    for key in keys:
        assert fast_index.get(key) == pure_index.get(key)
    assert fast_index.get(b"never put") is None
    big = compiled()
    for n in range(100_000):
        big.put(b"k%d" % n, n, (paths[0], n * 100, 100))
    assert len(big) == 100_000 and big.get(b"k99999") == (99_999, (paths[0], 9_999_900, 100))


def test_transaction_ends_advance_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled transactions.advance moves the ends exactly as the pure one does."""
    from cdc import transactions
    from cdc.log.base import AppendResult

    compiled = _compiled_core("advance")
    pure = _pure(monkeypatch, transactions).advance
    rng = random.Random(8)
    results = [AppendResult(rng.choice(["a", "b"]), rng.choice([0, 1, 7, 5000]),
                            rng.randrange(10_000)) for _ in range(3000)]
    fast_ends: dict[str, dict[str, int]] = {"a": {"1": 9_999}}
    pure_ends: dict[str, dict[str, int]] = {"a": {"1": 9_999}}
    for start in range(0, 3000, 700):
        compiled(fast_ends, results[start:start + 700])
        pure(pure_ends, results[start:start + 700])
        assert fast_ends == pure_ends
    assert fast_ends["b"]["5000"] == 1 + max(r.offset for r in results
                                             if (r.topic, r.partition) == ("b", 5000))


def test_remembering_a_batch_matches() -> None:
    """remember_all and value_bytes (the dispatcher's per-batch bookkeeping) give the pure
    results: the latest value per key of the wanted topics only, tombstones included, keys
    dropped from the LRU with their sizes; wrong inputs are refused, not misread."""
    from collections import OrderedDict

    from cdc import images, pipeline

    fast_remember, fast_bytes = _compiled_core("remember_all"), _compiled_core("value_bytes")
    rng = random.Random(8)
    records = [Record(rng.choice(["a", "b", "c"]), b"k%d" % rng.randrange(50),
                      None if rng.random() < 0.2 else rng.randbytes(rng.randrange(0, 99)), b"p")
               for _ in range(3000)]
    outcomes = []
    for remember in (fast_remember, images.remember_all):
        buffered: dict[str, dict[bytes, bytes | None]] = {"a": {b"old": b"x"}}
        lru: OrderedDict[tuple[str, bytes], tuple[bytes | None, int]] = OrderedDict(
            ((topic, b"k%d" % n), (b"v", 400 + n)) for topic in "abc" for n in range(0, 60, 3))
        dropped = remember(records, {"a", "c"}, buffered, lru)
        outcomes.append((dropped, buffered, list(lru.items())))
    assert outcomes[0] == outcomes[1]
    dropped, buffered, left = outcomes[0]
    assert set(buffered) == {"a", "c"} and buffered["a"][b"old"] == b"x"
    assert dropped > 0 and all(topic == "b" or key not in buffered[topic]
                               for (topic, key), _ in left)
    assert fast_bytes(records) == pipeline.value_bytes(records) > 0
    with pytest.raises(TypeError):
        fast_bytes([{"topic": "a"}])
    with pytest.raises(TypeError):
        fast_remember([["a", b"k", b"v", b"p"]], {"a"}, {}, OrderedDict())
