"""FactMarketHistory's rows (step T4, `jobs.market_history`): the DailyMarket record that counts per (symbol,
DM_DATE), and the row made from it, its 52-week window and the dimensions: keys, P/E from the last four quarters
of Financial, yield, and the "Market history not loaded" and "No earnings for company" Alerts.

The rules are those of the step's docstring (TPC-DI 1.1.0 clause 4.5). Where it sits: the step
(`jobs.market_history`) reads the staged records and the dimensions and passes them here with the window words of
`jobs.market_slices`; it commits the rows and alerts. Pure: no lake.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import arrow_ops as ao
from jobs.market_slices import decode_high, decode_low
from jobs.messages import alert_rows
from jobs.valid_at import take, valid_versions
from schemas import warehouse as wh

SOURCE = "FactMarketHistory"
NO_EARNINGS = "No earnings for company"
NOT_LOADED = "Market history not loaded"
TABLE = wh.FACT_MARKET_HISTORY

RECORD_COLUMNS = ("dm_date", "dm_s_symb", "dm_close", "dm_high", "dm_low", "dm_vol", "source_batch")


def effective_records(*staged: pa.Table, batch_id: int | None = None) -> pa.Table:
    """The DailyMarket record that counts for every (symbol, DM_DATE) of the staged tables (Batch1 and CDC rows
    alike): the latest in declared order (TPC-DI batch, CDC_DSN, then the values); sorted by symbol and date. With
    `batch_id`, a column `_new`: whether micro-batch `batch_id` staged a record of the pair."""
    parts = []
    for t in staged:
        dsn = t["cdc_dsn"] if "cdc_dsn" in t.column_names else pa.nulls(t.num_rows, pa.int64())
        part = t.select(list(RECORD_COLUMNS)).append_column("cdc_dsn", dsn.cast(pa.int64()))
        parts.append(part.append_column("batch_id", t["batch_id"].cast(pa.int64())))
    records = pa.concat_tables(parts).combine_chunks()
    order = ["dm_s_symb", "dm_date", "source_batch", "cdc_dsn", "dm_close", "dm_high", "dm_low", "dm_vol"]
    ordered = ao.sort(records, order)
    out = ao.last_of_groups(ordered, ["dm_s_symb", "dm_date"]).select(list(RECORD_COLUMNS))
    if batch_id is not None:
        starts = ao.group_starts(ordered, ["dm_s_symb", "dm_date"])
        mine = np.asarray(pc.equal(ordered["batch_id"], batch_id), dtype=bool)
        new = np.logical_or.reduceat(mine, starts) if len(starts) else np.zeros(0, dtype=bool)
        out = out.append_column("_new", pa.array(new, pa.bool_()))
    return out


def quarter_index(days: np.ndarray) -> np.ndarray:
    """year * 4 + quarter - 1 of days since 1970-01-01."""
    months = np.asarray(days, dtype="datetime64[D]").astype("datetime64[M]").astype(np.int64)  # since 1970-01
    return (months // 12 + 1970) * 4 + (months % 12) // 3


def earnings(financials: pa.Table, companies: pa.Table) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """The quarterly basic EPS per company (CIK) as sorted lookup arrays: (keys `company code << 20 | quarter
    index`, running sum of EPS cents, distinct CIKs whose index is the company code). `financials`: Financial rows
    (sk_companyid, fi_year, fi_qtr, fi_basic_eps); `companies`: DimCompany (sk_companyid, companyid). A quarter
    reported by several versions of a company counts once (the latest version's row)."""
    cik = take(companies["companyid"], valid_index(financials["sk_companyid"], companies["sk_companyid"]))
    table = pa.table(
        {
            "cik": cik,
            "q": pc.add(pc.multiply(financials["fi_year"].cast(pa.int64()), 4), pc.subtract(financials["fi_qtr"], 1)),
            "sk": financials["sk_companyid"],
            "eps": financials["fi_basic_eps"],
        }
    ).filter(pc.is_valid(cik))
    table = ao.last_of_groups(ao.sort(table, ["cik", "q", "sk"]), ["cik", "q"])
    ciks = pc.unique(table["cik"].combine_chunks()) if table.num_rows else pa.array([], pa.int64())
    code = pc.index_in(table["cik"], value_set=ciks).to_numpy(zero_copy_only=False).astype(np.int64)
    keys = (code << 20) | ao.column(table, "q").to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.argsort(keys, kind="stable")
    running = np.r_[0, np.cumsum(ao.cents(table["eps"])[order])]
    return keys[order], running, ciks


def valid_index(keys: pa.Array | pa.ChunkedArray, dim_keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Row index in `dim_keys` of each of `keys` (a unique-key lookup), -1 when absent."""
    found = pc.index_in(ao.column(pa.table({"k": keys}), "k"), value_set=ao.column(pa.table({"k": dim_keys}), "k"))
    return pc.fill_null(found, -1).to_numpy(zero_copy_only=False).astype(np.int64)


def last_four_quarters(
    ciks: pa.Array, days: np.ndarray, eps: tuple[np.ndarray, np.ndarray, pa.Array]
) -> tuple[np.ndarray, np.ndarray]:
    """(EPS sum in cents, quarters found) of each company over the four quarters before the quarter of its day."""
    keys, running, known = eps
    code = pc.fill_null(pc.index_in(ciks, value_set=known), -1).to_numpy(zero_copy_only=False).astype(np.int64)
    quarter = quarter_index(days)
    first = np.searchsorted(keys, (np.maximum(code, 0) << 20) | (quarter - 4), side="left")
    after = np.searchsorted(keys, (np.maximum(code, 0) << 20) | (quarter - 1), side="right")
    found = np.where(code >= 0, after - first, 0)
    total = np.where(code >= 0, running[after] - running[first], 0)
    return total, found


def market_rows(
    records: pa.Table,
    high: np.ndarray,
    low: np.ndarray,
    securities: pa.Table,
    companies: pa.Table,
    eps: tuple[np.ndarray, np.ndarray, pa.Array],
) -> tuple[pa.Table, pa.Table, pa.Table]:
    """FactMarketHistory rows of `records` (`effective_records` rows) with their window words (`window_extremes`):
    keys and dividend of the DimSecurity version valid on DM_DATE (`securities`: symbol, sk_securityid,
    sk_companyid, dividend, effectivedate, enddate), CIK through `companies` (DimCompany sk_companyid, companyid),
    P/E from `eps` (`earnings`). Also the records without a security version (`dm_s_symb, dm_date,
    source_batch`) and the rows without earnings (`dm_s_symb, dm_date, source_batch`)."""
    days = ao.days(records["dm_date"])
    version = valid_versions(
        records["dm_s_symb"], days, securities["symbol"], securities["effectivedate"], securities["enddate"]
    )
    ok = version >= 0
    kept = records.filter(pa.array(ok))
    v = version[ok]
    d = days[ok]
    sk_company = take(securities["sk_companyid"], v)
    cik = take(companies["companyid"], valid_index(sk_company, companies["sk_companyid"]))
    close = ao.cents(kept["dm_close"])
    eps_sum, quarters = last_four_quarters(cik, d, eps)
    has_pe = (quarters > 0) & (eps_sum != 0)
    pe = ao.divide_round_half_up(close * 100, np.where(has_pe, eps_sum, 1))
    dividend = ao.cents(take(securities["dividend"], v))
    yields = ao.divide_round_half_up(dividend * 10000, np.where(close != 0, close, 1))
    high_cents, high_day = decode_high(high[ok])
    low_cents, low_day = decode_low(low[ok])
    rows = pa.table(
        {
            "sk_securityid": take(securities["sk_securityid"], v),
            "sk_companyid": sk_company,
            "sk_dateid": pa.array(ao.date_ids(d), pa.int32()),
            "peratio": ao.decimals(pe, 10, 2, has_pe),
            "yield": ao.decimals(yields, 18, 2, close != 0),
            "fiftytwoweekhigh": ao.decimals(high_cents, 8, 2),
            "sk_fiftytwoweekhighdate": pa.array(ao.date_ids(high_day), pa.int32()),
            "fiftytwoweeklow": ao.decimals(low_cents, 8, 2),
            "sk_fiftytwoweeklowdate": pa.array(ao.date_ids(low_day), pa.int32()),
            "closeprice": kept["dm_close"],
            "dayhigh": kept["dm_high"],
            "daylow": kept["dm_low"],
            "volume": kept["dm_vol"],
            "batchid": kept["source_batch"],
            "symbol": kept["dm_s_symb"],
        }
    ).cast(TABLE.arrow_schema())
    unresolved = records.filter(pa.array(~ok)).select(["dm_s_symb", "dm_date", "source_batch"])
    without = kept.filter(pa.array(~has_pe)).select(["dm_s_symb", "dm_date", "source_batch"])
    return rows, unresolved, without


def market_alerts(unresolved: pa.Table, without_earnings: pa.Table) -> pa.Table:
    """The "Market history not loaded" and "No earnings for company" Alerts."""

    def of(records: pa.Table, text: str, data: list[str]) -> pa.Table:
        dates = pc.strftime(records["dm_date"], format="%Y-%m-%d").to_pylist()
        symbols = records["dm_s_symb"].to_pylist()
        return alert_rows(
            ao.column(records, "source_batch"),
            source=SOURCE,
            text=text,
            data=data,
            key=[f"SYMB={s} DATE={d}" for s, d in zip(symbols, dates, strict=True)],
        )

    missing = [
        f"DM_S_SYMB = {s}, DM_DATE = {d}: no DimSecurity version on that day"
        for s, d in zip(
            unresolved["dm_s_symb"].to_pylist(),
            pc.strftime(unresolved["dm_date"], format="%Y-%m-%d").to_pylist(),
            strict=True,
        )
    ]
    no_earnings = [f"DM_S_SYMB = {s}" for s in without_earnings["dm_s_symb"].to_pylist()]
    return pa.concat_tables([of(unresolved, NOT_LOADED, missing), of(without_earnings, NO_EARNINGS, no_earnings)])
