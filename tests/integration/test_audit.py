"""The audit figures (jobs.audit_figures) and the TPC-DI audit (streamdi.audit) on real Spark and Delta tables.

A consistent hand-made warehouse (two TPC-DI batches) passes every check; a copy with known faults fails
exactly the checks those faults break, with the details written here by hand. The parser reads the official
generator's audit files exactly (spaces around the header names, empty Date/Value/DValue, CRLF).
"""

from __future__ import annotations

import copy
import datetime as dt
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from builders import SHARED_SAMPLE

from jobs import audit_figures
from schemas import warehouse as wh
from schemas.audit import AUDIT_FIGURES
from schemas.model import Table
from schemas.staging import REJECTS
from streamdi.audit import (
    FAILED,
    NOT_CHECKED,
    OK,
    SKIPPED,
    Expected,
    Figures,
    Term,
    _Audit,
    fk_violations,
    run_audit,
    scd2_violations,
)
from streamdi.batchlog import BatchFile
from streamdi.context import JobContext
from streamdi.lake import Lake
from streamdi.settings import Settings

pytestmark = pytest.mark.integration

D = dt.date
EOT = D(9999, 12, 31)
HEADER = "DataSet, BatchID ,Date , Attribute , Value, DValue"  # as the official generator writes it
needs_sample = pytest.mark.skipif(
    not SHARED_SAMPLE.exists(), reason="../shared/tpcdi-sample is not beside the checkout"
)


# ------------------------------------------------------------------------------------- audit file parser
def parsed(name: str) -> list[dict]:
    table, rejected = audit_figures.parse_audit_files([SHARED_SAMPLE / name], root=SHARED_SAMPLE)
    assert rejected == []
    return table.to_pylist()


def fig(dataset, batchid, date, attribute, value, dvalue, source_file, line_no) -> dict:
    return dict(
        dataset=dataset,
        batchid=batchid,
        date=date,
        attribute=attribute,
        value=value,
        dvalue=dvalue,
        source_file=source_file,
        line_no=line_no,
    )


@needs_sample
def test_parser_reads_an_official_count_file_exactly():
    f = "Batch1/CustomerMgmt_audit.csv"
    assert parsed(f) == [
        fig("DimAccount", 1, None, "CA_ADDACCT", 4280, None, f, 2),
        fig("DimAccount", 1, None, "CA_CLOSEACCT", 1284, None, f, 3),
        fig("DimAccount", 1, None, "CA_UPDACCT", 2568, None, f, 4),
        fig("DimAccount", 1, None, "CA_ID_HIST", -1, None, f, 5),
        fig("DimCustomer", 1, None, "C_NEW", 4728, None, f, 6),
        fig("DimCustomer", 1, None, "C_UPDCUST", 1284, None, f, 7),
        fig("DimCustomer", 1, None, "C_ID_HIST", 0, None, f, 8),
        fig("DimCustomer", 1, None, "C_INACT", 428, None, f, 9),
        fig("DimCustomer", 1, None, "C_DOB_TO", 4, None, f, 10),
        fig("DimCustomer", 1, None, "C_DOB_TY", 4, None, f, 11),
        fig("DimCustomer", 1, None, "C_TIER_INV", 251, None, f, 12),
    ]


@needs_sample
def test_parser_reads_official_date_and_decimal_figures_and_header_only_files():
    assert parsed("Batch2_audit.csv") == [
        fig("Batch", 2, D(2017, 7, 8), "FirstDay", None, None, "Batch2_audit.csv", 2),
        fig("Batch", 2, D(2017, 7, 8), "LastDay", None, None, "Batch2_audit.csv", 3),
    ]
    generator = parsed("Generator_audit.csv")
    assert generator[0] == fig("Generator", 1, None, "SF", None, 3000.0, "Generator_audit.csv", 2)
    assert generator[3] == fig(
        "Generator", 1, None, "ONE_DAY_IN_MILLISECONDS", None, 86400000.0, "Generator_audit.csv", 5
    )
    assert generator[7] == fig(
        "Generator", 1, D(2017, 7, 7), "FIRST_BATCH_DATE_START", None, None, "Generator_audit.csv", 9
    )
    assert parsed("Batch1/Date_audit.csv") == []


@needs_sample
def test_read_dir_reads_every_audit_file_of_a_data_set():
    figures = Figures.from_arrow(audit_figures.read_dir(SHARED_SAMPLE))
    assert figures.batches == (1, 2, 3)
    assert figures.value("DimBroker", "HR_BROKERS", 1) == 4293
    assert figures.value("DimCompany", "FW_CMP", 1) == 86 + 7  # FINWIRE1967Q1 + FINWIRE2000Q1
    assert figures.value("Financial", "FW_FIN", 1) == 0 + 610
    assert figures.value("DimCompany", "FW_CMP_DUP", 1) == -1
    assert figures.value("DimCustomer", "C_NEW", 2) == 11
    assert figures.value("DimTrade", "T_NEW", 3) is not None
    assert figures.value("DimTrade", "T_NEW", 4) is None
    assert figures.day("FirstDay", 1) == D(1950, 1, 1)
    assert figures.day("LastDay", 1) == D(2017, 7, 7)


def test_parser_rejects_bad_lines_with_the_reason():
    text = (
        f"{HEADER}\r\n"
        "DimTrade,2,,T_NEW,12,\r\n"
        "\r\n"
        "DimTrade,two,,T_NEW,x,\r\n"
        "Batch,2,2017-7-8,FirstDay,,\r\n"
        "DimTrade,2,,T_NEW\r\n"
        ",2,,,1,abc\r\n"
    )
    figures, rejected = audit_figures.parse_audit_text(text, "Batch2/Trade_audit.csv")
    assert figures == [fig("DimTrade", 2, None, "T_NEW", 12, None, "Batch2/Trade_audit.csv", 2)]
    assert [(r.line_no, r.reason) for r in rejected] == [
        (4, "BatchID: 'two' is not an integer; Value: 'x' is not an integer"),
        (5, "Date: '2017-7-8' is not a YYYY-MM-DD date"),
        (6, "expected 6 fields, found 4"),
        (7, "DataSet: required value is empty; Attribute: required value is empty; DValue: 'abc' is not a number"),
    ]
    _, rejected = audit_figures.parse_audit_text("a,b\nDimTrade,2,,T_NEW,12,\n", "x_audit.csv")
    assert [(r.line_no, r.reason) for r in rejected] == [(2, "not an audit file: header is 'a,b'")]


def test_stage_appends_figures_once_and_a_redelivery_replaces_the_first(spark, tmp_path: Path):
    settings = Settings(home=tmp_path, spark_master="local[2]", spark_shuffle_partitions=2)
    ctx = JobContext(settings, spark=spark, lake=Lake(tmp_path / "lake", spark))
    landing = settings.landing_dir

    def deliver(rel: str, body: str, batch_id: int, source_batch: int) -> BatchFile:
        (landing / rel).parent.mkdir(parents=True, exist_ok=True)
        (landing / rel).write_bytes(body.encode())
        return BatchFile(batch_id, 0, rel, len(body), "x", dt.datetime(2020, 1, 1), source_batch)

    first = [
        deliver("Batch2/Trade_audit.csv", f"{HEADER}\r\nDimTrade,2,,T_NEW,10,\r\nDimTrade,2,,T_NEW,oops,\r\n", 1, 2),
        deliver("Batch2/Trade.txt", "not an audit file\r\n", 1, 2),
    ]
    assert audit_figures.stage(ctx, 1, first) == {"audit_figures": 1, "rejects": 1}
    assert audit_figures.stage(ctx, 1, first) == {"audit_figures": 1, "rejects": 1}  # replay: skipped by the lake
    staged = ctx.lake.read_arrow(AUDIT_FIGURES).to_pylist()
    assert staged == [
        {
            **fig("DimTrade", 2, None, "T_NEW", 10, None, "Batch2/Trade_audit.csv", 2),
            "batch_id": 1,
            "source_batch": 2,
        }
    ]
    rejects = ctx.lake.read_arrow(REJECTS).to_pylist()
    assert [(r["source"], r["source_file"], r["line_no"], r["reason"]) for r in rejects] == [
        ("Audit", "Batch2/Trade_audit.csv", 3, "Value: 'oops' is not an integer")
    ]
    # the same file delivered again (corrected) under another folder in micro-batch 2
    again = [deliver("late/Batch2/Trade_audit.csv", f"{HEADER}\r\nDimTrade,2,,T_NEW,11,\r\n", 2, 2)]
    assert audit_figures.stage(ctx, 2, again) == {"audit_figures": 1}
    assert audit_figures.staged_figures(ctx).to_pylist() == [
        fig("DimTrade", 2, None, "T_NEW", 11, None, "late/Batch2/Trade_audit.csv", 2)
    ]


# ------------------------------------------------------------------------------------------ pure parts
def test_figures_sum_over_files_and_leave_out_figures_marked_minus_one():
    figures = Figures(
        [
            fig("DimCompany", 1, None, "FW_CMP", 2, None, "a", 2),
            fig("DimCompany", 1, None, "FW_CMP", 3, None, "b", 2),
            fig("DimAccount", 2, None, "CA_ADDACCT", 4, None, "c", 2),
            fig("DimAccount", 2, None, "CA_ID_HIST", -1, None, "c", 3),
        ]
    )
    assert figures.value("DimCompany", "FW_CMP", 1) == 5
    assert figures.expected([Term(1, "DimCompany", "FW_CMP")], [1, 2]) == Expected(5, (), (), 1)
    assert figures.expected([Term(1, "DimAccount", "CA_ADDACCT"), Term(-1, "DimAccount", "CA_ID_HIST")], [2]) == (
        Expected(4, (), ("DimAccount/CA_ID_HIST batch 2",), 1)
    )
    assert figures.expected([Term(1, "DimAccount", "CA_UPDACCT")], [2]).missing == ("DimAccount/CA_UPDACCT batch 2",)
    audit = _Audit(None, figures, {})
    audit.compare("only -1", 7, "==", figures.expected([Term(-1, "DimAccount", "CA_ID_HIST")], [2]), "rows")
    audit.compare("absent", 7, "==", figures.expected([Term(1, "DimAccount", "CA_UPDACCT")], [2]), "rows", 2)
    audit.compare("with -1", 3, ">=", figures.expected([Term(1, "DimAccount", "CA_ADDACCT")], [2]), "rows", 2)
    assert [(c.name, c.status, c.detail) for c in audit.checks] == [
        ("only -1", NOT_CHECKED, "DimAccount/CA_ID_HIST batch 2 is -1"),
        ("absent", SKIPPED, "no audit figure DimAccount/CA_UPDACCT batch 2"),
        ("with -1", FAILED, "rows is 3, expected >= 4"),
    ]


def test_scd2_violations_name_every_broken_invariant(spark):
    rows = [
        # key 1: fine
        (1, 11, D(2020, 1, 1), D(2020, 2, 1), False),
        (1, 12, D(2020, 2, 1), EOT, True),
        # key 2: two current versions, the first one still open
        (2, 21, D(2020, 1, 1), EOT, True),
        (2, 22, D(2020, 3, 1), EOT, True),
        # key 3: the first version ends after the second starts (overlap), the second starts the day it ends
        (3, 31, D(2020, 1, 1), D(2020, 5, 1), False),
        (3, 32, D(2020, 4, 1), D(2020, 4, 1), False),
        # key 4: two versions start the same day; surrogate key 41 also used by key 5
        (4, 41, D(2020, 1, 1), D(2020, 1, 1), False),
        (4, 42, D(2020, 1, 1), EOT, True),
        (5, 41, D(2020, 1, 1), EOT, True),
        # key 6: its open version is not flagged current
        (6, 61, D(2020, 1, 1), EOT, False),
    ]
    df = spark.createDataFrame(rows, "k int, sk int, effectivedate date, enddate date, iscurrent boolean")
    got = sorted((r["kind"], r["k"], r["sk"]) for r in scd2_violations(df, "k", "sk").collect())
    assert got == sorted(
        [
            ("EndDate", 2, 21),  # ends 9999-12-31, next starts 2020-03-01
            ("Overlap", 2, 22),
            ("one current version", 2, 21),
            ("EndDate", 3, 31),  # ends 2020-05-01, next starts 2020-04-01
            ("Overlap", 3, 32),
            ("EndDate", 3, 32),  # the last version must end 9999-12-31
            ("consolidation", 3, 32),
            ("one current version", 3, 31),
            ("same-day versions", 4, 42),
            ("consolidation", 4, 41),
            ("distinct keys", 4, 41),
            ("distinct keys", 5, 41),
            ("IsCurrent", 6, 61),
            ("one current version", 6, 61),
        ]
    )


def test_fk_violations_tell_null_missing_and_invalid_references(spark):
    parent = spark.createDataFrame(
        [(100, D(2020, 1, 1), D(2020, 6, 1)), (101, D(2020, 6, 1), EOT)],
        "psk int, effectivedate date, enddate date",
    )
    child = spark.createDataFrame(
        [
            (1, 100, D(2020, 2, 1)),
            (2, 101, D(2020, 2, 1)),
            (3, 999, D(2020, 2, 1)),
            (4, None, D(2020, 2, 1)),
            (5, 100, D(2020, 6, 1)),
        ],
        "id int, fk int, day date",
    )
    day = child["day"]
    got = fk_violations(child, ["id"], "fk", parent, "psk", day, day).collect()
    assert sorted((r["reason"], r["id"], r["fk"]) for r in got) == [
        ("NULL", 4, None),
        ("missing", 3, 999),
        ("not valid", 2, 101),  # version 101 starts after the day
    ]  # id 5: the day a version ends still counts (inclusive end, as in the official script)
    anyversion = fk_violations(child, ["id"], "fk", parent, "psk").collect()
    assert sorted((r["reason"], r["id"]) for r in anyversion) == [("NULL", 4), ("missing", 3)]


# ------------------------------------------------------------------------------ hand-made warehouse
TYPE_DEFAULTS = {"int": 0, "bigint": 0, "string": "x", "boolean": False, "date": D(2000, 1, 1), "time": "00:00:00"}


def arrow(table: Table, rows: list[dict]) -> pa.Table:
    """Rows with every required column not given filled with a type default, every other one NULL."""
    full = []
    for r in rows:
        unknown = set(r) - set(table.column_names)
        assert not unknown, f"{table.name} has no {unknown}"
        row = {}
        for c in table.columns:
            if c.name in r:
                row[c.name] = r[c.name]
            elif c.nullable:
                row[c.name] = None
            else:
                row[c.name] = Decimal(0) if c.type.startswith("decimal") else TYPE_DEFAULTS[c.type]
        full.append(row)
    schema = table.arrow_schema()
    return pa.table({f.name: pa.array([r[f.name] for r in full], f.type) for f in schema}, schema=schema)


def version(eff: D, end: D = EOT, batch: int = 1) -> dict:
    return {"effectivedate": eff, "enddate": end, "iscurrent": end == EOT, "batchid": batch}


def company(sk, cid, name, eff, end=EOT):
    return {
        "sk_companyid": sk,
        "companyid": cid,
        "name": name,
        "status": "Active",
        "industry": "Aerospace",
        "sprating": "AAA",
        "country": "Canada",
        **version(eff, end),
    }


def security(sk, symbol, company_sk, eff):
    return {
        "sk_securityid": sk,
        "symbol": symbol,
        "sk_companyid": company_sk,
        "status": "Active",
        "issue": "COMMON",
        "exchangeid": "NYSE",
        **version(eff),
    }


def customer(sk, cid, eff, end=EOT, batch=1, status="Active", gender="M"):
    return {
        "sk_customerid": sk,
        "customerid": cid,
        "status": status,
        "gender": gender,
        "tier": 1,
        "taxid": "123-45-6789",
        "phone1": "(123) 456-7890",
        "email1": "jo.doe@mail.com",
        "nationaltaxratedesc": "US rate",
        "nationaltaxrate": Decimal("0.15000"),
        "localtaxratedesc": "Canada rate",
        "localtaxrate": Decimal("0.10000"),
        **version(eff, end, batch),
    }


def account(sk, aid, broker_sk, customer_sk, eff, end=EOT, batch=1, status="Active"):
    return {
        "sk_accountid": sk,
        "accountid": aid,
        "sk_brokerid": broker_sk,
        "sk_customerid": customer_sk,
        "status": status,
        "taxstatus": 1,
        **version(eff, end, batch),
    }


def trade(tid, broker, create, close, status, kind, security_sk, company_sk, customer_sk, account_sk, batch):
    return {
        "tradeid": tid,
        "sk_brokerid": broker,
        "sk_createdateid": create,
        "sk_createtimeid": 93000,
        "sk_closedateid": close,
        "sk_closetimeid": 100000 if close else None,
        "status": status,
        "type": kind,
        "cashflag": True,
        "sk_securityid": security_sk,
        "sk_companyid": company_sk,
        "quantity": 10,
        "sk_customerid": customer_sk,
        "sk_accountid": account_sk,
        "batchid": batch,
    }


def messages_of(batch: int, counts: dict[str, int], inactive: int, pcr: bool = True) -> list[dict]:
    rows = [
        {
            "batchid": batch,
            "messagesource": s,
            "messagetext": "Row count",
            "messagetype": "Validation",
            "messagedata": str(n),
            "messagekey": "Row count",
        }
        for s, n in counts.items()
    ]
    rows.append(
        {
            "batchid": batch,
            "messagesource": "DimCustomer",
            "messagetext": "Inactive customers",
            "messagetype": "Validation",
            "messagedata": str(inactive),
            "messagekey": "Inactive customers",
        }
    )
    if pcr:
        rows.append(
            {
                "batchid": batch,
                "messagesource": "Phase Complete Record",
                "messagetext": "Batch Complete",
                "messagetype": "PCR",
                "messagekey": "Batch Complete",
            }
        )
    return rows


def alert(batch: int, text: str, key: str) -> dict:
    return {"batchid": batch, "messagesource": "x", "messagetext": text, "messagetype": "Alert", "messagekey": key}


COUNTS1 = {
    "DimAccount": 2,
    "DimBroker": 2,
    "DimCompany": 3,
    "DimCustomer": 2,
    "DimDate": 5,
    "DimSecurity": 2,
    "DimTime": 2,
    "DimTrade": 2,
    "Financial": 1,
    "Industry": 1,
    "StatusType": 2,
    "TaxRate": 2,
    "TradeType": 2,
}
COUNTS2 = {**COUNTS1, "DimAccount": 3, "DimCustomer": 3, "DimTrade": 3}

GOOD: dict[Table, list[dict]] = {
    wh.DIM_DATE: [
        {"sk_dateid": int(d.strftime("%Y%m%d")), "datevalue": d}
        for d in (D(1950, 1, 1), D(2017, 7, 5), D(2017, 7, 6), D(2017, 7, 7), D(2017, 7, 8))
    ],
    wh.DIM_TIME: [{"sk_timeid": 93000, "timevalue": "09:30:00"}, {"sk_timeid": 100000, "timevalue": "10:00:00"}],
    wh.STATUS_TYPE: [{"st_id": "CMPT", "st_name": "Completed"}, {"st_id": "CNCL", "st_name": "Canceled"}],
    wh.TRADE_TYPE: [{"tt_id": "TMB", "tt_name": "Market Buy"}, {"tt_id": "TLB", "tt_name": "Limit Buy"}],
    wh.INDUSTRY: [{"in_id": "AD", "in_name": "Aerospace", "in_sc_id": "CG"}],
    wh.TAX_RATE: [
        {"tx_id": "US1", "tx_name": "US rate", "tx_rate": Decimal("0.15000")},
        {"tx_id": "CN1", "tx_name": "Canada rate", "tx_rate": Decimal("0.10000")},
    ],
    wh.DIM_BROKER: [
        {"sk_brokerid": sk, "brokerid": bid, "firstname": "A", "lastname": "B", **version(D(1950, 1, 1))}
        for sk, bid in ((1001, 10), (1002, 11))
    ],
    wh.DIM_COMPANY: [
        company(2001, 100, "Acme", D(2000, 1, 1), D(2010, 1, 1)),
        company(2002, 100, "Acme", D(2010, 1, 1)),
        company(2003, 200, "Bolt", D(2005, 1, 1)),
    ],
    wh.DIM_SECURITY: [security(3001, "AAA", 2002, D(2010, 1, 1)), security(3002, "BBB", 2003, D(2005, 6, 1))],
    wh.FINANCIAL: [
        {
            "sk_companyid": 2003,
            "fi_year": 2005,
            "fi_qtr": 1,
            "fi_qtr_start_date": D(2005, 1, 1),
            "fi_revenue": Decimal("1000.00"),
            "fi_net_earn": Decimal("100.00"),
            "fi_basic_eps": Decimal("1.00"),
            "fi_dilut_eps": Decimal("0.90"),
            "fi_margin": Decimal("0.10"),
            "fi_out_basic": 100,
            "fi_out_dilut": 110,
        }
    ],
    wh.DIM_CUSTOMER: [
        customer(4001, 1, D(2015, 1, 1), D(2017, 7, 8)),
        customer(4002, 1, D(2017, 7, 8), batch=2, status="Inactive"),
        customer(4003, 2, D(2016, 1, 1), gender="F"),
    ],
    wh.DIM_ACCOUNT: [
        account(5001, 1000, 1001, 4001, D(2015, 1, 1), D(2017, 7, 8)),
        account(5002, 1000, 1001, 4002, D(2017, 7, 8), batch=2, status="Inactive"),
        account(5003, 1001, 1002, 4003, D(2016, 1, 1)),
    ],
    wh.DIM_TRADE: [
        trade(1, 1001, 20170706, 20170707, "Completed", "Market Buy", 3001, 2002, 4001, 5001, 1),
        trade(2, 1002, 20170705, 20170705, "Canceled", "Limit Sell", 3002, 2003, 4003, 5003, 1),
        trade(3, 1001, 20170708, None, "Pending", "Limit Buy", 3001, 2002, 4002, 5002, 2),
    ],
    wh.DI_MESSAGES: [
        *messages_of(0, dict.fromkeys(COUNTS1, 0), 0),
        *messages_of(1, COUNTS1, 0),
        *messages_of(2, COUNTS2, 1),
        alert(1, "DOB out of range", "C_ID=1"),
        alert(1, "Invalid customer tier", "C_ID=2"),
        alert(1, "Invalid trade commission", "T_ID=1"),
    ],
}

FIGURE_FILES = {
    "Batch1_audit.csv": ["Batch,1,1950-01-01,FirstDay,,", "Batch,1,2017-07-07,LastDay,,"],
    "Batch2_audit.csv": ["Batch,2,2017-07-08,FirstDay,,", "Batch,2,2017-07-08,LastDay,,"],
    "Batch1/HR_audit.csv": ["DimBroker,1,,HR_BROKERS,2,"],
    "Batch1/FINWIRE2000Q1_audit.csv": [
        "DimSecurity,1,,FW_SEC,1,",
        "DimSecurity,1,,FW_SEC_DUP,-1,",
        "DimCompany,1,,FW_CMP,2,",
        "Financial,1,,FW_FIN,1,",
    ],
    "Batch1/FINWIRE2010Q1_audit.csv": ["DimSecurity,1,,FW_SEC,1,", "DimCompany,1,,FW_CMP,1,", "Financial,1,,FW_FIN,0,"],
    "Batch1/CustomerMgmt_audit.csv": [
        "DimAccount,1,,CA_ADDACCT,0,",
        "DimAccount,1,,CA_CLOSEACCT,0,",
        "DimAccount,1,,CA_UPDACCT,0,",
        "DimAccount,1,,CA_ID_HIST,-1,",
        "DimCustomer,1,,C_NEW,1,",
        "DimCustomer,1,,C_UPDCUST,0,",
        "DimCustomer,1,,C_ID_HIST,0,",
        "DimCustomer,1,,C_INACT,0,",
        "DimCustomer,1,,C_DOB_TO,1,",
        "DimCustomer,1,,C_DOB_TY,0,",
        "DimCustomer,1,,C_TIER_INV,1,",
    ],
    "Batch1/Trade_audit.csv": [
        "DimTrade,1,,T_Records,2,",
        "DimTrade,1,,T_NEW,2,",
        "DimTrade,1,,T_CanceledTrades,1,",
        "DimTrade,1,,T_InvalidCommision,1,",
        "DimTrade,1,,T_InvalidCharge,0,",
    ],
    "Batch2/Customer_audit.csv": [
        "DimCustomer,2,,C_NEW,0,",
        "DimCustomer,2,,C_UPDCUST,0,",
        "DimCustomer,2,,C_ID_HIST,0,",
        "DimCustomer,2,,C_INACT,1,",
        "DimCustomer,2,,C_DOB_TO,0,",
        "DimCustomer,2,,C_DOB_TY,0,",
        "DimCustomer,2,,C_TIER_INV,0,",
    ],
    "Batch2/Account_audit.csv": [
        "DimAccount,2,,CA_ADDACCT,0,",
        "DimAccount,2,,CA_CLOSEACCT,1,",
        "DimAccount,2,,CA_UPDACCT,0,",
        "DimAccount,2,,CA_ID_HIST,-1,",
    ],
    "Batch2/Trade_audit.csv": [
        "DimTrade,2,,T_Records,1,",
        "DimTrade,2,,T_NEW,1,",
        "DimTrade,2,,T_CanceledTrades,0,",
        "DimTrade,2,,T_InvalidCommision,0,",
        "DimTrade,2,,T_InvalidCharge,0,",
    ],
}


def broken_warehouse() -> dict[Table, list[dict]]:
    """GOOD with one fault per check family."""
    w = copy.deepcopy(GOOD)
    w[wh.DIM_CUSTOMER][0]["iscurrent"] = True  # customer 1: two current versions
    w[wh.DIM_CUSTOMER][2]["gender"] = "X"  # a bad gender
    w[wh.DIM_COMPANY][0]["enddate"] = D(2011, 1, 1)  # company 100: v1 ends after v2 starts
    w[wh.DIM_TRADE][2]["sk_accountid"] = 9999  # trade 3: dangling account key
    w[wh.DIM_TRADE][0]["sk_customerid"] = 4002  # trade 1: a customer version that starts after the trade
    w[wh.DIM_ACCOUNT][2]["effectivedate"] = D(2017, 7, 9)  # account 1001: after Batch1's last day
    w[wh.DIM_BROKER].append({**w[wh.DIM_BROKER][0], "sk_brokerid": 1003, "brokerid": 12})  # one broker too many
    w[wh.DI_MESSAGES] = [
        m
        for m in w[wh.DI_MESSAGES]
        if not (m["batchid"] == 2 and m["messagetype"] == "PCR") and m["messagetext"] != "Invalid trade commission"
    ]
    return w


def build(spark, root: Path, warehouse: dict[Table, list[dict]]) -> JobContext:
    settings = Settings(home=root, spark_master="local[2]", spark_shuffle_partitions=2)
    ctx = JobContext(settings, spark=spark, lake=Lake(root / "lake", spark))
    for table, rows in warehouse.items():
        ctx.lake.append(table, arrow(table, rows), app_id="test", version=1)
    return ctx


@pytest.fixture(scope="module")
def figures_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("figures")
    for name, lines in FIGURE_FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(("\r\n".join([HEADER, *lines]) + "\r\n").encode())
    return root


@pytest.fixture(scope="module")
def good_report(spark, tmp_path_factory, figures_dir):
    ctx = build(spark, tmp_path_factory.mktemp("good"), GOOD)
    return run_audit(ctx, figures_dir)


@pytest.fixture(scope="module")
def broken_report(spark, tmp_path_factory, figures_dir):
    ctx = build(spark, tmp_path_factory.mktemp("broken"), broken_warehouse())
    return run_audit(ctx, figures_dir)


EXPECTED_CHECKS = [
    ("Audit table batches", None),
    ("DImessages validation reports", 0),
    ("DImessages validation reports", 2),
    ("DImessages Phase complete records", None),
    ("DImessages row counts", 2),
    ("Batch row count: DimTrade", None),
    ("DimBroker row count", None),
    ("DimBroker Batch1 first day", None),
    ("DimCompany row count", None),
    ("DimCompany row count message", 2),
    ("DimCompany Overlap", None),
    ("DimCompany distinct names", None),
    ("DimCompany Industry", None),
    ("DimSecurity row count", None),
    ("DimSecurity SK_CompanyID", None),
    ("Financial row count", None),
    ("Financial EPS", None),
    ("DimCustomer row count", 1),
    ("DimCustomer row count", 2),
    ("DimCustomer EffectiveDate", 2),
    ("DimCustomer inactive customers", 2),
    ("DimCustomer age range alerts", 1),
    ("DimCustomer customer tier alerts", 1),
    ("DimCustomer LocalTaxRate", None),
    ("DimAccount row count", 1),
    ("DimAccount row count", 2),
    ("DimAccount SK_CustomerID", None),
    ("DimAccount SK_BrokerID", None),
    ("DimAccount inactive customers", None),
    ("DimTrade row count", 1),
    ("DimTrade row count", 2),
    ("DimTrade table row count", None),
    ("DimTrade canceled trades", None),
    ("DimTrade commission alerts", 1),
    ("DimTrade SK_AccountID", None),
    ("DimTrade SK_CreateTimeID", None),
    ("DimTrade date check", 1),
    ("DimTrade date check", 2),
    ("DimTrade SK_CustomerID matches dimaccount", None),
]


def test_every_check_passes_on_a_consistent_warehouse(good_report):
    assert good_report.ok, good_report.render()
    assert good_report.failed == [] and good_report.skipped == []
    for name, batch in EXPECTED_CHECKS:
        assert good_report.get(name, batch).status == OK


def test_the_report_renders_ok_or_the_failing_detail(good_report, broken_report):
    assert "TPC-DI audit: OK" in good_report.render()
    text = broken_report.render(width=400)
    assert "TPC-DI audit: NOT OK" in text
    assert "FAILED: row count is 3, expected == 2" in text


def test_a_broken_warehouse_fails_exactly_the_checks_its_faults_break(broken_report):
    failed = {(c.name, c.batch): c.detail for c in broken_report.failed}
    assert failed == {
        ("DimCustomer IsCurrent", None): "1 version(s) whose IsCurrent disagrees with an end date of 9999-12-31, "
        "e.g. customerid=1",
        ("DimCustomer one current version", None): "1 key(s) without exactly one current version, e.g. customerid=1",
        ("DimCustomer Gender", None): "1 row with a bad gender, e.g. X",
        ("DimCompany EndDate", None): "1 version(s) whose end date is not the next version's effective date "
        "(or 9999-12-31 for the last), e.g. companyid=100",
        ("DimCompany Overlap", None): "1 version(s) starting before the previous version ends, e.g. companyid=100",
        (
            "DimTrade SK_AccountID",
            None,
        ): "2 unresolved: 1 with no dimaccount row (e.g. tradeid=3 -> sk_accountid=9999), "
        "1 with a dimaccount version not valid at the date (e.g. tradeid=2 -> sk_accountid=5003)",
        ("DimTrade SK_CustomerID", None): "1 unresolved: 1 with a dimcustomer version not valid at the date "
        "(e.g. tradeid=1 -> sk_customerid=4002)",
        ("DimTrade SK_CustomerID matches dimaccount", None): "1 row whose sk_customerid is not its dimaccount "
        "version's (tradeid), e.g. 1",
        ("DimAccount EffectiveDate", 1): "1 version outside [1950-01-01, 2017-07-07], e.g. accountid day: "
        "1001 2017-07-09",
        ("DimBroker row count", None): "row count is 3, expected == 2",
        ("DImessages row counts", 2): "DimBroker reports 2, the table has 3",
        ("DImessages Phase complete records", None): "PCR rows for batches [0, 1], expected [0, 1, 2]",
        ("DimTrade commission alerts", 1): "count of 'Invalid trade commission' alerts is 0, expected == 1",
    }
    assert broken_report.skipped == []
    assert not broken_report.ok


def test_checks_of_missing_tables_and_figures_are_skipped_with_the_reason(spark, tmp_path, figures_dir):
    ctx = build(spark, tmp_path, {wh.DIM_BROKER: GOOD[wh.DIM_BROKER]})
    report = run_audit(ctx, figures_dir)
    assert report.get("DimTrade table row count").status == SKIPPED
    assert report.get("DimTrade table row count").detail == "table warehouse.dimtrade does not exist"
    assert report.get("DImessages batches").detail == "table warehouse.dimessages does not exist"
    assert report.get("DimBroker row count").status == OK
    assert not report.ok
    empty = tmp_path / "no-figures"
    empty.mkdir()
    report = run_audit(ctx, empty)
    assert report.get("Audit table batches").detail == f"no audit figures in {empty}"
    assert report.get("DimBroker row count").status == SKIPPED
    assert report.get("DimBroker row count").detail == "no audit figure DimBroker/HR_BROKERS"
