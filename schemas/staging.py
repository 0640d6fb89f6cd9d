"""Staging tables: each source's fields plus lineage, and the rejects table for lines that do not parse.

Lineage columns:
- `batch_id`: the micro-batch (batch log sequence number) that staged the line; orders and deduplicates work,
  never copied into warehouse rows.
- `source_batch`: the TPC-DI batch (1 historical, 2.. incremental) the file belongs to.
- `source_file`: the landing file's path relative to the landing zone.
- `line_no`: 1-based line number in that file.
"""

from __future__ import annotations

from functools import cache

from schemas.model import Column, SourceFile, Table

LINEAGE = (
    Column("batch_id", "bigint", False, "micro-batch that staged this line"),
    Column("source_batch", "int", False, "TPC-DI batch of the file"),
    Column("source_file", "string", False, "landing file, relative to the landing zone"),
    Column("line_no", "bigint", False, "1-based line number in the file"),
)


@cache
def staging_table_for(source: SourceFile) -> Table:
    return Table(
        name=source.name.lower(),
        layer="staging",
        columns=(*source.columns, *LINEAGE),
        order_by=("batch_id", "source_file", "line_no"),
        doc=f"Parsed lines of {source.pattern}.",
    )


REJECTS = Table(
    name="rejects",
    layer="staging",
    columns=(
        Column("batch_id", "bigint", False),
        Column("source_batch", "int", False),
        Column("source", "string", False, "declared source name, e.g. TradeType"),
        Column("source_file", "string", False),
        Column("line_no", "bigint", False),
        Column("line", "string", True, "the raw line as read"),
        Column("reason", "string", False, "why the line was rejected"),
    ),
    order_by=("batch_id", "source_file", "line_no"),
    doc="Every line that could not be parsed, with the reason; read = staged + rejected.",
)
