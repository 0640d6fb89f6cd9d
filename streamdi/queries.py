"""Named queries over the PostgreSQL warehouse `dw.*`, for `streamdi query NAME` and the push/pull benchmark.

A query here is plain SQL run by the read-only role; `streamdi query --help` lists every name with its
description. Add a query by adding an entry to `NAMED_QUERIES`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NamedQuery:
    name: str
    description: str
    sql: str


TRADE_SUMMARY = NamedQuery(
    name="trade_summary",
    description=(
        "per trade type over DimTrade: trades, total and average quantity, total and average trade-minus-bid "
        "price difference (trades without a trade price count in the quantities only)"
    ),
    sql="""SELECT type AS trade_type,
       count(*) AS trades,
       sum(quantity) AS total_quantity,
       round(avg(quantity), 4) AS avg_quantity,
       sum(tradeprice - bidprice) AS total_price_diff,
       round(avg(tradeprice - bidprice), 4) AS avg_price_diff
FROM dw.dimtrade
GROUP BY type
ORDER BY type""",
)

SECTOR_DAY = NamedQuery(
    name="sector_day",
    description=(
        "the live window trades_day per sector on the latest day that has trades: completed trades, shares and "
        "value traded, commissions (warehouse.trade_windows; see docs/windows.md)"
    ),
    sql="""SELECT node AS sector, window_start::date AS day, trades, quantity, value, commission
FROM dw.trade_windows
WHERE window_name = 'trades_day' AND level = 'sector'
  AND window_start = (SELECT max(window_start) FROM dw.trade_windows
                      WHERE window_name = 'trades_day' AND level = 'sector')
ORDER BY value DESC, sector""",
)

BROKER_WEEK = NamedQuery(
    name="broker_week",
    description=(
        "the ten brokers with the highest commissions in the latest week (Monday to Sunday) of the live window "
        "trades_week, with their trades and value traded"
    ),
    sql="""SELECT node AS broker, window_start::date AS week, trades, value, commission
FROM dw.trade_windows
WHERE window_name = 'trades_week' AND level = 'broker'
  AND window_start = (SELECT max(window_start) FROM dw.trade_windows
                      WHERE window_name = 'trades_week' AND level = 'broker')
ORDER BY commission DESC, broker
LIMIT 10""",
)

SECTOR_24H = NamedQuery(
    name="sector_24h",
    description=(
        "the last 24 hours per sector, up to the hour of the latest completed trade: trades, shares and value "
        "traded (the window trades_24h_hourly, answered when queried from the slices: dw.trade_window_answers)"
    ),
    sql="""SELECT node AS sector, window_start, window_end, trades, quantity, value
FROM dw.trade_window_answers
WHERE window_name = 'trades_24h_hourly' AND level = 'sector'
  AND window_end = (SELECT max(window_end) FROM dw.trade_window_answers
                    WHERE window_name = 'trades_24h_hourly' AND level = 'sector')
ORDER BY value DESC, sector""",
)

NAMED_QUERIES: dict[str, NamedQuery] = {q.name: q for q in (TRADE_SUMMARY, SECTOR_DAY, BROKER_WEEK, SECTOR_24H)}


def resolve(sql_or_name: str) -> tuple[str | None, str]:
    """(name, SQL) of a named query, or (None, the text itself) when it is not a name."""
    named = NAMED_QUERIES.get(sql_or_name.strip())
    if named is not None:
        return named.name, named.sql
    return None, sql_or_name
