"""`jobs.prospect.effective_lines`: one line per prospect and snapshot, the greatest when a snapshot lists a
prospect more than once (compared after normalization, field by field in the declared order)."""

from __future__ import annotations

import pyarrow as pa

from jobs import prospect


def _line(agency: str, batch: int, lastname: str, *, gender: str = "F", income: int | None = 1) -> dict:
    row = {name: None for name in prospect.LINES.column_names}
    row.update(
        agencyid=agency,
        source_batch=batch,
        lastname=lastname,
        firstname="Ann",
        city="Paris",
        state="TX",
        gender=gender,
        income=income,
        batch_id=batch,
        source_file=f"Batch{batch}/Prospect.csv",
        line_no=1,
    )
    return row


def _table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=prospect.LINES.arrow_schema())


def test_the_greatest_line_of_a_repeated_prospect_in_prospect_and_batch_order():
    first = [
        _line("AG3", 2, "Cole", gender="m"),  # upper-cased to M before the comparison: greater than F
        _line("AG1", 3, "Adams"),
        _line("AG2", 2, "Smith"),
        _line("AG4", 2, "Dunn", income=None),
    ]
    second = [
        _line("AG1", 2, "Young"),
        _line("AG3", 2, "Cole", gender="F"),
        _line("AG1", 3, "Brown"),
        _line("AG4", 2, "Dunn", income=10),  # NULL is the smallest
        _line("AG1", 3, "Abbot"),
    ]
    lines = pa.concat_tables([_table(first), _table(second)])
    got = prospect.effective_lines(lines)
    assert got.column_names == ["agencyid", "source_batch", *prospect.FIELDS]
    assert got.select(["agencyid", "source_batch", "lastname", "gender", "income"]).to_pylist() == [
        {"agencyid": "AG1", "source_batch": 2, "lastname": "Young", "gender": "F", "income": 1},
        {"agencyid": "AG1", "source_batch": 3, "lastname": "Brown", "gender": "F", "income": 1},
        {"agencyid": "AG2", "source_batch": 2, "lastname": "Smith", "gender": "F", "income": 1},
        {"agencyid": "AG3", "source_batch": 2, "lastname": "Cole", "gender": "M", "income": 1},
        {"agencyid": "AG4", "source_batch": 2, "lastname": "Dunn", "gender": "F", "income": 10},
    ]


def test_lines_listed_once_are_kept_as_they_are_and_no_lines_give_none():
    lines = _table([_line("AG2", 3, "Smith", gender="x"), _line("AG1", 3, "Young")])
    got = prospect.effective_lines(lines)
    assert got.select(["agencyid", "lastname", "gender"]).to_pylist() == [
        {"agencyid": "AG1", "lastname": "Young", "gender": "F"},
        {"agencyid": "AG2", "lastname": "Smith", "gender": "U"},  # not a declared value
    ]
    assert prospect.effective_lines(_table([])).num_rows == 0
