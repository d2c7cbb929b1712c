"""The local SparkSession every ``cdc apply`` job and Spark test uses.

:func:`spark_session` builds (or returns the already running) session: ``local[2,3]`` by default
(two cores; a failed task is tried up to 3 times — local mode's default is once, and on a loaded
machine a Python worker can miss Spark's fixed 10 s connect-back deadline; our reads are
idempotent),
Python workers on this interpreter (``PYSPARK_PYTHON``/``PYSPARK_DRIVER_PYTHON`` =
``sys.executable``; workers started with another Python fail after a 10 s timeout), the project
root on the workers' ``PYTHONPATH`` (so they import ``spark_apply.source``), no web UI, few
shuffle partitions, JVM logging at ERROR, and the ``cdc`` data source registered.

JVM jars: every jar in the Spark jar folder (Spark's Kafka source, spark-avro, delta-spark and
their dependencies, fetched by ``cdc setup`` into the jar cache: :mod:`cdc.jvm`; or the folder the
config's ``spark.jars_dir`` names) goes on the classpath with ``spark.jars``; nothing is downloaded
at run time (no ``spark.jars.packages``). With delta-spark among them, Delta's SQL extension and
catalog are set, so Spark reads and writes the Delta followers' tables (``format("delta")``,
``MERGE INTO delta.`path```). Without that folder the session still starts (local log followers
need none of them) and :func:`require_spark_jars` names the fix where a job needs them. Spark's
connector jars work only with the exact Spark release they were built for: the session refuses to
run when ``spark.version`` differs from theirs (:func:`check_spark_version`; spark-avro, which
Maven Central lacks for Spark 4.2.0, has a stand-in release: :data:`SPARK_AVRO_STAND_IN`).
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cdc.errors import CdcError
from cdc.jvm import (
    SETUP_FIX,
    class_archive_key,
    jars_dir,
    jars_ready,
    jvm_options,
    stderr_through_logging,
)
from cdc.status import pid_alive

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LOG4J = Path(__file__).resolve().parent / "log4j2.properties"
FETCH_FIX = SETUP_FIX

# Spark's Kafka connector jars carry the exact Spark release: spark-sql-kafka-0-10_2.13-4.2.0.jar
_VERSION = r"(?P<version>\d+\.\d+\.\d+(?:-\w+)?)"
_SPARK_CONNECTOR_JAR = re.compile(
    rf"^spark-(?:sql-kafka-0-10|token-provider-kafka-0-10)_\d+\.\d+-{_VERSION}\.jar$")
_SPARK_AVRO_JAR = re.compile(rf"^spark-avro_\d+\.\d+-{_VERSION}\.jar$")
#: Spark releases Maven Central has no spark-avro for -> the spark-avro release that stands in
#: (cdc/jvm/spark.pom.xml; tests/test_spark_jars.py round-trips Avro through it)
SPARK_AVRO_STAND_IN = {"4.2.0": "4.1.1"}
# delta-spark carries the Spark line it was built for: delta-spark_4.2_2.13-4.4.0.jar
_DELTA_JAR = re.compile(r"^delta-spark_(?P<line>\d+\.\d+)_\d+\.\d+-[^-]+\.jar$")
# the jars a Spark job may need, by what it uses them for (checked by require_spark_jars)
REQUIRED_JARS = {
    "kafka": re.compile(r"^spark-sql-kafka-0-10_"),
    "avro": re.compile(r"^spark-avro_"),
    "delta": re.compile(r"^delta-spark_"),
}


def spark_jars_folder() -> Path:
    """Where ``cdc setup`` puts Spark's connector jars for this installation (:mod:`cdc.jvm`)."""
    return jars_dir("spark")


def spark_jars(folder: Path | None = None) -> list[Path]:
    """Every jar in ``folder`` (default: :func:`spark_jars_folder`, once ``cdc setup`` filled
    it), absolute paths, sorted; none when there is no such folder."""
    if folder is None:
        folder = spark_jars_folder()
        if not jars_ready(folder):
            return []
    if not folder.is_dir():
        return []
    return sorted(p.resolve() for p in folder.glob("*.jar"))


def require_spark_jars(*needs: str, folder: Path | None = None) -> list[Path]:
    """The jars in ``folder``, after checking the ones ``needs`` names (``"kafka"``, ``"avro"``,
    ``"delta"``; all three when none is named) are there: a job that reads Kafka with Spark's
    source, decodes Avro in the JVM or writes Delta with delta-spark calls this first."""
    jars = spark_jars(folder)
    names = [p.name for p in jars]
    missing = [need for need in (needs or tuple(REQUIRED_JARS))
               if not any(REQUIRED_JARS[need].match(name) for name in names)]
    if missing:
        shown = folder or spark_jars_folder()
        where = f"{shown} has no jar for {', '.join(missing)}" if jars else f"{shown} is missing"
        raise CdcError(f"Spark's connector jars are not set up: {where}", FETCH_FIX)
    return jars


def jars_spark_version(jars: Sequence[Path | str]) -> str | None:
    """The Spark release Spark's Kafka connector jars among ``jars`` were built for (from their
    file names), or None when there is none among them. Jars of two releases are an error."""
    versions = {m.group("version") for m in
                (_SPARK_CONNECTOR_JAR.match(Path(j).name) for j in jars) if m}
    if len(versions) > 1:
        releases = ", ".join(sorted(versions))
        raise CdcError(f"Spark's connector jars are of different Spark releases ({releases})",
                       f"delete the folder they are in and {FETCH_FIX}")
    return versions.pop() if versions else None


def check_spark_version(running: str, jars: Sequence[Path | str]) -> None:
    """Raise :class:`CdcError` when the running Spark (``spark.version``) is not the release the
    jars were built for: Spark's connector jars must match it exactly (spark-avro: or be its
    :data:`SPARK_AVRO_STAND_IN`), delta-spark its line (``delta-spark_4.2_...``)."""
    wanted = jars_spark_version(jars)
    fix = ("install the pyspark release the project pins (pyproject.toml) and run `cdc setup`, "
           "which fetches the jars for it (cdc/jvm/spark.pom.xml)")
    if wanted is not None:
        fix += ("; or run the Spark the jars are for: "
                f"`.venv/bin/pip install \"pyspark[sql]=={wanted}\"`")
    folder = Path(jars[0]).parent if jars and Path(jars[0]).is_absolute() else None
    where = f"the jars in {folder} (spark.jars)" if folder else "the jars (spark.jars)"
    if wanted is not None and running != wanted:
        raise CdcError(
            f"Spark {running} is running, but {where} are for Spark {wanted}: connector jars work "
            "only with the Spark release they were built for", fix)
    avro = SPARK_AVRO_STAND_IN.get(running, running)
    for j in jars:
        name = Path(j).name
        delta = _DELTA_JAR.match(name)
        if delta and running.split(".")[:2] != delta.group("line").split("."):
            raise CdcError(f"Spark {running} is running, but {name} (spark.jars) is for Spark "
                           f"{delta.group('line')}.x", fix)
        m = _SPARK_AVRO_JAR.match(name)
        if m and m.group("version") != avro:
            raise CdcError(
                f"Spark {running} is running, but {name} (spark.jars) is not the spark-avro for "
                f"it, which is {avro} (SPARK_AVRO_STAND_IN in spark_apply/session.py and "
                "spark.avro.version in cdc/jvm/spark.pom.xml must agree)", fix)


# ------------------------------------------------------------------ the driver's class archive

#: quiet: a JVM that cannot map the archive (another classpath) starts without it, silently
_CDS_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def driver_class_archive() -> Path:
    """Where the AppCDS class archive of Spark's driver JVM lives (in the jar cache, keyed by
    the ``java`` binary and pyspark's jars): ``cdc setup`` makes it (:func:`make_class_archive`,
    a short training session whose JVM writes the classes it loaded when it exits); every
    session then maps it (``-XX:SharedArchiveFile``) and starts with about a third less CPU —
    on a 2-core machine, seconds per ``cdc apply`` start."""
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    return jars_dir("spark").parent / f"spark-driver-cds-{class_archive_key(jars)}.jsa"


def make_class_archive(say: Any = print) -> Path | None:
    """Make :func:`driver_class_archive` unless it exists: a training session in a child
    process (its JVM must exit by itself to write the archive), renamed into place when it
    succeeded. ``None`` when it could not be made (``cdc apply`` then simply starts without)."""
    import subprocess

    archive = driver_class_archive()
    if archive.exists():
        say(f"spark: the driver's class archive {archive} is ready")
        return archive
    say(f"spark: making the driver's class archive {archive} (a short Spark session) ...")
    temporary = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    code = ("from spark_apply.session import spark_session; "
            f"s = spark_session(master='local[1]', app_name='cdc-class-archive', conf="
            f"{{'spark.driver.extraJavaOptions': {_driver_java_options('')!r} + "
            "' -XX:TieredStopAtLevel=1'"  # the training only: quicker, and the same classes
            " + "
            f"' -XX:ArchiveClassesAtExit={temporary} {_CDS_QUIET}'}}); "
            "s.range(100).selectExpr('id % 7 AS k').groupBy('k').count().collect(); s.stop()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, timeout=600)
    if done.returncode != 0 or not temporary.exists() or temporary.stat().st_size < 1 << 20:
        temporary.unlink(missing_ok=True)
        say(f"spark: no class archive (Spark starts without it): {done.stderr.strip()[-300:]}")
        return None
    os.replace(temporary, archive)
    return archive


def class_archive_options() -> str:
    """The JVM options that map :func:`driver_class_archive` (empty when there is none). Spark's
    executors and its standalone daemons run the same classpath, so they map it too; a JVM
    elsewhere, without the file, or with other jars starts without it, silently."""
    archive = driver_class_archive()
    return f"-XX:SharedArchiveFile={archive} {_CDS_QUIET}" if archive.exists() else ""


def _driver_java_options(archive: str, temp: Path | None = None) -> str:
    """The driver JVM's options: the log4j settings, ``CDC_JVM_OPTIONS``, ``archive`` (the
    class archive's options, or empty) and ``temp`` as its ``java.io.tmpdir``: what the JVM
    puts in temporary folders (Spark deletes them only at a clean exit) stays in the scratch
    directory, which the next start removes once this process is gone. (Executors are where
    the big leftovers were seen: a copy of each shipped archive; docs/followers.md.)"""
    temp_option = f"-Djava.io.tmpdir={temp}" if temp is not None else ""
    return " ".join(filter(None, [f"-Dlog4j2.configurationFile=file:{LOG4J}", *jvm_options(),
                                  archive, temp_option]))


def _worker_environment(executor_python: str = sys.executable) -> None:
    """Set before the JVM starts: the JVM passes its environment on to the Python workers.
    The driver's own Python workers (planning the ``cdc`` source) run this interpreter; the
    executors run ``executor_python``."""
    os.environ["PYSPARK_PYTHON"] = executor_python
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if os.sep not in executor_python:  # a name (python3): on this machine, it is this Python
        here = str(Path(sys.executable).parent)
        if os.environ.get("PATH", "").split(os.pathsep)[0] != here:
            os.environ["PATH"] = os.pathsep.join([here, os.environ.get("PATH", "")])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(PROJECT_ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *paths])


def _shipping(conf: Mapping[str, str]) -> dict[str, str]:
    """The settings that ship this installation to the executors (packed once, cached), unless
    ``conf`` names an archive itself (``spark.archives``)."""
    from spark_apply.ship import UNPACKED, pack, ship_settings

    python = conf.get("spark.pyspark.python", "python3")
    if "spark.archives" in conf:
        return {"spark.pyspark.python": python,
                "spark.executorEnv.PYTHONPATH": conf.get("spark.executorEnv.PYTHONPATH",
                                                         UNPACKED)}
    return {**ship_settings(pack()), "spark.pyspark.python": python}


def scratch_dir(root: Path) -> Path:
    """This process's Spark scratch directory under ``root`` (``run-<pid>``), created; the
    ``run-*`` directories of processes that no longer run are removed first. Spark deletes its
    own scratch at a clean exit; a SIGKILLed driver leaves it behind (block manager files, the
    archive it ships), and this is where the next start finds it."""
    import shutil

    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob("run-*"):
        pid = old.name[4:]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    mine = root / f"run-{os.getpid()}"
    mine.mkdir(exist_ok=True)
    return mine


#: Hadoop's local file system without checksum files (both of its APIs: Spark's checkpoint
#: manager uses FileContext, the rest FileSystem)
RAW_LOCAL_FILES = {
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
}


def spark_session(master: str = "local[2,3]", app_name: str = "cdc",
                  conf: Mapping[str, str] | None = None,
                  jars_folder: Path | None = None, ship: bool = False,
                  scratch: Path | None = None) -> Any:
    """The SparkSession (created on first call; later calls return the same one, ``master``
    and ``conf`` then apply only where Spark allows changing them at runtime).

    ``conf`` adds or overrides Spark settings, e.g. ``{"spark.driver.memory": "2g"}``;
    ``jars_folder``:
    the folder of Spark's connector jars (default: :func:`spark_jars_folder`). ``ship``: hand
    the executors the code and its dependencies (:mod:`spark_apply.ship`) instead of assuming
    they have this installation; they run ``spark.pyspark.python`` (default ``python3``).
    ``scratch``: the folder for the driver's scratch space (``spark.local.dir``, unless
    ``conf`` sets it): :func:`scratch_dir` of it.
    """
    conf = dict(conf or {})
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started us: its settings
    shipped = _shipping(conf) if ship and not submitted else {}
    if not submitted:
        _worker_environment(shipped.get("spark.pyspark.python", sys.executable))
    # pyspark 4.2 warns about pandas 3 on import; the cdc source does not use pandas
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark.sql import SparkSession

    from spark_apply.source import register

    archive = class_archive_options()
    scratch_run = scratch_dir(scratch) if scratch is not None else None
    java_options = _driver_java_options(archive, scratch_run)
    extra = " ".join(filter(None, [*jvm_options(), archive]))
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.adaptive.enabled": "false",
        "spark.driver.extraJavaOptions": java_options,
        **({"spark.executor.extraJavaOptions": extra} if extra else {}),
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        # local paths without Hadoop's .crc side files: each micro-batch writes two checkpoint
        # files (offsets/N before it, commits/N after it), and the checksummed file system
        # writes and renames a .crc beside each — 0.098 -> 0.071 s per near-empty batch
        # measured (docs/followers.md: the trade). Other schemes (hdfs:, s3a:) are unchanged.
        **RAW_LOCAL_FILES,
    }
    if not submitted:
        settings.update({"spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"],
                         "spark.pyspark.python": sys.executable,
                         "spark.pyspark.driver.python": sys.executable, **shipped})
    jars = spark_jars(jars_folder)
    if jars:
        settings["spark.jars"] = ",".join(str(p) for p in jars)
    if any(_DELTA_JAR.match(p.name) for p in jars):
        # Delta tables in Spark SQL: format("delta"), MERGE INTO delta.`path`, DESCRIBE HISTORY
        settings["spark.sql.extensions"] = "io.delta.sql.DeltaSparkSessionExtension"
        settings["spark.sql.catalog.spark_catalog"] = \
            "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    if scratch_run is not None and "spark.local.dir" not in conf:
        settings["spark.local.dir"] = str(scratch_run)
    settings.update(conf)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with stderr_through_logging():  # the JVM's log4j lines and warnings: our logging's
        spark = builder.getOrCreate()
    try:
        check_spark_version(spark.version, jars)
    except CdcError:
        spark.stop()
        raise
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def start_spark(master: str | None = None, conf: dict[str, str] | None = None,
                jars: Path | None = None, ship: bool = False, scratch: Path | None = None
                ) -> Any:
    """The SparkSession (``spark_apply/session.py``) on ``master`` (default: the embedded
    ``local[2,3]``) with the extra settings ``conf``, the connector jars in ``jars``
    (default: the jar cache's) and the driver's scratch space under ``scratch``, or a
    :class:`CdcError` with the fix."""
    try:
        return spark_session(master=master or "local[2,3]", app_name="cdc-apply", conf=conf,
                             jars_folder=jars, ship=ship, scratch=scratch)
    except ImportError as exc:
        raise CdcError(f"PySpark is not installed ({exc})",
                       "run `make setup`, or pip install -e '.[spark]'") from None
    except Exception as exc:  # noqa: BLE001 - Java missing, no memory, ...: one clear message
        first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
        raise CdcError(f"cannot start Spark: {first[:300]}",
                       "check that Java 17+ is installed (`java -version`; `make setup` "
                       "installs it) and that the machine has ~1.5 GB of free memory") from None
