"""SIGTERM for the capture daemon, from the first instant our code runs.

``cdc capture`` spends its first half second or more (more on a loaded machine) importing
libraries, reading the config and opening the log. A SIGTERM in that window used to meet
Python's default disposition and kill the process with -15 instead of a clean exit. So the
command line imports this module before its slow imports, and importing it in the ``cdc``
process (not in a program that merely imports the package) calls :func:`catch_early`: from
then on a SIGTERM is only *recorded*. Once the command is known:

* the daemon (``cdc capture``) installs its own handler and asks :func:`requested` whether a
  SIGTERM already came, and if so stops before streaming anything (exit 0);
* every other command calls :func:`release`: SIGTERM kills as by default again, and one that
  arrived meanwhile is delivered now (so ``cdc status`` under SIGTERM still dies at once).

Only SIGTERM is handled early; SIGINT keeps Python's KeyboardInterrupt.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType

_received: list[int] = []


def _record(signum: int, _frame: FrameType | None) -> None:
    _received.append(signum)


def catch_early() -> None:
    """Record SIGTERM instead of dying, until :func:`release` or a daemon's own handler."""
    signal.signal(signal.SIGTERM, _record)


def requested() -> bool:
    """Whether a SIGTERM arrived while only :func:`catch_early`'s recorder was installed."""
    return bool(_received)


def release() -> None:
    """Back to the default SIGTERM disposition; re-deliver a SIGTERM recorded meanwhile."""
    if signal.getsignal(signal.SIGTERM) is _record:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if _received:
            signal.raise_signal(signal.SIGTERM)


def running_as_cdc() -> bool:
    """Whether this process is the ``cdc`` command (its console script, ``python -m
    cdc_app.cli`` or ``python -m cdc_app``), not some program that merely imports the package
    (tests, notebooks)."""
    main = Path(getattr(sys.modules.get("__main__"), "__file__", None) or "")
    return main.name == "cdc" or main.parts[-2:] in (("cdc_app", "cli.py"),
                                                      ("cdc_app", "__main__.py"))


if running_as_cdc():  # on import: the command line imports this module first of all
    catch_early()
