"""The settings of a ``kind: sql`` follower (registered in ``cdc.followers``; light: the
sink's libraries are imported only when ``sinks/sql.py`` opens it)."""

from __future__ import annotations

import os
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator

from cdc.config import FollowerConfig, Secret, to_secret


def _to_sql_url(value: Any) -> Secret:
    secret = to_secret(value)
    if "://" not in secret.reveal():
        raise ValueError("expected an SQLAlchemy database URL such as postgresql+psycopg://"
                         f"user@host/db or sqlite:///path/file.db, got {secret}")
    return secret


class SqlFollowerConfig(FollowerConfig):
    """A SQL database SQLAlchemy reaches: the captured tables as plain tables of live rows
    (``sinks/sql.py``)."""

    kind: Literal["sql"]
    sink: ClassVar[str] = "sinks.sql:SqlSink"
    #: an SQLAlchemy URL (``postgresql+psycopg://user@host/db``, ``sqlite:///path/file.db``)
    url: Annotated[Secret, BeforeValidator(_to_sql_url)]
    #: name of an environment variable holding the database password (never put it in the file)
    password_env: str | None = None

    def database_url(self) -> str:
        """The URL with the password from ``password_env`` put in, if configured and set."""
        url = self.url.reveal()
        password = os.environ.get(self.password_env) if self.password_env else None
        if not password:
            return url
        import sqlalchemy as sa

        return sa.make_url(url).set(password=password).render_as_string(hide_password=False)
