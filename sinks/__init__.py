"""Followers: one module per kind (Redis, search, Delta, views) behind one Sink interface that
applies a folded batch with the version gate (``sinks/base.py``).

:func:`open_sink` builds the sink of a configured follower (``followers:`` in the config).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cdc.config import Config
    from sinks.base import Sink


def open_sink(config: Config, name: str) -> Sink:
    """The sink of follower ``name`` (:class:`~cdc.errors.ConfigError` if there is none).
    Nothing is connected yet; the Redis sink's ``check()`` PINGs."""
    follower = config.follower(name)
    from sinks.redis import RedisSink

    return RedisSink(name, follower.url, key_template=follower.key_template,
                     tombstone_retention=follower.tombstone_retention,
                     tables=config.follower_topics(name), password=follower.password())
