import subprocess
import sys
from pathlib import Path

import pytest

from cdc.config import load_config, parse_config, redact_dsn
from cdc.errors import ConfigError

GOOD = """
log: {backend: local, path: ./cdc-data/log, partitions: 8}
sources:
  - name: shop
    kind: postgres
    dsn: postgresql://cdc@127.0.0.1:5432/shop
    tables: [public.orders, public.customers]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cdc.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    return str(caught.value)


def test_the_documented_shape_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    assert config.log.partitions == 8
    assert config.sources[0].tables == ["public.orders", "public.customers"]
    # relative paths are resolved against the config file's directory
    assert config.log_path == (tmp_path / "cdc-data" / "log").resolve()
    assert config.log.tombstone_retention == 86400.0


def test_durations_and_sizes(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD.replace(
        "partitions: 8}", "partitions: 8, tombstone_retention: 7d, segment_bytes: 16MiB, "
        "commit_interval: 20ms}")))
    assert config.log.tombstone_retention == 7 * 86400
    assert config.log.segment_bytes == 16 * 1024**2
    assert config.log.commit_interval == pytest.approx(0.02)


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, "log:\n  path: [unclosed\nsources: []\n")
    assert "not valid YAML" in message and "line" in message and "fix:" in message


def test_unknown_key_is_named_with_a_suggestion(tmp_path: Path) -> None:
    message = error_of(tmp_path, GOOD.replace("tables:", "tabels:"))
    assert "sources[0].tabels: unknown key" in message
    assert "did you mean 'tables'" in message
    assert "sources[0].tables: Field required" in message


def test_unknown_top_level_key(tmp_path: Path) -> None:
    message = error_of(tmp_path, GOOD + "sinks: {}\n")
    assert "sinks: unknown key" in message


def test_wrong_types_and_values(tmp_path: Path) -> None:
    message = error_of(tmp_path, GOOD.replace("partitions: 8", "partitions: many")
                       .replace("kind: postgres", "kind: oracle"))
    assert "log.partitions" in message and "whole number" in message
    assert "sources[0].kind" in message and "'mysql' or 'postgres'" in message
    typo = error_of(tmp_path, GOOD.replace("kind: postgres", "kind: postgre"))
    assert "unknown source kind 'postgre'" in typo and "did you mean 'postgres'?" in typo
    assert "2 problems" in message


def test_unqualified_table_name(tmp_path: Path) -> None:
    message = error_of(tmp_path, GOOD.replace("public.customers", "customers"))
    assert "sources[0].tables" in message and "schema.table" in message


def test_quoted_table_names_are_accepted(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD.replace("public.customers",
                                                      "'\"My Schema\".\"odd.table\"'")))
    assert config.sources[0].tables[1] == '"My Schema"."odd.table"'


def test_duplicate_source_names(tmp_path: Path) -> None:
    text = GOOD + """  - name: shop
    kind: mysql
    dsn: mysql://root@127.0.0.1/shop
    tables: [shop.orders]
"""
    message = error_of(tmp_path, text)
    assert "unique" in message and "give each source its own `name:`" in message
    assert "correct the value" not in message


@pytest.mark.parametrize(("kind", "dsn", "expected"), [
    ("mysql", "postgresql://cdc:pw@db/shop", "a postgresql:// connection string for a source "
     "of another kind"),
    ("postgres", "mysql://cdc@db/shop", "a mysql:// connection string"),
    ("postgres", "jdbc:postgresql://db:5432/shop", "drop the `jdbc:` prefix"),
    ("mysql", "jdbc:mariadb://db/shop", "write it as mysql://user@host:port/database"),
])
def test_a_dsn_of_another_kind_is_refused_with_the_fix(tmp_path: Path, kind: str, dsn: str,
                                                       expected: str) -> None:
    text = GOOD.replace("kind: postgres", f"kind: {kind}").replace(
        "postgresql://cdc@127.0.0.1:5432/shop", dsn)
    message = error_of(tmp_path, text)
    assert "sources[0].dsn: " in message
    assert expected in message
    assert "pw" not in message  # the password never shows


def test_the_dsn_forms_each_kind_takes(tmp_path: Path) -> None:
    for kind, dsn in (("postgres", "postgres://cdc@db/shop"),
                      ("postgres", "host=db dbname=shop user=cdc"),
                      ("mysql", "mariadb://cdc@db:3306/shop"), ("mysql", "mysql://cdc@db/shop")):
        text = GOOD.replace("kind: postgres", f"kind: {kind}").replace(
            "postgresql://cdc@127.0.0.1:5432/shop", dsn)
        if kind == "mysql":
            text = text.replace("public.orders, public.customers", "shop.orders")
        assert load_config(write(tmp_path, text)).sources[0].dsn.reveal() == dsn


def test_bad_duration(tmp_path: Path) -> None:
    message = error_of(tmp_path, GOOD.replace("partitions: 8", "tombstone_retention: soon"))
    assert "log.tombstone_retention" in message and "duration" in message


def test_missing_file_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    config = load_config(write(tmp_path, ""))
    assert config.sources == []


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    assert "must be a mapping" in error_of(tmp_path, "- a\n- b\n")


def test_passwords_never_show(tmp_path: Path) -> None:
    secret = "s3cr3t-Pa55"
    text = GOOD.replace("cdc@127.0.0.1", f"cdc:{secret}@127.0.0.1")
    config = load_config(write(tmp_path, text))
    source = config.sources[0]
    assert source.dsn.reveal().count(secret) == 1
    for shown in (str(source.dsn), repr(source.dsn), repr(source), repr(config),
                  str(config.model_dump())):
        assert secret not in shown
    # ... nor in validation errors about the same source
    message = error_of(tmp_path, text.replace("kind: postgres", "kind: nope"))
    assert secret not in message


def test_redact_dsn_forms() -> None:
    assert redact_dsn("postgresql://u:pw@h:5432/db?sslmode=require&password=x") == (
        "postgresql://u:***@h:5432/db?sslmode=require&password=***")
    assert redact_dsn("host=h user=u password='a b' dbname=d") == (
        "host=h user=u password=*** dbname=d")
    assert redact_dsn("postgresql://u@h/db") == "postgresql://u@h/db"


def test_parse_config_directly() -> None:
    config = parse_config({"sources": []}, Path("/srv/cdc"))
    assert config.log_path == Path("/srv/cdc/cdc-data/log")


def test_the_shipped_example_configs_are_valid() -> None:
    root = Path(__file__).resolve().parent.parent
    for name in ("cdc.example.yaml", "docker/cdc.yaml", "docker/cdc-kafka.yaml"):
        config = load_config(root / name)
        assert config.sources[0].name == "shop"


def test_check_config_on_the_compose_kafka_config() -> None:
    """docker/compose.yaml's Kafka config passes `cdc check-config` (no Docker engine runs
    here: the check reads the file only)."""
    root = Path(__file__).resolve().parent.parent
    compose = (root / "docker" / "compose.yaml").read_text()
    assert "apache/kafka" in compose and "cdc-kafka.yaml" in compose
    result = subprocess.run([sys.executable, "-m", "cdc_app.cli", "check-config", "--config",
                             str(root / "docker" / "cdc-kafka.yaml")],
                            capture_output=True, text=True, cwd=root, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "log at Kafka at kafka:9092 (8 partitions)" in result.stdout


def test_a_kafka_log_needs_brokers_and_no_secrets_in_client() -> None:
    with pytest.raises(ConfigError, match="needs bootstrap_servers"):
        parse_config({"log": {"backend": "kafka"}, "sources": []}, Path("/srv"))
    with pytest.raises(ConfigError, match="use password_env") as raised:
        parse_config({"log": {"backend": "kafka", "bootstrap_servers": "b:9092",
                              "client": {"sasl.password": "hunter2"}}, "sources": []}, Path("/"))
    assert "hunter2" not in str(raised.value)


def test_topic_config_cannot_undo_compaction_or_the_tombstone_retention() -> None:
    base = {"backend": "kafka", "bootstrap_servers": "b:9092"}
    for setting in ("cleanup.policy", "delete.retention.ms"):
        with pytest.raises(ConfigError, match="always compacted") as raised:
            parse_config({"log": {**base, "topic_config": {setting: "delete"}}, "sources": []},
                         Path("/"))
        assert setting in str(raised.value)
    config = parse_config({"log": {**base, "topic_config": {"segment.ms": 1000}},
                           "sources": []}, Path("/"))
    assert config.log.topic_config == {"segment.ms": 1000}


def test_spark_section_and_master_validation(tmp_path: Path) -> None:
    config = parse_config({"spark": {"master": "spark://127.0.0.1:7077",
                                     "conf": {"spark.executor.memory": "1g"}}}, tmp_path)
    assert config.spark.master == "spark://127.0.0.1:7077"
    assert config.spark.conf == {"spark.executor.memory": "1g"}
    assert parse_config({}, tmp_path).spark.master == "local[2,3]"
    for bad, words in (({"master": "http://x"}, "not a Spark master URL"),
                       ({"conf": {"executor.memory": "1g"}}, "are not Spark settings"),
                       ({"conf": {"spark.master": "local"}}, "set the master with")):
        with pytest.raises(ConfigError, match=words):
            parse_config({"spark": bad}, tmp_path)
    (tmp_path / "cdc.yaml").write_text("{}\n")
    result = subprocess.run([sys.executable, "-m", "cdc_app.cli", "apply", "--config",
                             str(tmp_path / "cdc.yaml"), "--follower", "x", "--master", "nope"],
                            capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert result.returncode == 2, result.stderr
    assert "--master" in result.stderr and "not a Spark master URL" in result.stderr


def test_a_follower_kind_whose_sink_does_not_load_is_a_config_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc.sink import open_sink
    from sinks.search_settings import SearchFollowerConfig

    config = parse_config({"followers": {"idx": {"kind": "search", "path": str(tmp_path)}}},
                          tmp_path)
    monkeypatch.setattr(SearchFollowerConfig, "sink", "sinks.search:NoSuchSink")
    with pytest.raises(ConfigError, match="kind 'search'.*sinks.search:NoSuchSink") as raised:
        open_sink(config, "idx")
    assert "fix or uninstall the package" in str(raised.value)


def test_log_formats_and_lossy_modes_are_refused_with_the_reason() -> None:
    base = {"backend": "kafka", "bootstrap_servers": "b:9092"}
    refused = [({**base, "format": "json", "decimal_handling": "double"}, "loses digits"),
               ({**base, "time_precision": "connect"}, "loses microseconds"),
               ({**base, "time_precision": "adaptive"}, "applies to format json only"),
               ({"backend": "local", "format": "json"}, "is for backend kafka"),
               ({**base, "decimal_handling": "string"}, "applies to format json only"),
               ({**base, "format": "json", "schema_registry": {"url": "http://r:8081"}},
                "carries each schema inline")]
    for log, reason in refused:
        with pytest.raises(ConfigError, match=reason):
            parse_config({"log": log, "sources": []}, Path("/"))
    parsed = parse_config({"log": {**base, "format": "json", "decimal_handling": "string"},
                           "sources": []}, Path("/"))
    assert (parsed.log.format, parsed.log.decimal_handling) == ("json", "string")
    parsed = parse_config({"log": {**base, "format": "json", "time_precision": "adaptive"},
                           "sources": []}, Path("/"))
    assert parsed.log.time_precision == "adaptive"
    with pytest.raises(ConfigError) as raised:
        parse_config({"log": {**base, "decimal_handling": "string"}, "sources": []}, Path("/"))
    assert "fix: remove it, or set format: json" in str(raised.value)


#: a config's tail with one view ``v`` (into a SQLite follower)
ONE_VIEW = ("followers:\n  lite: {kind: sql, url: 'sqlite:///x.db'}\nviews:\n  v:\n"
            "    source: shop\n    sql: SELECT o.id FROM orders o\n    key: [id]\n"
            "    followers: [lite]\n")


def test_a_views_time_zone_is_an_iana_name(tmp_path: Path) -> None:
    view = ONE_VIEW
    assert load_config(write(tmp_path, GOOD + view)).views["v"].time_zone == "UTC"
    config = load_config(write(tmp_path, GOOD + view + "    time_zone: Europe/Berlin\n"))
    assert config.views["v"].time_zone == "Europe/Berlin"
    said = error_of(tmp_path, GOOD + view + "    time_zone: Mars/Olympus\n")
    assert "views.v.time_zone" in said and "unknown time zone 'Mars/Olympus'" in said \
        and "Europe/Berlin" in said, said


def test_a_views_memory_limit_is_an_amount_its_state_gets(tmp_path: Path) -> None:
    from views.types import set_up_state

    view = ONE_VIEW
    assert load_config(write(tmp_path, GOOD + view)).views["v"].memory_limit == "1GB"
    config = load_config(write(tmp_path, GOOD + view + "    memory_limit: 300MB\n"))
    import duckdb

    db = set_up_state(duckdb.connect(), "UTC", config.views["v"].memory_limit)
    limit = db.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    assert limit.replace(" ", "") in ("286.1MiB", "300.0MB"), limit
    said = error_of(tmp_path, GOOD + view + "    memory_limit: lots\n")
    assert "views.v.memory_limit" in said and "512MB" in said, said
