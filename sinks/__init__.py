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
from cdc.events import TableId

if TYPE_CHECKING:
    from cdc.config import Config
    from sinks.base import Sink


#: topic -> (source, table) of what a sink holds
Topics = dict[str, tuple[str, TableId]]


def _redis(config: Config, name: str, follower: Any, topics: Topics) -> Sink:
    from sinks.redis import RedisSink

    return RedisSink(name, follower.url, key_template=follower.key_template,
                     tombstone_retention=follower.tombstone_retention,
                     tables=topics, password=follower.password())


def _delta(config: Config, name: str, follower: Any, topics: Topics) -> Sink:
    from cdc.log.open import log_settings
    from sinks.delta import DeltaSink

    return DeltaSink(name, config.follower_path(name), tables=topics,
                     mode=follower.mode, buckets=follower.buckets,
                     tombstone_retention=follower.tombstone_retention,
                     log_path=config.log_path, log=log_settings(config))


def _search(config: Config, name: str, follower: Any, topics: Topics) -> Sink:
    from sinks.search import SearchSink

    return SearchSink(name, config.follower_path(name), tables=topics,
                      text_fields=follower.text_fields, writer_memory=follower.writer_memory,
                      tombstone_retention=follower.tombstone_retention,
                      log_path=config.log_path)


def _sql(config: Config, name: str, follower: Any, topics: Topics) -> Sink:
    from cdc.log.open import log_settings
    from sinks.sql import SqlSink

    return SqlSink(name, follower.database_url(), tables=topics,
                   tombstone_retention=follower.tombstone_retention,
                   log_path=config.log_path, log=log_settings(config))


def _view(config: Config, name: str, view: Any, topics: Topics) -> Sink:
    from views.sink import ViewSink

    return ViewSink(config, name)


#: follower ``kind`` -> ``build(config, name, follower config, topics) -> Sink`` (nothing
#: connected yet); ``topics``: what it holds (a view's followers hold the view's topic)
REGISTRY: dict[str, Callable[[Config, str, Any, Topics], Sink]] = {
    "redis": _redis,
    "delta": _delta,
    "search": _search,
    "sql": _sql,
    "view": _view,
}


def open_sink(config: Config, name: str, topics: Topics | None = None) -> Sink:
    """The sink of follower (or view) ``name`` (:class:`~cdc.errors.ConfigError` if there is
    none, or if its kind has no sink), holding ``topics`` (default: the tables it follows).
    Nothing is connected yet: :meth:`Sink.check` does that."""
    follower = config.follower(name)
    kind = str(getattr(follower, "kind", ""))
    build = REGISTRY.get(kind)
    if build is None:
        raise ConfigError(f"follower {name}: there is no follower kind {kind!r}",
                          f"set followers.{name}.kind to one of {', '.join(sorted(REGISTRY))}")
    if topics is None:
        topics = {} if kind == "view" else config.follower_topics(name)
    return build(config, name, follower, topics)
