"""State the transform steps keep between micro-batches: held records (work that arrived before what it refers to and
waits in the lake for it) and the slices of the 52-week market windows.

`staging.trade_holds` (step T3: rules in `jobs.trades`, commits in `jobs.create_trades`): one row per trade that
cannot be built yet -- its account or security has no dimension version on the trade's creation day, its creation
record or its Trade record has not arrived, or its status/type code is unknown. A held trade is retried in every
later micro-batch of its TPC-DI batch; when the missing part arrives its row is deleted and the trade enters
DimTrade. When a later TPC-DI batch starts it becomes `rejected` (final) and a DImessages Alert gives the reason:
the expiry is the end of the trade's TPC-DI batch, a property of the data, never a count of micro-batches.
"""

from __future__ import annotations

from schemas.model import Column as C
from schemas.model import Table

HELD = "held"
REJECTED = "rejected"

TRADE_HOLDS = Table(
    name="trade_holds",
    layer="staging",
    columns=(
        C("tradeid", "bigint", False),
        C("first_batch", "bigint", False, "micro-batch in which the trade was first held"),
        C("source_batch", "int", False, "TPC-DI batch of the trade's latest record"),
        C("reason", "string", False, "what is missing, e.g. 'account 45 has no version on 2013-05-01'"),
        C("state", "string", False, "held (retried every micro-batch of its batch) or rejected (final)"),
    ),
    key=("tradeid",),
    order_by=("tradeid",),
    doc="Trades waiting for their account, security or first record (T3), and those rejected when their batch ended.",
)

# The partial aggregates FactMarketHistory's 52-week windows are combined from (step T4, `jobs.market_slices`):
# per security, the highest DM_HIGH and the lowest DM_LOW (each with its first day) of every aligned block of
# 2**level days (block number `block` covers days block * 2**level .. (block + 1) * 2**level - 1, counted from
# 1970-01-01), for levels 1..8; level 0, the day itself, is the DailyMarket record. A window is combined from the
# few blocks that cover it, so a micro-batch reads about 18 slices per security and day instead of a year of
# DailyMarket.
MARKET_SLICES = Table(
    name="market_slices",
    layer="staging",
    columns=(
        C("symbol", "string", False),
        C("level", "int", False, "the block spans 2**level days"),
        C("block", "int", False, "days block * 2**level .. (block + 1) * 2**level - 1 since 1970-01-01"),
        C("high", "decimal(8,2)", False, "highest DM_HIGH of the block"),
        C("high_date", "date", False, "first day of the block with that high"),
        C("low", "decimal(8,2)", False, "lowest DM_LOW of the block"),
        C("low_date", "date", False, "first day of the block with that low"),
    ),
    key=("symbol", "level", "block"),
    order_by=("level", "block", "symbol"),
    # a new day changes the last block of each level: a micro-batch's MERGE rewrites those files, not the table; in
    # files of 256 KB, not 1 MB (twelve MERGEs of SF 6 micro-batches: 0.31 -> 0.11-0.13 s each, 416,000 -> 79,000-
    # 113,000 rows copied), as the eight levels' last blocks are eight places in the declared order
    file_bytes=256 * 1024,
    resident=True,  # T4 reads the slices of the micro-batch's securities, scattered over the table
    doc="Per-security slices of DailyMarket (highs and lows of aligned blocks of days) for the 52-week windows.",
)
