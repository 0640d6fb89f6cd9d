"""Micro-batch equivalence: however a batch is cut into micro-batches, and whatever Spark's partition count,
the Delta warehouse ends identical row for row (surrogate keys included).

Generated data (the generator is deterministic): Batch1 is loaded once; Batch2 is then loaded on copies of
that state whole, and dripped as 7 and as 12 micro-batches (50 with `STREAMDI_TEST_SCALE=full`: each
micro-batch costs seconds of fixed Spark work, and the suite must fit CI's budget); the dripped loads compact
their tables after every third file, so the comparison also covers compaction. Separately, Batch1 +
Batch2 of a smaller data set load with 1 and 8 shuffle partitions. Each variant runs collect -> stage ->
transform in this process (PostgreSQL is not involved: migration has its own tests) and every warehouse table
is compared (the live windows also against a from-scratch computation, tests/windows_oracle.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from builders import at_scale, trim_calendar
from windows_oracle import expected_windows, stored_windows

from jobs import cash_balances, holdings, market_history, trade_candidates, watches, windows
from schemas import sources as src
from schemas.model import Table
from schemas.warehouse import (
    DIM_TRADE,
    FACT_CASH_BALANCES,
    FACT_HOLDINGS,
    FACT_MARKET_HISTORY,
    FACT_WATCHES,
    WAREHOUSE_TABLES,
)
from streamdi.context import JobContext
from streamdi.delivery import deliver_batch, drip_batch
from streamdi.generator import Params, generate
from streamdi.lake import Lake
from streamdi.run.pipeline import run_pending
from streamdi.settings import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def make_context(home: Path, spark, **settings_overrides) -> JobContext:
    settings = Settings(home=home, spark_master="local[2]", spark_shuffle_partitions=2, **settings_overrides)
    return JobContext(settings, spark=spark, lake=Lake(settings.lake_root, spark))


def transform_pending(ctx: JobContext) -> None:
    run_pending(ctx, upto="transform")


def warehouse_rows(ctx: JobContext) -> dict[str, list[dict]]:
    return {t.name: ctx.lake.read_arrow(t).to_pylist() for t in WAREHOUSE_TABLES if ctx.lake.exists(t)}


def load_dripped(ctx: JobContext, data: Path, batch: int, parts: int) -> int:
    return drip_batch(data, batch, ctx.settings.landing_dir, parts, lambda _g, _n: transform_pending(ctx))


@pytest.fixture(scope="module")
def data_sf01(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sf01")
    generate(Params(scale_factor=0.1, batches=2), out)
    trim_calendar(out)
    return out


@pytest.fixture(scope="module")
def after_batch1(data_sf01, tmp_path_factory, spark) -> Path:
    home = tmp_path_factory.mktemp("after-batch1")
    ctx = make_context(home, spark)
    deliver_batch(data_sf01, 1, ctx.settings.landing_dir)
    transform_pending(ctx)
    return home


def copy_of(home: Path, tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(home, target)
    return target


DRIP_PARTS = (7, at_scale(12, 50))


def test_batch2_dripped_in_micro_batches_equals_batch2_loaded_whole(data_sf01, after_batch1, tmp_path, spark):
    whole = make_context(copy_of(after_batch1, tmp_path, "whole"), spark)
    deliver_batch(data_sf01, 2, whole.settings.landing_dir)
    transform_pending(whole)
    expected = warehouse_rows(whole)
    assert expected["dimtrade"] and expected["dimcustomer"] and expected["dimaccount"]
    assert any(r["batchid"] == 2 for r in expected["dimtrade"])  # Batch2 did change trades
    # the live windows equal a from-scratch computation over the same records
    lake = whole.settings.lake_root
    assert stored_windows(lake) == expected_windows(lake)
    assert expected["trade_windows"] and expected["market_windows"]

    for parts in DRIP_PARTS:
        # the dripped loads compact a table as soon as it has 3 small files: compaction must not change a row
        dripped = make_context(copy_of(after_batch1, tmp_path, f"drip{parts}"), spark, compact_small_files=3)
        groups = load_dripped(dripped, data_sf01, 2, parts)
        micro_batches = [b for b in dripped_batches(dripped) if b > 1]
        assert groups == parts
        assert len(micro_batches) == parts
        # a staging table and a warehouse fact get small files (appends) and are compacted; DimTrade's ordered
        # MERGEs grow its last file instead (`streamdi.delta_merge`)
        assert compactions(dripped, src.TRADE_CDC.staging) >= 1 and compactions(dripped, FACT_CASH_BALANCES) >= 1
        got = warehouse_rows(dripped)
        for table, rows in expected.items():
            assert got[table] == rows, f"{table} differs after {parts} micro-batches"


def compactions(ctx: JobContext, table: Table) -> int:
    """OPTIMIZE commits in the history of `table`."""
    return sum(1 for commit in ctx.lake.history(table) if commit.operation == "OPTIMIZE")


def dripped_batches(ctx: JobContext) -> list[int]:
    from streamdi.batchlog import BatchLog

    return BatchLog(ctx.lake).batch_ids()


# the steps that recompute a big load a piece of its keys at a time, with pieces small enough for SF 0.02's Batch1
# (~2,600 trades, ~40 customers and accounts with records, ~7,000 DailyMarket records) to come in many pieces
SMALL_PIECES = (
    (watches, "CUSTOMERS_PER_PIECE", 8),
    (holdings, "TRADES_PER_PIECE", 400),
    (cash_balances, "ACCOUNTS_PER_PIECE", 9),
    (trade_candidates, "TRADES_PER_PIECE", 400),
    (market_history, "RECORDS_PER_PIECE", 1500),
    (windows, "PIECE_RECORDS", 500),
)


def load_batches_1_and_2(data: Path, home: Path, spark, **settings) -> dict[str, list[dict]]:
    ctx = make_context(home, spark, **settings)
    for batch in (1, 2):
        deliver_batch(data, batch, ctx.settings.landing_dir)
        transform_pending(ctx)
    return warehouse_rows(ctx)


def test_shuffle_partitions_1_and_8_and_steps_in_pieces_give_identical_warehouses(data, tmp_path, spark, monkeypatch):
    """`data`: the shared SF 0.02 data set (tests/e2e/conftest.py). Batch1 and Batch2 with 1 and 8 shuffle
    partitions, and with every step that can recompute a piece of its keys at a time doing so in small pieces (a
    first load's pieces written as files of their own, as SF 100's are; the live windows sliced a piece of their
    records at a time), one step at a time (`STREAMDI_STEPS_BESIDE=false`, as a capped first load runs)."""
    results = {}
    try:
        for partitions in (1, 8):
            spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
            results[partitions] = load_batches_1_and_2(data, tmp_path / f"p{partitions}", spark)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")
    assert results[1]["dimtrade"]
    assert results[8].keys() == results[1].keys()
    for table, rows in results[1].items():
        assert results[8][table] == rows, f"{table} differs between 1 and 8 shuffle partitions"

    for module, name, size in SMALL_PIECES:
        monkeypatch.setattr(module, name, size)
    pieced = load_batches_1_and_2(data, tmp_path / "pieces", spark, steps_beside=False)
    lake = Lake(tmp_path / "pieces" / "lake", spark)
    for table in (FACT_WATCHES, FACT_HOLDINGS, FACT_CASH_BALANCES, DIM_TRADE, FACT_MARKET_HISTORY):
        first_load = next(c for c in lake.history(table) if c.operation != "CREATE TABLE")
        assert lake.written_in_pieces(table, first_load), f"{table.name}'s first load was not written in pieces"
    assert pieced.keys() == results[1].keys()
    for table, rows in results[1].items():
        assert pieced[table] == rows, f"{table} differs when its steps recompute in pieces"
