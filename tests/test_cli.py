"""The cdc command line, run as a user would (a real subprocess)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdc.avro import EventCodec
from cdc.events import ChangeEvent, Op
from cdc.log.local import LocalChangeLog
from cdc.log.schemas import SchemaStore
from cdc.position import Position
from cdc_app.synthetic import ORDERS, Workload

CDC = [sys.executable, "-m", "cdc_app.cli"]


def cdc(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CDC, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "cdc.yaml").write_text(
        "log: {path: ./data/log, partitions: 4, tombstone_retention: 1h}\n"
        "sources:\n"
        "  - {name: shop, kind: postgres, dsn: 'postgresql://cdc:hunter2@127.0.0.1/shop',\n"
        "     tables: [public.orders]}\n")
    workload = Workload(keys=50, seed=1)
    with LocalChangeLog(tmp_path / "data" / "log", partitions=4) as log:
        codec = EventCodec(SchemaStore(log.path, writable=True))
        log.ensure_topic(ORDERS.topic, {"source": "shop", "table": "public.orders"})
        records = [r for event in workload.events(400) for r in codec.records(event)]
        records += codec.records(ChangeEvent(ORDERS, Op.DELETE, Position.test(10_000), 1,
                                             before={"id": 999, "customer": "gone"}))
        log.append(records, {"shop": {"seq": 400}})
    tombstones = sum(r.value is None for r in records)
    live = len(workload.rows)
    (tmp_path / "expected.json").write_text(json.dumps(
        {"records": len(records), "tombstones": tombstones, "live": live,
         "deleted_keys": len({r.key for r in records}) - live}))
    return tmp_path


def expected(project: Path) -> dict:
    return json.loads((project / "expected.json").read_text())


def test_dump_prints_one_json_object_per_record(project: Path) -> None:
    result = cdc("log", "dump", "--config", "cdc.yaml", cwd=project)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == expected(project)["records"]
    for line in lines:
        assert list(line) == ["topic", "table", "partition", "offset", "position", "key", "value"]
        assert line["topic"] == "shop.public.orders" and line["table"] == "public.orders"
    by_partition: dict[int, list[int]] = {}
    for line in lines:
        by_partition.setdefault(line["partition"], []).append(line["offset"])
    for offsets in by_partition.values():
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    created = next(line for line in lines if line["value"] and line["value"]["op"] == "c")
    after = created["value"]["after"]
    assert isinstance(after["amount"], str) and "." in after["amount"]  # numerics as strings
    assert after["placed_at"].endswith("Z") and "T" in after["placed_at"]  # ISO-8601
    assert created["key"] == {"id": after["id"]}
    assert created["position"]["kind"] == "test"
    delete, tombstone = lines_for(lines, 999)
    assert delete["value"]["op"] == "d" and tombstone["value"] is None
    assert tombstone["position"] == delete["position"]
    assert tombstone["offset"] == delete["offset"] + 1


def lines_for(lines: list[dict], key: int) -> list[dict]:
    return [line for line in lines if line["key"] == {"id": key}]


def test_stats_and_compact(project: Path) -> None:
    stats = cdc("log", "stats", "--config", "cdc.yaml", "--json", cwd=project)
    assert stats.returncode == 0, stats.stderr
    data = json.loads(stats.stdout)
    topic = data["topics"][0]
    want = expected(project)
    assert topic["records"] == want["records"] and topic["tombstones"] == want["tombstones"]
    assert want["tombstones"] > 1
    assert data["source_offsets"] == {"shop": {"seq": 400}}
    table = cdc("log", "stats", "--config", "cdc.yaml", cwd=project)
    assert "shop.public.orders" in table.stdout and str(want["records"]) in table.stdout

    compacted = cdc("log", "compact", "--config", "cdc.yaml", cwd=project)
    assert compacted.returncode == 0, compacted.stderr
    assert f"{want['records']} -> " in compacted.stdout
    after = json.loads(cdc("log", "stats", "--config", "cdc.yaml", "--json",
                           cwd=project).stdout)["topics"][0]
    # the latest record of each live key, plus a fresh tombstone per deleted key
    assert after["records"] == want["live"] + want["deleted_keys"]
    assert after["tombstones"] == want["deleted_keys"]
    dropped = cdc("log", "compact", "--config", "cdc.yaml", "--retention", "0s", cwd=project)
    assert dropped.returncode == 0
    assert json.loads(cdc("log", "stats", "--config", "cdc.yaml", "--json",
                          cwd=project).stdout)["topics"][0]["tombstones"] == 0


def test_version_names_the_fast_paths_and_a_missing_one_is_a_warning(project: Path) -> None:
    """``cdc --version`` says which compiled kernels run (``make setup`` builds them all); a
    command started where one is missing warns with the fix instead of silently running the
    pure-Python twin."""
    version = cdc("--version", cwd=project)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("cdc ") and "cdc.log._fast: compiled" in version.stdout
    assert all(f"{name}: compiled" in version.stdout for name in (
        "cdc._fast", "connectors.postgres._fast", "connectors.mysql._fast")), version.stdout
    assert "warning" not in cdc("check-config", cwd=project).stderr
    hidden = ("import sys; sys.modules['connectors.mysql._fast'] = None; "
              "from cdc_app.cli import main; main(['check-config'])")
    result = subprocess.run([sys.executable, "-c", hidden], cwd=project, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "connectors.mysql._fast (missing)" in result.stderr
    assert "pip install" in result.stderr and "CDC_PURE_PYTHON=1" in result.stderr
    quiet = cdc("check-config", cwd=project, env={"CDC_PURE_PYTHON": "1"})
    assert "warning" not in quiet.stderr and "pure Python" in cdc(
        "--version", cwd=project, env={"CDC_PURE_PYTHON": "1"}).stdout


@pytest.mark.parametrize("kernel", ["cdc._fast", "cdc.log._fast", "connectors.postgres._fast",
                                    "connectors.mysql._fast"])
def test_a_kernel_imported_first_is_still_taken_by_its_modules(kernel: str) -> None:
    """Whatever imports a kernel first (``cdc --version``, the start-up check, a plugin), the
    modules it speeds up still take it. The MariaDB kernel once imported its pure-Python module
    at its top: imported first, it left that module half-built, the module's import of the
    kernel failed as "not built", and every MariaDB capture and snapshot ran pure Python, 4x
    slower, while ``cdc --version`` said "compiled" (issue 42)."""
    from cdc_app.fastpaths import OWNERS

    probe = (f"import importlib, {kernel}\n"
             "from cdc_app.fastpaths import _takes\n"
             f"owners = {list(OWNERS[kernel])!r}\n"
             "idle = [o for o in owners if not _takes(importlib.import_module(o), "
             f"{kernel!r})]\n"
             "print('idle:', idle)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=120, env={k: v for k, v in os.environ.items()
                                              if k != "CDC_PURE_PYTHON"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "idle: []", result.stdout


def test_errors_are_messages_not_tracebacks(project: Path) -> None:
    (project / "bad.yaml").write_text("log: {partitions: lots}\nsources: []\n")
    result = cdc("log", "stats", "--config", "bad.yaml", cwd=project)
    assert result.returncode == 2
    assert "log.partitions" in result.stderr and "fix:" in result.stderr
    assert "Traceback" not in result.stderr

    missing = cdc("log", "dump", "--config", "nope.yaml", cwd=project)
    assert missing.returncode == 2 and "does not exist" in missing.stderr

    (project / "empty.yaml").write_text("log: {path: ./nowhere}\n")
    nolog = cdc("log", "stats", "--config", "empty.yaml", cwd=project)
    assert nolog.returncode == 1 and "no change log" in nolog.stderr
    assert "Traceback" not in nolog.stderr

    unknown = cdc("log", "dump", "--config", "cdc.yaml", "--topic", "x.y.z", cwd=project)
    assert unknown.returncode == 1 and "no topic x.y.z" in unknown.stderr


def test_secrets_never_reach_the_output(project: Path) -> None:
    outputs = []
    for args in (("check-config", "--config", "cdc.yaml"), ("log", "stats", "--config",
                                                             "cdc.yaml")):
        result = cdc(*args, cwd=project)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout + result.stderr)
    (project / "bad.yaml").write_text((project / "cdc.yaml").read_text().replace(
        "kind: postgres", "kind: oracle"))
    result = cdc("check-config", "--config", "bad.yaml", cwd=project)
    assert result.returncode == 2
    outputs.append(result.stdout + result.stderr)
    assert "postgresql://cdc:***@127.0.0.1/shop" in outputs[0]
    for output in outputs:
        assert "hunter2" not in output


def test_demo_runs_and_checks_itself(tmp_path: Path) -> None:
    result = cdc("demo", "--log-only", "--dir", str(tmp_path / "demo"), "--rows", "3000",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "equal" in result.stdout and "DIFFERENT" not in result.stdout


def test_the_config_may_come_before_the_command(project: Path) -> None:
    """`cdc -c F <command>` works like `cdc <command> -c F`, and text in brackets is printed,
    not eaten as markup."""
    elsewhere = project / "elsewhere"
    elsewhere.mkdir()
    config = project / "cdc.yaml"
    before = cdc("-c", str(config), "log", "stats", cwd=elsewhere)
    after = cdc("log", "stats", "-c", str(config), cwd=elsewhere)
    assert before.returncode == after.returncode == 0, before.stderr
    assert before.stdout == after.stdout and "orders" in before.stdout

    (project / "bad.yaml").write_text("log: {path: ./data/log}\nsources:\n"
                                      "  - {name: shop, kind: postgres, dsn: 'postgresql://x/y',"
                                      " tables: public.orders}\n")
    listed = cdc("--config", "bad.yaml", "check-config", cwd=project)
    assert listed.returncode == 2
    assert "e.g. [a, b]" in listed.stderr
    # a fix that names another command reminds of the config this one was given
    (project / "empty.yaml").write_text("log: {path: ./nothing/log}\n")
    for args in (("log", "stats", "-c", "empty.yaml"), ("-c", "empty.yaml", "log", "stats")):
        missing = cdc(*args, cwd=project)
        assert missing.returncode == 1 and "`cdc bootstrap`" in missing.stderr, missing.stderr
        assert "give that command --config empty.yaml" in missing.stderr
    (elsewhere / "cdc.yaml").write_text("log: {path: ./nothing/log}\n")  # the default config
    plain = cdc("log", "stats", cwd=elsewhere)
    assert "`cdc bootstrap`" in plain.stderr and "give that command" not in plain.stderr


def test_an_unreachable_kafka_is_one_clean_error_and_unset_variables_are_named(
        project: Path) -> None:
    """No raw librdkafka line before the error (it goes through logging, which a one-shot
    command keeps for the error itself); `check-config` names an ``*_env`` that is unset."""
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (project / "kafka.yaml").write_text(
        f"log: {{backend: kafka, bootstrap_servers: '127.0.0.1:{port}',"
        " password_env: CDC_TEST_UNSET_KAFKA_PW}\n")
    stats = cdc("log", "stats", "--config", "kafka.yaml", cwd=project,
                env={"CDC_TEST_UNSET_KAFKA_PW": "x"})
    assert stats.returncode == 1
    assert stats.stderr.startswith("error: Kafka log at"), stats.stderr
    assert "rdkafka" not in stats.stderr and "Traceback" not in stats.stderr
    checked = cdc("check-config", "--config", "kafka.yaml", cwd=project)
    assert checked.returncode == 0
    assert "log.password_env names CDC_TEST_UNSET_KAFKA_PW, which is not set" in checked.stdout
