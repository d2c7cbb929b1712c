import random

import pytest

from cdc.position import Position, format_lsn, parse_lsn


def test_bytes_order_equals_position_order() -> None:
    rnd = random.Random(3)
    positions = [Position.postgres(rnd.choice([0, 1, 2**32, 2**63, 2**64 - 3]) + rnd.randrange(3),
                                   rnd.randrange(5), snapshot=rnd.random() < 0.3)
                 for _ in range(300)]
    by_value = sorted(positions)
    by_bytes = sorted(positions, key=Position.to_bytes)
    assert by_value == by_bytes


def test_snapshot_rows_sort_before_changes_at_the_same_lsn() -> None:
    snapshot_row = Position.postgres(1000, 999_999, snapshot=True)
    first_change = Position.postgres(1000, 1)
    assert snapshot_row < first_change
    assert Position.postgres(999, 5) < snapshot_row


def test_commit_lsn_then_ordinal() -> None:
    assert Position.postgres(10, 9) < Position.postgres(11, 1)
    assert Position.postgres(11, 1) < Position.postgres(11, 2)
    assert Position.mysql(1, 500, 3) < Position.mysql(2, 4, 0)


def test_round_trips() -> None:
    for position in (Position.postgres(parse_lsn("16/B374D848"), 7), Position.mysql(3, 4, 5),
                     Position.postgres(5, 1, snapshot=True), Position.test(42)):
        assert Position.from_bytes(position.to_bytes()) == position
        assert Position.from_dict(position.to_dict()) == position
    assert Position.postgres(parse_lsn("16/B374D848"), 7).to_dict()["lsn"] == "16/B374D848"
    assert format_lsn(parse_lsn("0/16B3748")) == "0/16B3748"


def test_positions_of_different_kinds_do_not_compare() -> None:
    with pytest.raises(TypeError):
        _ = Position.test(1) < Position.mysql(1, 1, 1)


def test_parts_must_fit_unsigned_64_bits() -> None:
    with pytest.raises(ValueError):
        Position.test(-1)
    with pytest.raises(ValueError):
        Position.test(2**64)
