"""The ``cdc`` Spark data source (spark_apply/source.py) against real local logs and real Spark.

Logs are written directly with :class:`LocalChangeLog` and the :class:`EventCodec` from the
synthetic ``shop.public.orders`` workload. Every Spark test shares the session fixture ``spark``;
queries run with ``availableNow`` (a few batches each) except one continuous query.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from cdc.avro import EventCodec  # noqa: E402
from cdc.errors import LogError  # noqa: E402
from cdc.events import TableId  # noqa: E402
from cdc.log.compaction import compact  # noqa: E402
from cdc.log.local import LocalChangeLog, LocalChangeLogReader  # noqa: E402
from cdc.log.schemas import SchemaStore  # noqa: E402
from cdc_app.synthetic import ORDERS, Workload  # noqa: E402
from spark_apply.source import (  # noqa: E402
    SCHEMA,
    SourceOptionError,
    fair_share,
    next_end,
    parse_options,
)

SOURCE = "shop"
Row = dict[str, Any]


class Log:
    """A writable log with the orders topic and a deterministic workload."""

    def __init__(self, path: Path, partitions: int = 4, segment_bytes: int = 64 * 1024**2,
                 keys: int = 50) -> None:
        self.path = path
        self.writer = LocalChangeLog(path, partitions=partitions, segment_bytes=segment_bytes,
                                     fsync=False)
        self.codec = EventCodec(SchemaStore(path, writable=True))
        self.workload = Workload(keys=keys)
        self.writer.ensure_topic(ORDERS.topic, {"source": SOURCE, "table": str(ORDERS.table),
                                                "connector": "postgresql"})

    def append(self, changes: int, schema: Any = ORDERS) -> None:
        records = []
        for event in self.workload.events(changes):
            if schema is not ORDERS:
                event.schema = schema
            records.extend(self.codec.records(event))
        self.writer.append(records, {SOURCE: {"seq": self.workload.seq}})

    def stored(self, start: dict[str, dict[str, int]] | None = None) -> set[tuple[str, int, int]]:
        """(topic, partition, offset) of every record now in the log at or past ``start``."""
        reader = LocalChangeLogReader(self.path)
        out = set()
        for info in reader.topics():
            for partition in range(info.partitions):
                first = (start or {}).get(info.name, {}).get(str(partition), 0)
                out.update((info.name, partition, record.offset)
                           for record in reader.iter_partition(info.name, partition, first))
        return out


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    opened = Log(tmp_path / "log")
    yield opened
    opened.writer.close()


def stream(spark: Any, path: Path, checkpoint: Path, **options: str) -> list[list[Row]]:
    """Run an ``availableNow`` query from ``checkpoint`` to its end; the rows of each batch."""
    batches: list[list[Row]] = []

    def collect(frame: Any, batch_id: int) -> None:
        batches.append([row.asDict() for row in frame.collect()])

    reader = spark.readStream.format("cdc").option("path", str(path))
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    assert query.awaitTermination(120), "availableNow did not exit once caught up"
    assert query.exception() is None
    return batches


def records(batches: list[list[Row]]) -> list[Row]:
    return [row for batch in batches for row in batch if row["op"] != "w"]


def ids(rows: list[Row]) -> list[tuple[str, int, int]]:
    return [(row["topic"], row["partition"], row["offset"]) for row in rows]


def watermarks(batch: list[Row]) -> dict[str, Any]:
    return {row["source"]: json.loads(row["after"]) for row in batch if row["op"] == "w"}


# ----------------------------------------------------------------------------------- Spark

def test_every_record_once_across_batches(spark: Any, log: Log, tmp_path: Path) -> None:
    log.append(300)
    expected = log.stored()
    batches = stream(spark, log.path, tmp_path / "ck", maxRecordsPerTrigger="100")

    got = ids(records(batches))
    assert len(got) == len(set(got)) and set(got) == expected
    assert len(batches) == -(-len(expected) // 100)  # ceil: full batches until caught up
    assert all(len([r for r in batch if r["op"] != "w"]) <= 100 for batch in batches)
    # the budget is shared: the first batch takes 25 offsets from each of the 4 partitions
    first = batches[0]
    assert sorted({r["partition"] for r in first}) == [0, 1, 2, 3]
    assert all(sum(r["partition"] == p for r in first) == 25 for p in range(4))
    # only the batch that reached the log's end carries the watermark
    assert [watermarks(b) for b in batches[:-1]] == [{}] * (len(batches) - 1)
    assert watermarks(batches[-1]) == {SOURCE: {"seq": 300}}

    # the rows say what `cdc log dump` says (the same decoding)
    from cdc_app.logview import dump_lines

    dumped = {(d["topic"], d["partition"], d["offset"]): d
              for d in map(json.loads, dump_lines(log.writer))}
    for row in records(batches):
        line = dumped[(row["topic"], row["partition"], row["offset"])]
        value = line["value"]
        assert row["source"] == SOURCE and row["table"] == "public.orders"
        assert json.loads(row["key"]) == line["key"]
        assert row["timestamp_ms"] > 0 and isinstance(row["position"], bytearray | bytes)
        if value is None:
            assert row["op"] is None and row["after"] is None and row["source_ts_ms"] is None
        else:
            assert row["op"] == value["op"]
            assert row["source_ts_ms"] == value["source"]["ts_ms"]
            after = None if row["after"] is None else json.loads(row["after"])
            assert after == (value["after"] if value["op"] != "d" else None)
    ops = {row["op"] for row in records(batches)}
    assert {"c", "u", "d", None} <= ops


def test_restart_resumes_exactly_after_appends_and_compaction(
        spark: Any, tmp_path: Path) -> None:
    log = Log(tmp_path / "log", segment_bytes=4096, keys=30)
    try:
        log.append(200)
        checkpoint = tmp_path / "ck"
        first = ids(records(stream(spark, log.path, checkpoint, maxRecordsPerTrigger="150")))
        assert set(first) == log.stored()
        ends = LocalChangeLogReader(log.path).state().topics[ORDERS.topic].parts
        resume = {ORDERS.topic: {str(i): part.next_offset for i, part in enumerate(ends)}}

        log.append(200)
        report = compact(log.path, tombstone_retention=0)
        assert report.records_after < report.records_before  # compaction removed records
        expected = log.stored(resume)  # what survived compaction past the resume points
        batches = stream(spark, log.path, checkpoint, maxRecordsPerTrigger="150")
        second = ids(records(batches))
        assert len(second) == len(set(second)) and set(second) == expected
        assert not set(first) & set(second)
        assert watermarks(batches[-1]) == {SOURCE: {"seq": 400}}
    finally:
        log.writer.close()


def test_watermark_of_an_idle_source(spark: Any, log: Log, tmp_path: Path) -> None:
    log.append(20)
    checkpoint = tmp_path / "ck"
    assert watermarks(stream(spark, log.path, checkpoint)[-1]) == {SOURCE: {"seq": 20}}

    # a heartbeat: only the source offsets move, no record is appended
    log.writer.append([], {SOURCE: {"seq": 20, "heartbeat": 1}})
    batches = stream(spark, log.path, checkpoint)
    assert batches == [[{
        "topic": None, "partition": None, "offset": None, "timestamp_ms": None,
        "source": SOURCE, "table": None, "key": None, "position": None, "op": "w",
        "after": '{"heartbeat":1,"seq":20}', "source_ts_ms": None}]]
    assert stream(spark, log.path, checkpoint) == []  # nothing new: no batch at all


def test_continuous_query_picks_up_new_topics_of_its_sources(
        spark: Any, log: Log, tmp_path: Path) -> None:
    log.append(10)
    seen: list[Row] = []
    query = (spark.readStream.format("cdc").option("sources", SOURCE).load(str(log.path))
             .writeStream.foreachBatch(lambda frame, _: seen.extend(
                 row.asDict() for row in frame.collect()))
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_for(lambda: watermarks(seen) == {SOURCE: {"seq": 10}}, query)
        items = dataclasses.replace(ORDERS, table=TableId("public", "items"))
        other = dataclasses.replace(ORDERS, source="other")
        for schema, source in ((items, SOURCE), (other, "other")):
            log.writer.ensure_topic(schema.topic, {"source": source, "table": "public.x"})
        log.append(5, items)
        log.append(5, other)
        log.writer.append([], {"other": {"seq": 1}})
        wait_for(lambda: any(row["topic"] == items.topic for row in seen), query)
        wait_for(lambda: watermarks(seen).get(SOURCE) == {"seq": 20}, query)
    finally:
        query.stop()
    topics = {row["topic"] for row in seen if row["op"] != "w"}
    assert topics == {ORDERS.topic, items.topic}
    assert {row["source"] for row in seen} == {SOURCE}
    assert sum(row["topic"] == items.topic for row in seen) == len(
        [t for t in log.stored() if t[0] == items.topic])


def wait_for(condition: Any, query: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert query.exception() is None and query.isActive
        assert time.monotonic() < deadline, "the continuous query did not deliver in time"
        time.sleep(0.1)


def test_batch_read_of_the_whole_log(spark: Any, log: Log) -> None:
    log.append(50)
    frame = spark.read.format("cdc").option("topics", ORDERS.topic).load(str(log.path))
    assert frame.schema == SCHEMA
    rows = [row.asDict() for row in frame.collect()]
    assert set(ids(records([rows]))) == log.stored()
    assert watermarks(rows) == {SOURCE: {"seq": 50}}


@pytest.mark.parametrize(("options", "message"), [
    ({}, "the cdc source needs the change log's directory"),
    ({"path": "/nonexistent/log"}, "no change log at /nonexistent/log"),
    ({"path": "{log}", "maxRecordsPerTrigger": "lots"}, "must be a positive integer"),
])
def test_bad_options_through_spark(spark: Any, log: Log, options: dict[str, str],
                                   message: str) -> None:
    reader = spark.readStream.format("cdc")
    for key, value in options.items():
        reader = reader.option(key, value.replace("{log}", str(log.path)))
    with pytest.raises(Exception) as raised:  # noqa: B017 (Spark wraps the CdcError)
        reader.load()
    assert message in str(raised.value)
    assert "fix:" in str(raised.value)


# ------------------------------------------------------------------------------ no Spark

@pytest.mark.parametrize(("options", "error", "message"), [
    ({"path": "{log}", "maxRecordsPerTrigger": "0"}, SourceOptionError,
     "maxRecordsPerTrigger must be a positive integer, got '0'"),
    ({"path": "{log}", "splits": "-1"}, SourceOptionError, "splits must be a positive integer"),
    ({"path": "{log}", "maxrecordspertriger": "5"}, SourceOptionError,
     "has no option maxrecordspertriger"),
    ({"path": "{log}", "topics": " , "}, SourceOptionError, "option 'topics' is empty"),
    ({"path": "{log}", "topics": "a", "sources": "b"}, SourceOptionError, "not both"),
    ({"path": "{log}", "topics": "shop.public.nope"}, LogError, "no topic shop.public.nope"),
    ({"path": "{log}/topics"}, LogError, "is not a change log"),
])
def test_bad_options(log: Log, options: dict[str, str], error: type[Exception],
                     message: str) -> None:
    with pytest.raises(error) as raised:
        parse_options({k: v.replace("{log}", str(log.path)) for k, v in options.items()})
    assert message in str(raised.value)


def test_options_are_case_insensitive(log: Log) -> None:
    parsed = parse_options({"PATH": str(log.path), "MaxRecordsPerTrigger": "7",
                            "sources": "shop, other,shop"})
    assert (parsed.max_records, parsed.sources, parsed.topics) == (7, ("shop", "other"), None)


def test_fair_share() -> None:
    pending = {("t", "0"): 100, ("t", "1"): 3, ("t", "2"): 0, ("u", "0"): 40}
    assert fair_share(pending, 60) == {("t", "0"): 29, ("t", "1"): 3, ("u", "0"): 28}
    assert sum(fair_share(pending, 1000).values()) == 143
    # a budget smaller than the partition count: who goes first rotates
    firsts = {tuple(k for k, v in fair_share(pending, 1, rotate).items() if v)
              for rotate in range(3)}
    assert len(firsts) == 3


def test_next_end() -> None:
    complete = {"topics": {"t": {"0": 10, "1": 4}}, "watermarks": {"s": {"lsn": 9}}}
    start = {"topics": {"t": {"0": 2}, "gone": {"0": 5}}}
    assert next_end(start, complete, None) == {
        "topics": {"gone": {"0": 5}, "t": {"0": 10, "1": 4}}, "watermarks": {"s": {"lsn": 9}}}
    cut = next_end(start, complete, 6)
    assert cut == {"topics": {"gone": {"0": 5}, "t": {"0": 5, "1": 3}}}  # no watermark
    with pytest.raises(LogError, match="the log was replaced"):
        next_end({"topics": {"t": {"0": 11}}}, complete, None)


@pytest.mark.parametrize(("arrays", "count"), [(False, 300), (True, 3)])
def test_projection_reads_what_fastavro_reads(arrays: bool, count: int) -> None:
    """The compiled reader (op, after, source.ts_ms) agrees with fastavro on random envelopes
    of every column type, arrays of each included."""
    import io

    import fastavro
    from fastavro.utils import generate_many

    from cdc.avro import value_schema
    from cdc.avroreader import compile_projection
    from tests.test_avrowriter import all_types_schema

    envelope = value_schema(all_types_schema(arrays))
    project = compile_projection(envelope)
    parsed = fastavro.parse_schema(envelope)
    checked = 0
    for datum in generate_many(parsed, count):
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, datum)
        want = fastavro.schemaless_reader(io.BytesIO(buffer.getvalue()), parsed, None)
        assert project(b"\0\0\0\0\1" + buffer.getvalue(), 5) == (
            want["op"], want["after"], want["source"]["ts_ms"])
        checked += 1
    assert checked == count


def test_decoder_falls_back_to_fastavro_and_agrees(log: Log) -> None:
    """Rows decoded through the projection and through EventCodec.decode_value are equal."""
    from cdc.reading import Decoder

    log.append(60)
    reader = LocalChangeLogReader(log.path)
    fast = Decoder(EventCodec(SchemaStore(log.path)))
    slow = Decoder(EventCodec(SchemaStore(log.path)))
    values = [r.value for p in range(4) for r in reader.iter_partition(ORDERS.topic, p)
              if r.value is not None]
    for value in values[:3]:
        slow._plans[int.from_bytes(value[1:5], "big")] = (None, [])  # force the fallback
    assert [fast.decode(v) for v in values] == [slow.decode(v) for v in values]
    assert {fast.decode(v)[0] for v in values} == {"c", "u", "d"}


@pytest.mark.parametrize(("arrays", "count"), [(False, 600), (True, 30)])
def test_compiled_decoding_equals_the_python_projection(arrays: bool, count: int) -> None:
    """The compiled program (``cdc/_fast.pyx``, what ``Decoder.decode_image`` runs) gives the
    same op, image (values, column order and Python types) and ts_ms as the generated Python
    projection plus row builder (the ``CDC_PURE_PYTHON=1`` path), on random envelopes of every
    column type."""
    import io

    import fastavro
    from fastavro.utils import generate_many

    from cdc.avro import value_schema
    from cdc.avroreader import RUN_PROGRAM, compile_program, compile_projection
    from cdc.reading import row_builder as _row_builder
    from cdc.types import ColumnType
    from tests.test_avrowriter import all_types_schema

    if RUN_PROGRAM is None:
        pytest.skip("the compiled extension is not built (CDC_PURE_PYTHON=1?)")
    envelope = value_schema(all_types_schema(arrays))
    value = envelope["fields"][0]["type"][1]
    columns = [(f.get("cdc.column", f["name"]), f["name"],
                ColumnType.from_description(f["cdc.type"])) for f in value["fields"]]
    project, build = compile_projection(envelope), _row_builder(columns)
    program = compile_program(envelope, columns)
    parsed = fastavro.parse_schema(envelope)
    images = 0
    for datum in generate_many(parsed, count):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, datum)
        data = b"\0\0\0\0\1" + out.getvalue()
        op, image, ts = project(data, 5)
        want = (op, None if image is None else build(image), ts)
        got = RUN_PROGRAM(program, data, 5)
        assert got == want
        if image is not None:
            images += 1
            assert list(got[1]) == list(want[1])
            assert [type(v) for v in got[1].values()] == [type(v) for v in want[1].values()]
    assert images > count // 4


def test_a_process_keeps_a_few_logs_open_and_closes_the_least_recently_used(
        tmp_path: Path) -> None:
    """cdc/reading.py's open_log: the same reader again for the same log; beyond KEPT_OPEN logs
    the least recently used is closed (a process running many applies, e.g. a test session,
    would otherwise hold every log's files and Kafka consumers), and opened anew when asked."""
    from cdc import reading

    logs = [Log(tmp_path / f"log{i}") for i in range(reading.KEPT_OPEN + 1)]
    settings = [json.dumps({"backend": "local", "path": str(log.path)}) for log in logs]
    try:
        first = reading.open_log(settings[0])[0]
        assert reading.open_log(settings[0])[0] is first
        closed: list[bool] = []
        first.close = lambda: closed.append(True)  # type: ignore[method-assign]
        for text in settings[1:]:
            reading.open_log(text)
        assert closed == [True] and settings[0] not in reading._OPEN
        assert len([s for s in settings if s in reading._OPEN]) == reading.KEPT_OPEN
        again = reading.open_log(settings[0])[0]
        assert again is not first and again.topics() == first.topics()
    finally:
        for log in logs:
            log.writer.close()
