"""The stream service's pure parts: the trigger, round cuts, the listing of waiting files, latency percentiles and
rows/s."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from streamdi.batchlog import percentile
from streamdi.collector import Listing
from streamdi.parts import parts_of
from streamdi.run.stream_cuts import Manifests, Round, Trigger, held_parts, next_round, waiting_files
from streamdi.run.stream_status import rows_per_second, summary


def test_trigger_fires_after_the_interval_or_at_the_size():
    trigger = Trigger(interval=0.5, max_bytes=1000)
    assert not trigger.fires(waited=0.49, waiting_bytes=999)
    assert trigger.fires(waited=0.5, waiting_bytes=0)
    assert trigger.fires(waited=0.0, waiting_bytes=1000)
    assert not Trigger(interval=0.5).fires(waited=0.1, waiting_bytes=10**9)  # no size trigger by default
    assert Trigger(interval=0).fires(waited=0.0, waiting_bytes=0)


@pytest.mark.parametrize("bad", [dict(interval=-1), dict(max_bytes=-1), dict(poll=0)])
def test_a_trigger_refuses_negative_settings(bad):
    with pytest.raises(ValueError, match="trigger needs"):
        Trigger(**bad)


def test_a_trigger_refuses_an_unknown_cut():
    with pytest.raises(ValueError, match="unknown cut 'size': one of time, round"):
        Trigger(cut="size")


# Two TPC-DI batches of three sources in two channels, each source cut in three parts; Batch3's BatchDate in one.
FEED = {
    (2, 0): {"Trade_batch2_0000.txt", "crm/Customer_batch2_0000.txt", "crm/Account_batch2_0000.txt"},
    (2, 1): {"Trade_batch2_0001.txt", "crm/Customer_batch2_0001.txt", "crm/Account_batch2_0001.txt"},
    (2, 2): {"Trade_batch2_0002.txt", "crm/Customer_batch2_0002.txt", "crm/Account_batch2_0002.txt"},
    (3, 0): {"BatchDate_batch3_0000.txt", "Trade_batch3_0000.txt"},
    (3, 1): {"Trade_batch3_0001.txt"},
}


DECLARED = {b: {n: frozenset(fs) for (b2, n), fs in FEED.items() if b2 == b} for b in (2, 3)}


def test_the_next_round_is_the_lowest_batch_and_part_number_complete_when_all_declared_files_are_in():
    waiting = ["Trade_batch2_0001.txt", "crm/Account_batch2_0000.txt", "Trade_batch3_0000.txt"]
    registered = {"Trade_batch2_0000.txt"}
    assert next_round(waiting, registered, set(), DECLARED) == Round(
        (2, 0),
        frozenset({"crm/Account_batch2_0000.txt"}),
        False,  # crm/Customer_batch2_0000.txt is still missing
    )
    assert next_round([*waiting, "crm/Customer_batch2_0000.txt"], registered, set(), DECLARED) == Round(
        (2, 0), frozenset({"crm/Account_batch2_0000.txt", "crm/Customer_batch2_0000.txt"}), True
    )
    # a duplicate carries its original's number: it joins that round (here one already cut, so it is complete)
    dup = ["Trade_batch2_0000_dup.txt", "Trade_batch2_0001.txt"]
    assert next_round(dup, registered | FEED[2, 0], set(), DECLARED) == Round(
        (2, 0), frozenset({"Trade_batch2_0000_dup.txt"}), True
    )
    # a round never overtakes an earlier one that has not arrived: Batch3's part 1 waits for the rest of Batch3 and
    # for Batch2 (here, the whole of it)
    assert next_round(["Trade_batch3_0001.txt"], set(), set(), DECLARED).complete is False
    assert next_round(
        ["Trade_batch3_0001.txt"], set(FEED[2, 0]) | FEED[2, 1] | FEED[2, 2] | FEED[3, 0], set(), DECLARED
    ).complete
    # held parts wait; nothing left: no round
    assert next_round(["Trade_batch2_0001.txt"], set(), {"Trade_batch2_0001.txt"}, DECLARED) is None


def test_whole_files_are_a_round_of_their_own_and_an_undeclared_round_says_so():
    waiting = ["Batch2/Trade.txt", "Trade_batch2_0000.txt", "Batch2/Trade_audit.csv"]
    assert next_round(waiting, set(), set(), DECLARED) == Round(
        None, frozenset({"Batch2/Trade.txt", "Batch2/Trade_audit.csv"}), None
    )
    assert next_round(["Trade_batch9_0004.txt"], set(), set(), DECLARED) == Round(
        (9, 4), frozenset({"Trade_batch9_0004.txt"}), None
    )


def _write_manifests(landing: Path, feed: dict[tuple[int, int], set[str]], extra: dict | None = None) -> None:
    """The drip's manifests of `feed` (`streamdi.generator.drip`'s format), a duplicate delivery in each."""
    for batch in sorted({b for b, _ in feed}):
        deliveries = [
            {"file": f, "part": n, "kind": "original"} for (b, n), fs in feed.items() if b == batch for f in fs
        ]
        deliveries.append({"file": f"Trade_batch{batch}_0000_dup.txt", "part": 0, "kind": "duplicate"})
        path = landing / "_drip" / f"batch{batch}_manifest.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"source_batch": batch, "deliveries": deliveries, **(extra or {})}))


def test_round_cuts_are_the_same_whatever_the_arrival_order_and_the_moments_of_the_cuts(tmp_path: Path):
    """The service cuts a round once it is complete; the files arrive in 200 random orders and the service looks
    at random moments (after 1..6 arrivals, as its speed would have it): always the same micro-batches, whether the
    manifests are given whole or read by `Manifests`, which retires a batch once all of its files are registered."""
    files = sorted(f for round_ in FEED.values() for f in round_)
    expected = [frozenset(FEED[key]) for key in sorted(FEED)]
    _write_manifests(tmp_path, FEED)
    rng = random.Random(5)
    for trial in range(200):
        manifests = Manifests(tmp_path) if trial % 2 else None
        arrivals = rng.sample(files, len(files))
        registered: set[str] = set()
        cuts = []
        arrived = 0
        while len(registered) < len(files):
            arrived = min(len(files), arrived + rng.randint(1, 6))
            while True:  # every complete round is cut at this look, one micro-batch each
                waiting = [f for f in arrivals[:arrived] if f not in registered]
                declared, retired = manifests.declared(registered) if manifests else (DECLARED, frozenset())
                chosen = next_round(waiting, registered, set(), declared, retired)
                if chosen is None or not chosen.complete:
                    break
                cuts.append(chosen.files)
                registered |= chosen.files
        assert cuts == expected


def test_manifests_are_read_once_and_retired_once_every_file_they_declare_is_registered(tmp_path: Path):
    manifests = Manifests(tmp_path, full_every=3600)
    assert manifests.declared(set()) == ({}, frozenset())  # no manifest folder yet
    _write_manifests(tmp_path, FEED)
    declared, retired = manifests.declared(set())
    assert declared == DECLARED and not retired  # the duplicate delivery is left out
    batch2 = set().union(*(fs for (b, _), fs in FEED.items() if b == 2))
    declared, retired = manifests.declared(batch2)
    assert declared == {3: DECLARED[3]} and set(retired) == {2}
    # a retired batch's round is still a declared one, and complete: its files are all in
    assert next_round(["Trade_batch2_0000_dup.txt"], batch2, set(), declared, retired) == Round(
        (2, 0), frozenset({"Trade_batch2_0000_dup.txt"}), True
    )
    assert next_round(["Trade_batch9_0000.txt"], batch2, set(), declared, retired).complete is None
    # a manifest being written is left out until it can be read; a new one is found (its folder changed)
    broken = tmp_path / "_drip" / "batch4_manifest.json"
    broken.write_text('{"deliveries": [')
    assert set(manifests.declared(batch2)[0]) == {3}
    broken.write_text(json.dumps({"deliveries": [{"file": "Trade_batch4_0000.txt", "part": 0}]}))
    assert manifests.declared(batch2)[0][4] == {0: frozenset({"Trade_batch4_0000.txt"})}
    # a retired manifest rewritten in place is looked at again by the next whole look
    rewritten = tmp_path / "_drip" / "batch2_manifest.json"
    rewritten.write_text(json.dumps({"deliveries": [{"file": "Trade_batch2_0009.txt", "part": 9}]}))
    os.utime(rewritten, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert 2 not in manifests.declared(batch2)[0]  # not before the whole look
    manifests.full_every = 0
    declared, retired = manifests.declared(batch2)
    assert declared[2] == {9: frozenset({"Trade_batch2_0009.txt"})} and 2 not in retired
    # a removed manifest is forgotten, retired or not
    rewritten.unlink()
    (tmp_path / "_drip" / "batch3_manifest.json").unlink()
    declared, retired = manifests.declared(batch2)
    assert set(declared) == {4} and not set(retired)


def test_waiting_files_skips_registered_files_and_deliveries_in_progress(tmp_path: Path):
    for name in (
        "Trade_batch2_0001.txt",
        "Batch2/Trade.txt",
        "Batch2/Account.txt",
        "x.tmp",
        "y.part",
        "z~",
        ".hidden",
        "_drip/manifest.json",
        "Batch2/_tmp/Trade.txt",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"12345")
    waiting = sorted((name, size) for name, size, _ in waiting_files(tmp_path, {"Batch2/Account.txt"}))
    assert waiting == [("Batch2/Trade.txt", 5), ("Trade_batch2_0001.txt", 5)]
    assert list(waiting_files(tmp_path / "missing", set())) == []


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None


def test_rows_per_second_is_over_the_stages_run_time():
    recent = [
        {"rows": 100, "seconds": {"stage": 0.5, "transform": 1.0, "migrate": 0.5}},
        {"rows": 300, "seconds": {"stage": 0.5, "transform": 1.5}},
    ]
    assert rows_per_second(recent) == 100.0
    assert rows_per_second([]) is None


def test_the_summary_leaves_the_cold_first_micro_batch_out_of_the_percentiles():
    status = {
        "state": "idle",
        "pid": 7,
        "updated_at": "t",
        "waiting_files": 0,
        "lag_seconds": 0.0,
        "batches_done": 4,
        "recent": [
            {"batch_id": 2, "rows": 50, "visible": 12.0, "seconds": {"transform": 10.0}, "cold": True},
            {"batch_id": 3, "rows": 100, "visible": 2.0, "seconds": {"transform": 1.0}, "cold": False},
            {"batch_id": 4, "rows": 100, "visible": 4.0, "seconds": {"transform": 1.0}, "cold": False},
            {"batch_id": 5, "rows": 100, "visible": 3.0, "seconds": {"transform": 1.0}, "cold": False},
        ],
    }
    brief = summary(status, running=True)
    assert (brief["warm_batches"], brief["visible_p50_seconds"], brief["visible_p99_seconds"]) == (3, 3.0, 4.0)
    assert brief["cold_visible_seconds"] == 12.0 and brief["rows_per_second"] == 100.0
    assert summary(status, running=False)["state"] == "not running (last state: idle)"
    assert summary(None, running=False) == {"running": False, "state": "never started"}


def test_a_part_is_held_until_its_predecessor_arrives_or_its_grace_is_over():
    registered = parts_of({"Trade_batch2_0000.txt", "Batch2/Account.txt"})
    new = [
        "Trade_batch2_0002.txt",  # 0001 missing: held
        "Trade_batch2_0003.txt",  # after a held part: held
        "Trade_batch2_0003_dup.txt",  # the same part delivered twice: held with it
        "Customer_batch2_0001.txt",  # its 0000 arrives in the same pass: ready
        "Customer_batch2_0000.txt",
        "Batch2/Trade.txt",  # a whole file is never held
    ]
    seen = dict.fromkeys(new, 100.0)
    assert held_parts(new, registered, seen, now=101.0, grace=30.0) == {
        "Trade_batch2_0002.txt",
        "Trade_batch2_0003.txt",
        "Trade_batch2_0003_dup.txt",
    }
    # the missing part arrives: everything is ready
    assert held_parts([*new, "Trade_batch2_0001.txt"], registered, seen, now=101.0, grace=30.0) == set()
    # the grace is over: the part is cut without its predecessor, and its successors with it
    assert held_parts(new, registered, seen, now=130.0, grace=30.0) == set()
    # a part first listed now has just arrived
    assert held_parts(["Trade_batch2_0005.txt"], registered, {}, now=500.0, grace=1.0) == {"Trade_batch2_0005.txt"}
    assert held_parts(["Trade_batch2_0005.txt"], registered, {}, now=500.0, grace=0.0) == set()


def test_a_failure_that_lost_a_connection_is_told_from_others_through_its_causes():
    from py4j.protocol import Py4JNetworkError

    from streamdi.run.stream import _connection_lost

    def chained(outer: Exception, inner: Exception) -> Exception:
        try:
            try:
                raise inner
            except Exception as exc:
                raise outer from exc
        except Exception as exc:
            return exc

    assert _connection_lost(ConnectionRefusedError(111, "Connection refused"))
    assert _connection_lost(Py4JNetworkError("Answer from Java side is empty"))
    assert _connection_lost(chained(RuntimeError("stage failed"), EOFError()))
    assert not _connection_lost(chained(RuntimeError("stage failed"), ValueError("bad row")))
    assert not _connection_lost(OSError(28, "No space left on device"))


def test_waiting_files_leaves_a_directory_nothing_waits_in_unlisted_until_a_name_changes(tmp_path):
    """The service's look (`waiting_files` with a `Listing`): a directory whose files are all registered is not listed
    again while its modification time stays; a name added to it changes that time and is seen at once."""
    for name in ("crm/Customer_batch2_0000.txt", "Trade_batch2_0000.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    old = 1_700_000_000
    for directory in (tmp_path, tmp_path / "crm"):
        os.utime(directory, (old, old))
    registered = {"crm/Customer_batch2_0000.txt", "Trade_batch2_0000.txt"}
    quiet = Listing()
    assert list(waiting_files(tmp_path, registered, quiet)) == []
    assert set(quiet.quiet) == {str(tmp_path), str(tmp_path / "crm")}
    # a name that appeared without a change of the time (only a test can do that) is not looked for
    (tmp_path / "crm" / "Customer_batch2_0001.txt").write_text("y")
    os.utime(tmp_path / "crm", (old, old))
    assert list(waiting_files(tmp_path, registered, quiet)) == []
    assert [name for name, _, _ in waiting_files(tmp_path, registered)] == ["crm/Customer_batch2_0001.txt"]
    # a real arrival changes the directory's time
    (tmp_path / "crm" / "Customer_batch2_0002.txt").write_text("z")
    assert sorted(name for name, _, _ in waiting_files(tmp_path, registered, quiet)) == [
        "crm/Customer_batch2_0001.txt",
        "crm/Customer_batch2_0002.txt",
    ]
