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
    from cdc.config import DeltaFollowerConfig, RedisFollowerConfig
    from cdc.log.open import log_settings

    follower = config.follower(name)
    tables = config.follower_topics(name)
    if isinstance(follower, RedisFollowerConfig):
        from sinks.redis import RedisSink

        return RedisSink(name, follower.url, key_template=follower.key_template,
                         tombstone_retention=follower.tombstone_retention,
                         tables=tables, password=follower.password())
    if isinstance(follower, DeltaFollowerConfig):
        from sinks.delta import DeltaSink

        return DeltaSink(name, config.follower_path(name), tables=tables, mode=follower.mode,
                         buckets=follower.buckets,
                         tombstone_retention=follower.tombstone_retention,
                         log_path=config.log_path, log=log_settings(config))
    from sinks.search import SearchSink

    return SearchSink(name, config.follower_path(name), tables=tables,
                      text_fields=follower.text_fields, writer_memory=follower.writer_memory,
                      tombstone_retention=follower.tombstone_retention,
                      log_path=config.log_path)
