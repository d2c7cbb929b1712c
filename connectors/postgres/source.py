"""The PostgreSQL connector: a snapshot source and a streaming source that both yield
:class:`~cdc.events.ChangeEvent` s with :class:`~cdc.position.Position` s.

Positions: a streamed change is ``(commit LSN, stream, ordinal in its transaction)``; a snapshot
row is ``(consistent point LSN, snapshot, row number)``, which sorts before every change streamed
from that slot (their commit LSNs are past the consistent point).

Offsets (:class:`PostgresOffset`): ``lsn`` is the end LSN of the last transaction (or heartbeat
message) whose changes are all in the log; streaming resumes *after* it: a transaction whose
commit LSN is below it is skipped. :class:`PostgresStream` yields a :class:`~cdc.source.Checkpoint`
holding such an offset after each transaction's last change; once everything yielded before it
is durable, the caller stores it and calls :meth:`PostgresStream.confirm`. Streaming again from
a stored offset skips every transaction already covered, so nothing is delivered twice unless it
was never confirmed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import pq

from cdc.avro import EventCodec, write_long
from cdc.config import SourceConfig
from cdc.errors import CdcError
from cdc.events import ChangeEvent, Column, Op, TableId, TableSchema, TransactionInfo
from cdc.incremental import PREFIX as WATERMARK_PREFIX
from cdc.log.base import Record
from cdc.offsets import SourceOffset
from cdc.position import Position, format_lsn
from cdc.source import (
    Checkpoint,
    EncodedBatch,
    IncrementalSnapshotSource,
    Leader,
    StreamingSource,
    StreamItem,
    Watermark,
)
from connectors.postgres import catalog, pgoutput, rowcodec
from connectors.postgres.connection import SourceError, connect, describe
from connectors.postgres.replication import ReplicationStream, quote_ident, xlog_data
from connectors.postgres.types import PgType, pg_type

if TYPE_CHECKING:
    from cdc.columns import ColumnPolicies

HEARTBEAT_PREFIX = "cdc-heartbeat"
UNCHANGED = pgoutput.UNCHANGED_TOAST
#: the source block's fields the compiled change encoder writes itself (rowcodec.ChangePlan)
#: COPY bytes handed to the compiled row loop at a time
COPY_BATCH_BYTES = 1024 * 1024
VARYING_SOURCE_FIELDS = ("ts_ms", "sequence", "ts_us", "ts_ns", "txId", "lsn", "xmin")

log = logging.getLogger("cdc.capture")


def owned_slot(stored: SourceOffset | None) -> str | None:
    """The replication slot this log made for the source: the one its stored offset names
    (None: the log holds no offset of it). Only that slot is ever dropped or reused."""
    return stored.slot if isinstance(stored, PostgresOffset) and stored.slot else None


@dataclass(frozen=True, kw_only=True)
class PostgresOffset(SourceOffset):
    """Where a PostgreSQL source stands: resume after ``lsn`` (see the module doc)."""

    kind = "postgres"

    lsn: int = 0
    slot: str = ""
    #: the consistent point of the snapshot the source was bootstrapped from
    snapshot_lsn: str | None = None
    #: when the bootstrap started (ms since the epoch), while bootstrapping
    started_ms: int | None = None

    def order(self) -> tuple[int, ...]:
        return (self.lsn,)

    def describe(self) -> str:
        return format_lsn(self.lsn)


@dataclass
class CapturedTable:
    """A table's current schema and the text parser of each column, in column order."""

    schema: TableSchema
    parsers: list[PgType]
    #: (column name, text parser) per column, in order
    plan: list[tuple[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.plan = [(column.name, mapping.parse)
                     for column, mapping in zip(self.schema.columns, self.parsers, strict=True)]
        self._row_plans: tuple[Any, Any] = (None, None)  # (codec, its row plan)
        self._key_plan: tuple[rowcodec.KeyColumn, ...] | None = None

    def row_plan(self, codec: Any) -> tuple[rowcodec.Column, ...] | None:
        """The fast row encoder's plan for ``codec`` (a :class:`cdc.avro.TableCodec` of this
        table's schema); None when the codec has no compiled field writers."""
        if self._row_plans[0] is codec:
            return self._row_plans[1]  # type: ignore[no-any-return]
        plan = None
        if codec.value_writers is not None and codec.schema.columns == self.schema.columns:
            plan = rowcodec.row_plan(self.parsers, codec.value_fields, codec.value_writers,
                                     [c.type for c in self.schema.columns])
        self._row_plans = (codec, plan)
        return plan

    def key_plan(self) -> tuple[rowcodec.KeyColumn, ...]:
        """The plan of this table's key bytes from a text tuple."""
        if self._key_plan is None:
            self._key_plan = rowcodec.key_plan([c.name for c in self.schema.columns],
                                               self.schema.key, self.parsers,
                                               [c.type for c in self.schema.columns])
        return self._key_plan

    def row(self, values: tuple[object, ...]) -> dict[str, Any]:
        if len(values) != len(self.plan):
            raise SourceError(f"{self.schema.table}: a tuple of {len(values)} columns for a "
                              f"schema of {len(self.plan)}",
                              "restart capture; report it if it repeats")
        unchanged = pgoutput.UNCHANGED_TOAST
        return {name: None if value is None or value is unchanged else parse(value)
                for (name, parse), value in zip(self.plan, values, strict=False)}


def database_of(source: SourceConfig) -> str:
    return describe(source).rsplit("/", 1)[-1]


class PostgresSource:
    """Checks, snapshots and streams one configured PostgreSQL source."""

    def __init__(self, config: SourceConfig) -> None:
        self.config = config
        self.name = config.name
        self.database = database_of(config)
        self.tables = [TableId.parse(t) for t in config.tables]

    # -- checks and catalog ------------------------------------------------------------------
    def check(self, conn: psycopg.Connection[Any]) -> dict[TableId, CapturedTable]:
        """Validate server, role and tables; return each table's schema."""
        catalog.check_server(conn, self.name)
        catalog.check_role(conn, self.name)
        out = {}
        for table in self.tables:
            info = catalog.table_info(conn, self.name, table)
            key = catalog.key_columns(info, self.name, self.config.keys.get(str(table)))
            schema, parsers = catalog.table_schema(conn, self.name, self.database, info, key)
            out[table] = CapturedTable(_keys_required(schema), parsers)
        return out

    def connect(self, replication: bool = False) -> psycopg.Connection[Any]:
        return connect(self.config, replication=replication)

    # -- snapshot ----------------------------------------------------------------------------
    def create_slot(self, replication: psycopg.Connection[Any]) -> tuple[int, str]:
        """(consistent point LSN, exported snapshot name) of a new pgoutput slot."""
        slot = self.config.slot_name
        result = replication.pgconn.exec_(
            f"CREATE_REPLICATION_SLOT {quote_ident(slot)} LOGICAL pgoutput EXPORT_SNAPSHOT"
            .encode())
        if result.status != pq.ExecStatus.TUPLES_OK:
            message = (result.error_message or b"").decode(errors="replace").strip()
            if "all replication slots are in use" in message:
                raise SourceError(f"source {self.name!r}: {message}",
                                  "drop an unused slot or raise max_replication_slots")
            raise SourceError(f"source {self.name!r}: cannot create slot {slot!r}: {message}",
                              "check the role's REPLICATION attribute and max_replication_slots")
        lsn_text = (result.get_value(0, 1) or b"").decode()
        snapshot = (result.get_value(0, 2) or b"").decode()
        high, low = lsn_text.split("/")
        return (int(high, 16) << 32) | int(low, 16), snapshot

    def snapshot_rows(self, conn: psycopg.Connection[Any], captured: CapturedTable,
                      consistent_lsn: int, first_row: int, ts_ms: int,
                      codec: EventCodec | None = None, columns: Any = None
                      ) -> Iterator[ChangeEvent | EncodedBatch]:
        """Every row of a table as op ``r`` events, read with COPY inside the open snapshot
        transaction of ``conn``. Row numbers continue from ``first_row``. With a codec, rows
        are encoded straight from COPY's bytes into log records (rowcodec.encode_copy) and
        yielded as EncodedBatch es (with the runner's column rules, ``columns``, applied as the
        dispatcher would); a row that loop declines is yielded as an event."""
        schema = captured.schema
        selected = ", ".join(quote_ident(c.name) for c in schema.columns)
        query = f"COPY (SELECT {selected} FROM {catalog.qualified(schema.table)}) TO STDOUT"
        source_info = {"snapshot": "true", "lsn": consistent_lsn, "txId": None,
                       "sequence": json.dumps([None, format_lsn(consistent_lsn)])}
        plan = None
        ruled = self.config.has_column_rules(schema.table)
        if codec is not None and (not ruled or columns is not None):
            plan = copy_plan(codec, captured, consistent_lsn, ts_ms, source_info,
                             columns.get(schema.table) if ruled else None)
        with conn.cursor() as cursor, cursor.copy(query) as copy:
            if plan is not None:
                yield from self._encoded_copy(copy, plan, captured, first_row, ts_ms,
                                              source_info, consistent_lsn)
                return
            number = first_row
            width = len(captured.plan)
            text_rows = rowcodec.TextRows
            for values in copy.rows():
                number += 1
                if len(values) != width:
                    captured.row(values)  # raises, naming the problem
                yield ChangeEvent(schema, Op.READ,
                                  Position.postgres(consistent_lsn, number, snapshot=True),
                                  ts_ms, source_info=source_info,
                                  raw=text_rows(captured, None, values))

    def _encoded_copy(self, copy: Any, plan: rowcodec.CopyPlan, captured: CapturedTable,
                      number: int, ts_ms: int, source_info: dict[str, Any], lsn: int
                      ) -> Iterator[ChangeEvent | EncodedBatch]:
        """COPY's bytes, about a megabyte at a time, through rowcodec.encode_copy."""
        rest = b""
        ended = False
        while not ended:
            pending = [rest]
            size = 0
            while size < COPY_BATCH_BYTES:
                chunk = copy.read()
                if not chunk:
                    ended = True
                    break
                pending.append(bytes(chunk))
                size += len(chunk)
            data = b"".join(pending)
            items, at, number = encode_copy_data(
                plan, data, number, captured,
                lambda n, values: ChangeEvent(
                    captured.schema, Op.READ, Position.postgres(lsn, n, snapshot=True), ts_ms,
                    source_info=source_info, raw=rowcodec.TextRows(captured, None, values)))
            for item in items:
                yield (EncodedBatch(item, (plan[7],), len(item)) if isinstance(item, list)
                       else item)
            rest = data[at:]
        if rest:
            raise SourceError(f"source {self.name!r}: the COPY of {captured.schema.table} "
                              "ended inside a row", "run `cdc bootstrap` again; report it if it "
                              "repeats")

    def count_rows(self, conn: psycopg.Connection[Any], table: TableId) -> int:
        """An estimate of a table's row count, for progress bars."""
        row = conn.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                           (catalog.qualified(table),)).fetchone()
        return max(int(row[0]), 0) if row and row[0] is not None else 0

    # -- streaming ---------------------------------------------------------------------------
    def stream(self, offset: PostgresOffset, leader: Callable[[], Leader],
               codec: EventCodec | None = None, status_interval: float = 5.0
               ) -> PostgresStream:
        """A streaming session resuming after ``offset``; ``leader`` opens the leader its
        incremental snapshots' sweep looks keys up in (on first use)."""
        return PostgresStream(self, offset, leader, codec, status_interval)


def encode_copy_data(plan: rowcodec.CopyPlan, data: bytes, number: int,
                     captured: CapturedTable,
                     event: Callable[[int, tuple[str | None, ...]], ChangeEvent]
                     ) -> tuple[list[list[Record] | ChangeEvent], int, int]:
    """The whole rows of COPY text ``data`` as log records, through rowcodec.encode_copy:
    (runs of records and, between them, the events of rows that loop declined, made by
    ``event(row number, column texts)``; where the rows ended in ``data``, i.e. the start of
    a row cut short or ``len(data)``; the last row number). Rows are numbered on from
    ``number``. A row of the wrong column count raises, naming the problem."""
    encode = rowcodec.ENCODE_COPY
    items: list[list[Record] | ChangeEvent] = []
    at, times = 0, _times()
    while True:
        records: list[Record] = []
        at, number = encode(plan, data, at, number, records, Record, times)
        if records:
            items.append(records)
        end = data.find(b"\n", at)
        if end < 0:
            return items, at, number
        values = rowcodec.copy_fields(data[at:end])  # declined: the event path
        if len(values) != len(captured.plan):
            captured.row(values)  # raises, naming the problem
        number += 1
        items.append(event(number, values))
        at = end + 1


def _snapshot_position(commit_lsn: int, ordinal: int) -> Position:
    """The position of the ``ordinal``-th row logged at a watermark committed at
    ``commit_lsn``: after every change committed before it, before every one after."""
    return Position.postgres(commit_lsn, ordinal, snapshot=True)


def _logged_plans(codec: EventCodec, captured: CapturedTable, policy: Any
                  ) -> tuple[TableSchema, Any, Any, Any, Any] | None:
    """What a compiled loop needs to write a table's rows as logged: (the schema logged, its
    table codec, row plan, key plan, the column rules for rowcodec._ruled or None). With
    ``policy`` (a :class:`cdc.columns.TablePolicy`) the schema is the rules' output and the
    plans are for its columns; None when the codec has no compiled writers for it."""
    if policy is None:
        table = codec.table(captured.schema)
        return captured.schema, table, captured.row_plan(table), captured.key_plan(), None
    rules = policy.projection(captured.schema)
    text = pg_type(25, -1, {})  # a masked or hashed value is text
    parsers = [text if kind in ("mask", "hash") else captured.parsers[index]
               for index, kind, _ in rules]
    projection = tuple((index, _RULE_CODES[kind], _rule_argument(
        kind, argument, captured.parsers[index])) for index, kind, argument in rules)
    schema = policy.schema(captured.schema)
    table = codec.table(schema)
    if table.value_writers is None:
        return None
    types = [c.type for c in schema.columns]
    row = rowcodec.row_plan(parsers, table.value_fields, table.value_writers, types)
    key = rowcodec.key_plan([c.name for c in schema.columns], schema.key, parsers, types)
    return schema, table, row, key, projection


def change_plan(codec: EventCodec, captured: CapturedTable, policy: Any = None
                ) -> rowcodec.ChangePlan | None:
    """A table's plan for rowcodec.encode_changes, or None (its changes then take the event
    path): a column type without compiled writers, or an envelope not of the usual shape.
    ``policy``: the table's column rules (:class:`cdc.columns.TablePolicy`), if it has any."""
    logged = _logged_plans(codec, captured, policy)
    if logged is None:
        return None
    schema, table, row, key, projection = logged
    probe = ChangeEvent(schema, Op.CREATE, Position.postgres(0, 0), 0, after={},
                        source_info={"txId": 0, "lsn": 0, "snapshot": "false"})
    pieces = codec.source_parts(table, probe, VARYING_SOURCE_FIELDS)
    if row is None or pieces is None or any(pieces[2:4] + pieces[5:]):
        return None
    return (schema.topic, row, key, table.header, pieces[0], pieces[1], pieces[4],
            schema.table, len(captured.schema.columns), schema,
            rowcodec.skip_plan(table.value_fields), projection)


#: rowcodec.encode_changes' codes of column rules (cdc/columns.py transforms)
_RULE_CODES = {None: 0, "null": 1, "mask": 2, "truncate": 3, "hash": 4}


def _rule_argument(kind: str | None, argument: Any, parser: PgType) -> Any:
    """A rule's argument as rowcodec._ruled takes it: the mask's UTF-8 bytes, the characters
    truncate keeps, or for hash the function of a value's text (parsed as the event path
    parses it) that gives the logged text."""
    if kind == "mask":
        return str(argument).encode()
    if kind == "hash":
        parse = parser.parse
        return lambda text: argument(parse(text))
    return argument or 0


def copy_plan(codec: EventCodec, captured: CapturedTable, lsn: int, ts_ms: int,
              source_info: dict[str, Any], policy: Any = None) -> rowcodec.CopyPlan | None:
    """A table's plan for rowcodec.encode_copy (snapshot rows at ``lsn``), or None (its rows
    then take the event path). ``policy``: the table's column rules, if it has any."""
    logged = _logged_plans(codec, captured, policy)
    if logged is None:
        return None
    schema, table, row, key, projection = logged
    probe = ChangeEvent(schema, Op.READ, Position.postgres(lsn, 0, snapshot=True), ts_ms,
                        after={}, source_info=source_info)
    pieces = codec.source_parts(table, probe, ())
    if row is None or pieces is None:
        return None
    return (schema.topic, row, key, table.header, pieces[0] + b"\x00\x02r",
            len(captured.schema.columns), lsn, schema, projection)


def _times(now_ms: int | None = None) -> bytes:
    """The envelope's processing times (ts_ms, ts_us, ts_ns) of changes encoded at
    ``now_ms`` (default: now)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if _TIMES[0] == now:
        return _TIMES[1]
    out = bytearray()
    for value in (now, now * 1000, now * 1_000_000):
        out.append(2)
        write_long(value, out)
    _TIMES[:] = [now, bytes(out)]
    return _TIMES[1]  # type: ignore[return-value]


_TIMES: list[Any] = [-1, b""]


def _unchanged_toast(captured: CapturedTable, change: pgoutput.Update) -> tuple[str, ...]:
    """Columns whose values PostgreSQL did not send (TOASTed and unchanged by the update)."""
    if pgoutput.UNCHANGED_TOAST not in change.new:
        return ()
    return tuple(column.name for column, value in zip(captured.schema.columns, change.new,
                                                      strict=True)
                 if value is pgoutput.UNCHANGED_TOAST)


def _keys_required(schema: TableSchema) -> TableSchema:
    """Non-key columns are nullable in the Avro schema: before images may be partial."""
    columns = tuple(Column(c.name, c.type, nullable=c.name not in schema.key)
                    for c in schema.columns)
    return TableSchema(schema.source, schema.database, schema.table, columns, schema.key,
                       schema.connector)


@dataclass
class _Transaction:
    xid: int
    commit_lsn: int
    commit_ms: int
    ordinal: int = 0
    #: changes per table so far, by the table's topic
    per_table: dict[str, int] = field(default_factory=dict)
    commit_text: str = ""
    txn_id: str = ""
    #: the envelope's transaction block up to its counters (union branch and id)
    txn_prefix: bytes = b""

    def __post_init__(self) -> None:
        self.commit_text = format_lsn(self.commit_lsn)
        self.txn_id = f"{self.xid}:{self.commit_lsn}"
        data = self.txn_id.encode()
        prefix = bytearray(b"\x02")
        write_long(len(data), prefix)
        self.txn_prefix = bytes(prefix) + data


class PostgresStream(StreamingSource, IncrementalSnapshotSource):
    """A live ``START_REPLICATION`` session from a stored offset, decoded into events and
    checkpoints (the connector checks the slot first: ``connector.py``)."""

    def __init__(self, source: PostgresSource, offset: PostgresOffset,
                 leader: Callable[[], Leader], codec: EventCodec | None = None,
                 status_interval: float = 5.0) -> None:
        self.source = source
        #: where the session started: every checkpoint's offset is this one at another LSN
        self.offset = offset
        #: with a codec, runs of plain row changes are encoded here into log records
        #: (rowcodec.encode_changes) and yielded as EncodedBatch es
        self.codec = codec
        #: relation oid -> its plan for encode_changes (None: its changes take the event path)
        self.plans: dict[int, rowcodec.ChangePlan | None] = {}
        #: the runner's previous images (StreamingSource.use_previous_images): with them,
        #: updates with unchanged TOAST values are encoded here too
        self.previous: Callable[[str, bytes, bytes], bytes | None] | None = None
        #: the runner's column rules (StreamingSource.use_column_rules): with them, tables
        #: with rules are encoded here too (as the rules say)
        self.columns: ColumnPolicies | None = None
        self.resume_lsn = offset.lsn
        #: opens the leader that absent() asks (on first use), and the one it opened
        self._open_leader = leader
        self._leader: Leader | None = None
        self.catalog_conn = source.connect()
        self.captured = source.check(self.catalog_conn)
        self.replication_conn = source.connect(replication=True)
        self.stream = ReplicationStream(self.replication_conn, source.config.slot_name,
                                        source.config.publication_name, offset.lsn,
                                        status_interval)
        self.relations: dict[int, CapturedTable] = {}
        self.last_message_at = time.monotonic()
        self._key_type_cache: dict[TableId, list[str]] = {}
        self._synchronous = False

    def describe(self) -> str:
        return format_lsn(self.offset.lsn)

    def use_previous_images(self, previous: Callable[[str, bytes, bytes], bytes | None]
                            ) -> None:
        self.previous = previous

    def use_column_rules(self, columns: ColumnPolicies) -> None:
        self.columns = columns

    def confirm(self, offset: SourceOffset) -> None:
        """``offset`` is durable in the log: the server may recycle WAL before it."""
        assert isinstance(offset, PostgresOffset)
        self.stream.confirm(offset.lsn)
        self.stream.send_status(force=True)

    def heartbeat(self) -> None:
        self.catalog_conn.execute("SELECT pg_logical_emit_message(false, %s, %s)",
                                  (HEARTBEAT_PREFIX, str(int(time.time() * 1000))))

    def close(self, timeout: float = 5.0) -> None:
        """Close the replication connection, wait (up to ``timeout`` s) until the server's
        walsender has let go of the slot, then close the rest.

        The walsender notices the closed socket asynchronously; without the wait, a capture
        that exited 0 could still show its slot ``active`` for a moment, and a capture
        restarted at once would be refused with "replication slot ... is active for PID ...".
        Before that, the stream is ended with ``CopyDone`` so the last confirmation is read,
        not reset away.
        """
        if self._leader is not None:
            with contextlib.suppress(Exception):
                self._leader.close()
        try:
            self._let_go_of_slot(timeout)
        except (psycopg.Error, OSError) as exc:  # a broken connection: nothing to wait for
            log.debug("closing the stream: %s", exc)
        finally:
            for conn in (self.replication_conn, self.catalog_conn):
                with contextlib.suppress(Exception):  # closing a broken connection may fail
                    conn.close()

    def _let_go_of_slot(self, timeout: float) -> None:
        walsender = self.replication_conn.info.backend_pid
        with contextlib.suppress(CdcError, psycopg.Error, OSError):
            if not self.stream.finish(timeout / 2):
                log.info("the server did not end the stream within %.1f s; closing it",
                         timeout / 2)
        self.replication_conn.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.catalog_conn.execute(
                "SELECT 1 FROM pg_replication_slots WHERE active_pid = %s",
                (walsender,)).fetchone():
            time.sleep(0.02)

    def items(self, idle_timeout: float) -> Iterator[StreamItem]:
        """Decoded changes (runs of plain row changes already encoded, as
        :class:`EncodedBatch` es, when the stream has a codec), a :class:`Checkpoint` after each
        transaction, ``None`` when idle."""
        self.stream.start()
        offset = self.offset
        txn: _Transaction | None = None
        skipping = False
        decode, fast = pgoutput.decode, self._fast_change
        insert, update, delete = pgoutput.Insert, pgoutput.Update, pgoutput.Delete
        plans = self.plans
        encode = rowcodec.ENCODE_CHANGES if self.codec is not None else None
        begin_struct, commit_struct = pgoutput.BEGIN, pgoutput.COMMIT
        epoch = pgoutput.PG_EPOCH_MICROS
        for batch in self.stream.batches(idle_timeout, raw=True):
            if batch is None:
                yield None
                continue
            index, count = 0, len(batch)
            times = _times()
            while index < count:
                if encode is not None and txn is not None and not skipping and plans:
                    records: list[Record] = []
                    touched: dict[str, TableSchema] = {}
                    index, changes = encode(plans, batch, index, txn, records, Record, times,
                                            touched, self.previous, {})
                    if changes:
                        yield EncodedBatch(records, list(touched.values()), changes,
                                           transaction=txn.txn_id, ts_ms=txn.commit_ms)
                    if index >= count:
                        break
                message = xlog_data(batch[index])
                index += 1
                payload = message.payload
                if payload[0] == 0x42:  # Begin and Commit, without the decoder's objects
                    final_lsn, commit_time, xid = begin_struct.unpack_from(payload, 1)
                    skipping = final_lsn < self.resume_lsn
                    txn = _Transaction(xid, final_lsn, (commit_time + epoch) // 1000)
                    continue
                if payload[0] == 0x43:
                    if not skipping:
                        yield Checkpoint(offset.replace(
                            lsn=commit_struct.unpack_from(payload, 1)[2]))
                    txn, skipping = None, False
                    continue
                decoded = decode(payload)
                kind = decoded.__class__
                if kind is insert or kind is update or kind is delete:
                    if skipping or txn is None:
                        continue
                    event = fast(decoded, txn, message.start_lsn)  # type: ignore[arg-type]
                    if event is None:
                        yield from self._row_change(decoded, txn,  # type: ignore[arg-type]
                                                    message.start_lsn)
                    else:
                        yield event
                    oid = decoded.relation_oid  # type: ignore[union-attr]
                    if encode is not None and oid not in plans:
                        # only now: the dispatcher has checked and registered its schema
                        plans[oid] = self._change_plan(oid)
                    continue
                if isinstance(decoded, pgoutput.Relation):
                    self.relations[decoded.oid] = self._relation(decoded)
                    plans.pop(decoded.oid, None)
                elif isinstance(decoded, pgoutput.Message):
                    if decoded.prefix == HEARTBEAT_PREFIX and txn is None:
                        # every transaction committed before the heartbeat was sent before it
                        yield Checkpoint(offset.replace(lsn=decoded.lsn))
                    elif decoded.prefix == WATERMARK_PREFIX and txn is not None and not skipping:
                        yield Watermark(decoded.content.decode(errors="replace"),
                                        functools.partial(_snapshot_position, txn.commit_lsn))
                elif skipping or txn is None:
                    continue
                elif isinstance(decoded, pgoutput.Truncate):
                    yield from self._truncate(decoded, txn, message.start_lsn)

    def _change_plan(self, oid: int) -> rowcodec.ChangePlan | None:
        captured = self.relations.get(oid)
        if captured is None or self.codec is None:
            return None
        compiled, policy = self._compiled_rules(captured)
        return change_plan(self.codec, captured, policy) if compiled else None

    def _compiled_rules(self, captured: CapturedTable) -> tuple[bool, Any]:
        """(whether the compiled loops may encode the table's rows, the column rules they
        apply or None). They may not without a codec, nor for a table with rules the runner
        has not handed over (cdc/columns.py then transforms its events first)."""
        if self.codec is None:
            return False, None
        if not self.source.config.has_column_rules(captured.schema.table):
            return True, None
        if self.columns is None:
            return False, None
        return True, self.columns.get(captured.schema.table)

    # -- incremental snapshots (cdc/incremental.py: IncrementalSnapshotSource) --------------
    def watermark(self, payload: str) -> None:
        """A transactional logical message of its own: the stream yields it in commit order."""
        if not self._synchronous:  # flushed at commit, so the stream sees it at once (with
            # synchronous_commit off it would wait for the WAL writer: wal_writer_delay)
            self.catalog_conn.execute("SET synchronous_commit TO on")
            self._synchronous = True
        self.catalog_conn.execute("SELECT pg_logical_emit_message(true, %s, %s)",
                                  (WATERMARK_PREFIX, payload))

    def chunk(self, table: TableId, after: Sequence[str] | None, size: int
              ) -> tuple[TableSchema, list[ChangeEvent | Record], list[str] | None]:
        """Up to ``size`` rows with a key above ``after`` (key texts), in key order, read with
        COPY and decoded exactly as the bootstrap decodes rows: with a codec, straight from
        COPY's bytes into log records (rowcodec.encode_copy, the runner's column rules
        applied; the schema returned is then the one they are logged in), a row that loop
        declines as an event."""
        captured = self.captured[table]
        schema = captured.schema
        key = ", ".join(quote_ident(k) for k in schema.key)
        columns = ", ".join(quote_ident(c.name) for c in schema.columns)
        where, params = "", None
        if after is not None:  # placeholders: every other % doubled
            casts = ", ".join(f"%s::{kind.replace('%', '%%')}"
                              for kind in self._key_types(table))
            key, columns = key.replace("%", "%%"), columns.replace("%", "%%")
            where, params = f"WHERE ({key}) > ({casts})", tuple(after)
        name = catalog.qualified(table)
        name = name if params is None else name.replace("%", "%%")
        query = (f"COPY (SELECT {columns} FROM {name} {where} ORDER BY {key} "
                 f"LIMIT {int(size)}) TO STDOUT")
        ts_ms = int(time.time() * 1000)
        info = {"snapshot": "incremental", "lsn": None, "txId": None, "sequence": None}
        plan = self._chunk_plan(captured, ts_ms, info)
        placeholder = Position.postgres(0, 0, snapshot=True)
        indexes = [[c.name for c in schema.columns].index(k) for k in schema.key]
        items: list[ChangeEvent | Record] = []
        values: Sequence[str | None] = ()

        def event(_: int, texts: Sequence[str | None]) -> ChangeEvent:
            if len(texts) != len(captured.plan):
                captured.row(texts)  # raises, naming the problem
            return ChangeEvent(schema, Op.READ, placeholder, ts_ms, source_info=dict(info),
                               raw=rowcodec.TextRows(captured, None, texts))
        try:
            with self.catalog_conn.cursor() as cursor, cursor.copy(query, params) as copy:
                if plan is None:
                    for values in copy.rows():
                        items.append(event(0, values))
                else:
                    data = b"".join(bytes(block) for block in iter(copy.read, b""))
                    encoded, at, _ = encode_copy_data(plan, data, 0, captured, event)
                    if at != len(data):
                        raise SourceError(f"source {self.source.name!r}: the COPY of a chunk "
                                          f"of {table} ended inside a row", "capture reads the "
                                          "chunk again; report it if it repeats")
                    for item in encoded:
                        if isinstance(item, list):
                            items.extend(item)
                        else:
                            items.append(item)
                    if data:  # the last row's key texts
                        values = rowcodec.copy_fields(data[data.rfind(b"\n", 0, -1) + 1:-1])
        except (psycopg.OperationalError, psycopg.InterfaceError):
            raise  # the connection went away: capture reconnects, the chunk is read again
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SourceError(f"source {self.source.name!r}: a chunk of {table} cannot be read: "
                              f"{first}", f"if {table} was altered meanwhile, run `cdc snapshot "
                              f"--table {table}` again") from None
        last = [str(values[i]) for i in indexes] if len(items) == size else None
        return (schema if plan is None else plan[7]), items, last

    def estimate_rows(self, table: TableId) -> int | None:
        return self.source.count_rows(self.catalog_conn, table) or None

    def schema_of(self, table: TableId) -> TableSchema:
        return self.captured[table].schema

    def absent(self, table: TableId, keys: Sequence[bytes]) -> list[bytes]:
        if self._leader is None:
            self._leader = self._open_leader()
        gone = self._leader.absent(table, [key.decode() for key in keys])
        return [text.encode() for text in gone]

    def _chunk_plan(self, captured: CapturedTable, ts_ms: int, info: dict[str, Any]
                    ) -> rowcodec.CopyPlan | None:
        """The encode_copy plan of a chunk's rows (their positions are placeholders: the
        caller replaces them), or None when they take the event path."""
        compiled, policy = self._compiled_rules(captured)
        if self.codec is None or not compiled:
            return None
        return copy_plan(self.codec, captured, 0, ts_ms, info, policy)

    def _key_types(self, table: TableId) -> list[str]:
        """The SQL types of ``table``'s key columns, in key order (for the chunks' bounds)."""
        found = self._key_type_cache.get(table)
        if found is None:
            schema = self.captured[table].schema
            rows = dict(self.catalog_conn.execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attname = ANY(%s) AND NOT attisdropped",
                (catalog.qualified(table), list(schema.key))).fetchall())
            found = self._key_type_cache[table] = [str(rows[k]) for k in schema.key]
        return found

    def _relation(self, relation: pgoutput.Relation) -> CapturedTable:
        table = TableId(relation.namespace, relation.name)
        known = self.captured.get(table)
        key = known.schema.key if known else tuple(c.name for c in relation.columns if c.is_key)
        oids = {c.type_oid for c in relation.columns}
        types = catalog.type_catalog(self.catalog_conn, oids)
        parsers = catalog.with_icu_orders(
            self.catalog_conn, relation.oid, [c.name for c in relation.columns],
            [pg_type(c.type_oid, c.type_modifier, types) for c in relation.columns])
        columns = tuple(Column(c.name, p.column_type, nullable=c.name not in key)
                        for c, p in zip(relation.columns, parsers, strict=True))
        schema = TableSchema(self.source.name, self.source.database, table, columns, key,
                             connector="postgresql")
        captured = CapturedTable(schema, parsers)
        self.captured[table] = captured
        return captured

    def _event(self, captured: CapturedTable, txn: _Transaction, lsn: int, op: Op,
               before: dict[str, Any] | None, after: dict[str, Any] | None,
               unchanged: tuple[str, ...] = (), raw: rowcodec.TextRows | None = None
               ) -> ChangeEvent:
        txn.ordinal += 1
        table = captured.schema.topic
        txn.per_table[table] = txn.per_table.get(table, 0) + 1
        return ChangeEvent(
            captured.schema, op, Position.postgres(txn.commit_lsn, txn.ordinal), txn.commit_ms,
            before=before, after=after,
            source_info={"txId": txn.xid, "lsn": lsn, "xmin": None, "snapshot": "false",
                         # [commit LSN, change LSN]: the same on every replay
                         "sequence": f'["{txn.commit_text}","{format_lsn(lsn)}"]'},
            transaction=TransactionInfo(txn.txn_id, txn.ordinal, txn.per_table[table]),
            unchanged=unchanged, raw=raw,
        )

    def _fast_change(self, change: pgoutput.Insert | pgoutput.Update | pgoutput.Delete,
                     txn: _Transaction, lsn: int) -> ChangeEvent | None:
        """The event of an insert, a delete or a plain update (key unchanged, default replica
        identity) with its text tuples kept raw; None for anything else (see _row_change)."""
        captured = self.relations.get(change.relation_oid)
        if captured is None:
            return None
        old: pgoutput.TupleData | None = None
        new: pgoutput.TupleData | None = None
        unchanged: tuple[str, ...] = ()
        if isinstance(change, pgoutput.Insert):
            op, new = Op.CREATE, change.new
        elif isinstance(change, pgoutput.Delete):
            op, old = Op.DELETE, change.old
        elif change.old is None:
            op, new = Op.UPDATE, change.new
            if UNCHANGED in new:
                unchanged = _unchanged_toast(captured, change)
        else:
            return None
        image = new if new is not None else old
        if image is None or len(image) != len(captured.plan):
            return None  # _row_change says what is wrong
        txn.ordinal += 1
        table = captured.schema.topic
        per_table = txn.per_table[table] = txn.per_table.get(table, 0) + 1
        return ChangeEvent(
            captured.schema, op, Position.postgres(txn.commit_lsn, txn.ordinal), txn.commit_ms,
            source_info={"txId": txn.xid, "lsn": lsn, "xmin": None, "snapshot": "false",
                         # [commit LSN, change LSN]: the same on every replay
                         "sequence": f'["{txn.commit_text}","{format_lsn(lsn)}"]'},
            transaction=TransactionInfo(txn.txn_id, txn.ordinal, per_table),
            unchanged=unchanged, raw=rowcodec.TextRows(captured, old, new))

    def _row_change(self, change: pgoutput.Insert | pgoutput.Update | pgoutput.Delete,
                    txn: _Transaction, lsn: int) -> Iterator[ChangeEvent]:
        captured = self.relations.get(change.relation_oid)
        if captured is None:
            raise SourceError(f"a change for relation {change.relation_oid} arrived before its "
                              "Relation message", "restart capture; report it if it repeats")
        if isinstance(change, pgoutput.Insert):
            yield self._event(captured, txn, lsn, Op.CREATE, None, captured.row(change.new))
            return
        if isinstance(change, pgoutput.Delete):
            yield self._event(captured, txn, lsn, Op.DELETE, captured.row(change.old), None)
            return
        after = captured.row(change.new)
        before = captured.row(change.old) if change.old is not None else None
        schema = captured.schema
        unchanged = _unchanged_toast(captured, change)
        if unchanged and change.old is not None and not change.old_is_key_only:
            # REPLICA IDENTITY FULL: the old tuple is whole (PostgreSQL detoasts it)
            assert before is not None
            old = dict(zip((c.name for c in schema.columns), change.old, strict=True))
            for name in unchanged:
                if old[name] is not pgoutput.UNCHANGED_TOAST:
                    after[name] = before[name]
            unchanged = tuple(n for n in unchanged if old[n] is pgoutput.UNCHANGED_TOAST)
        if before is not None and schema.key_of(before) != schema.key_of(after):
            # the primary key changed: the old key is deleted, the new one created
            delete = self._event(captured, txn, lsn, Op.DELETE, before, None)
            create = self._event(captured, txn, lsn, Op.CREATE, None, after, unchanged)
            if unchanged:  # their values are in the old key's image: one step for both
                create.replaces = delete
            else:
                yield delete
            yield create
            return
        if before is not None and change.old_is_key_only:
            before = None  # only the key was sent; Debezium then reports no before image
        yield self._event(captured, txn, lsn, Op.UPDATE, before, after, unchanged)

    def _truncate(self, truncate: pgoutput.Truncate, txn: _Transaction,
                  lsn: int) -> Iterator[ChangeEvent]:
        for oid in truncate.relation_oids:
            captured = self.relations.get(oid)
            if captured is not None:
                yield self._event(captured, txn, lsn, Op.TRUNCATE, None, None)
