"""T3's hold bookkeeping on collected rows: `expired_holds`, `next_holds` and `rejection_alerts` (no Spark).

A hold expires with its TPC-DI batch: the micro-batch count plays no part, so the same trades are rejected
however a batch was cut."""

from __future__ import annotations

import pyarrow as pa

from jobs.trades import expired_holds, next_holds, rejection_alerts
from schemas.holds import TRADE_HOLDS


def _unresolved(*rows: tuple[int, int, str]) -> pa.Table:
    return pa.table(
        {
            "tradeid": pa.array([r[0] for r in rows], pa.int64()),
            "source_batch": pa.array([r[1] for r in rows], pa.int32()),
            "reason": pa.array([r[2] for r in rows], pa.string()),
        }
    )


def _holds(*rows: tuple[int, int, int, str, str]) -> pa.Table:
    return pa.table(
        {
            "tradeid": pa.array([r[0] for r in rows], pa.int64()),
            "first_batch": pa.array([r[1] for r in rows], pa.int64()),
            "source_batch": pa.array([r[2] for r in rows], pa.int32()),
            "reason": [r[3] for r in rows],
            "state": [r[4] for r in rows],
        }
    ).cast(TRADE_HOLDS.arrow_schema())


HELD_BEFORE = _holds((10, 5, 2, "no Trade record yet", "held"), (11, 3, 2, "no Trade record yet", "held"))


def test_a_trade_keeps_the_first_batch_of_its_hold_while_its_tpcdi_batch_lasts():
    # micro-batch 60 is still TPC-DI batch 2: however many micro-batches passed, nothing is rejected
    got = next_holds(_unresolved((10, 2, "a"), (11, 2, "b"), (12, 2, "c")), HELD_BEFORE, batch_id=60, current_batch=2)
    assert got.schema == TRADE_HOLDS.arrow_schema()
    assert got.to_pylist() == [
        {"tradeid": 10, "first_batch": 5, "source_batch": 2, "reason": "a", "state": "held"},
        {"tradeid": 11, "first_batch": 3, "source_batch": 2, "reason": "b", "state": "held"},
        {"tradeid": 12, "first_batch": 60, "source_batch": 2, "reason": "c", "state": "held"},  # new hold
    ]


def test_a_trade_of_an_ended_tpcdi_batch_is_rejected_when_it_cannot_be_built():
    got = next_holds(_unresolved((12, 1, "c"), (13, 3, "d")), HELD_BEFORE, batch_id=7, current_batch=3)
    assert [(r["tradeid"], r["state"]) for r in got.to_pylist()] == [(12, "rejected"), (13, "held")]


def test_without_a_current_tpcdi_batch_nothing_expires():
    got = next_holds(_unresolved((12, 1, "c")), HELD_BEFORE, batch_id=7, current_batch=None)
    assert got["state"].to_pylist() == ["held"]
    assert expired_holds(HELD_BEFORE, None).num_rows == 0


def test_holds_of_ended_batches_expire_and_rejected_ones_stay_as_they_are():
    holds = _holds(
        (10, 5, 2, "a", "held"),
        (11, 3, 1, "b", "held"),
        (12, 2, 1, "c", "rejected"),
        (13, 9, 3, "d", "held"),
    )
    assert expired_holds(holds, 2).to_pylist() == [
        {"tradeid": 11, "first_batch": 3, "source_batch": 1, "reason": "b", "state": "rejected"}
    ]
    assert sorted(expired_holds(holds, 4)["tradeid"].to_pylist()) == [10, 11, 13]
    assert expired_holds(holds, 1).num_rows == 0


def test_nothing_unresolved_gives_no_hold_rows():
    got = next_holds(_unresolved(), HELD_BEFORE, batch_id=6, current_batch=2)
    assert got.num_rows == 0 and got.schema == TRADE_HOLDS.arrow_schema()


def test_each_rejected_trade_gets_one_alert_with_the_reason():
    rejected = _holds((11, 3, 2, "account 45 has no DimAccount version on 2017-07-08", "rejected"))
    assert rejection_alerts(rejected).to_pylist() == [
        {
            "batchid": 2,
            "messagesource": "DimTrade",
            "messagetext": "Trade rejected",
            "messagetype": "Alert",
            "messagedata": "T_ID = 11, still unresolved at the end of TPC-DI batch 2: "
            "account 45 has no DimAccount version on 2017-07-08",
            "messagekey": "rejected T_ID=11",
        }
    ]
    assert rejection_alerts(rejected.slice(0, 0)).num_rows == 0
