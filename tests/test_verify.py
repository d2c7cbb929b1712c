"""``cdc verify`` against real PostgreSQL and real Redis.

* Checksum parity: for every type of ``tests/test_pg_types.py`` (and an array of each, 1-D to
  3-D) plus edge values, the SQL canonical text of each cell equals ``canonical_text`` of the JSON
  form the snapshot's decoding gives, the key texts equal the log's key bytes, and every chunk's
  SQL checksum equals the Python checksum of those rows; types without an exact SQL form are
  flagged.
* End to end: bootstrap + ``cdc capture`` + ``cdc apply`` into Redis; verify exits 0 when
  equal (also on idle tables: its own heartbeat moves the log and the watermark), 1 naming the
  key and column changed / deleted / added directly in Redis, and 3 naming capture or apply when
  that stage is not running.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from cdc.events import TableId
from cdc.sink import canonical_text, row_text
from cdc.verify import chunk_checksum, row_digest_text
from tests import test_pg_types as types_test
from tests.pgkit import Capture, Database, cdc, output, write_config
from tests.sparkkit import InProcessApply

pytestmark = pytest.mark.timeout(300)

EDGE_TABLE = """
CREATE TABLE edge (k text, n int, f8 float8, f4 real, a3 int[], tz timetz, iv interval,
                   t text, PRIMARY KEY (k, n));
CREATE TABLE boxes (id int PRIMARY KEY, b box[]);
INSERT INTO boxes VALUES (1, ARRAY['(1,1),(0,0)'::box, '(2,2),(1,1)'::box]), (2, '{}'), (3, NULL);
"""
EDGE_ROWS = [
    ("'plain'", "1", "1e15", "1e15", "'{{{1,2},{3,4}},{{5,NULL},{7,8}}}'", "'24:00:00+00'",
     "'-1 mons -1 days -00:00:00.5'", "'x'"),
    (types_test.lit('q"uo\\te\n{é😀}\x01'), "-2", "1234567890123456.7", "'-0'", "'{}'",
     "'00:00:00.000001-14'", "'1 sec'",
     types_test.lit("\x7f\u2028\t")),
    ("''", "0", "100", "16777216", "'{{1},{NULL}}'", "'12:00+05'",
     "'P1Y-2M3DT-4H5M-6.000001S'", "''"),
    ("'z'", "7", "'-1e-5'", "'1e-45'", "'[0:1]={1,2}'", "NULL", "NULL", "NULL"),
    ("'zz'", "8", "5e-324", "3.4028235e38", "'{1,NULL}'", "'23:59:59.999999+00'",
     "'0'", "'NULL'"),
]


def _leader(db: Database, tables: list[str]) -> Any:
    from cdc.config import parse_config
    from connectors.postgres.checksum import PostgresLeader

    config = parse_config({"sources": [{"name": db.source, "kind": "postgres", "dsn": db.dsn(),
                                        "tables": tables}]}, Path("."))
    return PostgresLeader(config.sources[0])


def _check_parity(leader: Any, table: TableId, chunk_size: int) -> dict[str, dict[str, Any]]:
    """Every cell's SQL text == canonical_text(JSON form); every chunk checksum == Python's."""
    from connectors.postgres.replication import quote_ident

    described = leader.table(table)
    chunks = list(leader.chunks(table, chunk_size))
    rows: dict[str, dict[str, Any]] = {}
    for chunk in chunks:
        decoded = leader.rows(table, chunk)
        assert list(decoded) == chunk.keys  # the SQL key texts are the log's key bytes
        texts = [row_digest_text(key, row_text(decoded[key]), described.columns)
                 for key in chunk.keys]
        assert chunk_checksum(texts) == chunk.checksum, chunk.keys
        rows.update(decoded)
    canons = described.canons
    cells = ", ".join(f"CASE WHEN {quote_ident(n)} IS NULL THEN NULL ELSE {canons[n].text} END"
                      for n in described.columns)
    query = f"SELECT {described.key_sql}, {cells} FROM {quote_ident(table.table)}"
    for key, *texts in leader.conn.execute(query).fetchall():
        for name, text in zip(described.columns, texts, strict=True):
            value = rows[key][name]
            assert text == (None if value is None else canonical_text(value)), (key, name)
    return rows


def test_sql_canonical_text_equals_the_snapshot_json_form(pg_db: Database) -> None:
    columns = types_test._columns(pg_db)
    pg_db.execute(types_test.TYPES_SETUP)
    definitions = [f"{c.name} {c.sql_type}" for c in columns]
    definitions += [f"a_{c.name} {c.sql_type}[]" for c in columns]
    pg_db.execute(f"CREATE TABLE types_all (id int PRIMARY KEY, {', '.join(definitions)})")
    types_test._insert_rows(pg_db, columns, 1)
    types_test._insert_rows(pg_db, columns, 101)
    pg_db.execute(EDGE_TABLE)
    for values in EDGE_ROWS:
        pg_db.execute(f"INSERT INTO edge VALUES ({', '.join(values)})")
    leader = _leader(pg_db, ["public.types_all", "public.edge", "public.boxes"])
    try:
        rows = _check_parity(leader, TableId("public", "types_all"), chunk_size=3)
        assert len(rows) == 10
        for row in range(5):  # the rows path decodes to the stated JSON values too
            assert {k: v for k, v in rows[f'{{"id":{row + 1}}}'].items() if k != "id"} == \
                types_test._expected(columns, row)
        assert leader.table(TableId("public", "types_all")).inexact == ()
        edge = _check_parity(leader, TableId("public", "edge"), chunk_size=2)
        assert len(edge) == len(EDGE_ROWS)
        assert edge['{"k":"plain","n":1}']["a3"] == [[[1, 2], [3, 4]], [[5, None], [7, 8]]]
        assert canonical_text(edge['{"k":"plain","n":1}']["f8"]) == "1000000000000000.0"
        assert leader.table(TableId("public", "edge")).inexact == ()
        # box[] elements are ';'-delimited in PostgreSQL's text, plain strings in JSON
        boxes = _check_parity(leader, TableId("public", "boxes"), chunk_size=2)
        assert boxes == {'{"id":1}': {"id": 1, "b": ["(1,1),(0,0)", "(2,2),(1,1)"]},
                         '{"id":2}': {"id": 2, "b": []}, '{"id":3}': {"id": 3, "b": None}}
    finally:
        leader.close()


# ---------------------------------------------------------------------------- end to end

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, amount numeric(12,2), note text,
                    tags text[], at timestamptz, ratio real);
CREATE TABLE quiet (code text PRIMARY KEY, label text);
"""


def _setup(db: Database, tmp_path: Path, redis_url: str) -> Path:
    db.execute(SCHEMA)
    db.execute("INSERT INTO items SELECT g, 1, g / 7.0, 'note ' || g, ARRAY['a', g::text], "
               "'2024-01-01'::timestamptz + g * interval '1 minute', g / 3.0 "
               "FROM generate_series(1, 2500) g")
    db.execute("INSERT INTO quiet VALUES ('a', 'A'), ('b', NULL)")
    followers = f"followers:\n  cache:\n    kind: redis\n    url: {redis_url}\n"
    # capture's own heartbeats are rare: on idle tables only verify's heartbeat moves the log
    config = write_config(tmp_path, db, ["public.items", "public.quiet"], extra=followers,
                          heartbeat_interval="1h")
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    return config


def _verify(config: Path, *args: str) -> Any:
    began = time.monotonic()
    result = cdc("verify", "--config", str(config), "--follower", "cache", "--chunk-size", "300",
                 *args, timeout=240)
    print(f"verify {' '.join(args)}: exit {result.returncode} in {time.monotonic() - began:.1f} s")
    return result


def test_verify_equal_then_names_what_was_changed_in_redis(pg_db: Database, tmp_path: Path,
                                                           redis_url: str, spark: Any) -> None:
    config = _setup(pg_db, tmp_path, redis_url)
    capture = Capture(config, tmp_path / "capture.log").start()
    applier = InProcessApply(config, tmp_path / "apply.log", "cache")
    try:
        pg_db.execute("UPDATE items SET v = v + 1, note = NULL WHERE id % 10 = 0")
        pg_db.execute("DELETE FROM items WHERE id BETWEEN 2001 AND 2100")
        pg_db.execute("INSERT INTO items (id, v, tags) VALUES (9001, 5, '{}')")
        started = time.monotonic()
        result = _verify(config, "--timeout", "180s")  # Spark takes its time to start
        assert result.returncode == 0, output(result) + (tmp_path / "apply.log").read_text()
        assert "follower equals the leader" in result.stdout
        assert re.search(r"public\.items\s*│\s*2,401\s*│\s*9\s*│\s*0", result.stdout), \
            result.stdout
        # the tables stay idle from here on: verify's own heartbeat moves the log and the
        # watermark, so it cannot hang
        idle = _verify(config, "--timeout", "90s")
        assert idle.returncode == 0, output(idle)

        client = redis.Redis.from_url(redis_url, decode_responses=True)
        client.hset("public.items:42", "amount", "6.01")  # changed directly in Redis
        client.delete("public.items:77")  # deleted
        client.hset("public.items:5000", mapping={"_cdc_key": '{"id":5000}', "v": "1",
                                                  "_cdc_position": "00"})  # extra
        client.hdel("public.quiet:a", "label")
        changed = _verify(config, "--show", "10")
        text = output(changed)
        assert changed.returncode == 1, text
        assert '{"id":42}  different: amount' in text
        assert '{"id":77}  missing on the follower' in text
        assert '{"id":5000}  extra on the follower' in text
        assert '{"code":"a"}  different: label' in text
        assert "follower differs from the leader" in text
        assert "s per 100k rows" in text
    finally:
        applier_code = applier.terminate()
        capture_code = capture.terminate()
    assert applier_code == 0, (tmp_path / "apply.log").read_text()
    assert capture_code == 0, (tmp_path / "capture.log").read_text()
    print(f"\nverify end to end: {time.monotonic() - started:.1f} s")


def test_verify_names_the_stage_that_is_behind_and_passes_after_apply_once(
        pg_db: Database, tmp_path: Path, redis_url: str, spark: Any) -> None:
    from tests.pgkit import wait_caught_up
    from tests.sparkkit import apply_once

    config = _setup(pg_db, tmp_path, redis_url)
    # no capture: the log cannot reach verify's heartbeat
    result = _verify(config, "--timeout", "2s")
    assert result.returncode == 3, output(result)
    assert "capture is behind" in result.stderr and "cdc capture" in result.stderr
    capture = Capture(config, tmp_path / "capture.log").start()
    try:  # capture but no apply: the log passes the target, the follower does not
        result = _verify(config, "--timeout", "4s")
        assert result.returncode == 3, output(result)
        assert "apply is behind" in result.stderr
        assert "cdc apply --follower cache" in result.stderr
        # the batch way: `cdc apply --once`, capture still running. Verify's own heartbeat
        # moves the log past the follower's watermark, yet nothing of its tables came after
        # its last batch: it is current
        apply_once(config, "cache")
        after_once = _verify(config, "--timeout", "30s")
        assert after_once.returncode == 0, output(after_once)
        assert "follower equals the leader" in after_once.stdout
        pg_db.execute("UPDATE items SET v = v + 1 WHERE id <= 3")  # now it is behind
        wait_caught_up(pg_db, tmp_path / "log")
        behind = _verify(config, "--timeout", "3s")
        assert behind.returncode == 3, output(behind)
        said = " ".join(behind.stderr.split())  # unwrapped
        assert "3 record(s) of its tables are past its last finished batch" in said
        assert "cdc apply --once --follower cache" in said
    finally:
        capture_code = capture.terminate()
    assert capture_code == 0, (tmp_path / "capture.log").read_text()
