"""The MySQL/MariaDB connector on the source contract (:mod:`cdc.source`), registered for
``kind: mysql`` in ``pyproject.toml``'s ``cdc.connectors`` entry points.

Positions (:meth:`cdc.position.Position.mysql`): ``(binlog file sequence, start position of the
rows event, ordinal of the change inside the event)``. A snapshot row is ``(sequence, snapshot
position, row number)``: every streamed rows event starts after the snapshot position (a
transaction's GTID event comes first), so snapshot rows sort before every streamed change.

Offsets (:class:`MySqlOffset`): ``file``/``pos`` is the end of the last transaction (XID or DDL
event) whose changes are all in the log; streaming resumes there, by file and position, on the
same server. ``gtid`` is the GTID set reached (MariaDB's ``gtid_binlog_pos`` form), kept for
resuming elsewhere; ``server_id``/``server_uuid`` name the server the positions belong to.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pymysql

from cdc.avro import EventCodec, fixed_schema
from cdc.avrowriter import write_long
from cdc.config import SourceConfig
from cdc.errors import ConfigError
from cdc.events import ChangeEvent, Op, TableId, TableSchema
from cdc.log.base import Record
from cdc.offsets import BOOTSTRAPPING, SourceOffset
from cdc.position import Position
from cdc.preflight import Part
from cdc.source import (
    Connector,
    EncodedBatch,
    EnvelopeSource,
    Leader,
    ServerStatus,
    SnapshotSource,
    StreamingSource,
)
from connectors.mysql import catalog
from connectors.mysql.connection import (
    SourceError,
    SourceUnavailable,
    address,
    connect,
    query,
)
from connectors.mysql.offset import MySqlOffset, purge_warnings
from connectors.mysql.settings import MySqlSourceConfig

if TYPE_CHECKING:
    from connectors.mysql.schema import CapturedTable
    from connectors.mysql.stream import MySqlStreaming


def _source_defaults(schema: TableSchema) -> dict[str, Any]:
    return {"db": schema.table.schema, "table": schema.table.table, "server_id": 0,
            "gtid": None, "file": "", "pos": 0, "row": 0, "thread": None, "query": None}


ENVELOPE = EnvelopeSource(connector="mysql", schema=fixed_schema("source.mysql.avsc"),
                          defaults=_source_defaults)


def _my_config(config: SourceConfig) -> MySqlSourceConfig:
    if not isinstance(config, MySqlSourceConfig):
        raise ConfigError(f"source {config.name!r} is not a MySQL source",
                          "set its `kind:` to mysql")
    return config


class MySqlConnector(Connector):
    """``kind: mysql``: the row binlog read as a replica; snapshots in a consistent-snapshot
    transaction whose binlog position MariaDB reports atomically."""

    kind = "mysql"
    offset_type = MySqlOffset

    def __init__(self, config: SourceConfig) -> None:
        super().__init__(config)
        self.my_config = _my_config(config)

    @classmethod
    def envelope(cls) -> EnvelopeSource:
        return ENVELOPE

    def snapshot(self, codec: EventCodec | None = None) -> SnapshotSource:
        return MySqlSnapshot(self.my_config, codec)

    @classmethod
    def stream_type(cls) -> type[MySqlStreaming]:
        from connectors.mysql.stream import MySqlStreaming

        return MySqlStreaming

    def stream(self, offset: SourceOffset, codec: EventCodec | None = None) -> StreamingSource:
        assert isinstance(offset, MySqlOffset)
        return self.stream_type()(self.my_config, offset, codec)

    def bootstrapping_offset(self) -> SourceOffset:
        return MySqlOffset(state=BOOTSTRAPPING, started_ms=int(time.time() * 1000))

    def retryable(self) -> tuple[type[BaseException], ...]:
        return (SourceUnavailable, pymysql.err.OperationalError, pymysql.err.InterfaceError,
                ConnectionError)

    def status(self, stored: SourceOffset | None) -> ServerStatus:
        conn = connect(self.my_config)
        try:
            file, pos = catalog.current_position(conn, self.name)
            files = catalog.binlog_files(conn, self.name)
            cascades = catalog.cascades(conn, [TableId.parse(t) for t in self.my_config.tables])
            expiring = catalog.expires_binlogs(conn)
        finally:
            conn.close()
        fields: dict[str, Any] = {"server_position": f"{file}:{pos}",
                                  "oldest_binlog": files[0][0] if files else None,
                                  "binlog_bytes": sum(size for _, size in files)}
        warnings: list[str] = list(cascades)
        if isinstance(stored, MySqlOffset) and stored.file:
            lag = _lag_bytes(files, stored.file, stored.pos, file, pos)
            fields.update(position=stored.describe(), lag_bytes=lag,
                          retained_bytes=fields["binlog_bytes"])
            warnings.extend(purge_warnings(self.my_config, files, stored, expiring))
        return ServerStatus(fields, warnings)

    def drop(self, stored: SourceOffset | None) -> list[str]:
        """Nothing to remove: a MariaDB server keeps no state for a binlog reader. Refused
        while a replica with this source's server_id is connected (its capture, running)."""
        replica = self.my_config.replica_id
        conn = connect(self.my_config)
        try:  # not allowed to look (None): the log's writer refuses a running capture
            connected = catalog.replica_connected(conn, replica)
        finally:
            conn.close()
        if connected:
            raise SourceError(f"source {self.name!r}: a replica with its server_id {replica} "
                              "is connected: its capture is running",
                              f"stop `cdc capture` of {self.name} first")
        return []

    def preflight(self, stored: SourceOffset | None, log_read: bool = True) -> Part:
        from connectors.mysql.preflight import preflight_part

        return preflight_part(self.my_config, stored)

    def leader(self) -> Leader:
        from connectors.mysql.checksum import MySqlLeader

        return MySqlLeader(self.my_config)


def _lag_bytes(files: list[tuple[str, int]], stored_file: str, stored_pos: int,
               file: str, pos: int) -> int:
    """Binlog bytes between the stored position and the server's."""
    if stored_file == file:
        return max(pos - stored_pos, 0)
    total, counting = 0, False
    for name, size in files:
        if name == stored_file:
            counting, total = True, max(size - stored_pos, 0)
        elif counting and name == file:
            return total + pos
        elif counting:
            total += size
    return total


#: snapshot rows encoded per batch by the fast path
SNAPSHOT_BATCH = 2000


class MySqlSnapshot(SnapshotSource):
    """One ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` over every captured table, its binlog
    position read inside it (MariaDB's ``binlog_snapshot_file``/``_position``), no global
    lock."""

    def __init__(self, config: MySqlSourceConfig, codec: EventCodec | None = None) -> None:
        self.config = config
        self.codec = codec
        self.name = config.name
        self.tables: dict[TableId, TableSchema] = {}
        self.captured: dict[TableId, CapturedTable] = {}
        self._warnings: list[str] = []
        self._conn: Any = None
        self._reader: Any = None
        self.server: catalog.Server | None = None
        self.file = ""
        self.pos = 0
        self.file_seq = 0
        self.gtid: str | None = None
        self.ts_ms = 0
        self._row = 0

    def check(self) -> dict[TableId, TableSchema]:
        from connectors.mysql.schema import build

        self._conn = connect(self.config)
        self.server = catalog.server_info(self._conn, self.name)
        catalog.check_privileges(self._conn, self.name, address(self.config).user)
        catalog.current_position(self._conn, self.name)
        tables = [TableId.parse(t) for t in self.config.tables]
        for table in tables:
            info = catalog.table_info(self._conn, self.name, table)
            catalog.key_columns(info, self.name, self.config.keys.get(str(table)))
            captured = build(self.config, table, info.columns, info.primary_key)
            self.captured[table] = captured
            self.tables[table] = captured.schema
        self._warnings = catalog.cascades(self._conn, tables)
        return self.tables

    def warnings(self) -> list[str]:
        return list(self._warnings)

    def open(self) -> str:
        self._reader = connect(self.config, streaming=True)
        with self._reader.cursor() as cursor:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            cursor.execute("SHOW SESSION STATUS LIKE 'binlog_snapshot_%'")
            status = {str(k).lower(): str(v) for k, v in cursor.fetchall()}
        if "binlog_snapshot_file" not in status:
            raise SourceError(f"source {self.name!r}: the server does not report its snapshot's "
                              "binlog position (binlog_snapshot_file): it is not MariaDB",
                              "cdc bootstraps MariaDB without a global lock; MySQL 8 needs a "
                              "brief FLUSH TABLES WITH READ LOCK, not supported yet")
        self.file = status["binlog_snapshot_file"]
        self.pos = int(status["binlog_snapshot_position"])
        self.file_seq = catalog.file_sequence(self.file)
        rows = query(self._reader, "SELECT BINLOG_GTID_POS(%s, %s)", (self.file, self.pos))
        self.gtid = str(rows[0][0]) if rows and rows[0][0] is not None else None
        self.ts_ms = int(time.time() * 1000)
        return f"consistent snapshot at binlog {self.file}:{self.pos} (GTID {self.gtid or '-'})"

    def estimate_rows(self, table: TableId) -> int | None:
        rows = query(self._conn, "SELECT table_rows FROM information_schema.tables WHERE "
                                 "table_schema = %s AND table_name = %s",
                     (table.schema, table.table))
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    def rows(self, table: TableId) -> Iterator[ChangeEvent | EncodedBatch]:
        from connectors.mysql.types import snapshot_expression

        captured = self.captured[table]
        columns = ", ".join(snapshot_expression(c) for c in captured.columns)
        sql = f"SELECT {columns} FROM {catalog.qualified(table)}"
        fast = self._fast(captured)
        if fast is not None:
            yield from self._fast_rows(captured, sql, *fast)
            return
        schema = captured.schema
        info = self._source_info()
        convert = captured.snapshot_row
        with self._reader.cursor() as cursor:
            cursor.execute(sql)
            for values in cursor.fetchall_unbuffered():
                self._row += 1
                yield ChangeEvent(schema, Op.READ,
                                  Position.mysql(self.file_seq, self.pos, self._row), self.ts_ms,
                                  after=convert(values), source_info=info)

    def _source_info(self) -> dict[str, Any]:
        server_id = self.server.server_id if self.server else 0
        return {"snapshot": "true", "file": self.file, "pos": self.pos, "row": 0,
                "server_id": server_id, "gtid": self.gtid}

    def _fast(self, captured: CapturedTable) -> tuple[Any, bytes] | None:
        """(text plan, the constant tail of every value) when the table takes the fast path."""
        from connectors.mysql import rowcodec

        if self.codec is None or self.config.has_column_rules(captured.schema.table):
            return None  # column rules: the dispatcher transforms typed events
        codec = self.codec.table(captured.schema)
        plan = rowcodec.text_plan_for(captured.columns, codec.value_fields,
                                      [c.type for c in captured.schema.columns],
                                      captured.schema.key)
        record = (codec.parts or {}).get("io.debezium.connector.mysql.Source")
        envelope = (codec.parts or {}).get(f"{codec.registered.schema['namespace']}.Envelope")
        if plan is None or record is None or envelope is None:
            return None
        probe = ChangeEvent(captured.schema, Op.READ, Position.mysql(0, 0, 0), self.ts_ms,
                            after={}, source_info=self._source_info(), processed_ms=self.ts_ms)
        block = self.codec.source_block(probe)
        tail = bytearray()
        for name, writer in record:
            writer(block[name], tail)
        tail += b"\x00"  # no transaction block
        tail += b"\x02r"
        for value in (self.ts_ms, self.ts_ms * 1000, self.ts_ms * 1_000_000):
            tail.append(2)
            write_long(value, tail)
        tail += b"\x00"  # unavailable_columns
        return plan, bytes(tail)

    def _fast_rows(self, captured: CapturedTable, sql: str, plan: Any,
                   tail: bytes) -> Iterator[EncodedBatch]:
        """Raw text-protocol row packets, a batch at a time, straight to records."""
        from connectors.mysql import rowcodec

        assert self.codec is not None
        schema = captured.schema
        topic = schema.topic
        header = self.codec.table(schema).header + b"\x00\x02"  # no before; an after image
        cursor = self._reader.cursor()
        cursor.execute(sql)  # unbuffered: the column definitions are read, the rows are not
        splitter = rowcodec.PacketSplitter()
        stream = self._reader._rfile
        pending: list[bytes] = []
        try:
            while not splitter.done:
                chunk = stream.read1(1 << 20)
                if not chunk:
                    raise SourceUnavailable(f"source {self.name!r}: the server closed the "
                                            f"connection while {schema.table} was read",
                                            "run `cdc bootstrap` again")
                pending += splitter.feed(chunk)
                while len(pending) >= SNAPSHOT_BATCH or (splitter.done and pending):
                    batch, pending = pending[:SNAPSHOT_BATCH], pending[SNAPSHOT_BATCH:]
                    records = rowcodec.snapshot_records(plan, batch, topic, header, tail,
                                                       self.file_seq, self.pos, self._row,
                                                       Record)
                    self._row += len(records)
                    yield EncodedBatch(records, (schema,), len(records), whole_rows=True)
        except rowcodec.PacketError as exc:
            payload = exc.args[0]
            raise SourceError(f"source {self.name!r}: reading {schema.table} failed: "
                              f"{payload[9:].decode(errors='replace')}",
                              "check the server's log, then run `cdc bootstrap` again") from None
        finally:
            # the rows were read here, not by PyMySQL: its result is over
            cursor._result.unbuffered_active = False
            cursor._result.connection = None
            self._reader._result = None
            cursor.close()

    def vanished_position(self) -> Position:
        self._row += 1
        return Position.mysql(self.file_seq, self.pos, self._row)

    def resume_offset(self) -> SourceOffset:
        server = self.server
        return MySqlOffset(file=self.file, pos=self.pos, file_seq=self.file_seq, gtid=self.gtid,
                           server_id=server.server_id if server else 0,
                           server_uuid=server.server_uuid if server else None,
                           snapshot_at=f"{self.file}:{self.pos}")

    def close(self) -> None:
        for conn in (self._reader, self._conn):
            if conn is not None:
                with contextlib.suppress(Exception):  # a broken connection may fail to close
                    conn.close()
        self._reader = self._conn = None
