"""The SQL follower (``kind: sql``, ``sinks/sql.py``; issue 14, in progress): PostgreSQL
captured, ``cdc apply`` into SQLite and into a second PostgreSQL database, ``cdc verify``
passes for both, the user's tables hold the live rows only (positions and delete markers in
the side table), and their columns are typed from the Avro schemas per dialect (the mapping in
``sinks/sql.py``'s docstring), through a column added and a column retyped upstream. The sink
contract suite runs on both dialects too (``tests/test_sink_contract.py``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cdc.avro import value_schema
from cdc.events import Column, TableId, TableSchema
from cdc.log.schemas import SchemaStore
from cdc.sink import Change, row_text
from cdc.types import ColumnType
from sinks.sql import SqlSink, SqlSinkError
from tests.pgkit import (
    Capture,
    Database,
    Load,
    cdc,
    new_database,
    output,
    wait_caught_up,
    write_config,
)
from tests.sparkkit import InProcessApply

#: every type of ``typed`` below, snapshot and stream, NaN/infinities, BC, arrays, JSON
TYPED = """
    CREATE TABLE typed (id int PRIMARY KEY, i2 int2, i8 int8, amount numeric(12,2), free numeric,
                        wide numeric(40,10), f8 float8, f4 real, d date, ts timestamp,
                        tstz timestamptz, t time, j jsonb, tags text[], nums int[], u uuid,
                        raw bytea, flag boolean);
    INSERT INTO typed VALUES
      (1, -32768, 9223372036854775807, 12.30, 'NaN', 123456789012345678901234567890.0123456789,
       'NaN', 3.14, 'infinity', '2020-02-29 12:00:00.5', '2020-01-01 12:00:00+02', '24:00:00',
       '{"b": 1, "a": [1, "x"]}', '{a,NULL,"c d"}', '{{1,2},{3,NULL}}',
       'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x0001ff', true),
      (2, 7, -1, -0.05, '-1.500', 0, 'Infinity', '-0', '0044-03-15 BC', '0044-03-15 12:00:00 BC',
       '-infinity', '00:00:00.000001', '[]', '{}', '{}', NULL, '', false),
      (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL);
"""
STREAMED = [
    "UPDATE typed SET f8 = '-Infinity', free = 'Infinity', d = '-infinity', ts = 'infinity', "
    "t = '23:59:59.999999', tags = '{{x,y},{NULL,z}}' WHERE id = 3",
    "INSERT INTO typed (id, f8, tstz, j, amount) VALUES (4, 1e300, '10000-01-01 00:00:00+00', "
    "'{\"k\": null}', 'NaN')",
    "ALTER TABLE typed ADD COLUMN extra numeric(5,1)",
    "UPDATE typed SET extra = 1234.5 WHERE id = 1",
    "ALTER TABLE typed ALTER COLUMN i2 TYPE text",
    "UPDATE typed SET i2 = 'now text' WHERE id = 2",
]
#: the PostgreSQL follower's columns of ``typed`` (information_schema: type, precision, scale)
PG_COLUMNS = {
    "id": ("integer", 32, 0), "i2": ("text", None, None), "i8": ("bigint", 64, 0),
    "amount": ("numeric", 12, 2), "free": ("numeric", None, None),
    "wide": ("numeric", 40, 10), "f8": ("double precision", 53, None),
    "f4": ("double precision", 53, None), "d": ("date", None, None),
    "ts": ("timestamp without time zone", None, None),
    "tstz": ("timestamp with time zone", None, None),
    "t": ("time without time zone", None, None), "j": ("json", None, None),
    "tags": ("json", None, None), "nums": ("json", None, None), "u": ("uuid", None, None),
    "raw": ("bytea", None, None), "flag": ("boolean", None, None),
    "extra": ("numeric", 5, 1),
}
#: the SQLite follower's declared types (the rest are TEXT)
SQLITE_TYPED = {"id": "BIGINT", "i8": "BIGINT", "raw": "BLOB", "flag": "BOOLEAN"}


def test_sql_followers_equal_the_leader_and_hold_live_rows_only(
        tmp_path: Path, pg_db: Database, pg_cluster: Any, spark: Any) -> None:
    pg_db.execute("""
        CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, amount numeric(12,2), note text,
                            updated timestamptz NOT NULL DEFAULT now());
        CREATE TABLE audit (seq bigserial PRIMARY KEY, id int NOT NULL, v int NOT NULL,
                            op text NOT NULL);
        INSERT INTO items (id, v, note) SELECT g, 1, 'snap' FROM generate_series(1, 300) g;
    """ + TYPED)
    target = new_database(pg_cluster)
    try:
        url = target.dsn().replace("postgresql://", "postgresql+psycopg://", 1)
        sqlite = tmp_path / "follower" / "db.sqlite"
        followers = (f"followers:\n  lite:\n    kind: sql\n    url: sqlite:///{sqlite}\n"
                     f"  report:\n    kind: sql\n    url: {url}\n")
        config = write_config(tmp_path, pg_db, ["public.items", "public.typed"],
                              extra=followers)
        assert cdc("bootstrap", "--config", str(config)).returncode == 0
        capture = Capture(config, tmp_path / "capture.log").start()
        apply = InProcessApply(config, tmp_path / "apply.log", "lite", "report")
        try:
            pg_db.execute("DELETE FROM items WHERE id <= 20")
            pg_db.execute("UPDATE items SET id = 1000 WHERE id = 50")  # a key change
            for statement in STREAMED:
                pg_db.execute(statement)
            load = Load(pg_db, threads=2).start()
            time.sleep(3)
            load.finish()
            wait_caught_up(pg_db, tmp_path / "log")
            for name in ("lite", "report"):  # verify waits for the follower to catch up
                verified = cdc("verify", "--config", str(config), "--follower", name,
                               "--timeout", "180s", timeout=300)
                assert verified.returncode == 0, output(verified)
                assert "follower equals the leader" in verified.stdout
        finally:
            apply_code = apply.terminate()
            capture_code = capture.terminate()
        assert apply_code == 0, (tmp_path / "apply.log").read_text() if apply.error else ""
        assert capture_code == 0
        live = pg_db.execute("SELECT count(*) FROM items")[0][0]
        for engine_url in (f"sqlite:///{sqlite}", url):
            engine = sa.create_engine(engine_url)
            try:
                with engine.connect() as conn:
                    assert conn.execute(sa.text("SELECT count(*) FROM items")).scalar() == live
                    columns = [c["name"] for c in sa.inspect(conn).get_columns("items")]
                    assert columns[:4] == ["id", "v", "amount", "note"]
                    assert not [c for c in columns if c.startswith("_cdc")]
                    deleted = conn.execute(sa.text(
                        "SELECT count(*) FROM _cdc_rows WHERE deleted")).scalar_one()
                    assert deleted >= 21  # 20 deletes and the moved key's old one
            finally:
                engine.dispose()
        assert_typed_columns(url, sqlite)
    finally:
        target.drop()


def assert_typed_columns(url: str, sqlite: Path) -> None:
    """The followers' ``typed`` columns have the stated types."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            held = {name: (kind, precision, scale) for name, kind, precision, scale in conn.execute(
                sa.text("SELECT column_name, data_type, numeric_precision, numeric_scale FROM "
                        "information_schema.columns WHERE table_name = 'typed'"))}
            assert held == PG_COLUMNS
            items = {name: kind for name, kind in conn.execute(sa.text(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = 'items'"))}
            assert items == {"id": "integer", "v": "integer", "amount": "numeric",
                             "note": "text", "updated": "timestamp with time zone"}
    finally:
        engine.dispose()
    engine = sa.create_engine(f"sqlite:///{sqlite}")
    try:
        with engine.connect() as conn:
            declared = {c["name"]: str(c["type"]) for c in sa.inspect(conn).get_columns("typed")}
        assert declared == {name: SQLITE_TYPED.get(name, "TEXT") for name in PG_COLUMNS}
    finally:
        engine.dispose()


# --------------------------------------------------------------- schemas without capture

TOPIC = "src.public.t"
TABLE = TableId("public", "t")


def schema_of(*columns: tuple[str, ColumnType]) -> dict[str, Any]:
    return value_schema(TableSchema("src", "db", TABLE, tuple(
        Column(name, kind, name != "id") for name, kind in columns), ("id",)))


def change(key: int, position: int, row: dict[str, Any]) -> Change:
    return Change(TOPIC, "src", "public.t", json.dumps({"id": key}, separators=(",", ":")),
                  position.to_bytes(4, "big"), row, "c")


@pytest.fixture(params=["sqlite", "postgres"])
def typed_sink(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlSink]:
    """A follower whose log's schema store is ``tmp_path / "log"``."""
    (tmp_path / "log").mkdir()
    database = None
    if request.param == "postgres":
        database = new_database(request.getfixturevalue("pg_cluster"))
        url = database.dsn().replace("postgresql://", "postgresql+psycopg://", 1)
    else:
        url = f"sqlite:///{tmp_path / 'follower.db'}"
    sink = SqlSink("db", url, tables={TOPIC: ("src", TABLE)})
    store = SchemaStore(tmp_path / "log")
    sink._schema_store = lambda: store  # type: ignore[method-assign]  # the log's own store
    try:
        yield sink
    finally:
        sink.close()
        if database is not None:
            database.drop()


def register(sink_dir: Path, schema: dict[str, Any]) -> None:
    SchemaStore(sink_dir / "log", writable=True).register(f"{TOPIC}-value", schema)


def test_other_values_and_schema_versions_read_back_exactly(typed_sink: SqlSink,
                                                       tmp_path: Path) -> None:
    """MySQL's unsigned 64-bit integers and TIMEs past 24 h, a decimal beyond PostgreSQL's
    precision, a column added and one retyped in a newer schema version."""
    register(tmp_path, schema_of(("id", ColumnType("int32")), ("u", ColumnType("uint64")),
                                 ("t", ColumnType("time")), ("y", ColumnType("year")),
                                 ("huge", ColumnType("decimal", 1200, 2)),
                                 ("f", ColumnType("float64")), ("n", ColumnType("int16"))))
    rows = {1: {"id": 1, "u": "18446744073709551615", "t": "12:00:00.000000", "y": 0,
                "huge": "9" * 1198 + ".99", "f": -0.0, "n": 5},
            2: {"id": 2, "u": "0", "t": "24:00:00.000000", "y": 2155, "f": "NaN", "n": -5}}
    typed_sink.apply([change(key, 1, row) for key, row in rows.items()])
    register(tmp_path, schema_of(("id", ColumnType("int32")), ("u", ColumnType("uint64")),
                                 ("t", ColumnType("time")), ("n", ColumnType("string")),
                                 ("added", ColumnType("decimal", 5, 1))))
    rows[3] = {"id": 3, "t": "-838:59:59.000000", "n": "words", "added": "1234.5"}
    typed_sink.apply([change(3, 2, rows[3])])
    keys = [json.dumps({"id": key}, separators=(",", ":")) for key in rows]
    assert typed_sink.read(TOPIC, keys) == {
        key: row_text(row) for key, row in zip(keys, rows.values(), strict=True)}
    with typed_sink.engine.connect() as conn:
        declared = {c["name"]: str(c["type"]) for c in sa.inspect(conn).get_columns("t")}
    postgres = typed_sink.engine.dialect.name == "postgresql"
    assert declared == ({"id": "INTEGER", "u": "NUMERIC(20, 0)", "t": "TEXT", "y": "INTEGER",
                         "huge": "NUMERIC", "f": "DOUBLE PRECISION", "n": "TEXT",
                         "added": "NUMERIC(5, 1)"} if postgres else
                        {"id": "BIGINT", "u": "TEXT", "t": "TEXT", "y": "BIGINT",
                         "huge": "TEXT", "f": "TEXT", "n": "TEXT", "added": "TEXT"})


def test_names_longer_than_the_dialect_keeps_are_refused(typed_sink: SqlSink,
                                                         tmp_path: Path) -> None:
    long = "c" * 70
    register(tmp_path, schema_of(("id", ColumnType("int32")), (long, ColumnType("string"))))
    if typed_sink.engine.dialect.name == "sqlite":  # SQLite keeps any length
        typed_sink.check()
        typed_sink.apply([change(1, 1, {"id": 1, long: "x"})])
        assert typed_sink.read(TOPIC, ['{"id":1}']) == {'{"id":1}': {"id": "1", long: "x"}}
        return
    with pytest.raises(SqlSinkError, match=f"column {long} of table t is 70 bytes long; "
                                           "postgresql keeps at most 63") as refused:
        typed_sink.check()
    assert "followers.db.tables" in str(refused.value)
    with pytest.raises(SqlSinkError, match="70 bytes long"):
        typed_sink.apply([change(1, 1, {"id": 1, long: "x"})])


def test_floats_without_a_schema_read_back_exactly(typed_sink: SqlSink) -> None:
    """A view's topic has no schema: its columns are typed from the values' logical kind by the
    same table as with a schema, and NaN, the infinities and negative numbers read back
    exactly (on SQLite a float column is TEXT, whose REAL cannot hold NaN or -0.0)."""
    rows: dict[int, dict[str, Any]] = {
        1: {"id": 1, "f": -1.5}, 2: {"id": 2, "f": "NaN"}, 3: {"id": 3, "f": "-Infinity"}}
    typed_sink.apply([change(key, 1, row) for key, row in rows.items()])
    postgres = typed_sink.engine.dialect.name == "postgresql"
    with typed_sink.engine.connect() as conn:
        assert str(sa.inspect(conn).get_columns("t")[1]["type"]) == (
            "DOUBLE PRECISION" if postgres else "TEXT")
    rows[4] = {"id": 4, "f": -0.0}
    typed_sink.apply([change(4, 2, rows[4])])
    keys = [json.dumps({"id": key}, separators=(",", ":")) for key in rows]
    assert typed_sink.read(TOPIC, keys) == {
        key: row_text(row) for key, row in zip(keys, rows.values(), strict=True)}
    with typed_sink.engine.connect() as conn:
        assert str(sa.inspect(conn).get_columns("t")[1]["type"]) == (
            "DOUBLE PRECISION" if postgres else "TEXT")


def test_a_views_null_group_is_written_read_and_deleted(typed_sink: SqlSink) -> None:
    """A view's topic (no schema) may have a key holding NULL (a NULL group on the leader): its
    table has a unique index on the key, not a primary key, and the row is written, replaced,
    read and deleted by ``IS NULL`` (``= NULL`` matches nothing)."""
    def grouped(region: str | None, position: int, n: int | None) -> Change:
        key = json.dumps({"region": region, "day": 1}, separators=(",", ":"))
        row = None if n is None else {"region": region, "day": 1, "n": n}
        return Change(TOPIC, "src", "views.v", key, position.to_bytes(4, "big"), row,
                      "d" if row is None else "u")

    null_key, north = '{"region":null,"day":1}', '{"region":"n","day":1}'
    typed_sink.apply([grouped(None, 1, 2), grouped("n", 1, 5)])
    typed_sink.apply([grouped(None, 2, 3)])  # replaced, not duplicated
    assert typed_sink.read(TOPIC, [null_key, north]) == {
        null_key: {"day": "1", "n": "3"}, north: {"region": "n", "day": "1", "n": "5"}}
    with typed_sink.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM t")).scalar() == 2
        indexes = sa.inspect(conn).get_indexes("t")
        assert [i["column_names"] for i in indexes if i["unique"]] == [["region", "day"]]
    typed_sink.apply([grouped(None, 3, None)])
    assert typed_sink.read(TOPIC, [null_key, north]) == {
        north: {"region": "n", "day": "1", "n": "5"}}
    assert sorted(typed_sink.keys(TOPIC)) == [north]


def test_a_batch_larger_than_one_gate_statement_is_gated_whole(typed_sink: SqlSink) -> None:
    """More changes in one batch than one statement's parameters would allow (PostgreSQL:
    65,535; SQLite: 32,766) if they were bound one by one: the gate binds the batch whole (as
    arrays, or one JSON array), and every key is written once."""
    count = 14_000
    typed_sink.apply([change(key, 2, {"id": key, "v": key}) for key in range(count)])
    older = typed_sink.apply([change(key, 1, {"id": key, "v": -1}) for key in range(count)])
    assert older.skipped == count and older.written == 0
    assert len(list(typed_sink.keys(TOPIC))) == count
    assert typed_sink.read(TOPIC, ['{"id":13999}']) == {'{"id":13999}': {"id": "13999",
                                                                         "v": "13999"}}


def test_a_side_table_created_by_another_writer_meanwhile_is_fine(tmp_path: Path) -> None:
    """Two writers opening one new SQLite follower at once: the other creates ``_cdc_rows``
    between this one's check and its create. Its create fails with "already exists" — and
    this writer must still create ``_cdc_watermarks`` (CI once saw "no such table" here)."""
    from sinks.sql import ROWS, WATERMARKS

    url = f"sqlite:///{tmp_path / 'follower.db'}"
    engine = sa.create_engine(url)
    sink = SqlSink("db", url)
    dialect = type(sink.engine.dialect)
    original = dialect.has_table

    def the_other_writer_right_after(self: Any, connection: Any, name: str, *args: Any,
                                     **kw: Any) -> bool:
        found = original(self, connection, name, *args, **kw)
        if name == ROWS and not found:  # checked: absent; the other creates it now
            with engine.begin() as other:
                other.execute(sa.text(f"CREATE TABLE {ROWS} (tbl TEXT, key TEXT)"))
        return found

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(dialect, "has_table", the_other_writer_right_after)
            sink.check()
        assert {ROWS, WATERMARKS} <= set(sa.inspect(engine).get_table_names())
    finally:
        sink.close()
        engine.dispose()
