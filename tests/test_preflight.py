"""``cdc check-config --connect``: every part reached and checked, a ✓/✗ table with the fix per
✗, exit 1 on any ✗ — and nothing created (slots, publications, topics, follower paths)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.kafkakit import kafka_yaml
from tests.pgkit import Database, cdc, output, write_config

pytestmark = [pytest.mark.timeout(600)]

WIDE = {"COLUMNS": "300"}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_state(db: Database, broker: Any, root: Path) -> dict[str, Any]:
    """What check-config must leave as it found: slots, publications, topics, files."""
    from confluent_kafka.admin import AdminClient

    with psycopg.connect(db.dsn(), autocommit=True) as conn:
        slots = sorted(r[0] for r in conn.execute("SELECT slot_name FROM pg_replication_slots"))
        publications = sorted(r[0] for r in conn.execute("SELECT pubname FROM pg_publication"))
    # the broker's own __consumer_offsets appears with the first consumer ever (every real
    # cluster has it): not a topic of the log's
    topics = sorted(t for t in AdminClient({"bootstrap.servers": broker.bootstrap_servers})
                    .list_topics(timeout=10).topics if t != "__consumer_offsets")
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    return {"slots": slots, "publications": publications, "topics": topics, "files": files}


def _rows(text: str) -> dict[str, str]:
    """``part/check`` -> the row's mark and the first line of its finding ("source" is the
    source's part, "cache" a follower's)."""
    rows, part, last = {}, "", ""
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) >= 5 and cells[1] in ("✓", "!", "✗", "–"):
            part = cells[2].split(" ")[cells[2].startswith(("follower", "source"))] \
                if cells[2] else part
            last = f"{part}/{cells[3]}"
            rows[last] = f"{cells[1]} {cells[4]}"
        elif len(cells) >= 5 and last and not cells[1] and cells[4] \
                and not cells[4].startswith("fix:") and "fix:" not in rows[last]:
            rows[last] += " " + cells[4]  # the finding wrapped onto the next line
    return rows


def test_preflight_checks_every_part_and_creates_nothing(
        pg_db: Database, kafka_broker: Any, redis_url: str, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE orders (id int PRIMARY KEY, note text)")
    pg_db.execute("CREATE TABLE lines (order_id int, line int, sku text, "
                  "PRIMARY KEY (order_id, line))")
    followers = (f"followers:\n  cache:\n    kind: redis\n    url: {redis_url}\n"
                 f"  wh:\n    kind: delta\n    path: {tmp_path / 'state' / 'wh'}\n"
                 f"  db:\n    kind: sql\n    url: sqlite:///{tmp_path / 'state' / 'f.db'}\n")
    config = write_config(tmp_path, pg_db, ["public.orders", "public.lines"],
                          log_options=kafka_yaml(kafka_broker), extra=followers)
    before = _server_state(pg_db, kafka_broker, tmp_path)
    checked = cdc("check-config", "--config", str(config), "--connect", env=WIDE)
    assert checked.returncode == 0, output(checked)
    rows = _rows(checked.stdout)
    assert rows[f"{pg_db.source}/server"].startswith("✓ PostgreSQL 1"), rows
    assert rows[f"{pg_db.source}/settings"].startswith("✓ wal_level = logical")
    assert rows[f"{pg_db.source}/slot cdc_{pg_db.source}"] == "✓ free: `cdc bootstrap` creates it"
    assert rows[f"{pg_db.source}/table public.lines"] == "✓ key (order_id, line), 3 columns"
    assert rows["log/brokers"].startswith("✓ 1 broker(s) answer")
    assert rows["log/format"].startswith("✓ a new log")
    assert rows["cache/server"].startswith("✓ Redis")
    assert "will be created" in rows["wh/directory"] and "will be created" in rows["db/database"]
    assert rows["spark/master"].startswith("✓ local")
    assert _server_state(pg_db, kafka_broker, tmp_path) == before  # created nothing

    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    after_bootstrap = _server_state(pg_db, kafka_broker, tmp_path)
    again = cdc("check-config", "--config", str(config), "--connect", env=WIDE)
    assert again.returncode == 0, output(again)
    rows = _rows(again.stdout)
    assert rows[f"{pg_db.source}/slot cdc_{pg_db.source}"] == "✓ this log's, idle"
    assert rows["log/format"].startswith("✓ format avro, as the log was created")
    assert rows["log/topics"].startswith("✓ 4 topic(s): compacted")
    assert _server_state(pg_db, kafka_broker, tmp_path) == after_bootstrap


def test_preflight_names_each_problem_and_its_fix(
        pg_db: Database, redis_url: str, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE keyless (a int, b text)")
    pg_db.execute("CREATE TABLE people (id int PRIMARY KEY, email text)")
    pg_db.execute(f"SELECT pg_create_logical_replication_slot('cdc_{pg_db.source}', "
                  "'pgoutput')")  # another tool's slot of the name cdc would use
    dead = _closed_port()
    followers = (f"followers:\n  cache:\n    kind: redis\n    url: redis://127.0.0.1:{dead}/0\n"
                 f"  locked:\n    kind: redis\n    url: {redis_url}\n"
                 "    password_env: CDC_TEST_UNSET_PASSWORD\n"
                 f"spark:\n  master: spark://127.0.0.1:{dead}\n")
    columns = {"public.people": {"transforms": {"id": "mask"}}}
    config = write_config(tmp_path, pg_db, ["public.keyless", "public.people"],
                          extra=followers, columns=columns)
    checked = cdc("check-config", "--config", str(config), "--connect", env=WIDE)
    text = output(checked)
    assert checked.returncode == 1, text
    rows = _rows(checked.stdout)
    assert rows[f"{pg_db.source}/slot cdc_{pg_db.source}"].startswith("✗ replication slot"), rows
    assert "this log did not create it" in text and "pg_drop_replication_slot" in text
    assert rows[f"{pg_db.source}/table public.keyless"].startswith("✗")
    assert "REPLICA IDENTITY" in text
    assert rows[f"{pg_db.source}/table public.people"].startswith("✗") and "mask of id" in text
    assert rows["locked/password_env"].startswith("✗ followers.locked.password_env names the "
                                           "environment variable CDC_TEST_UNSET_PASSWORD")
    assert rows["cache/server"].startswith("✗") and "cannot reach Redis" in text
    assert rows["spark/master"].startswith("✗ the Spark master") and "start-master.sh" in text
    assert "preflight: " in checked.stderr and "check(s) failed" in checked.stderr
    with psycopg.connect(pg_db.dsn(), autocommit=True) as conn:
        assert [r[0] for r in conn.execute("SELECT pubname FROM pg_publication")] == []
    assert not (tmp_path / "log").exists()
    json.dumps(rows)  # every finding is plain text


def test_an_unreachable_source_is_one_failure_and_the_rest_not_checked(
        pg_db: Database, tmp_path: Path) -> None:
    dead = _closed_port()
    config = write_config(tmp_path, pg_db, ["public.t"],
                          dsn=f"postgresql://cdc@127.0.0.1:{dead}/nothing")
    checked = cdc("check-config", "--config", str(config), "--connect", env=WIDE)
    assert checked.returncode == 1
    rows = _rows(checked.stdout)
    assert rows[f"{pg_db.source}/server"].startswith("✗")
    assert "cannot reach PostgreSQL" in checked.stdout
    assert rows[f"{pg_db.source}/settings"] == "– not checked: server failed"
    assert rows["log/directory"].startswith("✓") and "will be created" in rows["log/directory"]


def test_preflight_of_a_mariadb_source(mysql_db: Any, tmp_path: Path) -> None:
    from tests.mykit import write_config as my_config

    mysql_db.script("CREATE TABLE items (id int PRIMARY KEY, name varchar(20));"
                    "CREATE TABLE loose (a int, b int);")
    config = my_config(tmp_path, mysql_db, ["items"])
    checked = cdc("check-config", "--config", str(config), "--connect",
                  env={**WIDE, **mysql_db.env()})
    assert checked.returncode == 0, output(checked)
    rows = _rows(checked.stdout)
    source = mysql_db.source
    assert "MariaDB" in rows[f"{source}/server"] and rows[f"{source}/server"].startswith("✓")
    assert rows[f"{source}/binlog settings"].split(";")[0] == (
        "✓ log_bin ON, binlog_format ROW, binlog_row_image FULL, binlog_row_metadata FULL")
    assert rows[f"{source}/privileges"].startswith("✓")
    assert rows[f"{source}/stored position"] == "✓ none yet: `cdc bootstrap` takes one"
    assert rows[f"{source}/table {mysql_db.table('items')}"] == "✓ key (id), 2 columns"

    unset = my_config(tmp_path, mysql_db, ["items", "loose"])
    unset.write_text(unset.read_text().replace(mysql_db.password_env, "CDC_TEST_UNSET_PW"))
    refused = cdc("check-config", "--config", str(unset), "--connect", env=WIDE)
    assert refused.returncode == 1
    rows = _rows(refused.stdout)
    assert rows[f"{source}/server"].startswith("✗ password_env names the environment "
                                              "variable CDC_TEST_UNSET_PW")
    both = my_config(tmp_path, mysql_db, ["items", "loose"])
    keyless = cdc("check-config", "--config", str(both), "--connect",
                  env={**WIDE, **mysql_db.env()})
    assert keyless.returncode == 1
    assert _rows(keyless.stdout)[f"{source}/table {mysql_db.table('loose')}"].startswith("✗")
