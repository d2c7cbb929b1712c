"""A throwaway Apache Kafka Connect worker: standalone mode, run straight from the Maven jars
``cdc setup --only connect`` copies into the jar cache (:mod:`cdc.jvm`: ``connect.pom.xml``),
with Debezium's JDBC sink connector on its ``plugin.path``; in a temporary directory, its REST
API on a free loopback port; stopped (and deleted) when done. Nothing is downloaded here.

It is the interoperability proof's consumer — a tool nobody here wrote reading the log's topics
(``log.format: json``)::

    with ThrowawayConnect(kafka.bootstrap_servers) as connect:
        connect.add("pg-sink", {"connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
                                ...})
        connect.wait_running("pg-sink")

Keys and values are read with Kafka's ``JsonConverter`` (``schemas.enable=true``), and the
worker's consumers read committed records only (``consumer.isolation.level=read_committed``:
cdc writes each append in a Kafka transaction). The JVM logs through log4j2 to ``connect.log`` in
its directory, never to our stdout; like the brokers it dies with us.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cdc.errors import CdcError
from cdc.jvm import PLUGINS, SETUP_FIX, jvm_options
from cdc.jvm import jars_dir as jar_cache
from cdc_app.servers import stop_process
from cdc_app.servers.kafka import _LOG4J2, _die_with_parent, _escape, find_java
from cdc_app.servers.postgres import free_port

#: the worker's heap: Debezium's JDBC sink (Hibernate) wants more than a broker
HEAP = ("-Xmx512m", "-Xms64m")
_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
_SETUP = "run `cdc setup --only connect` once (`make setup` does)"


def connect_jars() -> Path:
    """The jar folder of the ``connect`` set, or the error naming the fix."""
    folder = jar_cache("connect")
    if not any(folder.glob("connect-runtime-*.jar")) or not (folder / PLUGINS).is_dir():
        raise CdcError(f"the Kafka Connect jars are missing from {folder}", _SETUP)
    return folder


class ThrowawayConnect:
    """One standalone Kafka Connect worker reading from ``bootstrap_servers``."""

    def __init__(self, bootstrap_servers: str, jvm: tuple[str, ...] = HEAP) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.jvm = jvm
        self.directory: Path | None = None
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def worker_properties(self) -> dict[str, str]:
        assert self.directory is not None
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "key.converter": _CONVERTER, "value.converter": _CONVERTER,
            "key.converter.schemas.enable": "true", "value.converter.schemas.enable": "true",
            "offset.storage.file.filename": str(self.directory / "connect.offsets"),
            "offset.flush.interval.ms": "1000",
            "plugin.path": str(connect_jars() / PLUGINS),
            "listeners": f"http://127.0.0.1:{self.port}",
            "consumer.isolation.level": "read_committed",
            "consumer.auto.offset.reset": "earliest",
            "consumer.fetch.max.wait.ms": "100",
        }

    def start(self, timeout: float = 120.0) -> ThrowawayConnect:
        """Start the worker and return once its REST API answers."""
        folder = connect_jars()
        self.directory = Path(tempfile.mkdtemp(prefix="cdc-connect-"))
        self.port = free_port()
        properties = self.directory / "worker.properties"
        properties.write_text("".join(f"{k}={_escape(v)}\n"
                                      for k, v in self.worker_properties().items()))
        (self.directory / "log4j2.xml").write_text(
            _LOG4J2.format(path=self.directory / "connect.log"))
        classpath = os.pathsep.join(str(jar) for jar in sorted(folder.glob("*.jar")))
        command = [find_java(), *self.jvm, *jvm_options(), "-Djava.awt.headless=true",
                   "-XX:+ExitOnOutOfMemoryError",
                   f"-Dlog4j2.configurationFile={self.directory / 'log4j2.xml'}",
                   "-cp", classpath, "org.apache.kafka.connect.cli.ConnectStandalone",
                   str(properties)]
        with open(self.directory / "connect.out", "ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=out, cwd=self.directory,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=_die_with_parent())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                self.request("GET", "/connectors")
                return self
            except (OSError, CdcError):
                time.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        raise CdcError(f"the Kafka Connect worker did not start; the end of its log:\n{tail}",
                       f"check that Java 17+ runs; {SETUP_FIX}")

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One REST call; the answer's JSON (None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - loopback
                text = answer.read()
        except urllib.error.HTTPError as exc:
            raise CdcError(f"Kafka Connect answered {exc.code} to {method} {path}: "
                           f"{exc.read().decode(errors='replace')[:2000]}",
                           "see the worker's connect.log") from None
        return json.loads(text) if text else None

    def add(self, name: str, config: Mapping[str, str]) -> None:
        """Create connector ``name``."""
        self.request("POST", "/connectors", {"name": name, "config": dict(config)})

    def status(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/connectors/{name}/status")  # type: ignore[no-any-return]

    def wait_running(self, name: str, timeout: float = 60.0) -> None:
        """Return once the connector and its tasks run; the failure's trace if one failed."""
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = self.status(name)
            self.check(name, status)
            tasks = status.get("tasks") or []
            if status["connector"]["state"] == "RUNNING" and tasks and \
                    all(task["state"] == "RUNNING" for task in tasks):
                return
            time.sleep(0.2)
        raise CdcError(f"connector {name} is not running after {timeout:.0f} s: {status}",
                       "see the worker's connect.log")

    def check(self, name: str, status: dict[str, Any] | None = None) -> None:
        """Raise the failure of connector ``name`` or one of its tasks, if any."""
        status = status or self.status(name)
        for part in (status["connector"], *(status.get("tasks") or [])):
            if part.get("state") == "FAILED":
                raise CdcError(f"connector {name} failed: {part.get('trace', '')[:4000]}",
                               "see the worker's connect.log")

    def log_tail(self, chars: int = 4000) -> str:
        if self.directory is None:
            return ""
        text = ""
        for path in (self.directory / "connect.log", self.directory / "connect.out"):
            if path.exists():
                text += path.read_bytes()[-chars:].decode(errors="replace")
        return text[-chars:]

    def stop(self, timeout: float = 20.0) -> None:
        stop_process(self.process, timeout)
        self.process = None

    def cleanup(self) -> None:
        self.stop()
        if self.directory is not None and not os.environ.get("CDC_KEEP_CONNECT"):
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> ThrowawayConnect:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
