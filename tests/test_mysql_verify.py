"""``cdc verify`` of a MariaDB source (``connectors/mysql/checksum.py``) against a real MariaDB
and a real Redis.

* Checksum parity: for every MySQL/MariaDB type the connector maps (``tests/test_mysql_types.py``'s
  table: extremes, zero dates, NULLs) plus float, string-escaping and key edge cases, every
  cell's SQL canonical text equals ``canonical_text`` of the JSON form the snapshot's decoding
  gives, the key texts equal the log's key bytes, and every chunk's SQL checksum equals the
  Python checksum of those rows; keyset pagination over composite, ENUM, binary, temporal and
  decimal keys sees every row once; ``absent`` finds exactly the keys the leader lacks.
* End to end: bootstrap + ``cdc capture`` + ``cdc apply --once`` into Redis; verify exits 0
  when equal, 1 naming a key changed directly in Redis, and 3 naming capture when it is not
  running.
"""

from __future__ import annotations

import os
import random
import re
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from cdc.config import load_config, parse_config
from cdc.events import TableId
from cdc.sink import canonical_text, row_text
from cdc.verify import chunk_checksum, row_digest_text
from connectors.mysql.catalog import qualified
from connectors.mysql.connection import query, quote_ident
from tests import test_mysql_types as types_test
from tests.mykit import MyDatabase, wait_caught_up, write_config
from tests.pgkit import Capture, cdc, output
from tests.sparkkit import apply_once

pytestmark = pytest.mark.timeout(300)

#: doubles whose Python repr takes every layout: fixed/scientific boundaries, subnormals, -0.0
DOUBLES = [0.0, -0.0, 1.0, -1.5, 0.1, 1e15, 1e16, 123456789012345678.0, 1234567890123456.7,
           9999999999999998.0, 1e-4, 1e-5, 0.00012345, 5e-324, 2.2250738585072014e-308,
           1.7976931348623157e308, -1e308, 100.0, 1e22, 0.30000000000000004]
#: strings whose JSON escaping is exercised in keys (quotes, backslashes, every control
#: character, characters json.dumps leaves alone)
STRINGS = ['q"uo\\te', "\n\r\t\b\f", "".join(chr(c) for c in range(1, 32)), "é😀\u2028\x7f",
           "", "plain", "a/b", "%s %%", "'"]

EDGE_DDL = """
CREATE TABLE edge (k varchar(40) NOT NULL, n int NOT NULL, d double, f float,
                   t text CHARACTER SET latin1, dd double(10,2), PRIMARY KEY (k, n))
                   CHARACTER SET utf8mb4
"""
KEYS_DDL = """
CREATE TABLE keyed (b binary(3) NOT NULL, dt datetime(6) NOT NULL, e enum('b','a') NOT NULL,
                    u bigint unsigned NOT NULL, de decimal(5,2) NOT NULL, tm time(3) NOT NULL,
                    v int, PRIMARY KEY (b, dt, e, u, de, tm))
"""


def _leader(db: MyDatabase, tables: list[str]) -> Any:
    from connectors.mysql.checksum import MySqlLeader

    config = parse_config({"sources": [{"name": db.source, "kind": "mysql", "dsn": db.url(),
                                        "password_env": db.password_env,
                                        "server_id": db.server_id,
                                        "tables": [f'{db.name}."{t}"' for t in tables]}]},
                          Path("."))
    return MySqlLeader(config.sources[0])


def _check_parity(leader: Any, table: TableId, chunk_size: int) -> dict[str, dict[str, Any]]:
    """Every cell's SQL text == canonical_text(JSON form); every chunk checksum == Python's."""

    described = leader.table(table)
    chunks = list(leader.chunks(table, chunk_size))
    decoded = [leader.rows(table, chunk) for chunk in chunks]
    rows = {key: row for part in decoded for key, row in part.items()}
    cells = ", ".join(f"IF(t.{quote_ident(n)} IS NULL, NULL, {described.canons[n].text})"
                      for n in described.columns)
    sql = f"SELECT {described.key_sql}, {cells} FROM {qualified(table)} AS t"
    seen = 0
    for key, *texts in query(leader.conn, sql):
        seen += 1
        for name, text in zip(described.columns, texts, strict=True):
            value = rows[key][name]
            assert text == (None if value is None else canonical_text(value)), (key, name)
    assert seen == len(rows)  # pagination saw every row once
    for chunk, part in zip(chunks, decoded, strict=True):
        assert list(part) == chunk.keys  # the SQL key texts are the log's key bytes
        assert len(chunk.keys) <= chunk_size
        texts = [row_digest_text(key, row_text(part[key]), described.columns)
                 for key in chunk.keys]
        assert chunk_checksum(texts) == chunk.checksum, chunk.keys
    return rows


def _fill_types(db: MyDatabase) -> None:
    """tests/test_mysql_types.py's table: its three rows, then random doubles and floats."""
    db.execute(types_test.DDL)
    rnd = random.Random(7)
    with db.transaction() as cursor:
        cursor.execute("SET SESSION sql_mode = ''")  # zero dates, zero months and days
        for row in (types_test.MAX_ROW, types_test.MIN_ROW, types_test.NULL_ROW):
            types_test._insert(cursor, row)
        for i in range(40):
            bits = struct.unpack("<d", rnd.getrandbits(64).to_bytes(8, "little"))[0]
            double = bits if bits == bits and abs(bits) != float("inf") else 1.0
            small = rnd.uniform(-1, 1) * 10 ** rnd.randint(-30, 30)
            types_test._insert(cursor, {"id": 10 + i, "d": double, "f": small,
                                        "vc": rnd.choice(STRINGS)[:20], "dte": "2024-02-30"})


def test_sql_canonical_text_equals_the_snapshot_json_form(mysql_db: MyDatabase) -> None:
    db = mysql_db
    _fill_types(db)
    db.execute(EDGE_DDL)
    with db.transaction() as cursor:
        n = 0
        for text in STRINGS:
            for double in DOUBLES:
                n += 1
                single = double if double == 0 or 1e-38 < abs(double) < 3e38 else None
                cursor.execute("INSERT INTO edge VALUES (%s, %s, %s, %s, %s, %s)",
                               (text, n, double, single, "é€\x81",
                                double if abs(double) < 1e7 else -0.01))
    db.execute(KEYS_DDL)
    with db.transaction() as cursor:
        for i in range(12):
            cursor.execute("INSERT INTO keyed VALUES (%s, %s, %s, %s, %s, %s, %s)",
                           (bytes([i % 3, 0, 255]), f"2024-01-0{1 + i % 2} 00:00:00.00000{i % 2}",
                            "ab"[i // 6], 18446744073709551615 - i % 2, f"{i % 3}.50",
                            f"{'-' if i % 2 else ''}838:59:{i:02d}.5", i))
    leader = _leader(db, [types_test.TABLE, "edge", "keyed"])
    try:
        table = TableId(db.name, types_test.TABLE)
        rows = _check_parity(leader, table, chunk_size=3)
        assert len(rows) == 43
        for key in (1, 2, 3):  # the rows path decodes to the stated JSON values
            assert rows[f'{{"id":{key}}}'] == types_test.EXPECTED[key], key
        assert rows['{"id":10}']["dte"] is None  # an impossible date is null
        assert leader.inexact(table) == ()
        edge = _check_parity(leader, TableId(db.name, "edge"), chunk_size=7)
        assert len(edge) == len(STRINGS) * len(DOUBLES)
        n = STRINGS.index("plain") * len(DOUBLES) + DOUBLES.index(1e15) + 1
        assert canonical_text(edge[f'{{"k":"plain","n":{n}}}']["d"]) == "1000000000000000.0"
        # DOUBLE(M,D) prints rounded to D decimals; the snapshot, the binlog and the SQL all
        # take the stored double (-0.01 is -0.010000000000000009), so it is exact
        assert leader.inexact(TableId(db.name, "edge")) == ()
        keyed = _check_parity(leader, TableId(db.name, "keyed"), chunk_size=1)
        assert len(keyed) == 12
        # ENUM keys sort by their index ('b' before 'a'): pagination compares them so too
        assert next(iter(keyed)) == ('{"b":"AAD/","dt":"2024-01-01T00:00:00.000000","e":"b",'
                                     '"u":"18446744073709551615","de":"0.50",'
                                     '"tm":"838:59:06.500000"}')

        # absent: exactly the keys the leader lacks
        known = list(edge)[:5] + list(keyed)[:5]
        lacking = ['{"k":"plain","n":9999}', '{"k":"nope","n":1}', '{"n":1,"k":"plain"}',
                   '{"k":"plain"}', "not json"]
        assert leader.absent(TableId(db.name, "edge"), known[:5] + lacking) == lacking
        gone = known[5].replace("838:59:", "838:58:")
        assert leader.absent(TableId(db.name, "keyed"), [*known[5:], gone]) == [gone]
        assert leader.absent(table, ['{"id":1}', '{"id":4}', '{"id":"1"}']) == \
            ['{"id":4}', '{"id":"1"}']
        # literals do not depend on the session's sql_mode
        edge_table = TableId(db.name, "edge")
        query(leader.conn, "SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')")
        assert _check_parity(leader, edge_table, chunk_size=50) == edge
        # a GROUP_CONCAT cut short (it warns) never yields a checksum, and the keys are read
        query(leader.conn, "SET SESSION group_concat_max_len = 200")
        cut = list(leader.chunks(edge_table, 50))
        assert {chunk.checksum for chunk in cut} == {""}
        assert [key for chunk in cut for key in chunk.keys] == list(edge)

        target = leader.target()
        file, pos = db.binlog_position()
        assert target.text == f"{file}:{pos}" and target.order == (int(file[-6:]), pos)
    finally:
        leader.close()


# ---------------------------------------------------------------------------- end to end

def _setup(db: MyDatabase, tmp_path: Path, redis_url: str) -> Path:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, amount decimal(12,2), "
               "note varchar(40), at timestamp(3) NULL, ratio double, flag bit(1), "
               "tags set('a','b','c'))")
    db.execute("INSERT INTO items SELECT seq, 1, seq / 7, CONCAT('note \"', seq, '\"'), "
               "TIMESTAMP'2024-01-01 00:00:00' + INTERVAL seq MINUTE, seq / 3e0, seq % 2, "
               "IF(seq % 3 = 0, 'a,c', '') FROM seq_1_to_300")
    db.execute("CREATE TABLE quiet (code varchar(8) PRIMARY KEY, label text)")
    db.execute("INSERT INTO quiet VALUES ('a', 'A'), ('b', NULL)")
    followers = f"followers:\n  cache:\n    kind: redis\n    url: {redis_url}\n"
    config = write_config(tmp_path, db, ["items", "quiet"], extra=followers)
    result = cdc("bootstrap", "--config", str(config), env=db.env())
    assert result.returncode == 0, output(result)
    return config


def _verify(config: Path, db: MyDatabase, *args: str) -> Any:
    began = time.monotonic()
    result = cdc("verify", "--config", str(config), "--follower", "cache", "--chunk-size", "64",
                 *args, timeout=120, env=db.env())
    print(f"verify {' '.join(args)}: exit {result.returncode} in {time.monotonic() - began:.1f} s")
    return result


def _apply_once(config: Path, db: MyDatabase) -> None:
    """``cdc apply --once`` of the Redis follower, in this process on the shared session."""
    began = time.monotonic()
    os.environ.update(db.env())
    apply_once(config, "cache")
    print(f"apply --once: {time.monotonic() - began:.1f} s")


def test_verify_mariadb_follower_equal_then_different_then_capture_behind(
        mysql_db: MyDatabase, tmp_path: Path, redis_url: str, spark: Any) -> None:
    from cdc.sink import open_sink

    db = mysql_db
    started = time.monotonic()
    config = _setup(db, tmp_path, redis_url)
    capture = Capture(config, tmp_path / "capture.log").start()
    try:
        db.execute("UPDATE items SET v = v + 1, note = NULL, tags = 'b' WHERE id % 10 = 0")
        db.execute("DELETE FROM items WHERE id BETWEEN 201 AND 220")
        db.execute("INSERT INTO items (id, v, ratio) VALUES (9001, 5, 1e16)")
        wait_caught_up(db, tmp_path / "log")  # apply --once folds what the log holds now
        _apply_once(config, db)

        result = _verify(config, db, "--timeout", "60s")
        assert result.returncode == 0, output(result)
        assert "follower equals the leader" in result.stdout
        assert re.search(rf"{db.name}\.items\s*│\s*281\s*│", result.stdout), result.stdout

        sink = open_sink(load_config(config), "cache")
        topic = f"{db.source}.{db.name}.items"
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        client.hset(sink.row_key(topic, '{"id":42}'), "amount", "6.01")  # changed in Redis
        changed = _verify(config, db, "--timeout", "60s", "--show", "10")
        text = output(changed)
        assert changed.returncode == 1, text
        assert '{"id":42}  different: amount' in text
        assert "follower differs from the leader" in text
        sink.close()
    finally:
        capture_code = capture.terminate()
    assert capture_code == 0, (tmp_path / "capture.log").read_text()
    # capture stopped: a write moves the server's binlog past what the log holds
    db.execute("UPDATE items SET v = v + 1 WHERE id = 1")
    behind = _verify(config, db, "--timeout", "2s")
    assert behind.returncode == 3, output(behind)
    assert "capture is behind" in behind.stderr and "cdc capture" in behind.stderr
    print(f"\nverify end to end: {time.monotonic() - started:.1f} s")


def test_check_config_refuses_views_comparing_loosely_compared_text(
        tmp_path: Path, mysql_db: MyDatabase) -> None:
    """MariaDB's ``_ci`` collations make 'Ann' and 'ann ' one group on the leader and two in a
    follower, and a PAD SPACE one (``utf8mb4_bin``, binary but blind to trailing blanks) makes
    'b' and 'b ' one: ``check-config --connect`` refuses a view grouping, keying, joining,
    filtering or ordering on such a column (``WHERE label = 'ann'`` keeps 'Ann' on the leader),
    names it and a fix that is itself right, passes a view that only projects it, and passes
    the grouping view once the column is ``utf8mb4_nopad_bin``."""
    mysql_db.execute("CREATE TABLE tag (id int PRIMARY KEY, "
                     "label varchar(20) COLLATE utf8mb4_general_ci, code varchar(8) "
                     "COLLATE utf8mb4_nopad_bin, kind varchar(8) COLLATE utf8mb4_bin) "
                     "CHARACTER SET utf8mb4")
    mysql_db.execute("CREATE TABLE note (id int PRIMARY KEY, tag_code varchar(8) "
                     "COLLATE utf8mb4_nopad_bin, tag_label varchar(20) COLLATE "
                     "utf8mb4_general_ci)")
    mysql_db.execute("INSERT INTO tag VALUES (1, 'Ann', 'a', 'b'), (2, 'ann ', 'b', 'b ')")
    # the leader's own answers: one group where a follower comparing bytes has two
    table = mysql_db.table("tag")
    assert mysql_db.execute(f"SELECT count(DISTINCT label) FROM {table}") == [(1,)]
    assert mysql_db.execute(f"SELECT count(DISTINCT kind) FROM {table}") == [(1,)]
    assert mysql_db.execute(f"SELECT count(DISTINCT code) FROM {table}") == [(2,)]
    db = mysql_db.name
    views = {
        "by_label": (f"SELECT t.label, count(*) AS n FROM {db}.tag t GROUP BY t.label",
                     "label", f"{db}.tag.label (utf8mb4_general_ci): equality"),
        "by_kind": (f"SELECT t.kind, count(*) AS n FROM {db}.tag t GROUP BY t.kind",
                    "kind", f"{db}.tag.kind (utf8mb4_bin): equality"),
        "joined": (f"SELECT n.id, t.code FROM {db}.note n JOIN {db}.tag t "
                   "ON n.tag_label = t.label", "id",
                   f"{db}.note.tag_label (utf8mb4_general_ci): equality; "
                   f"{db}.tag.label (utf8mb4_general_ci): equality"),
        "by_code": (f"SELECT t.code, count(*) AS n FROM {db}.tag t GROUP BY t.code", "code",
                    None),
        "filtered": (f"SELECT t.id, t.code FROM {db}.tag t WHERE upper(t.label) = 'ANN'", "id",
                     f"{db}.tag.label (utf8mb4_general_ci): equality"),
        "lowest": (f"SELECT t.code, min(t.kind) AS k FROM {db}.tag t GROUP BY t.code", "code",
                   f"{db}.tag.kind (utf8mb4_bin): order"),
        "projected": (f"SELECT t.id, t.label, char_length(t.label) AS n FROM {db}.tag t "
                      "WHERE char_length(t.kind) > 0", "id", None),
    }
    for name, (sql, key, loose) in views.items():
        extra = (f"followers:\n  reporting:\n    kind: sql\n    url: sqlite:///{tmp_path}/r.db\n"
                 f"views:\n  {name}:\n    source: {mysql_db.source}\n    sql: {sql}\n"
                 f"    key: [{key}]\n    followers: [reporting]\n")
        config = write_config(tmp_path, mysql_db, ["tag", "note"], extra=extra)
        checked = cdc("check-config", "--config", str(config), "--connect")
        if loose is None:
            assert checked.returncode == 0, output(checked)
            assert "leader EXPLAIN" in checked.stdout, output(checked)
            continue
        assert checked.returncode != 0, output(checked)
        assert "compares text the leader compares by its collation" in checked.stderr
        assert loose in " ".join(checked.stderr.split()), output(checked)
        assert "COLLATE utf8mb4_nopad_bin" in checked.stderr
        assert "Traceback" not in checked.stderr
    mysql_db.execute("ALTER TABLE tag MODIFY label varchar(20) COLLATE utf8mb4_nopad_bin")
    sql, key, _ = views["by_label"]
    extra = (f"followers:\n  reporting:\n    kind: sql\n    url: sqlite:///{tmp_path}/r.db\n"
             f"views:\n  by_label:\n    source: {mysql_db.source}\n    sql: {sql}\n"
             f"    key: [{key}]\n    followers: [reporting]\n")
    config = write_config(tmp_path, mysql_db, ["tag", "note"], extra=extra)
    passed = cdc("check-config", "--config", str(config), "--connect")
    assert passed.returncode == 0, output(passed)
