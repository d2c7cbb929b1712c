"""A throwaway Redis server: ``redis-server`` on a free loopback port, data in a temporary
directory, no persistence, stopped (and its directory deleted) when done.

Used by the tests (the ``redis_server`` fixture), ``cdc demo`` and the benchmarks::

    with ThrowawayRedis() as server:
        client = redis.Redis.from_url(server.url)
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from cdc.errors import CdcError
from cdc_app.servers import stop_process
from cdc_app.servers.postgres import free_port


def find_redis_server() -> str:
    """The ``redis-server`` executable's path."""
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    if found is None:
        raise CdcError("redis-server is not installed",
                       "run `make setup` (it installs Debian's redis-server package)")
    return found


@dataclass
class ThrowawayRedis:
    """A redis-server bound to 127.0.0.1 on a free port (or ``port``), without persistence."""

    port: int = 0
    settings: dict[str, str] = field(default_factory=dict)
    directory: Path | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20.0) -> ThrowawayRedis:
        """Start the server and return once it answers PING; :class:`CdcError` otherwise."""
        binary = find_redis_server()
        self.directory = Path(tempfile.mkdtemp(prefix="cdc-redis-"))
        self.port = self.port or free_port()
        options = {"bind": "127.0.0.1", "port": str(self.port), "dir": str(self.directory),
                   "save": '""', "appendonly": "no", "protected-mode": "yes",
                   "logfile": str(self.directory / "redis.log"), "daemonize": "no",
                   **self.settings}
        conf = "".join(f"{key} {value}\n" for key, value in options.items())
        (self.directory / "redis.conf").write_text(conf)
        self.process = subprocess.Popen([binary, str(self.directory / "redis.conf")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        cwd=self.directory)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None and self.directory is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if _pings(self.port):
                return
            time.sleep(0.02)
        log = self.directory / "redis.log"
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
        self.stop()
        raise CdcError(f"redis-server on port {self.port} did not start:\n{tail}",
                       "check that redis-server runs (`redis-server --version`) and the port "
                       "is free")

    def restart(self, down_for: float = 0.0, timeout: float = 20.0) -> ThrowawayRedis:
        """Stop the server (SIGTERM: with ``appendonly yes`` in ``settings`` it keeps its data),
        wait ``down_for`` seconds, start it again on the same port and directory."""
        assert self.directory is not None
        stop_process(self.process, 10)
        time.sleep(down_for)
        self.process = subprocess.Popen([find_redis_server(), str(self.directory / "redis.conf")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        cwd=self.directory)
        self._wait_ready(timeout)
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s) and delete its directory."""
        stop_process(self.process, 10)
        self.process = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> ThrowawayRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _pings(port: int) -> bool:
    """Whether a server on ``port`` answers an inline PING with +PONG."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False
