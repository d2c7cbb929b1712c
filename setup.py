"""Builds the optional compiled fast paths (Cython); everything else is in pyproject.toml.

``pip install -e .`` (``make setup``) compiles ``cdc/_fast.pyx``, ``cdc/log/_fast.pyx``,
``connectors/postgres/_fast.pyx`` and ``connectors/mysql/_fast.pyx`` when Cython (a build
requirement, from PyPI) and a C compiler are there.
If either is missing or compilation fails, the install still succeeds and the pure-Python
implementations are used; ``CDC_PURE_PYTHON=1`` skips the build (and, at run time, selects the
pure-Python paths even when the extensions are built).
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCES = {
    "cdc._fast": (["cdc/_fast.pyx"], []),
    "connectors.postgres._fast": (["connectors/postgres/_fast.pyx"], []),
    "connectors.mysql._fast": (["connectors/mysql/_fast.pyx"], []),
    "cdc.log._fast": (["cdc/log/_fast.pyx"], ["z"]),
}
#: what every extension cimports: the byte primitives, written once (cdc/_bytes.pxd)
SHARED = ["cdc/_bytes.pxd"]
#: C headers an extension includes (a change rebuilds it)
DEPENDS = {"cdc.log._fast": ["cdc/log/crc32_fold.h"]}


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing: the compiled paths are an optimisation. The
    extensions compile in parallel, one per CPU (set-up time on a fresh machine)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure leaves the pure path
            _warn(f"the compiled fast paths were not built ({exc})")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            _warn(f"{ext.name} was not built ({exc})")


def _warn(message: str) -> None:
    print(f"setup: WARNING: {message}; the pure-Python implementation is used instead",
          file=sys.stderr)


def extensions() -> list[Extension]:
    if os.environ.get("CDC_PURE_PYTHON", "") == "1":
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn("Cython is not installed")
        return []
    modules = [Extension(name, sources, libraries=libraries, extra_compile_args=["-O2"],
                         depends=SHARED + DEPENDS.get(name, []))
               for name, (sources, libraries) in SOURCES.items()]
    try:
        return list(cythonize(modules, language_level=3, quiet=True,
                              nthreads=os.cpu_count() or 1))
    except Exception as exc:  # noqa: BLE001
        _warn(f"Cython could not translate the fast paths ({exc})")
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
