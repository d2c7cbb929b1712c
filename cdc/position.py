"""Positions: where a record came from in its source's log, as a total order.

A :class:`Position` travels *outside* the record's value (in the log record's header), so a
tombstone — whose value is null — still carries one. Followers store the position they applied per
key and ignore any record whose position is not newer: that is what makes replays harmless.

Layouts (all parts are unsigned 64-bit integers, compared left to right):

``postgres`` ``(lsn, phase, ordinal)``
    ``lsn`` is the *commit* LSN of the transaction (change LSNs are not unique), ``phase`` is
    ``0`` for snapshot rows and ``1`` for streamed changes — so a snapshot row taken at the slot's
    consistent point sorts before every change streamed from it — and ``ordinal`` numbers the
    changes inside the transaction (or the rows of the snapshot) from 1.
``mysql`` ``(file_seq, pos, row)``
    binlog file sequence number, the event's position in that file, and the row's index inside the
    rows event. The GTID is kept in the source offsets for resuming, not here.
``test`` ``(seq,)``
    for tests and benchmarks that need an order without a database.

The byte form is a one-byte kind tag followed by each part as 8 big-endian bytes, so comparing
the bytes of two positions of the same source gives the same answer as comparing the positions.
"""

from __future__ import annotations

import struct
from functools import total_ordering
from typing import Any

from cdc.errors import LogCorruptError

_LAYOUTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "test": (0, ("seq",)),
    "postgres": (1, ("lsn", "phase", "ordinal")),
    "mysql": (2, ("file_seq", "pos", "row")),
}
_KIND_BY_TAG = {tag: kind for kind, (tag, _) in _LAYOUTS.items()}
_U64 = struct.Struct(">Q")
_POSTGRES = struct.Struct(">BQQQ")  # tag 1 and the three parts
PHASE_SNAPSHOT = 0
PHASE_STREAM = 1


def format_lsn(lsn: int) -> str:
    """PostgreSQL's text form of an LSN, e.g. ``0/16B3748``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """The integer value of an LSN written as ``X/Y``."""
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


@total_ordering
class Position:
    """A point in one source's change stream. Immutable, hashable, totally ordered per kind."""

    __slots__ = ("kind", "parts")

    def __init__(self, kind: str, parts: tuple[int, ...]) -> None:
        layout = _LAYOUTS.get(kind)
        if layout is None:
            raise ValueError(f"unknown position kind {kind!r}")
        if len(parts) != len(layout[1]):
            raise ValueError(f"a {kind} position has parts {layout[1]}, got {parts!r}")
        for part in parts:
            if not 0 <= part < 1 << 64:
                raise ValueError(f"position parts must be unsigned 64-bit integers: {parts!r}")
        self.kind = kind
        self.parts = tuple(parts)

    # -- constructors ------------------------------------------------------------------------
    @classmethod
    def postgres(cls, lsn: int, ordinal: int, *, snapshot: bool = False) -> Position:
        if not (0 <= lsn < 1 << 64 and 0 <= ordinal < 1 << 64):
            raise ValueError(f"position parts must be unsigned 64-bit integers: {lsn}, {ordinal}")
        position = cls.__new__(cls)  # the checks above are all __init__ would do
        position.kind = "postgres"
        position.parts = (lsn, PHASE_SNAPSHOT if snapshot else PHASE_STREAM, ordinal)
        return position

    @classmethod
    def mysql(cls, file_seq: int, pos: int, row: int) -> Position:
        return cls("mysql", (file_seq, pos, row))

    @classmethod
    def test(cls, seq: int) -> Position:
        return cls("test", (seq,))

    # -- encodings ---------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        if self.kind == "postgres":
            return _POSTGRES.pack(1, *self.parts)
        tag = _LAYOUTS[self.kind][0]
        return bytes([tag]) + b"".join(_U64.pack(part) for part in self.parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> Position:
        if not data:
            raise LogCorruptError("a record has an empty position", "restore the log from a copy")
        kind = _KIND_BY_TAG.get(data[0])
        if kind is None or len(data) != 1 + 8 * len(_LAYOUTS[kind][1]):
            raise LogCorruptError(f"a record has an unreadable position ({data.hex()})",
                                  "restore the log from a copy")
        parts = tuple(_U64.unpack_from(data, 1 + 8 * i)[0] for i in range(len(_LAYOUTS[kind][1])))
        return cls(kind, parts)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form, e.g. ``{"kind": "postgres", "lsn": "0/16B3748", ...}``."""
        names = _LAYOUTS[self.kind][1]
        out: dict[str, Any] = {"kind": self.kind}
        for name, part in zip(names, self.parts, strict=True):
            out[name] = part
        if self.kind == "postgres":
            out["lsn"] = format_lsn(self.parts[0])
            out["phase"] = "snapshot" if self.parts[1] == PHASE_SNAPSHOT else "stream"
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Position:
        kind = data["kind"]
        names = _LAYOUTS[kind][1]
        values = dict(data)
        if kind == "postgres":
            if isinstance(values["lsn"], str):
                values["lsn"] = parse_lsn(values["lsn"])
            phase = values["phase"]
            values["phase"] = {"snapshot": PHASE_SNAPSHOT, "stream": PHASE_STREAM}.get(phase, phase)
        return cls(kind, tuple(int(values[name]) for name in names))

    # -- comparisons -------------------------------------------------------------------------
    def _key(self) -> tuple[int, tuple[int, ...]]:
        return (_LAYOUTS[self.kind][0], self.parts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Position) and self._key() == other._key()

    def __lt__(self, other: Position) -> bool:
        if self.kind != other.kind:
            raise TypeError(f"cannot order a {self.kind} position against a {other.kind} one")
        return self.parts < other.parts

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Position({self.kind}, {self.parts})"
