"""Throwaway local database servers for the demo, the tests and the benchmarks.

They start on free loopback ports with the settings CDC needs, in their own data directories,
and never touch the machine's default instances.
"""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM ``process`` (if it still runs) and wait ``timeout`` s for it; SIGKILL then."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)
