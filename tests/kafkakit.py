"""Helpers for tests of the Kafka log: config options with names of a test's own, and the
latest row per key as a Kafka log holds it."""

from __future__ import annotations

import uuid
from typing import Any

from tests.pgkit import LogAt, log_reader


def kafka_yaml(broker: Any, prefix: str | None = None) -> dict[str, Any]:
    """``log:`` options for ``broker`` with internal topics and transactional ids of a test's own
    (so tests sharing one broker never see each other's sources)."""
    prefix = prefix or uuid.uuid4().hex[:6]
    return {"backend": "kafka", "bootstrap_servers": broker.bootstrap_servers,
            "offsets_topic": f"_cdc_offsets_{prefix}", "schemas_topic": f"_cdc_schemas_{prefix}",
            "transactional_id_prefix": f"cdc-{prefix}-"}


def latest(log: LogAt, topic: str) -> dict[str, Any]:
    """The latest row per key (key text -> row) of ``topic``; deleted keys left out."""
    from cdc_app.logview import fold_latest

    reader = log_reader(log)
    assert reader is not None
    try:
        return fold_latest(reader, topic)[1]
    finally:
        reader.close()


def drop_kafka_topics(broker: Any, names: list[str]) -> None:
    """Delete ``names`` from ``broker`` if they exist (topics whose names are fixed, such as the
    synthetic workload's, would otherwise be shared by tests using the session broker)."""
    import time

    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    present = [n for n in names if n in admin.list_topics(timeout=30).topics]
    if not present:
        return
    for future in admin.delete_topics(present, operation_timeout=30).values():
        future.result(timeout=60)
    deadline = time.monotonic() + 60
    while any(n in admin.list_topics(timeout=30).topics for n in present):
        assert time.monotonic() < deadline, f"topics {present} not deleted"
        time.sleep(0.2)


def broker_watch(node: Any, kind: str, source_position: Any) -> Any:
    """A :class:`tests.kills.Watch` of a Kafka broker JVM (``node``: a ThrowawayKafka). Its
    position is the pair (``source_position()``: how far the writers pushing through it had got,
    bytes the broker wrote): a kill lands in flight when the broker wrote in the second before
    and the writers' position was past what was committed to Kafka (where they resume once it
    is back)."""
    from tests.kills import Watch, process_io

    def position() -> tuple[Any, int] | None:
        if node.process is None:
            return None
        return source_position(), process_io(node.process.pid, "wchar")

    return Watch(kind, position, ahead=lambda at, committed: at[0] > committed,
                 moved=lambda before, now: now[1] > before[1])
