"""The one way tests SIGKILL something on purpose, and the record of every such kill.

A fault test proves something only if its kill lands on work in flight: a capture killed while
idle, or a broker killed while nothing is written to it, recovers from nothing. So every
deliberate kill goes through :class:`Watch`, which:

* samples the killed process's own *position* (``position()``: an LSN it was sent, the records a
  writer handed to the log, the batches a Spark query planned, the bytes a broker wrote ...) every
  :data:`SAMPLE_S` seconds from the moment the watch starts;
* at the kill, reads the position once more, sends SIGKILL (``action()``) and keeps the sample
  taken about one second before;
* afterwards compares the position with the *committed* position its restart resumes from
  (``resumes_from()``: the log's stored source offset, the last batch Spark committed, ...).

The kill *landed in flight* when the position advanced in the second before the SIGKILL **and**
is ahead of the committed position (``position > resumes_from``, or ``ahead(position,
resumes_from)`` where the two are not plain numbers). :meth:`Kill.settle` raises
:class:`AssertionError` otherwise, so a kill that lands on nothing fails its test.

Every kill is recorded in :data:`KILLS` by kind (what was killed) and phase (what it was doing);
``tests/conftest.py`` prints the counts in pytest's summary.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: seconds between two samples of a watched position
SAMPLE_S = 0.05
#: how far back "the second before the SIGKILL" reaches
WINDOW_S = 1.0


@dataclass
class Kill:
    """One deliberate SIGKILL: what was killed, in which phase, and where it stood."""

    kind: str
    phase: str
    position: Any  # the killed process's own position just before the SIGKILL
    second_before: Any  # ... and about a second earlier
    ahead: Callable[[Any, Any], bool]
    moved: Callable[[Any, Any], bool]
    resumes_from: Any = None  # the committed position its restart resumes from
    settled: bool = False
    in_flight: bool = False
    detail: str = ""

    @property
    def advanced(self) -> bool:
        return bool(self.moved(self.second_before, self.position))

    def settle(self, resumes_from: Any, detail: str = "") -> Kill:
        """Compare with the committed position; :class:`AssertionError` unless the kill landed
        while work was in flight."""
        self.resumes_from, self.settled = resumes_from, True
        self.detail = detail
        self.in_flight = self.advanced and bool(self.ahead(self.position, resumes_from))
        assert self.in_flight, (
            f"the SIGKILL of {self.kind} ({self.phase}) landed on nothing in flight: its "
            f"position went {self.second_before!r} -> {self.position!r} in the second before, "
            f"the committed position its restart resumes from is {resumes_from!r}"
            + (f" ({detail})" if detail else ""))
        return self


#: every kill of the run, in order
KILLS: list[Kill] = []


def _greater(position: Any, committed: Any) -> bool:
    return bool(position > committed)


class Watch:
    """Samples ``position()`` in the background until :meth:`stop` (or the ``with`` block) ends;
    :meth:`kill` SIGKILLs through ``action`` and records the kill.

    ``position`` must be cheap (it runs every :data:`SAMPLE_S` s) and must not raise while the
    process lives; an exception makes the sample count as "unknown" (skipped).
    """

    def __init__(self, kind: str, position: Callable[[], Any],
                 ahead: Callable[[Any, Any], bool] = _greater,
                 moved: Callable[[Any, Any], bool] | None = None,
                 close: Callable[[], Any] | None = None) -> None:
        """``ahead(position, committed)``: the position is past the committed one (default
        ``>``); ``moved(before, now)``: the position advanced (default ``now > before``);
        ``close``: releases what ``position`` holds (a connection), at :meth:`stop`."""
        self.kind = kind
        self.position = position
        self.ahead = ahead
        self.moved = moved or (lambda before, now: bool(now > before))
        self.close = close
        self._samples: deque[tuple[float, Any]] = deque(maxlen=int(4 * WINDOW_S / SAMPLE_S))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch {kind}")

    def start(self) -> Watch:
        self._sample()  # where it stood when the watch began
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        if self.close is not None:
            self.close()

    def __enter__(self) -> Watch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _sample(self) -> None:
        try:
            value = self.position()
        except Exception:  # noqa: BLE001 - a process starting or gone: no sample
            return
        if value is None:
            return
        with self._lock:
            self._samples.append((time.monotonic(), value))

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def _second_before(self, position: Any) -> Any:
        """The newest sample at least :data:`WINDOW_S` old (or the oldest kept, or
        ``position`` when there is none)."""
        now = time.monotonic()
        with self._lock:
            older = [value for at, value in self._samples if now - at >= WINDOW_S]
            earliest = self._samples[0][1] if self._samples else position
        return older[-1] if older else earliest

    def wait_moving(self, timeout: float = 60) -> None:
        """Until the position is known and advanced in the last :data:`WINDOW_S` (the process
        is at work); :class:`AssertionError` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                last = self._samples[-1][1] if self._samples else None
            if last is not None and self.moved(self._second_before(last), last):
                return
            time.sleep(SAMPLE_S)
        raise AssertionError(f"{self.kind} made no progress within {timeout} s")

    def restarted(self) -> None:
        """The watched process was restarted: forget the samples of the one before."""
        with self._lock:
            self._samples.clear()

    def kill(self, phase: str, action: Callable[[], Any],
             resumes_from: Callable[[], Any] | None = None, detail: str = "",
             aim: float = 0.0, read_before: bool = False,
             freeze: tuple[Callable[[], Any], Callable[[], Any]] | None = None) -> Kill:
        """SIGKILL now (``action``) and record it. With ``resumes_from``, settle at once (read
        the committed position after the kill); else call :meth:`Kill.settle` later (e.g. once
        a killed broker is back and its log can be read).

        ``aim`` (seconds, with ``resumes_from``): first wait up to that long for a moment when
        the position is ahead of the committed one (both read just before the SIGKILL), for
        processes that are often caught up (a capture keeping pace with a light load).

        ``read_before``: read the committed position just before the SIGKILL, not after it —
        for a killed server that holds it (a broker: nothing commits while it is down).

        ``freeze`` (``(stop, go_on)``, e.g. SIGSTOP and SIGCONT of the process group): with
        ``aim``, each look is taken with the process stopped, so the SIGKILL lands exactly at
        a moment seen in flight (a Spark driver may commit its batch between a look and a
        SIGKILL sent after it)."""
        deadline = time.monotonic() + aim
        while True:
            # look with the process running (reading the committed position may be slow: a
            # Kafka reader), and freeze it only to confirm a moment that looks in flight
            committed = (resumes_from() if (aim or read_before) and resumes_from is not None
                         else None)
            position = self.position()
            if not aim or committed is None or time.monotonic() > deadline:
                break
            if not (position is not None and self.ahead(position, committed)
                    and self.moved(self._second_before(position), position)):
                time.sleep(0.01)  # a look reads positions: no busy loop
                continue
            if freeze is None:
                break
            looked_at = time.monotonic()
            freeze[0]()
            position = self.position()  # read last: the SIGKILL follows at once
            if (position is not None and self.moved(self._second_before(position), position)
                    and self.ahead(position, resumes_from())):  # still: fire, frozen
                break
            freeze[1]()
            # let it run at least as long as the confirmation held it stopped: its own
            # progress in the second before is what the kill needs
            time.sleep(max(0.02, time.monotonic() - looked_at))
        second_before = self._second_before(position)
        action()
        kill = Kill(self.kind, phase, position, second_before, self.ahead, self.moved)
        KILLS.append(kill)
        self.restarted()
        if resumes_from is not None:
            kill.settle(committed if read_before else resumes_from(), detail)
        return kill


def process_freeze(pid: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """``freeze`` for :meth:`Watch.kill`: SIGSTOP / SIGCONT of process ``pid`` (a capture
    daemon: stopped, it cannot commit between the look that saw changes in flight and the
    SIGKILL; seen when a MariaDB capture kept pace with its load)."""
    import contextlib
    import signal

    def stop() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)

    def go_on() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    return stop, go_on


# ----------------------------------------------------------------------- position probes

def process_io(pid: int, field: str = "rchar") -> int:
    """A counter of ``/proc/<pid>/io`` (``rchar``: bytes the process read, ``wchar``: wrote)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value)
    raise KeyError(field)


def cpu_ticks(pids: Iterable[int]) -> int:
    """User + system CPU ticks of ``pids`` together (processes already gone count 0)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from ``/proc/*/stat``)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(parent, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(parents.get(current, []))
    return out


# ------------------------------------------------------------------------------ the summary

def kill_records() -> list[tuple[str, str, bool, bool]]:
    """This process's kills as plain tuples (kind, phase, in flight, settled): what a
    pytest-xdist worker hands to the controller, which prints the run's summary."""
    return [(k.kind, k.phase, k.in_flight, k.settled) for k in KILLS]


def summary_lines(records: list[tuple[str, str, bool, bool]]) -> list[str]:
    """The kills of the run (:func:`kill_records` of every process that ran tests) by kind and
    phase, and how many landed in flight."""
    if not records:
        return []
    by_kind: dict[str, dict[str, list[bool]]] = {}
    for kind, phase, in_flight, _ in records:
        by_kind.setdefault(kind, {}).setdefault(phase, []).append(in_flight)
    landed = sum(record[2] for record in records)
    unsettled = sum(not record[3] for record in records)
    lines = [f"{len(records)} SIGKILLs, {landed} asserted in flight"
             + (f", {unsettled} not settled (their test failed first)" if unsettled else "")]
    for kind in sorted(by_kind):
        phases = by_kind[kind]
        count = sum(len(v) for v in phases.values())
        in_flight = sum(sum(v) for v in phases.values())
        parts = ", ".join(f"{phase} {len(kills)}" for phase, kills in sorted(phases.items()))
        lines.append(f"  {kind}: {count} ({in_flight} in flight) - {parts}")
    return lines
