"""Which compiled fast paths this installation has (``cdc --version``, and a warning at start
when one is missing): each kernel is a Cython module built by ``pip install`` with a C compiler
(``setup.py``); without it the same results come from pure Python, slower
(:mod:`cdc.speedups`)."""

from __future__ import annotations

import importlib

from cdc.speedups import PURE_PYTHON_ENV, pure_python

#: the compiled kernels, and what each speeds up
KERNELS = {
    "cdc._fast": "the codec, row images, the dispatcher",
    "cdc.log._fast": "log framing and partitioning",
    "connectors.postgres._fast": "pgoutput and COPY decoding",
    "connectors.mysql._fast": "binlog rows decoding",
}


def kernel_states() -> dict[str, str]:
    """Kernel -> ``compiled``, ``pure Python (CDC_PURE_PYTHON=1)`` or ``missing``."""
    if pure_python():
        return {name: f"pure Python ({PURE_PYTHON_ENV}=1)" for name in KERNELS}
    states = {}
    for name in KERNELS:
        try:
            importlib.import_module(name)
        except ImportError:
            states[name] = "missing"
        else:
            states[name] = "compiled"
    return states


def version_text(version: str) -> str:
    """``cdc --version``: the version, then one line per kernel."""
    lines = [f"cdc {version}", "fast paths:"]
    lines += [f"  {name}: {state} ({KERNELS[name]})" for name, state in kernel_states().items()]
    return "\n".join(lines)


def missing_warning() -> str | None:
    """The warning to print at start when a kernel is missing (``None``: all there, or pure
    Python asked for)."""
    missing = [name for name, state in kernel_states().items() if state == "missing"]
    if not missing:
        return None
    return (f"warning: compiled fast path(s) {', '.join(missing)} missing: running their "
            "pure-Python twins, several times slower. Fix: reinstall where a C compiler is "
            f"(pip install --force-reinstall --no-binary cdc cdc), or set {PURE_PYTHON_ENV}=1 "
            "to say this is meant")
