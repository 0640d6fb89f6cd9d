"""The key-set helpers and `changes_against` of jobs.arrow_ops on hand-written values."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa

from jobs import arrow_ops as ao


def test_distinct_sorts_and_drops_repeats_wherever_they_are():
    keys = np.array([5, 5, 5, 1, 1, 9, 5, 1, -3, 9, 9], np.int64)
    assert ao.distinct(keys).tolist() == [-3, 1, 5, 9]
    assert ao.distinct(np.array([], np.int64)).tolist() == []
    assert ao.distinct(np.array([7], np.int64)).tolist() == [7]


def test_union_and_member():
    assert ao.union(np.array([4, 2, 2]), np.array([3, 4, 10])).tolist() == [2, 3, 4, 10]
    assert ao.member(np.array([1, 2, 3, 11, -1]), np.array([2, 3, 10])).tolist() == [False, True, True, False, False]
    assert ao.member(np.array([1, 2]), np.array([], np.int64)).tolist() == [False, False]


SCHEMA = pa.schema(
    [
        pa.field("owner", pa.int64(), False),
        pa.field("day", pa.int32(), False),
        pa.field("cash", pa.decimal128(15, 2)),
        pa.field("note", pa.large_string()),
    ]
)


def rows(*values: tuple) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, v, strict=True)) for v in values], schema=SCHEMA)


def test_changes_against_keeps_new_and_changed_rows_and_lists_the_vanished_keys():
    stored = rows(
        (1, 10, Decimal("5.00"), "a"),  # unchanged
        (1, 11, Decimal("6.00"), None),  # unchanged, NULL equals NULL
        (1, 12, Decimal("7.00"), "b"),  # cash changes
        (2, 10, Decimal("1.00"), None),  # NULL becomes a value
        (2, 11, Decimal("2.00"), "x"),  # gone
        (3, 10, Decimal("3.00"), "y"),  # gone
    )
    recomputed = rows(
        (1, 12, Decimal("7.50"), "b"),
        (1, 10, Decimal("5.00"), "a"),
        (2, 10, Decimal("1.00"), "now"),
        (1, 11, Decimal("6.00"), None),
        (4, 10, Decimal("0.00"), None),  # new
    )

    upserts, gone = ao.changes_against(recomputed, stored, ["owner", "day"])

    assert (
        upserts.to_pylist()
        == rows(
            (1, 12, Decimal("7.50"), "b"), (2, 10, Decimal("1.00"), "now"), (4, 10, Decimal("0.00"), None)
        ).to_pylist()
    )
    assert gone.to_pylist() == [{"owner": 2, "day": 11}, {"owner": 3, "day": 10}]


def test_changes_against_nothing_stored_or_nothing_recomputed():
    recomputed = rows((1, 10, Decimal("5.00"), "a"))
    upserts, gone = ao.changes_against(recomputed, SCHEMA.empty_table(), ["owner", "day"])
    assert upserts.to_pylist() == recomputed.to_pylist()
    assert gone.num_rows == 0
    upserts, gone = ao.changes_against(SCHEMA.empty_table(), recomputed, ["owner", "day"])
    assert upserts.num_rows == 0
    assert gone.to_pylist() == [{"owner": 1, "day": 10}]


def test_row_numbers_and_whether_positions_are_every_row_in_order():
    data = ao.with_row_numbers(pa.table({"k": ["b", "a", "c"]}))
    assert data[ao.ROW].to_pylist() == [0, 1, 2]
    assert ao.is_every_row(pa.array([0, 1, 2], pa.int64()), 3)
    assert ao.is_every_row(pa.chunked_array([[0], [1, 2]], pa.int64()), 3)
    assert not ao.is_every_row(pa.array([1, 0, 2], pa.int64()), 3)
    assert not ao.is_every_row(pa.array([0, 1], pa.int64()), 3)
    assert ao.is_every_row(pa.array([], pa.int64()), 0)


def _fin_lines(files: list[str], lines: list[int], batches: list[int], text: list[str]) -> pa.Table:
    return pa.table({"source_file": files, "line_no": lines, "batch_id": batches, "text": text})


def test_latest_delivery_keeps_each_lines_latest_micro_batch_in_file_line_order():
    from jobs.finwire_records import latest_delivery

    staged = _fin_lines(
        ["F2", "F1", "F1", "F2", "F1"],
        [1, 2, 1, 1, 2],
        [1, 1, 1, 3, 2],
        ["F2:1 old", "F1:2 old", "F1:1", "F2:1 new", "F1:2 new"],
    )
    assert latest_delivery(staged)["text"].to_pylist() == ["F1:1", "F1:2 new", "F2:1 new"]


def test_latest_delivery_of_one_delivery_in_order_is_the_table_itself():
    from jobs.finwire_records import latest_delivery

    staged = _fin_lines(["F1", "F1", "F2"], [1, 2, 1], [1, 1, 1], ["a", "b", "c"])
    assert latest_delivery(staged) is staged
    shuffled = staged.take([2, 0, 1])
    assert latest_delivery(shuffled)["text"].to_pylist() == ["a", "b", "c"]


def test_pieces_without_the_redelivered_lines_keep_the_staged_order_and_copy_nothing_without_a_redelivery():
    from jobs.finwire_records import redelivered, without_redelivered

    staged = _fin_lines(["F2", "F1", "F1"], [1, 2, 1], [1, 1, 1], ["F2:1", "F1:2", "F1:1"])
    stale = redelivered(staged)
    assert stale.num_rows == 0
    assert without_redelivered(staged, stale) is staged
    again = pa.concat_tables([staged, _fin_lines(["F1"], [2], [2], ["F1:2 new"])])
    stale = redelivered(again)
    assert stale.to_pylist() == [{"source_file": "F1", "line_no": 2, "batch_id": 1}]
    assert without_redelivered(again, stale)["text"].to_pylist() == ["F2:1", "F1:1", "F1:2 new"]
    pieces = [without_redelivered(again.slice(start, 2), stale) for start in (0, 2)]  # as read a piece at a time
    assert [p["text"].to_pylist() for p in pieces] == [["F2:1"], ["F1:1", "F1:2 new"]]


def test_date_ids_are_yyyymmdd_of_days_since_1970_whatever_their_span_or_kind():
    days = np.array([0, -1, 59, 11016, 11017, 17351, 17351, 47541], np.int32)  # 2000-02-29, 2017-07-04, 2100-03-01
    expected = [19700101, 19691231, 19700301, 20000229, 20000301, 20170704, 20170704, 21000301]
    assert ao.date_ids(days).tolist() == expected
    assert ao.date_ids(days.astype("datetime64[D]")).tolist() == expected
    # a span wider than the table's converts value by value: the same ids
    assert ao.date_ids(np.array([-400_000, 11016, 400_000])).tolist() == [8741102, 20000229, 30650301]
    assert ao.date_ids(np.array([], np.int64)).tolist() == []
