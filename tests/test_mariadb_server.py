"""The throwaway MariaDB server and its fixtures: the binlog is configured for CDC, and a replica
(python-mysql-replication, as the capture user) reads real column names and values from it."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import MariadbGtidEvent, XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from cdc.errors import CdcError


def read_changes(db: Any, gtid_pos: str) -> list[Any]:
    """Every event after ``gtid_pos`` (a non-blocking read to the end of the binlog)."""
    stream = BinLogStreamReader(
        connection_settings=db.capture_settings(), server_id=db.server_id, is_mariadb=True,
        auto_position=gtid_pos, blocking=False, only_schemas=[db.name],
        only_events=[MariadbGtidEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent,
                     XidEvent], enable_logging=False)
    try:
        return list(stream)
    finally:
        stream.close()


def test_binlog_is_configured_for_cdc(mysql_db) -> None:  # type: ignore[no-untyped-def]
    settings = mysql_db.execute(
        "SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata")
    assert settings == [(1, "ROW", "FULL", "FULL")]
    # the capture user may read the binlog coordinates and its database
    with mysql_db.capture_connect() as conn, conn.cursor() as cursor:
        cursor.execute("SHOW MASTER STATUS")
        assert cursor.fetchone()[0].startswith("binlog.")


def test_replica_reads_row_changes_with_names(mysql_db) -> None:  # type: ignore[no-untyped-def]
    mysql_db.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40) NOT NULL, "
                     "amount DECIMAL(12,2), note TEXT)")
    start = mysql_db.gtid_pos()
    with mysql_db.transaction() as cursor:
        cursor.execute("INSERT INTO items VALUES (1, 'caf\u00e9 \U0001f600', 12.50, NULL), "
                       "(2, 'two', NULL, 'x')")
    mysql_db.execute("UPDATE items SET amount = 99.99, note = 'changed' WHERE id = 1")
    mysql_db.execute("DELETE FROM items WHERE id = 2")

    events = read_changes(mysql_db, start)
    gtids = [e for e in events if isinstance(e, MariadbGtidEvent)]
    assert len(gtids) == 3 and all(e.domain_id == 0 and e.server_id == 1 for e in gtids)
    assert sum(isinstance(e, XidEvent) for e in events) == 3
    rows = [e for e in events if isinstance(e, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent)]
    assert {(e.schema, e.table) for e in rows} == {(mysql_db.name, "items")}

    inserted = [row["values"] for row in rows[0].rows]
    assert isinstance(rows[0], WriteRowsEvent)
    assert inserted == [
        {"id": 1, "name": "caf\u00e9 \U0001f600", "amount": Decimal("12.50"), "note": None},
        {"id": 2, "name": "two", "amount": None, "note": "x"}]
    assert isinstance(rows[1], UpdateRowsEvent)
    (update,) = rows[1].rows
    assert update["before_values"]["amount"] == Decimal("12.50")
    assert update["after_values"] == {"id": 1, "name": "caf\u00e9 \U0001f600",
                                      "amount": Decimal("99.99"), "note": "changed"}
    assert isinstance(rows[2], DeleteRowsEvent)
    assert [row["values"] for row in rows[2].rows] == [
        {"id": 2, "name": "two", "amount": None, "note": "x"}]
    assert rows[0].primary_key == "id"
    assert not any(name.startswith("UNKNOWN_COL") for e in rows for row in e.rows
                   for name in row.get("values", row.get("after_values", {})))


def test_misconfigured_server(mariadb_factory) -> None:  # type: ignore[no-untyped-def]
    server = mariadb_factory(options={"binlog_format": "STATEMENT",
                                      "binlog_row_image": "MINIMAL", "log_bin": False})
    assert server.execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_image") == [
        (0, "STATEMENT", "MINIMAL")]
    broken = mariadb_factory(start=False, options={"default_time_zone": "Nowhere/Special"})
    with pytest.raises(CdcError, match="Illegal or unknown default time zone"):
        broken.start(timeout=20)
