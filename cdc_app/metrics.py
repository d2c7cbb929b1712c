"""Prometheus metrics of ``cdc capture`` and ``cdc apply`` (``--metrics-port``; docs/metrics.md).

Each daemon serves its own registry on ``http://ADDRESS:PORT/metrics``. Updates are cheap: the
capture hooks (:class:`cdc.observe.CaptureObserver`) run once per log commit, flush or idle
wait, and the apply hooks once per micro-batch — never once per event. What costs a query (the
source server's lag, the log's sizes, the followers' lag in records) is measured by one
background thread every ``metrics.poll_interval`` seconds.

The core never imports this module: the command line builds the observers and hands them in.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.exposition import choose_encoder

from cdc.config import Config, SourceConfig
from cdc.errors import CdcError
from cdc.observe import CaptureObserver
from cdc.offsets import SourceOffset, offset_order
from cdc.status import records_behind
from cdc.transactions import is_transaction_topic, transaction_topic

if TYPE_CHECKING:
    from cdc.log.base import ChangeLogReader, Record

log = logging.getLogger("cdc_app.metrics")

#: seconds: a log commit (fsyncs, or a Kafka transaction's round trips)
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                  10.0, 30.0)
#: records per log commit
COMMIT_SIZE_BUCKETS = (1, 10, 100, 500, 1_000, 5_000, 10_000, 20_000, 50_000, 100_000)
#: seconds: a ``cdc apply`` micro-batch
BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class MetricsError(CdcError):
    """The metrics endpoint cannot be served."""


def position_number(data: Mapping[str, Any] | SourceOffset | None) -> float | None:
    """A source offset as one number that orders like it: PostgreSQL's LSN; MySQL/MariaDB's
    binlog file sequence x 2^32 + position (a float: exact up to 2^53)."""
    if data is None:
        return None
    order = data.order() if isinstance(data, SourceOffset) else offset_order(data)
    if not order:
        return None
    if len(order) == 1:
        return float(order[0])
    return float(order[0] * 2**32 + order[1])


class Health:
    """What ``/healthz`` and ``/readyz`` say. ``/healthz``: the daemon is alive (it answers).
    ``/readyz``: every part (a source of capture, a follower of apply) is in a state of
    :data:`READY` — streaming, applying — and not starting, snapshotting, reconnecting, waiting
    for an unreachable log or follower, or failed. Parts report their states from any thread."""

    #: the states in which a part is ready
    READY = frozenset({"streaming", "applying"})

    def __init__(self, parts: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, tuple[str, str]] = dict.fromkeys(parts, ("starting", ""))

    def set(self, part: str, state: str, detail: str = "") -> None:
        with self._lock:
            self._states[part] = (state, detail)

    def report(self) -> tuple[bool, str]:
        """(ready, one line per part: ``<part>: <state>[ (<detail>)]``)."""
        with self._lock:
            states = dict(self._states)
        lines = [f"{part}: {state}" + (f" ({detail})" if detail else "")
                 for part, (state, detail) in states.items()]
        return bool(states) and all(s in self.READY for s, _ in states.values()), \
            "\n".join(lines)


def _handler(registry: CollectorRegistry, health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._answer(200, encoder(registry), content_type)
            elif path == "/healthz":
                self._answer(200, b"alive\n")
            elif path == "/readyz":
                ready, text = health.report()
                heading = "ready" if ready else "not ready"
                self._answer(200 if ready else 503, f"{heading}\n{text}\n".encode())
            else:
                self._answer(404, b"not found: /metrics, /healthz and /readyz are served\n")

        def _answer(self, code: int, body: bytes,
                    content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - its signature
            return None  # a scrape is not news
    return Handler


def serve(port: int, address: str, registry: CollectorRegistry, option: str,
          health: Health | None = None) -> Any:
    """Serve ``registry`` (``/metrics``) and ``health`` (``/healthz``, ``/readyz``) on
    ``address:port`` in a daemon thread; the server (``shutdown()`` stops it). A port that
    cannot be had is a :class:`MetricsError` naming it and the fix (``option``: how the user
    chose the port)."""
    disable_created_metrics()  # type: ignore[no-untyped-call]  # no ``_created`` series
    try:
        server = ThreadingHTTPServer((address, port), _handler(registry, health or Health([])))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="cdc-metrics-http",
                         daemon=True).start()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise MetricsError(
                f"cannot serve metrics on port {port}: another process listens there",
                f"choose a free port ({option}), or stop that process (`ss -ltnp "
                f"'sport = :{port}'` names it)") from None
        if exc.errno == errno.EACCES:
            raise MetricsError(f"cannot serve metrics on port {port}: ports below 1024 need "
                               "root", f"choose a port above 1023 ({option})") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise MetricsError(f"cannot serve metrics on {address}: not an address of this "
                               "machine", "set metrics.address to 0.0.0.0 or one of this "
                               "machine's addresses") from None
        raise MetricsError(f"cannot serve metrics on {address}:{port}: "
                           f"{exc.strerror or exc}", f"choose another port ({option})") from None
    return server


class Poller:
    """Runs ``tasks`` every ``interval`` seconds in a daemon thread until :meth:`stop`; a task
    that fails is counted in ``errors`` (by kind) and tried again next time."""

    def __init__(self, interval: float, tasks: Sequence[Callable[[], None]],
                 errors: Callable[[str], None]) -> None:
        self.interval = interval
        self.tasks = list(tasks)
        self.errors = errors
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cdc-metrics", daemon=True)

    def start(self) -> Poller:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            for task in self.tasks:
                try:
                    task()
                except Exception as exc:  # noqa: BLE001 - metrics never stop the daemon
                    log.debug("metrics: %s failed: %s", getattr(task, "__name__", task), exc)
                    self.errors(exc.__class__.__name__)
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        self._stop.set()


class LogMetrics:
    """``cdc_log_*``: per topic, bytes on storage (local log) and end offsets."""

    def __init__(self, config: Config, registry: CollectorRegistry) -> None:
        self.config = config
        self.size = Gauge("cdc_log_size_bytes", "Bytes a topic takes in the change log's "
                          "storage (local log only)", ["topic"], registry=registry)
        self.ends = Gauge("cdc_log_end_offsets", "Sum over a topic's partitions of the end "
                          "offset: records ever appended to it", ["topic"], registry=registry)
        self._reader: ChangeLogReader | None = None
        #: per topic, the sum of its partitions' end offsets at the last poll
        self.end_offsets: dict[str, dict[int, int]] = {}

    def reader(self) -> ChangeLogReader | None:
        if self._reader is None:
            from cdc.log.open import open_reader

            self._reader = open_reader(self.config, missing_ok=True)
        return self._reader

    def poll(self) -> None:
        reader = self.reader()
        if reader is None:
            return
        ends: dict[str, dict[int, int]] = {}
        for info in reader.topics():
            if is_transaction_topic(info.meta):
                continue
            ends[info.name] = parts = reader.end_offsets(info.name)
            self.ends.labels(info.name).set(sum(parts.values()))
            size = reader.topic_bytes(info.name)
            if size is not None:
                self.size.labels(info.name).set(size)
        self.end_offsets = ends

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


# ------------------------------------------------------------------------------------ capture

class CaptureMetrics(CaptureObserver):
    """``cdc_capture_*`` and ``cdc_snapshot_*``: the observer of capture and bootstrap."""

    def __init__(self, config: Config, sources: Sequence[SourceConfig],
                 registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.sources = list(sources)
        self.registry = registry = registry or CollectorRegistry()
        labels = ["source"]
        self.events = Counter("cdc_capture_events", "Change events written to the log (a "
                              "delete's tombstone not counted)", ["source", "table"],
                              registry=registry)
        self.records = Counter("cdc_capture_records", "Records written to the log (events "
                               "and tombstones)", labels, registry=registry)
        self.commits = Histogram("cdc_capture_commit_duration_seconds", "Time of one commit "
                                 "to the log (its fsyncs or Kafka transaction)", labels,
                                 buckets=COMMIT_BUCKETS, registry=registry)
        self.commit_size = Histogram("cdc_capture_commit_records", "Records per commit to the "
                                     "log", labels, buckets=COMMIT_SIZE_BUCKETS,
                                     registry=registry)
        self.lag_seconds = Gauge("cdc_capture_source_lag_seconds", "At the last commit, its "
                                 "newest transaction's age (source commit -> durable in the "
                                 "log); 0 once the source has nothing more to send", labels,
                                 registry=registry)
        self.lag_bytes = Gauge("cdc_capture_source_lag_bytes", "Bytes of the source's log "
                               "(WAL, binlog) past the durable position, as the server says",
                               labels, registry=registry)
        self.retained = Gauge("cdc_capture_source_retained_bytes", "Bytes of log the source "
                              "server keeps for capture (slot's restart LSN; binlog files)",
                              labels, registry=registry)
        self.position = Gauge("cdc_capture_durable_position", "The last durable source "
                              "position as a number (PostgreSQL: LSN; MySQL: file sequence "
                              "x 2^32 + position)", labels, registry=registry)
        self.durable_at = Gauge("cdc_capture_durable_position_timestamp_seconds", "When the "
                                "last durable position was committed (Unix time)", labels,
                                registry=registry)
        self.durable_age = Gauge("cdc_capture_durable_position_age_seconds", "Seconds since "
                                 "a source position was last made durable (and confirmed to "
                                 "the server)", labels, registry=registry)
        self.errors = Counter("cdc_capture_errors", "Failures by kind (exception class); "
                              "capture reconnects after most", ["source", "kind"],
                              registry=registry)
        self.snapshot_rows = Gauge("cdc_snapshot_rows", "Rows a snapshot copied so far",
                                   ["source", "table"], registry=registry)
        self.snapshot_estimated = Gauge("cdc_snapshot_rows_estimated", "Rows the snapshot "
                                        "of a table is expected to copy (the exact count "
                                        "once done)", ["source", "table"], registry=registry)
        self.snapshot_events = Counter("cdc_snapshot_events", "Incremental snapshot "
                                       "notifications: started, table_done, failed, completed",
                                       ["source", "event"], registry=registry)
        self.snapshot_failed = Gauge("cdc_snapshot_failed", "1 while a table's last "
                                     "incremental snapshot failed (cdc snapshot --table again)",
                                     ["source", "table"], registry=registry)
        self.retained_limit = Gauge("cdc_capture_source_retained_limit_bytes", "How much log "
                                    "the server may keep for capture before it is at risk: "
                                    "PostgreSQL's max_slot_wal_keep_size (as retained + "
                                    "safe_wal_size), else the source's warn_retained_wal",
                                    labels, registry=registry)
        self.log = LogMetrics(config, registry)
        self.health = Health(f"source {source.name}" for source in self.sources)
        self._durable: dict[str, SourceOffset] = {}
        self._durable_mono: dict[str, float] = {}
        started = time.monotonic()
        for source in self.sources:
            name = source.name
            self._durable_mono[name] = started
            self.durable_age.labels(name).set_function(self._age_of(name))
            self.records.labels(name)  # the series exist from the start, at 0
            self.commits.labels(name)
            self.commit_size.labels(name)
        self._poller: Poller | None = None

    def _age_of(self, source: str) -> Callable[[], float]:
        """Read at each scrape: seconds since ``source``'s last durable position (since start
        while there was none)."""
        return lambda: time.monotonic() - self._durable_mono[source]

    # -- the hooks (cdc.observe) -----------------------------------------------------------
    def committed(self, source: str, records: Sequence[Record], seconds: float,
                  newest_commit_ms: int | None) -> None:
        skip = transaction_topic(source)
        prefix = len(source) + 1
        counts = Tally(r.topic for r in records if r.value is not None and r.topic != skip)
        for topic, count in counts.items():
            self.events.labels(source, topic[prefix:]).inc(count)
        self.records.labels(source).inc(len(records))
        self.commits.labels(source).observe(seconds)
        self.commit_size.labels(source).observe(len(records))
        if newest_commit_ms is not None:
            self.lag_seconds.labels(source).set(max(0.0, time.time() - newest_commit_ms / 1000))

    def durable(self, source: str, offset: SourceOffset) -> None:
        self._durable[source] = offset
        self._durable_mono[source] = time.monotonic()
        self.durable_at.labels(source).set(time.time())
        number = position_number(offset)
        if number is not None:
            self.position.labels(source).set(number)

    def idle(self, source: str) -> None:
        self.lag_seconds.labels(source).set(0.0)

    def error(self, source: str, kind: str) -> None:
        self.errors.labels(source, kind).inc()

    def snapshot_event(self, source: str, event: str, table: str) -> None:
        self.snapshot_events.labels(source, event).inc()
        if event in ("started", "failed"):
            self.snapshot_failed.labels(source, table).set(1 if event == "failed" else 0)

    def snapshot_progress(self, source: str, table: str, rows: int,
                          estimated: int | None) -> None:
        self.snapshot_rows.labels(source, table).set(rows)
        if estimated is not None:
            self.snapshot_estimated.labels(source, table).set(estimated)

    # -- what is polled --------------------------------------------------------------------
    def poll_sources(self) -> None:
        from cdc.source import connector_for

        for source in self.sources:
            try:
                connector = connector_for(source)
                status = connector.status(self._durable.get(source.name))
            except Exception as exc:  # noqa: BLE001 - the server is away: counted, retried
                self.error(source.name, f"status:{exc.__class__.__name__}")
                continue
            for gauge, key in ((self.lag_bytes, "lag_bytes"), (self.retained, "retained_bytes"),
                               (self.retained_limit, "retained_limit_bytes")):
                value = status.fields.get(key)
                if value is not None:
                    gauge.labels(source.name).set(float(value))

    def state(self, source: str, state: str, detail: str = "") -> None:
        self.health.set(f"source {source}", state, detail)

    def start(self, port: int, option: str) -> Any:
        """Serve on ``port`` and start polling; the server."""
        server = serve(port, self.config.metrics.address, self.registry, option, self.health)
        self._poller = Poller(self.config.metrics.poll_interval,
                              [self.poll_sources, self.log.poll],
                              lambda kind: self.error("", f"poll:{kind}")).start()
        return server

    def stop(self) -> None:
        if self._poller is not None:
            self._poller.stop()


# -------------------------------------------------------------------------------------- apply

class ApplyMetrics:
    """``cdc_apply_*``: the observer of each follower's batches (``FollowerProgress.observer``
    in ``spark_apply/jobs.py``), and the followers' lag in records, polled."""

    def __init__(self, config: Config, names: Iterable[str],
                 checkpoint_offsets: Callable[[Path], Mapping[str, Any] | None],
                 registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.names = list(names)
        self.checkpoint_offsets = checkpoint_offsets
        self.registry = registry = registry or CollectorRegistry()
        labels = ["follower"]
        self.batches = Counter("cdc_apply_batches", "Micro-batches applied", labels,
                               registry=registry)
        self.records = Counter("cdc_apply_records", "Log records read and folded",
                               ["follower", "topic"], registry=registry)
        self.rows = Counter("cdc_apply_rows", "Follower rows by outcome: written, deleted, or "
                            "skipped by the version gate (already newer)",
                            ["follower", "outcome"], registry=registry)
        self.duration = Histogram("cdc_apply_batch_duration_seconds", "Time of one "
                                  "micro-batch (read, fold, write, watermark)", labels,
                                  buckets=BATCH_BUCKETS, registry=registry)
        self.lag_seconds = Gauge("cdc_apply_lag_seconds", "Source commit -> applied, of the "
                                 "newest change of the last batch (0 when it had none)",
                                 labels, registry=registry)
        self.lag_records = Gauge("cdc_apply_lag_records", "Records in the follower's topics "
                                 "past its checkpoint (what it has still to read)", labels,
                                 registry=registry)
        self.watermark = Gauge("cdc_apply_watermark_position", "The follower's watermark "
                               "per source as a number (as cdc_capture_durable_position)",
                               ["follower", "source"], registry=registry)
        self.watermark_at = Gauge("cdc_apply_watermark_timestamp_seconds", "When the "
                                  "follower's watermark for a source last moved (Unix time)",
                                  ["follower", "source"], registry=registry)
        self.errors = Counter("cdc_apply_errors", "Failures of a follower's batches by kind "
                              "(exception class)", ["follower", "kind"], registry=registry)
        self.restarts = Counter("cdc_apply_restarts", "Queries restarted after a transient "
                                "failure of Spark's plumbing", labels, registry=registry)
        self.waiting = Gauge("cdc_apply_waiting_seconds", "Seconds the follower has been "
                             "waiting for an unreachable log or follower server (0: not "
                             "waiting)", labels, registry=registry)
        self._waiting_since: dict[str, float] = {}
        self.log = LogMetrics(config, registry)
        self.health = Health(f"follower {name}" for name in self.names)
        self._marks: dict[tuple[str, str], float] = {}
        for name in self.names:
            self.batches.labels(name)
            self.duration.labels(name)
            for outcome in ("written", "deleted", "skipped"):
                self.rows.labels(name, outcome)
            self.waiting.labels(name).set_function(self._waited(name))
        self._poller: Poller | None = None

    def _waited(self, follower: str) -> Callable[[], float]:
        """Read at each scrape: seconds since ``follower`` began waiting (0 when it is not)."""
        def seconds() -> float:
            since = self._waiting_since.get(follower)
            return 0.0 if since is None else time.monotonic() - since
        return seconds

    # -- the hooks (spark_apply/jobs.py) ---------------------------------------------------
    def batch(self, progress: Any, total: Any, seconds: float) -> None:
        """Follower ``progress.name`` applied a batch (``total``: its TaskReport)."""
        name = progress.name
        self.batches.labels(name).inc()
        self.duration.labels(name).observe(seconds)
        for topic, count in total.records_by_topic.items():
            self.records.labels(name, topic).inc(count)
        for outcome in ("written", "deleted", "skipped"):
            count = getattr(total, outcome)
            if count:
                self.rows.labels(name, outcome).inc(count)
        if progress.lag_s is not None:
            self.lag_seconds.labels(name).set(progress.lag_s)
        now = time.time()
        for source, offset in list(progress.watermarks.items()):
            number = position_number(offset)
            if number is None:
                continue
            if self._marks.get((name, source)) != number:
                self._marks[(name, source)] = number
                self.watermark.labels(name, source).set(number)
                self.watermark_at.labels(name, source).set(now)

    def error(self, follower: str, kind: str) -> None:
        self.errors.labels(follower, kind).inc()

    def restarted(self, follower: str) -> None:
        self.restarts.labels(follower).inc()
        self.state(follower, "restarting")

    def state(self, follower: str, state: str, detail: str = "") -> None:
        """Follower ``follower`` is now ``state`` (``starting``, ``applying``, ``restarting``,
        ``waiting`` for an unreachable log or follower, ``failed``)."""
        self.health.set(f"follower {follower}", state, detail)
        if state == "waiting":
            self._waiting_since.setdefault(follower, time.monotonic())
        else:
            self._waiting_since.pop(follower, None)

    # -- what is polled --------------------------------------------------------------------
    def poll_lag(self) -> None:
        self.log.poll()
        ends = self.log.end_offsets
        for name in self.names:
            done = self.checkpoint_offsets(self.config.follower_checkpoint(name))
            self.lag_records.labels(name).set(records_behind(self.config, name, ends, done)[1])

    def start(self, port: int, option: str) -> Any:
        server = serve(port, self.config.metrics.address, self.registry, option, self.health)
        self._poller = Poller(self.config.metrics.poll_interval, [self.poll_lag],
                              lambda kind: self.error("", f"poll:{kind}")).start()
        return server

    def stop(self) -> None:
        if self._poller is not None:
            self._poller.stop()
        self.log.close()
