"""What ``cdc apply`` ships to a cluster's executors (spark_apply/ship.py): this installation's
code with its compiled kernels, data files and entry points, and its Python dependencies, but
not pyspark (Spark provides it); packed once per set of installed files. The cluster tests run
apply on workers that have nothing else (tests/test_spark_cluster.py)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from spark_apply.ship import archive_files, distributions, pack, ship_settings


def test_the_archive_holds_the_code_its_plugins_and_dependencies_but_not_pyspark(
        tmp_path: Path) -> None:
    archive = pack(tmp_path)
    assert pack(tmp_path) == archive  # the same installed files: the same archive, not a new one
    assert [p.name for p in tmp_path.glob("*.zip")] == [archive.name]
    names = set(zipfile.ZipFile(archive).namelist())
    tops = {name.split("/", 1)[0] for name in names}
    for package in ("cdc", "connectors", "sinks", "spark_apply", "views", "pydantic",
                    "deltalake", "redis", "tantivy", "duckdb", "pyarrow", "pandas"):
        assert package in tops, package
    assert not {"pyspark", "py4j"} & tops and not any("__pycache__" in n for n in names)
    assert any(n.startswith("cdc/_fast") and n.endswith(".so") for n in names)
    assert "cdc/schemas/source.postgresql.avsc" in names
    info = next(n for n in names if n.startswith("cdc-") and n.endswith(".dist-info/"
                                                                       "entry_points.txt"))
    points = zipfile.ZipFile(archive).read(info).decode()
    assert "[cdc.followers]" in points and "sinks.redis_settings" in points
    assert {d.metadata["Name"].lower() for d in distributions()} >= {"cdc", "deltalake"}
    assert len(names) == len({name for _, name in archive_files()})
    settings = ship_settings(archive)
    assert settings["spark.archives"] == f"{archive}#cdcenv"
    assert settings["spark.executorEnv.PYTHONPATH"] == "cdcenv"
