"""Faults of the Kafka log under load, on real brokers: the whole broker down and back (capture
waits, retries, loses nothing), a broker of a 3-node cluster SIGKILLed and restarted, and two
`cdc capture` daemons for one source (the second fences the first). Afterwards the history in
Kafka (``read_committed``) equals the audit trail, and a follower applied from Kafka passes
``cdc verify``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.kafkakit import broker_watch, kafka_yaml
from tests.pgkit import (
    LOAD_SCHEMA,
    Capture,
    Database,
    Load,
    cdc,
    check_against_audit,
    output,
    read_topic,
    stored_offset,
    wait_caught_up,
    wait_for,
    write_config,
)
from tests.sparkkit import InProcessApply

SEEDED = 300


def _seed(db: Database) -> None:
    db.execute(LOAD_SCHEMA)
    db.execute("INSERT INTO items (id, v, amount, note) SELECT g, 1, g * 1.25, 'seed' "
               f"FROM generate_series(1, {SEEDED}) g")
    db.execute("INSERT INTO audit (id, v, op) SELECT g, 1, 'c' "
               f"FROM generate_series(1, {SEEDED}) g")


def _bootstrap(db: Database, tmp_path: Path, options: dict[str, Any], extra: str = ""
               ) -> tuple[Path, dict[str, Any]]:
    config = write_config(tmp_path, db, ["public.items"], log_options=options, extra=extra)
    result = cdc("bootstrap", "--config", str(config))
    assert result.returncode == 0, output(result)
    return config, {**options, "path": str(tmp_path / "log")}


def _stored_lsn(settings: dict[str, Any], db: Database) -> int:
    """The source LSN the Kafka log committed (where capture resumes)."""
    return int((stored_offset(settings, db.source) or {}).get("lsn", 0))


def _committed(db: Database) -> int:
    return int(db.execute("SELECT count(*) FROM audit")[0][0])


@pytest.fixture(scope="module")
def own_broker():  # type: ignore[no-untyped-def]
    """A broker of this module's own: its tests kill it."""
    from cdc_app.servers.kafka import ThrowawayKafka

    with ThrowawayKafka() as broker:
        yield broker


@pytest.mark.parametrize("rows", [True, False], ids=["rows", "offsets-only"])
def test_an_append_during_an_outage_fails_as_unavailable_and_the_writer_recovers(
        own_broker: Any, rows: bool) -> None:
    """With the broker down (stopped) an append fails with LogUnavailable (what capture
    retries) within the log's timeouts — also one that carries only a source offset, whose
    record's failed delivery the commit reports only as "1 message(s) failed delivery"; once
    the broker is back the same writer resolves its unfinished transaction, reads the offsets really
    committed, and appends again."""
    from cdc.config import LogConfig
    from cdc.errors import LogUnavailable
    from cdc.log.base import Record
    from cdc.log.kafka import KafkaChangeLog, KafkaChangeLogReader

    options = kafka_yaml(own_broker)
    config = LogConfig(partitions=3, client={"message.timeout.ms": 3000},
                       **{k: v for k, v in options.items()})
    writer = KafkaChangeLog(config).for_source("s1")

    def records(tag: str) -> list[Record]:
        return [Record("s1.public.t", f'{{"id":{i}}}'.encode(), f"{tag}{i}".encode(),
                       i.to_bytes(9, "big")) for i in range(20)]

    try:
        writer.ensure_topic("s1.public.t", {"source": "s1"})
        writer.append(records("a"), {"s1": {"seq": 1}})
        own_broker.stop()  # down (the crashes in flight are the tests below)
        started = time.monotonic()
        with pytest.raises(LogUnavailable) as raised:
            writer.append(records("b") if rows else [], {"s1": {"seq": 2}})
        assert time.monotonic() - started < 90
        assert "brokers are up" in raised.value.fix
        own_broker.start()
        assert writer.source_offsets() == {"s1": {"seq": 1}}  # the failed append left nothing
        writer.append(records("c"), {"s1": {"seq": 3}})
        reader = KafkaChangeLogReader(config)
        values = {r.value for p in range(3) for r in reader.iter_partition("s1.public.t", p)}
        reader.close()
        assert not any(v.startswith(b"b") for v in values if v)
        assert {v for v in values if v and v.startswith(b"c")} == {
            f"c{i}".encode() for i in range(20)}
        assert reader.source_offsets() == {"s1": {"seq": 3}}
    finally:
        writer.close()


def test_capture_waits_out_a_whole_broker_outage(own_broker: Any, pg_db: Database,
                                                 tmp_path: Path, redis_url: str,
                                                 spark: Any) -> None:
    """The only broker SIGKILLed under load and started again 10 s later (over three times the
    3 s delivery timeout), then once more while capture catches up: the capture daemon
    keeps running (librdkafka waits, or the failed commit is retried from what Kafka holds),
    and nothing is lost or doubled. Then a Redis follower applied from
    the Kafka log passes `cdc verify`."""
    _seed(pg_db)
    # deliveries give up after 3 s: the outage may surface as an error to retry
    options = {**kafka_yaml(own_broker), "client": {"message.timeout.ms": 3000}}
    followers = f"followers:\n  cache:\n    kind: redis\n    url: {redis_url}\n"
    config, settings = _bootstrap(pg_db, tmp_path, options, followers)
    capture = Capture(config, tmp_path / "capture.log").start()
    load = Load(pg_db, threads=2, bulk_every=15).start()
    watch = broker_watch(own_broker, "Kafka broker (single)", pg_db.current_lsn).start()
    try:
        wait_for(lambda: load.committed > 30, 60, "load")
        wait_caught_up(pg_db, settings, 60)  # the daemon is streaming into Kafka
        # twice: a 10 s outage while streaming, then a short one while capture catches up
        for phase, outage in (("streaming", 10), ("catching up after an outage", 3)):
            before = _committed(pg_db)
            watch.wait_moving()
            watch.kill(phase, own_broker.kill, lambda: _stored_lsn(settings, pg_db),
                       read_before=True)
            wait_for(lambda b=before: _committed(pg_db) > b + 20, 60, "load during the outage")
            time.sleep(outage)
            assert capture.alive(), (tmp_path / "capture.log").read_text()[-3000:]
            own_broker.start()
            wait_for(lambda b=before: _committed(pg_db) > b + 60, 60, "load after the outage")
    finally:
        watch.stop()
        load.finish()
    wait_caught_up(pg_db, settings, 180)
    assert capture.alive(), (tmp_path / "capture.log").read_text()[-3000:]
    figures = check_against_audit(pg_db, read_topic(settings, f"{pg_db.source}.public.items"))
    assert figures
    applier = InProcessApply(config, tmp_path / "apply.log", "cache")
    try:
        verified = cdc("verify", "--config", str(config), "--follower", "cache",
                       "--timeout", "180s", timeout=300)
        assert verified.returncode == 0, output(verified) + applier.log_file.read_text()
        assert "follower equals the leader" in verified.stdout
    finally:
        applier_code = applier.terminate()
        text = (tmp_path / "capture.log").read_text()
        capture_code = capture.terminate()
    assert applier_code == 0, applier.log_file.read_text()[-3000:]
    assert capture_code == 0, text[-3000:]
    # where the outage hit decides whether librdkafka waited it out or an error surfaced
    # and the daemon retried (test_an_append_during_an_outage_... covers the retry itself)
    assert "Traceback" not in text
    assert text.count("Connection refused") < 20, "librdkafka's repeats are not dropped"


def test_capture_started_while_the_brokers_are_down_waits_for_them(
        own_broker: Any, pg_db: Database, tmp_path: Path) -> None:
    """`cdc capture` started while the only broker is down (a service manager starts it beside
    the brokers, or a broker restarts as it opens the log) waits for the log instead of exiting:
    a SIGTERM ends that wait at once with exit 0; once the broker is up, the waiting daemon
    streams what the leader committed meanwhile, and the history equals the audit trail."""
    _seed(pg_db)
    config, settings = _bootstrap(pg_db, tmp_path, kafka_yaml(own_broker))
    own_broker.stop()
    try:
        first = Capture(config, tmp_path / "first.log").start()
        wait_for(lambda: "retrying the log" in (tmp_path / "first.log").read_text(), 60,
                 "the first capture to wait for the log")
        started = time.monotonic()
        assert first.terminate(30) == 0, (tmp_path / "first.log").read_text()[-3000:]
        assert time.monotonic() - started < 10
        capture = Capture(config, tmp_path / "capture.log").start()
        wait_for(lambda: "retrying the log" in (tmp_path / "capture.log").read_text(), 60,
                 "capture to wait for the log")
        pg_db.execute("INSERT INTO items (id, v, amount, note) SELECT g, 1, g * 1.25, 'later' "
                      f"FROM generate_series({SEEDED + 1}, {SEEDED + 50}) g")
        pg_db.execute("INSERT INTO audit (id, v, op) SELECT g, 1, 'c' "
                      f"FROM generate_series({SEEDED + 1}, {SEEDED + 50}) g")
        time.sleep(2)
        assert capture.alive(), (tmp_path / "capture.log").read_text()[-3000:]
    finally:
        own_broker.start()
    wait_caught_up(pg_db, settings, 120)
    text = (tmp_path / "capture.log").read_text()
    assert capture.alive(), text[-3000:]
    assert check_against_audit(pg_db, read_topic(settings, f"{pg_db.source}.public.items"))
    assert capture.terminate() == 0, text[-3000:]
    assert "Traceback" not in text and "error:" not in text


@pytest.mark.slow
def test_a_broker_of_three_killed_and_restarted_under_load(kafka_cluster: Any, pg_db: Database,
                                                           tmp_path: Path) -> None:
    """Replication factor 3, min.insync.replicas 2: each broker in turn SIGKILLed under load and
    restarted; the capture daemon never stops and the history equals the audit trail."""
    cluster = kafka_cluster
    _seed(pg_db)
    options = {**kafka_yaml(cluster), "replication_factor": 3, "min_insync_replicas": 2}
    config, settings = _bootstrap(pg_db, tmp_path, options)
    capture = Capture(config, tmp_path / "capture.log").start()
    load = Load(pg_db, threads=2, bulk_every=15).start()
    try:
        wait_for(lambda: load.committed > 30, 60, "load")
        for index in (0, 2):
            before = _committed(pg_db)
            with broker_watch(cluster.node(index), "Kafka broker (one of three)",
                              pg_db.current_lsn) as watch:
                watch.wait_moving()
                watch.kill(f"under load, node {index + 1}", cluster.node(index).kill,
                           lambda: _stored_lsn(settings, pg_db), read_before=True)
            wait_for(lambda b=before: _committed(pg_db) > b + 20, 120, "load, one node down")
            time.sleep(3)
            cluster.node(index).start()
            # generous: on a loaded machine a restarted broker takes a while to rejoin ISR
            wait_for(lambda b=before: not capture.alive() or _committed(pg_db) > b + 40, 180,
                     "load after the restart")
            assert capture.alive(), (tmp_path / "capture.log").read_text()[-3000:]
    finally:
        load.finish()
        cluster.start()  # every node up again for the next test
    wait_caught_up(pg_db, settings, 180)
    text = (tmp_path / "capture.log").read_text()
    assert capture.terminate() == 0, text[-3000:]
    figures = check_against_audit(pg_db, read_topic(settings, f"{pg_db.source}.public.items"))
    assert figures


def test_a_second_capture_daemon_fences_the_first(kafka_broker: Any, pg_db: Database,
                                                  tmp_path: Path) -> None:
    """Two `cdc capture` for one source on one Kafka log: the second takes over the source's
    transactional id, the first is refused at its next commit and exits with a clear error;
    the history has no holes and no replay with a different position."""
    _seed(pg_db)
    config, settings = _bootstrap(pg_db, tmp_path, kafka_yaml(kafka_broker))
    first = Capture(config, tmp_path / "first.log").start()
    load = Load(pg_db, threads=2).start()
    try:
        wait_for(lambda: load.committed > 30, 60, "load")
        wait_caught_up(pg_db, settings, 60)  # the first daemon is streaming into Kafka
        second = Capture(config, tmp_path / "second.log").start()
        wait_for(lambda: not first.alive(), 60, "the first daemon to be fenced")
        wait_for(lambda: load.committed > 80, 60, "more load")
    finally:
        load.finish()
    wait_caught_up(pg_db, settings, 180)
    assert second.terminate() == 0, (tmp_path / "second.log").read_text()[-3000:]
    assert first.process is not None and first.process.returncode not in (0, None)
    text = (tmp_path / "first.log").read_text()
    assert "another process took over" in text and "one `cdc capture` per source" in text
    assert "Traceback" not in text
    figures = check_against_audit(pg_db, read_topic(settings, f"{pg_db.source}.public.items"))
    assert figures


def test_a_refresh_that_stops_short_of_a_commit_keeps_the_committed_offset(
        kafka_broker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a broker restart the offsets topic's last stable offset can stay behind a
    transaction whose commit already succeeded (the coordinator writes its markers later). A
    writer that re-reads its offsets then must still say what it committed, not the older
    record before it (capture would take its slot as advanced by another consumer and stop:
    seen when the only broker was killed twice in a row). The held-back end is simulated by
    reading the offsets topic only up to the second commit's record."""
    from cdc.config import LogConfig
    from cdc.log.kafka import KafkaChangeLog

    config = LogConfig(partitions=1, **kafka_yaml(kafka_broker))
    writer = KafkaChangeLog(config).for_source("s1")
    try:
        writer.append([], {"s1": {"seq": 1}})
        writer.append([], {"s1": {"seq": 2}})
        held_back = writer._snapshot.source_at["s1"]  # the second commit's record
        assert held_back > 0
        writer._snapshot.next_offset = 0  # read the topic again from its start ...
        real_high = writer._high
        monkeypatch.setattr(writer, "_high", lambda name, partition: (
            held_back if name == config.offsets_topic else real_high(name, partition)))
        assert writer.source_offsets() == {"s1": {"seq": 2}}  # ... but only up to that record
        monkeypatch.undo()
        assert writer.source_offsets() == {"s1": {"seq": 2}}
    finally:
        writer.close()
