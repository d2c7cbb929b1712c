"""``cdc demo --source mysql``: a throwaway MariaDB -> capture -> log -> Spark -> Redis, Delta,
search; verify each; the summary (about 1 min)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pgkit import cdc, output

pytestmark = pytest.mark.timeout(420)


def test_demo_with_mariadb_captures_a_live_workload(tmp_path: Path) -> None:
    result = cdc("demo", "--source", "mysql", "--dir", str(tmp_path / "demo"), "--seconds", "3",
                 timeout=400)
    assert result.returncode == 0, output(result)
    assert "throwaway MariaDB on 127.0.0.1:" in result.stdout
    for follower in ("cache", "warehouse", "search"):
        assert f"verify: follower {follower}" in result.stdout, output(result)
    assert result.stdout.count("follower equals the leader") == 3, output(result)
    assert "Redis, Delta and the search index equal MariaDB" in result.stdout
    summary = result.stdout[result.stdout.index("summary: MariaDB"):]
    assert "shop.orders" in summary and "shop.customers" in summary
    assert "differ" not in summary
