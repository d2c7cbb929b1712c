"""The preflight of a PostgreSQL source (the contract of :mod:`cdc.preflight`): catalog queries
only — no slot, no publication, nothing written."""

from __future__ import annotations

import functools
from typing import Any

import psycopg

from cdc.events import TableId
from cdc.offsets import SourceOffset
from cdc.preflight import Part, Step, Warn, environment_set
from connectors.postgres import catalog
from connectors.postgres.connection import SourceError, connect, describe
from connectors.postgres.requirements import REQUIRED
from connectors.postgres.settings import PostgresSourceConfig
from connectors.postgres.source import owned_slot

#: pgoutput and logical replication slots
OLDEST_VERSION = 100000
#: ``cdc verify``'s checksums (connectors/postgres/checksum.py)
VERIFY_VERSION = 140000


class _Session:
    """The one connection the steps share (opened by the first)."""

    def __init__(self, config: PostgresSourceConfig) -> None:
        self.config = config
        self.conn: psycopg.Connection[Any] | None = None

    def db(self) -> psycopg.Connection[Any]:
        assert self.conn is not None, "the first step connects"
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def preflight_part(config: PostgresSourceConfig, stored: SourceOffset | None,
                   log_read: bool = True) -> Part:
    session = _Session(config)
    name = config.name
    steps = [Step("server", lambda: _server(session)),
             Step("settings", lambda: _settings(session)),
             Step("role", lambda: _role(session)),
             Step(f"slot {config.slot_name}", lambda: _slot(session, stored, log_read)),
             Step(f"publication {config.publication_name}", lambda: _publication(session))]
    for text in config.tables:
        steps.append(Step(f"table {text}", functools.partial(_table, session, text)))
    return Part(f"source {name} (postgres)", steps, session.close)


def _server(session: _Session) -> str:
    environment_set(session.config.password_env, "password_env")
    session.conn = connect(session.config)
    row = session.db().execute("SELECT current_setting('server_version_num')::int, "
                               "split_part(current_setting('server_version'), ' ', 1)").fetchone()
    assert row is not None
    number = int(row[0])
    shown = f"PostgreSQL {row[1]} at {describe(session.config)}"
    if number < OLDEST_VERSION:
        raise SourceError(f"{shown}: logical replication with pgoutput needs PostgreSQL 10 or "
                          "later", "upgrade the server (PostgreSQL 14 or later is tested)")
    if number < VERIFY_VERSION:
        return Warn(f"{shown}: capture works; `cdc verify` needs PostgreSQL 14 or later")
    return shown


def _settings(session: _Session) -> str:
    catalog.check_server(session.db(), session.config.name)
    row = session.db().execute(
        "SELECT current_setting('max_wal_senders')::int, (SELECT count(*) FROM "
        "pg_stat_replication)").fetchone()
    assert row is not None
    found = ", ".join(f"{name} = {wanted}" for name, wanted, *_ in REQUIRED)
    if row[1] >= row[0]:
        raise SourceError(f"all {row[0]} WAL senders are in use (max_wal_senders)",
                          "raise max_wal_senders in postgresql.conf and restart PostgreSQL")
    return f"{found}; {row[0] - row[1]} of {row[0]} WAL senders free"


def _role(session: _Session) -> str:
    catalog.check_role(session.db(), session.config.name)
    row = session.db().execute(
        "SELECT current_user, rolsuper, rolreplication FROM pg_roles "
        "WHERE rolname = current_user").fetchone()
    assert row is not None
    how = "superuser" if row[1] else "REPLICATION" if row[2] else "rds_replication"
    return f"{row[0]}: {how}"


def _slot(session: _Session, stored: SourceOffset | None, log_read: bool) -> str:
    config = session.config
    slot = config.slot_name
    info = catalog.slot_info(session.db(), slot)
    ours = owned_slot(stored) == slot
    if info is None:
        if ours:
            raise SourceError(f"the log streams {config.name!r} from slot {slot!r}, which no "
                              "longer exists: changes made since it went are lost",
                              f"run `cdc bootstrap --source {config.name}` again (it "
                              "re-snapshots the tables)")
        catalog.check_free_slot(session.db(), config.name)
        return "free: `cdc bootstrap` creates it"
    if not ours and not log_read:
        return Warn("exists; whether this log made it is unknown: the log could not be read")
    if not ours:
        raise SourceError(f"replication slot {slot!r} exists (plugin {info.plugin}) and this "
                          "log did not create it — another tool's (Debezium's?), or a cdc log "
                          "that is gone",
                          "give the source a slot of its own (sources: slot: <name>), or, if "
                          "nothing reads from it any more, drop it: "
                          f"SELECT pg_drop_replication_slot('{slot}')")
    if info.wal_status == "lost":
        raise SourceError(f"slot {slot!r} lost WAL it needed (max_slot_wal_keep_size exceeded)",
                          f"run `cdc bootstrap --source {config.name}` again")
    return f"this log's, {'in use by capture' if info.active else 'idle'}"


def _publication(session: _Session) -> str:
    config = session.config
    name = config.publication_name
    db = session.db()
    wanted = {TableId.parse(t) for t in config.tables}
    if db.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone():
        current = {TableId(s, t) for s, t in db.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
            (name,)).fetchall()}
        if current == wanted:
            return f"exists, for the {len(wanted)} table(s)"
        return Warn(f"exists for other tables: `cdc bootstrap` sets them to the source's "
                    f"{len(wanted)} (as the tables' owner)")
    row = db.execute(
        "SELECT has_database_privilege(current_database(), 'CREATE'), bool_and("
        "pg_has_role(c.relowner, 'USAGE')) FROM pg_class c WHERE c.oid = ANY(%s::regclass[])",
        ([catalog.qualified(t) for t in wanted],)).fetchone()
    if row is None or not row[0] or not row[1]:
        listed = ", ".join(catalog.qualified(t) for t in sorted(wanted, key=str))
        raise SourceError(f"publication {name!r} does not exist, and this role may not create "
                          "it (it needs CREATE on the database and to own the tables)",
                          f"have an admin run: CREATE PUBLICATION {name} FOR TABLE {listed};")
    return "`cdc bootstrap` creates it"


def _table(session: _Session, text: str) -> str:
    config = session.config
    db = session.db()
    table = TableId.parse(text)
    info = catalog.table_info(db, config.name, table)
    key = catalog.key_columns(info, config.name, config.keys.get(text))
    schema, _ = catalog.table_schema(db, config.name, str(db.info.dbname), info, key)
    row = db.execute("SELECT has_table_privilege(%s::oid, 'SELECT')", (info.oid,)).fetchone()
    if row is None or not row[0]:
        raise SourceError(f"this role may not read {text} (snapshots read it)",
                          f"GRANT SELECT ON {catalog.qualified(table)} TO {db.info.user};")
    policies = config.column_policies()  # a ConfigError (the fix) when hash_key_env is unset
    policy = policies.get(table) if policies is not None else None
    if policy is not None:
        policy.check(schema)  # e.g. a masked key column
    return f"key ({', '.join(key)}), {len(schema.columns)} columns"
