"""``cdc source drop``: a source's slot, publication, position and (on request) topics removed —
refused while its capture runs, and never touching a slot this log did not create."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.status import read_status
from tests.kafkakit import kafka_yaml
from tests.pgkit import Capture, Database, cdc, output, wait_for, write_config

pytestmark = [pytest.mark.timeout(600)]


def _server(db: Database) -> tuple[list[str], list[str]]:
    with psycopg.connect(db.dsn(), autocommit=True) as conn:
        return ([r[0] for r in conn.execute("SELECT slot_name FROM pg_replication_slots "
                                            "WHERE database = current_database()")],
                [r[0] for r in conn.execute("SELECT pubname FROM pg_publication")])


def test_drop_a_postgres_source_from_a_kafka_log(pg_db: Database, kafka_broker: Any,
                                                 tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient

    pg_db.execute("CREATE TABLE items (id int PRIMARY KEY, v int)")
    pg_db.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 50) g")
    config = write_config(tmp_path, pg_db, ["public.items"], log_options=kafka_yaml(kafka_broker))
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    slot = f"cdc_{pg_db.source}"
    assert _server(pg_db) == ([slot], [f"cdc_{pg_db.source}"])
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    assert any(pg_db.source in t for t in admin.list_topics(timeout=10).topics)

    capture = Capture(config, tmp_path / "capture.log").start()
    try:
        wait_for(lambda: (read_status(tmp_path / "log", pg_db.source) or {}).get("running"),
                 60, "capture to stream")
        running = cdc("source", "drop", pg_db.source, "--config", str(config), "--yes")
    finally:
        stopped = capture.terminate()
    assert stopped == 0
    assert running.returncode == 1 and "its capture is running" in running.stderr
    unconfirmed = cdc("source", "drop", pg_db.source, "--config", str(config))
    assert unconfirmed.returncode == 1 and "nothing was dropped" in unconfirmed.stderr
    assert _server(pg_db)[0] == [slot]

    dropped = cdc("source", "drop", pg_db.source, "--config", str(config), "--yes", "--topics")
    assert dropped.returncode == 0, output(dropped)
    assert f"dropped replication slot {slot}" in dropped.stdout
    assert f"deleted topic {pg_db.source}.public.items" in dropped.stdout
    assert _server(pg_db) == ([], [])
    assert not any(pg_db.source in t for t in admin.list_topics(timeout=10).topics)
    again = cdc("capture", "--config", str(config))
    assert again.returncode != 0 and "has not been bootstrapped" in again.stderr
    assert cdc("bootstrap", "--config", str(config)).returncode == 0  # starts over
    assert _server(pg_db)[0] == [slot]


def test_a_slot_this_log_did_not_create_is_left_alone(pg_db: Database, tmp_path: Path) -> None:
    pg_db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_config(tmp_path / "a", pg_db, ["public.items"])
    assert cdc("bootstrap", "--config", str(first)).returncode == 0  # log a's slot
    empty = write_config(tmp_path / "b", pg_db, ["public.items"])
    nothing = cdc("source", "drop", pg_db.source, "--config", str(empty), "--yes")
    assert nothing.returncode == 1 and "holds nothing" in nothing.stderr
    # log b holds another source, not this one: the slot of this source's name is log a's
    text = empty.read_text()
    other = text + text[text.index("  - name:"):].replace(
        f"name: {pg_db.source}", "name: other").replace("tables:", "slot: cdc_b_other\n    tables:")
    empty.write_text(other)
    assert cdc("bootstrap", "--config", str(empty), "--source", "other").returncode == 0
    refused = cdc("source", "drop", pg_db.source, "--config", str(empty), "--yes")
    assert refused.returncode == 1, output(refused)
    assert "was not created by this log" in refused.stderr
    assert "pg_drop_replication_slot" in refused.stderr
    assert f"cdc_{pg_db.source}" in _server(pg_db)[0]  # left alone
    own = cdc("source", "drop", pg_db.source, "--config", str(first), "--yes")
    assert own.returncode == 0, output(own)  # log a's own: it drops it
    assert _server(pg_db)[0] == ["cdc_b_other"]


def test_drop_a_mariadb_source_forgets_its_position(mysql_db: Any, tmp_path: Path) -> None:
    from tests.mykit import write_config as my_config

    mysql_db.script("CREATE TABLE items (id int PRIMARY KEY, v int);"
                    "INSERT INTO items VALUES (1, 1), (2, 2);")
    config = my_config(tmp_path, mysql_db, ["items"])
    env = mysql_db.env()
    assert cdc("bootstrap", "--config", str(config), env=env).returncode == 0
    dropped = cdc("source", "drop", mysql_db.source, "--config", str(config), "--yes",
                  "--topics", env=env)
    assert dropped.returncode == 0, output(dropped)
    assert "forgot its position" in dropped.stdout
    stats = cdc("log", "stats", "--config", str(config))
    assert mysql_db.table("items") not in stats.stdout, stats.stdout
    again = cdc("capture", "--config", str(config), env=env)
    assert again.returncode != 0 and "has not been bootstrapped" in again.stderr
