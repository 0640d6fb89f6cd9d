"""The independent parts of one transform step, run at the same time in an incremental micro-batch.

Some steps are made of parts that read and commit different tables: T3's DimTrade then FactHoldings, and its
FactCashBalances (which reads only CashTransaction and DimAccount); T4's FactWatches and FactMarketHistory; AG's
trade windows and market windows. During a small micro-batch the process keeps only about 1.2 of this machine's 2
cores busy (its threads wait on delta-rs commits, Parquet reads and the checks' server), so such parts finish sooner
beside each other than one after the other. The step's result is the same either way: each part commits its own
tables under its own app transactions (DImessages: each part upserts only its own alerts, under the table's commit
lock), and the parts' results come back in the order given.

A micro-batch that carries the historical load (TPC-DI Batch1) runs the parts one after the other: each of them then
holds whole tables (`jobs.pieces`), and their memory peaks must not add up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import wait
from typing import TypeVar

from jobs.scope import BatchScope
from streamdi.pools import kept_pool

T = TypeVar("T")

HISTORICAL_BATCH = 1  # the TPC-DI batch of the historical load
# threads for the parts beside a step's own: T3 and T4 run at the same time and each hands one part over
THREADS = 2


def run_beside(scope: BatchScope, parts: Sequence[Callable[[], T]], *, beside: bool = True) -> list[T]:
    """Each part's result, in the order of `parts`: the first runs in the calling thread while the others run in
    the pool, in an incremental micro-batch; one after the other in one carrying TPC-DI Batch1, or without `beside`
    (`Settings.steps_beside` off: a load under a memory cap, where two MERGEs into large tables at once, SF 100's
    market slices and FactWatches, took 4.6 GiB). When a part fails, the others are waited for (none still commits
    once the step has failed) and the first failure is raised."""
    if len(parts) < 2 or not beside or HISTORICAL_BATCH in scope.source_batches:
        return [part() for part in parts]
    pool = kept_pool("step-parts", THREADS)
    others = [pool.submit(part) for part in parts[1:]]
    try:
        first = parts[0]()
    finally:
        wait(others)
    return [first, *(other.result() for other in others)]
