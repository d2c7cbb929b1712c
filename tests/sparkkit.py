"""Helpers for tests that SIGKILL ``cdc apply``'s processes (the apply process, an executor, a
worker): where the followers stand, read from their progress records
(``spark_apply/progress.py``), as positions for :class:`tests.kills.Watch`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.kills import Watch, cpu_ticks, descendants


def batches(roots: Iterable[Path]) -> tuple[int, int]:
    """(batches planned, batches committed) summed over the followers whose progress folders
    are under ``roots``: ``planned.json`` names the batch handed to a runner, ``progress.json``
    counts the batches written (a planned batch not counted is written again at the restart)."""
    import json

    planned = committed = 0
    for root in roots:
        for record in Path(root).rglob("progress.json"):
            with contextlib.suppress(OSError, ValueError):
                committed += int(json.loads(record.read_text()).get("batches", 0))
        for record in Path(root).rglob("planned.json"):
            with contextlib.suppress(OSError, ValueError):
                planned += int(json.loads(record.read_text()).get("batch", 0))
    return max(planned, committed), committed


def driver_watch(roots: list[Path], writes: Any = None) -> Watch:
    """A :class:`Watch` of a ``cdc apply`` driver whose queries checkpoint under ``roots``. Its
    position is (batches planned, batches committed, ``writes()``: writes its sinks made, if
    given): a kill lands in flight when any of them advanced in the second before and a planned
    batch is not committed (the restart resumes from the committed ones and replays it)."""
    def position() -> tuple[int, int, int]:
        planned, committed = batches(roots)
        return planned, committed, writes() if writes is not None else 0

    return Watch("cdc apply (driver)", position,
                 ahead=lambda at, committed: at[0] > committed,
                 moved=lambda before, now: sum(now) > sum(before))


def committed_batches(roots: list[Path]) -> int:
    return batches(roots)[1]


def tree_watch(kind: str, pids: Any, roots: list[Path], min_ticks: int = 5) -> Watch:
    """A :class:`Watch` of a Spark executor or worker (``pids()``: its root processes). Its
    position is (CPU ticks of its processes and their children, batches planned by the
    driver): a kill lands in flight when it used at least ``min_ticks`` (1/100 s) of CPU in the
    second before, doing task work, and the driver had a batch planned and not committed (the
    tasks of which Spark runs again elsewhere)."""
    def position() -> tuple[int, int]:
        tree = [pid for root in pids() for pid in descendants(root)]
        return cpu_ticks(tree), batches(roots)[0]

    return Watch(kind, position, ahead=lambda at, committed: at[1] > committed,
                 moved=lambda before, now: now[0] - before[0] >= min_ticks)


# ------------------------------------------------------------------ apply in this process

#: in-process applies still running (the conftest stops them after each test)
RUNNING: list[InProcessApply] = []


class InProcessApply:
    """``cdc apply`` of ``names`` (followers or views) run in this test process, in a thread, on
    the session's shared SparkSession (the ``spark`` fixture: ask for it, so the session is the
    tests' own) — for tests that check only what the followers hold, not the process (which
    keep ``cdc apply`` subprocesses: SIGKILL, SIGTERM, metrics, the CLI end to end, the
    demo). Continuous until :meth:`terminate`; ``once=True`` returns when caught up (use
    :func:`apply_once`). ``spark.master`` and static ``spark.conf`` of the config do not apply:
    the shared session is local mode."""

    def __init__(self, config: Path, log_file: Path | None = None, *names: str,
                 once: bool = False) -> None:
        import threading

        from cdc.config import load_config

        self.config = load_config(config)
        self.names = list(names) or ["cache"]
        self.log_file = log_file or Path(config).parent / "apply.log"
        self.once = once
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.job: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="in-process apply")
        self.thread.start()
        RUNNING.append(self)

    def _run(self) -> None:
        import traceback

        from spark_apply.jobs import run_apply

        try:
            self.job = run_apply(self.config, self.names, once=self.once, stop=self.stop)
        except BaseException as exc:  # noqa: BLE001 - reported by terminate()/wait()
            self.error = exc
            self.log_file.write_text(traceback.format_exc())

    def wait(self, timeout: float = 600) -> Any:
        """Until a ``once`` run ended; its job (progress per name). Raises what it raised."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"apply of {self.names} still runs after {timeout} s"
        RUNNING.remove(self)
        if self.error is not None:
            raise self.error
        return self.job

    def terminate(self, timeout: float = 120) -> int:
        """Stop after the running batch (as SIGTERM does); 0 if the run ended cleanly."""
        self.stop.set()
        self.thread.join(timeout)
        if self in RUNNING:
            RUNNING.remove(self)
        if self.thread.is_alive():
            self.log_file.write_text(f"apply of {self.names} did not stop within {timeout} s")
            return 1
        return 0 if self.error is None else 1


def apply_once(config: Path, *names: str) -> Any:
    """``cdc apply --once`` of ``names`` in this process (see :class:`InProcessApply`); the
    finished job."""
    return InProcessApply(config, None, *names, once=True).wait()


def stop_leftover_applies() -> None:
    for run in list(RUNNING):
        run.terminate(60)


def group_freeze(pid: int) -> tuple[Any, Any]:
    """``freeze`` for :meth:`tests.kills.Watch.kill`: SIGSTOP / SIGCONT of process group
    ``pid`` (a ``cdc apply`` started in a session of its own: driver, JVM, Python workers)."""
    import contextlib
    import signal

    def stop() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGSTOP)

    def go_on() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGCONT)

    return stop, go_on
