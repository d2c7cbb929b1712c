"""The settings of a ``kind: redis`` follower (registered in ``cdc.followers``; light: the
sink's libraries are imported only when ``sinks/redis.py`` opens it)."""

from __future__ import annotations

import os
import string
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, field_validator

from cdc.config import FollowerConfig, Secret, to_secret

FOLLOWER_KEY_FIELDS = frozenset({"schema", "table", "source", "key", "key_json"})


def check_key_template(template: str) -> str:
    """``template`` if it is a usable Redis key template; ``ValueError`` naming the problem.

    Allowed fields: ``{schema}``, ``{table}``, ``{source}``, ``{key}``, ``{key_json}``; one of
    the last two must appear (or every row of a table would share one key)."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template)
                 if name is not None]
    except ValueError as exc:
        raise ValueError(f"key_template {template!r} is not a valid template ({exc}); write "
                         "literal braces as {{ and }}") from None
    unknown = sorted(set(names) - FOLLOWER_KEY_FIELDS)
    if unknown:
        raise ValueError(f"key_template uses unknown field(s) {unknown}; allowed: "
                         + ", ".join("{" + f + "}" for f in sorted(FOLLOWER_KEY_FIELDS)))
    if "key" not in names and "key_json" not in names:
        raise ValueError("key_template must contain {key} or {key_json}, or every row of a "
                         "table would share one Redis key")
    return template


def _to_redis_url(value: Any) -> Secret:
    secret = to_secret(value)
    scheme = secret.reveal().split("://", 1)[0].lower() if "://" in secret.reveal() else ""
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"expected a Redis URL such as redis://127.0.0.1:6379/0, got {secret}")
    return secret




class RedisFollowerConfig(FollowerConfig):
    """A Redis cache: one hash per row (``sinks/redis.py``)."""

    kind: Literal["redis"]
    sink: ClassVar[str] = "sinks.redis:RedisSink"
    url: Annotated[Secret, BeforeValidator(_to_redis_url)]
    #: name of an environment variable holding the Redis password (never put it in the file)
    password_env: str | None = None
    #: Redis key of a row: {schema} {table} {source} {key} {key_json}
    key_template: str = "{schema}.{table}:{key}"

    @field_validator("key_template")
    @classmethod
    def _template_ok(cls, value: str) -> str:
        return check_key_template(value)

    def password(self) -> str | None:
        """The password from ``password_env``, if configured and set."""
        return os.environ.get(self.password_env) if self.password_env else None
