"""The app's screens of what the core measured: ``cdc status`` (what :func:`cdc.status.collect`
gathered: one table of the sources, the log and every follower, the warnings under it) and
``cdc verify`` (a :class:`cdc.verify.VerifyReport`: one row per table, the differing keys)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from cdc.verify import VerifyReport


def _bytes(value: Any) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(size) < 1024 or unit == "TB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return str(value)


def print_status(status: dict[str, Any], console: Console) -> None:
    """Sources, the log and every follower in one table; warnings under it."""
    log = status["log"]
    table = Table(title="cdc status", title_justify="left")
    for column in ("", "name", "kind", "state", "position", "lag", "size", "rate", "total"):
        table.add_column(column, justify="right" if column in ("lag", "size", "rate", "total")
                         else "left")
    warnings = []
    for row in status["sources"]:
        state = row["capture"] if row["offset_state"] == "streaming" else row["offset_state"]
        position = row.get("stored_position") or "-"
        if row.get("position") and row.get("position") != position:
            position += f" (server confirmed {row['position']})"
        table.add_row("source", row["source"], row["kind"], state, position,
                      _bytes(row.get("lag_bytes")),
                      _bytes(row.get("retained_bytes")) + " retained"
                      if row.get("retained_bytes") is not None else "-",
                      f"{row['events_per_s'] or 0:,.0f} ev/s",
                      f"{row['events']:,} ev" if row.get("events") is not None else "-")
        if row.get("server"):
            warnings.append(f"{row['source']}: {row['server']}")
        warnings.extend(f"{row['source']}: {warning}" for warning in row.get("warnings", []))
        if row.get("unavailable_images"):
            warnings.append(
                f"{row['source']}: {row['unavailable_images']:,} change(s) lack values the "
                "source did not send (PostgreSQL's unchanged TOAST) and no earlier image of the "
                "row had; their records name them in unavailable_columns. Set REPLICA IDENTITY "
                "FULL on the table, or re-bootstrap, to have whole rows again")
        if row.get("last_error") and row["capture"] == "running":
            warnings.append(f"{row['source']}: {row['last_error']}")
    table.add_section()
    table.add_row("log", str(log["path"]), log["backend"], f"{log.get('topics', 0)} topics",
                  "-", "-", _bytes(log["bytes"]), "-",
                  f"{log.get('records_appended', 0):,} rec")
    if status.get("followers"):
        table.add_section()
    for row in status.get("followers", []):
        marks = ", ".join(f"{source}@{mark['position']}"
                          for source, mark in row["watermarks"].items()) or "-"
        lag = [] if row.get("lag_records") is None else [f"{row['lag_records']:,} rec"]
        if row.get("lag_s") is not None:
            lag.append(f"{row['lag_s']:.1f} s")
        table.add_row("view" if row["view"] else "follower", row["follower"], row["kind"],
                      row["apply"], marks, ", ".join(lag) or "-", "-",
                      f"{row['changes_per_s'] or 0:,.0f} ch/s",
                      f"{row['records_read']:,} rec read"
                      if row.get("records_read") is not None else "-")
        if row.get("last_error"):
            warnings.append(f"{row['follower']}: {row['last_error']}")
    console.print(table)
    for row in status["sources"]:
        for name, snap in (row.get("snapshots") or {}).items():
            eta = f", about {snap['eta_s']:.0f} s left" if snap.get("eta_s") is not None else ""
            of = f" of ~{snap['estimated']:,}" if snap.get("estimated") else ""
            console.print(f"snapshot {row['source']} {name}: {snap['phase']}, "
                          f"{snap['rows']:,}{of} rows, {snap['rows_per_s']:,.0f} rows/s{eta}, "
                          f"{snap['tombstones']:,} tombstoned"
                          + (f" — {snap['error']}" if snap.get("error") else ""),
                          highlight=False)
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)


def print_report(report: VerifyReport, console: Console, limit: int) -> None:
    """One row per table, then the differing keys (at most ``limit`` per table)."""
    for source, (target, reached) in sorted(report.targets.items()):
        console.print(f"source [bold]{source}[/]: follower {report.follower} at "
                      f"{reached} >= target {target.text} (waited "
                      f"{report.waited_seconds:.1f} s)", highlight=False)
    table = Table(title=f"verify: follower {report.follower}")
    for column in ("table", "rows", "chunks", "rechecked by rows", "follower keys", "missing",
                   "extra", "different", "result"):
        table.add_column(column, justify="left" if column in ("table", "result") else "right")
    for result in report.tables:
        verdict = "[green]equal[/]" if result.differing == 0 else "[red]differs[/]"
        table.add_row(str(result.table), f"{result.rows:,}", f"{result.chunks:,}",
                      f"{result.rechecked:,}", f"{result.follower_keys:,}",
                      f"{result.missing:,}", f"{result.extra:,}", f"{result.different:,}",
                      verdict)
    console.print(table)
    for result in report.tables:
        if result.inexact:
            console.print(f"{result.table}: column(s) {', '.join(result.inexact)} have no exact "
                          "SQL form; their chunks were compared by rows", highlight=False)
        if not result.differing:
            continue
        console.print(f"[red]{result.table}[/]: {result.differing:,} differing key(s)"
                      + (f", the first {limit}:" if result.differing > limit else ":"),
                      highlight=False)
        for difference in result.differences:
            console.print(f"  {difference.key}  {difference.describe()}", highlight=False,
                          markup=False)
    rows, seconds = report.rows, report.leader_seconds
    rate = f", {seconds / rows * 100_000:.2f} s per 100k rows" if rows else ""
    console.print(f"leader checksums: {rows:,} rows in {seconds:.2f} s{rate}", highlight=False)
    console.print("[green]follower equals the leader[/]" if report.equal
                  else "[red]follower differs from the leader[/]")


def apply_table(job: Any, since: dict[str, Any] | None = None, latency: bool = True) -> Table:
    """``cdc apply``'s live table of ``job`` (a :class:`spark_apply.jobs.ApplyJob`): per
    follower, batches, records read, changes, written/deleted/skipped, lag, and the per-change
    latency p50/p99 (commit at the source -> applied) — of the changes applied after ``since``
    (per follower, a copy of its histogram then), or none shown (``latency`` False: while a
    backlog drains it measures the wait, not the pipeline)."""
    from cdc.offsets import offset_text
    from spark_apply.latency import format_seconds

    table = Table(title="cdc apply", title_justify="left")
    for column in ("follower", "batches", "records", "changes", "written", "deleted",
                   "skipped (gate)", "lag", "latency p50", "p99", "watermark"):
        table.add_column(column, justify="left" if column in ("follower", "watermark")
                         else "right")
    for name in job.names:
        p = job.progress[name]
        marks = ", ".join(f"{s}@{offset_text(o)}" for s, o in sorted(p.watermarks.items())) or "-"
        hist = p.latency.since(since[name]) if since and name in since else p.latency
        table.add_row(name, f"{p.batches:,}", f"{p.records:,}", f"{p.changes:,}",
                      f"{p.written:,}", f"{p.deleted:,}", f"{p.skipped:,}",
                      "-" if p.lag_s is None else f"{p.lag_s:.2f} s",
                      format_seconds(hist.quantile(0.5)) if latency else "…",
                      format_seconds(hist.quantile(0.99)) if latency else "…", marks)
    return table


class ApplyScreen:
    """The live table while ``cdc apply`` runs (``ApplyJob.wait``'s ``screen``): started on
    the first call, updated on each, stopped by :meth:`stop`."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._live: Any = None

    def __call__(self, job: Any) -> None:
        from rich.live import Live

        if self._live is None:
            self._live = Live(apply_table(job), console=self.console, refresh_per_second=2,
                              transient=False)
            self._live.start()
        else:
            self._live.update(apply_table(job))

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
            if not self.console.is_terminal:
                self.console.line()  # rich leaves the last line of a non-terminal Live open
