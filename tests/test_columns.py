"""Column filters and masking (``columns:`` of a source, ``cdc/columns.py``) against real
PostgreSQL, MariaDB and Redis.

* Configuration refusals, each naming the key and the fix: include with exclude, an unknown
  transform, a length that is not positive, a hash without ``hash_key_env``, a table not
  captured, a transform of a left-out column.
* End to end on each leader: bootstrap and then streamed inserts, updates (TOAST left unchanged
  on PostgreSQL), key changes and deletes of rows full of secrets. No secret's bytes appear in
  any file of the log (or, over Kafka, any record, schema or offset), in the daemons' output, in
  capture's ``/metrics``, or in a decoded envelope (``source`` block included); the Avro
  schema names each transform; hashes are HMAC-SHA256 of the value under the configured key;
  ``cdc verify`` (the leader read through the same rules) exits 0 against a Redis follower,
  and 1 naming the key after a masked value is changed in Redis.
* Refusals at run time: the hash key's variable unset (named, its value never printed); a column
  the rules name that the table lacks; truncate of a number; a key left out; a mask added to a
  column the log already holds in clear (capture refuses before logging anything more).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

from cdc.config import parse_config
from cdc.errors import ConfigError
from cdc_app.servers.postgres import free_port
from tests.pgkit import (
    ApplyProcess,
    Capture,
    Database,
    cdc,
    output,
    read_topic,
    wait_caught_up,
    write_config,
)

pytestmark = pytest.mark.timeout(400)

KEY_ENV = "CDC_TEST_HASH_KEY"
HASH_KEY = "k3y-for-tests-only"
SECRET = "S3CR3T"  # every secret value holds it; none may reach the log


def _hmac(text: str) -> str:
    return hmac.new(HASH_KEY.encode(), text.encode(), hashlib.sha256).hexdigest()


def _source(**extra: Any) -> dict[str, Any]:
    return {"name": "s", "kind": "postgres", "dsn": "postgresql://u@h/d",
            "tables": ["public.t"], **extra}


@pytest.mark.parametrize(("extra", "message"), [
    ({"columns": {"public.t": {"include": ["a"], "exclude": ["b"]}}},
     "set include or exclude, not both"),
    ({"columns": {"public.t": {"transforms": {"a": "scramble"}}}}, "unknown transform 'scramble'"),
    ({"columns": {"public.t": {"transforms": {"a": "truncate(0)"}}}},
     "truncate needs a positive length"),
    ({"columns": {"public.t": {"transforms": {"a": "hash"}}}}, "hash_key_env is not set"),
    ({"columns": {"public.u": {"exclude": ["a"]}}}, "columns: names table(s) not in tables"),
    ({"columns": {"public.t": {"exclude": ["a"], "transforms": {"a": "mask"}}}},
     "the column is left out"),
])
def test_bad_column_rules_are_refused_with_the_fix(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"sources": [_source(**extra)]}, Path("."))
    assert message in str(raised.value), str(raised.value)
    assert "sources[0]" in str(raised.value)


PG_SCHEMA = """
CREATE TABLE people (id int PRIMARY KEY, email text, ssn text, name text, notes text, age int,
                     bio text);
ALTER TABLE people ALTER COLUMN bio SET STORAGE EXTERNAL;
CREATE TABLE accounts (login text PRIMARY KEY, balance int, pin text);
"""
RULES = {
    "public.people": {"exclude": ["notes"],
                      "transforms": {"email": "hash", "ssn": "mask", "name": "truncate(2)",
                                     "age": None, "bio": "mask(<bio>)"}},
    "public.accounts": {"transforms": {"login": "hash", "pin": "mask"}},
}


def _secret(kind: str, n: int) -> str:
    return f"{kind}-{SECRET}-{n}"


def _pg_rows(db: Database, ids: range, version: int = 0) -> None:
    with db.connect() as conn, conn.cursor() as cursor:
        for n in ids:
            cursor.execute(
                "INSERT INTO people VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (n, _secret("mail", n + version), _secret("ssn", n), f"Na{SECRET}{n}",
                 _secret("note", n), 30 + n, _secret("bio", n) + "x" * 3000))
            cursor.execute("INSERT INTO accounts VALUES (%s, %s, %s)",
                           (_secret("login", n), n, _secret("pin", n)))


def _config(tmp_path: Path, db: Database, redis_url: str, rules: Any = None,
            metrics_port: int | None = None) -> Path:
    followers = f"followers:\n  cache:\n    kind: redis\n    url: {redis_url}\n"
    if metrics_port is not None:
        followers += f"metrics:\n  capture_port: {metrics_port}\n  poll_interval: 200ms\n"
    return write_config(tmp_path, db, ["public.people", "public.accounts"], extra=followers,
                        columns=RULES if rules is None else rules, hash_key_env=KEY_ENV)


def _no_secret_anywhere(*places: Path) -> None:
    for place in places:
        files = [place] if place.is_file() else [p for p in place.rglob("*") if p.is_file()]
        for path in files:
            data = path.read_bytes()
            assert SECRET.encode() not in data, f"a secret in {path}"


def test_postgres_rules_keep_secrets_out_of_the_log_and_verify_through_them(
        pg_db: Database, tmp_path: Path, redis_url: str) -> None:
    os.environ[KEY_ENV] = HASH_KEY  # the test's cdc processes inherit it
    pg_db.execute(PG_SCHEMA)
    _pg_rows(pg_db, range(1, 41))
    port = free_port()
    config = _config(tmp_path, pg_db, redis_url, metrics_port=port)
    booted = cdc("bootstrap", "--config", str(config))
    assert booted.returncode == 0, output(booted)
    capture = Capture(config, tmp_path / "capture.log").start()
    applier = ApplyProcess(config, tmp_path / "apply.log")
    try:
        _pg_rows(pg_db, range(41, 61))
        pg_db.execute("UPDATE people SET age = age + 1, email = 'new-' || email WHERE id <= 20")
        pg_db.execute("UPDATE people SET name = 'Zo' || name WHERE id BETWEEN 21 AND 30")  # bio
        # (stored out of line, unchanged) is not sent: filled from the log's masked image
        pg_db.execute(f"UPDATE accounts SET login = 'moved-{SECRET}-' || balance "
                      "WHERE balance % 5 = 0")  # key changes under a hashed key
        pg_db.execute("DELETE FROM people WHERE id % 7 = 0")
        pg_db.execute("DELETE FROM accounts WHERE balance % 9 = 0")
        wait_caught_up(pg_db, tmp_path / "log")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            metrics = page.read().decode()
        counter = f'cdc_capture_events_total{{source="{pg_db.source}",table="public.people"}}'
        assert counter in metrics and SECRET not in metrics
        verified = cdc("verify", "--config", str(config), "--follower", "cache",
                       "--chunk-size", "16", "--timeout", "180s", timeout=240)
        assert verified.returncode == 0, output(verified) + applier.log_file.read_text()
        assert "follower equals the leader" in verified.stdout
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        victim = next(k for k in client.scan_iter("public.people:*"))
        client.hset(victim, "ssn", "9999")
        changed = cdc("verify", "--config", str(config), "--follower", "cache", "--timeout",
                      "60s", timeout=240)
        assert changed.returncode == 1, output(changed)
        assert re.search(r'\{"id":\d+\}\s+different: ssn', changed.stdout), changed.stdout
    finally:
        applier_code = applier.terminate()
        capture_code = capture.terminate()
    assert applier_code == 0, applier.log_file.read_text()[-3000:]
    assert capture_code == 0, (tmp_path / "capture.log").read_text()[-3000:]
    _no_secret_anywhere(tmp_path / "log", tmp_path / "capture.log", tmp_path / "apply.log")
    assert SECRET not in output(booted) + output(verified) + output(changed)
    dumped = cdc("log", "dump", "--config", str(config))  # the transaction topic too
    assert dumped.returncode == 0 and '"status":"END"' in dumped.stdout, output(dumped)[-2000:]
    assert SECRET not in dumped.stdout

    people = read_topic(tmp_path / "log", f"{pg_db.source}.public.people")
    updated = [e for e in people if e.op == "u" and int(e.key[6:-1]) <= 20]
    assert updated and SECRET not in json.dumps([e.envelope for e in people])
    row = updated[-1].envelope["after"]
    n = row["id"]
    assert set(row) == {"id", "email", "ssn", "name", "age", "bio"}  # notes left out
    assert row["email"] == _hmac("new-" + _secret("mail", n))
    assert (row["ssn"], row["name"], row["age"], row["bio"]) == ("****", "Na", None, "<bio>")
    toasted = [e for e in people if e.op == "u" and 21 <= e.envelope["after"]["id"] <= 30]
    assert toasted and all(e.envelope["after"]["bio"] == "<bio>" for e in toasted)
    assert all(not e.envelope["unavailable_columns"] for e in toasted)
    accounts = read_topic(tmp_path / "log", f"{pg_db.source}.public.accounts")
    keys = {json.loads(e.key)["login"] for e in accounts}
    assert _hmac(_secret("login", 3)) in keys and _hmac(f"moved-{SECRET}-5") in keys

    from cdc.log.schemas import SchemaStore
    store = SchemaStore(tmp_path / "log")
    envelope = store.versions(f"{pg_db.source}.public.people-value")[-1].schema
    fields = {f["name"]: f for f in envelope["fields"][0]["type"][1]["fields"]}
    assert fields["email"]["cdc.transform"] == "hash"
    assert fields["email"]["cdc.type"] == {"name": "string", "source_type": "hash of text"}
    assert fields["name"]["cdc.transform"] == "truncate(2)"
    assert fields["age"]["cdc.transform"] == "null" and "notes" not in fields


def test_rules_that_do_not_fit_the_table_are_refused_before_anything_is_logged(
        pg_db: Database, tmp_path: Path, redis_url: str) -> None:
    os.environ[KEY_ENV] = HASH_KEY
    pg_db.execute(PG_SCHEMA)
    _pg_rows(pg_db, range(1, 4))
    cases = [
        ({"public.people": {"transforms": {"mail": "hash"}}}, "mail not in the table"),
        ({"public.people": {"transforms": {"age": "truncate(2)"}}},
         "truncate applies to text columns only"),
        ({"public.people": {"exclude": ["id"]}}, "key column(s) id cannot be left out"),
        ({"public.accounts": {"transforms": {"login": "mask"}}}, "only `hash` keeps keys"),
    ]
    for rules, message in cases:
        config = _config(tmp_path, pg_db, redis_url, rules)
        refused = cdc("bootstrap", "--config", str(config))
        assert refused.returncode != 0, output(refused)
        assert message in refused.stderr and "Traceback" not in refused.stderr, output(refused)
        assert not (tmp_path / "log" / "schemas.jsonl").exists() or \
            "people" not in (tmp_path / "log" / "schemas.jsonl").read_text()

    config = _config(tmp_path, pg_db, redis_url)
    unset = cdc("bootstrap", "--config", str(config), env={KEY_ENV: ""})
    assert unset.returncode != 0 and KEY_ENV in unset.stderr, output(unset)
    assert HASH_KEY not in output(unset) and "Traceback" not in unset.stderr

    # logged in clear first, then a mask added: capture refuses, naming the column and the fix
    clear = _config(tmp_path, pg_db, redis_url, {"public.people": {"exclude": ["notes"]}})
    booted = cdc("bootstrap", "--config", str(clear))
    assert booted.returncode == 0, output(booted)
    _config(tmp_path, pg_db, redis_url, {"public.people": {"exclude": ["notes"],
                                                           "transforms": {"ssn": "mask"}}})
    capture = Capture(config, tmp_path / "capture.log").start()
    assert capture.process is not None
    assert capture.process.wait(60) != 0
    text = (tmp_path / "capture.log").read_text()
    assert "the log already holds ssn in clear" in text and "rebuild the topic" in text, text
    assert "Traceback" not in text
    again = cdc("bootstrap", "--config", str(config))
    assert again.returncode != 0 and "already holds" in again.stderr, output(again)


def test_mariadb_rules_keep_secrets_out_of_the_log_and_verify_through_them(
        mysql_db: Any, tmp_path: Path, redis_url: str) -> None:
    from tests import mykit

    os.environ[KEY_ENV] = HASH_KEY
    mysql_db.execute("CREATE TABLE people (id int PRIMARY KEY, email varchar(80), "
                     "ssn varchar(40), notes text, age int, code varbinary(20))")
    mysql_db.execute("CREATE TABLE tokens (token varchar(60) PRIMARY KEY, n int)")

    def rows(ids: range) -> None:
        for n in ids:
            mysql_db.execute("INSERT INTO people VALUES (%s, %s, %s, %s, %s, %s)",
                             (n, _secret("mail", n), _secret("ssn", n), _secret("note", n),
                              n, _secret("c", n).encode()))
            mysql_db.execute("INSERT INTO tokens VALUES (%s, %s)", (_secret("tok", n), n))

    rows(range(1, 31))
    rules = {mysql_db.table("people"): {"exclude": ["notes"],
                                        "transforms": {"email": "hash", "ssn": "mask",
                                                       "code": "hash"}},
             mysql_db.table("tokens"): {"transforms": {"token": "hash"}}}
    followers = f"followers:\n  cache:\n    kind: redis\n    url: {redis_url}\n"
    config = mykit.write_config(tmp_path, mysql_db, ["people", "tokens"], extra=followers,
                                columns=rules, hash_key_env=KEY_ENV)
    env = mysql_db.env()
    os.environ.update(env)  # the daemons inherit the password
    booted = cdc("bootstrap", "--config", str(config), env=env)
    assert booted.returncode == 0, output(booted)
    capture = Capture(config, tmp_path / "capture.log").start()
    applier = ApplyProcess(config, tmp_path / "apply.log")
    try:
        rows(range(31, 51))
        mysql_db.execute("UPDATE people SET email = CONCAT('x', email), age = age + 1 "
                         "WHERE id <= 10")
        mysql_db.execute(f"UPDATE tokens SET token = CONCAT('moved-{SECRET}-', n) "
                         "WHERE n % 4 = 0")
        mysql_db.execute("DELETE FROM people WHERE id % 6 = 0")
        mysql_db.execute("TRUNCATE tokens")
        mysql_db.execute("INSERT INTO tokens VALUES (%s, 7)", (_secret("tok", 7),))
        mykit.wait_caught_up(mysql_db, tmp_path / "log")
        verified = cdc("verify", "--config", str(config), "--follower", "cache",
                       "--chunk-size", "8", "--timeout", "180s", timeout=240, env=env)
        assert verified.returncode == 0, output(verified) + applier.log_file.read_text()
    finally:
        applier_code = applier.terminate()
        capture_code = capture.terminate()
    assert applier_code == 0, applier.log_file.read_text()[-3000:]
    assert capture_code == 0, (tmp_path / "capture.log").read_text()[-3000:]
    _no_secret_anywhere(tmp_path / "log", tmp_path / "capture.log", tmp_path / "apply.log")
    assert SECRET not in output(booted) + output(verified)
    events = read_topic(tmp_path / "log", f"{mysql_db.source}.{mysql_db.table('people')}")
    after = next(e.envelope["after"] for e in events if e.op == "u")
    assert after["email"] == _hmac("x" + _secret("mail", after["id"]))
    assert after["ssn"] == "****" and "notes" not in after
    # a non-text value is hashed in its JSON form's text (bytes: base64), as verify reads it
    assert after["code"] == _hmac(base64.b64encode(_secret("c", after["id"]).encode()).decode())
    assert {e.envelope["source"]["query"] for e in events if e.envelope} <= {None}


def test_a_kafka_log_holds_no_secret_either(kafka_broker: Any, pg_db: Database,
                                             tmp_path: Path) -> None:
    """The same rules over the Kafka backend: every record of every topic the source wrote,
    its schemas and its stored offset, read back from the broker, hold no secret."""
    from cdc.log.open import reader_from
    from tests.kafkakit import kafka_yaml

    os.environ[KEY_ENV] = HASH_KEY
    pg_db.execute(PG_SCHEMA)
    _pg_rows(pg_db, range(1, 21))
    options = kafka_yaml(kafka_broker)
    config = write_config(tmp_path, pg_db, ["public.people", "public.accounts"],
                          log_options=options, columns=RULES, hash_key_env=KEY_ENV)
    booted = cdc("bootstrap", "--config", str(config))
    assert booted.returncode == 0, output(booted)
    capture = Capture(config, tmp_path / "capture.log").start()
    try:
        _pg_rows(pg_db, range(21, 31))
        pg_db.execute("UPDATE people SET email = 'k-' || email, name = 'Q' || name")
        pg_db.execute(f"UPDATE accounts SET login = 'kk-{SECRET}' || balance WHERE balance < 5")
        pg_db.execute("DELETE FROM people WHERE id % 3 = 0")
        wait_caught_up(pg_db, {**options, "path": str(tmp_path / "log")})
    finally:
        capture_code = capture.terminate()
    assert capture_code == 0, (tmp_path / "capture.log").read_text()[-3000:]
    reader = reader_from({**options, "path": str(tmp_path / "log")})
    assert reader is not None
    try:
        records = 0
        for info in reader.topics():
            if not info.name.startswith(pg_db.source):
                continue
            for partition in range(info.partitions):
                for record in reader.iter_partition(info.name, partition):
                    records += 1
                    for part in (record.key, record.value or b""):
                        assert SECRET.encode() not in part, (info.name, record.position)
        assert records > 90
        assert SECRET not in json.dumps(reader.source_offsets())
        schemas = [v.schema for s in reader.schemas().subjects()
                   for v in reader.schemas().versions(s)]
        assert SECRET not in json.dumps(schemas) and "cdc.transform" in json.dumps(schemas)
    finally:
        reader.close()
    _no_secret_anywhere(tmp_path / "capture.log")


def test_a_changed_key_is_refused_until_the_topic_is_rebuilt(pg_db: Database,
                                                             tmp_path: Path) -> None:
    """Records keyed a new way would never replace those keyed the old way: bootstrap and
    capture refuse a key that differs from the log's, naming both and the fix."""
    pg_db.execute("CREATE TABLE nokey (code text NOT NULL, region text NOT NULL, n int); "
                  "ALTER TABLE nokey REPLICA IDENTITY FULL")
    pg_db.execute("INSERT INTO nokey VALUES ('a', 'x', 1)")
    config = write_config(tmp_path, pg_db, ["public.nokey"], keys={"public.nokey": ["code"]})
    booted = cdc("bootstrap", "--config", str(config))
    assert booted.returncode == 0, output(booted)
    config = write_config(tmp_path, pg_db, ["public.nokey"],
                          keys={"public.nokey": ["code", "region"]})
    again = cdc("bootstrap", "--config", str(config))
    assert again.returncode != 0, output(again)
    message = "the log keys it by (code), the source now by (code, region)"
    assert message in again.stderr and "rebuild the topic" in again.stderr, output(again)
    capture = Capture(config, tmp_path / "capture.log").start()
    pg_db.execute("INSERT INTO nokey VALUES ('b', 'y', 2)")
    assert capture.process is not None and capture.process.wait(60) != 0
    text = (tmp_path / "capture.log").read_text()
    assert message in text and "Traceback" not in text, text[-2000:]


def test_the_logged_key_of_an_event_is_the_one_its_records_carry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dispatcher.logged_key (what an incremental snapshot's window keys streamed events by)
    is the key the dispatcher logs: the hashed one for a table whose key is hashed, so a
    streamed change of that key drops the chunk's older copy (keys compared as logged)."""
    from cdc.avro import EventCodec
    from cdc.columns import ColumnPolicies
    from cdc.events import ChangeEvent, Column, ColumnType, Op, TableId, TableSchema
    from cdc.log.local import LocalChangeLog
    from cdc.log.schemas import SchemaStore
    from cdc.pipeline import Dispatcher
    from cdc.position import Position

    monkeypatch.setenv("CDC_TEST_LOGGED_KEY", "a secret")
    columns = (Column("id", ColumnType("string")), Column("v", ColumnType("int64")))
    hashed, plain = TableId("public", "hashed"), TableId("public", "plain")
    policies = ColumnPolicies.from_settings("src", {
        str(hashed): {"transforms": {"id": "hash"}},
        str(plain): {"transforms": {"v": "null"}}}, "CDC_TEST_LOGGED_KEY")
    with LocalChangeLog(tmp_path / "log", partitions=2) as log:
        dispatcher = Dispatcher(log, EventCodec(SchemaStore(tmp_path / "log", writable=True)),
                                "src", columns=policies)
        for table in (hashed, plain):
            schema = TableSchema("src", "db", table, columns, ("id",))
            event = ChangeEvent(schema, Op.CREATE, Position.postgres(1, 1), 0,
                                after={"id": "alice", "v": 1})
            key = dispatcher.logged_key(event)
            assert key == dispatcher.add(event)[0].key
            assert (b"alice" in key) == (table == plain)
