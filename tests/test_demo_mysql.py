"""``cdc demo --source mysql``: a throwaway MariaDB -> capture -> log -> Spark -> Redis, Delta,
search; verify each; the summary (about 1 min)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pgkit import cdc, output, prober_rows

pytestmark = pytest.mark.timeout(420)


@pytest.mark.servers  # starts its own servers or Spark
def test_demo_with_mariadb_captures_a_live_workload(tmp_path: Path) -> None:
    result = cdc("demo", "--source", "mysql", "--dir", str(tmp_path / "demo"), "--seconds", "3",
                 timeout=400)
    assert result.returncode == 0, output(result)
    assert "throwaway MariaDB on 127.0.0.1:" in result.stdout
    for follower in ("cache", "warehouse", "search", "reporting"):
        assert f"verify: follower {follower}" in result.stdout, output(result)
    assert result.stdout.count("follower equals the leader") == 4, output(result)
    assert ("Redis, Delta, the search index, the SQL follower and the view "
            "revenue_by_customer equal MariaDB") in result.stdout
    assert result.stdout.count("view revenue_by_customer in") >= 2  # both followers verified
    summary = result.stdout[result.stdout.index("summary: MariaDB"):]
    assert "shop.orders" in summary and "shop.customers" in summary
    assert "differ" not in summary
    probes = prober_rows(result.stdout)  # the latency prober saw every probe in every follower
    assert set(probes) == {"cache", "warehouse", "search", "reporting"}, summary
    assert all(seen > 0 and unseen == 0 for seen, unseen in probes.values()), probes
