"""A throwaway Spark standalone cluster: one master and N workers on loopback, started from
pyspark's own jars with ``spark-class`` (no Spark download), logs and work directories in a
temporary directory, stopped (and the directory deleted) when done.

Used by the cluster tests and ``bench/apply.py --cluster``::

    with ThrowawaySparkCluster(workers=2) as cluster:
        cdc apply --master cluster.master_url ...

Each worker offers ``cores`` cores and ``memory`` to executors; an application's executors
need ``spark.executor.memory`` at most that (:data:`EXECUTOR_MEMORY` fits). Workers are
separate JVMs: :meth:`kill_worker` SIGKILLs one (its executors die with it, as on a lost
machine) and :meth:`start_worker` adds one back.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc.errors import CdcError
from cdc.jvm import jvm_options
from cdc_app.servers.postgres import free_port

#: what an application on this cluster may ask per executor (a worker offers ``memory``)
EXECUTOR_MEMORY = "512m"


def spark_home() -> Path:
    """pyspark's installation (its ``bin/spark-class`` and ``jars/``)."""
    try:
        import pyspark
    except ImportError:
        raise CdcError("PySpark is not installed",
                       "run `make setup`, or pip install -e '.[spark]'") from None
    return Path(pyspark.__file__).resolve().parent


@dataclass
class ThrowawaySparkCluster:
    """A standalone master and ``workers`` workers of ``cores`` cores each, on 127.0.0.1."""

    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    directory: Path | None = None
    port: int = 0
    ui_port: int = 0
    master: subprocess.Popen[bytes] | None = None
    worker_processes: list[subprocess.Popen[bytes] | None] = field(default_factory=list)
    #: each worker's web UI port (how the master's status names it)
    worker_ui_ports: list[int] = field(default_factory=list)
    #: the Python the workers offer executors (their PYSPARK_PYTHON, first on their PATH as
    #: ``python3``), with no PYTHONPATH: a machine with nothing of the project installed. None:
    #: the workers inherit this process's environment.
    worker_python: Path | None = None

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _command(self, *args: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), *args]

    def _environment(self) -> dict[str, str]:
        assert self.directory is not None
        env = dict(os.environ)
        # scratch space (executors' block managers, the shipped archive unpacked) inside the
        # cluster's directory, removed with it: a SIGKILLed executor leaves its directory
        # behind (a gigabyte with the archive), and /tmp would collect them
        local = self.directory / "local"
        local.mkdir(exist_ok=True)
        env.update({"SPARK_HOME": str(spark_home()), "SPARK_LOG_DIR": str(self.directory),
                    "SPARK_DAEMON_MEMORY": "256m", "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_NO_DAEMONIZE": "1", "SPARK_LOCAL_DIRS": str(local)})
        # and every JVM's temporary directory (executors inherit the workers' environment): an
        # executor copies each shipped archive into a java.io.tmpdir folder before unpacking it
        # and only deletes it at a clean exit (~570 MB per killed executor)
        temp = self.directory / "tmp"
        temp.mkdir(exist_ok=True)
        env["JAVA_TOOL_OPTIONS"] = " ".join(
            filter(None, [env.get("JAVA_TOOL_OPTIONS", ""), f"-Djava.io.tmpdir={temp}"]))
        from spark_apply.session import class_archive_options

        extra = [*jvm_options(), *class_archive_options().split()]
        if extra:
            env["SPARK_DAEMON_JAVA_OPTS"] = " ".join(
                filter(None, [env.get("SPARK_DAEMON_JAVA_OPTS", ""), *extra]))
        return env

    def start(self, timeout: float = 90.0) -> ThrowawaySparkCluster:
        """Start the master and the workers; return once every worker is registered ALIVE."""
        self.directory = Path(tempfile.mkdtemp(prefix="cdc-spark-"))
        self.port = self.port or free_port()
        self.ui_port = self.ui_port or free_port()
        log = (self.directory / "master.log").open("wb")
        self.master = subprocess.Popen(
            self._command("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                          "--port", str(self.port), "--webui-port", str(self.ui_port)),
            stdout=log, stderr=subprocess.STDOUT, env=self._environment(),
            cwd=self.directory, start_new_session=True)
        try:
            for _ in range(self.workers):
                self.start_worker()
            self.wait_workers(self.workers, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _worker_environment(self) -> dict[str, str]:
        env = self._environment()
        if self.worker_python is not None:
            for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
                env.pop(name, None)
            env["PYSPARK_PYTHON"] = str(self.worker_python)
            env["PATH"] = f"{self.worker_python.parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    def start_worker(self) -> int:
        """Start one more worker; its index (for :meth:`kill_worker`)."""
        assert self.directory is not None
        index = len(self.worker_processes)
        work = self.directory / f"worker-{index}"
        work.mkdir()
        log = (self.directory / f"worker-{index}.log").open("wb")
        ui_port = free_port()
        self.worker_ui_ports.append(ui_port)
        self.worker_processes.append(subprocess.Popen(
            self._command("org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                          "--cores", str(self.cores), "--memory", self.memory,
                          "--webui-port", str(ui_port), "--work-dir", str(work),
                          self.master_url),
            stdout=log, stderr=subprocess.STDOUT, env=self._worker_environment(), cwd=work,
            start_new_session=True))
        return index

    def state(self) -> dict[str, Any]:
        """The master's JSON status (workers, applications), or ``{}`` while it is not up."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/",
                                        timeout=2) as answer:
                return dict(json.loads(answer.read()))
        except (OSError, ValueError):
            return {}

    def alive_workers(self) -> int:
        return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")

    def wait_workers(self, count: int, timeout: float = 90.0) -> None:
        """Until ``count`` workers are ALIVE; :class:`CdcError` with the logs' tails if not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.master is not None and self.master.poll() is not None:
                break
            if self.alive_workers() >= count:
                return
            time.sleep(0.3)
        raise CdcError(f"the Spark standalone cluster did not come up ({self.alive_workers()} "
                       f"of {count} workers alive):\n{self.log_tail()}",
                       "check that Java 17 runs (`java -version`) and that pyspark is installed")

    def live_workers(self) -> list[int]:
        """The indexes of the workers whose process runs."""
        return [index for index, process in enumerate(self.worker_processes)
                if process is not None and process.poll() is None]

    def wait_worker(self, index: int, timeout: float = 90.0) -> None:
        """Until the master lists worker ``index`` itself as ALIVE (a count of ALIVE workers
        can include one just killed that the master has not timed out yet)."""
        suffix = f":{self.worker_ui_ports[index]}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(w.get("state") == "ALIVE" and str(w.get("webuiaddress", "")).endswith(suffix)
                   for w in self.state().get("workers", [])):
                return
            time.sleep(0.3)
        raise CdcError(f"Spark worker {index} did not register with the master:\n"
                       f"{self.log_tail()}", "check the worker's log above")

    def log_tail(self, chars: int = 1500) -> str:
        if self.directory is None:
            return ""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}"
                         for p in sorted(self.directory.glob("*.log")))

    def executor_pids(self, index: int | None = None) -> list[int]:
        """The process ids of the executors the workers (or worker ``index``) run now
        (``CoarseGrainedExecutorBackend`` JVMs)."""
        pids = []
        chosen = self.worker_processes if index is None else [self.worker_processes[index]]
        for worker in chosen:
            for pid in _children(worker.pid) if worker is not None else []:
                try:
                    command = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"CoarseGrainedExecutorBackend" in command:
                    pids.append(pid)
        return pids

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index`` and its executors (a lost machine)."""
        process = self.worker_processes[index]
        if process is None:
            return
        for pid in _children(process.pid):
            _kill(pid)
        _kill(process.pid)
        process.wait(10)
        self.worker_processes[index] = None

    def stop(self) -> None:
        """SIGKILL everything (workers, their executors, the master); delete the directory."""
        for index in range(len(self.worker_processes)):
            self.kill_worker(index)
        if self.master is not None:
            _kill(self.master.pid)
            self.master.wait(10)
            self.master = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> ThrowawaySparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (executors are children of their worker)."""
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True,
                           check=False)
    out: list[int] = []
    for child in (int(p) for p in found.stdout.split()):
        out.extend([child, *_children(child)])
    return out


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
