"""Which runner a follower gets: chosen once when ``cdc apply`` starts (the rules are in
``spark_apply/runners/__init__.py``'s docstring)."""

from __future__ import annotations

from cdc.config import Config
from cdc.sink import Placement, Sink
from spark_apply.runners.base import Runner
from spark_apply.runners.executors import ExecutorRunner, KafkaRunner
from spark_apply.runners.inline import VIEW_SLOTS, InlineRunner
from spark_apply.runners.process import ProcessRunner
from spark_apply.tasks import FollowerHandle


def reads_with_spark_kafka(config: Config, name: str, sink: Sink, local: bool) -> bool:
    """Whether follower ``name`` reads with Spark's Kafka source: its ``reader`` is
    ``spark-kafka``, or ``auto`` with a Kafka log on a cluster (in local mode the apply process
    reads the log once for every follower). Never for a sink written in the driver."""
    if not sink.placement.splits:
        return False
    follower = config.follower(name)
    return follower.reader == "spark-kafka" or (
        follower.reader == "auto" and config.log.backend == "kafka" and not local)


def choose(config: Config, name: str, sink: Sink, handle: FollowerHandle, master: str) -> Runner:
    """Follower ``name``'s runner (see the module docstring)."""
    local = master.startswith("local")
    if sink.placement is Placement.DRIVER:
        return InlineRunner(name, sink)
    if reads_with_spark_kafka(config, name, sink, local):
        return KafkaRunner(handle, sink)
    if not local:
        return ExecutorRunner(handle, sink)
    if sink.placement is Placement.WHOLE_BATCH:
        return InlineRunner(name, sink, VIEW_SLOTS)
    return ProcessRunner(handle, split_keys=sink.placement is Placement.BY_OWNER)


