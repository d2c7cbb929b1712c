"""``cdc apply`` on a real Spark standalone cluster: a master and 2 workers of one core each
(``cdc_app/servers/spark.py``: pyspark's own jars started with ``spark-class``), on loopback.

* Under a PostgreSQL write load of small transactions and of 20,000-row ``UPDATE``s (over
  100,000 changes in all: tens of megabytes of records, many times
  ``spark.driver.maxResultSize``, which is 1m: no record is collected to the driver; a million
  changes through the cluster is ``bench/apply.py --master cluster --changes 1000000``),
  ``cdc apply --master spark://...`` runs four followers (Redis, Delta SCD1, Delta SCD2, search)
  with speculative task duplicates on, while the test SIGKILLs (through ``tests/kills.py``, each
  while a batch is in flight) an executor (the worker starts another), a whole live worker
  (its tasks rerun on the other; a new worker joins) and the driver (restarted from the
  checkpoints). Afterwards ``cdc verify`` exits 0 for every follower and each equals the table,
  and Spark's own event log shows every follower's writes ran as executor tasks, none in the
  driver.
* One workload applied in local mode and on the cluster from the local log, and on the cluster
  from a Kafka log through Spark's Kafka source, gives identical followers.
* A view of every construct docs/views.md lists as incremental (``tests/test_views.py``:
  ``CONSTRUCTS``), one ``cdc apply`` on the cluster under one random PostgreSQL load of
  inserts, updates, deletes and primary-key changes: ``cdc verify --view`` finds each equal to
  the leader running the same SQL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cdc.config import load_config
from cdc.sink import open_sink
from cdc_app.servers.spark import EXECUTOR_MEMORY, ThrowawaySparkCluster
from cdc_app.synthetic import ORDERS, Workload
from tests.kafkakit import drop_kafka_topics, kafka_yaml
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
from tests.sparkkit import (
    apply_once,
    batches,
    committed_batches,
    driver_watch,
    group_freeze,
    tree_watch,
)
from views.host import Lease, LeaseRecord

pytestmark = [pytest.mark.timeout(1200)]

FOLLOWERS = ("cache", "warehouse", "history", "search")


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with nothing installed: what the cluster's workers run (``import cdc``
    fails there), so ``cdc apply`` must ship itself (spark_apply/ship.py)."""
    venv = tmp_path_factory.mktemp("workers") / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    probe = subprocess.run([str(python), "-c", "import cdc"], cwd=venv, env=env,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "No module named 'cdc'" in probe.stderr, probe.stderr
    return python


@pytest.fixture(scope="module")
def cluster(bare_python: Path) -> Any:
    pytest.importorskip("pyspark")
    with ThrowawaySparkCluster(workers=2, cores=1, worker_python=bare_python) as running:
        yield running


def spark_section(cluster: ThrowawaySparkCluster, events: Path) -> str:
    """The cluster's settings; Spark's own event log (its listener's record of every task,
    where it ran and its metrics) into ``events``."""
    events.mkdir(parents=True, exist_ok=True)
    conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false",
            "spark.executor.memory": EXECUTOR_MEMORY, "spark.driver.maxResultSize": "1m",
            "spark.task.maxFailures": "8", "spark.cores.max": "2",
            "spark.driver.memory": "512m", "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            # speculative duplicates of slow tasks write beside the originals: the gates hold
            "spark.speculation": "true", "spark.speculation.multiplier": "1.2",
            "spark.speculation.quantile": "0.5", "spark.speculation.interval": "200ms"}
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
            f"    checkpoint: {root / ('checkpoint-history' + suffix)}\n"
            f"  search:\n    kind: search\n    path: {root / ('search' + suffix)}\n"
            f"    max_records_per_batch: 20000\n    trigger_interval: 500ms\n"
            f"    checkpoint: {root / ('checkpoint-search' + suffix)}\n")


class Apply:
    """One continuous ``cdc apply`` of every follower, in its own process group."""

    def __init__(self, config: Path, log_file: Path) -> None:
        self.log_file = log_file
        with open(log_file, "ab") as out:
            follow = [arg for name in FOLLOWERS for arg in ("--follower", name)]
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cdc_app.cli", "apply", "--config", str(config), *follow],
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


def kill_executor(cluster: ThrowawaySparkCluster, roots: list[Path], phase: str) -> None:
    """SIGKILL an executor while a batch of the queries checkpointing under ``roots`` is in
    flight (the worker starts another; its tasks run again)."""
    executors = cluster.executor_pids()
    assert executors, cluster.log_tail()
    victim = executors[0]
    with tree_watch("Spark executor", lambda: [victim], roots) as watch:
        watch.wait_moving()
        watch.kill(phase, lambda: os.kill(victim, signal.SIGKILL),
                   lambda: committed_batches(roots), aim=60, read_before=True)


def kill_worker(cluster: ThrowawaySparkCluster, roots: list[Path], phase: str) -> None:
    """SIGKILL a whole live worker with an executor (a lost machine) while a batch is in
    flight: its tasks rerun on the other."""
    index = next(i for i in cluster.live_workers() if cluster.executor_pids(i))
    worker = cluster.worker_processes[index]
    assert worker is not None
    with tree_watch("Spark worker", lambda: [worker.pid], roots) as watch:
        watch.wait_moving()
        watch.kill(phase, lambda: cluster.kill_worker(index),
                   lambda: committed_batches(roots), aim=60, read_before=True)
    assert worker.poll() is not None and index not in cluster.live_workers()


def commits(checkpoint: Path) -> int:
    """Batches the follower wrote (its progress record's count)."""
    return batches([checkpoint])[1]


def wait_commits(checkpoint: Path, more: int, run: Apply, timeout: float = 240) -> None:
    """Until the follower wrote ``more`` batches beyond now."""
    target = commits(checkpoint) + more
    wait_for(lambda: commits(checkpoint) >= target or run.process.poll() is not None, timeout,
             f"{more} more batches in {checkpoint}")
    assert run.process.poll() is None, run.log_file.read_text(errors="replace")[-3000:]


@pytest.mark.parametrize("backend", ["local", "kafka"])
def test_cluster_apply_survives_killed_executor_worker_and_driver(
        cluster: ThrowawaySparkCluster, pg_db: Database, tmp_path: Path, redis_url: str,
        backend: str, request: pytest.FixtureRequest) -> None:
    """The local log carries over 100,000 changes (the bulk UPDATEs); the Kafka log, read by
    Spark's Kafka source, the small transactions only (its reader is the slower one here)."""
    pg_db.execute("""
        CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, amount numeric(12,2), note text,
                            updated timestamptz NOT NULL DEFAULT now());
        CREATE TABLE audit (seq bigserial PRIMARY KEY, id int NOT NULL, v int NOT NULL,
                            op text NOT NULL);
    """)
    temp_before = set(Path(tempfile.gettempdir()).glob("spark-*"))
    seeded = SEEDED if backend == "local" else 5000
    pg_db.execute("INSERT INTO items (id, v, amount, note) SELECT g, 1, g / 7.0, md5(g::text) "
                  f"FROM generate_series(1, {seeded}) g")
    options = kafka_yaml(request.getfixturevalue("kafka_broker")) if backend == "kafka" else {}
    config_path = write_config(tmp_path, pg_db, ["public.items"], log_options=options,
                               extra=spark_section(cluster, tmp_path / "events") +
                               followers_section(tmp_path,
                                                                                redis_url))
    log: Any = {**options, "path": str(tmp_path / "log")} if options else tmp_path / "log"
    result = cdc("bootstrap", "--config", str(config_path))
    assert result.returncode == 0, output(result)
    capture = Capture(config_path, tmp_path / "capture.log").start()
    load = Load(pg_db, threads=2, key_changes=0.05, pause=0.05, seed=13).start()
    bulk = BulkUpdates(pg_db, rounds=5 if backend == "local" else 0).start()
    cache_checkpoint = tmp_path / "checkpoint-cache"
    roots = [tmp_path / f"checkpoint-{name}" for name in FOLLOWERS]
    phase = f"mid-batch ({backend} log)"
    began = time.monotonic()

    def step(what: str) -> None:  # where the time goes (pytest -s)
        print(f"cluster test [{backend}] {time.monotonic() - began:6.1f} s: {what}", flush=True)

    run: Apply | None = Apply(config_path, tmp_path / "apply-1.log")
    try:
        assert run is not None
        wait_commits(cache_checkpoint, 2, run)
        step("two batches committed")
        kill_executor(cluster, roots, phase)
        step("executor killed")
        wait_commits(cache_checkpoint, 2, run)
        step("two more batches")
        # a whole live worker with an executor (a lost machine): its tasks rerun on the other
        kill_worker(cluster, roots, phase)
        wait_commits(cache_checkpoint, 1, run)
        step("worker killed, a batch more")
        cluster.wait_worker(cluster.start_worker())  # a new one joins
        wait_commits(cache_checkpoint, 1, run)
        step("a new worker, a batch more")
        # the driver: restarted from the checkpoints, it replays the batch in flight
        with driver_watch(roots) as watch:
            watch.wait_moving()
            watch.kill(phase, run.kill, lambda: committed_batches(roots), aim=60,
                       freeze=group_freeze(run.process.pid))
        run = Apply(config_path, tmp_path / "apply-2.log")
        wait_commits(cache_checkpoint, 1, run)
        step("driver killed, restarted, a batch committed")
        bulk.finish()
        load.finish()
        wait_caught_up(pg_db, log, timeout=300)
        step("capture caught up")
        verified = verify_followers(config_path, FOLLOWERS)
        step("verified")
        code, text = run.terminate()
        step("apply stopped")
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
    if backend == "local":  # through the cluster with maxResultSize=1m
        assert bulk.changes + SEEDED >= 100_000
    # Spark's own record: every follower's writes ran as tasks on the executors, none in the
    # driver (search included: each task writes the index shards of the keys it owns)
    for name in FOLLOWERS:
        tasks = apply_tasks(tmp_path / "events", name)
        assert tasks["executor"] >= 4 and tasks["driver"] == 0, (name, tasks)
    # the killed driver's copy of the shipped archive stayed in its scratch directory (removed
    # by the next start), not in the system's temporary directory
    left = [path for path in set(Path(tempfile.gettempdir()).glob("spark-*")) - temp_before
            if any(path.glob("cdc-env-*.zip"))]
    assert left == []


#: rows of ``items`` before the load (snapshotted by ``cdc bootstrap``)
SEEDED = 20_000


class BulkUpdates:
    """Large transactions beside the small ones of :class:`Load`: ``UPDATE`` of every seeded row,
    one transaction each, a pause between them so the kills land among them."""

    def __init__(self, db: Database, rounds: int = 5, pause: float = 4.0) -> None:
        self.db, self.rounds, self.pause = db, rounds, pause
        self.changes = 0
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> BulkUpdates:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            with self.db.connect() as conn:
                for _ in range(self.rounds):
                    with conn.transaction():
                        done = conn.execute(f"UPDATE items SET v = v + 1, amount = amount + 1 "
                                            f"WHERE id <= {SEEDED}")
                        self.changes += done.rowcount
                    time.sleep(self.pause)
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.errors.append(exc)

    def finish(self) -> None:
        self._thread.join(600)
        assert not self._thread.is_alive(), "the bulk updates did not finish"
        if self.errors:
            raise self.errors[0]


def test_local_mode_cluster_and_kafka_give_identical_followers(
        cluster: ThrowawaySparkCluster, tmp_path: Path, redis_url: str,
        kafka_broker: Any, spark: Any) -> None:
    """One workload, three ways: the local log in local mode (in this process, on the tests'
    shared local session), the local log on the cluster, and a Kafka log on the cluster read by
    Spark's Kafka source (in smaller batches). The followers are identical, SCD2 history
    included."""
    from tests.test_apply import write_synthetic

    config_path, workload = write_synthetic(tmp_path, redis_url)
    base = json.loads(config_path.read_text())
    append_synthetic(tmp_path / "log", workload, 20_000)
    kafka_log = {**kafka_yaml(kafka_broker), "partitions": 4}
    drop_kafka_topics(kafka_broker, [ORDERS.topic])  # the synthetic topic's name is fixed
    try:
        append_synthetic(kafka_log, Workload(keys=300), 20_000)  # the same seed: the same events
        paths = {mode: mode_config(cluster, tmp_path, base, redis_url, mode, kafka_log)
                 for mode in ("local", "cluster", "kafka")}
        # the two cluster applications side by side, a core each (one submitted with
        # spark-submit, as docs/followers.md shows); local mode meanwhile
        runs = [submit_once(cluster, paths["cluster"]), start_once(paths["kafka"])]
        apply_once(paths["local"], *FOLLOWERS)
        for run in runs:
            finish_once(run)
        assert cluster.directory is not None  # the executors ran from the shipped archive
        assert list(cluster.directory.glob("worker-*/app-*/*/cdcenv/cdc/__init__.py"))
        results = {mode: held_by_followers(path) for mode, path in paths.items()}
    finally:
        drop_kafka_topics(kafka_broker, [ORDERS.topic])
    for name in FOLLOWERS:
        assert len(results["local"][name]) > 200, name
        assert results["local"][name] == results["cluster"][name] == results["kafka"][name], name
    # the SCD2 history (every version, not only the live rows) is the same too
    history = {}
    for mode in ("local", "cluster", "kafka"):
        config = load_config(tmp_path / f"{mode}.yaml")
        sink = open_sink(config, "history")
        table = sink.history(next(iter(config.follower_topics("history"))))  # type: ignore
        rows = table.drop_columns(["_cdc_applied_ms"]).to_pylist()  # wall clock of the write
        history[mode] = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
    assert len(history["local"]) > len(results["local"]["history"])
    assert history["local"] == history["cluster"] == history["kafka"]


def mode_config(cluster: ThrowawaySparkCluster, tmp_path: Path, base: dict[str, Any],
                redis_url: str, mode: str, kafka_log: dict[str, Any]) -> Path:
    """The config of the three followers in ``mode`` (written next to ``tmp_path``)."""
    root = tmp_path / mode
    db = {"local": 1, "cluster": 2, "kafka": 5}[mode]
    per_batch = 8000 if mode == "kafka" else 10000  # two or three batches
    common: dict[str, Any] = {"max_records_per_batch": per_batch}
    if mode == "kafka":
        common["reader"] = "spark-kafka"
    followers = {
        "cache": {"kind": "redis", "url": redis_url.rsplit("/", 1)[0] + f"/{db}",
                  "checkpoint": str(root / "cp-cache"), **common},
        "warehouse": {"kind": "delta", "path": str(root / "warehouse"), "buckets": 4,
                      "checkpoint": str(root / "cp-warehouse"), **common},
        "history": {"kind": "delta", "mode": "scd2", "path": str(root / "history"),
                    "buckets": 4, "checkpoint": str(root / "cp-history"), **common},
        "search": {"kind": "search", "path": str(root / "search"),
                   "checkpoint": str(root / "cp-search"), **common}}
    config = {**base, "followers": followers,
              "spark": {"master": "local[2]" if mode == "local" else cluster.master_url,
                        "conf": {"spark.driver.maxResultSize": "1m",
                                 "spark.driver.host": "127.0.0.1",
                                 "spark.task.maxFailures": "8", "spark.cores.max": "1",
                                 "spark.executor.memory": EXECUTOR_MEMORY}}}
    if mode == "kafka":
        config["log"] = kafka_log
    path = tmp_path / f"{mode}.yaml"
    path.write_text(json.dumps(config))
    return path


def start_once(path: Path) -> subprocess.Popen[str]:
    """``cdc apply --once`` of the three followers, a process of its own."""
    args = [arg for name in FOLLOWERS for arg in ("--follower", name)]
    return subprocess.Popen([sys.executable, "-m", "cdc_app.cli", "apply", "--config", str(path),
                             "--once", *args], cwd=PROJECT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def submit_once(cluster: ThrowawaySparkCluster, path: Path) -> subprocess.Popen[str]:
    """``cdc apply --once`` of the three followers through ``spark-submit``, with the archive
    ``cdc pack`` makes (the documented invocation, docs/followers.md)."""
    import cdc_app.cli
    from cdc_app.servers.spark import spark_home
    from spark_apply.ship import UNPACKED, pack

    args = [arg for name in FOLLOWERS for arg in ("--follower", name)]
    command = [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.master_url,
               "--archives", f"{pack()}#{UNPACKED}",
               "--conf", f"spark.executorEnv.PYTHONPATH={UNPACKED}",
               "--conf", "spark.pyspark.python=python3",
               "--conf", f"spark.pyspark.driver.python={sys.executable}",
               str(Path(cdc_app.cli.__file__)), "apply", "--config", str(path), "--once", *args]
    # as from the activated virtualenv: Spark's Python workers on the driver (planning the cdc
    # source) run `python3` too, which must be the driver's
    env = {**os.environ, "PYSPARK_DRIVER_PYTHON": sys.executable, "PYSPARK_PYTHON": "python3",
           "SPARK_HOME": str(spark_home()),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.Popen(command, cwd=PROJECT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish_once(run: subprocess.Popen[str]) -> None:
    try:
        text, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 0, text[-3000:]


def apply_tasks(events: Path, follower: str) -> dict[str, int]:
    """From Spark's event logs in ``events`` (one per application, a killed driver's still
    ``.inprogress``): the successful tasks of ``follower``'s apply jobs (their description is
    ``cdc apply <follower>: batch ...``) by where they ran — ``driver`` or ``executor``."""
    counts = {"driver": 0, "executor": 0}
    for log in (path for path in events.rglob("*") if path.is_file()):
        stages: set[tuple[str, int]] = set()
        for line in log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # the last line of a killed driver's log
            kind = event.get("Event")
            if kind == "SparkListenerJobStart":
                description = (event.get("Properties") or {}).get("spark.job.description", "")
                if description.startswith(f"cdc apply {follower}: batch"):
                    stages.update((log.name, stage) for stage in event["Stage IDs"])
            elif (kind == "SparkListenerTaskEnd" and (log.name, event["Stage ID"]) in stages
                  and event["Task End Reason"]["Reason"] == "Success"):
                where = event["Task Info"]["Executor ID"]
                counts["driver" if where == "driver" else "executor"] += 1
    return counts


def held_by_followers(path: Path) -> dict[str, dict[str, dict[str, str]]]:
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
    return held


def test_views_of_every_construct_survive_kills_and_equal_the_leader(
        cluster: ThrowawaySparkCluster, pg_db: Database, tmp_path: Path) -> None:
    """The randomized differential test of docs/views.md's coverage table, on PostgreSQL, and
    the views' proof on the cluster: one random load, one ``cdc apply`` of every view (each
    batch one executor task), an executor, a worker and the driver SIGKILLed while a batch of
    the join + aggregate view is in flight; between the driver's runs its scratch directory and
    every worker's work directory are deleted, and the restarted apply goes on from its
    committed batches (the views' state is beside the log, not there). Then each view equals
    the leader running the same SQL: every one in the SQL follower, the join + aggregate in
    Delta too."""
    from tests.test_views import CONSTRUCTS, SHOP, ShopLoad

    pg_db.execute(SHOP)
    views = sorted(set(CONSTRUCTS.values()))
    sqlite = tmp_path / "reporting.sqlite"
    # the kills aim at the join + aggregate view; the others in fewer, larger batches (a task
    # each per batch, on two one-core executors)
    section = views_section(pg_db.source, views, {"revenue": "500ms"},
                            {"revenue": "[reporting, warehouse]"})
    config = write_config(tmp_path, pg_db, ["public.customers", "public.orders"], extra=(
        spark_section(cluster, tmp_path / "events")
        + f"followers:\n  reporting:\n    kind: sql\n    url: sqlite:///{sqlite}\n"
        + f"  warehouse:\n    kind: delta\n    path: {tmp_path / 'warehouse'}\n" + section))
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    capture = Capture(config, tmp_path / "capture.log").start()
    # the join + aggregate view's query first: its batches (and the kills aimed at them) go on
    # while the others' queries start, one after another
    follow = [arg for name in sorted(views, key=lambda name: name != "revenue")
              for arg in ("--view", name)]
    roots = [tmp_path / "state" / "apply" / "view-revenue"]
    phase = "mid-batch (a view)"

    def start() -> subprocess.Popen[bytes]:
        with open(tmp_path / "apply.log", "ab") as out:
            return subprocess.Popen([sys.executable, "-m", "cdc_app.cli", "apply", "--config",
                                     str(config), *follow], stdout=out, stderr=out,
                                    cwd=PROJECT, start_new_session=True)

    def more_batches(count: int) -> None:
        target = committed_batches(roots) + count
        wait_for(lambda: committed_batches(roots) >= target or apply.poll() is not None, 240,
                 f"{count} more batches of the view")
        assert apply.poll() is None, (tmp_path / "apply.log").read_text()[-3000:]

    apply = start()
    load = ShopLoad(pg_db).start()
    verified: dict[tuple[str, str], subprocess.CompletedProcess[str]] = {}
    try:
        more_batches(2)
        kill_executor(cluster, roots, phase)
        more_batches(1)
        kill_worker(cluster, roots, phase)
        cluster.wait_worker(cluster.start_worker())
        more_batches(1)
        state = tmp_path / "state" / "views" / "revenue.duckdb"
        killed = kill_view_host(state, roots, phase)
        wait_for(lambda: (Lease(state).read() or killed).epoch > killed.epoch, 120,
                 "a host taking the killed one's lease over")
        more_batches(1)
        taken = Lease(state).read()
        assert taken is not None and taken.live() and taken.pid != killed.pid
        with driver_watch(roots) as watch:
            watch.wait_moving()
            watch.kill(phase, lambda: (os.killpg(apply.pid, signal.SIGKILL), apply.wait(30)),
                       lambda: committed_batches(roots), aim=60,
                       freeze=group_freeze(apply.pid))
        # the driver's scratch and every worker's work directory gone: nothing of the views'
        # state was there (the restart does not rebuild from offset 0: it would be refused
        # without the state, and it goes on from the committed batches)
        shutil.rmtree(tmp_path / "state" / "spark", ignore_errors=True)
        assert cluster.directory is not None
        for work in (path for path in cluster.directory.glob("worker-*") if path.is_dir()):
            for item in work.iterdir():
                shutil.rmtree(item, ignore_errors=True)
        assert (tmp_path / "state" / "views" / "revenue.duckdb").exists()
        committed = committed_batches(roots)
        apply = start()
        more_batches(1)
        assert committed_batches(roots) > committed
        load.finish()
        assert load.transactions > 50
        wait_caught_up(pg_db, tmp_path / "log")
        verified = verify_views(config, [(name, "reporting") for name in views]
                                + [("revenue", "warehouse")])
    finally:
        load.finish()
        apply_code = stop(apply)
        capture_code = capture.terminate()
    assert_views_verified(verified, len(views) + 1)
    assert apply_code == 0, (tmp_path / "apply.log").read_text(errors="replace")[-3000:]
    for name in views:  # the states' hosts stopped with the run that used them
        record = Lease(tmp_path / "state" / "views" / f"{name}.duckdb").read()
        assert record is not None and record.kind == "host" and not record.live(), record
    assert capture_code == 0
    # Spark's own record: every view's batches ran as executor tasks, none in the driver
    for name in views:
        tasks = apply_tasks(tmp_path / "events", name)
        assert tasks["executor"] >= 1 and tasks["driver"] == 0, (name, tasks)


def kill_view_host(state: Path, roots: list[Path], phase: str) -> LeaseRecord:
    """SIGKILL the process holding a view's state open (``views/host.py``) while a batch of
    the view is in flight: the batch's task sends it again to a host that takes the lease
    over. Its lease before the kill."""
    record = Lease(state).read()
    assert record is not None and record.kind == "host" and record.live(), record
    with tree_watch("view state host", lambda: [record.pid], roots) as watch:
        watch.wait_moving()
        watch.kill(phase, lambda: os.kill(record.pid, signal.SIGKILL),
                   lambda: committed_batches(roots), aim=60, read_before=True)
    return record


def views_section(source: str, names: list[str], trigger: dict[str, str],
                  followers: dict[str, str]) -> str:
    """The ``views:`` of a config: each of tests/test_views.py's ``names`` (``incremental:
    strict``) held by the SQL follower ``reporting`` (or ``followers[name]``), its trigger
    ``trigger[name]`` (default 2 s)."""
    from tests.test_views import VIEWS

    return "views:\n" + "".join(
        f"  {name}:\n    source: {source}\n    sql: {json.dumps(VIEWS[name][0])}\n"
        f"    key: {json.dumps(VIEWS[name][1])}\n"
        f"    followers: {followers.get(name, '[reporting]')}\n"
        f"    incremental: strict\n    trigger_interval: {trigger.get(name, '2s')}\n"
        for name in names)


def stop(apply: subprocess.Popen[bytes]) -> int:
    """SIGTERM to a ``cdc apply`` (SIGKILL to its group if it does not stop); its exit code."""
    apply.send_signal(signal.SIGTERM)
    try:
        return apply.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(apply.pid, signal.SIGKILL)
        return apply.wait(30)


def assert_views_verified(verified: dict[tuple[str, str], subprocess.CompletedProcess[str]],
                          count: int) -> None:
    for (name, follower), result in verified.items():
        assert result.returncode == 0, f"view {name} in {follower}: {output(result)}"
        assert "equals the leader" in result.stdout, (name, follower)
    assert len(verified) == count


def verify_views(config: Path, pairs: list[tuple[str, str]], env: dict[str, str] | None = None
                 ) -> dict[tuple[str, str], subprocess.CompletedProcess[str]]:
    """``cdc verify --view V --follower F`` of each pair, three at a time."""
    from concurrent.futures import ThreadPoolExecutor

    def one(pair: tuple[str, str]) -> subprocess.CompletedProcess[str]:
        return cdc("verify", "--config", str(config), "--view", pair[0], "--follower", pair[1],
                   "--timeout", "240s", timeout=400, env=env)

    with ThreadPoolExecutor(3) as pool:
        return dict(zip(pairs, pool.map(one, pairs), strict=True))


#: the MariaDB shop: text compared byte by byte (a view groups and joins on it)
MARIADB_SHOP = """
    CREATE TABLE customers (id int PRIMARY KEY,
                            name varchar(40) COLLATE utf8mb4_nopad_bin NOT NULL,
                            region varchar(10) COLLATE utf8mb4_nopad_bin);
    CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL,
                         amount decimal(12,2) NOT NULL, sku varchar(10) COLLATE utf8mb4_nopad_bin
                         NOT NULL);
    INSERT INTO customers SELECT seq, concat('c', seq), elt(1 + seq % 3, 'n', 's', 'e')
        FROM seq_1_to_60;
    INSERT INTO orders SELECT seq, 1 + seq % 60, (seq % 997) / 10.0, concat('sku', seq % 17)
        FROM seq_1_to_3000;
"""
#: the views of tests/test_views.py:VIEWS run on MariaDB (it has no FULL JOIN)
MARIADB_VIEWS = ("by_region", "right", "distinct_skus", "both", "running", "regions",
                 "above_mean", "extremes")


class MariaDBShopLoad(threading.Thread):
    """Random transactions on the MariaDB shop: inserts, updates, deletes, key changes."""

    def __init__(self, db: Any, seconds: float) -> None:
        super().__init__(daemon=True)
        self.db, self.seconds, self.transactions = db, seconds, 0

    def run(self) -> None:
        import random

        rng = random.Random(7)
        conn = self.db.connect()
        deadline = time.monotonic() + self.seconds
        try:
            with conn.cursor() as cursor:
                while time.monotonic() < deadline:
                    conn.begin()
                    for _ in range(rng.randint(1, 6)):
                        self._change(cursor, rng)
                    conn.commit()
                    self.transactions += 1
                    time.sleep(0.005)
        finally:
            conn.close()

    @staticmethod
    def _change(cursor: Any, rng: Any) -> None:
        roll, order = rng.random(), rng.randint(1, 4000)
        if roll < 0.35:
            cursor.execute("INSERT INTO orders VALUES (%s, %s, %s, %s) ON DUPLICATE KEY UPDATE "
                           "amount = VALUES(amount)", (order, rng.randint(1, 70),
                                                       rng.randint(0, 99999) / 100,
                                                       f"sku{rng.randint(0, 20)}"))
        elif roll < 0.6:
            cursor.execute("UPDATE orders SET amount = amount + 1, customer_id = %s "
                           "WHERE id = %s", (rng.randint(1, 70), order))
        elif roll < 0.75:
            cursor.execute("DELETE FROM orders WHERE id = %s", (order,))
        elif roll < 0.82:  # a primary key change (none if the new key is taken)
            cursor.execute("UPDATE IGNORE orders SET id = %s WHERE id = %s",
                           (order + 5000, order))
        elif roll < 0.9:
            cursor.execute("INSERT INTO customers VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE "
                           "name = VALUES(name), region = VALUES(region)",
                           (rng.randint(1, 70), f"n{rng.randint(0, 9)}",
                            rng.choice(["n", "s", "e", None])))
        else:
            cursor.execute("DELETE FROM customers WHERE id = %s", (rng.randint(1, 70),))


def test_views_equal_the_leader_on_mariadb(
        cluster: ThrowawaySparkCluster, mysql_db: Any, tmp_path: Path) -> None:
    """The same differential test on MariaDB: the views of every construct it has (no FULL
    JOIN), one random load, one ``cdc apply`` on the cluster, each view against the leader."""
    from tests import mykit

    mysql_db.script(MARIADB_SHOP)
    sqlite = tmp_path / "reporting.sqlite"
    config = mykit.write_config(tmp_path, mysql_db, ["customers", "orders"], extra=(
        spark_section(cluster, tmp_path / "events")
        + f"followers:\n  reporting:\n    kind: sql\n    url: sqlite:///{sqlite}\n"
        + views_section(mysql_db.source, list(MARIADB_VIEWS), {}, {})))
    env = {**os.environ, **mysql_db.env()}
    assert cdc("bootstrap", "--config", str(config), env=env).returncode == 0
    checked = cdc("check-config", "--config", str(config), "--connect", env=env)
    assert checked.returncode == 0, output(checked)
    capture = Capture(config, tmp_path / "capture.log").start()
    follow = [arg for name in MARIADB_VIEWS for arg in ("--view", name)]
    with open(tmp_path / "apply.log", "ab") as out:
        apply = subprocess.Popen([sys.executable, "-m", "cdc_app.cli", "apply", "--config",
                                  str(config), *follow], stdout=out, stderr=out, cwd=PROJECT,
                                 env=env, start_new_session=True)
    load = MariaDBShopLoad(mysql_db, seconds=15)
    load.start()
    verified: dict[tuple[str, str], subprocess.CompletedProcess[str]] = {}
    try:
        load.join(120)
        assert load.transactions > 50
        mykit.wait_caught_up(mysql_db, tmp_path / "log")
        verified = verify_views(config, [(name, "reporting") for name in MARIADB_VIEWS], env)
    finally:
        apply_code = stop(apply)
        capture_code = capture.terminate()
    assert_views_verified(verified, len(MARIADB_VIEWS))
    assert apply_code == 0, (tmp_path / "apply.log").read_text(errors="replace")[-3000:]
    assert capture_code == 0
