"""The follower contract (``cdc/sink.py``), once for every sink kind, through the public Sink
API only (apply, set_watermark, watermark, read, keys, check, owner, refresh, close).

Every sink runs on a real server or in a real directory: Redis on the session's redis-server,
Delta (scd1 and scd2) and search (Tantivy) in ``tmp_path``. Batches are source-schema rows
(``tests/sinkkit.py``) handed over the way the batch handler does: folded
(``fold_records``) for sinks that fold, every record in (position, offset) order per key for
sinks that do not (``folds`` False: Delta scd2). Kind-specific layouts, types, queries and
maintenance stay in ``test_redis_sink.py``, ``test_delta_sink.py`` and ``test_search_sink.py``.
"""

from __future__ import annotations

import json
import multiprocessing
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc.errors import CdcError
from cdc.position import Position
from cdc.sink import Change, Sink, row_text
from cdc_app.servers.postgres import free_port
from tests.sinkkit import (
    KINDS,
    TOPIC,
    MiniLog,
    apply_in_batches,
    build_sink,
    changes_of,
    expected_rows,
    held_rows,
    install_plugin,
    key_json,
    pos,
    race_writer,
    random_log,
    v_of,
)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def settings(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """What the kind's sink is opened on: an emptied redis-server, or a fresh directory."""
    if kind == "redis":
        return {"redis_url": request.getfixturevalue("redis_url")}
    if kind == "sql-postgres":
        database = request.getfixturevalue("pg_db")
        return {"url": database.dsn().replace("postgresql://", "postgresql+psycopg://", 1)}
    if kind == "plugin-lite":
        return {"root": str(tmp_path / "follower"), "plugin": request.getfixturevalue("plugin")}
    return {"root": str(tmp_path / "follower")}


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The out-of-tree ``lite`` follower kind installed on a temporary ``sys.path`` entry
    (``tests/plugin/cdc_lite.py``), uninstalled afterwards."""
    from cdc.config import forget_kinds

    directory = install_plugin(tmp_path / "site-packages")
    monkeypatch.syspath_prepend(str(directory))
    forget_kinds()
    yield str(directory)
    monkeypatch.undo()
    forget_kinds()


@pytest.fixture
def sink(kind: str, settings: dict[str, str]) -> Iterator[Sink]:
    made = build_sink(kind, settings)
    yield made
    made.close()


def change(key: int, seq: int, row: dict[str, Any] | None, op: str = "u") -> Change:
    return Change(TOPIC, "src", "public.items", key_json(key), pos(seq),
                  row, "d" if row is None else op, 1_000_000 + seq)


def last_watermark(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return json.loads([r for r in rows if r["op"] == "w"][-1]["after"])


def apply_one(sink: Sink, *changes: Change) -> tuple[int, int, int]:
    stats = sink.apply(list(changes))
    return stats.written, stats.deleted, stats.skipped


# ---------------------------------------------------------------------------- the fold cases

def test_out_of_order_within_a_batch(sink: Sink) -> None:
    log = MiniLog(ts="position")
    log.upsert(1, pos(5), 5)
    log.upsert(1, pos(9), 9)
    log.upsert(1, pos(7), 7)
    applied, _ = apply_in_batches(sink, log.rows, 10)
    assert applied >= 1
    assert held_rows(sink) == {key_json(1): {"id": "1", "v": "9"}}
    # the follower remembers position 9 (not 7, the last offset): 8 is gated, 10 passes
    assert apply_one(sink, change(1, 8, {"id": 1, "v": 8})) == (0, 0, 1)
    assert apply_one(sink, change(1, 10, {"id": 1, "v": 10})) == (1, 0, 0)
    assert v_of(sink, 1) == 10


def test_out_of_order_across_batches_is_gated(sink: Sink) -> None:
    log = MiniLog(ts="position")
    log.upsert(1, pos(9), 9)
    log.upsert(1, pos(5), 5)
    log.upsert(1, pos(9), 99)  # an equal position is not newer
    assert apply_in_batches(sink, log.rows, 1) == (1, 2)
    assert v_of(sink, 1) == 9
    assert list(sink.keys(TOPIC)) == [key_json(1)]


def test_random_log_in_batches_of_any_size_equals_the_reference(sink: Sink) -> None:
    """The same log applied in batches of several sizes (each size into a table of its own)
    ends equal to the reference fold: newest per key, deleted keys absent."""
    for size in (4, 29, 10_000):
        topic = f"s{size}.public.items{size}"
        log = random_log(size, keys=30, changes=200, topic=topic, ts="position")
        applied, _ = apply_in_batches(sink, log.rows, size)
        want = expected_rows(log)
        assert want and applied >= len(want)
        assert held_rows(sink, topic) == want, size
        assert sink.watermark(f"s{size}") == {"lsn": 194}, size


def test_positions_order_like_their_bytes(sink: Sink) -> None:
    """The gate compares positions as bytes, left to right, unsigned: pairs that differ in
    every part and in high bits, one key per pair."""
    rng = random.Random(5)
    values = [Position.postgres(rng.choice([0, 1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 4])
                                + rng.randint(0, 3), rng.randint(0, 2**64 - 1)).to_bytes()
              for _ in range(61)]
    values += [pos(7), pos(7)]  # equal: not newer
    pairs = list(zip(values, values[1:], strict=False))
    first = [Change(TOPIC, "src", "public.items", key_json(k), a, {"id": k, "v": 1}, "c")
             for k, (a, _) in enumerate(pairs)]
    second = [Change(TOPIC, "src", "public.items", key_json(k), b, {"id": k, "v": 2}, "u")
              for k, (_, b) in enumerate(pairs)]
    sink.apply(first)
    stats = sink.apply(second)
    assert stats.written == sum(b > a for a, b in pairs)
    held = held_rows(sink)
    for k, (a, b) in enumerate(pairs):
        assert held[key_json(k)]["v"] == ("2" if b > a else "1"), (a.hex(), b.hex())


def test_one_batch_per_key_mix_counts(sink: Sink) -> None:
    """written/deleted/skipped of one batch: new keys, newer and older versions, deletes that
    pass and deletes the gate refuses."""
    first = MiniLog(ts="position")
    for key in range(1, 7):
        first.upsert(key, pos(10), 10, "c")
    apply_in_batches(sink, first.rows, 100)
    second = MiniLog(ts="position")
    second.upsert(1, pos(11), 11)       # newer: written
    second.upsert(2, pos(9), 9)         # older: skipped
    second.add(3, pos(12), "d")         # delete: deleted
    second.add(4, pos(8), "d")          # older delete: skipped
    second.upsert(8, pos(1), 1, "c")    # new key: written
    second.add(9, pos(13), "d")         # delete of an unknown key: deleted (a marker)
    changes, _ = changes_of(sink, second.rows)
    stats = sink.apply(changes)
    assert (stats.written, stats.deleted, stats.skipped) == (2, 2, 2)
    assert {k: r["v"] for k, r in held_rows(sink).items()} == {
        key_json(1): "11", key_json(2): "10", key_json(4): "10", key_json(5): "10",
        key_json(6): "10", key_json(8): "1"}


# ----------------------------------------------------------------- replays and restarts

def test_replay_from_offset_zero_changes_nothing(sink: Sink) -> None:
    log = random_log(1, changes=400, ts="position")
    apply_in_batches(sink, log.rows, 37)
    want = expected_rows(log)
    assert held_rows(sink) == want
    applied, skipped = apply_in_batches(sink, log.rows, 53)  # from 0, other batch bounds
    assert applied == 0 and skipped > 0
    assert held_rows(sink) == want
    assert sink.watermark("src") == {"lsn": 388}
    # the replay left every key's position as it was: replaying again still skips all
    assert apply_in_batches(sink, log.rows, len(log.rows))[0] == 0


def test_duplicate_batches_change_nothing(sink: Sink) -> None:
    log = random_log(2, changes=250, ts="position")
    for begin in range(0, len(log.rows), 60):
        changes, _ = changes_of(sink, log.rows[begin:begin + 60])
        first = sink.apply(changes)
        after_first = held_rows(sink)
        second = sink.apply(changes)  # a crashed batch, replayed
        assert (second.written, second.deleted) == (0, 0)
        assert second.skipped == first.written + first.deleted + first.skipped == len(changes)
        assert held_rows(sink) == after_first
    assert held_rows(sink) == expected_rows(log)


def test_restart_mid_log(kind: str, settings: dict[str, str]) -> None:
    """A crash after the writes of a batch, before its checkpoint: a new process (a new sink on
    the same follower) resumes from an earlier offset; the replayed part changes nothing."""
    log = random_log(3, changes=400, ts="position")
    crash, resume = 330, 250  # rows applied before the crash; where the checkpoint was
    first = build_sink(kind, settings)
    try:
        apply_in_batches(first, log.rows[:crash], 40)
        assert held_rows(first) == expected_rows(log.rows[:crash])
    finally:
        first.close()
    second = build_sink(kind, settings)
    try:
        assert second.watermark("src") == last_watermark(log.rows[:crash])
        assert apply_in_batches(second, log.rows[resume:crash], 25)[0] == 0
        apply_in_batches(second, log.rows[crash:], 25)
        assert held_rows(second) == expected_rows(log)
        assert second.watermark("src") == {"lsn": 388}
    finally:
        second.close()


# ---------------------------------------------------------------------------- deletes

def test_delete_then_reinsert(sink: Sink) -> None:
    log = MiniLog(ts="position")
    log.upsert(1, pos(1), 1, "c")
    log.delete(1, pos(2))
    log.upsert(1, pos(3), 3, "c")
    log.upsert(2, pos(1), 1, "c")
    apply_in_batches(sink, log.rows, 100)  # one batch
    assert held_rows(sink) == {key_json(1): {"id": "1", "v": "3"},
                               key_json(2): {"id": "2", "v": "1"}}


def test_delete_then_reinsert_one_record_per_batch(sink: Sink) -> None:
    log = MiniLog(ts="position")
    log.upsert(1, pos(1), 1, "c")
    log.delete(1, pos(2))
    log.upsert(1, pos(3), 3, "c")
    assert apply_in_batches(sink, log.rows[:2], 1) == (2, 0)  # insert, delete
    assert apply_in_batches(sink, log.rows[2:3], 1) == (0, 1)  # the tombstone: not newer
    assert v_of(sink, 1) is None and list(sink.keys(TOPIC)) == []
    assert sink.read(TOPIC, [key_json(1)]) == {}
    assert apply_in_batches(sink, log.rows[3:], 1) == (1, 0)  # the re-insert
    assert held_rows(sink) == {key_json(1): {"id": "1", "v": "3"}}
    # the re-insert replaced the marker: a replay of the whole key stays at the re-insert
    assert apply_in_batches(sink, log.rows, 1) == (0, 4)
    assert v_of(sink, 1) == 3


def test_delete_marker_stops_a_late_older_record(sink: Sink) -> None:
    assert apply_one(sink, change(1, 1, {"id": 1, "v": 1}, "c"),
                     change(2, 1, {"id": 2, "v": 1}, "c")) == (2, 0, 0)
    assert apply_one(sink, change(1, 5, None)) == (0, 1, 0)
    assert held_rows(sink) == {key_json(2): {"id": "2", "v": "1"}}
    # an update committed before the delete, arriving late (a replay): it cannot resurrect
    assert apply_one(sink, change(1, 4, {"id": 1, "v": 4})) == (0, 0, 1)
    assert apply_one(sink, change(1, 5, None)) == (0, 0, 1)  # the tombstone after the delete
    assert held_rows(sink) == {key_json(2): {"id": "2", "v": "1"}}
    assert apply_one(sink, change(1, 6, {"id": 1, "v": 6}, "c")) == (1, 0, 0)
    assert v_of(sink, 1) == 6


def test_delete_of_an_unknown_key_is_remembered(sink: Sink) -> None:
    """A follower built from a compacted log may see a key's delete first: the marker keeps
    a later-arriving older record out."""
    log = MiniLog(ts="position")
    log.delete(7, pos(5))
    log.upsert(7, pos(3), 3, "c")
    assert apply_in_batches(sink, log.rows[:2], 2)[0] == 1  # delete + tombstone: one marker
    assert apply_in_batches(sink, log.rows[2:], 1) == (0, 1)
    assert list(sink.keys(TOPIC)) == [] and sink.read(TOPIC, [key_json(7)]) == {}
    assert apply_one(sink, change(7, 6, {"id": 7, "v": 6}, "c")) == (1, 0, 0)
    assert v_of(sink, 7) == 6


# ------------------------------------------------------------------------- watermarks

def test_watermarks_only_move_forward(kind: str, settings: dict[str, str], sink: Sink) -> None:
    assert sink.watermark("src") is None
    sink.set_watermark("src", {"lsn": 2**40, "lsn_text": "100/0"})
    sink.set_watermark("src", {"lsn": 5})
    sink.set_watermark("other", {"lsn": 1})
    sink.set_watermark("my", {"file_seq": 2, "pos": 4})
    sink.set_watermark("my", {"file_seq": 1, "pos": 900})  # MySQL: the file orders first
    assert sink.watermark("src") == {"lsn": 2**40, "lsn_text": "100/0"}
    assert sink.watermark("other") == {"lsn": 1}
    assert sink.watermark("my") == {"file_seq": 2, "pos": 4}
    again = build_sink(kind, settings)  # another process of the same follower
    try:
        assert again.watermark("src") == {"lsn": 2**40, "lsn_text": "100/0"}
        again.set_watermark("src", {"lsn": 2**40 + 1})
        again.set_watermark("my", {"file_seq": 2, "pos": 5})
    finally:
        again.close()
    assert sink.watermark("src") == {"lsn": 2**40 + 1}
    assert sink.watermark("my") == {"file_seq": 2, "pos": 5}
    assert sink.watermark("nobody") is None


# ------------------------------------------------------------------------ schema changes

def test_schema_change_mid_stream(sink: Sink) -> None:
    """A column added upstream (rows written later have it, older ones do not), one dropped,
    one retyped: every row reads back as the leader's row text."""
    sink.apply([change(1, 1, {"id": 1, "name": "a", "qty": 5}, "c"),
                change(2, 1, {"id": 2, "name": "b", "qty": 6}, "c")])
    # note added
    sink.apply([change(2, 2, {"id": 2, "name": "b", "qty": 6, "note": "fresh words"}),
                change(3, 2, {"id": 3, "name": "c", "qty": 7, "note": None}, "c")])
    rows = {1: {"id": 1, "name": "a", "qty": 5},
            2: {"id": 2, "name": "b", "qty": 6, "note": "fresh words"},
            3: {"id": 3, "name": "c", "qty": 7}}
    assert held_rows(sink) == {key_json(k): row_text(r) for k, r in rows.items()}
    # name dropped, qty retyped to text
    rows[3] = {"id": 3, "qty": "seven", "note": "x"}
    sink.apply([change(3, 3, rows[3])])
    assert held_rows(sink) == {key_json(k): row_text(r) for k, r in rows.items()}
    assert sink.read(TOPIC, [key_json(1)]) == {key_json(1): {"id": "1", "name": "a",
                                                             "qty": "5"}}


# ------------------------------------------------------------------------- owner, check

def test_owner_is_stable_and_in_range(kind: str, settings: dict[str, str], sink: Sink) -> None:
    keys = [key_json(k).encode() for k in range(300)]
    for writers in (1, 2, 3, 7):
        owners = [sink.owner(TOPIC, key, writers) for key in keys]
        assert all(0 <= o < writers for o in owners)
        assert [sink.owner(TOPIC, key, writers) for key in keys] == owners
        if writers > 1:
            assert len(set(owners)) > 1, "every key has the same owner"
    before = {w: [sink.owner(TOPIC, key, w) for key in keys] for w in (2, 3)}
    sink.apply([change(k, 1, {"id": k}, "c") for k in range(20)])  # the table exists now
    sink.refresh()
    other = build_sink(kind, settings)  # another task of the same follower
    try:
        for w, owners in before.items():
            assert [sink.owner(TOPIC, key, w) for key in keys] == owners
            assert [other.owner(TOPIC, key, w) for key in keys] == owners
    finally:
        other.close()


#: what the fix of a failed check() names, per kind
FIX_NAMES = {"redis": "url", "delta-scd1": "path", "delta-scd2": "path", "search": "path",
             "sql-sqlite": "url", "sql-postgres": "url", "plugin-lite": "path"}


def test_check_passes_or_names_the_fix(kind: str, sink: Sink, tmp_path: Path) -> None:
    sink.check()
    assert apply_one(sink, change(1, 1, {"id": 1}, "c")) == (1, 0, 0)
    if kind == "redis":
        bad = build_sink(kind, {"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    elif kind == "sql-postgres":
        bad = build_sink(kind, {"url": f"postgresql+psycopg://u:pw@127.0.0.1:{free_port()}/x"})
    else:
        blocker = tmp_path / "a file"
        blocker.write_text("not a directory")
        bad = build_sink(kind, {"root": str(blocker)})
    try:
        with pytest.raises(CdcError) as caught:
            bad.check()
    finally:
        bad.close()
    error = caught.value
    assert error.fix and "fix:" in str(error)
    assert FIX_NAMES[kind] in error.fix, str(error)


# ---------------------------------------------------------------------- racing writers

ROUNDS = 6
RACE_KEYS = 40


def _race_batch(round_no: int, newer: bool) -> list[Change]:
    """Round ``round_no``'s batch: every key at one position, the newer batch a step above the
    older; the newer one deletes a quarter of the keys, the older one writes them."""
    seq = 10 * (round_no + 1) + (2 if newer else 1)
    out = []
    for k in range(RACE_KEYS):
        if newer and (k + round_no) % 4 == 0:
            out.append(change(k, seq, None))
        else:
            out.append(change(k, seq, {"id": k, "v": seq, "who": "newer" if newer else "older"},
                              "u"))
    return out


def test_racing_writers_the_newer_batch_wins(kind: str, settings: dict[str, str],
                                             sink: Sink) -> None:
    """Two processes, each with its own sink on the same follower, apply an older and a newer
    batch of the same keys at the same moment (a replayed or zombie task racing a newer one),
    the older one started last; afterwards every key holds the newer batch's data."""
    if not sink.placement.on_executors:
        pytest.skip(f"{kind}: placed on the driver — cdc apply writes this follower from "
                    "the driver only, one batch at a time, so writers never race")
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    pipes = [context.Pipe() for _ in range(2)]
    children = [context.Process(target=race_writer, args=(kind, settings, child, barrier),
                                daemon=True) for _, child in pipes]
    for child in children:
        child.start()
    try:
        for round_no in range(ROUNDS):
            newer, older = _race_batch(round_no, True), _race_batch(round_no, False)
            delay = (0.0, 0.001, 0.003, 0.006, 0.012, 0.025)[round_no % 6]
            pipes[0][0].send((newer, 0.0))
            pipes[1][0].send((older, delay))  # started last
            answers = []
            for parent, _ in pipes:
                assert parent.poll(120), "a racing writer did not answer"
                answers.append(parent.recv())
            assert [a[0] for a in answers] == ["ok", "ok"], answers
            sink.refresh()
            want = {c.key: row_text(c.row) for c in newer if c.row is not None}
            assert held_rows(sink) == want, f"round {round_no}: {answers}"
            # the newer batch's positions hold: it replayed changes nothing
            stats = sink.apply(newer)
            assert (stats.written, stats.deleted) == (0, 0), f"round {round_no}"
    finally:
        for parent, _ in pipes:
            parent.send(None)
        for child in children:
            child.join(timeout=60)
            if child.is_alive():
                child.kill()


def test_an_installed_follower_kind_is_validated_like_the_project_s_own(
        plugin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The config knows the out-of-tree kind once its package is on the path: its own keys are
    checked (did-you-mean from its model), a misspelt kind suggests it, and without the
    package the kind is unknown again, naming the registered ones."""
    from cdc.config import forget_kinds, parse_config
    from cdc.errors import ConfigError

    def problem(follower: dict[str, Any]) -> str:
        with pytest.raises(ConfigError) as caught:
            parse_config({"followers": {"ext": follower}}, tmp_path)
        return str(caught.value)

    assert "did you mean 'path'?" in problem({"kind": "lite", "paht": "x"})
    assert "did you mean 'lite'?" in problem({"kind": "lyte", "path": "x"})
    parse_config({"followers": {"ext": {"kind": "lite", "path": "x"}}}, tmp_path)
    monkeypatch.undo()
    forget_kinds()
    message = problem({"kind": "lite", "path": "x"})
    assert "unknown follower kind 'lite'" in message and "'redis'" in message
