"""A throwaway Apicurio Registry: a Schema Registry nobody here wrote, for the proof that a log
keeps its schemas in the user's registry (``log.schema_registry``) through the Confluent-
compatible API (``/apis/ccompat/v7``). Run from the finished Quarkus build Maven Central serves
(``cdc setup --only apicurio``: :mod:`cdc.jvm`'s ``apicurio.pom.xml``), in-memory storage, on
free loopback ports (its management listener too), in a temporary directory; stopped when done::

    with ThrowawayApicurio() as registry:
        registry.url   # http://127.0.0.1:PORT/apis/ccompat/v7

Apicurio 3.x needs Java 21 or newer: the machine's Temurin JDK (``/usr/lib/jvm/temurin-*``), or
the ``java`` named by ``$CDC_JAVA21``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from cdc.errors import CdcError
from cdc.jvm import APP
from cdc.jvm import jars_dir as jar_cache
from cdc_app.servers import stop_process
from cdc_app.servers.kafka import _die_with_parent
from cdc_app.servers.postgres import free_port

_SETUP = "run `cdc setup --only apicurio` once (`make setup` does)"
#: small: the tests register a few dozen schemas
JVM = ("-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def java21() -> str:
    """A ``java`` of version 21 or newer: ``$CDC_JAVA21``, else a Temurin JDK beside the
    system's Java; the error naming the fix otherwise."""
    candidates = [os.environ["CDC_JAVA21"]] if os.environ.get("CDC_JAVA21") else [
        str(path) for path in sorted(Path("/usr/lib/jvm").glob("*/bin/java"), reverse=True)]
    for candidate in candidates:
        try:
            shown = subprocess.run([candidate, "-version"], capture_output=True, text=True,
                                   timeout=30, check=False).stderr
        except OSError:
            continue
        match = re.search(r'version "(\d+)', shown)
        if match and int(match.group(1)) >= 21:
            return candidate
    raise CdcError("no Java 21 or newer found (Apicurio Registry 3 needs one)",
                   "install a JDK 21+ (e.g. Temurin) under /usr/lib/jvm, or set CDC_JAVA21 to "
                   "its java")


class ThrowawayApicurio:
    """One Apicurio Registry with in-memory storage on 127.0.0.1."""

    def __init__(self) -> None:
        self.port = 0
        self.directory: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL (what ``log.schema_registry.url`` takes)."""
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v7"

    def start(self, timeout: float = 90.0) -> ThrowawayApicurio:
        run = jar_cache("apicurio") / APP / "quarkus-run.jar"
        if not run.exists():
            raise CdcError(f"Apicurio Registry is missing: no {run}", _SETUP)
        self.directory = Path(tempfile.mkdtemp(prefix="cdc-apicurio-"))
        self.port, management = free_port(), free_port()
        command = [java21(), *JVM, "-Dquarkus.http.host=127.0.0.1",
                   f"-Dquarkus.http.port={self.port}", "-Dquarkus.management.host=127.0.0.1",
                   f"-Dquarkus.management.port={management}", "-jar", str(run)]
        with open(self.directory / "apicurio.log", "ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=out, cwd=self.directory,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=_die_with_parent())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                with urllib.request.urlopen(f"{self.url}/subjects", timeout=2):  # noqa: S310
                    return self
            except OSError:
                time.sleep(0.2)
        tail = (self.directory / "apicurio.log").read_bytes()[-3000:].decode(errors="replace")
        self.cleanup()
        raise CdcError(f"Apicurio Registry did not start; the end of its log:\n{tail}", _SETUP)

    def cleanup(self) -> None:
        stop_process(self.process, 20)
        self.process = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> ThrowawayApicurio:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
