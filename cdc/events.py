"""Change events: what every connector yields and every consumer of the log reads.

A :class:`ChangeEvent` is one row change with the envelope of Debezium's connectors — ``before``,
``after``, ``op``, ``ts_ms``, ``source{...}``, ``transaction{...}`` — plus its
:class:`~cdc.position.Position`, which is stored outside the value. Rows are dicts from column name
to a plain Python value (``int``, ``str``, ``Decimal``, ``datetime``...); the column's
:class:`~cdc.types.ColumnType` says how that value is encoded.

The log's topic for a table is ``<source name>.<schema>.<table>`` (Debezium's naming).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any, Protocol

from cdc.errors import SchemaError
from cdc.position import Position
from cdc.types import ColumnType


class Op(StrEnum):
    """Debezium's operation codes."""

    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"  # a snapshot row
    TRUNCATE = "t"


@dataclass(frozen=True, order=True)
class TableId:
    """A table's schema-qualified name, exactly as the database spells it (no quoting)."""

    schema: str
    table: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}"

    @classmethod
    def parse(cls, text: str) -> TableId:
        """Parse ``schema.table`` where either part may be double-quoted (``""`` escapes ``"``)."""
        parts: list[str] = []
        current, quoted, i = "", False, 0
        while i < len(text):
            char = text[i]
            if quoted:
                if char == '"' and text[i + 1 : i + 2] == '"':
                    current += '"'
                    i += 1
                elif char == '"':
                    quoted = False
                else:
                    current += char
            elif char == '"':
                quoted = True
            elif char == ".":
                parts.append(current)
                current = ""
            else:
                current += char
            i += 1
        parts.append(current)
        if quoted or len(parts) != 2 or not all(parts):
            raise SchemaError(f"{text!r} is not a schema-qualified table name",
                              "write it as schema.table, e.g. public.orders")
        return cls(parts[0], parts[1])


def topic_name(source: str, table: TableId) -> str:
    """The change log topic that holds ``table``'s changes."""
    return f"{source}.{table.schema}.{table.table}"


def split_topic(topic: str) -> tuple[str, TableId]:
    """:func:`topic_name` read back: ``(source, table)`` of ``<source>.<schema>.<table>``.
    Source names hold no dots, so the first dot ends the source; a schema holding a dot is
    ambiguous here (readers that know the topic's meta use its ``table`` instead)."""
    source, _, rest = topic.partition(".")
    schema, _, table = rest.partition(".")
    if not (source and schema and table):
        raise SchemaError(f"{topic!r} is not a change log topic name (source.schema.table)",
                          "pass a topic as listed by `cdc log stats`")
    return source, TableId(schema, table)


@dataclass(frozen=True)
class Column:
    """One column of a captured table."""

    name: str
    type: ColumnType
    nullable: bool = True
    #: the column transform applied in capture (``hash``, ``mask``, ``truncate(4)``, ``null``:
    #: :mod:`cdc.columns`); empty when the log holds the leader's value
    transform: str = ""


@dataclass(frozen=True)
class TableSchema:
    """The shape of a table at one moment: columns in order and the key columns.

    ``key`` lists the primary-key columns (or the configured key columns) in key order.
    """

    source: str
    database: str
    table: TableId
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    connector: str = "postgresql"

    def __post_init__(self) -> None:
        names = [column.name for column in self.columns]
        if len(set(names)) != len(names):
            raise SchemaError(f"table {self.table} lists a column twice")
        missing = [k for k in self.key if k not in names]
        if missing:
            raise SchemaError(f"table {self.table}: key column(s) {missing} are not columns")
        if not self.key:
            raise SchemaError(
                f"table {self.table} has no primary key, so its changes cannot be keyed",
                "add a primary key, or configure key columns for it",
            )

    @cached_property
    def topic(self) -> str:
        return topic_name(self.source, self.table)

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise SchemaError(f"table {self.table} has no column {name!r}")

    def key_of(self, row: dict[str, Any]) -> dict[str, Any]:
        """The key columns of ``row``, in key order."""
        try:
            return {name: row[name] for name in self.key}
        except KeyError as exc:
            raise SchemaError(f"a row of {self.table} lacks key column {exc.args[0]!r}") from None

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source, "database": self.database, "connector": self.connector,
            "schema": self.table.schema, "table": self.table.table, "key": list(self.key),
            "columns": [
                {"name": c.name, "type": c.type.describe(), "nullable": c.nullable,
                 **({"transform": c.transform} if c.transform else {})}
                for c in self.columns
            ],
        }


@dataclass
class TransactionInfo:
    """Debezium's ``transaction`` block: the transaction id and the event's place in it."""

    id: str
    total_order: int
    data_collection_order: int

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "total_order": self.total_order,
                "data_collection_order": self.data_collection_order}


class RawImages(Protocol):
    """A connector's row images not yet turned into Python values (see :class:`ChangeEvent`).

    ``rows()`` gives the typed ``(before, after)`` dicts exactly as the connector would have
    built them; ``key_bytes()`` the :func:`encode_key` bytes of the event's key; the codec asks
    ``encode_images`` for the Avro bytes of ``before`` and ``after`` directly (see
    :meth:`cdc.avro.EventCodec.encode`), which must equal encoding ``rows()``.
    """

    def rows(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None]: ...

    def key_bytes(self) -> bytes: ...

    def encode_images(self, codec: Any, out: bytearray,
                      filled: dict[str, Any] | None) -> bool: ...


_PENDING: Any = object()


class ChangeEvent:
    """One change to one row (or, for ``op == 't'``, to a whole table).

    ``source_info`` holds the connector-specific provenance fields of Debezium's ``source`` block
    (``db``, ``schema``, ``table``, ``txId``, ``lsn``, ``xmin``, ``snapshot``, ``sequence`` for
    PostgreSQL); ``version``, ``connector``, ``name`` and ``ts_ms`` are filled in from the schema
    and the event when the envelope is built.

    ``raw``: a connector may hand over its row images undecoded (:class:`RawImages`) instead of
    ``before``/``after``; the typed dicts are then built on first access of ``before``,
    ``after`` or ``key``, and the codec encodes the raw images directly (the hot path never
    builds them).
    """

    __slots__ = ("schema", "op", "position", "ts_ms", "_before", "_after", "source_info",
                 "transaction", "processed_ms", "unchanged", "replaces", "raw")

    def __init__(self, schema: TableSchema, op: Op, position: Position, ts_ms: int,
                 before: dict[str, Any] | None = None, after: dict[str, Any] | None = None,
                 source_info: dict[str, Any] | None = None,
                 transaction: TransactionInfo | None = None, processed_ms: int | None = None,
                 unchanged: tuple[str, ...] = (), replaces: ChangeEvent | None = None,
                 raw: RawImages | None = None) -> None:
        self.schema = schema
        self.op = op
        self.position = position
        self.ts_ms = ts_ms
        self.source_info: dict[str, Any] = {} if source_info is None else source_info
        #: Debezium's ``transaction`` block
        self.transaction = transaction
        #: time the event was processed by the connector (envelope ``ts_ms``), ms since the
        #: epoch; ``None``: the time it is encoded
        self.processed_ms = processed_ms
        #: columns of ``after`` whose values the source did not send because they did not
        #: change (PostgreSQL's unchanged TOAST values); the dispatcher fills them from the
        #: key's previous image, and names those it could not fill in the envelope's
        #: ``unavailable_columns``
        self.unchanged = unchanged
        #: an update that changed the primary key, as a create carrying the delete of the old
        #: key: ``unchanged`` values are then filled from the old key's image, and the delete
        #: is logged first (the delete's position is the lower)
        self.replaces = replaces
        self.raw = raw
        if raw is not None:
            self._before = self._after = _PENDING
            return
        self._before, self._after = before, after
        if op in (Op.CREATE, Op.READ, Op.UPDATE) and after is None:
            raise SchemaError(f"a {op.name.lower()} event needs an after image")
        if op is Op.DELETE and before is None:
            raise SchemaError("a delete event needs a before image (at least the key)")

    @classmethod
    def removal(cls, schema: TableSchema, position: Position, ts_ms: int) -> ChangeEvent:
        """The delete of a row known only by its key (no images; the record's key says which):
        a TRUNCATE's live keys, rows gone while a slot was lost, rows an incremental snapshot
        found gone."""
        event = cls(schema, Op.DELETE, position, ts_ms, before={})
        event._before = None
        return event

    def _materialize(self) -> None:
        assert self.raw is not None
        self._before, self._after = self.raw.rows()

    @property
    def before(self) -> dict[str, Any] | None:
        if self._before is _PENDING:
            self._materialize()
        return self._before  # type: ignore[no-any-return]

    @before.setter
    def before(self, value: dict[str, Any] | None) -> None:
        if self._after is _PENDING:
            self._materialize()
        self._before = value

    @property
    def after(self) -> dict[str, Any] | None:
        if self._after is _PENDING:
            self._materialize()
        return self._after  # type: ignore[no-any-return]

    @after.setter
    def after(self, value: dict[str, Any] | None) -> None:
        if self._before is _PENDING:
            self._materialize()
        self._after = value

    @property
    def key(self) -> dict[str, Any] | None:
        """The row's key values; ``None`` for a truncate, which has no row."""
        if self.op is Op.TRUNCATE:
            return None
        row = self.after if self.after is not None else self.before
        assert row is not None
        return self.schema.key_of(row)

    def _fields(self) -> tuple[Any, ...]:
        return (self.schema, self.op, self.position, self.ts_ms, self.before, self.after,
                self.source_info, self.transaction, self.processed_ms, self.unchanged,
                self.replaces)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChangeEvent) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"ChangeEvent({self.schema.table}, {self.op.value}, {self.position!r}, "
                f"before={self.before!r}, after={self.after!r})")


def encode_key(schema: TableSchema, key: dict[str, Any]) -> bytes:
    """Canonical key bytes: compact JSON of the key columns in key order.

    The bytes depend only on the key's column names and values — never on the value schema — so
    a tombstone always shadows every older record of its key, and a key column retyped without
    changing its values keeps its bytes. Values use their JSON form (numerics as strings).
    """
    return json.dumps(key_json(schema, key), separators=(",", ":"), ensure_ascii=False).encode()


def key_json(schema: TableSchema, key: dict[str, Any]) -> dict[str, Any]:
    """The JSON form of a key (the same form ``cdc log dump`` prints)."""
    out: dict[str, Any] = {}
    for name, value in key.items():
        ctype = schema.column(name).type
        out[name] = None if value is None else ctype.to_json(ctype.to_avro(value))
    return out
