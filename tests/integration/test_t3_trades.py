"""T3 (jobs.create_trades, jobs.trades): DimTrade from hand-written staged trade records and hand-written dimension
rows.

Every expected row is written by hand from the rules (TPC-DI 4.5.8 and the incremental DimTrade rules):
create date/time from PNDG (limit) or SBMT (market) or the CDC I line, close from CMPT/CNCL, fields from the
latest record, keys from the dimension versions valid on the creation day.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import create_trades, trade_candidates, trades
from jobs.scope import BatchScope
from schemas import sources as src
from schemas import warehouse as wh
from schemas.holds import TRADE_HOLDS
from schemas.model import Table
from streamdi.context import JobContext
from streamdi.lake import Lake
from streamdi.settings import Settings

pytestmark = pytest.mark.integration

OPEN = dt.date(9999, 12, 31)
BATCH_DATES = {1: dt.date(2013, 12, 31), 2: dt.date(2014, 1, 2), 3: dt.date(2014, 1, 3)}
STATUS_TYPES = [
    ("ACTV", "Active"),
    ("CMPT", "Completed"),
    ("CNCL", "Canceled"),
    ("PNDG", "Pending"),
    ("SBMT", "Submitted"),
    ("INAC", "Inactive"),
]
TRADE_TYPES = [
    ("TMB", "Market Buy", 0, 1),
    ("TMS", "Market Sell", 1, 1),
    ("TSL", "Stop Loss", 1, 0),
    ("TLS", "Limit Sell", 1, 0),
    ("TLB", "Limit Buy", 0, 0),
]


# ------------------------------------------------------------------------------------------- builders
def ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def money(text: str | None) -> Decimal | None:
    return None if text is None else Decimal(text)


def trade(t_id, when, status, tt="TMB", symb="SYMA", account=100, qty=100, bid="10.00", price=None, **amounts):
    """One Trade record (Trade.txt row; CDC lines add cdc_flag/cdc_dsn)."""
    return {
        "t_id": t_id,
        "t_dts": ts(when),
        "t_st_id": status,
        "t_tt_id": tt,
        "t_is_cash": True,
        "t_s_symb": symb,
        "t_qty": qty,
        "t_bid_price": money(bid),
        "t_ca_id": account,
        "t_exec_name": f"exec{t_id}",
        "t_trade_price": money(price),
        "t_chrg": money(amounts.get("chrg")),
        "t_comm": money(amounts.get("comm")),
        "t_tax": money(amounts.get("tax")),
    }


def cdc(flag, dsn, *args, **kwargs):
    return {"cdc_flag": flag, "cdc_dsn": dsn, **trade(*args, **kwargs)}


def history(t_id, when, status):
    return {"th_t_id": t_id, "th_dts": ts(when), "th_st_id": status}


def account(accountid, sk, customer, broker, eff, end=OPEN):
    return {
        "sk_accountid": sk,
        "accountid": accountid,
        "sk_brokerid": broker,
        "sk_customerid": customer,
        "accountdesc": f"account {accountid}",
        "taxstatus": 1,
        "status": "Active",
        "iscurrent": end == OPEN,
        "batchid": 1,
        "effectivedate": eff,
        "enddate": end,
    }


def security(symbol, sk, company, eff, end=OPEN):
    return {
        "sk_securityid": sk,
        "symbol": symbol,
        "issue": "COMMON",
        "status": "Active",
        "name": f"{symbol} Inc.",
        "exchangeid": "NYSE",
        "sk_companyid": company,
        "sharesoutstanding": 1000,
        "firsttrade": dt.date(2000, 1, 1),
        "firsttradeonexchange": dt.date(2000, 1, 1),
        "dividend": Decimal("0.10"),
        "iscurrent": end == OPEN,
        "batchid": 1,
        "effectivedate": eff,
        "enddate": end,
    }


def dim_trade(tradeid, create, close, status, type_, keys, batchid=1, qty=100, bid="10.00", price=None, **amounts):
    """An expected DimTrade row; `create`/`close` are (dateid, timeid) or None; `keys` = (account, customer,
    broker, security, company)."""
    sk_account, sk_customer, sk_broker, sk_security, sk_company = keys
    return {
        "tradeid": tradeid,
        "sk_brokerid": sk_broker,
        "sk_createdateid": create[0],
        "sk_createtimeid": create[1],
        "sk_closedateid": close[0] if close else None,
        "sk_closetimeid": close[1] if close else None,
        "status": status,
        "type": type_,
        "cashflag": True,
        "sk_securityid": sk_security,
        "sk_companyid": sk_company,
        "quantity": qty,
        "bidprice": money(bid),
        "sk_customerid": sk_customer,
        "sk_accountid": sk_account,
        "executedby": f"exec{tradeid}",
        "tradeprice": money(price),
        "fee": money(amounts.get("chrg")),
        "commission": money(amounts.get("comm")),
        "tax": money(amounts.get("tax")),
        "batchid": batchid,
    }


class World:
    """A lake plus the calls that stage rows, commit dimension rows and run T3, one micro-batch at a time."""

    def __init__(self, spark, root) -> None:
        settings = Settings(home=root, spark_master="local[2]")
        self.ctx = JobContext(settings, spark=spark, lake=Lake(root / "lake", spark))
        self.lines: dict[str, int] = {}
        self.sources: dict[int, set[str]] = {}  # micro-batch -> sources staged in it (as the batch log would say)
        self.batches: dict[int, set[int]] = {}  # micro-batch -> TPC-DI batches staged in it
        lake = self.ctx.lake
        lake.upsert(wh.STATUS_TYPE, self._arrow(wh.STATUS_TYPE, STATUS_TYPES), app_id="T0/statustype", version=1)
        lake.upsert(wh.TRADE_TYPE, self._arrow(wh.TRADE_TYPE, TRADE_TYPES), app_id="T0/tradetype", version=1)

    @staticmethod
    def _arrow(table: Table, rows: list) -> pa.Table:
        if rows and isinstance(rows[0], tuple):
            rows = [dict(zip(table.column_names, r, strict=True)) for r in rows]
        return pa.Table.from_pylist(rows, schema=table.arrow_schema())

    def stage(self, table: Table, micro_batch: int, source_batch: int, rows: list[dict]) -> None:
        """Append staged rows with lineage (file `Batch<k>/<table>.txt`, line numbers continuing per file)."""
        file = f"Batch{source_batch}/{table.name}.txt"
        self.batches.setdefault(micro_batch, set()).add(source_batch)
        self.sources.setdefault(micro_batch, set()).update(
            s.name for s in src.ALL_SOURCES if s.staging.name == table.name
        )
        first = self.lines.get(file, 0)
        self.lines[file] = first + len(rows)
        lineage = {"batch_id": micro_batch, "source_batch": source_batch, "source_file": file}
        full = [{**r, **lineage, "line_no": first + i + 1} for i, r in enumerate(rows)]
        self.ctx.lake.append(table, self._arrow(table, full), app_id=f"test/{file}", version=self.lines[file])

    def dims(self, micro_batch: int, accounts=(), securities=()) -> None:
        """Commit dimension versions as T2/T1 would in this micro-batch."""
        if accounts:
            data = self._arrow(wh.DIM_ACCOUNT, list(accounts))
            self.ctx.lake.upsert(wh.DIM_ACCOUNT, data, app_id="T2/dimaccount", version=micro_batch)
        if securities:
            data = self._arrow(wh.DIM_SECURITY, list(securities))
            self.ctx.lake.upsert(wh.DIM_SECURITY, data, app_id="T1/dimsecurity", version=micro_batch)

    def run(self, micro_batch: int) -> dict[str, int]:
        """T3 of `micro_batch`, whose TPC-DI batches are those it staged (none: the latest staged before it)."""
        staged = self.batches.get(micro_batch) or {
            max((b for m, bs in self.batches.items() if m < micro_batch for b in bs), default=1)
        }
        scope = BatchScope(
            batch_id=micro_batch,
            source_batches=tuple(sorted(staged)),
            batch_dates=BATCH_DATES,
            sources=frozenset(self.sources.get(micro_batch, ())),
        )
        return create_trades.run(self.ctx, scope)

    def table(self, table: Table) -> list[dict]:
        return self.ctx.lake.read_arrow(table).to_pylist() if self.ctx.lake.exists(table) else []

    def messages(self) -> list[dict]:
        return [m for m in self.table(wh.DI_MESSAGES) if m["messagesource"] == "DimTrade"]


# --------------------------------------------------------------------------------------- the scenario
# Account 100 changes on 2013-06-01 (v1 -> v2); security SYMB changes on 2013-07-01.
ACCOUNT_100_V1 = account(100, 1001, 501, 701, dt.date(2013, 1, 1), dt.date(2013, 6, 1))
ACCOUNT_100_ONLY_V1 = account(100, 1001, 501, 701, dt.date(2013, 1, 1))  # before v2 is known
ACCOUNT_100_V2 = account(100, 1002, 502, 701, dt.date(2013, 6, 1))
ACCOUNT_200 = account(200, 2001, 601, 702, dt.date(2013, 1, 1))
SYMA = security("SYMA", 11, 21, dt.date(2012, 1, 1))
SYMB_V1 = security("SYMB", 12, 22, dt.date(2012, 1, 1), dt.date(2013, 7, 1))
SYMB_V2 = security("SYMB", 13, 23, dt.date(2013, 7, 1))

B1_HISTORY = [
    # 1: market buy, SBMT creates it
    history(1, "2013-05-01 10:00:01", "SBMT"),
    history(1, "2013-05-01 10:05:00", "CMPT"),
    # 2: limit buy, PNDG creates it (not its SBMT), on SYMB's first version
    history(2, "2013-06-20 09:00:00", "PNDG"),
    history(2, "2013-07-02 11:00:00", "SBMT"),
    history(2, "2013-07-02 11:00:30", "CMPT"),
    # 3: limit sell, canceled
    history(3, "2013-03-03 08:00:00", "PNDG"),
    history(3, "2013-03-10 16:30:00", "CNCL"),
    # 4: limit buy, pending at the end of Batch1, completed in Batch2
    history(4, "2013-12-30 15:00:00", "PNDG"),
    # 5: market sell with a commission above its value (10 x 1.00) and a fee equal to it
    history(5, "2013-04-04 12:00:00", "SBMT"),
    history(5, "2013-04-04 12:01:00", "CMPT"),
]
B1_TRADES = [
    trade(1, "2013-05-01 10:05:00", "CMPT", price="10.50", chrg="1.00", comm="2.00", tax="0.50"),
    trade(
        2, "2013-07-02 11:00:30", "CMPT", "TLB", "SYMB", 200, 50, "20.00", "19.90", chrg="3.00", comm="4.00", tax="1.00"
    ),
    trade(3, "2013-03-10 16:30:00", "CNCL", "TLS", "SYMA", 200, 30, "5.00"),
    trade(4, "2013-12-30 15:00:00", "PNDG", "TLB", "SYMA", 100, 70, "8.00"),
    trade(5, "2013-04-04 12:01:00", "CMPT", "TMS", "SYMA", 200, 10, "1.00", "1.00", chrg="10.00", comm="10.01"),
]
B2_CDC = [
    cdc("U", 5, 4, "2014-01-02 09:30:00", "SBMT", "TLB", "SYMA", 100, 70, "8.00"),
    cdc("U", 6, 4, "2014-01-02 09:31:00", "CMPT", "TLB", "SYMA", 100, 70, "8.00", "7.90", chrg="1.10", comm="2.20"),
    # 6: new in Batch2; its fee (10.50) exceeds its value (5 x 2.00)
    cdc("I", 7, 6, "2014-01-02 10:00:00", "SBMT", "TMB", "SYMA", 200, 5, "2.00"),
    cdc("U", 8, 6, "2014-01-02 10:00:05", "CMPT", "TMB", "SYMA", 200, 5, "2.00", "2.00", chrg="10.50", comm="1.00"),
]

K100_V1 = (1001, 501, 701, 11, 21)
K100_V2 = (1002, 502, 701, 11, 21)
K200_SYMA = (2001, 601, 702, 11, 21)
EXPECTED = [
    dim_trade(
        1,
        (20130501, 100001),
        (20130501, 100500),
        "Completed",
        "Market Buy",
        K100_V1,
        price="10.50",
        chrg="1.00",
        comm="2.00",
        tax="0.50",
    ),
    dim_trade(
        2,
        (20130620, 90000),
        (20130702, 110030),
        "Completed",
        "Limit Buy",
        (2001, 601, 702, 12, 22),
        qty=50,
        bid="20.00",
        price="19.90",
        chrg="3.00",
        comm="4.00",
        tax="1.00",
    ),
    dim_trade(3, (20130303, 80000), (20130310, 163000), "Canceled", "Limit Sell", K200_SYMA, qty=30, bid="5.00"),
    dim_trade(
        4,
        (20131230, 150000),
        (20140102, 93100),
        "Completed",
        "Limit Buy",
        K100_V2,
        batchid=2,
        qty=70,
        bid="8.00",
        price="7.90",
        chrg="1.10",
        comm="2.20",
    ),
    dim_trade(
        5,
        (20130404, 120000),
        (20130404, 120100),
        "Completed",
        "Market Sell",
        K200_SYMA,
        qty=10,
        bid="1.00",
        price="1.00",
        chrg="10.00",
        comm="10.01",
    ),
    dim_trade(
        6,
        (20140102, 100000),
        (20140102, 100005),
        "Completed",
        "Market Buy",
        K200_SYMA,
        batchid=2,
        qty=5,
        bid="2.00",
        price="2.00",
        chrg="10.50",
        comm="1.00",
    ),
]


def alert(batchid, text, data, key):
    return {
        "messagedateandtime": dt.datetime.combine(BATCH_DATES[batchid], dt.time(), tzinfo=dt.UTC),
        "batchid": batchid,
        "messagesource": "DimTrade",
        "messagetext": text,
        "messagetype": "Alert",
        "messagedata": data,
        "messagekey": key,
    }


EXPECTED_ALERTS = [
    alert(1, "Invalid trade commission", "T_ID = 5, T_COMM = 10.01", "commission T_ID=5"),
    alert(2, "Invalid trade fee", "T_ID = 6, T_CHRG = 10.50", "fee T_ID=6 CDC_DSN=8"),
]


@pytest.fixture(scope="module")
def whole(spark, tmp_path_factory) -> World:
    """Everything (Batch1 and Batch2 records, every dimension version) in one micro-batch."""
    return whole_world(World(spark, tmp_path_factory.mktemp("t3-whole")))


@pytest.fixture(scope="module")
def split(spark, tmp_path_factory) -> World:
    """The same records cut into five micro-batches, dimensions arriving late and in pieces, a U line ahead of
    its trade's I line."""
    return split_world(World(spark, tmp_path_factory.mktemp("t3-split")))


@pytest.fixture(scope="module")
def split_in_spark(spark, tmp_path_factory) -> World:
    """`split` with the candidate trades always selected from every staged record (`candidate_records`), never
    read by id."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trade_candidates, "DRIVER_CANDIDATES", 0)
        return split_world(World(spark, tmp_path_factory.mktemp("t3-split-spark")))


@pytest.fixture(scope="module")
def whole_in_pieces(spark, tmp_path_factory) -> World:
    """`whole` with its six trades read and recomputed two at a time (`TRADES_PER_PIECE`), as a big load is."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trade_candidates, "TRADES_PER_PIECE", 2)
        return whole_world(World(spark, tmp_path_factory.mktemp("t3-whole-pieces")))


@pytest.fixture(scope="module")
def split_in_pieces(spark, tmp_path_factory) -> World:
    """`split` with the candidates selected from every staged record's trade ids and recomputed two at a time."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trade_candidates, "DRIVER_CANDIDATES", 0)
        patch.setattr(trade_candidates, "TRADES_PER_PIECE", 2)
        return split_world(World(spark, tmp_path_factory.mktemp("t3-split-pieces")))


def whole_world(w: World) -> World:
    w.stage(src.TRADE_HISTORY.staging, 1, 1, B1_HISTORY)
    w.stage(src.TRADE.staging, 1, 1, B1_TRADES)
    w.stage(src.TRADE_CDC.staging, 1, 2, B2_CDC)
    w.dims(1, [ACCOUNT_100_V1, ACCOUNT_100_V2, ACCOUNT_200], [SYMA, SYMB_V1, SYMB_V2])
    w.rows = w.run(1)
    return w


def split_world(w: World) -> World:
    w.stage(src.TRADE_HISTORY.staging, 1, 1, B1_HISTORY)  # history before Trade.txt
    w.dims(1, [ACCOUNT_100_ONLY_V1], [SYMA, SYMB_V1, SYMB_V2])
    w.run(1)
    w.holds_after_1 = w.table(TRADE_HOLDS)
    w.stage(src.TRADE.staging, 2, 1, B1_TRADES)
    w.run(2)  # 1 and 4 on account 100's only version; 2, 3, 5 held for account 200
    w.after_2 = {r["tradeid"]: r for r in w.table(wh.DIM_TRADE)}
    w.holds_after_2 = w.table(TRADE_HOLDS)
    w.dims(3, [ACCOUNT_100_V1, ACCOUNT_100_V2, ACCOUNT_200])  # 100's v2 starts before trade 4's creation
    w.run(3)
    w.stage(src.TRADE_CDC.staging, 4, 2, B2_CDC[1:2] + B2_CDC[3:])  # U lines only: 6 has no creation record
    w.run(4)
    w.holds_after_4 = w.table(TRADE_HOLDS)
    w.stage(src.TRADE_CDC.staging, 5, 2, [B2_CDC[0], B2_CDC[2]])
    w.run(5)
    return w


# ------------------------------------------------------------------------------------------------ tests
def test_batch1_trades_take_create_and_close_from_their_history(whole):
    rows = {r["tradeid"]: r for r in whole.table(wh.DIM_TRADE)}
    assert rows[1] == EXPECTED[0]  # market: created by SBMT 10:00:01, closed by CMPT 10:05:00


def test_limit_trade_is_created_by_pndg_and_market_trade_by_sbmt(whole):
    rows = {r["tradeid"]: r for r in whole.table(wh.DIM_TRADE)}
    assert (rows[2]["sk_createdateid"], rows[2]["sk_createtimeid"]) == (20130620, 90000)  # PNDG, not SBMT
    assert (rows[1]["sk_createdateid"], rows[1]["sk_createtimeid"]) == (20130501, 100001)
    assert rows[2] == EXPECTED[1]  # SYMB's version valid on 2013-06-20, not the one of the SBMT day


def test_canceled_trade_is_closed_by_cncl_and_has_no_amounts(whole):
    rows = {r["tradeid"]: r for r in whole.table(wh.DIM_TRADE)}
    assert rows[3] == EXPECTED[2]


def test_trade_created_in_batch1_and_closed_by_a_later_u_line(whole):
    rows = {r["tradeid"]: r for r in whole.table(wh.DIM_TRADE)}
    assert rows[4] == EXPECTED[3]  # created 2013-12-30 (Batch1), closed 2014-01-02 (Batch2), batchid 2


def test_whole_load_gives_every_expected_row_and_the_counts(whole):
    assert whole.table(wh.DIM_TRADE) == EXPECTED
    assert whole.rows == {"dimtrade": 6, "dimessages": 2, "trade_holds": 0}
    assert whole.table(TRADE_HOLDS) == []


def test_alerts_one_per_offending_record_with_the_spec_texts(whole):
    # trade 5: commission 10.01 > 10 x 1.00 (its fee 10.00 is not above); trade 6: fee 10.50 > 5 x 2.00
    assert whole.messages() == EXPECTED_ALERTS


def test_keys_are_fixed_at_creation_even_after_a_later_account_version(split):
    # micro-batch 2 knew only account 100's first version: trade 1 (May) and trade 4 (December) took it
    assert split.after_2[1]["sk_accountid"] == 1001
    assert split.after_2[4]["sk_accountid"] == 1001
    rows = {r["tradeid"]: r for r in split.table(wh.DIM_TRADE)}
    # v2 (from 2013-06-01) arrived in micro-batch 3: trade 1 keeps v1, trade 4 (created 2013-12-30) moves to v2
    assert rows[1] == EXPECTED[0]
    assert rows[4] == EXPECTED[3]


def test_held_trades_wait_for_their_trade_record_account_and_first_record(split):
    assert split.holds_after_1 == [
        {"tradeid": t, "first_batch": 1, "source_batch": 1, "state": "held", "reason": "no Trade record yet"}
        for t in (1, 2, 3, 4, 5)
    ]
    assert sorted(split.after_2) == [1, 4]
    assert split.holds_after_2 == [
        {
            "tradeid": t,
            "first_batch": 1,
            "source_batch": 1,
            "state": "held",
            "reason": f"account 200 has no DimAccount version on {day}",
        }
        for t, day in ((2, "2013-06-20"), (3, "2013-03-03"), (5, "2013-04-04"))
    ]
    assert split.holds_after_4 == [
        {
            "tradeid": 6,
            "first_batch": 4,
            "source_batch": 2,
            "state": "held",
            "reason": "no creation record (PNDG, SBMT or I) yet",
        }
    ]
    assert split.table(TRADE_HOLDS) == []


def test_split_over_micro_batches_gives_identical_tables(whole, split):
    assert split.table(wh.DIM_TRADE) == whole.table(wh.DIM_TRADE) == EXPECTED
    assert split.messages() == whole.messages() == EXPECTED_ALERTS


def test_candidates_selected_from_every_record_give_the_same_tables(split, split_in_spark):
    assert split_in_spark.table(wh.DIM_TRADE) == EXPECTED
    assert split_in_spark.messages() == EXPECTED_ALERTS
    assert split_in_spark.holds_after_2 == split.holds_after_2
    assert split_in_spark.holds_after_4 == split.holds_after_4


def test_trades_recomputed_in_pieces_give_the_same_tables(whole_in_pieces, split, split_in_pieces):
    """A big load reads and recomputes its trades a piece at a time (here two trades a piece): the same DimTrade,
    alerts and holds as one piece, whole and split."""
    assert whole_in_pieces.table(wh.DIM_TRADE) == EXPECTED
    assert whole_in_pieces.messages() == EXPECTED_ALERTS
    assert whole_in_pieces.rows == {"dimtrade": 6, "dimessages": 2, "trade_holds": 0}
    assert whole_in_pieces.table(TRADE_HOLDS) == []
    # the first load wrote each piece as a file of its own; the pieces ascend by trade id, as the declared order
    files = sorted(whole_in_pieces.ctx.lake.path(wh.DIM_TRADE).glob("*.parquet"))
    assert [f.name for f in files] == [f"T3-dimtrade-v1-piece-{i:05d}.snappy.parquet" for i in range(3)]
    assert [pq.read_table(f)["tradeid"].to_pylist() for f in files] == [[1, 2], [3, 4], [5, 6]]
    assert split_in_pieces.table(wh.DIM_TRADE) == EXPECTED
    assert split_in_pieces.messages() == EXPECTED_ALERTS
    for stage in ("holds_after_1", "holds_after_2", "holds_after_4"):
        assert getattr(split_in_pieces, stage) == getattr(split, stage)


def test_rerun_of_a_committed_micro_batch_changes_nothing(split):
    lake = split.ctx.lake
    before = {t.name: lake.version(t) for t in (wh.DIM_TRADE, wh.DI_MESSAGES, TRADE_HOLDS)}
    assert split.run(5) == {}
    assert {t.name: lake.version(t) for t in (wh.DIM_TRADE, wh.DI_MESSAGES, TRADE_HOLDS)} == before
    assert split.table(wh.DIM_TRADE) == EXPECTED


def test_held_trades_are_resolved_when_their_account_or_creation_record_arrives(spark, tmp_path):
    w = World(spark, tmp_path)
    w.dims(1, [ACCOUNT_200], [SYMA])
    # 8: a limit order whose SBMT arrives before its PNDG -- SBMT does not create a limit order
    w.stage(src.TRADE_HISTORY.staging, 1, 1, [history(8, "2013-08-16 10:00:00", "SBMT")])
    w.stage(src.TRADE.staging, 1, 1, [trade(8, "2013-08-16 10:00:00", "SBMT", "TLB", "SYMA", 200)])
    assert w.run(1) == {"dimtrade": 0, "dimessages": 0, "trade_holds": 1}
    no_pndg = {
        "tradeid": 8,
        "first_batch": 1,
        "source_batch": 1,
        "state": "held",
        "reason": "no creation record (PNDG, SBMT or I) yet",
    }
    assert w.table(TRADE_HOLDS) == [no_pndg]

    w.stage(src.TRADE_HISTORY.staging, 2, 1, [history(8, "2013-08-15 09:00:00", "PNDG")])
    w.run(2)  # 8 resolves
    assert w.table(TRADE_HOLDS) == []
    assert w.table(wh.DIM_TRADE) == [
        dim_trade(8, (20130815, 90000), None, "Submitted", "Limit Buy", K200_SYMA),
    ]

    w.stage(src.TRADE_CDC.staging, 3, 2, [cdc("I", 1, 7, "2014-01-02 11:00:00", "SBMT", account=300)])
    w.run(3)
    account_300 = {
        "tradeid": 7,
        "first_batch": 3,
        "source_batch": 2,
        "state": "held",
        "reason": "account 300 has no DimAccount version on 2014-01-02",
    }
    assert w.table(TRADE_HOLDS) == [account_300]
    w.run(4)  # nothing new: 7 is still held with the same first_batch
    assert w.table(TRADE_HOLDS) == [account_300]

    w.dims(5, [account(300, 3001, 801, 703, dt.date(2014, 1, 2))])
    w.run(5)
    assert w.table(wh.DIM_TRADE) == [
        dim_trade(7, (20140102, 110000), None, "Submitted", "Market Buy", (3001, 801, 703, 11, 21), batchid=2),
        dim_trade(8, (20130815, 90000), None, "Submitted", "Limit Buy", K200_SYMA),
    ]
    assert w.table(TRADE_HOLDS) == []
    assert w.messages() == []


def test_a_held_trade_waits_as_long_as_its_batch_lasts_and_is_rejected_when_the_next_starts(spark, tmp_path):
    w = World(spark, tmp_path)
    w.dims(1, [ACCOUNT_200], [SYMA])
    w.stage(src.TRADE_CDC.staging, 1, 2, [cdc("I", 1, 9, "2014-01-02 11:00:00", "SBMT", account=999)])
    w.run(1)
    for micro_batch in range(2, 26):  # more micro-batches of TPC-DI batch 2 than the old limit of 20
        w.stage(
            src.TRADE_CDC.staging,
            micro_batch,
            2,
            [cdc("I", micro_batch, 100 + micro_batch, "2014-01-02 12:00:00", "SBMT", account=200)],
        )
        w.run(micro_batch)
    assert w.table(TRADE_HOLDS)[0]["state"] == "held"
    assert w.messages() == []
    # the first micro-batch of TPC-DI batch 3 rejects it, before its own records are looked at: the account
    # arriving with it does not save the trade (a whole Batch3 would not either)
    w.stage(src.TRADE_CDC.staging, 26, 3, [cdc("I", 26, 300, "2014-01-03 10:00:00", "SBMT", account=200)])
    w.dims(26, [account(999, 9991, 901, 709, dt.date(2014, 1, 1))])
    w.run(26)
    reason = "account 999 has no DimAccount version on 2014-01-02"
    assert w.table(TRADE_HOLDS) == [
        {"tradeid": 9, "first_batch": 1, "source_batch": 2, "state": "rejected", "reason": reason}
    ]
    assert w.messages() == [
        alert(
            2, "Trade rejected", f"T_ID = 9, still unresolved at the end of TPC-DI batch 2: {reason}", "rejected T_ID=9"
        )
    ]
    assert 9 not in {r["tradeid"] for r in w.table(wh.DIM_TRADE)}
    # rejection is final
    w.run(27)
    assert w.table(TRADE_HOLDS)[0]["state"] == "rejected"
    assert 9 not in {r["tradeid"] for r in w.table(wh.DIM_TRADE)}


def three_batch1_trades(spark, tmp_path) -> World:
    """Trades 1-3 with their history staged by micro-batch 1: 1 is touched by nothing, 2 is on account 200
    (changed in the candidate tests), 3 is held."""
    w = World(spark, tmp_path)
    w.stage(
        src.TRADE.staging,
        1,
        1,
        [
            trade(1, "2013-05-01 10:05:00", "CMPT", account=100),
            trade(2, "2013-05-02 10:05:00", "CMPT", account=200),
            trade(3, "2013-05-03 10:05:00", "PNDG", "TLB", symb="SYMB", account=300),
        ],
    )
    w.stage(src.TRADE_HISTORY.staging, 1, 1, [history(t, f"2013-05-0{t} 10:00:00", "SBMT") for t in (1, 2, 3)])
    return w


def test_candidates_are_every_record_of_the_trades_a_micro_batch_can_touch(spark, tmp_path):
    w = three_batch1_trades(spark, tmp_path)
    w.stage(src.TRADE_CDC.staging, 2, 2, [cdc("I", 1, 4, "2014-01-02 09:30:00", "SBMT")])  # new in micro-batch 2
    staged = (src.TRADE.staging, src.TRADE_HISTORY.staging, src.TRADE_CDC.staging)
    records = trades.trade_records(*[w.ctx.lake.read_arrow(t) for t in staged])
    held = pa.array([3], pa.int64())
    changed_accounts = pa.array([200], pa.int64())
    got = trades.candidate_records(records, 2, held, changed_accounts, None)
    rows = sorted((r["tradeid"], r["_kind"], r["batch_id"]) for r in got.to_pylist())
    history_kind, trade_kind = trades.HISTORY, trades.TRADE
    assert rows == sorted(
        [
            (2, trade_kind, 1),
            (2, history_kind, 1),
            (3, trade_kind, 1),
            (3, history_kind, 1),
            (4, trade_kind, 2),
        ]
    )


def test_driver_side_candidates_are_the_records_of_the_touched_trades_in_scope(spark, tmp_path):
    """`candidate_ids`/`candidate_tables` (delta-rs, for small micro-batches) keep the rows `candidate_records`
    keeps: every record up to this micro-batch of the trades it can touch, never one of a skipped micro-batch."""
    w = three_batch1_trades(spark, tmp_path)
    w.stage(src.TRADE_CDC.staging, 2, 2, [cdc("U", 1, 2, "2014-01-02 09:00:00", "CMPT", account=200)])  # skipped
    w.stage(src.TRADE_CDC.staging, 3, 2, [cdc("I", 2, 4, "2014-01-02 09:30:00", "SBMT")])  # this micro-batch
    w.stage(src.TRADE_CDC.staging, 4, 2, [cdc("U", 3, 3, "2014-01-02 10:00:00", "CMPT", symb="SYMB")])  # later
    scope = BatchScope(batch_id=3, source_batches=(2,), skipped=frozenset({2}))
    staged = (src.TRADE.staging, src.TRADE_HISTORY.staging, src.TRADE_CDC.staging)
    ids = trade_candidates.candidate_ids(
        w.ctx, scope, staged, pa.array([3], pa.int64()), pa.array([200], pa.int64()), pa.array(["NONE"])
    )
    assert sorted(ids.to_pylist()) == [2, 3, 4]
    found = trade_candidates.candidate_tables(w.ctx, scope, staged, ids)
    got = trades.trade_records(*found)
    rows = sorted((r["tradeid"], r["_kind"], r["batch_id"]) for r in got.to_pylist())
    history_kind, trade_kind = trades.HISTORY, trades.TRADE
    assert rows == [
        (2, history_kind, 1),
        (2, trade_kind, 1),
        (3, history_kind, 1),
        (3, trade_kind, 1),
        (4, trade_kind, 3),
    ]


def test_driver_side_dimension_versions_are_all_versions_of_the_keys_the_records_name(spark, tmp_path):
    """`versions_named` gives every DimAccount/DimSecurity version (all of them, not just current ones) of the
    accounts and symbols the candidate records name, and none of the others."""
    w = three_batch1_trades(spark, tmp_path)
    w.stage(src.TRADE_CDC.staging, 2, 2, [cdc("I", 1, 4, "2014-01-02 09:30:00", "SBMT", symb="SYMB", account=400)])
    w.dims(
        1,
        [
            account(100, 1001, 801, 701, dt.date(2013, 1, 1), dt.date(2013, 6, 1)),
            account(100, 1002, 801, 701, dt.date(2013, 6, 1)),
            account(400, 4001, 804, 701, dt.date(2013, 1, 1)),
            account(500, 5001, 805, 701, dt.date(2013, 1, 1)),
        ],
        [
            security("SYMB", 21, 31, dt.date(2013, 1, 1), dt.date(2013, 7, 1)),
            security("SYMC", 23, 33, dt.date(2013, 1, 1)),
        ],
    )
    scope = BatchScope(batch_id=2, source_batches=(2,))
    staged = (src.TRADE.staging, src.TRADE_HISTORY.staging, src.TRADE_CDC.staging)
    found = trade_candidates.candidate_tables(w.ctx, scope, staged, pa.array([1, 4], pa.int64()))
    accounts = trade_candidates.versions_named(w.ctx, wh.DIM_ACCOUNT, "accountid", found, "t_ca_id")
    securities = trade_candidates.versions_named(w.ctx, wh.DIM_SECURITY, "symbol", found, "t_s_symb")
    assert sorted(accounts["sk_accountid"].to_pylist()) == [1001, 1002, 4001]  # trade 1: 100, trade 4: 400
    assert sorted(securities["sk_securityid"].to_pylist()) == [21]  # SYMA has no version, SYMB one
    # a dimension not created yet (no T1 commit so far) gives no versions
    w2 = three_batch1_trades(spark, tmp_path / "fresh")
    assert trade_candidates.versions_named(w2.ctx, wh.DIM_SECURITY, "symbol", found, "t_s_symb").num_rows == 0
