"""How ``cdc apply`` rides out an unreachable log or follower, as ``cdc capture`` does.

An *outage* is a :class:`~cdc.errors.LogUnavailable` (the brokers are down or unreachable) or a
:class:`~cdc.errors.FollowerUnavailable` (the follower's server is), raised where ``cdc apply``
starts (the log's and each sink's checks), by the loop's read of the log, or by a batch (a
task's or a follower process's failure arrives as its traceback text: ``spark_apply/errors.py``
rebuilds the error). Then:

* The follower **waits**: it gets no batch, and it is tried again after 1, 2, 4 … at most
  :data:`MAX_DELAY` seconds — by reaching what was away (:func:`probe`: opening the log, the
  sink's own check); then the loop plans it again from its progress record. Nothing of the
  failed batch counted: the record was not written, and the version gate makes rewriting what
  did land a no-op, so it **resumes exactly** (and catches up without holding the others).
* It says so: ``waiting`` in ``/readyz`` (with the problem), the metrics (``cdc_apply_errors``
  by kind, ``cdc_apply_waiting_seconds``), and one log line when the outage begins, one per
  :data:`LOG_EVERY` seconds while it lasts, one when it ends — never a traceback.
* Other followers go on; ``SIGTERM`` ends the wait at once.

``cdc apply --once`` (a batch run) does not wait: an outage is its error, with the fix, and
the scheduler that runs it tries again later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from cdc.errors import CdcError, FollowerUnavailable, LogUnavailable

log = logging.getLogger("spark_apply.jobs")

#: seconds before the first retry, doubling up to :data:`MAX_DELAY`
FIRST_DELAY = 1.0
MAX_DELAY = 30.0
#: at most one "still waiting" line per follower this often (seconds)
LOG_EVERY = 30.0
OUTAGES = (LogUnavailable, FollowerUnavailable)
T = TypeVar("T")


def outage_of(error: BaseException | None, rebuilt: CdcError | None = None) -> CdcError | None:
    """The outage ``error`` is — itself, or ``rebuilt``: the CdcError that Spark's wrapped
    failure carries (:func:`spark_apply.errors.task_error`) — else None."""
    for candidate in (error, rebuilt):
        if isinstance(candidate, OUTAGES):
            return candidate
    return None


def _what(problem: CdcError) -> str:
    return "the log" if isinstance(problem, LogUnavailable) else "the follower's server"


@dataclass
class Waiting:
    """One follower waiting out an outage."""

    name: str
    problem: CdcError
    since: float
    delay: float = FIRST_DELAY
    next_try: float = 0.0
    logged: float = 0.0

    def __post_init__(self) -> None:
        self.next_try = self.since + self.delay
        log.warning("follower %s: %s is unreachable: %s; waiting for it (retrying with "
                    "backoff, at most every %.0f s)", self.name, _what(self.problem),
                    self.problem.problem, MAX_DELAY)
        self.logged = self.since

    @property
    def due(self) -> bool:
        return time.monotonic() >= self.next_try

    def failed_again(self, problem: CdcError) -> None:
        """Another attempt failed: the next one after twice the delay."""
        now = time.monotonic()
        self.problem = problem
        self.delay = min(self.delay * 2, MAX_DELAY)
        self.next_try = now + self.delay
        if now - self.logged >= LOG_EVERY:
            log.warning("follower %s: still waiting for %s (%.0f s so far): %s", self.name,
                        _what(problem), now - self.since, problem.problem)
            self.logged = now

    def ended(self) -> None:
        log.warning("follower %s: %s is back after %.0f s: resuming from its progress record",
                    self.name, _what(self.problem), time.monotonic() - self.since)


def ride_out(attempt: Callable[[], T], stop: threading.Event, names: list[str],
             observer: Any = None) -> T | None:
    """``attempt()``, tried again while it raises an outage, with backoff, until it succeeds
    (its result) or ``stop`` is set (None). ``names``: the followers that wait meanwhile, whose
    ``observer`` (the metrics) hears ``waiting`` and each failure."""
    waiting: dict[str, Waiting] = {}
    while True:
        try:
            result = attempt()
        except OUTAGES as exc:
            for name in names:
                if name in waiting:
                    waiting[name].failed_again(exc)
                else:
                    waiting[name] = Waiting(name, exc, time.monotonic())
                if observer is not None:
                    observer.error(name, type(exc).__name__)
                    observer.state(name, "waiting", exc.problem)
            delay = next(iter(waiting.values())).delay
            if stop.wait(delay):
                return None
            continue
        for name in names:
            if name in waiting:
                waiting[name].ended()
                if observer is not None:
                    observer.state(name, "starting")
        return result


def probe(config: Any, sink: Any, problem: CdcError) -> None:
    """Reach what ``problem`` says was away — the log (opened, then closed) or the follower's
    server (the sink's own check) — raising the outage again while it still is."""
    if isinstance(problem, LogUnavailable):
        from cdc.log.open import open_reader

        reader = open_reader(config, missing_ok=True)
        if reader is not None:
            reader.close()
    else:
        sink.check()
