"""Preflight: what ``cdc check-config --connect`` asks of every part a config names — each
source, the log, every follower, the Spark master — creating nothing.

A :class:`Part` is one thing the config names (``source shop``, ``log``, ``follower cache``);
its :class:`Step` s are the questions asked of it, in order. The contract of a step:

* ``run()`` returns a short finding (``"PostgreSQL 16.4"``) when all is well, a :class:`Warn`
  (a finding worth reading that fails nothing) when it cannot tell, and raises a
  :class:`~cdc.errors.CdcError` (the problem and its fix) when the part would not work.
* It **creates nothing**: no slot, publication, topic, table, file or directory. Reads and
  catalog queries only.
* It answers within its ``timeout`` (seconds), or it is reported as unanswered and the part's
  later steps are not run; its thread is left behind as a daemon, so a hung connection cannot
  hang the command.
* A part's **first step reaches the part** (connects, opens): when it fails, the later steps are
  reported as not checked — they would only repeat its error.

Each connector, log backend and sink writes its own steps (the rooms that know their servers);
:func:`run_parts` runs the parts side by side and gives one :class:`Outcome` per step.
Findings and problems never hold a password: they name hosts, users and settings only.
"""

from __future__ import annotations

import contextlib
import enum
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cdc.errors import CdcError

#: a step's timeout unless it says otherwise (seconds)
DEFAULT_TIMEOUT = 10.0


class Warn(str):
    """A step's finding that needs reading but fails nothing (e.g. "cannot tell whether the
    server_id is free: SHOW SLAVE HOSTS is not allowed")."""

    __slots__ = ()


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Step:
    """One question asked of a part (see the module docstring for the contract)."""

    what: str
    run: Callable[[], str]
    timeout: float = DEFAULT_TIMEOUT


@dataclass
class Part:
    """One thing the config names, its steps in order, and what releases what they opened
    (called after the last step, unless a step is still running)."""

    name: str
    steps: Sequence[Step]
    close: Callable[[], None] = field(default=_nothing)


class Verdict(enum.Enum):
    OK = "✓"
    WARN = "!"
    FAIL = "✗"
    SKIPPED = "–"


@dataclass(frozen=True)
class Outcome:
    """What one step found."""

    part: str
    what: str
    verdict: Verdict
    finding: str
    fix: str = ""
    seconds: float = 0.0


def _run_step(part: str, step: Step) -> Outcome:
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["finding"] = step.run()
        except CdcError as exc:
            box["error"] = exc
        except Exception as exc:  # noqa: BLE001 - a driver's own error: shown, never a traceback
            box["crash"] = exc

    started = time.monotonic()
    thread = threading.Thread(target=target, name=f"preflight {part}: {step.what}", daemon=True)
    thread.start()
    thread.join(step.timeout)
    seconds = time.monotonic() - started
    if thread.is_alive():
        return Outcome(part, step.what, Verdict.FAIL, f"no answer within {step.timeout:g} s",
                       "check that it runs and is reachable from this machine (address, port, "
                       "firewall)", seconds)
    error = box.get("error")
    if isinstance(error, CdcError):
        return Outcome(part, step.what, Verdict.FAIL, error.problem, error.fix or "", seconds)
    crash = box.get("crash")
    if isinstance(crash, BaseException):
        first = (str(crash).strip().splitlines() or [""])[0][:300]
        return Outcome(part, step.what, Verdict.FAIL, f"{type(crash).__name__}: {first}",
                       "unexpected: run again with CDC_TRACEBACK=1 and report it", seconds)
    finding = str(box.get("finding") or "")
    verdict = Verdict.WARN if isinstance(box.get("finding"), Warn) else Verdict.OK
    return Outcome(part, step.what, verdict, finding, "", seconds)


def run_part(part: Part, done: Callable[[Outcome], None] = lambda _o: None) -> list[Outcome]:
    """The outcomes of ``part``'s steps, in order (the first step's failure, or any step's
    timeout, leaves the later ones not checked)."""
    outcomes: list[Outcome] = []
    blocker: Outcome | None = None
    stuck = False
    for step in part.steps:
        if blocker is not None:
            outcome = Outcome(part.name, step.what, Verdict.SKIPPED,
                              f"not checked: {blocker.what} failed")
        else:
            outcome = _run_step(part.name, step)
            stuck = outcome.finding.startswith("no answer within")
            if outcome.verdict is Verdict.FAIL and (stuck or not outcomes):
                blocker = outcome
        outcomes.append(outcome)
        done(outcome)
    if not stuck:
        with contextlib.suppress(Exception):  # closing what a step opened: nothing to report
            part.close()
    return outcomes


def run_parts(parts: Sequence[Part], done: Callable[[Outcome], None] = lambda _o: None
              ) -> list[Outcome]:
    """Every part's outcomes, parts side by side (a thread each), listed in ``parts``' order."""
    results: list[list[Outcome]] = [[] for _ in parts]

    def one(index: int) -> None:
        results[index] = run_part(parts[index], done)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(parts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [outcome for outcomes in results for outcome in outcomes]


def writable_place(path: Path, what: str, fix: str) -> str:
    """A finding for a directory a daemon will write: it exists and is writable, or the nearest
    existing parent is (it would be created there); a :class:`CdcError` otherwise. Creates
    nothing."""
    path = path.expanduser()
    if path.exists():
        if not path.is_dir():
            raise CdcError(f"{what} {path} is a file, not a directory", fix)
        if not os.access(path, os.W_OK | os.X_OK):
            raise CdcError(f"{what} {path} is not writable by this user", fix)
        return f"{path} exists and is writable"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise CdcError(f"{what} {path} does not exist, and {parent} (the nearest existing "
                       "parent) is not a writable directory, so it cannot be created", fix)
    return f"{path} will be created (in {parent}, writable)"


def environment_set(variable: str | None, setting: str) -> str | None:
    """A :class:`CdcError` naming ``setting`` when it names an environment variable that is
    not set here; a finding when it is; None when nothing is named."""
    if not variable:
        return None
    if os.environ.get(variable) is None:
        raise CdcError(f"{setting} names the environment variable {variable}, which is not set",
                       f"set {variable} in the environment of the cdc commands (e.g. the "
                       "systemd unit's EnvironmentFile), or remove the setting")
    return f"{setting}: {variable} is set"
