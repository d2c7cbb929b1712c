"""``docker/`` is checked by reading it (no container engine runs here): the servers of
``compose.yaml`` have exactly the settings the connectors enforce at start (the same lists:
``connectors/*/requirements.py``), the capture users get what the connectors check for, the cdc
services run bootstrap, capture and apply from the image the Dockerfile builds from the wheel,
and Kafka advertises an address the host can reach."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from cdc.config import parse_config
from connectors.mysql.requirements import PRIVILEGES
from connectors.mysql.requirements import REQUIRED as MYSQL_REQUIRED
from connectors.postgres.requirements import REQUIRED as POSTGRES_REQUIRED
from connectors.postgres.requirements import ROLE_ATTRIBUTE

DOCKER = Path(__file__).resolve().parent.parent / "docker"


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((DOCKER / "compose.yaml").read_text()))


def _settings(command: list[str]) -> dict[str, str]:
    """``["postgres", "-c", "a=b"]`` or ``["--a-b=c", "--flag"]`` -> ``{"a_b": "c", "flag": ""}``
    (names with underscores, lower case)."""
    found: dict[str, str] = {}
    for index, word in enumerate(command):
        text = command[index + 1] if word == "-c" else word if word.startswith("--") else None
        if text is None:
            continue
        name, _, value = text.lstrip("-").partition("=")
        found[name.replace("-", "_").lower()] = value
    return found


def test_postgres_has_every_setting_the_connector_requires() -> None:
    service = compose()["services"]["postgres"]
    settings = _settings(service["command"])
    for name, wanted, *_ in POSTGRES_REQUIRED:
        assert settings.get(name) == wanted, (name, settings)
    assert int(settings["max_replication_slots"]) >= 1 and int(settings["max_wal_senders"]) >= 1
    script = (DOCKER / "postgres-shop.psql").read_text()
    assert re.search(rf"CREATE ROLE cdc LOGIN {ROLE_ATTRIBUTE}\b", script)
    mounted = " ".join(service["volumes"])
    assert "postgres-init.sh" in mounted and "postgres-shop.psql" in mounted


def test_mariadb_has_every_setting_the_connector_requires() -> None:
    service = compose()["services"]["mariadb"]
    settings = _settings(service["command"])
    for name, wanted, *_ in MYSQL_REQUIRED:
        if name == "log_bin":  # ON when the option is given, with or without a base name
            assert name in settings, settings
        else:
            assert settings.get(name, "").upper() == wanted, (name, settings)
    grants = (DOCKER / "mariadb-init.sql").read_text().upper()
    granted = re.search(r"GRANT (.*?) ON \*\.\* TO 'CDC'", grants)
    assert granted, grants
    for _, aliases in PRIVILEGES:
        assert any(alias in granted.group(1) for alias in aliases), aliases
    assert service["environment"]["MARIADB_USER"] == "cdc"


def test_the_cdc_services_bootstrap_capture_and_apply_from_the_wheel_image() -> None:
    services = compose()["services"]
    for name in ("bootstrap", "capture", "apply"):
        assert services[name]["build"]["dockerfile"] == "docker/Dockerfile", name
    assert "cdc bootstrap" in " ".join(services["bootstrap"]["entrypoint"])
    assert services["capture"]["command"][0] == "capture"
    assert services["apply"]["command"][:3] == ["apply", "--follower", "cache"]
    assert not any("log stats" in str(s.get("command", "")) for s in services.values())
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "pip wheel" in dockerfile and "openjdk-17-jre-headless" in dockerfile
    assert "cdc setup" in dockerfile and "[spark]" in dockerfile
    for config in ("cdc.yaml", "cdc-kafka.yaml"):
        parsed = parse_config(yaml.safe_load((DOCKER / config).read_text()), DOCKER)
        assert {s.kind for s in parsed.sources} == {"postgres", "mysql"}
        assert "cache" in parsed.followers


def test_kafka_advertises_an_address_the_host_reaches() -> None:
    kafka = compose()["services"]["kafka"]
    environment = kafka["environment"]
    advertised = dict(item.split("://", 1)
                      for item in environment["KAFKA_ADVERTISED_LISTENERS"].split(","))
    published = {port.split(":")[0]: port.split(":")[1] for port in kafka["ports"]}
    host_side = [address for address in advertised.values() if address.startswith("localhost:")]
    assert host_side, advertised
    port = host_side[0].split(":")[1]
    assert published.get(port) == port  # the host port maps to the same container port
    listeners = environment["KAFKA_LISTENERS"]
    assert f":{port}" in listeners and "kafka:9092" in advertised.values()
