"""Platform tables in the lake: the batch log, the single source of progress.

- `platform.batch_files`: one row per landing file, written once when the collector registers it. The
  micro-batch `batch_id` increases with arrival (file modification time, ties broken by file name).
- `platform.batch_events`: append-only stage transitions per batch (`stage` done, `halted`, ...). A stage's
  state follows from the events it has (`streamdi.batchlog.stage_states`), not from their times.
"""

from __future__ import annotations

from schemas.model import Column as C
from schemas.model import Table

BATCH_FILES = Table(
    name="batch_files",
    layer="platform",
    columns=(
        C("batch_id", "bigint", False, "micro-batch sequence number"),
        C("file_seq", "int", False, "position of the file inside its micro-batch (arrival order)"),
        C("file", "string", False, "path relative to the landing zone"),
        C("size_bytes", "bigint", False),
        C("sha256", "string", False),
        C("arrived_at", "timestamp", False, "file modification time when registered"),
        C("source_batch", "int", False, "TPC-DI batch the file belongs to"),
        C("registered_at", "timestamp", False),
    ),
    key=("file",),
    order_by=("batch_id", "file_seq"),
)

BATCH_EVENTS = Table(
    name="batch_events",
    layer="platform",
    columns=(
        C("batch_id", "bigint", False),
        C("stage", "string", False, "stage, transform or migrate"),
        C("state", "string", False, "done, halted, skipped, resumed"),
        C("at", "timestamp", False),
        C("detail", "string", True, "JSON with counts or the reason"),
    ),
    order_by=("batch_id", "at", "stage"),
)

PLATFORM_TABLES = (BATCH_FILES, BATCH_EVENTS)
