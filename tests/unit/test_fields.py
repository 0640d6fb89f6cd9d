"""Dates and timestamps: each declared pattern takes exactly its shape and real calendar values (UTC)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from jobs.fields import DATETIME_PATTERNS, Problems, typed
from schemas.model import Column

UTC = dt.UTC


@pytest.mark.parametrize(
    ("fmt", "text", "expected"),
    [
        ("yyyy-MM-dd", "2012-02-29", dt.date(2012, 2, 29)),
        ("yyyy-MM-dd", "2013-02-29", None),
        ("yyyy-MM-dd", "2012-1-05", None),
        ("yyyy-MM-dd", "2012-01-05 ", None),
        ("yyyy-MM-dd", "2012-01-05T00:00", None),
        ("yyyy-MM-dd HH:mm:ss", "2012-01-05 23:59:59", dt.datetime(2012, 1, 5, 23, 59, 59, tzinfo=UTC)),
        ("yyyy-MM-dd HH:mm:ss", "2012-01-05 24:00:00", None),
        ("yyyy-MM-dd HH:mm:ss", "2012-01-05 10:11:12.5", None),
        ("yyyy-MM-dd HH:mm:ss", "2012-01-05T10:11:12", None),
        ("yyyy-MM-dd'T'HH:mm:ss", "2012-01-05T10:11:12", dt.datetime(2012, 1, 5, 10, 11, 12, tzinfo=UTC)),
        ("yyyy-MM-dd'T'HH:mm:ss", "2012-01-05 10:11:12", None),
        ("yyyy-MM-dd'T'HH:mm:ss", "2012-02-30T10:11:12", None),
        ("yyyyMMdd", "20120229", dt.date(2012, 2, 29)),
        ("yyyyMMdd", "20121301", None),
        ("yyyyMMdd", "2012015", None),
        ("yyyyMMdd-HHmmss", "20120105-101112", dt.datetime(2012, 1, 5, 10, 11, 12, tzinfo=UTC)),
        ("yyyyMMdd-HHmmss", "20120105-106012", None),
        ("yyyyMMdd-HHmmss", "20120105 101112", None),
    ],
)
def test_datetime_fields_parse_exactly_their_pattern(fmt: str, text: str, expected: object):
    logical = "timestamp" if "HH" in fmt else "date"
    value = typed(pa.array([text], pa.large_string()), pa.array([True]), Column("x", logical, fmt=fmt))
    assert (value.values.to_pylist(), value.invalid.to_pylist()) == ([expected], [expected is None])


def test_every_pattern_is_tested():
    assert set(DATETIME_PATTERNS) == {
        "yyyy-MM-dd",
        "yyyy-MM-dd HH:mm:ss",
        "yyyy-MM-dd'T'HH:mm:ss",
        "yyyyMMdd",
        "yyyyMMdd-HHmmss",
    }


def test_problems_are_joined_in_the_order_found_and_empty_for_a_good_record():
    problems = Problems(3)
    problems.add(pa.array([True, False, False]), "first")
    problems.add(pa.array([False, False, False]), "never")
    problems.add(pa.array([True, False, True]), pa.array(["a", "b", "c"], pa.large_string()))
    assert problems.reason().to_pylist() == ["first; a", "", "c"]
    assert Problems(2).reason().to_pylist() == ["", ""]


def test_a_column_the_cast_rejects_everywhere_is_typed_value_by_value():
    texts = [f"{n}.{n % 10}05" for n in range(1000)]  # three decimals for a scale of two: each one is rounded
    value = typed(pa.array(texts, pa.large_string()), pa.array([True] * 1000), Column("d", "decimal(8,2)"))
    assert value.values.to_pylist()[:3] == [Decimal("0.01"), Decimal("1.11"), Decimal("2.21")]
    assert value.values.to_pylist()[999] == Decimal("999.91")
    assert value.invalid.to_pylist() == [False] * 1000
