"""Change events through Avro: every logical type, stated mappings, keys, tombstones, versions."""

import datetime as dt
import json
import uuid
from decimal import Decimal
from pathlib import Path

import fastavro
import pytest

from cdc.avro import EventCodec, value_schema
from cdc.errors import EncodingError, SchemaError
from cdc.events import (
    ChangeEvent,
    Column,
    Op,
    TableId,
    TableSchema,
    TransactionInfo,
    encode_key,
    split_topic,
    topic_name,
)
from cdc.log.schemas import SchemaStore
from cdc.position import Position
from cdc.types import INT32_MAX, INT64_MAX, INT64_MIN, ColumnType


def schema_with(*columns: Column, name: str = "things") -> TableSchema:
    return TableSchema("src", "db", TableId("public", name),
                       (Column("id", ColumnType("int64"), False), *columns), ("id",))


def roundtrip(codec: EventCodec, schema: TableSchema, row: dict) -> dict:
    event = ChangeEvent(schema, Op.CREATE, Position.test(1), 5, after=row)
    records = codec.records(event)
    assert len(records) == 1
    return codec.decode_value(records[0].value).envelope


@pytest.fixture
def codec(tmp_path: Path) -> EventCodec:
    return EventCodec(SchemaStore(tmp_path, writable=True))


ALL_TYPES = [
    ("b", ColumnType("boolean"), True, True),
    ("i16", ColumnType("int16"), -32768, -32768),
    ("i32", ColumnType("int32"), 2**31 - 1, 2**31 - 1),
    ("i64", ColumnType("int64"), -(2**63), -(2**63)),
    ("u64", ColumnType("uint64"), 2**64 - 1, "18446744073709551615"),
    ("f32", ColumnType("float32"), 1.5, 1.5),
    ("f64", ColumnType("float64"), float("-inf"), "-Infinity"),
    ("f64nan", ColumnType("float64"), float("nan"), "NaN"),
    ("dec", ColumnType("decimal", 38, 10), Decimal("1234567890123456789012345678.0123456789"),
     "1234567890123456789012345678.0123456789"),
    ("decnan", ColumnType("decimal", 10, 2), Decimal("NaN"), "NaN"),
    ("decinf", ColumnType("decimal", 10, 2), Decimal("-Infinity"), "-Infinity"),
    ("num", ColumnType("numeric"), Decimal("3.14159265358979323846264338327950288419716939"),
     "3.14159265358979323846264338327950288419716939"),
    ("numinf", ColumnType("numeric"), Decimal("Infinity"), "Infinity"),
    ("s", ColumnType("string"), "héllo \U0001F600 'x' \"y\"", "héllo \U0001F600 'x' \"y\""),
    ("by", ColumnType("bytes"), b"\x00\xff", "AP8="),
    ("js", ColumnType("json"), {"a": [1, None, "x"]}, '{"a":[1,null,"x"]}'),
    ("u", ColumnType("uuid"), uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
    ("e", ColumnType("enum", values=("a", "b")), "b", "b"),
    ("d", ColumnType("date"), dt.date(1, 1, 1), "0001-01-01"),
    ("dmax", ColumnType("date"), dt.date(9999, 12, 31), "9999-12-31"),
    ("dinf", ColumnType("date"), "infinity", "infinity"),
    ("t", ColumnType("time"), dt.time(23, 59, 59, 999999), "23:59:59.999999"),
    ("ts", ColumnType("timestamp"), dt.datetime(1, 1, 1), "0001-01-01T00:00:00.000000"),
    ("tsinf", ColumnType("timestamp"), "infinity", "infinity"),
    ("tsninf", ColumnType("timestamp"), "-infinity", "-infinity"),
    ("tz", ColumnType("timestamptz"),
     dt.datetime(2024, 2, 29, 12, 0, 0, 1, tzinfo=dt.timezone(dt.timedelta(hours=2))),
     "2024-02-29T10:00:00.000001Z"),
    ("tzinf", ColumnType("timestamptz"), "-infinity", "-infinity"),
    ("arr", ColumnType("array", element=ColumnType("int32")), [1, None, 3], [1, None, 3]),
    ("arr2", ColumnType("array", element=ColumnType("array", element=ColumnType("string"))),
     [["a", None], []], [["a", None], []]),
    ("nul", ColumnType("string"), None, None),
]


def test_every_type_round_trips_to_its_json_form(codec: EventCodec) -> None:
    schema = schema_with(*(Column(name, ctype) for name, ctype, _, _ in ALL_TYPES))
    row = {"id": 1, **{name: value for name, _, value, _ in ALL_TYPES}}
    after = roundtrip(codec, schema, row)["after"]
    for name, _, _, expected in ALL_TYPES:
        assert after[name] == expected, name


def test_stated_avro_mappings(codec: EventCodec) -> None:
    """uint64 as decimal(20,0), infinite timestamps as the int64 sentinels, plain numeric text."""
    schema = schema_with(Column("u", ColumnType("uint64")), Column("ts", ColumnType("timestamp")),
                         Column("d", ColumnType("date")), Column("n", ColumnType("numeric")))
    event = ChangeEvent(schema, Op.CREATE, Position.test(1), 5,
                        after={"id": 1, "u": 2**64 - 1, "ts": "infinity", "d": "infinity",
                               "n": Decimal("-0.000000000000000000000000000000000000000001")})
    value = codec.records(event)[0].value
    parsed = fastavro.parse_schema(value_schema(schema))
    import io
    raw = fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed, None)["after"]
    assert raw["u"] == Decimal(2**64 - 1)
    assert raw["ts"] == INT64_MAX
    assert raw["d"] == INT32_MAX
    assert raw["n"] == "-0.000000000000000000000000000000000000000001"
    event.after["ts"] = "-infinity"
    raw = fastavro.schemaless_reader(io.BytesIO(codec.records(event)[0].value[5:]), parsed, None)
    assert raw["after"]["ts"] == INT64_MIN


def test_envelope_has_debezium_fields(codec: EventCodec) -> None:
    schema = schema_with(Column("v", ColumnType("string")))
    event = ChangeEvent(schema, Op.UPDATE, Position.postgres(100, 2), 1_700_000_000_000,
                        before={"id": 1, "v": "old"}, after={"id": 1, "v": "new"},
                        source_info={"txId": 77, "lsn": 100, "xmin": None},
                        transaction=TransactionInfo("77:100", 3, 2))
    envelope = codec.decode_value(codec.records(event)[0].value).envelope
    assert set(envelope) >= {"before", "after", "op", "ts_ms", "source", "transaction"}
    assert envelope["op"] == "u"
    assert envelope["before"] == {"id": 1, "v": "old"}
    source = envelope["source"]
    for name in ("version", "connector", "name", "ts_ms", "snapshot", "db", "sequence", "schema",
                 "table", "txId", "lsn", "xmin"):
        assert name in source, name
    assert (source["connector"], source["name"], source["db"]) == ("postgresql", "src", "db")
    assert (source["schema"], source["table"], source["txId"]) == ("public", "things", 77)
    assert envelope["transaction"] == {"id": "77:100", "total_order": 3,
                                       "data_collection_order": 2}


def test_delete_is_followed_by_a_tombstone_with_the_same_key_and_position(codec) -> None:
    schema = schema_with(Column("v", ColumnType("string")))
    event = ChangeEvent(schema, Op.DELETE, Position.test(9), 5, before={"id": 4, "v": "x"})
    delete, tombstone = codec.records(event)
    assert tombstone.value is None
    assert tombstone.key == delete.key == b'{"id":4}'
    assert tombstone.position == delete.position == Position.test(9).to_bytes()


def test_key_bytes_depend_only_on_key_values(codec: EventCodec) -> None:
    v1 = schema_with(Column("v", ColumnType("string")))
    v2 = schema_with(Column("v", ColumnType("string")), Column("w", ColumnType("int32")))
    v3 = TableSchema("src", "db", TableId("public", "things"),
                     (Column("id", ColumnType("int32"), False),), ("id",))  # retyped key column
    keys = {encode_key(s, {"id": 12}) for s in (v1, v2, v3)}
    assert keys == {b'{"id":12}'}
    composite = TableSchema("src", "db", TableId("public", "t"),
                            (Column("a", ColumnType("string")), Column("b", ColumnType("decimal",
                                                                                        10, 2))),
                            ("b", "a"))
    assert encode_key(composite, {"b": Decimal("1.50"), "a": "x"}) == b'{"b":"1.50","a":"x"}'


def test_new_columns_make_a_new_schema_version(tmp_path: Path) -> None:
    store = SchemaStore(tmp_path, writable=True)
    codec = EventCodec(store)
    v1 = schema_with(Column("v", ColumnType("string")))
    v2 = schema_with(Column("v", ColumnType("string")), Column("w", ColumnType("int32")))
    first = codec.table(v1).schema_id
    second = codec.table(v2).schema_id
    assert first != second
    assert [s.version for s in store.versions(f"{v1.topic}-value")] == [1, 2]
    # old records stay readable with their own version
    old = codec.records(ChangeEvent(v1, Op.CREATE, Position.test(1), 1,
                                    after={"id": 1, "v": "a"}))[0].value
    new = codec.records(ChangeEvent(v2, Op.CREATE, Position.test(2), 1,
                                    after={"id": 1, "v": "a", "w": 5}))[0].value
    assert codec.decode_value(old).envelope["after"] == {"id": 1, "v": "a"}
    assert codec.decode_value(new).envelope["after"] == {"id": 1, "v": "a", "w": 5}
    # a restarted process finds the same ids, and a reader in another process resolves them
    again = EventCodec(SchemaStore(tmp_path, writable=True))
    assert again.table(v1).schema_id == first
    assert EventCodec(SchemaStore(tmp_path)).decode_value(new).schema_id == second


def test_torn_schema_line_is_ignored_and_cut(tmp_path: Path) -> None:
    store = SchemaStore(tmp_path, writable=True)
    store.register("a-value", {"type": "string"})
    with open(tmp_path / "schemas.jsonl", "ab") as handle:
        handle.write(b'{"id": 2, "subj')
    assert SchemaStore(tmp_path).subjects() == ["a-value"]
    writer = SchemaStore(tmp_path, writable=True)
    assert writer.register("b-value", {"type": "long"}).id == 2
    assert SchemaStore(tmp_path).subjects() == ["a-value", "b-value"]


def test_odd_column_names_keep_their_spelling(codec: EventCodec) -> None:
    schema = schema_with(Column('we"ird.Name here', ColumnType("string")),
                         Column("we_ird_Name_here", ColumnType("string")),
                         Column("1st", ColumnType("int32")))
    after = roundtrip(codec, schema, {"id": 1, 'we"ird.Name here': "a",
                                      "we_ird_Name_here": "b", "1st": 1})["after"]
    assert after == {"id": 1, 'we"ird.Name here': "a", "we_ird_Name_here": "b", "1st": 1}


def test_bad_values_get_clear_errors(codec: EventCodec) -> None:
    schema = schema_with(Column("amount", ColumnType("decimal", 5, 2)),
                         Column("n", ColumnType("int16")))
    with pytest.raises(EncodingError, match=r"public.things.amount.*float"):
        roundtrip(codec, schema, {"id": 1, "amount": 1.5})
    with pytest.raises(EncodingError, match="more than 2 fractional digits"):
        roundtrip(codec, schema, {"id": 1, "amount": Decimal("1.234")})
    with pytest.raises(EncodingError, match=r"public.things.n"):
        roundtrip(codec, schema, {"id": 1, "n": 40000})


def test_table_without_key_is_refused_with_a_fix() -> None:
    with pytest.raises(SchemaError, match="REPLICA IDENTITY|no primary key"):
        TableSchema("s", "d", TableId("public", "nokey"), (Column("a", ColumnType("int32")),), ())


def test_table_id_parsing() -> None:
    assert TableId.parse("public.orders") == TableId("public", "orders")
    assert TableId.parse('"My Schema"."a.b""c"') == TableId("My Schema", 'a.b"c')
    with pytest.raises(SchemaError):
        TableId.parse("orders")


def test_topic_names_read_back() -> None:
    table = TableId("public", "orders")
    assert split_topic(topic_name("shop", table)) == ("shop", table)
    assert split_topic("shop.public.a.b") == ("shop", TableId("public", "a.b"))
    for bad in ("shop", "shop.public", ".public.orders"):
        with pytest.raises(SchemaError, match="not a change log topic name"):
            split_topic(bad)


def test_dump_json_is_strict_json(codec: EventCodec) -> None:
    schema = schema_with(Column("f", ColumnType("float64")))
    for value, text in ((float("nan"), "NaN"), (float("inf"), "Infinity"),
                        (float("-inf"), "-Infinity"), (1.5, 1.5)):
        envelope = roundtrip(codec, schema, {"id": 1, "f": value})
        dumped = json.dumps(envelope, allow_nan=False)  # strict JSON: no bare NaN
        assert envelope["after"] == {"id": 1, "f": text}
        assert json.loads(dumped)["after"] == {"id": 1, "f": text}
