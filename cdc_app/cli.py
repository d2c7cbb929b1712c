"""The ``cdc`` command line.

Every predictable failure is a :class:`~cdc.errors.CdcError`: it is printed as a short message with
its fix and the command exits non-zero — never with a traceback.
"""

from __future__ import annotations

# first, before the slow imports below: importing it makes a SIGTERM recorded, not fatal
# (see cdc_app/shutdown.py; capture then stops cleanly, other commands die as by default)
from cdc_app import shutdown  # isort: split

import functools
import json
import os
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.markup import escape
from rich.table import Table

from cdc import __version__
from cdc.config import Config, load_config
from cdc.errors import CdcError
from cdc_app import logs
from cdc_app.console import make_console
from cdc_app.logs import FORMATS, LEVELS

F = TypeVar("F", bound=Callable[..., Any])
#: where ``cdc --config F <command>`` keeps F (``ctx.meta`` is shared by the whole invocation)
_GLOBAL_CONFIG = "cdc.config_path"
err_console = make_console(stderr=True)


def friendly_errors(func: F) -> F:
    """Turn a :class:`CdcError` into a message and an exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except CdcError as exc:
            if os.environ.get("CDC_TRACEBACK"):  # for bug reports: where the error came from
                traceback.print_exc()
            err_console.print(f"[bold red]error:[/] {escape(exc.problem)}", highlight=False,
                              markup=True)
            if exc.fix:
                err_console.print(f"  [bold]fix:[/] {escape(exc.fix)}", highlight=False)
                given = kwargs.get("config_path") or _given_config()
                if given and "`cdc " in exc.fix and "--config" not in exc.fix:
                    err_console.print(f"  (give that command --config {escape(given)}, as "
                                      "this one was given)", highlight=False)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            err_console.print("interrupted")
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


config_option = click.option(
    "--config", "-c", "config_path", type=click.Path(dir_okay=False), default=None,
    help="YAML config file (default: $CDC_CONFIG or ./cdc.yaml).",
)


def _remember_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta[_GLOBAL_CONFIG] = value


def _given_config() -> str | None:
    """The config path given before the command (``cdc --config F <command>``), if any."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(_GLOBAL_CONFIG) if ctx is not None else None


def _load(config_path: str | None) -> Config:
    """The config the command was given (``--config`` after the command, else before it)."""
    return load_config(config_path or _given_config())


#: commands that handle SIGTERM themselves (drain and exit 0)
DAEMONS = frozenset({"capture", "apply"})


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from cdc_app.fastpaths import version_text

        click.echo(version_text(__version__))
        ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None,
              expose_value=False, callback=_remember_config,
              help="YAML config file for the command (it may also follow the command).")
@click.option("--log-level", type=click.Choice(LEVELS), envvar="CDC_LOG_LEVEL", default=None,
              help="Log records at this level and above (default: info for capture and "
                   "apply, warning otherwise; $CDC_LOG_LEVEL).")
@click.option("--log-format", type=click.Choice(FORMATS), envvar="CDC_LOG_FORMAT",
              default="text", show_default=True,
              help="text, or json: one object per line (time, level, logger, message); "
                   "$CDC_LOG_FORMAT.")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version,
              help="Show the version and which compiled fast paths are in use, and exit.")
@click.pass_context
def main(ctx: click.Context, log_level: str | None, log_format: str) -> None:
    """Change data capture: database logs into a compacted change log, folded into followers."""
    from cdc_app.fastpaths import missing_warning

    logs.setup(log_level, log_format, daemon=ctx.invoked_subcommand in DAEMONS)
    if ctx.invoked_subcommand not in DAEMONS:
        shutdown.release()
    else:  # `kill -QUIT PID` prints every thread's stack to stderr, as a JVM does
        import faulthandler
        import signal

        faulthandler.register(signal.SIGQUIT, all_threads=True)
    warning = missing_warning()
    if warning is not None:
        click.echo(warning, err=True)


@main.command("check-config")
@config_option
@click.option("--connect", is_flag=True,
              help="Also reach every part the config names and check it, creating nothing: "
                   "each source (version, settings, privileges, slot or server_id, tables and "
                   "keys), the log, each follower, the Spark master; and run each view's SQL "
                   "where it must run (EXPLAIN on the leader, DuckDB). Exits 1 on any ✗.")
@friendly_errors
def check_config(config_path: str | None, connect: bool) -> None:
    """Validate the config file and print what it means (secrets redacted)."""
    config = _load(config_path)
    console = make_console()
    where = (f"Kafka at {config.log.bootstrap_servers}" if config.log.backend == "kafka"
             else str(config.log_path))
    console.print(f"[green]ok[/]: log at {where} ({config.log.partitions} partitions)",
                  highlight=False)
    for source in config.sources:
        console.print(f"  source {source.name} ({source.kind}) {source.dsn}: "
                      f"{', '.join(source.tables)}", highlight=False)
    for setting, variable in _named_variables(config):
        if variable not in os.environ:
            console.print(f"[yellow]warning:[/] {setting} names {variable}, which is not set "
                          "here: the commands that use it need it in their environment",
                          highlight=False)
    failed = 0
    if connect:
        from cdc_app.preflight import preflight

        failed = preflight(config, console)
    if config.views:
        _check_views(config, connect, console)
    if failed:
        raise CdcError(f"preflight: {failed} check(s) failed",
                       "fix each ✗ above as its row says, then run `cdc check-config --connect` "
                       "again")


def _named_variables(config: Config) -> list[tuple[str, str]]:
    """(setting, environment variable) of every ``*_env`` setting the config names."""
    named = [("log.password_env", config.log.password_env)]
    for index, source in enumerate(config.sources):
        named += [(f"sources.{index}.password_env", source.password_env),
                  (f"sources.{index}.hash_key_env", source.hash_key_env)]
    for name, follower in config.followers.items():
        named.append((f"followers.{name}.password_env", getattr(follower, "password_env", None)))
    return [(setting, variable) for setting, variable in named if variable]


def _check_views(config: Config, connect: bool, console: Any) -> None:
    """Each view: incremental or recomputed, and why; with ``connect``, where its SQL ran."""
    from cdc.source import connector_for
    from views.check import check_view

    leaders: dict[str, Any] = {}
    spark: Any = None
    try:
        for name, view in config.views.items():
            leader = None
            if connect:
                if view.source not in leaders:
                    leaders[view.source] = connector_for(config.source(view.source)).leader()
                leader = leaders[view.source]
            checked = check_view(config, name, leader)
            how = "[green]incremental[/]" if checked.plan.mode == "incremental" else \
                f"[yellow]recomputed whole after each batch[/] ({checked.plan.reason})"
            console.print(f"  view {name} on {view.source} -> {', '.join(view.followers)}: {how}; "
                          f"key {', '.join(view.key)}", highlight=False)
            for operator in checked.plan.operators:
                console.print(f"    {escape(operator.describe())}", highlight=False)
            if checked.tables:
                spark = spark or _check_spark()
                from spark_apply.views_check import check_in_spark

                check_in_spark(spark, name, view.sql, str(config.source(view.source).kind),
                               checked.tables)
                checked.checked.append("Spark SQL")
            if checked.checked:
                console.print(f"    runs: {', '.join(checked.checked)}", highlight=False)
            for note in checked.skipped:
                console.print(f"    not checked: {note}", highlight=False)
    finally:
        for leader in leaders.values():
            leader.close()
        if spark is not None:
            spark.stop()


def _check_spark() -> Any:
    """A small local SparkSession for analysing views' SQL (no job runs)."""
    from spark_apply.session import spark_session

    return spark_session(master="local[1]", app_name="cdc check-config")


@main.command("setup")
@click.option("--only", "only", multiple=True,
              type=click.Choice(["spark", "kafka", "connect", "apicurio"]),
              help="Only this jar set (repeatable; default: spark and kafka; connect is Kafka "
                   "Connect with Debezium's JDBC sink and apicurio a Schema Registry, for the "
                   "interoperability tests).")
@friendly_errors
def setup_cmd(only: tuple[str, ...]) -> None:
    """Fetch the JVM jars once, with Maven, into the jar cache ($CDC_JARS_DIR, else
    ~/.cache/cdc/jars): Spark's connectors for `cdc apply`, the Kafka broker for the demo; and
    make the Spark driver's class archive there (it starts faster with it)."""
    from cdc.jvm import DEFAULT_SETS
    from cdc_app.jars import fetch_jars

    console = make_console()
    names = list(only) or list(DEFAULT_SETS)
    fetch_jars(names, lambda line: console.print(line, highlight=False))
    if "spark" in names:
        try:
            from spark_apply.session import make_class_archive
        except ImportError:  # installed without the spark extra: nothing to speed up
            return
        make_class_archive(lambda line: console.print(line, highlight=False))


@main.command("pack")
@click.option("--dir", "directory", default=None, type=click.Path(file_okay=False),
              help="Where to write it (default: ~/.cache/cdc/packs, or $CDC_PACK_DIR).")
@friendly_errors
def pack_cmd(directory: str | None) -> None:
    """Pack this installation's code and Python dependencies (without pyspark) into the archive
    `cdc apply` ships to a cluster's executors; print its path and a spark-submit line."""
    from spark_apply.ship import UNPACKED, pack

    archive = pack(Path(directory) if directory else None)
    console = make_console()
    console.print(str(archive), highlight=False, soft_wrap=True)
    console.print(
        f"spark-submit --archives {archive}#{UNPACKED} --conf spark.executorEnv.PYTHONPATH="
        f"{UNPACKED} --conf spark.pyspark.python=python3 --conf spark.pyspark.driver.python="
        f"{sys.executable} {Path(__file__).resolve()} apply --config cdc.yaml --follower NAME",
        highlight=False, soft_wrap=True, style="dim")


@main.group("log")
def log_group() -> None:
    """Inspect and maintain the change log."""


@log_group.command("stats")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@friendly_errors
def log_stats(config_path: str | None, as_json: bool) -> None:
    """Topics, partitions, records, tombstones, bytes and source offsets of the log."""
    from cdc.log.open import must_read
    from cdc_app.logview import log_stats as collect
    from cdc_app.logview import print_stats

    config = _load(config_path)
    stats = collect(must_read(config))
    if as_json:
        click.echo(json.dumps(stats, indent=2))
    else:
        print_stats(stats, make_console())


@log_group.command("compact")
@config_option
@click.option("--retention", default=None,
              help="Tombstone retention, e.g. 24h (default: log.tombstone_retention).")
@click.option("--wait", "wait_for", is_flag=True,
              help="Kafka: wait until the brokers dropped every row record superseded now.")
@click.option("--timeout", default="10m", show_default=True, help="How long --wait waits.")
@friendly_errors
def log_compact(config_path: str | None, retention: str | None, wait_for: bool,
                timeout: str) -> None:
    """Keep the latest record per key; drop tombstones older than the retention."""
    from cdc.log.compaction import compact

    config = _load(config_path)
    if config.log.backend == "kafka":
        make_console().print(
            "the Kafka log is compacted by the brokers themselves: every topic cdc creates has "
            "cleanup.policy=compact and delete.retention.ms = log.tombstone_retention "
            f"({config.log.tombstone_retention:g} s). The broker's log cleaner rewrites closed "
            "segments (segment.ms / segment.bytes) once their dirty ratio passes "
            "min.cleanable.dirty.ratio (log.topic_config sets both); `cdc log stats` shows how "
            "many records remain.", highlight=False)
        if wait_for:
            _wait_for_broker_compaction(config, _duration("--timeout", timeout))
        return
    seconds = _duration("--retention", retention) if retention else \
        config.log.tombstone_retention
    report = compact(config.log_path, seconds)
    table = Table(title="compaction", show_header=False)
    table.add_row("mode", "offline (active segments rolled)" if report.offline
                  else "online (a writer is running: closed segments only)")
    table.add_row("segments rewritten", str(report.segments_rewritten))
    table.add_row("records", f"{report.records_before:,} -> {report.records_after:,}")
    table.add_row("tombstones dropped", f"{report.tombstones_dropped:,}")
    table.add_row("bytes", f"{report.bytes_before:,} -> {report.bytes_after:,}")
    table.add_row("seconds", f"{report.seconds:.3f}")
    make_console().print(table)


def _duration(option: str, text: str) -> float:
    from cdc.config import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise CdcError(f"{option}: {exc}", f"e.g. {option} 10m") from None


def _wait_for_broker_compaction(config: Config, timeout: float) -> None:
    """Until every record superseded when called is gone from the Kafka topics."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from cdc.errors import LogError
    from cdc.log.open import must_read
    from cdc.transactions import is_transaction_topic
    from cdc_app.logview import still_present, superseded

    reader = must_read(config)
    try:
        # transaction topics left out: an END replaces its BEGIN (one key), and the newest
        # END sits in the active segment until the next transaction rolls it
        pending = {t.name: superseded(reader, t.name) for t in reader.topics()
                   if not is_transaction_topic(t.meta)}
        pending = {name: parts for name, parts in pending.items() if parts}
        total = sum(len(o) for parts in pending.values() for o in parts.values())
        deadline = time.monotonic() + timeout
        with Progress(TextColumn("compaction"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("superseded records dropped"), console=err_console) as bar:
            task = bar.add_task("compaction", total=total)
            while pending:
                pending = {name: left for name, parts in pending.items()
                           if (left := still_present(reader, name, parts))}
                left_now = sum(len(o) for parts in pending.values() for o in parts.values())
                bar.update(task, completed=total - left_now)
                if not pending:
                    break
                if time.monotonic() > deadline:
                    raise LogError(
                        f"after {timeout:g} s the brokers still hold {left_now:,} superseded "
                        f"records in {', '.join(sorted(pending))}",
                        "the cleaner leaves a partition's active segment alone until "
                        "segment.ms / segment.bytes roll it, and starts only past "
                        "min.cleanable.dirty.ratio: lower them in log.topic_config, or wait "
                        "longer (--timeout)")
                time.sleep(1.0)
    finally:
        reader.close()
    make_console().print(f"the brokers dropped all {total:,} records superseded at the start",
                         highlight=False)


@log_group.command("dump")
@config_option
@click.option("--topic", "topics", multiple=True, help="Only these topics (repeatable).")
@click.option("--partition", type=int, default=None, help="Only this partition.")
@click.option("--from-offset", type=int, default=0, show_default=True)
@friendly_errors
def log_dump(config_path: str | None, topics: tuple[str, ...], partition: int | None,
             from_offset: int) -> None:
    """One JSON object per record, in offset order within each partition."""
    from cdc.log.open import must_read
    from cdc_app.logview import dump_lines

    config = _load(config_path)
    out = sys.stdout
    try:
        for line in dump_lines(must_read(config), topics, partition, from_offset):
            out.write(line)
            out.write("\n")
    except BrokenPipeError:  # `cdc log dump | head` is fine
        sys.stderr.close()


@main.group("registry")
def registry_group() -> None:
    """The log's schemas through Confluent's Schema Registry API."""


@registry_group.command("serve")
@config_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8081, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: a free one).")
@friendly_errors
def registry_serve(config_path: str | None, host: str, port: int) -> None:
    """Serve the log's schemas, read-only, through the subset of Confluent's Schema Registry
    REST API that consumers decode with (`/schemas/ids/{id}`, `/subjects/{s}/versions[/{v}]`),
    until interrupted: point `schema.registry.url` (or AvroDeserializer) here."""
    from cdc.log.open import must_read
    from cdc_app.registry import serve

    config = _load(config_path)
    reader = must_read(config)
    try:
        serve(reader.schemas(), host, port,
              lambda url: click.echo(f"serving the schemas of the log on {url}", err=True))
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()


source_option = click.option("--source", "sources", multiple=True,
                             help="Only this source (repeatable; default: every source).")


def _setup_logging() -> None:
    logs.daemon_level()


def _capture_metrics(config: Config, sources: list[Any], port: int | None) -> Any:
    """The capture's metrics, served on ``port`` (else ``metrics.capture_port``); None when
    neither is set. A port that is taken is refused here, before the log is opened."""
    port = port if port is not None else config.metrics.capture_port
    if port is None:
        return None
    import logging

    from cdc_app.metrics import CaptureMetrics

    metrics = CaptureMetrics(config, sources)
    metrics.start(port, "--metrics-port PORT, or metrics.capture_port in the config")
    logging.getLogger("cdc_app.metrics").info("metrics at http://%s:%d/metrics",
                                          config.metrics.address, port)
    return metrics


def _apply_metrics(config: Config, names: list[str], port: int | None) -> Any:
    """``cdc apply``'s metrics, served on ``port`` (else ``metrics.apply_port``), or None."""
    port = port if port is not None else config.metrics.apply_port
    if port is None:
        return None
    from cdc_app.metrics import ApplyMetrics
    from spark_apply.progress import applied_offsets

    metrics = ApplyMetrics(config, names, applied_offsets)
    metrics.start(port, "--metrics-port PORT, or metrics.apply_port in the config")
    err_console.print(f"metrics at http://{config.metrics.address}:{port}/metrics",
                      highlight=False)
    return metrics


def metrics_option(key: str) -> Callable[[F], F]:
    return click.option(
        "--metrics-port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
        help=f"Serve Prometheus metrics on PORT (/metrics; default: metrics.{key} in the "
             "config; see docs/metrics.md).")


def _capture_stop() -> threading.Event:
    """The event SIGTERM and SIGINT set: capture drains what is buffered and exits 0 (also
    while it still waits for the log at start)."""
    import signal

    stop = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        err_console.print(f"{signal.Signals(signum).name}: draining and stopping")
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    if shutdown.requested():  # a SIGTERM came while we were still starting up
        request_stop(signal.SIGTERM, None)
    return stop


def _stream_until_signalled(config: Config, sources: list[Any], writer: Any, codec: Any,
                            metrics: Any = None, stop: threading.Event | None = None) -> None:
    """Run capture until SIGTERM or SIGINT; both drain what is buffered and exit 0."""
    from cdc.coordinator import run_capture

    stop = stop or _capture_stop()
    if metrics is None:
        run_capture(config, sources, writer, codec, stop)
    else:
        run_capture(config, sources, writer, codec, stop, observer=metrics)


@main.command("bootstrap")
@config_option
@source_option
@click.option("--follow", is_flag=True, help="Carry on as the capture daemon afterwards.")
@metrics_option("capture_port")
@friendly_errors
def bootstrap_cmd(config_path: str | None, sources: tuple[str, ...], follow: bool,
                  metrics_port: int | None) -> None:
    """Snapshot the sources' tables into the log with a new replication slot."""
    from cdc.coordinator import bootstrap, capture_sources, open_log
    from cdc.observe import NO_OBSERVER

    _setup_logging()
    config = _load(config_path)
    chosen = capture_sources(config, sources)
    metrics = _capture_metrics(config, chosen, metrics_port)
    writer, codec = open_log(config)
    console = make_console()
    try:
        for source in chosen:
            report = bootstrap(config, source, writer, codec, console,
                               observer=metrics or NO_OBSERVER)
            rows = sum(report.rows.values())
            vanished = sum(report.vanished.values())
            console.print(f"source [bold]{source.name}[/]: {rows:,} rows from "
                          f"{len(report.rows)} table(s) in {report.seconds:.1f} s"
                          + (f", {vanished:,} vanished keys tombstoned" if vanished else "")
                          + "; ready to stream", highlight=False)
        if follow:
            _stream_until_signalled(config, chosen, writer, codec, metrics)
    finally:
        writer.close()
        if metrics is not None:
            metrics.stop()


@main.command("capture")
@config_option
@source_option
@metrics_option("capture_port")
@friendly_errors
def capture_cmd(config_path: str | None, sources: tuple[str, ...],
                metrics_port: int | None) -> None:
    """Stream changes into the log until stopped (SIGTERM drains and exits 0)."""
    from cdc.coordinator import (
        capture_sources,
        open_log,
        stopped_before_streaming,
        when_log_answers,
    )

    _setup_logging()
    config = _load(config_path)
    chosen = capture_sources(config, sources)
    metrics = _capture_metrics(config, chosen, metrics_port)
    stop = _capture_stop()
    try:
        # a daemon waits out brokers that are down or restarting when it starts, as it does
        # while it runs (a service manager starts it beside them)
        opened = when_log_answers("capture", lambda: open_log(config), stop)
        if opened is None:
            stopped_before_streaming()
            return
        writer, codec = opened
        try:
            _stream_until_signalled(config, chosen, writer, codec, metrics, stop)
        finally:
            writer.close()
    finally:
        if metrics is not None:
            metrics.stop()


@main.command("snapshot")
@config_option
@click.option("--source", "source_name", default=None,
              help="The source (default: the only one).")
@click.option("--table", "tables", multiple=True, required=True,
              help="A captured table (schema.table) to snapshot again while capture streams "
                   "(repeatable).")
@click.option("--wait/--no-wait", default=False,
              help="Show the snapshot's progress until it is done (capture must be running).")
@friendly_errors
def snapshot_cmd(config_path: str | None, source_name: str | None, tables: tuple[str, ...],
                 wait: bool) -> None:
    """Snapshot tables while `cdc capture` keeps streaming: chunks by primary key between
    watermarks in the source's own log, no lock, no new slot (docs/capture.md)."""
    from cdc_app.snapshots import request_snapshot, wait_for_snapshots

    config = _load(config_path)
    console = make_console()
    request = request_snapshot(config, source_name, tables, console)
    if wait:
        wait_for_snapshots(config, request, console)


@main.command("apply")
@config_option
@click.option("--follower", "followers", multiple=True,
              help="A follower under `followers:` (repeatable: one Spark application runs them "
                   "all).")
@click.option("--view", "views", multiple=True,
              help="A view under `views:` (repeatable), kept current in its followers.")
@click.option("--once", is_flag=True,
              help="Apply everything committed to the log now, then exit 0 (availableNow).")
@click.option("--master", default=None, metavar="URL",
              help="Spark master: local[N] or spark://host:port (default: spark.master in the "
                   "config, else local[2,3]).")
@click.option("--conf", "spark_conf", multiple=True, metavar="KEY=VALUE",
              help="A Spark setting (repeatable), over the config's spark.conf, e.g. --conf "
                   "spark.executor.memory=2g.")
@metrics_option("apply_port")
@friendly_errors
def apply_cmd(config_path: str | None, followers: tuple[str, ...], views: tuple[str, ...],
              once: bool, master: str | None, spark_conf: tuple[str, ...],
              metrics_port: int | None) -> None:
    """Fold the change log into followers and views with Spark (continuous until SIGTERM, or
    --once)."""
    import signal
    import threading

    config = _with_spark_conf(_load(config_path), spark_conf)
    unknown = [name for name in views if name not in config.views]
    if unknown:
        raise CdcError(f"no view named {unknown[0]!r} in the config (known: "
                       f"{', '.join(config.views) or 'none'})", "pass a name under `views:`")
    if not followers and not views:
        raise CdcError("no follower or view given",
                       "pass --follower NAME or --view NAME (names under `followers:`/`views:`)")
    stop = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        err_console.print(f"{signal.Signals(signum).name}: finishing the running batch and "
                          "stopping")
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    if shutdown.requested():  # a SIGTERM came while we were still starting up
        stop.set()
    from spark_apply.jobs import run_apply
    from spark_apply.latency import format_seconds

    console = make_console()
    if master is not None:
        from pydantic import ValidationError

        from cdc.config import SparkConfig

        try:
            master = SparkConfig(master=master).master
        except ValidationError as exc:
            message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            raise click.BadParameter(message, param_hint="--master") from None
    metrics = _apply_metrics(config, [*followers, *views], metrics_port)
    from cdc_app.screens import ApplyScreen

    screen = ApplyScreen(console)
    try:
        job = run_apply(config, [*followers, *views], once, screen, stop, master=master,
                        observer=metrics)
    finally:
        screen.stop()
        if metrics is not None:
            metrics.stop()
    for name in job.names:
        p = job.progress[name]
        what = "view" if name in config.views else "follower"
        console.print(f"{what} [bold]{name}[/]: {p.batches:,} batches, {p.records:,} records, "
                      f"{p.written:,} written, {p.deleted:,} deleted, {p.skipped:,} skipped by "
                      "the version gate; commit -> applied latency p50 "
                      f"{format_seconds(p.latency.quantile(0.5))}, p99 "
                      f"{format_seconds(p.latency.quantile(0.99))}", highlight=False)


def _with_spark_conf(config: Config, pairs: tuple[str, ...]) -> Config:
    """``config`` with ``--conf KEY=VALUE`` settings over its ``spark.conf``."""
    if not pairs:
        return config
    from pydantic import ValidationError

    from cdc.config import SparkConfig

    extra: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--conf")
        extra[key.strip()] = value
    try:
        SparkConfig(conf=extra)
    except ValidationError as exc:
        message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        raise click.BadParameter(message, param_hint="--conf") from None
    spark = config.spark.model_copy(update={"conf": {**config.spark.conf, **extra}})
    return config.model_copy(update={"spark": spark})


@main.command("status")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@friendly_errors
def status_cmd(config_path: str | None, as_json: bool) -> None:
    """Sources (slot, confirmed position, lag, retained log, events/s), the log (size,
    records) and every follower (checkpoint, records behind, watermark, apply running)."""
    from cdc.status import collect
    from cdc_app.screens import print_status
    from spark_apply.progress import applied_offsets

    config = _load(config_path)
    status = collect(config, applied_offsets)
    if as_json:
        click.echo(json.dumps(status, indent=2))
    else:
        print_status(status, make_console())


@main.command("demo")
@click.option("--dir", "directory", default="./cdc-data/demo", show_default=True,
              help="Where the demo writes (wiped first).")
@click.option("--seconds", default=15.0, show_default=True,
              help="How long the workload writes once the follower has caught up (the "
                   "latency window).")
@click.option("--source", "source", type=click.Choice(["postgres", "mysql"]),
              default="postgres", show_default=True,
              help="The leader: a throwaway PostgreSQL, or MariaDB (kind: mysql).")
@click.option("--log-only", is_flag=True,
              help="Only the change log (append, read, compact, stats), no database.")
@click.option("--rows", default=20_000, show_default=True,
              help="With --log-only: changes the synthetic workload appends.")
@friendly_errors
def demo(directory: str, seconds: float, source: str, log_only: bool, rows: int) -> None:
    """A throwaway PostgreSQL (or MariaDB) and Redis, a shop workload, bootstrap + capture +
    apply, verify."""
    if log_only:
        from cdc_app.demo import run_demo

        run_demo(directory, rows)
        return
    from cdc_app.demo_pg import run_db_demo

    _setup_logging()
    run_db_demo(directory, seconds, source)


@main.group("source")
def source_group() -> None:
    """A source's state outside the config: its slot, publication, position and topics."""


@source_group.command("drop")
@config_option
@click.argument("name")
@click.option("--topics", "with_topics", is_flag=True,
              help="Also delete the source's topics from the log (its tables' records and "
                   "its transaction topic): followers that read them must be rebuilt or "
                   "dropped.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@friendly_errors
def source_drop_cmd(config_path: str | None, name: str, with_topics: bool, yes: bool) -> None:
    """Remove source NAME's replication slot and publication (PostgreSQL) and forget its
    position in the log, so nothing of it holds WAL or binlogs any more; with --topics, its
    topics too. Refused while its capture runs, and for a slot this log did not create."""
    from cdc.coordinator import open_log
    from cdc.log.open import open_reader
    from cdc.source import connector_for
    from cdc.status import read_status

    config = _load(config_path)
    source = config.source(name)
    live = read_status(config.log_path, name)
    if live and live["running"]:
        raise CdcError(f"source {name}: its capture is running (pid {live['pid']})",
                       f"stop `cdc capture` of {name} first (SIGTERM drains it)")
    probe = open_reader(config, missing_ok=True)
    if probe is not None:
        probe.close()
    else:
        raise CdcError(f"source {name}: the log at {config.log_path} holds nothing, so "
                       "nothing of the source is this log's to drop",
                       "check log.* in the config; a slot another log made is dropped by hand "
                       "(SELECT pg_drop_replication_slot('<slot>'))")
    root, _ = open_log(config)  # a local log refuses a second writer: capture holds it
    try:
        data = root.source_offsets().get(name)
        connector = connector_for(source)
        stored = connector.load_offset(data) if data else None
        topics = [t.name for t in root.topics() if t.name.startswith(f"{name}.")]
        doing = ["its slot and publication" if source.kind == "postgres" else None,
                 "its position in the log" if data else None,
                 f"{len(topics)} topic(s)" if with_topics and topics else None]
        what = ", ".join(d for d in doing if d) or "nothing of it is kept"
        if not yes and (not sys.stdin.isatty()
                        or not click.confirm(f"drop source {name}: {what}?", err=True)):
            raise CdcError(f"not confirmed: nothing was dropped (it would drop {what})",
                           "answer y, or pass --yes (needed when stdin is not a terminal)")
        console = make_console()
        for dropped in connector.drop(stored):
            console.print(f"dropped {dropped}", highlight=False)
        writer = root.for_source(name)  # fences a capture of it elsewhere (Kafka)
        if data:
            writer.append([], source_offsets={name: None})
            console.print(f"forgot its position ({stored.describe() if stored else '?'}): "
                          f"`cdc bootstrap --source {name}` starts it over", highlight=False)
        for topic in topics if with_topics else []:
            writer.drop_topic(topic)
            console.print(f"deleted topic {topic}", highlight=False)
    finally:
        root.close()


@main.group("warehouse")
def warehouse_group() -> None:
    """Maintain a Delta warehouse follower's tables (kind: delta)."""


retain_option = click.option(
    "--retain", default="1h", show_default=True,
    help="Delete files the tables stopped using longer ago than this (whole hours, rounded "
         "up; 0: all of them — then no reader or `cdc apply` should be running).")


def _warehouse(config_path: str | None, follower: str, retain: str, optimize: bool) -> None:
    from cdc.config import parse_duration
    from cdc.sink import open_sink
    from sinks.delta import DeltaSink, maintenance_table
    from sinks.delta_settings import DeltaFollowerConfig

    config = _load(config_path)
    kind = config.follower(follower)
    if not isinstance(kind, DeltaFollowerConfig):
        raise CdcError(f"follower {follower} is a {kind.kind} follower; `cdc warehouse` "
                       "maintains Delta tables", "pass a follower with kind: delta")
    try:
        seconds = parse_duration(retain)
    except ValueError as exc:
        raise CdcError(f"--retain: {exc}", "e.g. --retain 1h (or 0)") from None
    sink = open_sink(config, follower)
    assert isinstance(sink, DeltaSink)
    try:
        results = sink.vacuum(seconds, optimize=optimize)
    finally:
        sink.close()
    title = f"{'optimize' if optimize else 'vacuum'}: follower {follower}"
    make_console().print(maintenance_table(results, title))


@warehouse_group.command("vacuum")
@config_option
@click.option("--follower", required=True, help="A follower under `followers:` (kind: delta).")
@retain_option
@friendly_errors
def warehouse_vacuum(config_path: str | None, follower: str, retain: str) -> None:
    """Drop delete markers older than the follower's tombstone_retention, then delete files
    the tables no longer use (older than --retain)."""
    _warehouse(config_path, follower, retain, optimize=False)


@warehouse_group.command("optimize")
@config_option
@click.option("--follower", required=True, help="A follower under `followers:` (kind: delta).")
@retain_option
@friendly_errors
def warehouse_optimize(config_path: str | None, follower: str, retain: str) -> None:
    """Compact each table's small files (one file per bucket, up to deltalake's target
    size), write a checkpoint, then vacuum as `cdc warehouse vacuum` does."""
    _warehouse(config_path, follower, retain, optimize=True)


@main.command("verify")
@config_option
@click.option("--follower", default=None,
              help="A follower under `followers:` (with --view: one of the view's followers; "
                   "default: each of them).")
@click.option("--view", "views", multiple=True,
              help="Verify this view (under `views:`): its SQL run on the leader against the "
                   "follower's rows. Repeat it to verify several views in one run.")
@click.option("--timeout", default="120s", show_default=True,
              help="How long to wait for the follower to reach the leader's position.")
@click.option("--chunk-size", default=1000, show_default=True,
              help="Rows per checksummed chunk (primary-key order).")
@click.option("--show", "limit", default=20, show_default=True,
              help="Differing keys listed per table at most.")
@friendly_errors
def verify_cmd(config_path: str | None, follower: str | None, views: tuple[str, ...],
               timeout: str, chunk_size: int, limit: int) -> None:
    """Compare a follower (or a view in its followers) with the leader: exit 0 when equal, 1
    listing differing keys, 3 when the follower did not catch up in time."""
    from cdc.config import parse_duration
    from cdc.sink import open_sink
    from cdc.verify import verify
    from cdc_app.screens import print_report

    config = _load(config_path)
    try:
        seconds = parse_duration(timeout)
    except ValueError as exc:
        raise CdcError(f"--timeout: {exc}", "e.g. --timeout 2m") from None
    if views:
        codes = [_verify_view(config, view, follower, seconds, chunk_size, max(limit, 0))
                 for view in dict.fromkeys(views)]
        sys.exit(max(codes))
    if follower is None:
        raise CdcError("no follower given", "pass --follower NAME (or --view NAME)")
    from spark_apply.progress import applied_offsets

    sink = open_sink(config, follower)
    console = make_console()
    try:
        report = verify(config, follower, sink, console, timeout=seconds,
                        chunk_size=chunk_size, limit=max(limit, 0), applied=applied_offsets)
    finally:
        sink.close()
    print_report(report, console, max(limit, 0))
    sys.exit(0 if report.equal else 1)


def _verify_view(config: Config, view: str, follower: str | None, timeout: float,
                 chunk_size: int, limit: int) -> int:
    """``cdc verify --view``: each chosen follower of the view; the exit code."""
    from cdc.sink import open_sink
    from views.sink import view_holds
    from views.verify import print_view_report, verify_view

    if view not in config.views:
        raise CdcError(f"no view named {view!r} in the config (known: "
                       f"{', '.join(config.views) or 'none'})", "pass a name under `views:`")
    chosen = config.views[view].followers
    if follower is not None:
        if follower not in chosen:
            raise CdcError(f"view {view} is not held by follower {follower} (it is by "
                           f"{', '.join(chosen)})", "pass one of those with --follower")
        chosen = [follower]
    console = make_console()
    equal = True
    holds = view_holds(config.views[view].source, view)
    for name in chosen:
        sink = open_sink(config, name, holds)
        try:
            result = verify_view(config, view, name, sink, console, timeout=timeout,
                                 chunk_size=chunk_size)
        finally:
            sink.close()
        print_view_report(result, console, limit)
        equal = equal and result.equal
    return 0 if equal else 1


@main.command("search")
@config_option
@click.option("--follower", required=True, help="A follower of kind search.")
@click.option("--table", default=None, help="Only rows of this table (schema.table).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=1),
              help="Rows shown at most (best first).")
@click.argument("query")
@friendly_errors
def search_cmd(config_path: str | None, follower: str, table: str | None, limit: int,
               query: str) -> None:
    """Search a search follower's index. QUERY: words (any text column), column:word,
    "a phrase", prefix*, AND / OR / NOT, (grouping) — see docs/followers.md."""
    from sinks.search import print_search, search_follower

    config = _load(config_path)
    result = search_follower(config, follower, query, table=table, limit=limit)
    print_search(result, make_console())


if __name__ == "__main__":
    main()
