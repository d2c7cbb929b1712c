"""How a failure in a task, a child process or Spark's plumbing reaches the user: as the
:class:`~cdc.errors.CdcError` it was (rebuilt from its traceback text), or a one-line summary —
never a traceback."""

from __future__ import annotations

import re
from typing import NoReturn

from cdc.errors import CdcError


class ApplyError(CdcError):
    """A follower's batches failed."""


#: failures of Spark's own plumbing, not of the data or the sink: Spark starts a Python process
#: per task that must connect back within a fixed 10 s, which a loaded machine can miss. Such a
#: batch is run again (the version gate absorbs a replay) up to :data:`TRANSIENT_RESTARTS` times.
TRANSIENT_FAILURES = ("Python worker failed to connect back", "CANNOT_OPEN_SOCKET",
                      "Timed out while waiting for the Python worker")
TRANSIENT_RESTARTS = 5

#: how a CdcError raised in a task reaches the driver: ``module.Kind: problem`` and
#: ``  fix: ...`` (``CdcError.__str__``) inside the Python traceback Spark wraps it in
_TASK_ERROR = re.compile(r"^(?:[\w]+\.)*(?P<kind>\w+): (?P<problem>.*)\n(?:  fix: (?P<fix>.*))?",
                         re.M)
_PYTHON_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b.*)$", re.M)


def _error_classes() -> dict[str, type[CdcError]]:
    """Every CdcError class loaded in this process, by name."""
    found: dict[str, type[CdcError]] = {}
    pending: list[type[CdcError]] = [CdcError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.__name__, cls)
        pending.extend(cls.__subclasses__())
    return found


def task_error(exc: BaseException) -> CdcError | None:
    """The CdcError a task raised, rebuilt from its traceback text (the last one in it), or
    ``None`` when the failure is not one of ours."""
    text = str(exc)
    if "Traceback (most recent call last)" not in text:
        return None
    classes = _error_classes()
    for match in reversed(list(_TASK_ERROR.finditer(text))):
        cls = classes.get(match.group("kind"))
        if cls is not None:
            problem = match.group("problem").strip()
            fix = (match.group("fix") or "").strip() or "see the message above"
            try:
                return cls(problem, fix)
            except TypeError:  # a subclass with its own constructor
                return CdcError(problem, fix)
    return None


def raise_task_failure(name: str, text: str) -> NoReturn:
    """Raise the CdcError in ``text`` (a task's traceback), else a ``RuntimeError`` of it."""
    rebuilt = task_error(RuntimeError(text))
    if rebuilt is not None:
        raise rebuilt
    raise RuntimeError(f"follower {name}: {text}")


def failure_summary(text: str) -> str:
    """The line of a failure that says what went wrong: the last Python exception line of an
    embedded traceback (``RuntimeError: ...``), else the first line."""
    found = _PYTHON_ERROR.findall(text)
    if "Traceback (most recent call last)" in text and found:
        return str(found[-1]).strip()
    lines = text.strip().splitlines()
    return lines[0] if lines else "?"


def is_transient(text: str) -> bool:
    """Whether a failure is Spark's plumbing (:data:`TRANSIENT_FAILURES`)."""
    return any(marker in text for marker in TRANSIENT_FAILURES)
