"""The streaming source: the server's row binlog, read as a replica (python-mysql-replication),
turned into change events and checkpoints.

Transactions: MariaDB starts each with a GTID event (MySQL with a GTID event and ``BEGIN``) and
ends it with an XID event (``COMMIT`` for non-transactional engines); a DDL statement is a
transaction of its own. After each end the stream yields a :class:`~cdc.source.Checkpoint` at the
end position of that event, so a resume (by file and position, on the same server) starts at a
transaction boundary and never mid-transaction. When the server is idle it sends heartbeat events
carrying its current position; between transactions they become checkpoints too, so an idle
source's stored position keeps up with the server.

A binlog reader thread does the blocking reads and the row decoding; the capture thread takes
its items from a bounded queue (so memory stays bounded whatever the transaction size) and gets
``None`` when nothing arrived for ``idle_timeout``.

Refusals (:class:`~connectors.mysql.connection.SourceError`, never skipped): the stored binlog
file was purged; the server's binlog sequence went backwards or its identity changed (a
failover, ``RESET MASTER``); a DML statement arriving as a query (a session switched itself to
STATEMENT or MIXED format); a rows event without whole row images (a session with a MINIMAL or
NOBLOB row image); a table-map event without column names.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import re
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.bitmap import BitCount
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from cdc.avro import EventCodec
from cdc.events import ChangeEvent, Op, TableId, TableSchema, TransactionInfo, encode_key
from cdc.log.base import Record
from cdc.offsets import SourceOffset
from cdc.position import Position
from cdc.source import (
    Checkpoint,
    EncodedBatch,
    IncrementalSnapshotSource,
    StreamingSource,
    StreamItem,
    Watermark,
)
from connectors.mysql import catalog
from connectors.mysql.connection import (
    SourceError,
    SourceUnavailable,
    address,
    connect,
    query,
    translate,
)
from connectors.mysql.offset import MySqlOffset, purge_warnings
from connectors.mysql.rowcodec import (
    Fallback,
    build_records,
    decode_rows,
    implementation,
    plan_for,
)
from connectors.mysql.schema import CapturedTable, build
from connectors.mysql.settings import MySqlSourceConfig
from connectors.mysql.types import prepare_table_map, refine

log = logging.getLogger("cdc.capture")

#: chunks (lists of items) the reader may hold ahead of the capture thread
QUEUE_CHUNKS = 64
#: items (rows-event batches, events) the reader gathers before handing them over mid-transaction
HANDOVER_ITEMS = 64
_END = object()
_DML = re.compile(r"^\s*(?:/\*.*?\*/\s*)*(INSERT|UPDATE|DELETE|REPLACE|LOAD\s+DATA)\b",
                  re.IGNORECASE | re.DOTALL)
_TRUNCATE = re.compile(r"^\s*TRUNCATE\s+(?:TABLE\s+)?(.+?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_RENAME = re.compile(r"^\s*RENAME\s+TABLES?\s+(.+?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_ALTER_RENAME = re.compile(
    r"^\s*ALTER\s+(?:ONLINE\s+|IGNORE\s+)*TABLE\s+(?:IF\s+EXISTS\s+)?"
    r"(`(?:[^`]|``)+`(?:\.`(?:[^`]|``)+`)?|[^\s`]+)\s.*?\bRENAME\s+"
    r"(?!COLUMN\b|INDEX\b|KEY\b|CONSTRAINT\b)(?:TO\s+|AS\s+)?"
    r"(`(?:[^`]|``)+`(?:\.`(?:[^`]|``)+`)?|[^\s`,;]+)",
    re.IGNORECASE | re.DOTALL)
_DROP = re.compile(r"^\s*DROP\s+(?:TEMPORARY\s+)?TABLES?\s+(?:IF\s+EXISTS\s+)?(.+?)\s*;?\s*$",
                   re.IGNORECASE | re.DOTALL)


def _names(text: str, default_schema: str) -> list[TableId]:
    """Table names of a TRUNCATE/DROP statement (``a``, ``db.a``, backquoted)."""
    out = []
    for part in re.findall(r"(`(?:[^`]|``)+`|[^\s,`.]+)(?:\.(`(?:[^`]|``)+`|[^\s,`.]+))?", text):
        first, second = (p.strip("`").replace("``", "`") if p else p for p in part)
        if first.upper() in ("RESTRICT", "CASCADE", "WAIT", "NOWAIT"):
            continue
        out.append(TableId(first, second) if second else TableId(default_schema, first))
    return out


class _Reconnected(SourceUnavailable):
    """The library lost its replication connection and tried to open another one."""


def _connection_class(source: str) -> Any:
    """PyMySQL's Connection, refusing a second replication connection: python-mysql-replication
    silently reconnects and goes on from the last *event*, possibly mid-transaction; we prefer
    to start over from the stored offset (the runner discards what was not durable)."""
    opened = {"stream": 0}

    class Connection(pymysql.connections.Connection):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("db") != "information_schema":
                opened["stream"] += 1
                if opened["stream"] > 1:
                    raise _Reconnected(f"source {source!r}: the replication connection was "
                                       "lost", "nothing to do: capture resumes from the log")
            super().__init__(*args, **kwargs)

    return Connection


class MySqlStreaming(StreamingSource, IncrementalSnapshotSource):
    """A binlog dump from a stored offset, after checking the server can still serve it."""

    def __init__(self, config: MySqlSourceConfig, offset: MySqlOffset,
                 codec: EventCodec | None = None) -> None:
        self.config = config
        self.offset = offset
        self.codec = codec
        self.name = config.name
        self.tables = {TableId.parse(t) for t in config.tables}
        #: where incremental snapshots write their watermarks (read back from the binlog)
        self.signal = config.signal_table_id
        self._snap: Any = None
        self._snap_leader: Any = None
        self._queue: queue.Queue[Any] = queue.Queue(QUEUE_CHUNKS)
        self._stop = threading.Event()
        self._catalog = connect(config)
        try:
            self.server = catalog.server_info(self._catalog, self.name)
            self._check_offset()
            self._reader = BinlogReader(self, offset)
        except BaseException:
            self._catalog.close()
            raise
        self._thread = threading.Thread(target=self._reader.run, name=f"binlog-{self.name}",
                                        daemon=True)
        self._thread.start()

    def _check_offset(self) -> None:
        again = (f"run `cdc bootstrap --source {self.name}` again: it re-snapshots the tables "
                 "and tombstones keys deleted meanwhile")
        offset, server = self.offset, self.server
        if offset.server_id and server.server_id != offset.server_id or (
                offset.server_uuid and server.server_uuid != offset.server_uuid):
            raise SourceError(f"source {self.name!r}: the server is not the one the log's "
                              f"positions come from (server_id {server.server_id}, was "
                              f"{offset.server_id}): a failover or a new server?", again)
        files = catalog.binlog_files(self._catalog, self.name)
        names = [name for name, _ in files]
        if offset.file not in names:
            sequences = [catalog.file_sequence(name) for name in names]
            if sequences and offset.file_seq < min(sequences):
                raise SourceError(f"source {self.name!r}: binlog {offset.file} was purged from "
                                  f"the server (its oldest is now {names[0]}), so changes "
                                  "since the stored position are gone", again)
            raise SourceError(f"source {self.name!r}: binlog {offset.file} is not on the server "
                              f"and its binlog sequence is behind it (newest {names[-1]}): "
                              "RESET MASTER, or another server", again)
        size = dict(files)[offset.file]
        if offset.pos > size:
            raise SourceError(f"source {self.name!r}: the stored position {offset.describe()} "
                              f"is past the end of {offset.file} ({size} bytes): the binlog "
                              "was rewritten", again)
        expiring = catalog.expires_binlogs(self._catalog)
        for warning in purge_warnings(self.config, files, offset, expiring):
            log.warning("source %s: %s", self.name, warning)

    def describe(self) -> str:
        return self.offset.describe()

    def items(self, idle_timeout: float) -> Iterator[StreamItem]:
        get = self._queue.get
        while True:
            try:
                chunk = get(timeout=idle_timeout)
            except queue.Empty:
                yield None
                continue
            if chunk is _END:
                return
            if isinstance(chunk, BaseException):
                raise chunk
            yield from chunk

    def confirm(self, offset: SourceOffset) -> None:
        """Nothing to tell the server: MySQL keeps binlogs by time, not by replica progress."""

    def heartbeat(self) -> None:
        """Nothing to write: the server sends heartbeat events with its position when idle."""

    # -- incremental snapshots (cdc/incremental.py) ------------------------------------------
    def _snapshot_session(self) -> Any:
        """The connection watermarks are written on (the capture thread's own; the signal
        table created on first use)."""
        if self._snap is None:
            conn = connect(self.config)
            table = catalog.qualified(self.signal)
            try:
                if not query(conn, "SELECT 1 FROM information_schema.tables WHERE "
                                   "table_schema = %s AND table_name = %s",
                             (self.signal.schema, self.signal.table)):
                    query(conn, f"CREATE TABLE {table} (id VARCHAR(64) NOT NULL PRIMARY KEY, "
                                "payload VARCHAR(2048) NOT NULL) ENGINE=InnoDB")
            except pymysql.err.MySQLError as exc:
                conn.close()
                raise SourceError(
                    f"source {self.name!r}: cannot create the signal table {self.signal} for "
                    f"incremental snapshots: {translate(self.config, exc).problem}",
                    f"have an admin run: CREATE TABLE {table} (id VARCHAR(64) NOT NULL PRIMARY "
                    "KEY, payload VARCHAR(2048) NOT NULL) ENGINE=InnoDB; GRANT INSERT, UPDATE "
                    f"ON {table} TO the capture user (or set signal_table)") from None
            self._snap = conn
        return self._snap

    def _leader(self) -> Any:
        if self._snap_leader is None:
            from connectors.mysql.checksum import MySqlLeader

            self._snap_leader = MySqlLeader(self.config)
        return self._snap_leader

    def watermark(self, payload: str) -> None:
        """A row of the signal table, committed on its own: the binlog carries it in order."""
        conn = self._snapshot_session()
        try:
            query(conn, f"INSERT INTO {catalog.qualified(self.signal)} (id, payload) VALUES "
                        "(%s, %s) ON DUPLICATE KEY UPDATE payload = VALUES(payload)",
                  (self.name[:64], payload))
        except pymysql.err.MySQLError as exc:
            raise translate(self.config, exc) from None

    def chunk(self, table: TableId, after: Sequence[str] | None, size: int
              ) -> tuple[TableSchema, list[ChangeEvent | Record], list[str] | None]:
        """Up to ``size`` rows past ``after`` (the last key's JSON text) in key order, read with
        the snapshot's expressions and converters (keyset pagination as ``cdc verify``'s)."""
        from connectors.mysql.types import snapshot_expression

        leader = self._leader()
        leader._tables.pop(table, None)  # described afresh: a DDL may have changed it
        described = leader.table(table)
        captured = described.captured
        schema = captured.schema
        where = ""
        if after is not None:
            values = leader._values(described, after[0])
            if values is None:
                raise SourceError(f"source {self.name!r}: the incremental snapshot of {table} "
                                  f"cannot page past the key {after[0]}",
                                  "give the table a key without zero dates")
            where = f"WHERE {leader._compare(described, '>', values, alias='')}"
        columns = ", ".join(snapshot_expression(c) for c in captured.columns)
        sql = (f"SELECT {columns} FROM {catalog.qualified(table)} {where} "
               f"ORDER BY {leader._order(described, alias='')} LIMIT {int(size)}")
        ts_ms = int(time.time() * 1000)
        info = {"snapshot": "incremental", "file": "", "pos": 0, "row": 0,
                "server_id": self.server.server_id, "gtid": None, "thread": None,
                "query": None}
        placeholder = Position.mysql(0, 0, 0)
        events = [ChangeEvent(schema, Op.READ, placeholder, ts_ms,
                              after=captured.snapshot_row(values), source_info=dict(info))
                  for values in leader._query(sql, table)]
        last = None
        if len(events) == size:
            after_row = events[-1].after
            assert after_row is not None
            last = [encode_key(schema, schema.key_of(after_row)).decode()]
        return schema, [*events], last

    def absent(self, table: TableId, keys: Sequence[bytes]) -> list[bytes]:
        gone = self._leader().absent(table, [key.decode() for key in keys])
        return [str(text).encode() for text in gone]

    def estimate_rows(self, table: TableId) -> int | None:
        rows = self._leader()._query(
            "SELECT table_rows FROM information_schema.tables WHERE table_schema = "
            f"{self._leader().conn.escape(table.schema)} AND table_name = "
            f"{self._leader().conn.escape(table.table)}", table)
        return int(rows[0][0]) if rows and rows[0][0] else None

    def schema_of(self, table: TableId) -> TableSchema:
        return self._leader().table(table).captured.schema  # type: ignore[no-any-return]

    def close(self) -> None:
        self._stop.set()
        self._reader.close()
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()  # unblock a reader waiting to put
        self._thread.join(timeout=5)
        for conn in (self._catalog, self._snap, self._snap_leader):
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()


class BinlogReader:
    """The reader thread's work: binlog events in, chunks of stream items out."""

    def __init__(self, owner: MySqlStreaming, offset: MySqlOffset) -> None:
        self.owner = owner
        self.config = owner.config
        self.name = owner.name
        self.offset = offset
        self.file = offset.file
        self.file_seq = offset.file_seq
        self.gtids = _gtid_map(offset.gtid)
        self.captured: dict[TableId, CapturedTable] = {}
        self.by_table_id: dict[int, CapturedTable | None] = {}
        #: per table, the columns its last table map described (a new version when they change)
        self.maps: dict[TableId, list[Any]] = {}
        self.txn: _Txn | None = None
        self.fast = FastRows(owner.codec) if owner.codec is not None else None
        #: tables with column rules take the typed path: the dispatcher transforms their events
        self.ruled = {t for t in owner.tables if self.config.has_column_rules(t)}
        #: rows events encoded by the fast path and by the typed path (a diagnostic)
        self.fast_events = self.typed_events = 0
        settings = address(self.config).settings()
        self.stream = BinLogStreamReader(
            connection_settings=settings, server_id=self.config.replica_id,
            log_file=offset.file, log_pos=offset.pos, resume_stream=True, blocking=True,
            # is_mariadb=True would make the library ignore log_file/log_pos and dump from the
            # first binlog (or by GTID); MariaDB serves COM_BINLOG_DUMP by file and position,
            # which resumes exactly at our transaction boundary
            is_mariadb=False, slave_heartbeat=1.0, freeze_schema=True,
            only_events=[MariadbGtidEvent, GtidEvent, QueryEvent, XidEvent, RotateEvent,
                         HeartbeatLogEvent, TableMapEvent, WriteRowsEvent, UpdateRowsEvent,
                         DeleteRowsEvent],
            pymysql_wrapper=_connection_class(self.name), enable_logging=False)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stream.close()
        log.info("source %s: %d rows events encoded by the fast path (%s), %d by the typed "
                 "path", self.name, self.fast_events, implementation(), self.typed_events)

    @property
    def checksum(self) -> bool:
        """Whether events end in a CRC32 (the server's binlog_checksum, as negotiated)."""
        return bool(getattr(self.stream, "_BinLogStreamReader__use_checksum", False))

    def run(self) -> None:
        put, stop = self.owner._queue.put, self.owner._stop
        pending: list[StreamItem] = []
        try:
            for event in self.stream:
                if stop.is_set():
                    return
                items = self.handle(event)
                if not items:
                    continue
                pending += items
                # one hand-over per transaction (or per HANDOVER_EVENTS rows events of a big
                # one): the capture thread needs nothing before the transaction's checkpoint
                if items[-1].__class__ is Checkpoint or len(pending) >= HANDOVER_ITEMS:
                    put(pending)
                    pending = []
            if pending:
                put(pending)
            put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the capture thread
            if stop.is_set():
                return
            put(_error(self.config, exc))

    # -- events ------------------------------------------------------------------------------
    def handle(self, event: Any) -> list[StreamItem]:
        kind = event.__class__
        if kind in (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent):
            return self.rows(event)
        if kind is TableMapEvent:
            self.table_map(event)
            return []
        if kind is XidEvent:
            return self.commit(event)
        if kind is MariadbGtidEvent or kind is GtidEvent:
            self.txn = _Txn(event.gtid, event.packet.log_pos - event.event_size)
            return []
        if kind is QueryEvent:
            return self.query(event)
        if kind is RotateEvent:
            self.file = event.next_binlog
            self.file_seq = catalog.file_sequence(self.file)
            return []
        if kind is HeartbeatLogEvent:
            return self.idle(event)
        return []

    def _offset(self, pos: int) -> MySqlOffset:
        return self.offset.replace(file=self.file, file_seq=self.file_seq, pos=pos,
                                   gtid=_gtid_text(self.gtids))

    def commit(self, event: Any) -> list[StreamItem]:
        txn, self.txn = self.txn, None
        if txn is not None and txn.gtid:
            _advance(self.gtids, txn.gtid)
        return [Checkpoint(self._offset(event.packet.log_pos))]

    def idle(self, event: Any) -> list[StreamItem]:
        if self.txn is not None or not event.packet.log_pos:
            return []
        if event.ident and event.ident != self.file:
            return []
        return [Checkpoint(self._offset(event.packet.log_pos))]

    def query(self, event: Any) -> list[StreamItem]:
        text = event.query.strip()
        upper = text[:16].upper()
        if upper.startswith("BEGIN"):
            if self.txn is None:
                self.txn = _Txn(None, event.packet.log_pos - event.event_size)
            return []
        if upper.startswith("COMMIT"):
            return self.commit(event)
        schema = event.schema.decode() if isinstance(event.schema, bytes) else str(event.schema)
        dml = _DML.match(text)
        if dml:
            raise SourceError(  # the verb only: the statement's values may be masked columns'
                f"source {self.name!r}: a DML statement ({dml.group(1).upper()}) arrived as a "
                f"query event at {self.file}:{event.packet.log_pos - event.event_size} (a "
                "session with binlog_format STATEMENT or MIXED)",
                "make every session write ROW events (SET GLOBAL binlog_format='ROW', and do "
                "not let sessions change it; reconnect the writers), then re-bootstrap this "
                "source: the statement's changes are not in the log")
        self._renames(text, schema, event)
        items: list[StreamItem] = []
        start = event.packet.log_pos - event.event_size
        for match, what in ((_TRUNCATE.match(text), "truncate"), (_DROP.match(text), "drop")):
            if match is None:
                continue
            for table in _names(match.group(1), schema):
                captured = self.captured.get(table) or self._known(table)
                if captured is None:
                    continue
                if what == "drop":
                    log.warning("source %s: table %s was dropped; its rows are tombstoned in "
                                "the log", self.name, table)
                    self.captured.pop(table, None)
                items.append(ChangeEvent(
                    captured.schema, Op.TRUNCATE, Position.mysql(self.file_seq, start, 0),
                    event.timestamp * 1000,
                    source_info=self._info(event, 0, query=text[:1000])))
        if self.txn is not None and self.txn.gtid:
            _advance(self.gtids, self.txn.gtid)
        self.txn = None
        # the table-id map is kept: a DDL that changes a table gives it a new table id (and a new
        # table-map event); the library sends the map of an id it has seen only once
        # (freeze_schema), so forgetting ours here would drop every later change of every
        # captured table after any unrelated statement (a GRANT, a CREATE TABLE)
        items.append(Checkpoint(self._offset(event.packet.log_pos)))
        return items

    def _renames(self, text: str, schema: str, event: Any) -> None:
        """Refuse a DDL that renames a captured table away: its later changes would carry a
        name capture does not follow, and be lost without a word."""
        pairs: list[tuple[TableId, TableId]] = []
        match = _RENAME.match(text)
        if match is not None:
            names = _names(re.sub(r"(?i)\bTO\b", ",", match.group(1)), schema)
            pairs = list(zip(names[0::2], names[1::2], strict=False))
        altered = _ALTER_RENAME.match(text)
        if altered is not None:
            old = _names(altered.group(1), schema)
            new = _names(altered.group(2), schema)
            if old and new:
                pairs.append((old[0], new[0]))
        for old_name, new_name in pairs:
            if old_name in self.owner.tables and new_name not in self.owner.tables:
                raise SourceError(
                    f"source {self.name!r}: captured table {old_name} was renamed to {new_name} "
                    f"at {self.file}:{event.packet.log_pos - event.event_size}; its later "
                    "changes would not be captured",
                    f"add {new_name} to the source's tables: (and remove {old_name}), then run "
                    f"`cdc bootstrap --source {self.name}`; or rename it back")

    def _known(self, table: TableId) -> CapturedTable | None:
        """A captured table not seen in this session yet, described from information_schema."""
        if table not in self.owner.tables:
            return None
        info = catalog.table_info(self.owner._catalog, self.name, table)
        captured = build(self.config, table, info.columns, info.primary_key)
        self.captured[table] = captured
        return captured

    def table_map(self, event: Any) -> None:
        table = TableId(event.schema, event.table)
        if table == self.owner.signal:
            self.by_table_id[event.table_id] = SIGNAL  # type: ignore[assignment]
            return
        if table not in self.owner.tables:
            self.by_table_id[event.table_id] = None
            return
        meta = getattr(event, "optional_metadata", None)
        named = bool(getattr(meta, "column_name_list", None))
        columns = prepare_table_map(event)
        if not named or any(not c.name or c.name.startswith("UNKNOWN_COL") for c in columns):
            raise SourceError(f"source {self.name!r}: the table-map event of {table} at "
                              f"{self.file}:{event.packet.log_pos} carries no column names",
                              "SET GLOBAL binlog_row_metadata = 'FULL' (and in my.cnf), then "
                              "re-bootstrap: events written without it cannot be decoded")
        known = self.captured.get(table)
        if known is not None and self.maps.get(table) == columns:
            self.by_table_id[event.table_id] = known
            return
        self.maps[table] = columns
        info = None
        with contextlib.suppress(SourceError):
            info = catalog.table_info(self.owner._catalog, self.name, table)
        refined = refine(columns, info.columns) if info is not None else columns
        pk = [columns[i].name for i in _primary_key(event)]
        captured = build(self.config, table, refined, pk or (info.primary_key if info else ()))
        self.captured[table] = captured
        self.by_table_id[event.table_id] = captured

    def rows(self, event: Any) -> list[StreamItem]:
        captured = self.by_table_id.get(event.table_id)
        if captured is None:
            return []
        start = event.packet.log_pos - event.event_size
        if captured is SIGNAL:
            return self._watermarks(event, start)
        _whole(self, captured, event)  # before any decoding: a partial image misreads
        if self.fast is not None and captured.schema.table not in self.ruled:
            with contextlib.suppress(Fallback):
                items = self.fast.rows(self, event, captured, start)
                self.fast_events += 1
                return items
        self.typed_events += 1
        txn = self.txn or _Txn(None, start)
        if self.txn is None:
            self.txn = txn
        kind = event.__class__
        schema = captured.schema
        ts_ms = event.timestamp * 1000
        out: list[StreamItem] = []
        ordinal = 0
        for index, row in enumerate(event.rows):
            if kind is UpdateRowsEvent:
                before = captured.binlog_row(row["before_values"])
                after = captured.binlog_row(row["after_values"])
                if schema.key_of(before) != schema.key_of(after):
                    ordinal += 1
                    out.append(self._event(captured, Op.DELETE, before, None, start, ordinal,
                                           index, ts_ms, event, txn))
                    ordinal += 1
                    out.append(self._event(captured, Op.CREATE, None, after, start, ordinal,
                                           index, ts_ms, event, txn))
                    continue
                ordinal += 1
                out.append(self._event(captured, Op.UPDATE, before, after, start, ordinal,
                                       index, ts_ms, event, txn))
            else:
                values = row["values"]
                image = captured.binlog_row(values)
                ordinal += 1
                if kind is WriteRowsEvent:
                    out.append(self._event(captured, Op.CREATE, None, image, start, ordinal,
                                           index, ts_ms, event, txn))
                else:
                    out.append(self._event(captured, Op.DELETE, image, None, start, ordinal,
                                           index, ts_ms, event, txn))
        return out

    def _watermarks(self, event: Any, start: int) -> list[StreamItem]:
        """The signal table's rows: watermarks of incremental snapshots, at this event's
        place (rows logged there take positions after it, before the next event)."""
        out: list[StreamItem] = []
        file_seq = self.file_seq
        for row in event.rows:
            values = row.get("after_values") or row.get("values") or {}
            payload = values.get("payload")
            if isinstance(payload, bytes):
                payload = payload.decode(errors="replace")
            if isinstance(payload, str):
                out.append(Watermark(payload, functools.partial(_signal_position, file_seq,
                                                                start)))
        return out

    def _info(self, event: Any, row: int, query: str | None = None) -> dict[str, Any]:
        return {"snapshot": "false", "server_id": event.packet.server_id,
                "gtid": self.txn.gtid if self.txn else None, "file": self.file,
                "pos": event.packet.log_pos - event.event_size, "row": row, "thread": None,
                "query": query}

    def _event(self, captured: CapturedTable, op: Op, before: dict[str, Any] | None,
               after: dict[str, Any] | None, start: int, ordinal: int, index: int, ts_ms: int,
               event: Any, txn: _Txn) -> ChangeEvent:
        txn.total += 1
        table = captured.schema.table
        txn.per_table[table] = txn.per_table.get(table, 0) + 1
        return ChangeEvent(captured.schema, op, Position.mysql(self.file_seq, start, ordinal),
                           ts_ms, before=before, after=after,
                           source_info=self._info(event, index),
                           transaction=TransactionInfo(txn.id(self.file), txn.total,
                                                       txn.per_table[table]))


class _Txn:
    __slots__ = ("gtid", "start", "total", "per_table")

    def __init__(self, gtid: str | None, start: int) -> None:
        self.gtid = gtid
        self.start = start
        self.total = 0
        self.per_table: dict[TableId, int] = {}

    def id(self, file: str) -> str:
        return self.gtid or f"{file}:{self.start}"


def _primary_key(event: Any) -> list[int]:
    meta = getattr(event, "optional_metadata", None)
    if meta is None:
        return []
    keys = list(getattr(meta, "simple_primary_key_list", []) or [])
    keys += list((getattr(meta, "primary_keys_with_prefix", None) or {}).keys())
    return keys


def _whole(reader: BinlogReader, captured: CapturedTable, event: Any) -> None:
    """Refuse a rows event whose row images lack columns (a session with a MINIMAL or NOBLOB
    row image): its columns-present bitmaps must name every column."""
    count = len(event.columns) if getattr(event, "columns", None) else len(captured.columns)
    for name in ("columns_present_bitmap", "columns_present_bitmap2"):
        bitmap = getattr(event, name, None)
        if bitmap is not None and BitCount(bitmap) < count:
            raise SourceError(
                f"source {reader.name!r}: a row of {captured.schema.table} at {reader.file}:"
                f"{event.packet.log_pos - event.event_size} is not a whole row image (a session "
                "with binlog_row_image MINIMAL or NOBLOB)",
                "make every session log whole rows (SET GLOBAL binlog_row_image='FULL' and "
                "reconnect the writers), then re-bootstrap this source: followers cannot be "
                "rebuilt from partial rows")


def _gtid_map(text: str | None) -> dict[str, str]:
    """``"0-1-42,1-2-7"`` as {domain: gtid}."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if part.count("-") == 2:
            out[part.split("-", 1)[0]] = part
        elif part:
            out[part] = part  # MySQL's uuid:interval form, kept as it is
    return out


def _advance(gtids: dict[str, str], gtid: str) -> None:
    if gtid.count("-") == 2:
        gtids[gtid.split("-", 1)[0]] = gtid


def _gtid_text(gtids: dict[str, str]) -> str | None:
    return ",".join(gtids[k] for k in sorted(gtids, key=_domain_key)) or None


def _domain_key(domain: str) -> tuple[int, str]:
    return (int(domain), "") if domain.isdigit() else (1 << 62, domain)


def _error(config: MySqlSourceConfig, exc: BaseException) -> BaseException:
    """The exception to hand over: library and driver errors made ours."""
    if isinstance(exc, SourceError):
        return exc
    if isinstance(exc, pymysql.err.MySQLError):
        if exc.args and exc.args[0] == 4052:  # ER_SLAVE_SAME_ID: another replica took our id
            return SourceError(f"source {config.name!r}: another replica connected to the "
                               f"server with the same server_id ({config.replica_id}), and the "
                               "server dropped capture's connection",
                               "give this source a server_id that is unique among the server's "
                               "replicas (sources[].server_id), then start capture again")
        if exc.args and exc.args[0] == 1236:  # ER_MASTER_FATAL_ERROR_READING_BINLOG
            return SourceError(f"source {config.name!r}: the server refused the binlog dump: "
                               f"{exc.args[-1]}",
                               "if another replica uses the same id, set a unique server_id; "
                               f"if the binlog was purged, run `cdc bootstrap --source "
                               f"{config.name}` again")
        return translate(config, exc)
    if isinstance(exc, OSError | EOFError | struct.error):
        return SourceUnavailable(f"source {config.name!r}: the replication connection failed "
                                 f"({exc.__class__.__name__}: {exc})",
                                 "nothing to do: capture resumes from the log")
    return exc


def _long(value: int) -> bytes:
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _string(text: str) -> bytes:
    data = text.encode()
    return _long(len(data)) + data




#: the table map of the signal table (incremental snapshots' watermarks)
SIGNAL = object()


def _signal_position(file_seq: int, start: int, ordinal: int) -> Position:
    return Position.mysql(file_seq, start, ordinal)


class FastRows:
    """Rows events of tables with a fast plan (``rowcodec.py``) straight to log records, as
    one :class:`~cdc.source.EncodedBatch` per event; the envelope around the row images is
    written here, field by field in the registered schema's order."""

    def __init__(self, codec: EventCodec) -> None:
        self.codec = codec
        #: (captured table, table id) -> (plan or None, its table codec)
        self.plans: dict[tuple[int, int], tuple[Any, Any]] = {}
        #: (table codec, commit second, server id) -> the source block's fixed head and tail
        self._heads: dict[tuple[int, int, int], tuple[bytes | None, bytes]] = {}

    def _plan(self, captured: CapturedTable, event: Any) -> tuple[Any, Any]:
        cache = (id(captured), event.table_id)
        found = self.plans.get(cache)
        if found is None:
            codec = self.codec.table(captured.schema)
            plan = None
            table_map = event.table_map.get(event.table_id)
            if table_map is not None and codec.parts is not None:
                plan = plan_for(table_map.columns, captured.columns, codec.value_fields,
                                [c.type for c in captured.schema.columns],
                                captured.schema.key)
            found = self.plans[cache] = (plan, codec)
            if len(self.plans) > 4096:
                self.plans.clear()
        return found

    def rows(self, reader: BinlogReader, event: Any, captured: CapturedTable,
             start: int) -> list[StreamItem]:
        plan, codec = self._plan(captured, event)
        wrapper = event.packet
        if plan is None or wrapper._BinLogPacketWrapper__data_buffer:
            raise Fallback
        packet = wrapper.packet
        data, pos = packet._data, packet._position
        end = len(data) - (4 if reader.checksum else 0)
        kind = event.__class__
        decoded = decode_rows(plan, data, pos, end, kind is UpdateRowsEvent)
        txn = reader.txn or _Txn(None, start)
        reader.txn = txn
        schema = captured.schema
        table = schema.table
        topic = schema.topic
        ts_ms = event.timestamp * 1000
        processed = int(time.time() * 1000)
        times = b"".join(b"\x02" + _long(v) for v in
                         (processed, processed * 1000, processed * 1_000_000))
        prefix, suffix = self._source(codec, schema, ts_ms, reader, event, start)
        pieces = (codec.header, prefix, suffix, b"\x02" + _string(txn.id(reader.file)),
                  times + b"\x00")
        kind = 0 if kind is WriteRowsEvent else 1 if kind is DeleteRowsEvent else 2
        records, txn.total, per_table = build_records(
            decoded, kind, topic, pieces, txn.total, txn.per_table.get(table, 0),
            reader.file_seq, start, Record)
        txn.per_table[table] = per_table
        events = sum(1 for r in records if r.value is not None)
        return [EncodedBatch(records, (schema,), events, whole_rows=True,
                             transaction=txn.id(reader.file), ts_ms=ts_ms)]

    def _source(self, codec: Any, schema: Any, ts_ms: int, reader: BinlogReader, event: Any,
                start: int) -> tuple[bytes, bytes]:
        """The source block's bytes before and after its ``row`` field. The fields up to
        ``server_id`` change once a second at most: they are written by the registered
        schema's writers and cached; ``gtid``, ``file`` and ``pos`` are appended per event."""
        info = reader._info(event, 0)
        cache = (id(codec), ts_ms, info["server_id"])
        found = self._heads.get(cache)
        if found is None:
            found = self._heads[cache] = self._head(codec, schema, ts_ms, info)
            if len(self._heads) > 1024:
                self._heads.clear()
                self._heads[cache] = found
        head, suffix = found
        if head is None:
            raise Fallback
        out = bytearray(head)
        gtid = info["gtid"]
        if gtid is None:
            out.append(0)
        else:
            out.append(2)
            out += _string(gtid)
        out += _string(info["file"])
        out += _long(info["pos"])
        return bytes(out), suffix

    def _head(self, codec: Any, schema: Any, ts_ms: int, info: dict[str, Any]
              ) -> tuple[bytes | None, bytes]:
        """The fixed head and tail of the source block (None: not the expected layout)."""
        record = (codec.parts or {}).get("io.debezium.connector.mysql.Source")
        names = [name for name, _ in record or ()]
        if not names or names[-6:] != ["gtid", "file", "pos", "row", "thread", "query"]:
            return None, b""
        probe = ChangeEvent(schema, Op.CREATE, Position.mysql(0, 0, 0), ts_ms, after={},
                            source_info={**info, "thread": None, "query": None})
        block = self.codec.source_block(probe)
        head, tail = bytearray(), bytearray()
        for name, writer in record[:-6]:
            writer(block[name], head)
        for name, writer in record[-2:]:
            writer(block[name], tail)
        return bytes(head), bytes(tail)
