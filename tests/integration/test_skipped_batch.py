"""A micro-batch an operator skips after staging never reaches the warehouse: the transform steps of later
micro-batches read staging through `BatchScope.staged`, which leaves the skipped batch's rows (and its
BatchDate) out."""

from __future__ import annotations

import datetime as dt

import pyarrow.compute as pc
import pytest
from builders import source_line, write_landing_file

from jobs.scope import load_scope
from schemas import sources as src
from streamdi.batchlog import BatchLog
from streamdi.collector import collect
from streamdi.context import JobContext
from streamdi.lake import Lake
from streamdi.run.pipeline import stage_job
from streamdi.settings import Settings

pytestmark = pytest.mark.integration

NOW = dt.datetime(2024, 7, 1, 9, 0, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def ctx(spark, tmp_path_factory) -> JobContext:
    home = tmp_path_factory.mktemp("skip-home")
    settings = Settings(home=home, spark_master="local[2]")
    return JobContext(settings=settings, spark=spark, lake=Lake(settings.lake_root, spark))


def test_staged_rows_and_dates_of_a_skipped_batch_are_left_out_of_later_batches(ctx):
    landing = ctx.settings.landing_dir
    batch_log = BatchLog(ctx.lake)
    deliveries = {
        1: {"Batch1/TaxRate_1.txt": ["US1"]},
        2: {"Batch1/TaxRate_2.txt": ["US2", "US3"], "Batch1/BatchDate.txt": None},
        3: {"Batch1/TaxRate_3.txt": ["US4"]},
    }
    for batch_id, files in deliveries.items():
        for name, tax_ids in files.items():
            if tax_ids is None:
                lines = [source_line(src.BATCH_DATE, batchdate="2017-07-08")]
            else:
                lines = [source_line(src.TAX_RATE, tx_id=t) for t in tax_ids]
            write_landing_file(landing / name, lines)
        assert collect(batch_log, landing, now=NOW).batch_id == batch_id
        stage_job(ctx, batch_id)

    before = load_scope(ctx, 3)
    assert before.batch_dates == {1: dt.date(2017, 7, 8)}
    assert before.skipped == frozenset()

    assert batch_log.skip(2, "sent twice by mistake", now=NOW) == ["transform", "migrate"]

    scope = load_scope(ctx, 3)
    assert scope.skipped == frozenset({2})
    assert scope.batch_dates == {}
    staged = scope.staged_where(ctx, src.TAX_RATE.staging, pc.scalar(True), ["batch_id", "tx_id"])
    assert sorted((r["batch_id"], r["tx_id"]) for r in staged.to_pylist()) == [
        (1, "US1"),
        (3, "US4"),
    ]
    # the skipped batch's own rows stay in staging (nothing is deleted), for inspection
    assert sorted(ctx.lake.read_arrow(src.TAX_RATE.staging)["tx_id"].to_pylist()) == ["US1", "US2", "US3", "US4"]
