"""The MySQL fast row path (connectors/mysql/rowcodec.py and its compiled twin) writes exactly
what the typed path writes: the same binlog captured twice, once each way
(``CDC_TEST_MYSQL_TYPED=1``, tests/faults/sitecustomize.py, forces the typed path), gives the
same records — keys, positions, schema ids and envelopes (processing times aside) — on every fast
kind and its edge values; and the compiled decoder equals the pure-Python one byte for byte on
the same rows events."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cdc.avro import EventCodec
from cdc.log.local import LocalChangeLogReader
from cdc.log.schemas import SchemaStore
from cdc.transactions import is_transaction_topic
from tests.faults import fault_env
from tests.mykit import MyDatabase, wait_caught_up, write_config
from tests.pgkit import PROJECT, cdc, output

DDL = """
CREATE TABLE fast (
  id BIGINT PRIMARY KEY, ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
  mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT NOT NULL, iu INT UNSIGNED, bu BIGINT UNSIGNED,
  d1 DECIMAL(12,2), d2 DECIMAL(65,30), d3 DECIMAL(5,0), d4 DECIMAL(18,9),
  f FLOAT, dbl DOUBLE,
  c CHAR(8), vc VARCHAR(300), tx TEXT, lt LONGTEXT, js JSON,
  bn BINARY(4), vb VARBINARY(10), bl BLOB,
  e ENUM('a', 'bé', 'c c'), dt DATE, dtm DATETIME, dtm3 DATETIME(3), dtm6 DATETIME(6),
  ts TIMESTAMP NULL DEFAULT NULL, ts6 TIMESTAMP(6) NULL DEFAULT NULL, yr YEAR
) CHARACTER SET utf8mb4
"""
ROWS = [
    "(1, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295, "
    "18446744073709551615, -1234567890.12, "
    "-99999999999999999999999999999999999.999999999999999999999999999999, 99999, "
    "-0.000000001, -1.5, 2.2250738585072014e-308, 'ab', REPEAT('é', 300), 'text 😀', "
    "REPEAT('x', 70000), '{\"a\": [1, 2.5]}', 'a\\0', '', 'blob\\0', 'bé', '2024-02-29', "
    "'1000-01-01 00:00:00', '9999-12-31 23:59:59.999', '2024-03-10 02:30:00.000001', "
    "'1970-01-01 00:00:01', '2038-01-19 03:14:07.999999', 1901)",
    "(2, 127, 0, 32767, 0, 8388607, 0, 2147483647, 0, 0, 0.00, 0, -99999, 123456789.123456789, "
    "3.4e38, -1.7976931348623157e308, '', '', '', '', '[]', 'abcd', 'xyz', '', 'c c', "
    "'0001-01-01', '0000-01-01 00:00:00', '2020-01-01 00:00:00.5', '2020-01-01 00:00:00', "
    "'2001-09-09 01:46:40', '2001-09-09 01:46:40.000001', 2155)",
    "(3, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '0000-00-00', '2020-00-10 00:00:00', "
    "NULL, NULL, '0000-00-00 00:00:00', NULL, 0)",
]
WORKLOAD = [
    "SET SESSION sql_mode = ''",
    f"INSERT INTO fast VALUES {', '.join(ROWS)}",
    "UPDATE fast SET vc = CONCAT(vc, '!'), d1 = d1 + 1, e = 'a' WHERE id IN (1, 2)",
    "UPDATE fast SET id = 20 WHERE id = 2",  # a key change: delete + create
    "INSERT INTO fast (id, i) SELECT seq + 100, seq FROM seq_1_to_500",
    "UPDATE fast SET i = i + 1 WHERE id > 100",
    "DELETE FROM fast WHERE id > 300 OR id = 3",
]


def _records(log: Path) -> list[tuple[Any, ...]]:
    reader = LocalChangeLogReader(log)
    codec = EventCodec(SchemaStore(log))
    out = []
    for topic in reader.topics():
        if is_transaction_topic(topic.meta):
            continue  # transaction events carry ids and timestamps, compared elsewhere
        for partition in range(topic.partitions):
            for record in reader.iter_partition(topic.name, partition):
                envelope = None
                schema_id = None
                if record.value is not None:
                    schema_id, envelope = codec.decode_raw(record.value)
                    for volatile in ("ts_ms", "ts_us", "ts_ns"):
                        envelope.pop(volatile)
                out.append((record.topic, record.partition, record.offset, record.key,
                            record.position, schema_id, envelope))
    return out


def _capture(config: Path, log: Path, db: MyDatabase, env: dict[str, str]) -> str:
    process = subprocess.Popen([sys.executable, "-m", "cdc_app.cli", "capture", "--config",
                                str(config)], cwd=PROJECT, env=fault_env(**env),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_caught_up(db, log)
    finally:
        process.terminate()
        text, _ = process.communicate(timeout=30)
    assert process.returncode == 0, text
    return text


def test_fast_path_equals_typed_path(mysql_db: MyDatabase, tmp_path: Path) -> None:
    db = mysql_db
    db.script("SET SESSION sql_mode = ''; " + DDL)
    config = write_config(tmp_path, db, ["fast"])
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    for statement in WORKLOAD:
        db.script(statement if statement.startswith("SET") else
                  "SET SESSION sql_mode = ''; " + statement)
    typed_dir = tmp_path / "typed"
    typed_dir.mkdir()
    shutil.copytree(tmp_path / "log", typed_dir / "log")
    typed_config = write_config(typed_dir, db, ["fast"])
    fast_text = _capture(config, tmp_path / "log", db, {})
    typed_text = _capture(typed_config, typed_dir / "log", db, {"CDC_TEST_MYSQL_TYPED": "1"})
    assert "rows events encoded by the fast path" in fast_text
    assert " 0 by the typed path" in fast_text, fast_text  # every event took the fast path
    assert " 0 rows events encoded by the fast path" in typed_text, typed_text
    fast, typed = _records(tmp_path / "log"), _records(typed_dir / "log")
    assert len(fast) == len(typed) > 500
    for mine, theirs in zip(fast, typed, strict=True):
        assert mine == theirs


def test_compiled_decoder_equals_pure_python(mysql_db: MyDatabase, tmp_path: Path) -> None:
    import importlib

    from cdc.speedups import pure_python
    from connectors.mysql import rowcodec

    if pure_python():
        pytest.skip("CDC_PURE_PYTHON=1: the compiled paths are switched off")
    try:
        importlib.import_module("connectors.mysql._fast")
    except ImportError:
        if shutil.which("gcc") or shutil.which("cc"):
            pytest.fail("connectors/mysql/_fast is not built although a C compiler is here")
        pytest.skip("no C compiler: the compiled twin is not built")
    if rowcodec.implementation() != "compiled":  # first imported under CDC_PURE_PYTHON=1
        rowcodec = importlib.reload(rowcodec)
    assert rowcodec.implementation() == "compiled"
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import (
        DeleteRowsEvent,
        TableMapEvent,
        UpdateRowsEvent,
        WriteRowsEvent,
    )

    from cdc.events import TableId
    from connectors.mysql import _fast  # type: ignore[attr-defined]
    from connectors.mysql.catalog import table_info
    from connectors.mysql.schema import build
    from connectors.mysql.settings import MySqlSourceConfig
    from connectors.mysql.types import prepare_table_map

    db = mysql_db
    start = db.binlog_position()
    db.script("SET SESSION sql_mode = ''; " + DDL)
    for statement in WORKLOAD:
        db.script("SET SESSION sql_mode = ''; " + statement)
    source = MySqlSourceConfig(name=db.source, kind="mysql", dsn=db.url(),
                               password_env=db.password_env, tables=[db.table("fast")])
    conn = db.capture_connect()
    info = table_info(conn, db.source, TableId(db.name, "fast"))
    conn.close()
    captured = build(source, TableId(db.name, "fast"), info.columns, info.primary_key)
    codec = EventCodec(SchemaStore(tmp_path, writable=True)).table(captured.schema)
    stream = BinLogStreamReader(connection_settings=db.capture_settings(),
                                server_id=db.server_id, log_file=start[0], log_pos=start[1],
                                resume_stream=True, blocking=False, freeze_schema=True,
                                only_events=[TableMapEvent, WriteRowsEvent, UpdateRowsEvent,
                                             DeleteRowsEvent])
    compared = 0
    try:
        for event in stream:
            if isinstance(event, TableMapEvent):
                prepare_table_map(event)
                continue
            plan = rowcodec.plan_for(event.table_map[event.table_id].columns, captured.columns,
                                     codec.value_fields,
                                     [c.type for c in captured.schema.columns],
                                     captured.schema.key)
            assert plan is not None
            packet = event.packet.packet
            data, pos = packet._data, packet._position
            end = len(data) - 4
            update = isinstance(event, UpdateRowsEvent)
            assert _fast.decode_rows(plan, data, pos, end, update) == \
                rowcodec._pure_decode_rows(plan, data, pos, end, update)
            compared += 1
    finally:
        stream.close()
    assert compared >= 6


def test_fast_snapshot_equals_typed_snapshot(mysql_db: MyDatabase, tmp_path: Path) -> None:
    """The snapshot's text-protocol fast path writes what the typed path writes."""
    db = mysql_db
    db.script("SET SESSION sql_mode = ''; " + DDL)
    for statement in WORKLOAD[1:2] + WORKLOAD[4:5]:
        db.script("SET SESSION sql_mode = ''; " + statement)
    logs = {}
    texts = {}
    for name, env in (("fast", {}), ("typed", {"CDC_TEST_MYSQL_TYPED": "1"})):
        directory = tmp_path / name
        directory.mkdir()
        config = write_config(directory, db, ["fast"])
        result = subprocess.run([sys.executable, "-m", "cdc_app.cli", "bootstrap", "--config",
                                 str(config)], cwd=PROJECT, env=fault_env(**env),
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        logs[name], texts[name] = _records(directory / "log"), result.stdout
    assert len(logs["fast"]) == len(logs["typed"]) == 503
    for mine, theirs in zip(logs["fast"], logs["typed"], strict=True):
        for record in (mine, theirs):  # the two bootstraps ran at different times
            for volatile in ("ts_ms", "ts_us", "ts_ns"):
                record[6]["source"].pop(volatile)
        assert mine == theirs
