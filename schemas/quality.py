"""Data-quality tables in the lake (`quality.*`), written by the validation in the batch dataflow.

- `quality.results`: one row per (micro-batch, attempt, table, check) with what the check found and what its
  policy did. `attempt` counts the operator's resumes of the batch's stage (0 for the first run), so a resumed
  batch keeps the results of the run that halted it.
- `quality.quarantine`: the rows a `quarantine` check moved out of a table, as JSON, with the checks they
  failed. Keyed by (micro-batch, table, row key): a rerun quarantines the same rows once.
"""

from __future__ import annotations

from schemas.model import Column as C
from schemas.model import Table

QUALITY_RESULTS = Table(
    name="results",
    layer="quality",
    columns=(
        C("batch_id", "bigint", False, "micro-batch"),
        C("attempt", "int", False, "0 for the first run of the stage, n after the n-th resume"),
        C("table_name", "string", False, "qualified name of the validated table (`staging.trade`)"),
        C("check_id", "string", False, "the check's id in its suite (expectations/<layer>/<table>.yml)"),
        C("expectation", "string", False, "Great Expectations expectation type"),
        C("column_name", "string", True, "the column the expectation is about, if one"),
        C("policy", "string", False, "warn, quarantine or halt"),
        C("action", "string", False, "passed, warned, quarantined, halted or overridden (halt after a resume)"),
        C("success", "boolean", False),
        C("element_count", "bigint", False, "rows validated"),
        C("unexpected_count", "bigint", False, "rows that failed (0 for table-level expectations)"),
        C("detail", "string", True, "JSON: the expectation's arguments and up to 20 failing values"),
    ),
    key=("batch_id", "attempt", "table_name", "check_id"),
    order_by=("batch_id", "attempt", "table_name", "check_id"),
)

QUARANTINE = Table(
    name="quarantine",
    layer="quality",
    columns=(
        C("batch_id", "bigint", False, "micro-batch"),
        C("table_name", "string", False, "the table the row was held out of"),
        C("row_key", "string", False, "JSON of the row's key columns (staging: source file and line number)"),
        C("check_ids", "string", False, "the quarantine checks the row failed, comma-separated"),
        C("row", "string", False, "JSON of the whole row"),
    ),
    key=("batch_id", "table_name", "row_key"),
    order_by=("batch_id", "table_name", "row_key"),
)

QUALITY_TABLES = (QUALITY_RESULTS, QUARANTINE)
