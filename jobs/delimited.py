"""Parse delimited source lines (pipe- or comma-separated) into typed rows, with Arrow's C++ kernels.

A delimited file is already split into numbered lines in the driver (`jobs.landing.numbered_lines`); the fields
are split here and typed by `jobs.fields`, column by column, without a round trip through the JVM (measured on
SF 3's Batch1: see `bench/README.md`). A line is bad when it is empty, has the wrong number of fields, has a
value that is not of its declared type, leaves a required field empty, or has an action code outside its set
(`ACTION_CODES`); its `reason` then names every problem, in column order.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from jobs import fields
from schemas.model import SourceFile

# Codes that say how a line is applied (TPC-DI 2.2.2): CDC_FLAG of every incremental file (I insert, U update) and
# W_ACTION of WatchHistory (ACTV adds a watch, CNCL removes it). A line with another code cannot be applied (the
# watch transform would take any other action for a removal), so it is rejected like a value that is not of its
# type. Other coded values are checked by the staging suites (`expectations/staging/`).
ACTION_CODES: dict[str, tuple[str, ...]] = {"cdc_flag": ("I", "U"), "w_action": ("ACTV", "CNCL")}


def check_lines(lines: pa.Table, source: SourceFile) -> pa.Table:
    """Split and type `lines` of `source`: `line_no`, `line`, the other columns of `lines` (lineage, passed
    through), the declared columns and `reason` ('' for a good line).

    `lines` has `line_no` and `line` (the raw text, line ending removed). Typed values of a bad line are
    NULL or partial; only `reason` is meant to be read for it.
    """
    fields.check_supported(source.columns, source.name)
    expected = len(source.columns)
    line = lines["line"].combine_chunks().cast(pa.large_string())
    split = pc.split_pattern(line, source.delimiter)
    count = pc.list_value_length(split)
    right_width = pc.equal(count, expected)
    if not pc.all(right_width).as_py():
        # A line of the wrong width is checked as if it were a line of empty fields: its reason is its width.
        filler = pa.scalar(source.delimiter * (expected - 1), line.type)
        split = pc.split_pattern(pc.if_else(right_width, line, filler), source.delimiter)
    problems = fields.Problems(len(line))
    values = {}
    for i, col in enumerate(source.columns):
        raw = pc.list_element(split, i)
        present = pc.not_equal(raw, "")
        values[col.name] = fields.type_column(problems, raw, present, col)
        codes = ACTION_CODES.get(col.name)
        if codes is not None:
            unknown = pc.and_(present, pc.invert(pc.is_in(raw, pa.array(codes, raw.type))))
            problems.add(unknown, (f"{col.name}: '", raw, f"' is not one of {', '.join(codes)}"))
    wrong_width = (f"expected {expected} fields, found ", count.cast(pa.string()))
    return fields.checked_lines(lines, line, values, fields.line_reason(line, right_width, problems, wrong_width))


def parse_delimited(lines: pa.Table, source: SourceFile) -> tuple[pa.Table, pa.Table]:
    """`(staged, rejected)` lines of one source: `staged` has the declared columns, `line_no` and the other
    columns of `lines`; `rejected` has `line_no`, `line`, `reason` and the other columns. Every input line is in
    exactly one of the two."""
    return fields.split_checked(check_lines(lines, source), [c.name for c in source.columns])
