"""The signal both row paths raise when the fast path does not take an event.

It lives in a module of its own, which imports nothing of the connector, so that the pure-Python
row path (``rowcodec.py``) and its compiled twin (``_fast.pyx``) can both import it whichever of
them is imported first. When the twin imported it from ``rowcodec.py``, importing the twin first
(as ``cdc --version`` and the start-up check did) ran ``rowcodec.py`` while the twin was half
initialised: its ``from connectors.mysql._fast import ...`` failed, was taken for "not built",
and every MariaDB capture and snapshot ran the pure-Python rows, ~4x slower (issue 42).
"""

from __future__ import annotations


class Fallback(Exception):  # noqa: N818 - a signal, not an error
    """The fast path does not take this event: use the typed path."""
