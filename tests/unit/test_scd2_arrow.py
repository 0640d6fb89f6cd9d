"""SCD2 history on Arrow (jobs.scd2_arrow) on hand-written change records: the same cases and results as the Spark
building blocks' tests (tests/integration/test_scd2.py)."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pyarrow as pa

from jobs.scd2_arrow import build_versions, loadable, midnight, surrogate_keys, version_changes

OPEN = date(9999, 12, 31)
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("_ts", pa.timestamp("us", tz="UTC")),
        ("_batch", pa.int32()),
        ("seq", pa.int64()),
        ("a", pa.large_string()),
        ("_has_a", pa.bool_()),
        ("b", pa.large_string()),
        ("_has_b", pa.bool_()),
    ]
)


def versions(rows: list[tuple]) -> list[dict]:
    changes = pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in rows], SCHEMA)
    return build_versions(changes, "id", ["_ts", "seq"], ["a", "b"]).to_pylist()


def v(id_, a, b, eff, end=OPEN, batch=1):
    return {"id": id_, "a": a, "b": b, "effectivedate": eff, "enddate": end, "iscurrent": end == OPEN, "batchid": batch}


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def test_one_version_per_day_the_days_last_change_wins_and_absent_fields_carry_forward():
    rows = [
        (1, at(2010, 1, 1, 12), 1, 2, None, False, "y", True),  # same day, later: only b changes
        (1, at(2010, 1, 1, 10), 1, 1, "a", True, "x", True),
        (1, at(2011, 3, 4, 9), 2, 3, "c", True, None, False),  # only a changes
        (1, at(2012, 1, 1, 9), 3, 4, None, True, None, False),  # a set to NULL (present, empty)
        (2, at(2010, 5, 1, 0), 1, 1, "z", True, "w", True),
    ]

    assert versions(rows) == [
        v(1, "a", "y", date(2010, 1, 1), date(2011, 3, 4)),
        v(1, "c", "y", date(2011, 3, 4), date(2012, 1, 1), batch=2),
        v(1, None, "y", date(2012, 1, 1), batch=3),
        v(2, "z", "w", date(2010, 5, 1)),
    ]


def test_a_key_whose_first_record_lacks_a_field_has_it_null_not_the_previous_keys_value():
    rows = [
        (1, at(2010, 1, 1), 1, 1, "one", True, "b1", True),
        (2, at(2010, 1, 2), 1, 2, None, False, "b2", True),  # key 2 never carries a: NULL, not key 1's "one"
    ]

    assert versions(rows) == [v(1, "one", "b1", date(2010, 1, 1)), v(2, None, "b2", date(2010, 1, 2))]


def test_records_of_one_day_are_ordered_by_the_declared_order_not_by_arrival():
    rows = [
        (1, at(2017, 7, 8), 2, 9, "late", True, "b9", True),
        (1, at(2017, 7, 8), 2, 3, "early", True, "b3", True),
    ]

    assert versions(rows) == [v(1, "late", "b9", date(2017, 7, 8), batch=2)]


def test_no_changes_give_no_versions():
    assert versions([]) == []


def test_surrogate_keys_derive_from_natural_key_and_day():
    ids = pa.array([7, 7, 12345, None], pa.int64())
    days = pa.array([date(1900, 1, 1), date(2017, 7, 8), date(1900, 1, 2), date(2000, 1, 1)], pa.date32())
    assert surrogate_keys(ids, days).to_pylist() == [700000, 700000 + 42922, 1234500001, None]


def test_midnight_of_a_date_is_utc():
    assert midnight(pa.array([date(2017, 7, 8), None], pa.date32())).to_pylist() == [at(2017, 7, 8), None]


def test_loadable_drops_every_version_of_a_key_with_a_problem():
    rows = pa.table({"id": [1, 1, 2], "_problem": pa.array([None, "missing taxid", None], pa.large_string())})
    assert loadable(rows, "id")["id"].to_pylist() == [2]


def test_version_changes_upserts_the_new_history_and_deletes_versions_that_no_longer_exist():
    current = pa.table({"sk": [10, 11, 20], "id": [1, 1, 2]})
    new = pa.table({"sk": [10], "id": [1], "a": ["x2"]})

    upserts, deletes = version_changes(current, new, ["sk", "id", "a"], "id", "sk", pa.array([1, 3], pa.int64()))

    assert upserts.to_pylist() == [{"sk": 10, "id": 1, "a": "x2"}]
    assert deletes.to_pylist() == [11]  # key 2 was not touched: left alone
