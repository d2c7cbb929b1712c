"""Bad input against real servers: each failure is a clear, actionable error (no traceback), does
no partial damage, and never shows a secret."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cdc_app.servers.postgres import ThrowawayPostgres, free_port
from tests.pgkit import (
    SECRET_PASSWORD,
    Capture,
    Database,
    cdc,
    latest_rows,
    new_database,
    output,
    read_topic,
    start_cluster,
    stored_offset,
    table_rows,
    wait_caught_up,
    write_config,
)

pytestmark = pytest.mark.timeout(180)


def refused(config: Path, *snippets: str, command: str = "bootstrap", code: int = 1) -> str:
    result = cdc(command, "--config", str(config))
    text = output(result)
    assert result.returncode == code, text
    assert "Traceback" not in text
    assert "fix:" in text
    for snippet in snippets:
        assert snippet in text, text
    return text


def untouched(db: Database, log: Path) -> None:
    """No slot was created and no source offset stored."""
    assert db.slot() is None
    assert stored_offset(log, db.source) is None


@pytest.fixture
def table_db(pg_db: Database) -> Database:
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg_db.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) g")
    return pg_db


def test_unreachable_server(table_db: Database, tmp_path: Path) -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/{table_db.name}"
    config = write_config(tmp_path, table_db, ["public.t"], dsn=dsn)
    refused(config, "cannot reach PostgreSQL", "check that the server runs")
    untouched(table_db, tmp_path / "log")


def test_wrong_password_is_named_but_never_shown(table_db: Database, tmp_path: Path) -> None:
    wrong = "Wr0ng-" + SECRET_PASSWORD
    config = write_config(tmp_path, table_db, ["public.t"],
                          dsn=table_db.dsn("cdc_password", wrong))
    text = refused(config, "authentication failed", "cdc_password@127.0.0.1")
    assert wrong not in text and SECRET_PASSWORD not in text
    untouched(table_db, tmp_path / "log")


def test_password_from_env_works_and_stays_secret(table_db: Database, tmp_path: Path) -> None:
    # the role does not own the table: an admin prepared the publication and grants
    table_db.execute(f"CREATE PUBLICATION cdc_{table_db.source} FOR TABLE t")
    table_db.execute("GRANT SELECT ON t TO cdc_password")
    config = write_config(tmp_path, table_db, ["public.t"], dsn=table_db.dsn("cdc_password"),
                          password_env="TEST_PG_PASSWORD")
    env = {"TEST_PG_PASSWORD": SECRET_PASSWORD}
    runs = [cdc("bootstrap", "--config", str(config), env=env)]
    assert runs[0].returncode == 0, output(runs[0])
    process = subprocess.Popen([sys.executable, "-m", "cdc_app.cli", "capture", "--config",
                                str(config)],
                               env={**os.environ, **env}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    table_db.execute("UPDATE t SET v = 'changed' WHERE id = 1")
    wait_caught_up(table_db, tmp_path / "log")
    runs.append(cdc("status", "--config", str(config), env=env))
    runs.append(cdc("check-config", "--config", str(config), env=env))
    process.terminate()
    captured, _ = process.communicate(timeout=30)
    assert process.returncode == 0, captured
    # with the password inline in the dsn, nothing prints it either
    inline = write_config(tmp_path, table_db, ["public.t"],
                          dsn=table_db.dsn("cdc_password", SECRET_PASSWORD))
    runs.append(cdc("check-config", "--config", str(inline)))
    runs.append(cdc("status", "--config", str(inline)))
    for text in [captured, *(output(r) for r in runs)]:
        assert SECRET_PASSWORD not in text
    assert all(r.returncode == 0 for r in runs), [output(r) for r in runs]


def test_role_without_replication(table_db: Database, tmp_path: Path) -> None:
    config = write_config(tmp_path, table_db, ["public.t"], dsn=table_db.dsn("norepl"))
    refused(config, "lacks the REPLICATION attribute", "ALTER ROLE")
    untouched(table_db, tmp_path / "log")
    # Amazon RDS / Aurora: no REPLICATION attribute, the rds_replication role instead
    table_db.execute("CREATE ROLE rds_replication; GRANT rds_replication TO norepl")
    try:
        checked = cdc("check-config", "--config", str(config), "--connect",
                      env={"COLUMNS": "300"})
        assert "│ role " in checked.stdout and "norepl: rds_replication" in checked.stdout, \
            output(checked)
    finally:
        table_db.execute("DROP ROLE rds_replication")


def test_missing_table(table_db: Database, tmp_path: Path) -> None:
    config = write_config(tmp_path, table_db, ["public.t", "public.nope"])
    refused(config, "public.nope does not exist")
    untouched(table_db, tmp_path / "log")


def test_table_without_primary_key(table_db: Database, tmp_path: Path) -> None:
    table_db.execute("CREATE TABLE loose (a int, b text)")
    config = write_config(tmp_path, table_db, ["public.loose"])
    refused(config, "has no primary key", "REPLICA IDENTITY FULL", "keys:")
    untouched(table_db, tmp_path / "log")


def test_invalid_yaml_and_unknown_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("log:\n  path: [unclosed\nsources: []\n")
    refused(bad, "not valid YAML", "line", command="capture", code=2)
    typo = tmp_path / "typo.yaml"
    typo.write_text("log: {path: ./log}\nsources:\n  - name: a\n    kind: postgres\n"
                    "    dsn: postgresql://x@127.0.0.1/db\n    tables: [public.t]\n"
                    "    heartbeat_interal: 1s\n")
    refused(typo, "unknown key", "heartbeat_interval", command="capture", code=2)


def test_log_directory_not_writable(table_db: Database, tmp_path: Path) -> None:
    log = tmp_path / "ro"
    log.mkdir()
    mounted = False
    if os.geteuid() == 0:  # root ignores permission bits: use a read-only filesystem
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(log)],
                                capture_output=True)
        if result.returncode != 0:
            pytest.skip("cannot mount a read-only tmpfs here")
        mounted = True
    else:
        log.chmod(0o500)
    try:
        config = write_config(tmp_path, table_db, ["public.t"], log_path=log / "log")
        refused(config, "permission denied", "writable")
        assert table_db.slot() is None
    finally:
        if mounted:
            subprocess.run(["umount", str(log)], check=True)
        else:
            log.chmod(0o700)


def test_slot_dropped_while_stopped_then_rebootstrap(table_db: Database, tmp_path: Path) -> None:
    config = write_config(tmp_path, table_db, ["public.t"])
    log = tmp_path / "log"
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    table_db.execute(f"SELECT pg_drop_replication_slot('cdc_{table_db.source}')")
    table_db.execute("DELETE FROM t WHERE id <= 10")  # changes the log will never see streamed
    table_db.execute("UPDATE t SET v = 'new' WHERE id = 50")
    before = stored_offset(log, table_db.source)
    refused(config, "no longer exists", "cdc bootstrap", command="capture")
    assert stored_offset(log, table_db.source) == before  # nothing changed
    redo = cdc("bootstrap", "--config", str(config))
    assert redo.returncode == 0, output(redo)
    assert "10 vanished keys tombstoned" in redo.stdout
    events = read_topic(log, f"{table_db.source}.public.t")
    assert latest_rows(events) == table_rows(table_db, "t")
    assert sum(e.op == "tombstone" for e in events) == 10


@pytest.fixture(scope="module")
def replica_cluster() -> Iterator[ThrowawayPostgres]:
    pg = start_cluster(wal_level="replica", max_wal_senders="5")
    yield pg
    pg.cleanup()


@pytest.fixture(scope="module")
def one_slot_cluster() -> Iterator[ThrowawayPostgres]:
    pg = start_cluster(max_replication_slots="1")
    yield pg
    pg.cleanup()


def test_wal_level_not_logical(replica_cluster: ThrowawayPostgres, tmp_path: Path) -> None:
    db = new_database(replica_cluster)
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(tmp_path, db, ["public.t"])
    refused(config, "wal_level is replica", "wal_level = logical", "restart PostgreSQL")
    assert stored_offset(tmp_path / "log", db.source) is None


def test_no_free_replication_slot(one_slot_cluster: ThrowawayPostgres, tmp_path: Path) -> None:
    db = new_database(one_slot_cluster)
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    db.execute("SELECT pg_create_logical_replication_slot('someone_else', 'pgoutput')")
    config = write_config(tmp_path, db, ["public.t"])
    refused(config, "replication slots are in use", "max_replication_slots")
    assert stored_offset(tmp_path / "log", db.source) is None
    db.drop()


@pytest.mark.servers  # starts its own servers or Spark
def test_capture_reconnects_when_postgres_restarts(tmp_path: Path) -> None:
    pg = start_cluster()
    try:
        db = new_database(pg)
        db.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
        config = write_config(tmp_path, db, ["public.t"])
        assert cdc("bootstrap", "--config", str(config)).returncode == 0
        capture = Capture(config, tmp_path / "capture.log").start()
        db.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 100) g")
        wait_caught_up(db, tmp_path / "log")
        pg.stop()
        time.sleep(1.5)
        assert capture.alive()
        pg.start()
        db.execute("UPDATE t SET v = 1 WHERE id <= 50")
        db.execute("DELETE FROM t WHERE id > 90")
        wait_caught_up(db, tmp_path / "log", timeout=60)
        assert capture.alive()
        assert capture.terminate() == 0
        assert "reconnecting" in (tmp_path / "capture.log").read_text()
        assert latest_rows(read_topic(tmp_path / "log", f"{db.source}.public.t")) == \
            table_rows(db, "t")
    finally:
        pg.cleanup()


def test_publication_needs_privileges(table_db: Database, tmp_path: Path) -> None:
    table_db.execute("GRANT SELECT ON t TO cdc_password")
    config = write_config(tmp_path, table_db, ["public.t"],
                          dsn=table_db.dsn("cdc_password", SECRET_PASSWORD))
    text = refused(config, "publication", "CREATE PUBLICATION")
    assert SECRET_PASSWORD not in text
    with psycopg.connect(table_db.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)


def test_bootstrap_refuses_a_slot_this_log_did_not_create(table_db: Database,
                                                           tmp_path: Path) -> None:
    """A slot of the configured name made by someone else (Debezium's, say) is neither dropped
    nor used; the slot a log's own bootstrap made is replaced by its next bootstrap."""
    slot = f"cdc_{table_db.source}"
    table_db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    before = table_db.slot()
    config = write_config(tmp_path, table_db, ["public.t"])
    refused(config, f"replication slot {slot!r} already exists", "this log did not create it",
            f"pg_drop_replication_slot('{slot}')", "slot: <name>")
    assert table_db.slot() == before  # untouched
    assert stored_offset(tmp_path / "log", table_db.source) is None
    table_db.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    assert table_db.slot() is not None
    again = cdc("bootstrap", "--config", str(config))  # its own slot: replaced
    assert again.returncode == 0, output(again)
    other = tmp_path / "other"  # another log naming the same slot: refused
    other.mkdir()
    refused(write_config(other, table_db, ["public.t"]), "this log did not create it")
