"""Which implementation of the compiled fast paths runs: ``CDC_PURE_PYTHON``.

Several modules have a compiled twin (Cython: ``cdc/_fast.pyx``, ``cdc/log/_fast.pyx``,
``connectors/postgres/_fast.pyx``, ``connectors/mysql/_fast.pyx``; built by ``pip install``
when a C compiler is there) that gives exactly the same results as their pure-Python code.
Each module takes its twin when it imports, unless :func:`pure_python` says not to. This is
the one place that reads the environment variable; ``setup.py`` reads it too, to skip the build.
"""

from __future__ import annotations

import os

#: ``CDC_PURE_PYTHON=1``: run the pure-Python implementations even where compiled ones are built
PURE_PYTHON_ENV = "CDC_PURE_PYTHON"


def pure_python() -> bool:
    """Whether ``CDC_PURE_PYTHON=1`` asks for the pure-Python implementations (read at each
    call: a module decides when it is imported, tests re-import with the variable set)."""
    return os.environ.get(PURE_PYTHON_ENV, "") == "1"
