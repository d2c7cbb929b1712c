"""The local applier (``spark_apply/local_apply.py``): a follower's small batches in local mode
run in a process of its own. Its contract, checked without Spark: it applies a batch as a task
would (the follower then equals the log), a task's CdcError comes back as that error, a child
killed between batches or in the middle of one is replaced and the batch rerun, and closing it
leaves no process behind."""

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
from cdc.log.open import log_settings
from cdc.reading import open_log
from cdc.sink import open_sink
from cdc_app.synthetic import ORDERS
from spark_apply.jobs import _task_error
from spark_apply.local_apply import LocalApplier
from spark_apply.source import SourceOptions, complete_end, plan
from spark_apply.tasks import ApplyTask, FollowerHandle
from tests.test_apply import write_synthetic

pytestmark = pytest.mark.servers


def whole_log_task(settings: str) -> ApplyTask:
    reader, _ = open_log(settings)
    state = reader.committed()
    parts = plan(state, {"topics": {}}, complete_end(state, SourceOptions(settings)), 1)
    return ApplyTask(tuple(item for part in parts for item in part.ranges))


def test_the_local_applier_applies_reports_and_survives_its_child_dying(
        tmp_path: Path, redis_url: str) -> None:
    config_path, workload = write_synthetic(tmp_path, redis_url, changes=2000)
    config = load_config(config_path)
    settings = json.dumps(log_settings(config))
    handle = FollowerHandle(config, "cache", settings, "token-1")
    task = whole_log_task(settings)
    applier = LocalApplier(handle)
    try:
        report = applier.run(task)
        assert report.records >= 2000 and report.written > 0
        sink = open_sink(config, "cache")
        assert set(sink.keys(ORDERS.topic)) == {f'{{"id":{key}}}' for key in workload.rows}
        first = applier._process.pid

        os.kill(first, signal.SIGKILL)  # between batches: the next batch gets a new child
        time.sleep(0.5)
        again = applier.run(task)
        assert again.skipped == again.changes > 0  # the gate: nothing new to write
        assert applier._process.pid != first

        # in the middle of a batch: the child is frozen before it can answer, then killed;
        # run() sees the pipe close and reruns the task in a third child
        second = applier._process.pid
        os.kill(second, signal.SIGSTOP)
        answers: list[Any] = []
        running = threading.Thread(target=lambda: answers.append(applier.run(task)))
        running.start()
        time.sleep(0.5)
        assert running.is_alive() and not answers  # waiting on the frozen child
        os.kill(second, signal.SIGKILL)
        running.join(60)
        assert answers and answers[0].changes > 0
        assert applier._process.pid not in (first, second)

        broken = LocalApplier(FollowerHandle(config, "cache", json.dumps(
            {"backend": "local", "path": str(tmp_path / "no-such-log")}), "token-2"))
        try:
            with pytest.raises(RuntimeError) as failed:
                broken.run(task)
            error = _task_error(failed.value)  # the CdcError the task raised, rebuilt
            assert error is not None and "log" in str(error).lower(), failed.value
        finally:
            broken.close()
    finally:
        process = applier._process
        applier.close()
    assert process is None or not process.is_alive()
    sink.close()
