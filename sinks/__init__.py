"""Followers: one module per kind (Redis, search, Delta, views) behind one Sink interface that
applies a folded batch with the version gate (``sinks/base.py``).

:data:`REGISTRY` maps a follower's ``kind`` to the function that builds its sink;
:func:`open_sink` builds the sink of a configured follower (``followers:`` in the config). A kind
the registry does not know is a :class:`~cdc.errors.ConfigError`, never a fall-through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cdc.errors import ConfigError

if TYPE_CHECKING:
    from cdc.config import Config
    from sinks.base import Sink


def _redis(config: Config, name: str, follower: Any) -> Sink:
    from sinks.redis import RedisSink

    return RedisSink(name, follower.url, key_template=follower.key_template,
                     tombstone_retention=follower.tombstone_retention,
                     tables=config.follower_topics(name), password=follower.password())


def _delta(config: Config, name: str, follower: Any) -> Sink:
    from cdc.log.open import log_settings
    from sinks.delta import DeltaSink

    return DeltaSink(name, config.follower_path(name), tables=config.follower_topics(name),
                     mode=follower.mode, buckets=follower.buckets,
                     tombstone_retention=follower.tombstone_retention,
                     log_path=config.log_path, log=log_settings(config))


def _search(config: Config, name: str, follower: Any) -> Sink:
    from sinks.search import SearchSink

    return SearchSink(name, config.follower_path(name), tables=config.follower_topics(name),
                      text_fields=follower.text_fields, writer_memory=follower.writer_memory,
                      tombstone_retention=follower.tombstone_retention,
                      log_path=config.log_path)


def _sql(config: Config, name: str, follower: Any) -> Sink:
    from sinks.sql import SqlSink

    return SqlSink(name, follower.database_url(), tables=config.follower_topics(name),
                   tombstone_retention=follower.tombstone_retention)


#: follower ``kind`` -> ``build(config, name, follower config) -> Sink`` (nothing connected yet)
REGISTRY: dict[str, Callable[[Config, str, Any], Sink]] = {
    "redis": _redis,
    "delta": _delta,
    "search": _search,
    "sql": _sql,
}


def open_sink(config: Config, name: str) -> Sink:
    """The sink of follower ``name`` (:class:`~cdc.errors.ConfigError` if there is none, or if
    its kind has no sink). Nothing is connected yet: :meth:`Sink.check` does that."""
    follower = config.follower(name)
    kind = str(getattr(follower, "kind", ""))
    build = REGISTRY.get(kind)
    if build is None:
        raise ConfigError(f"follower {name}: there is no follower kind {kind!r}",
                          f"set followers.{name}.kind to one of {', '.join(sorted(REGISTRY))}")
    return build(config, name, follower)
