"""Plugins: what other packages add to the core through entry points, found by name.

Two kinds of plugin, each an entry point group whose names are the config's ``kind:`` values:

* ``cdc.connectors``: a source kind (``sources: - kind: postgres``). The entry point names the
  kind's **settings model**, a subclass of :class:`cdc.config.SourceConfig` whose ``kind`` field
  is ``Literal["<the entry point's name>"]`` and whose ``connector`` class variable names the
  connector class as ``"module:Class"`` (a :class:`cdc.source.Connector`).
* ``cdc.followers``: a follower kind (``followers: NAME: kind: redis``). The entry point names the
  kind's settings model, a subclass of :class:`cdc.config.FollowerConfig` (``kind`` likewise),
  whose ``sink`` class variable names the sink class as ``"module:Class"`` (a
  :class:`cdc.sink.Sink` with ``from_settings``).

Settings models are loaded when a config is read, so their modules stay light (no drivers);
implementations are loaded on first use. A package registers its own kinds in its
``pyproject.toml`` (``[project.entry-points."cdc.followers"]``) without touching this one. This
module only finds and checks plugins; :mod:`cdc.config` builds the config's unions from them.
"""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar, get_args

from cdc.errors import ConfigError

SOURCE_GROUP = "cdc.connectors"
FOLLOWER_GROUP = "cdc.followers"

T = TypeVar("T")


def registered(group: str, base: type[T]) -> dict[str, type[T]]:
    """The settings models registered in entry point ``group``, by kind (sorted by kind), each
    checked to subclass ``base`` and to declare ``kind: Literal[<its entry point's name>]``.
    A plugin that fails to load or breaks these rules is a :class:`ConfigError` naming it."""
    found: dict[str, type[T]] = {}
    for point in sorted(entry_points(group=group), key=lambda p: p.name):
        found.setdefault(point.name, _settings_model(point, base))
    return found


def _settings_model(point: EntryPoint, base: type[T]) -> type[T]:
    fix = f"fix or uninstall the package that registers {point.value} in {point.group}"
    try:
        model = point.load()
    except Exception as exc:  # a third party's code: any failure is its own
        raise ConfigError(f"the plugin {point.name!r} ({point.value}) of {point.group} does "
                          f"not load: {exc.__class__.__name__}: {exc}", fix) from None
    if not (isinstance(model, type) and issubclass(model, base)):
        raise ConfigError(f"the plugin {point.name!r} of {point.group} names {point.value}, "
                          f"which is not a {base.__module__}.{base.__qualname__}", fix)
    kind = getattr(model, "model_fields", {}).get("kind")
    if kind is None or get_args(kind.annotation) != (point.name,):
        raise ConfigError(f"the plugin {point.name!r} of {point.group}: {point.value} must "
                          f"declare kind: Literal[{point.name!r}]", fix)
    return model


def implementation(path: str, base: type[Any], kind: str) -> Any:
    """The class at ``path`` (``"module:Class"``) that implements plugin kind ``kind``,
    checked to subclass ``base`` (an abstract class: hence not typed ``type[T]``)."""
    fix = f"fix or uninstall the package that provides kind {kind!r}"
    module_name, _, name = path.partition(":")
    try:
        found: Any = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"kind {kind!r}: its implementation {path} does not load: "
                          f"{exc.__class__.__name__}: {exc}", fix) from None
    if not (isinstance(found, type) and issubclass(found, base)):
        raise ConfigError(f"kind {kind!r}: {path} is not a {base.__module__}."
                          f"{base.__qualname__}", fix)
    return found
