"""Landing files of finished micro-batches deleted after a retention, so an always-on landing zone does not grow
for ever (a drip at SF 6 lands ~10 MB a micro-batch: ~170 GB a day at one micro-batch every 5 s).

A registered file is read only by the stage of its micro-batch (`jobs.landing.read_registered`); once every stage
of that micro-batch is done, its rows are in the lake's staging tables and the warehouse, and its name, size and
SHA-256 stay in the batch log, so the collector never registers it again: delivered again under the same name
with the same bytes it is passed over, with other bytes it is reported as changed, as before. The files of a
micro-batch go once its migration has been done for `retention_hours` (the batch log's event time), and only as
they were registered (same size and modification time: a file rewritten in place since, which the collector
reported, is left for the operator). Kept: the files of a skipped micro-batch (their rows never reached the
warehouse: an operator may mend and deliver them again), of a halted or pending one, and anything not registered.

Micro-batches are looked at in order and the walk stops at the first one not finished or finished too recently, so
a call costs the micro-batches finished since the last one (`Cleanup` remembers where a process stopped; a new
process walks the history once: an `unlink` of a file already gone each).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from pathlib import Path

from streamdi.batchlog import BatchFile, BatchLog
from streamdi.batchlog_index import DONE, SKIPPED, STAGES

log = logging.getLogger(__name__)

CHECK_EVERY_SECONDS = 600.0  # a long-running process looks at the landing zone's finished files this often


@dataclass
class Cleanup:
    """What one process remembers between its cleanups: the micro-batches up to `through` are dealt with (their
    files deleted, or kept for good: skipped), and when it last looked (`time.monotonic()`)."""

    through: int = 0
    looked_at: float | None = None


@dataclass(frozen=True)
class Cleaned:
    files: int = 0
    bytes: int = 0
    batches: list[int] = field(default_factory=list)  # the micro-batches whose files were deleted


def clean_landing(
    batch_log: BatchLog, landing: Path, retention_hours: float, *, now: dt.datetime, cleanup: Cleanup | None = None
) -> Cleaned:
    """Delete the landing files of the micro-batches whose every stage is done and whose migration was done more
    than `retention_hours` before `now`, as the module's text says; `cleanup` carries where the last call of this
    process stopped (and is moved on)."""
    cleanup = cleanup if cleanup is not None else Cleanup()
    logged = batch_log.states()
    batches = [b for b in batch_log.batch_ids() if b > cleanup.through]
    if not batches:
        return Cleaned()
    finished_at = {b: at for (b, _), at in batch_log.done_times(stage="migrate", after=cleanup.through).items()}
    cutoff = now - dt.timedelta(hours=retention_hours)
    deleted, size, cleaned = 0, 0, []
    for batch_id in batches:
        states = [logged.get((batch_id, stage)) for stage in STAGES]
        if SKIPPED in states and all(s in (DONE, SKIPPED) for s in states):
            cleanup.through = batch_id  # an operator's skip: its files stay
            continue
        if any(s != DONE for s in states) or batch_id not in finished_at or finished_at[batch_id] > cutoff:
            break
        files = batch_log.files(batch_id)
        removed = [f for f in files if _remove(landing, f)]
        deleted += len(removed)
        size += sum(f.size_bytes for f in removed)
        if removed:
            cleaned.append(batch_id)
        cleanup.through = batch_id
    if deleted:
        log.info(
            "landing zone: deleted %d file(s) (%.1f MB) of micro-batch(es) %s..%s, migrated more than %g h ago",
            *(deleted, size / 1e6, cleaned[0], cleaned[-1], retention_hours),
        )
    return Cleaned(deleted, size, cleaned)


def _remove(landing: Path, registered: BatchFile) -> bool:
    """Delete `registered`'s file if it is there as registered (size and modification time); whether it did."""
    path = landing / registered.file
    try:
        stat = path.stat(follow_symlinks=False)
    except FileNotFoundError:
        return False
    arrived_at = dt.datetime.fromtimestamp(stat.st_mtime, tz=dt.UTC)
    if stat.st_size != registered.size_bytes or arrived_at != registered.arrived_at:
        what = (registered.file, registered.batch_id)
        log.warning("landing file %s of micro-batch %s changed since it was collected: kept", *what)
        return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
