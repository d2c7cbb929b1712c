"""Bad input for a MySQL/MariaDB source, each refused by `cdc bootstrap` before anything changes,
with a message naming the problem and the fix, no traceback and no password: binlog off, binlog
format STATEMENT/MIXED, row image MINIMAL/NOBLOB, row metadata MINIMAL, missing grants, a wrong
password, a table without a primary key (and the same table with `keys:`), a bad DSN; foreign-key
cascades are a warning (bootstrap and `cdc status`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_app.servers.mysql import ThrowawayMariaDB
from tests.mykit import MyDatabase, new_database, write_config
from tests.pgkit import cdc, output, stored_offset


@pytest.fixture(scope="module")
def settings_server() -> ThrowawayMariaDB:  # type: ignore[misc]
    """A server of this module's own, whose global binlog settings the tests change."""
    from tests.mykit import start_server

    server = start_server()
    yield server
    server.cleanup()


def _refused(db: MyDatabase, tmp_path: Path, *needles: str, tables: list[str] | None = None,
             **source: object) -> str:
    config = write_config(tmp_path, db, tables or ["t"], **source)
    result = cdc("bootstrap", "--config", str(config))
    text = output(result)
    assert result.returncode != 0, text
    for needle in needles:
        assert needle in text, text
    assert "Traceback" not in text and db.password not in text
    assert stored_offset(tmp_path / "log", db.source) is None  # nothing changed
    return text


@pytest.mark.parametrize(("variable", "value", "needles"), [
    ("binlog_format", "STATEMENT", ("binlog_format is STATEMENT", "SET GLOBAL binlog_format")),
    ("binlog_format", "MIXED", ("binlog_format is MIXED", "'ROW'")),
    ("binlog_row_image", "MINIMAL", ("binlog_row_image is MINIMAL", "'FULL'")),
    ("binlog_row_image", "NOBLOB", ("binlog_row_image is NOBLOB", "'FULL'")),
    ("binlog_row_metadata", "MINIMAL", ("binlog_row_metadata is MINIMAL", "column names")),
])
def test_binlog_settings_are_checked(settings_server: ThrowawayMariaDB, tmp_path: Path,
                                     variable: str, value: str,
                                     needles: tuple[str, ...]) -> None:
    db = new_database(settings_server)
    db.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    settings_server.execute(f"SET GLOBAL {variable} = '{value}'")
    try:
        _refused(db, tmp_path, *needles)
    finally:
        settings_server.execute(f"SET GLOBAL {variable} = DEFAULT")
        settings_server.execute(
            f"SET GLOBAL {variable} = '{'ROW' if variable == 'binlog_format' else 'FULL'}'")
        db.drop()


def test_binlog_off(mariadb_factory, tmp_path: Path) -> None:
    server = mariadb_factory(options={"log_bin": False})
    db = new_database(server)
    db.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    _refused(db, tmp_path, "log_bin is OFF", "log_bin")


@pytest.mark.parametrize(("revoke", "needles"), [
    ("REPLICATION SLAVE", ("lacks REPLICATION SLAVE", "GRANT REPLICATION SLAVE")),
    ("REPLICATION CLIENT", ("lacks REPLICATION CLIENT", "GRANT REPLICATION CLIENT")),
])
def test_missing_replication_grants(mysql_db: MyDatabase, tmp_path: Path, revoke: str,
                                    needles: tuple[str, ...]) -> None:
    db = mysql_db
    db.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    db.server.execute(f"REVOKE {revoke} ON *.* FROM '{db.user}'@'%'")
    _refused(db, tmp_path, *needles)


def test_missing_select_grant(mysql_db: MyDatabase, tmp_path: Path) -> None:
    db = mysql_db
    db.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    db.server.execute(f"REVOKE SELECT ON `{db.name}`.* FROM '{db.user}'@'%'")
    _refused(db, tmp_path, "GRANT SELECT")


def test_wrong_password_is_never_printed(mysql_db: MyDatabase, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    db = mysql_db
    db.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    monkeypatch.setenv(db.password_env, "not-the-password-4711")
    text = _refused(db, tmp_path, "access denied", "password")
    assert "not-the-password-4711" not in text


def test_password_variable_unset(mysql_db: MyDatabase, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    db = mysql_db
    db.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    monkeypatch.delenv(db.password_env)
    _refused(db, tmp_path, f"{db.password_env} (password_env) is not set", "export")


def test_bad_dsn(mysql_db: MyDatabase, tmp_path: Path) -> None:
    db = mysql_db
    # refused by the config itself, before anything connects
    _refused(db, tmp_path, "a postgresql:// connection string for a source of another kind",
             "mysql://user@host:port/database", url="postgresql://x@127.0.0.1/db")
    _refused(db, tmp_path, "not a MySQL URL", "mysql://user@host:port/database",
             url="mysql:///db")


def test_table_without_primary_key_needs_keys(mysql_db: MyDatabase, tmp_path: Path) -> None:
    db = mysql_db
    db.execute("CREATE TABLE t (a INT, b VARCHAR(10))")
    db.execute("INSERT INTO t VALUES (1, 'x'), (2, 'y')")
    _refused(db, tmp_path, "has no primary key", "keys:")
    config = write_config(tmp_path, db, ["t"], keys={db.table("t"): ["a"]})
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    assert "2 rows" in result.stdout


def test_cascading_foreign_keys_warn(mysql_db: MyDatabase, tmp_path: Path) -> None:
    db = mysql_db
    db.execute("CREATE TABLE parent (id INT PRIMARY KEY)")
    db.execute("CREATE TABLE child (id INT PRIMARY KEY, p INT, FOREIGN KEY (p) REFERENCES "
               "parent(id) ON DELETE CASCADE)")
    config = write_config(tmp_path, db, ["parent", "child"])
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    assert "ON DELETE CASCADE" in output(result) and "never writes" in output(result)
    status = cdc("status", "--config", str(config))
    assert "ON DELETE CASCADE" in output(status), output(status)
