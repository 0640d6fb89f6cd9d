"""Warehouse suites (`jobs.validate`): after a transform step commits, its tables are validated on the rows this
micro-batch wrote (plus the still-current versions of the keys it touched), results are recorded once per
attempt, a failed halt check halts the transform before migration until an operator resumes it, and step DM
writes one `Quality` DImessages row per failed check."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest
from builders import source_line, suites_in, write_landing_file

from jobs import validate
from schemas import sources as src
from schemas import warehouse as wh
from schemas.quality import QUALITY_RESULTS
from streamdi import quality
from streamdi.batchlog import BatchLog, BatchLogError
from streamdi.collector import collect
from streamdi.context import JobContext
from streamdi.lake import Lake
from streamdi.quality import Validator
from streamdi.run.pipeline import stage_job, transform_job
from streamdi.settings import Settings
from streamdi.suites import SuiteError, load_suites

pytestmark = pytest.mark.integration

NOW = dt.datetime(2024, 7, 1, 9, 0, tzinfo=dt.UTC)
END = dt.date(9999, 12, 31)


@pytest.fixture
def ctx(spark, tmp_path) -> JobContext:
    settings = Settings(home=tmp_path / "home", spark_master="local[2]")
    return JobContext(settings=settings, spark=spark, lake=Lake(settings.lake_root, spark))


def customer(sk: int, customerid: int, *, current: bool, start: str, end: dt.date = END, tier: int = 1) -> dict:
    return {
        "sk_customerid": sk,
        "customerid": customerid,
        "taxid": "123-45-6789",
        "status": "Active",
        "lastname": "Doe",
        "firstname": "Jo",
        "middleinitial": None,
        "gender": "F",
        "tier": tier,
        "dob": dt.date(1980, 1, 2),
        "addressline1": "1 Main St",
        "addressline2": None,
        "postalcode": "12345",
        "city": "Town",
        "stateprov": "NY",
        "country": "USA",
        "phone1": None,
        "phone2": None,
        "phone3": None,
        "email1": None,
        "email2": None,
        "nationaltaxratedesc": None,
        "nationaltaxrate": None,
        "localtaxratedesc": None,
        "localtaxrate": None,
        "iscurrent": current,
        "batchid": 1,
        "effectivedate": dt.date.fromisoformat(start),
        "enddate": end,
    }


def commit_customers(ctx: JobContext, batch_id: int, rows: list[dict]) -> None:
    data = pa.Table.from_pylist(rows, schema=wh.DIM_CUSTOMER.arrow_schema())
    ctx.lake.upsert(wh.DIM_CUSTOMER, data, app_id="T2/dimcustomer", version=batch_id)


def results(ctx: JobContext) -> list[tuple]:
    return [
        (
            r["batch_id"],
            r["attempt"],
            r["table_name"],
            r["check_id"],
            r["action"],
            r["element_count"],
            r["unexpected_count"],
        )
        for r in ctx.lake.read_arrow(QUALITY_RESULTS).to_pylist()
        if not r["success"]
    ]


# ------------------------------------------------------------------------------------------------ suites
@pytest.mark.parametrize(
    ("check", "message"),
    [
        (
            "{id: c, expectation: expect_column_values_to_not_be_null, kwargs: {column: tier}, policy: quarantine}",
            "policy quarantine is for staging suites",
        ),
        (
            "{id: c, expectation: expect_column_values_to_not_be_null, "
            "kwargs: {column: tier, row_condition: iscurrent == True}, policy: warn}",
            "needs `condition_parser: pandas`",
        ),
        (
            "{id: c, expectation: expect_column_values_to_not_be_null, "
            "kwargs: {column: tier, row_condition: nosuchcolumn > 1, condition_parser: pandas}, policy: warn}",
            "names no column of warehouse.dimcustomer",
        ),
    ],
)
def test_a_warehouse_suite_that_cannot_work_is_refused_with_the_file_and_check(tmp_path, check, message):
    root = suites_in(tmp_path, warehouse__dimcustomer=f"table: warehouse.dimcustomer\nchecks:\n  - {check}\n")
    with pytest.raises(SuiteError, match=message) as raised:
        load_suites(root)
    assert "dimcustomer.yml: check 1 (c)" in str(raised.value)


@pytest.mark.parametrize(
    ("suite", "message"),
    [
        (
            "table: warehouse.dimaccount\nchecks:\n  - {id: c, expectation: expect_column_values_to_be_in_set, "
            "kwargs: {column: sk_customerid, value_set: {$PARAMETER: dimcustomer__nosuchcolumn}}, policy: warn}\n",
            "parameter 'dimcustomer__nosuchcolumn' must name a warehouse table and one of its columns",
        ),
        (
            "table: warehouse.dimaccount\nchecks:\n  - {id: c, expectation: expect_column_values_to_not_be_in_set, "
            "kwargs: {column: sk_customerid, value_set: {$PARAMETER: missing_from__nosuchtable__sk_customerid}}, "
            "policy: warn}\n",
            "parameter 'missing_from__nosuchtable__sk_customerid' must name a warehouse table",
        ),
        (
            "table: staging.trade\nchecks:\n  - {id: c, expectation: expect_column_values_to_be_in_set, "
            "kwargs: {column: t_ca_id, value_set: {$PARAMETER: dimaccount__accountid}}, policy: warn}\n",
            "run-time parameters are for warehouse suites",
        ),
    ],
)
def test_a_key_parameter_must_name_a_warehouse_table_and_column(tmp_path, suite, message):
    layer = "staging" if "staging." in suite else "warehouse"
    name = "trade" if layer == "staging" else "dimaccount"
    root = suites_in(tmp_path, **{f"{layer}__{name}": suite})
    with pytest.raises(SuiteError, match=message):
        load_suites(root)


def test_the_shipped_warehouse_suites_load_and_cover_every_table_a_step_builds():
    suites = load_suites()
    built = {t.qualified_name for tables in validate.STEP_TABLES.values() for t in tables}
    assert built == {
        "warehouse.dimbroker",
        "warehouse.dimcompany",
        "warehouse.dimsecurity",
        "warehouse.financial",
        "warehouse.dimcustomer",
        "warehouse.dimaccount",
        "warehouse.prospect",
        "warehouse.dimtrade",
        "warehouse.factcashbalances",
        "warehouse.factholdings",
        "warehouse.factmarkethistory",
        "warehouse.factwatches",
        "warehouse.trade_windows",
        "warehouse.market_windows",
    }
    assert built <= set(suites)
    # every SCD2 table halts on a second current version, DimTrade on a second row per trade, Prospect on a second
    # row per AgencyID, the facts on a key that names no dimension row
    for name in built:
        assert any(c.policy == "halt" for c in suites[name].checks) or name == "warehouse.financial"


# ------------------------------------------------------------------------------------------------ rows checked
def test_a_big_fact_table_is_read_back_with_only_its_checked_columns_and_keys():
    # factmarkethistory.yml checks daylow, fiftytwoweeklow, fiftytwoweekhigh, dayhigh, sk_securityid and
    # sk_companyid; symbol and sk_dateid are its key and order; its prices, volume, yield and ratio are not read
    suite = load_suites(registry=False)["warehouse.factmarkethistory"]
    assert validate.checked_columns(suite, wh.FACT_MARKET_HISTORY) == [
        "sk_securityid", "sk_companyid", "sk_dateid", "fiftytwoweekhigh", "fiftytwoweeklow", "dayhigh", "daylow",
        "symbol",
    ]  # fmt: skip


def test_the_rows_checked_are_this_micro_batchs_writes_plus_the_current_versions_of_the_keys_it_touched(ctx):
    commit_customers(
        ctx,
        1,
        [customer(10, 7, current=True, start="2017-07-01"), customer(20, 8, current=True, start="2017-07-01")],
    )
    # micro-batch 2 adds a version of customer 7 but (a bug) leaves version 10 open; customer 8 is untouched
    commit_customers(ctx, 2, [customer(11, 7, current=True, start="2017-07-09")])

    rows = validate.written_rows(ctx.lake, wh.DIM_CUSTOMER, "T2/dimcustomer", 2)
    assert [(r["sk_customerid"], r["customerid"], r["iscurrent"]) for r in rows.to_pylist()] == [
        (10, 7, True),
        (11, 7, True),
    ]
    assert validate.written_rows(ctx.lake, wh.DIM_CUSTOMER, "T2/dimcustomer", 3) is None
    assert validate.written_rows(ctx.lake, wh.DIM_CUSTOMER, "T1/dimcustomer", 2) is None

    # the steps read back only what the suite and the rows' keys need: the same rows, 8 of DimCustomer's 33 columns
    columns = validate.checked_columns(load_suites(registry=False)["warehouse.dimcustomer"], wh.DIM_CUSTOMER)
    assert columns == [
        "sk_customerid", "customerid", "status", "gender", "tier", "iscurrent", "effectivedate", "enddate"
    ]  # fmt: skip
    assert validate.written_rows(ctx.lake, wh.DIM_CUSTOMER, "T2/dimcustomer", 2, columns) == rows.select(columns)

    checks = validate.validate_step(ctx, 2, "T2")
    assert checks.rows == {"warehouse.dimcustomer": 2}
    assert checks.halts == [
        "warehouse.dimcustomer: check one_current_version_per_customer (expect_column_values_to_be_unique) "
        "failed on 2 of 2 rows"
    ]
    assert results(ctx) == [(2, 0, "warehouse.dimcustomer", "one_current_version_per_customer", "halted", 2, 2)]

    # the same attempt again (a crash before the batch log heard of it) records nothing twice
    validate.validate_step(ctx, 2, "T2")
    assert len(results(ctx)) == 1
    # after a resume (attempt 1) the halt check only warns
    resumed = validate.validate_step(ctx, 2, "T2", attempt=1)
    assert resumed.halts == []
    assert results(ctx)[1] == (2, 1, "warehouse.dimcustomer", "one_current_version_per_customer", "overridden", 2, 2)


def test_a_large_first_load_is_read_back_only_while_no_other_large_one_is_held(ctx, monkeypatch):
    read_back = []
    real = validate.commit_rows

    def recorded(lake, table, commit, columns=None):
        read_back.append((table.name, commit.txn_version, validate._ONE_LARGE.locked()))
        return real(lake, table, commit, columns)

    monkeypatch.setattr(validate, "commit_rows", recorded)
    monkeypatch.setattr(validate, "LARGE_COMMIT_ROWS", 2)
    # the step's checks read a large commit back under the one lock for large read-backs, a small one beside it
    commit_customers(
        ctx,
        1,
        [customer(10, 7, current=True, start="2017-07-01"), customer(20, 8, current=True, start="2017-07-01")],
    )
    assert validate.validate_step(ctx, 1, "T2").rows == {"warehouse.dimcustomer": 2}
    commit_customers(ctx, 2, [customer(11, 7, current=True, start="2017-07-09")])
    assert validate.validate_step(ctx, 2, "T2").rows == {"warehouse.dimcustomer": 2}
    assert read_back == [("dimcustomer", 1, True), ("dimcustomer", 2, False)]
    assert not validate._ONE_LARGE.locked()

    # large: a commit that only appended (a first load) of at least LARGE_COMMIT_ROWS rows, told by its log
    first = validate.written_commit(ctx.lake, wh.DIM_CUSTOMER, "T2/dimcustomer", 1)
    second = validate.written_commit(ctx.lake, wh.DIM_CUSTOMER, "T2/dimcustomer", 2)
    assert validate.written_commit(ctx.lake, wh.DIM_CUSTOMER, "T2/dimcustomer", 3) is None
    assert validate.is_large(ctx.lake, wh.DIM_CUSTOMER, first)  # 2 rows appended
    assert not validate.is_large(ctx.lake, wh.DIM_CUSTOMER, second)  # a MERGE
    monkeypatch.setattr(validate, "LARGE_COMMIT_ROWS", 3)
    assert not validate.is_large(ctx.lake, wh.DIM_CUSTOMER, first)


def test_a_correct_scd2_change_passes_every_shipped_check(ctx):
    commit_customers(ctx, 1, [customer(10, 7, current=True, start="2017-07-01")])
    commit_customers(
        ctx,
        2,
        [
            customer(10, 7, current=False, start="2017-07-01", end=dt.date(2017, 7, 9)),
            customer(11, 7, current=True, start="2017-07-09", tier=4),
        ],
    )
    checks = validate.validate_step(ctx, 2, "T2")
    assert checks.halts == []
    failed = {(o.check.id, o.action, o.unexpected_count) for o in checks.all_outcomes() if not o.success}
    assert failed == {("tier_is_1_2_or_3", "warned", 1)}  # tier 4: a TPC-DI alert case, recorded, not stopped


# ------------------------------------------------------------------------------------------------ in the dataflow
BROKER_SUITE = """
table: warehouse.dimbroker
checks:
  - id: broker_ids_below_1000
    expectation: expect_column_values_to_be_between
    kwargs: {column: brokerid, max_value: 999}
    policy: halt
    why: a test rule the second broker breaks
  - id: has_a_phone
    expectation: expect_column_values_to_not_be_null
    kwargs: {column: phone}
    policy: warn
"""


def hr_line(employee: int, phone: str | None = "555-0100") -> str:
    fields = [str(employee), "1", "Ann", "Lee", "", "314", "Branch", "Office", phone or ""]
    return ",".join(fields)


def test_a_halt_check_after_a_step_halts_the_transform_before_migration_until_resumed(ctx, tmp_path, monkeypatch):
    monkeypatch.setattr(
        quality, "_validator", Validator(load_suites(suites_in(tmp_path, warehouse__dimbroker=BROKER_SUITE)))
    )
    landing = ctx.settings.landing_dir
    write_landing_file(landing / "Batch1" / "BatchDate.txt", [source_line(src.BATCH_DATE, batchdate="2017-07-07")])
    write_landing_file(landing / "Batch1" / "Date.txt", [source_line(src.DATE_FILE)])
    write_landing_file(landing / "Batch1" / "HR.csv", [hr_line(5), hr_line(1234, phone=None)])
    batch_log = BatchLog(ctx.lake)
    assert collect(batch_log, landing, now=NOW).batch_id == 1
    stage_job(ctx, 1)

    detail = transform_job(ctx, 1)
    reason = (
        "warehouse.dimbroker: check broker_ids_below_1000 (expect_column_values_to_be_between) failed on 1 of 2 rows"
    )
    assert detail["halted"] == reason
    assert [(h.batch_id, h.stage, h.reason) for h in batch_log.halted()] == [(1, "transform", reason)]
    assert batch_log.pending() == []  # nothing runs, migration included
    assert ctx.lake.row_count(wh.DIM_BROKER) == 2  # T0 committed: the check sees what was written
    assert not ctx.lake.exists(wh.DI_MESSAGES)  # the steps after T0's wave (DM included) did not run
    with pytest.raises(BatchLogError, match="batch resume 1"):
        batch_log.skip(1, "bad brokers", now=NOW)

    batch_log.resume(1, now=NOW, note="broker 1234 is real")
    detail = transform_job(ctx, 1)
    assert "halted" not in detail
    assert detail["checks"] == {"overridden": 1, "warned": 1}
    assert batch_log.is_done(1, "transform")
    assert results(ctx) == [
        (1, 0, "warehouse.dimbroker", "broker_ids_below_1000", "halted", 2, 1),
        (1, 0, "warehouse.dimbroker", "has_a_phone", "warned", 2, 1),
        (1, 1, "warehouse.dimbroker", "broker_ids_below_1000", "overridden", 2, 1),
        (1, 1, "warehouse.dimbroker", "has_a_phone", "warned", 2, 1),
    ]
    detail_json = json.loads(
        next(r["detail"] for r in ctx.lake.read_arrow(QUALITY_RESULTS).to_pylist() if r["action"] == "halted")
    )
    assert detail_json["failing_values"] == [1234]

    quality_messages = [
        {k: m[k] for k in ("batchid", "messagesource", "messagetext", "messagetype", "messagedata", "messagekey")}
        for m in ctx.lake.read_arrow(wh.DI_MESSAGES).to_pylist()
        if m["messagetype"] == "Quality"
    ]
    assert quality_messages == [
        {
            "batchid": 1,
            "messagesource": "warehouse.dimbroker",
            "messagetext": "Quality check failed: broker_ids_below_1000",
            "messagetype": "Quality",
            "messagedata": "expect_column_values_to_be_between on brokerid, policy halt",
            "messagekey": "warehouse.dimbroker/broker_ids_below_1000",
        },
        {
            "batchid": 1,
            "messagesource": "warehouse.dimbroker",
            "messagetext": "Quality check failed: has_a_phone",
            "messagetype": "Quality",
            "messagedata": "expect_column_values_to_not_be_null on phone, policy warn",
            "messagekey": "warehouse.dimbroker/has_a_phone",
        },
    ]


def broker(sk: int, brokerid: int) -> dict:
    return {
        "sk_brokerid": sk,
        "brokerid": brokerid,
        "managerid": None,
        "firstname": "Ann",
        "lastname": "Lee",
        "middleinitial": None,
        "branch": None,
        "office": None,
        "phone": None,
        "iscurrent": True,
        "batchid": 1,
        "effectivedate": dt.date(1950, 1, 1),
        "enddate": END,
    }


def account(sk: int, accountid: int, sk_customerid: int | None, sk_brokerid: int) -> dict:
    return {
        "sk_accountid": sk,
        "accountid": accountid,
        "sk_brokerid": sk_brokerid,
        "sk_customerid": sk_customerid,
        "accountdesc": "Brokerage",
        "taxstatus": 1,
        "status": "Active",
        "iscurrent": True,
        "batchid": 1,
        "effectivedate": dt.date(2017, 7, 1),
        "enddate": END,
    }


def test_a_surrogate_key_that_resolves_to_no_version_halts(ctx):
    ctx.lake.upsert(
        wh.DIM_BROKER,
        pa.Table.from_pylist([broker(4, 40)], schema=wh.DIM_BROKER.arrow_schema()),
        app_id="T0/dimbroker",
        version=1,
    )
    commit_customers(ctx, 1, [customer(10, 7, current=True, start="2017-07-01")])
    accounts = [account(100, 1, sk_customerid=10, sk_brokerid=4), account(101, 2, sk_customerid=99, sk_brokerid=4)]
    ctx.lake.upsert(
        wh.DIM_ACCOUNT,
        pa.Table.from_pylist(accounts, schema=wh.DIM_ACCOUNT.arrow_schema()),
        app_id="T2/dimaccount",
        version=1,
    )
    checks = validate.validate_step(ctx, 1, "T2")
    assert checks.rows == {"warehouse.dimcustomer": 1, "warehouse.dimaccount": 2}
    assert checks.halts == [
        "warehouse.dimaccount: check customer_key_resolves (expect_column_values_to_not_be_in_set) "
        "failed on 1 of 2 rows"
    ]
    failing = next(o for o in checks.outcomes["warehouse.dimaccount"] if o.check.id == "customer_key_resolves")
    assert failing.failing_values == (99,)
    broker_check = next(o for o in checks.outcomes["warehouse.dimaccount"] if o.check.id == "broker_key_resolves")
    assert broker_check.success


KEY_CHECKS = """table: warehouse.dimaccount
checks:
  - {id: resolves, expectation: expect_column_values_to_be_in_set,
     kwargs: {column: sk_customerid, value_set: {$PARAMETER: dimcustomer__sk_customerid}}, policy: warn}
  - {id: not_dangling, expectation: expect_column_values_to_not_be_in_set,
     kwargs: {column: sk_customerid, value_set: {$PARAMETER: missing_from__dimcustomer__sk_customerid}}, policy: warn}
  - {id: broker_not_dangling, expectation: expect_column_values_to_not_be_in_set,
     kwargs: {column: sk_brokerid, value_set: {$PARAMETER: missing_from__dimbroker__sk_brokerid}}, policy: warn}
"""


def test_both_key_parameter_forms_pass_only_the_checked_values_and_agree(ctx, tmp_path):
    suite = load_suites(suites_in(tmp_path, warehouse__dimaccount=KEY_CHECKS))["warehouse.dimaccount"]
    commit_customers(ctx, 1, [customer(sk, sk - 3, current=True, start="2017-07-01") for sk in (10, 11, 12)])
    rows = pa.Table.from_pylist(
        [
            account(100, 1, sk_customerid=10, sk_brokerid=4),
            account(101, 2, sk_customerid=99, sk_brokerid=4),
            account(102, 3, sk_customerid=None, sk_brokerid=5),
            account(103, 4, sk_customerid=11, sk_brokerid=4),
            account(104, 5, sk_customerid=99, sk_brokerid=5),
        ],
        schema=wh.DIM_ACCOUNT.arrow_schema(),
    )
    values = validate.key_values(ctx.lake, suite, rows)
    # DimCustomer has 10, 11 and 12; 12 is not in the rows, so it is never passed; DimBroker does not exist yet
    assert {k: sorted(v) for k, v in values.items()} == {
        "dimcustomer__sk_customerid": [10, 11],
        "missing_from__dimcustomer__sk_customerid": [99],
        "missing_from__dimbroker__sk_brokerid": [4, 5],
    }
    outcomes = {
        o.check.id: o for o in Validator({suite.name: suite}).validate(suite, rows, 1, parameters=values).outcomes
    }
    assert [(o.success, o.unexpected_count, o.failing_values) for o in outcomes.values()] == [
        (False, 2, (99, 99)),
        (False, 2, (99, 99)),
        (False, 5, (4, 4, 5, 4, 5)),  # null keys are not checked; no broker resolves
    ]


def trade(tradeid: int, *, sk_brokerid: int = 4, quantity: int = 10) -> dict:
    return {
        "tradeid": tradeid,
        "sk_brokerid": sk_brokerid,
        "sk_createdateid": 20170702,
        "sk_createtimeid": 93000,
        "sk_closedateid": 20170703,
        "sk_closetimeid": 100000,
        "status": "Completed",
        "type": "Market Buy",
        "cashflag": True,
        "sk_securityid": 1,
        "sk_companyid": 1,
        "quantity": quantity,
        "bidprice": 10,
        "sk_customerid": 10,
        "sk_accountid": 100,
        "executedby": "Ann Lee",
        "tradeprice": 10,
        "fee": 0,
        "commission": 1,
        "tax": 0,
        "batchid": 1,
    }


def test_a_large_first_load_written_in_pieces_is_checked_a_piece_at_a_time_with_the_whole_reads_outcomes(
    ctx, monkeypatch
):
    ctx.lake.upsert(
        wh.DIM_BROKER,
        pa.Table.from_pylist([broker(4, 40)], schema=wh.DIM_BROKER.arrow_schema()),
        app_id="T0/dimbroker",
        version=1,
    )
    # DimTrade's first load in three pieces (each a file, in tradeid order within it): trade 5 twice (in the first
    # and the last piece), broker key 99 dangling in two pieces, a quantity of 0 in the second
    pieces = [
        [trade(t) for t in range(1, 8)] + [trade(8, sk_brokerid=99)],
        [trade(t) for t in range(10, 16)] + [trade(16, quantity=0)],
        [trade(5), trade(20, sk_brokerid=99), trade(21)],
    ]
    written = ctx.lake.pieces(wh.DIM_TRADE, app_id="T3/dimtrade", version=1)
    for rows in pieces:
        written.add(pa.Table.from_pylist(rows, schema=wh.DIM_TRADE.arrow_schema()))
    written.commit()
    monkeypatch.setattr(quality, "PIECE_ROWS", 3)
    monkeypatch.setattr(validate, "PIECE_ROWS", 3)

    def outcomes(checks: validate.StepChecks) -> list[tuple]:
        return [
            (o.check.id, o.success, o.element_count, o.unexpected_count, o.failing_values, o.action)
            for o in checks.outcomes["warehouse.dimtrade"]
        ]

    whole = validate.validate_step(ctx, 1, "T3")  # 18 rows: under LARGE_COMMIT_ROWS, read back whole
    monkeypatch.setattr(validate, "LARGE_COMMIT_ROWS", 10)

    def not_whole(*args, **kwargs):
        raise AssertionError("a large commit written in pieces is not read back whole")

    monkeypatch.setattr(validate, "commit_rows", not_whole)
    by_piece = validate.validate_step(ctx, 1, "T3")
    assert by_piece.rows == whole.rows == {"warehouse.dimtrade": 18}
    assert outcomes(by_piece) == outcomes(whole)
    failed = {o[0]: o[1:5] for o in outcomes(by_piece) if not o[1]}
    assert failed == {
        "one_row_per_trade": (False, 18, 2, (5, 5)),
        "quantity_is_positive": (False, 18, 1, (0,)),
        "broker_key_resolves": (False, 18, 2, (99, 99)),
        # no DimSecurity, DimCompany, DimAccount or DimCustomer: their keys resolve to nothing
        "security_key_resolves": (False, 18, 18, (1,) * 18),
        "company_key_resolves": (False, 18, 18, (1,) * 18),
        "account_key_resolves": (False, 18, 18, (100,) * 18),
        "customer_key_resolves": (False, 18, 18, (10,) * 18),
    }
    assert by_piece.halts == whole.halts
    assert len(results(ctx)) == len(failed)  # the same attempt recorded once
