"""Every MySQL/MariaDB column type against a real MariaDB (tests/mykit.py): rows read by a
snapshot-style SELECT (PyMySQL, connectors.mysql.types.SNAPSHOT_CONNECT_ARGS) and the same rows
read from the binlog (pymysqlreplication) give the stated JSON values and byte-identical Avro;
an UPDATE's and a DELETE's images too."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pymysql
import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from cdc.types import ColumnType
from connectors.mysql.types import (
    CHECK_CLAUSES_SQL,
    INFO_SCHEMA_COLUMNS_SQL,
    SNAPSHOT_CONNECT_ARGS,
    MyColumn,
    binlog_converter,
    column_from_info_schema,
    column_type,
    mariadb_json_columns,
    prepare_table_map,
    refine,
    snapshot_converter,
    snapshot_expression,
)

WEIRD = "we`ird col.name"
TABLE = "all types"  # a space in the table name too

DDL = f"""
CREATE TABLE `{TABLE}` (
  id int NOT NULL PRIMARY KEY,
  ti tinyint, tiu tinyint unsigned, si smallint, siu smallint unsigned,
  mi mediumint, miu mediumint unsigned, i int, iu int unsigned, bi bigint, biu bigint unsigned,
  de decimal(65,30), de2 decimal(5,2),
  f float, d double,
  b1 bit(1), b10 bit(10), b64 bit(64),
  c char(5), vc varchar(20), tx text,
  l1 varchar(10) CHARACTER SET latin1, l1t text CHARACTER SET latin1,
  bn binary(4), vb varbinary(8), bl blob,
  e enum('x','y z','é'), st set('a','b','c'), st2 set('a','b','c'),
  j json,
  dte date, dtm datetime, dtm6 datetime(6), ts6 timestamp(6) NULL DEFAULT NULL,
  tm6 time(6), tm6b time(6), tm0 time, yr year,
  zd date, zdt datetime, zts timestamp NULL DEFAULT NULL, zmd date,
  gv int AS (i + 1) VIRTUAL, gs varchar(30) AS (concat(vc, '!')) STORED,
  `{WEIRD.replace("`", "``")}` int,
  u uuid, ip inet6,
  nn_dt datetime NOT NULL DEFAULT '2000-01-01 00:00:00'
) CHARACTER SET utf8mb4
"""

MAX_ROW = {
    "id": 1, "ti": 127, "tiu": 255, "si": 32767, "siu": 65535, "mi": 8388607,
    "miu": 16777215, "i": 2147483646, "iu": 4294967295, "bi": 9223372036854775807,
    "biu": 18446744073709551615,
    "de": "99999999999999999999999999999999999.999999999999999999999999999999",
    "de2": "-999.99", "f": 3.14159265, "d": 0.30000000000000004,
    "b1": b"\x01", "b10": b"\x02\x01", "b64": b"\xff" * 7 + b"\xfe",
    "c": "ab   ", "vc": "héllo 😀", "tx": "emoji 😀 text", "l1": "café", "l1t": "é€\x81",
    "bn": b"ab\0\0", "vb": b"\0\xff\0", "bl": b"\xde\xad\xbe\xef\0",
    "e": "é", "st": "c,a", "st2": "",
    "j": '{"b": 1,  "a":[1,2.50], "s": "é"}',
    "dte": "2024-02-29", "dtm": "2024-02-29 23:59:59", "dtm6": "1000-01-01 00:00:00.000001",
    "ts6": "2038-01-19 03:14:07.999999", "tm6": "-838:59:59.000000", "tm6b": "25:00:00.5",
    "tm0": "-00:00:01", "yr": 2155,
    "zd": "0000-00-00", "zdt": "0000-00-00 00:00:00", "zts": "0000-00-00 00:00:00",
    "zmd": "2020-00-15", WEIRD: 7,
    "u": "6CCD780C-BABA-1026-9564-5B8C656024DB", "ip": "::ffff:1.2.3.4",
    "nn_dt": "0000-00-00 00:00:00",
}
MIN_ROW = {
    "id": 2, "ti": -128, "tiu": 0, "si": -32768, "siu": 0, "mi": -8388608, "miu": 0,
    "i": -2147483648, "iu": 0, "bi": -9223372036854775808, "biu": 0,
    "de": "-0.000000000000000000000000000001", "de2": "0.5", "f": -1.5, "d": -1e308,
    "b1": b"\x00", "b10": b"\x00\x00", "b64": b"\x00" * 8,
    "c": "", "vc": "", "tx": "", "l1": "", "l1t": "",
    "bn": b"\0\0\0\0", "vb": b"", "bl": b"",
    "e": "x", "st": "a,b,c", "st2": "b",
    "j": "[]", "dte": "0000-01-01", "dtm": "0000-01-01 00:00:00",
    "dtm6": "9999-12-31 23:59:59.999999", "ts6": "1970-01-01 00:00:01.000001",
    "tm6": "-00:00:00.01", "tm6b": "-00:01:00.5", "tm0": "00:00:00", "yr": "0000",
    "zd": "2020-01-00", "zdt": "2020-00-00 10:00:00", "zts": "1970-01-01 00:00:01",
    "zmd": "0000-00-00", WEIRD: -1,
    "u": "ffffffff-eeee-4ddd-8ccc-bbbbbbbb0000", "ip": "::",
    "nn_dt": "2000-01-01 00:00:00",
}
NULL_ROW = {"id": 3}

#: the JSON form (to_json(to_avro(value))) of every column, per row; None is NULL
EXPECTED: dict[int, dict[str, Any]] = {
    1: {
        "id": 1, "ti": 127, "tiu": 255, "si": 32767, "siu": 65535, "mi": 8388607,
        "miu": 16777215, "i": 2147483646, "iu": 4294967295, "bi": 9223372036854775807,
        "biu": "18446744073709551615",
        "de": "99999999999999999999999999999999999.999999999999999999999999999999",
        "de2": "-999.99", "f": 3.1415927410125732, "d": 0.30000000000000004,
        "b1": True, "b10": "1000000001",
        "b64": "1111111111111111111111111111111111111111111111111111111111111110",
        "c": "ab", "vc": "héllo 😀", "tx": "emoji 😀 text", "l1": "café", "l1t": "é€\x81",
        "bn": "YWIAAA==", "vb": "AP8A", "bl": "3q2+7wA=",
        "e": "é", "st": "a,c", "st2": "",
        "j": '{"b": 1,  "a":[1,2.50], "s": "é"}',
        "dte": "2024-02-29", "dtm": "2024-02-29T23:59:59.000000",
        "dtm6": "1000-01-01T00:00:00.000001", "ts6": "2038-01-19T03:14:07.999999Z",
        "tm6": "-838:59:59.000000", "tm6b": "25:00:00.500000", "tm0": "-00:00:01.000000",
        "yr": 2155, "zd": None, "zdt": None, "zts": None, "zmd": None,
        "gv": 2147483647, "gs": "héllo 😀!", WEIRD: 7,
        "u": "6ccd780c-baba-1026-9564-5b8c656024db", "ip": "::ffff:1.2.3.4",
        "nn_dt": None,
    },
    2: {
        "id": 2, "ti": -128, "tiu": 0, "si": -32768, "siu": 0, "mi": -8388608, "miu": 0,
        "i": -2147483648, "iu": 0, "bi": -9223372036854775808, "biu": "0",
        "de": "-0.000000000000000000000000000001", "de2": "0.50", "f": -1.5, "d": -1e308,
        "b1": False, "b10": "0000000000", "b64": "0" * 64,
        "c": "", "vc": "", "tx": "", "l1": "", "l1t": "",
        "bn": "AAAAAA==", "vb": "", "bl": "",
        "e": "x", "st": "a,b,c", "st2": "b", "j": "[]",
        "dte": "0000-01-01", "dtm": "0000-01-01T00:00:00.000000",
        "dtm6": "9999-12-31T23:59:59.999999", "ts6": "1970-01-01T00:00:01.000001Z",
        "tm6": "-00:00:00.010000", "tm6b": "-00:01:00.500000", "tm0": "00:00:00.000000",
        "yr": 0, "zd": None, "zdt": None, "zts": "1970-01-01T00:00:01.000000Z", "zmd": None,
        "gv": -2147483647, "gs": "!", WEIRD: -1,
        "u": "ffffffff-eeee-4ddd-8ccc-bbbbbbbb0000", "ip": "::",
        "nn_dt": "2000-01-01T00:00:00.000000",
    },
}
EXPECTED[3] = {name: None for name in EXPECTED[1]} | {
    "id": 3, "nn_dt": "2000-01-01T00:00:00.000000"}

#: what the UPDATE changes in row 1 (and so what the DELETE's before image holds)
UPDATED = {"i": 5, "vc": "changed", "gv": 6, "gs": "changed!", "tm6": "-00:01:04.500000",
           "st2": "a,b,c"}


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _insert(cursor: Any, row: dict[str, Any]) -> None:
    names = ", ".join(_quote(name) for name in row)
    marks = ", ".join(["%s"] * len(row))
    cursor.execute(f"INSERT INTO `{TABLE}` ({names}) VALUES ({marks})", list(row.values()))


def _info_columns(db: Any) -> list[MyColumn]:
    checks = [row[0] for row in db.execute(CHECK_CLAUSES_SQL, (db.name, TABLE))]
    json_columns = mariadb_json_columns(checks)
    return [column_from_info_schema(row, f"{db.name}.{TABLE}", json_columns)
            for row in db.execute(INFO_SCHEMA_COLUMNS_SQL, (db.name, TABLE))]


def _avro_bytes(ctype: ColumnType, datum: Any) -> bytes:
    inner = ctype.avro()
    branches = inner if isinstance(inner, list) else [inner]
    schema = fastavro.parse_schema({"type": "record", "name": "r", "fields": [
        {"name": "v", "type": ["null", *branches]}]})
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, {"v": datum})
    return out.getvalue()


def _encode(columns: list[MyColumn], values: dict[str, Any], converters: list[Any]
            ) -> dict[str, tuple[Any, bytes]]:
    """column -> (JSON form, Avro bytes) of one row's values."""
    out = {}
    for column, convert in zip(columns, converters, strict=True):
        ctype = column_type(column)
        value = values[column.name]
        if value is not None and convert is not None:
            value = convert(value)
        datum = None if value is None else ctype.to_avro(value)
        shown = None if datum is None else ctype.to_json(datum)
        out[column.name] = (shown, _avro_bytes(ctype, datum))
    return out


def _snapshot(db: Any, columns: list[MyColumn]) -> dict[int, dict[str, tuple[Any, bytes]]]:
    settings = {**db.server.connection_settings(db.user, db.password, database=db.name),
                **SNAPSHOT_CONNECT_ARGS}
    conn = pymysql.connect(**settings, cursorclass=pymysql.cursors.SSCursor)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(snapshot_expression(c) for c in columns)
                           + f" FROM `{TABLE}` ORDER BY id")
            rows = list(cursor.fetchall())
    finally:
        conn.close()
    converters = [snapshot_converter(c) for c in columns]
    return {row[0]: _encode(columns, dict(zip([c.name for c in columns], row, strict=True)),
                            converters) for row in rows}


def _binlog(db: Any, start: tuple[str, int], info: list[MyColumn]) -> list[tuple[str, Any]]:
    """(event kind, images) of every row event of the table since ``start``, encoded.
    (``is_mariadb=False``: in MariaDB mode the library ignores log_file/log_pos and reads the
    shared server's whole binlog from its start.)"""
    stream = BinLogStreamReader(
        connection_settings=db.capture_settings(), server_id=db.server_id,
        log_file=start[0], log_pos=start[1], resume_stream=True, blocking=False,
        is_mariadb=False, only_schemas=[db.name],
        only_events=[TableMapEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent])
    events: list[tuple[str, Any]] = []
    columns: list[MyColumn] = []
    try:
        for event in stream:
            if isinstance(event, TableMapEvent):
                binlog_columns = prepare_table_map(event)
                assert [c.name for c in binlog_columns] == [c.name for c in info]
                columns = refine(binlog_columns, info)
                converters = [binlog_converter(c) for c in columns]
                continue
            for row in event.rows:
                if isinstance(event, UpdateRowsEvent):
                    events.append(("update", (
                        _encode(columns, row["before_values"], converters),
                        _encode(columns, row["after_values"], converters))))
                else:
                    kind = "insert" if isinstance(event, WriteRowsEvent) else "delete"
                    events.append((kind, _encode(columns, row["values"], converters)))
    finally:
        stream.close()
    return events


def _json(encoded: dict[str, tuple[Any, bytes]]) -> dict[str, Any]:
    return {name: shown for name, (shown, _) in encoded.items()}


@pytest.fixture
def typed_table(mysql_db):  # type: ignore[no-untyped-def]
    mysql_db.execute(DDL)
    return mysql_db


def test_every_type_snapshot_and_binlog_agree(typed_table: Any) -> None:
    db = typed_table
    info = _info_columns(db)
    assert [(c.name, c.data_type) for c in info if c.name in ("j", "u", "ip", "gv", "gs")] == [
        ("j", "json"), ("gv", "int"), ("gs", "varchar"), ("u", "uuid"), ("ip", "inet6")]
    assert {c.name: c.generated for c in info if c.generated} == {"gv": "VIRTUAL",
                                                                   "gs": "STORED"}
    start = db.binlog_position()
    with db.transaction() as cursor:
        cursor.execute("SET SESSION sql_mode = ''")  # zero dates, zero months and days
        for row in (MAX_ROW, MIN_ROW, NULL_ROW):
            _insert(cursor, row)
    before = _snapshot(db, info)
    for key in (1, 2, 3):
        assert _json(before[key]) == EXPECTED[key], key

    with db.transaction() as cursor:
        cursor.execute(f"UPDATE `{TABLE}` SET i = 5, vc = 'changed', tm6 = '-00:01:04.5', "
                       "st2 = 'c,b,a' WHERE id = 1")
    after = _snapshot(db, info)
    assert _json(after[1]) == EXPECTED[1] | UPDATED
    with db.transaction() as cursor:
        cursor.execute(f"DELETE FROM `{TABLE}` WHERE id = 1")

    events = _binlog(db, start, info)
    assert [kind for kind, _ in events] == ["insert", "insert", "insert", "update", "delete"]
    for (_, image), key in zip(events[:3], (1, 2, 3), strict=True):
        assert _json(image) == EXPECTED[key], key
        assert image == before[key], key  # byte-identical Avro, column by column
    _, (old, new) = events[3]
    assert old == before[1]
    assert new == after[1]
    _, deleted = events[4]
    assert deleted == after[1]


def test_binlog_columns_refined_by_information_schema(typed_table: Any) -> None:
    """The table map says binary(16) for UUID and INET6 and longtext for MariaDB's JSON;
    information_schema's description replaces it where names and base types agree."""
    db = typed_table
    info = _info_columns(db)
    start = db.binlog_position()
    db.execute(f"INSERT INTO `{TABLE}` (id) VALUES (9)")
    stream = BinLogStreamReader(
        connection_settings=db.capture_settings(), server_id=db.server_id,
        log_file=start[0], log_pos=start[1], resume_stream=True, blocking=False,
        is_mariadb=False, only_schemas=[db.name], only_events=[TableMapEvent])
    try:
        table_map = next(iter(stream))
        binlog_columns = prepare_table_map(table_map)
    finally:
        stream.close()
    by_name = {c.name: c for c in binlog_columns}
    assert (by_name["u"].data_type, by_name["u"].precision) == ("binary", 16)
    assert (by_name["ip"].data_type, by_name["ip"].precision) == ("binary", 16)
    assert (by_name["j"].data_type, by_name["j"].charset) == ("longtext", "utf8mb4")
    assert by_name["l1"].charset == "latin1"
    assert by_name["id"].primary_key and not by_name["id"].nullable
    assert by_name["i"].nullable and not by_name["i"].primary_key
    assert by_name["biu"].unsigned and not by_name["bi"].unsigned
    assert by_name["e"].values == ("x", "y z", "é")
    assert by_name["st"].values == ("a", "b", "c")
    assert (by_name["de"].precision, by_name["de"].scale) == (65, 30)
    assert by_name["b10"].precision == 10
    assert [by_name[n].scale for n in ("dtm", "dtm6", "ts6", "tm6", "tm0")] == [0, 6, 6, 6, 0]
    refined = {c.name: c for c in refine(binlog_columns, info)}
    assert refined["u"].data_type == "uuid"
    assert refined["ip"].data_type == "inet6"
    assert refined["j"].data_type == "json"
    assert refined["gv"].generated == "VIRTUAL"
    assert refined["id"].primary_key
    # every other column: the binlog and information_schema agree on the logical type
    for column in binlog_columns:
        if column.name not in ("u", "ip", "j"):
            binlog, catalog = column_type(column), column_type(refined[column.name])
            assert (binlog.name, binlog.precision) == (catalog.name, catalog.precision), column


def test_inet6_text_matches_mariadb(mysql_db: Any) -> None:
    """Our INET6 text for the binlog's 16 bytes is MariaDB's own text for the value."""
    from connectors.mysql.types import inet6_text

    addresses = ["::", "::1", "::1.2.3.4", "::ffff:1.2.3.4", "1:0:2:3:4:5:6:7",
                 "1:0:0:2:0:0:0:3", "fe80::1", "2001:db8::ff00:42:8329", "::ffff:0.0.0.1",
                 "::0.1.0.0", "0:0:0:0:0:fffe:1.2.3.4", "1::", "1:2:3:4:5:6:7:8",
                 "0:0:1::", "1:0:0:2:2:0:0:3", "::ffff:ffff:ffff"]
    for address in addresses:
        text, raw = mysql_db.execute("SELECT CAST(CAST(%s AS INET6) AS CHAR), "
                                     "CAST(CAST(%s AS INET6) AS BINARY(16))",
                                     (address, address))[0]
        assert inet6_text(bytes(raw)) == text, address
