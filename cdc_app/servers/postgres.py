"""A throwaway PostgreSQL cluster: initdb in a temporary directory, started on a free port with
``wal_level=logical``, stopped (and deleted) when done.

PostgreSQL refuses to run as root, so when we are root the cluster runs as an unprivileged OS user
(``postgres`` if it exists, else ``nobody``); otherwise it runs as ourselves.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from cdc.errors import CdcError

CANDIDATE_BIN_DIRS = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin",
                      "/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/14/bin")

HBA = """\
local   all          all                     trust
host    all          cdc_password   127.0.0.1/32  scram-sha-256
host    replication  cdc_password   127.0.0.1/32  scram-sha-256
host    all          all            127.0.0.1/32  trust
host    replication  all            127.0.0.1/32  trust
"""


def find_bin_dir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` live."""
    for candidate in CANDIDATE_BIN_DIRS:
        if (Path(candidate) / "initdb").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise CdcError("PostgreSQL server binaries (initdb, pg_ctl) are not installed",
                   "run `make setup` (it installs Debian's postgresql package)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise CdcError("running as root and no unprivileged user exists to run PostgreSQL",
                   "create a `postgres` user, or run as a normal user")


@dataclass
class ThrowawayPostgres:
    """``with ThrowawayPostgres() as pg: pg.dsn("postgres")``."""

    settings: dict[str, str] = field(default_factory=dict)
    directory: Path | None = None
    port: int = 0
    user: str | None = None
    _owned_dir: bool = False

    def start(self) -> ThrowawayPostgres:
        bin_dir = find_bin_dir()
        self.user = _run_as()
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="cdc-pg-"))
            self._owned_dir = True
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o755)
        data = self.directory / "data"
        if self.user:
            shutil.chown(self.directory, self.user)
        if not (data / "PG_VERSION").exists():
            self._run([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres",
                       "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"])
            (data / "pg_hba.conf").write_text(HBA)
            if self.user:
                shutil.chown(data / "pg_hba.conf", self.user)
        self.port = self.port or free_port()
        options = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.directory}'",
            "wal_level": "logical",
            "max_replication_slots": "20",
            "max_wal_senders": "20",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "128MB",
            "max_connections": "60",
            **self.settings,
        }
        args = " ".join(f"-c {key}={value}" for key, value in options.items())
        self._run([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(self.directory / "log"),
                   "-o", args, "-w", "-t", "60", "start"])
        return self

    def stop(self, mode: str = "fast") -> None:
        if self.directory is None:
            return
        data = self.directory / "data"
        if (data / "postmaster.pid").exists():
            self._run([str(find_bin_dir() / "pg_ctl"), "-D", str(data), "-m", mode, "-w",
                       "stop"], check=False)

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop("immediate")
        if self._owned_dir and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> ThrowawayPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def dsn(self, database: str = "postgres", user: str = "postgres",
            password: str | None = None) -> str:
        auth = f"{user}:{password}" if password else user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def _run(self, command: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, cwd="/")
        if check and result.returncode != 0:
            log = ""
            if self.directory is not None and (self.directory / "log").exists():
                log = (self.directory / "log").read_text()[-2000:]
            raise CdcError(f"{Path(command[-1]).name} failed: {result.stderr.strip()}\n{log}",
                           "check that PostgreSQL's server binaries are installed")
        return result


def wait_ready(pg: ThrowawayPostgres, timeout: float = 30) -> None:
    """Block until the server accepts connections."""
    deadline = time.monotonic() + timeout
    bin_dir = find_bin_dir()
    while time.monotonic() < deadline:
        result = subprocess.run([str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p",
                                 str(pg.port)], capture_output=True)
        if result.returncode == 0:
            return
        time.sleep(0.1)
    raise CdcError(f"PostgreSQL on port {pg.port} did not become ready")
