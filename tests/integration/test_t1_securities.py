"""T1 (jobs.create_securities): DimCompany, DimSecurity, Financial and their alerts from hand-written FINWIRE records.

Every expected row is written out by hand from the rules in the module docstring (TPC-DI 1.1.0, 4.5.3, 4.5.7,
4.5.8). Surrogate keys follow the declared rules, restated here (`sk`: `CIK * 100000 + days since 1900-01-01`;
`sec_key`: the framework's 63-bit hash of ("dimsecurity", symbol, day)), not taken from jobs.securities.

The scenario: two FINWIRE files of TPC-DI batch 1 (BatchDate 2017-07-07).
- Acme Corp (CIK 1): two records on 1967-01-05 (the later PTS wins although its line comes first), then a new
  CEO and industry on 1967-04-10; its security ACME refers to it by CIK, so the company change on 04-10 starts a
  new ACME version with the new sk_companyid.
- Beta Inc (CIK 2): an invalid S&P rating (alert, NULL rating), renamed "Beta Holdings" and made inactive on
  05-20; its security BETA refers to it by name ("Beta Inc", then "Beta Holdings").
- CIK 3's only record has an unknown status code; GHOST refers to an unknown CIK; a FIN record names
  "Beta Holdings" before the rename: all three are left out with an alert.
- Financial: (CIK 1, 1967 Q1) filed twice (by CIK, then by name: the later one wins, resolved to the company
  version valid at its posting date); a 1966 Q4 record before the CEO change keeps the first version.
It is loaded as one micro-batch, and again as two with the later quarter's file first.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from jobs import create_securities
from jobs.companies import company_of_key, company_references, resolve_company
from jobs.scope import BatchScope
from schemas import warehouse as wh
from schemas.staging import FINWIRE_TABLES
from streamdi.context import JobContext
from streamdi.lake import Lake
from streamdi.settings import Settings

pytestmark = pytest.mark.integration

D = dt.date
UTC = dt.UTC
OPEN = D(9999, 12, 31)
BATCH_DATE = dt.datetime(2017, 7, 7, tzinfo=UTC)
Q1, Q2 = "Batch1/FINWIRE1967Q1", "Batch1/FINWIRE1967Q2"
REFERENCE_FILES = ["Batch1/StatusType.txt", "Batch1/Industry.txt"]
TABLES = (wh.DIM_COMPANY, wh.DIM_SECURITY, wh.FINANCIAL, wh.DI_MESSAGES)


def sk(cik: int, day: D) -> int:
    """The declared DimCompany surrogate key rule, restated for the expectations."""
    return cik * 100_000 + (day - D(1900, 1, 1)).days


def ts(day: str, hms: str = "12:00:00") -> dt.datetime:
    return dt.datetime.fromisoformat(f"{day}T{hms}").replace(tzinfo=UTC)


# ----------------------------------------------------------------------------------------------- builders
def _lineage(file: str, line: int) -> dict:
    return dict(source_batch=1, source_file=file, line_no=line)


def cmp(file: str, line: int, pts: dt.datetime, cik: int, name: str, **fields) -> dict:
    row = dict(
        pts=pts,
        rec_type="CMP",
        company_name=name,
        cik=f"{cik:010d}",
        status="ACTV",
        industry_id="AM",
        sp_rating="AA-",
        founding_date=D(1900, 1, 2),
        addr_line1="1 Main St",
        addr_line2=None,
        postal_code="10001",
        city="Springfield",
        state_province="NY",
        country="USA",
        ceo_name="Ann Lee",
        description="Rockets",
    )
    return {**row, **fields, **_lineage(file, line)}


def _reference(ref: str) -> dict:
    """The last field of SEC/FIN as the parser stages it: a 10-digit CIK (short line) or a name (full line)."""
    is_cik = ref.isdigit() and len(ref) == 10
    return dict(co_name_or_cik=ref, cik=ref if is_cik else None, company_name=None if is_cik else ref)


def sec(file: str, line: int, pts: dt.datetime, symbol: str, ref: str, **fields) -> dict:
    row = dict(
        pts=pts,
        rec_type="SEC",
        symbol=symbol,
        issue_type="COMMON",
        status="ACTV",
        name="Acme common",
        ex_id="NYSE",
        sh_out=1000,
        first_trade_date=D(1960, 1, 4),
        first_trade_exchg=D(1960, 2, 1),
        dividend=Decimal("1.50"),
    )
    return {**row, **fields, **_reference(ref), **_lineage(file, line)}


def fin(file: str, line: int, pts: dt.datetime, year: int, qtr: int, ref: str, revenue: str) -> dict:
    row = dict(
        pts=pts,
        rec_type="FIN",
        year=year,
        quarter=qtr,
        qtr_start_date=D(year, 3 * qtr - 2, 1),
        posting_date=pts.date(),
        revenue=Decimal(revenue),
        earnings=Decimal("10.00"),
        eps=Decimal("1.00"),
        diluted_eps=Decimal("0.90"),
        margin=Decimal("0.10"),
        inventory=Decimal("5.00"),
        assets=Decimal("1000.00"),
        liabilities=Decimal("400.00"),
        sh_out=100,
        diluted_sh_out=110,
    )
    return {**row, **_reference(ref), **_lineage(file, line)}


CMP_ROWS = [
    cmp(Q1, 1, ts("1967-01-05", "10:00:00"), 1, "Acme Corp"),
    cmp(Q1, 2, ts("1967-01-05", "09:00:00"), 1, "Acme Corp", ceo_name="Zed Early"),  # same day, earlier PTS
    cmp(Q1, 3, ts("1967-02-01"), 2, "Beta Inc", sp_rating="XX+", ceo_name="Cy Young"),
    cmp(Q2, 1, ts("1967-04-10", "08:00:00"), 1, "Acme Corp", industry_id="BK", sp_rating="BB", ceo_name="Bob Ray"),
    cmp(Q2, 2, ts("1967-05-20"), 2, "Beta Holdings", status="INAC", sp_rating="BBB", ceo_name="Cy Young"),
    cmp(Q2, 9, ts("1967-05-21"), 3, "Gamma", status="XXXX"),
]
SEC_ROWS = [
    sec(Q1, 4, ts("1967-02-15", "09:00:00"), "ACME", "0000000001"),
    sec(Q1, 5, ts("1967-03-01"), "BETA", "Beta Inc", **{"issue_type": "PREF_A", "name": "Beta pref"},
        ex_id="NASDAQ", sh_out=500, dividend=Decimal("0.75")),
    sec(Q2, 3, ts("1967-06-01"), "BETA", "Beta Holdings", **{"issue_type": "PREF_A", "name": "Beta pref"},
        ex_id="NASDAQ", sh_out=500, dividend=Decimal("0.80")),
    sec(Q2, 4, ts("1967-06-15"), "GHOST", "0000000009"),
]  # fmt: skip
FIN_ROWS = [
    fin(Q1, 7, ts("1967-03-10"), 1966, 4, "0000000001", "90.00"),
    fin(Q2, 5, ts("1967-04-05", "10:00:00"), 1967, 1, "0000000001", "100.00"),
    fin(Q2, 6, ts("1967-04-20", "10:00:00"), 1967, 1, "Acme Corp", "110.00"),
    fin(Q2, 7, ts("1967-05-25"), 1967, 1, "Beta Holdings", "300.00"),
    fin(Q2, 8, ts("1967-05-01"), 1967, 1, "Beta Holdings", "200.00"),  # before the rename: unknown
]


# ----------------------------------------------------------------------------------------------- expectations
def company(cik: int, eff: D, end: D, **values) -> dict:
    row = dict(
        sk_companyid=sk(cik, eff),
        companyid=cik,
        status="Active",
        name="Acme Corp",
        industry="Aerospace & Defense",
        sprating="AA-",
        islowgrade=False,
        ceo="Ann Lee",
        addressline1="1 Main St",
        addressline2=None,
        postalcode="10001",
        city="Springfield",
        stateprov="NY",
        country="USA",
        description="Rockets",
        foundingdate=D(1900, 1, 2),
        iscurrent=end == OPEN,
        batchid=1,
        effectivedate=eff,
        enddate=end,
    )
    return {**row, **values}


EXPECTED_COMPANIES = [
    company(1, D(1967, 1, 5), D(1967, 4, 10)),
    company(1, D(1967, 4, 10), OPEN, industry="Banking", sprating="BB", islowgrade=True, ceo="Bob Ray"),
    company(2, D(1967, 2, 1), D(1967, 5, 20), name="Beta Inc", sprating=None, islowgrade=None, ceo="Cy Young"),
    company(2, D(1967, 5, 20), OPEN, name="Beta Holdings", status="Inactive", sprating="BBB", ceo="Cy Young"),
]


def security(symbol: str, eff: D, end: D, company_key: int, **values) -> dict:
    row = dict(
        symbol=symbol,
        issue="COMMON",
        status="Active",
        name="Acme common",
        exchangeid="NYSE",
        sk_companyid=company_key,
        sharesoutstanding=1000,
        firsttrade=D(1960, 1, 4),
        firsttradeonexchange=D(1960, 2, 1),
        dividend=Decimal("1.50"),
        iscurrent=end == OPEN,
        batchid=1,
        effectivedate=eff,
        enddate=end,
    )
    return {**row, **values}


BETA = dict(issue="PREF_A", name="Beta pref", exchangeid="NASDAQ", sharesoutstanding=500)
EXPECTED_SECURITIES = [
    security("ACME", D(1967, 2, 15), D(1967, 4, 10), sk(1, D(1967, 1, 5))),
    security("ACME", D(1967, 4, 10), OPEN, sk(1, D(1967, 4, 10))),  # forced by Acme's new version
    security("BETA", D(1967, 3, 1), D(1967, 5, 20), sk(2, D(1967, 2, 1)), dividend=Decimal("0.75"), **BETA),
    security("BETA", D(1967, 5, 20), D(1967, 6, 1), sk(2, D(1967, 5, 20)), dividend=Decimal("0.75"), **BETA),
    security("BETA", D(1967, 6, 1), OPEN, sk(2, D(1967, 5, 20)), dividend=Decimal("0.80"), **BETA),
]


def financial(company_key: int, year: int, qtr: int, revenue: str) -> dict:
    return dict(
        sk_companyid=company_key,
        fi_year=year,
        fi_qtr=qtr,
        fi_qtr_start_date=D(year, 3 * qtr - 2, 1),
        fi_revenue=Decimal(revenue),
        fi_net_earn=Decimal("10.00"),
        fi_basic_eps=Decimal("1.00"),
        fi_dilut_eps=Decimal("0.90"),
        fi_margin=Decimal("0.10"),
        fi_inventory=Decimal("5.00"),
        fi_assets=Decimal("1000.00"),
        fi_liability=Decimal("400.00"),
        fi_out_basic=100,
        fi_out_dilut=110,
    )


EXPECTED_FINANCIALS = [
    financial(sk(1, D(1967, 1, 5)), 1966, 4, "90.00"),
    financial(sk(1, D(1967, 4, 10)), 1967, 1, "110.00"),  # the later filing, under the version valid then
    financial(sk(2, D(1967, 5, 20)), 1967, 1, "300.00"),
]


def alert(source: str, text: str, key: str, data: str) -> dict:
    return dict(
        messagedateandtime=BATCH_DATE,
        batchid=1,
        messagesource=source,
        messagetext=text,
        messagetype="Alert",
        messagedata=data,
        messagekey=key,
    )


EXPECTED_MESSAGES = [
    alert("DimCompany", "Invalid SPRating", f"{Q1}:3", "CO_ID = 2, CO_SP_RATE = XX+"),
    alert("DimCompany", "Unknown status type", f"{Q2}:9", "CO_ID = 3, ST_ID = XXXX"),
    alert("DimSecurity", "Unknown company", f"{Q2}:4", "S_SYMB = GHOST, CO_NAME_OR_CIK = 0000000009, DAY = 1967-06-15"),
    alert(
        "Financial",
        "Unknown company",
        f"{Q2}:8",
        "FI_YEAR = 1967, FI_QTR = 1, CO_NAME_OR_CIK = Beta Holdings, DAY = 1967-05-01",
    ),
]


# ----------------------------------------------------------------------------------------------- harness
def _context(spark, tmp_path) -> JobContext:
    settings = Settings(home=tmp_path, spark_master="local[2]")
    ctx = JobContext(settings=settings, spark=spark, lake=Lake(tmp_path / "lake", spark))
    ctx.lake.append(
        wh.STATUS_TYPE,
        pa.Table.from_pylist(
            [dict(st_id="ACTV", st_name="Active"), dict(st_id="INAC", st_name="Inactive")],
            schema=wh.STATUS_TYPE.arrow_schema(),
        ),
        app_id="test",
        version=0,
    )
    industries = [
        dict(in_id="AM", in_name="Aerospace & Defense", in_sc_id="CG"),
        dict(in_id="BK", in_name="Banking", in_sc_id="FN"),
    ]
    ctx.lake.append(
        wh.INDUSTRY, pa.Table.from_pylist(industries, schema=wh.INDUSTRY.arrow_schema()), app_id="test", version=0
    )
    return ctx


def _stage(ctx: JobContext, batch_id: int, files: list[str], fin_rows: list[dict] = FIN_ROWS) -> BatchScope:
    """Stage the scenario's records of `files` (its FIN records `fin_rows`) as micro-batch `batch_id`; its scope
    (with the reference files when it is the first micro-batch)."""
    for code, rows in (("CMP", CMP_ROWS), ("SEC", SEC_ROWS), ("FIN", fin_rows)):
        table = FINWIRE_TABLES[code]
        mine = [{**r, "batch_id": batch_id} for r in rows if r["source_file"] in files]
        ctx.lake.append(table, pa.Table.from_pylist(mine, schema=table.arrow_schema()), app_id="test", version=batch_id)
    landed = files + (REFERENCE_FILES if batch_id == 1 else [])
    return BatchScope(
        batch_id=batch_id,
        source_batches=(1,),
        batch_dates={1: BATCH_DATE.date()},
        file_seq={f: i for i, f in enumerate(landed)},
    )


def _rows(ctx: JobContext, table) -> list[dict]:
    return ctx.lake.read_arrow(table).to_pylist()


def _without_key(rows: list[dict], key: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k != key} for r in rows]


def securities_ref(ref: str) -> str:
    """The reference key of a company reference as the module documents it: `C<CIK>` or `N<name>`."""
    return f"C{int(ref)}" if ref.isdigit() and len(ref) == 10 else f"N{ref}"


def sec_key(spark, symbol: str, day: D) -> int:
    """The declared DimSecurity key rule on literals, computed by Spark itself: `xxhash64("dimsecurity", symbol,
    day)` with the sign bit cleared."""
    df = spark.createDataFrame([(symbol, day)], "symbol string, day date")
    hashed = F.xxhash64(F.lit("dimsecurity"), F.col("symbol"), F.col("day")).bitwiseAND(F.lit(0x7FFFFFFFFFFFFFFF))
    return df.select(hashed).first()[0]


def _tables(ctx: JobContext) -> dict[str, list[dict]]:
    return {t.name: _rows(ctx, t) for t in TABLES}


@pytest.fixture(scope="module")
def loaded(spark, tmp_path_factory):
    """The scenario loaded as one micro-batch (both files and the reference files)."""
    ctx = _context(spark, tmp_path_factory.mktemp("t1_single"))
    scope = _stage(ctx, 1, [Q1, Q2])
    written = create_securities.run(ctx, scope)
    return ctx, scope, written


# ----------------------------------------------------------------------------------------------- tests
def test_company_versions_one_per_day_later_pts_wins(loaded):
    ctx, _, written = loaded
    assert _rows(ctx, wh.DIM_COMPANY) == EXPECTED_COMPANIES
    assert written == {"dimcompany": 4, "dimsecurity": 5, "financial": 3, "dimessages": 4}


def test_company_change_starts_security_version_by_cik_and_by_name(loaded, spark):
    ctx, _, _ = loaded
    rows = _rows(ctx, wh.DIM_SECURITY)
    assert _without_key(rows, "sk_securityid") == EXPECTED_SECURITIES
    assert [r["sk_securityid"] for r in rows] == [
        sec_key(spark, r["symbol"], r["effectivedate"]) for r in EXPECTED_SECURITIES
    ]


def test_financial_resolved_to_version_valid_at_posting_last_filing_wins(loaded):
    ctx, _, _ = loaded
    assert _rows(ctx, wh.FINANCIAL) == EXPECTED_FINANCIALS


def test_alerts_invalid_rating_unknown_status_unknown_company(loaded):
    ctx, _, _ = loaded
    assert _rows(ctx, wh.DI_MESSAGES) == EXPECTED_MESSAGES


def test_rerun_of_committed_micro_batch_changes_nothing(loaded):
    ctx, scope, _ = loaded
    versions = {t.name: ctx.lake.version(t) for t in TABLES}
    assert create_securities.run(ctx, scope) == {}
    assert {t.name: ctx.lake.version(t) for t in TABLES} == versions


def test_micro_batch_without_finwire_does_nothing(loaded):
    ctx, _, _ = loaded
    versions = {t.name: ctx.lake.version(t) for t in TABLES}
    scope = BatchScope(batch_id=2, source_batches=(2,), batch_dates={1: BATCH_DATE.date()}, file_seq={"x/Trade.txt": 0})
    assert create_securities.run(ctx, scope) == {}
    assert {t.name: ctx.lake.version(t) for t in TABLES} == versions


def test_later_quarter_first_over_two_micro_batches_gives_same_tables(spark, tmp_path, loaded):
    ctx = _context(spark, tmp_path)
    first = create_securities.run(ctx, _stage(ctx, 1, [Q2]))
    assert first == {"dimcompany": 2, "dimsecurity": 1, "financial": 2, "dimessages": 4}
    # Acme's first version is not known yet: its 1967-04-05 filing waits with an alert, the 04-20 one (by name)
    # resolves; BETA's later record resolves to the company under its new name.
    assert _rows(ctx, wh.FINANCIAL) == [
        financial(sk(1, D(1967, 4, 10)), 1967, 1, "110.00"),
        financial(sk(2, D(1967, 5, 20)), 1967, 1, "300.00"),
    ]
    assert _without_key(_rows(ctx, wh.DIM_SECURITY), "sk_securityid") == [
        security("BETA", D(1967, 6, 1), OPEN, sk(2, D(1967, 5, 20)), dividend=Decimal("0.80"), **BETA)
    ]
    assert [(m["messagesource"], m["messagekey"]) for m in _rows(ctx, wh.DI_MESSAGES)] == [
        ("DimCompany", f"{Q2}:9"),
        ("DimSecurity", f"{Q2}:4"),
        ("Financial", f"{Q2}:5"),
        ("Financial", f"{Q2}:8"),
    ]
    second = create_securities.run(ctx, _stage(ctx, 2, [Q1]))
    assert set(second) == {"dimcompany", "dimsecurity", "financial", "dimessages"}
    # the earlier quarter completes every history and withdraws the alert of the filing it resolves
    assert _tables(ctx) == _tables(loaded[0])


def test_fin_records_one_at_a_time_and_a_file_delivered_again(spark, tmp_path, monkeypatch, loaded):
    """FIN records read and built in pieces of one record give the tables of one piece; a file delivered again
    in a later micro-batch replaces its earlier lines, read in pieces too."""
    monkeypatch.setattr(create_securities, "PIECE_RECORDS", 1)
    ctx = _context(spark, tmp_path)
    create_securities.run(ctx, _stage(ctx, 1, [Q2]))
    create_securities.run(ctx, _stage(ctx, 2, [Q1]))
    assert _tables(ctx) == _tables(loaded[0])
    # Q2 again, with Acme's filing for 1967 Q1 by name (line 6) revised: it replaces the first delivery's
    revised = [
        {**r, "revenue": Decimal("111.00")} if (r["source_file"], r["line_no"]) == (Q2, 6) else r for r in FIN_ROWS
    ]
    written = create_securities.run(ctx, _stage(ctx, 3, [Q2], revised))
    assert written["financial"] == 3
    assert sorted(_rows(ctx, wh.FINANCIAL), key=lambda r: (r["sk_companyid"], r["fi_year"])) == [
        financial(sk(1, D(1967, 1, 5)), 1966, 4, "90.00"),
        financial(sk(1, D(1967, 4, 10)), 1967, 1, "111.00"),
        financial(sk(2, D(1967, 5, 20)), 1967, 1, "300.00"),
    ]
    assert _rows(ctx, wh.DI_MESSAGES) == _rows(loaded[0], wh.DI_MESSAGES)


def test_unit_company_key_inverse_and_arrived_sources():
    assert company_of_key(pa.array([sk(1234567890, D(1967, 4, 10)), sk(7, D(1900, 1, 1))])).to_pylist() == [
        1234567890,
        7,
    ]
    assert create_securities.arrived_sources(["Batch1/FINWIRE1967Q1", "Batch1/FINWIRE1967Q1_audit.csv"]) == {"FINWIRE"}
    assert create_securities.arrived_sources(["Batch1/Industry.txt", "Batch2/Trade.txt"]) == {"Industry"}
    assert create_securities.arrived_sources(["Batch1/Trade.txt"]) == set()


def test_unit_reference_resolves_to_version_valid_that_day():
    versions = [  # companyid, name, effectivedate, enddate
        (5, "Dup", D(1970, 1, 1), OPEN),
        (4, "Dup", D(1970, 6, 1), OPEN),
        (6, "Solo", D(1970, 1, 1), D(1970, 3, 1)),
        (6, "Solo2", D(1970, 3, 1), OPEN),
    ]
    companies = pa.Table.from_pylist(
        [dict(companyid=c, sk_companyid=sk(c, e), name=n, effectivedate=e, enddate=end) for c, n, e, end in versions]
    )
    records = pa.Table.from_pylist(
        [
            dict(line_no=line, _ref=ref, _pdate=day)
            for line, ref, day in [
                (1, securities_ref("Dup"), D(1970, 2, 1)),  # only CIK 5 bears the name then
                (2, securities_ref("Dup"), D(1970, 7, 1)),  # both do: the smallest CIK
                (3, securities_ref("Solo"), D(1970, 4, 1)),  # renamed by then
                (4, securities_ref("0000000006"), D(1969, 12, 31)),  # before the company's first version
                (5, securities_ref("0000000006"), D(1970, 3, 1)),
            ]
        ]
    )
    companyid, sk_companyid = resolve_company(records, company_references(companies))
    got = list(zip(records["line_no"].to_pylist(), companyid.to_pylist(), sk_companyid.to_pylist(), strict=True))
    assert got == [
        (1, 5, sk(5, D(1970, 1, 1))),
        (2, 4, sk(4, D(1970, 6, 1))),
        (3, None, None),
        (4, None, None),
        (5, 6, sk(6, D(1970, 3, 1))),
    ]
