"""The stream service's pure parts: the trigger, the listing of waiting files, latency percentiles and rows/s."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamdi.stream import Trigger, held_parts, percentile, rows_per_second, waiting_files


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


def test_a_part_is_held_until_its_predecessor_arrives_or_its_grace_is_over():
    registered = {"Trade_batch2_0000.txt", "Batch2/Account.txt"}
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
