"""A view's state held open between batches under a lease (``views/host.py``): one writer at a
time, a dead holder's lease taken over, a second ``cdc apply`` refused naming the holder, a
state host started by a caller, its batches equal to the same batches applied to a state opened
cold, and a SIGKILLed host taken over by the caller that sends the batch again.
(SIGKILLs of a host mid-batch under a running ``cdc apply`` on a Spark cluster, compared with
the leader: ``tests/test_spark_cluster.py``.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdc.avro import EventCodec
from cdc.events import ChangeEvent, Column, Op, TableId, TableSchema, TransactionInfo
from cdc.position import Position
from cdc.sink import Change
from cdc.types import ColumnType
from views.host import HostBusy, HostedView, Lease, ViewHost, fingerprint
from views.state import ViewError


def _config(tmp_path: Path) -> Any:
    from cdc.config import parse_config

    return parse_config({
        "log": {"path": str(tmp_path / "log")},
        "sources": [{"name": "shop", "kind": "postgres", "dsn": "postgresql://u@h/d",
                     "tables": ["public.orders"]}],
        "followers": {"r": {"kind": "sql", "url": f"sqlite:///{tmp_path / 'r.db'}"}},
        "views": {"v": {"source": "shop", "key": ["customer_id"],
                        "sql": "SELECT o.customer_id, count(*) AS n, sum(o.amount) AS total "
                               "FROM orders o GROUP BY o.customer_id", "followers": ["r"]}}},
        tmp_path)


ORDERS = TableSchema(
    source="shop", database="d", table=TableId("public", "orders"),
    columns=(Column("id", ColumnType("int64", source_type="bigint"), nullable=False),
             Column("customer_id", ColumnType("int64", source_type="bigint")),
             Column("amount", ColumnType("decimal", 10, 2, source_type="numeric(10,2)"))),
    key=("id",))


def _register_schema(config: Any) -> None:
    """``public.orders``' schema in the config's log (one row of it appended), as capture's
    snapshot registers it: the host process reads it there."""
    from cdc.log.open import log_settings, writer_from

    writer = writer_from(log_settings(config))
    try:
        codec = EventCodec(writer.schemas())
        writer.ensure_topic(ORDERS.topic, {"source": "shop", "table": "public.orders"})
        event = ChangeEvent(ORDERS, Op.READ, Position.test(1), ts_ms=int(time.time() * 1000),
                            after={"id": 0, "customer_id": 0, "amount": Decimal("0")},
                            source_info={"txId": 1, "lsn": 64},
                            transaction=TransactionInfo("1", 1, 1))
        writer.for_source("shop").append(codec.records(event),
                                         {"shop": {"lsn": 64, "lsn_text": "0/40"}})
    finally:
        writer.close()


def _orders(rows: list[tuple[int, int, str | None]], start: int) -> list[Change]:
    """Changes of ``public.orders`` (``amount`` None: a delete) at positions from ``start``."""
    return [Change(topic="shop.public.orders", source="shop", table="public.orders",
                   key=json.dumps({"id": key}), position=(start + i).to_bytes(9, "big"),
                   row=None if amount is None else
                   {"id": key, "customer_id": customer, "amount": amount},
                   op="d" if amount is None else "u")
                   for i, (key, customer, amount) in enumerate(rows)]


@pytest.fixture
def config(tmp_path: Path) -> Any:
    config = _config(tmp_path)
    _register_schema(config)
    return config


def test_the_lease_has_one_holder_and_a_dead_holders_is_taken_over(tmp_path: Path) -> None:
    lease = Lease(tmp_path / "v.duckdb")
    first = lease.take("apply", None, "k", "f")
    assert first.epoch == 1 and first.live()
    with pytest.raises(HostBusy, match=f"pid {os.getpid()}"):
        lease.take("apply", None, "k", "f")
    assert lease.renew(first.epoch)
    # a holder that died: its process gone, its lease not live at once on this machine
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    record = json.loads(lease.path.read_text())
    lease.path.write_text(json.dumps({**record, "pid": int(dead.stdout)}))
    assert not lease.read().live()  # type: ignore[union-attr]
    second = lease.take("host", ("127.0.0.1", 1), "k2", "f")
    assert second.epoch == 2
    assert not lease.renew(first.epoch)  # fenced: the old epoch renews nothing
    lease.release(second.epoch)
    released = lease.read()
    assert released is not None and not released.live() and released.epoch == 2
    assert oct(lease.path.stat().st_mode & 0o777) == "0o600"  # it holds the host's key


def test_a_second_apply_of_a_view_is_refused_naming_the_holder(config: Any) -> None:
    host = ViewHost(config, ["v"])
    try:
        with pytest.raises(ViewError, match=r"held by cdc apply \(pid \d+ on .*epoch 1\)"):
            ViewHost(config, ["v"])
        view = HostedView(config, "v", host)
        view.apply(_orders([(1, 10, "5.00"), (2, 10, "7.50"), (3, 11, "1.00")], 1))
        assert view.read("t", ['{"customer_id":10}']) == {
            '{"customer_id":10}': {"customer_id": "10", "n": "2", "total": "12.50"}}
    finally:
        host.close()
    again = ViewHost(config, ["v"])  # released at close: taken as the next epoch
    try:
        assert Lease(config.view_state("v")).read().epoch == 2  # type: ignore[union-attr]
    finally:
        again.close()


def test_a_started_host_applies_batches_and_a_sigkilled_one_is_taken_over(config: Any) -> None:
    view = HostedView(config, "v", stops_host=True)
    try:
        view.check()  # no host yet: on the file itself
        assert Lease(config.view_state("v")).read() is None
        view.apply(_orders([(1, 10, "5.00"), (2, 10, "7.50"), (3, 11, "1.00")], 1))
        first = Lease(config.view_state("v")).read()
        assert first is not None and first.kind == "host" and first.pid != os.getpid()
        assert first.fingerprint == fingerprint(config, "v") and first.live()
        view.apply(_orders([(2, 11, "7.50")], 10))
        os.kill(first.pid, signal.SIGKILL)
        # the next batch finds the host gone: a new one takes the lease over
        view.apply(_orders([(3, None, None)], 20))
        second = Lease(config.view_state("v")).read()
        assert second is not None and second.epoch == first.epoch + 1 and second.live()
        # the same batch sent twice (a task run again): the gate skips it
        view.apply(_orders([(3, None, None)], 20))
        rows = view.read("t", ['{"customer_id":10}', '{"customer_id":11}'])
        assert rows == {'{"customer_id":10}': {"customer_id": "10", "n": "1", "total": "5.00"},
                        '{"customer_id":11}': {"customer_id": "11", "n": "1", "total": "7.50"}}
        assert view.watermark("shop") is None
    finally:
        view.close()
    deadline = time.monotonic() + 10
    while (Lease(config.view_state("v")).read() or first).live() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Lease(config.view_state("v")).read().live()  # type: ignore[union-attr]
