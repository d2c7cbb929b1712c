"""SearchSink against real Tantivy indexes: delete markers, the gate's lookups and position
words, rows as text, search, odd table names, the watermark file, the single writer, errors,
and ``cdc search``. The contract every sink keeps (the gate through read/keys, replays,
deletes, watermarks) is tests/test_sink_contract.py's."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import tantivy

import sinks.search as search_module
from cdc.events import TableId
from cdc.position import Position
from cdc.sink import Change, row_text
from sinks.search import (
    DELETED,
    SearchQueryError,
    SearchSink,
    SearchSinkError,
    position_words,
)

TOPIC = "src.public.items"
ITEMS = "public.items"


def change(key: int | dict[str, Any], seq: int, row: dict[str, Any] | None,
           topic: str = TOPIC, table: str = ITEMS) -> Change:
    key_obj = key if isinstance(key, dict) else {"id": key}
    return Change(topic, topic.split(".")[0], table, json.dumps(key_obj, separators=(",", ":")),
                  Position.postgres(seq, 1).to_bytes(), row, "d" if row is None else "u")


def item(key: int, version: int, **extra: Any) -> dict[str, Any]:
    return {"id": key, "title": f"item {key} version {version}", **extra}


def open_sink(path: Path, *, retention: float = 3600.0,
              text_fields: dict[str, list[str]] | None = None,
              tables: dict[str, tuple[str, TableId]] | None = None,
              shards: int = 1) -> SearchSink:
    return SearchSink("idx", path, tables=tables or {}, text_fields=text_fields or {},
                      writer_memory=32 * 1024**2, tombstone_retention=retention,
                      log_path=path / "log", shards=shards)


HEAP = 32 * 1024**2


@pytest.fixture
def sink(tmp_path: Path) -> Any:
    opened = open_sink(tmp_path / "search")
    yield opened
    opened.close()


def held(sink: SearchSink, topic: str = TOPIC) -> dict[str, dict[str, str]]:
    """Everything the follower holds for ``topic``, through keys() and read()."""
    keys = list(sink.keys(topic))
    assert len(keys) == len(set(keys))
    return sink.read(topic, keys)


def markers(sink: SearchSink) -> int:
    query = tantivy.Query.term_query(sink.schema, DELETED, 1)
    return sum(int(searcher.search(query, 10, count=True).count)  # type: ignore[attr-defined]
               for _, searcher in sink._searchers())


# ------------------------------------------------------------------------------ the gate

def test_an_unfolded_batch_keeps_the_newest_per_key(sink: SearchSink) -> None:
    """Two changes of one key in a batch (a caller that did not fold): the newest is kept;
    an equal position is not newer."""
    assert sink.apply([change(1, 20, item(1, 20)), change(2, 5, item(2, 5))]).written == 2
    stats = sink.apply([change(1, 10, item(1, 10)), change(2, 6, item(2, 6)),
                        change(1, 20, item(1, 99))])
    assert (stats.written, stats.skipped) == (1, 1)
    assert held(sink) == {'{"id":1}': row_text(item(1, 20)), '{"id":2}': row_text(item(2, 6))}


def test_markers_are_documents_that_never_match(sink: SearchSink) -> None:
    sink.apply([change(1, 1, item(1, 1)), change(2, 1, item(2, 1))])
    sink.apply([change(1, 3, None)])
    assert markers(sink) == 1
    assert sink.apply([change(1, 3, None)]).skipped == 1  # the tombstone after the delete
    assert markers(sink) == 1
    assert sink.search("version").total == 1  # the marker never matches
    assert sink.apply([change(1, 4, item(1, 4))]).written == 1  # re-insert: marker replaced
    assert markers(sink) == 0
    assert sink.search("version").total == 2


def test_markers_expire_after_the_retention(tmp_path: Path) -> None:
    sink = open_sink(tmp_path / "s", retention=0.3)
    try:
        sink.apply([change(1, 1, item(1, 1)), change(2, 1, item(2, 1))])
        sink.apply([change(1, 5, None)])
        assert sink.apply([change(1, 4, item(1, 4))]).skipped == 1  # within the retention
        assert markers(sink) == 1
        time.sleep(0.4)
        sink.apply([change(2, 6, item(2, 6))])  # any later batch purges expired markers
        assert markers(sink) == 0
        # past the retention the key is forgotten (the log's compaction dropped older records)
        assert sink.apply([change(1, 4, item(1, 4))]).written == 1
    finally:
        sink.close()
    sink = open_sink(tmp_path / "zero", retention=0)  # no markers at all
    try:
        sink.apply([change(1, 1, item(1, 1))])
        assert sink.apply([change(1, 2, None)]).deleted == 1
        assert markers(sink) == 0 and held(sink) == {}
    finally:
        sink.close()


def test_position_words_order_like_the_bytes() -> None:
    rng = random.Random(3)
    values = [bytes(rng.randrange(256) if rng.random() < 0.7 else 0
                    for _ in range(rng.randrange(0, 32))) for _ in range(3000)]
    values += [b"", b"\0", b"\0\0", b"\1", b"\1\0", b"\xff" * 31]
    ordered = sorted(values)
    assert sorted(values, key=position_words) == ordered
    pairs = list(zip(ordered, ordered[1:], strict=False))
    assert [position_words(v) == position_words(w) for v, w in pairs] == [v == w for v, w in pairs]
    with pytest.raises(SearchSinkError, match="32 bytes"):
        position_words(b"x" * 32)


def test_large_positions_and_many_keys_in_small_chunks(sink: SearchSink,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_module, "LOOKUP_CHUNK", 70)
    top = (1 << 64) - 1
    batch = [Change(TOPIC, "src", ITEMS, f'{{"id":{k}}}', Position.postgres(top - 5, k)
                    .to_bytes(), item(k, 1)) for k in range(500)]
    assert sink.apply(batch).written == 500
    newer = [Change(TOPIC, "src", ITEMS, c.key, Position.postgres(top, 0).to_bytes(),
                    item(int(c.key[6:-1]), 2)) for c in batch[::2]]
    assert sink.apply(newer + batch[1::2]).written == 250  # the odd ones are not newer
    state = held(sink)
    assert len(state) == 500 and state['{"id":4}'] == row_text(item(4, 2))
    assert state['{"id":5}'] == row_text(item(5, 1))


def test_hash_collisions_are_looked_up_alone(sink: SearchSink,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_module, "id_hash", lambda identity: len(identity) % 3)
    sink.apply([change(k, 1, item(k, 1)) for k in range(30)])
    stats = sink.apply([change(k, 2 if k % 2 else 1, item(k, 2)) for k in range(30)])
    assert (stats.written, stats.skipped) == (15, 15)
    state = held(sink)
    assert len(state) == 30
    assert all(state[f'{{"id":{k}}}'] == row_text(item(k, 2 if k % 2 else 1)) for k in range(30))


def test_a_failed_batch_leaves_the_index_as_it_was(sink: SearchSink) -> None:
    sink.apply([change(1, 1, item(1, 1))])
    bad = Change(TOPIC, "src", ITEMS, '{"id":9}', b"\1" * 40, item(9, 1))
    with pytest.raises(SearchSinkError):
        sink.apply([change(1, 2, item(1, 2)), change(2, 2, item(2, 2)), bad])
    assert held(sink) == {'{"id":1}': row_text(item(1, 1))}
    assert sink.apply([change(2, 2, item(2, 2))]).written == 1  # the writer still works
    assert set(held(sink)) == {'{"id":1}', '{"id":2}'}


def test_keys_slices_many_documents_once_each(sink: SearchSink,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_module, "KEYS_SLICE", 10)  # crowded slices get halved
    sink.apply([change(k, 1, item(k, 1)) for k in range(1200)])
    sink.apply([change(k, 2, None) for k in range(0, 1200, 4)])
    sink.apply([change(k, 1, item(k, 1), topic="src.public.other", table="public.other")
                for k in range(50)])
    keys = list(sink.keys(TOPIC))
    assert len(keys) == len(set(keys)) == 900
    assert sorted(keys) == sorted(f'{{"id":{k}}}' for k in range(1200) if k % 4)
    assert len(list(sink.keys("src.public.other"))) == 50


def test_keys_spread_over_shards_and_are_read_from_all(tmp_path: Path) -> None:
    """Three shards: each key lives in the shard ``cdc.sink.key_group`` names — the owner
    ``cdc apply`` gives its task — and reads, keys and searches cover every shard."""
    from cdc.sink import key_group

    sink = open_sink(tmp_path / "s", shards=3)
    try:
        sink.apply([change(k, 1, item(k, 1)) for k in range(60)])
        sink.apply([change(k, 2, None) for k in range(0, 60, 3)])
        assert json.loads((tmp_path / "s" / "shards.json").read_text()) == \
            {"version": 1, "shards": 3}
        per_shard = []
        for shard in sink.shards:
            searcher = shard.searcher()
            assert searcher is not None
            keys = {key for key in sink._shard_keys(searcher, TOPIC)}
            assert {key_group(key.encode(), 3) for key in keys} == {shard.number}
            assert {sink.owner(TOPIC, key.encode(), 3) for key in keys} == {shard.number}
            per_shard.append(len(keys))
        assert sum(per_shard) == 40 and min(per_shard) > 5
        assert held(sink) == {f'{{"id":{k}}}': row_text(item(k, 1)) for k in range(60) if k % 3}
        found = sink.search("version", limit=7)
        assert found.total == 40 and len(found.hits) == 7
        assert all(a.score >= b.score for a, b in zip(found.hits, found.hits[1:], strict=False))
        assert markers(sink) == 20
    finally:
        sink.close()


# ------------------------------------------------------------------------------ rows

def test_read_is_row_text_for_every_kind_of_value(sink: SearchSink) -> None:
    row = {"id": 7, "name": "Zoë 🚀 漢字", "quote": 'say "hi" \\ it\'s', "empty": "",
           "lines": "a\nb\tc\u2028", "big": 10**30, "neg": -7, "real": 1.5, "negzero": -0.0,
           "huge": 1e300, "ok": True, "no": False, "gone": None, "amount": "12.50",
           "tags": ["a", None, 1, {"k": [True, 2.25]}], "doc": {"é": {"n": [1, "x"]}},
           "looks_like_json": '{"a":1}', "date": "2024-05-01T12:00:00.123456Z",
           "long": "x" * 5000, "Upper Case Col": "Mixed", "dot.ted": "d"}
    composite = {"a": 1, "b": "x y\"z"}
    sink.apply([change(composite, 1, row)])
    key = json.dumps(composite, separators=(",", ":"))
    assert sink.read(TOPIC, [key, '{"a":2}']) == {key: row_text(row)}
    assert list(sink.keys(TOPIC)) == [key]


def test_schema_change_mid_stream(sink: SearchSink) -> None:
    sink.apply([change(1, 1, {"id": 1, "title": "alpha", "old_col": "legacy words"})])
    # a column dropped and another added upstream, then one retyped (text -> number)
    sink.apply([change(1, 2, {"id": 1, "title": "beta", "new_col": "fresh words"}),
                change(2, 2, {"id": 2, "title": "gamma", "old_col": "still here"})])
    assert sink.read(TOPIC, ['{"id":1}']) == {'{"id":1}': {"id": "1", "title": "beta",
                                                           "new_col": "fresh words"}}
    assert [h.key for h in sink.search("new_col:fresh").hits] == ['{"id":1}']
    assert sink.search("legacy").total == 0
    assert [h.key for h in sink.search("old_col:still").hits] == ['{"id":2}']
    sink.apply([change(2, 3, {"id": 2, "title": 42})])
    assert sink.read(TOPIC, ['{"id":2}']) == {'{"id":2}': {"id": "2", "title": "42"}}
    assert [h.key for h in sink.search("title:42").hits] == ['{"id":2}']


# ------------------------------------------------------------------------------ search

def test_search_text_fields_and_exact_columns(tmp_path: Path) -> None:
    sink = open_sink(tmp_path / "s", text_fields={ITEMS: ["title", "body"]})
    try:
        sink.apply([
            change(1, 1, {"id": 1, "title": "PostgreSQL logical replication", "body": "WAL",
                          "sku": "abc-123 xyz", "qty": 5}),
            change(2, 1, {"id": 2, "title": "Redis caching", "body": "fast keys",
                          "sku": "abc", "qty": 6}),
            change(3, 1, {"id": 3, "title": "gone soon", "sku": "q"}),
            change(1, 1, {"id": 1, "name": "Other table postgresql"}, topic="src.public.other",
                   table="public.other"),
        ])
        sink.apply([change(3, 2, None)])

        def keys(query: str, **kwargs: Any) -> list[str]:
            return sorted(h.key for h in sink.search(query, **kwargs).hits)

        assert keys("title:postgresql") == ['{"id":1}']  # a text column: tokenized
        assert keys("replication AND wal") == ['{"id":1}']  # bare words: every text column
        assert keys('title:"logical replication"') == ['{"id":1}']
        assert keys('title:"logical repl"*') == ['{"id":1}']
        assert keys("_cdc_all:/postgre.*/", topics=[TOPIC]) == ['{"id":1}']
        # sku is not a text column here: indexed whole, never tokenized
        assert keys("sku:abc") == ['{"id":2}']
        assert keys('sku:"abc-123 xyz"') == ['{"id":1}']
        assert keys("xyz") == [] and keys("sku:xyz") == []
        assert keys("qty:6") == ['{"id":2}']
        # other tables: string columns are text by default
        assert keys("postgresql") == ['{"id":1}', '{"id":1}']
        assert keys("postgresql", topics=[TOPIC]) == ['{"id":1}']
        assert keys("*") == ['{"id":1}', '{"id":1}', '{"id":2}']  # the deleted row is gone
        found = sink.search("*", topics=[TOPIC], limit=1)
        assert found.total == 2 and len(found.hits) == 1
        assert found.hits[0].row == row_text(sink.read(TOPIC, [found.hits[0].key])
                                             [found.hits[0].key])
        with pytest.raises(SearchQueryError, match="not valid"):
            sink.search("title:(oops")
    finally:
        sink.close()


def test_odd_table_and_column_names(tmp_path: Path) -> None:
    weird = TableId('My "Schema"', "Or.ders Tab")
    near = TableId('My "Schema"', "Or")  # its topic is a prefix of the weird one's
    topic = f"src.{weird.schema}.{weird.table}"
    near_topic = f"src.{near.schema}.{near.table}"
    tables = {topic: ("src", weird), near_topic: ("src", near)}
    sink = open_sink(tmp_path / "s", tables=tables,
                     text_fields={'"My ""Schema"""."Or.ders Tab"': ["Note Text"]})
    try:
        row = {"ID": 1, "Note Text": "Zebra crossing", "Other": "lion den"}
        sink.apply([change({"ID": 1}, 1, row, topic=topic, table=str(weird)),
                    change({"ID": 1}, 1, {"ID": 1, "Other": "zebra"}, topic=near_topic,
                           table=str(near))])
        assert held(sink, topic) == {'{"ID":1}': row_text(row)}
        assert held(sink, near_topic) == {'{"ID":1}': {"ID": "1", "Other": "zebra"}}
        hits = sink.search(r"Note\ Text:zebra").hits
        assert [(h.topic, h.key) for h in hits] == [(topic, '{"ID":1}')]
        assert [h.topic for h in sink.search("lion").hits] == []  # Other: not a text column
        assert [h.topic for h in sink.search('Other:"lion den"').hits] == [topic]
        assert [h.topic for h in sink.search("zebra", topics=[near_topic]).hits] == \
            [near_topic]
    finally:
        sink.close()


# ------------------------------------------------------------------------------ storage

def test_watermarks_live_in_one_file(tmp_path: Path) -> None:
    sink = open_sink(tmp_path / "s")
    sink.set_watermark("src", {"lsn": 5})
    assert open_sink(tmp_path / "s").watermark("src") == {"lsn": 5}
    assert sorted(p.name for p in (tmp_path / "s").iterdir()  # (and its hidden lock)
                  if not p.name.startswith(".")) == ["watermarks.json"]


def test_readers_without_an_index_and_beside_the_writer(tmp_path: Path) -> None:
    reader = open_sink(tmp_path / "s")
    assert reader.read(TOPIC, ['{"id":1}']) == {} and list(reader.keys(TOPIC)) == []
    with pytest.raises(SearchSinkError, match=r"run `cdc apply --follower idx` first"):
        reader.search("x")
    writer = open_sink(tmp_path / "s")
    try:
        writer.check()
        writer.apply([change(1, 1, item(1, 1))])
        assert held(reader) == {'{"id":1}': row_text(item(1, 1))}  # no lock needed to read
        writer.apply([change(1, 2, item(1, 2))])
        assert held(reader) == {'{"id":1}': row_text(item(1, 2))}  # sees each new commit
    finally:
        writer.close()


def test_a_writer_waits_for_a_shard_another_writer_holds(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A shard's writer is taken for each apply and released after it: while another writer
    holds it (a replayed or speculative task), apply waits; past LOCK_WAIT_S it stops with the
    fix; once released, the waiting writer goes on."""
    import threading

    first = open_sink(tmp_path / "s")
    first.apply([change(1, 1, item(1, 1))])
    held_writer = first.shards[0].take_writer(HEAP)  # the lock is free after each apply
    monkeypatch.setattr(search_module, "LOCK_WAIT_S", 0.3)
    second = open_sink(tmp_path / "s")
    with pytest.raises(SearchSinkError, match="another `cdc apply`") as caught:
        second.apply([change(1, 2, item(1, 2))])
    assert "fix:" in str(caught.value)
    monkeypatch.setattr(search_module, "LOCK_WAIT_S", 30.0)
    release = threading.Timer(0.3, held_writer.wait_merging_threads)
    release.start()
    started = time.monotonic()
    assert second.apply([change(1, 2, item(1, 2))]).written == 1
    assert time.monotonic() - started >= 0.25  # it waited for the release
    release.join()
    assert held(first) == {'{"id":1}': row_text(item(1, 2))}


@pytest.mark.parametrize("locked", [True, False])
def test_writers_racing_to_create_the_index(tmp_path: Path, locked: bool,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers of a new index at the same moment (a task and its speculative duplicate, each
    with its own sink): the layout and each shard are created once, neither writer mistakes the
    other's half-made shard for a foreign directory, and both batches land. (Without the
    creation lock some rounds fail: the test checks it still catches that.)"""
    import contextlib
    import threading

    if not locked:
        monkeypatch.setattr(SearchSink, "creating", lambda self: contextlib.nullcontext())
    failures = []
    for round_no in range(12):
        path = tmp_path / f"round-{round_no}"
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def write(first: int, path: Path = path, barrier: threading.Barrier = barrier,
                  errors: list[BaseException] = errors) -> None:
            sink = open_sink(path, shards=3)
            barrier.wait()
            try:
                sink.apply([change(k, 1, item(k, 1)) for k in range(first, first + 30)])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(first,)) for first in (0, 30)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        if errors:
            failures.append(errors)
            continue
        assert held(open_sink(path, shards=3)) == {f'{{"id":{k}}}': row_text(item(k, 1))
                                                   for k in range(60)}
    if locked:
        assert failures == []
    elif not failures:
        pytest.skip("no round raced without the lock this time (timing): nothing shown")


_KILLED_WRITER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.test_search_sink import change, item, open_sink
sink = open_sink(Path({path!r}))
sink.apply([change(1, 1, item(1, 1))])
writer = sink.shards[0].take_writer(32 * 1024**2)
print("ready", flush=True)
key = 2
while True:  # added but never committed, until it is killed
    writer.add_document(sink._document(f"x{{key}}", key, change(key, 2, item(key, 2))))
    if key % 20 == 0:
        print(key, flush=True)
    key += 1
"""


def test_a_killed_writer_leaves_the_last_commit_and_no_lock(tmp_path: Path) -> None:
    """A writer SIGKILLed while it adds documents (through tests/kills.py: its position is the
    documents it added, the committed position the one document committed before)."""
    import threading

    from tests.kills import Watch

    code = _KILLED_WRITER.format(root=str(Path(__file__).parents[1]), path=str(tmp_path / "s"))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    added = [1]

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            if line.strip().isdigit():
                added.append(int(line))

    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        threading.Thread(target=read, daemon=True).start()
        with Watch("search index writer", lambda: added[-1]) as watch:
            watch.wait_moving()
            watch.kill("adding documents", child.kill, lambda: 1)  # one document committed
    finally:
        child.kill()
        child.wait(timeout=30)
    sink = open_sink(tmp_path / "s")
    try:
        sink.check()  # the OS released the dead process's lock
        assert held(sink) == {'{"id":1}': row_text(item(1, 1))}
        assert sink.apply([change(1, 2, item(1, 2))]).written == 1
    finally:
        sink.close()


def test_directories_that_are_not_our_index(tmp_path: Path) -> None:
    (tmp_path / "busy" / "shards" / "0").mkdir(parents=True)
    (tmp_path / "busy" / "shards" / "0" / "notes.txt").write_text("mine")
    with pytest.raises(SearchSinkError, match="not empty and no shards.json says"):
        open_sink(tmp_path / "busy").check()
    (tmp_path / "busy2").mkdir()
    (tmp_path / "busy2" / "shards.json").write_text('{"version": 1, "shards": 1}')
    (tmp_path / "busy2" / "shards" / "0").mkdir(parents=True)
    (tmp_path / "busy2" / "shards" / "0" / "notes.txt").write_text("mine")
    with pytest.raises(SearchSinkError, match="not empty and holds no Tantivy index"):
        open_sink(tmp_path / "busy2").check()
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("body", stored=True)
    other = tmp_path / "other" / "shards" / "0"
    other.mkdir(parents=True)
    (tmp_path / "other" / "shards.json").write_text('{"version": 1, "shards": 1}')
    tantivy.Index(builder.build(), str(other))
    with pytest.raises(SearchSinkError, match="not a cdc search index"):
        open_sink(tmp_path / "other").check()
    old = tmp_path / "old" / "index"  # the layout before shards
    old.mkdir(parents=True)
    tantivy.Index(search_module.build_schema(), str(old))
    with pytest.raises(SearchSinkError, match="older layout") as caught:
        open_sink(tmp_path / "old").read(TOPIC, ['{"id":1}'])
    assert "checkpoint" in str(caught.value)
    open_sink(tmp_path / "three", shards=3).apply([change(1, 1, item(1, 1))])
    with pytest.raises(SearchSinkError, match="created with 3 shards, the config says 2") as c:
        open_sink(tmp_path / "three", shards=2).read(TOPIC, ['{"id":1}'])
    assert "shards: 3" in str(c.value)
    (tmp_path / "file").write_text("")
    with pytest.raises(SearchSinkError, match="cannot create the index directory"):
        open_sink(tmp_path / "file").check()


# ------------------------------------------------------------------------------ cdc search

def run_cdc(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "cdc_app.cli", *args], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=120)


def test_cdc_search_command(tmp_path: Path) -> None:
    from cdc.config import load_config
    from cdc.sink import open_sink as open_configured

    (tmp_path / "cdc.yaml").write_text(json.dumps({
        "log": {"path": "./log"},
        "sources": [{"name": "shop", "kind": "postgres", "dsn": "postgresql://u@127.0.0.1/db",
                     "tables": ["public.orders", "public.customers"]}],
        "followers": {
            "find": {"kind": "search", "path": "./idx",
                     "text_fields": {"public.orders": ["note"]}},
            "empty": {"kind": "search", "path": "./nothing"},
            "cache": {"kind": "redis", "url": "redis://127.0.0.1:1/0"},
        }}))
    sink = open_configured(load_config(tmp_path / "cdc.yaml"), "find")
    assert isinstance(sink, SearchSink)
    orders, customers = "shop.public.orders", "shop.public.customers"
    sink.apply([Change(orders, "shop", "public.orders", f'{{"id":{k}}}',
                       Position.postgres(10, k).to_bytes(),
                       {"id": k, "note": f"[bold]parcel[/] number {k}", "customer": "ann",
                        "amount": "1.50"}) for k in range(1, 4)]
               + [Change(customers, "shop", "public.customers", '{"id":1}',
                         Position.postgres(10, 9).to_bytes(),
                         {"id": 1, "name": "Parcel Fan", **{f"c{i}": i for i in range(8)}})])
    try:  # the writer stays open: `cdc search` reads beside it
        shown = run_cdc("search", "--config", "cdc.yaml", "--follower", "find", "parcel",
                        cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        out = shown.stdout
        assert "4 matching row(s)" in out and "[bold]parcel[/] number 2" in out
        assert "public.customers" in out and '{"id":3}' in out
        assert "more column(s) not shown" in out  # the customer row has 10 columns
        only = run_cdc("search", "-c", "cdc.yaml", "--follower", "find", "note:number",
                       "--table", "public.orders", "--limit", "2", cwd=tmp_path)
        assert only.returncode == 0, only.stderr
        assert "3 matching row(s), the best 2" in only.stdout
        assert "customer" in only.stdout and "public.customers" not in only.stdout
        none = run_cdc("search", "-c", "cdc.yaml", "--follower", "find", "customer:bob",
                       cwd=tmp_path)
        assert none.returncode == 0 and "no matching rows" in none.stdout
    finally:
        sink.close()
    errors = {
        ("--follower", "find", "note:("): "is not valid",
        ("--follower", "nobody", "x"): "no follower named 'nobody'",
        ("--follower", "cache", "x"): "is of kind redis",
        ("--follower", "empty", "x"): "run `cdc apply --follower empty` first",
        ("--follower", "find", "x", "--table", "public.nope"): "does not follow table",
    }
    for args, message in errors.items():
        failed = run_cdc("search", "-c", "cdc.yaml", *args, cwd=tmp_path)
        assert failed.returncode != 0, args
        assert message in failed.stderr and "fix:" in failed.stderr, failed.stderr
        assert "Traceback" not in failed.stderr


@pytest.mark.parametrize("written_later", ["newer", "older"])
def test_the_gate_sees_every_document_of_an_id(sink: SearchSink, written_later: str) -> None:
    """An index that holds two documents for one id (a Tantivy merge that lost a delete, see
    below): the gate looks up every document of the batch's ids (not one per id: Tantivy may
    return either duplicate, and leave out another id's only one), the newest decides, and a
    change that passes leaves exactly one document."""
    first, second = (5, 10) if written_later == "newer" else (10, 5)
    sink.apply([change(1, first, item(1, first)),
                *(change(key, 5, item(key, 5)) for key in (2, 3, 4))])
    writer = sink.shards[0].take_writer(HEAP)
    extra = change(1, second, item(1, second))
    identity = search_module.doc_id(TOPIC, extra.key)
    writer.add_document(sink._document(identity, search_module.id_hash(identity), extra))
    writer.commit()  # id 1 now holds rows at 5 and at 10
    writer.wait_merging_threads()
    assert documents_of(sink, 1) == 2
    stats = sink.apply([change(1, 7, item(1, 7)),
                        *(change(key, 20, item(key, 20)) for key in (2, 3, 4))])
    assert (stats.skipped, stats.written) == (1, 3)  # 7 is older than the document at 10
    assert [documents_of(sink, key) for key in (2, 3, 4)] == [1, 1, 1]
    sink.apply([change(1, 12, None)])
    assert documents_of(sink, 1) == 1 and markers(sink) == 1
    assert held(sink) == {f'{{"id":{key}}}': row_text(item(key, 20)) for key in (2, 3, 4)}


def test_a_new_writer_never_reuses_the_last_commits_opstamp(tmp_path: Path) -> None:
    """Tantivy starts a new writer's opstamps *at* the last commit's: its first operation
    shares that opstamp, and a merge the killed writer left (resumed at the new writer's first
    commit) may then skip that delete on some segments — the rows it deleted came back beside
    their newer markers (found by test_apply_crash.py). The sink spends that opstamp when it
    opens its writer, so the gate's delete always orders after the last commit."""
    path = tmp_path / "search"
    first = open_sink(path)
    first.apply([change(1, 5, item(1, 1))])
    first.close()
    committed = json.loads((path / "shards" / "0" / "meta.json").read_text())["opstamp"]
    raw = tantivy.Index.open(str(path / "shards" / "0")).writer(32 * 1024**2, 1)
    assert raw.delete_documents_by_term(search_module.ID, "none") == committed  # Tantivy's
    raw.rollback()
    del raw
    reopened = open_sink(path)
    try:
        writer = reopened.shards[0].take_writer(HEAP)
        assert writer.delete_documents_by_term(search_module.ID, "none") > committed
        writer.rollback()
        writer.wait_merging_threads()
    finally:
        reopened.close()


def documents_of(sink: SearchSink, key: int) -> int:
    searcher = sink.shard_of(f'{{"id":{key}}}').searcher()
    assert searcher is not None
    query = tantivy.Query.term_query(sink.schema, search_module.ID,
                                     search_module.doc_id(TOPIC, f'{{"id":{key}}}'))
    return int(searcher.search(query, 10, count=True).count)  # type: ignore[attr-defined]


#: run by a child process: seven committed batches of rows, then an eighth that deletes four
#: of them; it exits (as a SIGKILL would) right after that commit, while Tantivy merges
_KILLED_AFTER_A_COMMIT = """
import os, sys
from tests.test_search_sink import change, item, open_sink
from pathlib import Path
sink = open_sink(Path(sys.argv[1]))
for batch in range(7):
    sink.apply([change(key, 10 + batch, item(key, 1)) for key in range(batch * 5, batch * 5 + 5)])
sink.apply([change(key, 100, None) for key in (3, 11, 19, 27)])
os._exit(0)
"""


def test_deletes_of_a_restarted_writer_survive_the_merge_it_resumes(tmp_path: Path) -> None:
    """The case above end to end: a writer killed right after a commit (Tantivy merging), a
    new one that deletes rows: every deleted row is gone, one document per id. (Without the
    sink's fix a trial here kept a deleted row now and then: the merge must still be running.)
    """
    for trial in range(6):
        path = tmp_path / f"trial-{trial}"
        done = subprocess.run([sys.executable, "-c", _KILLED_AFTER_A_COMMIT, str(path)],
                              cwd=Path(__file__).resolve().parents[1], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        restarted = open_sink(path)
        try:
            targets = [1, 6, 12, 17, 22, 28, 33, 2, 8, 30]
            restarted.apply([change(key, 200, None) for key in targets])
        finally:
            restarted.close()
        reopened = open_sink(path)
        try:
            counts = {key: documents_of(reopened, key) for key in range(35)}
            live = held(reopened)
        finally:
            reopened.close()
        assert {key: n for key, n in counts.items() if n != 1} == {}, f"trial {trial}"
        gone = {3, 11, 19, 27, *targets}
        assert set(live) == {f'{{"id":{key}}}' for key in range(35) if key not in gone}
