"""The JVMs this project starts: their options (``CDC_JVM_OPTIONS``) and their jars.

**Jars.** Four sets, each the dependencies of a pom shipped here: ``spark.pom.xml`` (Spark's
Kafka source, spark-avro, delta-spark: ``cdc apply`` passes them with ``spark.jars``),
``kafka.pom.xml`` (the throwaway Kafka brokers of the demo and the tests) and
``connect.pom.xml`` (a throwaway Kafka Connect worker with Debezium's JDBC sink, for the
interoperability tests; plugin archives unpacked into its ``plugins/``), ``apicurio.pom.xml``
(a throwaway Apicurio Registry, unpacked into ``app/``, for the same tests). ``cdc setup`` copies
them from Maven into a user cache, once; nothing fetches them at run time. The folder of a set is
``<root>/<set>-<first 12 hex digits of the pom's SHA-256>``, so a changed pom (another Spark
release) gets a folder of its own and two installations of different versions share the cache
without thrashing. The root is ``$CDC_JARS_DIR``, else ``$XDG_CACHE_HOME/cdc/jars``, else
``~/.cache/cdc/jars``; the config's ``spark.jars_dir`` names a folder of Spark jars directly.
A folder counts as complete once ``cdc setup`` wrote its ``.complete`` marker (last).

**Class archives.** A JVM that maps an AppCDS archive of the classes it loads starts with far
less CPU. The Kafka brokers make theirs on their first clean stop
(``cdc_app/servers/kafka.py``); ``cdc setup`` makes the Spark driver's with a short training
session (``spark_apply/session.py``: ``make_class_archive``), which Spark's executors and the
standalone daemons map too (same classpath). Both live in the jar cache, keyed by
:func:`class_archive_key` (the ``java`` binary and the jars); a JVM that cannot map one starts
without it.

**Options.**
The Spark driver of ``cdc apply`` (``spark.driver.extraJavaOptions``), its executors
(``spark.executor.extraJavaOptions``, unless the config sets them), and the throwaway servers of
the demo and the tests (Kafka brokers, Spark's master and workers) add the options in the
environment variable ``CDC_JVM_OPTIONS``, split like a shell would. On a small machine, where
JVMs live for minutes, ``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC`` (the JIT's quick tier only,
one GC thread) saves about a fifth of their CPU time; the test suite sets exactly that
(``tests/conftest.py``). Unset: the JVM's defaults.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import select
import shlex
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

#: the environment variable read by :func:`jvm_options`
JVM_OPTIONS_ENV = "CDC_JVM_OPTIONS"


def find_java() -> str | None:
    """The ``java`` executable (``$JAVA_HOME/bin/java``, else the one on PATH; ``None``: no
    Java) — the one Spark's launcher and the throwaway servers run."""
    import shutil

    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def class_archive_key(*parts: object) -> str:
    """A short key for an AppCDS class archive made by ``java`` (its resolved path, size and
    time) for what ``parts`` name (a classpath...): a JVM maps an archive only when these
    match what made it, so another Java or other jars get another archive."""
    java = find_java()
    described = ""
    if java is not None:
        resolved = Path(java).resolve()
        stat = resolved.stat()
        described = f"{resolved}:{stat.st_size}:{stat.st_mtime_ns}"
    text = ":".join([described, *(str(part) for part in parts)])
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def jvm_options() -> list[str]:
    """The options of ``CDC_JVM_OPTIONS`` (empty when unset)."""
    return shlex.split(os.environ.get(JVM_OPTIONS_ENV, ""))


#: the environment variable naming the jar cache's root
JARS_ENV = "CDC_JARS_DIR"
#: the jar sets: name -> the pom whose dependencies they are
POMS = {"spark": Path(__file__).with_name("spark.pom.xml"),
        "kafka": Path(__file__).with_name("kafka.pom.xml"),
        "connect": Path(__file__).with_name("connect.pom.xml"),
        "apicurio": Path(__file__).with_name("apicurio.pom.xml")}
#: the sets ``cdc setup`` fetches unless told which: ``connect`` (a Kafka Connect worker with
#: Debezium's JDBC sink) and ``apicurio`` (a Schema Registry) are for the interoperability
#: tests, ``cdc setup --only connect --only apicurio``
DEFAULT_SETS = ("spark", "kafka")
#: where in a set's folder ``cdc setup`` unpacks its plugin archives (``*-plugin.tar.gz``)
PLUGINS = "plugins"
#: ... and its application archives (``*-all.tar.gz``: a finished Quarkus build)
APP = "app"
#: written last into a jar folder by ``cdc setup``
COMPLETE = ".complete"
#: the fix named wherever a jar set is missing
SETUP_FIX = "run `cdc setup` once (it fetches the JVM jars with Maven; `make setup` runs it)"


def jars_root() -> Path:
    """``$CDC_JARS_DIR``, else ``$XDG_CACHE_HOME/cdc/jars``, else ``~/.cache/cdc/jars``."""
    if os.environ.get(JARS_ENV):
        return Path(os.environ[JARS_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "cdc" / "jars"


def jars_dir(name: str) -> Path:
    """The folder of jar set ``name`` (``spark`` or ``kafka``) for this installation's pom."""
    digest = hashlib.sha256(POMS[name].read_bytes()).hexdigest()[:12]
    return jars_root() / f"{name}-{digest}"


def jars_ready(folder: Path) -> bool:
    """Whether ``cdc setup`` finished filling ``folder``."""
    return (folder / COMPLETE).is_file()


# ------------------------------------------------------------------- the JVM's own stderr

#: set by the command line once its logging is set up (cdc_app/logs.py): a JVM started inside
#: :func:`stderr_through_logging` then writes its stderr — log4j's console lines, the JVM's own
#: warnings — into the ``jvm`` logger instead of the terminal
LOG_JVM_STDERR = False
#: ``<level> <logger>: <message>`` (the layout of spark_apply/log4j2.properties)
_LOG4J_LINE = re.compile(r"^(TRACE|DEBUG|INFO|WARN|ERROR|FATAL) (\S+): (.*)$")
_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
           "WARN": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}


def _pump(read_fd: int, logger: logging.Logger) -> None:
    """What the JVM writes to ``read_fd``, as records of ``logger``: a log4j line and the lines
    that follow it at once (its stack trace) as one record at the line's level, under its
    logger's name; any other line (the JVM's own notes) as a warning of its own."""
    buffer = b""
    record: list[str] = []
    level = logging.WARNING

    def flush() -> None:
        if record:
            logger.log(level, "%s", "\n".join(record))
            record.clear()

    while True:
        ready, _, _ = select.select([read_fd], [], [], 0.2)
        if not ready:
            flush()  # a record's lines arrive together: a pause ends it
            continue
        chunk = os.read(read_fd, 65536)
        if not chunk:
            flush()
            os.close(read_fd)
            return
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            text = raw.decode("utf-8", errors="replace").rstrip()
            match = _LOG4J_LINE.match(text)
            if match:
                flush()
                level = _LEVELS[match[1]]
                record.append(f"{match[2]}: {match[3]}")
            elif record:
                record.append(text)
            elif text.strip():
                logger.warning("%s", text.removeprefix("WARNING: "))


@contextlib.contextmanager
def stderr_through_logging(name: str = "jvm") -> Iterator[None]:
    """While inside, a process started here (the Spark driver's JVM) gets a pipe as its stderr,
    whose lines a daemon thread logs through logger ``name`` (see :func:`_pump`), for the
    process's whole life; this process's own stderr is back as it was on leaving. A no-op
    unless :data:`LOG_JVM_STDERR` (the command line's logging writes to its own copy of
    stderr, so nothing it logs can come back through the pipe)."""
    if not LOG_JVM_STDERR:
        yield
        return
    read_fd, write_fd = os.pipe()
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    threading.Thread(target=_pump, args=(read_fd, logging.getLogger(name)),
                     name="jvm-stderr", daemon=True).start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
