"""The generated files have the official generator's formats, compared with the sample in ../shared."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest
from builders import SHARED_SAMPLE
from conftest import read_lines

from schemas import sources as src

needs_sample = pytest.mark.skipif(
    not SHARED_SAMPLE.exists(), reason="../shared/tpcdi-sample is not beside the checkout"
)
NS = "{http://www.tpc.org/tpc-di}"


def _names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if not p.name.startswith("FINWIRE")}


@needs_sample
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_each_batch_has_the_official_set_of_files(dataset: Path, batch: int):
    assert _names(dataset / f"Batch{batch}") == _names(SHARED_SAMPLE / f"Batch{batch}")
    assert (dataset / f"Batch{batch}_audit.csv").exists()


def test_finwire_has_one_file_and_one_audit_per_quarter_1967q1_to_2017q2(dataset: Path):
    quarters = sorted(p.name for p in (dataset / "Batch1").glob("FINWIRE*") if not p.name.endswith("_audit.csv"))
    assert len(quarters) == 202
    assert (quarters[0], quarters[-1]) == ("FINWIRE1967Q1", "FINWIRE2017Q2")
    assert all((dataset / "Batch1" / f"{q}_audit.csv").exists() for q in quarters)


DELIMITED = [
    (1, "Trade.txt", src.TRADE),
    (1, "TradeHistory.txt", src.TRADE_HISTORY),
    (1, "CashTransaction.txt", src.CASH_TRANSACTION),
    (1, "HoldingHistory.txt", src.HOLDING_HISTORY),
    (1, "DailyMarket.txt", src.DAILY_MARKET),
    (1, "WatchHistory.txt", src.WATCH_HISTORY),
    (1, "HR.csv", src.HR),
    (1, "Prospect.csv", src.PROSPECT),
    (1, "Date.txt", src.DATE_FILE),
    (1, "Time.txt", src.TIME_FILE),
    (1, "Industry.txt", src.INDUSTRY),
    (1, "TaxRate.txt", src.TAX_RATE),
    (1, "StatusType.txt", src.STATUS_TYPE),
    (1, "TradeType.txt", src.TRADE_TYPE),
    (1, "BatchDate.txt", src.BATCH_DATE),
    (2, "Customer.txt", src.CUSTOMER),
    (2, "Account.txt", src.ACCOUNT),
    (2, "Trade.txt", src.TRADE_CDC),
    (2, "CashTransaction.txt", src.CASH_TRANSACTION_CDC),
    (2, "HoldingHistory.txt", src.HOLDING_HISTORY_CDC),
    (2, "DailyMarket.txt", src.DAILY_MARKET_CDC),
    (2, "WatchHistory.txt", src.WATCH_HISTORY_CDC),
    (2, "Prospect.csv", src.PROSPECT),
    (3, "Trade.txt", src.TRADE_CDC),
    (3, "Customer.txt", src.CUSTOMER),
]


@needs_sample
@pytest.mark.parametrize(("batch", "name", "source"), DELIMITED, ids=[f"Batch{b}/{n}" for b, n, _ in DELIMITED])
def test_delimited_files_have_crlf_lines_and_the_official_field_count(dataset: Path, batch, name, source):
    official = read_lines(SHARED_SAMPLE / f"Batch{batch}" / name)
    fields = {len(line.split(source.delimiter)) for line in official}
    assert fields == {len(source.columns)}
    lines = read_lines(dataset / f"Batch{batch}" / name)  # also checks CRLF endings
    assert lines, f"Batch{batch}/{name} is empty"
    assert {len(line.split(source.delimiter)) for line in lines} == fields


@needs_sample
@pytest.mark.parametrize("name", ["StatusType.txt", "TradeType.txt", "Industry.txt", "TaxRate.txt"])
def test_fixed_reference_files_are_byte_identical_to_the_official_ones(dataset: Path, name: str):
    assert (dataset / "Batch1" / name).read_bytes() == (SHARED_SAMPLE / "Batch1" / name).read_bytes()


def test_generated_date_and_time_lines_read_like_the_official_ones(dataset: Path):
    dates = read_lines(dataset / "Batch1" / "Date.txt")
    assert dates[0] == (
        "19500101|1950-01-01|Jan 1, 1950|1950|1950|19501|1950 Q1|19501|1950 Jan|19501|1950-W1|7|Sun|1950|1950|19503"
        "|1950 Q3|true"
    )
    assert len(dates) == 25933  # 1950-01-01 .. 2020-12-31
    times = read_lines(dataset / "Batch1" / "Time.txt")
    assert len(times) == 86400
    assert times[34200] == "093000|09:30:00|09|09|30|09:30|00|09:30:00|true|true"


def test_dates_and_timestamps_have_the_official_text_form(dataset: Path):
    trade = read_lines(dataset / "Batch1" / "Trade.txt")[0].split("|")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", trade[1])
    assert re.fullmatch(r"\d+\.\d\d", trade[7])
    market = read_lines(dataset / "Batch2" / "DailyMarket.txt")[0].split("|")
    assert market[0] == "I" and re.fullmatch(r"\d{4}-\d\d-\d\d", market[2])


# FINWIRE line widths seen in the official files: CMP 543; SEC 220 (company name) or 170 (CIK);
# FIN 246 (company name) or 196 (CIK)
OFFICIAL_WIDTHS = {"CMP": {543}, "SEC": {170, 220}, "FIN": {196, 246}}


def test_finwire_records_have_the_official_widths(dataset: Path):
    widths = defaultdict(set)
    for path in (dataset / "Batch1").glob("FINWIRE????Q?"):
        for line in read_lines(path):
            widths[line[15:18]].add(len(line))
    assert dict(widths) == OFFICIAL_WIDTHS


@needs_sample
def test_official_finwire_widths_are_the_ones_the_test_expects():
    widths = defaultdict(set)
    for path in (SHARED_SAMPLE / "Batch1").glob("FINWIRE????Q?"):
        for line in read_lines(path):
            widths[line[15:18]].add(len(line))
    assert dict(widths) == OFFICIAL_WIDTHS


def _xml_shape(path: Path) -> dict[str, set[tuple[str, tuple[str, ...]]]]:
    """Per ActionType: every (element path, sorted attribute names) that occurs."""
    shapes: dict[str, set] = defaultdict(set)

    def walk(element: ET.Element, prefix: str, kind: str) -> None:
        here = f"{prefix}/{element.tag.replace(NS, 'TPCDI:')}"
        shapes[kind].add((here, tuple(sorted(element.attrib))))
        for child in element:
            walk(child, here, kind)

    root = ET.parse(path).getroot()
    assert root.tag == f"{NS}Actions"
    for action in root:
        walk(action, "", action.attrib["ActionType"])
    return shapes


@needs_sample
def test_customer_mgmt_xml_uses_the_official_elements_and_attributes(dataset: Path):
    ours = _xml_shape(dataset / "Batch1" / "CustomerMgmt.xml")
    official = _xml_shape(SHARED_SAMPLE / "Batch1" / "CustomerMgmt.xml")
    assert set(ours) == set(official) == {"NEW", "ADDACCT", "UPDACCT", "UPDCUST", "CLOSEACCT", "INACT"}
    for kind in ("NEW", "ADDACCT", "UPDACCT", "CLOSEACCT", "INACT"):
        assert {path for path, _ in ours[kind]} == {path for path, _ in official[kind]}, kind
        assert ours[kind] <= official[kind], kind  # attribute sets: optional attributes (C_GNDR, C_TIER) vary
    # an update carries only what changes: its paths are a subset of the full customer's
    all_paths = {path for path, _ in official["NEW"]}
    assert {path for path, _ in ours["UPDCUST"]} <= all_paths


@needs_sample
def test_customer_mgmt_xml_prolog_namespace_indentation_and_line_endings(dataset: Path):
    ours = (dataset / "Batch1" / "CustomerMgmt.xml").read_bytes()
    official = (SHARED_SAMPLE / "Batch1" / "CustomerMgmt.xml").read_bytes()
    head = b'<?xml version="1.0" encoding="UTF-8"?>\r\n<TPCDI:Actions xmlns:TPCDI="http://www.tpc.org/tpc-di">\r\n'
    assert ours.startswith(head) and official.startswith(head)
    assert ours.endswith(b"\t</TPCDI:Action>\r\n</TPCDI:Actions>")
    assert b"\n" not in ours.replace(b"\r\n", b"")
    assert b"\t\t\t\t<C_PHONE_1>\r\n\t\t\t\t\t<C_CTRY_CODE" in ours


@needs_sample
def test_audit_files_have_the_official_header_and_attributes(dataset: Path):
    compared = 0
    for official in sorted(SHARED_SAMPLE.rglob("*_audit.csv")):
        if official.name == "Generator_audit.csv":
            continue
        ours = dataset / official.relative_to(SHARED_SAMPLE)
        official_lines, our_lines = read_lines(official), read_lines(ours)
        assert our_lines[0] == official_lines[0] == "DataSet, BatchID ,Date , Attribute , Value, DValue"
        keys = [(line.split(",")[0], line.split(",")[1], line.split(",")[3]) for line in official_lines[1:]]
        assert [(line.split(",")[0], line.split(",")[1], line.split(",")[3]) for line in our_lines[1:]] == keys
        compared += 1
    assert compared == 36


@needs_sample
def test_the_xml_declaration_lists_exactly_the_official_customer_paths():
    official = _xml_shape(SHARED_SAMPLE / "Batch1" / "CustomerMgmt.xml")["NEW"]
    paths = set()
    for path, attributes in official:
        if path.startswith("/TPCDI:Action/Customer"):
            below = path.removeprefix("/TPCDI:Action/")
            paths |= {f"{below}/@{a}" for a in attributes}
            if not any(other.startswith(path + "/") for other, _ in official):  # a leaf element holds a value
                paths.add(below)
    assert {f.path for f in src.CUSTOMER_MGMT_XML} == paths
