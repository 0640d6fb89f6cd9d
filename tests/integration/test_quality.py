"""Data-quality suites and policies (`streamdi.quality`) with real Great Expectations: suites load and are
checked, each policy does what it says on hand-made rows, and in the stage step quarantined rows are
retrievable with their checks, a halt check halts the batch until an operator resumes it, and the counts
reconcile (read = staged + rejected + quarantined)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from builders import source_line, staged_trades, suites_in, write_landing_file

from schemas import sources as src
from schemas.quality import QUALITY_RESULTS, QUARANTINE
from streamdi import quality
from streamdi.batchlog import BatchLog
from streamdi.collector import collect
from streamdi.context import JobContext
from streamdi.lake import Lake
from streamdi.quality import Validator
from streamdi.run.pipeline import stage_job
from streamdi.settings import Settings
from streamdi.suites import SuiteError, load_suites

pytestmark = pytest.mark.integration

NOW = dt.datetime(2024, 7, 1, 9, 0, tzinfo=dt.UTC)

TRADE_SUITE = """
table: staging.trade
checks:
  - id: known_status
    expectation: expect_column_values_to_be_in_set
    kwargs: {column: t_st_id, value_set: [CMPT, SBMT]}
    policy: quarantine
  - id: positive_quantity
    expectation: expect_column_values_to_be_between
    kwargs: {column: t_qty, min_value: 1}
    policy: quarantine
  - id: sane_price
    expectation: expect_column_values_to_be_between
    kwargs: {column: t_bid_price, max_value: 1000}
    policy: warn
  - id: not_too_many
    expectation: expect_table_row_count_to_be_between
    kwargs: {max_value: 3}
    policy: halt
"""


def test_every_suite_in_expectations_loads_against_the_declared_tables():
    suites = load_suites()
    assert {"staging.trade", "staging.dailymarket", "staging.batchdate", "staging.customermgmt"} <= set(suites)
    for suite in suites.values():
        assert suite.path.parent.name == suite.table.layer and suite.path.stem == suite.table.name
        assert suite.checks, suite.path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("table: staging.nope\nchecks: []\n", "unknown table 'staging.nope'"),
        (
            "table: staging.trade\nchecks:\n  - {id: a, expectation: expect_it_to_work, kwargs: {}, policy: warn}\n",
            "'expect_it_to_work' is not a Great Expectations expectation",
        ),
        (
            "table: staging.trade\nchecks:\n  - id: a\n    expectation: expect_column_values_to_not_be_null\n"
            "    kwargs: {column: t_qtty}\n    policy: warn\n",
            "'t_qtty' is not a column of staging.trade",
        ),
        (
            "table: staging.trade\nchecks:\n  - id: a\n    expectation: expect_column_values_to_not_be_null\n"
            "    kwargs: {column: t_qty}\n    policy: drop\n",
            "policy must be one of warn, quarantine, halt, not 'drop'",
        ),
        (
            "table: staging.trade\nchecks:\n  - id: a\n    expectation: expect_table_row_count_to_be_between\n"
            "    kwargs: {max_value: 3}\n    policy: quarantine\n",
            "policy quarantine needs a row-level expectation",
        ),
        (
            "table: staging.trade\nchecks:\n  - id: a\n    expectation: expect_column_values_to_be_in_set\n"
            "    kwargs: {column: t_qty}\n    policy: warn\n",
            "arguments do not fit expect_column_values_to_be_in_set",
        ),
        (
            "table: staging.trade\nchecks:\n  - {id: a, expectation: expect_column_values_to_not_be_null,"
            " kwargs: {column: t_qty}, policy: warn}\n  - {id: a, expectation: expect_column_values_to_not_be_null,"
            " kwargs: {column: t_id}, policy: warn}\n",
            "id 'a' is used twice",
        ),
    ],
)
def test_a_bad_suite_is_refused_with_the_file_and_the_reason(tmp_path, text, message):
    root = suites_in(tmp_path, staging__trade=text)
    with pytest.raises(SuiteError) as raised:
        load_suites(root)
    assert message in str(raised.value)
    assert str(root / "staging" / "trade.yml") in str(raised.value)


def test_a_suite_must_sit_in_the_file_of_its_table(tmp_path):
    root = suites_in(tmp_path, staging__trades="table: staging.trade\nchecks: []\n")
    with pytest.raises(SuiteError, match="belongs in expectations/staging/trade.yml"):
        load_suites(root)


def test_each_policy_does_what_it_says(tmp_path):
    suite = load_suites(suites_in(tmp_path, staging__trade=TRADE_SUITE))["staging.trade"]
    validator = Validator({suite.name: suite})
    rows = staged_trades(
        (1, "CMPT", 10, "20.00"),
        (2, "XXXX", 10, "20.00"),  # unknown status: quarantined
        (3, "SBMT", 0, "2000.00"),  # zero quantity: quarantined; price warned
        (4, "NOPE", -5, "30.00"),  # fails both quarantine checks: quarantined once, with both
        (5, "SBMT", 1, "99.99"),
    )

    checked = validator.validate(suite, rows, batch_id=4)

    outcomes = [(o.check.id, o.success, o.element_count, o.unexpected_count, o.action) for o in checked.outcomes]
    assert outcomes == [
        ("known_status", False, 5, 2, "quarantined"),
        ("positive_quantity", False, 5, 2, "quarantined"),
        ("sane_price", False, 5, 1, "warned"),
        ("not_too_many", False, 5, 0, "halted"),
    ]
    assert checked.kept["t_id"].to_pylist() == [1, 5]
    quarantined = checked.quarantined.to_pylist()
    assert [(q["batch_id"], q["table_name"], q["check_ids"]) for q in quarantined] == [
        (4, "staging.trade", "known_status"),
        (4, "staging.trade", "positive_quantity"),
        (4, "staging.trade", "known_status,positive_quantity"),
    ]
    assert [json.loads(q["row_key"]) for q in quarantined] == [
        {"source_file": "Batch1/Trade.txt", "line_no": n} for n in (2, 3, 4)
    ]
    assert json.loads(quarantined[2]["row"])["t_qty"] == -5
    assert [o.describe(suite.name) for o in checked.halts] == [
        "staging.trade: check not_too_many (expect_table_row_count_to_be_between) failed on the table"
    ]
    results = checked.result_rows(batch_id=4, attempt=0).to_pylist()
    assert [(r["check_id"], r["policy"], r["action"], r["unexpected_count"]) for r in results] == [
        ("known_status", "quarantine", "quarantined", 2),
        ("positive_quantity", "quarantine", "quarantined", 2),
        ("sane_price", "warn", "warned", 1),
        ("not_too_many", "halt", "halted", 0),
    ]
    assert json.loads(results[0]["detail"]) == {
        "kwargs": {"column": "t_st_id", "value_set": ["CMPT", "SBMT"]},
        "failing_values": ["XXXX", "NOPE"],
    }

    resumed = validator.validate(suite, rows, batch_id=4, resumed=True)
    assert [o.action for o in resumed.outcomes] == ["quarantined", "quarantined", "warned", "overridden"]
    assert resumed.halts == []


PIECED = """
table: staging.trade
checks:
  - {id: known_status, expectation: expect_column_values_to_be_in_set, policy: quarantine,
     kwargs: {column: t_st_id, value_set: [CMPT, SBMT]}}
  - {id: unique_id, expectation: expect_column_values_to_be_unique, kwargs: {column: t_id}, policy: warn}
  - {id: submitted_price, expectation: expect_column_values_to_be_between, policy: warn,
     kwargs: {column: t_bid_price, max_value: 50, row_condition: 't_st_id == "SBMT"', condition_parser: pandas}}
  - {id: not_too_many, expectation: expect_table_row_count_to_be_between, kwargs: {max_value: 3}, policy: halt}
  - {id: positive_quantity, expectation: expect_column_values_to_be_between, kwargs: {column: t_qty, min_value: 1},
     policy: quarantine}
"""


def test_a_large_table_is_checked_in_pieces_with_the_outcomes_of_one_check(tmp_path, monkeypatch):
    """Above `PIECE_ROWS` rows, the checks that judge each row alone see pieces of the rows and their outcomes are
    merged; uniqueness and the row count see every row (only their columns). Counts, failing values, quarantined
    rows and the checks each row failed are those of a whole-table validation."""
    suite = load_suites(suites_in(tmp_path, staging__trade=PIECED))["staging.trade"]
    validator = Validator({suite.name: suite})
    seen = []
    check = validator.check

    def spied(part, rows, *args, **kwargs):
        seen.append(([c.id for c in part.checks], rows["t_id"].to_pylist()))
        return check(part, rows, *args, **kwargs)

    monkeypatch.setattr(validator, "check", spied)
    monkeypatch.setattr(quality, "PIECE_ROWS", 2)
    rows = staged_trades(
        (1, "CMPT", 10, "20.00"),
        (2, "XXXX", 10, "20.00"),  # unknown status: quarantined
        (2, "SBMT", 0, "70.00"),  # a second trade 2; zero quantity: quarantined; submitted price warned
        (4, "NOPE", -5, "30.00"),  # fails both quarantine checks
        (5, "SBMT", 1, "90.00"),  # submitted price warned
    )

    checked = validator.validate(suite, rows, batch_id=4)

    row_wise = ["known_status", "submitted_price", "positive_quantity"]
    assert seen == [
        (["unique_id", "not_too_many"], [1, 2, 2, 4, 5]),
        (row_wise, [1, 2]),
        (row_wise, [2, 4]),
        (row_wise, [5]),
    ]
    assert [
        (o.check.id, o.success, o.element_count, o.unexpected_count, o.action, o.failing_values)
        for o in checked.outcomes
    ] == [
        ("known_status", False, 5, 2, "quarantined", ("XXXX", "NOPE")),
        ("unique_id", False, 5, 2, "warned", (2, 2)),
        ("submitted_price", False, 2, 2, "warned", (70.0, 90.0)),
        ("not_too_many", False, 5, 0, "halted", ()),
        ("positive_quantity", False, 5, 2, "quarantined", (0, -5)),
    ]
    assert checked.kept["t_id"].to_pylist() == [1, 5]
    assert [(json.loads(q["row_key"])["line_no"], q["check_ids"]) for q in checked.quarantined.to_pylist()] == [
        (2, "known_status"),
        (3, "positive_quantity"),
        (4, "known_status,positive_quantity"),
    ]


def test_rows_that_pass_every_check_are_kept_whole(tmp_path):
    suite = load_suites(suites_in(tmp_path, staging__trade=TRADE_SUITE))["staging.trade"]
    rows = staged_trades((1, "CMPT", 10, "20.00"), (2, "SBMT", 3, "5.10"))

    checked = Validator({suite.name: suite}).validate(suite, rows, batch_id=1)

    assert checked.kept.equals(rows)
    assert checked.quarantined.num_rows == 0
    assert {o.action for o in checked.outcomes} == {"passed"}


def test_validating_hashes_no_rows_for_a_fingerprint_nobody_reads(tmp_path, monkeypatch):
    """Great Expectations' pandas engine fingerprints each batch by hashing every row unless told not to (its
    `HASH_THRESHOLD`); the Validator turns that off. Should an upgrade rename the knob, the hash runs again and
    this test says so."""
    from great_expectations.execution_engine import pandas_execution_engine

    def hashed(_frame):
        raise AssertionError("a batch was hashed")

    suite = load_suites(suites_in(tmp_path, staging__trade=TRADE_SUITE))["staging.trade"]
    validator = Validator({suite.name: suite})
    monkeypatch.setattr(pandas_execution_engine, "hash_pandas_dataframe", hashed)
    rows = staged_trades((1, "CMPT", 10, "20.00"), (2, "XXXX", 0, "5.10"))

    checked = validator.validate(suite, rows, batch_id=1)

    assert [(o.check.id, o.action, o.unexpected_count) for o in checked.outcomes] == [
        ("known_status", "quarantined", 1),
        ("positive_quantity", "quarantined", 1),
        ("sane_price", "passed", 0),
        ("not_too_many", "passed", 0),
    ]


CONDITIONED = """
table: staging.trade
checks:
  - {id: submitted_price, expectation: expect_column_values_to_be_between, policy: warn,
     kwargs: {column: t_bid_price, max_value: 50, row_condition: 't_st_id == "SBMT"', condition_parser: pandas}}
  - {id: canceled_price, expectation: expect_column_values_to_be_between, policy: warn,
     kwargs: {column: t_bid_price, max_value: 50, row_condition: 't_st_id == "CNCL"', condition_parser: pandas}}
  - {id: completed_price, expectation: expect_column_values_to_be_between, policy: warn,
     kwargs: {column: t_bid_price, max_value: 50, row_condition: 't_st_id == "CMPT"', condition_parser: pandas}}
  - {id: quantity, expectation: expect_column_values_to_be_between, kwargs: {column: t_qty, min_value: 1}, policy: warn}
"""


def test_every_check_counts_the_rows_of_its_domain_whether_it_passes_or_fails(tmp_path):
    # passed checks are run for their verdict only, failed ones again for details: both must count the rows their
    # row condition selects (none for CNCL), as Great Expectations does
    suite = load_suites(suites_in(tmp_path, staging__trade=CONDITIONED))["staging.trade"]
    rows = staged_trades((1, "CMPT", 10, "20.00"), (2, "SBMT", 3, "5.10"), (3, "CMPT", 0, "70.00"), (4, "SBMT", 1, "9"))

    checked = Validator({suite.name: suite}).validate(suite, rows, batch_id=1)

    assert [
        (o.check.id, o.action, o.element_count, o.unexpected_count, o.failing_values) for o in checked.outcomes
    ] == [
        ("submitted_price", "passed", 2, 0, ()),
        ("canceled_price", "passed", 0, 0, ()),
        ("completed_price", "warned", 2, 1, (70.0,)),
        ("quantity", "warned", 4, 1, (0,)),
    ]


# -- in the stage step, with the suites of expectations/ ------------------------------------------------------


@pytest.fixture
def ctx(spark, tmp_path) -> JobContext:
    settings = Settings(home=tmp_path / "home", spark_master="local[2]")
    return JobContext(settings=settings, spark=spark, lake=Lake(settings.lake_root, spark))


def trade_line(t_id: str, **fields: str) -> str:
    return source_line(src.TRADE, t_id=t_id, **fields)


def test_stage_quarantines_bad_trades_and_counts_reconcile(ctx):
    landing = ctx.settings.landing_dir
    write_landing_file(
        landing / "Batch1" / "Trade.txt",
        [
            trade_line("1"),
            trade_line("2", t_tt_id="TXX"),  # not a trade type
            trade_line("3", t_qty="0"),
            "4|broken line",  # a parse reject, not a quality failure
            trade_line("5"),
        ],
    )
    batch_log = BatchLog(ctx.lake)
    assert collect(batch_log, landing, now=NOW).batch_id == 1

    detail = stage_job(ctx, 1)

    assert (detail["read"], detail["staged"], detail["rejected"], detail["quarantined"], detail["held"]) == (
        5,
        2,
        1,
        2,
        0,
    )
    assert "halted" not in detail and batch_log.is_done(1, "stage")
    assert sorted(ctx.lake.read_arrow(src.TRADE.staging)["t_id"].to_pylist()) == [1, 5]
    held_out = ctx.lake.read_arrow(QUARANTINE).to_pylist()
    assert [(q["table_name"], json.loads(q["row_key"])["line_no"], q["check_ids"]) for q in held_out] == [
        ("staging.trade", 2, "type_is_a_trade_type"),
        ("staging.trade", 3, "quantity_is_positive"),
    ]
    assert json.loads(held_out[0]["row"])["t_tt_id"] == "TXX"
    failed = [
        (r["check_id"], r["action"], r["unexpected_count"])
        for r in ctx.lake.read_arrow(QUALITY_RESULTS).to_pylist()
        if r["action"] != "passed"
    ]
    assert failed == [("quantity_is_positive", "quarantined", 1), ("type_is_a_trade_type", "quarantined", 1)]


def test_a_halt_check_holds_the_rows_and_halts_the_batch_until_resumed(ctx):
    landing = ctx.settings.landing_dir
    write_landing_file(landing / "Batch1" / "BatchDate.txt", [source_line(src.BATCH_DATE, batchdate="1900-01-01")])
    write_landing_file(landing / "Batch1" / "TaxRate.txt", [source_line(src.TAX_RATE, tx_id="US1")])
    batch_log = BatchLog(ctx.lake)
    assert collect(batch_log, landing, now=NOW).batch_id == 1

    detail = stage_job(ctx, 1)

    assert detail["halted"] == (
        "staging.batchdate: check date_is_plausible (expect_column_values_to_be_between) failed on 1 of 1 rows"
    )
    assert (detail["staged"], detail["held"]) == (1, 1)  # the tax rate is staged, the date waits
    assert [(h.batch_id, h.stage) for h in batch_log.halted()] == [(1, "stage")]
    assert batch_log.pending() == []
    assert not ctx.lake.exists(src.BATCH_DATE.staging)  # nothing of the held table was written

    batch_log.resume(1, now=NOW + dt.timedelta(minutes=5), note="the date is right, the generator was told so")
    resumed = stage_job(ctx, 1)

    assert "halted" not in resumed and batch_log.is_done(1, "stage")
    assert ctx.lake.read_arrow(src.BATCH_DATE.staging)["batchdate"].to_pylist() == [dt.date(1900, 1, 1)]
    assert ctx.lake.read_arrow(src.TAX_RATE.staging)["tx_id"].to_pylist() == ["US1"]  # staged once
    by_attempt = [
        (r["attempt"], r["check_id"], r["action"])
        for r in ctx.lake.read_arrow(QUALITY_RESULTS).to_pylist()
        if r["table_name"] == "staging.batchdate"
    ]
    assert by_attempt == [(0, "date_is_plausible", "halted"), (1, "date_is_plausible", "overridden")]


def test_the_process_validator_is_built_once():
    assert quality.validator() is quality.validator()
