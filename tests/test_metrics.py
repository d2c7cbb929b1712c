"""Prometheus metrics (``--metrics-port``, cdc_app/metrics.py) scraped from the real endpoints of
running daemons, ``cdc status`` with sources, log and followers, and the bad input.

Spark cost: one continuous ``cdc apply`` process (its own SparkSession).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdc.config import load_config, parse_config
from cdc.errors import ConfigError
from cdc.sink import open_sink
from cdc_app.servers.postgres import free_port
from cdc_app.synthetic import Workload
from tests.pgkit import (
    DAEMONS,
    LOAD_SCHEMA,
    PROJECT,
    Database,
    Load,
    append_synthetic,
    cdc,
    output,
    wait_caught_up,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.timeout(300)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of ``http://127.0.0.1:port/metrics``: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def daemon(args: list[str], log_file: Path) -> subprocess.Popen[bytes]:
    """``cdc ARGS`` in the background (killed after the test if it is left running)."""
    with open(log_file, "ab") as err:
        process = subprocess.Popen([sys.executable, "-m", "cdc_app.cli", *args], stdout=err,
                                   stderr=err, cwd=PROJECT)
    DAEMONS.append(process)
    return process


def health(port: int, path: str) -> tuple[int, str]:
    """(status, body) of ``/healthz`` or ``/readyz``."""
    import urllib.error

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()


def try_scrape(port: int) -> Samples | None:
    try:
        return scrape(port)
    except OSError:
        return None


# --------------------------------------------------------------------------------- config

SOURCES = {"sources": [{"name": "shop", "kind": "postgres", "dsn": "postgresql://cdc@h/shop",
                        "tables": ["public.orders"]}]}


def test_metrics_config_defaults_and_errors() -> None:
    config = parse_config(SOURCES, Path("/srv"))
    assert config.metrics.capture_port is None and config.metrics.apply_port is None
    config = parse_config({**SOURCES, "metrics": {"capture_port": 8791, "apply_port": 8792,
                                                  "poll_interval": "2s"}}, Path("/srv"))
    assert (config.metrics.capture_port, config.metrics.poll_interval) == (8791, 2.0)
    for metrics, message in [
        ({"capture_port": 70000}, "metrics.capture_port: Input should be less than or equal"),
        ({"capture_port": 8791, "apply_port": 8791}, "capture and apply each serve their own"),
        ({"address": "localhost:80"}, "is not an IP address"),
        ({"capture_prot": 1}, "did you mean 'capture_port'?"),
        ({"poll_interval": "never"}, "metrics.poll_interval"),
    ]:
        with pytest.raises(ConfigError) as caught:
            parse_config({**SOURCES, "metrics": metrics}, Path("/srv"))
        assert message in str(caught.value), str(caught.value)


def test_a_port_in_use_is_refused_with_the_fix(tmp_path: Path) -> None:
    config = tmp_path / "cdc.yaml"
    config.write_text(json.dumps({"log": {"path": str(tmp_path / "log")}, **SOURCES,
                                  "followers": {"cache": {"kind": "redis",
                                                          "url": "redis://127.0.0.1:1/0"}}}))
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for command in (["capture"], ["apply", "--follower", "cache", "--once"]):
            result = cdc(*command, "--config", str(config), "--metrics-port", str(port))
            text = output(result)
            assert result.returncode == 1, text
            assert f"cannot serve metrics on port {port}: another process listens there" in text
            assert "--metrics-port" in text and "Traceback" not in text
    result = cdc("capture", "--config", str(config), "--metrics-port", "0")
    assert result.returncode == 2 and "--metrics-port" in output(result)


# ------------------------------------------------------------------------------- capture

def test_capture_metrics_move_under_load_and_status_shows_everything(
        pg_db: Database, tmp_path: Path) -> None:
    from cdc.coordinator import bootstrap, open_log
    from cdc_app.console import make_console
    from cdc_app.metrics import CaptureMetrics

    pg_db.execute(LOAD_SCHEMA)
    pg_db.execute("INSERT INTO items (id, v, amount, note) SELECT g, 1, g, 'x' "
                  "FROM generate_series(1, 3000) g")
    follower = ("followers:\n  cache:\n    kind: redis\n    url: redis://127.0.0.1:1/0\n"
                "metrics:\n  poll_interval: 200ms\n")
    config_path = write_config(tmp_path, pg_db, ["public.items"], extra=follower)
    config = load_config(config_path)

    # the snapshot's progress, in process, through the same observer capture uses
    snapshot = CaptureMetrics(config, config.sources)
    writer, codec = open_log(config)
    try:
        bootstrap(config, config.sources[0], writer, codec, make_console(), observer=snapshot)
    finally:
        writer.close()
    labels = {"source": pg_db.source, "table": "public.items"}
    assert snapshot.registry.get_sample_value("cdc_snapshot_rows", labels) == 3000
    assert snapshot.registry.get_sample_value("cdc_snapshot_rows_estimated", labels) == 3000

    port = free_port()
    capture = daemon(["capture", "--config", str(config_path), "--metrics-port", str(port)],
                     tmp_path / "capture.log")
    load = Load(pg_db, threads=2).start()
    try:
        source = {"source": pg_db.source}
        events = {**source, "table": "public.items"}

        def moving() -> bool:  # events seen, and a first commit durable (on a loaded
            # machine that may come well after the first events)
            got = try_scrape(port)
            return bool(got and (value(got, "cdc_capture_events_total", **events) or 0) > 0
                        and value(got, "cdc_capture_source_lag_bytes", **source) is not None
                        and value(got, "cdc_capture_durable_position", **source) is not None)

        wait_for(moving, 60, "the first events and a durable position in /metrics")
        first = scrape(port)
        time.sleep(1.5)
        second = scrape(port)
        for name, labels_ in [("cdc_capture_events_total", events),
                              ("cdc_capture_records_total", source),
                              ("cdc_capture_commit_duration_seconds_count", source),
                              ("cdc_capture_commit_records_count", source),
                              ("cdc_capture_durable_position", source)]:
            before, after = value(first, name, **labels_), value(second, name, **labels_)
            assert before is not None and after is not None and after > before, name
        assert value(second, "cdc_capture_events_total", source=pg_db.source,
                     table="public.audit") is None  # not captured
        assert (value(second, "cdc_capture_source_lag_seconds", **source) or 0) >= 0
        assert (value(second, "cdc_capture_source_retained_bytes", **source) or 0) > 0
        assert (value(second, "cdc_capture_durable_position_age_seconds", **source) or 99) < 10
        assert (value(second, "cdc_capture_durable_position_timestamp_seconds", **source) or 0
                ) > time.time() - 60
        assert (value(second, "cdc_log_end_offsets", topic=f"{pg_db.source}.public.items")
                or 0) >= 3000
        assert (value(second, "cdc_log_size_bytes", topic=f"{pg_db.source}.public.items")
                or 0) > 0

        status = cdc("status", "--config", str(config_path), "--json")
        assert status.returncode == 0, output(status)
        data = json.loads(status.stdout)
        assert data["sources"][0]["capture"] == "running"
        assert data["log"]["records_appended"] >= 3000 and data["log"]["topics"] == 1
        row = data["followers"][0]
        assert (row["follower"], row["kind"], row["apply"]) == ("cache", "redis", "never ran")
        assert row["lag_records"] >= 3000 and row["records_read"] == 0
        table = cdc("status", "--config", str(config_path))
        assert table.returncode == 0, output(table)
        for word in ("source", pg_db.source, "running", "log", "follower", "cache", "never ran"):
            assert word in table.stdout, table.stdout
    finally:
        load.finish()
    wait_caught_up(pg_db, tmp_path / "log")
    wait_for(lambda: value(scrape(port), "cdc_capture_source_lag_seconds",
                           source=pg_db.source) == 0, 30, "the lag to drop to 0 when idle")

    # /healthz and /readyz through the states: streaming, reconnecting (the database closed
    # to connections and the stream cut), streaming again
    assert health(port, "/healthz") == (200, "alive\n")
    assert health(port, "/readyz") == (200, f"ready\nsource {pg_db.source}: streaming\n")
    admin = pg_db.dsn().rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {pg_db.name} ALLOW_CONNECTIONS false")
        try:
            conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                         "WHERE slot_name = %s", (f"cdc_{pg_db.source}",))
            wait_for(lambda: "not currently accepting connections" in health(
                port, "/readyz")[1], 30, "/readyz to name the reconnecting's cause")
            code, body = health(port, "/readyz")
            assert code == 503, body
            assert body.startswith(f"not ready\nsource {pg_db.source}: reconnecting ("), body
            assert health(port, "/healthz")[0] == 200
        finally:
            conn.execute(f"ALTER DATABASE {pg_db.name} ALLOW_CONNECTIONS true")
    wait_for(lambda: health(port, "/readyz")[0] == 200, 60, "/readyz to say 200 again")
    assert health(port, "/nothing")[0] == 404
    capture.send_signal(signal.SIGTERM)
    assert capture.wait(30) == 0, (tmp_path / "capture.log").read_text()


# --------------------------------------------------------------------------------- apply

@pytest.mark.servers  # starts its own servers or Spark
def test_apply_metrics_follow_the_watermark(tmp_path: Path, redis_url: str) -> None:
    config_path = tmp_path / "cdc.yaml"
    config_path.write_text(json.dumps({
        "log": {"path": str(tmp_path / "log"), "partitions": 4},
        **SOURCES,
        "followers": {"cache": {"kind": "redis", "url": redis_url,
                                "trigger_interval": "200ms"}},
        "metrics": {"poll_interval": "200ms"}}))
    workload = Workload(keys=300)
    append_synthetic(tmp_path / "log", workload, 3000)
    sink = open_sink(load_config(config_path), "cache")
    port = free_port()
    process = daemon(["apply", "--config", str(config_path), "--follower", "cache",
                      "--metrics-port", str(port)], tmp_path / "apply.log")
    follower = {"follower": "cache"}
    mark = {"follower": "cache", "source": "shop"}
    try:
        def answers() -> bool:
            try:
                return health(port, "/healthz")[0] == 200
            except OSError:
                return False

        wait_for(answers, 120, "the endpoints to answer")
        # starting until its first batch is committed -- which, in local mode without a Spark
        # session, may already have happened when the endpoints first answer
        assert health(port, "/readyz") in ((503, "not ready\nfollower cache: starting\n"),
                                           (200, "ready\nfollower cache: applying\n"))
        wait_for(lambda: sink.watermark("shop") == {"lsn": 3000}, 300, "the first catch-up")
        wait_for(lambda: health(port, "/readyz")[0] == 200, 30, "/readyz to say 200")
        assert health(port, "/readyz")[1] == "ready\nfollower cache: applying\n"
        wait_for(lambda: value(scrape(port), "cdc_apply_lag_records", **follower) == 0, 30,
                 "the follower's lag in records to reach 0")
        first = scrape(port)
        assert value(first, "cdc_apply_watermark_position", **mark) == 3000
        assert (value(first, "cdc_apply_watermark_timestamp_seconds", **mark) or 0
                ) > time.time() - 300
        assert (value(first, "cdc_apply_batches_total", **follower) or 0) >= 1
        appended = value(first, "cdc_log_end_offsets", topic="shop.public.orders")
        assert appended is not None and appended >= 3000  # deletes add tombstones
        assert value(first, "cdc_apply_records_total", follower="cache",
                     topic="shop.public.orders") == appended
        assert (value(first, "cdc_apply_rows_total", follower="cache", outcome="written")
                or 0) > 0

        append_synthetic(tmp_path / "log", workload, 500)
        wait_for(lambda: value(scrape(port), "cdc_apply_watermark_position", **mark) == 3500,
                 120, "the watermark in /metrics to move")
        second = scrape(port)
        for name in ("cdc_apply_batches_total", "cdc_apply_batch_duration_seconds_count",
                     "cdc_apply_batch_duration_seconds_sum"):
            assert (value(second, name, **follower) or 0) > (value(first, name, **follower)
                                                             or 0), name
        assert (value(second, "cdc_apply_records_total", follower="cache",
                      topic="shop.public.orders") or 0) >= appended + 500
        assert (value(second, "cdc_apply_lag_seconds", **follower) or 0) >= 0

        def status() -> dict[str, Any]:
            result = cdc("status", "--config", str(config_path), "--json")
            assert result.returncode == 0, output(result)
            data: dict[str, Any] = json.loads(result.stdout)
            return data

        assert {"log", "sources", "followers"} <= set(status())
        # the daemon writes its status file once a second
        wait_for(lambda: status()["followers"][0]["watermarks"]["shop"]["order"] == [3500], 30,
                 "cdc status to show the new watermark")
        row = status()["followers"][0]
        assert row["apply"] == "running" and row["batches"] >= 2 and row["lag_records"] == 0
        process.send_signal(signal.SIGTERM)
        process.wait(120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, (tmp_path / "apply.log").read_text()
    assert status()["followers"][0]["apply"] == "stopped"
