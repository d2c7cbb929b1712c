"""connectors/mysql/types.py without a server: the mapping, the converters of both paths (raw
binlog byte vectors below were taken from MariaDB 10.11's binlog), and the new logical types."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest

from cdc.errors import CdcError
from cdc.types import ColumnType
from connectors.mysql.types import (
    MyColumn,
    avro_optional,
    binlog_converter,
    column_from_info_schema,
    column_type,
    columns_from_table_map,
    inet6_text,
    mariadb_json_columns,
    mysql_json_text,
    prepare_table_map,
    refine,
    snapshot_converter,
    snapshot_expression,
)


def col(data_type: str, **kw: Any) -> MyColumn:
    return MyColumn(name=kw.pop("name", "c"), data_type=data_type, **kw)


def bits_of(hex_bytes: str) -> str:
    """The bit string pymysqlreplication gives for a raw column read as BIT."""
    raw = bytes.fromhex(hex_bytes)
    return "".join(format(byte, "08b") for byte in raw)


def json_of(column: MyColumn, value: Any, path: str = "binlog") -> Any:
    """to_json(to_avro(converted value)) through one path's converter."""
    convert = (binlog_converter if path == "binlog" else snapshot_converter)(column)
    if convert is not None:
        value = convert(value)
    if value is None:
        return None
    ctype = column_type(column)
    return ctype.to_json(ctype.to_avro(value))


# ---------------------------------------------------------------------------- the mapping

@pytest.mark.parametrize(("column", "name", "params"), [
    (col("tinyint"), "int16", {}),
    (col("tinyint", unsigned=True), "int16", {}),
    (col("tinyint", column_type="tinyint(1)"), "int16", {}),
    (col("smallint"), "int16", {}),
    (col("smallint", unsigned=True), "int32", {}),
    (col("mediumint"), "int32", {}),
    (col("mediumint", unsigned=True), "int32", {}),
    (col("int"), "int32", {}),
    (col("int", unsigned=True), "int64", {}),
    (col("bigint"), "int64", {}),
    (col("bigint", unsigned=True), "uint64", {}),
    (col("decimal", precision=65, scale=30), "decimal", {"precision": 65, "scale": 30}),
    (col("decimal", precision=10, scale=0), "decimal", {"precision": 10, "scale": 0}),
    (col("float"), "float32", {}),
    (col("double"), "float64", {}),
    (col("bit", precision=1), "boolean", {}),
    (col("bit", precision=10), "bits", {"precision": 10}),
    (col("bit", precision=64), "bits", {"precision": 64}),
    (col("char", charset="latin1"), "string", {}),
    (col("varchar"), "string", {}),
    (col("text"), "string", {}),
    (col("longtext"), "string", {}),
    (col("binary", precision=4), "bytes", {}),
    (col("varbinary"), "bytes", {}),
    (col("blob"), "bytes", {}),
    (col("enum", values=("a", "b")), "enum", {"values": ("a", "b")}),
    (col("set", values=("a", "b")), "enumset", {"values": ("a", "b")}),
    (col("json"), "json", {}),
    (col("date"), "date", {}),
    (col("datetime", scale=0), "timestamp", {"precision": 0}),  # the digits adaptive reads
    (col("datetime", scale=3), "timestamp", {"precision": 3}),
    (col("datetime", scale=6), "timestamp", {"precision": None}),
    (col("timestamp", scale=3), "timestamptz", {"precision": None}),
    (col("time", scale=6), "time", {"precision": None}),
    (col("time", scale=2), "time", {"precision": 2}),
    (col("year"), "year", {}),
    (col("uuid"), "uuid", {}),
    (col("inet6"), "string", {}),
])
def test_mapping(column: MyColumn, name: str, params: dict[str, Any]) -> None:
    ctype = column_type(column)
    assert ctype.name == name
    for key, value in params.items():
        assert getattr(ctype, key) == value


def test_source_type_is_the_column_type() -> None:
    assert column_type(col("int", column_type="int(10) unsigned", unsigned=True)).source_type \
        == "int(10) unsigned"


@pytest.mark.parametrize("kind", ["point", "geometry", "polygon", "multipolygon",
                                  "geometrycollection", "linestring"])
def test_spatial_types_are_refused(kind: str) -> None:
    with pytest.raises(CdcError) as caught:
        column_type(MyColumn("shape", kind, column_type=kind, table="shop.places"))
    text = str(caught.value)
    assert "shop.places.shape" in text and kind in text and "unsupported type" in text
    assert "exclude the table" in caught.value.fix  # type: ignore[operator]


def test_unknown_type_is_refused() -> None:
    with pytest.raises(CdcError, match="shop.t.v.*vector"):
        column_type(MyColumn("v", "vector", table="shop.t"))


def test_avro_optional() -> None:
    assert avro_optional(col("int"))
    assert not avro_optional(col("int", nullable=False))
    assert avro_optional(col("date", nullable=False))  # zero dates become null
    assert avro_optional(col("timestamp", nullable=False))


def test_snapshot_expression() -> None:
    assert snapshot_expression(col("float", name="f")) == "CAST(`f` AS DOUBLE)"
    assert snapshot_expression(col("int", name="we`ird col.name")) == "`we``ird col.name`"


# ------------------------------------------------------------------ numbers, both paths

@pytest.mark.parametrize(("column", "value", "shown"), [
    (col("tinyint", unsigned=True), 255, 255),
    (col("tinyint"), -128, -128),
    (col("smallint", unsigned=True), 65535, 65535),
    (col("mediumint", unsigned=True), 16777215, 16777215),
    (col("int", unsigned=True), 4294967295, 4294967295),
    (col("int"), -2147483648, -2147483648),
    (col("bigint"), -9223372036854775808, -9223372036854775808),
    (col("bigint", unsigned=True), 18446744073709551615, "18446744073709551615"),
    (col("bigint", unsigned=True), 0, "0"),
    (col("decimal", precision=65, scale=30),
     Decimal("-99999999999999999999999999999999999.999999999999999999999999999999"),
     "-99999999999999999999999999999999999.999999999999999999999999999999"),
    (col("decimal", precision=5, scale=2), Decimal("0.5"), "0.50"),
    (col("double"), 0.30000000000000004, 0.30000000000000004),
    (col("float"), 3.1415927410125732, 3.1415927410125732),
])
def test_numbers(column: MyColumn, value: Any, shown: Any) -> None:
    assert json_of(column, value, "snapshot") == shown
    assert json_of(column, value, "binlog") == shown


def test_year() -> None:
    year = col("year")
    assert column_type(year).avro() == {"type": "int", "connect.name": "io.debezium.time.Year"}
    assert json_of(year, 2155) == 2155
    assert json_of(year, 1900) == 0  # pymysqlreplication: YEAR 0000 is 1900 + 0
    assert json_of(year, 0, "snapshot") == 0


# ------------------------------------------------------------------------------ bits

def test_bits() -> None:
    one, ten, wide = col("bit", precision=1), col("bit", precision=10), col("bit", precision=64)
    assert json_of(one, b"\x01", "snapshot") is True
    assert json_of(one, b"\x00", "snapshot") is False
    assert json_of(one, "1") is True and json_of(one, "0") is False
    assert json_of(ten, b"\x02\x01", "snapshot") == "1000000001"
    assert json_of(ten, "1000000001") == "1000000001"
    ctype = column_type(ten)
    assert ctype.to_avro("1000000001") == b"\x01\x02"  # Debezium's little-endian Bits
    assert json_of(wide, b"\xff" * 7 + b"\xfe", "snapshot") == "1" * 63 + "0"
    assert json_of(wide, "1" * 63 + "0") == "1" * 63 + "0"


# ------------------------------------------------------------------------ text, bytes

def test_latin1_from_raw_binlog_bytes() -> None:
    latin1 = col("text", charset="latin1")
    assert json_of(latin1, b"caf\xe9 \x80\x81\x8d\x8f\x90\x9d") == "café €\x81\x8d\x8f\x90\x9d"
    assert json_of(latin1, "café") == "café"  # pymysqlreplication's own cp1252 text
    assert json_of(latin1, "") == ""


def test_utf8mb4_and_char_padding() -> None:
    assert json_of(col("varchar", charset="utf8mb4"), "😀".encode()) == "😀"
    assert json_of(col("char", charset="utf8mb4"), b"ab  ") == "ab"
    assert json_of(col("char", charset="utf8mb4"), "ab", "snapshot") == "ab"


def test_unknown_charset_is_refused() -> None:
    with pytest.raises(CdcError, match="t.c.*swe7"):
        binlog_converter(MyColumn("c", "varchar", charset="swe7", table="t"))


def test_binary_padding() -> None:
    binary = col("binary", precision=4)
    assert json_of(binary, b"ab") == "YWIAAA=="  # the binlog drops trailing zero bytes
    assert json_of(binary, "") == "AAAAAA=="  # pymysqlreplication: all-zero -> ''
    assert json_of(binary, b"ab\0\0", "snapshot") == "YWIAAA=="
    assert json_of(col("varbinary"), "") == ""
    assert json_of(col("blob"), b"\xde\xad") == "3q0="


def test_enum_and_set() -> None:
    enum = col("enum", values=("x", "y z", "é"))
    assert column_type(enum).avro()["cdc.values"] == ["x", "y z", "é"]
    assert json_of(enum, "é") == "é"
    members = col("set", values=("a", "b", "c"))
    assert column_type(members).avro() == {
        "type": "string", "connect.name": "io.debezium.data.EnumSet",
        "cdc.values": ["a", "b", "c"]}
    assert json_of(members, "a,c", "snapshot") == "a,c"
    assert json_of(members, "", "snapshot") == ""
    assert json_of(members, {"c", "a"}) == "a,c"  # pymysqlreplication's set
    assert json_of(members, bits_of("05")) == "a,c"  # raw bitmask (prepare_table_map)
    assert json_of(members, bits_of("00")) == ""
    with pytest.raises(CdcError):
        column_type(members).to_avro({"z"})


# ------------------------------------------------------------------------------ times

@pytest.mark.parametrize(("fsp", "raw", "shown"), [
    (6, "7fffffffd8f0", "-00:00:00.010000"),
    (5, "7fffffffd8f0", "-00:00:00.010000"),
    (4, "7fffffff9c", "-00:00:00.010000"),
    (2, "7fffffff", "-00:00:00.010000"),
    (1, "7fffffce", "-00:00:00.500000"),
    (6, "7fffbff85ee0", "-00:01:00.500000"),
    (4, "7fffbbec78", "-00:01:04.500000"),
    (0, "7fffbc", "-00:01:04.000000"),
    (6, "7fefffffffff", "-01:00:00.000001"),
    (6, "4b9105000000", "-838:59:59.000000"),
    (5, "4b9105f0bdca", "-838:59:58.999990"),
    (6, "7f3747f3f5ec", "-12:34:56.789012"),
    (6, "81900007a120", "25:00:00.500000"),
    (6, "800000000001", "00:00:00.000001"),
    (0, "800000", "00:00:00.000000"),
])
def test_raw_time(fsp: int, raw: str, shown: str) -> None:
    assert json_of(col("time", scale=fsp), bits_of(raw)) == shown


def test_time_from_snapshot_and_pymysqlreplication() -> None:
    time = col("time", scale=6)
    assert json_of(time, dt.timedelta(days=-35, seconds=3601), "snapshot") == "-838:59:59.000000"
    assert json_of(time, dt.timedelta(hours=25, microseconds=500000)) == "25:00:00.500000"


def test_dates() -> None:
    date = col("date")
    assert json_of(date, dt.date(2024, 2, 29), "snapshot") == "2024-02-29"
    for zero in ("0000-00-00", "2020-00-15", "2020-01-00"):
        assert json_of(date, zero, "snapshot") is None
    assert json_of(date, "0000-01-01", "snapshot") == "0000-01-01"  # year 0 is a real date
    # raw DATE: 3 bytes little-endian, day 5 bits, month 4, year 15
    raw = (2024 << 9 | 2 << 5 | 29).to_bytes(3, "little").hex()
    assert json_of(date, bits_of(raw)) == "2024-02-29"
    assert json_of(date, bits_of("000000")) is None
    assert json_of(date, bits_of((1 << 5 | 1).to_bytes(3, "little").hex())) == "0000-01-01"
    assert json_of(date, bits_of((2020 << 9 | 15).to_bytes(3, "little").hex())) is None
    assert json_of(date, None) is None


def _datetime2(year: int, month: int, day: int, hour: int, minute: int, second: int,
               fraction: bytes = b"") -> str:
    packed = (1 << 39 | (year * 13 + month) << 22 | day << 17 | hour << 12 | minute << 6
              | second)
    return bits_of(packed.to_bytes(5, "big").hex() + fraction.hex())


def test_datetimes() -> None:
    micro = col("datetime", scale=6)
    assert json_of(micro, dt.datetime(1000, 1, 1, 0, 0, 0, 1), "snapshot") \
        == "1000-01-01T00:00:00.000001"
    assert json_of(micro, _datetime2(1000, 1, 1, 0, 0, 0, b"\0\0\1")) \
        == "1000-01-01T00:00:00.000001"
    assert json_of(micro, _datetime2(9999, 12, 31, 23, 59, 59, (999999).to_bytes(3, "big"))) \
        == "9999-12-31T23:59:59.999999"
    two = col("datetime", scale=2)
    assert json_of(two, _datetime2(2020, 1, 2, 3, 4, 5, bytes([50]))) \
        == "2020-01-02T03:04:05.500000"
    plain = col("datetime", scale=0)
    assert json_of(plain, "0000-00-00 00:00:00", "snapshot") is None
    assert json_of(plain, _datetime2(0, 0, 0, 0, 0, 0)) is None
    assert json_of(plain, "2020-00-00 10:00:00", "snapshot") is None
    assert json_of(plain, "0000-01-01 00:00:00", "snapshot") == "0000-01-01T00:00:00.000000"
    assert json_of(plain, _datetime2(0, 1, 1, 0, 0, 0)) == "0000-01-01T00:00:00.000000"
    assert json_of(plain, dt.datetime(2024, 2, 29, 23, 59, 59)) == "2024-02-29T23:59:59.000000"


def test_timestamps() -> None:
    stamp = col("timestamp", scale=6)
    assert json_of(stamp, dt.datetime(2038, 1, 19, 3, 14, 7, 999999), "snapshot") \
        == "2038-01-19T03:14:07.999999Z"
    raw = (2**31 - 1).to_bytes(4, "big").hex() + (999999).to_bytes(3, "big").hex()
    assert json_of(stamp, bits_of(raw)) == "2038-01-19T03:14:07.999999Z"
    assert json_of(stamp, bits_of("00000000000000")) is None  # the zero TIMESTAMP
    assert json_of(stamp, "0000-00-00 00:00:00.000000", "snapshot") is None
    # pymysqlreplication's own value: a naive UTC datetime, 0 for the zero TIMESTAMP
    assert json_of(stamp, dt.datetime(1970, 1, 1, 0, 0, 1)) == "1970-01-01T00:00:01.000000Z"
    assert json_of(stamp, dt.datetime(1970, 1, 1)) is None


# ------------------------------------------------------------------------ uuid, inet6

def test_uuid() -> None:
    column = col("uuid")
    assert json_of(column, "6CCD780C-BABA-1026-9564-5B8C656024DB", "snapshot") \
        == "6ccd780c-baba-1026-9564-5b8c656024db"
    assert json_of(column, bytes.fromhex("6ccd780cbaba102695645b8c656024db")) \
        == "6ccd780c-baba-1026-9564-5b8c656024db"
    assert json_of(column, bytes.fromhex("ffffffffeeee4ddd8cccbbbbbbbb")) \
        == "ffffffff-eeee-4ddd-8ccc-bbbbbbbb0000"  # trailing zero bytes dropped in the binlog


@pytest.mark.parametrize(("hex_bytes", "text"), [
    ("", "::"),
    ("00000000000000000000000000000001", "::1"),
    ("00000000000000000000000001020304", "::1.2.3.4"),
    ("00000000000000000000ffff01020304", "::ffff:1.2.3.4"),
    ("00010000000200030004000500060007", "1::2:3:4:5:6:7"),
    ("00010000000000020000000000000003", "1:0:0:2::3"),
    ("fe800000000000000000000000000001", "fe80::1"),
    ("20010db8000000000000ff0000428329", "2001:db8::ff00:42:8329"),
    ("00000000000000000000ffff00000001", "::ffff:0.0.0.1"),
    ("0000000000000000000000000001", "::0.1.0.0"),
    ("00000000000000000000fffe01020304", "::fffe:102:304"),
    ("0001", "1::"),
])
def test_inet6(hex_bytes: str, text: str) -> None:
    column = col("inet6")
    assert json_of(column, bytes.fromhex(hex_bytes)) == text
    assert json_of(column, text, "snapshot") == text
    assert inet6_text(bytes.fromhex(hex_bytes).ljust(16, b"\0")) == text


# ------------------------------------------------------------------------------- json

def test_json() -> None:
    mariadb = col("json", charset="utf8mb4")
    assert json_of(mariadb, b'{"b": 1,  "a":[1,2.50]}') == '{"b": 1,  "a":[1,2.50]}'
    assert json_of(mariadb, '{"a": 1}', "snapshot") == '{"a": 1}'
    mysql = col("json")  # MySQL 8's binary JSON (no charset in the table map)
    parsed = {b"a": [1, 2.5, None, True, b"\xc3\xa9\n"], b"bb": {b"x": Decimal("1.50")}}
    assert json_of(mysql, parsed) == '{"a": [1, 2.5, null, true, "é\\n"], "bb": {"x": 1.50}}'
    assert mysql_json_text(1e300) == "1e300"
    assert mysql_json_text(b"top") == '"top"'
    assert mysql_json_text([]) == "[]"


def test_mariadb_json_columns() -> None:
    assert mariadb_json_columns(["json_valid(`j`)", "`x` > 0", "json_valid(`we``ird`)"]) \
        == {"j", "we`ird"}


# --------------------------------------------------------------- information_schema, maps

def test_column_from_info_schema() -> None:
    row: tuple[Any, ...] = ("s", "set", "set('a','it''s')", None, None, None, 6, "utf8mb4", "",
                            "YES", "")
    column = column_from_info_schema(row, "db.t")
    assert column.values == ("a", "it's") and column.nullable and column.table == "db.t"
    row = ("j", "longtext", "longtext", None, None, None, 4294967295, "utf8mb4", "", "YES", "")
    assert column_from_info_schema(row, json_columns={"j"}).data_type == "json"
    row = ("g", "int", "int(11)", 10, 0, None, None, None, "VIRTUAL GENERATED", "YES", "")
    assert column_from_info_schema(row).generated == "VIRTUAL"
    row = ("id", "bigint", "bigint(20) unsigned", 20, 0, None, None, None, "", "NO", "PRI")
    column = column_from_info_schema(row)
    assert column.unsigned and column.primary_key and not column.nullable
    assert column_type(column).name == "uint64"
    row = ("t", "time", "time(6)", None, None, 6, None, None, "", "YES", "")
    assert column_from_info_schema(row).scale == 6
    row = ("b", "binary", "binary(4)", None, None, None, 4, None, "", "YES", "")
    assert column_from_info_schema(row).precision == 4


def _pycol(type_code: int, name: str, **kw: Any) -> SimpleNamespace:
    base = {"type": type_code, "name": name, "unsigned": False, "is_primary": False,
            "character_set_name": None, "collation_name": None, "enum_values": None,
            "set_values": None}
    return SimpleNamespace(**(base | kw))


def _table_map() -> SimpleNamespace:
    columns = [
        _pycol(3, "id", is_primary=True),
        _pycol(254, "u", character_set_name="binary", collation_name="binary",
               max_length=16),
        _pycol(252, "j", character_set_name="utf8", collation_name="utf8mb4_bin",
               length_size=4),
        _pycol(15, "l", character_set_name="cp1252", collation_name="latin1_swedish_ci",
               max_length=10),
        _pycol(19, "t", fsp=6),
        _pycol(248, "s", character_set_name="utf8", collation_name="utf8mb4_general_ci",
               set_values=["a", "b"], size=1),
        _pycol(247, "e", character_set_name="utf8", collation_name="utf8mb4_general_ci",
               enum_values=["", "x"], size=1),
        _pycol(8, "ub", unsigned=True),
        _pycol(246, "de", precision=65, decimals=30),
        _pycol(16, "bt", bits=10, bytes=2),
    ]
    return SimpleNamespace(schema="db", table="t", columns=columns,
                           null_bitmask=bytes([0b11111110, 0b11]))


def test_columns_from_table_map() -> None:
    columns = {c.name: c for c in columns_from_table_map(_table_map())}
    assert columns["id"].primary_key and not columns["id"].nullable
    assert (columns["u"].data_type, columns["u"].precision, columns["u"].charset) \
        == ("binary", 16, "binary")
    assert (columns["j"].data_type, columns["j"].charset) == ("longtext", "utf8mb4")
    assert (columns["l"].data_type, columns["l"].charset) == ("varchar", "latin1")
    assert (columns["t"].data_type, columns["t"].scale) == ("time", 6)
    assert columns["s"].values == ("a", "b") and columns["e"].values == ("x",)
    assert columns["ub"].unsigned and column_type(columns["ub"]).name == "uint64"
    assert (columns["de"].precision, columns["de"].scale) == (65, 30)
    assert columns["bt"].precision == 10 and columns["bt"].nullable
    assert columns["id"].table == "db.t"


def test_prepare_table_map_reads_raw_and_keeps_the_description() -> None:
    event = _table_map()
    first = prepare_table_map(event)
    by_name = {c.name: c for c in event.columns}
    assert (by_name["t"].type, by_name["t"].bits, by_name["t"].bytes) == (16, 48, 6)
    assert (by_name["s"].type, by_name["s"].bytes) == (16, 1)
    assert by_name["l"].character_set_name == "binary"
    assert by_name["u"].character_set_name == "binary"  # binary columns untouched
    assert by_name["j"].character_set_name == "binary"
    assert prepare_table_map(event) == first == columns_from_table_map(event)


def test_refine() -> None:
    binlog = columns_from_table_map(_table_map())
    info = [MyColumn("id", "int", primary_key=True, nullable=False),
            MyColumn("u", "uuid", column_type="uuid"),
            MyColumn("j", "json", charset="utf8mb4"),
            MyColumn("l", "varchar", charset="latin1", precision=10),
            MyColumn("t", "time", scale=6), MyColumn("s", "set", values=("a", "b")),
            MyColumn("e", "enum", values=("x",)),
            MyColumn("ub", "bigint", unsigned=True), MyColumn("renamed", "decimal")]
    refined = refine(binlog, info)
    assert [c.data_type for c in refined][:3] == ["int", "uuid", "json"]
    assert refined[0].primary_key
    assert refined[8] == binlog[8]  # the name differs: the binlog's description stays
    assert refined[9] == binlog[9]  # information_schema has no 10th column
    mismatch = refine(binlog, [MyColumn("id", "varchar")])
    assert mismatch[0] == binlog[0]


# --------------------------------------------------------------------- new logical types

def test_enumset_codec() -> None:
    ctype = ColumnType("enumset", values=("a", "b", "c"))
    assert ctype.to_avro(("c", "a")) == "a,c"
    assert ctype.to_avro("b") == "b"
    assert ctype.to_json("a,c") == "a,c" and ctype.from_json("a,c") == "a,c"
    assert ColumnType("enumset").to_avro({"y", "x"}) == "x,y"
    with pytest.raises(CdcError):
        ctype.to_avro(3)


def test_year_codec() -> None:
    ctype = ColumnType("year")
    assert ctype.to_avro(1901) == 1901 and ctype.to_json(1901) == 1901
    assert ctype.from_json(2155) == 2155
    with pytest.raises(CdcError):
        ctype.to_avro(True)
    with pytest.raises(CdcError):
        ctype.to_avro(10000)
