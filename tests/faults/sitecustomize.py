"""Fault injection and test switches, kept out of the product: a test puts this directory first
on the PYTHONPATH of a ``cdc`` subprocess it starts (:func:`tests.faults.fault_env`), and Python
imports this module at the interpreter's start. It imports nothing of the product then (the
project may not be on ``sys.path`` yet, and Spark's Python workers inherit the PYTHONPATH too):
each switch set in the environment wraps a product method when that method's module is first
imported, whoever imports it.

``CDC_TEST_VIEW_STALL=<path>``: after a view batch's state commit
(:meth:`views.sink.ViewSink._commit_state`) that changed view rows, ``<path>`` is created and the
batch stalls there for 600 s, so that the test's SIGKILL lands between the state's commit and the
followers' writes (the outbox full). A view's batch runs on the driver, the ``cdc apply`` process
itself (docs/views.md).

``CDC_TEST_MYSQL_TYPED=1``: the MySQL connector's snapshot and binlog stream get no codec, so
they take the typed path (rows decoded to values, then encoded) instead of the fast one
(``connectors/mysql/rowcodec.py``), for comparing the two.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

VIEW_STALL = "CDC_TEST_VIEW_STALL"
MYSQL_TYPED = "CDC_TEST_MYSQL_TYPED"


def _stall_after_state_commit(module: ModuleType) -> None:
    sink = module.ViewSink
    commit = sink._commit_state

    def _commit_state(self: Any, state: Any, changes: Any, behind: bool = False) -> Any:
        result = commit(self, state, changes, behind)
        if result.upserts + result.deletes:
            Path(os.environ[VIEW_STALL]).touch()
            time.sleep(600)
        return result

    sink._commit_state = _commit_state


def _mysql_typed(module: ModuleType) -> None:
    connector = module.MySqlConnector
    snapshot, stream = connector.snapshot, connector.stream

    def snapshot_typed(self: Any, codec: Any = None) -> Any:
        return snapshot(self, None)

    def stream_typed(self: Any, offset: Any, codec: Any = None) -> Any:
        return stream(self, offset, None)

    connector.snapshot, connector.stream = snapshot_typed, stream_typed


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds module ``name`` with the other finders and runs ``patch`` on it once executed."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(fullname, path, target)
            if spec is not None and spec.loader is not None:
                self._patch_after_exec(spec.loader)
                return spec
        return None

    def _patch_after_exec(self, loader: Any) -> None:
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            self.patch(module)

        loader.exec_module = exec_module


def _run_shadowed() -> None:
    """The ``sitecustomize`` this one shadows, if any (a Debian Python's, say), runs too."""
    here = Path(__file__).resolve().parent
    rest = [entry for entry in sys.path if Path(entry or os.curdir).resolve() != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if os.environ.get(VIEW_STALL):
    sys.meta_path.insert(0, _PatchOnImport("views.sink", _stall_after_state_commit))
if os.environ.get(MYSQL_TYPED) == "1":
    sys.meta_path.insert(0, _PatchOnImport("connectors.mysql.connector", _mysql_typed))
_run_shadowed()
