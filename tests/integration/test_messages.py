"""Step DM (jobs.messages.run): the validation rows and phase complete records of DImessages, on real Spark and
real Delta tables. Counts are written by hand from the rows the tests put in the warehouse."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from jobs import messages
from jobs.scope import BatchScope
from schemas import warehouse as wh
from schemas.model import Table
from streamdi.context import JobContext
from streamdi.lake import Lake

pytestmark = pytest.mark.integration

SOURCES = [
    "DimAccount",
    "DimBroker",
    "DimCompany",
    "DimCustomer",
    "DimDate",
    "DimSecurity",
    "DimTime",
    "DimTrade",
    "Financial",
    "Industry",
    "StatusType",
    "TaxRate",
    "TradeType",
]
BATCH1 = dt.date(2017, 7, 7)
BATCH2 = dt.date(2017, 7, 8)


def customer(sk: int, customerid: int, status: str, iscurrent: bool) -> dict:
    return {
        "sk_customerid": sk,
        "customerid": customerid,
        "taxid": "123-45-6789",
        "status": status,
        "lastname": "Doe",
        "firstname": "Jo",
        "dob": dt.date(1980, 1, 1),
        "addressline1": "1 Main St",
        "postalcode": "12345",
        "city": "Town",
        "stateprov": "ON",
        "iscurrent": iscurrent,
        "batchid": 1,
        "effectivedate": dt.date(2015, 1, 1) if iscurrent else dt.date(2014, 1, 1),
        "enddate": dt.date(9999, 12, 31) if iscurrent else dt.date(2015, 1, 1),
    }


def arrow(table: Table, rows: list[dict]) -> pa.Table:
    schema = table.arrow_schema()
    return pa.table({f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in schema}, schema=schema)


def test_validation_counts_count_each_table_and_the_current_inactive_customers(spark, tmp_path: Path):
    lake = Lake(tmp_path / "lake", spark)
    lake.append(
        wh.DIM_CUSTOMER,
        arrow(
            wh.DIM_CUSTOMER,
            [
                customer(1, 1, "Inactive", True),  # counts as inactive
                customer(2, 2, "Active", True),
                customer(3, 2, "Inactive", False),  # an old version: not counted
            ],
        ),
        app_id="test",
        version=1,
    )
    tables = {"DimCustomer": lake.read(wh.DIM_CUSTOMER), "DimTrade": spark.range(4)}
    got = {(r[0], r[1]): r[2] for r in messages.validation_counts(spark, tables).collect()}
    expected = {(s, "Row count"): "0" for s in SOURCES}
    expected[("DimCustomer", "Row count")] = "3"
    expected[("DimTrade", "Row count")] = "4"
    expected[("DimCustomer", "Inactive customers")] = "1"
    assert got == expected


def dimessages(ctx: JobContext) -> list[dict]:
    return ctx.lake.read_arrow(wh.DI_MESSAGES).to_pylist()


def validation(rows: list[dict], batch: int) -> dict[tuple[str, str], str]:
    return {
        (r["messagesource"], r["messagetext"]): r["messagedata"]
        for r in rows
        if r["batchid"] == batch and r["messagetype"] == "Validation"
    }


@pytest.fixture(scope="module")
def dm_ctx(spark, settings, lake_dir: Path) -> JobContext:
    ctx = JobContext(settings, spark=spark, lake=Lake(lake_dir / "lake", spark))
    ctx.lake.append(
        wh.DIM_CUSTOMER,
        arrow(wh.DIM_CUSTOMER, [customer(1, 1, "Active", True), customer(2, 2, "Inactive", True)]),
        app_id="test/customers",
        version=1,
    )
    return ctx


def test_first_micro_batch_of_batch1_writes_batch0_and_batch1(dm_ctx: JobContext):
    scope = BatchScope(batch_id=1, source_batches=(1,), batch_dates={1: BATCH1})
    written = messages.run(dm_ctx, scope)
    assert written == {"dimessages": 30}  # (13 row counts + inactive customers + PCR) x batches 0 and 1
    rows = dimessages(dm_ctx)
    assert len(rows) == 30
    zero = {(s, "Row count"): "0" for s in SOURCES} | {("DimCustomer", "Inactive customers"): "0"}
    assert validation(rows, 0) == zero
    assert validation(rows, 1) == zero | {("DimCustomer", "Row count"): "2", ("DimCustomer", "Inactive customers"): "1"}
    pcr = [r for r in rows if r["messagetype"] == "PCR"]
    assert [(r["batchid"], r["messagesource"], r["messagetext"], r["messagedata"], r["messagekey"]) for r in pcr] == [
        (0, "Phase Complete Record", "Batch Complete", None, "Batch Complete"),
        (1, "Phase Complete Record", "Batch Complete", None, "Batch Complete"),
    ]
    # the BatchDate of the message's batch, not the wall clock; batch 0 has none
    assert {r["messagedateandtime"] for r in rows if r["batchid"] == 1} == {dt.datetime(2017, 7, 7, tzinfo=dt.UTC)}
    assert {r["messagedateandtime"] for r in rows if r["batchid"] == 0} == {None}
    assert {r["messagekey"] for r in rows if r["messagetype"] == "Validation"} == {"Row count", "Inactive customers"}


def test_a_later_micro_batch_of_the_same_batch_replaces_its_rows(dm_ctx: JobContext):
    # micro-batch 2 carries more of TPC-DI batch 1: one more customer arrived
    dm_ctx.lake.append(
        wh.DIM_CUSTOMER,
        arrow(wh.DIM_CUSTOMER, [customer(3, 3, "Inactive", True)]),
        app_id="test/customers",
        version=2,
    )
    scope = BatchScope(batch_id=2, source_batches=(1,), batch_dates={1: BATCH1})
    assert messages.run(dm_ctx, scope) == {"dimessages": 30}
    rows = dimessages(dm_ctx)
    assert len(rows) == 30  # replaced, not duplicated
    assert validation(rows, 1)[("DimCustomer", "Row count")] == "3"
    assert validation(rows, 1)[("DimCustomer", "Inactive customers")] == "2"
    assert validation(rows, 0)[("DimCustomer", "Row count")] == "0"


def test_the_next_batch_adds_its_rows_and_leaves_earlier_batches_and_alerts_alone(dm_ctx: JobContext, spark):
    # an alert raised by another step in the same micro-batch
    scope = BatchScope(batch_id=3, source_batches=(2,), batch_dates={1: BATCH1, 2: BATCH2})
    trades = spark.createDataFrame([(7, 2)], "t_id bigint, batch int")
    alert = messages.alerts(
        trades,
        source="DimTrade",
        text="Invalid trade fee",
        when=F.lit(True),
        data=F.format_string("T_ID = %d", "t_id"),
        key=F.format_string("T_ID=%d", "t_id"),
        batchid=F.col("batch"),
    )
    assert messages.commit_messages(dm_ctx, scope, "T3", alert) == 1
    dm_ctx.lake.append(
        wh.DIM_BROKER,
        arrow(
            wh.DIM_BROKER,
            [
                {
                    "sk_brokerid": 1,
                    "brokerid": 1,
                    "firstname": "A",
                    "lastname": "B",
                    "iscurrent": True,
                    "batchid": 1,
                    "effectivedate": dt.date(1950, 1, 1),
                    "enddate": dt.date(9999, 12, 31),
                }
            ],
        ),
        app_id="test/brokers",
        version=3,
    )
    assert messages.run(dm_ctx, scope) == {"dimessages": 15}
    rows = dimessages(dm_ctx)
    assert len(rows) == 46  # 30 of batches 0 and 1, 15 of batch 2, 1 alert
    assert validation(rows, 2)[("DimBroker", "Row count")] == "1"
    assert validation(rows, 2)[("DimCustomer", "Row count")] == "3"
    assert validation(rows, 1)[("DimBroker", "Row count")] == "0"  # batch 1 is not recounted by batch 2
    assert [r["messagetext"] for r in rows if r["messagetype"] == "Alert"] == ["Invalid trade fee"]
    assert {r["messagedateandtime"] for r in rows if r["batchid"] == 2} == {dt.datetime(2017, 7, 8, tzinfo=dt.UTC)}


def test_a_rerun_of_a_committed_micro_batch_writes_nothing(dm_ctx: JobContext):
    before = dm_ctx.lake.version(wh.DI_MESSAGES)
    scope = BatchScope(batch_id=3, source_batches=(2,), batch_dates={1: BATCH1, 2: BATCH2})
    assert messages.run(dm_ctx, scope) == {}
    assert dm_ctx.lake.version(wh.DI_MESSAGES) == before


def test_a_micro_batch_without_files_writes_nothing(dm_ctx: JobContext):
    before = dm_ctx.lake.version(wh.DI_MESSAGES)
    assert messages.run(dm_ctx, BatchScope(batch_id=4, source_batches=())) == {}
    assert dm_ctx.lake.version(wh.DI_MESSAGES) == before
