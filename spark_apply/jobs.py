"""``cdc apply``: one loop reads the change log once for every follower and view, and each
writes through a runner of its own.

The walk, per cycle of the loop (:meth:`ApplyJob.wait`):

1. the followers that are *ready* (not writing a batch, not waiting out an outage, their
   ``trigger_interval`` since their last batch passed — unless that batch was a quiet one, of
   fewer than :data:`QUIET_BATCH` records: the interval batches changes up under load, and
   at a trickle a change is applied as soon as the loop sees it) are planned together from one
   read of the log's committed state and their own progress records
   (``spark_apply/planning.py``): followers at the same offsets share one batch, one a little
   behind joins it, one far behind gets a read of its own;
2. each read is read once (``spark_apply/shared_read.py``) and cut into one batch per
   follower, handed to the follower's runner (``spark_apply/runners/``: a process of its own in
   local mode, the apply process for views and driver-placed sinks, Spark jobs on a cluster) on
   the follower's own thread, so a slow follower holds nobody back;
3. when the runner returned, on that thread: :meth:`Sink.set_watermark` with the batch's
   watermarks, then the follower's progress record (``spark_apply/progress.py``) — so neither
   ever claims more than the follower holds. A crash before the record replays the batch from
   the previous one; the version gate makes the replay change nothing.

``once`` fixes the complete end of the log when the run starts and returns when every follower
reached it; otherwise the loop runs until :meth:`ApplyJob.request_stop` (SIGTERM), which lets the
running batches finish. A follower whose log or server is away waits with backoff and catches up
(``spark_apply/outages.py``); a view that fails stops alone; any other failure stops the run.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc.config import Config
from cdc.errors import CdcError, LogError, LogUnavailable
from cdc.heap import collector_paused, long_lived_heap
from cdc.log.open import log_settings, must_read
from cdc.sink import Sink
from spark_apply import progress as records
from spark_apply.errors import (
    TRANSIENT_RESTARTS,
    ApplyError,
    failure_summary,
    is_transient,
    task_error,
)
from spark_apply.followers import FollowerProgress
from spark_apply.outages import OUTAGES, Waiting, outage_of, probe
from spark_apply.outages import ride_out as wait_out_outages
from spark_apply.planning import Member, Read, plan_cycle
from spark_apply.runners.base import Runner
from spark_apply.runners.choice import choose
from spark_apply.session import start_spark
from spark_apply.shared_read import Batch, Decoded, Takes, cut
from spark_apply.stale import refuse_if_stale
from spark_apply.tasks import FollowerHandle, TaskReport, open_target

log = logging.getLogger(__name__)

__all__ = ["ApplyError", "ApplyJob", "FollowerProgress", "run_apply"]

#: how soon :meth:`ApplyJob.wait` sees a stop request (SIGTERM, Ctrl-C) while it waits
STOP_POLL_S = 0.1
#: how long a read of the log may go unanswered before its followers are said to wait
LOG_PATIENCE_S = 10.0
#: after a stop's grace, how long the batches whose Spark jobs were cancelled get to end
CANCEL_WAIT_S = 20.0
#: the longest the loop sleeps between two looks at the log (a follower's own
#: ``trigger_interval`` may be longer)
POLL_S = 0.05
#: a batch of fewer records than this is a quiet one: the follower's next batch does not wait
#: for its ``trigger_interval`` (measured idle, a probe reached a search follower in 0.34 s p50
#: at 250 ms and 0.23 s at 50 ms; Delta 0.76 s at 1 s and 0.26 s at 50 ms)
QUIET_BATCH = 100


def check_log(config: Config) -> None:
    """:class:`LogError` with the fix unless the configured log exists."""
    from cdc.log.open import open_reader

    reader = open_reader(config, missing_ok=True)
    if reader is None:
        where = (config.log_path if config.log.backend == "local"
                 else config.log.bootstrap_servers)
        raise LogError(f"there is no change log at {where}",
                       "run `cdc bootstrap` (then `cdc capture`) first, or correct the log "
                       "settings")
    reader.close()


@dataclass
class _Follower:
    """The loop's view of one follower: its record, runner, thread and timing."""

    name: str
    member: Callable[[dict[str, Any]], Member]
    record: records.Progress
    runner: Runner | None = None
    #: its batch being written (None: ready for the next)
    running: Future[Any] | None = None
    #: the end of the batch being written
    running_end: dict[str, Any] | None = None
    #: the next batch, read while the running one is written (a backlog only: see
    #: :meth:`ApplyJob._cycle`); dropped if the running one fails
    ahead: Batch | None = None
    #: when its last batch started (monotonic)
    started: float = 0.0
    interval: float = 0.0
    #: records of its last batch (a quiet one does not make the next wait: :data:`QUIET_BATCH`)
    last_records: int = 0
    #: ``--once``: it reached the run's target
    done: bool = False
    #: batches run again after a transient failure of Spark's plumbing
    restarts: int = 0


@dataclass
class ApplyJob:
    """The followers ``names`` kept by one loop. Build with :meth:`prepare` (checks everything
    that can be checked before Spark or a runner starts), then :meth:`start` and :meth:`wait`."""

    config: Config
    names: list[str]
    sinks: dict[str, Sink]
    progress: dict[str, FollowerProgress]
    stop: threading.Event = field(default_factory=threading.Event)
    #: views that stopped on their own error while the others went on
    failed_views: dict[str, CdcError] = field(default_factory=dict)
    #: CPU seconds the loop's own thread spent planning, reading and decoding the log, and
    #: the records it read (``bench/apply_fanout.py``: they must not grow with the followers)
    read_cpu_seconds: float = 0.0
    read_records: int = 0
    #: per follower, its batches run again after Spark's plumbing failed them
    #: (:data:`spark_apply.errors.TRANSIENT_FAILURES`)
    restarts: dict[str, int] = field(default_factory=dict)
    #: followers waiting out an unreachable log or follower (spark_apply/outages.py)
    waiting: dict[str, Waiting] = field(default_factory=dict)
    #: per follower, its status file for ``cdc status`` (cdc/status.py)
    _status_files: dict[str, Any] = field(default_factory=dict)
    _followers: dict[str, _Follower] = field(default_factory=dict)
    _spark: Any = None
    _once: bool = False
    _target: dict[str, Any] | None = None
    _pool: ThreadPoolExecutor | None = None
    #: the cycle's read of the log (its own thread, see :meth:`_cycle`)
    _reader_pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="cdc-read"))
    _reading: Future[Any] | None = None
    #: the changes the reads decoded, kept for the next reads (``spark_apply/shared_read.py``)
    _decoded: Decoded = field(default_factory=Decoded)
    _reading_ready: list[str] = field(default_factory=list)
    _reading_since: float = 0.0
    _impatient: bool = False
    _failure: BaseException | None = None
    #: :meth:`stop_queries` waited once (a second call only counts what ended)
    _drained: bool = False
    #: the views' states held open by this process (local mode: views/host.py)
    view_host: Any = None
    #: unique to this run (processes and executors keep one sink per run and follower)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def prepare(cls, config: Config, names: Sequence[str], stop: threading.Event | None = None,
                observer: Any = None, wait_out: bool = False,
                master: str | None = None, once: bool = False) -> ApplyJob:
        """Validate the followers, the log and every sink's connection; no Spark yet. With
        ``wait_out`` (a continuous run), an unreachable log or follower is waited for
        (:mod:`spark_apply.outages`) until ``stop`` is set; otherwise it is the error. In
        local mode (``master``, else the config's) this process hosts the views' states
        (``views/host.py``); on a cluster their tasks reach the hosts they start, which a
        continuous run stops at its end and a ``once`` run leaves to the next (each stops when
        idle)."""
        stop = stop or threading.Event()

        def check(attempt: Callable[[], Any], followers: list[str]) -> None:
            if wait_out:
                wait_out_outages(attempt, stop, followers, observer)
            else:
                attempt()
        if not names:
            raise CdcError("no follower given",
                           "pass --follower NAME (one of the names under `followers:`)")
        chosen = list(dict.fromkeys(names))
        for name in chosen:
            config.follower(name)
            if not config.follower_sources(name):
                raise CdcError(f"follower {name} follows no source: the config has no "
                               "`sources:`", "add the databases to capture under `sources:`")
        check(lambda: check_log(config), chosen)
        for name in chosen:
            if name in config.views:
                _refuse_lost_view_state(config, name)
        sinks: dict[str, Sink] = {}
        host = None
        try:
            views = [name for name in chosen if name in config.views]
            if views and (master or config.spark.master).startswith("local"):
                from views.host import ViewHost

                host = ViewHost(config, views)
            for name in chosen:
                sinks[name] = open_target(config, name, host, stops_host=not once)
            # each sink's check connects, a view's opens its state: side by side
            with ThreadPoolExecutor(max_workers=min(4, len(chosen)),
                                    thread_name_prefix="cdc-check") as pool:
                for done in [pool.submit(check, sinks[name].check, [name]) for name in chosen]:
                    done.result()
        except BaseException:
            for sink in sinks.values():
                sink.close()
            if host is not None:
                host.close()
            raise
        return cls(config, chosen, sinks, {name: FollowerProgress(name) for name in chosen},
                   stop=stop, view_host=host)

    def checkpoint(self, name: str) -> Path:
        """Follower ``name``'s progress folder (``spark_apply/progress.py``)."""
        return self.config.follower_checkpoint(name)

    def handle(self, name: str) -> FollowerHandle:
        """What a process or executor needs to write follower ``name``: its own settings
        (:meth:`Config.trimmed`), the log's, its secrets."""
        follower = self.config.follower(name)
        secrets = tuple((variable, os.environ[variable])
                        for variable in (getattr(follower, "password_env", None),
                                         self.config.log.password_env)
                        if variable and variable in os.environ)
        return FollowerHandle(self.config.trimmed(name), name,
                              json.dumps(log_settings(self.config)), self.token, secrets)

    def runners(self, master: str) -> dict[str, Runner]:
        """Each follower's runner (``spark_apply/runners``), chosen once."""
        return {name: choose(self.config, name, self.sinks[name], self.handle(name), master)
                for name in self.names}

    def start(self, spark: Any, once: bool, master: str | None = None,
              runners: dict[str, Runner] | None = None) -> None:
        """Load every follower's progress record and give each its runner. ``spark``: the
        session for runners that run Spark jobs (None when none does)."""
        self._spark, self._once = spark, once
        chosen = master or (str(spark.sparkContext.master) if spark is not None
                            else self.config.spark.master)
        runners = runners or self.runners(chosen)
        for name in self.names:
            folder = self.checkpoint(name)
            refuse_if_stale(self.config, name, folder)
            _make_folder(name, folder)
            runner = runners[name]
            if runner.needs_spark:
                if spark is None:
                    raise ApplyError(f"follower {name} runs Spark jobs but no SparkSession was "
                                     "started", "report this: run_apply starts one")
                runner.attach(spark)  # type: ignore[attr-defined]
            self._followers[name] = _Follower(
                name, functools.partial(self._member, name), records.load(folder), runner,
                interval=float(self.config.follower(name).trigger_interval))
            warm = getattr(runner, "warm", None)
            if warm is not None:
                warm()  # a follower's process starts now, not at its first batch
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.names)),
                                        thread_name_prefix="cdc-apply")
        if once:
            reader = must_read(self.config)
            try:
                self._target = _target(reader.committed(), self._followers.values())
            finally:
                reader.close()
        for name in self.names:
            observer = self.progress[name].observer
            if observer is not None:
                observer.state(name, "applying")

    def _member(self, name: str, start: dict[str, Any]) -> Member:
        follower = self.config.follower(name)
        only: frozenset[str] | None = None
        read_topics = self.sinks[name].read_topics
        if read_topics is not None:
            only = frozenset(read_topics)
        elif getattr(follower, "tables", None):
            only = frozenset(self.config.follower_topics(name))
        return Member(name, start, frozenset(self.config.follower_sources(name)), only,
                      int(follower.max_records_per_batch))

    # ------------------------------------------------------------------------------ the loop
    def _eligible(self, f: _Follower, now: float) -> bool:
        interval = f.interval if f.last_records >= QUIET_BATCH else 0.0
        return (not f.done and f.name not in self.waiting and f.name not in self.failed_views
                and (self._once or now - f.started >= interval))

    def _behind(self, f: _Follower) -> bool:
        """Writing a batch that stopped short of the complete end (a backlog: its end has no
        watermarks), with no next batch read yet: worth reading the next one meanwhile."""
        return (f.running is not None and f.ahead is None and f.running_end is not None
                and "watermarks" not in f.running_end and f.name not in self.waiting
                and f.name not in self.failed_views)

    def _cycle(self) -> None:
        """Plan, read once and hand out one cycle's batches (the module docstring, 1-2). A
        follower draining a backlog gets its next batch read while it writes the current one
        (``ahead``), handed to it as soon as it is done; at the live end batches are read when
        the follower is ready, so a new change never waits behind a batch read too early.

        The read runs on a thread of its own: a log that stops answering (brokers gone: the
        Kafka reader retries for a minute and more before it gives up) never blocks the loop,
        and after :data:`LOG_PATIENCE_S` the followers it was for wait out the outage."""
        if self._reading is not None:
            if not self._reading.done():
                self._check_patience()
                return
            self._finish_read()
        now = time.monotonic()
        for f in self._followers.values():
            if f.running is None and f.ahead is not None and self._eligible(f, now):
                batch, f.ahead = f.ahead, None
                self._dispatch(f.name, batch)
        ready = [f for f in self._followers.values()
                 if f.running is None and self._eligible(f, now)]
        behind = [f for f in self._followers.values() if self._behind(f)]
        if not ready and not behind:
            return
        members = [f.member(f.record.offsets) for f in ready]
        members += [f.member(f.running_end or {}) for f in behind]
        self._reading_ready = [f.name for f in ready]
        self._reading_since, self._impatient = time.monotonic(), False
        self._reading = self._reader_pool.submit(self._read, members)
        with contextlib.suppress(FutureTimeout):  # usually milliseconds: hand it out now
            self._reading.result(timeout=POLL_S)
        if self._reading.done():
            self._finish_read()

    def _read(self, members: list[Member]) -> tuple[dict[str, Batch], BaseException | None]:
        """On the reader thread: the cycle's batches (none if the log failed: the error)."""
        from cdc.reading import open_log

        batches: dict[str, Batch] = {}
        cpu = time.thread_time()
        try:
            reader, decoder = open_log(json.dumps(log_settings(self.config)))
            state = reader.committed()
            for read in plan_cycle(reader, state, members, self._target):
                self.read_records += sum(item.end - item.start for item in read.ranges)
                with collector_paused():  # a read's short-lived records: cdc/heap.py
                    batches.update(self._cut(reader, decoder, state, read))
        except CdcError as exc:
            return {}, exc
        finally:
            self.read_cpu_seconds += time.thread_time() - cpu
        return batches, None

    def _finish_read(self) -> None:
        """Hand out the batches of the read that ended (a follower that went waiting meanwhile
        gets none: it is planned again from its record when it resumes)."""
        assert self._reading is not None
        batches, error = self._reading.result()
        self._reading = None
        ready = self._reading_ready
        if isinstance(error, OUTAGES):
            if self._once:
                self._failure = error
            for name in ready:
                if name not in self.waiting and not self._once:
                    self._wait(name, error)
            return
        if error is not None:
            self._failure = error
            return
        for name, batch in batches.items():
            follower = self._followers[name]
            if name in self.waiting or name in self.failed_views:
                continue
            if follower.running is None:
                self._dispatch(name, batch)
            else:
                follower.ahead = batch
        if self._once:
            for name in ready:
                self._followers[name].done = name not in batches

    def _check_patience(self) -> None:
        """A read that has not answered for :data:`LOG_PATIENCE_S`: its followers wait."""
        if (self._impatient or self._once
                or time.monotonic() - self._reading_since < LOG_PATIENCE_S):
            return
        self._impatient = True
        where = (f"Kafka log at {self.config.log.bootstrap_servers}"
                 if self.config.log.backend == "kafka" else f"the log at {self.config.log_path}")
        silent = LogUnavailable(f"{where} has not answered for {LOG_PATIENCE_S:.0f} s",
                                "check that the log's storage (the brokers) is up and "
                                "reachable; cdc apply resumes by itself")
        for name in self._reading_ready:
            if name not in self.waiting:
                self._wait(name, silent)

    def _cut(self, reader: Any, decoder: Any, state: Any, read: Read) -> dict[str, Batch]:
        followers = self._followers

        def takes(name: str) -> Takes:
            runner = followers[name].runner
            return Takes.RANGES if runner is None else runner.takes
        return cut(reader, decoder, state, read, takes, lambda name: not self.sinks[name].folds,
                   self._decoded)

    def _dispatch(self, name: str, batch: Batch) -> None:
        follower = self._followers[name]
        follower.started = time.monotonic()
        follower.running_end = batch.end
        assert self._pool is not None
        follower.running = self._pool.submit(self._apply, follower, batch)

    def _apply(self, follower: _Follower, batch: Batch) -> tuple[TaskReport, Batch, float]:
        """On the follower's thread: write the batch, then its watermarks, then its progress
        record (the module docstring, 3)."""
        started = time.monotonic()
        assert follower.runner is not None
        records.save_planned(self.checkpoint(follower.name), follower.record.batches + 1,
                             follower.record.offsets, batch.end)
        report = follower.runner.run(batch)
        sink = self.sinks[follower.name]
        for source, offset in sorted(batch.watermarks.items()):
            sink.set_watermark(source, offset)
        record = records.Progress(batch.end, follower.record.batches + 1)
        records.save(self.checkpoint(follower.name), record)
        follower.record = record
        return report, batch, time.monotonic() - started

    def _collect(self) -> None:
        """Count each batch that ended; sort out each that failed."""
        for follower in self._followers.values():
            running = follower.running
            if running is None or not running.done():
                continue
            follower.running = None
            try:
                report, batch, seconds = running.result()
            except BaseException as exc:  # noqa: BLE001 - sorted by _failed
                follower.ahead = None  # planned from an end the follower did not reach
                self._failed(follower, exc)
                continue
            follower.restarts = 0
            follower.last_records = report.records
            self.progress[follower.name].record(report, batch.watermarks, seconds)

    def _failed(self, follower: _Follower, exc: BaseException) -> None:
        """A batch of ``follower`` failed: wait out an outage, stop a view alone, run a batch
        that Spark's plumbing failed again, or stop the run with the error."""
        name = follower.name
        known = exc if isinstance(exc, CdcError) else task_error(exc)
        observer = self.progress[name].observer
        if observer is not None:
            observer.error(name, type(known or exc).__name__)
        outage = outage_of(known)
        if outage is not None and not self._once:
            self._wait(name, outage)
            return
        if known is not None and name in self.config.views and outage is None:
            self.progress[name].error = known
            self._stop_view(name, known)
            return
        if known is not None:
            self.progress[name].error = known
            self._failure = known
            return
        text = str(exc)
        if is_transient(text) and follower.restarts < TRANSIENT_RESTARTS:
            follower.restarts += 1
            self.restarts[name] = self.restarts.get(name, 0) + 1
            if observer is not None:
                observer.restarted(name)
            log.warning("follower %s: a batch failed in Spark's plumbing (%s); running it "
                        "again (%d of %d)", name, text.strip().splitlines()[0][:200],
                        follower.restarts, TRANSIENT_RESTARTS)
            return
        self._failure = ApplyError(
            f"follower {name}: a batch failed: {failure_summary(text)[:500]}",
            "fix the cause and run `cdc apply` again; it resumes from the progress record in "
            f"{self.checkpoint(name)}")

    def _wait(self, name: str, outage: CdcError) -> None:
        """Follower ``name`` waits out ``outage`` (a first one, or it failed again)."""
        known = self.waiting.get(name)
        if known is not None:
            known.failed_again(outage)
        else:
            self.waiting[name] = Waiting(name, outage, time.monotonic())
        self.progress[name].error = None  # not the follower's own failure: it resumes
        observer = self.progress[name].observer
        if observer is not None:
            observer.state(name, "waiting", outage.problem)

    def _retry_waiting(self) -> None:
        """Each waiting follower whose time has come: reach what was away; then it is planned
        again from its progress record."""
        for name, waiting in list(self.waiting.items()):
            if not waiting.due or self.stop.is_set():
                continue
            try:
                probe(self.config, self.sinks[name], waiting.problem)
            except OUTAGES as exc:
                waiting.failed_again(exc)
                continue
            try:  # away so long that the log may have compacted deletes it never saw
                refuse_if_stale(self.config, name, self.checkpoint(name))
            except CdcError as exc:
                self._failure = exc
                return
            self.waiting.pop(name).ended()
            if self.progress[name].observer is not None:
                self.progress[name].observer.state(name, "applying")

    def _stop_view(self, name: str, error: CdcError) -> None:
        """View ``name`` failed with ``error`` (e.g. its SQL broken by a schema change): it
        stops, said loudly; the other followers and views go on. ``cdc apply`` then exits
        with the error once the others are done."""
        self.failed_views[name] = error
        if self.progress[name].observer is not None:
            self.progress[name].observer.state(name, "failed", error.problem)
        log.error("view %s stopped: %s (fix: %s); the other followers and views go on",
                  name, error.problem, error.fix)

    def _finished(self) -> bool:
        """``--once``: every follower reached the target (or failed alone); no batch runs."""
        return self._once and self._reading is None and all(
            f.running is None and f.ahead is None and (f.done or f.name in self.failed_views)
            for f in self._followers.values())

    def _pause(self) -> None:
        """Until a batch ends, :data:`POLL_S` passed, or a stop is requested."""
        running = [f.running for f in self._followers.values() if f.running is not None]
        if self._reading is not None:
            running.append(self._reading)
        if running:
            wait_futures(running, timeout=POLL_S, return_when="FIRST_COMPLETED")
        else:
            self.stop.wait(POLL_S)

    def request_stop(self) -> None:
        """Ask :meth:`wait` to stop (safe from a signal handler)."""
        self.stop.set()

    def wait(self, screen: Callable[[ApplyJob], None] | None = None,
             refresh: float = 0.5) -> None:
        """Run the loop until every follower reached the target (``once``) or a stop was
        requested; ``screen`` (the app's live table) is called with the job every ``refresh``
        seconds and once at the end. Raises :class:`ApplyError` (or the sink's own CdcError)
        if a batch failed."""
        shown = 0.0
        try:
            while not self.stop.is_set() and self._failure is None:
                self._collect()
                self._retry_waiting()
                if self._failure is None:
                    self._cycle()
                if self._finished():
                    break
                self._pause()
                now = time.monotonic()
                if now - shown >= refresh:
                    shown = now
                    self.write_status()
                    if screen is not None:
                        screen(self)
            self.stop_queries()
            if self._failure is not None:
                raise self._failure
            for error in self.failed_views.values():
                raise error
        finally:
            if screen is not None:
                screen(self)

    def write_status(self, state: str = "running", force: bool = False) -> None:
        """Each follower's progress for ``cdc status`` (at most once a second each)."""
        from cdc.status import follower_status_file

        for name in self.names:
            p = self.progress[name]
            with contextlib.suppress(OSError):  # advisory: never stop apply for it
                if name not in self._status_files:
                    self._status_files[name] = follower_status_file(self.config.log_path, name)
                failed = self.failed_views.get(name) or p.error
                self._status_files[name].update(
                    state, p.changes, force=force, batches=p.batches, records=p.records,
                    written=p.written, deleted=p.deleted, skipped=p.skipped, lag_s=p.lag_s,
                    watermarks=dict(p.watermarks),
                    last_error=failed.problem if failed else None)

    def stop_queries(self, grace: float = 60.0) -> None:
        """Let the running batches finish (up to ``grace`` s) and count them. Spark jobs still
        running then are cancelled (their batches fail, and are planned again from the progress
        records next run), so a batch stuck in Spark cannot hold the process past its stop."""
        running = [f.running for f in self._followers.values() if f.running is not None]
        if running and not self._drained:
            self._drained = True
            _, late = wait_futures(running, timeout=grace)
            if late and self._spark is not None:
                log.warning("%d batch(es) still running %.0f s after the stop: cancelling their "
                            "Spark jobs", len(late), grace)
                self._spark.sparkContext.cancelAllJobs()
                wait_futures(late, timeout=CANCEL_WAIT_S)
                for follower in self._followers.values():
                    if follower.running in late:  # not a failure: replayed by the next run
                        follower.running = follower.ahead = None
        self._collect()

    def close(self) -> None:
        self._reader_pool.shutdown(wait=False, cancel_futures=True)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        for follower in self._followers.values():
            if follower.runner is not None:
                follower.runner.close()
        for sink in self.sinks.values():
            sink.close()
        if self.view_host is not None:
            self.view_host.close()


def _make_folder(name: str, folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CdcError(f"follower {name}: cannot create its progress folder {folder} "
                       f"({exc.strerror})",
                       f"make it writable, or set followers.{name}.checkpoint") from None


def _target(state: Any, followers: Any) -> dict[str, Any]:
    """``--once``: the complete end of every followed source when the run starts."""
    from spark_apply.source import SourceOptions, complete_end

    sources = sorted({source for f in followers for source in f.member({"topics": {}}).sources})
    return complete_end(state, SourceOptions(log="", sources=tuple(sources)))


def _refuse_lost_view_state(config: Config, name: str) -> None:
    """A view whose state file is gone while its progress record says batches were applied
    would resume mid-log with empty base tables: refused with the fix."""
    from views.state import ViewError

    folder = config.follower_checkpoint(name)
    path = config.view_state(name)
    if not path.exists() and records.applied_offsets(folder) is not None:
        raise ViewError(f"view {name}: its state {path} is gone but its progress record "
                        f"{records.path_of(folder)} says batches were applied: it would resume "
                        "mid-log with empty base tables",
                        f"delete the folder {folder} too (and empty the view's tables in its "
                        "followers) to rebuild the view from offset 0")


def run_apply(config: Config, names: Sequence[str], once: bool,
              screen: Callable[[ApplyJob], None] | None = None,
              stop: threading.Event | None = None, master: str | None = None,
              observer: Any = None) -> ApplyJob:
    """Prepare, start the runners (and a SparkSession if one of them runs Spark jobs), run the
    loop, stop. ``stop`` (set by a SIGTERM handler) ends a continuous run; a stop requested
    before the loop starts means no batch runs. ``master`` overrides the config's
    ``spark.master``. Returns the finished job (its ``progress``)."""
    job = ApplyJob.prepare(config, names, stop, observer, wait_out=not once, master=master,
                             once=once)
    for progress in job.progress.values():
        progress.observer = observer  # metrics: cdc_app.metrics.ApplyMetrics
    try:
        if job.stop.is_set():
            return job
        for name in job.names:  # a stale follower is refused before anything starts
            stale = functools.partial(refuse_if_stale, config, name, job.checkpoint(name))
            if once:
                stale()
            else:
                wait_out_outages(stale, job.stop, [name], observer)
        chosen = master or config.spark.master
        runners = job.runners(chosen)
        spark = None
        if any(runner.needs_spark for runner in runners.values()):
            from spark_apply.session import require_spark_jars

            if any(type(runner).__name__ == "KafkaRunner" for runner in runners.values()):
                require_spark_jars("kafka", "avro")
            jars = config.resolve(config.spark.jars_dir) if config.spark.jars_dir else None
            ship = config.spark.ship == "always" or (
                config.spark.ship == "auto" and not chosen.startswith("local"))
            spark = start_spark(chosen, config.spark.conf, jars, ship,
                                scratch=config.log_path.parent / "state" / "spark")
        if job.stop.is_set():
            for runner in runners.values():
                runner.close()
            return job
        job.start(spark, once, chosen, runners)
        long_lived_heap()  # start-up's heap out of collections: cdc/heap.py
        job.wait(screen)
        return job
    finally:
        job.stop_queries()
        job.write_status("stopped", force=True)
        job.close()
