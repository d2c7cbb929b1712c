"""``cdc apply``: follower config, bad input, and end to end through real Spark into real Redis.

Costs: ``test_apply_once_from_postgres_capture`` starts one ``cdc apply --once`` process (local
mode: the follower's own process writes, no SparkSession) and then replays in-process, once more
that way and once with the executor runner on the shared ``spark`` fixture;
``test_continuous_apply_stops_cleanly_on_sigterm`` starts one continuous ``cdc apply`` process.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cdc.config import load_config, parse_config
from cdc.errors import ConfigError
from cdc.sink import open_sink, row_text
from cdc_app.servers.postgres import free_port
from cdc_app.synthetic import ORDERS, Workload
from sinks.redis import RedisSink
from tests.pgkit import (
    PROJECT,
    Capture,
    Load,
    append_synthetic,
    assert_follower_equals_log_and_table,
    cdc,
    latest_rows,
    output,
    read_topic,
    wait_caught_up,
    wait_for,
    write_config,
)
from tests.sparkkit import apply_once

SOURCES = {"sources": [{"name": "shop", "kind": "postgres", "dsn": "postgresql://cdc@h/shop",
                        "tables": ["public.orders", "public.customers"]}]}


def follower_config(**follower: Any) -> Any:
    return parse_config({**SOURCES, "followers": {"cache": {"kind": "redis",
                                                            "url": "redis://h:6379/0",
                                                            **follower}}}, Path("/srv/cdc"))


# --------------------------------------------------------------------------------- config

def test_follower_config_defaults_and_derived_values() -> None:
    config = follower_config()
    follower = config.follower("cache")
    assert follower.key_template == "{schema}.{table}:{key}"
    assert follower.tombstone_retention == 86400.0
    assert follower.trigger_interval == 0.05 and follower.driver_batch_records == 20_000
    assert config.follower_sources("cache") == ["shop"]
    assert sorted(config.follower_topics("cache")) == ["shop.public.customers",
                                                       "shop.public.orders"]
    assert config.follower_checkpoint("cache") == Path("/srv/cdc/cdc-data/state/apply/cache")
    config = follower_config(tables=['public."orders"'], tombstone_retention="90m",
                             checkpoint="ck", trigger_interval="2s")
    assert list(config.follower_topics("cache")) == ["shop.public.orders"]
    assert config.follower("cache").tombstone_retention == 5400.0
    assert config.follower("cache").trigger_interval == 2.0
    assert config.follower_checkpoint("cache") == Path("/srv/cdc/ck")


@pytest.mark.parametrize(("follower", "message"), [
    ({"url": "http://h/0"}, "followers.cache.url: expected a Redis URL"),
    ({"kind": "memcached"}, "followers.cache.kind"),
    ({"sources": ["nope"]}, "followers.cache.sources: ['nope'] are not under `sources:`"),
    ({"tables": ["public.nope"]}, "followers.cache.tables: ['public.nope'] are not captured"),
    ({"tables": ["orders"]}, "is not schema-qualified"),
    ({"key_template": "{table}"}, "must contain {key} or {key_json}"),
    ({"key_template": "{tabel}:{key}"}, "unknown field(s) ['tabel']"),
    ({"tombstone_retention": "soon"}, "expected a duration"),
    ({"max_records_per_batch": 0}, "followers.cache.max_records_per_batch"),
    ({"urll": "x"}, "did you mean 'url'?"),
])
def test_follower_config_errors(follower: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        follower_config(**follower)
    assert message in str(caught.value)


def test_follower_url_password_never_shows() -> None:
    with pytest.raises(ConfigError) as caught:
        follower_config(url="http://:hunter2secret@h/0")
    assert "hunter2secret" not in str(caught.value)
    config = follower_config(url="redis://:hunter2secret@h:6379/0")
    assert "hunter2secret" not in repr(config) and "hunter2secret" not in str(config.followers)
    with pytest.raises(ConfigError, match=r"no follower named 'other' .*known: cache"):
        config.follower("other")


def test_a_follower_is_shipped_its_own_settings_only(tmp_path: Path) -> None:
    """What ``cdc apply`` pickles into a follower's process or tasks holds that follower's
    settings (a view: its own and its followers'), its sources and the log — not the others'."""
    config = parse_config({
        "log": {"path": str(tmp_path / "log")},
        "sources": [{"name": "shop", "kind": "postgres", "dsn": "postgresql://cdc@h/shop",
                     "tables": ["public.orders"]},
                    {"name": "crm", "kind": "postgres", "dsn": "postgresql://cdc@h/crm",
                     "tables": ["public.people"]}],
        "followers": {"cache": {"kind": "redis", "url": "redis://h:6379/0", "sources": ["shop"]},
                      "lake": {"kind": "sql", "url": "sqlite:///x.db"}},
        "views": {"totals": {"source": "shop", "sql": "SELECT 1 AS k", "key": ["k"],
                             "followers": ["lake"]}}}, tmp_path)
    cache = config.trimmed("cache")
    assert list(cache.followers) == ["cache"] and not cache.views
    assert [source.name for source in cache.sources] == ["shop"]
    assert cache.log == config.log and cache.follower("cache") == config.follower("cache")
    totals = config.trimmed("totals")
    assert list(totals.followers) == ["lake"] and list(totals.views) == ["totals"]
    assert [source.name for source in totals.sources] == ["shop"]


def test_the_example_config_declares_a_follower() -> None:
    config = load_config(PROJECT / "cdc.example.yaml")
    assert config.follower("cache").kind == "redis"


# ------------------------------------------------------------------------------ bad input

def write_synthetic(directory: Path, redis_url: str, changes: int = 0, **follower: Any
                    ) -> tuple[Path, Workload]:
    """A config with the synthetic shop source and a ``cache`` follower; ``changes`` events of
    the synthetic workload in its log (none: no log at all)."""
    options = {"kind": "redis", "url": redis_url, **follower}
    config = directory / "cdc.yaml"
    config.write_text(json.dumps({
        "log": {"path": str(directory / "log"), "partitions": 4},
        **{"sources": [{**SOURCES["sources"][0], "tables": ["public.orders"]}]},
        "followers": {"cache": options}}))
    workload = Workload(keys=300)
    if changes:
        append_synthetic(directory / "log", workload, changes)
    return config, workload


def test_apply_bad_input_fails_fast_with_the_fix(tmp_path: Path, redis_url: str) -> None:
    config, _ = write_synthetic(tmp_path, redis_url)
    result = cdc("apply", "--config", str(config), "--follower", "nope", "--once")
    assert result.returncode == 2
    assert "no follower named 'nope'" in output(result) and "known: cache" in output(result)
    result = cdc("apply", "--config", str(config), "--follower", "cache", "--once")
    assert result.returncode == 1
    assert "there is no change log" in output(result) and "cdc bootstrap" in output(result)
    assert "Traceback" not in output(result)
    dead = f"redis://:hunter2secret@127.0.0.1:{free_port()}/0"
    config, _ = write_synthetic(tmp_path, dead, changes=10)
    started = time.monotonic()
    result = cdc("apply", "--config", str(config), "--follower", "cache", "--once")
    assert result.returncode == 1, output(result)
    assert "cannot reach Redis at redis://:***@127.0.0.1" in output(result)
    assert "start Redis there" in output(result)
    assert "hunter2secret" not in output(result) and "Traceback" not in output(result)
    assert time.monotonic() - started < 30  # before any SparkSession starts


# ----------------------------------------------------------------------------- end to end

ITEMS = "public.items"


def redis_state(sink: RedisSink) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in sink.client.scan_iter(count=1000):
        kind = sink.client.type(name)
        out[name] = sink.client.hgetall(name) if kind == "hash" else sink.client.get(name)
    return out


def test_apply_once_from_postgres_capture(tmp_path: Path, pg_db: Any, redis_url: str,
                                          spark: Any) -> None:
    pg_db.execute("""
        CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, amount numeric(12,2), note text,
                            updated timestamptz NOT NULL DEFAULT now());
        CREATE TABLE audit (seq bigserial PRIMARY KEY, id int NOT NULL, v int NOT NULL,
                            op text NOT NULL);
        INSERT INTO items (id, v, note) SELECT g, 1, 'snap' FROM generate_series(1, 300) g;
    """)
    follower = (f"followers:\n  cache:\n    kind: redis\n    url: {redis_url}\n"
                "    max_records_per_batch: 700\n")
    config_path = write_config(tmp_path, pg_db, [f"{ITEMS}"], extra=follower)
    log = tmp_path / "log"
    assert cdc("bootstrap", "--config", str(config_path)).returncode == 0
    capture = Capture(config_path, tmp_path / "capture.log").start()
    try:
        pg_db.execute("TRUNCATE items")  # a tombstone per snapshotted key follows
        pg_db.execute("INSERT INTO items (id, v, note) SELECT g, 1, 'again' "
                      "FROM generate_series(250, 400) g")
        pg_db.execute("DELETE FROM items WHERE id = 260")
        pg_db.execute("INSERT INTO items (id, v, note) VALUES (260, 2, 're-inserted')")
        pg_db.execute("UPDATE items SET id = 1000 WHERE id = 261")  # key change
        load = Load(pg_db, threads=2).start()
        time.sleep(3)
        load.finish()
        wait_caught_up(pg_db, log)
        target = pg_db.current_lsn()
        wait_caught_up(pg_db, log)
    finally:
        capture_code = capture.terminate()
    assert capture_code == 0
    topic = f"{pg_db.source}.{ITEMS}"

    started = time.monotonic()
    result = cdc("apply", "--config", str(config_path), "--follower", "cache", "--once",
                 timeout=600)
    once_seconds = time.monotonic() - started
    assert result.returncode == 0, output(result)
    assert "follower cache:" in result.stdout and "skipped by the version gate" in result.stdout

    config = load_config(config_path)
    sink = open_sink(config, "cache")
    assert isinstance(sink, RedisSink)
    rows = assert_follower_equals_log_and_table(sink, pg_db, log, topic)
    assert rows > 150 and sink.read(topic, ['{"id":260}'])['{"id":260}']["note"] == "re-inserted"
    assert sink.read(topic, ['{"id":261}', '{"id":1}']) == {}
    mark = sink.watermark(pg_db.source)
    assert mark is not None and int(mark["lsn"]) >= target

    # replay the whole log from offset 0 (a lost progress record) on the shared session: nothing
    # may change, every change is stopped by the version gate
    from spark_apply.jobs import ApplyJob, run_apply
    from spark_apply.runners.executors import ExecutorRunner

    before = redis_state(sink)
    checkpoint = config.follower_checkpoint("cache")
    status = spark.sparkContext._jsc.sc().statusStore()  # Spark's own record of its jobs

    def spark_jobs() -> int:
        return int(status.jobsList(None).size())

    seconds, jobs = [], []
    # local mode: every batch is written by the follower's own process, no Spark job; the
    # executor runner (a cluster master's) runs one Spark job per batch on the shared session
    for runner in ("process", "executors"):
        subprocess.run(["rm", "-rf", str(checkpoint)], check=True)
        jobs_before = spark_jobs()
        started = time.monotonic()
        if runner == "process":
            job = run_apply(config, ["cache"], once=True)
        else:
            job = ApplyJob.prepare(config, ["cache"])
            try:
                job.start(spark, True, runners={"cache": ExecutorRunner(
                    job.handle("cache"), job.sinks["cache"])})
                job.wait()
            finally:
                job.stop_queries()
                job.close()
        seconds.append(time.monotonic() - started)
        jobs.append(spark_jobs() - jobs_before)
        progress = job.progress["cache"]
        assert progress.batches >= 2  # admission control: 700 records per batch at most
        assert (progress.written, progress.deleted) == (0, 0)
        assert progress.skipped == progress.changes > 0
        assert redis_state(sink) == before
    assert jobs[0] == 0, f"{jobs[0]} Spark jobs ran for batches the follower's process applies"
    assert jobs[1] >= progress.batches, jobs
    print(f"apply --once (own process) {once_seconds:.1f} s; replay in-process: follower "
          f"process {seconds[0]:.1f} s, executors {seconds[1]:.1f} s ({jobs[1]} jobs), "
          f"{progress.batches} batches, {progress.records} records")


@pytest.mark.servers  # starts its own servers or Spark
def test_continuous_apply_stops_cleanly_on_sigterm(tmp_path: Path, redis_url: str) -> None:
    config_path, workload = write_synthetic(tmp_path, redis_url, changes=3000,
                                            trigger_interval="200ms")
    log = tmp_path / "log"
    sink = open_sink(load_config(config_path), "cache")
    process = subprocess.Popen([sys.executable, "-m", "cdc_app.cli", "apply", "--config",
                                str(config_path), "--follower", "cache"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=PROJECT)
    try:
        wait_for(lambda: sink.watermark("shop") == {"lsn": 3000}, 300, "the first catch-up")
        append_synthetic(log, workload, 500)  # the running query picks these up
        wait_for(lambda: sink.watermark("shop") == {"lsn": 3500}, 120, "the second catch-up")
        process.send_signal(signal.SIGTERM)
        text = process.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, text
    assert "SIGTERM" in text and "follower cache:" in text
    assert isinstance(sink, RedisSink)
    topic = ORDERS.topic
    expected = {key: row_text(row) for key, row in latest_rows(read_topic(log, topic)).items()}
    held = sink.read(topic, sorted(sink.keys(topic)))
    assert held == expected and len(held) == len(workload.rows)


def test_redis_lost_during_apply_is_reported_and_nothing_is_committed(
        tmp_path: Path, spark: Any) -> None:
    from cdc_app.servers.redis import ThrowawayRedis
    from sinks.redis import RedisSinkError
    from spark_apply.jobs import ApplyJob

    server = ThrowawayRedis().start()
    config_path, _ = write_synthetic(tmp_path, server.url, changes=500)
    config = load_config(config_path)
    job = ApplyJob.prepare(config, ["cache"])  # Redis answers now ...
    server.stop()                              # ... and is gone when the first batch applies
    try:
        job.start(spark, once=True)
        with pytest.raises(RedisSinkError, match="cannot reach Redis"):
            job.wait()
    finally:
        job.stop_queries()
        job.close()
    # the failed batch counted for nothing: the follower's progress record does not exist
    from spark_apply.progress import applied_offsets

    assert applied_offsets(config.follower_checkpoint("cache")) is None


def test_a_batch_failing_in_sparks_plumbing_is_run_again(tmp_path: Path, redis_url: str,
                                                          spark: Any) -> None:
    """A batch that fails with Spark's "Python worker failed to connect back" is planned and run
    again from the progress record (here the watermark write raises that text twice, then
    works); any other failure is raised at once with the fix."""
    from spark_apply.errors import TRANSIENT_FAILURES
    from spark_apply.jobs import ApplyError, ApplyJob

    class Flaky(RedisSink):
        failures = 2

        def set_watermark(self, source: str, offset: Any) -> None:
            if Flaky.failures:
                Flaky.failures -= 1
                raise RuntimeError(TRANSIENT_FAILURES[0] + " (simulated)")
            super().set_watermark(source, offset)

    config_path, workload = write_synthetic(tmp_path, redis_url, changes=800,
                                            max_records_per_batch=300)
    config = load_config(config_path)
    follower = config.follower("cache")
    job = ApplyJob.prepare(config, ["cache"])
    job.sinks["cache"].close()
    job.sinks["cache"] = Flaky("cache", follower.url)  # type: ignore[attr-defined]
    try:
        job.start(spark, once=True)
        job.wait()
    finally:
        job.stop_queries()
        job.close()
    assert job.restarts == {"cache": 2}
    sink = open_sink(config, "cache")
    expected = latest_rows(read_topic(tmp_path / "log", ORDERS.topic))
    assert set(sink.keys(ORDERS.topic)) == set(expected) and len(expected) > 100

    Flaky.failures = 1
    append_synthetic(tmp_path / "log", workload, 50)
    job = ApplyJob.prepare(config, ["cache"])
    job.sinks["cache"].close()

    class Broken(RedisSink):
        def set_watermark(self, source: str, offset: Any) -> None:
            raise RuntimeError("a real bug")

    job.sinks["cache"] = Broken("cache", follower.url)  # type: ignore[attr-defined]
    try:
        job.start(spark, once=True)
        with pytest.raises(ApplyError, match="a real bug"):
            job.wait()
    finally:
        job.stop_queries()
        job.close()
    assert job.restarts == {}


def test_the_progress_record_resumes_and_refuses_damage(tmp_path: Path, redis_url: str) -> None:
    """The follower's progress record (``spark_apply/progress.py``): a temporary file a killed
    run left beside it is ignored; the record says where the follower resumes (a second run
    reads only what was appended); a damaged or newer record is refused with the fix — never
    guessed at, never a traceback."""
    from spark_apply.progress import FILE, ProgressError, applied_offsets

    config_path, workload = write_synthetic(tmp_path, redis_url, changes=200)
    folder = load_config(config_path).follower_checkpoint("cache")
    folder.mkdir(parents=True)
    torn = folder / f".{FILE}.tmp"
    torn.write_text('{"format": 1, "offs')
    first = apply_once(config_path, "cache")
    assert first.progress["cache"].records >= 200
    sink = open_sink(load_config(config_path), "cache")
    assert sink.watermark("shop") == {"lsn": 200}
    done = applied_offsets(folder)
    assert done is not None and sum(done["topics"][ORDERS.topic].values()) >= 200

    append_synthetic(tmp_path / "log", workload, 30)
    again = apply_once(config_path, "cache")
    assert 0 < again.progress["cache"].records <= 30 + 5  # only what was appended
    assert set(sink.keys(ORDERS.topic)) == set(latest_rows(read_topic(tmp_path / "log",
                                                                      ORDERS.topic)))

    record = folder / FILE
    good = record.read_text()
    for damage, says in (("{not json", "not valid JSON"),
                         (good.replace('"format":1', '"format":9'), "newer cdc")):
        record.write_text(damage)
        result = cdc("apply", "--config", str(config_path), "--follower", "cache", "--once")
        assert result.returncode != 0 and says in result.stdout + result.stderr, output(result)
        assert "Traceback" not in result.stdout + result.stderr
        with pytest.raises(ProgressError):
            from spark_apply.progress import load

            load(folder)
