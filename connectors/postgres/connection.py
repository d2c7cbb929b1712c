"""Opening connections to the leader, with errors a user can act on.

Passwords come from the DSN, from ``password_env`` or from ``~/.pgpass`` (libpq reads it), and
never appear in a message: errors name the host, port, database and user only.

Every connection we open (catalog, snapshot COPY, replication) carries our session settings
(:data:`~connectors.postgres.types.SESSION_OPTIONS`: DateStyle, TimeZone, IntervalStyle,
extra_float_digits, bytea_output, lc_monetary) as startup ``options``, after any the DSN has, so
they override the database's and the role's defaults (``ALTER DATABASE/ROLE ... SET``). For the
replication connection this is the only way: pgoutput's text tuples are produced by the
walsender, which runs with its startup settings and takes no SET once streaming.
tests/test_pg_session.py captures a database with unusual defaults for every one of them.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from cdc.config import SourceConfig
from cdc.errors import CdcError
from connectors.postgres.types import SESSION_OPTIONS


class SourceError(CdcError):
    """The source database refused, is unreachable, or is not set up for CDC."""


class SourceUnavailable(SourceError):
    """The server cannot be reached right now (down, restarting, network): worth retrying."""


def describe(source: SourceConfig) -> str:
    """``user@host:port/db`` for messages — never the password."""
    params = _params(source)
    return (f"{params.get('user', '?')}@{params.get('host', 'localhost')}:"
            f"{params.get('port', 5432)}/{params.get('dbname', '?')}")


def _params(source: SourceConfig) -> dict[str, Any]:
    try:
        params = conninfo_to_dict(source.dsn.reveal())
    except psycopg.ProgrammingError:
        raise SourceError(f"source {source.name!r}: dsn is not a valid PostgreSQL connection "
                          "string", "write it as postgresql://user@host:port/dbname") from None
    return params


def connect(source: SourceConfig, replication: bool = False,
            autocommit: bool = True) -> psycopg.Connection[Any]:
    """A connection to ``source`` with our session settings (replication=database if asked)."""
    params = _params(source)
    password = source.password()
    if password is not None:
        params["password"] = password
    params["options"] = (params.get("options", "") + " " + SESSION_OPTIONS).strip()
    params.setdefault("connect_timeout", 10)
    params.setdefault("application_name", f"cdc-{source.name}")
    if replication:
        params["replication"] = "database"
    try:
        return psycopg.connect(autocommit=autocommit, **params)
    except psycopg.OperationalError as exc:
        raise translate(source, exc, replication) from None


#: what a connection attempt says when the server is away for a while (down, restarting, a
#: failover, a database closed to connections, all slots of connections taken): capture waits
#: and retries
_TRANSIENT = ("connection refused", "could not translate host", "timeout expired",
              "the database system is starting up", "the database system is shutting down",
              "the database system is in recovery mode", "not currently accepting connections",
              "too many clients already", "server closed the connection unexpectedly")


def translate(source: SourceConfig, exc: Exception, replication: bool = False) -> SourceError:
    """A :class:`SourceError` for a failed connection, with the likely fix."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
    where = describe(source)
    lower = str(exc).lower()
    if "password authentication failed" in lower or "no password supplied" in lower:
        return SourceError(f"source {source.name!r}: authentication failed for {where}",
                           "check the password (password_env or ~/.pgpass) and the user name")
    if any(sign in lower for sign in _TRANSIENT):
        return SourceUnavailable(
            f"source {source.name!r}: cannot reach PostgreSQL at {where} ({text})",
            "check that the server runs and the host/port in dsn are right")
    if "does not exist" in lower and "database" in lower:
        return SourceError(f"source {source.name!r}: {text}", "fix the database name in dsn")
    if replication and ("replication" in lower or "pg_hba" in lower):
        return SourceError(
            f"source {source.name!r}: the server refused a replication connection for {where} "
            f"({text})",
            "grant the role REPLICATION (ALTER ROLE ... REPLICATION) and allow it in pg_hba.conf "
            "(a 'replication' line)")
    return SourceError(f"source {source.name!r}: cannot connect to {where}: {text}",
                       "check the dsn and the server's pg_hba.conf")
