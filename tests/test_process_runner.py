"""The process runner (``spark_apply/runners/process.py``): in local mode each follower's batches
are written by a process of its own, fed the changes the apply loop read and decoded once. Its
contract, checked without Spark: it writes a batch as a task would (the follower then equals the
log), a CdcError raised there comes back as that error, a child killed between batches or in the
middle of one is replaced and the batch written again, and closing it leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cdc.config import load_config
from cdc.errors import CdcError
from cdc.log.open import log_settings
from cdc.reading import open_log
from cdc.sink import open_sink
from cdc_app.synthetic import ORDERS
from spark_apply.planning import Member, plan_cycle
from spark_apply.runners import process
from spark_apply.runners.process import ProcessRunner
from spark_apply.shared_read import Batch, Takes, cut
from spark_apply.tasks import FollowerHandle
from tests.test_apply import write_synthetic

pytestmark = pytest.mark.servers


def whole_log_batch(settings: str, shared: bool = False) -> Batch:
    """The whole log as follower ``cache``'s one batch: only its ranges (it alone reads the
    share), or (``shared``) the fold of the loop's one read, shared with a second follower."""
    reader, decoder = open_log(settings)
    state = reader.committed()
    members = [Member(name, {"topics": {}}, frozenset({"shop"}), None, 10**9)
               for name in (("cache", "twin") if shared else ("cache",))]
    (read,) = plan_cycle(reader, state, members)
    batch = cut(reader, decoder, state, read, lambda _: Takes.FOLDED, lambda _: False)["cache"]
    assert (batch.shipment is not None) is shared and batch.ranges
    return batch


def test_the_process_runner_writes_reports_and_survives_its_child_dying(
        tmp_path: Path, redis_url: str) -> None:
    config_path, workload = write_synthetic(tmp_path, redis_url, changes=2000)
    config = load_config(config_path)
    settings = json.dumps(log_settings(config))
    handle = FollowerHandle(config, "cache", settings, "token-1")
    task = whole_log_batch(settings, shared=True)
    applier = ProcessRunner(handle)
    try:
        report = applier.run(task)
        assert report.records >= 2000 and report.written > 0
        sink = open_sink(config, "cache")
        assert set(sink.keys(ORDERS.topic)) == {f'{{"id":{key}}}' for key in workload.rows}
        first = applier.pids[0]

        os.kill(first, signal.SIGKILL)  # between batches: the next batch gets a new child
        time.sleep(0.5)
        again = applier.run(task)
        assert again.skipped == again.changes > 0  # the gate: nothing new to write
        assert applier.pids[0] != first

        # in the middle of a batch: the child is frozen before it can answer, then killed;
        # run() sees the pipe close and reruns the task in a third child
        second = applier.pids[0]
        os.kill(second, signal.SIGSTOP)
        answers: list[Any] = []
        running = threading.Thread(target=lambda: answers.append(applier.run(task)))
        running.start()
        time.sleep(0.5)
        assert running.is_alive() and not answers  # waiting on the frozen child
        os.kill(second, signal.SIGKILL)
        running.join(60)
        assert answers and answers[0].changes > 0
        assert applier.pids[0] not in (first, second)

        unreachable = config.model_copy(update={"followers": {"cache": config.followers[
            "cache"].model_copy(update={"url": "redis://127.0.0.1:1/0"})}})
        broken = ProcessRunner(FollowerHandle(unreachable, "cache", settings, "token-2"))
        try:
            with pytest.raises(CdcError) as failed:  # the sink's own error, rebuilt here
                broken.run(task)
            assert "redis" in str(failed.value).lower() and failed.value.fix, failed.value
        finally:
            broken.close()
    finally:
        children = [child.process for child in applier._children]
        applier.close()
    assert all(child is None or not child.is_alive() for child in children)
    sink.close()


@pytest.mark.parametrize("shared", [True, False], ids=["fold-shipped", "ranges-read"])
def test_a_large_batch_is_split_between_writers_by_key_owner(
        tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch, shared: bool) -> None:
    """At least ``SPLIT_AT`` winners (records, for ranges read by the children): two children
    write at once, each its keys; together the follower equals the log and the reports add up
    to one batch's -- whether the loop shipped the fold or the children read the ranges."""
    config_path, workload = write_synthetic(tmp_path, redis_url, changes=2000)
    config = load_config(config_path)
    settings = json.dumps(log_settings(config))
    task = whole_log_batch(settings, shared)
    records = sum(item.end - item.start for item in task.ranges)
    monkeypatch.setattr(process, "SPLIT_AT", 100)
    applier = ProcessRunner(FollowerHandle(config, "cache", settings, "token-3"), writers=2,
                            split_keys=True)
    try:
        report = applier.run(task)
        assert len(applier.pids) == 2
        assert report.records == records  # counted once, not per writer
        assert report.changes == report.written + report.deleted > 0
        if task.shipment is not None:
            assert report.changes == len(task.shipment.folded.winners)
        sink = open_sink(config, "cache")
        assert set(sink.keys(ORDERS.topic)) == {f'{{"id":{key}}}' for key in workload.rows}
        sink.close()
    finally:
        applier.close()
