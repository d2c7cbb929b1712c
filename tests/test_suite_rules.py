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


def test_the_schedule_names_test_files_that_exist() -> None:
    """``tests/schedule.py`` orders and groups files by name: a renamed file would silently
    fall back to the default order, or split a shared unit in two."""
    from tests.schedule import LONGEST_FIRST, SHARED

    named = set(LONGEST_FIRST) | set(SHARED) | set(SHARED.values())
    def exists(name: str) -> bool:  # in tests/ or a folder of it (tests/fuzz_views/)
        return any(path.is_file() for path in TESTS.rglob(name))

    assert named and all(exists(name) for name in named), \
        sorted(name for name in named if not exists(name))


def test_the_schedule_puts_longest_first_and_keeps_units_together() -> None:
    from tests.schedule import LONGEST_FIRST, order, unit_of

    class Item:
        def __init__(self, nodeid: str, servers: bool) -> None:
            self.nodeid, self.servers = nodeid, servers

        def get_closest_marker(self, name: str) -> object:
            return object() if name == "servers" and self.servers else None

    items = [Item("tests/test_a.py::t", False), Item("tests/test_kafka_server.py::t", True),
             Item(f"tests/{LONGEST_FIRST[1]}::t", True), Item("tests/test_b.py::t", True),
             Item(f"tests/{LONGEST_FIRST[0]}::t", True)]
    order(items)
    units = [unit_of(item.nodeid).split("/")[1] for item in items]
    # the spark cluster's file, then the three-broker unit (test_kafka_server.py with it)
    assert units[:3] == [LONGEST_FIRST[0], LONGEST_FIRST[1], LONGEST_FIRST[1]]
    assert items[-1].nodeid == "tests/test_a.py::t"  # the quick ones last
    assert unit_of("tests/test_kafka_server.py::x") == "tests/test_kafka_faults.py"


#: the product's packages (what the wheel installs)
PRODUCT = ("cdc", "cdc_app", "connectors", "sinks", "spark_apply", "views")
#: the folders of a Spark streaming checkpoint whose layout Spark may change between releases
SPARK_CHECKPOINT_PARTS = frozenset({"offsets", "commits"})


def spark_checkpoint_paths(source: str) -> list[int]:
    """Lines of ``source`` that build a path into a Spark checkpoint's ``offsets/`` or
    ``commits/`` (``folder / "offsets"``, ``"…/commits/…"`` in a string)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and side.value in SPARK_CHECKPOINT_PARTS:
                    found.append(node.lineno)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and any(
                f"/{part}/" in node.value or node.value.endswith(f"/{part}")
                for part in SPARK_CHECKPOINT_PARTS):
            found.append(node.lineno)
    return found


def test_the_check_finds_a_path_into_a_spark_checkpoint() -> None:
    assert spark_checkpoint_paths('x = folder / "offsets" / str(n)') == [1]
    assert spark_checkpoint_paths('x = "ck/commits/3"') == [1]
    assert spark_checkpoint_paths('x = {"offsets": 1}') == []


def test_no_product_code_reads_sparks_checkpoint_files() -> None:
    """How a batch's ranges are known is ``spark_apply/planning.py`` with the follower's own
    progress record: no product module opens a Spark checkpoint's ``offsets/`` or ``commits/``
    (their layout is Spark's to change)."""
    root = Path(__file__).parents[1]
    offenders = [f"{path.relative_to(root)}:{line}"
                 for package in PRODUCT for path in sorted((root / package).rglob("*.py"))
                 for line in spark_checkpoint_paths(path.read_text())]
    assert not offenders, offenders
