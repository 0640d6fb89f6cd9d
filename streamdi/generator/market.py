"""Trading: Trade, TradeHistory, CashTransaction, HoldingHistory, DailyMarket and WatchHistory.

The whole history (2012-07-07 to the end of the last batch) is drawn at once, vectorized, and then cut into
batches by event time, so a trade submitted on Batch1's last day and completed in Batch2 appears as its
submitted state in Batch1's Trade.txt and as a `U` line in Batch2's.

- Holdings: a buy (TMB or TLB) opens a position in one account and symbol; a sell (TMS or TLS) of the same
  quantity closes it later (unless the history ends first). HoldingHistory refers to the buy as the holding's
  trade (`hh_h_t_id`). Some limit buys are canceled instead (PNDG -> CNCL) and change nothing.
- Status transitions: market orders SBMT -> CMPT; limit orders PNDG -> SBMT -> CMPT or PNDG -> CNCL.
- An account is only traded while it is open (opened before the buy, not closed before the sell completes);
  watches only involve customers that are active at the time, each (customer, symbol) at most once.
- Every completed trade books one cash transaction (buy: -(value + fees), sell: value - fees).
- A few completed trades carry a commission or a fee above the trade's value (DImessages alerts).
- Prices follow one random walk per security; bid and trade prices sit near that day's close.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa

from streamdi.generator import text as tx
from streamdi.generator.customers import People
from streamdi.generator.finwire import Finwire
from streamdi.generator.output import AuditRow, Output, WrittenFile
from streamdi.generator.params import HISTORY_BEGIN, Params, epoch_seconds

DAY = 86400
STATUS = np.array(["PNDG", "SBMT", "CMPT", "CNCL"], dtype=object)
PNDG, SBMT, CMPT, CNCL = 0, 1, 2, 3
TYPES = np.array(["TMB", "TLB", "TMS", "TLS"], dtype=object)
TMB, TLB, TMS, TLS = 0, 1, 2, 3
INVALID_FEE_RATE = 0.0001
# Rows (and DailyMarket's days) formatted as text at a time: a file is written piece by piece.
PIECE_ROWS = 1 << 20
DAYS_PER_PIECE = 32


def _pick_open(
    rng: np.random.Generator, opened: np.ndarray, closed: np.ndarray, start: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """For each [start, end], an index of an entity opened at or before `start` and not closed before `end`
    (-1 where none was found in a few tries). `opened` must be sorted."""
    limit = np.searchsorted(opened, start, side="right")
    chosen = np.full(len(start), -1, dtype=np.int64)
    todo = np.flatnonzero(limit > 0)
    for _ in range(12):
        if len(todo) == 0:
            break
        pick = (rng.random(len(todo)) * limit[todo]).astype(np.int64)
        ok = closed[pick] > end[todo]
        chosen[todo[ok]] = pick[ok]
        todo = todo[~ok]
    return chosen


class Market:
    """The daily close of every security (cents), one random walk each."""

    def __init__(self, params: Params, n_securities: int) -> None:
        rng = params.rng("DailyMarket")
        self.first_day = epoch_seconds(HISTORY_BEGIN) // DAY
        self.days = params.horizon // DAY - self.first_day
        steps = rng.normal(0.0, 0.02, (n_securities, self.days))
        start = rng.uniform(np.log(5.0), np.log(100.0), (n_securities, 1))
        self.close = np.maximum(np.round(np.exp(start + np.cumsum(steps, axis=1)) * 100), 1).astype(np.int64)
        self.high = self.close + np.round(self.close * rng.uniform(0, 0.1, self.close.shape)).astype(np.int64)
        self.low = np.maximum(self.close - np.round(self.close * rng.uniform(0, 0.1, self.close.shape)), 1).astype(
            np.int64
        )
        self.volume = rng.integers(10**5, 10**9, self.close.shape)

    def release_bars(self) -> None:
        """Let go of the daily highs, lows and volumes once DailyMarket is written (trades use the close)."""
        del self.high, self.low, self.volume

    def close_at(self, security: np.ndarray, ts: np.ndarray) -> np.ndarray:
        day = np.clip(ts // DAY - self.first_day, 0, self.days - 1)
        return self.close[security, day]


def generate(params: Params, out: Output, fw: Finwire, people: People) -> None:
    market = Market(params, len(fw.symbols))
    _daily_market(params, out, fw, market)
    market.release_bars()
    _trades(params, out, fw, people, market)
    _watches(params, out, fw, people)


# ------------------------------------------------------------------------------------------ DailyMarket
def _daily_market(params: Params, out: Output, fw: Finwire, market: Market) -> None:
    """One line per security and day from the security's first market day (spread over the history so that
    about 29% of the security-days are present, as in the official files) to the day before the batch date."""
    n_s = len(fw.symbols)
    rng = params.rng("DailyMarket", "coverage")
    first_market_day = (market.days * (1 - rng.uniform(0, 0.58, n_s))).astype(np.int64)
    first_market_day[0] = 0  # at least one security has the whole history
    for batch in range(1, params.batches + 1):
        last_day = epoch_seconds(params.batch_date(batch)) // DAY - 1 - market.first_day  # the day before
        first_day = 0 if batch == 1 else last_day
        days = np.arange(first_day, last_day + 1)

        def pieces(days: np.ndarray = days) -> Iterator[tuple[list[pa.Array], None]]:
            for lo in range(0, len(days), DAYS_PER_PIECE):
                some = days[lo : lo + DAYS_PER_PIECE]
                present = some[:, None] >= first_market_day[None, :]
                day_pos, sec_idx = np.nonzero(present)  # row-major: by day, then by symbol
                day_idx = some[day_pos]
                cols = [
                    tx.dates(day_idx + market.first_day),
                    pa.array(fw.symbols[sec_idx]),
                    tx.money(market.close[sec_idx, day_idx]),
                    tx.money(market.high[sec_idx, day_idx]),
                    tx.money(market.low[sec_idx, day_idx]),
                    tx.ints(market.volume[sec_idx, day_idx]),
                ]
                yield cols, None

        written = _write(out, batch, "DailyMarket", pieces())
        out.write_audit(
            f"Batch{batch}/DailyMarket_audit.csv", [AuditRow("FactMarketHistory", batch, "DM_RECORDS", written.rows)]
        )


def _write(
    out: Output,
    batch: int,
    name: str,
    pieces: Iterator[tuple[list[pa.Array], np.ndarray | None]],
) -> WrittenFile:
    """Write a file from pieces of its columns (each with its insert flags, None for all inserts), one piece
    in memory as text at a time. Batch1: the fields as they are; incremental: CDC_FLAG and CDC_DSN
    (increasing) in front."""
    dsn = out.next_dsn(name) if batch > 1 else 0

    def lines() -> Iterator[pa.Array]:
        nonlocal dsn
        for cols, inserts in pieces:
            if batch > 1:
                n = len(cols[0])
                flags = np.full(n, "I") if inserts is None else np.where(inserts, "I", "U")
                cols = [pa.array(flags), tx.ints(np.arange(dsn, dsn + n)), *cols]
                dsn += n
            yield tx.join_fields(cols, "|")

    return out.write_lines(f"Batch{batch}/{name}.txt", lines())


def _rows(
    n: int, cols_of: Callable[..., list[pa.Array]], *arrays: np.ndarray, inserts: np.ndarray | None = None
) -> Iterator[tuple[list[pa.Array], np.ndarray | None]]:
    """`_write`'s pieces of n rows: `cols_of` applied to each piece of `arrays` (PIECE_ROWS rows at a time)."""
    for lo in range(0, n, PIECE_ROWS):
        piece = slice(lo, min(n, lo + PIECE_ROWS))
        yield cols_of(*(a[piece] for a in arrays)), None if inserts is None else inserts[piece]


# ------------------------------------------------------------------------------------------------ Trades
def _status_times(rng: np.random.Generator, t0: np.ndarray, limit: np.ndarray, canceled: np.ndarray) -> np.ndarray:
    """(n, 3) times of (first status, SBMT-or-CNCL, CMPT); -1 where a trade has no such step."""
    n = len(t0)
    times = np.full((n, 3), -1, dtype=np.int64)
    times[:, 0] = t0
    wait = rng.integers(60, 3 * DAY, n)
    submit = np.where(limit, t0 + wait, t0)
    times[:, 1] = np.where(limit, submit, -1)
    times[:, 2] = np.where(canceled, -1, submit + rng.integers(1, 301, n))
    times[canceled, 1] = t0[canceled] + rng.integers(60, 10 * DAY, int(canceled.sum()))
    return times


def _trades(params: Params, out: Output, fw: Finwire, people: People, market: Market) -> None:
    rng = params.rng("Trade")
    arrays = people.arrays()
    by_open = np.argsort(arrays["account_opened"], kind="stable")
    opened, closed = arrays["account_opened"][by_open], arrays["account_closed"][by_open]
    begin, horizon = epoch_seconds(HISTORY_BEGIN), params.horizon
    n_s = len(fw.symbols)

    # buys, then the sells that close them, then canceled limit buys
    h, c = params.holdings, params.canceled
    buy_t0 = rng.integers(begin, horizon, h)
    buy_type = np.where(rng.random(h) < 0.6, TLB, TMB)
    buy_times = _status_times(rng, buy_t0, buy_type == TLB, np.zeros(h, bool))
    sell_t0 = buy_times[:, 2] + (rng.exponential(60 * DAY, h)).astype(np.int64) + 1
    sell_type = np.where(rng.random(h) < 0.6, TLS, TMS)
    sell_times = _status_times(rng, sell_t0, sell_type == TLS, np.zeros(h, bool))
    has_sell = sell_times[:, 2] < horizon
    holding_end = np.where(has_sell, sell_times[:, 2], horizon)
    account = _pick_open(rng, opened, closed, buy_t0, holding_end)
    keep = account >= 0
    can_t0 = rng.integers(begin, horizon, c)
    can_times = _status_times(rng, can_t0, np.ones(c, bool), np.ones(c, bool))
    can_account = _pick_open(rng, opened, closed, can_t0, can_times[:, 1])
    can_keep = can_account >= 0

    # one row per trade: type, times, account, symbol, qty, the holding's buy (index into this table)
    symbol = rng.integers(0, n_s, h)
    qty = rng.integers(1, 10000, h)
    b, s = np.flatnonzero(keep), np.flatnonzero(keep & has_sell)
    k = np.flatnonzero(can_keep)
    ttype = np.concatenate([buy_type[b], sell_type[s], np.full(len(k), TLB)])
    times = np.concatenate([buy_times[b], sell_times[s], can_times[k]])
    acct = by_open[np.concatenate([account[b], account[s], can_account[k]])]
    symb = np.concatenate([symbol[b], symbol[s], rng.integers(0, n_s, c)[k]])
    quantity = np.concatenate([qty[b], qty[s], rng.integers(1, 10000, c)[k]])
    holding_of = np.concatenate([np.arange(len(b)), np.searchsorted(b, s), np.full(len(k), -1)])
    is_sell = np.isin(ttype, (TMS, TLS))

    # trade ids in order of the first status
    order = np.lexsort((np.arange(len(ttype)), times[:, 0]))
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    ttype, times, acct, symb, quantity, is_sell = (a[order] for a in (ttype, times, acct, symb, quantity, is_sell))
    holding_of = holding_of[order]
    buy_tid = np.where(holding_of >= 0, rank[np.clip(holding_of, 0, None)], -1)  # t_id of the holding's buy
    n = len(ttype)
    t_id = np.arange(n)

    bid = np.maximum(market.close_at(symb, times[:, 0]) * rng.uniform(0.95, 1.05, n), 1).astype(np.int64)
    done = times[:, 2] >= 0
    price = np.maximum(market.close_at(symb, np.maximum(times[:, 2], 0)) * rng.uniform(0.98, 1.02, n), 1)
    price = price.astype(np.int64)
    value = price * quantity  # cents
    chrg = rng.integers(100, 2000, n)
    comm = rng.integers(100, 5000, n)
    bad_comm = done & (rng.random(n) < INVALID_FEE_RATE)
    bad_chrg = done & (rng.random(n) < INVALID_FEE_RATE)
    first_done = np.flatnonzero(done & (times[:, 2] < params.window(1)[1]))
    if len(first_done) >= 2:  # at least one of each alert in Batch1
        bad_comm[first_done[0]] = True
        bad_chrg[first_done[1]] = True
    comm = np.where(bad_comm, value + rng.integers(1, 1000, n), comm)
    chrg = np.where(bad_chrg, value + rng.integers(1, 1000, n), chrg)
    tax = (value * rng.uniform(0, 0.1, n)).astype(np.int64)
    is_cash = rng.random(n) < 0.7
    exec_name = rng.integers(0, 15000, n)
    cash_amount = np.where(is_sell, value - chrg - comm - tax, -(value + chrg + comm + tax))
    ct_name = tx.random_text(params.rng("CashTransaction"), n, 10, 100)
    hh_before = np.where(is_sell, quantity, 0)
    hh_after = np.where(is_sell, 0, quantity)

    # status events: (trade, step, status, time)
    first_status = np.where(np.isin(ttype, (TLB, TLS)), PNDG, SBMT)
    second_status = np.where(times[:, 2] < 0, CNCL, SBMT)
    ev_trade = np.concatenate([t_id, t_id, t_id])
    ev_step = np.repeat([0, 1, 2], n)
    ev_status = np.concatenate([first_status, second_status, np.full(n, CMPT)])
    ev_time = times.T.ravel()
    real = (ev_time >= 0) & (ev_time < params.horizon)
    ev_trade, ev_step, ev_status, ev_time = ev_trade[real], ev_step[real], ev_status[real], ev_time[real]

    def trade_cols(rows: np.ndarray, status: np.ndarray, ts: np.ndarray) -> list[pa.Array]:
        completed = status == CMPT
        return [
            tx.ints(rows),
            tx.timestamps(ts),
            pa.array(STATUS[status]),
            pa.array(TYPES[ttype[rows]]),
            tx.ints(is_cash[rows].astype(np.int64)),
            pa.array(fw.symbols[symb[rows]]),
            tx.ints(quantity[rows]),
            tx.money(bid[rows]),
            tx.ints(acct[rows]),
            tx.ints(exec_name[rows]),
            tx.money(price[rows], completed),
            tx.money(chrg[rows], completed),
            tx.money(comm[rows], completed),
            tx.money(tax[rows], completed),
        ]

    def history_cols(trade: np.ndarray, ts: np.ndarray, status: np.ndarray) -> list[pa.Array]:
        return [tx.ints(trade), tx.timestamps(ts), pa.array(STATUS[status])]

    def cash_cols(rows: np.ndarray, ts: np.ndarray) -> list[pa.Array]:
        return [tx.ints(acct[rows]), tx.timestamps(ts), tx.money(cash_amount[rows]), ct_name.take(pa.array(rows))]

    def holding_cols(rows: np.ndarray) -> list[pa.Array]:
        return [tx.ints(buy_tid[rows]), tx.ints(rows), tx.ints(hh_before[rows]), tx.ints(hh_after[rows])]

    def invalid(rows: np.ndarray, status: np.ndarray) -> tuple[int, int]:
        completed = status == CMPT
        return int((completed & (comm[rows] > value[rows])).sum()), int((completed & (chrg[rows] > value[rows])).sum())

    for batch in range(1, params.batches + 1):
        start, end = params.window(batch)
        in_batch = (ev_time >= start) & (ev_time < end)
        folder = f"Batch{batch}"
        if batch == 1:
            # Trade.txt: each trade in its last state before the cut; TradeHistory.txt: every step before it
            ev = np.flatnonzero(in_batch)
            ev = ev[np.lexsort((ev_step[ev], ev_trade[ev]))]
            last = ev[np.r_[ev_trade[ev][1:] != ev_trade[ev][:-1], True]] if len(ev) else ev
            rows, status, ts = ev_trade[last], ev_status[last], ev_time[last]
            _write(out, batch, "Trade", _rows(len(rows), trade_cols, rows, status, ts))
            comm_bad, chrg_bad = invalid(rows, status)
            out.write_audit(
                f"{folder}/Trade_audit.csv",
                [
                    AuditRow("DimTrade", 1, "T_Records", len(rows)),
                    AuditRow("DimTrade", 1, "T_NEW", len(rows)),
                    AuditRow("DimTrade", 1, "T_CanceledTrades", int((status == CNCL).sum())),
                    AuditRow("DimTrade", 1, "T_InvalidCommision", comm_bad),
                    AuditRow("DimTrade", 1, "T_InvalidCharge", chrg_bad),
                ],
            )
            history = _rows(len(ev), history_cols, ev_trade[ev], ev_time[ev], ev_status[ev])
            _write(out, batch, "TradeHistory", history)
            th_types = ttype[ev_trade[ev]]
            out.write_audit(
                f"{folder}/TradeHistory_audit.csv",
                [
                    AuditRow("DimTradeHistory", 1, "TH_Records", len(ev)),
                    AuditRow("DimTradeHistory", 1, "TH_TLBTrades", int((th_types == TLB).sum())),
                    AuditRow("DimTradeHistory", 1, "TH_TLSTrades", int((th_types == TLS).sum())),
                    AuditRow("DimTradeHistory", 1, "TH_TMBTrades", int((th_types == TMB).sum())),
                    AuditRow("DimTradeHistory", 1, "TH_TMSTrades", int((th_types == TMS).sum())),
                    AuditRow("DimTradeHistory", 1, "TH_CanceledLTrades", int((ev_status[ev] == CNCL).sum())),
                ],
            )
        else:
            ev = np.flatnonzero(in_batch)
            ev = ev[np.lexsort((ev_step[ev], ev_trade[ev], ev_time[ev]))]
            rows, status = ev_trade[ev], ev_status[ev]
            pieces = _rows(len(rows), trade_cols, rows, status, ev_time[ev], inserts=ev_step[ev] == 0)
            _write(out, batch, "Trade", pieces)
            comm_bad, chrg_bad = invalid(rows, status)
            out.write_audit(
                f"{folder}/Trade_audit.csv",
                [
                    AuditRow("DimTrade", batch, "T_Records", len(rows)),
                    AuditRow("DimTrade", batch, "T_NEW", int((ev_step[ev] == 0).sum())),
                    AuditRow("DimTrade", batch, "T_CanceledTrades", int((status == CNCL).sum())),
                    AuditRow("DimTrade", batch, "T_InvalidCommision", comm_bad),
                    AuditRow("DimTrade", batch, "T_InvalidCharge", chrg_bad),
                ],
            )
        # completions: one cash transaction and one holding change each, in time order
        cm = np.flatnonzero(in_batch & (ev_status == CMPT))
        cm = cm[np.lexsort((ev_trade[cm], ev_time[cm]))]
        rows = ev_trade[cm]
        _write(out, batch, "CashTransaction", _rows(len(rows), cash_cols, rows, ev_time[cm]))
        out.write_audit(
            f"{folder}/CashTransaction_audit.csv",
            [
                AuditRow("DimTradeHistory", batch, "CT_Records", len(rows)),
                AuditRow("DimTradeHistory", batch, "CT_Trades", len(np.unique(rows))),
                AuditRow("DimTradeHistory", batch, "CT_AccountsCreations", 0),
                AuditRow("DimTradeHistory", batch, "CT_UpdatedAccounts", 0),
            ],
        )
        _write(out, batch, "HoldingHistory", _rows(len(rows), holding_cols, rows))
        out.write_audit(
            f"{folder}/HoldingHistory_audit.csv", [AuditRow("FactHoldings", batch, "HH_RECORDS", len(rows))]
        )


# ------------------------------------------------------------------------------------------------ Watches
def _watches(params: Params, out: Output, fw: Finwire, people: People) -> None:
    rng = params.rng("WatchHistory")
    arrays = people.arrays()
    begin, horizon = epoch_seconds(HISTORY_BEGIN), params.horizon
    w = params.watches
    start = rng.integers(begin, horizon, w)
    customer = _pick_open(rng, arrays["customer_created"], arrays["customer_inactive"], start, start)
    symbol = rng.integers(0, len(fw.symbols), w)
    ok = customer >= 0
    start, customer, symbol = start[ok], customer[ok], symbol[ok]
    order = np.argsort(start, kind="stable")
    start, customer, symbol = start[order], customer[order], symbol[order]
    # a (customer, symbol) watch alternates ACTV/CNCL: an earlier watch is canceled before the next one starts
    pair = customer * len(fw.symbols) + symbol
    by_pair = np.lexsort((start, pair))
    start, customer, symbol, pair = start[by_pair], customer[by_pair], symbol[by_pair], pair[by_pair]
    distinct = np.r_[True, (pair[1:] != pair[:-1]) | (start[1:] != start[:-1])]
    start, customer, symbol, pair = start[distinct], customer[distinct], symbol[distinct], pair[distinct]
    m = len(start)
    followed = np.r_[pair[1:] == pair[:-1], False]
    next_start = np.r_[start[1:], horizon]
    gap = np.maximum(next_start - start - 1, 1)
    cancel = np.where(
        followed,
        start + 1 + (rng.random(m) * gap).astype(np.int64),
        start + rng.exponential(120 * DAY, m).astype(np.int64) + 1,
    )
    canceled = followed | ((rng.random(m) < 0.25) & (cancel < horizon))
    ev_c = np.concatenate([customer, customer[canceled]])
    ev_s = np.concatenate([symbol, symbol[canceled]])
    ev_t = np.concatenate([start, cancel[canceled]])
    ev_a = np.concatenate([np.zeros(m, np.int8), np.ones(int(canceled.sum()), np.int8)])
    order = np.lexsort((ev_a, ev_s, ev_c, ev_t))
    ev_c, ev_s, ev_t, ev_a = ev_c[order], ev_s[order], ev_t[order], ev_a[order]

    def watch_cols(c: np.ndarray, s: np.ndarray, t: np.ndarray, a: np.ndarray) -> list[pa.Array]:
        return [tx.ints(c), pa.array(fw.symbols[s]), tx.timestamps(t), pa.array(np.where(a == 0, "ACTV", "CNCL"))]

    for batch in range(1, params.batches + 1):
        lo, hi = np.searchsorted(ev_t, params.window(batch))
        sl = slice(lo, hi)
        _write(out, batch, "WatchHistory", _rows(hi - lo, watch_cols, ev_c[sl], ev_s[sl], ev_t[sl], ev_a[sl]))
        actv = int((ev_a[sl] == 0).sum())
        out.write_audit(
            f"Batch{batch}/WatchHistory_audit.csv",
            [
                AuditRow("FactWatches", batch, "WH_ACTIVE", actv),  # ACTV records, as the official generator
                AuditRow("FactWatches", batch, "WH_RECORDS", hi - lo),
            ],
        )
