"""The preflight of ``cdc apply``'s Spark (the contract of :mod:`cdc.preflight`): PySpark
installed, Java found, the connector jars fetched, the master reached. Light: it imports neither
PySpark nor a JVM, and starts nothing."""

from __future__ import annotations

import importlib.metadata
import socket

from cdc.config import Config
from cdc.errors import ConfigError
from cdc.jvm import SETUP_FIX, find_java, jars_dir, jars_ready
from cdc.preflight import Part, Step, Warn

#: seconds to wait for a standalone master's port
MASTER_TIMEOUT = 5.0


def spark_part(config: Config) -> Part:
    spark = config.spark

    def pyspark() -> str:
        try:
            return f"PySpark {importlib.metadata.version('pyspark')}"
        except importlib.metadata.PackageNotFoundError:
            raise ConfigError("PySpark is not installed, and `cdc apply` runs on Spark",
                              "install the project with its spark extra (pip install "
                              "'cdc[spark]'; `make setup` does)") from None

    def java() -> str:
        found = find_java()
        if found is None:
            raise ConfigError("no Java found ($JAVA_HOME/bin/java, or java on PATH): Spark "
                              "runs on Java 17", "install a Java 17 runtime (e.g. apt-get install "
                              "openjdk-17-jre-headless) or set JAVA_HOME")
        return found

    def jars() -> str:
        if spark.jars_dir is not None:
            folder = config.resolve(spark.jars_dir)
            if not any(folder.glob("*.jar")):
                raise ConfigError(f"spark.jars_dir {folder} holds no jars",
                                  "point it at a folder of Spark's connector jars, or remove it "
                                  "(the jar cache is used then)")
            return f"{folder}"
        folder = jars_dir("spark")
        if not jars_ready(folder):
            raise ConfigError(f"Spark's connector jars are not fetched yet ({folder})", SETUP_FIX)
        return f"fetched ({folder})"

    def master() -> str:
        url = spark.master
        if url.startswith("local"):
            return f"{url}: Spark runs inside `cdc apply`, on this machine"
        if not url.startswith("spark://"):
            return Warn(f"{url}: not checked (preflight reaches local and spark:// masters)")
        for where in url[len("spark://"):].split(","):
            host, _, port = where.rpartition(":")
            try:
                socket.create_connection((host, int(port)), timeout=MASTER_TIMEOUT).close()
            except (OSError, ValueError) as exc:
                raise ConfigError(f"the Spark master at {where} does not accept connections "
                                  f"({exc})", "start it (sbin/start-master.sh), or correct "
                                  "spark.master (spark://host:7077)") from None
        return f"{url} accepts connections"

    return Part("spark", [Step("pyspark", pyspark), Step("java", java), Step("jars", jars),
                          Step("master", master, MASTER_TIMEOUT * 2 + 1)])
