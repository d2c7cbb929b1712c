"""Which compiled fast paths this installation has (``cdc --version``, and a warning at start
when one is missing): each kernel is a Cython module built by ``pip install`` with a C compiler
(``setup.py``); without it the same results come from pure Python, slower
(:mod:`cdc.speedups`)."""

from __future__ import annotations

import importlib
from types import ModuleType

from cdc.speedups import PURE_PYTHON_ENV, pure_python

#: the compiled kernels, and what each speeds up
KERNELS = {
    "cdc._fast": "the codec, row images, the dispatcher",
    "cdc.log._fast": "log framing and partitioning",
    "connectors.postgres._fast": "pgoutput and COPY decoding",
    "connectors.mysql._fast": "binlog rows decoding",
}
#: the modules that bind each kernel's functions in place of their pure-Python twins when they
#: are imported: a kernel runs only where its owners took it (a kernel that imports but is not
#: taken -- an import cycle, say -- is no faster than a missing one)
OWNERS = {
    "cdc._fast": ("cdc.avro", "cdc.avroreader", "cdc.images", "cdc.pipeline",
                  "cdc.transactions"),
    "cdc.log._fast": ("cdc.log.partitioner", "cdc.log.segment"),
    "connectors.postgres._fast": ("connectors.postgres.pgoutput", "connectors.postgres.rowcodec"),
    "connectors.mysql._fast": ("connectors.mysql.rowcodec",),
}
#: a kernel's state when it is built and every owner runs it
COMPILED = "compiled"


def kernel_states() -> dict[str, str]:
    """Kernel -> ``compiled``, ``pure Python (CDC_PURE_PYTHON=1)``, ``missing``, or ``built but
    not used by <modules>``. The owners are imported before the kernel (the order a command
    imports them in) and asked what they hold."""
    if pure_python():
        return {name: f"pure Python ({PURE_PYTHON_ENV}=1)" for name in KERNELS}
    states = {}
    for name in KERNELS:
        idle = [owner for owner in OWNERS[name] if not _takes(importlib.import_module(owner), name)]
        try:
            importlib.import_module(name)
        except ImportError:
            states[name] = "missing"
            continue
        states[name] = f"built but not used by {', '.join(idle)}" if idle else COMPILED
    return states


def _takes(module: ModuleType, kernel: str) -> bool:
    """Whether ``module`` holds a function or class of ``kernel`` (Cython sets their
    ``__module__`` to the kernel's name)."""
    return any(getattr(value, "__module__", None) == kernel for value in vars(module).values())


def version_text(version: str) -> str:
    """``cdc --version``: the version, then one line per kernel."""
    lines = [f"cdc {version}", "fast paths:"]
    lines += [f"  {name}: {state} ({KERNELS[name]})" for name, state in kernel_states().items()]
    return "\n".join(lines)


def missing_warning() -> str | None:
    """The warning to print at start when a kernel is missing (``None``: all there, or pure
    Python asked for)."""
    if pure_python():
        return None
    missing = [f"{name} ({state})" for name, state in kernel_states().items()
               if state != COMPILED]
    if not missing:
        return None
    return (f"warning: compiled fast path(s) {', '.join(missing)} not in use: running their "
            "pure-Python twins, several times slower. Fix: reinstall where a C compiler is "
            f"(pip install --force-reinstall --no-binary cdc cdc), or set {PURE_PYTHON_ENV}=1 "
            "to say this is meant")
