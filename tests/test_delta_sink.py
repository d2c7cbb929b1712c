"""DeltaSink (sinks/delta.py) on real Delta tables in tmp_path: what the tables hold (scd1
markers, scd2 history exactness), schema changes mid-stream, types, odd names, readers (Spark
parquet, DuckDB, Polars) and `cdc warehouse vacuum/optimize`. The contract every sink keeps
(the gate through read/keys, replays, deletes, watermarks, racing writers) is
tests/test_sink_contract.py's, for scd1 and scd2.

Batches are built as rows of the Spark source's schema (``tests/sinkkit.py``) and handed over
the way the batch handler does (folded for scd1; every record in position order for scd2).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc.events import Column, TableId, TableSchema
from cdc.log.schemas import SchemaStore
from cdc.sink import Change, row_text
from cdc.types import ColumnType, Interval
from sinks.delta import (
    DeltaSink,
    DeltaSinkError,
    cell_text,
    current_files,
    table_dir,
)
from tests.sinkkit import (
    TABLE,
    TOPIC,
    MiniLog,
    apply_in_batches,
    changes_of,
    expected_rows,
    held_rows,
    key_json,
    pos,
    v_of,
)
from tests.sinkkit import random_log as _random_log

MODES = ("scd1", "scd2")


def random_log(seed: int, keys: int = 40, changes: int = 400) -> MiniLog:
    return _random_log(seed, keys, changes, ts="position")


def contents(sink: DeltaSink, topic: str = TOPIC) -> list[dict[str, Any]]:
    """Every row of the table (markers and closed versions included), in key/position order."""
    return sink.history(topic).to_pylist()


@pytest.fixture(params=MODES)
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DeltaSink]:
    made = DeltaSink("wh", tmp_path / "wh", tables={TOPIC: ("src", TABLE)}, mode=request.param,
                     buckets=4, log_path=tmp_path / "log")
    yield made
    made.close()


# ------------------------------------------------------------------ what the tables hold

def test_rows_of_out_of_order_and_gated_records(sink: DeltaSink) -> None:
    log = MiniLog(ts="position")
    log.upsert(1, pos(5), 5)
    log.upsert(1, pos(9), 9)
    log.upsert(1, pos(7), 7)
    apply_in_batches(sink, log.rows, 10)
    rows = contents(sink)
    if sink.mode == "scd1":
        assert [r["_cdc_position"] for r in rows] == [pos(9).hex()]
    else:  # history in position order, whatever the offsets
        assert [(r["v"], r["is_current"]) for r in rows] == [(5, False), (7, False), (9, True)]
    # a record the gate refuses adds no row (scd2: no history either)
    late = MiniLog(ts="position")
    late.upsert(1, pos(8), 8)
    assert apply_in_batches(sink, late.rows, 1) == (0, 1)
    assert contents(sink) == rows


def test_replay_and_duplicate_batches_leave_the_tables_untouched(sink: DeltaSink) -> None:
    """Not one row changes, bookkeeping columns included (the contract suite checks the live
    rows)."""
    log = random_log(2, changes=250)
    for begin in range(0, len(log.rows), 60):
        changes, _ = changes_of(sink, log.rows[begin:begin + 60])
        sink.apply(changes)
        after_first = contents(sink)
        sink.apply(changes)  # a crashed batch, replayed
        assert contents(sink) == after_first
    before = contents(sink)
    assert apply_in_batches(sink, log.rows, 53)[0] == 0  # the log from offset 0
    assert contents(sink) == before


def test_delete_markers_in_the_table(sink: DeltaSink) -> None:
    log = MiniLog(ts="position")
    log.upsert(1, pos(1), 1, "c")
    log.delete(1, pos(2))
    log.upsert(1, pos(3), 3, "c")
    apply_in_batches(sink, log.rows[:3], 1)  # insert, delete, tombstone: one per batch
    rows = contents(sink)
    if sink.mode == "scd1":  # the marker: deleted, data NULL, the delete's position
        assert [(r["_cdc_deleted"], r["v"], r["_cdc_position"]) for r in rows] == [
            (True, None, pos(2).hex())]
    else:  # the version closed by the delete, no row added
        assert [(r["v"], r["is_current"], r["_cdc_end_position"]) for r in rows] == [
            (1, False, pos(2).hex())]
    assert apply_in_batches(sink, log.rows[:1], 1) == (0, 1)  # late: no row either
    assert contents(sink) == rows
    apply_in_batches(sink, log.rows[3:], 1)
    assert v_of(sink, 1) == 3
    # a delete of a key never seen (a compacted log): a marker row, scd2 too (nothing to close)
    unknown = MiniLog(ts="position")
    unknown.delete(7, pos(5))
    apply_in_batches(sink, unknown.rows, 2)
    assert [r["_cdc_deleted"] for r in contents(sink) if r["_cdc_key"] == key_json(7)] == [True]


def test_watermarks_live_in_one_file(tmp_path: Path) -> None:
    sink = DeltaSink("wh", tmp_path / "wh", tables={})
    sink.set_watermark("src", {"lsn": 5})
    assert DeltaSink("wh", tmp_path / "wh", tables={}).watermark("src") == {"lsn": 5}
    assert sorted(p.name for p in (tmp_path / "wh").iterdir()  # (and its hidden lock)
                  if not p.name.startswith(".")) == ["_cdc_watermarks.json"]


# ----------------------------------------------------------------------------- scd2 history

def test_scd2_history_is_the_ordered_sequence_of_changes(tmp_path: Path) -> None:
    sink = DeltaSink("wh", tmp_path / "wh", tables={}, mode="scd2", buckets=8)
    log = random_log(3, keys=25, changes=500)
    rng = random.Random(4)
    begin = 0
    while begin < len(log.rows):  # batches of random sizes
        size = rng.randint(1, 80)
        changes, _ = changes_of(sink, log.rows[begin:begin + size])
        sink.apply(changes)
        begin += size
    rows = contents(sink)
    assert not any(r["_cdc_deleted"] for r in rows)  # every delete had a version to close
    by_key: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_key.setdefault(row["_cdc_key"], []).append(row)
    source: dict[str, list[dict[str, Any]]] = {}
    for record in log.rows:
        if record["op"] not in ("w", None):
            source.setdefault(record["key"], []).append(record)
    assert set(by_key) == set(source)
    for key, versions in by_key.items():
        records = source[key]
        upserts = [r for r in records if r["op"] in ("c", "u", "r")]
        # the history equals the ordered sequence of the key's upserts
        assert [(v["_cdc_position"], v["v"], v["_cdc_op"]) for v in versions] == [
            (r["position"].hex(), json.loads(r["after"])["v"], r["op"]) for r in upserts]
        # each version ends where the key's next record (upsert or delete) begins
        ends = {r["position"].hex(): r for r in records}
        for version in versions:
            assert version["valid_from"] == _utc(ends[version["_cdc_position"]]["source_ts_ms"])
            following = [r for r in records if r["position"] > bytes.fromhex(
                version["_cdc_position"])]
            if not following:
                assert version["is_current"] and version["valid_to"] is None
                assert version["_cdc_end_position"] is None
                continue
            assert not version["is_current"]
            assert version["_cdc_end_position"] == following[0]["position"].hex()
            assert version["valid_to"] == _utc(following[0]["source_ts_ms"])
        # at most one current row, exactly one for a live key
        current = [v for v in versions if v["is_current"]]
        assert len(current) == (1 if records[-1]["op"] in ("c", "u") else 0)
    assert held_rows(sink) == expected_rows(log)
    # re-applying everything adds nothing
    before = contents(sink)
    assert apply_in_batches(sink, log.rows, 111)[0] == 0
    assert contents(sink) == before


def _utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def test_scd2_record_without_commit_time_uses_the_apply_time(tmp_path: Path) -> None:
    sink = DeltaSink("wh", tmp_path / "wh", tables={}, mode="scd2", buckets=2)
    before = dt.datetime.now(dt.UTC)
    sink.apply([Change(TOPIC, "src", "public.items", key_json(1), pos(1), {"id": 1}, "r")])
    valid_from = contents(sink)[0]["valid_from"]
    assert before - dt.timedelta(seconds=1) <= valid_from <= dt.datetime.now(dt.UTC)


# --------------------------------------------------------------------------- schema changes

def new_store(directory: Path) -> SchemaStore:
    """An empty change log at ``directory`` (the sink finds schemas through the log) and its
    schema store."""
    from cdc.log.local import LocalChangeLog

    with LocalChangeLog(directory, partitions=4) as log:
        log.append([], {"test": {"phase": "empty"}})
    return SchemaStore(directory, writable=True)


def register(store: SchemaStore, topic: str, columns: list[tuple[str, str]],
             table: TableId = TABLE) -> None:
    """Register ``topic``'s value schema for ``columns`` (name, logical type) the way the
    PostgreSQL connector does (cdc/avro.py)."""
    from cdc.avro import value_schema

    schema = TableSchema("src", "db", table,
                         tuple(Column(name, ColumnType(kind), nullable=name != "id")
                               for name, kind in columns), ("id",))
    store.register(f"{topic}-value", value_schema(schema))


def change(key: int, seq: int, row: dict[str, Any] | None, op: str = "u",
           topic: str = TOPIC) -> Change:
    return Change(topic, "src", "public.items", key_json(key), pos(seq), row, op,
                  1_000_000 + seq)


def delta_types(sink: DeltaSink, topic: str = TOPIC) -> dict[str, str]:
    from deltalake import DeltaTable

    schema = pa.schema(DeltaTable(str(sink.table_path(topic))).schema().to_arrow())
    return {f.name: str(f.type) for f in schema if f.name not in sink.reserved}


@pytest.mark.parametrize("mode", MODES)
def test_schema_changes_mid_stream(tmp_path: Path, mode: str) -> None:
    store = new_store(tmp_path / "log")
    sink = DeltaSink("wh", tmp_path / "wh", tables={}, mode=mode, buckets=4,  # type: ignore[arg-type]
                     log_path=tmp_path / "log")
    register(store, TOPIC, [("id", "int32"), ("name", "string"), ("qty", "int32"),
                            ("price", "float64")])
    v1 = {1: {"id": 1, "name": "a", "qty": 5, "price": 1.5},
          2: {"id": 2, "name": "b", "qty": 6, "price": 2.25}}
    sink.apply([change(k, 1, row, "c") for k, row in v1.items()])
    assert delta_types(sink) == {"id": "int64", "name": "string", "qty": "int64",
                                 "price": "double"}
    # v2: note added, name dropped, price renamed to cost, qty retyped to text
    register(store, TOPIC, [("id", "int32"), ("qty", "string"), ("cost", "float64"),
                            ("note", "string")])
    assert delta_types(sink) == {"id": "int64", "name": "string", "qty": "int64",
                                 "price": "double"}
    v2 = {2: {"id": 2, "qty": "six", "cost": 2.5, "note": "x"},
          3: {"id": 3, "qty": "7", "cost": 3.0, "note": None}}
    sink.apply([change(k, 2, row) for k, row in v2.items()])
    assert delta_types(sink) == {"id": "int64", "name": "string", "qty": "string",
                                 "price": "double", "cost": "double", "note": "string"}
    want = {key_json(1): row_text(v1[1]), key_json(2): row_text(v2[2]),
            key_json(3): row_text(v2[3])}
    assert held_rows(sink) == want  # key 1's qty "5" is text now, read back the same
    # an old record arriving late for a key not yet written: ints fit the text column
    sink.apply([change(4, 1, {"id": 4, "name": "d", "qty": 8, "price": 4.0}, "c")])
    assert sink.read(TOPIC, [key_json(4)])[key_json(4)] == {"id": "4", "name": "d",
                                                            "qty": "8", "price": "4.0"}
    # v3: text back to integer: the column stays text (canonical text either way)
    register(store, TOPIC, [("id", "int32"), ("qty", "int64"), ("cost", "float64"),
                            ("note", "string")])
    sink.apply([change(3, 3, {"id": 3, "qty": 70, "cost": 3.5, "note": "y"})])
    assert delta_types(sink)["qty"] == "string"
    assert sink.read(TOPIC, [key_json(3)])[key_json(3)] == {"id": "3", "qty": "70",
                                                            "cost": "3.5", "note": "y"}


def test_values_that_do_not_fit_widen_the_column(tmp_path: Path) -> None:
    """Without a schema, types are inferred; a later value of another type turns the column
    into text (old rows' values become their canonical text) instead of failing."""
    sink = DeltaSink("wh", tmp_path / "wh", tables={}, mode="scd1", buckets=2)
    sink.apply([change(1, 1, {"id": 1, "n": 10, "f": 0.5, "b": True, "big": 2**64}, "c")])
    assert delta_types(sink) == {"id": "int64", "n": "int64", "f": "double", "b": "bool",
                                 "big": "string"}  # integers beyond 64 bits are text
    sink.apply([change(2, 2, {"id": 2, "n": "ten", "f": 1, "b": "maybe"}, "c")])
    assert delta_types(sink) == {"id": "int64", "n": "string", "f": "string", "b": "string",
                                 "big": "string"}
    assert held_rows(sink) == {key_json(1): {"id": "1", "n": "10", "f": "0.5", "b": "true",
                                             "big": str(2**64)},
                               key_json(2): {"id": "2", "n": "ten", "f": "1", "b": "maybe"}}


# ------------------------------------------------------------------------------ types

def _json_form(kind: str, value: Any, **params: Any) -> Any:
    ctype = ColumnType(kind, **params)
    return ctype.to_json(ctype.to_avro(value))


TYPED = [  # (column, logical type, params, values as the connector would hand them over)
    ("flag", "boolean", {}, [True, False]),
    ("small", "int16", {}, [-32768, 7]),
    ("num", "int32", {}, [2**31 - 1, -1]),
    ("big", "int64", {}, [-(2**63), 2**63 - 1]),
    ("real", "float32", {}, [1.5, float("nan")]),
    ("dbl", "float64", {}, [float("inf"), float("-inf"), -0.0, 1e300, 0.1]),
    ("price", "decimal", {"precision": 10, "scale": 2}, [decimal.Decimal("12.30"),
                                                          decimal.Decimal("NaN")]),
    ("exact", "numeric", {}, [decimal.Decimal("1" * 40 + ".5")]),
    ("Col Umn", "string", {}, ["Zoë", ""]),
    ('we.ird"name', "bytes", {}, [b"\x00\xff"]),
    ("UPPER", "json", {}, [{"k": [1, True, None]}]),
    ("u", "uuid", {}, [uuid.UUID(int=42)]),
    ("day", "date", {}, [dt.date(2024, 2, 29), "infinity"]),
    ("clock", "time", {}, [dt.time(12, 30, 1, 5)]),
    ("ts", "timestamp", {}, [dt.datetime(2024, 1, 2, 3, 4, 5, 6)]),
    ("tstz", "timestamptz", {}, [dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)]),
    ("span", "interval", {}, [Interval(14, 3, 4_000_001)]),
    ("pt", "point", {}, [(1.5, -2.0)]),
    ("tags", "array", {"element": ColumnType("int32")}, [[1, None, 3], [[1, 2], [3, 4]]]),
    ("huge", "uint64", {}, [2**64 - 1]),
]


def typed_rows() -> list[dict[str, Any]]:
    longest = max(len(values) for *_, values in TYPED)
    rows = []
    for i in range(longest):
        row: dict[str, Any] = {"id": i}
        for column, kind, params, values in TYPED:
            row[column] = None if i >= len(values) else _json_form(kind, values[i], **params)
        rows.append(row)
    return rows


@pytest.mark.parametrize("mode", MODES)
def test_types_round_trip_through_read(tmp_path: Path, mode: str) -> None:
    from cdc.avro import value_schema

    store = new_store(tmp_path / "log")
    schema = TableSchema("src", "db", TABLE, (Column("id", ColumnType("int32"), False),) + tuple(
        Column(column, ColumnType(kind, **params)) for column, kind, params, _ in TYPED),
        ("id",))
    store.register(f"{TOPIC}-value", value_schema(schema))
    sink = DeltaSink("wh", tmp_path / "wh", tables={}, mode=mode, buckets=4,  # type: ignore[arg-type]
                     log_path=tmp_path / "log")
    rows = typed_rows()
    sink.apply([change(row["id"], 1, row, "r") for row in rows])
    types = delta_types(sink)
    assert {name: types[name] for name in ("flag", "small", "num", "big", "real", "dbl")} == {
        "flag": "bool", "small": "int64", "num": "int64", "big": "int64", "real": "double",
        "dbl": "double"}
    assert {types[name] for name in types if name not in (
        "id", "flag", "small", "num", "big", "real", "dbl")} == {"string"}
    assert held_rows(sink) == {key_json(row["id"]): row_text(row) for row in rows}
    assert sink.read(TOPIC, [key_json(0)])[key_json(0)]["dbl"] == "Infinity"


def test_cell_text_matches_canonical_text() -> None:
    assert [cell_text(v) for v in (float("nan"), float("inf"), float("-inf"), -0.0, 1e300,
                                   True, 7, "x")] == [
        "NaN", "Infinity", "-Infinity", "-0.0", "1e+300", "true", "7", "x"]


def test_odd_table_names_get_their_own_tables(tmp_path: Path) -> None:
    odd = {'src.My Schema.we.ird"name': TableId("My Schema", 'we.ird"name'),
           "src.public.UPPER case": TableId("public", "UPPER case"),
           "src.public.upper case": TableId("public", "upper case"),
           "src.public.50%": TableId("public", "50%")}
    sink = DeltaSink("wh", tmp_path / "wh", tables={t: ("src", i) for t, i in odd.items()},
                     mode="scd1", buckets=2)
    for n, topic in enumerate(odd):
        sink.apply([change(1, 1, {"id": 1, "n": n}, "c", topic=topic)])
    names = sorted(p.name for p in (tmp_path / "wh").iterdir())
    assert names == sorted(["src.My~20Schema.we.ird~22name", "src.public.UPPER~20case",
                            "src.public.upper~20case", "src.public.50~25"])
    for n, topic in enumerate(odd):
        assert table_dir(tmp_path / "wh", topic).is_dir()
        assert held_rows(sink, topic) == {key_json(1): {"id": "1", "n": str(n)}}
    reopened = DeltaSink("wh", tmp_path / "wh", tables={}, mode="scd1")
    assert held_rows(reopened, "src.public.50%") == {key_json(1): {"id": "1", "n": "3"}}


# ------------------------------------------------------------------------- errors, setup

@pytest.mark.parametrize(("mode", "column"), [("scd1", "_cdc_key"), ("scd1", "_CDC_Position"),
                                              ("scd2", "valid_from"), ("scd2", "is_current")])
def test_reserved_column_is_refused(tmp_path: Path, mode: str, column: str) -> None:
    sink = DeltaSink("wh", tmp_path / "wh", tables={TOPIC: ("src", TABLE)}, mode=mode)  # type: ignore[arg-type]
    with pytest.raises(DeltaSinkError, match=f"column named {column}.*reserves") as caught:
        sink.apply([change(1, 1, {"id": 1, column: "x"}, "c")])
    assert "public.items" in str(caught.value) and "fix:" in str(caught.value)


def test_scd1_keeps_scd2_names_as_data(tmp_path: Path) -> None:
    sink = DeltaSink("wh", tmp_path / "wh", tables={}, mode="scd1")
    sink.apply([change(1, 1, {"id": 1, "valid_from": "2020", "is_current": False}, "c")])
    assert held_rows(sink) == {key_json(1): {"id": "1", "valid_from": "2020",
                                             "is_current": "false"}}


def test_check_names_the_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    sink = DeltaSink("wh", blocker / "wh", tables={TOPIC: ("src", TABLE)})
    with pytest.raises(DeltaSinkError, match="not writable") as caught:
        sink.check()
    assert "followers.wh.path" in str(caught.value)
    good = DeltaSink("wh", tmp_path / "wh", tables={TOPIC: ("src", TABLE)}, mode="scd1")
    good.check()
    good.apply([change(1, 1, {"id": 1}, "c")])
    with pytest.raises(DeltaSinkError, match="written in mode scd1") as caught:
        DeltaSink("wh", tmp_path / "wh", tables={TOPIC: ("src", TABLE)}, mode="scd2").check()
    assert "mode back to scd1" in str(caught.value)


def test_existing_tables_keep_their_bucket_count(tmp_path: Path) -> None:
    first = DeltaSink("wh", tmp_path / "wh", tables={}, mode="scd1", buckets=3)
    first.apply([change(k, 1, {"id": k}, "c") for k in range(20)])
    second = DeltaSink("wh", tmp_path / "wh", tables={}, mode="scd1", buckets=7)
    assert second.apply([change(k, 2, {"id": k, "x": 1}) for k in range(20)]).written == 20
    assert len(contents(second)) == 20  # no duplicates: same buckets as before
    assert {p.name for p in second.table_path(TOPIC).iterdir() if "=" in p.name} == {
        f"_cdc_bucket={b}" for b in range(3)}


# ------------------------------------------------------------------------------ readers

def _reader_rows(rows: list[dict[str, Any]], columns: list[str]) -> dict[str, dict[str, str]]:
    """Live rows of a reader's output as follower text, keyed by _cdc_key."""
    return {row["_cdc_key"]: {c: cell_text(row[c]) for c in columns if row.get(c) is not None}
            for row in rows if not row["_cdc_deleted"]}


def test_spark_duckdb_and_polars_read_the_tables(tmp_path: Path, spark: Any) -> None:
    import duckdb
    import polars as pl

    sink = DeltaSink("wh", tmp_path / "wh", tables={}, mode="scd1", buckets=4)
    sink.apply([change(k, 1, {"id": k, "Col Umn": f"v{k}", "amount": k * 0.5}, "c")
                for k in range(30)])
    sink.apply([change(k, 2, {"id": k, "Col Umn": None, "amount": -1.0, "new col": k % 2 == 0})
                for k in range(0, 30, 3)])  # a second schema: an added column
    sink.apply([change(k, 3, None, "d") for k in range(1, 30, 5)])
    want = held_rows(sink)
    columns = ["id", "Col Umn", "amount", "new col"]
    path = sink.table_path(TOPIC)
    files = current_files(path)
    assert files and all(Path(f).is_file() for f in files)

    frame = spark.read.option("mergeSchema", "true").parquet(*files)
    assert _reader_rows([r.asDict() for r in frame.collect()], columns) == want

    connection = duckdb.connect()
    result = connection.execute("SELECT * FROM read_parquet(?, union_by_name = true)", [files])
    names = [d[0] for d in result.description]
    assert _reader_rows([dict(zip(names, r, strict=True)) for r in result.fetchall()],
                        columns) == want

    assert _reader_rows(pl.read_delta(str(path)).to_dicts(), columns) == want
    assert current_files(tmp_path / "nothing") == []


# -------------------------------------------------------------------- vacuum and optimize

def test_optimize_and_vacuum_bound_the_files(tmp_path: Path) -> None:
    sink = DeltaSink("wh", tmp_path / "wh", tables={TOPIC: ("src", TABLE)}, mode="scd1",
                     buckets=2, tombstone_retention=3600)
    for seq in range(1, 13):  # new keys: each MERGE adds files, none is rewritten
        sink.apply([change(k, seq, {"id": k, "v": seq}) for k in range(seq * 6, seq * 6 + 6)])
    sink.apply([change(k, 20, {"id": k, "v": 20}) for k in range(6, 20)])  # rewrites files
    sink.apply([change(k, 21, None, "d") for k in (7, 8)])
    want = held_rows(sink)
    results = sink.vacuum(0, optimize=True)
    assert len(results) == 1
    result = results[0]
    assert result.live_files_before > result.live_files_after == 2  # one file per bucket
    assert result.disk_files_before > result.disk_files_after == 2
    assert result.markers_dropped == 0 and result.rows == len(want)
    assert held_rows(sink) == want
    assert apply_in_batches(sink, [], 1) == (0, 0)
    # markers go after the retention (0 here): the live rows stay the same
    expired = DeltaSink("wh", tmp_path / "wh", tables={TOPIC: ("src", TABLE)}, mode="scd1",
                        tombstone_retention=0)
    result = expired.vacuum(0)[0]
    assert result.markers_dropped == 2
    assert not any(r["_cdc_deleted"] for r in contents(expired))
    assert held_rows(expired) == want


def test_cdc_warehouse_commands(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cdc_app.cli import main

    config = tmp_path / "cdc.yaml"
    config.write_text(f"""
log: {{path: {tmp_path / 'log'}}}
sources:
  - {{name: src, kind: postgres, dsn: "postgresql://u:secret@127.0.0.1:1/db",
     tables: [public.items]}}
followers:
  wh: {{kind: delta, path: {tmp_path / 'wh'}, mode: scd2, buckets: 2}}
  cache: {{kind: redis, url: "redis://127.0.0.1:1/0"}}
""")
    sink = DeltaSink("wh", tmp_path / "wh", tables={TOPIC: ("src", TABLE)}, mode="scd2",
                     buckets=2)
    for seq in range(1, 8):
        sink.apply([change(k, seq, {"id": k, "v": seq}) for k in range(4)])
    want = held_rows(sink)
    history = len(contents(sink))
    before = sum(1 for _ in sink.table_path(TOPIC).rglob("*.parquet"))
    runner = CliRunner()
    done = runner.invoke(main, ["warehouse", "optimize", "--config", str(config),
                                "--follower", "wh", "--retain", "0"])
    assert done.exit_code == 0, done.output
    assert "src.public.items" in done.output and "live files" in done.output
    assert sum(1 for _ in sink.table_path(TOPIC).rglob("*.parquet")) < before
    assert len(current_files(sink.table_path(TOPIC))) == 2  # one per bucket
    assert held_rows(sink) == want and len(contents(sink)) == history
    done = runner.invoke(main, ["warehouse", "vacuum", "--config", str(config),
                                "--follower", "wh"])
    assert done.exit_code == 0, done.output
    done = runner.invoke(main, ["warehouse", "vacuum", "--config", str(config),
                                "--follower", "cache"])
    assert done.exit_code == 1 and "kind: delta" in done.output
    done = runner.invoke(main, ["warehouse", "vacuum", "--config", str(config),
                                "--follower", "wh", "--retain", "soon"])
    assert done.exit_code == 1 and "--retain" in done.output


def test_scd1_takes_the_newest_of_an_unfolded_batch(tmp_path: Path) -> None:
    """Two changes of one key in an scd1 batch (a caller that did not fold): the newest wins,
    the other counts as skipped, and the MERGE does not fail."""
    sink = DeltaSink("wh", tmp_path / "wh", tables={}, mode="scd1", buckets=2)
    stats = sink.apply([change(1, 5, {"id": 1, "v": 5}), change(1, 7, {"id": 1, "v": 7}),
                        change(1, 6, {"id": 1, "v": 6}), change(2, 1, None, "d")])
    assert (stats.written, stats.deleted, stats.skipped) == (1, 1, 2)
    assert held_rows(sink) == {key_json(1): {"id": "1", "v": "7"}}


def test_apply_and_vacuum_redo_a_commit_that_lost_a_race(tmp_path: Path) -> None:
    """`cdc warehouse vacuum` beside `cdc apply`: a MERGE whose commit finds the vacuum's
    commit first is redone from a fresh read of the table."""
    applier = DeltaSink("wh", tmp_path / "wh", tables={TOPIC: ("src", TABLE)}, mode="scd1",
                        buckets=2, tombstone_retention=0)
    applier.apply([change(k, 1, {"id": k}, "c") for k in range(10)])
    applier.apply([change(k, 2, None, "d") for k in range(3)])
    maintainer = DeltaSink("wh", tmp_path / "wh", tables={TOPIC: ("src", TABLE)}, mode="scd1",
                           tombstone_retention=0)
    assert maintainer.vacuum(3600)[0].markers_dropped == 3
    # the applier's table handle predates the vacuum's commit: its MERGE conflicts, is redone
    stats = applier.apply([change(k, 3, {"id": k, "x": 1}) for k in range(10)])
    assert (stats.written, stats.skipped) == (10, 0)
    applier.apply([change(1, 4, None, "d")])
    assert maintainer.vacuum(3600)[0].markers_dropped == 1  # it reads the table afresh
    assert sorted(held_rows(applier)) == sorted(key_json(k) for k in range(10) if k != 1)


def test_columns_differing_only_in_case_are_refused_with_the_fix(tmp_path: Path) -> None:
    sink = DeltaSink("wh", tmp_path / "wh", tables={}, mode="scd1")
    with pytest.raises(DeltaSinkError, match="ignore case") as caught:
        sink.apply([change(1, 1, {"id": 1, "Name": "a", "name": "b"}, "c")])
    assert "leave the table out" in str(caught.value)


def test_vacuum_deletes_files_a_crashed_writer_left_once_older_than_retain(
        tmp_path: Path) -> None:
    import os
    import shutil
    import time

    sink = DeltaSink("wh", tmp_path / "wh", tables={TOPIC: ("src", TABLE)}, mode="scd1",
                     buckets=1)
    sink.apply([change(k, 1, {"id": k}, "c") for k in range(5)])
    live = Path(current_files(sink.table_path(TOPIC))[0])
    old_orphan = live.with_name("part-00000-crashed-old.parquet")
    new_orphan = live.with_name("part-00000-crashed-new.parquet")
    for orphan in (old_orphan, new_orphan):
        shutil.copy(live, orphan)  # written by a MERGE killed before its commit
    two_hours_ago = time.time() - 7200
    os.utime(old_orphan, (two_hours_ago, two_hours_ago))
    result = sink.vacuum(3600)[0]
    assert not old_orphan.exists() and new_orphan.exists() and live.exists()
    assert (result.disk_files_before, result.disk_files_after) == (3, 2)
    assert len(held_rows(sink)) == 5


def test_fits() -> None:
    from sinks.delta import fits

    assert fits("int64", [1, None, -(2**63), 2**63 - 1])
    assert not fits("int64", [2**63]) and not fits("int64", [True]) and not fits("int64", [1.0])
    assert fits("bool", [True, None]) and not fits("bool", [1])
    assert fits("float64", [0.5, "NaN", "Infinity", "-Infinity", None])
    assert not fits("float64", [1]) and not fits("float64", ["nan"])


def test_a_schema_merging_merge_keeps_the_tables_cdc_settings(tmp_path: Path) -> None:
    """deltalake's MERGE with a schema merge drops the table's description: the sink puts it
    back, and a table whose description is gone still opens from the settings file."""
    from deltalake import DeltaTable

    from sinks.delta import SETTINGS_FILE

    sink = DeltaSink("wh", tmp_path, tables={}, buckets=4)
    sink.apply([Change(TOPIC, "shop", "public.t", key_json(1), pos(1), {"id": 1}, "c")])
    sink.apply([Change(TOPIC, "shop", "public.t", key_json(2), pos(2), {"id": 2, "new": 5},
                       "c")])
    path = sink.table_path(TOPIC)
    assert "buckets" in (DeltaTable(str(path)).metadata().description or "")
    DeltaTable(str(path)).alter.set_table_description("")  # as a crash in between leaves it
    fresh = DeltaSink("wh", tmp_path, tables={}, buckets=8)
    assert fresh.owner_groups(TOPIC) == 4 and (path / SETTINGS_FILE).exists()
    assert fresh.read(TOPIC, [key_json(2)])[key_json(2)] == {"id": "2", "new": "5"}
