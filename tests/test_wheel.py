"""The wheel, installed as a user installs it: into a fresh virtualenv outside the checkout, run
from a directory elsewhere with no PYTHONPATH (``tests/wheelkit.py``). It holds the compiled
fast paths and every data file; the commands and the live demo work from it."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.pgkit import prober_rows
from tests.wheelkit import ROOT, Installed, installed

#: building the wheel and its virtualenv takes a minute or two (once per run): not in test-quick
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def package() -> Installed:
    return installed()


def test_the_wheel_holds_the_fast_paths_and_every_data_file(package: Installed) -> None:
    names = set(zipfile.ZipFile(package.wheel).namelist())
    for kernel in ("cdc/_fast", "cdc/log/_fast", "connectors/postgres/_fast",
                   "connectors/mysql/_fast"):
        assert any(n.startswith(kernel) and n.endswith(".so") for n in names), kernel
    wanted = {f"cdc/schemas/{p.name}" for p in (ROOT / "cdc" / "schemas").glob("*.avsc")}
    wanted |= {"cdc/jvm/spark.pom.xml", "cdc/jvm/kafka.pom.xml", "cdc/jvm/connect.pom.xml",
               "cdc/jvm/apicurio.pom.xml",
               "spark_apply/log4j2.properties", "cdc/py.typed"}
    assert wanted <= names, sorted(wanted - names)
    assert package.wheel.name.endswith("-linux_x86_64.whl")  # a platform wheel


def test_the_installed_package_runs_outside_the_checkout(package: Installed,
                                                         tmp_path: Path) -> None:
    probe = package.run("--version", cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    assert "cdc._fast: compiled" in probe.stdout and "missing" not in probe.stdout
    where = subprocess.run(
        [str(package.python), "-c", "import cdc, sinks; print(cdc.__file__, sinks.__file__)"],
        cwd=tmp_path, env=package.env(), capture_output=True, text=True, timeout=60)
    assert str(package.venv) in where.stdout and str(ROOT) not in where.stdout, where.stdout
    (tmp_path / "cdc.yaml").write_text(
        "sources:\n  - {name: shop, kind: postgres, dsn: 'postgresql://u:secret@h/db',\n"
        "     tables: [public.orders]}\n"
        "followers:\n  cache: {kind: redis, url: 'redis://127.0.0.1:1/0'}\n")
    checked = package.run("check-config", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "source shop (postgres)" in checked.stdout and "secret" not in checked.stdout
    demo = package.run("demo", "--log-only", "--dir", str(tmp_path / "demo"), "--rows", "2000",
                       cwd=tmp_path)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "equal" in demo.stdout and "DIFFERENT" not in demo.stdout


@pytest.mark.servers  # starts its own servers and Spark
def test_the_live_demo_runs_from_the_wheel(package: Installed, tmp_path: Path) -> None:
    """capture -> log -> Spark -> Redis, Delta, search, SQL, a view; verify each; the summary
    (2-4 min): from the installed package, outside the checkout."""
    result = package.run("demo", "--dir", str(tmp_path / "demo"), "--seconds", "2",
                         cwd=tmp_path, timeout=400)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "follower equals the leader" in result.stdout
    assert ("Redis, Delta, the search index, the SQL follower and the view "
            "revenue_by_customer equal PostgreSQL") in result.stdout
    assert result.stdout.count("view revenue_by_customer in") >= 2  # both followers verified
    summary = result.stdout[result.stdout.index("summary: PostgreSQL"):]
    assert "public.orders" in summary and "public.customers" in summary
    probes = prober_rows(result.stdout)  # the prober runs from the installed package too
    assert set(probes) == {"cache", "warehouse", "search", "reporting"}, summary
    assert all(seen > 0 and unseen == 0 for seen, unseen in probes.values()), probes


def test_the_sdist_holds_what_the_kernels_are_built_from(tmp_path: Path) -> None:
    """A wheel built from the source distribution compiles the same fast paths: the sdist holds
    every ``.pyx`` of the checkout and what they cimport or include (MANIFEST.in)."""
    import sys
    import tarfile

    (tmp_path / "egg").mkdir()
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base",
                    str(tmp_path / "egg"), "sdist", "-d", str(tmp_path / "dist")],
                   cwd=ROOT, check=True, capture_output=True)
    [sdist] = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        held = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    tracked = subprocess.run(["git", "ls-files", "*.pyx", "*.pxd", "*.h"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    assert len([name for name in tracked if name.endswith(".pyx")]) >= 4
    assert set(tracked) | {"setup.py"} <= held, sorted(set(tracked) - held)
