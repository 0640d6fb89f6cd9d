"""Staging: good lines land in staging.<source>, every bad line lands in staging.rejects with its reason."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from builders import SHARED_SAMPLE, deliver, source_line, write_landing_file

from jobs.delimited import parse_delimited
from jobs.landing import numbered_lines, source_for_file
from schemas import sources as src
from schemas.staging import REJECTS
from streamdi.batchlog import BatchLog
from streamdi.collector import collect
from streamdi.context import JobContext
from streamdi.lake import Lake
from streamdi.run.pipeline import stage_job
from streamdi.settings import Settings

pytestmark = pytest.mark.integration

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def ctx(spark, tmp_path_factory) -> JobContext:
    home = tmp_path_factory.mktemp("stage-home")
    settings = Settings(home=home, spark_master="local[2]")
    return JobContext(settings=settings, spark=spark, lake=Lake(settings.lake_root, spark))


def test_source_for_file_matches_declared_patterns():
    assert source_for_file("Batch1/TaxRate.txt") is src.TAX_RATE
    assert source_for_file("TradeType_batch1_0001.txt") is src.TRADE_TYPE
    assert source_for_file("Batch1/Customer.xml") is None


def test_stage_job_loads_good_lines_and_rejects_bad_ones(ctx: JobContext):
    landing = ctx.settings.landing_dir
    write_landing_file(
        landing / "Batch1" / "TaxRate.txt",
        [
            source_line(src.TAX_RATE, tx_id="US1", tx_rate="0.15000"),
            "US2|wrong field count",
            source_line(src.TAX_RATE, tx_id="US3", tx_rate="not-a-number"),
            source_line(src.TAX_RATE, tx_id="US4", tx_rate="0.30500"),
        ],
    )
    write_landing_file(
        landing / "Batch1" / "Date.txt",
        [
            source_line(src.DATE_FILE),
            source_line(src.DATE_FILE, sk_dateid="20170705", datevalue="2017-07-32"),
        ],
    )
    write_landing_file(landing / "Batch1" / "Unknown.dat", ["what is this"])
    write_landing_file(landing / "Batch1" / "TaxRate_audit.csv", ["DataSet, BatchID ,Date , Attribute , Value, DValue"])
    batch_log = BatchLog(ctx.lake)
    batch_id = collect(batch_log, landing, now=NOW).batch_id
    assert batch_id == 1

    detail = stage_job(ctx, batch_id)

    assert detail == {
        "read": 6,
        "staged": 3,
        "rejected": 3,
        "quarantined": 0,
        "held": 0,
        "checks": {"passed": 1},  # expectations/staging/taxrate.yml (Date.txt has no suite)
        "audit_files": 1,
        "unknown_files": ["Batch1/Unknown.dat"],
        "duplicates": {},
    }
    taxes = ctx.lake.read_arrow(src.TAX_RATE.staging).to_pylist()
    assert [
        (r["tx_id"], r["tx_rate"], r["batch_id"], r["source_batch"], r["source_file"], r["line_no"]) for r in taxes
    ] == [
        ("US1", Decimal("0.15000"), 1, 1, "Batch1/TaxRate.txt", 1),
        ("US4", Decimal("0.30500"), 1, 1, "Batch1/TaxRate.txt", 4),
    ]
    rejects = sorted(
        (r["source"], r["source_file"], r["line_no"], r["reason"]) for r in ctx.lake.read_arrow(REJECTS).to_pylist()
    )
    assert rejects == [
        ("Date", "Batch1/Date.txt", 2, "datevalue: '2017-07-32' is not a valid date"),
        ("TaxRate", "Batch1/TaxRate.txt", 2, "expected 3 fields, found 2"),
        ("TaxRate", "Batch1/TaxRate.txt", 3, "tx_rate: 'not-a-number' is not a valid decimal(6,5)"),
    ]
    # read = staged + rejected, per file, counted from the tables themselves
    for name, source, lines in (
        ("Batch1/TaxRate.txt", src.TAX_RATE, 4),
        ("Batch1/Date.txt", src.DATE_FILE, 2),
    ):
        staged = sum(1 for r in ctx.lake.read_arrow(source.staging).to_pylist() if r["source_file"] == name)
        rejected = sum(1 for r in ctx.lake.read_arrow(REJECTS).to_pylist() if r["source_file"] == name)
        assert staged + rejected == lines

    # the stage is recorded once; running it again commits nothing new
    assert batch_log.is_done(batch_id, "stage")
    stage_job(ctx, batch_id)
    assert len(ctx.lake.read_arrow(src.TAX_RATE.staging)) == 2
    assert len(ctx.lake.read_arrow(REJECTS)) == 3


def test_a_line_that_is_not_utf8_is_rejected_with_its_reason_and_the_other_lines_staged(spark, tmp_path):
    """Bytes are never replaced: a delimited line and a FINWIRE line with an invalid byte go to the rejects, named by
    the byte, with the bytes shown as `\\xNN`; the file's other lines are staged; read = staged + rejected."""
    settings = Settings(home=tmp_path, spark_master="local[2]")
    own = JobContext(settings=settings, spark=spark, lake=Lake(settings.lake_root, spark))
    landing = settings.landing_dir
    good = [source_line(src.TAX_RATE, tx_id="US1", tx_rate="0.15000"), source_line(src.TAX_RATE, tx_id="US3")]
    taxes = "\r\n".join(good).encode()
    deliver(landing, "Batch1/TaxRate.txt", taxes.replace(b"\r\n", b"\r\nUS2|Caf\xe9 tax|0.10000\r\n") + b"\r\n", NOW)
    deliver(landing, "Batch1/FINWIRE1967Q1", b"19670101-000000CMP\xff\xfe\r\n", NOW)
    batch_id = collect(BatchLog(own.lake), landing, now=NOW).batch_id

    detail = stage_job(own, batch_id)

    assert (detail["read"], detail["staged"], detail["rejected"]) == (4, 2, 2)
    assert sorted(r["tx_id"] for r in own.lake.read_arrow(src.TAX_RATE.staging).to_pylist()) == ["US1", "US3"]
    rejects = [
        (r["source"], r["source_file"], r["line_no"], r["line"], r["reason"])
        for r in own.lake.read_arrow(REJECTS).to_pylist()
    ]
    assert sorted(rejects) == [
        ("FINWIRE", "Batch1/FINWIRE1967Q1", 1, "19670101-000000CMP\\xff\\xfe",
         "not valid UTF-8: byte 0xff at byte 19 of the line"),
        ("TaxRate", "Batch1/TaxRate.txt", 2, "US2|Caf\\xe9 tax|0.10000",
         "not valid UTF-8: byte 0xe9 at byte 8 of the line"),
    ]  # fmt: skip


def test_a_file_that_repeats_an_earlier_file_of_its_tpcdi_batch_is_not_staged(ctx: JobContext):
    """Continues the test above (Batch1/TaxRate.txt is staged in micro-batch 1). A piece with the same bytes in TPC-DI
    batch 1 (a producer's retry) is a duplicate; a second copy of Batch2/BatchDate.txt in the same micro-batch is a
    duplicate of the first to arrive; the same bytes as Batch3/BatchDate.txt belong to another TPC-DI batch and are
    staged."""
    landing = ctx.settings.landing_dir
    taxes = (landing / "Batch1" / "TaxRate.txt").read_bytes()
    day = b"2017-07-08\r\n"
    for n, (relative, content) in enumerate(
        (
            ("TaxRate_batch1_0001.txt", taxes),
            ("Batch2/BatchDate.txt", day),
            ("BatchDate_batch2_0002.txt", day),
            ("Batch3/BatchDate.txt", day),
        )
    ):
        deliver(landing, relative, content, NOW + dt.timedelta(seconds=n))
    batch_log = BatchLog(ctx.lake)
    assert collect(batch_log, landing, now=NOW).batch_ids == [2, 3, 4]

    again = stage_job(ctx, 2)
    assert (again["read"], again["staged"], again["rejected"]) == (0, 0, 0)
    assert again["duplicates"] == {"TaxRate_batch1_0001.txt": "Batch1/TaxRate.txt"}
    assert again["unknown_files"] == []
    batch2 = stage_job(ctx, 3)
    assert (batch2["read"], batch2["staged"], batch2["rejected"]) == (1, 1, 0)
    assert batch2["duplicates"] == {"BatchDate_batch2_0002.txt": "Batch2/BatchDate.txt"}
    batch3 = stage_job(ctx, 4)
    assert (batch3["read"], batch3["staged"], batch3["duplicates"]) == (1, 1, {})
    assert len(ctx.lake.read_arrow(src.TAX_RATE.staging)) == 2
    dates = ctx.lake.read_arrow(src.BATCH_DATE.staging).to_pylist()
    assert sorted((r["batch_id"], r["source_file"]) for r in dates) == [
        (3, "Batch2/BatchDate.txt"),
        (4, "Batch3/BatchDate.txt"),
    ]


def account_lines(*dsns: int) -> bytes:
    return b"".join(f"I|{dsn}|{100 + dsn}|1|7|account {dsn}|1|ACTV\r\n".encode() for dsn in dsns)


def checks_of(ctx: JobContext, batch_id: int) -> dict[str, tuple[str, int, list]]:
    from schemas.quality import QUALITY_RESULTS

    return {
        r["check_id"]: (r["action"], r["unexpected_count"], json.loads(r["detail"]).get("failing_values"))
        for r in ctx.lake.read_arrow(QUALITY_RESULTS).to_pylist()
        if r["batch_id"] == batch_id and r["table_name"] == "staging.account"
    }


def test_parts_are_checked_against_the_declared_order(ctx: JobContext):
    """Continues the tests above. Account.txt is totally ordered by CDC_DSN (schemas/ordering.py): part 0001 arriving
    before 0000 is staged with a warning (its predecessor is missing); 0000 arriving later, its keys below 0001's,
    is fine; part 0002 whose first key is not above 0001's last halts the batch, says where, and is held back."""
    landing = ctx.settings.landing_dir
    batch_log = BatchLog(ctx.lake)
    micro = []
    for n, (name, dsns) in enumerate(
        (
            ("Account_batch2_0001.txt", (20, 21)),
            ("Account_batch2_0000.txt", (10, 11)),
            ("Account_batch2_0002.txt", (15,)),
        )
    ):
        deliver(landing, name, account_lines(*dsns), NOW + dt.timedelta(minutes=1, seconds=n))
        micro.append(collect(batch_log, landing, now=NOW).batch_id)
        micro.append(stage_job(ctx, micro[-1]))
    (first, early), (second, late), (third, bad) = micro[0:2], micro[2:4], micro[4:6]
    assert early["staged"] == 2 and "halted" not in early
    assert checks_of(ctx, first) == {
        "declared_order": ("passed", 0, None),
        "predecessor_present": ("warned", 1, ["Account_batch2_0001.txt (missing account_batch2_0000)"]),
        **{k: v for k, v in checks_of(ctx, first).items() if k not in ("declared_order", "predecessor_present")},
    }
    assert late["staged"] == 2 and "halted" not in late
    assert checks_of(ctx, second)["declared_order"] == ("passed", 0, None)
    assert checks_of(ctx, second)["predecessor_present"] == ("passed", 0, None)
    assert bad["staged"] == 0 and bad["held"] == 1
    assert bad["halted"] == (
        "staging.account: check declared_order (streamdi_ordering_contract) failed on 1 of 1 rows: "
        "Account_batch2_0002.txt line 1: 15 is not above 21 (Account_batch2_0001.txt line 2)"
    )
    assert checks_of(ctx, third)["declared_order"][0] == "halted"
    staged = ctx.lake.read_arrow(src.ACCOUNT.staging).to_pylist()
    assert sorted((r["source_file"], r["cdc_dsn"]) for r in staged) == [
        ("Account_batch2_0000.txt", 10),
        ("Account_batch2_0000.txt", 11),
        ("Account_batch2_0001.txt", 20),
        ("Account_batch2_0001.txt", 21),
    ]


OFFICIAL_BATCH1 = SHARED_SAMPLE / "Batch1"
# line counts of the official generator's files in ../shared/tpcdi-sample (Date and Time are cut to 300 lines)
OFFICIAL_LINES = {
    "StatusType.txt": 6,
    "TradeType.txt": 5,
    "Industry.txt": 102,
    "TaxRate.txt": 320,
    "Date.txt": 300,
    "Time.txt": 300,
    "BatchDate.txt": 1,
}


@pytest.mark.skipif(not OFFICIAL_BATCH1.exists(), reason="../shared/tpcdi-sample is not beside the checkout")
@pytest.mark.parametrize("name", sorted(OFFICIAL_LINES))
def test_official_reference_files_parse_without_a_single_reject(name: str):
    source = source_for_file(name)
    staged, rejected = parse_delimited(numbered_lines(str(OFFICIAL_BATCH1 / name))[0], source)
    assert rejected.to_pylist() == []
    assert staged.num_rows == OFFICIAL_LINES[name]


@pytest.mark.skipif(not OFFICIAL_BATCH1.exists(), reason="../shared/tpcdi-sample is not beside the checkout")
def test_official_values_keep_their_exact_text():
    rows, _ = parse_delimited(numbered_lines(str(OFFICIAL_BATCH1 / "TaxRate.txt"))[0], src.TAX_RATE)
    first = rows.to_pylist()[0]
    assert (first["line_no"], first["tx_id"], first["tx_name"], str(first["tx_rate"])) == (
        1,
        "US1",
        "U.S. Income Tax Bracket for the poor",
        "0.15000",
    )
    rows, _ = parse_delimited(numbered_lines(str(OFFICIAL_BATCH1 / "BatchDate.txt"))[0], src.BATCH_DATE)
    assert rows["batchdate"].to_pylist() == [dt.date(2017, 7, 7)]
