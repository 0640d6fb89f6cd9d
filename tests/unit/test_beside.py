"""`jobs.beside.run_beside`: a step's parts beside each other in an incremental micro-batch, one after the other in
one that carries TPC-DI Batch1 or when told not to (`Settings.steps_beside`); results in the order given, failures
raised once every part has ended."""

from __future__ import annotations

import threading
import time

import pytest

from jobs.beside import run_beside
from jobs.scope import BatchScope

INCREMENTAL = BatchScope(batch_id=7, source_batches=(2,))
HISTORICAL = BatchScope(batch_id=3, source_batches=(1,))


def test_the_parts_of_an_incremental_micro_batch_run_at_the_same_time_and_keep_their_order():
    met = threading.Barrier(2, timeout=10)  # broken unless both parts wait on it at once
    threads: list[str] = []

    def part(value: str):
        def run() -> str:
            threads.append(threading.current_thread().name)
            met.wait()
            return value

        return run

    assert run_beside(INCREMENTAL, [part("first"), part("second")]) == ["first", "second"]
    assert threads.count(threading.current_thread().name) == 1
    assert any(name.startswith("step-parts") for name in threads)


@pytest.mark.parametrize(
    ("scope", "beside"),
    [(HISTORICAL, True), (BatchScope(batch_id=2, source_batches=(1, 2)), True), (INCREMENTAL, False)],
    ids=["batch1", "mixed", "incremental-not-beside"],
)
def test_the_parts_of_the_historical_load_or_not_beside_run_one_after_the_other(scope, beside):
    order: list[tuple[str, str]] = []

    def part(value: str):
        def run() -> str:
            order.append((value, threading.current_thread().name))
            return value

        return run

    assert run_beside(scope, [part("a"), part("b"), part("c")], beside=beside) == ["a", "b", "c"]
    me = threading.current_thread().name
    assert order == [("a", me), ("b", me), ("c", me)]


def test_a_failed_part_is_raised_only_once_the_other_parts_have_ended():
    ended: list[str] = []

    def slow() -> str:
        time.sleep(0.3)
        ended.append("slow")
        return "slow"

    def failing() -> str:
        raise ValueError("the first part failed")

    with pytest.raises(ValueError, match="the first part failed"):
        run_beside(INCREMENTAL, [failing, slow])
    assert ended == ["slow"]

    def failing_beside() -> str:
        raise KeyError("a part beside failed")

    with pytest.raises(KeyError, match="a part beside failed"):
        run_beside(INCREMENTAL, [slow, failing_beside])
    assert ended == ["slow", "slow"]
