"""The batch log and the collector on real Delta tables (no Spark: the log reads through Arrow): batch id
allocation, file order, stage progress, the summary, arrival order and exclusions in the landing zone,
changed files, and two collectors racing on the same landing directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from builders import deliver

from schemas.platform import BATCH_EVENTS, BATCH_FILES
from streamdi.batchlog import BatchFile, BatchLog, BatchLogError, Halt, LandedFile
from streamdi.batchlog_index import _INDEXES
from streamdi.collector import CollectResult, collect
from streamdi.lake import Lake

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
NOW = datetime(2024, 7, 1, 9, 0, 0, tzinfo=UTC)
T0 = datetime(2024, 7, 1, 8, 0, 0, tzinfo=UTC)


def landed(file: str, *, size: int = 10, sha: str = "a", second: int = 0, source_batch: int = 1) -> LandedFile:
    return LandedFile(
        file=file,
        size_bytes=size,
        sha256=sha * 64,
        arrived_at=datetime(2024, 7, 1, 8, 0, second, tzinfo=UTC),
        source_batch=source_batch,
    )


def batch_file(batch_id: int, file_seq: int, f: LandedFile) -> BatchFile:
    return BatchFile(batch_id, file_seq, f.file, f.size_bytes, f.sha256, f.arrived_at, f.source_batch)


@pytest.fixture
def batch_log(tmp_path: Path) -> BatchLog:
    return BatchLog(Lake(tmp_path / "lake"))


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    path = tmp_path / "landing"
    path.mkdir()
    return path


# -- the batch log -----------------------------------------------------------------------------------------


def test_register_allocates_consecutive_batches_and_keeps_file_order(batch_log):
    date_file = landed("Batch1/Date.txt", size=120, sha="d", second=5)
    rate_file = landed("Batch1/TaxRate.txt", size=30, sha="e", second=1)  # older, but given second
    trade_file = landed("Batch2/Trade.txt", size=77, sha="f", second=9, source_batch=2)

    assert batch_log.last_batch_id() == 0
    assert batch_log.register([], now=NOW) is None
    assert batch_log.register([date_file, rate_file], now=NOW) == 1
    assert batch_log.register([trade_file], now=NOW) == 2

    assert batch_log.files(1) == [
        BatchFile(1, 1, "Batch1/Date.txt", 120, "d" * 64, datetime(2024, 7, 1, 8, 0, 5, tzinfo=UTC), 1),
        BatchFile(1, 2, "Batch1/TaxRate.txt", 30, "e" * 64, datetime(2024, 7, 1, 8, 0, 1, tzinfo=UTC), 1),
    ]
    assert batch_log.files(2) == [
        BatchFile(2, 1, "Batch2/Trade.txt", 77, "f" * 64, datetime(2024, 7, 1, 8, 0, 9, tzinfo=UTC), 2)
    ]
    assert batch_log.files(3) == []
    assert batch_log.last_batch_id() == 2
    assert batch_log.batch_ids() == [1, 2]
    assert sorted(batch_log.registered_files()) == [
        "Batch1/Date.txt",
        "Batch1/TaxRate.txt",
        "Batch2/Trade.txt",
    ]
    assert batch_log.registered_files()["Batch2/Trade.txt"].batch_id == 2


def test_registered_files_follow_other_processes_and_compaction(tmp_path):
    """`registered_files` reads each data file of the log once per process: what another process registers later,
    and the log's files rewritten by a compaction, are still seen whole."""
    mine = BatchLog(Lake(tmp_path / "lake"))
    theirs = BatchLog(Lake(tmp_path / "lake"))  # another process's handle on the same lake
    mine.register([landed("Batch1/Date.txt", sha="d")], now=NOW)
    assert list(mine.registered_files()) == ["Batch1/Date.txt"]
    for n in range(2, 6):
        theirs.register([landed(f"Batch{n}/Trade.txt", sha=str(n), second=n, source_batch=n)], now=NOW)
    expected = {
        "Batch1/Date.txt": BatchFile(
            1, 1, "Batch1/Date.txt", 10, "d" * 64, datetime(2024, 7, 1, 8, 0, 0, tzinfo=UTC), 1
        ),
        **{
            f"Batch{n}/Trade.txt": BatchFile(
                n, 1, f"Batch{n}/Trade.txt", 10, str(n) * 64, datetime(2024, 7, 1, 8, 0, n, tzinfo=UTC), n
            )
            for n in range(2, 6)
        },
    }
    assert mine.registered_files() == expected
    index = _INDEXES[(str(mine.lake.path(BATCH_FILES)), "batchlog/registered")]
    theirs.register([landed("Batch6/Trade.txt", sha="6", second=6, source_batch=6)], now=NOW)  # not yet read here
    assert theirs.lake.compact(2) == {"platform.batch_files": 6}  # six files of one row each: one now
    expected["Batch6/Trade.txt"] = BatchFile(
        6, 1, "Batch6/Trade.txt", 10, "6" * 64, datetime(2024, 7, 1, 8, 0, 6, tzinfo=UTC), 6
    )
    assert mine.registered_files() == expected
    assert mine.last_batch_id() == 6 and mine.files(6) == [expected["Batch6/Trade.txt"]]
    # the compaction's file holds the rows folded before and one more: taken in, not built again from every file
    assert _INDEXES[(str(mine.lake.path(BATCH_FILES)), "batchlog/registered")] is index
    kept = pa.Table.from_pylist([r for r in theirs.lake.read_arrow(BATCH_FILES).to_pylist() if r["batch_id"] != 3])
    theirs.lake.overwrite(BATCH_FILES, kept.cast(BATCH_FILES.arrow_schema()), app_id="test/forget", version=1)
    assert mine.registered_files() == {k: v for k, v in expected.items() if v.batch_id != 3}  # rows gone: built again
    assert _INDEXES[(str(mine.lake.path(BATCH_FILES)), "batchlog/registered")] is not index


def test_stage_states_follow_other_processes_and_compaction(tmp_path):
    """The events are folded per data file of the log once per process: marks, halts, resumes and skips made
    through another handle afterwards, and a compaction of the log, give the plan, halts and states a fresh
    process reads."""
    mine = BatchLog(Lake(tmp_path / "lake"))
    theirs = BatchLog(Lake(tmp_path / "lake"))
    for n in (1, 2, 3, 4):
        theirs.register([landed(f"Batch{n}/Trade.txt", sha=str(n), second=n, source_batch=n)], now=NOW)
    assert mine.pending() == [(b, s) for b in (1, 2, 3, 4) for s in ("stage", "transform", "migrate")]
    for stage in ("stage", "transform", "migrate"):
        theirs.mark(1, stage, "done", now=T0)
    theirs.mark(2, "stage", "done", now=T0)
    theirs.halt(2, "transform", "a failed check", now=T0.replace(hour=9))
    assert mine.pending() == [] and mine.halted() == [Halt(2, "transform", "a failed check", T0.replace(hour=9))]
    theirs.resume(2, now=T0.replace(hour=10))
    assert mine.resumes(2, "transform") == 1 and mine.halted() == []
    theirs.halt(2, "transform", "failed again", now=T0.replace(hour=11))
    assert mine.halted() == [Halt(2, "transform", "failed again", T0.replace(hour=11))]
    theirs.resume(2, now=T0.replace(hour=12))
    theirs.skip(3, "a bad file", now=T0)
    expected_states = {
        **{(1, s): "done" for s in ("stage", "transform", "migrate")},
        (2, "stage"): "done",
        (2, "transform"): "resumed",
        **{(3, s): "skipped" for s in ("stage", "transform", "migrate")},
    }
    expected_pending = [(2, "transform"), (2, "migrate"), (4, "stage"), (4, "transform"), (4, "migrate")]

    def answers(log: BatchLog) -> tuple:
        progress = log.progress()
        assert (progress.pending, progress.halted, progress.states) == (log.pending(), log.halted(), log.states())
        return progress.pending, progress.halted, progress.states, log.skipped_batches(), log.resumes(2, "transform")

    assert answers(mine) == (expected_pending, [], expected_states, frozenset({3}), 2)
    assert mine.files(4) == [batch_file(4, 1, landed("Batch4/Trade.txt", sha="4", second=4, source_batch=4))]
    assert (mine.last_batch_id(), mine.batch_ids(), mine.is_done(1, "migrate")) == (4, [1, 2, 3, 4], True)
    theirs.mark(4, "stage", "done", now=T0)  # not yet read here when the compaction takes its file in
    expected_states[(4, "stage")] = "done"
    expected_pending.remove((4, "stage"))
    index = _INDEXES[(str(mine.lake.path(BATCH_EVENTS)), "batchlog/events")]
    assert theirs.lake.compact(2)["platform.batch_events"] == 12  # one file per event: one now
    assert answers(mine) == (expected_pending, [], expected_states, frozenset({3}), 2)
    assert _INDEXES[(str(mine.lake.path(BATCH_EVENTS)), "batchlog/events")] is index  # taken in, not built again
    script = (
        "import sys; from streamdi.batchlog import BatchLog; from streamdi.lake import Lake; "
        "p = BatchLog(Lake(sys.argv[1])).progress(); print(p.pending, p.halted, sorted(p.states.items()))"
    )
    fresh = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "lake")], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert fresh.stdout.strip() == f"{expected_pending} [] {sorted(expected_states.items())}"


def test_the_migrators_readers_read_only_the_batches_after_a_given_one(batch_log):
    """`stage_progress` and `arrivals` with `after`: only the batches after it (the migrator's, after the last
    visible one), the same entries as the whole read gives for them."""
    for n in (1, 2, 3):
        batch_log.register([landed(f"Batch{n}/Trade.txt", second=n, source_batch=n)], now=NOW)
        batch_log.mark(n, "stage", "done", now=T0.replace(minute=n))
    batch_log.mark(1, "transform", "done", now=T0.replace(minute=10))
    batch_log.skip(3, "a bad file", now=NOW)
    every = batch_log.stage_progress(("stage", "transform"))
    assert batch_log.stage_progress(("stage", "transform"), after=1) == {k: v for k, v in every.items() if k[0] > 1}
    assert batch_log.stage_progress(("stage", "transform"), after=2) == {
        (3, "stage"): ("done", T0.replace(minute=3)),
        (3, "transform"): ("skipped", None),
    }
    assert batch_log.arrivals(after=1) == {2: T0.replace(second=2), 3: T0.replace(second=3)}
    assert batch_log.arrivals() == {1: T0.replace(second=1), **batch_log.arrivals(after=1)}


def test_stages_run_in_order_and_a_repeated_mark_is_a_no_op(batch_log):
    batch_log.register([landed("Batch1/Date.txt", second=3), landed("Batch1/Time.txt", second=4)], now=NOW)
    batch_log.register([landed("Batch2/Trade.txt", second=8, source_batch=2)], now=NOW)

    assert batch_log.pending() == [
        (1, "stage"),
        (1, "transform"),
        (1, "migrate"),
        (2, "stage"),
        (2, "transform"),
        (2, "migrate"),
    ]
    assert batch_log.next_step() == (1, "stage")

    assert batch_log.mark(1, "stage", "done", now=NOW, detail={"rows": 3}) is True

    assert batch_log.next_step() == (1, "transform")
    assert batch_log.is_done(1, "stage")
    assert not batch_log.is_done(1, "transform")
    assert batch_log.mark(1, "stage", "done", now=NOW) is False
    assert batch_log.pending() == [
        (1, "transform"),
        (1, "migrate"),
        (2, "stage"),
        (2, "transform"),
        (2, "migrate"),
    ]
    with pytest.raises(ValueError, match="unknown stage 'load'"):
        batch_log.mark(1, "load", "done", now=NOW)

    batch_log.mark(1, "transform", "done", now=NOW)
    batch_log.mark(1, "migrate", "halted", now=NOW, detail={"reason": "expectation failed"})

    assert batch_log.states() == {(1, "stage"): "done", (1, "transform"): "done", (1, "migrate"): "halted"}
    assert batch_log.next_step() is None  # a halted stage stops everything after it
    assert batch_log.summary() == [
        {
            "batch_id": 1,
            "files": 2,
            "source_batches": [1],
            "arrived_at": datetime(2024, 7, 1, 8, 0, 4, tzinfo=UTC),
            "stage": "done",
            "transform": "done",
            "migrate": "halted",
            "stage_at": NOW,  # when each stage was marked done (the batch-log page's latency columns)
            "transform_at": NOW,
            "migrate_at": None,
        },
        {
            "batch_id": 2,
            "files": 1,
            "source_batches": [2],
            "arrived_at": datetime(2024, 7, 1, 8, 0, 8, tzinfo=UTC),
            "stage": "pending",
            "transform": "pending",
            "migrate": "pending",
            "stage_at": None,
            "transform_at": None,
            "migrate_at": None,
        },
    ]

    # A later event for the same (batch, stage) wins: the halted migration is resumed and done.
    assert batch_log.mark(1, "migrate", "done", now=datetime(2024, 7, 1, 9, 5, 0, tzinfo=UTC)) is True
    assert batch_log.next_step() == (2, "stage")
    for stage in ("stage", "transform", "migrate"):
        batch_log.mark(2, stage, "done", now=NOW)

    assert batch_log.pending() == []
    assert batch_log.next_step() is None


# -- the collector -----------------------------------------------------------------------------------------


def test_collect_registers_new_files_once_in_arrival_order(batch_log, landing):
    deliver(landing, "a.txt", b"newer a\n", datetime(2024, 7, 1, 8, 0, 30, tzinfo=UTC))
    deliver(landing, "b.txt", b"older b\n", datetime(2024, 7, 1, 8, 0, 10, tzinfo=UTC))
    # Same modification time: the name breaks the tie (y is written first, x still comes first).
    deliver(landing, "y.txt", b"tie y\n", datetime(2024, 7, 1, 8, 0, 20, tzinfo=UTC))
    deliver(landing, "x.txt", b"tie x\n", datetime(2024, 7, 1, 8, 0, 20, tzinfo=UTC))
    deliver(landing, "Batch2/Trade.txt", b"trade 2\n", datetime(2024, 7, 1, 8, 0, 40, tzinfo=UTC))
    deliver(landing, "Trade_batch3_0001.txt", b"trade 3\n", datetime(2024, 7, 1, 8, 0, 50, tzinfo=UTC))
    for hidden in (".x", "_x", "x.tmp", "x.part", "x.txt~", ".partial/z.txt", "_incoming/z.txt"):
        deliver(landing, hidden, b"not yet\n", datetime(2024, 7, 1, 8, 0, 0, tzinfo=UTC))
    expected_files = [
        LandedFile(
            "b.txt",
            8,
            "01566ca76758a310a18db695e8e85cc8ac5e1a19dff21ce4b65da01715b6b1ad",
            datetime(2024, 7, 1, 8, 0, 10, tzinfo=UTC),
            1,
        ),
        LandedFile(
            "x.txt",
            6,
            "ba685330809c0fb9dd7215403fa9875ac59016a13a3b71ba33d01b177680f885",
            datetime(2024, 7, 1, 8, 0, 20, tzinfo=UTC),
            1,
        ),
        LandedFile(
            "y.txt",
            6,
            "1ac35b2c477ce9920aee89291d5b58b4f0a6071fb91cf13fa21873f17a539803",
            datetime(2024, 7, 1, 8, 0, 20, tzinfo=UTC),
            1,
        ),
        LandedFile(
            "a.txt",
            8,
            "bffb5398023871e6cb571480226d3d6a9d040a2f2c5b98b25dd7c97a7f426e6a",
            datetime(2024, 7, 1, 8, 0, 30, tzinfo=UTC),
            1,
        ),
        LandedFile(
            "Batch2/Trade.txt",
            8,
            "95375284e346c6bd84e30087d4bcc73653f95d89d60e5775dba2ee849b7eedde",
            datetime(2024, 7, 1, 8, 0, 40, tzinfo=UTC),
            2,
        ),
        LandedFile(
            "Trade_batch3_0001.txt",
            8,
            "89155b39a2a4e3ee850f318edc783705248baa6b29fd813c1ffa386200080593",
            datetime(2024, 7, 1, 8, 0, 50, tzinfo=UTC),
            3,
        ),
    ]

    first = collect(batch_log, landing, now=NOW)

    # one micro-batch per TPC-DI batch, oldest first; unmarked files belong to the batch open when they arrived
    assert first == CollectResult(batch_id=3, files=expected_files, changed=[], batch_ids=[1, 2, 3])
    assert batch_log.files(1) == [batch_file(1, seq, f) for seq, f in enumerate(expected_files[:4], start=1)]
    assert [(f.file_seq, f.file) for f in batch_log.files(1)] == [
        (1, "b.txt"),
        (2, "x.txt"),
        (3, "y.txt"),
        (4, "a.txt"),
    ]
    assert batch_log.files(2) == [batch_file(2, 1, expected_files[4])]
    assert batch_log.files(3) == [batch_file(3, 1, expected_files[5])]

    again = collect(batch_log, landing, now=NOW)

    assert again == CollectResult(batch_id=None, files=[], changed=[])
    assert batch_log.last_batch_id() == 3

    deliver(landing, "late.txt", b"late\n", datetime(2024, 7, 1, 8, 1, 0, tzinfo=UTC))
    late = collect(batch_log, landing, now=NOW)

    late_file = LandedFile(
        "late.txt",
        5,
        "f152945b358aa26a9e72e25381deff94e254c547089bd690dccd218e9414d148",
        datetime(2024, 7, 1, 8, 1, 0, tzinfo=UTC),
        3,  # unmarked: TPC-DI batch 3 was the open one when it arrived
    )
    assert late == CollectResult(batch_id=4, files=[late_file], changed=[], batch_ids=[4])
    assert batch_log.files(4) == [batch_file(4, 1, late_file)]
    assert len(batch_log.registered_files()) == 7


def test_collect_reports_a_changed_file_and_does_not_register_it_again(batch_log, landing):
    deliver(landing, "a.txt", b"newer a\n", datetime(2024, 7, 1, 8, 0, 30, tzinfo=UTC))
    assert collect(batch_log, landing, now=NOW).batch_id == 1

    deliver(landing, "a.txt", b"changed a\n", datetime(2024, 7, 1, 8, 5, 0, tzinfo=UTC))
    result = collect(batch_log, landing, now=NOW)

    assert result == CollectResult(batch_id=None, files=[], changed=["a.txt"])
    assert batch_log.last_batch_id() == 1
    assert batch_log.files(1) == [
        BatchFile(
            1,
            1,
            "a.txt",
            8,
            "bffb5398023871e6cb571480226d3d6a9d040a2f2c5b98b25dd7c97a7f426e6a",
            datetime(2024, 7, 1, 8, 0, 30, tzinfo=UTC),
            1,
        )
    ]


def test_collect_on_a_missing_landing_directory_raises(batch_log, tmp_path):
    with pytest.raises(FileNotFoundError, match="landing directory"):
        collect(batch_log, tmp_path / "nowhere", now=NOW)
    assert batch_log.last_batch_id() == 0


# -- concurrent collectors ---------------------------------------------------------------------------------


def child_collect(root: str, landing: str, ready: str, go: str) -> None:
    """Entry point of a collector subprocess: wait for the start signal, collect once, print the result."""
    batch_log = BatchLog(Lake(Path(root)))
    Path(ready).touch()
    deadline = time.monotonic() + 60
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no start signal")
        time.sleep(0.005)
    result = collect(batch_log, Path(landing), now=NOW)
    print(json.dumps({"batch_id": result.batch_id, "files": [f.file for f in result.files]}))


# The child leaves as `streamdi.run.cli.main` does (flush, then `os._exit`): delta-rs and Arrow's threads can abort
# a finished process during interpreter shutdown ("terminate called without an active exception", exit -6).
COLLECT_IN_CHILD = (
    f"import os, sys; sys.path[:0] = [{str(HERE)!r}, {str(HERE.parent)!r}]; "
    "import test_batchlog as t; t.child_collect(*sys.argv[1:]); sys.stdout.flush(); os._exit(0)"
)


def test_two_collectors_at_the_same_time_register_each_file_exactly_once(tmp_path, landing):
    root = tmp_path / "lake"
    BatchLog(Lake(root))  # the platform tables exist before the race, as after `streamdi init`
    names = [f"Batch1/File{i}.txt" for i in range(6)]
    for i, name in enumerate(names):
        deliver(landing, name, f"file {i}\n".encode(), datetime(2024, 7, 1, 8, 0, i, tzinfo=UTC))
    env = {k: v for k, v in os.environ.items() if k != "STREAMDI_FAULT_AT"}
    go = tmp_path / "go"
    children = []
    for n in range(2):
        ready = tmp_path / f"ready{n}"
        args = [str(root), str(landing), str(ready), str(go)]
        children.append(
            (
                ready,
                subprocess.Popen(
                    [sys.executable, "-c", COLLECT_IN_CHILD, *args],
                    cwd=REPO,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        )
    deadline = time.monotonic() + 120
    while not all(ready.exists() for ready, _ in children):
        assert time.monotonic() < deadline, "collector subprocesses did not start"
        assert all(proc.poll() is None for _, proc in children), [proc.communicate() for _, proc in children]
        time.sleep(0.01)
    go.touch()
    outputs = [proc.communicate(timeout=120) for _, proc in children]

    assert [proc.returncode for _, proc in children] == [0, 0], [err for _, err in outputs]
    results = sorted((json.loads(out) for out, _ in outputs), key=lambda r: r["batch_id"] or 0)
    # Whoever takes the collector lock first registers everything; the other finds nothing new.
    assert results == [{"batch_id": None, "files": []}, {"batch_id": 1, "files": names}]
    batch_log = BatchLog(Lake(root))
    assert batch_log.batch_ids() == [1]
    assert [(f.file_seq, f.file) for f in batch_log.files(1)] == list(enumerate(names, start=1))


def test_done_details_give_each_batch_the_detail_of_its_stage(batch_log):
    batch_log.register([landed("Batch1/Date.txt", second=3)], now=NOW)
    batch_log.register([landed("Batch2/Trade.txt", second=8, source_batch=2)], now=NOW)
    batch_log.mark(1, "stage", "done", now=NOW, detail={"read": 3})
    batch_log.mark(1, "transform", "done", now=NOW, detail={"seconds": {"T0": 0.5, "T3": 2.25}})
    batch_log.mark(2, "stage", "done", now=NOW)
    assert batch_log.done_details("transform") == {1: {"seconds": {"T0": 0.5, "T3": 2.25}}}
    assert batch_log.done_details("stage") == {1: {"read": 3}, 2: {}}
    assert batch_log.done_details("migrate") == {}


def test_marks_of_an_earlier_batch_are_recorded_after_a_later_batch(batch_log):
    batch_log.register([landed("a.txt")], now=NOW)
    batch_log.register([landed("b.txt")], now=NOW)
    assert batch_log.mark(2, "stage", "done", now=NOW) is True
    assert batch_log.mark(1, "stage", "done", now=NOW) is True
    assert batch_log.is_done(1, "stage") and batch_log.is_done(2, "stage")


# -- halted, resumed and skipped batches (data-quality policies and operator actions) ---------------------------

LATER = datetime(2024, 7, 1, 10, 0, 0, tzinfo=UTC)


def three_batches(batch_log: BatchLog) -> None:
    for n in (1, 2, 3):
        batch_log.register([landed(f"b{n}.txt", second=n)], now=NOW)


def test_a_halted_stage_blocks_itself_and_every_later_step_until_resumed(batch_log):
    three_batches(batch_log)
    batch_log.mark(1, "stage", "done", now=NOW)
    batch_log.mark(1, "transform", "done", now=NOW)
    batch_log.mark(1, "migrate", "done", now=NOW)
    batch_log.mark(2, "stage", "done", now=NOW)

    assert batch_log.halt(2, "transform", "expect_column_values_to_be_between failed on dimtrade", now=NOW) is True

    assert batch_log.pending() == []  # not batch 2's migrate, not batch 3
    assert batch_log.halted() == [Halt(2, "transform", "expect_column_values_to_be_between failed on dimtrade", NOW)]
    assert not batch_log.was_resumed(2, "transform")
    # a retried halt (e.g. after a crash right after it) records nothing new
    assert batch_log.halt(2, "transform", "expect_column_values_to_be_between failed on dimtrade", now=NOW) is False

    assert batch_log.resume(2, now=LATER, note="bad prices confirmed by the broker") == "transform"

    assert batch_log.halted() == []
    assert batch_log.was_resumed(2, "transform")
    assert batch_log.pending() == [(2, "transform"), (2, "migrate"), (3, "stage"), (3, "transform"), (3, "migrate")]
    # halted again after the resume: a new halt is recorded, and a second resume is possible
    assert batch_log.halt(2, "transform", "another failure", now=datetime(2024, 7, 1, 11, tzinfo=UTC)) is True
    assert [h.reason for h in batch_log.halted()] == ["another failure"]
    assert batch_log.resume(2, now=datetime(2024, 7, 1, 12, tzinfo=UTC)) == "transform"
    assert batch_log.pending()[0] == (2, "transform")


def test_a_clock_stepped_back_cannot_reorder_halted_and_resumed(batch_log, tmp_path):
    """Each event carries the wall clock of its process. The clock steps back between the events (NTP, another
    machine): the state still follows what happened, for the batch log and for the migrator's reading of it."""
    from streamdi.migrator import _read_batch_log

    three_batches(batch_log)
    batch_log.mark(1, "stage", "done", now=NOW)
    hour = [datetime(2024, 7, 1, h, tzinfo=UTC) for h in range(24)]
    batch_log.halt(1, "transform", "first failure", now=hour[12])
    assert batch_log.resume(1, now=hour[11]) == "transform"  # one hour "before" the halt
    assert batch_log.halted() == [] and batch_log.states()[(1, "transform")] == "resumed"
    assert batch_log.pending()[0] == (1, "transform")
    batch_log.halt(1, "transform", "second failure", now=hour[10])
    assert batch_log.halted() == [Halt(1, "transform", "second failure", hour[10])]
    assert batch_log.pending() == []
    batch_log.resume(1, now=hour[9])
    assert batch_log.halted() == []
    batch_log.mark(1, "transform", "done", now=hour[8])
    assert batch_log.states()[(1, "transform")] == "done"
    assert batch_log.pending()[0] == (1, "migrate")
    assert _read_batch_log(batch_log.lake).transformed == {1: hour[8]}


def test_resuming_a_batch_that_is_not_halted_is_refused(batch_log):
    three_batches(batch_log)
    with pytest.raises(BatchLogError, match="micro-batch 1 is not halted"):
        batch_log.resume(1, now=NOW)


def test_skipping_drops_the_rest_of_a_batch_and_lets_later_batches_run(batch_log):
    three_batches(batch_log)
    batch_log.halt(1, "stage", "unknown status codes", now=NOW)
    [halt] = batch_log.halted()
    assert [command for command, _ in halt.commands()] == [
        "streamdi batch resume 1",
        "streamdi batch skip 1 --reason TEXT",
    ]

    with pytest.raises(BatchLogError, match="needs a reason"):
        batch_log.skip(1, "  ", now=LATER)
    assert batch_log.skip(1, "file resent as batch 3", now=LATER) == ["stage", "transform", "migrate"]

    assert batch_log.halted() == []
    assert batch_log.skipped_batches() == frozenset({1})
    later = [(b, stage) for b in (2, 3) for stage in ("stage", "transform", "migrate")]
    assert batch_log.pending() == later
    assert batch_log.summary()[0] | {"arrived_at": None} == {
        "batch_id": 1,
        "files": 1,
        "source_batches": [1],
        "arrived_at": None,
        "stage": "skipped",
        "transform": "skipped",
        "migrate": "skipped",
        "stage_at": None,
        "transform_at": None,
        "migrate_at": None,
    }
    assert batch_log.skip(1, "again", now=LATER) == []  # already skipped: nothing new


def test_a_batch_halted_after_its_transform_committed_cannot_be_skipped_only_resumed(batch_log):
    three_batches(batch_log)
    batch_log.mark(1, "stage", "done", now=NOW)
    batch_log.halt(1, "transform", "two current versions of customer 7", now=NOW)
    with pytest.raises(BatchLogError, match="streamdi batch resume 1"):
        batch_log.skip(1, "bad customers", now=LATER)
    assert batch_log.skipped_batches() == frozenset()
    [halt] = batch_log.halted()
    assert [command for command, _ in halt.commands()] == ["streamdi batch resume 1"]  # no skip offered
    assert batch_log.resume(1, now=LATER) == "transform"


def test_a_transformed_or_unknown_batch_cannot_be_skipped(batch_log):
    three_batches(batch_log)
    for stage in ("stage", "transform"):
        batch_log.mark(1, stage, "done", now=NOW)
    with pytest.raises(BatchLogError, match="already transformed"):
        batch_log.skip(1, "too late", now=LATER)
    batch_log.mark(1, "migrate", "done", now=NOW)
    with pytest.raises(BatchLogError, match="micro-batch 1 is done"):
        batch_log.skip(1, "too late", now=LATER)
    with pytest.raises(BatchLogError, match="micro-batch 9 is not in the batch log"):
        batch_log.skip(9, "never arrived", now=LATER)
