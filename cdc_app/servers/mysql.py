"""A throwaway MariaDB server: ``mariadb-install-db`` in a temporary directory, ``mariadbd``
started on a free loopback port (and a unix socket in that directory) with the row binlog a CDC
replica needs, stopped (and deleted) when done.

``--no-defaults`` keeps ``/etc/mysql`` out of it, so every setting is the one given here::

    with ThrowawayMariaDB() as server:
        server.execute("CREATE DATABASE shop")
        server.url_for("cdc", "shop")   # mysql://cdc@127.0.0.1:PORT/shop

The defaults are what capture needs (``log_bin``, ``binlog_format=ROW``,
``binlog_row_image=FULL``, ``binlog_row_metadata=FULL``, GTIDs in ``gtid_domain_id``); tests that
need a misconfigured server override them through ``options`` (``{"binlog_format": "STATEMENT"}``,
``{"log_bin": False}`` for no binlog at all). Named time zones (``default_time_zone=
'America/New_York'``) need the time zone tables: ``time_zones=True`` loads them when the data
directory is created, :meth:`ThrowawayMariaDB.load_time_zones` loads them into a running server.

mariadbd refuses to run as root, so when we are root it switches to an unprivileged OS user
(``mysql`` if it exists, else ``nobody``) with its own ``--user`` option; the process we start is
the server itself, so :meth:`ThrowawayMariaDB.kill` really kills it.
"""

from __future__ import annotations

import atexit
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc.errors import CdcError
from cdc_app.servers.postgres import free_port

#: a value of ``False`` in an ``options`` mapping removes the option (``{"log_bin": False}``: no
#: binlog); ``None`` or ``True`` passes it as a bare flag (``--log-bin``); a list of
#: ``"name=value"`` / ``"name"`` strings only adds or overrides
OptionValue = str | int | bool | None
Options = Mapping[str, OptionValue] | Iterable[str]

BINLOG_BASENAME = "binlog"
ZONEINFO = Path("/usr/share/zoneinfo")

#: installed data directories to copy, per (OS user, time zones loaded); deleted at exit
_TEMPLATES: dict[tuple[str | None, bool], Path] = {}
_INSTALL_FIX = "run `make setup` (it installs Debian's mariadb-server and mariadb-client)"


def find_program(*names: str) -> str:
    """The path of the first of ``names`` found on PATH or in /usr/sbin, /usr/bin."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
        for directory in ("/usr/sbin", "/usr/bin"):
            if (Path(directory) / name).exists():
                return str(Path(directory) / name)
    raise CdcError(f"MariaDB program {names[0]} is not installed", _INSTALL_FIX)


def mariadb_version() -> str:
    """The installed server's version, e.g. ``10.11.19`` (from ``mariadbd --version``)."""
    result = subprocess.run([find_program("mariadbd", "mysqld"), "--no-defaults", "--version"],
                            capture_output=True, text=True, check=False)
    match = re.search(r"Ver (\d+\.\d+\.\d+)", result.stdout)
    if not match:
        raise CdcError(f"cannot read the MariaDB server version from {result.stdout!r}",
                       _INSTALL_FIX)
    return match.group(1)


def debezium_version_string() -> str:
    """A ``--version`` value like ``5.5.5-10.11.19-MariaDB-log``: the replication-protocol form
    of the version string that some clients (Debezium's MySQL connector) parse."""
    return f"5.5.5-{mariadb_version()}-MariaDB-log"


def _run_as() -> str | None:
    """The OS user mariadbd runs as: ourselves unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("mysql", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise CdcError("running as root and no unprivileged user exists to run MariaDB",
                   "create a `mysql` user, or run as a normal user")


def _normalise(options: Options) -> dict[str, OptionValue]:
    """``{"binlog-format": "ROW"}``, ``["binlog_format=ROW", "skip-name-resolve"]`` or
    ``["--log-bin"]`` -> ``{"binlog_format": "ROW", ...}`` (underscores, no dashes in front)."""
    items: Iterable[tuple[str, OptionValue]]
    if isinstance(options, Mapping):
        items = options.items()
    else:
        pairs: list[tuple[str, OptionValue]] = []
        for option in options:
            name, sep, value = option.partition("=")
            pairs.append((name, value if sep else None))
        items = pairs
    return {name.lstrip("-").replace("-", "_"): value for name, value in items}


def _argument(name: str, value: OptionValue) -> str:
    flag = "--" + name.replace("_", "-")
    return flag if value is None or value is True else f"{flag}={value}"


@dataclass
class ThrowawayMariaDB:
    """A mariadbd on 127.0.0.1 (free port) with a CDC-ready row binlog, in a temporary
    directory; ``start()`` again after ``stop()``/``kill()`` reuses the same data directory and
    port (restart-mid-stream tests), ``cleanup()`` deletes it."""

    #: extra or overriding server options (see :data:`Options`); ``False`` drops a default
    options: Options = field(default_factory=dict)
    server_id: int = 1
    gtid_domain_id: int = 0
    #: 1/1 is durable; 2/0 (tests/mykit.py) survives a SIGKILL of mariadbd, not of the OS
    flush_log_at_trx_commit: int = 1
    sync_binlog: int = 1
    #: a ``--version=`` override, e.g. :func:`debezium_version_string`
    version: str | None = None
    #: load the time zone tables (named zones) when the data directory is created
    time_zones: bool = False
    directory: Path | None = None
    port: int = 0
    host: str = "127.0.0.1"
    #: the OS user mariadbd runs as (set by ``start()``: ``mysql`` when we are root)
    user: str | None = None
    process: subprocess.Popen[bytes] | None = None
    #: seconds the last ``start()`` took (install included when it ran)
    start_seconds: float = 0.0
    _owned_dir: bool = False

    # ------------------------------------------------------------------------------ paths

    @property
    def data_dir(self) -> Path:
        return self._dir / "data"

    @property
    def socket(self) -> str:
        return str(self._dir / "mysqld.sock")

    @property
    def error_log(self) -> Path:
        return self._dir / "error.log"

    @property
    def binlog_basename(self) -> Path:
        return self.data_dir / BINLOG_BASENAME

    @property
    def _dir(self) -> Path:
        if self.directory is None:
            raise CdcError("the throwaway MariaDB server has not been started",
                           "call start() first")
        return self.directory

    # -------------------------------------------------------------------------- lifecycle

    def server_options(self) -> dict[str, OptionValue]:
        """Every option mariadbd gets after ``--no-defaults`` (``False`` ones removed)."""
        defaults: dict[str, OptionValue] = {
            "datadir": str(self.data_dir),
            # Its own temporary folder: internal temporary tables (`#sql-temptable-…`) in a /tmp
            # shared with other servers and tests were once removed under a running query.
            "tmpdir": str(self._dir / "tmp"),
            "socket": self.socket,
            "pid_file": str(self._dir / "mysqld.pid"),
            "log_error": str(self.error_log),
            "port": self.port,
            "bind_address": self.host,
            "skip_name_resolve": None,
            "log_bin": str(self.binlog_basename),
            "binlog_format": "ROW",
            "binlog_row_image": "FULL",
            "binlog_row_metadata": "FULL",
            "server_id": self.server_id,
            "gtid_domain_id": self.gtid_domain_id,
            "character_set_server": "utf8mb4",
            "collation_server": "utf8mb4_general_ci",
            "innodb_buffer_pool_size": "32M",
            "innodb_log_file_size": "16M",
            "innodb_log_buffer_size": "4M",
            "innodb_flush_log_at_trx_commit": self.flush_log_at_trx_commit,
            "sync_binlog": self.sync_binlog,
            "innodb_doublewrite": 0,
            "innodb_fast_shutdown": 1,
            "innodb_buffer_pool_load_at_startup": 0,
            "innodb_buffer_pool_dump_at_shutdown": 0,
            "performance_schema": "OFF",
            "max_connections": 200,
            "key_buffer_size": "1M",
            "table_open_cache": 400,
            "thread_cache_size": 8,
            "loose_feedback": "OFF",
        }
        if self.user:
            defaults["user"] = self.user
        if self.version:
            defaults["version"] = self.version
        merged = {**defaults, **_normalise(self.options)}
        return {name: value for name, value in merged.items() if value is not False}

    def start(self, timeout: float = 30.0) -> ThrowawayMariaDB:
        """Create the data directory (first time only), start mariadbd and return once it
        accepts connections; :class:`CdcError` with the tail of its error log otherwise."""
        if self.running():
            return self
        began = time.monotonic()
        self.user = _run_as()
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="cdc-mariadb-"))
            self._owned_dir = True
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o755)
        if self.user:
            shutil.chown(self.directory, self.user, self.user)
        if not (self.data_dir / "mysql").is_dir():
            self._copy_template()
        temporary = self._dir / "tmp"
        temporary.mkdir(exist_ok=True)
        if self.user:
            shutil.chown(temporary, self.user, self.user)
        self.port = self.port or free_port()
        command = [find_program("mariadbd", "mysqld"), "--no-defaults",
                   *(_argument(name, value) for name, value in self.server_options().items())]
        with open(self._dir / "mariadbd.out", "ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=out, cwd=self._dir,
                                            stdin=subprocess.DEVNULL)
        self._wait_ready(timeout)
        self.start_seconds = time.monotonic() - began
        return self

    def _copy_template(self) -> None:
        """A fresh data directory: a copy of one ``mariadb-install-db`` made once per process
        (and per ``time_zones``); copying takes a tenth of the 1-3 s installing does."""
        key = (self.user, self.time_zones)
        template = _TEMPLATES.get(key)
        if template is None or not (template / "data" / "mysql").is_dir():
            template = Path(tempfile.mkdtemp(prefix="cdc-mariadb-template-"))
            os.chmod(template, 0o755)
            if self.user:
                shutil.chown(template, self.user, self.user)
            try:
                _install(template / "data", self.user, self.time_zones)
            except BaseException:
                shutil.rmtree(template, ignore_errors=True)
                raise
            if not _TEMPLATES:
                atexit.register(_remove_templates)
            _TEMPLATES[key] = template
        result = subprocess.run(["cp", "-a", str(template / "data"), str(self.data_dir)],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise CdcError(f"cannot copy a MariaDB data directory to {self.data_dir}: "
                           f"{result.stderr.strip()}", "check the free space in the temp dir")

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                self.root_connect(timeout=2).close()
                return
            except Exception as exc:  # noqa: BLE001 - not up yet; reported below if it stays so
                last = exc
                time.sleep(0.05)
        exited = self.process.poll()
        tail = self.error_log_tail()
        if exited is None:
            self.kill()
            what = f"did not accept connections within {timeout:.0f} s ({last})"
        else:
            self.process = None
            what = f"exited with status {exited}"
        raise CdcError(f"mariadbd on port {self.port} {what}; the end of its error log:\n{tail}",
                       "check the options given to the throwaway server and that mariadbd runs "
                       "(`mariadbd --version`)")

    def error_log_tail(self, chars: int = 2000) -> str:
        """The end of the server's error log (and of its stdout/stderr)."""
        text = ""
        for path in (self.error_log, self._dir / "mariadbd.out"):
            if path.exists():
                text += path.read_text(errors="replace")[-chars:]
        return text[-chars:]

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 60.0) -> None:
        """Clean shutdown (SIGTERM: mariadbd flushes and closes the binlog); SIGKILL if it has
        not exited within ``timeout``."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: a crash (InnoDB and the binlog recover at the next ``start()``)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self.process = None

    def restart(self, timeout: float = 30.0) -> None:
        self.stop()
        self.start(timeout)

    def cleanup(self) -> None:
        """Stop (kill) the server and delete its directory if we created it."""
        self.kill()
        if self._owned_dir and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> ThrowawayMariaDB:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # --------------------------------------------------------------------------- clients

    def url_for(self, user: str = "root", database: str = "", password: str | None = None
                ) -> str:
        """``mysql://user[:password]@127.0.0.1:PORT/database`` (TCP, for capture configs)."""
        auth = f"{user}:{password}" if password else user
        return f"mysql://{auth}@{self.host}:{self.port}/{database}"

    def connection_settings(self, user: str = "root", password: str = "",
                            database: str | None = None, tcp: bool = True) -> dict[str, Any]:
        """PyMySQL ``connect()`` arguments (also BinLogStreamReader's ``connection_settings``)."""
        settings: dict[str, Any] = {"user": user, "password": password, "charset": "utf8mb4"}
        if tcp:
            settings.update(host=self.host, port=self.port)
        else:
            settings["unix_socket"] = self.socket
        if database:
            settings["database"] = database
        return settings

    def root_connect(self, database: str | None = None, *, tcp: bool = False,
                     timeout: float = 10) -> Any:
        """A PyMySQL connection as root (unix socket unless ``tcp``), in autocommit mode."""
        import pymysql

        return pymysql.connect(**self.connection_settings(database=database, tcp=tcp),
                               autocommit=True, connect_timeout=timeout)

    def execute(self, sql: str, params: Any = None, database: str | None = None
                ) -> list[tuple[Any, ...]]:
        """Run one statement as root; its rows (empty for statements without a result)."""
        conn = self.root_connect(database)
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql, params)
                return list(cursor.fetchall()) if cursor.description else []
        finally:
            conn.close()

    def variables(self, *names: str) -> dict[str, Any]:
        """``SELECT @@name, ...`` as a dict."""
        row = self.execute("SELECT " + ", ".join(f"@@{name}" for name in names))[0]
        return dict(zip(names, row, strict=True))

    def binlog_position(self) -> tuple[str, int]:
        """The current binlog file and position (``SHOW MASTER STATUS``)."""
        rows = self.execute("SHOW MASTER STATUS")
        if not rows:
            raise CdcError("the throwaway MariaDB server has no binlog",
                           "start it without overriding log_bin")
        return str(rows[0][0]), int(rows[0][1])

    def load_time_zones(self, zones: Iterable[str] | None = None) -> None:
        """Load the time zone tables (all of /usr/share/zoneinfo, or just ``zones`` not loaded
        yet) into the running server, without writing them to the binlog. Needed before a
        named zone can be used (``SET time_zone = 'America/New_York'``, ``default_time_zone``
        at the next start)."""
        client = find_program("mariadb", "mysql")
        if zones is not None:  # loading a zone twice fails: the ones loaded already are kept
            listed = subprocess.run(
                [client, "--no-defaults", f"--socket={self.socket}", "-uroot", "-N", "-e",
                 "SELECT Name FROM mysql.time_zone_name"], capture_output=True, text=True,
                check=False)
            zones = [zone for zone in zones if zone not in listed.stdout.split()]
            if not zones:
                return
        sql = "SET SESSION sql_log_bin = 0;\n" + _time_zone_sql(zones)
        result = subprocess.run([client, "--no-defaults", f"--socket={self.socket}", "-uroot",
                                 "mysql"], input=sql, capture_output=True, text=True,
                                check=False)
        if result.returncode != 0:
            raise CdcError(f"loading the time zone tables failed: {result.stderr.strip()}",
                           _INSTALL_FIX)


def _install(data_dir: Path, user: str | None, time_zones: bool) -> None:
    """``mariadb-install-db``: system tables, root without a password (socket and TCP), no
    test database; the time zone tables too when ``time_zones`` is set."""
    command = [find_program("mariadb-install-db", "mysql_install_db"), "--no-defaults",
               f"--datadir={data_dir}", "--auth-root-authentication-method=normal",
               "--skip-test-db", "--skip-name-resolve",
               "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M",
               "--innodb-doublewrite=0", "--performance-schema=OFF"]
    if user:
        command.append(f"--user={user}")
    if time_zones:
        sql = data_dir.parent / "time_zones.sql"
        sql.write_text("USE mysql;\n" + _time_zone_sql())
        os.chmod(sql, 0o644)
        command.append(f"--extra-file={sql}")
    result = subprocess.run(command, capture_output=True, text=True, cwd="/", check=False)
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-2000:]
        raise CdcError(f"mariadb-install-db failed in {data_dir}:\n{output}", _INSTALL_FIX)


def _remove_templates() -> None:
    for template in _TEMPLATES.values():
        shutil.rmtree(template, ignore_errors=True)
    _TEMPLATES.clear()


def _time_zone_sql(zones: Iterable[str] | None = None) -> str:
    """``mysql_tzinfo_to_sql`` output for all zones, or for the named ones."""
    program = find_program("mysql_tzinfo_to_sql", "mariadb-tzinfo-to-sql")
    if not ZONEINFO.is_dir():
        raise CdcError(f"{ZONEINFO} is missing: no time zone data to load",
                       "install Debian's tzdata package")
    if zones is None:
        runs = [[program, str(ZONEINFO)]]
    else:
        runs = [[program, str(ZONEINFO / zone), zone] for zone in zones]
    parts = []
    for command in runs:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise CdcError(f"{' '.join(command)} failed: {result.stderr.strip()[-500:]}",
                           "name zones as in /usr/share/zoneinfo, e.g. America/New_York")
        parts.append(result.stdout)
    return "\n".join(parts)
