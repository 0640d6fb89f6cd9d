"""FactHoldings rules on hand-written records (`jobs.holdings`, pure functions, no Spark)."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa

from jobs import holdings
from schemas import sources as src
from schemas import warehouse as wh


def staged(rows: list[tuple], cdc: bool = False) -> pa.Table:
    """Staged HoldingHistory rows: (HH_H_T_ID, HH_T_ID, before, after, TPC-DI batch[, cdc_dsn])."""
    table = (src.HOLDING_HISTORY_CDC if cdc else src.HOLDING_HISTORY).staging
    out = []
    for r in rows:
        row = {"hh_h_t_id": r[0], "hh_t_id": r[1], "hh_before_qty": r[2], "hh_after_qty": r[3]}
        row |= {"source_batch": r[4], "batch_id": r[4], "source_file": "f", "line_no": 1}
        if cdc:
            row |= {"cdc_flag": "I", "cdc_dsn": r[5]}
        out.append(row)
    return pa.Table.from_pylist(out, schema=table.arrow_schema())


def trades(rows: list[tuple]) -> pa.Table:
    """DimTrade rows: (tradeid, sk_accountid, price, close date id, close time id); other keys derived."""
    schema = wh.DIM_TRADE.arrow_schema()
    cols = {
        "tradeid": [r[0] for r in rows],
        "sk_customerid": [r[1] * 10 for r in rows],
        "sk_accountid": [r[1] for r in rows],
        "sk_securityid": [r[1] + 1 for r in rows],
        "sk_companyid": [r[1] + 2 for r in rows],
        "tradeprice": [None if r[2] is None else Decimal(r[2]) for r in rows],
        "sk_closedateid": [r[3] for r in rows],
        "sk_closetimeid": [r[4] for r in rows],
    }
    return pa.table({k: pa.array(v, schema.field(k).type) for k, v in cols.items()})


def test_before_and_after_quantities_of_a_buy_and_the_sells_that_change_it():
    records = holdings.holding_records(
        staged([(1, 1, 0, 100, 1), (1, 2, 100, 40, 1)]),  # buy 100, sell 60
        staged([(1, 3, 40, 0, 2, 7)], cdc=True),  # the rest sold in batch 2
    )
    dim = trades(
        [(1, 700, "10.00", 20170101, 93000), (2, 700, "12.50", 20170203, 100001), (3, 700, "9.00", 20170708, 120000)]
    )
    rows, missing = holdings.holding_rows(records, dim)
    common = {"sk_customerid": 7000, "sk_accountid": 700, "sk_securityid": 701, "sk_companyid": 702}
    assert rows.to_pylist() == [
        {"tradeid": 1, "currenttradeid": 1, **common, "currentprice": Decimal("10.00"), "currentholding": 100,
         "sk_dateid": 20170101, "sk_timeid": 93000, "batchid": 1},
        {"tradeid": 1, "currenttradeid": 2, **common, "currentprice": Decimal("12.50"), "currentholding": 40,
         "sk_dateid": 20170203, "sk_timeid": 100001, "batchid": 1},
        {"tradeid": 1, "currenttradeid": 3, **common, "currentprice": Decimal("9.00"), "currentholding": 0,
         "sk_dateid": 20170708, "sk_timeid": 120000, "batchid": 2},
    ]  # fmt: skip
    assert missing.num_rows == 0


def test_a_record_delivered_again_counts_once_and_the_latest_in_declared_order_wins():
    records = holdings.holding_records(
        staged([(1, 2, 100, 40, 2, 5), (1, 2, 100, 45, 2, 9), (1, 2, 100, 40, 2, 5)], cdc=True)
    )
    assert records.select(["hh_h_t_id", "hh_t_id", "hh_after_qty"]).to_pylist() == [
        {"hh_h_t_id": 1, "hh_t_id": 2, "hh_after_qty": 45}  # CDC_DSN 9 is the later record
    ]


def test_records_whose_current_trade_is_missing_or_open_are_not_loaded_and_say_why():
    records = holdings.holding_records(staged([(1, 1, 0, 10, 1), (1, 2, 10, 0, 1), (4, 4, 0, 5, 1)]))
    dim = trades([(1, 700, "10.00", 20170101, 93000), (4, 800, None, None, None)])
    rows, missing = holdings.holding_rows(records, dim)
    assert rows["currenttradeid"].to_pylist() == [1]
    assert missing.to_pylist() == [
        {"hh_h_t_id": 1, "hh_t_id": 2, "source_batch": 1, "reason": "its current trade has no DimTrade row"},
        {"hh_h_t_id": 4, "hh_t_id": 4, "source_batch": 1, "reason": "its current trade has no close date"},
    ]
    alerts = holdings.not_loaded_alerts(missing).to_pylist()
    assert [(a["messagekey"], a["messagedata"]) for a in alerts] == [
        ("T_ID=2 H_T_ID=1", "HH_T_ID = 2, HH_H_T_ID = 1: its current trade has no DimTrade row"),
        ("T_ID=4 H_T_ID=4", "HH_T_ID = 4, HH_H_T_ID = 4: its current trade has no close date"),
    ]
    assert {a["messagetext"] for a in alerts} == {"Holding not loaded"}
