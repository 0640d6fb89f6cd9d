"""Parse delimited source lines (pipe- or comma-separated) into typed rows, with Arrow's C++ kernels.

A delimited file is already split into numbered lines in the driver (`jobs.stage.numbered_lines`); the fields
are split here and typed by `jobs.fields`, column by column, without a round trip through the JVM (measured on
SF 3's Batch1: see `bench/README.md`). A line is bad when it is empty, has the wrong number of fields, has a
value that is not of its declared type, or leaves a required field empty; its `reason` then names every
problem, in column order.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from jobs import fields
from schemas.model import SourceFile


def check_lines(lines: pa.Table, source: SourceFile) -> pa.Table:
    """Split and type `lines` of `source`: `line_no`, `line`, the other columns of `lines` (lineage, passed
    through), the declared columns and `reason` ('' for a good line).

    `lines` has `line_no` and `line` (the raw text, line ending removed). Typed values of a bad line are
    NULL or partial; only `reason` is meant to be read for it.
    """
    fields.check_supported(source.columns, source.name)
    expected = len(source.columns)
    line = lines["line"].combine_chunks().cast(pa.large_string())
    count = pc.list_value_length(pc.split_pattern(line, source.delimiter))
    right_width = pc.equal(count, expected)
    # A line of the wrong width is checked as if it were a line of empty fields: its reason is its width.
    filler = pa.scalar(source.delimiter * (expected - 1), line.type)
    split = pc.split_pattern(pc.if_else(right_width, line, filler), source.delimiter)
    problems, typed = fields.Problems(len(line)), []
    for i, col in enumerate(source.columns):
        raw = pc.list_element(split, i)
        present = pc.not_equal(raw, "")
        value = fields.typed(raw, present, col)
        typed.append(value.values)
        problems.add_typed(col, raw, present, value)
    reason = pc.if_else(
        pc.equal(line, ""),
        pa.scalar("empty line", line.type),
        pc.if_else(
            right_width, problems.reason(), fields.join(f"expected {expected} fields, found ", count.cast(pa.string()))
        ),
    )
    out = lines.drop_columns(["line"]).add_column(1, "line", line)
    for col, values in zip(source.columns, typed, strict=True):
        out = out.append_column(col.name, values)
    return out.append_column("reason", reason)


def parse_delimited(lines: pa.Table, source: SourceFile) -> tuple[pa.Table, pa.Table]:
    """`(staged, rejected)` lines of one source: `staged` has the declared columns, `line_no` and the other
    columns of `lines`; `rejected` has `line_no`, `line`, `reason` and the other columns. Every input line is in
    exactly one of the two."""
    checked = check_lines(lines, source)
    good = pc.equal(checked["reason"], "")
    passthrough = [c for c in lines.column_names if c not in ("line_no", "line")]
    staged = checked.filter(good).select([*[c.name for c in source.columns], "line_no", *passthrough])
    rejected = checked.filter(pc.invert(good)).select(["line_no", "line", "reason", *passthrough])
    return staged, rejected
