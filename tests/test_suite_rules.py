"""Rules of the test suite itself, checked on its source."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def asserts_in_finally(source: str) -> list[int]:
    """Line numbers of ``assert`` statements inside a ``finally:`` block (at any depth)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Try) and node.finalbody:
            for statement in node.finalbody:
                found += [sub.lineno for sub in ast.walk(statement)
                          if isinstance(sub, ast.Assert)]
    return sorted(found)


def test_the_check_finds_an_assert_in_a_finally_block() -> None:
    source = ("try:\n    pass\nfinally:\n    x = 1\n    if x:\n        assert x == 1\n"
              "try:\n    assert True\nexcept Exception:\n    pass\n")
    assert asserts_in_finally(source) == [6]


def test_no_assert_inside_finally() -> None:
    """A failing assert in ``finally:`` hides the test's first failure and skips the clean-up
    after it: clean up in ``finally:``, keep what it returns, assert after the ``try``."""
    offenders = [f"{path.name}:{line}" for path in sorted(TESTS.glob("*.py"))
                 for line in asserts_in_finally(path.read_text())]
    assert offenders == [], offenders
