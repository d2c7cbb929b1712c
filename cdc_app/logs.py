"""How the ``cdc`` commands log: one handler on stderr for every logger — ours, librdkafka's
(``cdc.kafka.client``), py4j's — as text or one JSON object per line (``--log-format json``),
at ``--log-level`` (default: ``info`` for the daemons, ``warning`` for one-shot commands, whose
errors are printed as problem and fix). ``CDC_LOG_LEVEL`` and ``CDC_LOG_FORMAT`` set the same
(e.g. in a systemd unit's environment)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
from typing import Any, TextIO

from cdc import jvm

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
#: one-shot commands: a Kafka client's complaints are in the error the command prints
_QUIET_IN_COMMANDS = ("cdc.kafka.client",)
#: loggers whose INFO lines are another library's chatter
_CHATTY = ("py4j", "urllib3", "sqlglot")
#: loggers whose errors cdc reports itself, with the fix: py4j logs every exception a
#: foreachBatch function raises, with its traceback, before the query fails with it
_SILENT = ("py4j.clientserver", "py4j.java_gateway")

_chosen_level: str | None = None
_stream: TextIO | None = None


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ms), ``level``, ``logger``, ``message``, and
    ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        moment = dt.datetime.fromtimestamp(record.created, dt.UTC)
        out = {"time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
               "level": record.levelname.lower(), "logger": record.name,
               "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def _own_stderr() -> TextIO:
    """A copy of stderr of the logging's own: a JVM's stderr may be piped into logging
    meanwhile (cdc/jvm), and what logging writes must not go back into that pipe."""
    global _stream
    if _stream is None:
        try:
            _stream = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1,
                                encoding="utf-8", errors="replace")
        except (AttributeError, OSError, ValueError):  # no file behind it (a test's capture)
            return sys.stderr
    return _stream


def setup(level: str | None, form: str, daemon: bool) -> None:
    """Send every logger's records to stderr in ``form`` at ``level`` (None: the command's
    default)."""
    global _chosen_level
    _chosen_level = level
    handler = logging.StreamHandler(_own_stderr())
    handler.setFormatter(JsonFormatter() if form == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((level or ("info" if daemon else "warning")).upper())
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in _SILENT:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    if not daemon and level is None:
        for name in _QUIET_IN_COMMANDS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
    jvm.LOG_JVM_STDERR = True


def to_console(console: Any, level: int) -> None:
    """Log through ``console`` (a rich Console) at ``level`` and above: a live display on it
    (the demo's tables) keeps the lines above itself instead of being torn by them."""
    from rich.logging import RichHandler

    handler = RichHandler(console=console, show_path=False, markup=False, rich_tracebacks=False)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    global _chosen_level
    _chosen_level = logging.getLevelName(level).lower()


def daemon_level() -> None:
    """A command that runs long and says what it does (bootstrap, the demo): ``info`` unless
    the user chose a level."""
    if _chosen_level is None:
        logging.getLogger().setLevel(logging.INFO)
        for name in _QUIET_IN_COMMANDS:
            logging.getLogger(name).setLevel(logging.NOTSET)
