"""Opening connections to a MySQL/MariaDB leader, with errors a user can act on.

``dsn`` is ``mysql://user@host:port/database`` (``mariadb://`` too). The password comes from
``password_env`` (or, discouraged, the DSN); it never appears in a message: errors name
``user@host:port/db`` only.

Every session we open pins what shapes the values we read: ``time_zone = '+00:00'`` (TIMESTAMP
columns are read in UTC, whatever the server's or the database's zone), ``utf8mb4`` on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql

from cdc.config import SourceConfig
from cdc.errors import CdcError

#: what every session runs first (see the module doc)
SESSION_INIT = "SET time_zone = '+00:00'"


class SourceError(CdcError):
    """The source database refused, is unreachable, or is not set up for CDC."""


class SourceUnavailable(SourceError):
    """The server cannot be reached right now (down, restarting, network): worth retrying."""


@dataclass(frozen=True)
class Address:
    """Where and as whom to connect (the password is never shown)."""

    host: str
    port: int
    user: str
    database: str
    password: str | None

    def __str__(self) -> str:
        return f"{self.user}@{self.host}:{self.port}/{self.database}"

    def settings(self) -> dict[str, Any]:
        """PyMySQL / BinLogStreamReader connection settings."""
        out: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.user,
                               "password": self.password or "", "charset": "utf8mb4"}
        return out


def address(source: SourceConfig) -> Address:
    """The parsed ``dsn`` of ``source``, with the password from ``password_env`` if set."""
    text = source.dsn.reveal()
    try:
        parts = urlsplit(text)
        port = parts.port or 3306
    except ValueError:
        parts, port = None, 0
    if parts is None or parts.scheme not in source.dsn_schemes or not parts.hostname:
        raise SourceError(f"source {source.name!r}: dsn is not a MySQL URL ({source.dsn})",
                          "write it as mysql://user@host:port/database")
    database = unquote(parts.path.lstrip("/"))
    if not parts.username:
        raise SourceError(f"source {source.name!r}: dsn names no user ({source.dsn})",
                          "write it as mysql://user@host:port/database")
    password = source.password()
    if password is None and parts.password is not None:
        password = unquote(parts.password)
    if source.password_env and password is None:
        raise SourceError(f"source {source.name!r}: the environment variable "
                          f"{source.password_env} (password_env) is not set",
                          f"export {source.password_env}=<the password> before running cdc")
    return Address(parts.hostname, port, unquote(parts.username), database, password)


def connect(source: SourceConfig, *, timeout: float = 10.0,
            streaming: bool = False) -> pymysql.connections.Connection:
    """A session on ``source`` with our settings (autocommit; ``streaming``: an unbuffered
    cursor class, so a SELECT is streamed rather than held in memory)."""
    where = address(source)
    settings = where.settings()
    if where.database:
        settings["database"] = where.database
    try:
        conn = pymysql.connect(**settings, autocommit=True, connect_timeout=timeout,
                               init_command=SESSION_INIT,
                               cursorclass=pymysql.cursors.SSCursor if streaming
                               else pymysql.cursors.Cursor)
    except pymysql.err.MySQLError as exc:
        raise translate(source, exc) from None
    return conn


def translate(source: SourceConfig, exc: BaseException) -> SourceError:
    """A :class:`SourceError` for a failed connection or query, with the likely fix."""
    where = address(source)
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
    text = str(exc.args[1] if len(exc.args) > 1 else exc).strip().splitlines()
    first = text[0] if text else exc.__class__.__name__
    if where.password:
        first = first.replace(where.password, "***")
    if code == 1045:
        return SourceError(f"source {source.name!r}: access denied for {where} (wrong user or "
                           "password)", "check the password (password_env) and the user name")
    if code in (2002, 2003, 2006, 2013, 2055, 1053, 1927) or isinstance(
            exc, ConnectionError | TimeoutError):
        return SourceUnavailable(
            f"source {source.name!r}: cannot reach MySQL/MariaDB at {where} ({first})",
            "check that the server runs and the host/port in dsn are right")
    if code == 1049:
        return SourceError(f"source {source.name!r}: {first}", "fix the database name in dsn")
    return SourceError(f"source {source.name!r}: {where}: {first}",
                       "check the dsn, the user's grants and the server")


def query(conn: Any, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Every row of one statement."""
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def variables(conn: Any, *names: str) -> dict[str, str]:
    """Global server variables by name (missing ones absent)."""
    placeholders = ", ".join(["%s"] * len(names))
    rows = query(conn, "SELECT variable_name, variable_value FROM "
                       f"information_schema.global_variables WHERE variable_name IN "
                       f"({placeholders})", [n.upper() for n in names])
    return {str(name).lower(): str(value) for name, value in rows}


def quote_ident(name: str) -> str:
    """``name`` as a MySQL identifier (backticks doubled)."""
    return "`" + name.replace("`", "``") + "`"
