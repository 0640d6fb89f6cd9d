"""Platform tables in the lake: the batch log, the single source of progress.

- `platform.batch_files`: one row per landing file, written once when the collector registers it. The
  micro-batch `batch_id` increases with arrival (file modification time, ties broken by file name).
- `platform.batch_events`: append-only stage transitions per batch (`stage` done, `halted`, ...). A stage's
  state follows from the events it has (`streamdi.batchlog.stage_states`), not from their times.
"""

from __future__ import annotations

from schemas.model import Column as C
from schemas.model import Table

# The log's data files of their own size: compaction then joins a few micro-batches' small files and leaves a full
# file alone, instead of rewriting one file of the whole history at every compaction (then read again by every
# process's index of the log, `streamdi.batchlog_index`): 256 KiB, ~3,000 registered files.
LOG_FILE_BYTES = 256 * 1024

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
    file_bytes=LOG_FILE_BYTES,
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
    file_bytes=LOG_FILE_BYTES,
)

PLATFORM_TABLES = (BATCH_FILES, BATCH_EVENTS)
