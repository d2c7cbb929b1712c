"""Kafka Connect's JSON form of the log's records (cdc/connect.py): every type there and back
byte for byte, the stated decimal rules, and keys that depend on their values only."""

import base64
import json
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from cdc.avro import EventCodec
from cdc.connect import KEY_PREFIX, VALUE_PREFIX, ConnectJson, canonical_key
from cdc.errors import EncodingError
from cdc.events import ChangeEvent, Column, Op, TableId, TableSchema, TransactionInfo
from cdc.log.schemas import SchemaStore
from cdc.position import Position
from cdc.types import ColumnType
from tests.test_codec import ALL_TYPES, schema_with


@pytest.fixture
def store(tmp_path: Path) -> SchemaStore:
    return SchemaStore(tmp_path, writable=True)


def _event(schema: TableSchema, row: dict, op: Op = Op.UPDATE) -> ChangeEvent:
    return ChangeEvent(schema, op, Position.postgres(100, 2), 1_700_000_000_000,
                       before=dict(row), after=dict(row), source_info={"txId": 7, "lsn": 100},
                       transaction=TransactionInfo("7:100", 3, 2))


def _every_type(skip: tuple[str, ...] = ()) -> tuple[TableSchema, dict]:
    kept = [t for t in ALL_TYPES if t[0] not in skip]
    schema = schema_with(*(Column(name, ctype) for name, ctype, _, _ in kept))
    return schema, {"id": 1, **{name: value for name, _, value, _ in kept}}


@pytest.mark.parametrize("mode", ["precise", "string"])
def test_every_value_goes_to_connect_json_and_back_byte_for_byte(store, mode) -> None:
    special = ("decnan", "decinf", "numinf") if mode == "precise" else ()
    schema, row = _every_type(skip=("arr2", *special))
    codec, connect = EventCodec(store), ConnectJson(store, mode)
    value = codec.records(_event(schema, row))[0].value
    as_json = connect.value(value)
    assert as_json is not None and as_json.startswith(VALUE_PREFIX)
    document = json.loads(as_json)
    assert set(document) == {"schema", "payload"}
    assert ConnectJson(store).to_avro(as_json) == value  # a reader needs no setting
    assert document["payload"]["op"] == "u"
    assert document["payload"]["source"]["table"] == "things"


def test_connect_forms_follow_debezium(store) -> None:
    schema = schema_with(Column("dec", ColumnType("decimal", 10, 2)),
                         Column("num", ColumnType("numeric")), Column("u64", ColumnType("uint64")),
                         Column("ts", ColumnType("timestamp")), Column("by", ColumnType("bytes")),
                         Column("i16", ColumnType("int16")), Column("f32", ColumnType("float32")))
    row = {"id": 5, "dec": Decimal("-12.50"), "num": Decimal("3.1400"), "u64": 2**64 - 1,
           "ts": "infinity", "by": b"\x00\xff", "i16": 7, "f32": 1.5}
    value = EventCodec(store).records(_event(schema, row, Op.CREATE))[0].value
    precise = json.loads(ConnectJson(store, "precise").value(value))
    fields = {f["field"]: f for f in precise["schema"]["fields"]}
    after = {f["field"]: f for f in fields["after"]["fields"]}
    assert after["dec"]["name"] == "org.apache.kafka.connect.data.Decimal"
    assert after["dec"]["parameters"] == {"scale": "2", "connect.decimal.precision": "10"}
    assert after["num"]["name"] == "io.debezium.data.VariableScaleDecimal"
    assert (after["ts"]["type"], after["ts"]["name"]) == ("int64",
                                                          "io.debezium.time.MicroTimestamp")
    assert (after["i16"]["type"], after["f32"]["type"], after["id"]["type"]) == (
        "int16", "float", "int64")
    assert after["id"]["optional"] is False and after["dec"]["optional"] is True
    payload = precise["payload"]["after"]
    assert int.from_bytes(base64.b64decode(payload["dec"]), "big", signed=True) == -1250
    assert payload["num"] == {"scale": 4, "value": base64.b64encode(b"\x7a\xa8").decode()}
    assert int.from_bytes(base64.b64decode(payload["u64"]), "big", signed=True) == 2**64 - 1
    assert payload["ts"] == 2**63 - 1 and payload["by"] == "AP8="
    as_text = json.loads(ConnectJson(store, "string").value(value))["payload"]["after"]
    assert (as_text["dec"], as_text["num"], as_text["u64"]) == (
        "-12.50", "3.1400", "18446744073709551615")


def test_nan_in_precise_mode_stops_with_the_fix(store) -> None:
    schema = schema_with(Column("dec", ColumnType("decimal", 10, 2)))
    value = EventCodec(store).records(_event(schema, {"id": 1, "dec": Decimal("NaN")}))[0].value
    with pytest.raises(EncodingError) as caught:
        ConnectJson(store, "precise").value(value)
    assert "NaN" in caught.value.problem and "decimal_handling: string" in caught.value.fix
    assert json.loads(ConnectJson(store, "string").value(value))["payload"]["after"]["dec"] == \
        "NaN"


def test_a_multidimensional_array_is_refused_with_the_fix(store) -> None:
    schema = schema_with(Column("a", ColumnType("array", element=ColumnType("int32"))))
    codec, connect = EventCodec(store), ConnectJson(store)
    flat = codec.records(_event(schema, {"id": 1, "a": [1, None, 3]}))[0].value
    assert json.loads(connect.value(flat))["payload"]["after"]["a"] == [1, None, 3]
    nested = codec.records(_event(schema, {"id": 1, "a": [[1, 2], [3, 4]]}))[0].value
    with pytest.raises(EncodingError, match="multidimensional"):
        connect.value(nested)


def test_keys_depend_on_their_values_only(store) -> None:
    def key_of(key_type: ColumnType, value: object) -> bytes:
        schema = TableSchema("src", "db", TableId("public", "k"),
                             (Column("id", key_type, False), Column("v", ColumnType("string"))),
                             ("id",))
        canonical = EventCodec(store).key_bytes(_event(schema, {"id": value, "v": "x"}))
        return ConnectJson(store).key("src.public.k", canonical)

    as_int, as_bigint = key_of(ColumnType("int32"), 7), key_of(ColumnType("int64"), 7)
    assert as_int == as_bigint and as_int.startswith(KEY_PREFIX)
    document = json.loads(as_int)
    assert document["schema"] == {"type": "struct", "optional": False, "name": "src.public.k.Key",
                                  "fields": [{"type": "int64", "optional": False,
                                              "field": "id"}]}
    assert document["payload"] == {"id": 7}
    assert canonical_key(as_int) == b'{"id":7}'
    text = key_of(ColumnType("uuid"), uuid.UUID(int=3))
    assert json.loads(text)["schema"]["fields"][0]["type"] == "string"
    assert canonical_key(text) == b'{"id":"00000000-0000-0000-0000-000000000003"}'
    assert key_of(ColumnType("decimal", 5, 1), Decimal("1.5")) == key_of(
        ColumnType("decimal", 9, 1), Decimal("1.5"))
    assert canonical_key(b'{"id":1}') == b'{"id":1}'  # the log's own form passes through
    assert ConnectJson(store).key("t", b"{}").startswith(KEY_PREFIX)  # a truncate's key


def test_a_delete_known_by_its_key_only_gets_a_key_only_before_image(store) -> None:
    """TRUNCATE's live keys (and rows gone during a lost slot) are logged as deletes without
    images; Kafka Connect sinks delete by the ``before`` image, so the JSON form gives them one
    with the key's columns, and reading it back gives the record as written."""
    schema = TableSchema("src", "db", TableId("public", "k"),
                         (Column("id", ColumnType("int64"), False),
                          Column("at", ColumnType("timestamp"), False),
                          Column("v", ColumnType("string"), False)), ("id", "at"))
    codec, connect = EventCodec(store), ConnectJson(store)
    value = codec.encode(ChangeEvent.removal(schema, Position.test(3), 1))
    key = b'{"id":4,"at":"2024-01-02T03:04:05.000006"}'
    as_key, as_json = connect.record("src.public.k", key, value)
    document = json.loads(as_json)
    assert document["payload"]["before"] == {"id": 4, "at": 1704164645000006, "v": None}  # µs
    before = next(f for f in document["schema"]["fields"] if f["field"] == "before")
    assert {f["field"]: f["optional"] for f in before["fields"]} == {
        "id": False, "at": False, "v": True}
    assert ConnectJson(store).to_avro(as_json) == value
    assert canonical_key(as_key) == key
