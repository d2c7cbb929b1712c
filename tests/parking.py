"""Shared servers parked while the tests running do not use them.

A session-scoped Kafka cluster lives from the first test that asks for it to the end of the
worker's session. Idle, a throwaway KRaft node still costs about a
fifth of a core (its heartbeats, controller and raft threads run mostly in the interpreter):
a worker's broker plus the cluster took half of the 2 cores through the rest of a run. So a
registered server is **parked** — its processes stopped with SIGSTOP, which costs nothing and
keeps every connection, topic and offset — once the test that just ended is followed by one
that does not use it (its fixture is not in the next test's closure), and **unparked**
(SIGCONT) by the function-scoped fixture a test asks for (statically or with
``getfixturevalue``). A node or a cluster carries on at once when continued: all of its
clocks jumped together, so no session expired in its own eyes.

The contract: the session fixture that owns a server calls :func:`register` after starting it
and :func:`release` before stopping it (a stopped process would not act on SIGTERM until
continued); the function-scoped fixture tests ask for calls :func:`use`; conftest's teardown
hook calls :func:`park`.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from typing import Any

#: fixture name -> the pids of the server's processes now (nodes may have been restarted)
_SERVERS: dict[str, Callable[[], list[int]]] = {}
_PARKED: set[str] = set()


def register(name: str, pids: Callable[[], list[int]]) -> None:
    """Park the server of fixture ``name`` between the tests that use it."""
    _SERVERS[name] = pids


def release(name: str) -> None:
    """Continue the server (if parked) and stop parking it: its fixture is ending."""
    _signal(name, signal.SIGCONT)
    _PARKED.discard(name)
    _SERVERS.pop(name, None)


def use(name: str) -> None:
    """A test is about to use the server of fixture ``name``: continue it if parked (called by
    the function-scoped fixture, so a fixture asked for by name at run time counts too)."""
    if name in _PARKED:
        _signal(name, signal.SIGCONT)
        _PARKED.discard(name)


def park(nextitem: Any) -> None:
    """After a test's teardown: stop every running server ``nextitem`` does not use (all of
    them when there is no next test)."""
    wanted = set(getattr(nextitem, "fixturenames", ())) if nextitem is not None else set()
    for name in list(_SERVERS):
        if name not in wanted and name not in _PARKED:
            _signal(name, signal.SIGSTOP)
            _PARKED.add(name)


def _signal(name: str, sig: signal.Signals) -> None:
    pids = _SERVERS.get(name)
    for pid in pids() if pids is not None else ():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
