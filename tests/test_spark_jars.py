"""Spark's JVM jars (Kafka source, spark-avro, delta-spark): fetched at set-up by ``cdc setup``
into the jar cache (cdc/jvm: spark.pom.xml), passed with ``spark.jars``, and of the exact Spark
release pyspark is pinned to (pyproject.toml)."""

from __future__ import annotations

import re
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cdc.errors import CdcError
from spark_apply.session import (
    SPARK_AVRO_STAND_IN,
    check_spark_version,
    jars_spark_version,
    require_spark_jars,
    spark_jars,
    spark_jars_folder,
)

ROOT = Path(__file__).resolve().parent.parent
POM = ROOT / "cdc" / "jvm" / "spark.pom.xml"
JARS_42 = ["commons-pool2-2.13.1.jar", "kafka-clients-3.9.2.jar",
           "spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-token-provider-kafka-0-10_2.13-4.2.0.jar",
           "spark-avro_2.13-4.1.1.jar", "delta-spark_4.2_2.13-4.4.0.jar"]


def pinned_pyspark() -> str:
    """The pyspark release pyproject.toml pins (``pyspark[sql]==X.Y.Z``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = [re.fullmatch(r"pyspark(?:\[\w+\])?==(\S+)", dep.replace(" ", ""))
            for extra in project["project"]["optional-dependencies"].values() for dep in extra]
    found = [m.group(1) for m in pins if m]
    assert len(found) == 1, "pyproject.toml pins pyspark exactly, once"
    return found[0]


def pom_properties() -> dict[str, str]:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    props = ET.parse(POM).getroot().find("m:properties", ns)
    assert props is not None
    return {child.tag.split("}")[1]: (child.text or "") for child in props}


def artifact(jar_name: str) -> str:
    """A jar's artifact name without its version: ``zstd-jni-1.5.7-7.jar`` -> ``zstd-jni``."""
    m = re.match(r"^(.+?)-(\d+\..*)\.jar$", jar_name)
    return m.group(1) if m else jar_name


# ----------------------------------------------------------------- no Spark needed


def test_pyproject_and_pom_pin_the_same_spark() -> None:
    props, pin = pom_properties(), pinned_pyspark()
    assert props["spark.version"] == pin
    assert props["spark.avro.version"] == SPARK_AVRO_STAND_IN.get(pin, pin)
    assert props["delta.spark.line"] == ".".join(pin.split(".")[:2])


def test_version_mismatch_names_both_versions_and_the_fix() -> None:
    check_spark_version("4.2.0", JARS_42)  # a match: no error
    check_spark_version("4.3.0", ["kafka-clients-3.9.2.jar"])  # no Spark connector jar: no check
    with pytest.raises(CdcError) as caught:
        check_spark_version("4.3.0", JARS_42)
    message = str(caught.value)
    assert "Spark 4.3.0 is running" in message
    assert "are for Spark 4.2.0" in message
    assert 'pip install "pyspark[sql]==4.2.0"' in message
    assert "cdc setup" in message


def test_delta_jar_of_another_spark_line_is_refused() -> None:
    jars = [j.replace("delta-spark_4.2_", "delta-spark_4.1_") for j in JARS_42]
    with pytest.raises(CdcError, match=r"delta-spark_4\.1_2\.13-4\.4\.0\.jar .* Spark 4\.1\.x"):
        check_spark_version("4.2.0", jars)


def test_spark_avro_must_be_the_running_release_or_its_stand_in() -> None:
    jars = [j.replace("spark-avro_2.13-4.1.1", "spark-avro_2.13-4.0.1") for j in JARS_42]
    with pytest.raises(CdcError, match=r"spark-avro_2\.13-4\.0\.1\.jar .* is not the spark-avro "
                                       r"for it, which is 4\.1\.1"):
        check_spark_version("4.2.0", jars)
    jars_43 = [j.replace("4.2.0", "4.3.0").replace("4.1.1", "4.3.0").replace("_4.2_", "_4.3_")
               for j in JARS_42]
    check_spark_version("4.3.0", jars_43)  # no stand-in: spark-avro of the running release


def test_connector_jars_of_two_spark_releases_are_refused() -> None:
    jars = [*JARS_42, "spark-token-provider-kafka-0-10_2.13-4.1.1.jar"]
    with pytest.raises(CdcError, match=r"different Spark releases \(4\.1\.1, 4\.2\.0\)"):
        jars_spark_version(jars)


def test_require_spark_jars_names_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "spark"
    assert spark_jars(missing) == []
    with pytest.raises(CdcError, match=r"is missing\n  fix: run `cdc setup` once"):
        require_spark_jars(folder=missing)
    missing.mkdir()
    for name in JARS_42:
        if not name.startswith("delta-spark"):
            (missing / name).touch()
    assert len(require_spark_jars("kafka", "avro", folder=missing)) == 5
    with pytest.raises(CdcError, match="has no jar for delta"):
        require_spark_jars(folder=missing)


def test_the_drivers_scratch_of_a_killed_run_is_removed_at_the_next_start(
        tmp_path: Path) -> None:
    """``cdc apply`` gives Spark's driver a scratch folder per process (``spark.local.dir``):
    a SIGKILLed run leaves its folder (block files, the shipped archive: a gigabyte), and the
    next start removes the folders of processes that no longer run — not a live one's."""
    import os
    import subprocess
    import sys

    from spark_apply.session import scratch_dir

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for pid in (dead.pid, alive.pid):
            (tmp_path / f"run-{pid}" / "blockmgr-1").mkdir(parents=True)
            (tmp_path / f"run-{pid}" / "blockmgr-1" / "shuffle.data").write_bytes(b"x" * 1000)
        (tmp_path / "notes").mkdir()  # not a run folder: left alone
        mine = scratch_dir(tmp_path)
        assert mine == tmp_path / f"run-{os.getpid()}" and mine.is_dir()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [f"run-{alive.pid}", f"run-{os.getpid()}", "notes"])
    finally:
        alive.kill()
        alive.wait()


def test_fetched_jars_duplicate_none_of_pysparks() -> None:
    """A jar pyspark ships (Scala, Jackson, Hadoop, Parquet, log4j, ...) at a second version
    on the classpath is a conflict: the pom excludes them."""
    pyspark = pytest.importorskip("pyspark")
    ours = require_spark_jars()
    shipped = {artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    assert not sorted(p.name for p in ours if artifact(p.name) in shipped)
    assert jars_spark_version(ours) == pinned_pyspark()
    # delta-kernel's Jackson module (pyspark has none) is of pyspark's Jackson release
    databind = next((Path(pyspark.__file__).parent / "jars").glob("jackson-databind-*.jar"))
    jdk8 = [p.name for p in ours if artifact(p.name) == "jackson-datatype-jdk8"]
    assert jdk8 == [databind.name.replace("jackson-databind", "jackson-datatype-jdk8")]


# ------------------------------------------------------------------------ real Spark


def test_session_runs_the_pinned_spark_with_the_jars(spark) -> None:  # type: ignore[no-untyped-def]
    assert spark.version == pinned_pyspark()
    listed = spark.conf.get("spark.jars").split(",")
    assert listed == [str(p) for p in spark_jars()]
    names = [Path(p).name for p in listed]
    assert all(Path(p).is_absolute() and Path(p).parent == spark_jars_folder() for p in listed)
    for prefix in ("spark-sql-kafka-0-10_2.13-", "spark-avro_2.13-", "delta-spark_"):
        assert any(n.startswith(prefix) for n in names), prefix
    assert "spark.jars.packages" not in dict(spark.sparkContext.getConf().getAll())


def test_avro_round_trips_in_the_jvm(spark) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro, to_avro

    schema = ('{"type":"record","name":"r","fields":[{"name":"id","type":"long"},'
              '{"name":"name","type":["null","string"]}]}')
    df = spark.createDataFrame([(1, "a"), (2, None)], "id long, name string")
    encoded = df.select(to_avro(F.struct("id", "name"), schema).alias("v"))
    decoded = encoded.select(from_avro("v", schema).alias("r")).select("r.*")
    assert sorted(tuple(r) for r in decoded.collect()) == [(1, "a"), (2, None)]


def test_kafka_source_and_delta_are_found(spark) -> None:  # type: ignore[no-untyped-def]
    jvm = spark.sparkContext._jvm
    # the class loader spark.jars were added to (the context one, not the JVM's system one)
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    for name in ("org.apache.spark.sql.kafka010.KafkaSourceProvider",
                 "io.delta.sql.DeltaSparkSessionExtension",
                 "org.apache.spark.sql.delta.sources.DeltaDataSource"):
        jvm.java.lang.Class.forName(name, False, loader)
    # planning finds the source, then wants its options: no broker is contacted
    with pytest.raises(Exception) as caught:
        spark.read.format("kafka").load()
    assert "Failed to find data source" not in str(caught.value)
    assert "subscribe" in str(caught.value)


def test_delta_tables_are_readable_and_writable_both_ways(  # type: ignore[no-untyped-def]
        spark, tmp_path: Path) -> None:
    """A table the Delta follower wrote (delta-rs) is read by Spark with delta-spark, a MERGE by
    delta-spark is seen by the follower, and the follower keeps writing the table after it."""
    from cdc.sink import Change
    from sinks.delta import DeltaSink, table_dir

    topic = "shop.public.t"

    def change(key: int, seq: int, v: int | None) -> Change:
        return Change(topic, "shop", "public.t", f'{{"id":{key}}}', seq.to_bytes(8, "big"),
                      None if v is None else {"id": key, "v": v}, "u" if v is not None else "d")

    sink = DeltaSink("wh", tmp_path, tables={}, buckets=4)
    sink.apply([change(k, 1, k * 10) for k in range(1, 6)])
    path = str(table_dir(tmp_path, topic))
    live = spark.read.format("delta").load(path).where("NOT _cdc_deleted")
    assert sorted((r["id"], r["v"]) for r in live.collect()) == [(k, k * 10) for k in range(1, 6)]
    # delta-spark writes the same table: a gated upsert of key 2, as the follower would
    spark.sql(f"""MERGE INTO delta.`{path}` t
        USING (SELECT '{{"id":2}}' AS _cdc_key, '{(5).to_bytes(8, "big").hex()}' AS p) s
        ON t._cdc_key = s._cdc_key
        WHEN MATCHED AND s.p > t._cdc_position THEN UPDATE SET v = 99, _cdc_position = s.p""")
    sink.refresh()
    assert sink.read(topic, ['{"id":2}'])['{"id":2}']["v"] == "99"
    stats = sink.apply([change(2, 4, 1), change(3, 6, 33), change(4, 7, None)])
    assert (stats.written, stats.deleted, stats.skipped) == (1, 1, 1)  # seq 4 < 5: gated
    rows = {r["id"]: r["v"] for r in spark.read.format("delta").load(path)
            .where("NOT _cdc_deleted").collect()}
    assert rows == {1: 10, 2: 99, 3: 33, 5: 50}


def test_the_jar_cache_is_the_users_and_keyed_by_the_pom(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc import jvm

    monkeypatch.delenv(jvm.JARS_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    folder = jvm.jars_dir("spark")
    assert folder.parent == tmp_path / "xdg" / "cdc" / "jars"
    assert re.fullmatch(r"spark-[0-9a-f]{12}", folder.name) and not jvm.jars_ready(folder)
    monkeypatch.setenv(jvm.JARS_ENV, str(tmp_path / "mine"))
    assert jvm.jars_dir("kafka").parent == tmp_path / "mine"
    other = tmp_path / "other.pom.xml"  # another release's pom: a folder of its own
    other.write_text(POM.read_text().replace("<spark.version>", "<spark.version>9"))
    monkeypatch.setitem(jvm.POMS, "spark", other)
    assert jvm.jars_dir("spark").name.startswith("spark-")
    assert jvm.jars_dir("spark").name != folder.name


def test_setup_without_maven_names_the_fix(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "CDC_JARS_DIR": str(tmp_path / "jars"), "PATH": "/nonexistent"}
    result = subprocess.run([sys.executable, "-m", "cdc_app", "setup", "--only", "kafka"],
                            capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert result.returncode != 0
    assert "Maven (mvn) is not installed" in result.stderr and "apt-get install maven" in \
        result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "jars").exists() or not any((tmp_path / "jars").iterdir())
