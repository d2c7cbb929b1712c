"""A follower that stopped for longer than the log keeps tombstones may have missed deletes:
`cdc apply` refuses it with "rebuild this follower" — on both log backends — and a follower
rebuilt as the message says equals the log again."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from cdc.config import load_config
from cdc.log.open import log_settings
from cdc.sink import open_sink
from cdc_app.synthetic import ORDERS, Workload
from spark_apply.jobs import ApplyJob
from spark_apply.stale import FollowerStaleError
from tests.kafkakit import kafka_yaml
from tests.pgkit import append_synthetic, cdc, latest_rows, output, read_topic

RETENTION = 2.0


def _config(tmp_path: Path, log: dict[str, Any], redis_url: str) -> Path:
    path = tmp_path / "cdc.yaml"
    path.write_text(json.dumps({
        "log": {"path": str(tmp_path / "log"), "partitions": 4,
                "tombstone_retention": f"{RETENTION}s", **log},
        "sources": [{"name": "shop", "kind": "postgres", "dsn": "postgresql://cdc@h/shop",
                     "tables": ["public.orders"]}],
        "followers": {"cache": {"kind": "redis", "url": redis_url}}}))
    return path


def _apply(spark: Any, config: Path) -> None:
    job = ApplyJob.prepare(load_config(config), ["cache"])
    try:
        job.start(spark, once=True)
        job.wait()
    finally:
        job.stop_queries()
        job.close()


@pytest.mark.parametrize("backend", ["local", "kafka"])
def test_a_follower_stopped_longer_than_the_tombstone_retention_is_refused(
        backend: str, tmp_path: Path, redis_url: str, spark: Any,
        request: pytest.FixtureRequest) -> None:
    log = kafka_yaml(request.getfixturevalue("kafka_broker")) if backend == "kafka" else {}
    config = _config(tmp_path, log, redis_url)
    settings = log_settings(load_config(config))
    workload = Workload(keys=200)
    append_synthetic(settings, workload, 300)
    _apply(spark, config)
    append_synthetic(settings, workload, 50)
    _apply(spark, config)  # back within the retention: resumes

    append_synthetic(settings, workload, 100)  # changes (deletes too) it will not see in time
    time.sleep(RETENTION + 0.5)
    with pytest.raises(FollowerStaleError, match="stopped too long ago") as raised:
        _apply(spark, config)
    assert "rebuild this follower" in raised.value.fix
    result = cdc("apply", "--config", str(config), "--follower", "cache", "--once")
    assert result.returncode == 1, output(result)
    assert "rebuild this follower" in output(result) and "Traceback" not in output(result)

    # rebuilt as the message says: emptied, checkpoint deleted, read from offset 0
    redis.Redis.from_url(redis_url).flushall()
    shutil.rmtree(load_config(config).follower_checkpoint("cache"))
    _apply(spark, config)
    sink = open_sink(load_config(config), "cache")
    expected = latest_rows(read_topic(settings, ORDERS.topic))
    assert set(sink.keys(ORDERS.topic)) == set(expected) and len(expected) > 100
