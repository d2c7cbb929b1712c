"""Shared fixtures: throwaway log directories and record builders."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from cdc.log.base import Record
from cdc.position import Position
from tests import parking

TOPIC = "src.public.items"

# every JVM of the run (Spark drivers and executors, Spark's daemons, Kafka brokers: cdc/jvm.py)
# compiles with the JIT's quick tier only and collects with one thread: they live seconds to
# minutes, and on 2 CPUs this saves about a fifth of their CPU time
os.environ.setdefault("CDC_JVM_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


def make_record(seq: int, key: int, topic: str = TOPIC, tombstone: bool = False,
                size: int = 64) -> Record:
    """A record whose value is derived from (seq, key), so its content can be re-checked."""
    key_bytes = f'{{"id":{key}}}'.encode()
    value = None if tombstone else expected_value(seq, key, size)
    return Record(topic, key_bytes, value, Position.test(seq).to_bytes())


def expected_value(seq: int, key: int, size: int = 64) -> bytes:
    digest = hashlib.sha256(f"{seq}:{key}".encode()).hexdigest().encode()
    return (f"{seq}:{key}:".encode() + digest * (size // 64 + 1))[: max(size, 80)]


#: fixtures that start a database, a broker, Spark or a cluster: a test using one (directly or
#: through another fixture) is marked ``servers`` (as are, by hand, tests that start their own:
#: the demos, brokers with special settings, ...); ``make test-quick`` runs the others
SERVER_FIXTURES = {"pg_cluster", "mariadb_server", "mariadb_factory", "kafka_broker",
                   "kafka_cluster", "spark", "own_broker", "cluster", "german_cluster"}


def pytest_collection_modifyitems(items):  # type: ignore[no-untyped-def]
    from tests.schedule import order

    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.servers)
    order(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
    """``--dist loadfile`` as ``tests/schedule.py`` refines it; other modes as xdist has them."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.schedule import make_scheduler

    return make_scheduler(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):  # type: ignore[no-untyped-def]
    yield
    parking.park(nextitem)  # tests/parking.py: shared brokers stopped while unused


@pytest.fixture(autouse=True)
def _no_leftover_daemons():  # type: ignore[no-untyped-def]
    """A test that fails halfway may leave `cdc capture` / `cdc apply` running: killed here,
    so they never compete with later tests for the CPU or a replication slot."""
    yield
    from tests.pgkit import kill_leftover_daemons
    from tests.sparkkit import stop_leftover_applies

    kill_leftover_daemons()
    stop_leftover_applies()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "log"


# --------------------------------------------------------------------- PostgreSQL fixtures

@pytest.fixture(scope="session")
def pg_cluster():  # type: ignore[no-untyped-def]
    """One throwaway PostgreSQL 15 cluster for the whole session (wal_level=logical)."""
    from tests.pgkit import start_cluster

    pg = start_cluster()
    yield pg
    pg.cleanup()


@pytest.fixture
def pg_db(pg_cluster):  # type: ignore[no-untyped-def]
    """A fresh database (and a unique source/slot name) on the session cluster."""
    from tests.pgkit import new_database

    db = new_database(pg_cluster)
    yield db
    db.drop()


# --------------------------------------------------------------------------- Redis fixtures

@pytest.fixture(scope="session")
def redis_server():  # type: ignore[no-untyped-def]
    """One throwaway redis-server (free loopback port, no persistence) for the whole session.
    Tests that need an empty server call ``FLUSHALL`` themselves (``redis_url`` does)."""
    from cdc_app.servers.redis import ThrowawayRedis

    server = ThrowawayRedis().start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:  # type: ignore[no-untyped-def]
    """The session server's URL, emptied (FLUSHALL) before the test."""
    import redis

    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    return str(redis_server.url)


# --------------------------------------------------------------------------- Spark fixture

@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """The one local SparkSession of the test run (spark_apply/session.py): starting one takes
    7-15 s, so every Spark test shares it. Tests must stop the queries they start."""
    pytest.importorskip("pyspark")
    from spark_apply.session import spark_session

    session = spark_session(app_name="cdc-tests")
    yield session
    session.stop()


# ------------------------------------------------------------------------- MariaDB fixtures

@pytest.fixture(scope="session")
def mariadb_server():  # type: ignore[no-untyped-def]
    """One throwaway MariaDB server for the whole session (tests/mykit.py): row binlog with
    full images and metadata, GTIDs, flushed to the OS at each commit (a SIGKILL loses no
    committed transaction) but not fsynced."""
    from tests.mykit import start_server

    server = start_server()
    yield server
    server.cleanup()


@pytest.fixture
def mysql_db(mariadb_server):  # type: ignore[no-untyped-def]
    """A fresh database on the session server with its own capture user (password in the
    environment variable ``mysql_db.password_env``), source name and replica ``server_id``."""
    from tests.mykit import new_database

    db = new_database(mariadb_server)
    yield db
    db.drop()


@pytest.fixture
def mariadb_factory():  # type: ignore[no-untyped-def]
    """Starts extra throwaway servers with given options (``mariadb_factory(options={...})``,
    ``start=False`` to start it yourself); all are deleted at the end of the test."""
    from tests.mykit import ServerFactory

    factory = ServerFactory()
    yield factory
    factory.cleanup()


# --------------------------------------------------------------------------- Kafka fixture

@pytest.fixture(scope="session")
def kafka_broker():  # type: ignore[no-untyped-def]
    """One throwaway Apache Kafka broker (KRaft, one combined broker+controller node, from the
    jars `make setup` fetched) for the whole session; ``kafka_broker.bootstrap_servers``. Tests
    create topics with names of their own (``auto.create.topics.enable=false``). Not parked
    (tests/parking.py): once, a topic creation got no answer for 90 s from it right after it
    was continued; the cause is not understood."""
    from cdc_app.servers.kafka import ThrowawayKafka

    broker = ThrowawayKafka().start()
    yield broker
    broker.stop()
    broker.cleanup()


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot (/proc/stat)."""
    fields = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


_RUN_STARTED = _cpu_times() if Path("/proc/stat").exists() else (0.0, 0.0)


#: the kills of pytest-xdist workers, gathered by the controller as each worker ends
_WORKER_KILLS: list[tuple[str, str, bool, bool]] = []


def pytest_sessionfinish(session):  # type: ignore[no-untyped-def]
    """In a pytest-xdist worker: hand this process's kills to the controller."""
    if hasattr(session.config, "workeroutput"):
        from tests.kills import kill_records

        session.config.workeroutput["kills"] = kill_records()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # type: ignore[no-untyped-def]
    """In the pytest-xdist controller: a worker ended; keep its kills for the summary."""
    _WORKER_KILLS.extend(tuple(r) for r in getattr(node, "workeroutput", {}).get("kills", []))


def pytest_terminal_summary(terminalreporter):  # type: ignore[no-untyped-def]
    """The deliberate SIGKILLs of the run (tests/kills.py; every worker's), by kind and phase;
    how busy the machine's CPUs were meanwhile (this run and anything else on the machine)."""

    from tests.kills import kill_records, summary_lines

    lines = summary_lines(kill_records() + _WORKER_KILLS)
    if lines:
        terminalreporter.write_sep("=", "SIGKILLs (tests/kills.py)")
        for line in lines:
            terminalreporter.write_line(line)
    if Path("/proc/stat").exists():
        busy, total = _cpu_times()
        share = (busy - _RUN_STARTED[0]) / max(total - _RUN_STARTED[1], 1.0)
        loads = " / ".join(f"{v:.2f}" for v in os.getloadavg())
        terminalreporter.write_line(f"machine: {os.cpu_count()} CPUs {share:.0%} busy during the "
                                    f"run; load average now {loads}")


@pytest.fixture(scope="session")
def _kafka_cluster_server():  # type: ignore[no-untyped-def]
    """The session's three-node cluster behind :func:`kafka_cluster` (parked while unused)."""
    from cdc_app.servers.kafka import ThrowawayKafkaCluster

    cluster = ThrowawayKafkaCluster().start()
    parking.register("kafka_cluster",
                     lambda: [node.process.pid for node in cluster.nodes if node.running()])
    yield cluster
    parking.release("kafka_cluster")
    cluster.cleanup()


@pytest.fixture
def kafka_cluster(_kafka_cluster_server):  # type: ignore[no-untyped-def]
    """One throwaway three-node KRaft cluster (replication factor 3, min.insync.replicas 2),
    started the first time a test asks for it and shared by every test that needs three
    brokers. Tests kill and restart single nodes; each must leave all three running. Parked
    (SIGSTOP) between the tests that use it: tests/parking.py."""
    parking.use("kafka_cluster")
    return _kafka_cluster_server
