"""One logical kind per column (``cdc/logical.py``), whatever the follower: every column type
of ``types_all`` (``tests/test_pg_types.py``: each PostgreSQL type and an array of each; its
schema made here without a server, by the connector's own type mapping) and MySQL's own types
get one kind, and the Delta, SQL (PostgreSQL, SQLite) and DuckDB (views) followers type the
column by their table of that kind, through their own schema paths. Without a schema, the kind
guessed from the values is the same in every follower too: ``[1.0, "NaN"]`` is a float column
(NaN is how the JSON form spells a float NaN) in Delta and SQL alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdc.avro import value_schema
from cdc.events import Column, TableId, TableSchema, topic_name
from cdc.log.schemas import SchemaStore
from cdc.logical import Logical, LogicalKind, guess_kind, logical_columns
from cdc.sink import Change, row_text
from cdc.types import TYPE_NAMES, ColumnType

pytest.importorskip("deltalake")
pytest.importorskip("sqlalchemy")
pytest.importorskip("duckdb")

K = LogicalKind
SOURCE = "src"
TABLE = TableId("public", "types_all")
TOPIC = topic_name(SOURCE, TABLE)


def _typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


#: ``types_all``'s column types as (type OID, type modifier): pg_type.dat's stable OIDs, and
#: the test's own types in :data:`_CATALOG` as the connector's catalog query describes them
_PG_TYPES: dict[str, tuple[int, int]] = {
    "smallint": (21, -1), "integer": (23, -1), "bigint": (20, -1), "real": (700, -1),
    "double precision": (701, -1), "numeric": (1700, -1),
    "numeric(50,10)": (1700, _typmod(50, 10)), "numeric(10,2)": (1700, _typmod(10, 2)),
    "money": (790, -1), "boolean": (16, -1), "char(5)": (1042, 9), "varchar(20)": (1043, 24),
    "text": (25, -1), "bytea": (17, -1), "bit(1)": (1560, 1), "bit(10)": (1560, 10),
    "bit varying": (1562, -1), "mood": (90001, -1), "date": (1082, -1), "time": (1083, -1),
    "timetz": (1266, -1), "timestamp": (1114, -1), "timestamptz": (1184, -1),
    "interval": (1186, -1), "json": (114, -1), "jsonb": (3802, -1), "xml": (142, -1),
    "uuid": (2950, -1), "inet": (869, -1), "cidr": (650, -1), "macaddr": (829, -1),
    "point": (600, -1), "int4range": (3904, -1), "tstzrange": (3910, -1),
    "ltree": (90002, -1), "posint": (90003, -1), "price": (90004, -1),
}
_CATALOG: dict[int, dict[str, Any]] = {
    90001: {"kind": "enum", "name": "mood", "values": ["happy", "sad", "so-so 😐"]},
    90002: {"kind": "other", "name": "ltree"},
    90003: {"kind": "domain", "name": "posint", "base": 23, "base_modifier": -1},
    90004: {"kind": "domain", "name": "price", "base": 1700, "base_modifier": _typmod(8, 3)},
}
#: the logical kind of each ``types_all`` column (each ``a_<name>`` array column is JSON)
TYPES_ALL_KINDS: dict[str, Logical] = {
    "i2": Logical(K.INT16), "i4": Logical(K.INT32), "i8": Logical(K.INT64),
    "f4": Logical(K.FLOAT64), "f8": Logical(K.FLOAT64), "num": Logical(K.NUMERIC),
    "num_p": Logical(K.DECIMAL, 50, 10), "num_s": Logical(K.DECIMAL, 10, 2),
    "mon": Logical(K.DECIMAL, 19, 2), "bool": Logical(K.BOOLEAN), "ch": Logical(K.TEXT),
    "vc": Logical(K.TEXT), "t": Logical(K.TEXT), "ba": Logical(K.BYTES),
    "bit1": Logical(K.BOOLEAN), "bit10": Logical(K.TEXT), "vb": Logical(K.TEXT),
    "e": Logical(K.TEXT), "d": Logical(K.DATE), "tm": Logical(K.TIME), "ttz": Logical(K.TEXT),
    "ts": Logical(K.TIMESTAMP), "tstz": Logical(K.TIMESTAMPTZ), "iv": Logical(K.TEXT),
    "j": Logical(K.JSON), "jb": Logical(K.JSON), "x": Logical(K.TEXT), "u": Logical(K.UUID),
    "ip": Logical(K.TEXT), "net": Logical(K.TEXT), "mac": Logical(K.TEXT),
    "p": Logical(K.TEXT), "r": Logical(K.TEXT), "tr": Logical(K.TEXT), "lt": Logical(K.TEXT),
    "dpos": Logical(K.INT32), "dnum": Logical(K.DECIMAL, 8, 3),
}
#: MySQL's types that ``types_all`` lacks, and a decimal without a precision
OTHER_KINDS: dict[str, tuple[ColumnType, Logical]] = {
    "my_year": (ColumnType("year"), Logical(K.INT32)),
    "my_u64": (ColumnType("uint64"), Logical(K.DECIMAL, 20, 0)),
    "my_set": (ColumnType("enumset", values=("a", "b")), Logical(K.TEXT)),
    "my_dec": (ColumnType("decimal"), Logical(K.NUMERIC)),
}
#: logical kind -> (Delta, PostgreSQL, SQLite, DuckDB) column type; DECIMAL's depend on the
#: precision (:func:`_decimal_types`)
PHYSICAL: dict[LogicalKind, tuple[str, str, str, str]] = {
    K.BOOLEAN: ("bool", "BOOLEAN", "BOOLEAN", "BOOLEAN"),
    K.INT16: ("int64", "SMALLINT", "BIGINT", "BIGINT"),
    K.INT32: ("int64", "INTEGER", "BIGINT", "BIGINT"),
    K.INT64: ("int64", "BIGINT", "BIGINT", "BIGINT"),
    K.FLOAT64: ("float64", "DOUBLE PRECISION", "TEXT", "DOUBLE"),
    K.NUMERIC: ("string", "NUMERIC", "TEXT", "DOUBLE"),
    K.DATE: ("string", "DATE", "TEXT", "DATE"),
    K.TIME: ("string", "TIME WITHOUT TIME ZONE", "TEXT", "VARCHAR"),
    K.TIMESTAMP: ("string", "TIMESTAMP WITHOUT TIME ZONE", "TEXT", "TIMESTAMP"),
    K.TIMESTAMPTZ: ("string", "TIMESTAMP WITH TIME ZONE", "TEXT", "TIMESTAMPTZ"),
    K.UUID: ("string", "UUID", "TEXT", "VARCHAR"),
    K.JSON: ("string", "JSON", "TEXT", "VARCHAR"),
    K.BYTES: ("string", "BYTEA", "BLOB", "VARCHAR"),
    K.TEXT: ("string", "TEXT", "TEXT", "VARCHAR"),
}


def _decimal_types(logical: Logical) -> tuple[str, str, str, str]:
    precision, scale = logical.precision, logical.scale
    assert precision is not None and scale is not None
    return ("string", f"NUMERIC({precision}, {scale})", "TEXT",
            f"DECIMAL({precision},{scale})" if precision <= 38 else "DOUBLE")


def _physical(logical: Logical) -> tuple[str, str, str, str]:
    return _decimal_types(logical) if logical.kind is K.DECIMAL else PHYSICAL[logical.kind]


def types_all_schema() -> tuple[TableSchema, dict[str, Logical]]:
    """``types_all`` with the columns of :data:`OTHER_KINDS`, and each column's logical kind."""
    from connectors.postgres.types import pg_type
    from tests.test_pg_types import COLUMNS

    columns = [Column("id", ColumnType("int32"), False)]
    kinds = {"id": Logical(K.INT32)}
    for col in COLUMNS:
        ctype = pg_type(*_PG_TYPES[col.sql_type], _CATALOG).column_type
        columns += [Column(col.name, ctype), Column(f"a_{col.name}", ColumnType(
            "array", element=ctype, source_type=f"{ctype.source_type}[]"))]
        kinds.update({col.name: TYPES_ALL_KINDS[col.name], f"a_{col.name}": Logical(K.JSON)})
    for name, (ctype, logical) in OTHER_KINDS.items():
        columns.append(Column(name, ctype))
        kinds[name] = logical
    return TableSchema(SOURCE, "db", TABLE, tuple(columns), ("id",)), kinds


def test_every_column_type_has_one_logical_kind_in_every_follower(tmp_path: Path) -> None:
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql, sqlite

    from sinks.delta import DeltaSink
    from sinks.sql import SqlSink
    from views.sink import declared_columns

    schema, kinds = types_all_schema()
    covered = {c.type.name for c in schema.columns} | {
        c.type.element.name for c in schema.columns if c.type.element is not None}
    assert covered == set(TYPE_NAMES)  # a new column type needs its kind decided here
    (tmp_path / "log").mkdir()
    store = SchemaStore(tmp_path / "log", writable=True)
    store.register(f"{TOPIC}-value", value_schema(schema))
    assert logical_columns(store.versions(f"{TOPIC}-value")[-1].schema) == kinds

    delta = DeltaSink("wh", tmp_path / "wh", tables={})
    delta._schema_store = lambda: store  # type: ignore[method-assign]  # the log's own store
    delta_kinds, newest = delta.declared_columns(TOPIC)
    assert newest == list(kinds)
    sql = SqlSink("db", "sqlite://")
    sql._schema_store = lambda: store  # type: ignore[method-assign]
    by_dialect = {}
    for dialect in (postgresql.dialect(), sqlite.dialect()):
        declared, _ = sql._declared(TOPIC, dialect, ())
        by_dialect[dialect.name] = {
            name: str(sqltype.compile(dialect=dialect)) for name, sqltype in declared.items()}
    duckdb = dict(declared_columns(store, SOURCE, TABLE) or [])
    followers = {name: (delta_kinds[name], by_dialect["postgresql"][name],
                        by_dialect["sqlite"][name], duckdb[name]) for name in kinds}
    assert followers == {name: _physical(logical) for name, logical in kinds.items()}
    # the key columns' exception: a JSON key column is TEXT (PostgreSQL's JSON has no equality)
    keyed, _ = sql._declared(TOPIC, postgresql.dialect(), ("j",))
    assert isinstance(keyed["j"], sa.Text) and not isinstance(keyed["j"], sa.JSON)


#: values of a column without a schema -> their logical kind
GUESSES: list[tuple[list[Any], LogicalKind]] = [
    ([True, None, False], K.BOOLEAN),
    ([1, None, -(2**63), 2**63 - 1], K.INT64),
    ([0.5, -1e300, None], K.FLOAT64),
    ([1.0, "NaN"], K.FLOAT64),
    (["Infinity", -0.5, "-Infinity", "NaN"], K.FLOAT64),
    (["NaN"], K.TEXT),  # no float at all: a text column that holds "NaN"
    ([1.0, "nan"], K.TEXT),
    ([1, 0.5], K.TEXT),
    ([True, 1], K.TEXT),
    ([2**63], K.TEXT),
    ([None], K.TEXT),
    ([[1], {"a": 1}], K.TEXT),
    (["x", None], K.TEXT),
]


def test_guessed_kinds_are_one_in_every_follower(tmp_path: Path) -> None:
    """Each case is a column of one batch without a schema: the Delta and SQLite followers
    create the column of the guessed kind, and read every value back exactly."""
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql

    from sinks.delta import DeltaSink, kind_of_arrow
    from sinks.sql import SqlSink, _mapped_type
    from views.types import duckdb_type

    assert [guess_kind(values) for values, _ in GUESSES] == [kind for _, kind in GUESSES]
    height = max(len(values) for values, _ in GUESSES)
    rows = [{"id": index, **{f"c{case}": values[index] for case, (values, _) in
                             enumerate(GUESSES) if index < len(values)}}
            for index in range(height)]
    keys = [json.dumps({"id": row["id"]}, separators=(",", ":")) for row in rows]
    changes = [Change(TOPIC, SOURCE, str(TABLE), key, (index + 1).to_bytes(4, "big"), row, "c")
               for index, (key, row) in enumerate(zip(keys, rows, strict=True))]
    expected = {key: row_text(row) for key, row in zip(keys, rows, strict=True)}

    delta = DeltaSink("wh", tmp_path / "wh", tables={})
    delta.apply(changes)
    assert delta.read(TOPIC, keys) == expected
    arrow = delta.history(TOPIC).schema
    sql = SqlSink("db", f"sqlite:///{tmp_path / 'db.sqlite'}", tables={TOPIC: (SOURCE, TABLE)})
    sql.apply(changes)
    assert sql.read(TOPIC, keys) == expected
    with sql.engine.connect() as conn:
        sqlite_types = {column["name"]: str(column["type"])
                        for column in sa.inspect(conn).get_columns(TABLE.table)}
    sql.close()
    for case, (_, kind) in enumerate(GUESSES):
        name = f"c{case}"
        delta_type, postgres_type, sqlite_type, duckdb = _physical(Logical(kind))
        assert kind_of_arrow(arrow.field(name).type) == delta_type, name
        assert sqlite_types[name] == sqlite_type, name
        guessed_pg = _mapped_type(Logical(kind), True, False)  # as sinks/sql.py's plan does
        assert str(guessed_pg.compile(dialect=postgresql.dialect())) == postgres_type
        assert duckdb_type(Logical(kind)) == duckdb
