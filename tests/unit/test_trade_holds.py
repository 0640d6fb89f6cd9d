"""T3's hold bookkeeping on collected rows: `next_holds` and `rejection_alerts` (no Spark)."""

from __future__ import annotations

import pyarrow as pa

from jobs.trades import next_holds, rejection_alerts
from schemas.holds import TRADE_HOLDS


def _unresolved(*rows: tuple[int, int, str]) -> pa.Table:
    return pa.table(
        {
            "tradeid": pa.array([r[0] for r in rows], pa.int64()),
            "source_batch": pa.array([r[1] for r in rows], pa.int32()),
            "reason": pa.array([r[2] for r in rows], pa.string()),
        }
    )


HELD_BEFORE = pa.table(
    {
        "tradeid": pa.array([10, 11], pa.int64()),
        "first_batch": pa.array([5, 3], pa.int64()),
        "source_batch": pa.array([2, 2], pa.int32()),
        "reason": ["no Trade record yet", "no Trade record yet"],
        "state": ["held", "held"],
    }
).cast(TRADE_HOLDS.arrow_schema())


def test_a_trade_keeps_the_first_batch_of_its_hold_and_is_rejected_at_the_limit():
    got = next_holds(_unresolved((10, 2, "a"), (11, 2, "b"), (12, 3, "c")), HELD_BEFORE, batch_id=6, limit=3)
    assert got.schema == TRADE_HOLDS.arrow_schema()
    assert got.to_pylist() == [
        {"tradeid": 10, "first_batch": 5, "source_batch": 2, "reason": "a", "state": "held"},  # 6 - 5 < 3
        {"tradeid": 11, "first_batch": 3, "source_batch": 2, "reason": "b", "state": "rejected"},  # 6 - 3 >= 3
        {"tradeid": 12, "first_batch": 6, "source_batch": 3, "reason": "c", "state": "held"},  # new hold
    ]


def test_with_a_limit_of_zero_a_trade_is_rejected_when_first_held():
    got = next_holds(_unresolved((12, 3, "c")), HELD_BEFORE, batch_id=6, limit=0)
    assert got["state"].to_pylist() == ["rejected"]


def test_nothing_unresolved_gives_no_hold_rows():
    got = next_holds(_unresolved(), HELD_BEFORE, batch_id=6, limit=3)
    assert got.num_rows == 0 and got.schema == TRADE_HOLDS.arrow_schema()


def test_each_rejected_trade_gets_one_alert_with_the_reason():
    rejected = next_holds(_unresolved((11, 2, "account 45 has no DimAccount version on 2017-07-08")), HELD_BEFORE, 6, 3)
    assert rejection_alerts(rejected, 3).to_pylist() == [
        {
            "batchid": 2,
            "messagesource": "DimTrade",
            "messagetext": "Trade rejected",
            "messagetype": "Alert",
            "messagedata": "T_ID = 11, still unresolved after 3 micro-batches: "
            "account 45 has no DimAccount version on 2017-07-08",
            "messagekey": "rejected T_ID=11",
        }
    ]
    assert rejection_alerts(rejected.slice(0, 0), 3).num_rows == 0
