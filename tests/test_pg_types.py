"""PostgreSQL types through both paths: every type (and an array of each) is bootstrapped (COPY)
and then inserted again while capture runs (pgoutput); snapshot row k and streamed row k must
decode identically, under one Avro schema version, AND equal the values stated here — so a wrong
mapping fails even when both paths agree. Quoted schema/table/column names go through it all too.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import time as time_module
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest

from cdc.log.schemas import SchemaStore
from tests.pgkit import (
    Capture,
    Database,
    LoggedEvent,
    cdc,
    output,
    read_topic,
    wait_caught_up,
    write_config,
)

pytestmark = pytest.mark.timeout(300)


def lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def f32(value: float) -> float:
    """What an Avro ``float`` gives back for ``value``."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def point(x: Any, y: Any, wkb_hex: str | None = None) -> dict[str, Any]:
    def num(v: Any) -> Any:
        return v if isinstance(v, str) else float(v)

    raw = bytes.fromhex(wkb_hex) if wkb_hex else struct.pack(
        "<BIdd", 1, 1, *(float(v.replace("Infinity", "inf")) if isinstance(v, str) else v
                         for v in (x, y)))
    return {"x": num(x), "y": num(y), "wkb": b64(raw), "srid": None}


@dataclass
class Col:
    name: str
    sql_type: str
    #: four (SQL expression, expected JSON value) pairs: rows 1-4 (row 5 is all NULL)
    values: list[tuple[str, Any]]


UNICODE = "Ünïcødé ß 中文 😀 \u200b 'q' \"dq\" back\\slash tab\t nl\n {b},c NULL"
BYTES = bytes(range(256))

COLUMNS = [
    Col("i2", "smallint", [("-32768", -32768), ("32767", 32767), ("0", 0), ("1", 1)]),
    Col("i4", "integer", [("-2147483648", -2147483648), ("2147483647", 2147483647), ("0", 0),
                          ("42", 42)]),
    Col("i8", "bigint", [("-9223372036854775808", -(2**63)), ("9223372036854775807", 2**63 - 1),
                         ("0", 0), ("-1", -1)]),
    Col("f4", "real", [("1.5", 1.5), ("'NaN'", "NaN"), ("'-Infinity'", "-Infinity"),
                       ("0.1", f32(0.1))]),
    Col("f8", "double precision", [("0.1", 0.1), ("'Infinity'", "Infinity"),
                                   ("'-1e-300'", -1e-300),
                                   ("'1.7976931348623157e308'", 1.7976931348623157e308)]),
    Col("num", "numeric", [
        ("'1234567890123456789012345678901234567890.0123456789'",
         "1234567890123456789012345678901234567890.0123456789"),
        ("'NaN'", "NaN"), ("'-Infinity'", "-Infinity"),
        ("'-0.000000000000000000000000000000000000000100'",
         "-0.000000000000000000000000000000000000000100")]),
    Col("num_p", "numeric(50,10)", [
        ("'1234567890123456789012345678901234567890.0123456789'",
         "1234567890123456789012345678901234567890.0123456789"),
        ("'NaN'", "NaN"), ("'-0.5'", "-0.5000000000"), ("0", "0.0000000000")]),
    Col("num_s", "numeric(10,2)", [("'12345678.91'", "12345678.91"), ("'-0.01'", "-0.01"),
                                   ("0", "0.00"), ("'99999999.99'", "99999999.99")]),
    Col("mon", "money", [("'1234.56'", "1234.56"),
                         ("'-92233720368547758.08'", "-92233720368547758.08"),
                         ("'0'", "0.00"), ("'92233720368547758.07'", "92233720368547758.07")]),
    Col("bool", "boolean", [("true", True), ("false", False), ("true", True), ("false", False)]),
    Col("ch", "char(5)", [("'ab'", "ab   "), (lit("é😀"), "é😀   "), ("''", "     "),
                          ("'12345'", "12345")]),
    Col("vc", "varchar(20)", [("'hello'", "hello"), (lit('a,b{c}"d\\e'), 'a,b{c}"d\\e'),
                              ("''", ""), ("'NULL'", "NULL")]),
    Col("t", "text", [("'NULL'", "NULL"), (lit(UNICODE), UNICODE), ("''", ""),
                      (lit("x" * 3000), "x" * 3000)]),
    Col("ba", "bytea", [(r"'\x0001ff00'", b64(b"\x00\x01\xff\x00")), (r"'\x'", ""),
                        (lit("\\x" + BYTES.hex()), b64(BYTES)), (r"'\x5c7841'", b64(b"\\xA"))]),
    Col("bit1", "bit(1)", [("B'1'", True), ("B'0'", False), ("B'1'", True), ("B'0'", False)]),
    Col("bit10", "bit(10)", [("B'1000000001'", "1000000001"), ("B'0000000000'", "0000000000"),
                             ("B'1111111111'", "1111111111"), ("B'0101010101'", "0101010101")]),
    Col("vb", "bit varying", [("B'0011'", "0011"), ("B''", ""), ("B'" + "1" * 70 + "'", "1" * 70),
                              ("B'0'", "0")]),
    Col("e", "mood", [("'happy'", "happy"), ("'sad'", "sad"), (lit("so-so 😐"), "so-so 😐"),
                      ("'happy'", "happy")]),
    Col("d", "date", [("'0001-01-01'", "0001-01-01"), ("'9999-12-31'", "9999-12-31"),
                      ("'infinity'", "infinity"), ("'0044-03-15 BC'", "-0043-03-15")]),
    Col("tm", "time", [("'00:00:00'", "00:00:00.000000"), ("'23:59:59.999999'", "23:59:59.999999"),
                       ("'24:00:00'", "24:00:00.000000"), ("'12:34:56.5'", "12:34:56.500000")]),
    Col("ttz", "timetz", [("'12:00:00+05:30'", "06:30:00.000000Z"),
                          ("'00:30:00-01'", "01:30:00.000000Z"),
                          ("'01:00:00+02'", "23:00:00.000000Z"),
                          ("'23:59:59.999999+00'", "23:59:59.999999Z")]),
    Col("ts", "timestamp", [("'0001-01-01 00:00:00'", "0001-01-01T00:00:00.000000"),
                            ("'10000-01-01 00:00:00'", "+10000-01-01T00:00:00.000000"),
                            ("'-infinity'", "-infinity"),
                            ("'0044-03-15 12:00:00.25 BC'", "-0043-03-15T12:00:00.250000")]),
    Col("tstz", "timestamptz", [
        ("'9999-12-31 23:59:59.999999+00'", "9999-12-31T23:59:59.999999Z"),
        ("'infinity'", "infinity"), ("'0001-01-01 00:00:00+00'", "0001-01-01T00:00:00.000000Z"),
        ("'2024-02-29 12:00:00.5+02'", "2024-02-29T10:00:00.500000Z")]),
    Col("iv", "interval", [
        ("'1 year 2 mons 3 days 04:05:06.789'", "P1Y2M3DT4H5M6.789S"),
        ("'-1 year -2 mons +3 days -04:05:06.5'", "P-1Y-2M3DT-4H-5M-6.5S"),
        ("'0'", "P0Y0M0DT0H0M0S"),
        ("'1000000 hours 0.000001 sec'", "P0Y0M0DT1000000H0M0.000001S")]),
    Col("j", "json", [(lit('{"b": 1, "a": [1, 2.50, null]}'), '{"b": 1, "a": [1, 2.50, null]}'),
                      (lit('"x😀"'), '"x😀"'), ("'null'", "null"), ("'[]'", "[]")]),
    Col("jb", "jsonb", [(lit('{"b": 1, "a": [1, 2.50, null]}'), '{"a": [1, 2.50, null], "b": 1}'),
                        (lit('{"é": "😀\\t"}'), '{"é": "😀\\t"}'), ("'null'", "null"),
                        (lit('[1, {"x": []}]'), '[1, {"x": []}]')]),
    Col("x", "xml", [(lit('<a b="1">x &amp; y</a>'), '<a b="1">x &amp; y</a>'),
                     ("'plain text'", "plain text"), (lit("<é>😀</é>"), "<é>😀</é>"),
                     ("'<r/>'", "<r/>")]),
    Col("u", "uuid", [("'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'",
                       "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
                      ("'00000000-0000-0000-0000-000000000000'",
                       "00000000-0000-0000-0000-000000000000"),
                      ("'ffffffff-ffff-ffff-ffff-ffffffffffff'",
                       "ffffffff-ffff-ffff-ffff-ffffffffffff"),
                      ("'{12345678-1234-1234-1234-123456789abc}'",
                       "12345678-1234-1234-1234-123456789abc")]),
    Col("ip", "inet", [("'192.168.0.1'", "192.168.0.1"), ("'10.0.0.0/8'", "10.0.0.0/8"),
                       ("'::1'", "::1"), ("'2001:db8::1/64'", "2001:db8::1/64")]),
    Col("net", "cidr", [("'192.168.0.0/24'", "192.168.0.0/24"), ("'10/8'", "10.0.0.0/8"),
                        ("'::/0'", "::/0"), ("'2001:db8::/32'", "2001:db8::/32")]),
    Col("mac", "macaddr", [("'08:00:2b:01:02:03'", "08:00:2b:01:02:03"),
                           ("'08-00-2B-01-02-04'", "08:00:2b:01:02:04"),
                           ("'ffffffffffff'", "ff:ff:ff:ff:ff:ff"),
                           ("'00:00:00:00:00:00'", "00:00:00:00:00:00")]),
    Col("p", "point", [("'(1.5,-2)'", point(1.5, -2, "0101000000000000000000f83f00000000000000c0")),
                       ("'(0,0)'", point(0, 0)), ("'(1e300,-1e-300)'", point(1e300, -1e-300)),
                       ("'(NaN,Infinity)'", point("NaN", "Infinity"))]),
    Col("r", "int4range", [("'[1,10)'", "[1,10)"), ("'empty'", "empty"), ("'(,5]'", "(,6)"),
                           ("'[3,)'", "[3,)")]),
    Col("tr", "tstzrange", [
        (lit('["2020-01-01 00:00+00","2020-02-01 00:00+00")'),
         '["2020-01-01 00:00:00+00","2020-02-01 00:00:00+00")'),
        ("'empty'", "empty"), ("'(,)'", "(,)"),
        (lit("[2020-01-01 00:00+02,infinity]"), '["2019-12-31 22:00:00+00",infinity]')]),
    Col("lt", "ltree", [("'Top.Science.Astronomy'", "Top.Science.Astronomy"), ("'a'", "a"),
                        ("''", ""), ("'x_y.1'", "x_y.1")]),
    Col("dpos", "posint", [("1", 1), ("2147483647", 2147483647), ("5", 5), ("6", 6)]),
    Col("dnum", "price", [("'12345.678'", "12345.678"), ("'-0.001'", "-0.001"), ("'NaN'", "NaN"),
                          ("0", "0.000")]),
]

TYPES_SETUP = """
CREATE TYPE mood AS ENUM ('happy', 'sad', 'so-so 😐');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE DOMAIN price AS numeric(8,3);
"""


def array_cells(col: Col) -> list[tuple[str, Any]]:
    """Rows 1-4 of the array column: 1-D with a NULL, 2-D with NULLs, empty, one element."""
    (s1, j1), (s2, j2), (s3, j3), (s4, j4) = col.values
    typed = [f"({sql})::{col.sql_type}" for sql, _ in col.values]
    array_type = f"{col.sql_type}[]"
    return [
        (f"ARRAY[{typed[0]}, NULL, {typed[1]}]::{array_type}", [j1, None, j2]),
        (f"ARRAY[ARRAY[{typed[0]}, NULL], ARRAY[NULL, {typed[2]}]]::{array_type}",
         [[j1, None], [None, j3]]),
        (f"'{{}}'::{array_type}", []),
        (f"ARRAY[{typed[3]}]::{array_type}", [j4]),
    ]


def _ltree_available(db: Database) -> bool:
    return bool(db.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'ltree'"))


def _columns(db: Database) -> list[Col]:
    if _ltree_available(db):
        db.execute("CREATE EXTENSION ltree")
        return COLUMNS
    return [c for c in COLUMNS if c.sql_type != "ltree"]


def _insert_rows(db: Database, columns: list[Col], first_id: int) -> None:
    names = [c.name for c in columns] + [f"a_{c.name}" for c in columns]
    statements = []
    for row in range(4):
        cells = [f"({c.values[row][0]})::{c.sql_type}" for c in columns]
        cells += [array_cells(c)[row][0] for c in columns]
        statements.append(f"INSERT INTO types_all (id, {', '.join(names)}) "
                          f"VALUES ({first_id + row}, {', '.join(cells)})")
    statements.append(f"INSERT INTO types_all (id) VALUES ({first_id + 4})")
    with db.connect() as conn, conn.transaction():
        for statement in statements:
            conn.execute(statement)


def _expected(columns: list[Col], row: int) -> dict[str, Any]:
    if row == 4:
        return {name: None for c in columns for name in (c.name, f"a_{c.name}")}
    out = {c.name: c.values[row][1] for c in columns}
    out.update({f"a_{c.name}": array_cells(c)[row][1] for c in columns})
    return out


def _by_key(events: list[LoggedEvent], op: str) -> dict[int, dict[str, Any]]:
    rows = {}
    for event in events:
        if event.op == op:
            assert event.envelope is not None
            rows[json.loads(event.key)["id"]] = event.envelope["after"]
    return rows


def _types_table(db: Database) -> list[Col]:
    """Table ``types_all``: a column of every type and an array column of each; its columns."""
    columns = _columns(db)
    db.execute(TYPES_SETUP)
    definitions = [f"{c.name} {c.sql_type}" for c in columns]
    definitions += [f"a_{c.name} {c.sql_type}[]" for c in columns]
    db.execute(f"CREATE TABLE types_all (id int PRIMARY KEY, {', '.join(definitions)})")
    return columns


def test_every_type_through_snapshot_and_stream(pg_db: Database, tmp_path: Path) -> None:
    columns = _types_table(pg_db)
    _insert_rows(pg_db, columns, 1)
    log = tmp_path / "log"
    config = write_config(tmp_path, pg_db, ["public.types_all"])
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    capture = Capture(config, tmp_path / "capture.log").start()
    try:
        _insert_rows(pg_db, columns, 101)
        wait_caught_up(pg_db, log, timeout=60)
    finally:
        capture_code = capture.terminate()
    assert capture_code == 0, (tmp_path / "capture.log").read_text()

    topic = f"{pg_db.source}.public.types_all"
    events = read_topic(log, topic)
    snapshot, streamed = _by_key(events, "r"), _by_key(events, "c")
    assert sorted(snapshot) == [1, 2, 3, 4, 5] and sorted(streamed) == [101, 102, 103, 104, 105]
    for row in range(5):
        from_snapshot = dict(snapshot[row + 1])
        from_stream = dict(streamed[row + 101])
        assert (from_snapshot.pop("id"), from_stream.pop("id")) == (row + 1, row + 101)
        expected = _expected(columns, row)
        for name, value in expected.items():
            assert from_snapshot[name] == value, f"snapshot row {row + 1} column {name}"
            assert from_stream[name] == value, f"streamed row {row + 101} column {name}"
        assert from_snapshot == from_stream == expected

    # identical encodings: one schema version for both paths
    store = SchemaStore(log)
    versions = store.versions(f"{topic}-value")
    assert len(versions) == 1, [v.id for v in versions]
    _check_raw_avro(log, topic, versions[0].schema)
    _check_dump(tmp_path, config, topic, columns)


def _check_raw_avro(log: Path, topic: str, envelope: dict[str, Any]) -> None:
    """The Avro data itself, for the encodings whose JSON form hides them."""
    from cdc.log.local import LocalChangeLogReader

    value_fields = {f["name"]: f for f in envelope["fields"][0]["type"][1]["fields"]}
    bits = value_fields["bit10"]["type"][1]
    assert bits["connect.name"] == "io.debezium.data.Bits"
    assert bits["connect.parameters"] == {"length": "10"}
    assert value_fields["iv"]["type"][1]["connect.name"] == "io.debezium.time.Interval"
    assert value_fields["ttz"]["type"][1]["connect.name"] == "io.debezium.time.ZonedTime"
    assert value_fields["p"]["type"][1]["name"] == "Point"
    assert value_fields["a_p"]["type"][1]["items"][1] == "io.debezium.data.geometry.Point"
    assert value_fields["mon"]["type"][1]["logicalType"] == "decimal"
    assert value_fields["bit1"]["type"] == ["null", "boolean"]
    parsed = fastavro.parse_schema(envelope)
    reader = LocalChangeLogReader(log)
    raw_rows = {}
    for partition in range(reader.topic(topic).partitions):
        for record in reader.iter_partition(topic, partition):
            if record.value is not None:
                datum = fastavro.schemaless_reader(io.BytesIO(record.value[5:]), parsed, None)
                raw_rows[datum["after"]["id"]] = datum["after"]
    for key in (1, 101):
        raw = raw_rows[key]
        assert raw["bit10"] == (0b1000000001).to_bytes(2, "little")  # Debezium: little-endian
        assert raw["mon"] == Decimal("1234.56")
        assert raw["num_p"] == Decimal("1234567890123456789012345678901234567890.0123456789")
        assert raw["num"] == "1234567890123456789012345678901234567890.0123456789"
        assert raw["ts"] == -62135596800000000  # 0001-01-01 in microseconds since 1970
        assert raw["d"] == -719162
        assert raw["tm"] == 0
        assert raw["p"]["x"] == 1.5 and raw["p"]["y"] == -2.0 and raw["p"]["srid"] is None
    assert raw_rows[3]["d"] == 2**31 - 1 and raw_rows[3]["ts"] == -(2**63)
    # 44 BC = astronomical -43: 44 years (11 of them leap) before 0001-01-01, then 73 days
    bc_day = -719162 - (44 * 365 + 11) + 73
    assert raw_rows[4]["d"] == raw_rows[104]["d"] == bc_day
    assert raw_rows[4]["ts"] == raw_rows[104]["ts"] == (bc_day * 86_400 + 12 * 3600) * 10**6 \
        + 250_000
    assert raw_rows[3]["tm"] == 86_400_000_000


def _check_dump(tmp_path: Path, config: Path, topic: str, columns: list[Col]) -> None:
    result = cdc("log", "dump", "--config", str(config), "--topic", topic)
    assert result.returncode == 0, output(result)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    after = {line["key"]["id"]: line["value"]["after"] for line in lines}
    for key, row in ((2, 1), (102, 1), (4, 3), (104, 3)):
        expected = _expected(columns, row)
        for name in ("num", "f4", "mon", "d", "ts", "tstz", "iv", "ttz", "bit10", "p", "a_p",
                     "a_t", "a_num_p", "a_bit10", "t", "ba", "e", "jb"):
            assert after[key][name] == expected[name], (key, name)


def test_ltree_extension_is_available(pg_db: Database) -> None:
    """The extension types' coverage in test_every_type_through_snapshot_and_stream needs
    ltree: installed, its columns are among the ones that test captures, and it works."""
    if not _ltree_available(pg_db):
        pytest.skip("the ltree extension is not installed (Debian: postgresql-contrib / the "
                    "postgresql-15 package's contrib part); ltree columns were left out of "
                    "test_every_type_through_snapshot_and_stream")
    columns = _columns(pg_db)
    assert [c.name for c in columns if c.sql_type == "ltree"] == ["lt"]
    assert pg_db.execute("SELECT 'Top.Science'::ltree @> 'Top.Science.Astronomy'::ltree, "
                         "nlevel('Top.Science.Astronomy')") == [(True, 3)]


def test_quoted_schema_table_and_column_names(pg_db: Database, tmp_path: Path) -> None:
    pg_db.execute('CREATE SCHEMA "My Schema"')
    pg_db.execute('CREATE TABLE "My Schema"."we.ird""name" ("Id" int PRIMARY KEY, '
                  '"Col Umn" text, "UPPER.case" numeric(6,2), "q""uote" int[])')
    pg_db.execute('INSERT INTO "My Schema"."we.ird""name" VALUES (1, \'one\', 1.5, \'{1,NULL}\'), '
                  "(2, 'two', NULL, NULL)")
    log = tmp_path / "log"
    config = write_config(tmp_path, pg_db, ['"My Schema"."we.ird""name"'])
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    capture = Capture(config, tmp_path / "capture.log").start()
    try:
        pg_db.execute('INSERT INTO "My Schema"."we.ird""name" VALUES (3, \'three\', -2, \'{}\')')
        pg_db.execute('UPDATE "My Schema"."we.ird""name" SET "Col Umn" = \'uno\' WHERE "Id" = 1')
        pg_db.execute('DELETE FROM "My Schema"."we.ird""name" WHERE "Id" = 2')
        wait_caught_up(pg_db, log, timeout=60)
    finally:
        capture_code = capture.terminate()
    assert capture_code == 0, (tmp_path / "capture.log").read_text()
    topic = f'{pg_db.source}.My Schema.we.ird"name'
    events = read_topic(log, topic)
    ops = sorted((e.op, e.key) for e in events)
    assert ops == [("c", '{"Id":3}'), ("d", '{"Id":2}'), ("r", '{"Id":1}'), ("r", '{"Id":2}'),
                   ("tombstone", '{"Id":2}'), ("u", '{"Id":1}')]
    rows = {e.key: e.envelope["after"] for e in events if e.envelope and e.op in ("r", "c", "u")
            and e.envelope["after"]}
    assert rows['{"Id":3}'] == {"Id": 3, "Col Umn": "three", "UPPER.case": "-2.00",
                                'q"uote': []}
    assert rows['{"Id":2}'] == {"Id": 2, "Col Umn": "two", "UPPER.case": None, 'q"uote': None}
    updated = next(e for e in events if e.op == "u")
    assert updated.envelope and updated.envelope["after"] == {
        "Id": 1, "Col Umn": "uno", "UPPER.case": "1.50", 'q"uote': [1, None]}
    source = updated.envelope["source"]
    assert (source["schema"], source["table"]) == ("My Schema", 'we.ird"name')
    # Avro names are adjusted; the original names are kept beside them
    store = SchemaStore(log)
    versions = store.versions(f"{topic}-value")
    assert len(versions) == 1
    envelope = versions[0].schema
    assert envelope["namespace"] == f"{pg_db.source}.My_Schema.we_ird_name"
    fields = envelope["fields"][0]["type"][1]["fields"]
    assert [(f["name"], f.get("cdc.column")) for f in fields] == [
        ("Id", None), ("Col_Umn", "Col Umn"), ("UPPER_case", "UPPER.case"),
        ("q_uote", 'q"uote')]
    dump = cdc("log", "dump", "--config", str(config), "--topic", topic)
    assert dump.returncode == 0, output(dump)
    assert '"Col Umn":"uno"' in dump.stdout


# ------------------------------------------------------------------ the mapping, without a server

def test_type_mapping_from_oid_modifier_and_catalog() -> None:
    from connectors.postgres.types import pg_type

    def mapped(oid: int, modifier: int = -1, catalog: dict[int, Any] | None = None) -> Any:
        return pg_type(oid, modifier, catalog or {}).column_type

    assert mapped(1560, 1).name == "boolean"  # bit(1), as Debezium
    assert (mapped(1560, 12).name, mapped(1560, 12).precision) == ("bits", 12)
    assert mapped(1562, 5).name == "string" and mapped(1562, 5).source_type == "bit varying(5)"
    assert (mapped(1700, ((12 << 16) | 3) + 4).name, mapped(1700).name) == ("decimal", "numeric")
    # time and timestamp keep the fractional digits they declare below six (adaptive reads them)
    assert (mapped(1114, 3).precision, mapped(1114, 3).source_type) == (3, "timestamp(3)")
    assert (mapped(1083, 0).precision, mapped(1083, 0).name) == (0, "time")
    assert mapped(1114).precision is mapped(1114, 6).precision is mapped(1184, 3).precision is None
    assert mapped(1115, 3).element == mapped(1114, 3)  # timestamp(3)[]
    money = mapped(790)
    assert (money.name, money.precision, money.scale) == ("decimal", 19, 2)
    array = mapped(1231, ((12 << 16) | 3) + 4)  # numeric(12,3)[]: the modifier is the element's
    assert array.element is not None and (array.element.precision, array.element.scale) == (12, 3)
    catalog = {
        9001: {"kind": "domain", "name": "d", "base": 9002, "base_modifier": -1},
        9002: {"kind": "domain", "name": "d2", "base": 1560, "base_modifier": 8},
        9003: {"kind": "array", "name": "_d", "element": 9001, "delimiter": ","},
        9004: {"kind": "other", "name": "ltree"},
        9005: {"kind": "other", "name": "hstore"},
        9006: {"kind": "array", "name": "_box", "element": 603, "delimiter": ";"},
    }
    assert (mapped(9001, -1, catalog).name, mapped(9001, -1, catalog).precision) == ("bits", 8)
    element = mapped(9003, -1, catalog).element
    assert element is not None and element.name == "bits"
    assert mapped(9004, -1, catalog).name == "ltree"
    assert mapped(9005, -1, catalog).name == "string"
    boxes = pg_type(9006, -1, catalog).parse("{(2,2),(1,1);(4,4),(3,3)}")
    assert boxes == ["(2,2),(1,1)", "(4,4),(3,3)"]


def test_text_parsers_for_the_rare_forms() -> None:
    import datetime as dt

    from cdc.types import Interval
    from connectors.postgres.types import _interval, _timestamp, _timetz, parse_array

    assert _timestamp("2020-01-01 00:00:00+00") == dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    assert _timestamp("0001-01-01 00:00:00+00 BC") == -62167219200000000  # year 0
    assert _timestamp("10000-01-01 01:00:00+01") == 253402300800000000
    assert _timetz("00:00:00+00:00:30") == 86_400_000_000 - 30_000_000
    assert _interval("PT0S") == Interval(0, 0, 0)
    assert _interval("P-9M") == Interval(-9, 0, 0)
    assert _interval("PT-0.5S") == Interval(0, 0, -500_000)
    assert parse_array('[0:1]={"a\\\\b","NULL",NULL}', str) == ["a\\b", "NULL", None]
    assert parse_array("{{{1}},{{NULL}}}", int) == [[[1]], [[None]]]


def test_new_logical_types_round_trip_through_avro(tmp_path: Path) -> None:
    from cdc.avro import EventCodec
    from cdc.events import ChangeEvent, Column, Op, TableId, TableSchema
    from cdc.position import Position
    from cdc.types import ColumnType, Interval

    columns = {
        "bits": (ColumnType("bits", precision=3), "101", "101"),
        "iv": (ColumnType("interval"), Interval(-14, 3, -61_500_000), "P-1Y-2M3DT0H-1M-1.5S"),
        "tz": (ColumnType("timetz"), 3_600_000_000, "01:00:00.000000Z"),
        "p": (ColumnType("point"), (1.0, 2.0), point(1.0, 2.0)),
        "p2": (ColumnType("point"), {"x": 3, "y": 4}, point(3.0, 4.0)),
        "x": (ColumnType("xml"), "<a/>", "<a/>"),
        "d": (ColumnType("date"), -735160, "-0043-03-15"),
        "ts": (ColumnType("timestamp"), 253402300800000000, "+10000-01-01T00:00:00.000000"),
        "tstz": (ColumnType("timestamptz"), -62167219200000000, "0000-01-01T00:00:00.000000Z"),
        "a3": (ColumnType("array", element=ColumnType("point")),
               [[[(1.0, 2.0)], [None]]], [[[point(1.0, 2.0)], [None]]]),
    }
    schema = TableSchema("src", "db", TableId("public", "t"),
                         (Column("id", ColumnType("int32"), False),
                          *(Column(name, ctype) for name, (ctype, _, _) in columns.items())),
                         ("id",))
    codec = EventCodec(SchemaStore(tmp_path, writable=True))
    row = {"id": 1, **{name: value for name, (_, value, _) in columns.items()}}
    event = ChangeEvent(schema, Op.CREATE, Position.test(1), 5, after=row)
    after = codec.decode_value(codec.records(event)[0].value).envelope["after"]
    for name, (ctype, _, expected) in columns.items():
        assert after[name] == expected, name
        # the JSON form reads back as a value that encodes the same way (keys are read back so)
        assert ctype.to_json(ctype.to_avro(ctype.from_json(expected))) == expected, name


def test_incremental_chunks_encode_like_events(pg_db: Database, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An incremental snapshot's chunk read straight from COPY's bytes into log records
    (``PostgresStream.chunk`` with a codec: rowcodec.encode_copy) holds, row for row, the bytes
    the event path's chunk (no codec) is logged as — every type and edge value, an array of
    each, NULLs — and ends at the same last key."""
    import types

    import connectors.postgres.source as pg_source
    from cdc.avro import EventCodec
    from cdc.config import load_config
    from cdc.log.base import Record
    from connectors.postgres.connector import PostgresConnector
    from connectors.postgres.source import PostgresOffset, PostgresSource, _times

    columns = _types_table(pg_db)
    _insert_rows(pg_db, columns, 1)
    _insert_rows(pg_db, columns, 11)
    config = write_config(tmp_path, pg_db, ["public.types_all"])
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    now = 1_700_000_000.321  # the chunks' source and processing times
    monkeypatch.setattr(pg_source, "time", types.SimpleNamespace(
        time=lambda: now, monotonic=time_module.monotonic, sleep=time_module.sleep))
    monkeypatch.setattr(pg_source, "_times", lambda now_ms=None: _times(int(now * 1000)))
    codec = EventCodec(SchemaStore(tmp_path / "log", writable=True))
    source_config = load_config(config).sources[0]
    source = PostgresSource(source_config)
    stream = source.stream(PostgresOffset(), PostgresConnector(source_config).leader, codec)
    try:
        table = stream.source.tables[0]
        chunks = []
        for with_codec in (True, False):
            stream.codec = codec if with_codec else None
            first = stream.chunk(table, None, 7)
            chunks.append([first, stream.chunk(table, first[2], 7)])
    finally:
        stream.close()
    fast_chunks, slow_chunks = chunks
    assert [c[2] for c in fast_chunks] == [c[2] for c in slow_chunks] == [["12"], None]
    for (_, fast, _), (_, slow, _) in zip(fast_chunks, slow_chunks, strict=True):
        assert all(isinstance(row, Record) for row in fast)
        assert not any(isinstance(row, Record) for row in slow)
        for row, event in zip(fast, slow, strict=True):
            event.processed_ms = int(now * 1000)
            assert (row.topic, row.key, row.value) == codec.records(event)[0][:3]
