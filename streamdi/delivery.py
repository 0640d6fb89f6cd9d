"""Bringing a data set's batch folder into the landing zone: whole, or dripped as many micro-batches.

`streamdi load --data DIR --batch K` calls these, then the pipeline. A data set is a directory with
`Batch1/`, `Batch2/`, ... as the official generator (or `streamdi generate`) writes them.

- `deliver_batch` puts every file of `DIR/BatchK` (audit files included) under `landing/BatchK/`, hard-linked
  when the landing zone is on the same file system (else copied under a temporary name, then renamed), so a
  collect right after registers the whole batch as one micro-batch. The batch's audit files at the data set's
  root go with it: `DIR/BatchK_audit.csv` (the batch's FirstDay and LastDay), and with batch 1
  `DIR/Generator_audit.csv`, so the staged figures hold everything the audit compares with.
- `drip_batch` cuts the batch into `parts` pieces per file with the generator's drip mode (contiguous pieces,
  names carrying the TPC-DI batch) and calls `after_group` each time a group of pieces has been delivered:
  the caller runs the pipeline there, so each group becomes one micro-batch. The audit files (the folder's and
  the root's) go under `landing/BatchK/` with the last group.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

_BATCH_DIR = re.compile(r"Batch(\d+)")


def batch_dir(data_dir: Path, batch: int) -> Path:
    """`data_dir/Batch<batch>`, or a clear error naming what exists."""
    folder = data_dir / f"Batch{batch}"
    if not folder.is_dir():
        found = (
            sorted(p.name for p in data_dir.iterdir() if p.is_dir() and _BATCH_DIR.fullmatch(p.name))
            if (data_dir.is_dir())
            else []
        )
        hint = f"it has {', '.join(found)}" if found else "it has no BatchN folders"
        raise FileNotFoundError(f"{folder} does not exist ({data_dir}: {hint})")
    return folder


def place(source: Path, target: Path) -> bool:
    """Put `source` at `target` atomically; False when an identical file is already there."""
    if target.exists():
        if target.stat().st_size == source.stat().st_size and target.read_bytes() == source.read_bytes():
            return False
        raise FileExistsError(f"{target} already exists with other content; deliver corrections under a new name")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)
    return True


def root_audits(data_dir: Path, batch: int) -> list[Path]:
    """The audit files of TPC-DI batch `batch` at the data set's root: `Batch<batch>_audit.csv` and, for batch 1,
    `Generator_audit.csv` (those that exist)."""
    names = [f"Batch{batch}_audit.csv", *(["Generator_audit.csv"] if batch == 1 else [])]
    return [data_dir / n for n in names if (data_dir / n).is_file()]


def deliver_batch(data_dir: Path, batch: int, landing: Path) -> list[str]:
    """Deliver `data_dir/Batch<batch>` (and the batch's root audit files) into `landing/Batch<batch>/`; returns the
    files delivered (new ones)."""
    folder = batch_dir(data_dir, batch)
    delivered = []
    for source in [*sorted(p for p in folder.iterdir() if p.is_file()), *root_audits(data_dir, batch)]:
        if place(source, landing / folder.name / source.name):
            delivered.append(f"{folder.name}/{source.name}")
    return delivered


def drip_batch(
    data_dir: Path,
    batch: int,
    landing: Path,
    parts: int,
    after_group: Callable[[int, int], None],
    seed: int = 0,
) -> int:
    """Deliver `data_dir/Batch<batch>` as `parts` groups of pieces; `after_group(group, groups)` runs after each.

    Returns the number of groups. Groups follow the drip plan's delivery order: a new group starts whenever
    the piece number changes, so without faults there are exactly `parts` groups (fewer for tiny files).
    """
    from streamdi.generator.drip import DripOptions, drip, plan  # numpy and the text tables: only a drip needs them

    folder = batch_dir(data_dir, batch)
    options = DripOptions(parts=parts, seed=seed)
    deliveries, _ = plan(folder, options)
    last_of_group: dict[int, int] = {}  # delivery seq -> group number, for the last delivery of each group
    group = 0
    for i, d in enumerate(deliveries):
        if i + 1 == len(deliveries) or deliveries[i + 1].part != d.part:
            group += 1
            last_of_group[d.seq] = group
    groups = group
    audits = [*sorted(folder.glob("*_audit.csv")), *root_audits(data_dir, batch)]

    def delivered(d) -> None:
        done = last_of_group.get(d.seq)
        if done is None:
            return
        if done == groups:
            for audit in audits:
                place(audit, landing / folder.name / audit.name)
        after_group(done, groups)

    drip(folder, landing, options, on_delivery=delivered)
    return groups
