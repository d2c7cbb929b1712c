"""A view's state kept open between batches: the process that holds it, its lease, and how a
batch's task reaches it.

Opening a view's DuckDB state for each batch reads every column the batch scans cold and
checkpoints at every close. So the state lives in one long-lived process, its **host**, which
keeps it open (:class:`views.sink.ViewSink` with ``keep_open``) and applies every batch:

* in local mode the ``cdc apply`` process hosts its views itself (:class:`ViewHost` without a
  listener): a batch is a call in the process;
* on a cluster, the first task of a view's batch that finds no live host starts one beside
  itself (``python -m views.host``: a process of its own, outside Spark's placement, detached
  from the task's Python worker, listening on every interface behind a random key), and every
  later task, on whatever executor it runs, sends its batch there (:class:`HostedView`).

Reads of the state by another process (the driver's ``check`` and watermark on a cluster) go to
the live host too; with none live they open the file themselves, as before.

**The lease**, ``<state>.lease`` beside the state file (JSON, mode 0600: it holds the key;
read and replaced under an exclusive ``flock`` of ``<state>.lease.lock``), says who may write the
state: ``epoch``, ``pid``, ``machine``, ``kind`` (``apply`` or ``host``), ``address``, ``key``,
``fingerprint`` (of the view's settings), ``renewed`` (seconds since the epoch). One writer at a
time:

* a host takes the lease only when none is live, as ``epoch + 1``; it renews it every
  ``LEASE_TTL_S / 3`` s. A lease is live while renewed within :data:`LEASE_TTL_S` and, on this
  machine, while its process exists (a SIGKILLed holder's lease is taken over at once there);
* before each write a host checks that the lease still holds its epoch, and a host that finds it
  lost (paused past its TTL, then woken) stops at once: fencing by epoch. On one machine
  DuckDB's own file lock keeps a second writer out as well;
* a caller whose host dies mid-call (the connection drops, or its lease lapses while the caller
  waits) starts a new host once the old lease is not live and sends the same batch again. A
  batch may be sent twice: the state's version gate skips what it already holds and its outbox
  writes into the followers what a crash left unwritten (``views/sink.py``).

**Checkpoints** are DuckDB's own: when its write-ahead log passes ``checkpoint_threshold``
(:data:`views.types.CHECKPOINT_THRESHOLD`) and when the host closes the state, not per batch.

A detached host stops when the ``cdc apply`` run that used it ends (its driver asks), after
:data:`IDLE_S` without a call, or when a caller brings another definition of the view (a new
fingerprint): that caller then starts a host of its own. Its output goes to ``<state>.host.log``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pickle
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc.errors import CdcError
from cdc.events import topic_name
from cdc.sink import ApplyStats, Change, Placement, Sink
from cdc.status import pid_alive
from views.sink import ViewSink, batch_rows, view_plan, view_topic
from views.state import ViewError

if TYPE_CHECKING:
    from cdc.config import Config

#: a lease not renewed for this long is not live (its host renews it every third of it)
LEASE_TTL_S = 10.0
#: a detached host stops after this long without a call
IDLE_S = 120.0
#: how long a caller waits for the host it started to take the lease
START_WAIT_S = 60.0
#: how often a caller waiting for a reply checks that the host's lease is still live
POLL_S = 1.0
#: the calls that write the state (a host checks its lease before each)
WRITES = frozenset({"apply_rows", "caught_up", "check", "set_watermark"})


def fingerprint(config: Config, name: str) -> str:
    """What a host of view ``name`` was started with: its settings, its followers', the log's
    (a host serves only callers with the same)."""
    text = repr(config.trimmed(name).model_dump())  # hashed, never shown: secrets stay hidden
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------- the lease

@dataclass(frozen=True)
class LeaseRecord:
    """What ``<state>.lease`` says (see the module docstring)."""

    epoch: int
    pid: int
    machine: str
    kind: str
    address: tuple[str, int] | None
    key: str
    fingerprint: str
    renewed: float

    def live(self) -> bool:
        if time.time() - self.renewed > LEASE_TTL_S:
            return False
        return not self.here() or pid_alive(self.pid)

    def here(self) -> bool:
        return self.machine == socket.gethostname()

    def who(self) -> str:
        what = "cdc apply" if self.kind == "apply" else "the state host"
        return f"{what} (pid {self.pid} on {self.machine}, lease epoch {self.epoch})"


class Lease:
    """The lease of the view state at ``state`` (see the module docstring)."""

    def __init__(self, state: Path) -> None:
        self.path = state.with_name(state.name + ".lease")
        self._lock_path = state.with_name(state.name + ".lease.lock")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def read(self) -> LeaseRecord | None:
        try:
            data = json.loads(self.path.read_text())
            address = data.pop("address")
            return LeaseRecord(address=None if address is None else tuple(address), **data)
        except (OSError, ValueError, TypeError):
            return None

    def _write(self, record: LeaseRecord) -> None:
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump(asdict(record), handle)
        os.replace(temporary, self.path)

    def take(self, kind: str, address: tuple[str, int] | None, key: str,
             fingerprint: str) -> LeaseRecord:
        """The lease, as the next epoch (a :class:`HostBusy` while another holder's is live)."""
        with self._locked():
            old = self.read()
            if old is not None and old.live():
                raise HostBusy(old)
            record = LeaseRecord(epoch=(old.epoch if old else 0) + 1, pid=os.getpid(),
                                 machine=socket.gethostname(), kind=kind, address=address,
                                 key=key, fingerprint=fingerprint, renewed=time.time())
            self._write(record)
            return record

    def renew(self, epoch: int) -> bool:
        """Renewed if it still holds ``epoch`` (else lost: False)."""
        with self._locked():
            now = self.read()
            if now is None or now.epoch != epoch:
                return False
            self._write(replace(now, renewed=time.time()))
            return True

    def release(self, epoch: int) -> None:
        """Not live any more (the epoch stays: the next holder's is one above)."""
        with self._locked():
            now = self.read()
            if now is not None and now.epoch == epoch:
                self._write(replace(now, renewed=0.0))


class HostBusy(ViewError):
    """Another process holds a live lease on the view's state."""

    def __init__(self, record: LeaseRecord) -> None:
        self.record = record
        super().__init__(f"the view's state is held by {record.who()}: one writer at a time",
                         "is another `cdc apply` running this view? Stop it (its lease lapses "
                         f"{LEASE_TTL_S:.0f} s after its process stops)")


# ---------------------------------------------------------------------------------- the host

@dataclass
class _Hosted:
    sink: ViewSink
    lease: Lease
    record: LeaseRecord
    lock: threading.Lock


class ViewHost:
    """Views ``names`` of ``config``, their states kept open under their leases. ``detached``:
    a process of its own serving callers over the network (``python -m views.host``); else the
    ``cdc apply`` process hosting its own views (no listener)."""

    def __init__(self, config: Config, names: Sequence[str], detached: bool = False) -> None:
        self.config = config
        self.detached = detached
        self.key = secrets.token_hex(32)
        self.stopped = threading.Event()
        self.last_call = time.monotonic()
        self._listener: Listener | None = None
        address: tuple[str, int] | None = None
        if detached:
            self._listener = Listener(("0.0.0.0", 0), authkey=self.key.encode())
            address = (_advertised(), self._listener.address[1])
        self._views: dict[str, _Hosted] = {}
        try:
            for name in names:
                self._take(name, address)
        except BaseException:
            self.close()
            raise
        threading.Thread(target=self._renew, name="cdc-view-lease", daemon=True).start()
        if self._listener is not None:
            threading.Thread(target=self._accept, name="cdc-view-host", daemon=True).start()

    def _take(self, name: str, address: tuple[str, int] | None) -> None:
        lease = Lease(self.config.view_state(name))
        kind = "host" if self.detached else "apply"
        mine = fingerprint(self.config, name)
        try:
            record = lease.take(kind, address, self.key, mine)
        except HostBusy as busy:
            if self.detached or busy.record.kind != "host":
                raise ViewError(f"view {name}: {busy.problem}", busy.fix) from None
            _ask_stop(lease, busy.record, name)  # a host an earlier run left: stopped
            record = lease.take(kind, address, self.key, mine)
        self._views[name] = _Hosted(ViewSink(self.config, name, keep_open=True), lease, record,
                                    threading.Lock())

    def sink(self, name: str) -> ViewSink:
        return self._views[name].sink

    def call(self, name: str, method: str, args: Sequence[Any]) -> Any:
        """``method(*args)`` of view ``name``'s sink, under its lock (a write: only while the
        lease still holds this host's epoch, renewed first)."""
        self.last_call = time.monotonic()
        hosted = self._views[name]
        with hosted.lock:
            if method in WRITES and not hosted.lease.renew(hosted.record.epoch):
                self._lost(name)
            result = getattr(hosted.sink, method)(*args)
            self.last_call = time.monotonic()
            return list(result) if method == "keys" else result

    def _lost(self, name: str) -> None:
        hosted = self._views[name]
        if self.detached:
            os._exit(3)  # fencing: a host that lost its lease writes nothing more
        raise ViewError(f"view {name}: this process lost the lease on its state "
                        f"{hosted.lease.path} (it was not renewed for {LEASE_TTL_S:.0f} s: "
                        "the process was paused or the file system unreachable)",
                        "restart `cdc apply`; the view resumes from its progress record")

    # ----------------------------------------------------------------- the lease, renewed
    def _renew(self) -> None:
        while not self.stopped.wait(LEASE_TTL_S / 3):
            for hosted in list(self._views.values()):
                if not hosted.lease.renew(hosted.record.epoch) and self.detached:
                    os._exit(3)
            if self.detached and time.monotonic() - self.last_call > IDLE_S:
                self.close()

    # -------------------------------------------------------------------- serving callers
    def _accept(self) -> None:
        assert self._listener is not None
        while not self.stopped.is_set():
            try:
                connection = self._listener.accept()
            except (OSError, EOFError):  # closed by close(), or a caller without the key
                continue
            threading.Thread(target=self._serve, args=(connection,), daemon=True,
                             name="cdc-view-call").start()

    def _serve(self, connection: Connection) -> None:
        with connection:
            while True:
                try:
                    name, wanted, method, args = connection.recv()
                except (EOFError, OSError):
                    return
                reply = self._answer(name, wanted, method, args)
                try:
                    connection.send(reply)
                except (OSError, ValueError):
                    return
                if method == "stop":
                    self.close()
                    return

    def _answer(self, name: str, wanted: str, method: str, args: Sequence[Any]
                ) -> tuple[str, Any]:
        hosted = self._views.get(name)
        if method == "stop":
            return ("ok", None)
        if hosted is None or hosted.record.fingerprint != wanted:
            return ("other", None)
        try:
            return ("ok", self.call(name, method, args))
        except CdcError as exc:
            return ("error", ViewError(exc.problem, exc.fix))
        except Exception as exc:  # noqa: BLE001 (reaches the caller as the view's error)
            return ("error", ViewError(f"view {name}: its state host failed ({exc!r})",
                                       f"see {_host_log(self.config, name)}"))

    def close(self) -> None:
        """Every state closed (DuckDB checkpoints it), every lease released."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        for hosted in self._views.values():
            with hosted.lock:
                hosted.sink.close()
                hosted.lease.release(hosted.record.epoch)


def _advertised() -> str:
    """The address other machines reach this one at (the loopback's when none resolves)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _host_log(config: Config, name: str) -> Path:
    state = config.view_state(name)
    return state.with_name(state.name + ".host.log")


def _connect(record: LeaseRecord) -> Connection:
    assert record.address is not None
    host = "127.0.0.1" if record.here() else record.address[0]
    return Client((host, record.address[1]), authkey=record.key.encode())


def _ask_stop(lease: Lease, record: LeaseRecord, name: str) -> None:
    """Ask the host of ``record`` to stop, and wait until its lease is not live."""
    with contextlib.suppress(OSError, EOFError), _connect(record) as connection:
        connection.send((name, record.fingerprint, "stop", ()))
        connection.poll(30.0)
    _wait_lapsed(lease, record)


def _wait_lapsed(lease: Lease, record: LeaseRecord) -> None:
    """Until ``lease`` no longer holds ``record`` live (at most its TTL and a little)."""
    deadline = time.monotonic() + LEASE_TTL_S + 5
    while time.monotonic() < deadline:
        now = lease.read()
        if now is None or now.epoch != record.epoch or not now.live():
            return
        time.sleep(0.1)


# ------------------------------------------------------------------------- the caller's side

class HostedView(Sink):
    """View ``name`` of ``config`` as a sink whose every step runs where its state is held:
    ``host`` (this process's own) if given, else the live host of its lease, started by an
    :meth:`apply` when there is none. ``stops_host``: :meth:`close` asks a detached host to
    stop (the ``cdc apply`` driver's, at the end of the run)."""

    folds = True
    placement = Placement.WHOLE_BATCH

    def __init__(self, config: Config, name: str, host: ViewHost | None = None,
                 stops_host: bool = False) -> None:
        self.config = config
        self.name = name
        self.host = host
        self.stops_host = stops_host
        view = config.views[name]
        plan = host.sink(name).plan if host is not None else view_plan(config, name)
        self.plan = plan
        self.topic = view_topic(view.source, name)
        self.read_topics = sorted(topic_name(view.source, table)
                                  for table in plan.captured_tables)
        self.fingerprint = fingerprint(config, name)
        self.state = config.view_state(name)
        self.lease = Lease(self.state)
        self._direct: ViewSink | None = None
        self._connection: Connection | None = None
        self._record: LeaseRecord | None = None

    # ------------------------------------------------------------------ the sink's steps
    def check(self) -> None:
        self._call("check")

    def apply(self, changes: Sequence[Change]) -> ApplyStats:
        result: ApplyStats = self._call("apply_rows", batch_rows(changes), start=True)
        return result

    def apply_behind(self, changes: Sequence[Change]) -> ApplyStats:
        result: ApplyStats = self._call("apply_rows", batch_rows(changes), True, start=True)
        return result

    def caught_up(self) -> None:
        self._call("caught_up", start=True)

    def set_watermark(self, source: str, offset: Mapping[str, Any]) -> None:
        self._call("set_watermark", source, dict(offset))

    def watermark(self, source: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self._call("watermark", source)
        return result

    def read(self, topic: str, keys: Sequence[str]) -> dict[str, dict[str, str]]:
        result: dict[str, dict[str, str]] = self._call("read", topic, list(keys))
        return result

    def keys(self, topic: str) -> Iterator[str]:
        return iter(self._call("keys", topic))

    def close(self) -> None:
        record = self.lease.read() if self.stops_host and self.host is None else None
        self._hang_up()
        if record is not None and record.kind == "host" and record.live() and \
                record.fingerprint == self.fingerprint:
            _ask_stop(self.lease, record, self.name)
        if self._direct is not None:
            self._direct.close()
            self._direct = None

    # -------------------------------------------------------------------------- calling
    def _call(self, method: str, *args: Any, start: bool = False) -> Any:
        if self.host is not None:
            return self.host.call(self.name, method, args)
        for _ in range(4):
            record = self.lease.read()
            if record is None or not record.live():
                if not start:
                    return self._direct_call(method, args)
                record = self._start()
            if record.kind != "host":
                busy = HostBusy(record)
                raise ViewError(f"view {self.name}: {busy.problem}", busy.fix)
            try:
                status, value = self._send(record, method, args)
            except (OSError, EOFError):  # the host died or cannot be reached: taken over
                self._hang_up()
                _wait_lapsed(self.lease, record)
                continue
            if status == "ok":
                return value
            if status == "error":
                raise value
            self._hang_up()  # a host of another definition: stopped, then one of ours
            _ask_stop(self.lease, record, self.name)
        raise ViewError(f"view {self.name}: no host of its state {self.state} answers",
                        f"see {_host_log(self.config, self.name)}; stop any process that "
                        f"holds the state (its lease: {self.lease.path})")

    def _direct_call(self, method: str, args: Sequence[Any]) -> Any:
        """No live host: the step on the file itself (opened for it, closed after)."""
        if self._direct is None:
            self._direct = ViewSink(self.config, self.name)
        result = getattr(self._direct, method)(*args)
        return list(result) if method == "keys" else result

    def _send(self, record: LeaseRecord, method: str, args: Sequence[Any]) -> tuple[str, Any]:
        # the same holder (its renewals change only ``renewed``): the connection kept
        if self._connection is None or self._record is None or \
                (self._record.epoch, self._record.pid) != (record.epoch, record.pid):
            self._hang_up()
            self._connection = _connect(record)
            self._record = record
        connection = self._connection
        connection.send((self.name, self.fingerprint, method, tuple(args)))
        while not connection.poll(POLL_S):
            now = self.lease.read()
            if now is None or now.epoch != record.epoch or not now.live():
                raise OSError("the host's lease lapsed while it held the call")
        reply: tuple[str, Any] = connection.recv()
        return reply

    def _hang_up(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(OSError):
                self._connection.close()
        self._connection = None
        self._record = None

    def _start(self) -> LeaseRecord:
        """A host of this view started beside this process; its lease once it holds it."""
        log = _host_log(self.config, self.name)
        log.parent.mkdir(parents=True, exist_ok=True)
        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        started_at = log.stat().st_size if log.exists() else 0
        with open(log, "ab") as output:
            process = subprocess.Popen(
                [sys.executable, "-m", "views.host"], stdin=subprocess.PIPE, stdout=output,
                stderr=subprocess.STDOUT, env=env, start_new_session=True, close_fds=True)
        assert process.stdin is not None
        process.stdin.write(pickle.dumps((self.config.trimmed(self.name), self.name)))
        process.stdin.close()
        process.wait()  # it forks the host and exits at once
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline:
            record = self.lease.read()
            if record is not None and record.live() and record.kind == "host":
                return record
            if process.returncode or b"host not started" in log.read_bytes()[started_at:]:
                break
            time.sleep(0.05)
        raise ViewError(f"view {self.name}: its state host did not start",
                        f"see {log}")


# ------------------------------------------------------------------------ the host's process

def main() -> None:
    """``python -m views.host``: the pickled ``(config, view)`` on stdin; detaches, hosts the
    view until stopped or idle."""
    config, name = pickle.loads(sys.stdin.buffer.read())
    if os.fork() > 0:  # the starter reaps this one at once; the host lives on by itself
        os._exit(0)
    try:
        host = ViewHost(config, [name], detached=True)
    except CdcError as exc:
        print(f"view {name}: host not started: {exc}", flush=True)
        sys.exit(1)
    print(f"view {name}: host pid {os.getpid()} holds lease epoch "
          f"{host._views[name].record.epoch}", flush=True)
    host.stopped.wait()
    print(f"view {name}: host pid {os.getpid()} stopped", flush=True)


if __name__ == "__main__":
    main()
