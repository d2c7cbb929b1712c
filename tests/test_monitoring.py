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


# ------------------------------------------------------------------------- systemd units

SYSTEMD = MONITORING.parent / "systemd"


def _unit(name: str) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in (SYSTEMD / name).read_text().splitlines():
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        elif "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            current.setdefault(key, []).append(value)
    return sections


def test_the_systemd_units_verify_and_stop_gracefully(tmp_path: Path) -> None:
    """``systemd-analyze verify`` accepts them (with this installation's cdc as ExecStart);
    SIGTERM drains within the stop timeout; apply's JVM is not killed under its last batch."""
    from spark_apply.jobs import ApplyJob

    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: `make setup` installs Debian's systemd package"
    cdc = Path(shutil.which("cdc") or Path(__file__).parents[1] / ".venv" / "bin" / "cdc")
    grace = ApplyJob.stop_queries.__defaults__[0]  # type: ignore[index]
    for name, command in (("cdc-capture.service", "capture"), ("cdc-apply.service", "apply")):
        unit = _unit(name)
        service = unit["Service"]
        assert service["ExecStart"][0].split()[1] == command
        assert service["KillSignal"] == ["SIGTERM"] and service["Restart"] == ["on-failure"]
        assert "CDC_CONFIG=/etc/cdc/cdc.yaml" in service["Environment"]
        assert unit["Unit"]["StartLimitBurst"] == ["5"]
        copy = tmp_path / name
        copy.write_text((SYSTEMD / name).read_text().replace("/opt/cdc/.venv/bin/cdc",
                                                             str(cdc)))
        result = subprocess.run([analyze, "verify", "--man=no", str(copy)],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and not result.stderr.strip(), result.stderr
    apply = _unit("cdc-apply.service")["Service"]
    assert apply["KillMode"] == ["mixed"]
    assert int(apply["TimeoutStopSec"][0]) > grace
