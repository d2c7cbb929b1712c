"""The runners that write on Spark's executors: a cluster master's followers and views, and any
follower that reads with Spark's Kafka source.

* :class:`ExecutorRunner`: one Spark job per batch; its tasks read their ranges themselves
  through the log contract (``spark_apply/tasks.py``: by log partition, by owner, or one task
  for a view), fold and write them. The records never pass through the driver.
* :class:`KafkaRunner`: the batch read by Spark's Kafka source, decoded in the JVM, folded and
  written by ``mapInArrow`` tasks (``spark_apply/kafka_read.py``).

Both read for themselves (:attr:`Runner.takes` ``RANGES``): on a cluster each follower's
tasks read its ranges on the executors, where the records are, rather than through the driver.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

from cdc.sink import Placement, Sink
from spark_apply.runners.base import Runner
from spark_apply.shared_read import Batch, Takes
from spark_apply.tasks import FollowerHandle, TaskReport, plan_tasks, run_task


class _SparkRunner(Runner):
    takes = Takes.RANGES
    needs_spark = True

    def __init__(self, handle: FollowerHandle, sink: Sink) -> None:
        super().__init__(handle.name)
        self.handle = handle
        self.sink = sink
        self.spark: Any = None
        self.batches = 0

    def attach(self, spark: Any) -> None:
        """The SparkSession its jobs run on (started by the loop before the first batch)."""
        self.spark = spark

    def run(self, batch: Batch) -> TaskReport:
        self.batches += 1
        total = TaskReport()
        if batch.ranges:
            for report in self._reports(batch):
                total.merge(report)
        return total

    def _reports(self, batch: Batch) -> list[TaskReport]:
        raise NotImplementedError


class ExecutorRunner(_SparkRunner):
    """Tasks on the executors read, fold and write the batch (see the module docstring)."""

    def _reports(self, batch: Batch) -> list[TaskReport]:
        context = self.spark.sparkContext
        placement = self.sink.placement
        tasks = plan_tasks(batch.ranges, max(1, context.defaultParallelism) if placement.splits
                           else 1, placement is Placement.BY_OWNER, batch.behind)
        context.setJobDescription(f"cdc apply {self.name}: batch {self.batches}, "
                                  f"{len(tasks)} tasks")
        handle = self.handle
        reports: list[TaskReport] = (context.parallelize(tasks, len(tasks))
                                     .map(lambda task: run_task(handle, task)).collect())
        return reports


class KafkaRunner(_SparkRunner):
    """Spark's Kafka source reads the batch; ``mapInArrow`` tasks fold and write it."""

    def __init__(self, handle: FollowerHandle, sink: Sink) -> None:
        super().__init__(handle, sink)
        self._reader: Any = None
        self._store: Any = None

    def attach(self, spark: Any) -> None:
        """Also open the runner's own reader of the log for its schema store: its batches run
        on the follower's thread, beside the loop's reads, and a reader is not shared between
        threads."""
        super().attach(spark)
        from cdc.log.open import reader_from

        self._reader = reader_from(json.loads(self.handle.log))
        self._store = self._reader.schemas()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _reports(self, batch: Batch) -> list[TaskReport]:
        from cdc.log.open import kafka_topic_name
        from spark_apply.kafka_read import REPORT_SCHEMA, kafka_frame, kafka_task, topic_schema_ids

        settings = json.loads(self.handle.log)
        store = self._schemas()
        topics = sorted({item.topic for item in batch.ranges})
        frame = kafka_frame(self.spark, settings, batch.ranges, topic_schema_ids(store, topics),
                            store)
        names = {kafka_topic_name(settings, item.topic): item for item in batch.ranges}
        if self.sink.placement is Placement.BY_OWNER:
            frame = frame.repartition(max(1, self.spark.sparkContext.defaultParallelism),
                                      self._owner_column(names))
        self.spark.sparkContext.setJobDescription(
            f"cdc apply {self.name}: batch {self.batches} from Kafka")
        rows = frame.mapInArrow(kafka_task(self.handle, names), REPORT_SCHEMA).collect()
        return [pickle.loads(row["report"]) for row in rows]  # noqa: S301 - our own tasks'

    def _owner_column(self, names: dict[str, Any]) -> Any:
        """``Sink.owner``'s grouping in the JVM: :func:`cdc.sink.key_group` with
        ``owner_groups(topic)`` (``pmod(crc32(key), groups)``)."""
        from pyspark.sql import functions as F

        crc = F.crc32(F.col("key").cast("binary"))
        owner = crc
        for name, item in names.items():
            groups = self.sink.owner_groups(item.topic)
            if groups:
                owner = F.when(F.col("topic") == name, F.pmod(crc, F.lit(groups))).otherwise(owner)
        return owner

    def _schemas(self) -> Any:
        """The log's schema store (the runner's own, opened by :meth:`attach`; it re-reads
        itself when asked for a new id)."""
        if self._store is None:
            raise RuntimeError(f"follower {self.name}: the Kafka runner was not attached")
        return self._store
