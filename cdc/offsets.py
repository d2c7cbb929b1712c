"""Source offsets: where a source stands, as a typed value that every stage can order.

A source offset is committed to the change log *atomically with* the records it covers
(:meth:`cdc.log.base.ChangeLogWriter.append`), so it is the whole truth about how far a source
was captured. Each connector has its own offset type (a subclass of :class:`SourceOffset`:
PostgreSQL an LSN, MySQL a binlog file and position plus the GTID set); everything downstream —
the followers' watermarks, ``cdc verify``, ``cdc status`` — needs only to *order* offsets and to
*show* them, which :func:`offset_order` and :func:`offset_text` do from the stored JSON alone,
without importing the connector.

Contracts, stated exactly:

* **Resume after.** An offset ``o`` with ``state == "streaming"`` means: every change of every
  transaction that ended at or before ``o`` is in the log. Streaming from ``o`` yields the
  changes of transactions that end *after* ``o`` and nothing else, so the off-by-one is on the
  connector's side: an offset never points at a change still to be read, it points just past
  the last one read.
* **Order.** :meth:`SourceOffset.order` is a tuple of non-negative integers; of two offsets of
  one source, the one with the larger tuple is later. Offsets of different sources (or kinds)
  are never compared. The stored JSON carries the tuple (``"order"``), so a follower can keep
  its watermark moving only forward knowing nothing about the source.
* **Round trip.** ``type(o).load(o.dump()) == o`` for every offset; :meth:`SourceOffset.dump`
  is plain JSON (ints, strings, lists, dicts).
* **States.** ``bootstrapping`` is committed before a snapshot starts (capture refuses to
  stream from it); ``streaming`` is committed with the snapshot's last rows and with every flush
  of streamed changes.
* **Room to grow.** ``snapshots`` carries per-table progress of incremental snapshots (a later
  issue) through every commit unchanged; ``unavailable_images`` counts changes whose row images
  lacked values no earlier image had.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from cdc.errors import check_format

BOOTSTRAPPING = "bootstrapping"
STREAMING = "streaming"
_BASE_FIELDS = ("kind", "state", "order", "text", "unavailable_images", "snapshots")


@dataclass(frozen=True, kw_only=True)
class SourceOffset:
    """A source's position, typed. Subclasses add their fields and define :meth:`order` and
    :meth:`describe`; the base handles the JSON form and the fields every connector shares."""

    #: the connector kind (``postgres``, ``mysql``): the ``kind`` of its ``sources:`` entry
    kind: ClassVar[str] = ""

    state: str = STREAMING
    #: changes whose row images lacked values that no earlier image had (see docs/capture.md)
    unavailable_images: int = 0
    #: per table, incremental snapshot progress (opaque here; carried through every commit)
    snapshots: Mapping[str, Any] = field(default_factory=dict)

    # -- what subclasses define --------------------------------------------------------------
    def order(self) -> tuple[int, ...]:
        """The offset as a tuple that orders like the source's log (see the module doc)."""
        return ()

    def describe(self) -> str:
        """A short human form, e.g. ``0/16B3748`` or ``mariadb-bin.000003:4711``."""
        return self.state

    # -- JSON --------------------------------------------------------------------------------
    def dump(self) -> dict[str, Any]:
        """The JSON form stored in the log: the subclass's fields plus ``kind``, ``state``,
        ``order`` and ``text`` (so code that does not know the connector can order and show
        it)."""
        out: dict[str, Any] = {"format": OFFSET_FORMAT, "kind": self.kind, "state": self.state}
        for item in dataclasses.fields(self):
            if item.name not in _BASE_FIELDS:
                out[item.name] = _json(getattr(self, item.name))
        if self.unavailable_images:
            out["unavailable_images"] = self.unavailable_images
        if self.snapshots:
            out["snapshots"] = _json(self.snapshots)
        out["order"] = list(self.order())
        out["text"] = self.describe()
        return out

    @classmethod
    def load(cls, data: Mapping[str, Any]) -> Self:
        """The offset stored as ``data`` (by :meth:`dump`, or by an older version that wrote
        fewer fields: missing fields take their defaults; no ``format`` is format 1). Unknown
        keys are ignored; a ``format`` newer than :data:`OFFSET_FORMAT` is refused."""
        check_format(data.get("format", 1), OFFSET_FORMAT,
                     f"a stored {data.get('kind', cls.kind)} offset",
                     fix="run the cdc version that wrote the log (or a newer one)")
        names = {item.name for item in dataclasses.fields(cls)} - {"kind"}
        values = {name: data[name] for name in names if name in data}
        return cls(**cls._loaded(values))

    @classmethod
    def _loaded(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Hook: turn stored JSON values into field values (e.g. lists into tuples)."""
        return values

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (field values), as :func:`dataclasses.replace` makes it,
        without calling ``__init__`` again: it is made once per source transaction."""
        cls = type(self)
        names = _FIELD_NAMES.get(cls)
        if names is None:
            names = _FIELD_NAMES[cls] = frozenset(f.name for f in dataclasses.fields(cls)
                                                  if f.init)
        if (not changes.keys() <= names or not hasattr(self, "__dict__")
                or hasattr(cls, "__post_init__")):
            return dataclasses.replace(self, **changes)
        new = object.__new__(cls)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    @property
    def streaming(self) -> bool:
        return self.state == STREAMING


_FIELD_NAMES: dict[type, frozenset[str]] = {}

#: the format of a stored offset's JSON (:meth:`SourceOffset.dump`); 1: every version so far
OFFSET_FORMAT = 1


def _json(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    return value


def offset_order(data: Mapping[str, Any] | None) -> tuple[int, ...]:
    """The order of a stored offset (:meth:`SourceOffset.order`), read from its JSON alone.

    Offsets stored before the order was stored are read by their fields (PostgreSQL ``lsn``;
    MySQL ``file_seq`` and ``pos``); ``()`` for none or an unknown shape (every such offset
    ties)."""
    if not data:
        return ()
    order = data.get("order")
    if isinstance(order, list | tuple):
        return tuple(int(part) for part in order)
    if "lsn" in data:
        return (int(data["lsn"]),)
    if "file_seq" in data and "pos" in data:
        return (int(data["file_seq"]), int(data["pos"]))
    return ()


def offset_text(data: Mapping[str, Any] | None) -> str:
    """How a stored offset is shown (:meth:`SourceOffset.describe`); ``-`` for none."""
    if not data:
        return "-"
    text = data.get("text") or data.get("lsn_text")
    if text:
        return str(text)
    order = offset_order(data)
    return "/".join(str(part) for part in order) if order else str(data.get("state", "-"))


def reached(data: Mapping[str, Any] | None, target: tuple[int, ...]) -> bool:
    """Whether the stored offset ``data`` is at or past ``target`` (an :meth:`order`)."""
    order = offset_order(data)
    return bool(order) and order >= target
