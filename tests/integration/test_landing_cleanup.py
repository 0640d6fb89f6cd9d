"""The landing files of finished micro-batches are deleted after the retention, and nothing else is: a real batch
log in a Delta lake on disk, files registered by the collector, stages marked as the runner marks them."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
from builders import deliver

from streamdi.batchlog import DONE, BatchLog
from streamdi.collector import collect
from streamdi.lake import Lake
from streamdi.landing_cleanup import Cleanup, clean_landing

pytestmark = pytest.mark.integration

T = dt.datetime(2024, 7, 1, 12, 0, tzinfo=dt.UTC)


def _hours(h: float) -> dt.datetime:
    return T + dt.timedelta(hours=h)


def _micro_batch(batch_log: BatchLog, landing: Path, source_batch: int) -> int:
    """Deliver Batch<source_batch>/A.txt and B.txt and collect them as one micro-batch."""
    for name in ("A.txt", "B.txt"):
        deliver(landing, f"Batch{source_batch}/{name}", f"{name} of batch {source_batch}\n".encode(), _hours(-10))
    return collect(batch_log, landing, now=_hours(-10)).batch_id


def _done(batch_log: BatchLog, batch_id: int, at: dt.datetime, stages=("stage", "transform", "migrate")) -> None:
    for stage in stages:
        batch_log.mark(batch_id, stage, DONE, now=at)


def _there(landing: Path) -> list[str]:
    return sorted(str(p.relative_to(landing)) for p in landing.rglob("*") if p.is_file())


def test_only_the_files_of_micro_batches_migrated_before_the_retention_go(tmp_path: Path):
    landing = tmp_path / "landing"
    batch_log = BatchLog(Lake(tmp_path / "lake"))
    ids = [_micro_batch(batch_log, landing, b) for b in (2, 3, 4, 5, 6)]
    assert ids == [1, 2, 3, 4, 5]
    _done(batch_log, 1, _hours(-3))  # migrated 3 hours ago
    _done(batch_log, 2, _hours(-3), stages=("stage",))  # staged, then an operator skipped it
    batch_log.skip(2, "bad file", now=_hours(-3))
    _done(batch_log, 3, _hours(-2))  # migrated 2 hours ago, B.txt rewritten in place since
    deliver(landing, "Batch4/B.txt", b"other bytes\n", _hours(-1))
    _done(batch_log, 4, _hours(-0.5))  # migrated half an hour ago
    _done(batch_log, 5, _hours(-0.1), stages=("stage",))  # transform pending

    cleanup = Cleanup()
    cleaned = clean_landing(batch_log, landing, 1, now=T, cleanup=cleanup)
    assert (cleaned.files, cleaned.batches, cleanup.through) == (3, [1, 3], 3)
    assert cleaned.bytes == len(b"A.txt of batch 2\n") + len(b"B.txt of batch 2\n") + len(b"A.txt of batch 4\n")
    kept = ["Batch3/A.txt", "Batch3/B.txt", "Batch4/B.txt", "Batch5/A.txt", "Batch5/B.txt"]
    assert _there(landing) == [*kept, "Batch6/A.txt", "Batch6/B.txt"]

    # an hour later micro-batch 4 is old enough; 5 is still not finished
    later = clean_landing(batch_log, landing, 1, now=_hours(1), cleanup=cleanup)
    assert (later.files, later.batches, cleanup.through) == (2, [4], 4)
    assert _there(landing) == ["Batch3/A.txt", "Batch3/B.txt", "Batch4/B.txt", "Batch6/A.txt", "Batch6/B.txt"]

    # a new process walks the history again and finds nothing more to delete
    again = Cleanup()
    assert clean_landing(batch_log, landing, 1, now=_hours(1), cleanup=again).files == 0
    assert again.through == 4

    # the collector is not misled: nothing new, the rewritten file still reported; a deleted file delivered again
    # with the same bytes (a producer's retry) is passed over, with other bytes it is reported
    deliver(landing, "Batch2/A.txt", b"A.txt of batch 2\n", _hours(1))
    deliver(landing, "Batch5/A.txt", b"a correction\n", _hours(1))
    after = collect(batch_log, landing, now=_hours(1))
    assert (after.batch_id, after.files) == (None, [])
    assert sorted(after.changed) == ["Batch4/B.txt", "Batch5/A.txt"]
    assert batch_log.last_batch_id() == 5


def test_a_retention_of_zero_deletes_a_migrated_micro_batch_at_once_and_leaves_unregistered_files(tmp_path: Path):
    landing = tmp_path / "landing"
    batch_log = BatchLog(Lake(tmp_path / "lake"))
    batch_id = _micro_batch(batch_log, landing, 2)
    _done(batch_log, batch_id, T)
    deliver(landing, "Batch3/A.txt", b"arrived after the collect\n", T)
    (landing / "Batch3" / ".B.txt.tmp").write_bytes(b"a delivery in progress\n")
    assert clean_landing(batch_log, landing, 0, now=T).files == 2
    assert _there(landing) == ["Batch3/.B.txt.tmp", "Batch3/A.txt"]
    assert os.listdir(landing / "Batch2") == []  # directories stay (channels are directories too)


def test_nothing_is_deleted_before_any_micro_batch_is_marked(tmp_path: Path):
    landing = tmp_path / "landing"
    batch_log = BatchLog(Lake(tmp_path / "lake"))
    assert clean_landing(batch_log, landing, 0, now=T).files == 0  # no batch log at all
    _micro_batch(batch_log, landing, 2)  # registered, no event yet
    assert clean_landing(batch_log, landing, 0, now=T).files == 0
    assert _there(landing) == ["Batch2/A.txt", "Batch2/B.txt"]
