"""The compiled Avro writer writes exactly fastavro's bytes, on every type we generate."""

from __future__ import annotations

import io
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from fastavro.utils import generate_many

from cdc.avro import value_schema
from cdc.avrowriter import Unsupported, compile_writer
from cdc.events import Column, TableId, TableSchema
from cdc.types import TYPE_NAMES, ColumnType

PARAMS: dict[str, dict[str, Any]] = {
    "decimal": {"precision": 12, "scale": 2},
    "bits": {"precision": 12},
    "enum": {"values": ("a", "b")},
}


def all_types_schema(arrays: bool) -> TableSchema:
    columns = [Column("id", ColumnType("int64"), False)]
    for name in TYPE_NAMES:
        if name == "array":
            continue
        ctype = ColumnType(name, **PARAMS.get(name, {}))
        columns.append(Column(f"c_{name}", ctype))
        if arrays:
            columns.append(Column(f"a_{name}", ColumnType("array", element=ctype)))
    return TableSchema("src", "db", TableId("public", "every"), tuple(columns), ("id",))


def fastavro_bytes(schema: Any, datum: Any) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), datum)
    return buffer.getvalue()


def ours(schema: Any, datum: Any) -> bytes:
    out = bytearray()
    compile_writer(schema)(datum, out)
    return bytes(out)


@pytest.mark.parametrize(("arrays", "count"), [(False, 200), (True, 3)])
def test_random_envelopes_of_every_type_encode_like_fastavro(arrays: bool, count: int) -> None:
    envelope = value_schema(all_types_schema(arrays))
    writer = compile_writer(envelope)
    parsed = fastavro.parse_schema(envelope)
    checked = 0
    for datum in generate_many(parsed, count):
        out = bytearray()
        writer(datum, out)
        assert bytes(out) == fastavro_bytes(envelope, datum)
        checked += 1
    assert checked == count


@pytest.mark.parametrize("value", [Decimal("0"), Decimal("-0.01"), Decimal("12.3"),
                                   Decimal("-99999999.99"), Decimal("127"), Decimal("-128.00")])
def test_decimals(value: Decimal) -> None:
    schema = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
    assert ours(schema, value) == fastavro_bytes(schema, value)


@pytest.mark.parametrize("value", [0, 1, -1, 63, -64, 64, 2**31 - 1, -2**31, 2**63 - 1, -2**63])
def test_longs(value: int) -> None:
    assert ours("long", value) == fastavro_bytes("long", value)


def test_values_the_fast_path_does_not_know_are_refused_not_mangled() -> None:
    writer = compile_writer(["null", "double"])
    with pytest.raises(ValueError):
        writer(1, bytearray())  # fastavro accepts an int here: the caller falls back to it
    with pytest.raises(Unsupported):
        compile_writer(["int", "long"])
