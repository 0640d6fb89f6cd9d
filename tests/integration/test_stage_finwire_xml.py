"""Staging of the two non-delimited Batch1 sources: FINWIRE fixed-width records and CustomerMgmt.xml actions.

Expected counts are taken independently of the parser: record types by plain slicing of the raw lines, action
types by a regular expression over the XML text, and literal values read off the official sample by eye.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from collections import Counter
from decimal import Decimal
from pathlib import Path
from xml.etree import ElementTree

import pyarrow as pa
import pytest
from builders import SHARED_SAMPLE, write_landing_file

from jobs.customer_mgmt import read_actions
from jobs.finwire import parse_finwire
from jobs.landing import nondelimited_source_for_file, numbered_lines, source_for_file
from schemas.quality import QUALITY_RESULTS
from schemas.staging import CUSTOMER_MGMT, FINWIRE_TABLES, REJECTS
from streamdi.batchlog import BatchLog
from streamdi.collector import collect
from streamdi.context import JobContext
from streamdi.generator import generate
from streamdi.generator.params import Params
from streamdi.lake import Lake
from streamdi.run.pipeline import stage_job
from streamdi.settings import Settings

pytestmark = pytest.mark.integration

OFFICIAL = SHARED_SAMPLE / "Batch1"
needs_sample = pytest.mark.skipif(not OFFICIAL.exists(), reason="../shared/tpcdi-sample is not beside the checkout")
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
UTC = dt.UTC


def _context(spark, tmp_path_factory, name: str) -> JobContext:
    settings = Settings(home=tmp_path_factory.mktemp(name), spark_master="local[2]")
    return JobContext(settings=settings, spark=spark, lake=Lake(settings.lake_root, spark))


def _record_types(path: Path) -> Counter:
    """Record types of a FINWIRE file by plain slicing (characters 16-18 of each CRLF-terminated line)."""
    lines = path.read_bytes().decode().split("\r\n")
    assert lines[-1] == ""
    return Counter(line[15:18] for line in lines[:-1])


def _action_types(path: Path) -> Counter:
    return Counter(re.findall(r'<TPCDI:Action ActionType="([A-Z]+)"', path.read_text()))


def _rows(ctx: JobContext, table, **where) -> list[dict]:
    return [r for r in ctx.lake.read_arrow(table).to_pylist() if all(r[k] == v for k, v in where.items())]


# ----------------------------------------------------------------------------------------------- FINWIRE
@needs_sample
@pytest.mark.parametrize(
    ("name", "expected"),
    [("FINWIRE1967Q1", {"CMP": 86}), ("FINWIRE2000Q1", {"CMP": 7, "SEC": 11, "FIN": 610})],
)
def test_official_finwire_file_stages_every_record(name: str, expected: dict[str, int]):
    assert _record_types(OFFICIAL / name) == Counter(expected)
    staged, rejected = parse_finwire(numbered_lines(str(OFFICIAL / name))[0])
    assert rejected.to_pylist() == []
    assert {code: rows.num_rows for code, rows in staged.items()} == {"CMP": 0, "SEC": 0, "FIN": 0} | expected


def _line(rows, line_no: int, columns: list[str] | None = None) -> dict:
    (row,) = [r for r in rows.to_pylist() if r["line_no"] == line_no]
    return row if columns is None else {c: row[c] for c in columns}


@needs_sample
def test_official_finwire_values_are_cut_and_typed():
    staged, _ = parse_finwire(numbered_lines(str(OFFICIAL / "FINWIRE1967Q1"))[0])
    cmp = _line(staged["CMP"], 1)
    assert cmp == {
        "pts": dt.datetime(1967, 1, 1, 15, 48, 42, tzinfo=UTC),
        "rec_type": "CMP",
        "company_name": "kkhSvCsfgbDUvsiZWtPQwjkYPwKrfTUFMGMCWCBXBcOcTkaLSudO",
        "cik": "0000000000",
        "status": "ACTV",
        "industry_id": "DR",
        "sp_rating": "A",
        "founding_date": dt.date(1886, 7, 22),
        "addr_line1": "19918 Rogers North",
        "addr_line2": None,
        "postal_code": "35233",
        "city": "Long Beach",
        "state_province": "NC",
        "country": "United States of America",
        "ceo_name": "Ellebracht",
        # text loses only its right padding: the leading space is part of the official value
        "description": " CUpESkLIQ LBcTnhDEOCLVhfDjOopGKRBxRYGboIrPFcDxMSGkskSwAJdAPWSAPTf T",
        "line_no": 1,
    }

    staged, _ = parse_finwire(numbered_lines(str(OFFICIAL / "FINWIRE2000Q1"))[0])
    sec_cols = ["pts", "symbol", "issue_type", "status", "name", "ex_id", "sh_out", "first_trade_date"]
    sec_cols += ["first_trade_exchg", "dividend", "co_name_or_cik", "cik", "company_name"]
    by_name = _line(staged["SEC"], 612, sec_cols)
    assert tuple(by_name.values()) == (
        dt.datetime(2000, 3, 29, 16, 45, 45, tzinfo=UTC),
        "AAAAAAAAAAAACAJ",
        "COMMON",
        "ACTV",
        "JPVr DFHwpHiPOTUSQbLOgX",
        "PCX",
        272630463,
        dt.date(1922, 8, 23),
        dt.date(1877, 2, 7),
        Decimal("0.55"),
        "tXuUfntJgrxYaMaSjZVXXQIcxTYzWyiecYHvqZzOYqDOHdFPjXGZhQ",
        None,
        "tXuUfntJgrxYaMaSjZVXXQIcxTYzWyiecYHvqZzOYqDOHdFPjXGZhQ",
    )
    by_cik = _line(staged["SEC"], 615, sec_cols)
    assert tuple(by_cik.values()) == (
        dt.datetime(2000, 3, 30, 7, 32, 11, tzinfo=UTC),
        "AAAAAAAAAAAACAK",
        "COMMON",
        "ACTV",
        "GwgIEqATQcFcHRVgsOMSJQwcSmSwhLKoOSVIyVOzTeVfrOAAQrx",
        "PCX",
        765079927,
        dt.date(1982, 7, 1),
        dt.date(1941, 5, 29),
        Decimal("1.23"),
        "0000000492",
        "0000000492",
        None,
    )
    fin = _line(staged["FIN"], 1)
    assert fin == {
        "pts": dt.datetime(2000, 1, 1, 5, 8, 10, tzinfo=UTC),
        "rec_type": "FIN",
        "year": 2000,
        "quarter": 1,
        "qtr_start_date": dt.date(2000, 1, 1),
        "posting_date": dt.date(2000, 1, 1),
        "revenue": Decimal("6292352922.38"),
        "earnings": Decimal("3039537856.76"),
        "eps": Decimal("3.60"),
        "diluted_eps": Decimal("3.54"),
        "margin": Decimal("0.48"),
        "inventory": Decimal("321096697.16"),
        "assets": Decimal("713736468537.19"),
        "liabilities": Decimal("4983996903.02"),
        "sh_out": 844112022,
        "diluted_sh_out": 858941416,
        "co_name_or_cik": "0000000580",
        "cik": "0000000580",
        "company_name": None,
        "line_no": 1,
    }


# Official lines to damage in the bad-line tests (CMP line 1 of 1967Q1, SEC line 615 and FIN line 1 of 2000Q1).
CMP_LINE = (
    "19670101-154842CMPkkhSvCsfgbDUvsiZWtPQwjkYPwKrfTUFMGMCWCBXBcOcTkaLSudO        0000000000ACTVDRA   18860722"
    + "19918 Rogers North".ljust(80)
    + " " * 80
    + "35233".ljust(12)
    + "Long Beach".ljust(25)
    + "NC".ljust(20)
    + "United States of America".ljust(24)
    + "Ellebracht".ljust(46)
    + " CUpESkLIQ LBcTnhDEOCLVhfDjOopGKRBxRYGboIrPFcDxMSGkskSwAJdAPWSAPTf T".ljust(150)
)
SEC_CIK_LINE = (
    "20000330-073211SECAAAAAAAAAAAACAKCOMMONACTVGwgIEqATQcFcHRVgsOMSJQwcSmSwhLKoOSVIyVOzTeVfrOAAQrx"
    "                   PCX   765079927    1982070119410529        1.230000000492"
)
FIN_LINE = (
    "20000101-050810FIN200012000010120000101    6292352922.38    3039537856.76        3.60        3.54"
    "        0.48     321096697.16  713736468537.19    4983996903.02    844112022    8589414160000000580"
)
BAD_FINWIRE = [
    (CMP_LINE, None),
    (CMP_LINE[:15] + "XYZ" + CMP_LINE[18:], "unknown record type 'XYZ' (characters 16-18)"),
    (CMP_LINE[:300], "CMP record: expected 543 characters, found 300"),
    (CMP_LINE[:98] + "18861322" + CMP_LINE[106:], "founding_date: '18861322' is not a valid date"),
    (SEC_CIK_LINE, None),
    (SEC_CIK_LINE[:160] + "00000x0492", "co_name_or_cik: '00000x0492' is not a 10-digit CIK"),
    (SEC_CIK_LINE + "  ", "SEC record: expected 170 or 220 characters, found 172"),
    (FIN_LINE, None),
    (FIN_LINE[:39] + "    62923s2922.38" + FIN_LINE[56:], "revenue: '62923s2922.38' is not a valid decimal(15,2)"),
    ("", "empty line"),
]


def test_damaged_lines_start_from_official_lines():
    """The damaged-line tests start from exact copies of official lines."""
    official = (OFFICIAL / "FINWIRE1967Q1").read_bytes().decode().split("\r\n")[0] if OFFICIAL.exists() else None
    assert official in (None, CMP_LINE)
    assert (len(CMP_LINE), len(SEC_CIK_LINE), len(FIN_LINE)) == (543, 170, 196)


def test_bad_finwire_lines_are_rejected_with_their_reason():
    lines = pa.table(
        {
            "line_no": pa.array(range(1, len(BAD_FINWIRE) + 1), pa.int64()),
            "line": pa.array([line for line, _ in BAD_FINWIRE], pa.large_string()),
        }
    )
    staged, rejected = parse_finwire(lines)
    assert {code: sorted(rows["line_no"].to_pylist()) for code, rows in staged.items()} == {
        "CMP": [1],
        "SEC": [5],
        "FIN": [8],
    }
    assert sorted((r["line_no"], r["reason"]) for r in rejected.to_pylist()) == [
        (i, reason) for i, (_, reason) in enumerate(BAD_FINWIRE, 1) if reason is not None
    ]


def test_a_line_with_characters_beyond_ascii_is_cut_by_characters_not_bytes():
    """Positions count characters: a company name with 'é' and 'ß' (two bytes each in UTF-8) leaves every later
    field where it is, and the line keeps its 543 characters; ASCII lines of the same batch are cut alike."""
    accented = CMP_LINE[:18] + "é" + CMP_LINE[19:30] + "ß" + CMP_LINE[31:]
    lines = pa.table(
        {"line_no": pa.array([1, 2], pa.int64()), "line": pa.array([accented, CMP_LINE], pa.large_string())}
    )
    staged, rejected = parse_finwire(lines)
    assert rejected.num_rows == 0
    rows = {r["line_no"]: r for r in staged["CMP"].to_pylist()}
    assert rows[1]["company_name"] == "ékhSvCsfgbDUßsiZWtPQwjkYPwKrfTUFMGMCWCBXBcOcTkaLSudO"
    assert rows[2]["company_name"] == "kkhSvCsfgbDUvsiZWtPQwjkYPwKrfTUFMGMCWCBXBcOcTkaLSudO"
    for row in rows.values():
        assert (row["cik"], row["status"], row["industry_id"], row["founding_date"]) == (
            "0000000000",
            "ACTV",
            "DR",
            dt.date(1886, 7, 22),
        )
        assert row["description"] == " CUpESkLIQ LBcTnhDEOCLVhfDjOopGKRBxRYGboIrPFcDxMSGkskSwAJdAPWSAPTf T"


# ---------------------------------------------------------------------------------------- CustomerMgmt.xml
def _action(kind: str, ts: str, customer: str) -> str:
    return f'\t<TPCDI:Action ActionType="{kind}" ActionTS="{ts}">\n\t\t{customer}\n\t</TPCDI:Action>'


BAD_XML = "\n".join(
    [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<TPCDI:Actions xmlns:TPCDI="http://www.tpc.org/tpc-di">',
        _action("INACT", "2007-07-08T10:00:00", '<Customer C_ID="7"></Customer>'),
        _action("INACT", "2007-07-08 10:00:00", '<Customer C_ID="8"></Customer>'),
        _action("INACT", "2007-07-08T10:00:00", "<Customer></Customer>"),
        _action("NEW", "2007-07-08T10:00:00", '<Customer C_ID="9" C_DOB="1950-02-30" C_TIER="x"></Customer>'),
        _action("MOVE", "2007-07-08T10:00:00", '<Customer C_ID="10"></Customer>'),
        _action("CLOSEACCT", "2007-07-08T11:00:00", '<Customer C_ID="7"><Account CA_ID="70"/></Customer>'),
        _action(
            "CLOSEACCT",
            "2007-07-08T12:00:00",
            '<Customer C_ID="7"><Account CA_ID="71"/><Account CA_ID="72"/></Customer>',
        ),
        "</TPCDI:Actions>",
    ]
)


@pytest.fixture(scope="module")
def staged_sample(spark, tmp_path_factory) -> tuple[JobContext, dict]:
    """The official FINWIRE files and CustomerMgmt.xml staged by the stage job (micro-batch 1), then damaged
    FINWIRE and XML files (micro-batch 2)."""
    ctx = _context(spark, tmp_path_factory, "stage-fw-xml")
    landing = ctx.settings.landing_dir / "Batch1"
    landing.mkdir(parents=True)
    for name in ("FINWIRE1967Q1", "FINWIRE2000Q1", "CustomerMgmt.xml", "FINWIRE1967Q1_audit.csv"):
        shutil.copyfile(OFFICIAL / name, landing / name)
    batch_log = BatchLog(ctx.lake)
    assert collect(batch_log, ctx.settings.landing_dir, now=NOW).batch_id == 1
    detail = stage_job(ctx, 1)

    write_landing_file(landing / "FINWIRE1999Q4", [line for line, _ in BAD_FINWIRE])
    (landing / "CustomerMgmt_bad.xml").write_text(BAD_XML)
    assert collect(batch_log, ctx.settings.landing_dir, now=NOW).batch_id == 2
    return ctx, {1: detail, 2: stage_job(ctx, 2)}


@needs_sample
def test_official_sample_stages_finwire_and_xml_without_rejects(staged_sample):
    ctx, detail = staged_sample
    expected_fw = _record_types(OFFICIAL / "FINWIRE1967Q1") + _record_types(OFFICIAL / "FINWIRE2000Q1")
    expected_actions = _action_types(OFFICIAL / "CustomerMgmt.xml")
    assert expected_actions == Counter(NEW=64, ADDACCT=37, UPDACCT=22, UPDCUST=11, CLOSEACCT=12, INACT=4)
    total = sum(expected_fw.values()) + sum(expected_actions.values())
    assert detail[1] == {
        "read": total,
        "staged": total,
        "rejected": 0,
        "quarantined": 0,
        "held": 0,
        "checks": {"passed": 8, "warned": 1},
        "audit_files": 1,
        "unknown_files": [],
        "duplicates": {},
    }
    warned = [
        (r["table_name"], r["check_id"], r["unexpected_count"], json.loads(r["detail"]).get("failing_values"))
        for r in _rows(ctx, QUALITY_RESULTS, batch_id=1)
        if r["action"] != "passed"
    ]
    # the official generator writes a few invalid ratings on purpose (T1 turns them into "Invalid SPRating" alerts)
    assert warned == [("staging.finwire_cmp", "sp_rating_is_valid", 5, ["FZ", "ZyG", "DIq", "FrD", "ip"])]
    for code, table in FINWIRE_TABLES.items():
        assert len(_rows(ctx, table, batch_id=1)) == expected_fw[code]
    actions = _rows(ctx, CUSTOMER_MGMT, batch_id=1)
    assert Counter(r["action_type"] for r in actions) == expected_actions
    assert [r["action_seq"] for r in actions] == list(range(1, 151))
    assert _rows(ctx, REJECTS, batch_id=1) == []
    sec = _rows(ctx, FINWIRE_TABLES["SEC"], line_no=615)[0]
    assert (sec["source_file"], sec["source_batch"], sec["cik"]) == ("Batch1/FINWIRE2000Q1", 1, "0000000492")


@needs_sample
def test_action_numbers_follow_the_file():
    """`action_seq` is the action's position in the file. The expected order comes from ElementTree's parse of the
    whole document; the reader parses it as a stream, piece by piece."""
    path = OFFICIAL / "CustomerMgmt.xml"
    expected = [
        (i, action.get("ActionType"), action.find("Customer").get("C_ID"))
        for i, action in enumerate(ElementTree.parse(path).getroot(), start=1)
    ]
    assert len(expected) == 150
    rows = read_actions(str(path)).select(["action_seq", "action_type", "c_id"]).to_pylist()
    assert [(r["action_seq"], r["action_type"], r["c_id"]) for r in rows] == expected


def _without_nulls(row: dict) -> dict:
    lineage = ("batch_id", "source_batch", "source_file")
    return {k: v for k, v in row.items() if v is not None and k not in lineage}


@needs_sample
def test_official_actions_are_flattened_with_exact_values(staged_sample):
    ctx, _ = staged_sample
    by_seq = {r["action_seq"]: r for r in _rows(ctx, CUSTOMER_MGMT, batch_id=1)}
    assert _without_nulls(by_seq[1]) == {
        "action_type": "NEW",
        "action_ts": dt.datetime(2007, 7, 7, 16, 7, 49, tzinfo=UTC),
        "c_id": 0,
        "c_tax_id": "923-54-6498",
        "c_gndr": "F",
        "c_tier": 3,
        "c_dob": dt.date(1940, 12, 2),
        "c_l_name": "Joannis",
        "c_f_name": "Adara",
        "c_adline1": "4779 Weller Way",
        "c_zipcode": "92624",
        "c_city": "Columbus",
        "c_state_prov": "Ontario",
        "c_ctry": "Canada",
        "c_prim_email": "Adara.Joannis@moose-mail.com",
        "c_alt_email": "Adara.Joannis@gmx.com",
        "c_ctry_1": "1",
        "c_area_1": "872",
        "c_local_1": "523-8928",
        "c_local_2": "492-3961",
        "c_lcl_tx_id": "CA3",
        "c_nat_tx_id": "YT3",
        "ca_id": 0,
        "ca_tax_st": 1,
        "ca_b_id": 10180,
        "ca_name": "CJlmMuFyibKOmKLHIaTeWugvCgZdmcfpDsYb",
        "present_fields": "c_id,c_tax_id,c_gndr,c_tier,c_dob,c_l_name,c_f_name,c_m_name,c_adline1,c_adline2,"
        "c_zipcode,c_city,c_state_prov,c_ctry,c_prim_email,c_alt_email,c_ctry_1,c_area_1,c_local_1,c_ext_1,"
        "c_ctry_2,c_area_2,c_local_2,c_ext_2,c_ctry_3,c_area_3,c_local_3,c_ext_3,c_lcl_tx_id,c_nat_tx_id,"
        "ca_id,ca_tax_st,ca_b_id,ca_name",
        "action_seq": 1,
    }
    # UPDCUST: <C_ADLINE2/> is present and empty (set to NULL), C_ADLINE1 and C_ZIPCODE are absent (unchanged)
    assert _without_nulls(by_seq[26]) == {
        "action_type": "UPDCUST",
        "action_ts": dt.datetime(2007, 7, 17, 3, 58, 34, tzinfo=UTC),
        "c_id": 0,
        "c_city": "Augusta",
        "c_state_prov": "British Columbia",
        "c_ctry": "United States of America",
        "c_prim_email": "Adara.Joannis@gmail.com",
        "c_area_1": "357",
        "c_local_1": "423-9191",
        "c_area_2": "270",
        "c_local_2": "141-3475",
        "c_area_3": "421",
        "c_local_3": "277-2023",
        "c_ext_3": "59348",
        "present_fields": "c_id,c_adline2,c_city,c_state_prov,c_ctry,c_prim_email,c_alt_email,c_ctry_1,c_area_1,"
        "c_local_1,c_ext_1,c_ctry_2,c_area_2,c_local_2,c_ext_2,c_ctry_3,c_area_3,c_local_3,c_ext_3",
        "action_seq": 26,
    }
    # an empty attribute (C_TIER="") is present and NULL
    assert (by_seq[62]["c_tier"], "c_tier" in by_seq[62]["present_fields"].split(",")) == (None, True)
    assert _without_nulls(by_seq[23]) == {
        "action_type": "CLOSEACCT",
        "action_ts": dt.datetime(2007, 7, 16, 0, 29, 1, tzinfo=UTC),
        "c_id": 6,
        "ca_id": 6,
        "present_fields": "c_id,ca_id",
        "action_seq": 23,
    }
    # text is kept exactly as written, leading space included
    assert by_seq[40]["ca_name"] == " SBujiXiyqeLDdQHxlCabFTplbrYwXcMRNAbKfeJYDpFQzO"


@needs_sample
def test_bad_finwire_lines_and_actions_land_in_rejects(staged_sample):
    ctx, detail = staged_sample
    n_bad_fw = sum(1 for _, reason in BAD_FINWIRE if reason is not None)
    assert detail[2] == {
        "read": len(BAD_FINWIRE) + 7,
        "staged": len(BAD_FINWIRE) - n_bad_fw + 2,
        "rejected": n_bad_fw + 5,
        "quarantined": 0,
        "held": 0,
        "checks": {"passed": 9},
        "audit_files": 0,
        "unknown_files": [],
        "duplicates": {},
    }
    rejects = sorted((r["source"], r["source_file"], r["line_no"], r["reason"]) for r in _rows(ctx, REJECTS))
    assert rejects == [
        ("CustomerMgmt", "Batch1/CustomerMgmt_bad.xml", 2, "action_ts: '2007-07-08 10:00:00' is not a valid timestamp"),
        ("CustomerMgmt", "Batch1/CustomerMgmt_bad.xml", 3, "c_id: required value is empty"),
        (
            "CustomerMgmt",
            "Batch1/CustomerMgmt_bad.xml",
            4,
            "c_tier: 'x' is not a valid int; c_dob: '1950-02-30' is not a valid date",
        ),
        (
            "CustomerMgmt",
            "Batch1/CustomerMgmt_bad.xml",
            5,
            "action_type: 'MOVE' is not one of NEW, ADDACCT, UPDACCT, UPDCUST, CLOSEACCT, INACT",
        ),
        ("CustomerMgmt", "Batch1/CustomerMgmt_bad.xml", 7, "2 Account elements, at most one expected"),
        *sorted(
            ("FINWIRE", "Batch1/FINWIRE1999Q4", i, reason)
            for i, (_, reason) in enumerate(BAD_FINWIRE, 1)
            if reason is not None
        ),
    ]
    staged = _rows(ctx, CUSTOMER_MGMT, batch_id=2)
    assert [(r["action_seq"], r["action_type"], r["c_id"], r["ca_id"]) for r in staged] == [
        (1, "INACT", 7, None),
        (6, "CLOSEACCT", 7, 70),
    ]


def test_finwire_and_xml_are_recognised_only_in_batch1():
    assert nondelimited_source_for_file("Batch1/FINWIRE2000Q1", 1) == "FINWIRE"
    assert nondelimited_source_for_file("Batch1/CustomerMgmt.xml", 1) == "CustomerMgmt"
    assert nondelimited_source_for_file("Batch1/FINWIRE2000Q1_audit.csv", 1) is None
    assert nondelimited_source_for_file("Batch2/CustomerMgmt.xml", 2) is None
    assert nondelimited_source_for_file("Batch1/Trade.txt", 1) is None
    assert source_for_file("Batch1/FINWIRE2000Q1", 1) is None  # never mistaken for a delimited source


# ------------------------------------------------------------------------------------- generated data set
def test_generated_batch1_stages_every_file_without_rejects(spark, tmp_path_factory):
    out = tmp_path_factory.mktemp("gen-sf001")
    generate(Params(scale_factor=0.01, seed=1, batches=2), out)
    ctx = _context(spark, tmp_path_factory, "stage-generated")
    shutil.copytree(out / "Batch1", ctx.settings.landing_dir / "Batch1")
    assert collect(BatchLog(ctx.lake), ctx.settings.landing_dir, now=NOW).batch_id == 1

    detail = stage_job(ctx, 1)

    assert detail["rejected"] == 0
    assert detail["unknown_files"] == []
    assert detail["read"] == detail["staged"]
    quarters = sorted((out / "Batch1").glob("FINWIRE[0-9][0-9][0-9][0-9]Q[1-4]"))
    assert len(quarters) == 202
    expected_fw = sum((_record_types(p) for p in quarters), Counter())
    staged_fw = {code: len(ctx.lake.read_arrow(table)) for code, table in FINWIRE_TABLES.items()}
    assert staged_fw == dict(expected_fw)
    actions = ctx.lake.read_arrow(CUSTOMER_MGMT).to_pylist()
    assert Counter(r["action_type"] for r in actions) == _action_types(out / "Batch1" / "CustomerMgmt.xml")
    assert [r["action_seq"] for r in actions] == list(range(1, len(actions) + 1))
