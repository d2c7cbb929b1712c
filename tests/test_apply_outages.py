"""``cdc apply`` rides out outages as ``cdc capture`` does (spark_apply/outages.py): the only
Kafka broker SIGKILLed for 20 s while one apply runs and another starts, and the follower's
Redis stopped and restarted under load — each apply waits (``/readyz`` says so), resumes
exactly, never prints a traceback, and ``cdc verify`` passes afterwards."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cdc_app.servers.postgres import free_port
from tests.kafkakit import kafka_yaml
from tests.pgkit import (
    LOAD_SCHEMA,
    Capture,
    Database,
    Load,
    cdc,
    output,
    wait_caught_up,
    wait_for,
    write_config,
)
from tests.test_metrics import daemon, health

pytestmark = [pytest.mark.timeout(900)]

OUTAGE_S = 20


@pytest.fixture(scope="module")
def own_broker():  # type: ignore[no-untyped-def]
    """A broker of this module's own: its test kills it."""
    from cdc_app.servers.kafka import ThrowawayKafka

    with ThrowawayKafka() as broker:
        yield broker


def _ready(port: int) -> bool:
    try:
        return health(port, "/readyz")[0] == 200
    except OSError:
        return False


def _says(port: int, word: str) -> bool:
    try:
        return word in health(port, "/readyz")[1]
    except OSError:
        return False


def _verify(config: Path, follower: str) -> None:
    result = cdc("verify", "--config", str(config), "--follower", follower, "--timeout", "120s",
                 timeout=300)
    assert result.returncode == 0, output(result)


def _clean_exit(process: Any, log_file: Path) -> str:
    """SIGTERM (unless it has exited): the drain (a batch gets 60 s, then its Spark jobs are
    cancelled), exit 0, no traceback; its log."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(150)
    except subprocess.TimeoutExpired:  # where it hangs: every thread's stack (cdc_app/cli.py)
        process.send_signal(signal.SIGQUIT)
        time.sleep(3)
        process.kill()
        process.wait(30)
        raise AssertionError("no exit 150 s after SIGTERM:\n"
                             + log_file.read_text()[-12000:]) from None
    text = log_file.read_text()
    assert code == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    return text


def test_apply_waits_out_a_broker_outage_while_running_and_while_starting(
        own_broker: Any, pg_db: Database, redis_url: str, tmp_path: Path) -> None:
    pg_db.execute(LOAD_SCHEMA)
    pg_db.execute("INSERT INTO items (id, v, amount, note) SELECT g, 1, g, 'x' "
                  "FROM generate_series(1, 300) g")
    second = redis_url.rsplit("/", 1)[0] + "/1"
    followers = ("followers:\n"
                 f"  running:\n    kind: redis\n    url: {redis_url}\n"
                 "    tables: [public.items]\n    trigger_interval: 200ms\n"
                 f"  starting:\n    kind: redis\n    url: {second}\n"
                 "    tables: [public.items]\n    trigger_interval: 200ms\n")
    options = kafka_yaml(own_broker)
    config = write_config(tmp_path, pg_db, ["public.items", "public.audit"],
                          log_options=options, extra=followers)
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    capture = Capture(config, tmp_path / "capture.log").start()
    ports = {"running": free_port(), "starting": free_port()}
    logs = {name: tmp_path / f"apply-{name}.log" for name in ports}
    applies = {"running": daemon(["apply", "--config", str(config), "--follower", "running",
                                  "--metrics-port", str(ports["running"])], logs["running"])}
    load = Load(pg_db, threads=1, pause=0.05)
    try:
        wait_for(lambda: _ready(ports["running"]), 180, "the running apply to be ready")
        load.start()
        time.sleep(2)
        own_broker.kill()
        killed = time.monotonic()
        # an apply that starts now waits for the log before anything else
        applies["starting"] = daemon(["apply", "--config", str(config), "--follower",
                                      "starting", "--metrics-port", str(ports["starting"])],
                                     logs["starting"])
        for name, port in ports.items():
            # a batch in flight when the broker died ends on librdkafka's timeouts first:
            # on a loaded machine that took over 60 s once (the broker restarts only after)
            wait_for(lambda port=port: _says(port, ": waiting ("), OUTAGE_S + 100,
                     f"the {name} apply's /readyz to say it waits")
            code, body = health(port, "/readyz")
            assert code == 503 and "Kafka log" in body, body
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - killed)))
        own_broker.restart()
        for name, port in ports.items():
            wait_for(lambda port=port: _ready(port), 240, f"the {name} apply to apply again")
        load.finish()
        wait_caught_up(pg_db, {**options, "path": str(tmp_path / "log")}, 180)
        for name in ports:
            _verify(config, name)
    finally:  # the applies are stopped below, once (a second SIGTERM ends the drain)
        load.finish()
        capture_code = capture.terminate(60)
    assert capture_code == 0, (tmp_path / "capture.log").read_text()[-3000:]
    for name, process in applies.items():
        text = _clean_exit(process, logs[name])
        assert "the log is unreachable" in text and "the log is back after" in text, text[-3000:]


def test_apply_waits_out_its_redis_restarting_under_load(pg_db: Database,
                                                        tmp_path: Path) -> None:
    from cdc_app.servers.redis import ThrowawayRedis

    pg_db.execute(LOAD_SCHEMA)
    redis = ThrowawayRedis(settings={"appendonly": "yes", "appendfsync": "always"}).start()
    followers = (f"followers:\n  cache:\n    kind: redis\n    url: {redis.url}\n"
                 "    tables: [public.items]\n    trigger_interval: 200ms\n")
    config = write_config(tmp_path, pg_db, ["public.items", "public.audit"], extra=followers)
    assert cdc("bootstrap", "--config", str(config)).returncode == 0
    capture = Capture(config, tmp_path / "capture.log").start()
    port = free_port()
    apply = daemon(["apply", "--config", str(config), "--follower", "cache", "--metrics-port",
                    str(port)], tmp_path / "apply.log")
    load = Load(pg_db, threads=2, pause=0.02)
    try:
        wait_for(lambda: _ready(port), 180, "apply to be ready")
        load.start()
        time.sleep(2)
        restart = threading.Thread(target=redis.restart, kwargs={"down_for": 8.0})
        restart.start()
        wait_for(lambda: _says(port, ": waiting ("), 30, "/readyz to say apply waits")
        assert "cannot reach Redis" in health(port, "/readyz")[1]
        restart.join()
        wait_for(lambda: _ready(port), 120, "apply to apply again")
        apply.send_signal(signal.SIGQUIT)  # every thread's stack to its stderr; it goes on
        log_text = (tmp_path / "apply.log").read_text
        wait_for(lambda: "most recent call first" in log_text(), 30, "the threads' stacks")
        assert "spark_apply/jobs.py" in log_text() and apply.poll() is None
        load.finish()
        wait_caught_up(pg_db, tmp_path / "log")
        _verify(config, "cache")
    finally:
        load.finish()
        capture_code = capture.terminate(60)
        apply.send_signal(signal.SIGTERM)
        apply.wait(90)
        redis.stop()
    assert capture_code == 0, (tmp_path / "capture.log").read_text()[-3000:]
    text = _clean_exit(apply, tmp_path / "apply.log")
    assert "the follower's server is unreachable" in text and "is back after" in text, text
