"""Helpers for tests against real throwaway MariaDB servers (``cdc_app/servers/mysql.py``): a fresh
database per test with its own capture user, password (in an environment variable), source name
and replica ``server_id``; configs for a ``kind: mysql`` source; binlog positions and GTIDs.

The fixtures in ``tests/conftest.py`` (``mariadb_server``, ``mysql_db``, ``mariadb_factory``)
are built from these."""

from __future__ import annotations

import itertools
import json
import os
import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pymysql
from pymysql.constants import CLIENT

from cdc_app.servers.mysql import ThrowawayMariaDB

if TYPE_CHECKING:
    from tests.pgkit import LogAt

MY_PASSWORD = "s3cr3t-My5ql-Pa55word-plugh"

#: process-crash safe (InnoDB's log and the binlog are written to the OS at each commit) but
#: not fsynced: fast, and a SIGKILL of mariadbd loses no committed transaction
FAST_SAFE = {"flush_log_at_trx_commit": 2, "sync_binlog": 0}

#: replica server ids handed out by this process (the servers themselves use 1)
_server_ids = itertools.count(random.Random(os.getpid()).randrange(1000, 2**30, 1000) + 1)

#: privileges of the capture user on its database, besides SELECT: what a bootstrap's consistent
#: snapshot and its SHOW statements need (SHOW CREATE TABLE / SHOW COLUMNS / SHOW INDEX only
#: need SELECT; START TRANSACTION WITH CONSISTENT SNAPSHOT and SHOW STATUS need nothing)
DB_PRIVILEGES = "SELECT, SHOW VIEW"
#: global privileges of the capture user: the binlog dump (REPLICATION SLAVE) and SHOW MASTER
#: STATUS / SHOW BINARY LOGS (REPLICATION CLIENT, called BINLOG MONITOR since MariaDB 10.5)
GLOBAL_PRIVILEGES = "REPLICATION SLAVE, REPLICATION CLIENT"


def start_server(**kwargs: Any) -> ThrowawayMariaDB:
    """A started throwaway server; ``kwargs`` as :class:`ThrowawayMariaDB` (fast-safe flushing
    unless given)."""
    return ThrowawayMariaDB(**{**FAST_SAFE, **kwargs}).start()


def next_server_id() -> int:
    """A replica ``server_id`` no other test of this session uses."""
    return next(_server_ids)


@dataclass
class MyDatabase:
    """A fresh database on a server, with a capture user that may read only it (and the
    binlog), its password in the environment variable ``password_env``, a unique source name
    and a unique replica ``server_id``."""

    server: ThrowawayMariaDB
    name: str
    source: str
    user: str
    password: str
    password_env: str
    server_id: int

    # ------------------------------------------------------------------- addresses, logins

    def url(self, user: str | None = None, password: str | None = None) -> str:
        """``mysql://cdc_xxx@127.0.0.1:PORT/db_xxx`` (the password stays in the environment)."""
        return self.server.url_for(user or self.user, self.name, password)

    def table(self, name: str) -> str:
        """``db_xxx.name``: how a config's ``tables`` names a table of this database."""
        return f"{self.name}.{name}"

    def capture_settings(self) -> dict[str, Any]:
        """PyMySQL / BinLogStreamReader ``connection_settings`` as the capture user (TCP)."""
        return self.server.connection_settings(self.user, self.password, tcp=True)

    def capture_connect(self) -> Any:
        """A PyMySQL connection as the capture user, in this database."""
        return pymysql.connect(**self.server.connection_settings(
            self.user, self.password, database=self.name), autocommit=True)

    # ----------------------------------------------------------------------- SQL as root

    def connect(self) -> Any:
        """A PyMySQL connection as root in this database, autocommit."""
        return self.server.root_connect(self.name)

    def execute(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """One statement as root in this database; its rows."""
        return self.server.execute(sql, params, database=self.name)

    def script(self, sql: str) -> None:
        """Several ``;``-separated statements as root in this database, in one round trip."""
        conn = pymysql.connect(**self.server.connection_settings(database=self.name, tcp=False),
                               autocommit=True, client_flag=CLIENT.MULTI_STATEMENTS)
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql)
                while cursor.nextset():
                    pass
        finally:
            conn.close()

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """``with db.transaction() as cursor:``: one transaction as root, committed at the end
        (rolled back on an exception)."""
        conn = self.connect()
        try:
            conn.begin()
            with conn.cursor() as cursor:
                yield cursor
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    # ----------------------------------------------------------------- binlog coordinates

    def binlog_position(self) -> tuple[str, int]:
        """The server's current binlog file and position."""
        return self.server.binlog_position()

    def gtid_pos(self) -> str:
        """``@@gtid_binlog_pos``: the GTID of the last transaction in the binlog, per domain."""
        return str(self.server.variables("gtid_binlog_pos")["gtid_binlog_pos"])

    def env(self) -> dict[str, str]:
        """Environment for a ``cdc`` child process: the password variable."""
        return {self.password_env: self.password}

    # -------------------------------------------------------------------------- teardown

    def drop(self) -> None:
        """Kill the capture user's sessions (binlog dumps included), drop the database and
        the user, and unset the password variable."""
        conn = self.server.root_connect()
        try:
            with conn.cursor() as cursor:
                cursor.execute("SELECT id FROM information_schema.processlist WHERE user = %s",
                               (self.user,))
                for (thread,) in cursor.fetchall():
                    with suppress(pymysql.err.OperationalError):  # already gone
                        cursor.execute(f"KILL {int(thread)}")
                cursor.execute(f"DROP DATABASE IF EXISTS `{self.name}`")
                cursor.execute(f"DROP USER IF EXISTS '{self.user}'@'%'")
        finally:
            conn.close()
        if os.environ.get(self.password_env) == self.password:
            del os.environ[self.password_env]


def new_database(server: ThrowawayMariaDB, *, extra_grants: str = "",
                 set_env: bool = True) -> MyDatabase:
    """A fresh ``db_xxxxxxxx`` with capture user ``cdc_xxxxxxxx`` (password in
    ``CDC_TEST_MYSQL_PW_XXXXXXXX``, set in ``os.environ`` unless ``set_env`` is false).
    ``extra_grants`` adds database privileges (e.g. ``"INSERT, UPDATE"`` for a heartbeat
    table)."""
    suffix = uuid.uuid4().hex[:8]
    db = MyDatabase(server, f"db_{suffix}", f"s{suffix}", f"cdc_{suffix}",
                    f"{MY_PASSWORD}-{suffix}", f"CDC_TEST_MYSQL_PW_{suffix.upper()}",
                    next_server_id())
    privileges = DB_PRIVILEGES + (f", {extra_grants}" if extra_grants else "")
    conn = server.root_connect()
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE `{db.name}` CHARACTER SET utf8mb4")
            cursor.execute(f"CREATE USER '{db.user}'@'%%' IDENTIFIED BY %s", (db.password,))
            cursor.execute(f"GRANT {GLOBAL_PRIVILEGES} ON *.* TO '{db.user}'@'%'")
            cursor.execute(f"GRANT {privileges} ON `{db.name}`.* TO '{db.user}'@'%'")
    finally:
        conn.close()
    if set_env:
        os.environ[db.password_env] = db.password
    return db


def write_config(directory: Path, db: MyDatabase, tables: list[str], *, url: str | None = None,
                 log_path: Path | None = None, extra: str = "",
                 log_options: dict[str, Any] | None = None, **source: Any) -> Path:
    """A cdc.yaml for one ``kind: mysql`` source on ``db`` (tables given without the database
    name are qualified with it); returns its path."""
    qualified = [table if "." in table else db.table(table) for table in tables]
    lines = [
        "log:",
        f"  path: {log_path or directory / 'log'}",
        "  partitions: 4",
        "  commit_interval: 20ms",
        *(f"  {key}: {json.dumps(value)}" for key, value in (log_options or {}).items()),
        "sources:",
        f"  - name: {db.source}",
        "    kind: mysql",
        f"    dsn: {json.dumps(url or db.url())}",
        f"    password_env: {db.password_env}",
        f"    server_id: {db.server_id}",
        f"    tables: {json.dumps(qualified)}",
    ]
    source.setdefault("heartbeat_interval", "500ms")
    for key, value in source.items():
        lines.append(f"    {key}: {json.dumps(value)}")
    path = directory / "cdc.yaml"
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


class ServerFactory:
    """Starts extra throwaway servers for one test (misconfigured ones, say) and cleans every
    one of them up at the end: ``factory(options={"binlog_format": "STATEMENT"})``."""

    def __init__(self) -> None:
        self.servers: list[ThrowawayMariaDB] = []

    def __call__(self, *, start: bool = True, **kwargs: Any) -> ThrowawayMariaDB:
        server = ThrowawayMariaDB(**{**FAST_SAFE, **kwargs})
        self.servers.append(server)
        return server.start() if start else server

    def cleanup(self) -> None:
        for server in self.servers:
            server.cleanup()
        self.servers.clear()


def wait_caught_up(db: MyDatabase, log: LogAt, timeout: float = 60) -> None:
    """Until the log's stored offset reaches the server's binlog position as of now (idle
    heartbeats carry it there when the captured tables are quiet)."""
    from tests.pgkit import stored_offset, wait_for

    file, pos = db.binlog_position()
    target = (int(file.rsplit(".", 1)[1]), pos)
    wait_for(lambda: tuple((stored_offset(log, db.source) or {}).get("order") or (0, 0))
             >= target, timeout, f"capture to reach {file}:{pos}")


def binlog_order(db: MyDatabase) -> tuple[int, int]:
    """The server's binlog end as the log orders positions: (file sequence, position)."""
    file, pos = db.binlog_position()
    return int(file.rsplit(".", 1)[1]), pos


def capture_watch(db: MyDatabase, capture: Any) -> Any:
    """A :class:`tests.kills.Watch` of ``db``'s capture process. Its position is the pair
    (binlog end the server had written for it to read, CPU ticks the process used): a kill lands
    in flight when the process worked in the second before and the binlog held changes past the
    position the log stored (where the restart resumes). (MariaDB shows no per-dump-thread
    position, so the server's end stands for what was on its way; :func:`kill_capture` fires
    only while that end is past the stored position.)"""
    from tests.kills import Watch, cpu_ticks

    def position() -> tuple[tuple[int, int], int] | None:
        if capture.process is None:
            return None
        return binlog_order(db), cpu_ticks([capture.process.pid])

    return Watch("capture daemon (MariaDB)", position,
                 ahead=lambda at, committed: at[0] > committed,
                 moved=lambda before, now: now[1] > before[1])


def kill_capture(watch: Any, capture: Any, phase: str, log: LogAt, db: MyDatabase) -> Any:
    """SIGKILL ``capture`` through ``watch``; asserts it landed while changes were in flight."""
    from tests.pgkit import stored_offset

    def stored() -> tuple[int, int]:
        return tuple((stored_offset(log, db.source) or {}).get("order") or (0, 0))  # type: ignore

    from tests.kills import process_freeze

    return watch.kill(phase, capture.kill, stored, aim=30,
                      freeze=process_freeze(capture.process.pid))
