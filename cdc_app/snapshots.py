"""``cdc snapshot``: hand a request for an incremental snapshot to the capture daemon and,
with ``--wait``, show its progress (the algorithm: :mod:`cdc.incremental`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from cdc.config import Config, SourceConfig
from cdc.errors import CdcError
from cdc.events import TableId
from cdc.incremental import SnapshotQueue, SnapshotRequestError, TableProgress, progress_of
from cdc.source import IncrementalSnapshotSource, connector_class
from cdc.status import read_status


def _source(config: Config, name: str | None) -> SourceConfig:
    if name is not None:
        return config.source(name)
    if len(config.sources) != 1:
        raise SnapshotRequestError(
            "the config has several sources", "name one with --source: "
            + ", ".join(s.name for s in config.sources))
    return config.sources[0]


def stored_progress(config: Config, source: str) -> dict[str, TableProgress]:
    """The incremental snapshots the log's stored offset of ``source`` records."""
    from cdc.log.open import open_reader

    reader = open_reader(config, missing_ok=True)
    if reader is None:
        return {}
    try:
        return progress_of(reader.source_offsets().get(source))
    finally:
        reader.close()


@dataclass(frozen=True)
class Request:
    source: str
    id: str
    tables: list[str]


def request_snapshot(config: Config, source_name: str | None, tables: Sequence[str],
                     console: Console) -> Request:
    """Validate and queue a request. Refused with the fix: a connector without
    incremental snapshots, a table the source does not capture, one already running or
    queued."""
    source = _source(config, source_name)
    if not issubclass(connector_class(source.kind).stream_type(), IncrementalSnapshotSource):
        raise SnapshotRequestError(
            f"source {source.name!r} (kind {source.kind}): its connector has no incremental "
            "snapshots yet", f"snapshot it again with `cdc bootstrap --source {source.name}`")
    captured = {TableId.parse(t): t for t in source.tables}
    wanted: list[str] = []
    for text in tables:
        table = TableId.parse(text)
        if table not in captured:
            raise SnapshotRequestError(
                f"source {source.name!r} does not capture {table}",
                f"add it to the source's tables (capture snapshots a table new to the log by "
                f"itself when it starts), or choose one of: {', '.join(map(str, captured))}")
        wanted.append(str(table))
    running = stored_progress(config, source.name)
    busy = [f"{t} ({running[t].rows:,} rows done, request {running[t].request})"
            for t in wanted if t in running and running[t].active]
    queue = SnapshotQueue(config.log_path, source.name)
    queued = [f"{t} (request {r['id']}, queued)" for r in queue.pending()
              for t in r.get("tables", []) if t in wanted]
    if busy or queued:
        raise SnapshotRequestError(
            f"a snapshot of {', '.join(busy + queued)} is already under way",
            "wait for it to finish (`cdc status`, or `cdc snapshot ... --wait`)")
    request = queue.submit(wanted)
    daemon = read_status(config.log_path, source.name)
    if daemon is not None and daemon.get("running"):
        console.print(f"queued snapshot request [bold]{request}[/] of {', '.join(wanted)}: "
                      f"`cdc capture` (pid {daemon.get('pid')}) takes it within a second",
                      highlight=False)
    else:
        console.print(f"queued snapshot request [bold]{request}[/] of {', '.join(wanted)}: "
                      f"[yellow]no `cdc capture` is running for source {source.name}[/]; the "
                      "snapshot starts when it starts", highlight=False)
    return Request(source.name, request, wanted)


def wait_for_snapshots(config: Config, queued: Request, console: Console,
                       poll: float = 0.5) -> dict[str, TableProgress]:
    """Show the request's progress per table until every table is done."""
    source, request, tables = queued.source, queued.id, queued.tables
    if not (read_status(config.log_path, source) or {}).get("running"):
        raise CdcError(f"no `cdc capture` is running for source {source}: the request waits "
                       "for it", f"start `cdc capture --source {source}`")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("rows"), TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        tasks = {t: bar.add_task(t, total=None) for t in tables}
        while True:
            progress = stored_progress(config, source)
            mine = {t: progress[t] for t in tables
                    if t in progress and progress[t].request == request}
            for table, p in mine.items():
                bar.update(tasks[table], completed=p.rows,
                           total=max(p.estimated or 0, p.rows) or None)
            if len(mine) == len(tables) and not any(p.active for p in mine.values()):
                break
            if not (read_status(config.log_path, source) or {}).get("running"):
                raise CdcError(f"`cdc capture` of source {source} stopped before the snapshot "
                               "ended (it resumes when capture starts again)",
                               f"start `cdc capture --source {source}`")
            time.sleep(poll)
    for table, p in mine.items():
        console.print(f"{table}: {p.rows:,} rows in {p.chunks} chunks, {p.tombstones:,} keys "
                      "tombstoned" + (f"; [red]failed[/]: {p.error}" if p.error else ""),
                      highlight=False)
    failed = [t for t, p in mine.items() if p.phase == "failed"]
    if failed:
        raise CdcError(f"the snapshot of {', '.join(failed)} failed", "see above")
    return mine
