"""The collector: turns what arrived in the landing zone into the next micro-batch of the batch log.

Every file under the landing directory (recursively) is registered exactly once. New files found in one
pass form one micro-batch, ordered by arrival (modification time, ties broken by path). Writers should
deliver a file under a temporary name and rename it when complete: names starting with `.` or `_`, or ending
in `.tmp`, `.part` or `~`, are not collected. A registered file whose content later changes is reported and
not collected again (deliver corrections under a new name). A registered file whose size and modification
time are unchanged is not read again (a scheduled collect costs a directory listing).

The TPC-DI batch of a file comes from its path: a `BatchN` directory or a `batchN` mark in the file name
(e.g. `Batch2/Trade.txt`, `Trade_batch2_0007.txt`); a file with no mark belongs to batch 1.
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
    batch_id: int | None
    files: list[LandedFile] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)


def source_batch_of(relative: str) -> int:
    marks = _SOURCE_BATCH.findall(relative)
    return int(marks[-1]) if marks else 1


def _is_candidate(path: Path) -> bool:
    name = path.name
    return path.is_file() and not name.startswith((".", "_")) and not name.endswith(_SKIP_SUFFIXES)


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
    found = []
    for path in landing.rglob("*"):
        if not _is_candidate(path) or any(p.startswith((".", "_")) for p in path.relative_to(landing).parts[:-1]):
            continue
        stat = path.stat()
        relative = path.relative_to(landing).as_posix()
        arrived_at = dt.datetime.fromtimestamp(stat.st_mtime, tz=dt.UTC)
        seen = known.get(relative)
        unchanged = seen is not None and seen.size_bytes == stat.st_size and seen.arrived_at == arrived_at
        found.append(
            LandedFile(
                file=relative,
                size_bytes=stat.st_size,
                sha256=seen.sha256 if unchanged else _sha256(path),
                arrived_at=arrived_at,
                source_batch=source_batch_of(relative),
            )
        )
    return sorted(found, key=lambda f: (f.arrived_at, f.file))


def collect(batch_log: BatchLog, landing: Path, *, now: dt.datetime) -> CollectResult:
    """Register every new landing file as one new micro-batch (exactly once, even under concurrent callers)."""
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
        batch_id = batch_log.register(new, now=now)
    return CollectResult(batch_id=batch_id, files=new, changed=changed)
