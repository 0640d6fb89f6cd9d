"""The live-windows step (`jobs.windows.run`) on real Delta tables (delta-rs; the step needs no Spark), fed by
hand-written dimension and DimTrade commits as T1-T3 would make them.

The scenario, in TPC-DI batch 1 and then batch 2 (watermark of batch 2: batch 1's latest completion, 2017-07-04
11:00; grace one day):
- trades 1 and 2 (batch 1) on Monday 07-03 and Tuesday 07-04, account 45 with broker 300;
- from Wednesday 07-05 account 45 has a new version with broker 400 (a hierarchy change inside the week);
- trade 3 (batch 2) completes on Thursday 07-06: it goes to broker 400, trades 1 and 2 stay with broker 300;
- trade 4 (batch 2) completes on Saturday 07-01, more than a day before the watermark: late, an Alert, no window;
- then a redelivery of trade 4 moves its completion to Thursday 07-06 11:30: no longer late, its Alert goes, and it
  joins trade 3's session and broker 400's week.
The same records in one micro-batch and in four give the same tables.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pyarrow as pa
import pytest

from jobs import windows as win
from jobs.scope import BatchScope
from schemas import warehouse as wh
from schemas import windows as ws
from streamdi.context import JobContext
from streamdi.lake import Lake
from streamdi.report import windows as windows_report
from streamdi.settings import Settings

pytestmark = pytest.mark.integration

D = dt.date
OPEN = D(9999, 12, 31)
DEFAULTS = {"bigint": 0, "int": 0, "string": "x", "boolean": True, "date": D(2000, 1, 1)}


def rows_of(table, rows: list[dict]) -> pa.Table:
    """Arrow rows of `table`, non-null columns the rows leave out filled with a placeholder."""
    filled = []
    for r in rows:
        full = dict(r)
        for c in table.columns:
            if c.name not in full and not c.nullable:
                full[c.name] = DEFAULTS.get(c.type, Decimal("0"))
        filled.append(full)
    schema = table.arrow_schema()
    return pa.table({f.name: pa.array([r.get(f.name) for r in filled], f.type) for f in schema}, schema=schema)


def scd(eff: dt.date, end: dt.date = OPEN) -> dict:
    return {"effectivedate": eff, "enddate": end, "iscurrent": end == OPEN, "batchid": 1}


ACCOUNT_V1 = {"sk_accountid": 1, "accountid": 45, "sk_brokerid": 3, "sk_customerid": 8, "status": "Active"}
ACCOUNT_V2 = {"sk_accountid": 2, "accountid": 45, "sk_brokerid": 4, "sk_customerid": 8, "status": "Active"}


def trade(tid: int, closed: str, batch: int, quantity: int = 10) -> dict:
    when = dt.datetime.fromisoformat(closed)
    date_id, time_id = int(when.strftime("%Y%m%d")), int(when.strftime("%H%M%S"))
    return {
        "tradeid": tid,
        "sk_brokerid": 3,
        "sk_createdateid": date_id,
        "sk_createtimeid": time_id,
        "sk_closedateid": date_id,
        "sk_closetimeid": time_id,
        "status": "Completed",
        "type": "Market Buy",
        "cashflag": True,
        "sk_securityid": 11,
        "sk_companyid": 31,
        "quantity": quantity,
        "bidprice": Decimal("10.00"),
        "sk_customerid": 8,
        "sk_accountid": 1,
        "executedby": "x",
        "tradeprice": Decimal("10.00"),
        "fee": Decimal("1.00"),
        "commission": Decimal("2.00"),
        "tax": Decimal("0.00"),
        "batchid": batch,
    }


class World:
    def __init__(self, root) -> None:
        self.ctx = JobContext(Settings(home=root), lake=Lake(root / "lake"))

    def commit(self, micro: int, table, rows: list[dict], step: str = "T3") -> None:
        self.ctx.lake.upsert(table, rows_of(table, rows), app_id=f"{step}/{table.name}", version=micro)

    def reference(self, micro: int) -> None:
        self.commit(micro, wh.INDUSTRY, [{"in_id": "SW", "in_name": "Software", "in_sc_id": "TC"}], "T0")
        self.commit(micro, wh.DIM_BROKER, [{"sk_brokerid": 3, "brokerid": 300}, {"sk_brokerid": 4, "brokerid": 400}])
        company = {"sk_companyid": 31, "companyid": 7, "name": "C7", "industry": "Software"} | scd(D(2000, 1, 1))
        self.commit(micro, wh.DIM_COMPANY, [company], "T1")
        security = {"sk_securityid": 11, "symbol": "AAA", "sk_companyid": 31} | scd(D(2000, 1, 1))
        self.commit(micro, wh.DIM_SECURITY, [security], "T1")
        self.commit(micro, wh.DIM_CUSTOMER, [{"sk_customerid": 8, "customerid": 80} | scd(D(2000, 1, 1))], "T2")
        self.commit(micro, wh.DIM_ACCOUNT, [ACCOUNT_V1 | scd(D(2000, 1, 1))], "T2")

    def broker_moves(self, micro: int) -> None:
        self.commit(
            micro,
            wh.DIM_ACCOUNT,
            [ACCOUNT_V1 | scd(D(2000, 1, 1), D(2017, 7, 5)), ACCOUNT_V2 | scd(D(2017, 7, 5))],
            "T2",
        )

    def run(self, micro: int, batch: int) -> dict:
        return win.run(self.ctx, BatchScope(batch_id=micro, source_batches=(batch,)))

    def windows(self, name: str, level: str) -> list[tuple]:
        rows = self.ctx.lake.read_arrow(ws.TRADE_WINDOWS).to_pylist()
        return sorted(
            (r["node"], str(r["window_start"])[:16], str(r["window_end"])[:16], r["trades"], r["quantity"])
            for r in rows
            if r["window_name"] == name and r["level"] == level
        )

    def slices(self, level: str) -> list[tuple]:
        """(node, slice start, trades, quantity, value) of `trade_window_slices` at `level`."""
        if not self.ctx.lake.exists(ws.TRADE_WINDOW_SLICES):
            return []
        rows = self.ctx.lake.read_arrow(ws.TRADE_WINDOW_SLICES).to_pylist()
        return sorted(
            (r["node"], str(r["slice_start"])[:16], r["trades"], r["quantity"], r["value"])
            for r in rows
            if r["level"] == level
        )

    def latest(self) -> list[tuple]:
        return [(r["source"], str(r["latest"])[:16]) for r in self.ctx.lake.read_arrow(ws.WINDOW_LATEST).to_pylist()]

    def alerts(self) -> list[tuple]:
        if not self.ctx.lake.exists(wh.DI_MESSAGES):
            return []
        return sorted(
            (m["batchid"], m["messagesource"], m["messagetext"], m["messagekey"])
            for m in self.ctx.lake.read_arrow(wh.DI_MESSAGES).to_pylist()
        )

    def tables(self) -> dict:
        return {
            t.name: sorted(self.ctx.lake.read_arrow(t).to_pylist(), key=lambda r: tuple(r[k] for k in t.key))
            for t in (ws.TRADE_WINDOWS, ws.TRADE_WINDOW_SLICES, ws.WINDOW_LATEST, ws.WINDOW_WATERMARKS, wh.DI_MESSAGES)
        }


BATCH1 = [trade(1, "2017-07-03 10:00:00", 1, 10), trade(2, "2017-07-04 11:00:00", 1, 20)]
ON_TIME = trade(3, "2017-07-06 10:00:00", 2, 30)
LATE = trade(4, "2017-07-01 09:00:00", 2, 40)
CORRECTED = trade(4, "2017-07-06 10:30:00", 2, 40)


def test_late_records_hierarchy_changes_and_corrections_micro_batch_by_micro_batch(tmp_path):
    w = World(tmp_path)
    w.reference(1)
    w.commit(1, wh.DIM_TRADE, BATCH1)
    w.run(1, 1)
    assert w.windows("trades_week", "broker") == [("300", "2017-07-03 00:00", "2017-07-10 00:00", 2, 30)]

    w.broker_moves(2)
    w.commit(2, wh.DIM_TRADE, [ON_TIME, LATE])
    w.run(2, 2)
    # trades 1 and 2 stay with broker 300 (their account version), trade 3 goes to 400; trade 4 is late
    assert w.windows("trades_week", "broker") == [
        ("300", "2017-07-03 00:00", "2017-07-10 00:00", 2, 30),
        ("400", "2017-07-03 00:00", "2017-07-10 00:00", 1, 30),
    ]
    assert w.windows("trades_week", "customer") == [("80", "2017-07-03 00:00", "2017-07-10 00:00", 3, 60)]
    assert w.alerts() == [(2, "TradeWindows", "Late record past grace", "T_ID=4")]
    page = windows_report.render(windows_report.gather(w.ctx.lake), dt.datetime(2017, 7, 9))
    assert "1 late record(s)" in page and "<tr><td>TradeWindows</td><td>2</td><td>1</td></tr>" in page
    # the plot of trades_day per sector: sector TC (company 7's industry) with its three days
    daily = page[page.index('id="trades_day-sector"') : page.index('id="trades_hour-sector"')]
    assert re.findall(r"<title>TC (\S+) 00:00: ([\d.k]+)</title>", daily) == [
        ("2017-07-03", "100"),
        ("2017-07-04", "200"),
        ("2017-07-06", "300"),
    ]
    assert w.windows("account_sessions", "account") == [
        ("45", "2017-07-03 10:00", "2017-07-03 11:00", 1, 10),
        ("45", "2017-07-04 11:00", "2017-07-04 12:00", 1, 20),
        ("45", "2017-07-06 10:00", "2017-07-06 11:00", 1, 30),
    ]

    w.commit(3, wh.DIM_TRADE, [CORRECTED])
    w.run(3, 2)
    assert w.alerts() == []  # no longer late: its Alert is gone, and it counts
    assert w.windows("trades_week", "broker") == [
        ("300", "2017-07-03 00:00", "2017-07-10 00:00", 2, 30),
        ("400", "2017-07-03 00:00", "2017-07-10 00:00", 2, 70),
    ]
    assert w.windows("account_sessions", "account")[-1] == ("45", "2017-07-06 10:00", "2017-07-06 11:30", 2, 70)
    assert w.run(3, 2) == {}  # a rerun of a finished micro-batch commits nothing
    hours = [
        ("TC", "2017-07-03 10:00", "2017-07-03 11:00", 1, 10),
        ("TC", "2017-07-04 11:00", "2017-07-04 12:00", 1, 20),
    ]
    hours += [("TC", "2017-07-06 10:00", "2017-07-06 11:00", 2, 70)]
    assert w.windows("trades_hour", "sector") == hours
    # the slices of trades_24h_hourly (answered when queried) at its two levels: the on-time trades per hour,
    # trade 4 in the slice of its corrected time; the latest record is trade 4's 10:30
    assert w.slices("sector") == [
        ("TC", "2017-07-03 10:00", 1, 10, Decimal("100.00")),
        ("TC", "2017-07-04 11:00", 1, 20, Decimal("200.00")),
        ("TC", "2017-07-06 10:00", 2, 70, Decimal("700.00")),
    ]
    assert w.slices("industry") == [("SW", *r[1:]) for r in w.slices("sector")]
    assert w.slices("broker") == []  # no window answered when queried is at the broker level
    assert w.latest() == [("trades", "2017-07-06 10:30")]

    # a week and a bit later (batch 3): the hourly windows keep 7 days, so those ending by 07-13 13:00 go; the
    # daily ones keep 92 days
    w.commit(4, wh.DIM_TRADE, [trade(5, "2017-07-20 13:00:00", 3, 50)])
    w.run(4, 3)
    assert w.windows("trades_hour", "sector") == [("TC", "2017-07-20 13:00", "2017-07-20 14:00", 1, 50)]
    # slices are kept for trades_24h_hourly's keep (7 days) plus its size (a day): those ending by 07-12 13:00 go
    assert w.slices("sector") == [("TC", "2017-07-20 13:00", 1, 50, Decimal("500.00"))]
    assert w.latest() == [("trades", "2017-07-20 13:00")]
    assert [r[1] for r in w.windows("trades_day", "sector")] == [
        "2017-07-03 00:00",
        "2017-07-04 00:00",
        "2017-07-06 00:00",
        "2017-07-20 00:00",
    ]


def test_the_same_records_in_one_micro_batch_give_the_same_tables(tmp_path):
    split = World(tmp_path / "split")
    split.reference(1)
    split.commit(1, wh.DIM_TRADE, BATCH1)
    split.run(1, 1)
    split.broker_moves(2)
    split.commit(2, wh.DIM_TRADE, [LATE])
    split.run(2, 2)
    split.commit(3, wh.DIM_TRADE, [ON_TIME])
    split.run(3, 2)

    whole = World(tmp_path / "whole")
    whole.reference(1)
    whole.commit(1, wh.DIM_TRADE, BATCH1)
    whole.run(1, 1)
    whole.broker_moves(2)
    whole.commit(2, wh.DIM_TRADE, [ON_TIME, LATE])
    whole.run(2, 2)
    assert split.tables() == whole.tables()
    assert whole.alerts() == [(2, "TradeWindows", "Late record past grace", "T_ID=4")]


def test_a_kept_session_that_chains_back_past_the_read_is_read_whole(tmp_path, monkeypatch):
    """A session window kept one hour: the read starts a day before the horizon, but the session chains back three
    days (a trade every 50 minutes): the read goes further back until the session's first trade is in it."""
    chain = ws.Window("chain", ws.TRADES, ws.SESSION, dt.timedelta(hours=1), (ws.ACCOUNT,), keep=dt.timedelta(hours=1))
    monkeypatch.setattr(ws, "windows_of", lambda source, windows=(chain,): windows if source == ws.TRADES else ())
    w = World(tmp_path)
    w.reference(1)
    start = dt.datetime(2017, 7, 3)
    trades = [trade(i, str(start + i * dt.timedelta(minutes=50)), 1, 1) for i in range(87)]  # 71.7 hours
    w.commit(1, wh.DIM_TRADE, trades)
    w.run(1, 1)
    assert w.windows("chain", "account") == [("45", "2017-07-03 00:00", "2017-07-06 00:40", 87, 87)]


def market(day: str, volume: int, batch: int, high: str = "11.00", low: str = "9.00") -> dict:
    d = dt.date.fromisoformat(day)
    return {
        "symbol": "AAA",
        "sk_dateid": int(d.strftime("%Y%m%d")),
        "sk_securityid": 11,
        "sk_companyid": 31,
        "volume": volume,
        "dayhigh": Decimal(high),
        "daylow": Decimal(low),
        "closeprice": Decimal("10.00"),
        "batchid": batch,
    }


def test_market_rows_inserted_then_corrected_move_their_week(tmp_path):
    """FactMarketHistory's change feed, inserts only and then with updates (a corrected volume and high) and an
    equal re-delivery: the week per industry and sector follows each correction, the re-delivery changes nothing."""
    w = World(tmp_path)
    w.reference(1)
    w.commit(1, wh.FACT_MARKET_HISTORY, [market("2017-07-03", 100, 1), market("2017-07-04", 200, 1)], "T4")
    w.run(1, 1)

    def week() -> list[tuple]:
        rows = w.ctx.lake.read_arrow(ws.MARKET_WINDOWS).to_pylist()
        return sorted(
            (r["level"], r["node"], str(r["window_start"])[:10], r["days"], r["volume"], str(r["high"]))
            for r in rows
            if r["window_name"] == "market_week"
        )

    assert week() == [
        ("industry", "SW", "2017-07-03", 2, 300, "11.00"),
        ("sector", "TC", "2017-07-03", 2, 300, "11.00"),
    ]
    # an update of measures only (same TPC-DI batch: only the measures tell its images apart)
    w.commit(2, wh.FACT_MARKET_HISTORY, [market("2017-07-04", 250, 1, high="12.50")], "T4")
    w.commit(2, wh.FACT_MARKET_HISTORY, [market("2017-07-12", 50, 2)], "T4b")  # and an insert, a week later
    w.run(2, 2)
    corrected = [
        ("industry", "SW", "2017-07-03", 2, 350, "12.50"),
        ("industry", "SW", "2017-07-10", 1, 50, "11.00"),
        ("sector", "TC", "2017-07-03", 2, 350, "12.50"),
        ("sector", "TC", "2017-07-10", 1, 50, "11.00"),
    ]
    assert week() == corrected
    w.commit(3, wh.FACT_MARKET_HISTORY, [market("2017-07-12", 50, 2)], "T4")  # equal: no change, no feed
    assert w.run(3, 2) == {}
    assert week() == corrected
    # a row of batch 3 from before its watermark (batch 2's latest, 07-12) minus the grace (7 days): late. Its feed
    # holds inserts only, read for days and batches alone; the symbol of its Alert's key is read again when asked.
    w.commit(4, wh.FACT_MARKET_HISTORY, [market("2017-07-01", 70, 3)], "T4")
    assert BatchScope(batch_id=4, source_batches=(3,)).inserted_only(w.ctx, wh.FACT_MARKET_HISTORY)
    w.run(4, 3)
    assert week() == corrected
    assert [a for a in w.alerts() if a[1] == "MarketWindows"] == [
        (3, "MarketWindows", "Late record past grace", "SYMB=AAA:DATE=20170701")
    ]
