"""The preflight of a MySQL / MariaDB source (the contract of :mod:`cdc.preflight`): reads of
variables, grants and the catalog only — nothing written, no binlog dump started."""

from __future__ import annotations

import functools
from typing import Any

from cdc.events import TableId
from cdc.offsets import SourceOffset
from cdc.preflight import Part, Step, Warn, environment_set
from connectors.mysql import catalog
from connectors.mysql.connection import SourceError, address, connect, query
from connectors.mysql.offset import MySqlOffset
from connectors.mysql.requirements import REQUIRED
from connectors.mysql.settings import MySqlSourceConfig


class _Session:
    """The one connection the steps share (opened by the first), and the server it found."""

    def __init__(self, config: MySqlSourceConfig) -> None:
        self.config = config
        self.conn: Any = None
        self.server: catalog.Server | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def preflight_part(config: MySqlSourceConfig, stored: SourceOffset | None) -> Part:
    session = _Session(config)
    offset = stored if isinstance(stored, MySqlOffset) else None
    steps = [Step("server", lambda: _server(session)),
             Step("binlog settings", lambda: _settings(session)),
             Step("privileges", lambda: _privileges(session)),
             Step(f"server_id {config.replica_id}", lambda: _replica_id(session)),
             Step("stored position", lambda: _position(session, offset))]
    for text in config.tables:
        steps.append(Step(f"table {text}", functools.partial(_table, session, text)))
    return Part(f"source {config.name} (mysql)", steps, session.close)


def _server(session: _Session) -> str:
    environment_set(session.config.password_env, "password_env")
    session.conn = connect(session.config, timeout=8)
    version = str(query(session.conn, "SELECT VERSION()")[0][0])
    shown = f"{version} at {address(session.config)}"
    if "mariadb" not in version.lower():
        return Warn(f"{shown}: MySQL is untested, and `cdc bootstrap` needs MariaDB's "
                    "lock-free consistent snapshot")
    return shown


def _settings(session: _Session) -> str:
    session.server = catalog.server_info(session.conn, session.config.name)
    found = ", ".join(f"{name} {wanted}" for name, wanted, *_ in REQUIRED)
    expiry = "binlogs expire by age" if catalog.expires_binlogs(session.conn) \
        else "binlogs never expire by age"
    return f"{found}; {expiry}"


def _privileges(session: _Session) -> str:
    user = address(session.config).user
    catalog.check_privileges(session.conn, session.config.name, user)
    return f"{user}: REPLICATION SLAVE, REPLICATION CLIENT"


def _replica_id(session: _Session) -> str:
    wanted = session.config.replica_id
    own = int(query(session.conn, "SELECT @@server_id")[0][0])
    if own == wanted:
        raise SourceError(f"server_id {wanted} is the server's own: the server would refuse "
                          "the binlog dump", "set the source's server_id: to a number no "
                          "server or replica of this database uses")
    connected = catalog.replica_connected(session.conn, wanted)
    if connected is None:
        return Warn("cannot tell whether a replica uses it (SHOW SLAVE HOSTS was refused)")
    if connected:
        return Warn("a replica with this id is connected now: this source's capture, or "
                    "another replica (then set a unique server_id:)")
    return "not used by the server or a connected replica"


def _position(session: _Session, stored: MySqlOffset | None) -> str:
    if stored is None or not stored.file:
        return "none yet: `cdc bootstrap` takes one"
    server = session.server or catalog.server_info(session.conn, session.config.name)
    again = f"run `cdc bootstrap --source {session.config.name}` again (it re-snapshots)"
    if stored.server_id and server.server_id != stored.server_id:
        raise SourceError(f"the log's position {stored.describe()} comes from server_id "
                          f"{stored.server_id}, and this server is {server.server_id}: a "
                          "failover or a new server?", again)
    files = [name for name, _ in catalog.binlog_files(session.conn, session.config.name)]
    if stored.file not in files:
        raise SourceError(f"the log's position {stored.describe()} is in a binlog the server "
                          f"no longer has (oldest: {files[0] if files else 'none'})", again)
    return f"{stored.describe()} is still on the server ({len(files)} binlog files)"


def _table(session: _Session, text: str) -> str:
    from connectors.mysql.schema import build

    config = session.config
    table = TableId.parse(text)
    info = catalog.table_info(session.conn, config.name, table)
    key = catalog.key_columns(info, config.name, config.keys.get(text))
    schema = build(config, table, info.columns, info.primary_key).schema
    policies = config.column_policies()  # a ConfigError (the fix) when hash_key_env is unset
    policy = policies.get(table) if policies is not None else None
    if policy is not None:
        policy.check(schema)  # e.g. a masked key column
    return f"key ({', '.join(key)}), {len(schema.columns)} columns"
