"""``cdc setup``: fetch the JVM jars once, from Maven, into the jar cache (:mod:`cdc.jvm`).

Each set is its pom's dependencies (``mvn dependency:copy-dependencies``: Maven resolves them,
transitive ones included, through its own repository ``~/.m2``), copied into a fresh folder
that is renamed into place and marked complete last, so an interrupted fetch leaves nothing
half-done behind. A set already complete is left alone; nothing else ever fetches.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path

from cdc.errors import CdcError
from cdc.jvm import APP, COMPLETE, PLUGINS, POMS, jars_dir, jars_ready

#: extra Maven arguments per set: Spark itself is `provided` in its pom (pyspark ships it)
MAVEN_ARGS = {"spark": ["-DincludeScope=runtime"], "kafka": [], "connect": [], "apicurio": []}
#: what each set is for, as `cdc setup` says it
PURPOSE = {"spark": "Spark's Kafka source, spark-avro and delta-spark (cdc apply)",
           "kafka": "the Kafka broker (the throwaway brokers of the demo and the tests)",
           "connect": "Kafka Connect and Debezium's JDBC sink (the interoperability tests)",
           "apicurio": "Apicurio Registry (the interoperability tests)"}


def fetch_jars(names: Sequence[str], say: Callable[[str], None]) -> dict[str, Path]:
    """Fetch each jar set of ``names`` that is not complete yet; where each one is."""
    done = {}
    for name in names:
        folder = jars_dir(name)
        if jars_ready(folder):
            say(f"{name}: {folder} is ready")
        else:
            say(f"{name}: fetching {PURPOSE[name]} with Maven into {folder} ...")
            _fetch(name, folder)
            say(f"{name}: {len(list(folder.glob('**/*.jar')))} jars in {folder}")
        done[name] = folder
    return done


def _fetch(name: str, folder: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise CdcError("Maven (mvn) is not installed: `cdc setup` fetches the JVM jars with it",
                       "install Maven (Debian: apt-get install maven) and a JDK, then run "
                       "`cdc setup` again")
    folder.parent.mkdir(parents=True, exist_ok=True)
    temporary = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    command = [mvn, "-q", "-B", "dependency:copy-dependencies",
               f"-DoutputDirectory={temporary}", *MAVEN_ARGS[name], "-f", str(POMS[name])]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        shutil.rmtree(temporary, ignore_errors=True)
        output = (result.stdout + result.stderr).strip()[-3000:]
        raise CdcError(f"Maven could not fetch the {name} jars (it needs Maven Central or a "
                       f"mirror in ~/.m2/settings.xml):\n{output}",
                       "check the network or the Maven settings, then run `cdc setup` again")
    for pattern, into in (("*-plugin.tar.gz", PLUGINS), ("*-all.tar.gz", APP)):
        for archive in sorted(temporary.glob(pattern)):  # Connect plugins, a Quarkus build
            with tarfile.open(archive) as packed:
                packed.extractall(temporary / into, filter="data")
            archive.unlink()
    (temporary / COMPLETE).write_text(POMS[name].name + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(temporary, folder)
