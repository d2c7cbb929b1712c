"""Kafka Connect's JSON form of the log's records (cdc/connect.py): every type there and back
byte for byte, the stated decimal rules, and keys that depend on their values only."""

import base64
import datetime as dt
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


@pytest.mark.parametrize("times", ["adaptive", "adaptive_time_microseconds"])
def test_adaptive_times_are_milliseconds_where_the_column_declares_at_most_3_digits(
        store, times) -> None:
    """Debezium's ``time.precision.mode`` adaptive: the declared digits (ColumnType.precision)
    pick Timestamp/Time milliseconds or MicroTimestamp/MicroTime; reading back is exact."""
    stamp = dt.datetime(2024, 2, 29, 23, 59, 58, 123000)
    schema = schema_with(Column("ts3", ColumnType("timestamp", 3)),
                         Column("ts0", ColumnType("timestamp", 0)),
                         Column("ts6", ColumnType("timestamp")),
                         Column("ts5", ColumnType("timestamp", 5)),
                         Column("tinf", ColumnType("timestamp", 3)),
                         Column("t3", ColumnType("time", 3)), Column("t6", ColumnType("time")),
                         Column("tz", ColumnType("timestamptz")),
                         Column("arr", ColumnType("array", element=ColumnType("timestamp", 3))))
    row = {"id": 1, "ts3": stamp, "ts0": stamp.replace(microsecond=0),
           "ts6": stamp.replace(microsecond=123456), "ts5": stamp.replace(microsecond=123450),
           "tinf": "-infinity", "t3": dt.time(12, 30, 1, 250000),
           "t6": dt.time(12, 30, 1, 250001), "tz": stamp.replace(tzinfo=dt.UTC), "arr": [stamp]}
    value = EventCodec(store).records(_event(schema, row, Op.CREATE))[0].value
    as_json = ConnectJson(store, "precise", times).value(value)
    document = json.loads(as_json)
    after = {f["field"]: f for f in document["schema"]["fields"][1]["fields"]}
    names = {name: (field["type"], field.get("name")) for name, field in after.items()}
    millis = ("int64", "io.debezium.time.Timestamp")
    micros = ("int64", "io.debezium.time.MicroTimestamp")
    assert names["ts3"] == names["ts0"] == names["tinf"] == millis
    assert names["ts6"] == names["ts5"] == micros
    assert names["t6"] == ("int64", "io.debezium.time.MicroTime")
    assert names["t3"] == (("int32", "io.debezium.time.Time") if times == "adaptive"
                           else ("int64", "io.debezium.time.MicroTime"))
    assert names["tz"] == ("string", "io.debezium.time.ZonedTimestamp")
    assert after["arr"]["items"]["name"] == "io.debezium.time.MicroTimestamp"
    payload = document["payload"]["after"]
    epoch_ms = int(stamp.replace(tzinfo=dt.UTC).timestamp() * 1000)
    assert (payload["ts3"], payload["ts0"]) == (epoch_ms, epoch_ms - 123)
    assert payload["ts6"] == epoch_ms * 1000 + 456 and payload["tinf"] == -(2**63)
    assert payload["t3"] == (45_001_250 if times == "adaptive" else 45_001_250_000)
    assert document["schema"]["parameters"]["cdc.time.precision"] == times
    assert ConnectJson(store).to_avro(as_json) == value  # exact, and a reader needs no setting
    micro = json.loads(ConnectJson(store).value(value))  # micro: no parameter, as before
    assert "cdc.time.precision" not in micro["schema"]["parameters"]
    assert micro["payload"]["after"]["ts3"] == epoch_ms * 1000


def test_a_time_beyond_int32_milliseconds_stops_adaptive_with_the_fix(store) -> None:
    schema = schema_with(Column("t", ColumnType("time", 0)))
    long_ago = dt.timedelta(hours=-838, minutes=-59, seconds=-59)  # MySQL's TIME minimum
    value = EventCodec(store).records(_event(schema, {"id": 1, "t": long_ago}))[0].value
    with pytest.raises(EncodingError) as caught:
        ConnectJson(store, "precise", "adaptive").value(value)
    assert "-838:59:59" in caught.value.problem
    assert "adaptive_time_microseconds" in caught.value.fix
    kept = json.loads(ConnectJson(store, "precise", "adaptive_time_microseconds").value(value))
    assert kept["payload"]["after"]["t"] == -(838 * 3600 + 59 * 60 + 59) * 1_000_000


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
