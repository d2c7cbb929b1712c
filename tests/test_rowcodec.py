"""The fast row path (text tuples straight to Avro bytes) writes exactly the typed path's bytes.

Every check runs against both implementations: the pure-Python one and the compiled one
(``connectors/postgres/_fast``, built by ``pip install -e .``).
"""

from __future__ import annotations

import contextlib
import importlib
import random
import shutil
import string
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cdc.avro
from cdc.avro import EventCodec
from cdc.errors import EncodingError
from cdc.events import ChangeEvent, Column, Op, TableId, TableSchema, TransactionInfo, encode_key
from cdc.log.base import Record
from cdc.log.schemas import SchemaStore
from cdc.position import Position
from connectors.postgres import pgoutput, rowcodec
from connectors.postgres.source import CapturedTable, _keys_required
from connectors.postgres.types import pg_type

U = pgoutput.UNCHANGED_TOAST


def _typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


# (column, type oid, type modifier, text values the server could print)
COLUMNS: list[tuple[str, int, int, list[str]]] = [
    ("id", 20, -1, []),  # the key: filled per row
    ("i2", 21, -1, ["0", "-32768", "32767", "7"]),
    ("i4", 23, -1, ["-2147483648", "2147483647", "63", "64", "-65"]),
    ("b", 16, -1, ["t", "f"]),
    ("f4", 700, -1, ["1.5", "-0", "NaN", "Infinity", "-Infinity", "3.4028235e+38", "1e-45"]),
    ("f8", 701, -1, ["0.1", "-1.2345678901234567e-300", "NaN", "-Infinity", "1e+308"]),
    ("t", 25, -1, ["", "héllo \U0001F600 'x' \"y\"", "x" * 300, "tab\there\\"]),
    ("vc", 1043, -1, ["name-1", "ü" * 70]),
    ("js", 3802, -1, ['{"a": [1, null, "x"], "b": {"c": 2}}', "[]", '"s"']),
    ("u", 2950, -1, ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
                     "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",  # not canonical: typed path
                     "a0eebc999c0b4ef8bb6d6bb9bd380a11"]),
    ("n", 1700, -1, ["0", "-12.500", "123456789012345678901234567890.1234567890123", "NaN",
                     "Infinity", "-Infinity", "0.000001", "1e5", "007", "-0"]),
    ("d", 1700, _typmod(12, 2), ["0.00", "-1234.56", "9999999999.99", "NaN", "12.3", "12",
                                 "-0.01", "0.5"]),
    ("d0", 1700, _typmod(5, 0), ["0", "-99999", "12345", "NaN"]),
    ("tz", 1184, -1, ["2024-01-01 00:00:00+00", "2024-02-29 23:59:59.5+00",
                      "0001-01-01 00:00:00+00", "9999-12-31 23:59:59.999999+00",
                      "2000-06-15 12:34:56.123+00", "infinity", "-infinity",
                      "0044-03-15 12:00:00+00 BC", "10000-01-01 00:00:00+00",
                      "2024-01-01 10:00:00+05:30"]),
    ("ts", 1114, -1, ["2024-01-01 00:00:00", "1969-12-31 23:59:59.999999", "0001-01-01 00:00:00",
                      "9999-12-31 23:59:59.5", "infinity", "-infinity",
                      "0044-03-15 12:00:00 BC", "10000-01-01 00:00:00"]),
    ("dt", 1082, -1, ["2024-01-01", "0001-01-01", "9999-12-31", "1970-01-01", "1969-12-31",
                      "infinity", "-infinity", "0044-03-15 BC", "10000-01-01"]),
    ("by", 17, -1, ["\\x", "\\x00ff10", "\\x" + "ab" * 100]),
    ("iv", 1186, -1, ["P1Y2M3DT4H5M6.5S", "PT0S", "P-1Y-2M"]),
    ("pt", 600, -1, ["(1.5,-2)", "(0,0)"]),
    ("arr", 1007, -1, ["{1,NULL,3}", "{}", "{{1,2},{3,4}}"]),
    ("tm", 1083, -1, ["24:00:00", "12:34:56.789"]),
    ("money", 790, -1, ["$1,234.56", "-$0.01"]),
]


def implementations() -> list[str]:
    return ["pure", "compiled"]


@pytest.fixture(params=implementations())
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "compiled":
        try:
            fast = importlib.import_module("connectors.postgres._fast")
        except ImportError:
            if shutil.which("gcc") or shutil.which("cc"):
                pytest.fail("the compiled fast path is not built although a C compiler is "
                            "here: run `make setup` (pip install -e .) and check its output")
            pytest.skip("no C compiler: the compiled fast path is not built")
        monkeypatch.setattr(rowcodec, "ENCODE_ROW", fast.encode_row)
        monkeypatch.setattr(rowcodec, "FALLBACKS", fast.fallbacks)
        monkeypatch.setattr(cdc.avro, "ENVELOPE_TAIL",
                            importlib.import_module("cdc._fast").envelope_tail)
        monkeypatch.setattr(pgoutput, "_parse_tuple", fast.parse_tuple)
        monkeypatch.setattr(rowcodec, "ENCODE_ROW_FILLED", fast.encode_row_filled)
        monkeypatch.setattr(rowcodec, "KEY_JSON", fast.key_json)
    else:
        monkeypatch.setattr(rowcodec, "ENCODE_ROW", rowcodec.encode_row)
        monkeypatch.setattr(rowcodec, "FALLBACKS", rowcodec.fallbacks)
        monkeypatch.setattr(cdc.avro, "ENVELOPE_TAIL", cdc.avro.envelope_tail)
        monkeypatch.setattr(pgoutput, "_parse_tuple", None)
        monkeypatch.setattr(rowcodec, "ENCODE_ROW_FILLED", rowcodec.encode_row_filled)
        monkeypatch.setattr(rowcodec, "KEY_JSON", rowcodec.key_json)
    return str(request.param)


def captured_table(columns: list[tuple[str, int, int, list[str]]] = COLUMNS,
                   key: tuple[str, ...] = ("id",)) -> CapturedTable:
    parsers = [pg_type(oid, typmod, {}) for _, oid, typmod, _ in columns]
    schema = TableSchema("src", "db", TableId("public", "all types"),
                         tuple(Column(name, p.column_type) for (name, *_), p in
                               zip(columns, parsers, strict=True)), key)
    return CapturedTable(_keys_required(schema), parsers)


@pytest.fixture
def codec(tmp_path: Path) -> EventCodec:
    return EventCodec(SchemaStore(tmp_path, writable=True))


def rows(count: int, seed: int = 7) -> Iterator[tuple[object, ...]]:
    rng = random.Random(seed)
    for n in range(count):
        values: list[object] = [str(rng.choice([n, -n, 2**63 - 1 - n, -(2**63) + n]))]
        for _, _, _, choices in COLUMNS[1:]:
            values.append(None if rng.random() < 0.1 else rng.choice(choices))
        yield tuple(values)


def events(captured: CapturedTable, op: Op, values: tuple[object, ...], n: int,
           unchanged: tuple[str, ...] = ()) -> tuple[ChangeEvent, ChangeEvent]:
    """The same change as a raw event and as a typed one."""
    info = {"txId": 700 + n % 3, "lsn": 2**40 + n, "xmin": None, "snapshot": "false",
            "sequence": f'["0/{n:X}","0/{n + 1:X}"]'}
    old, new = (values, None) if op is Op.DELETE else (None, values)
    common: dict[str, Any] = {
        "source_info": info, "transaction": TransactionInfo(f"{700 + n % 3}:99", n, n // 2),
        "processed_ms": 1_700_000_000_000 + n // 3, "unchanged": unchanged}
    position = Position.postgres(2**40 + n, n)
    raw = ChangeEvent(captured.schema, op, position, 1_600_000_000_000 + n % 5,
                      raw=rowcodec.TextRows(captured, old, new), **common)
    typed = ChangeEvent(captured.schema, op, position, 1_600_000_000_000 + n % 5,
                        before=None if old is None else captured.row(old),
                        after=None if new is None else captured.row(new), **common)
    return raw, typed


@pytest.mark.parametrize("op", [Op.CREATE, Op.UPDATE, Op.DELETE, Op.READ])
def test_raw_rows_encode_like_typed_rows(impl: str, codec: EventCodec, op: Op) -> None:
    captured = captured_table()
    fast = 0
    for n, values in enumerate(rows(400)):
        raw, typed = events(captured, op, values, n)
        if op is Op.READ:
            raw.source_info = typed.source_info = {"snapshot": "true", "lsn": 5, "txId": None,
                                                   "sequence": '[null,"0/5"]'}
        try:
            expected = codec.records(typed)
        except EncodingError as exc:
            with pytest.raises(EncodingError) as caught:
                codec.records(raw)
            assert caught.value.problem == exc.problem
            continue
        assert codec.records(raw) == expected, values
        out = bytearray()
        fast += rowcodec.TextRows(captured, *((values, None) if op is Op.DELETE else
                                              (None, values))).encode_images(
            codec.table(captured.schema), out, None)
    assert fast >= 300  # most rows took the fast path (the rest: values the typed path rejects)


def test_every_fast_kind_takes_the_fast_path(impl: str, codec: EventCodec) -> None:
    """Canonical server output of every fast kind never needs the typed path."""
    captured = captured_table()
    table = codec.table(captured.schema)
    plan = captured.row_plan(table)
    assert plan is not None
    canonical = ("5", "7", "63", "t", "1.5", "0.1", "héllo", "name-1", '{"a": 1}',
                 "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "-12.500", "-1234.56", "12345",
                 "2024-02-29 23:59:59.5+00", "1969-12-31 23:59:59.999999", "2024-01-01",
                 "\\x00ff", "PT0S", "(0,0)", "{1}", "12:00:00", "$1.00")
    before = rowcodec.FALLBACKS()
    out = bytearray()
    rowcodec.ENCODE_ROW(plan, canonical, out, None)
    assert rowcodec.FALLBACKS() == before
    raw, typed = events(captured, Op.CREATE, canonical, 1)
    assert codec.records(raw) == codec.records(typed)


def test_unchanged_columns_come_from_the_fill(impl: str, codec: EventCodec) -> None:
    captured = captured_table()
    for n, values in enumerate(rows(60, seed=3)):
        changed = list(values)
        gaps = tuple(name for i, (name, *_) in enumerate(COLUMNS) if i in (6, 8, 17)
                     and (n % 3 != 0 or i != 6))
        for i, (name, *_) in enumerate(COLUMNS):
            if name in gaps:
                changed[i] = U
        raw, typed = events(captured, Op.UPDATE, tuple(changed), n, gaps)

        def fill(_codec: Any, after: dict[str, Any], n: int = n,
                 gaps: tuple[str, ...] = gaps) -> list[str]:
            if n % 4 == 0:
                return list(gaps)  # nothing known: all unavailable
            if "t" in gaps:
                after["t"] = "from the image"
            if "js" in gaps:
                after["js"] = '{"old": true}'
            return [g for g in gaps if g not in ("t", "js")]

        assert codec.records(raw, fill) == codec.records(typed, fill)
        assert codec.records(raw) == codec.records(typed)  # no fill: all unavailable


def test_key_bytes(impl: str, codec: EventCodec) -> None:
    columns = [("id", 20, -1, []), ("name", 25, -1, []), ("day", 1082, -1, []),
               ("amount", 1700, _typmod(10, 2), []), ("v", 25, -1, [])]
    captured = captured_table(columns, key=("name", "id", "day", "amount"))
    rng = random.Random(5)
    for n in range(200):
        name = "".join(rng.choice(string.printable + "é\U0001F600\"\\") for _ in range(8))
        values = (str(rng.randrange(-(2**63), 2**63)), name, rng.choice(
            ["2024-01-01", "infinity", "0044-03-15 BC"]), rng.choice(["1.50", "-0.01", "NaN"]),
            str(uuid.UUID(int=n)))
        raw = rowcodec.TextRows(captured, None, values)
        typed_key = captured.schema.key_of(captured.row(values))
        assert raw.key_bytes() == encode_key(captured.schema, typed_key)
        deleted = rowcodec.TextRows(captured, (values[0], name, values[2], values[3], None), None)
        assert deleted.key_bytes() == raw.key_bytes()


def test_implementation_is_selectable(monkeypatch: pytest.MonkeyPatch) -> None:
    """CDC_PURE_PYTHON=1 selects the pure-Python path; otherwise the compiled one if built."""
    monkeypatch.setenv("CDC_PURE_PYTHON", "1")
    module = importlib.reload(rowcodec)
    try:
        assert module.implementation() == "pure"
        monkeypatch.delenv("CDC_PURE_PYTHON")
        module = importlib.reload(rowcodec)
        try:
            importlib.import_module("connectors.postgres._fast")
        except ImportError:
            assert module.implementation() == "pure"
        else:
            assert module.implementation() == "compiled"
    finally:
        importlib.reload(rowcodec)


FLAT = [c for c in COLUMNS if c[0] not in ("iv", "pt", "arr", "tm", "money")]


def test_decode_after_reencodes_like_fastavro(impl: str, codec: EventCodec) -> None:
    """The compiled after-image reader (previous images; ``cdc/avroreader.py``, the project's
    one Avro reader) gives values that the Avro writers turn into exactly the bytes fastavro's
    decoded values give, for flat rows and for points, arrays, intervals and money alike."""
    for columns in (FLAT, COLUMNS):
        captured = captured_table(columns)
        table = codec.table(captured.schema)
        assert table.value_writers is not None
        for n, values in enumerate(rows(150, seed=9)):
            values = tuple(v for v, c in zip(values, COLUMNS, strict=True) if c in columns)
            for op in (Op.CREATE, Op.DELETE):
                raw, typed = events(captured, op, values, n)
                try:
                    value = codec.records(typed)[0].value
                except EncodingError:
                    continue
                assert value is not None
                schema_id, fast = codec.decode_after(value)
                reference = codec.decode_raw(value)[1]["after"]
                assert schema_id == table.schema_id
                assert codec._after_readers[schema_id] is not None
                if reference is None:
                    assert fast is None
                    continue
                assert fast is not None and fast.keys() == reference.keys()
                for (_, field, _), write in zip(table.columns, table.value_writers,
                                                strict=True):
                    a, b = bytearray(), bytearray()
                    write(fast[field], a)
                    write(reference[field], b)
                    assert a == b, (field, fast[field], reference[field])


def test_pgoutput_tuples(impl: str) -> None:
    """Insert, update and delete messages decode to the same tuples either way (text, NULL,
    unchanged TOAST, binary, multi-byte UTF-8), and an unknown column kind raises DecodeError."""
    def column(value: object) -> bytes:
        if value is None:
            return b"n"
        if value is U:
            return b"u"
        data = value if isinstance(value, bytes) else str(value).encode()
        return (b"b" if isinstance(value, bytes) else b"t") + len(data).to_bytes(4, "big") + data

    def tuple_data(values: tuple[object, ...]) -> bytes:
        return len(values).to_bytes(2, "big") + b"".join(column(v) for v in values)

    values = ("1", None, U, "héllo \U0001F600", "", b"\x00\xff", "x" * 5000)
    oid = (77).to_bytes(4, "big")
    insert = pgoutput.decode(b"I" + oid + b"N" + tuple_data(values))
    assert insert == pgoutput.Insert(77, values)
    update = pgoutput.decode(b"U" + oid + b"K" + tuple_data(("1", None)) + b"N"
                             + tuple_data(values))
    assert update == pgoutput.Update(77, values, ("1", None), True)
    delete = pgoutput.decode(b"D" + oid + b"O" + tuple_data(values))
    assert delete == pgoutput.Delete(77, values, False)
    with pytest.raises(pgoutput.DecodeError, match="unknown tuple column kind 'x'"):
        pgoutput.decode(b"I" + oid + b"N" + b"\x00\x01" + b"x")


def _tuple_message(values: tuple[object, ...]) -> bytes:
    out = bytearray(len(values).to_bytes(2, "big"))
    for value in values:
        if value is None:
            out += b"n"
        elif value is U:
            out += b"u"
        else:
            data = str(value).encode()
            out += b"t" + len(data).to_bytes(4, "big") + data
    return bytes(out)


@pytest.mark.parametrize(("with_images", "with_rules"), [(False, False), (True, False),
                                                        (True, True)])
def test_change_runs_encode_like_events(impl: str, codec: EventCodec, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch, with_images: bool,
                                        with_rules: bool) -> None:
    """The stream's compiled loop (rowcodec.encode_changes: pgoutput bytes to log records)
    writes exactly the records the event path writes for the same messages — inserts, plain
    updates, deletes by key and by full old tuple, every type and edge value, and (given the
    previous images) updates with unchanged TOAST values filled from the key's latest image —
    and hands every message it declines (unchanged values without images, an old tuple on an
    update, a value the typed path rejects) back unconsumed, with the transaction's counters
    where the event path has them. With column rules (a column left out, others masked,
    nulled, truncated to characters of multi-byte text, hashed — the key too), the records are
    the event path's after the dispatcher's transform."""
    from connectors.postgres.replication import xlog_data
    from connectors.postgres.source import PostgresStream, _times, _Transaction, change_plan

    encode_changes = (importlib.import_module("connectors.postgres._fast").encode_changes
                      if impl == "compiled" else rowcodec.encode_changes)
    columns = FLAT if with_images else COLUMNS  # fills need columns stepped over in place
    captured = captured_table(columns)
    oid = 4242
    stream = PostgresStream.__new__(PostgresStream)
    stream.relations = {oid: captured}
    policy = None
    if with_rules:
        from cdc.columns import ColumnPolicies
        monkeypatch.setenv("CDC_TEST_HASH_KEY", "a secret")
        policies = ColumnPolicies.from_settings("src", {str(captured.schema.table): {
            "exclude": ["js"], "transforms": {"t": "truncate(3)", "vc": "mask(x·x)", "u": "null",
                                              "b": "mask", "id": "hash", "f8": "hash",
                                              "tz": "hash"}}}, "CDC_TEST_HASH_KEY")
        assert policies is not None
        policy = policies.get(captured.schema.table)
    plan = change_plan(codec, captured, policy)
    assert plan is not None
    processed = 1_700_000_000_123
    times = _times(processed)
    messages = []
    rng = random.Random(11)
    key_only = tuple(None if i else "1" for i in range(len(columns)))
    inserted: list[tuple[object, ...]] = []
    for n, full in enumerate(rows(400, seed=13)):
        values = tuple(v for v, c in zip(full, COLUMNS, strict=True) if c in columns)
        choice = rng.random()
        if choice < 0.4:
            payload = b"I" + oid.to_bytes(4, "big") + b"N" + _tuple_message(values)
            inserted.append(values)
        elif choice < 0.6:
            payload = b"U" + oid.to_bytes(4, "big") + b"N" + _tuple_message(values)
        elif choice < 0.7:  # a row inserted before, its text column unchanged
            earlier = inserted[rng.randrange(len(inserted))] if inserted else values
            toasted = tuple(U if i == 6 else v for i, v in enumerate(
                (earlier[0], *values[1:])))
            payload = b"U" + oid.to_bytes(4, "big") + b"N" + _tuple_message(toasted)
        elif choice < 0.75:
            payload = (b"U" + oid.to_bytes(4, "big") + b"K" + _tuple_message(key_only) + b"N"
                       + _tuple_message(values))
        elif choice < 0.9:
            keyed = tuple(v if i == 0 else None for i, v in enumerate(values))
            payload = b"D" + oid.to_bytes(4, "big") + b"K" + _tuple_message(keyed)
        else:
            payload = b"D" + oid.to_bytes(4, "big") + b"O" + _tuple_message(values)
        header = (2**33 + 1000 * n).to_bytes(8, "big") + bytes(16)  # start LSN, end, time
        messages.append(b"w" + header + payload)  # as received (batches(raw=True))
    expected_txn = _Transaction(987654, 2**34 + 17, 1_600_000_000_000)
    actual_txn = _Transaction(987654, 2**34 + 17, 1_600_000_000_000)
    expected: list[Any] = []
    actual: list[Any] = []
    # each side has its own previous images, fed as the dispatcher feeds them
    from cdc.images import PreviousImages
    from cdc.log.local import LocalChangeLog
    sides = {}
    for side in ("expected", "actual"):
        sides[side] = PreviousImages(LocalChangeLog(tmp_path / side, partitions=2), codec)

    def event_records(event: ChangeEvent, side: str) -> list[Any]:
        if policy is not None:  # as Dispatcher.add transforms it
            event = policy.event(event)
        images = sides[side]
        fill = None
        if event.unchanged and with_images:
            fill = images.filler(event.schema.topic, codec.key_bytes(event), event.unchanged,
                                 event.position.to_bytes())
        out = codec.records(event, fill)
        images.remember(out[0].topic, out[0].key, None if event.op is Op.DELETE
                        else out[0].value)
        return out

    compiled_changes = filled = 0
    index = 0
    while index < len(messages):
        touched: dict[Any, Any] = {}
        made: list[Any] = []
        stop, changes = encode_changes(
            {oid: plan}, messages, index, actual_txn, made, Record, times, touched,
            sides["actual"].latest_value if with_images else None, {})
        actual.extend(made)
        for record in made:  # as Dispatcher.add_batch does
            sides["actual"].remember(record.topic, record.key, record.value)
        compiled_changes += changes
        logged = captured.schema if policy is None else policy.schema(captured.schema)
        assert touched == ({captured.schema.topic: logged} if changes else {})
        for message in map(xlog_data, messages[index:stop]):  # the event path, the same ones
            event = stream._fast_change(pgoutput.decode(message.payload), expected_txn,
                                        message.start_lsn)
            assert event is not None
            event.processed_ms = processed
            filled += bool(event.unchanged)
            expected.extend(event_records(event, "expected"))
        assert actual == expected
        if stop == len(messages):
            break
        declined = xlog_data(messages[stop])  # the stream's event path takes it, on both sides
        decoded = pgoutput.decode(declined.payload)
        for txn, out, side in ((expected_txn, expected, "expected"),
                               (actual_txn, actual, "actual")):
            event = stream._fast_change(decoded, txn, declined.start_lsn)
            if event is None:  # an old tuple on an update: _row_change's case
                event = next(stream._row_change(decoded, txn, declined.start_lsn))
            event.processed_ms = processed
            with contextlib.suppress(EncodingError):  # rejected on both sides alike
                out.extend(event_records(event, side))
        index = stop + 1
    assert actual == expected
    assert (actual_txn.ordinal, actual_txn.per_table) == (expected_txn.ordinal,
                                                          expected_txn.per_table)
    assert compiled_changes >= 250  # most changes took the compiled loop
    assert (filled >= 15) == with_images  # and with images, the unchanged TOAST ones too


def _copy_text(value: object) -> bytes:
    if value is None:
        return b"\\N"
    text = str(value).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
    return text.replace("\r", "\\r").encode()


@pytest.mark.parametrize("with_rules", [False, True])
def test_copy_rows_encode_like_snapshot_events(impl: str, codec: EventCodec,
                                               monkeypatch: pytest.MonkeyPatch,
                                               with_rules: bool) -> None:
    """The snapshot's compiled loop (rowcodec.encode_copy: COPY text bytes to log records)
    writes exactly the records of the snapshot's events for the same rows — every type and edge
    value, escapes, NULLs — and stops, without consuming it, at a row cut short and at a row it
    declines (another column count, a value the typed path rejects); with column rules, those
    of the dispatcher's transform."""
    from connectors.postgres.source import _times, copy_plan

    encode_copy = (importlib.import_module("connectors.postgres._fast").encode_copy
                   if impl == "compiled" else rowcodec.encode_copy)
    captured = captured_table()
    lsn, ts_ms, processed = 2**35 + 99, 1_650_000_000_000, 1_700_000_000_321
    info = {"snapshot": "true", "lsn": lsn, "txId": None, "sequence": '[null,"8/63"]'}
    policy = None
    if with_rules:
        from cdc.columns import ColumnPolicies
        monkeypatch.setenv("CDC_TEST_HASH_KEY", "another secret")
        policies = ColumnPolicies.from_settings("src", {str(captured.schema.table): {
            "include": ["id", "i2", "t", "vc", "n", "tz", "dt", "by"],
            "transforms": {"t": "truncate(2)", "vc": "mask", "n": "null", "id": "hash",
                           "tz": "hash"}}}, "CDC_TEST_HASH_KEY")
        assert policies is not None
        policy = policies.get(captured.schema.table)
    plan = copy_plan(codec, captured, lsn, ts_ms, info, policy)
    assert plan is not None

    def records_of(event: ChangeEvent) -> list[Any]:
        return codec.records(event if policy is None else policy.event(event))
    times = _times(processed)
    lines = [b"\t".join(_copy_text(v) for v in values) for values in rows(400, seed=17)]
    lines[10] = lines[10] + b"\textra"  # a column too many
    lines.append(b"\t".join(_copy_text(v) for v in ("7", "1", "2", "t", "1.5", "0.1",
                                                    "tab\there\nnew\\line", *COLUMNS[7][3][:1],
                                                    *(None for _ in COLUMNS[8:]))))
    data = b"".join(line + b"\n" for line in lines) + b"42\tcut sh"
    def event_records(values: tuple[str | None, ...], number: int) -> list[Any]:
        """The snapshot event of a row through the dispatcher's steps ([] if rejected)."""
        if len(values) != len(COLUMNS):
            return []
        event = ChangeEvent(captured.schema, Op.READ,
                            Position.postgres(lsn, number, snapshot=True), ts_ms,
                            source_info=info, processed_ms=processed,
                            raw=rowcodec.TextRows(captured, None, values))
        with contextlib.suppress(EncodingError):
            return records_of(event)
        return []

    expected: list[Any] = []
    number = 1000
    for line in lines:
        number += 1
        expected.extend(event_records(rowcodec.copy_fields(line), number))
    actual: list[Any] = []
    at, number, compiled_rows = 0, 1000, 0
    while True:
        records: list[Any] = []
        at, number = encode_copy(plan, data, at, number, records, Record, times)
        compiled_rows += len(records)
        actual.extend(records)
        end = data.find(b"\n", at)
        if end < 0:
            break
        number += 1  # declined: the event path, as capture does
        actual.extend(event_records(rowcodec.copy_fields(data[at:end]), number))
        at = end + 1
    assert data[at:] == b"42\tcut sh"  # the row cut short is left for the next call
    assert number == 1000 + len(lines)
    assert actual == expected
    assert compiled_rows >= 300
    assert rowcodec.copy_fields(lines[-1])[6] == "tab\there\nnew\\line"
