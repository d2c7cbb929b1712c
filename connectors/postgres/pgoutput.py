"""Decoder for PostgreSQL's ``pgoutput`` logical replication messages (protocol version 1).

Every message arrives as the payload of an ``XLogData`` copy message. Integers are big-endian;
strings are NUL-terminated. Only the shapes are decoded here: turning column text into typed
values is ``connectors/postgres/types.py``'s job.

Message kinds handled: Begin ``B``, Commit ``C``, Origin ``O``, Relation ``R``, Type ``Y``,
Insert ``I``, Update ``U``, Delete ``D``, Truncate ``T``, logical decoding Message ``M``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from cdc.errors import CdcError
from cdc.speedups import pure_python

PG_EPOCH_MICROS = 946_684_800_000_000  # 2000-01-01 in microseconds since the Unix epoch

_I8 = struct.Struct(">b")
_U8 = struct.Struct(">B")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
#: Begin: final LSN, commit time, xid; Commit: flags, commit LSN, end LSN, commit time
BEGIN = _BEGIN = struct.Struct(">QqI")
COMMIT = _COMMIT = struct.Struct(">BQQq")

#: marker for a TOASTed column whose value did not change (pgoutput sends no bytes for it)
UNCHANGED_TOAST = object()


class DecodeError(CdcError):
    """A replication message that does not follow the pgoutput format."""


def pg_time_to_unix_micros(pg_micros: int) -> int:
    return pg_micros + PG_EPOCH_MICROS


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # the LSN of the transaction's commit record
    commit_time: int  # microseconds since the Unix epoch
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int  # one past the commit record: where replication resumes after this txn
    commit_time: int


@dataclass(frozen=True, slots=True)
class Origin:
    lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    name: str
    type_oid: int
    type_modifier: int
    is_key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class TypeInfo:
    oid: int
    namespace: str
    name: str


#: a tuple's columns: text (``str``), ``None`` for NULL, or :data:`UNCHANGED_TOAST`
TupleData = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    relation_oid: int
    new: TupleData
    old: TupleData | None  # present with REPLICA IDENTITY FULL ('O') or a changed key ('K')
    old_is_key_only: bool


@dataclass(frozen=True, slots=True)
class Delete:
    relation_oid: int
    old: TupleData
    old_is_key_only: bool


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Message:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


PgOutputMessage = (Begin | Commit | Origin | Relation | TypeInfo | Insert | Update | Delete
                   | Truncate | Message)


def _string(data: bytes, at: int) -> tuple[str, int]:
    end = data.index(b"\x00", at)
    return data[at:end].decode("utf-8"), end + 1


def _tuple(data: bytes, at: int) -> tuple[TupleData, int]:
    if _parse_tuple is not None and data.__class__ is bytes:
        parsed, end = _parse_tuple(data, at)
        if parsed is not None:
            return parsed, end  # else: malformed, and the code below says how
    (count,) = _I16.unpack_from(data, at)
    at += 2
    values: list[object] = []
    append = values.append
    for _ in range(count):
        kind = data[at]
        at += 1
        if kind == 0x74:  # 't' text
            (length,) = _I32.unpack_from(data, at)
            at += 4
            append(data[at : at + length].decode("utf-8"))
            at += length
        elif kind == 0x6E:  # 'n' null
            append(None)
        elif kind == 0x75:  # 'u' unchanged TOAST
            append(UNCHANGED_TOAST)
        elif kind == 0x62:  # 'b' binary (only with the binary option, which we do not request)
            (length,) = _I32.unpack_from(data, at)
            at += 4
            append(bytes(data[at : at + length]))
            at += length
        else:
            raise DecodeError(f"unknown tuple column kind {chr(kind)!r} in a pgoutput message")
    return tuple(values), at


def _compiled_parser() -> Any:
    """The compiled tuple parser (connectors/postgres/_fast), unless absent or
    ``CDC_PURE_PYTHON=1``."""
    if pure_python():
        return None
    try:
        from connectors.postgres import _fast  # type: ignore[attr-defined]
    except ImportError:
        return None
    _fast.init(UNCHANGED_TOAST)
    return _fast.parse_tuple


_parse_tuple = _compiled_parser()


def decode(data: bytes) -> PgOutputMessage | None:
    """One pgoutput message; ``None`` for kinds we do not need (e.g. stream control)."""
    kind = data[0]
    if kind == 0x49:  # 'I'
        (oid,) = _U32.unpack_from(data, 1)
        if data[5] != 0x4E:
            raise DecodeError("an Insert message without a new tuple")
        new, _ = _tuple(data, 6)
        return Insert(oid, new)
    if kind == 0x55:  # 'U'
        (oid,) = _U32.unpack_from(data, 1)
        at = 5
        old: TupleData | None = None
        key_only = False
        if data[at] in (0x4B, 0x4F):  # 'K' old key, 'O' old tuple
            key_only = data[at] == 0x4B
            old, at = _tuple(data, at + 1)
        if data[at] != 0x4E:
            raise DecodeError("an Update message without a new tuple")
        new, _ = _tuple(data, at + 1)
        return Update(oid, new, old, key_only)
    if kind == 0x44:  # 'D'
        (oid,) = _U32.unpack_from(data, 1)
        key_only = data[5] == 0x4B
        old_tuple, _ = _tuple(data, 6)
        return Delete(oid, old_tuple, key_only)
    if kind == 0x42:  # 'B'
        final_lsn, commit_time, xid = _BEGIN.unpack_from(data, 1)
        return Begin(final_lsn, pg_time_to_unix_micros(commit_time), xid)
    if kind == 0x43:  # 'C'
        flags, commit_lsn, end_lsn, commit_time = _COMMIT.unpack_from(data, 1)
        return Commit(flags, commit_lsn, end_lsn, pg_time_to_unix_micros(commit_time))
    if kind == 0x52:  # 'R'
        return _relation(data)
    if kind == 0x59:  # 'Y'
        (oid,) = _U32.unpack_from(data, 1)
        namespace, at = _string(data, 5)
        name, _ = _string(data, at)
        return TypeInfo(oid, namespace, name)
    if kind == 0x54:  # 'T'
        (count,) = _I32.unpack_from(data, 1)
        options = data[5]
        oids = tuple(_U32.unpack_from(data, 6 + 4 * i)[0] for i in range(count))
        return Truncate(oids, bool(options & 1), bool(options & 2))
    if kind == 0x4D:  # 'M'
        flags = data[1]
        (lsn,) = _U64.unpack_from(data, 2)
        prefix, at = _string(data, 10)
        (length,) = _I32.unpack_from(data, at)
        content = bytes(data[at + 4 : at + 4 + length])
        return Message(bool(flags & 1), lsn, prefix, content)
    if kind == 0x4F:  # 'O'
        (lsn,) = _U64.unpack_from(data, 1)
        name, _ = _string(data, 9)
        return Origin(lsn, name)
    return None


def _relation(data: bytes) -> Relation:
    (oid,) = _U32.unpack_from(data, 1)
    namespace, at = _string(data, 5)
    name, at = _string(data, at)
    identity = chr(data[at])
    (count,) = _I16.unpack_from(data, at + 1)
    at += 3
    columns = []
    for _ in range(count):
        flags = data[at]
        column, at = _string(data, at + 1)
        type_oid, modifier = struct.unpack_from(">Ii", data, at)
        at += 8
        columns.append(RelationColumn(column, type_oid, modifier, bool(flags & 1)))
    return Relation(oid, namespace or "pg_catalog", name, identity, tuple(columns))
