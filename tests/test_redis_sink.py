"""RedisSink's layout, delete markers and their retention, read/keys, watermarks and errors,
against a real redis-server. The contract every sink keeps (the gate, replays, deletes,
watermarks, racing writers) is tests/test_sink_contract.py's."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from cdc.events import TableId
from cdc.position import Position
from cdc.sink import Change
from cdc_app.servers.postgres import free_port
from sinks.redis import (
    DELETED_PREFIX,
    KEY_FIELD,
    POSITION_FIELD,
    RedisSink,
    RedisSinkError,
    check_key_template,
    glob_escape,
)
from tests.sinkkit import MiniLog, apply_in_batches, changes_of, pos, random_log, v_of


def change(key: dict[str, Any], seq: int, row: dict[str, Any] | None,
           topic: str = "src.public.items", table: str = "public.items") -> Change:
    return Change(topic, topic.split(".")[0], table, json.dumps(key, separators=(",", ":")),
                  Position.postgres(seq, 1).to_bytes(), row)


def test_default_layout_and_row_text(redis_url: str) -> None:
    sink = RedisSink("cache", redis_url)
    row = {"id": 7, "name": "Zoë", "amount": "12.50", "tags": ["a", "b"], "doc": {"k": 1},
           "ok": True, "gone": None}
    assert sink.apply([change({"id": 7}, 10, row)]).written == 1
    stored = sink.client.hgetall("public.items:7")
    assert stored == {"id": "7", "name": "Zoë", "amount": "12.50", "tags": '["a","b"]',
                      "doc": '{"k":1}', "ok": "true",
                      POSITION_FIELD: Position.postgres(10, 1).to_bytes().hex(),
                      KEY_FIELD: '{"id":7}'}
    assert sink.read("src.public.items", ['{"id":7}', '{"id":8}']) == {
        '{"id":7}': {k: v for k, v in stored.items() if not k.startswith("_cdc_")}}


def test_canonical_text_is_compact_json() -> None:
    from cdc.sink import canonical_text

    def reference(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(
            value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)

    for value in ["", "Zoë", 0, -7, 10**30, True, False, 1.5, -0.0, 1e300, [1, "a", None],
                  {"k": [True, {"é": 2.25}]}]:
        assert canonical_text(value) == reference(value), value
    with pytest.raises(ValueError):
        canonical_text(float("nan"))


def test_upsert_replaces_the_whole_hash(redis_url: str) -> None:
    sink = RedisSink("cache", redis_url)
    sink.apply([change({"id": 1}, 1, {"id": 1, "a": "x", "b": "y"})])
    sink.apply([change({"id": 1}, 2, {"id": 1, "a": "z", "b": None})])  # b dropped or nulled
    assert sink.read("src.public.items", ['{"id":1}']) == {'{"id":1}': {"id": "1", "a": "z"}}


def test_composite_keys_and_templates(redis_url: str) -> None:
    sink = RedisSink("cache", redis_url, key_template="{source}/{schema}/{table}/{key}")
    sink.apply([change({"a": 1, "b": "x y"}, 1, {"a": 1, "b": "x y", "v": 3})])
    assert sink.client.exists("src/public/items/1:x y")
    assert list(sink.keys("src.public.items")) == ['{"a":1,"b":"x y"}']
    sink = RedisSink("cache2", redis_url, key_template="row:{key_json}")
    sink.apply([change({"id": 5}, 1, {"id": 5})])
    assert sink.client.exists('row:{"id":5}')
    sink = RedisSink("cache3", redis_url, key_template="{{t}}{table}:{key}")
    sink.apply([change({"id": 6}, 1, {"id": 6})])
    assert sink.client.exists("{t}items:6")
    assert list(sink.keys("src.public.items")) == ['{"id":6}']


def test_keys_escape_glob_characters_and_skip_other_tables(redis_url: str) -> None:
    odd = "src.we*ird.it[e]ms?"
    tables = {odd: ("src", TableId("we*ird", "it[e]ms?"))}
    sink = RedisSink("cache", redis_url, tables=tables)
    sink.apply([change({"id": 1}, 1, {"id": 1}, topic=odd, table="we*ird.it[e]ms?")])
    # rows whose names the unescaped pattern would match, in tables of their own
    sink.apply([change({"id": 2}, 1, {"id": 2}, topic="src.weXird.itemsZ",
                       table="weXird.itemsZ")])
    sink.apply([change({"id": 3}, 1, {"id": 3}, topic="src.public.items",
                       table="public.items")])
    sink.apply([change({"id": 4}, 1, {"id": 4}, topic="src.public.items:x",
                       table="public.items:x")])  # key public.items:x:4 matches public.items:*
    assert sink.table_pattern(odd) == "we\\*ird.it\\[e\\]ms\\?:*"
    assert list(sink.keys(odd)) == ['{"id":1}']
    assert list(sink.keys("src.public.items")) == ['{"id":3}']
    assert glob_escape("a\\b") == "a\\\\b"


def test_keys_scans_many_rows_once_each(redis_url: str) -> None:
    sink = RedisSink("cache", redis_url, chunk_rows=100, pipeline_calls=3)
    sink.apply([change({"id": i}, 1, {"id": i}) for i in range(2500)])
    sink.apply([change({"id": i}, 2, None) for i in range(0, 2500, 5)])
    keys = list(sink.keys("src.public.items"))
    assert len(keys) == len(set(keys)) == 2000
    assert sink.client.exists(DELETED_PREFIX + "public.items:5")


def test_watermarks_are_per_follower(redis_url: str) -> None:
    sink = RedisSink("cache", redis_url)
    sink.set_watermark("src", {"lsn": 2**40 + 1})
    assert sink.watermark("src") == {"lsn": 2**40 + 1}
    assert RedisSink("elsewhere", redis_url).watermark("src") is None


def test_reserved_column_is_refused(redis_url: str) -> None:
    sink = RedisSink("cache", redis_url)
    with pytest.raises(RedisSinkError, match="_cdc_key.*reserves"):
        sink.apply([change({"id": 1}, 1, {"id": 1, "_cdc_key": "x"})])


def test_key_template_validation() -> None:
    assert check_key_template("{table}:{key}") == "{table}:{key}"
    with pytest.raises(ValueError, match="must contain {key}"):
        check_key_template("{schema}.{table}")
    with pytest.raises(ValueError, match="unknown field"):
        check_key_template("{tabel}:{key}")
    with pytest.raises(ValueError, match="not a valid template"):
        check_key_template("{key")


def test_unreachable_redis_names_the_fix_without_the_password() -> None:
    sink = RedisSink("cache", f"redis://:hunter2secret@127.0.0.1:{free_port()}/0")
    with pytest.raises(RedisSinkError) as caught:
        sink.check()
    text = str(caught.value)
    assert "cannot reach Redis" in text and "fix:" in text
    assert "hunter2secret" not in text and "***" in text


def test_wrong_password_is_reported(redis_server: Any) -> None:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.config_set("requirepass", "right-pass")
    try:
        sink = RedisSink("cache", redis_server.url.replace("//", "//:wrong-pass@"))
        with pytest.raises(RedisSinkError, match="refused the password") as caught:
            sink.check()
        assert "wrong-pass" not in str(caught.value)
    finally:
        authed = redis.Redis.from_url(redis_server.url, password="right-pass")
        authed.config_set("requirepass", "")


# ------------------------------------------------------------- storage under the version gate

def state(sink: RedisSink) -> dict[str, Any]:
    """Everything the follower holds: hashes with all fields, markers, watermarks."""
    out: dict[str, Any] = {}
    for name in sink.client.scan_iter(count=1000):
        kind = sink.client.type(name)
        out[name] = sink.client.hgetall(name) if kind == "hash" else sink.client.get(name)
    return out


def test_replay_and_duplicate_batches_leave_the_storage_untouched(redis_url: str) -> None:
    """Not one hash field, marker or watermark changes (the contract suite checks the rows)."""
    sink = RedisSink("cache", redis_url)
    log = random_log(2)
    for begin in range(0, len(log.rows), 50):
        changes, _ = changes_of(sink, log.rows[begin:begin + 50])
        sink.apply(changes)
        after_first = state(sink)
        sink.apply(changes)  # a crashed batch, replayed
        assert state(sink) == after_first
    apply_in_batches(sink, log.rows, 37)  # with watermarks
    before = state(sink)
    assert apply_in_batches(sink, log.rows, 53)[0] == 0  # the log from offset 0
    assert state(sink) == before


def test_delete_markers_hold_the_delete_position(redis_url: str) -> None:
    sink = RedisSink("cache", redis_url)
    marker = DELETED_PREFIX + "public.items:1"
    log = MiniLog()
    log.upsert(1, pos(1), 1, "c")
    log.delete(1, pos(2))
    log.upsert(1, pos(3), 3, "c")
    apply_in_batches(sink, log.rows, 100)  # one batch: only the re-insert reaches Redis
    assert v_of(sink, 1) == 3 and not sink.client.exists(marker)
    sink.client.flushall()
    apply_in_batches(sink, log.rows[:3], 1)  # the delete leaves a marker...
    assert sink.client.get(marker) == pos(2).hex()
    assert sink.client.hget("public.items:1", POSITION_FIELD) is None
    apply_in_batches(sink, log.rows[3:], 1)  # ...the re-insert removes it
    assert v_of(sink, 1) == 3 and not sink.client.exists(marker)
    assert sink.client.hget("public.items:1", POSITION_FIELD) == pos(3).hex()


def test_tombstone_after_retention(redis_url: str) -> None:
    sink = RedisSink("cache", redis_url, tombstone_retention=0.3)
    log = MiniLog()
    log.upsert(1, pos(1), 1, "c")
    log.delete(1, pos(2))
    apply_in_batches(sink, log.rows, 1)
    marker = DELETED_PREFIX + "public.items:1"
    assert 0 < sink.client.pttl(marker) <= 300
    assert apply_in_batches(sink, log.rows[:1], 1) == (0, 1)  # gated by the marker
    deadline = time.monotonic() + 5
    while sink.client.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sink.client.exists(marker), "the marker outlived its retention"
    # past the retention the marker is gone: the log's compaction has dropped older records by
    # then, so only a newer record can arrive — and it applies
    later = MiniLog()
    later.upsert(1, pos(4), 4, "c")
    assert apply_in_batches(sink, later.rows, 1) == (1, 0)
    assert v_of(sink, 1) == 4


def test_zero_retention_leaves_no_marker(redis_url: str) -> None:
    sink = RedisSink("cache", redis_url, tombstone_retention=0)
    log = MiniLog()
    log.upsert(1, pos(1), 1, "c")
    log.delete(1, pos(2))
    apply_in_batches(sink, log.rows, 1)
    assert state(sink) == {}
