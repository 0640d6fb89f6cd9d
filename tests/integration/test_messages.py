"""Step DM (jobs.messages.run): the validation rows and phase complete records of DImessages, on real Spark and
real Delta tables. Counts are written by hand from the rows the tests put in the warehouse."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest

from jobs import messages
from jobs.scope import BatchScope
from schemas import warehouse as wh
from schemas.model import Table
from streamdi.context import JobContext
from streamdi.lake import Lake

pytestmark = pytest.mark.integration

# the 24 validation rows of the spec's batch validation query, written by hand
SOURCES = [
    "DimAccount",
    "DimBroker",
    "DimCompany",
    "DimCustomer",
    "DimDate",
    "DimSecurity",
    "DimTime",
    "DimTrade",
    "FactCashBalances",
    "FactHoldings",
    "FactMarketHistory",
    "FactWatches",
    "Financial",
    "Industry",
    "Prospect",
    "StatusType",
    "TaxRate",
    "TradeType",
]
JOINED = ["FactCashBalances", "FactHoldings", "FactMarketHistory", "FactWatches"]
ZERO = (
    {(s, "Row count"): "0" for s in SOURCES}
    | {(s, "Row count joined"): "0" for s in JOINED}
    | {("DimCustomer", "Inactive customers"): "0", ("FactWatches", "Inactive watches"): "0"}
)
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


def test_validation_counts_count_each_table_the_joined_fact_rows_and_the_inactive_ones(
    spark, settings, tmp_path, monkeypatch
):
    ctx = JobContext(settings, spark=spark, lake=Lake(tmp_path / "lake", spark))
    lake = ctx.lake

    filler = {"int": 0, "bigint": 0, "string": "", "boolean": False, "date": dt.date(2000, 1, 1)}

    def put(table: Table, rows: list[dict], version: int = 1) -> None:
        """Append `rows`; a required column they do not name gets a filler value (no count looks at it)."""
        required = {c.name: filler.get(c.type, 0) for c in table.columns if not c.nullable}
        lake.append(table, arrow(table, [required | r for r in rows]), app_id="test", version=version)

    put(
        wh.DIM_CUSTOMER,
        [
            customer(1, 1, "Inactive", True),  # counts as inactive
            customer(2, 2, "Active", True),
            customer(3, 2, "Inactive", False),  # an old version: not counted
        ],
    )
    broker = {"sk_brokerid": 9, "brokerid": 9, "firstname": "A", "lastname": "B", "iscurrent": True, "batchid": 1}
    put(wh.DIM_BROKER, [broker | {"effectivedate": dt.date(1950, 1, 1), "enddate": dt.date(9999, 12, 31)}])
    account = {"accountid": 5, "sk_customerid": 1, "status": "Active", "iscurrent": True, "batchid": 1}
    account |= {"effectivedate": dt.date(2015, 1, 1), "enddate": dt.date(9999, 12, 31)}
    put(
        wh.DIM_ACCOUNT,
        [account | {"sk_accountid": 50, "sk_brokerid": 9}, account | {"sk_accountid": 51, "sk_brokerid": 8}],
    )
    put(wh.DIM_DATE, [{"sk_dateid": 20170707, "datevalue": dt.date(2017, 7, 7)}])
    cash = {"sk_customerid": 1, "cash": 1, "batchid": 1}
    put(
        wh.FACT_CASH_BALANCES,
        [
            cash | {"accountid": 5, "sk_accountid": 50, "sk_dateid": 20170707},  # joins
            cash | {"accountid": 6, "sk_accountid": 51, "sk_dateid": 20170707},  # its account's broker does not exist
            cash | {"accountid": 7, "sk_accountid": 50, "sk_dateid": 20170708},  # its day is not in DimDate
        ],
    )
    watch = {"sk_customerid": 2, "sk_securityid": 77, "sk_dateid_dateplaced": 20170707, "batchid": 1}
    put(
        wh.FACT_WATCHES,
        [
            watch
            | {"customerid": 2, "symbol": "A", "placed": dt.datetime(2017, 7, 7), "sk_dateid_dateremoved": 20170707},
            watch | {"customerid": 2, "symbol": "B", "placed": dt.datetime(2017, 7, 7)},
        ],
    )
    got = messages.validation_counts(ctx)
    assert fresh_process_counts(ctx, monkeypatch) == (got, 0)
    assert list(got) == [(s, t) for s, t in messages.VALIDATION_MESSAGES]
    assert len(got) == 24
    expected = {k: int(v) for k, v in ZERO.items()} | {
        ("DimCustomer", "Row count"): 3,
        ("DimCustomer", "Inactive customers"): 1,
        ("DimBroker", "Row count"): 1,
        ("DimAccount", "Row count"): 2,
        ("DimDate", "Row count"): 1,
        ("FactCashBalances", "Row count"): 3,
        ("FactCashBalances", "Row count joined"): 1,
        ("FactWatches", "Row count"): 2,
        ("FactWatches", "Row count joined"): 0,  # security 77 is in no DimSecurity
        ("FactWatches", "Inactive watches"): 1,
    }
    assert got == expected

    # Counted again after more commits, the files counted before keep their figures (`joined_count`): a row that did
    # not join is looked at again (its security arrives), a new file is counted, and a key that goes (a day
    # dropped from DimDate) is noticed, so the rows on it no longer count.
    put(wh.DIM_SECURITY, [{"sk_securityid": 77, "symbol": "A", "iscurrent": True, "batchid": 1}])
    put(wh.FACT_CASH_BALANCES, [cash | {"accountid": 8, "sk_accountid": 50, "sk_dateid": 20170707}], version=2)
    again = messages.validation_counts(ctx)
    assert (again[("FactWatches", "Row count joined")], again[("FactCashBalances", "Row count joined")]) == (2, 2)
    assert fresh_process_counts(ctx, monkeypatch) == (again, 0)
    lake.overwrite(wh.DIM_DATE, arrow(wh.DIM_DATE, []), app_id="test/date", version=1)
    # a new process is the first to see the day go: it counts every file again
    assert fresh_process_counts(ctx, monkeypatch)[1] == 3
    gone = messages.validation_counts(ctx)
    assert (gone[("FactWatches", "Row count joined")], gone[("FactCashBalances", "Row count joined")]) == (0, 0)
    assert fresh_process_counts(ctx, monkeypatch) == (gone, 0)


def fresh_process_counts(ctx: JobContext, monkeypatch) -> tuple[dict, int]:
    """`validation_counts` as a new process on the same lake makes them (a new Lake, no keys seen), and how many
    of the fact tables' data files it read to count the joined rows: none while the counts the last process left
    hold. (The resident dimensions it reads for their keys are read whole, file by file, either way.)"""
    read = []
    real = Lake.__dict__["_file_whole"]  # the staticmethod itself

    def whole(file, schema):
        if Path(file).parent.name.startswith("fact"):
            read.append(file)
        return real.__func__(file, schema)

    monkeypatch.setattr(Lake, "_file_whole", staticmethod(whole))
    seen = dict(messages._SEEN)
    messages._SEEN.clear()
    try:
        counts = messages.validation_counts(JobContext(ctx.settings, spark=ctx.spark, lake=Lake(ctx.lake.root)))
    finally:
        messages._SEEN.clear()
        messages._SEEN.update(seen)
        monkeypatch.setattr(Lake, "_file_whole", real)
    return counts, len(read)


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
    assert written == {"dimessages": 50}  # (24 validation rows + PCR) x batches 0 and 1
    rows = dimessages(dm_ctx)
    assert len(rows) == 50
    zero = ZERO
    assert validation(rows, 1) == zero | {("DimCustomer", "Row count"): "2", ("DimCustomer", "Inactive customers"): "1"}
    pcr = [r for r in rows if r["messagetype"] == "PCR"]
    assert [(r["batchid"], r["messagesource"], r["messagetext"], r["messagedata"], r["messagekey"]) for r in pcr] == [
        (0, "Phase Complete Record", "Batch Complete", None, "Batch Complete"),
        (1, "Phase Complete Record", "Batch Complete", None, "Batch Complete"),
    ]
    # the BatchDate of the message's batch, not the wall clock; batch 0 has none
    assert {r["messagedateandtime"] for r in rows if r["batchid"] == 1} == {dt.datetime(2017, 7, 7, tzinfo=dt.UTC)}
    assert {r["messagedateandtime"] for r in rows if r["batchid"] == 0} == {None}
    assert {r["messagekey"] for r in rows if r["messagetype"] == "Validation"} == {
        "Row count",
        "Row count joined",
        "Inactive customers",
        "Inactive watches",
    }


def test_a_later_micro_batch_of_the_same_batch_replaces_its_rows(dm_ctx: JobContext):
    # micro-batch 2 carries more of TPC-DI batch 1: one more customer arrived
    dm_ctx.lake.append(
        wh.DIM_CUSTOMER,
        arrow(wh.DIM_CUSTOMER, [customer(3, 3, "Inactive", True)]),
        app_id="test/customers",
        version=2,
    )
    scope = BatchScope(batch_id=2, source_batches=(1,), batch_dates={1: BATCH1})
    assert messages.run(dm_ctx, scope) == {"dimessages": 50}
    rows = dimessages(dm_ctx)
    assert len(rows) == 50  # replaced, not duplicated
    assert validation(rows, 1)[("DimCustomer", "Row count")] == "3"
    assert validation(rows, 1)[("DimCustomer", "Inactive customers")] == "2"
    assert validation(rows, 0)[("DimCustomer", "Row count")] == "0"


def test_the_next_batch_adds_its_rows_and_leaves_earlier_batches_and_alerts_alone(dm_ctx: JobContext):
    # an alert raised by another step in the same micro-batch
    scope = BatchScope(batch_id=3, source_batches=(2,), batch_dates={1: BATCH1, 2: BATCH2})
    alert = messages.alert_rows(
        pa.array([2]), source="DimTrade", text="Invalid trade fee", data=["T_ID = 7"], key=["T_ID=7"]
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
    assert messages.run(dm_ctx, scope) == {"dimessages": 25}
    rows = dimessages(dm_ctx)
    assert len(rows) == 76  # 50 of batches 0 and 1, 25 of batch 2, 1 alert
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
