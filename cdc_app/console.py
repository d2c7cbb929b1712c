"""Rich consoles that stay readable when the output is a pipe or a CI log."""

from __future__ import annotations

import os
import sys

from rich.console import Console

#: width used when the output is not a terminal (rich would assume 80 and cut table cells)
PIPE_WIDTH = 160


def make_console(stderr: bool = False) -> Console:
    """A console for stdout (or stderr); not a terminal: :data:`PIPE_WIDTH` columns wide, or
    ``$COLUMNS``."""
    stream = sys.stderr if stderr else sys.stdout
    columns = os.environ.get("COLUMNS", "")
    width = None if stream.isatty() else int(columns) if columns.isdigit() else PIPE_WIDTH
    return Console(stderr=stderr, width=width)
