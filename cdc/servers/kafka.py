"""Throwaway Apache Kafka brokers: KRaft (no ZooKeeper), run straight from the Maven jars that
``make setup`` copies into ``.cache/jars/kafka`` (scripts/fetch_jars.sh), in temporary
directories, on free loopback ports; stopped (and deleted) when done. Nothing is downloaded here.

One node, combined ``broker,controller`` roles, internal topics with replication factor 1::

    with ThrowawayKafka() as kafka:
        Producer({"bootstrap.servers": kafka.bootstrap_servers})

Three nodes in one controller quorum, replication factor 3 and ``min.insync.replicas=2``::

    with ThrowawayKafkaCluster() as cluster:
        cluster.node(0).kill()      # a crash; cluster.node(0).start() brings it back

Each node is a ``java ... kafka.Kafka server.properties`` we start ourselves (so ``kill()`` is a
real SIGKILL of the broker), logging through log4j2 to ``server.log`` in its directory, never to
our stdout. The JVM dies with us: ``start_new_session`` keeps a terminal's Ctrl-C away from it (we
stop it), an atexit hook kills whatever is still running, and on Linux the kernel SIGKILLs it when
the thread that started it dies (``PR_SET_PDEATHSIG``; only set when started from the main
thread, since it fires on the death of the starting *thread*).
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc.errors import CdcError
from cdc.servers.postgres import free_port

#: where scripts/fetch_jars.sh puts the jars, relative to the repository checkout
JARS_DIR = Path(__file__).resolve().parents[2] / ".cache" / "jars" / "kafka"
#: environment variable naming another jar folder
JARS_ENV = "CDC_KAFKA_JARS"
_SETUP_FIX = "run `make setup` (scripts/fetch_jars.sh copies the Kafka jars from Maven)"

#: the JVM's heap; a test broker needs little (256 MB is what a node is given in a cluster too)
HEAP = ("-Xmx256m", "-Xms128m")

_LOG4J2 = """\
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="warn">
  <Appenders>
    <File name="file" fileName="{path}" append="true">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Root level="INFO"><AppenderRef ref="file"/></Root>
    <!-- each client and server config is dumped at INFO, hundreds of lines at every start -->
    <Logger name="org.apache.kafka.common.config.AbstractConfig" level="WARN"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="kafka.request.logger" level="WARN"/>
  </Loggers>
</Configuration>
"""


def kafka_classpath() -> str:
    """The broker's classpath: every jar in ``$CDC_KAFKA_JARS`` or ``.cache/jars/kafka``."""
    folder = Path(os.environ.get(JARS_ENV) or JARS_DIR)
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not any(jar.name.startswith("kafka_2.13-") for jar in jars):
        raise CdcError(f"the Apache Kafka jars are missing: no kafka_2.13-*.jar in {folder}",
                       _SETUP_FIX if JARS_ENV not in os.environ
                       else f"point {JARS_ENV} at a folder of Kafka jars, or unset it and "
                            + _SETUP_FIX[4:])
    return os.pathsep.join(str(jar) for jar in jars)


def find_java() -> str:
    """The ``java`` executable (``$JAVA_HOME/bin/java``, else the one on PATH)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise CdcError("java is not installed (the throwaway Kafka brokers need Java 17+)",
                       "run `make setup` (it installs Debian's openjdk-17-jre-headless)")
    return found


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, base64url without padding (what
    ``kafka-storage random-uuid`` prints; like it, never one starting with ``-``)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@dataclass(eq=False)  # compared (and hashed, in _LIVE) by identity
class ThrowawayKafka:
    """One KRaft node with combined ``broker,controller`` roles on 127.0.0.1 (free ports), in a
    temporary directory. ``start()`` after ``stop()``/``kill()`` reuses the same ports and data
    (restart tests); ``cleanup()`` deletes them.

    On its own it is a single-node cluster (a standalone controller quorum, replication factor
    1); :class:`ThrowawayKafkaCluster` makes nodes that share a static quorum (``voters``)."""

    #: extra or overriding ``server.properties`` entries
    overrides: Mapping[str, str] = field(default_factory=dict)
    node_id: int = 1
    port: int = 0
    controller_port: int = 0
    directory: Path | None = None
    cluster_id: str = ""
    #: ``controller.quorum.voters`` (``1@127.0.0.1:PORT,...``) of a multi-node quorum; empty:
    #: this node alone, formatted with ``--standalone``
    voters: str = ""
    heap: tuple[str, ...] = HEAP
    process: subprocess.Popen[bytes] | None = None
    #: seconds the last ``start()`` took (formatting the storage included when it ran)
    start_seconds: float = 0.0
    _owned_dir: bool = False

    # ------------------------------------------------------------------------------ paths

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def _dir(self) -> Path:
        if self.directory is None:
            raise CdcError("the throwaway Kafka broker has not been started", "call start() first")
        return self.directory

    @property
    def data_dir(self) -> Path:
        return self._dir / "data"

    @property
    def server_log(self) -> Path:
        return self._dir / "server.log"

    @property
    def properties_file(self) -> Path:
        return self._dir / "server.properties"

    # ---------------------------------------------------------------------- configuration

    def server_properties(self) -> dict[str, str]:
        """Every ``server.properties`` entry: single-node defaults, then ``overrides``."""
        replicas = "1" if not self.voters else "3"
        min_isr = "1" if not self.voters else "2"
        quorum = ({"controller.quorum.voters": self.voters} if self.voters else
                  {"controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}"})
        defaults = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            **quorum,
            "listeners": (f"PLAINTEXT://127.0.0.1:{self.port},"
                          f"CONTROLLER://127.0.0.1:{self.controller_port}"),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            # the internal topics: without replication factors the brokers can satisfy, a
            # single node logs INVALID_REPLICATION_FACTOR forever; few partitions, since each
            # is created (and loaded) when first used and that costs CPU on a 2-core machine
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            "share.coordinator.state.topic.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            # compaction tests: the cleaner looks for work every second (default 15 s)
            "log.cleaner.backoff.ms": "1000",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.recovery.threads.per.data.dir": "1",
            # a node is fenced (its partitions move) 9 s after its last heartbeat; a follower
            # that stops fetching drops out of the ISR after 10 s
            "broker.heartbeat.interval.ms": "1000",
            "broker.session.timeout.ms": "9000",
            "replica.lag.time.max.ms": "10000",
            "controller.quorum.election.timeout.ms": "1000",
            "controller.quorum.fetch.timeout.ms": "3000",
            "controlled.shutdown.enable": "true",
        }
        return {**defaults, **self.overrides}

    def _write_config(self) -> None:
        lines = [f"{key}={_escape(value)}" for key, value in self.server_properties().items()]
        self.properties_file.write_text("\n".join(lines) + "\n")
        (self._dir / "log4j2.xml").write_text(_LOG4J2.format(path=self.server_log))

    def _java(self, *arguments: str, heap: tuple[str, ...] = ()) -> list[str]:
        return [find_java(), *heap, "-Djava.awt.headless=true", "-XX:+ExitOnOutOfMemoryError",
                f"-Dlog4j2.configurationFile={self._dir / 'log4j2.xml'}",
                f"-Dkafka.logs.dir={self._dir}", "-cp", kafka_classpath(), *arguments]

    # -------------------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 60.0) -> ThrowawayKafka:
        """Format the storage (first time only), start the JVM and return once a client
        reaches the broker; :class:`CdcError` with the end of its log otherwise."""
        if self.running():
            return self
        began = time.monotonic()
        self.launch()
        self.wait_ready(timeout)
        self.start_seconds = time.monotonic() - began
        return self

    def launch(self) -> None:
        """Format if needed and start the JVM, without waiting for it (a cluster's nodes wait
        for one another: start them all, then :meth:`wait_ready` each)."""
        if self.running():
            return
        self.prepare()
        self.format_storage()
        self._spawn()

    def prepare(self) -> None:
        """Pick the directory, ports and cluster id (first time) and write the config files."""
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="cdc-kafka-"))
            self._owned_dir = True
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.port or not self.controller_port:
            self.port, self.controller_port = _free_ports(2)
        self.cluster_id = self.cluster_id or new_cluster_id()
        self._write_config()
        _LIVE.add(self)

    def format_storage(self) -> None:
        """``kafka.tools.StorageTool format`` unless the data directory is formatted."""
        process = self.start_format()
        if process is not None:
            self.finish_format(process)

    def start_format(self) -> subprocess.Popen[bytes] | None:
        if (self.data_dir / "meta.properties").exists():
            return None
        command = self._java("kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                             "-c", str(self.properties_file),
                             *(() if self.voters else ("--standalone",)))
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=self._dir)

    def finish_format(self, process: subprocess.Popen[bytes]) -> None:
        output, _ = process.communicate()
        if process.returncode != 0:
            raise CdcError(f"formatting the Kafka storage in {self.data_dir} failed "
                           f"(status {process.returncode}):\n"
                           f"{output.decode(errors='replace')[-2000:]}",
                           "check the overrides given to the throwaway broker; " + _SETUP_FIX)

    def _spawn(self) -> None:
        command = self._java("kafka.Kafka", str(self.properties_file), heap=self.heap)
        with open(self._dir / "kafka.out", "ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=out, cwd=self._dir,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=_die_with_parent())

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Return once an admin client asking this node sees it among the live brokers."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        error = "not reachable"
        client: Any = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if client is None:
                if not _accepts(self.port):
                    time.sleep(0.05)
                    continue
                client = _admin(self.bootstrap_servers)
            try:
                metadata = client.list_topics(timeout=min(2.0, max(deadline - time.monotonic(),
                                                                   0.1)))
                if self.node_id in metadata.brokers:
                    return
                error = f"the broker does not list itself yet ({sorted(metadata.brokers)})"
            except Exception as exc:  # noqa: BLE001 - not up yet; reported below if it stays so
                error = str(exc)
            time.sleep(0.05)
        exited = self.process.poll()
        tail = self.log_tail()
        if exited is None:
            self.kill()
            what = f"was not ready within {timeout:.0f} s ({error})"
        else:
            self.process = None
            what = f"exited with status {exited}"
        raise CdcError(f"the Kafka broker on port {self.port} (node {self.node_id}) {what}; "
                       f"the end of its log:\n{tail}",
                       "check the overrides given to the throwaway broker and that Java 17+ "
                       "runs (`java -version`)")

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the broker's log (and of the JVM's stdout/stderr)."""
        if self.directory is None:
            return ""
        text = ""
        for path in (self.server_log, self._dir / "kafka.out"):
            if path.exists():
                with open(path, "rb") as handle:
                    handle.seek(max(0, path.stat().st_size - chars))
                    text += handle.read().decode(errors="replace")
        return text[-chars:]

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self) -> None:
        """SIGTERM without waiting (a controlled shutdown); :meth:`stop` waits."""
        if self.running():
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> None:
        """Controlled shutdown (SIGTERM); SIGKILL if the JVM has not exited within ``timeout``."""
        if self.process is None:
            return
        self.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)
        self.process = None

    def kill(self) -> None:
        """SIGKILL the JVM: a crash (the log recovers at the next ``start()``)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self.process = None

    def restart(self, timeout: float = 60.0) -> ThrowawayKafka:
        """Stop and start again on the same ports and data."""
        self.stop()
        return self.start(timeout)

    def cleanup(self) -> None:
        """Kill the broker and delete its directory if we created it."""
        self.kill()
        if self._owned_dir and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
        _LIVE.discard(self)

    def __enter__(self) -> ThrowawayKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


@dataclass(eq=False)
class ThrowawayKafkaCluster:
    """``size`` combined broker+controller nodes forming one KRaft quorum (static
    ``controller.quorum.voters``, every node formatted with the same cluster id):
    ``default.replication.factor=3``, ``min.insync.replicas=2``, internal topics with replication
    factor 3 and min.isr 2. With 3 nodes, one may be down (killed or stopped) and the cluster
    still elects a controller and accepts ``acks=all`` writes."""

    size: int = 3
    #: extra or overriding ``server.properties`` entries, for every node
    overrides: Mapping[str, str] = field(default_factory=dict)
    directory: Path | None = None
    nodes: list[ThrowawayKafka] = field(default_factory=list)
    #: seconds the last ``start()`` took (until every node was ready)
    start_seconds: float = 0.0

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.bootstrap_servers for node in self.nodes)

    def node(self, index: int) -> ThrowawayKafka:
        """The ``index``-th node (0-based; its ``node_id`` is ``index + 1``)."""
        return self.nodes[index]

    def start(self, timeout: float = 90.0) -> ThrowawayKafkaCluster:
        """Start every node not running and return once each is ready."""
        began = time.monotonic()
        if not self.nodes:
            self._create_nodes()
        try:
            waiting = [node for node in self.nodes if not node.running()]
            for node in waiting:
                node.prepare()
            formats = [(node, node.start_format()) for node in waiting]
            for node, process in formats:
                if process is not None:
                    node.finish_format(process)
            for node in waiting:
                node._spawn()
            deadline = time.monotonic() + timeout
            for node in waiting:
                node.wait_ready(max(deadline - time.monotonic(), 1.0))
        except BaseException:
            self.kill()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def _create_nodes(self) -> None:
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="cdc-kafka-cluster-"))
        ports = _free_ports(2 * self.size)
        voters = ",".join(f"{i + 1}@127.0.0.1:{ports[2 * i + 1]}" for i in range(self.size))
        cluster_id = new_cluster_id()
        self.nodes = [ThrowawayKafka(overrides=self.overrides, node_id=i + 1,
                                     port=ports[2 * i], controller_port=ports[2 * i + 1],
                                     directory=self.directory / f"node{i + 1}",
                                     cluster_id=cluster_id, voters=voters)
                      for i in range(self.size)]
        _LIVE.add(self)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every node: SIGTERM to all at once (so none waits for a controller that is
        shutting down too), SIGKILL to any not gone within ``timeout``."""
        for node in self.nodes:
            node.terminate()
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            node.stop(max(deadline - time.monotonic(), 0.1))

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()

    def cleanup(self) -> None:
        """Kill every node and delete the cluster's directory."""
        self.kill()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
        _LIVE.discard(self)

    def __enter__(self) -> ThrowawayKafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(timeout=10.0)
        self.cleanup()


# ------------------------------------------------------------------------------ helpers

#: brokers and clusters that may have a JVM running or a directory to delete
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


@atexit.register
def _cleanup_live() -> None:
    for server in list(_LIVE):
        server.cleanup()


def _die_with_parent() -> Any:
    """A ``preexec_fn`` asking Linux to SIGKILL the child when the thread starting it dies,
    or ``None`` off Linux or off the main thread (a worker thread may end before the broker)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not \
            threading.main_thread():
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def set_death_signal() -> None:
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl: nobody would kill us
            os.kill(os.getpid(), signal.SIGKILL)

    return set_death_signal


def _escape(value: str) -> str:
    """A ``.properties`` value: backslashes and leading blanks are special."""
    value = value.replace("\\", "\\\\")
    return "\\" + value if value[:1] in (" ", "\t") else value


def _accepts(port: int) -> bool:
    """Whether something accepts TCP connections on ``port`` (checked before a Kafka client
    is made, which would retry a refused connection in the background)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _admin(bootstrap_servers: str) -> Any:
    """A quiet confluent-kafka admin client (librdkafka logs connection errors to stderr)."""
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0,
                        "error_cb": lambda error: None})
