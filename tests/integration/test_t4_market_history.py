"""FactMarketHistory through its run edge (`jobs.market_history.run`) on real Delta tables (delta-rs; the step
needs no Spark), against a from-scratch oracle written here.

The scenario: two securities over two years with gaps in their DailyMarket (2016 is a leap year), a security
version change, a company with fewer than four quarters of earnings, a symbol without a security, and a record of
an incremental batch. It is loaded whole (every Batch1 record in one micro-batch) and cut three other ways, one of
them delivering days out of order; every load must end with the oracle's rows, the same alerts and the same
slices. The oracle takes, for each record, every record of the 52 weeks ending on its day, the security version
of its day, and the EPS of the four quarters before its day's quarter."""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import market_history as mh
from jobs import validate
from jobs.scope import BatchScope
from schemas import sources as src
from schemas import warehouse as wh
from schemas.holds import MARKET_SLICES
from streamdi.context import JobContext
from streamdi.lake import SCRATCH_DIR, Lake
from streamdi.settings import Settings

pytestmark = pytest.mark.integration

D = dt.date
OPEN = D(9999, 12, 31)
CENT = Decimal("0.01")


def security(symbol, sk, company, dividend, eff, end=OPEN):
    return {
        "sk_securityid": sk,
        "symbol": symbol,
        "issue": "COMMON",
        "status": "Active",
        "name": symbol,
        "exchangeid": "NYSE",
        "sk_companyid": company,
        "sharesoutstanding": 1000,
        "firsttrade": D(2000, 1, 1),
        "firsttradeonexchange": D(2000, 1, 1),
        "dividend": Decimal(dividend),
        "iscurrent": end == OPEN,
        "batchid": 1,
        "effectivedate": eff,
        "enddate": end,
    }


SECURITIES = [
    security("AAA", 11, 31, "1.00", D(2015, 1, 1), D(2016, 6, 1)),  # the dividend doubles on 2016-06-01
    security("AAA", 12, 31, "2.00", D(2016, 6, 1)),
    security("BBB", 21, 41, "0.50", D(2015, 3, 1)),
]
COMPANIES = [(31, 7), (41, 8)]  # (sk_companyid, CIK)
# CIK 7 reports every quarter of 2015 and 2016; CIK 8 only 2016 Q2 and Q3
EPS = {(31, 2015, q): Decimal("0.25") * q for q in (1, 2, 3, 4)} | {
    (31, 2016, q): Decimal("-0.10") + q for q in (1, 2, 3, 4)
}
EPS |= {(41, 2016, 2): Decimal("0.07"), (41, 2016, 3): Decimal("-0.07")}  # a zero sum when both are in


def market_records(seed: int = 3) -> list[dict]:
    """DailyMarket records: AAA on about 80% of the days of 2015-2016, BBB on about 60% from 2015-03-01 (its
    security starts then), ZZZ once (no security)."""
    rng = np.random.default_rng(seed)
    out = []
    for symbol, first, rate in (("AAA", D(2015, 1, 1), 0.8), ("BBB", D(2015, 3, 1), 0.6)):
        day = first
        while day <= D(2016, 12, 30):
            if rng.random() < rate:
                close = int(rng.integers(1000, 5000))
                high, low = close + int(rng.integers(0, 300)), close - int(rng.integers(0, 300))
                out.append(record(symbol, day, close, high, low, int(rng.integers(1, 10**6))))
            day += dt.timedelta(days=1)
    out.append(record("ZZZ", D(2016, 3, 3), 100, 110, 90, 5))
    return out


def record(symbol, day, close, high, low, vol, batch=1, dsn=None):
    return {
        "dm_date": day,
        "dm_s_symb": symbol,
        "dm_close": Decimal(close) / 100,
        "dm_high": Decimal(high) / 100,
        "dm_low": Decimal(low) / 100,
        "dm_vol": vol,
        "source_batch": batch,
        "cdc_dsn": dsn,
    }


BATCH1 = market_records()
# the incremental batch: a new day of AAA, 2016-12-31
BATCH2 = [record("AAA", D(2016, 12, 31), 4321, 9999, 10, 77, batch=2, dsn=1)]


class World:
    def __init__(self, root) -> None:
        self.ctx = JobContext(Settings(home=root), lake=Lake(root / "lake"))
        self.files = 0

    def dims(self, micro: int) -> None:
        lake = self.ctx.lake
        lake.upsert(wh.DIM_SECURITY, _arrow(wh.DIM_SECURITY, SECURITIES), app_id="T1/dimsecurity", version=micro)
        companies = [_company(sk, cik) for sk, cik in COMPANIES]
        lake.upsert(wh.DIM_COMPANY, _arrow(wh.DIM_COMPANY, companies), app_id="T1/dimcompany", version=micro)
        financial = [_financial(sk, y, q, eps) for (sk, y, q), eps in EPS.items()]
        lake.upsert(wh.FINANCIAL, _arrow(wh.FINANCIAL, financial), app_id="T1/financial", version=micro)

    def stage(self, micro: int, rows: list[dict]) -> None:
        if not rows:
            return
        cdc = rows[0]["cdc_dsn"] is not None
        table = (src.DAILY_MARKET_CDC if cdc else src.DAILY_MARKET).staging
        self.files += 1
        staged = [
            {**{k: v for k, v in r.items() if cdc or k != "cdc_dsn"}, "batch_id": micro, "line_no": i + 1}
            | {"source_file": f"f{self.files}", **({"cdc_flag": "I"} if cdc else {})}
            for i, r in enumerate(rows)
        ]
        self.ctx.lake.append(table, _arrow(table, staged), app_id=f"stage/{self.files}", version=micro)

    def run(self, micro: int, batch: int) -> dict:
        scope = BatchScope(batch_id=micro, source_batches=(batch,), batch_dates={1: D(2016, 12, 30), 2: D(2017, 1, 1)})
        return mh.run(self.ctx, scope)

    def table(self, table) -> list[dict]:
        return self.ctx.lake.read_arrow(table).to_pylist()

    def alerts(self) -> list[tuple]:
        return sorted(
            (m["batchid"], m["messagetext"], m["messagekey"], m["messagedata"])
            for m in self.table(wh.DI_MESSAGES)
            if m["messagesource"] == "FactMarketHistory"
        )


def _arrow(table, rows):
    schema = table.arrow_schema()
    return pa.table({f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in schema}, schema=schema)


def _company(sk, cik):
    return {
        "sk_companyid": sk,
        "companyid": cik,
        "status": "Active",
        "name": f"C{cik}",
        "industry": "Ind",
        "ceo": "X",
        "postalcode": "1",
        "city": "C",
        "stateprov": "S",
        "description": "d",
        "iscurrent": True,
        "batchid": 1,
        "effectivedate": D(2000, 1, 1),
        "enddate": OPEN,
    }


def _financial(sk, year, qtr, eps):
    zero = Decimal("0")
    return {
        "sk_companyid": sk,
        "fi_year": year,
        "fi_qtr": qtr,
        "fi_qtr_start_date": D(year, 3 * qtr - 2, 1),
        **dict.fromkeys(("fi_revenue", "fi_net_earn", "fi_dilut_eps", "fi_margin"), zero),
        **dict.fromkeys(("fi_inventory", "fi_assets", "fi_liability"), zero),
        "fi_basic_eps": eps,
        "fi_out_basic": 1,
        "fi_out_dilut": 1,
    }


# ------------------------------------------------------------------------------------------------ oracle
def date_id(day: D) -> int:
    return day.year * 10000 + day.month * 100 + day.day


def oracle(records: list[dict]) -> tuple[list[dict], list[tuple]]:
    """The expected FactMarketHistory rows (in the table's order) and alerts, from every record at once."""
    rows, alerts = [], []
    for r in records:
        symbol, day = r["dm_s_symb"], r["dm_date"]
        version = next(
            (s for s in SECURITIES if s["symbol"] == symbol and s["effectivedate"] <= day < s["enddate"]), None
        )
        key = f"SYMB={symbol} DATE={day}"
        if version is None:
            data = f"DM_S_SYMB = {symbol}, DM_DATE = {day}: no DimSecurity version on that day"
            alerts.append((r["source_batch"], "Market history not loaded", key, data))
            continue
        window = [
            x for x in records if x["dm_s_symb"] == symbol and day - dt.timedelta(days=363) <= x["dm_date"] <= day
        ]
        high = max(x["dm_high"] for x in window)
        low = min(x["dm_low"] for x in window)
        high_day = min(x["dm_date"] for x in window if x["dm_high"] == high)
        low_day = min(x["dm_date"] for x in window if x["dm_low"] == low)
        quarter = day.year * 4 + (day.month - 1) // 3
        earlier = [
            eps
            for (sk, y, q), eps in EPS.items()
            if sk == version["sk_companyid"] and quarter - 4 <= y * 4 + q - 1 <= quarter - 1
        ]
        total = sum(earlier, Decimal(0))
        pe = (r["dm_close"] / total).quantize(CENT, ROUND_HALF_UP) if earlier and total != 0 else None
        if pe is None:
            alerts.append((r["source_batch"], "No earnings for company", key, f"DM_S_SYMB = {symbol}"))
        rows.append(
            {
                "sk_securityid": version["sk_securityid"],
                "sk_companyid": version["sk_companyid"],
                "sk_dateid": date_id(day),
                "peratio": pe,
                "yield": (version["dividend"] / r["dm_close"] * 100).quantize(CENT, ROUND_HALF_UP),
                "fiftytwoweekhigh": high,
                "sk_fiftytwoweekhighdate": date_id(high_day),
                "fiftytwoweeklow": low,
                "sk_fiftytwoweeklowdate": date_id(low_day),
                "closeprice": r["dm_close"],
                "dayhigh": r["dm_high"],
                "daylow": r["dm_low"],
                "volume": r["dm_vol"],
                "batchid": r["source_batch"],
                "symbol": symbol,
            }
        )
    rows.sort(key=lambda x: (x["sk_dateid"], x["symbol"]))
    return rows, sorted(alerts)


EXPECTED_ROWS, EXPECTED_ALERTS = oracle(BATCH1 + BATCH2)


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> World:
    w = World(tmp_path_factory.mktemp("fmh-whole"))
    w.dims(1)
    w.stage(1, BATCH1)
    w.run(1, 1)
    w.stage(2, BATCH2)
    w.run(2, 2)
    return w


def test_a_whole_load_gives_the_from_scratch_rows_and_alerts(whole):
    assert whole.table(wh.FACT_MARKET_HISTORY) == EXPECTED_ROWS
    assert whole.alerts() == EXPECTED_ALERTS


def test_the_oracle_covers_the_cases_the_rules_name():
    by_key = {(r["symbol"], r["sk_dateid"]): r for r in EXPECTED_ROWS}
    # fewer than four quarters: BBB in 2016 Q3 has only Q2 (0.07); in 2016 Q4 Q2 + Q3 sum to 0: no earnings
    assert any(k[0] == "BBB" and 20160701 <= k[1] < 20161001 and r["peratio"] for k, r in by_key.items())
    assert any(k[0] == "BBB" and k[1] >= 20161001 and r["peratio"] is None for k, r in by_key.items())
    # the first year: a window shorter than 52 weeks; the dividend of each version
    assert {r["yield"] > 0 for r in EXPECTED_ROWS} == {True}
    assert by_key[("AAA", 20161231)]["fiftytwoweekhigh"] == Decimal("99.99")  # the incremental day's own high
    assert any(a[1] == "Market history not loaded" for a in EXPECTED_ALERTS)


@pytest.mark.parametrize("cut", ["halves", "shuffled", "days_late_then_dims"])
def test_any_cut_into_micro_batches_gives_the_whole_load(cut, whole, tmp_path):
    w = World(tmp_path)
    rng = np.random.default_rng(11)
    if cut == "halves":
        w.dims(1)
        w.stage(1, BATCH1[: len(BATCH1) // 2])
        w.run(1, 1)
        w.stage(2, BATCH1[len(BATCH1) // 2 :])
        w.run(2, 1)
        last = 3
    elif cut == "shuffled":  # days arrive out of order: later windows must be recomputed when an earlier day lands
        w.dims(1)
        order = rng.permutation(len(BATCH1))
        for i, part in enumerate(np.array_split(order, 6), start=1):
            w.stage(i, [BATCH1[j] for j in sorted(part)])
            w.run(i, 1)
        last = 7
    else:  # the records first, the securities, companies and earnings in a later micro-batch
        w.stage(1, BATCH1)
        w.run(1, 1)
        assert w.table(wh.FACT_MARKET_HISTORY) == []
        w.dims(2)
        w.run(2, 1)
        last = 3
    w.stage(last, BATCH2)
    w.run(last, 2)
    assert w.table(wh.FACT_MARKET_HISTORY) == EXPECTED_ROWS
    assert w.alerts() == EXPECTED_ALERTS
    assert w.table(MARKET_SLICES) == whole.table(MARKET_SLICES)


def test_a_load_computed_in_pieces_of_symbols_gives_the_whole_load(whole, tmp_path, monkeypatch):
    """A micro-batch with more new records than `RECORDS_PER_PIECE` is computed a piece of symbols at a time
    (here one symbol a piece): the same rows, alerts and slices."""
    monkeypatch.setattr(mh, "RECORDS_PER_PIECE", 100)
    w = World(tmp_path)
    w.dims(1)
    w.stage(1, BATCH1)
    scope = BatchScope(batch_id=1, source_batches=(1,), batch_dates={1: D(2016, 12, 30)})
    assert len(BATCH1) > 300 and [len(p.new) > 0 for p in mh.pieces(mh.touched(w.ctx, scope))] == [True] * 3
    w.run(1, 1)
    # the first load wrote each piece's rows and slices as a file of its own, each in the declared order
    for table in (wh.FACT_MARKET_HISTORY, MARKET_SLICES):
        files = sorted(w.ctx.lake.path(table).glob("*.parquet"))
        assert [f.name for f in files] == [
            f"T4-{table.name.replace('_', '-')}-v1-piece-{i:05d}.snappy.parquet" for i in range(len(files))
        ]
        assert len(files) >= 2  # a piece whose symbols have no security yet makes no row
        for file in files:
            rows = pq.read_table(file).select(list(table.order_by)).to_pylist()
            assert rows == sorted(rows, key=lambda r: tuple(r.values())) and rows
    # the checks read the commit back in the pieces' order, which is not the declared one across them: no sorted copy
    files = sorted(w.ctx.lake.path(wh.FACT_MARKET_HISTORY).glob("*.parquet"))
    back = validate.written_rows(w.ctx.lake, wh.FACT_MARKET_HISTORY, "T4/factmarkethistory", 1)
    assert back.to_pylist() == pa.concat_tables(pq.read_table(f) for f in files).select(back.column_names).to_pylist()
    assert back.to_pylist() != w.ctx.lake.read_arrow(wh.FACT_MARKET_HISTORY).to_pylist()
    w.stage(2, BATCH2)
    w.run(2, 2)
    assert w.table(wh.FACT_MARKET_HISTORY) == EXPECTED_ROWS
    assert w.alerts() == EXPECTED_ALERTS
    assert w.table(MARKET_SLICES) == whole.table(MARKET_SLICES)


def test_a_load_in_pieces_replaces_what_an_attempt_that_died_before_its_commit_left(whole, tmp_path, monkeypatch):
    """Pieces written by an attempt that died before its commit (more of them, other rows) are replaced by the
    next attempt's: the table holds its rows once."""
    monkeypatch.setattr(mh, "RECORDS_PER_PIECE", 100)
    w = World(tmp_path)
    w.dims(1)
    w.stage(1, BATCH1)
    stale = whole.ctx.lake.read_arrow(wh.FACT_MARKET_HISTORY)
    for position in range(5):
        w.ctx.lake.write_piece(
            wh.FACT_MARKET_HISTORY, stale, app_id="T4/factmarkethistory", version=1, position=position
        )
    w.run(1, 1)
    w.stage(2, BATCH2)
    w.run(2, 2)
    assert w.table(wh.FACT_MARKET_HISTORY) == EXPECTED_ROWS
    assert not (w.ctx.lake.path(wh.FACT_MARKET_HISTORY) / SCRATCH_DIR).exists()


def test_a_rerun_of_a_committed_micro_batch_changes_nothing(whole):
    lake = whole.ctx.lake
    before = {t.name: lake.version(t) for t in (wh.FACT_MARKET_HISTORY, MARKET_SLICES)}
    assert whole.run(2, 2) == {}
    assert {t.name: lake.version(t) for t in (wh.FACT_MARKET_HISTORY, MARKET_SLICES)} == before
