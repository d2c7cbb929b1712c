"""Column filters and masking: what of a row may enter the log.

A source's ``columns:`` setting names, per table, the columns to keep (``include``) or drop
(``exclude``) and a transform per column. They are applied in capture, before anything reaches
the log — to ``before`` and ``after`` images, snapshot rows and streamed changes alike, and to the
table's schema — by the dispatcher (:meth:`cdc.pipeline.Dispatcher.add`). A connector never
encodes such a table's rows itself (:meth:`ColumnRules.has_rules` tells it so).

Transforms, and the type each leaves in the log's schema:

============== ========================================================= ====================
``hash``       HMAC-SHA256, in hex, of the value's canonical text (the   ``string``
               text ``cdc verify`` compares: a string as it is, anything
               else as its compact JSON form), keyed by the bytes of the
               environment variable ``hash_key_env`` names (never logged)
``mask``       the fixed string ``****`` (``mask(TEXT)``: ``TEXT``)      ``string``
``truncate(n)`` the first ``n`` characters of a text value                unchanged
``null``       always null                                               unchanged, nullable
============== ========================================================= ====================

Each transformed field of the Avro schema carries ``"cdc.transform"`` (``hash``, ``mask``,
``truncate(3)``, ``null``), and its ``cdc.type``'s ``source_type`` says what the leader's type
was. Key columns may only be hashed: dropping, nulling, masking or truncating them would merge
rows. A hashed key stays unique because HMAC-SHA256 collisions are not found in practice; the
key bytes in the log are then the hashes, so followers key by them.

Hiding a column the log already holds in clear (a transform or exclusion added later), or hashing
a key already logged in clear, is refused (:func:`check_history`): the clear values would stay in
the log's history. The fix is to rebuild the topic.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cdc.errors import ConfigError
from cdc.events import ChangeEvent, Column, TableId, TableSchema, topic_name
from cdc.types import ColumnType, canonical_text

#: the types ``truncate(n)`` applies to (text whose prefix is still a value of the type)
TRUNCATABLE = frozenset({"string", "xml"})
MASK_TEXT = "****"
_TRANSFORM = re.compile(r"^\s*(hash|mask|truncate|null)\s*(?:\(\s*(.*?)\s*\))?\s*$", re.DOTALL)


@dataclass(frozen=True)
class Transform:
    """One column's transform: ``kind`` is ``hash``, ``mask``, ``truncate`` or ``null``."""

    kind: str
    #: ``truncate``: the characters kept; ``mask``: the text written
    argument: int | str | None = None

    def describe(self) -> str:
        if self.kind == "truncate":
            return f"truncate({self.argument})"
        if self.kind == "mask" and self.argument != MASK_TEXT:
            return f"mask({self.argument})"
        return self.kind

    def refusal(self, ctype: ColumnType, is_key: bool) -> str | None:
        """Why this transform cannot apply to a column of ``ctype``; None when it can."""
        if is_key and self.kind != "hash":
            return "it is a key column, and only `hash` keeps keys unique"
        if self.kind == "truncate" and ctype.name not in TRUNCATABLE:
            return (f"truncate applies to text columns only, and this one is {ctype.name} "
                    "(use hash, mask or null)")
        return None


def parse_transform(text: str | None) -> Transform:
    """``hash``, ``mask``, ``mask(TEXT)``, ``truncate(N)`` or ``null`` (YAML's ``null`` too);
    :class:`ValueError` naming the accepted forms otherwise."""
    if text is None:
        return Transform("null")
    match = _TRANSFORM.match(str(text))
    if match is None:
        raise ValueError(f"unknown transform {text!r}: use hash, mask, mask(TEXT), truncate(N) "
                         "or null")
    kind, argument = match.group(1), match.group(2)
    if kind == "truncate":
        if argument is None or not argument.isdigit() or int(argument) < 1:
            raise ValueError(f"{text!r}: truncate needs a positive length, e.g. truncate(4)")
        return Transform(kind, int(argument))
    if kind == "mask":
        return Transform(kind, MASK_TEXT if argument is None else argument.strip("'\""))
    if argument is not None:
        raise ValueError(f"{text!r}: {kind} takes no argument")
    return Transform(kind)


@dataclass(frozen=True)
class TableRules:
    """The column rules of one table, as configured (names not yet checked against a schema)."""

    table: TableId
    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    transforms: Mapping[str, Transform] | None = None

    def kept(self, name: str) -> bool:
        if self.include is not None:
            return name in self.include
        return name not in self.exclude

    def named(self) -> set[str]:
        """Every column these rules name."""
        return set(self.include or ()) | set(self.exclude) | set(self.transforms or {})


class TablePolicy:
    """:class:`TableRules` checked against a table's schema; transforms schemas and events."""

    def __init__(self, rules: TableRules, hash_key: bytes | None) -> None:
        self.rules = rules
        self._hash_key = hash_key
        self._schemas: dict[int, tuple[TableSchema, TableSchema]] = {}
        #: per source schema: (column name, value function or None to keep) for kept columns
        self._plans: dict[int, list[tuple[str, Any]]] = {}
        self._outputs: dict[int, TableSchema] = {}

    def check(self, schema: TableSchema) -> None:
        """Refuse, with the fix, rules that do not fit ``schema`` (see the module doc)."""
        table, names = schema.table, {c.name for c in schema.columns}
        unknown = sorted(self.rules.named() - names)
        if unknown:
            raise ConfigError(
                f"columns of {table}: {', '.join(unknown)} not in the table (it has "
                f"{', '.join(c.name for c in schema.columns)})",
                f"correct the names under the source's columns: {table}")
        dropped = [k for k in schema.key if not self.rules.kept(k)]
        if dropped:
            raise ConfigError(
                f"columns of {table}: key column(s) {', '.join(dropped)} cannot be left out: "
                "rows would merge",
                "keep the key columns (hash them if their values must not reach the log)")
        for name, transform in (self.rules.transforms or {}).items():
            why = transform.refusal(schema.column(name).type, name in schema.key)
            if why:
                raise ConfigError(f"columns of {table}: {transform.describe()} of {name}: {why}",
                                  f"change or remove the transform of {name}")
            if transform.kind == "hash" and self._hash_key is None:
                raise ConfigError(f"columns of {table}: {name} is hashed but the source has no "
                                  "hash key", "set hash_key_env on the source")

    def schema(self, schema: TableSchema) -> TableSchema:
        """The schema the log holds for ``schema`` (columns left out, transformed types)."""
        found = self._schemas.get(id(schema))
        if found is not None and found[0] is schema:
            return found[1]
        self.check(schema)
        transforms = self.rules.transforms or {}
        columns: list[Column] = []
        plan: list[tuple[str, Any]] = []
        for column in schema.columns:
            if not self.rules.kept(column.name):
                continue
            transform = transforms.get(column.name)
            if transform is None:
                columns.append(column)
                plan.append((column.name, None))
                continue
            columns.append(_transformed_column(column, transform))
            plan.append((column.name, self._function(column.type, transform)))
        out = replace(schema, columns=tuple(columns))
        self._schemas[id(schema)] = (schema, out)
        self._plans[id(out)] = plan
        self._outputs[id(out)] = out
        return out

    def _function(self, ctype: ColumnType, transform: Transform) -> Any:
        kind = transform.kind
        if kind == "null":
            return lambda _value: None
        if kind == "mask":
            text = transform.argument
            return lambda _value: text
        if kind == "truncate":
            length = int(transform.argument or 0)
            return lambda value: value[:length]
        key = self._hash_key
        assert key is not None
        return lambda value: hmac_hex(key, value_text(ctype, value))

    def projection(self, schema: TableSchema) -> list[tuple[int, str | None, Any]]:
        """For connectors that encode rows themselves: per column of :meth:`schema`
        ``(schema)``, in order, the index of its source column in ``schema``, its transform's
        kind (None: kept as it is) and argument — for ``hash``, the function of the column's
        typed (parsed) value that gives the logged text."""
        transforms = self.rules.transforms or {}
        out: list[tuple[int, str | None, Any]] = []
        for index, column in enumerate(schema.columns):
            if not self.rules.kept(column.name):
                continue
            transform = transforms.get(column.name)
            if transform is None:
                out.append((index, None, None))
            elif transform.kind == "hash":
                out.append((index, "hash", self._function(column.type, transform)))
            else:
                out.append((index, transform.kind, transform.argument))
        return out

    def produced(self, schema: TableSchema) -> bool:
        """Whether ``schema`` is one this policy made (its events are transformed already)."""
        return self._outputs.get(id(schema)) is schema

    def row(self, out_schema: TableSchema, row: dict[str, Any] | None) -> dict[str, Any] | None:
        """``row`` (of the source's schema) as the log holds it under ``out_schema``."""
        if row is None:
            return None
        result: dict[str, Any] = {}
        for name, function in self._plans[id(out_schema)]:
            if name not in row:
                continue  # an unsent value (unchanged TOAST): filled later from the log's image
            value = row[name]
            result[name] = value if function is None or value is None else function(value)
        return result

    def event(self, event: ChangeEvent) -> ChangeEvent:
        """``event`` as the log holds it: a new event, typed rows, the transformed schema."""
        schema = self.schema(event.schema)
        kept = {c.name for c in schema.columns}
        return ChangeEvent(
            schema, event.op, event.position, event.ts_ms,
            before=self.row(schema, event.before), after=self.row(schema, event.after),
            source_info=event.source_info, transaction=event.transaction,
            processed_ms=event.processed_ms,
            unchanged=tuple(n for n in event.unchanged if n in kept),
            replaces=None if event.replaces is None else self.event(event.replaces))

    def json_row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """A leader row in JSON form (``cdc verify``'s) as the log holds it: the same columns
        kept, the same transforms applied to the JSON-form values."""
        transforms = self.rules.transforms or {}
        result: dict[str, Any] = {}
        for name, value in row.items():
            if not self.rules.kept(name):
                continue
            transform = transforms.get(name)
            if transform is None or value is None:
                result[name] = value
            elif transform.kind == "hash":
                assert self._hash_key is not None
                result[name] = hmac_hex(self._hash_key, canonical_text(value))
            elif transform.kind == "truncate":
                result[name] = value[:int(transform.argument or 0)]
            else:
                result[name] = None if transform.kind == "null" else transform.argument
        return result

    def transforms_key(self, key: Sequence[str]) -> bool:
        """Whether any of the ``key`` columns is transformed (its log key bytes differ)."""
        return any(name in (self.rules.transforms or {}) for name in key)


def _transformed_column(column: Column, transform: Transform) -> Column:
    description = transform.describe()
    origin = column.type.source_type or column.type.name
    if transform.kind in ("hash", "mask"):
        text = ColumnType("string", source_type=f"{description} of {origin}")
        return Column(column.name, text, column.nullable, transform=description)
    return Column(column.name, column.type, column.nullable or transform.kind == "null",
                  transform=description)


def value_text(ctype: ColumnType, value: Any) -> str:
    """The canonical text of a Python value of ``ctype`` (its JSON form's, as verify reads)."""
    if type(value) is str and ctype.name == "string":
        return value
    return canonical_text(ctype.to_json(ctype.to_avro(value)))


def hmac_hex(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


class ColumnPolicies:
    """The column rules of one source, by table (from its config; see :meth:`from_settings`)."""

    def __init__(self, source: str, rules: Sequence[TableRules], hash_key: bytes | None) -> None:
        self.source = source
        self.tables = {r.table: TablePolicy(r, hash_key) for r in rules}

    @classmethod
    def from_settings(cls, source: str, columns: Mapping[str, Any],
                      hash_key_env: str | None) -> ColumnPolicies | None:
        """The policies of a source config's ``columns`` (None when it has none). The hash key
        is read from ``hash_key_env`` now; a missing one is refused, naming the variable."""
        if not columns:
            return None
        rules = [table_rules(text, setting) for text, setting in columns.items()]
        hash_key = None
        if any(t.kind == "hash" for r in rules for t in (r.transforms or {}).values()):
            value = os.environ.get(hash_key_env or "")
            if not value:
                raise ConfigError(
                    f"source {source!r} hashes columns, but the environment variable "
                    f"{hash_key_env} that holds the hash key is not set",
                    f"export {hash_key_env}=<a long random secret> (the same value on every "
                    "run: a new key changes every hash)")
            hash_key = value.encode()
        return cls(source, rules, hash_key)

    def get(self, table: TableId) -> TablePolicy | None:
        return self.tables.get(table)

    def check_log(self, registry: Any) -> None:
        """:func:`check_history` of every table with rules against ``registry`` (the log's
        schema registry): capture refuses at start, before it logs anything."""
        for table, policy in self.tables.items():
            topic = topic_name(self.source, table)
            check_history(policy, topic, [v.schema for v in registry.versions(f"{topic}-value")])


def table_rules(table: str, setting: Any) -> TableRules:
    """The :class:`TableRules` of one ``columns:`` entry (already validated by the config;
    the config's model, or a plain mapping of the same fields)."""
    def field(name: str) -> Any:
        if isinstance(setting, Mapping):
            return setting.get(name)
        return getattr(setting, name, None)
    include = field("include")
    transforms = {name: parse_transform(text)
                  for name, text in (field("transforms") or {}).items()}
    return TableRules(TableId.parse(table), None if include is None else tuple(include),
                      tuple(field("exclude") or ()), transforms)


def check_history(policy: TablePolicy | None, topic: str,
                  logged: Sequence[Mapping[str, Any]]) -> None:
    """Refuse ``policy`` when it hides a column, or hashes a key, that ``topic``'s logged
    schema versions (``logged``: registered Avro envelopes) hold in clear: those values would
    stay in the log's history."""
    if policy is None or not logged:
        return
    clear: set[str] = set()
    clear_key: set[str] = set()
    for envelope in logged:
        fields = envelope["fields"][0]["type"][1]["fields"]
        plain = {f.get("cdc.column", f["name"]) for f in fields if not f.get("cdc.transform")}
        clear |= plain
        clear_key |= {k for k in envelope.get("cdc.key", ()) if k in plain}
    rules, transforms = policy.rules, policy.rules.transforms or {}
    hidden = sorted(n for n in clear if not rules.kept(n) or n in transforms)
    if hidden:
        what = ", ".join(hidden)
        keys = [n for n in hidden if n in clear_key]
        raise ConfigError(
            f"table {policy.rules.table}: the log already holds {what} in clear"
            f"{' (a key: its clear values are the log keys)' if keys else ''}; hiding them "
            "now would leave the clear values in the log's history",
            f"remove the new rule, or rebuild the topic {topic}: capture into a new log "
            "(a new log.path, or a Kafka cluster without that topic) with `cdc bootstrap`, and "
            "rebuild the followers from it")


def check_key(schema: TableSchema, logged: Sequence[Mapping[str, Any]]) -> None:
    """Refuse ``schema`` when its key columns differ from those the log's newest schema version
    of the table was keyed by: records keyed the new way would never replace (or tombstone) the
    ones keyed the old way, and followers would keep both."""
    if not logged:
        return
    previous = list(logged[-1].get("cdc.key") or [])
    if previous and previous != list(schema.key):
        raise ConfigError(
            f"table {schema.table}: the log keys it by ({', '.join(previous)}), the source now "
            f"by ({', '.join(schema.key)}): new records would not replace the old ones",
            f"restore the key (the source's keys: setting, or the primary key), or rebuild the "
            f"topic {schema.topic}: capture into a new log (a new log.path, or a Kafka cluster "
            "without that topic) with `cdc bootstrap`, and rebuild the followers from it")

