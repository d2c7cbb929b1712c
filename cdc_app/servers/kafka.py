"""Throwaway Apache Kafka brokers: KRaft (no ZooKeeper), run straight from the Maven jars that
``cdc setup`` copies into the jar cache (:mod:`cdc.jvm`: ``kafka.pom.xml``), in temporary
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

Start-up time on a 2-core machine is mostly the JVM loading and compiling Kafka, so two things
are done once and reused:

* storage: the quorum is static (``controller.quorum.voters``), so a formatted data directory is
  just ``bootstrap.checkpoint`` (feature levels) and ``meta.properties`` (cluster, node and
  directory ids). ``kafka.tools.StorageTool format`` runs once per process into a template; each
  node gets a copy with its own ids instead of a JVM of its own (~1 s each; 5 s for 3 nodes).
* classes: the first broker that stops cleanly leaves an AppCDS archive of the classes it loaded
  (``-XX:ArchiveClassesAtExit``) in the jar folder, keyed by the ``java`` binary; later JVMs map
  it (``-XX:SharedArchiveFile``) and start ~0.8 s sooner each. Other jars (a changed pom) are
  another folder, with an archive of its own.
"""

from __future__ import annotations

import atexit
import base64
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc.errors import CdcError
from cdc.jvm import SETUP_FIX as _SETUP_FIX
from cdc.jvm import class_archive_key
from cdc.jvm import find_java as java_executable
from cdc.jvm import jars_dir as jar_cache
from cdc.jvm import jvm_options as cdc_jvm_options
from cdc_app.servers.postgres import free_port

#: environment variable naming another jar folder
JARS_ENV = "CDC_KAFKA_JARS"

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


def jars_dir() -> Path:
    """``$CDC_KAFKA_JARS``, else the jar cache's Kafka folder (:func:`cdc.jvm.jars_dir`)."""
    return Path(os.environ.get(JARS_ENV) or jar_cache("kafka"))


def kafka_classpath() -> str:
    """The broker's classpath: every jar in :func:`jars_dir`."""
    folder = jars_dir()
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not any(jar.name.startswith("kafka_2.13-") for jar in jars):
        fix = _SETUP_FIX if JARS_ENV not in os.environ else \
            f"point {JARS_ENV} at a folder of Kafka jars, or unset it and " + _SETUP_FIX
        raise CdcError(f"the Apache Kafka jars are missing: no kafka_2.13-*.jar in {folder}", fix)
    return os.pathsep.join(str(jar) for jar in jars)


def kafka_version() -> str:
    """The broker's version, from its jar's name (``kafka_2.13-4.3.1.jar`` -> ``4.3.1``)."""
    kafka_classpath()
    for jar in jars_dir().glob("kafka_2.13-*.jar"):
        match = re.fullmatch(r"kafka_2\.13-(.+)\.jar", jar.name)
        if match:
            return match.group(1)
    raise CdcError(f"no kafka_2.13-*.jar in {jars_dir()}", _SETUP_FIX)  # pragma: no cover


def find_java() -> str:
    """The ``java`` executable (:func:`cdc.jvm.find_java`), or the error naming the fix."""
    found = java_executable()
    if found is None:
        raise CdcError("java is not installed (the throwaway Kafka brokers need Java 17+)",
                       "run `make setup` (it installs Debian's openjdk-17-jre-headless)")
    return found


def new_cluster_id() -> str:
    """A KRaft cluster (or directory) id: 16 random bytes, base64url without padding (what
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

    On its own it is a single-node cluster (a quorum of itself, replication factor 1);
    :class:`ThrowawayKafkaCluster` makes nodes that share a quorum (``voters``)."""

    #: extra or overriding ``server.properties`` entries
    overrides: Mapping[str, str] = field(default_factory=dict)
    node_id: int = 1
    port: int = 0
    controller_port: int = 0
    directory: Path | None = None
    cluster_id: str = ""
    #: ``controller.quorum.voters`` (``1@127.0.0.1:PORT,...``) of a multi-node quorum; empty:
    #: this node alone
    voters: str = ""
    #: JVM options before the classpath (the heap by default)
    jvm_options: tuple[str, ...] = HEAP
    process: subprocess.Popen[bytes] | None = None
    #: seconds the last ``start()`` took
    start_seconds: float = 0.0
    _owned_dir: bool = False
    #: the class archive this JVM writes when it exits (see the module's docstring)
    _cds_dump: Path | None = None

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
        """Every ``server.properties`` entry: the defaults, then ``overrides``."""
        voters = self.voters or f"{self.node_id}@127.0.0.1:{self.controller_port}"
        size = len(voters.split(","))
        replicas, min_isr = str(min(size, 3)), str(max(1, min(2, size - 1)))
        defaults = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": voters,
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
            # a node that stops heartbeating is fenced (its partitions get new leaders, it
            # leaves the ISRs) after 6 s (3 s alone, where nobody takes over). A node started
            # again, even after a clean stop, is only let back in once its old session has
            # expired (DUPLICATE_BROKER_REGISTRATION until then): this is also how soon a
            # stopped or killed node of a cluster can rejoin. A new active controller gives
            # every registered broker a full session, so a single node killed and started
            # again waits for it too (stopped cleanly, it does not).
            "broker.heartbeat.interval.ms": "500" if size == 1 else "1000",
            "broker.session.timeout.ms": "3000" if size == 1 else "6000",
            "replica.lag.time.max.ms": "10000",
            "controller.quorum.election.timeout.ms": "1000",
            "controller.quorum.fetch.timeout.ms": "3000",
            # the active controller appends a no-op record to the metadata log every 500 ms
            # by default (KIP-835: how a broker sees that its metadata is fresh); each costs
            # the raft, controller and metadata-loader threads: an idle throwaway node used
            # ~20 % of a core, a third of it for these. Every 5 s is fresh enough here.
            "metadata.max.idle.interval.ms": "5000",
        }
        return {**defaults, **self.overrides}

    def _write_config(self) -> None:
        lines = [f"{key}={_escape(value)}" for key, value in self.server_properties().items()]
        self.properties_file.write_text("\n".join(lines) + "\n")
        (self._dir / "log4j2.xml").write_text(_LOG4J2.format(path=self.server_log))

    # -------------------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 60.0) -> ThrowawayKafka:
        """Start the broker (a new one: fresh directory, ports and storage) or start it again
        after ``stop()``/``kill()``, and return once a client reaches it; :class:`CdcError` with
        the end of its log otherwise."""
        if self.running():
            return self
        began = time.monotonic()
        fresh = self.directory is None
        try:
            self.launch()
            self.wait_ready(timeout)
        except BaseException:
            if fresh:  # a broker that never ran: nothing in its directory worth keeping
                self.cleanup()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def launch(self) -> None:
        """Start the JVM without waiting for it (a cluster's nodes wait for one another: launch
        them all, then :meth:`wait_ready` each)."""
        if self.running():
            return
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="cdc-kafka-"))
            self._owned_dir = True
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.port or not self.controller_port:
            self.port, self.controller_port = _free_ports(2)
        self.cluster_id = self.cluster_id or new_cluster_id()
        _LIVE.add(self)
        self._write_config()
        self._format_storage()
        command, self._cds_dump = _java_command(self._dir, ("kafka.Kafka",
                                                            str(self.properties_file)),
                                                self.jvm_options, may_dump=True)
        with open(self._dir / "kafka.out", "ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=out, cwd=self._dir,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=_die_with_parent())

    def _format_storage(self) -> None:
        """A formatted data directory (first start only): the template's with our ids."""
        if (self.data_dir / "meta.properties").exists():
            return
        template = _storage_template()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(template / "bootstrap.checkpoint", self.data_dir / "bootstrap.checkpoint")
        ids = {"node.id": str(self.node_id), "cluster.id": self.cluster_id,
               "directory.id": new_cluster_id()}
        lines = []
        for line in (template / "meta.properties").read_text().splitlines():
            key = line.partition("=")[0]
            lines.append(f"{key}={ids[key]}" if key in ids else line)
        (self.data_dir / "meta.properties").write_text("\n".join(lines) + "\n")

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
                metadata = client.list_topics(
                    timeout=min(2.0, max(deadline - time.monotonic(), 0.1)))
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
            self._reaped(clean=False)
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
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> None:
        """Controlled shutdown (SIGTERM); SIGKILL if the JVM has not exited within ``timeout``."""
        if self.process is None:
            return
        self.terminate()
        try:
            self.process.wait(timeout)
            clean = True
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)
            clean = False
        self._reaped(clean)

    def kill(self) -> None:
        """SIGKILL the JVM: a crash (the log recovers at the next ``start()``)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self._reaped(clean=False)

    def _reaped(self, clean: bool) -> None:
        self.process = None
        if self._cds_dump is not None:
            _keep_archive(self._cds_dump, clean)
            self._cds_dump = None

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
        self.stop(timeout=10.0)
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
    jvm_options: tuple[str, ...] = HEAP
    directory: Path | None = None
    nodes: list[ThrowawayKafka] = field(default_factory=list)
    #: seconds the last ``start()`` took (until every node was ready)
    start_seconds: float = 0.0

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.bootstrap_servers for node in self.nodes)

    def node(self, index: int) -> ThrowawayKafka:
        """The ``index``-th node (0-based; its ``node_id`` is ``index + 1``): ``kill()``,
        ``stop()``, ``start()``, ``restart()`` it on its own."""
        return self.nodes[index]

    def start(self, timeout: float = 90.0) -> ThrowawayKafkaCluster:
        """Start every node not running and return once each is ready (a node needs a
        majority of the quorum up before it can be, so all are launched first)."""
        began = time.monotonic()
        fresh = not self.nodes
        if fresh:
            self._create_nodes()
        waiting = [node for node in self.nodes if not node.running()]
        try:
            for node in waiting:
                node.launch()
            deadline = time.monotonic() + timeout
            for node in waiting:
                node.wait_ready(max(deadline - time.monotonic(), 1.0))
        except BaseException:
            if fresh:
                self.cleanup()
            else:
                self.kill()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def _create_nodes(self) -> None:
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="cdc-kafka-cluster-"))
        _LIVE.add(self)
        ports = _free_ports(2 * self.size)
        voters = ",".join(f"{i + 1}@127.0.0.1:{ports[2 * i + 1]}" for i in range(self.size))
        cluster_id = new_cluster_id()
        self.nodes = [ThrowawayKafka(overrides=self.overrides, node_id=i + 1,
                                     port=ports[2 * i], controller_port=ports[2 * i + 1],
                                     directory=self.directory / f"node{i + 1}",
                                     cluster_id=cluster_id, voters=voters,
                                     jvm_options=self.jvm_options)
                      for i in range(self.size)]

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every node: SIGTERM to all at once (so none waits for a controller that is
        shutting down too), SIGKILL to any not gone within ``timeout``. Takes ~5 s: the active
        controller, left without voters to hand over to, waits out KRaft's fixed 5 s graceful
        shutdown."""
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
        for node in self.nodes:
            node.cleanup()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
        _LIVE.discard(self)

    def __enter__(self) -> ThrowawayKafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()  # killed, not stopped: its data is deleted anyway (see stop())


# --------------------------------------------------------------------- JVM and storage

#: brokers and clusters that may have a JVM running or a directory to delete (held until their
#: cleanup(), so that one dropped without it is still cleaned up at exit)
_LIVE: set[Any] = set()
_LOCK = threading.RLock()
#: the formatted storage template of this process (see the module's docstring)
_TEMPLATE: list[Path] = []
#: whether a JVM of this process is writing the class archive (one at a time is enough)
_CDS_DUMPING: list[bool] = [False]


@atexit.register
def _cleanup_live() -> None:
    for server in list(_LIVE):
        server.cleanup()
    for template in _TEMPLATE:
        shutil.rmtree(template, ignore_errors=True)
    _TEMPLATE.clear()


def _cds_archive() -> Path | None:
    """Where the class archive for this ``java``, classpath and ``CDC_JVM_OPTIONS`` lives
    (``None``: nowhere, the folder is not writable and has none). A JVM refuses an archive made
    for another classpath (with a warning in the broker's output): a copied or moved jar folder
    makes a new one."""
    find_java()  # the error naming the fix when there is no Java
    key = class_archive_key(kafka_classpath(), cdc_jvm_options())
    path = jars_dir() / f"kafka-cds-{key}.jsa"
    return path if path.exists() or os.access(jars_dir(), os.W_OK) else None


def _java_command(directory: Path, arguments: tuple[str, ...], jvm_options: tuple[str, ...],
                  may_dump: bool) -> tuple[list[str], Path | None]:
    """``java`` with our options and the classpath, running ``arguments``; and the path the
    JVM will write a class archive to when it exits, if it is the one to make it."""
    options = [*jvm_options, *cdc_jvm_options(), "-Djava.awt.headless=true",
               "-XX:+ExitOnOutOfMemoryError",
               f"-Dlog4j2.configurationFile={directory / 'log4j2.xml'}",
               f"-Dkafka.logs.dir={directory}"]
    classpath = kafka_classpath()
    archive = _cds_archive()
    dump = None
    if archive is not None and archive.exists():
        options.append(f"-XX:SharedArchiveFile={archive}")
    elif archive is not None and may_dump:
        with _LOCK:
            if not _CDS_DUMPING[0]:
                _CDS_DUMPING[0] = True
                dump = archive.with_name(f"{archive.name}.{os.getpid()}.{id(directory)}.tmp")
                options.append(f"-XX:ArchiveClassesAtExit={dump}")
    return [find_java(), *options, "-cp", classpath, *arguments], dump


def _keep_archive(dump: Path, clean: bool) -> None:
    """Move a class archive a JVM wrote at its exit into place if the JVM exited by itself and
    a JVM accepts it (``-Xshare:on`` fails rather than ignore a bad one); else delete it."""
    archive = dump.with_name(dump.name.split(".jsa.")[0] + ".jsa")
    try:
        if clean and dump.exists():
            check = subprocess.run([find_java(), "-Xshare:on", f"-XX:SharedArchiveFile={dump}",
                                    "-cp", kafka_classpath(), "-version"],
                                   capture_output=True, check=False)
            if check.returncode == 0:
                os.replace(dump, archive)
    finally:
        dump.unlink(missing_ok=True)
        with _LOCK:
            _CDS_DUMPING[0] = False


def _storage_template() -> Path:
    """A data directory ``kafka.tools.StorageTool format`` made, once per process."""
    with _LOCK:
        if _TEMPLATE and (_TEMPLATE[0] / "data" / "meta.properties").exists():
            return _TEMPLATE[0] / "data"
        directory = Path(tempfile.mkdtemp(prefix="cdc-kafka-template-"))
        try:
            _format(directory)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        _TEMPLATE[:] = [directory]
        return directory / "data"


def _format(directory: Path) -> None:
    properties = {"process.roles": "broker,controller", "node.id": "1",
                  "controller.quorum.voters": "1@127.0.0.1:9093",
                  "listeners": "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
                  "controller.listener.names": "CONTROLLER",
                  "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                  "log.dirs": str(directory / "data")}
    config = directory / "server.properties"
    config.write_text("".join(f"{key}={_escape(value)}\n" for key, value in properties.items()))
    (directory / "log4j2.xml").write_text(_LOG4J2.format(path=directory / "format.log"))
    command, _ = _java_command(directory, ("kafka.tools.StorageTool", "format", "-t",
                                           new_cluster_id(), "-c", str(config)),
                               ("-Xmx128m",), may_dump=False)
    result = subprocess.run(command, capture_output=True, text=True, cwd=directory,
                            stdin=subprocess.DEVNULL, check=False)
    if result.returncode != 0 or not (directory / "data" / "bootstrap.checkpoint").exists():
        output = (result.stdout + result.stderr)[-2000:]
        raise CdcError(f"formatting Kafka storage (kafka.tools.StorageTool format) failed "
                       f"with status {result.returncode}:\n{output}", _SETUP_FIX)


def _die_with_parent() -> Any:
    """A ``preexec_fn`` asking Linux to SIGKILL the child when the thread starting it dies,
    or ``None`` off Linux or off the main thread (a worker thread may end before the broker)."""
    if not sys.platform.startswith("linux") or \
            threading.current_thread() is not threading.main_thread():
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

    config: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "log_level": 0,
                              "error_cb": lambda error: None}
    return AdminClient(config)
