"""Bad input catalogue (docs/bad-input.md): every TPC-DI source file type x every malformation that applies to it.

Each cell delivers small files into the landing zone of its file type's own home (a few good rows, hand-written from
the declared layouts in `schemas/`, plus the malformed content), collects them as one micro-batch and stages it with
the pipeline's own jobs (`collect_job`, `stage_job`: real Delta tables on disk; staging needs no Spark). It then
checks, from the tables themselves and independently of the stage's own counts:
- the good rows are staged, exactly (their line numbers and keys);
- every bad line (or XML action) is in `staging.rejects` with a reason that names the problem, or in
  `quality.quarantine` with the check it failed;
- read = staged + rejected + quarantined + held, in the stage's detail and, for each file, counted from the tables
  against the lines (actions) the test wrote.
Cells that do not apply to a file type say why (`Kind.na`); `test_the_doc_table_has_every_cell` keeps the table of
docs/bad-input.md in step with this matrix.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.compute as pc
import pytest
from builders import DEFAULTS, deliver

from schemas import finwire as fw
from schemas import sources as src
from schemas.model import SourceFile, Table
from schemas.quality import QUARANTINE
from schemas.staging import CUSTOMER_MGMT, FINWIRE_TABLES, REJECTS
from streamdi import collector
from streamdi.batchlog import BatchLog
from streamdi.context import JobContext
from streamdi.errors import LandingFileError
from streamdi.run.pipeline import collect_job, stage_job
from streamdi.settings import Settings

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "bad-input.md"
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
HUGE = 10 * 1024 * 1024  # characters of the huge line
COUNTS = ("read", "staged", "rejected", "quarantined", "held")

# The columns of docs/bad-input.md's table, in order.
MALFORMATIONS = {
    "field_count": "field count",
    "type": "type",
    "date": "date",
    "enum": "enum",
    "broken_xml": "broken XML",
    "truncated": "truncated file",
    "invalid_utf8": "invalid UTF-8",
    "empty": "empty file",
    "huge_line": "huge line",
    "duplicate": "duplicate file",
    "renamed": "renamed while read",
}
NOT_XML = "not XML"
NO_DATE = "no date or time field"
CODE_TABLE = "the code table itself: any code is a new one"
NO_CODE = "no coded field"


@dataclass(frozen=True)
class Bad:
    """A malformed value for the `type`, `date` or `enum` cell: `column` set to `value`; the line is `rejected` or
    `quarantined`, and its reason (or the check that quarantined it) contains `reason`."""

    column: str
    value: str
    outcome: str
    reason: str


@dataclass(frozen=True)
class Kind:
    """A source file type: one row of the catalogue."""

    label: str  # the row of docs/bad-input.md
    folder: str  # Batch1 or Batch2
    stem: str  # the landing file's name starts with it; the source's pattern accepts `<stem>_<cell><ext>`
    ext: str
    source: SourceFile | None = None  # a delimited source; None for FINWIRE and CustomerMgmt.xml
    values: dict[str, str] = field(default_factory=dict)  # the fields of a good line
    key: str = ""  # the field that tells the good lines apart (numbered per line)
    key_text: Callable[[int], str] = str
    bad: dict[str, tuple[Bad, ...]] = field(default_factory=dict)  # type/date/enum -> the bad values of its cell
    na: dict[str, str] = field(default_factory=dict)  # malformation -> why it does not apply

    @property
    def id(self) -> str:
        return self.label.replace(" ", "").replace("(", "-").replace(")", "").replace(",", "-")

    def path(self, name: str) -> str:
        return f"{self.folder}/{self.stem}_{name}{self.ext}"

    @property
    def xml(self) -> bool:
        return self.stem == "CustomerMgmt"

    @property
    def tables(self) -> tuple[Table, ...]:
        if self.xml:
            return (CUSTOMER_MGMT,)
        return tuple(FINWIRE_TABLES.values()) if self.source is None else (self.source.staging,)

    @property
    def position(self) -> str:
        return "action_seq" if self.xml else "line_no"


def reject(column: str, value: str, reason: str) -> tuple[Bad]:
    return (Bad(column, value, "rejected", reason),)


def not_valid(column: str, value: str, kind: str) -> tuple[Bad]:
    return reject(column, value, f"{column}: '{value}' is not a valid {kind}")


def values_of(source: SourceFile, line: str) -> dict[str, str]:
    return dict(zip([c.name for c in source.columns], line.split(source.delimiter), strict=True))


def cdc(values: dict[str, str]) -> dict[str, str]:
    return {"cdc_flag": "I", "cdc_dsn": "", **values}  # cdc_dsn: the line's number (increasing through the file)


CDC_FLAG = reject("cdc_flag", "X", "cdc_flag: 'X' is not one of I, U")
TRADE = dict(DEFAULTS["Trade"])
DAILY_MARKET = values_of(src.DAILY_MARKET, "2017-07-07|AAAA|20.00|21.00|19.00|1000")
WATCH = values_of(src.WATCH_HISTORY, "1|AAAA|2017-07-08 00:00:19|ACTV")
CASH = values_of(src.CASH_TRANSACTION, "7|2017-07-08 11:34:20|100.00|cash deposit")
HOLDING = values_of(src.HOLDING_HISTORY, "1|1|0|100")
PROSPECT = values_of(
    src.PROSPECT,
    "PEL0,PELLAND,Netti,,f,21847 olympia street,,T6b 1i1,Fairbanks,MA,United States of America,1-712-522-6088,"
    "368776,,3,W,20,760,O,Brink's,,1058868",
)
CUSTOMER = {
    **{c.name: "" for c in src.CUSTOMER.columns},
    "cdc_flag": "I", "c_id": "4728", "c_tax_id": "031-80-9744", "c_st_id": "ACTV", "c_l_name": "Kempffer",
    "c_f_name": "Tandie", "c_gndr": "F", "c_tier": "3", "c_dob": "1933-04-19", "c_adline1": "16132 Corsicana Road",
    "c_zipcode": "85775", "c_city": "Overland Park", "c_state_prov": "DC", "c_ctry": "United States of America",
    "c_local_1": "880-2336", "c_email_1": "Tandie.Kempffer@gawab.com", "c_lcl_tx_id": "DE2", "c_nat_tx_id": "MN1",
}  # fmt: skip
ACCOUNT = values_of(src.ACCOUNT, "I||9008|11473|4728|an account|1|ACTV")
PROSPECT_NA = {
    "date": NO_DATE,
    "enum": "no closed code set at staging: TPC-DI loads another gender, marital status or own-or-rent flag as "
    "'U' (T2)",
}

KINDS = (
    Kind(
        "Date.txt", "Batch1", "Date", ".txt", src.DATE_FILE, DEFAULTS["Date"], "sk_dateid",
        bad={"type": not_valid("calendaryearid", "2O17", "int"), "date": not_valid("datevalue", "2017-07-32", "date")},
        na={"enum": "no coded field (the flag is a boolean: another value is a type error)"},
    ),
    Kind(
        "Time.txt", "Batch1", "Time", ".txt", src.TIME_FILE, DEFAULTS["Time"], "sk_timeid",
        bad={"type": not_valid("hourid", "nine", "int"), "date": not_valid("timevalue", "25:61:00", "time")},
        na={"enum": "no coded field (the flags are booleans: another value is a type error)"},
    ),
    Kind(
        "Industry.txt", "Batch1", "Industry", ".txt", src.INDUSTRY, DEFAULTS["Industry"], "in_id", lambda n: f"I{n}",
        na={"type": "every field is text", "date": NO_DATE, "enum": CODE_TABLE},
    ),
    Kind(
        "StatusType.txt", "Batch1", "StatusType", ".txt", src.STATUS_TYPE, DEFAULTS["StatusType"], "st_id",
        lambda n: f"S{n}", na={"type": "every field is text", "date": NO_DATE, "enum": CODE_TABLE},
    ),
    Kind(
        "TaxRate.txt", "Batch1", "TaxRate", ".txt", src.TAX_RATE, DEFAULTS["TaxRate"], "tx_id", lambda n: f"US{n}",
        bad={"type": not_valid("tx_rate", "abc", "decimal(6,5)")}, na={"date": NO_DATE, "enum": NO_CODE},
    ),
    Kind(
        "TradeType.txt", "Batch1", "TradeType", ".txt", src.TRADE_TYPE, DEFAULTS["TradeType"], "tt_id",
        lambda n: f"T{n}", bad={"type": not_valid("tt_is_sell", "yes", "int")},
        na={"date": NO_DATE, "enum": CODE_TABLE},
    ),
    Kind(
        "HR.csv", "Batch1", "HR", ".csv", src.HR, values_of(src.HR, "1,1,Ann,Lee,,314,Branch,OFF1,555-0100"),
        "employeeid", bad={"type": not_valid("employeejobcode", "broker", "int")},
        na={"date": NO_DATE, "enum": "no closed code set: any job code is kept (314 marks a broker)"},
    ),
    Kind(
        "BatchDate.txt", "Batch1", "BatchDate", ".txt", src.BATCH_DATE, DEFAULTS["BatchDate"], "batchdate",
        lambda n: (dt.date(2000, 1, 1) + dt.timedelta(days=n)).isoformat(),
        bad={"date": not_valid("batchdate", "2017-02-30", "date")},
        na={"type": "its one field is a date (see the date cell)", "enum": NO_CODE},
    ),
    Kind(
        "FINWIRE", "Batch1", "FINWIRE2001Q1", "", key="cik", key_text=lambda n: f"{n:010d}",
        bad={
            "type": reject("revenue", "12a4.00", "revenue: '12a4.00' is not a valid decimal(15,2)"),
            "date": reject("founding_date", "18861322", "founding_date: '18861322' is not a valid date"),
            "enum": (
                Bad("rec_type", "XYZ", "rejected", "unknown record type 'XYZ' (characters 16-18)"),
                Bad("status", "XXXX", "quarantined", "status_is_active_or_inactive"),
            ),
        },
    ),
    Kind(
        "CustomerMgmt.xml", "Batch1", "CustomerMgmt", ".xml", key="c_id",
        bad={
            "type": reject("C_TIER", "x", "c_tier: 'x' is not a valid int"),
            "date": reject("C_DOB", "1950-02-30", "c_dob: '1950-02-30' is not a valid date"),
            "enum": reject("ActionType", "MOVE", "action_type: 'MOVE' is not one of NEW, ADDACCT"),
        },
        na={"field_count": "fields are named elements and attributes, not positions"},
    ),
    Kind(
        "Prospect.csv", "Batch1", "Prospect", ".csv", src.PROSPECT, PROSPECT, "agencyid", lambda n: f"A{n}",
        bad={"type": not_valid("income", "rich", "bigint")}, na=PROSPECT_NA,
    ),
    Kind(
        "DailyMarket.txt", "Batch1", "DailyMarket", ".txt", src.DAILY_MARKET, DAILY_MARKET, "dm_s_symb",
        lambda n: f"S{n}",
        bad={"type": not_valid("dm_vol", "1e6", "bigint"), "date": not_valid("dm_date", "2017-13-01", "date")},
        na={"enum": NO_CODE},
    ),
    Kind(
        "WatchHistory.txt", "Batch1", "WatchHistory", ".txt", src.WATCH_HISTORY, WATCH, "w_c_id",
        bad={
            "type": not_valid("w_c_id", "C7", "bigint"),
            "date": not_valid("w_dts", "2017-07-08 23:61:00", "timestamp"),
            "enum": reject("w_action", "XXXX", "w_action: 'XXXX' is not one of ACTV, CNCL"),
        },
    ),
    Kind(
        "Trade.txt", "Batch1", "Trade", ".txt", src.TRADE, TRADE, "t_id",
        bad={
            "type": not_valid("t_qty", "100.5", "int"),
            "date": not_valid("t_dts", "2017-02-29 09:30:00", "timestamp"),
            "enum": (Bad("t_tt_id", "XXX", "quarantined", "type_is_a_trade_type"),),
        },
    ),
    Kind(
        "TradeHistory.txt", "Batch1", "TradeHistory", ".txt", src.TRADE_HISTORY,
        values_of(src.TRADE_HISTORY, "1|2017-07-03 09:30:00|CMPT"), "th_t_id",
        bad={
            "type": not_valid("th_t_id", "T1", "bigint"),
            "date": not_valid("th_dts", "2017-07-03 09:60:00", "timestamp"),
            "enum": (Bad("th_st_id", "DONE", "quarantined", "status_is_a_status_code"),),
        },
    ),
    Kind(
        "CashTransaction.txt", "Batch1", "CashTransaction", ".txt", src.CASH_TRANSACTION, CASH, "ct_ca_id",
        bad={
            "type": not_valid("ct_amt", "12,50", "decimal(10,2)"),
            "date": not_valid("ct_dts", "2017-7-8 11:34:20", "timestamp"),
        },
        na={"enum": NO_CODE},
    ),
    Kind(
        "HoldingHistory.txt", "Batch1", "HoldingHistory", ".txt", src.HOLDING_HISTORY, HOLDING, "hh_t_id",
        bad={"type": not_valid("hh_before_qty", "none", "int")}, na={"date": NO_DATE, "enum": NO_CODE},
    ),
    Kind(
        "Customer.txt (Batch2, CDC)", "Batch2", "Customer", ".txt", src.CUSTOMER, CUSTOMER, "c_id",
        bad={
            "type": not_valid("c_tier", "gold", "int"),
            "date": not_valid("c_dob", "1950-02-30", "date"),
            "enum": CDC_FLAG,
        },
    ),
    Kind(
        "Account.txt (Batch2, CDC)", "Batch2", "Account", ".txt", src.ACCOUNT, ACCOUNT, "ca_id",
        bad={"type": not_valid("ca_tax_st", "exempt", "int"), "enum": CDC_FLAG}, na={"date": NO_DATE},
    ),
    Kind(
        "Trade.txt (Batch2, CDC)", "Batch2", "Trade", ".txt", src.TRADE_CDC, cdc(TRADE), "t_id",
        bad={
            "type": not_valid("cdc_dsn", "12b", "bigint"),
            "date": not_valid("t_dts", "2017-07-08 9:30:00", "timestamp"),
            "enum": (*CDC_FLAG, Bad("t_st_id", "XXXX", "quarantined", "status_is_a_status_code")),
        },
    ),
    Kind(
        "CashTransaction.txt (Batch2, CDC)", "Batch2", "CashTransaction", ".txt", src.CASH_TRANSACTION_CDC,
        cdc(CASH), "ct_ca_id",
        bad={
            "type": not_valid("ct_amt", "$100.00", "decimal(10,2)"),
            "date": not_valid("ct_dts", "2017-07-08", "timestamp"),
            "enum": CDC_FLAG,
        },
    ),
    Kind(
        "HoldingHistory.txt (Batch2, CDC)", "Batch2", "HoldingHistory", ".txt", src.HOLDING_HISTORY_CDC, cdc(HOLDING),
        "hh_t_id", bad={"type": not_valid("hh_after_qty", "ten", "int"), "enum": CDC_FLAG}, na={"date": NO_DATE},
    ),
    Kind(
        "DailyMarket.txt (Batch2, CDC)", "Batch2", "DailyMarket", ".txt", src.DAILY_MARKET_CDC, cdc(DAILY_MARKET),
        "dm_s_symb", lambda n: f"S{n}",
        bad={
            "type": not_valid("dm_close", "n/a", "decimal(8,2)"),
            "date": not_valid("dm_date", "07/08/2017", "date"),
            "enum": CDC_FLAG,
        },
    ),
    Kind(
        "WatchHistory.txt (Batch2, CDC)", "Batch2", "WatchHistory", ".txt", src.WATCH_HISTORY_CDC, cdc(WATCH), "w_c_id",
        bad={
            "type": not_valid("w_c_id", "1.0", "bigint"),
            "date": not_valid("w_dts", "2017-02-30 10:00:00", "timestamp"),
            "enum": (*CDC_FLAG, *reject("w_action", "DROP", "w_action: 'DROP' is not one of ACTV, CNCL")),
        },
    ),
    Kind(
        "Prospect.csv (Batch2)", "Batch2", "Prospect", ".csv", src.PROSPECT, PROSPECT, "agencyid", lambda n: f"B{n}",
        bad={"type": not_valid("age", "forty", "int")}, na=PROSPECT_NA,
    ),
)  # fmt: skip


def not_applicable(kind: Kind, cell: str) -> str | None:
    """Why `cell` does not apply to `kind` (None: it applies). FINWIRE's "field count" is its lines' length."""
    if cell == "broken_xml" and not kind.xml:
        return NOT_XML
    return kind.na.get(cell)


def applies(kind: Kind, cell: str) -> bool:
    return not_applicable(kind, cell) is None


CELLS = [(kind, cell) for kind in KINDS for cell in MALFORMATIONS if applies(kind, cell)]


# --------------------------------------------------------------------------------------------------- files
@dataclass
class Row:
    """One line (or XML action) of a cell's file: its bytes, and the key of a good one or the outcome of a bad one."""

    data: bytes
    key: str | None = None  # a good row's key
    outcome: str | None = None  # "rejected" or "quarantined"
    reason: str = ""


@dataclass
class Content:
    rows: list[Row]
    terminated: bool = True  # the last line ends with a line ending (XML: the root element is closed)


def delimited_line(kind: Kind, n: int, **values: str) -> bytes:
    fields = {**kind.values, kind.key: kind.key_text(n), **values}
    if "cdc_dsn" in fields and not fields["cdc_dsn"]:
        fields["cdc_dsn"] = str(n)
    return kind.source.delimiter.join(fields[c.name] for c in kind.source.columns).encode()


CMP = {
    "pts": "20010101-093000", "rec_type": "CMP", "status": "ACTV", "industry_id": "DR", "sp_rating": "A",
    "founding_date": "18860722", "addr_line1": "19918 Rogers North", "postal_code": "35233", "city": "Long Beach",
    "state_province": "NC", "country": "United States of America", "ceo_name": "Ellebracht",
    "description": "Makes things",
}  # fmt: skip
FIN = {
    "pts": "20010401-093000", "rec_type": "FIN", "year": "2001", "quarter": "1", "qtr_start_date": "20010101",
    "posting_date": "20010401", "revenue": "6292352922.38", "earnings": "3039537856.76", "eps": "3.60",
    "diluted_eps": "3.54", "margin": "0.48", "inventory": "321096697.16", "assets": "713736468537.19",
    "liabilities": "4983996903.02", "sh_out": "844112022", "diluted_sh_out": "858941416",
    "co_name_or_cik": "0000000580",
}  # fmt: skip


def finwire_line(record: fw.FixedWidthRecord, values: dict[str, str]) -> bytes:
    """A FINWIRE line of `record` from its declared positions: text left-aligned, numbers right-aligned; a 10-digit
    CIK as the last field of SEC/FIN is not padded (the short line)."""
    parts = []
    for f in record.fields:
        value = values.get(f.name, "")
        assert len(value) <= f.width, (f.name, value)
        short = f is record.fields[-1] and record.short_last_field == len(value)
        parts.append(value if short else value.ljust(f.width) if f.align == "left" else value.rjust(f.width))
    return "".join(parts).encode()


def company(n: int, **values: str) -> bytes:
    return finwire_line(fw.CMP, {**CMP, "company_name": f"Company {n}", "cik": f"{n:010d}", **values})


def action(n: int, name: str = "Joannis", **attributes: str) -> bytes:
    """A NEW action of CustomerMgmt.xml for customer `n` (`attributes` override ActionType, ActionTS and those of
    Customer)."""
    kind = attributes.pop("ActionType", "NEW")
    ts = attributes.pop("ActionTS", "2007-07-07T10:00:00")
    customer = {"C_ID": str(n), "C_TAX_ID": "923-54-6498", "C_GNDR": "F", "C_TIER": "3", "C_DOB": "1940-12-02"}
    attrs = " ".join(f'{k}="{v}"' for k, v in (customer | attributes).items())
    return (
        f'\t<TPCDI:Action ActionType="{kind}" ActionTS="{ts}">\n'
        f"\t\t<Customer {attrs}>\n"
        f"\t\t\t<Name><C_L_NAME>{name}</C_L_NAME><C_F_NAME>Adara</C_F_NAME><C_M_NAME/></Name>\n"
        "\t\t\t<Address><C_ADLINE1>4779 Weller Way</C_ADLINE1><C_ADLINE2/><C_ZIPCODE>92624</C_ZIPCODE>"
        "<C_CITY>Columbus</C_CITY><C_STATE_PROV>Ontario</C_STATE_PROV><C_CTRY>Canada</C_CTRY></Address>\n"
        "\t\t\t<TaxInfo><C_LCL_TX_ID>CA3</C_LCL_TX_ID><C_NAT_TX_ID>YT3</C_NAT_TX_ID></TaxInfo>\n"
        f'\t\t\t<Account CA_ID="{n}" CA_TAX_ST="1"><CA_B_ID>10180</CA_B_ID><CA_NAME>account {n}</CA_NAME></Account>\n'
        "\t\t</Customer>\n\t</TPCDI:Action>\n"
    ).encode()


XML_HEAD = b'<?xml version="1.0" encoding="UTF-8"?>\n<TPCDI:Actions xmlns:TPCDI="http://www.tpc.org/tpc-di">\n'
XML_TAIL = b"</TPCDI:Actions>\n"
MALFORMED_XML = "malformed XML: the reader could not parse this action"
NO_LINE_ENDING = "the file ends inside this line, without a line ending"


def good(kind: Kind, n: int) -> Row:
    if kind.xml:
        data = action(n)
    elif kind.source is None:
        data = company(n)
    else:
        data = delimited_line(kind, n)
    return Row(data, key=kind.key_text(n))


def bad_value(kind: Kind, n: int, bad: Bad) -> Row:
    if kind.xml:
        data = action(n, **{bad.column: bad.value})
    elif kind.source is None and bad.column == "rec_type":
        line = company(n)
        data = line[:15] + bad.value.encode() + line[18:]
    elif kind.source is None and bad.column not in CMP:  # a FIN field
        data = finwire_line(fw.FIN, {**FIN, bad.column: bad.value})
    elif kind.source is None:
        data = company(n, **{bad.column: bad.value})
    else:
        data = delimited_line(kind, n, **{bad.column: bad.value})
    return Row(data, outcome=bad.outcome, reason=bad.reason)


def content(kind: Kind, cell: str, base: int = 0) -> Content:
    """The file of a simple cell: good rows around the malformed ones. Keys are numbered from `base` + 1000 x the
    cell's column, so that no two files of a home have the same bytes (they would be duplicates)."""
    base += 1000 * list(MALFORMATIONS).index(cell)

    def g(i: int) -> Row:
        return good(kind, base + i)

    if cell in ("duplicate", "renamed"):
        return Content([g(1), g(2), g(3)])
    if cell in ("type", "date", "enum"):
        bad = [bad_value(kind, base + 2 + i, b) for i, b in enumerate(kind.bad[cell])]
        rows = [g(1), *bad, g(2 + len(bad))]
        return Content(rows)
    if cell == "field_count":
        if kind.source is None:  # FINWIRE: a CMP line is 543 characters
            long = company(base + 2) + b"0123456789"
            return Content(
                [g(1), Row(long, outcome="rejected", reason="CMP record: expected 543 characters, found 553")]
            )
        n, sep = len(kind.source.columns), kind.source.delimiter.encode()
        extra = delimited_line(kind, base + 2) + sep + b"extra"
        short = sep.join(delimited_line(kind, base + 3).split(sep)[:-1])  # BatchDate's one field: an empty line
        return Content(
            [
                g(1),
                Row(extra, outcome="rejected", reason=f"expected {n} fields, found {n + 1}"),
                Row(short, outcome="rejected", reason=f"expected {n} fields, found {n - 1}" if n > 1 else "empty line"),
                g(4),
            ]
        )
    if cell == "broken_xml":  # garbage before the first action; an action with an element left open
        garbage = Row(b"<<garbage>> & more\n", outcome="rejected", reason=MALFORMED_XML)
        unclosed = Row(action(base + 3).replace(b"</C_F_NAME>", b""), outcome="rejected", reason=MALFORMED_XML)
        return Content([garbage, g(2), unclosed, g(4)])
    if cell == "truncated":  # the last row cut in the middle, no line ending (XML: no end of the root either)
        last = g(3).data
        cut = last[: len(last) // 2] if kind.xml else last[:-3]
        return Content(
            [g(1), g(2), Row(cut, outcome="rejected", reason=MALFORMED_XML if kind.xml else NO_LINE_ENDING)], False
        )
    if cell == "invalid_utf8":
        if kind.xml:
            bad = action(base + 2, name="Caf?").replace(b"Caf?", b"Caf\xe9")
            return Content([g(1), Row(bad, outcome="rejected", reason=MALFORMED_XML), g(3)])
        line = g(2).data
        bad = line[:1] + b"\xe9" + line[1:]
        return Content(
            [g(1), Row(bad, outcome="rejected", reason="not valid UTF-8: byte 0xe9 at byte 2 of the line"), g(3)]
        )
    if cell == "empty":
        return Content([])
    if cell == "huge_line":
        if kind.xml:  # a huge run of garbage before the first action
            return Content([Row(b"<" + b"x" * HUGE + b"\n", outcome="rejected", reason=MALFORMED_XML), g(2), g(3)])
        if kind.source is None:
            huge = b"20010101-000000CMP" + b"x" * HUGE
            reason = f"CMP record: expected 543 characters, found {HUGE + 18}"
        else:
            columns = kind.source.columns
            huge = b"x" * HUGE  # BatchDate: one field of the right count, and not a date
            reason = f"expected {len(columns)} fields, found 1" if len(columns) > 1 else "' is not a valid date"
        return Content([g(1), Row(huge, outcome="rejected", reason=reason), g(3)])
    raise AssertionError(cell)


def file_bytes(kind: Kind, c: Content) -> bytes:
    if not c.rows:
        return b""  # the empty file: 0 bytes (an XML file too)
    if kind.xml:
        body = b"".join(r.data for r in c.rows)
        return XML_HEAD + body + XML_TAIL if c.terminated else XML_HEAD + body
    lines = [r.data for r in c.rows]
    return b"\r\n".join(lines) + (b"\r\n" if c.terminated else b"")


def lines_in(data: bytes) -> int:
    """Lines of a written file, counted from its bytes."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


# --------------------------------------------------------------------------------------------------- homes
class Home:
    """One landing zone and lake per file type; every cell delivers its files as the next micro-batch."""

    def __init__(self, path: Path) -> None:
        settings = Settings(home=path, spark_master="local[2]")
        self.ctx = JobContext(settings)  # no Spark: staging is Arrow and delta-rs
        self.landing = settings.landing_dir
        self.clock = itertools.count(1)

    def deliver(self, relative: str, data: bytes) -> Path:
        return deliver(self.landing, relative, data, START + dt.timedelta(seconds=next(self.clock)))

    def collect(self) -> list[int]:
        return collect_job(self.ctx).batch_ids

    def micro_batch(self, files: dict[str, bytes]) -> tuple[int, dict]:
        for relative, data in files.items():
            self.deliver(relative, data)
        (batch_id,) = self.collect()
        return batch_id, stage_job(self.ctx, batch_id)


@pytest.fixture(scope="module")
def homes(tmp_path_factory) -> Callable[[Kind], Home]:
    made: dict[str, Home] = {}

    def home(kind: Kind) -> Home:
        if kind.label not in made:
            made[kind.label] = Home(tmp_path_factory.mktemp(f"bad-input-{kind.id}"))
        return made[kind.label]

    return home


@dataclass
class Expected:
    """What one file must give: its rows read, and by line (action) number the good rows' keys, the rejected rows'
    reasons and the quarantined rows' checks (a distinctive part of each)."""

    read: int
    staged: dict[int, str] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    quarantined: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of(cls, kind: Kind, c: Content, data: bytes) -> Expected:
        read = len(c.rows) if kind.xml else lines_in(data)
        assert read == len(c.rows)
        e = cls(read)
        for n, row in enumerate(c.rows, 1):
            target = {None: e.staged, "rejected": e.rejected, "quarantined": e.quarantined}[row.outcome]
            target[n] = row.key if row.outcome is None else row.reason
        return e


def as_text(value) -> str:
    return value.isoformat() if isinstance(value, dt.date) else str(value)


def assert_outcome(home: Home, kind: Kind, batch_id: int, detail: dict, expected: dict[str, Expected]) -> None:
    """The stage's counts, and each file's rows found in staging, rejects and quarantine, exactly as expected."""
    counts = {c: detail[c] for c in COUNTS}
    assert counts == {
        "read": sum(e.read for e in expected.values()),
        "staged": sum(len(e.staged) for e in expected.values()),
        "rejected": sum(len(e.rejected) for e in expected.values()),
        "quarantined": sum(len(e.quarantined) for e in expected.values()),
        "held": 0,
    }
    assert counts["read"] == counts["staged"] + counts["rejected"] + counts["quarantined"] + counts["held"]
    assert "halted" not in detail
    lake, mine = home.ctx.lake, pc.field("batch_id") == batch_id
    staged: dict[str, dict[int, str]] = {}
    for table in kind.tables:
        for r in lake.read_if_exists(table, ["source_file", kind.position, kind.key], mine).to_pylist():
            staged.setdefault(r["source_file"], {})[r[kind.position]] = as_text(r[kind.key])
    rejected: dict[str, dict[int, str]] = {}
    for r in lake.read_if_exists(REJECTS, ["source_file", "line_no", "reason"], mine).to_pylist():
        rejected.setdefault(r["source_file"], {})[r["line_no"]] = r["reason"]
    quarantined: dict[str, dict[int, str]] = {}
    for r in lake.read_if_exists(QUARANTINE, ["row_key", "check_ids"], mine).to_pylist():
        key = json.loads(r["row_key"])
        quarantined.setdefault(key["source_file"], {})[key[kind.position]] = r["check_ids"]
    assert set(staged) | set(rejected) | set(quarantined) <= set(expected)
    for file, e in expected.items():
        assert staged.get(file, {}) == e.staged, file
        for found, wanted in ((rejected.get(file, {}), e.rejected), (quarantined.get(file, {}), e.quarantined)):
            assert sorted(found) == sorted(wanted), file
            for n, part in wanted.items():
                assert part in found[n], (file, n, found[n][:300])
        assert len(e.staged) + len(e.rejected) + len(e.quarantined) == e.read


def stage_cell(home: Home, kind: Kind, name: str, c: Content) -> tuple[int, dict]:
    data = file_bytes(kind, c)
    batch_id, detail = home.micro_batch({kind.path(name): data})
    assert_outcome(home, kind, batch_id, detail, {kind.path(name): Expected.of(kind, c, data)})
    return batch_id, detail


# ---------------------------------------------------------------------------------------------------- cells
@pytest.mark.parametrize(("kind", "cell"), CELLS, ids=[f"{k.id}-{c}" for k, c in CELLS])
def test_bad_input(kind: Kind, cell: str, homes, caplog, monkeypatch):
    home = homes(kind)
    caplog.set_level(logging.WARNING)
    if cell == "duplicate":
        duplicate_file(home, kind)
    elif cell == "renamed":
        renamed_while_read(home, kind, monkeypatch, caplog)
    else:
        _, detail = stage_cell(home, kind, cell, content(kind, cell))
        assert detail["duplicates"] == {}
        if cell == "empty":
            assert f"{kind.path(cell)} is empty (0 bytes): nothing to stage" in caplog.text


def duplicate_file(home: Home, kind: Kind) -> None:
    """The same bytes under another name (a producer's retry) are not staged again and are named with the file they
    repeat; the same name delivered again with the same bytes is not collected again; the same name with other
    bytes is not collected and is reported as changed."""
    original = content(kind, "duplicate")
    stage_cell(home, kind, "duplicate", original)
    data = file_bytes(kind, original)
    batch_id, detail = home.micro_batch({kind.path("duplicate_again"): data})
    assert {c: detail[c] for c in COUNTS} == dict.fromkeys(COUNTS, 0)
    assert detail["duplicates"] == {kind.path("duplicate_again"): kind.path("duplicate")}
    assert not home.ctx.lake.read_if_exists(REJECTS, condition=pc.field("batch_id") == batch_id).num_rows
    home.deliver(kind.path("duplicate"), data)  # the same name again, same bytes, a later time
    again = collect_job(home.ctx)
    assert (again.batch_ids, again.changed) == ([], [])
    home.deliver(kind.path("duplicate"), data + data[-10:])  # the same name again, other bytes
    changed = collect_job(home.ctx)
    assert (changed.batch_ids, changed.changed) == ([], [kind.path("duplicate")])
    home.deliver(kind.path("duplicate"), data)


def renamed_while_read(home: Home, kind: Kind, monkeypatch, caplog) -> None:
    """A file renamed while the collector reads it is left for the next pass (under its new name); a registered file
    renamed away, or replaced by another file renamed onto its name, before the stage reads it stops the stage with
    an error that names it and says what to do; nothing of it is staged until it is back, then all of it is."""
    landing = home.landing
    # 1. renamed while the collector hashes it: not registered in this pass, a warning names it
    moving, moved = kind.path("renamed_moving"), kind.path("renamed_moved")
    c = content(kind, "renamed")
    data = file_bytes(kind, c)
    home.deliver(moving, data)
    hash_file = collector._sha256

    def renamed_first(path: Path) -> str:
        if path == landing / moving:
            path.rename(landing / moved)
        return hash_file(path)

    monkeypatch.setattr(collector, "_sha256", renamed_first)
    assert home.collect() == []
    monkeypatch.setattr(collector, "_sha256", hash_file)
    assert f"{moving} disappeared while it was being collected" in caplog.text
    (batch_id,) = home.collect()  # the next pass finds it under its new name
    assert [f.file for f in BatchLog(home.ctx.lake).files(batch_id)] == [moved]
    detail = stage_job(home.ctx, batch_id)
    assert_outcome(home, kind, batch_id, detail, {moved: Expected.of(kind, c, data)})

    # 2. registered, then renamed away (out of the landing zone) before the stage reads it
    gone = kind.path("renamed_gone")
    c = content(kind, "renamed", base=100)
    data = file_bytes(kind, c)
    home.deliver(gone, data)
    (batch_id,) = home.collect()
    aside = home.ctx.settings.home / "aside"
    aside.mkdir(exist_ok=True)
    (landing / gone).rename(aside / "gone")
    with pytest.raises(
        LandingFileError, match=re.escape(f"{gone} of micro-batch {batch_id} is no longer in the landing")
    ):
        stage_job(home.ctx, batch_id)
    assert not BatchLog(home.ctx.lake).is_done(batch_id, "stage")
    assert_nothing_staged(home, kind, batch_id)
    (aside / "gone").rename(landing / gone)
    detail = stage_job(home.ctx, batch_id)
    assert_outcome(home, kind, batch_id, detail, {gone: Expected.of(kind, c, data)})

    # 3. registered, then another file renamed onto its name before the stage reads it
    swapped = kind.path("renamed_swapped")
    c = content(kind, "renamed", base=200)
    data = file_bytes(kind, c)
    home.deliver(swapped, data)
    (batch_id,) = home.collect()
    other = aside / "other"
    other.write_bytes(file_bytes(kind, content(kind, "renamed", base=300)))
    other.rename(landing / swapped)
    with pytest.raises(LandingFileError, match=re.escape(f"{swapped} of micro-batch {batch_id} changed after")):
        stage_job(home.ctx, batch_id)
    assert_nothing_staged(home, kind, batch_id)
    home.deliver(swapped, data)  # the collected bytes back
    detail = stage_job(home.ctx, batch_id)
    assert_outcome(home, kind, batch_id, detail, {swapped: Expected.of(kind, c, data)})


def assert_nothing_staged(home: Home, kind: Kind, batch_id: int) -> None:
    mine = pc.field("batch_id") == batch_id
    for table in (*kind.tables, REJECTS):
        assert home.ctx.lake.read_if_exists(table, ["batch_id"], mine).num_rows == 0, table.name


# ------------------------------------------------------------------------------------------- cross-checks
def test_empty_files_of_different_sources_are_not_duplicates_of_each_other(tmp_path, caplog):
    """Two empty files have the same bytes, but neither repeats the other: each is read (0 lines) and named empty."""
    home = Home(tmp_path)
    caplog.set_level(logging.WARNING)
    _, detail = home.micro_batch(
        {"Batch2/Trade.txt": b"", "Batch2/CashTransaction.txt": b"", "Batch2/BatchDate.txt": b"2017-07-08\r\n"}
    )
    assert {c: detail[c] for c in COUNTS} == {"read": 1, "staged": 1, "rejected": 0, "quarantined": 0, "held": 0}
    assert detail["duplicates"] == {}
    assert "Batch2/Trade.txt is empty (0 bytes)" in caplog.text
    assert "Batch2/CashTransaction.txt is empty (0 bytes)" in caplog.text


def test_every_kind_says_why_a_cell_does_not_apply():
    """A cell applies, with its malformed values where it needs them, or says why not."""
    for kind in KINDS:
        for cell in ("type", "date", "enum"):
            assert applies(kind, cell) == bool(kind.bad.get(cell)), (kind.label, cell)
        assert all(kind.na.values()), kind.label
        assert set(kind.na) <= set(MALFORMATIONS), kind.label
    assert len(KINDS) == 25


def doc_table() -> tuple[list[str], dict[str, list[str]]]:
    """(column headers, {row label: cells}) of the first table of docs/bad-input.md."""
    lines = [line for line in DOC.read_text().splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != len(header):
            break
        rows[cells[0].strip("`*")] = cells[1:]
    return header[1:], rows


def test_the_doc_table_has_every_cell():
    """docs/bad-input.md has one row per file type and one column per malformation; a cell says "n/a" exactly where
    the malformation does not apply."""
    header, rows = doc_table()
    assert header == list(MALFORMATIONS.values())
    assert list(rows) == [k.label for k in KINDS]
    for kind in KINDS:
        for cell, text in zip(MALFORMATIONS, rows[kind.label], strict=True):
            assert text.startswith("n/a") == (not applies(kind, cell)), (kind.label, cell, text)
