"""FactWatches rules on hand-written records (`jobs.watches`, pure functions, no Spark)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from jobs import watches
from schemas import sources as src

D = dt.date
OPEN = D(9999, 12, 31)


def ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def staged(rows: list[tuple], cdc: bool = False) -> pa.Table:
    """Staged WatchHistory rows: (customer, symbol, timestamp text, action, TPC-DI batch[, cdc_dsn])."""
    table = (src.WATCH_HISTORY_CDC if cdc else src.WATCH_HISTORY).staging
    out = []
    for r in rows:
        row = {"w_c_id": r[0], "w_s_symb": r[1], "w_dts": ts(r[2]), "w_action": r[3]}
        row |= {"source_batch": r[4], "batch_id": r[4], "source_file": "f", "line_no": 1}
        if cdc:
            row |= {"cdc_flag": "I", "cdc_dsn": r[5]}
        out.append(row)
    return pa.Table.from_pylist(out, schema=table.arrow_schema())


def versions(key: str, sk: str, rows: list[tuple]) -> pa.Table:
    key_type = pa.large_string() if key == "symbol" else pa.int64()
    return pa.table(
        {
            key: pa.array([r[0] for r in rows], key_type),
            sk: pa.array([r[1] for r in rows], pa.int64()),
            "effectivedate": pa.array([r[2] for r in rows], pa.date32()),
            "enddate": pa.array([r[3] for r in rows], pa.date32()),
        }
    )


CUSTOMERS = versions(
    "customerid", "sk_customerid", [(1, 11, D(2010, 1, 1), D(2017, 7, 8)), (1, 12, D(2017, 7, 8), OPEN)]
)
SECURITIES = versions("symbol", "sk_securityid", [("AAA", 21, D(2010, 1, 1), OPEN), ("BBB", 22, D(2010, 1, 1), OPEN)])


def rows_of(*tables: pa.Table):
    rows, failed, unmatched = watches.watch_rows(watches.watch_records(*tables), CUSTOMERS, SECURITIES)
    return rows.to_pylist(), failed, unmatched


def row(symbol, sk_c, sk_s, placed, removed, batch, when):
    return {
        "sk_customerid": sk_c,
        "sk_securityid": sk_s,
        "sk_dateid_dateplaced": placed,
        "sk_dateid_dateremoved": removed,
        "batchid": batch,
        "customerid": 1,
        "symbol": symbol,
        "placed": ts(when),
    }


def test_a_watch_activated_in_one_batch_and_cancelled_in_the_next():
    rows, failed, unmatched = rows_of(
        staged([(1, "AAA", "2017-07-01 10:00:00", "ACTV", 1)]),
        staged([(1, "AAA", "2017-07-08 09:00:00", "CNCL", 2, 5)], cdc=True),
    )
    # keys of the versions valid on the day it was placed; batch of its latest record (the CNCL)
    assert rows == [row("AAA", 11, 21, 20170701, 20170708, 2, "2017-07-01 10:00:00")]
    assert failed.num_rows == 0 and unmatched.num_rows == 0


def test_every_activation_is_a_watch_and_a_cancel_removes_the_latest_active_one():
    rows, _, unmatched = rows_of(
        staged(
            [
                (1, "AAA", "2017-07-01 10:00:00", "ACTV", 1),
                (1, "AAA", "2017-07-02 10:00:00", "CNCL", 1),
                (1, "AAA", "2017-07-03 10:00:00", "ACTV", 1),  # placed again: a second watch
                (1, "BBB", "2017-07-01 10:00:00", "ACTV", 1),
                (1, "BBB", "2017-07-04 10:00:00", "ACTV", 1),  # a second ACTV while the first is active
                (1, "BBB", "2017-07-05 10:00:00", "CNCL", 1),  # removes the latest one
                (1, "BBB", "2017-07-05 10:00:00", "CNCL", 1),  # the same record twice: counts once
            ]
        ),
        staged([(1, "AAA", "2017-07-08 11:00:00", "ACTV", 2, 3)], cdc=True),
    )
    assert rows == [
        row("AAA", 11, 21, 20170701, 20170702, 1, "2017-07-01 10:00:00"),
        row("AAA", 11, 21, 20170703, None, 1, "2017-07-03 10:00:00"),
        row("AAA", 12, 21, 20170708, None, 2, "2017-07-08 11:00:00"),  # the customer's version of 2017-07-08
        row("BBB", 11, 22, 20170701, None, 1, "2017-07-01 10:00:00"),
        row("BBB", 11, 22, 20170704, 20170705, 1, "2017-07-04 10:00:00"),
    ]
    assert unmatched.num_rows == 0


def test_unknown_keys_and_cancels_without_a_watch_are_reported():
    rows, failed, unmatched = rows_of(
        staged(
            [
                (1, "ZZZ", "2017-07-01 10:00:00", "ACTV", 1),  # no DimSecurity version
                (2, "AAA", "2017-07-01 10:00:00", "ACTV", 1),  # no DimCustomer version
                (1, "BBB", "2017-07-02 10:00:00", "CNCL", 1),  # nothing to remove
            ]
        )
    )
    assert rows == []
    alerts = watches.watch_alerts(failed, unmatched).to_pylist()
    assert [(a["messagetext"], a["messagekey"], a["messagedata"]) for a in alerts] == [
        (
            "Watch not loaded",
            "C_ID=1 SYMB=ZZZ DTS=2017-07-01 10:00:00",
            "W_C_ID = 1, W_S_SYMB = ZZZ, W_DTS = 2017-07-01 10:00:00: the security has no DimSecurity version on "
            "that day",
        ),
        (
            "Watch not loaded",
            "C_ID=2 SYMB=AAA DTS=2017-07-01 10:00:00",
            "W_C_ID = 2, W_S_SYMB = AAA, W_DTS = 2017-07-01 10:00:00: the customer has no DimCustomer version on "
            "that day",
        ),
        (
            "Watch cancel without watch",
            "C_ID=1 SYMB=BBB DTS=2017-07-02 10:00:00",
            "W_C_ID = 1, W_S_SYMB = BBB, W_DTS = 2017-07-02 10:00:00: no active watch of the pair",
        ),
    ]
    assert {a["batchid"] for a in alerts} == {1}
