"""How ``make test`` spreads the suite over pytest-xdist workers (``-n 2 --dist loadfile``).

The suite is mostly waiting on and computing in servers (Spark, Kafka, the databases); one
process keeps about 70 % of 2 CPUs busy, two keep both busy. Three rules:

* **A file is a unit** (``--dist loadfile``): its module-scoped fixtures (the Spark standalone
  cluster of ``test_spark_cluster.py``, a module's own broker) start once. Files that share a
  costly session fixture nobody else uses form one unit (:data:`SHARED`), so it starts once in
  the run rather than once per worker.
* **The longest units first** (:data:`LONGEST_FIRST`, measured in a full run): a worker that
  draws a long file late would run alone at the end. Then the other files with server tests,
  then the quick ones, which fill the gaps at the end.
* Each worker starts its own session servers (PostgreSQL, MariaDB, Redis, a broker, a local
  SparkSession) on free ports when its first test asks; nothing is shared between workers but
  the disk caches (jars, the broker's class archive: written under a temporary name, moved
  into place).

The order changes only the wall time, never a test's outcome: each test makes its own
databases, topics and followers. ``PYTEST_WORKERS=1 make test`` runs everything in one process.
"""

from __future__ import annotations

from typing import Any

#: test files in decreasing order of their time in a full run (seconds in ``make test``
#: with 2 workers, where they overlap with another file): 530, 255, 201, 193, 107, 104, 81,
#: 78, 76, 52, 47; test_tpch_views.py (100 alone) and fuzz_views/test_fuzz_views.py (50-67
#: alone) placed by their time alone, not yet measured in a full run
LONGEST_FIRST = (
    "test_spark_cluster.py", "test_kafka_faults.py", "test_apply_crash.py", "test_views.py",
    "test_wheel.py", "test_tpch_views.py", "test_pg_capture.py", "test_kafka_log.py",
    "test_columns.py", "test_apply.py", "test_fuzz_views.py", "test_demo_mysql.py",
    "test_mysql_capture.py", "test_pg_crash.py",
)

#: files scheduled as one unit: they share a session fixture no other file uses
SHARED = {"test_kafka_server.py": "test_kafka_faults.py"}  # the three-broker `kafka_cluster`


def file_of(nodeid: str) -> str:
    """``tests/test_x.py::test_y[z]`` -> ``test_x.py``."""
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


def unit_of(nodeid: str) -> str:
    """The scheduling unit a test belongs to: its file's path, or the path of the file it
    shares a fixture with (:data:`SHARED`)."""
    path = nodeid.split("::", 1)[0]
    name = file_of(nodeid)
    return path[: len(path) - len(name)] + SHARED.get(name, name)


def order(items: list[Any]) -> None:
    """Sort collected items in place: longest units first (:data:`LONGEST_FIRST`), then units
    with a ``servers`` test, then the rest; collection order within each group and unit."""
    rank: dict[str, int] = {}
    for item in items:
        unit = unit_of(item.nodeid)
        name = file_of(unit)
        if name in LONGEST_FIRST:
            value = LONGEST_FIRST.index(name)
        else:
            value = len(LONGEST_FIRST) + (0 if item.get_closest_marker("servers") else 1)
        rank[unit] = min(rank.get(unit, value), value)
    position = {id(item): index for index, item in enumerate(items)}
    items.sort(key=lambda item: (rank[unit_of(item.nodeid)], unit_of(item.nodeid),
                                 position[id(item)]))


def make_scheduler(config: Any, log: Any) -> Any:
    """A ``--dist loadfile`` scheduler whose units are :func:`unit_of` and which hands them
    out in collection order (see :func:`order`), not by their number of tests."""
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):  # type: ignore[misc]
        def __init__(self, config: Any, log: Any) -> None:
            super().__init__(config, log)
            config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return Scheduling(config, log)
