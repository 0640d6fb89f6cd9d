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

NAMED_QUERIES: dict[str, NamedQuery] = {q.name: q for q in (TRADE_SUMMARY,)}


def resolve(sql_or_name: str) -> tuple[str | None, str]:
    """(name, SQL) of a named query, or (None, the text itself) when it is not a name."""
    named = NAMED_QUERIES.get(sql_or_name.strip())
    if named is not None:
        return named.name, named.sql
    return None, sql_or_name
