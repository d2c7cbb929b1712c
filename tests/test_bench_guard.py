"""The speed guard (``bench/guard.py``, ``make bench-guard``): its verdicts, and that it fails
on a planted slowdown -- the compiled kernels switched off (``CDC_PURE_PYTHON=1``), which is
what issue 42's regression amounted to for the MariaDB rows kernel.

The guard's own measurements are not run here (CI runs ``make bench-guard`` after the suite,
alone on the machine); the planted run measures one in-process path on a small log: a few
seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import guard

PROJECT = Path(__file__).resolve().parent.parent


def test_the_committed_baseline_covers_every_path_with_a_margin() -> None:
    baseline = json.loads(guard.BASELINE.read_text())
    assert set(baseline["paths"]) == set(guard.PATHS)
    assert 0 < baseline["margin"] < 0.5
    for path, entry in baseline["paths"].items():
        assert entry["ratio"] > 0, path
        assert len(entry["runs"]) >= 5, f"{path}: a baseline is the median of at least 5 runs"


def test_a_ratio_below_the_margin_fails_and_one_within_passes() -> None:
    baseline = {"margin": 0.3, "paths": {"mysql_stream": {"ratio": 0.40},
                                         "log_append": {"ratio": 0.20}}}
    verdicts = {v.path: v for v in guard.judge({"mysql_stream": 0.27, "log_append": 0.15},
                                               baseline)}
    assert verdicts["mysql_stream"].failed  # 0.27 < 0.40 x 0.7 = 0.28
    assert not verdicts["log_append"].failed  # 0.15 >= 0.20 x 0.7 = 0.14
    text = guard.failure_text(verdicts["mysql_stream"], 0.3)
    assert "mysql_stream: ratio 0.270, baseline 0.400" in text
    assert "32% slower" in text
    assert "bench/guard.py --only mysql_stream" in text
    assert "make bench-mysql" in text


def test_a_path_without_a_baseline_is_never_judged_passed() -> None:
    (verdict,) = guard.judge({"pg_stream": 0.01}, {"margin": 0.3, "paths": {}})
    assert verdict.baseline is None and verdict.floor is None


def _guard(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROJECT / "bench" / "guard.py"), "--only", "log_append",
         "--records", "30000", "--json", str(tmp_path / "figures.json"), *args],
        cwd=PROJECT, env={**os.environ, "COLUMNS": "200", **env}, capture_output=True,
        text=True, timeout=300)


def test_the_guard_fails_on_a_planted_slowdown_naming_the_path(tmp_path: Path) -> None:
    """The baseline is this machine's, measured now with the compiled kernels (the committed
    one's floor sits within noise of the pure-Python ratio on a loaded machine: 0.121 against
    0.114 once); then the kernels are switched off."""
    measured = _guard(tmp_path, {})
    (normal,) = json.loads(measured.stdout.strip().splitlines()[-1])["verdicts"]
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"margin": 0.3, "paths": {
        "log_append": {"ratio": normal["ratio"]}}}))
    result = _guard(tmp_path, {"CDC_PURE_PYTHON": "1"}, "--baseline", str(baseline))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "speed guard FAILED log_append: ratio" in result.stdout
    assert "Reproduce: .venv/bin/python bench/guard.py --only log_append" in result.stdout
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    (verdict,) = figures["verdicts"]
    assert verdict["path"] == "log_append" and verdict["failed"]


def test_the_guard_refuses_to_pass_without_a_baseline(tmp_path: Path) -> None:
    result = _guard(tmp_path, {}, "--baseline", str(tmp_path / "none.json"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no baseline for log_append" in result.stdout
    assert "--write-baseline" in result.stdout
