"""Invariants of a generated data set: order, references, valid status histories, audits that add up."""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from conftest import read_audit, read_lines, read_rows

NS = "{http://www.tpc.org/tpc-di}"
INCREMENTAL = ("Customer", "Account", "Trade", "CashTransaction", "HoldingHistory", "DailyMarket", "WatchHistory")
VALID_HISTORIES = {
    ("SBMT",), ("SBMT", "CMPT"),  # market orders
    ("PNDG",), ("PNDG", "SBMT"), ("PNDG", "SBMT", "CMPT"), ("PNDG", "CNCL"),  # limit orders
}  # fmt: skip


def ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


@pytest.fixture(scope="module")
def actions(dataset: Path) -> list[ET.Element]:
    return list(ET.parse(dataset / "Batch1" / "CustomerMgmt.xml").getroot())


@pytest.fixture(scope="module")
def accounts(dataset: Path, actions) -> dict[int, tuple[dt.datetime, dt.datetime | None, int]]:
    """account id -> (opened, closed or None, customer id), from the XML and the incremental Account.txt."""
    out: dict[int, list] = {}
    for action in actions:
        when, kind = ts(action.attrib["ActionTS"]), action.attrib["ActionType"]
        customer = action.find("Customer")
        cid = int(customer.attrib["C_ID"])
        for account in customer.findall("Account"):
            aid = int(account.attrib["CA_ID"])
            if kind in ("NEW", "ADDACCT"):
                out[aid] = [when, None, cid]
            elif kind == "CLOSEACCT":
                out[aid][1] = when
        if kind == "INACT":
            for entry in out.values():
                if entry[2] == cid and entry[1] is None:
                    entry[1] = when
    for batch in (2, 3):
        day = dt.datetime.fromisoformat(read_lines(dataset / f"Batch{batch}" / "BatchDate.txt")[0])
        for row in read_rows(dataset / f"Batch{batch}" / "Account.txt"):
            aid = int(row[2])
            if row[0] == "I":
                out[aid] = [day, None, int(row[4])]
            elif row[7] == "INAC":
                out[aid][1] = day + dt.timedelta(days=1)  # closed some time during the day
    return {k: tuple(v) for k, v in out.items()}


def test_batch_dates_are_consecutive_and_batch1_history_ends_the_day_before_batch2(dataset: Path):
    dates = [read_lines(dataset / f"Batch{b}" / "BatchDate.txt") for b in (1, 2, 3)]
    assert dates == [["2017-07-07"], ["2017-07-08"], ["2017-07-09"]]
    last_history = max(ts(r[1]) for r in read_rows(dataset / "Batch1" / "TradeHistory.txt"))
    assert dt.datetime(2017, 7, 7) <= last_history < dt.datetime(2017, 7, 8)
    assert max(r[0] for r in read_rows(dataset / "Batch1" / "DailyMarket.txt")) == "2017-07-06"
    assert {r[2] for r in read_rows(dataset / "Batch2" / "DailyMarket.txt")} == {"2017-07-07"}
    assert {r[3][:10] for r in read_rows(dataset / "Batch3" / "Trade.txt")} == {"2017-07-09"}


@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("name", INCREMENTAL)
def test_cdc_dsn_strictly_increases_and_flags_are_i_or_u(dataset: Path, name: str, batch: int):
    rows = read_rows(dataset / f"Batch{batch}" / f"{name}.txt")
    assert {r[0] for r in rows} <= {"I", "U"}
    dsn = [int(r[1]) for r in rows]
    assert all(a < b for a, b in zip(dsn, dsn[1:], strict=False))


def test_trade_status_histories_follow_valid_transitions_across_batches(dataset: Path):
    history: dict[int, list[tuple[dt.datetime, str]]] = defaultdict(list)
    for t_id, when, status in read_rows(dataset / "Batch1" / "TradeHistory.txt"):
        history[int(t_id)].append((ts(when), status))
    batch1 = {int(r[0]): r for r in read_rows(dataset / "Batch1" / "Trade.txt")}
    assert set(batch1) == set(history)
    for t_id, row in batch1.items():  # Batch1 Trade.txt holds each trade's last state
        assert (ts(row[1]), row[2]) == history[t_id][-1]
    types = {t_id: row[3] for t_id, row in batch1.items()}
    for batch in (2, 3):
        for row in read_rows(dataset / f"Batch{batch}" / "Trade.txt"):
            t_id = int(row[2])
            assert (row[0] == "I") == (t_id not in history), row
            history[t_id].append((ts(row[3]), row[4]))
            types.setdefault(t_id, row[5])
    for t_id, steps in history.items():
        statuses = tuple(s for _, s in steps)
        assert statuses in VALID_HISTORIES, (t_id, statuses)
        assert [w for w, _ in steps] == sorted(w for w, _ in steps)
        assert (statuses[0] == "PNDG") == (types[t_id] in ("TLB", "TLS")), (t_id, types[t_id], statuses)
        assert "CNCL" not in statuses or types[t_id] == "TLB"


def test_trades_refer_to_accounts_open_at_trade_time_and_to_listed_securities(dataset: Path, accounts):
    securities = {}
    for path in (dataset / "Batch1").glob("FINWIRE????Q?"):
        for line in read_lines(path):
            if line[15:18] == "SEC":
                securities[line[18:33].strip()] = dt.datetime.strptime(line[:15], "%Y%m%d-%H%M%S")
    first_seen: dict[int, tuple] = {}
    for t_id, when, _status in read_rows(dataset / "Batch1" / "TradeHistory.txt"):
        first_seen.setdefault(int(t_id), ts(when))
    rows = [(int(r[0]), r) for r in read_rows(dataset / "Batch1" / "Trade.txt")]
    rows += [(int(r[2]), r[2:]) for b in (2, 3) for r in read_rows(dataset / f"Batch{b}" / "Trade.txt")]
    checked = 0
    for t_id, r in rows:
        when = first_seen.setdefault(t_id, ts(r[1]))
        opened, closed, _customer = accounts[int(r[8])]
        assert opened <= when and (closed is None or closed > ts(r[1])), (t_id, r[8])
        assert securities[r[5]] <= when
        checked += 1
    assert checked > 10000


def test_holdings_and_cash_follow_completed_trades(dataset: Path):
    trades = {int(r[0]): r for r in read_rows(dataset / "Batch1" / "Trade.txt")}
    completed = {t for t, r in trades.items() if r[2] == "CMPT"}
    holdings = read_rows(dataset / "Batch1" / "HoldingHistory.txt")
    assert {int(r[1]) for r in holdings} == completed
    for holding_trade, t_id, before, after in holdings:
        buy, trade = trades[int(holding_trade)], trades[int(t_id)]
        assert buy[3] in ("TMB", "TLB") and buy[6] == trade[6]  # opened by a buy of the same quantity
        assert (trade[8], trade[5]) == (buy[8], buy[5])  # same account and symbol
        expected = (0, int(trade[6])) if trade[3] in ("TMB", "TLB") else (int(trade[6]), 0)
        assert (int(before), int(after)) == expected
    cash = read_rows(dataset / "Batch1" / "CashTransaction.txt")
    assert len(cash) == len(completed)
    assert Counter(r[0] for r in cash) == Counter(trades[t][8] for t in completed)


def test_customer_actions_refer_to_known_customers_accounts_and_brokers(dataset: Path, actions):
    brokers = {int(r[0]) for r in read_rows(dataset / "Batch1" / "HR.csv", ",") if r[5] == "314"}
    customers: set[int] = set()
    inactive: set[int] = set()
    open_accounts: set[int] = set()
    last = None
    for action in actions:
        kind, when = action.attrib["ActionType"], ts(action.attrib["ActionTS"])
        assert last is None or last <= when
        last = when
        customer = action.find("Customer")
        cid = int(customer.attrib["C_ID"])
        if kind == "NEW":
            assert cid not in customers
            customers.add(cid)
        else:
            assert cid in customers and cid not in inactive, (kind, cid)
        for account in customer.findall("Account"):
            aid = int(account.attrib["CA_ID"])
            if kind in ("NEW", "ADDACCT"):
                assert aid not in open_accounts
                open_accounts.add(aid)
            else:
                assert aid in open_accounts, (kind, aid)
            if kind == "CLOSEACCT":
                open_accounts.discard(aid)
            else:
                assert int(account.findtext("CA_B_ID")) in brokers
        if kind == "INACT":
            inactive.add(cid)
    assert len(customers) > 100


def test_sec_and_fin_records_refer_to_a_company_posted_before_them(dataset: Path):
    records = []
    for path in sorted((dataset / "Batch1").glob("FINWIRE????Q?")):
        records += read_lines(path)
    names, ciks, checked = set(), set(), 0
    for line in sorted(records, key=lambda x: x[:15]):
        kind = line[15:18]
        if kind == "CMP":
            names.add(line[18:78].strip())
            ciks.add(line[78:88])
        else:
            ref = (line[160:220] if kind == "SEC" else line[186:246]).strip()
            assert ref in (ciks if len(ref) == 10 and ref.isdigit() else names), (kind, ref)
            checked += 1
    assert checked > 1000


def _lines(path: Path) -> int:
    return len(read_lines(path))


def test_audit_figures_equal_what_was_written(dataset: Path, actions):
    b1 = dataset / "Batch1"
    trades = read_rows(b1 / "Trade.txt")
    history = read_rows(b1 / "TradeHistory.txt")
    trade_type = {int(r[0]): r[3] for r in trades}
    th_types = Counter(trade_type[int(h[0])] for h in history)
    value = {int(r[0]): float(r[10]) * int(r[6]) for r in trades if r[2] == "CMPT"}
    expected = {
        "Trade": {
            ("DimTrade", "T_Records"): len(trades),
            ("DimTrade", "T_NEW"): len(trades),
            ("DimTrade", "T_CanceledTrades"): sum(r[2] == "CNCL" for r in trades),
            ("DimTrade", "T_InvalidCommision"): sum(float(r[12]) > value[int(r[0])] for r in trades if r[2] == "CMPT"),
            ("DimTrade", "T_InvalidCharge"): sum(float(r[11]) > value[int(r[0])] for r in trades if r[2] == "CMPT"),
        },
        "TradeHistory": {
            ("DimTradeHistory", "TH_Records"): len(history),
            ("DimTradeHistory", "TH_TLBTrades"): th_types["TLB"],
            ("DimTradeHistory", "TH_TLSTrades"): th_types["TLS"],
            ("DimTradeHistory", "TH_TMBTrades"): th_types["TMB"],
            ("DimTradeHistory", "TH_TMSTrades"): th_types["TMS"],
            ("DimTradeHistory", "TH_CanceledLTrades"): sum(h[2] == "CNCL" for h in history),
        },
        "HR": {("DimBroker", "HR_BROKERS"): sum(r[5] == "314" for r in read_rows(b1 / "HR.csv", ","))},
        "DailyMarket": {("FactMarketHistory", "DM_RECORDS"): _lines(b1 / "DailyMarket.txt")},
        "HoldingHistory": {("FactHoldings", "HH_RECORDS"): _lines(b1 / "HoldingHistory.txt")},
        "CustomerMgmt": {
            ("DimCustomer", "C_NEW"): sum(a.attrib["ActionType"] == "NEW" for a in actions),
            ("DimCustomer", "C_INACT"): sum(a.attrib["ActionType"] == "INACT" for a in actions),
            ("DimCustomer", "C_UPDCUST"): sum(a.attrib["ActionType"] == "UPDCUST" for a in actions),
            ("DimAccount", "CA_ADDACCT"): sum(a.attrib["ActionType"] == "ADDACCT" for a in actions),
            ("DimAccount", "CA_CLOSEACCT"): sum(a.attrib["ActionType"] == "CLOSEACCT" for a in actions),
            ("DimAccount", "CA_UPDACCT"): sum(a.attrib["ActionType"] == "UPDACCT" for a in actions),
            # as the official generator counts: NEW actions whose C_TIER is absent or not 1-3; UPDCUST never
            ("DimCustomer", "C_TIER_INV"): sum(
                a.attrib["ActionType"] == "NEW" and a.find("Customer").attrib.get("C_TIER") not in ("1", "2", "3")
                for a in actions
            ),
        },
    }
    watches = read_rows(b1 / "WatchHistory.txt")
    expected["WatchHistory"] = {
        ("FactWatches", "WH_RECORDS"): len(watches),
        # the official generator's WH_ACTIVE counts the batch's ACTV records (Batch2 of the official SF 3 sample:
        # 1,679 ACTV and 419 CNCL lines, WH_ACTIVE 1,679)
        ("FactWatches", "WH_ACTIVE"): sum(r[3] == "ACTV" for r in watches),
    }
    for name, figures in expected.items():
        audit = read_audit(b1 / f"{name}_audit.csv")
        assert {k: int(audit[k]) for k in figures} == figures, name
    for batch in (2, 3):
        folder = dataset / f"Batch{batch}"
        trade_rows = read_rows(folder / "Trade.txt")
        audit = read_audit(folder / "Trade_audit.csv")
        assert (int(audit[("DimTrade", "T_Records")]), int(audit[("DimTrade", "T_NEW")])) == (
            len(trade_rows),
            sum(r[0] == "I" for r in trade_rows),
        )
        customers = read_rows(folder / "Customer.txt")
        audit = read_audit(folder / "Customer_audit.csv")
        assert int(audit[("DimCustomer", "C_NEW")]) == sum(r[0] == "I" for r in customers)
        assert int(audit[("DimCustomer", "C_INACT")]) == sum(r[4] == "INAC" for r in customers)
        assert int(read_audit(folder / "Prospect_audit.csv")[("Prospect", "P_RECORDS")]) == _lines(
            folder / "Prospect.csv"
        )


def test_finwire_audits_count_the_records_of_their_quarter(dataset: Path):
    for path in (dataset / "Batch1").glob("FINWIRE????Q?"):
        kinds = Counter(line[15:18] for line in read_lines(path))
        audit = read_audit(path.with_name(path.name + "_audit.csv"))
        got = {
            k: int(audit[(ds, f"FW_{k}")])
            for ds, k in (("DimCompany", "CMP"), ("DimSecurity", "SEC"), ("Financial", "FIN"))
        }
        assert got == {k: kinds.get(k, 0) for k in ("CMP", "SEC", "FIN")}, path.name


def test_every_alert_path_occurs_in_batch1(dataset: Path):
    """Bad tiers, birth dates, commissions and fees, and invalid S&P ratings are present (at low rates)."""
    audit = read_audit(dataset / "Batch1" / "CustomerMgmt_audit.csv")
    assert all(int(audit[("DimCustomer", k)]) >= 1 for k in ("C_DOB_TO", "C_DOB_TY", "C_TIER_INV"))
    trade_audit = read_audit(dataset / "Batch1" / "Trade_audit.csv")
    assert int(trade_audit[("DimTrade", "T_InvalidCommision")]) >= 1
    assert int(trade_audit[("DimTrade", "T_InvalidCharge")]) >= 1
    valid = {"AAA", "AA+", "AA", "AA-", "A+", "A", "A-", "BBB+", "BBB", "BBB-", "BB+", "BB", "BB-", "B+", "B", "B-",
             "CCC+", "CCC", "CCC-", "CC", "C", "D"}  # fmt: skip
    ratings = [
        line[94:98].strip()
        for p in (dataset / "Batch1").glob("FINWIRE????Q?")
        for line in read_lines(p)
        if line[15:18] == "CMP"
    ]
    bad = [r for r in ratings if r not in valid]
    assert 0 < len(bad) < len(ratings) / 10
