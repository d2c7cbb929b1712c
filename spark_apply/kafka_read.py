"""A Kafka log's micro-batch read by Spark's own Kafka source, Avro decoded in the JVM.

``cdc apply``'s loop plans every batch (``spark_apply/planning.py``): offset ranges of the log's
partitions, whole source transactions only. For a Kafka log (``log.backend: kafka``,
``followers.<name>.reader: spark-kafka``) the records of those ranges are then read by Spark's
Kafka source as a *batch* query with exactly those offsets (``assign``, ``startingOffsets``,
``endingOffsets``: ``start <= offset < end``), so the executors fetch from the brokers in the
JVM:

* ``kafka.isolation.level`` is ``read_committed``: only records of committed capture
  transactions (the planned ends never pass the last stable offset anyway).
* ``failOnDataLoss`` is ``false``: the row topics are compacted, so offsets inside a planned
  range may be gone by the time it is read (superseded records, or a replay long after). That is
  the log's contract — the newest record of every key stays — not data loss; a follower that
  stopped for longer than the tombstone retention is refused before (``refuse_if_stale``).
* Offsets live in the follower's progress record (``spark_apply/progress.py``), never in Kafka
  consumer groups.

Decoding in the JVM: a value is Confluent's wire format (magic byte 0, a 4-byte schema id, the
Avro body). For every value schema id the log's schema store holds for the batch's topics,
``from_avro(substring(value, 6), schema)`` decodes the rows of that id (``when(schema_id = id,
...)``), one struct column per id (``e<id>``: the envelope without ``before``). The schema handed
to ``from_avro`` is the writer's with its ``decimal`` logical types removed, so Spark hands the
raw Avro datum to Python (bytes, not a rounded Spark decimal); :func:`avro_datum` then gives
exactly what ``cdc/avroreader.py`` would have produced, and the column types' ``to_json``
make the row's JSON form. The schema set is read again for every micro-batch, so a schema id
registered mid-stream (``ALTER TABLE ... ADD COLUMN``) is decoded from the next batch on. A value
whose schema id was not in the set (registered after this batch was planned: impossible for a
committed record, kept as a safety net) or whose schema the JVM path does not cover (unions of
two non-null types) is decoded in Python from its bytes.

The decoded rows go to :func:`spark_apply.tasks.run_rows` through ``mapInArrow``: Spark's Kafka
source makes one Spark partition per Kafka partition, and the log puts each key in one partition,
so each task folds whole keys. A sink that splits by owner (Delta) is repartitioned first by an
owner expression computed in the JVM (``Sink.owner``'s rule).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from decimal import Context
from typing import Any

from cdc.connect import canonical_key
from cdc.log.open import kafka_topic_name, spark_kafka_options
from cdc.reading import Range, open_log, row_builder, to_change

#: the header holding a record's position bytes (``cdc/log/kafka.py``)
POSITION_HEADER = "cdc.position"


def offsets_options(settings: Mapping[str, Any], ranges: Sequence[Range]) -> dict[str, str]:
    """``assign``/``startingOffsets``/``endingOffsets`` of Spark's Kafka source for ``ranges``."""
    assign: dict[str, list[int]] = {}
    starts: dict[str, dict[str, int]] = {}
    ends: dict[str, dict[str, int]] = {}
    for item in ranges:
        name = kafka_topic_name(dict(settings), item.topic)
        assign.setdefault(name, []).append(item.partition)
        starts.setdefault(name, {})[str(item.partition)] = item.start
        ends.setdefault(name, {})[str(item.partition)] = item.end
    return {"assign": json.dumps(assign), "startingOffsets": json.dumps(starts),
            "endingOffsets": json.dumps(ends)}


def strip_logical(schema: Any) -> Any:
    """``schema`` (parsed Avro JSON) without ``decimal`` logical types (the raw bytes remain)."""
    if isinstance(schema, list):
        return [strip_logical(member) for member in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strip_logical(value) for key, value in schema.items()
           if not (key in ("logicalType", "precision", "scale")
                   and schema.get("logicalType") == "decimal")}
    if "fields" in out:
        out["fields"] = [{**field, "type": strip_logical(field["type"])}
                         for field in schema["fields"]]
    return out


def jvm_decodable(schema: Any) -> bool:
    """Whether Spark's ``from_avro`` gives a datum :func:`avro_datum` can restore: every union
    is ``null`` plus at most one other type."""
    if isinstance(schema, list):
        if len([m for m in schema if m != "null"]) > 1:
            return False
        return all(jvm_decodable(member) for member in schema)
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "record":
            return all(jvm_decodable(field["type"]) for field in schema["fields"])
        if kind == "array":
            return jvm_decodable(schema["items"])
        if kind == "map":
            return jvm_decodable(schema["values"])
        return jvm_decodable(kind) if isinstance(kind, (dict, list)) else True
    return True


def value_schema(envelope: Mapping[str, Any]) -> Any:
    """The ``after`` image's record schema of an envelope schema."""
    after = next(f for f in envelope["fields"] if f["name"] == "after")
    return next(m for m in after["type"] if m != "null")


def avro_datum(schema: Any, value: Any, named: dict[str, Any] | None = None) -> Any:
    """Spark's decoding of ``value`` (Arrow → Python) turned into the Avro datum our own reader
    gives: decimals from their two's-complement bytes, maps from (key, value) pairs to dicts."""
    named = {} if named is None else named
    if value is None:
        return None
    if isinstance(schema, list):
        member = next((m for m in schema if m != "null"), "null")
        return avro_datum(member, value, named)
    if isinstance(schema, str):
        found = named.get(schema)
        return value if found is None else avro_datum(found, value, named)
    kind = schema.get("type")
    if isinstance(kind, (dict, list)):
        return avro_datum(kind, value, named)
    if kind == "bytes" and schema.get("logicalType") == "decimal":
        context = Context(prec=int(schema["precision"]))
        unscaled = int.from_bytes(value, "big", signed=True)
        return context.create_decimal(unscaled).scaleb(-int(schema.get("scale", 0)), context)
    if kind == "record":
        if "name" in schema:
            named[schema["name"]] = schema
            if schema.get("namespace"):
                named[f"{schema['namespace']}.{schema['name']}"] = schema
        return {field["name"]: avro_datum(field["type"], value.get(field["name"]), named)
                for field in schema["fields"]}
    if kind == "array":
        return [avro_datum(schema["items"], item, named) for item in value]
    if kind == "map":
        pairs = value.items() if isinstance(value, dict) else value
        return {key: avro_datum(schema["values"], item, named) for key, item in pairs}
    if kind in ("enum", "fixed") and "name" in schema:
        named[schema["name"]] = schema
    return value


class JvmDecoded:
    """What a task needs to turn one ``e<id>`` struct into a row: per schema id, the value
    schema (with logical types) and the codec's row builder."""

    def __init__(self, store: Any, codec: Any) -> None:
        self.store = store
        self.codec = codec
        self._plans: dict[int, tuple[Any, Any]] = {}

    def plan(self, schema_id: int) -> tuple[Any, Any]:
        found = self._plans.get(schema_id)
        if found is None:
            envelope = self.store.get(schema_id).schema
            found = self._plans[schema_id] = (value_schema(envelope),
                                              row_builder(self.codec.columns_of(schema_id)))
        return found

    def image(self, schema_id: int, after: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The after image's JSON form from Spark's struct (None stays None)."""
        if after is None:
            return None
        schema, build = self.plan(schema_id)
        return build(avro_datum(schema, after))  # type: ignore[no-any-return]


def kafka_frame(spark: Any, settings: Mapping[str, Any], ranges: Sequence[Range],
                schema_ids: Sequence[int], store: Any) -> Any:
    """The batch's records as a DataFrame: ``topic`` (the Kafka topic), ``partition``,
    ``offset``, ``key`` (string), ``position`` (binary), ``value`` (binary: kept for the ids the
    JVM does not decode), ``sid`` (the value's schema id; NULL for a tombstone) and one struct
    column ``e<id>`` per decoded schema id."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    reader = spark.read.format("kafka")
    options = {**spark_kafka_options(dict(settings)), **offsets_options(settings, ranges),
               "kafka.isolation.level": "read_committed", "failOnDataLoss": "false",
               "includeHeaders": "true"}
    for key, value in options.items():
        reader = reader.option(key, value)
    raw = reader.load()
    sid = F.when(F.substring("value", 1, 1) == F.lit(b"\x00"),
                 F.conv(F.hex(F.substring("value", 2, 4)), 16, 10).cast("int"))
    body = F.expr("substring(value, 6)")
    position = F.expr(f"filter(headers, h -> h.key = '{POSITION_HEADER}')[0].value")
    columns = [F.col("topic"), F.col("partition"), F.col("offset"),
               F.col("key").cast("string").alias("key"), position.alias("position"),
               F.col("value"), sid.alias("sid")]
    for schema_id in sorted(set(schema_ids)):
        envelope = store.get(schema_id).schema
        if not jvm_decodable(envelope):
            continue
        plain = json.dumps(strip_logical(envelope))
        envelope_col = from_avro(body, plain, {"mode": "FAILFAST"})
        columns.append(F.when(sid == schema_id, envelope_col.dropFields("before"))
                       .alias(f"e{schema_id}"))
    return raw.select(*columns)


def topic_schema_ids(store: Any, topics: Sequence[str]) -> list[int]:
    """Every value schema id the store holds for ``topics`` (subjects ``<topic>-value``)."""
    ids: list[int] = []
    for topic in topics:
        ids.extend(registered.id for registered in store.versions(f"{topic}-value"))
    return ids


# ------------------------------------------------------------------------------- the task side

#: what each ``mapInArrow`` task returns: its :class:`~spark_apply.tasks.TaskReport`, pickled
REPORT_SCHEMA = "report binary"


def kafka_task(handle: Any, topics: Mapping[str, Range]) -> Any:
    """The ``mapInArrow`` function of one micro-batch: ``topics`` maps each Kafka topic name to
    a :class:`Range` carrying its log topic, source and table (offsets unused)."""

    def run(batches: Any) -> Any:
        import pickle

        import pyarrow as pa

        from spark_apply.tasks import apply_records

        decoder = KafkaRowDecoder(handle)
        records = (
            (topics[row["topic"]], canonical_key(row["key"].encode()), row["position"] or b"",
             row["offset"], row)
            for batch in batches for row in batch.to_pylist())
        report = apply_records(handle, records, decoder.change)
        yield pa.RecordBatch.from_pydict({"report": [pickle.dumps(report)]})

    return run


class KafkaRowDecoder:
    """Turns a decoded row of :func:`kafka_frame` into a :class:`~cdc.sink.Change` (a
    :data:`cdc.reading.Decode`): the JVM's decoding where it has one, else the one read path's
    (:class:`cdc.reading.Decoder`) from the value bytes; either way :func:`cdc.reading.to_change`
    makes the change."""

    def __init__(self, handle: Any) -> None:
        reader, self.python = open_log(handle.log)
        self.jvm = JvmDecoded(reader.schemas(), self.python.codec)

    def change(self, item: Range, key: bytes, position: bytes, row: Mapping[str, Any]) -> Any:
        """The row's change (``None`` for a truncate)."""
        value = row["value"]
        if value is None:  # a tombstone
            return to_change(item, key, position, "", None, None)
        schema_id = row["sid"]
        envelope = row.get(f"e{schema_id}") if schema_id is not None else None
        if envelope is None:  # not decoded in the JVM: the one read path decodes it
            return self.python.change(item, key, position, bytes(value))
        op, ts = envelope["op"], envelope["source"]["ts_ms"]
        image = self.jvm.image(schema_id, envelope["after"]) if op in ("c", "u", "r") else None
        return to_change(item, key, position, op, image, ts)
