"""Upgrades: state written by an earlier version is read by this one, or refused naming the fix.

``tests/fixtures/v<N>/`` holds what version N stored (``tests/fixtures/make_v1.py`` says how it
was made): a local change log with its schema store and a source offset, and a Delta follower
with its watermark, a SQL follower (SQLite) and a Redis follower (its keys, restored into the
session's throwaway server). Every fixture folder is read here by the code of today; a format this
version cannot read must be refused with a :class:`FormatVersionError` that names the fix —
never misread. Formats newer than this version's are refused the same way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cdc.errors import FormatVersionError
from cdc.events import TableId
from cdc.log.local import LocalChangeLogReader
from cdc.sink import row_text
from connectors.postgres.source import PostgresOffset
from sinks.delta import DeltaSink
from tests.pgkit import latest_rows, read_topic

FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: every version whose state this one must read (a refused one moves to a test of its own)
READABLE = sorted(p.name for p in FIXTURES.glob("v*") if p.is_dir())


@pytest.fixture(params=READABLE)
def stored(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A copy of one version's state (readers may leave lock files behind)."""
    copy = tmp_path / str(request.param)
    shutil.copytree(FIXTURES / str(request.param), copy)
    return copy


def test_there_is_a_fixture_of_this_version() -> None:
    assert "v1" in READABLE


def test_the_log_and_its_offsets_read_as_written(stored: Path) -> None:
    expected = json.loads((stored / "expected.json").read_text())
    events = read_topic(stored / "log", expected["topic"])
    assert len(events) == expected["records"]
    assert {k: row_text(r) for k, r in latest_rows(events).items()} == expected["live"]
    reader = LocalChangeLogReader(stored / "log")
    try:
        offset = PostgresOffset.load(reader.source_offsets()["shop"])
    finally:
        reader.close()
    assert offset.dump() == expected["offset"] and offset.describe() == "0/16B3748"


def test_the_follower_reads_as_written(stored: Path) -> None:
    expected = json.loads((stored / "expected.json").read_text())
    sink = DeltaSink("warehouse", stored / "warehouse", tables={}, log_path=stored / "log")
    try:
        assert sink.read(expected["topic"], list(expected["live"])) == expected["live"]
        assert sorted(sink.keys(expected["topic"])) == sorted(expected["live"])
        assert sink.watermark("shop") == expected["offset"]
    finally:
        sink.close()


def test_the_sql_follower_reads_as_written(stored: Path) -> None:
    from sinks.sql import SqlSink

    expected = json.loads((stored / "expected.json").read_text())
    sink = SqlSink("ledger", f"sqlite:///{stored / 'sql' / 'follower.db'}",
                   tables={expected["topic"]: ("shop", TableId("public", "orders"))},
                   log_path=stored / "log")
    try:
        assert sink.read(expected["topic"], list(expected["live"])) == expected["live"]
        assert sorted(sink.keys(expected["topic"])) == sorted(expected["live"])
        assert sink.watermark("shop") == expected["offset"]
    finally:
        sink.close()


def _restore_redis(stored: Path, url: str) -> None:
    import redis

    with redis.Redis.from_url(url, decode_responses=True) as client:
        for key, item in json.loads((stored / "redis.json").read_text()).items():
            if item["type"] == "hash":
                client.hset(key, mapping=item["value"])
            else:
                client.set(key, item["value"])


def test_the_redis_follower_reads_as_written(stored: Path, redis_url: str) -> None:
    from sinks.redis import RedisSink

    expected = json.loads((stored / "expected.json").read_text())
    _restore_redis(stored, redis_url)
    sink = RedisSink("cache", redis_url,
                     tables={expected["topic"]: ("shop", TableId("public", "orders"))})
    try:
        assert sink.read(expected["topic"], list(expected["live"])) == expected["live"]
        assert sorted(sink.keys(expected["topic"])) == sorted(expected["live"])
        assert sink.watermark("shop") == expected["offset"]
    finally:
        sink.close()


def test_follower_state_from_a_newer_version_is_refused_naming_the_fix(
        tmp_path: Path, redis_url: str) -> None:
    """Each follower kind's layout carries its format: a newer one is refused, naming the fix."""
    import sqlite3

    import redis

    from sinks.redis import RedisSink, RedisSinkError
    from sinks.sql import SqlSink, SqlSinkError

    copy = tmp_path / "v1"
    shutil.copytree(FIXTURES / "v1", copy)
    with sqlite3.connect(copy / "sql" / "follower.db") as db:
        db.execute("""UPDATE _cdc_watermarks SET "offset" = '{"format": 2}'
                      WHERE source = '#format'""")
    sql = SqlSink("ledger", f"sqlite:///{copy / 'sql' / 'follower.db'}", log_path=copy / "log")
    try:
        with pytest.raises(SqlSinkError, match="has format 2, written by a newer cdc") as held:
            sql.watermark("shop")
        assert "run the cdc version that wrote the follower" in str(held.value)
    finally:
        sql.close()
    _restore_redis(copy, redis_url)
    with redis.Redis.from_url(redis_url) as client:
        client.hset("cdc:watermark:cache", "#format", "2")
    cache = RedisSink("cache", redis_url)
    try:
        with pytest.raises(RedisSinkError, match="has format 2, written by a newer cdc"):
            cache.watermark("shop")
    finally:
        cache.close()


def test_follower_state_written_before_formats_were_marked_reads_as_format_1(
        tmp_path: Path, redis_url: str) -> None:
    """A follower without a format marker is format 1: read, and marked when next written."""
    import sqlite3

    import redis

    from sinks.redis import RedisSink
    from sinks.sql import SqlSink

    expected = json.loads((FIXTURES / "v1" / "expected.json").read_text())
    copy = tmp_path / "v1"
    shutil.copytree(FIXTURES / "v1", copy)
    with sqlite3.connect(copy / "sql" / "follower.db") as db:
        db.execute("DELETE FROM _cdc_watermarks WHERE source = '#format'")
    sql = SqlSink("ledger", f"sqlite:///{copy / 'sql' / 'follower.db'}", log_path=copy / "log")
    try:
        assert sql.watermark("shop") == expected["offset"]
    finally:
        sql.close()
    with sqlite3.connect(copy / "sql" / "follower.db") as db:
        assert db.execute("SELECT \"offset\" FROM _cdc_watermarks WHERE source = '#format'"
                          ).fetchall() == [('{"format": 1}',)]
    _restore_redis(copy, redis_url)
    with redis.Redis.from_url(redis_url) as client:
        client.hdel("cdc:watermark:cache", "#format")
        cache = RedisSink("cache", redis_url)
        try:
            assert cache.watermark("shop") == expected["offset"]
            cache.set_watermark("shop", expected["offset"])
            assert client.hget("cdc:watermark:cache", "#format") == b"1"
        finally:
            cache.close()


def test_state_from_a_newer_version_is_refused_naming_the_fix(tmp_path: Path) -> None:
    copy = tmp_path / "v1"
    shutil.copytree(FIXTURES / "v1", copy)
    state = json.loads((copy / "log" / "state.json").read_text())
    offset = dict(state["source_offsets"]["shop"], format=2)
    with pytest.raises(FormatVersionError, match="format 2, written by a newer cdc") as caught:
        PostgresOffset.load(offset)
    assert "run the cdc version that wrote" in str(caught.value)
    (copy / "log" / "state.json").write_text(json.dumps({**state, "format": 2}))
    with pytest.raises(FormatVersionError, match="state .* has format 2, written by a newer cdc"):
        LocalChangeLogReader(copy / "log").committed()
    marks = copy / "warehouse" / "_cdc_watermarks.json"
    marks.write_text(json.dumps({**json.loads(marks.read_text()), "version": 2}))
    sink = DeltaSink("warehouse", copy / "warehouse", tables={}, log_path=copy / "log")
    try:
        with pytest.raises(Exception, match="watermarks .* has format 2, written by a newer cdc"
                           ) as held:
            sink.watermark("shop")
        assert "fix" in str(held.value)
    finally:
        sink.close()
