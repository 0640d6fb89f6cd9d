"""The collector: turns what arrived in the landing zone into the next micro-batch of the batch log.

Every file under the landing directory (recursively) is registered exactly once. New files found in one
pass form one micro-batch, ordered by arrival (modification time, ties broken by path). Writers should
deliver a file under a temporary name and rename it when complete: names starting with `.` or `_`, or ending
in `.tmp`, `.part` or `~`, are not collected. A registered file whose content later changes is reported and
not collected again (deliver corrections under a new name). A registered file whose size and modification
time are unchanged is not read again (a scheduled collect costs a directory listing).

The TPC-DI batch of a file comes from its path: a `BatchN` directory or a `batchN` mark in the file name
(e.g. `Batch2/Trade.txt`, `Trade_batch2_0007.txt`). A file with no mark belongs to the TPC-DI batch that was
open when it arrived: the latest batch of any file registered or found before it (batch 1 at the start).

New files of different TPC-DI batches never share a micro-batch: one pass registers one micro-batch per
TPC-DI batch found, oldest TPC-DI batch first, so a landing zone holding `Batch1/`, `Batch2/` and `Batch3/`
becomes micro-batches 1, 2 and 3 in that order.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from streamdi.batchlog import BatchFile, BatchLog, LandedFile

log = logging.getLogger(__name__)

_SOURCE_BATCH = re.compile(r"(?i)batch[_-]?(\d+)")
_SKIP_SUFFIXES = (".tmp", ".part", "~")


@dataclass(frozen=True)
class CollectResult:
    batch_id: int | None  # the last micro-batch registered by this pass
    files: list[LandedFile] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    batch_ids: list[int] = field(default_factory=list)  # every micro-batch registered by this pass


def source_batch_of(relative: str) -> int | None:
    """The TPC-DI batch marked in a landing path (`Batch2/...`, `..._batch2_...`), or None if unmarked."""
    marks = _SOURCE_BATCH.findall(relative)
    return int(marks[-1]) if marks else None


def is_collectable(name: str) -> bool:
    """Whether a file of this name is collected (not a temporary name of a delivery in progress)."""
    return not name.startswith((".", "_")) and not name.endswith(_SKIP_SUFFIXES)


def _is_candidate(path: Path) -> bool:
    return path.is_file() and is_collectable(path.name)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def scan_landing(landing: Path, known: dict[str, BatchFile] | None = None) -> list[LandedFile]:
    """Every collectable file under `landing`, in arrival order (mtime, then relative path).

    A file in `known` (the registered files) whose size and modification time are unchanged keeps its
    registered checksum instead of being read again, so a scheduled collect costs a directory listing, not a
    re-read of the whole landing zone.
    """
    if not landing.is_dir():
        raise FileNotFoundError(f"landing directory {landing} does not exist")
    known = known or {}
    found: list[tuple[LandedFile, bool]] = []
    for path in landing.rglob("*"):
        if not _is_candidate(path) or any(p.startswith((".", "_")) for p in path.relative_to(landing).parts[:-1]):
            continue
        stat = path.stat()
        relative = path.relative_to(landing).as_posix()
        arrived_at = dt.datetime.fromtimestamp(stat.st_mtime, tz=dt.UTC)
        seen = known.get(relative)
        unchanged = seen is not None and seen.size_bytes == stat.st_size and seen.arrived_at == arrived_at
        mark = source_batch_of(relative)
        landed = LandedFile(
            file=relative,
            size_bytes=stat.st_size,
            sha256=seen.sha256 if unchanged else _sha256(path),
            arrived_at=arrived_at,
            source_batch=mark or 0,
        )
        found.append((landed, mark is None and seen is None))
    found.sort(key=lambda item: (item[0].arrived_at, item[0].file))
    # an unmarked new file belongs to the TPC-DI batch open when it arrived
    open_batch = max((f.source_batch for f in known.values()), default=1)
    result = []
    for landed, unmarked in found:
        if unmarked:
            landed = LandedFile(landed.file, landed.size_bytes, landed.sha256, landed.arrived_at, open_batch)
        elif landed.file in known:
            landed = LandedFile(
                landed.file, landed.size_bytes, landed.sha256, landed.arrived_at, known[landed.file].source_batch
            )
        open_batch = max(open_batch, landed.source_batch)
        result.append(landed)
    return result


def collect(batch_log: BatchLog, landing: Path, *, now: dt.datetime) -> CollectResult:
    """Register every new landing file exactly once (even under concurrent callers): one new micro-batch per
    TPC-DI batch among the new files, oldest TPC-DI batch first."""
    with batch_log.lake.lock("collector"):
        known = batch_log.registered_files()
        new, changed = [], []
        for landed in scan_landing(landing, known):
            seen = known.get(landed.file)
            if seen is None:
                new.append(landed)
            elif seen.sha256 != landed.sha256:
                changed.append(landed.file)
        for name in changed:
            log.warning(
                "landing file %s changed after it was collected in batch %s; ignored "
                "(deliver corrections under a new name)",
                name,
                known[name].batch_id,
            )
        batch_ids = []
        for source_batch in sorted({f.source_batch for f in new}):
            batch_ids.append(batch_log.register([f for f in new if f.source_batch == source_batch], now=now))
    return CollectResult(batch_id=batch_ids[-1] if batch_ids else None, files=new, changed=changed, batch_ids=batch_ids)
