"""The project as a user gets it: a wheel built from this checkout (``pip wheel .``) installed
into a fresh virtualenv outside it, once per test run and shared by the xdist workers.

The wheel and the virtualenv go under ``~/.cache/cdc/test-wheels/wheel-<digest>`` (outside the
checkout; ``$XDG_CACHE_HOME`` is honoured), where the digest is of every file the wheel is built
from: the first worker to ask builds them under a lock, the others wait and reuse them, a later
run of unchanged sources reuses them too; building one removes the others no run is using.
Dependencies come from pip's cache (the set-up already downloaded them). The virtualenv has the
``spark`` extra, so it runs ``cdc demo`` and ``cdc apply``; nothing of the checkout is on its
path: commands run with ``PYTHONPATH`` removed and a working directory outside the checkout.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: what a wheel is built from
SOURCES = ("pyproject.toml", "setup.py", "cdc", "cdc_app", "connectors", "sinks",
           "spark_apply", "views")
SUFFIXES = {".py", ".pyx", ".pxd", ".h", ".avsc", ".xml", ".properties", ".toml", ".typed"}


def sources_digest() -> str:
    """A digest of every file the wheel is built from (names and contents)."""
    digest = hashlib.sha256()
    for name in SOURCES:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(
            p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        for file in files:
            digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Installed:
    """The wheel and the virtualenv it is installed in."""

    wheel: Path
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def cdc(self) -> Path:
        return self.venv / "bin" / "cdc"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a user's shell: no PYTHONPATH, the venv first on PATH."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return {**env, **extra}

    def run(self, *args: str, cwd: Path, timeout: float = 300,
            **extra: str) -> subprocess.CompletedProcess[str]:
        """``cdc ARGS`` from the installed package, in ``cwd`` (outside the checkout)."""
        return subprocess.run([str(self.cdc), *args], cwd=cwd, env=self.env(**extra),
                              capture_output=True, text=True, timeout=timeout)


def _pip(python: Path, *args: str) -> None:
    result = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "-q",
                             *args], capture_output=True, text=True, timeout=1200,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if result.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args)} failed:\n{result.stdout}{result.stderr}")


def installed() -> Installed:
    """The wheel of this checkout, installed with the ``spark`` extra in a fresh virtualenv
    (built by the first caller of the run, reused by the rest)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home = cache / "cdc" / "test-wheels" / f"wheel-{sources_digest()}"
    home.mkdir(parents=True, exist_ok=True)
    lock = os.open(home / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others wait here
    done = home / "installed"
    if not done.exists():
        _build(home)
        done.write_text("ok\n")
        _prune(home)
    fcntl.flock(lock, fcntl.LOCK_SH)  # held while this process runs: _prune leaves it alone
    _HELD.append(lock)
    wheel = next((home / "wheels").glob("cdc-*.whl"))
    return Installed(wheel, home / "venv")


#: the lock files of the builds this process uses (kept open: a shared lock marks them in use)
_HELD: list[int] = []


def _prune(home: Path) -> None:
    """Remove the other builds no process holds a lock on (1-2 GB each)."""
    for other in home.parent.glob("wheel-*"):
        if other == home:
            continue
        try:
            lock = os.open(other / ".lock", os.O_RDWR | os.O_CREAT)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(other, ignore_errors=True)
        except OSError:
            pass  # in use by another run
        finally:
            os.close(lock)


def _build(home: Path) -> None:
    wheels = home / "wheels"
    for stale in wheels.glob("*.whl"):
        stale.unlink()
    _pip(Path(sys.executable), "wheel", "--no-deps", "-w", str(wheels), str(ROOT))
    wheel = next(wheels.glob("cdc-*.whl"))
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True,
                   timeout=300)
    _pip(venv / "bin" / "python", "install", f"{wheel}[spark]")
