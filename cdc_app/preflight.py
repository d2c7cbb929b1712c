"""``cdc check-config --connect``: every part the config names, asked in parallel, shown as one
✓/✗ table (the steps are the connectors', log backends' and sinks' own: :mod:`cdc.preflight`)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from rich.markup import escape
from rich.table import Table

from cdc.config import Config
from cdc.errors import CdcError
from cdc.offsets import SourceOffset
from cdc.preflight import Outcome, Part, Step, Verdict, Warn, environment_set, run_parts

#: seconds to wait for the log's stored source offsets (slot ownership needs them)
OFFSETS_TIMEOUT = 20.0
_STYLE = {Verdict.OK: "green", Verdict.WARN: "yellow", Verdict.FAIL: "bold red",
          Verdict.SKIPPED: "dim"}


def preflight(config: Config, console: Any) -> int:
    """Run every part's checks, print the table; the number of ✗."""
    with console.status("checking the log's stored positions…"):
        offsets, log_read = _stored_offsets(config)
    parts = _parts(config, offsets, log_read)
    steps = sum(len(part.steps) for part in parts)
    with console.status(f"checking {len(parts)} parts ({steps} checks)…"):
        outcomes = run_parts(parts)
    console.print(_table(outcomes))
    return sum(1 for o in outcomes if o.verdict is Verdict.FAIL)


def _stored_offsets(config: Config) -> tuple[dict[str, Any], bool]:
    """The log's stored offset data per source, and whether the log could be read (within
    :data:`OFFSETS_TIMEOUT`: an unreachable Kafka must not hang the command)."""
    from cdc.log.open import open_reader

    found: dict[str, Any] = {}

    def read() -> None:
        reader = open_reader(config, missing_ok=True)
        if reader is not None:
            try:
                found["offsets"] = reader.source_offsets()
            finally:
                reader.close()
        else:
            found["offsets"] = {}

    def guarded() -> None:
        with contextlib.suppress(CdcError):  # the log's own part reports why
            read()

    thread = threading.Thread(target=guarded, daemon=True)
    thread.start()
    thread.join(OFFSETS_TIMEOUT)
    if "offsets" not in found:
        return {}, False
    return dict(found["offsets"]), True


def _parts(config: Config, offsets: dict[str, Any], log_read: bool) -> list[Part]:
    from cdc.log.open import log_preflight
    from cdc.source import connector_for

    parts = [log_preflight(config)]
    for source in config.sources:
        connector = connector_for(source)
        data = offsets.get(source.name)
        stored: SourceOffset | None = connector.load_offset(data) if data else None
        parts.append(connector.preflight(stored, log_read))
    parts.extend(_follower_part(config, name) for name in config.followers)
    if config.followers or config.views:
        from spark_apply.preflight import spark_part

        parts.append(spark_part(config))
    return parts


def _follower_part(config: Config, name: str) -> Part:
    from cdc.sink import open_sink

    settings = config.followers[name]
    title = f"follower {name} ({settings.kind})"
    steps: list[Step] = []
    password_env = getattr(settings, "password_env", None)
    if password_env:
        steps.append(Step("password_env", lambda: str(environment_set(
            password_env, f"followers.{name}.password_env"))))
    try:
        sink = open_sink(config, name)
    except CdcError as exc:
        problem = exc

        def refused() -> str:
            raise problem
        return Part(title, [*steps, Step("settings", refused)])
    steps.extend(sink.preflight())
    if not steps:
        steps.append(Step("checks", lambda: Warn(f"a {settings.kind} follower has no "
                                                  "preflight checks")))
    return Part(title, steps, sink.close)


def _table(outcomes: list[Outcome]) -> Table:
    table = Table(title="preflight (creates nothing)", show_lines=False, expand=False)
    table.add_column("", no_wrap=True)
    table.add_column("part", no_wrap=True)
    table.add_column("check")
    table.add_column("found / fix")
    previous = ""
    for outcome in outcomes:
        style = _STYLE[outcome.verdict]
        text = escape(outcome.finding)
        if outcome.fix:
            text += f"\n[bold]fix:[/] {escape(outcome.fix)}"
        table.add_row(f"[{style}]{outcome.verdict.value}[/]",
                      "" if outcome.part == previous else escape(outcome.part),
                      escape(outcome.what), f"[{style}]{text}[/]" if outcome.verdict in (
                          Verdict.FAIL, Verdict.SKIPPED) else text)
        previous = outcome.part
    return table
