"""The layers of pyproject.toml's [tool.importlinter] hold (the core imports no connector, sink,
Spark job or driver; connectors are rooms of their own), and the checker does catch a breach."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_every_layer_contract_is_kept() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" in result.stdout and " 0 broken" in result.stdout


def test_a_core_module_importing_a_connector_breaks_the_contract(tmp_path: Path) -> None:
    copy = tmp_path / "tree"
    for name in ("cdc", "connectors", "sinks", "spark_apply", "views"):
        shutil.copytree(ROOT / name, copy / name,
                        ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    status = copy / "cdc" / "status.py"
    status.write_text(status.read_text() + "\nfrom connectors.postgres import catalog  # noqa\n")
    result = subprocess.run([str(LINT), "--no-cache"], cwd=copy, capture_output=True, text=True,
                            timeout=300, env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"})
    assert result.returncode != 0
    assert "cdc.status -> connectors.postgres.catalog" in result.stdout, result.stdout
