"""The local SparkSession every ``cdc apply`` job and Spark test uses.

:func:`spark_session` builds (or returns the already running) session: ``local[2,3]`` by default
(two cores; a failed task is tried up to 3 times — local mode's default is once, and on a loaded
machine a Python worker can miss Spark's fixed 10 s connect-back deadline; our reads are
idempotent),
Python workers on this interpreter (``PYSPARK_PYTHON``/``PYSPARK_DRIVER_PYTHON`` =
``sys.executable``; workers started with another Python fail after a 10 s timeout), the project
root on the workers' ``PYTHONPATH`` (so they import ``spark_apply.source``), no web UI, few
shuffle partitions, JVM logging at ERROR, and the ``cdc`` data source registered.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LOG4J = Path(__file__).resolve().parent / "log4j2.properties"


def _worker_environment() -> None:
    """Set before the JVM starts: the JVM passes its environment on to the Python workers."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(PROJECT_ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *paths])


def spark_session(master: str = "local[2,3]", app_name: str = "cdc",
                  conf: Mapping[str, str] | None = None) -> Any:
    """The SparkSession (created on first call; later calls return the same one, ``master``
    and ``conf`` then apply only where Spark allows changing them at runtime).

    ``conf`` adds or overrides Spark settings, e.g. ``{"spark.driver.memory": "2g"}``.
    """
    _worker_environment()
    # pyspark 4.3 warns about pandas 3 on import; the cdc source does not use pandas
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark.sql import SparkSession

    from spark_apply.source import register

    java_options = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.adaptive.enabled": "false",
        "spark.driver.extraJavaOptions": java_options,
        "spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"],
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        **dict(conf or {}),
    }
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
