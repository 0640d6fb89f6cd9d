"""Held records: work that arrived before what it refers to and waits in the lake for it.

`staging.trade_holds` (step T3, `jobs.trades`): one row per trade that cannot be built yet -- its account or
security has no dimension version on the trade's creation day, its creation record or its Trade record has not
arrived, or its status/type code is unknown. A held trade is retried in every later micro-batch; when the
missing part arrives its row is deleted and the trade enters DimTrade. After `trade_hold_batches` micro-batches
it becomes `rejected` (final) and a DImessages Alert gives the reason.
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
        C("state", "string", False, "held (retried every micro-batch) or rejected (final)"),
    ),
    key=("tradeid",),
    order_by=("tradeid",),
    doc="Trades waiting for their account, security or first record (T3), and the ones rejected after the limit.",
)
