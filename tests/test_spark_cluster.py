"""``cdc apply`` on a real Spark standalone cluster: a master and 2 workers of one core each
(``cdc/servers/spark.py``: pyspark's own jars started with ``spark-class``), on loopback.

* Under a PostgreSQL write load, ``cdc apply --master spark://...`` runs three followers (Redis,
  Delta SCD1, Delta SCD2) while the test SIGKILLs an executor (the worker starts another), a
  whole worker (its tasks rerun on the other; a new worker joins) and the driver (restarted from
  the checkpoints). Afterwards ``cdc verify`` exits 0 for every follower and each equals the
  table. ``spark.driver.maxResultSize`` is 1m: no record is collected to the driver.
* The same log applied in local mode and on the cluster gives identical followers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cdc.config import load_config
from cdc.servers.spark import EXECUTOR_MEMORY, ThrowawaySparkCluster
from sinks import open_sink
from tests.pgkit import (
    PROJECT,
    Capture,
    Database,
    Load,
    append_synthetic,
    assert_verified,
    cdc,
    output,
    verify_followers,
    wait_caught_up,
    wait_for,
    write_config,
)

pytestmark = [pytest.mark.timeout(1200)]

FOLLOWERS = ("cache", "warehouse", "history")


@pytest.fixture(scope="module")
def cluster() -> Any:
    pytest.importorskip("pyspark")
    with ThrowawaySparkCluster(workers=2, cores=1) as running:
        yield running


def spark_section(cluster: ThrowawaySparkCluster) -> str:
    conf = {"spark.executor.memory": EXECUTOR_MEMORY, "spark.driver.maxResultSize": "1m",
            "spark.task.maxFailures": "8", "spark.cores.max": "2",
            "spark.driver.memory": "512m", "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1"}
    lines = [f"    {key}: {json.dumps(value)}" for key, value in conf.items()]
    return f"spark:\n  master: {cluster.master_url}\n  conf:\n" + "\n".join(lines) + "\n"


def followers_section(root: Path, redis_url: str, suffix: str = "") -> str:
    return (f"followers:\n"
            f"  cache:\n    kind: redis\n    url: {redis_url}\n"
            f"    max_records_per_batch: 20000\n    trigger_interval: 300ms\n"
            f"    checkpoint: {root / ('checkpoint-cache' + suffix)}\n"
            f"  warehouse:\n    kind: delta\n    path: {root / ('warehouse' + suffix)}\n"
            f"    buckets: 4\n    max_records_per_batch: 20000\n    trigger_interval: 500ms\n"
            f"    checkpoint: {root / ('checkpoint-warehouse' + suffix)}\n"
            f"  history:\n    kind: delta\n    mode: scd2\n"
            f"    path: {root / ('history' + suffix)}\n"
            f"    buckets: 4\n    max_records_per_batch: 20000\n    trigger_interval: 500ms\n"
            f"    checkpoint: {root / ('checkpoint-history' + suffix)}\n")


class Apply:
    """One continuous ``cdc apply`` of every follower, in its own process group."""

    def __init__(self, config: Path, log_file: Path) -> None:
        self.log_file = log_file
        with open(log_file, "ab") as out:
            follow = [arg for name in FOLLOWERS for arg in ("--follower", name)]
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cdc.cli", "apply", "--config", str(config), *follow],
                stdout=out, stderr=out, cwd=PROJECT, start_new_session=True)

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def terminate(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(180)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            code = self.process.wait(30)
        return code, self.log_file.read_text(errors="replace")


def commits(checkpoint: Path) -> int:
    folder = checkpoint / "commits"
    return sum(1 for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else 0


def wait_commits(checkpoint: Path, more: int, run: Apply, timeout: float = 240) -> None:
    """Until the follower's query committed ``more`` batches beyond now."""
    target = commits(checkpoint) + more
    wait_for(lambda: commits(checkpoint) >= target or run.process.poll() is not None, timeout,
             f"{more} more batches in {checkpoint}")
    assert run.process.poll() is None, run.log_file.read_text(errors="replace")[-3000:]


def test_cluster_apply_survives_killed_executor_worker_and_driver(
        cluster: ThrowawaySparkCluster, pg_db: Database, tmp_path: Path, redis_url: str) -> None:
    pg_db.execute("""
        CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, amount numeric(12,2), note text,
                            updated timestamptz NOT NULL DEFAULT now());
        CREATE TABLE audit (seq bigserial PRIMARY KEY, id int NOT NULL, v int NOT NULL,
                            op text NOT NULL);
    """)
    pg_db.execute("INSERT INTO items (id, v, amount, note) SELECT g, 1, g / 7.0, md5(g::text) "
                  "FROM generate_series(1, 5000) g")
    config_path = write_config(tmp_path, pg_db, ["public.items"],
                               extra=spark_section(cluster) + followers_section(tmp_path,
                                                                                redis_url))
    log = tmp_path / "log"
    result = cdc("bootstrap", "--config", str(config_path))
    assert result.returncode == 0, output(result)
    capture = Capture(config_path, tmp_path / "capture.log").start()
    load = Load(pg_db, threads=2, key_changes=0.05, pause=0.01, seed=13).start()
    cache_checkpoint = tmp_path / "checkpoint-cache"
    run: Apply | None = Apply(config_path, tmp_path / "apply-1.log")
    try:
        assert run is not None
        wait_commits(cache_checkpoint, 2, run)
        executors = cluster.executor_pids()
        assert executors, cluster.log_tail()
        os.kill(executors[0], signal.SIGKILL)  # the worker starts a new executor
        wait_commits(cache_checkpoint, 3, run)
        cluster.kill_worker(0)  # its tasks rerun on the other worker
        wait_commits(cache_checkpoint, 2, run)
        cluster.start_worker()
        cluster.wait_workers(2)
        wait_commits(cache_checkpoint, 2, run)
        run.kill()  # the driver: restarted from the checkpoints
        run = Apply(config_path, tmp_path / "apply-2.log")
        wait_commits(cache_checkpoint, 2, run)
        load.finish()
        wait_caught_up(pg_db, log, timeout=180)
        verified = verify_followers(config_path, FOLLOWERS)
        code, text = run.terminate()
        run = None
    finally:
        if run is not None:
            run.kill()
        load.stop.set()
        capture_code = capture.terminate()
    assert capture_code == 0, (tmp_path / "capture.log").read_text()[-3000:]
    assert_verified(verified)
    assert code == 0, text[-3000:]
    assert load.committed > 500


def test_cluster_and_local_mode_give_identical_followers(
        cluster: ThrowawaySparkCluster, tmp_path: Path, redis_url: str) -> None:
    from tests.test_apply import write_synthetic

    config_path, workload = write_synthetic(tmp_path, redis_url)
    base = json.loads(config_path.read_text())
    append_synthetic(tmp_path / "log", workload, 60_000)
    results: dict[str, dict[str, dict[str, dict[str, str]]]] = {}
    for mode, master in (("local", "local[2]"), ("cluster", cluster.master_url)):
        root = tmp_path / mode
        db = 1 if mode == "local" else 2
        followers = {
            "cache": {"kind": "redis", "url": redis_url.rsplit("/", 1)[0] + f"/{db}",
                      "checkpoint": str(root / "cp-cache"), "max_records_per_batch": 25000},
            "warehouse": {"kind": "delta", "path": str(root / "warehouse"), "buckets": 4,
                          "checkpoint": str(root / "cp-warehouse"),
                          "max_records_per_batch": 25000},
            "history": {"kind": "delta", "mode": "scd2", "path": str(root / "history"),
                        "buckets": 4, "checkpoint": str(root / "cp-history"),
                        "max_records_per_batch": 25000}}
        config = {**base, "followers": followers,
                  "spark": {"master": master,
                            "conf": {"spark.driver.maxResultSize": "1m",
                                     "spark.driver.host": "127.0.0.1",
                                     "spark.executor.memory": EXECUTOR_MEMORY}}}
        path = tmp_path / f"{mode}.yaml"
        path.write_text(json.dumps(config))
        args = [arg for name in FOLLOWERS for arg in ("--follower", name)]
        done = cdc("apply", "--config", str(path), "--once", *args, timeout=600)
        assert done.returncode == 0, output(done)
        loaded = load_config(path)
        held: dict[str, dict[str, dict[str, str]]] = {}
        for name in FOLLOWERS:
            sink = open_sink(loaded, name)
            try:
                topics = loaded.follower_topics(name)
                held[name] = {f"{topic} {key}": row for topic in topics
                              for key, row in sink.read(topic, list(sink.keys(topic))).items()}
            finally:
                sink.close()
        results[mode] = held
    for name in FOLLOWERS:
        assert len(results["local"][name]) > 200, name
        assert results["local"][name] == results["cluster"][name], name
    # the SCD2 history (every version, not only the live rows) is the same too
    history = {}
    for mode in ("local", "cluster"):
        sink = open_sink(load_config(tmp_path / f"{mode}.yaml"), "history")
        topic = next(iter(load_config(tmp_path / f"{mode}.yaml").follower_topics("history")))
        table = sink.history(topic)  # type: ignore[attr-defined]
        rows = table.drop_columns(["_cdc_applied_ms"]).to_pylist()  # wall clock of the write
        history[mode] = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
    assert len(history["local"]) > len(results["local"]["history"])
    assert history["local"] == history["cluster"]
