"""The Prometheus alert rules and the Grafana dashboard in deploy/monitoring: promtool checks the
rules and runs their unit tests (one per alert), and every metric they name is one cdc exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from cdc.config import parse_config
from cdc_app.metrics import ApplyMetrics, CaptureMetrics

MONITORING = Path(__file__).resolve().parent.parent / "deploy" / "monitoring"
RULES = MONITORING / "cdc-alerts.yaml"
DASHBOARD = MONITORING / "cdc-dashboard.json"
_METRIC = re.compile(r"\bcdc_[a-z_]+\b")


def _promtool(*args: str) -> str:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make setup` installs Debian's prometheus package"
    result = subprocess.run([promtool, *args], capture_output=True, text=True, cwd=MONITORING,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _exported() -> set[str]:
    """Every series name the capture's and apply's registries can export."""
    config = parse_config({"sources": [{"name": "shop", "kind": "postgres",
                                        "dsn": "postgresql://u@h/d", "tables": ["public.t"]}],
                           "followers": {"cache": {"kind": "redis",
                                                   "url": "redis://127.0.0.1:1/0"}}}, Path("/"))
    registry = CollectorRegistry()
    CaptureMetrics(config, config.sources, registry)
    apply = ApplyMetrics(config, ["cache"], lambda _: None, CollectorRegistry())
    names = set()
    for family in [*registry.collect(), *apply.registry.collect()]:
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(
            family.type, ("",))
        names.update(family.name + suffix for suffix in suffixes)
    return names


def test_the_alert_rules_pass_promtool_and_their_unit_tests() -> None:
    assert "SUCCESS: 9 rules found" in _promtool("check", "rules", RULES.name)
    tested = yaml.safe_load((MONITORING / "cdc-alerts.test.yaml").read_text())
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"]
              for rule in group["rules"]}
    fired = {case["alertname"] for test in tested["tests"] for case in test["alert_rule_test"]
             if case.get("exp_alerts")}
    assert fired == alerts  # a unit test that fires each alert
    assert "SUCCESS" in _promtool("test", "rules", "cdc-alerts.test.yaml")


def test_rules_and_dashboard_name_only_metrics_cdc_exports() -> None:
    exported = _exported()
    rules = yaml.safe_load(RULES.read_text())
    used = {name for group in rules["groups"] for rule in group["rules"]
            for name in _METRIC.findall(rule["expr"])}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert len(exprs) >= 20
    used |= {name for expr in exprs for name in _METRIC.findall(expr)}
    assert used and not used - exported, used - exported
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_incremental_snapshot_notifications_become_metrics() -> None:
    config = parse_config({"sources": [{"name": "shop", "kind": "postgres",
                                        "dsn": "postgresql://u@h/d", "tables": ["public.t"]}]},
                          Path("/"))
    metrics = CaptureMetrics(config, config.sources)
    sample = metrics.registry.get_sample_value
    for event in ("started", "failed", "completed"):
        metrics.snapshot_event("shop", event, "" if event == "completed" else "public.t")
    assert sample("cdc_snapshot_failed", {"source": "shop", "table": "public.t"}) == 1
    assert sample("cdc_snapshot_events_total", {"source": "shop", "event": "failed"}) == 1
    metrics.snapshot_event("shop", "started", "public.t")  # asked again
    assert sample("cdc_snapshot_failed", {"source": "shop", "table": "public.t"}) == 0
    assert sample("cdc_snapshot_events_total", {"source": "shop", "event": "started"}) == 2
