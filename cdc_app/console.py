"""Rich consoles that stay readable when the output is a pipe or a CI log."""

from __future__ import annotations

import sys

from rich.console import Console

#: width used when the output is not a terminal (rich would assume 80 and cut table cells)
PIPE_WIDTH = 160


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else PIPE_WIDTH
    return Console(stderr=stderr, width=width)
