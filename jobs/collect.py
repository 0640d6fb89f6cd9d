"""Bring several results of a step to the driver with one Spark action.

A small micro-batch's cost is Spark's fixed cost per action (planning, scheduling the stages of each plan), not
its data. A step that needs several results (rows to write, alerts, holds) therefore collects them together:
one plan, whose independent stages Spark schedules side by side, and one Arrow transfer.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T


def collect_parts(parts: Mapping[str, DataFrame]) -> dict[str, pa.Table]:
    """Every DataFrame of `parts` as an Arrow table with its own columns, all computed by one Spark action.

    Each part's rows travel as one struct column named after the part (NULL in the other parts' rows), so
    parts may have columns of the same name and different types. Row order within a part is not defined:
    callers sort (the lake writes in each table's declared order)."""
    if not parts:
        return {}
    packed = [df.select(_nullable_struct(df).alias(name)) for name, df in parts.items()]
    data = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), packed).toArrow()
    out = {}
    for name in parts:
        column = data[name].combine_chunks()
        out[name] = pa.Table.from_struct_array(column.filter(pc.is_valid(column)))
    return out


def _nullable_struct(df: DataFrame) -> Column:
    """The row of `df` as one struct whose fields may all be NULL: in the other parts' rows the struct is NULL,
    and PySpark's Arrow conversion rejects a NULL struct with non-nullable fields."""
    fields = [T.StructField(f.name, f.dataType, True) for f in df.schema.fields]
    return F.struct(*[F.col(c) for c in df.columns]).cast(T.StructType(fields))
