"""Test-only switches of ``cdc`` subprocesses (``sitecustomize.py`` here lists them): the product
reads no environment variable for tests."""

from __future__ import annotations

import os
from pathlib import Path

FAULTS = Path(__file__).resolve().parent


def fault_env(**switches: str) -> dict[str, str]:
    """This process's environment with this directory first on PYTHONPATH (so a subprocess
    imports its ``sitecustomize``) and ``switches`` set, e.g.
    ``fault_env(CDC_TEST_VIEW_STALL=str(marker))``."""
    path = [str(FAULTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **switches}
