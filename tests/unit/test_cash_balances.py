"""FactCashBalances rules on hand-written records (`jobs.cash_balances`, pure functions, no Spark).

Every expected balance is added up here by hand from the amounts written in the test."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa

from jobs import cash_balances as cb
from schemas import sources as src

D = dt.date


def staged(rows: list[tuple], cdc: bool = False) -> pa.Table:
    """Staged CashTransaction rows: (account, timestamp text, amount text, name, TPC-DI batch[, cdc_dsn])."""
    table = (src.CASH_TRANSACTION_CDC if cdc else src.CASH_TRANSACTION).staging
    out = []
    for r in rows:
        row = {
            "ct_ca_id": r[0],
            "ct_dts": dt.datetime.fromisoformat(r[1]).replace(tzinfo=dt.UTC),
            "ct_amt": Decimal(r[2]),
            "ct_name": r[3],
            "source_batch": r[4],
            "batch_id": r[4],
            "source_file": "f",
            "line_no": 1,
        }
        if cdc:
            row |= {"cdc_flag": "I", "cdc_dsn": r[5]}
        out.append(row)
    return pa.Table.from_pylist(out, schema=table.arrow_schema())


def accounts(rows: list[tuple]) -> pa.Table:
    """DimAccount versions: (accountid, sk_accountid, sk_customerid, effective, end)."""
    return pa.table(
        {
            "accountid": pa.array([r[0] for r in rows], pa.int64()),
            "sk_accountid": pa.array([r[1] for r in rows], pa.int64()),
            "sk_customerid": pa.array([r[2] for r in rows], pa.int64()),
            "effectivedate": pa.array([r[3] for r in rows], pa.date32()),
            "enddate": pa.array([r[4] for r in rows], pa.date32()),
        }
    )


BATCH1 = staged(
    [
        (5, "2017-07-01 09:00:00", "100.00", "salary", 1),
        (5, "2017-07-01 17:30:00", "-30.25", "coffee", 1),
        (5, "2017-07-01 17:30:00", "-30.25", "coffee", 1),  # the same record delivered twice: counts once
        (5, "2017-07-03 10:00:00", "-10.00", "rent", 1),
        (6, "2017-07-02 12:00:00", "5.00", "gift", 1),
    ]
)
BATCH2 = staged([(5, "2017-07-08 08:00:00", "0.50", "interest", 2, 41)], cdc=True)
VERSIONS = accounts(
    [
        (5, 501, 901, D(2017, 1, 1), D(2017, 7, 3)),  # account 5 changes on 2017-07-03
        (5, 502, 902, D(2017, 7, 3), D(9999, 12, 31)),
        (6, 601, 903, D(2017, 7, 5), D(9999, 12, 31)),  # account 6 opened after its first transaction
    ]
)


def rows_of(*tables: pa.Table) -> tuple[list[dict], list[dict]]:
    rows, missing = cb.cash_balance_rows(cb.daily_balances(cb.cash_records(*tables)), VERSIONS)
    return rows.to_pylist(), missing.to_pylist()


def test_running_cash_across_days_and_batches_with_the_account_version_of_each_day():
    rows, missing = rows_of(BATCH1, BATCH2)
    assert rows == [
        # 100.00 - 30.25 (the duplicate counts once)
        {"sk_customerid": 901, "sk_accountid": 501, "sk_dateid": 20170701, "cash": Decimal("69.75"), "batchid": 1,
         "accountid": 5},
        # 69.75 - 10.00, on the new version's first day
        {"sk_customerid": 902, "sk_accountid": 502, "sk_dateid": 20170703, "cash": Decimal("59.75"), "batchid": 1,
         "accountid": 5},
        # 59.75 + 0.50: the balance carries over from batch 1 into batch 2
        {"sk_customerid": 902, "sk_accountid": 502, "sk_dateid": 20170708, "cash": Decimal("60.25"), "batchid": 2,
         "accountid": 5},
    ]  # fmt: skip
    # account 6 has no version on 2017-07-02: not loaded
    assert missing == [{"accountid": 6, "day": (D(2017, 7, 2) - D(1970, 1, 1)).days, "batchid": 1}]


def test_a_day_split_over_micro_batches_gives_the_same_rows_and_order_does_not_matter():
    first = BATCH1.slice(0, 2)
    rest = BATCH1.slice(2)
    assert rows_of(rest, BATCH2, first) == rows_of(BATCH1, BATCH2)


def test_each_missing_day_raises_one_alert_keyed_by_account_and_day():
    _, missing = cb.cash_balance_rows(cb.daily_balances(cb.cash_records(BATCH1)), VERSIONS)
    assert cb.not_loaded_alerts(missing).to_pylist() == [
        {
            "batchid": 1,
            "messagesource": "FactCashBalances",
            "messagetext": "Cash balance not loaded",
            "messagetype": "Alert",
            "messagedata": "CT_CA_ID = 6, 2017-07-02: no DimAccount version on that day",
            "messagekey": "CA_ID=6 DAY=2017-07-02",
        }
    ]


def test_no_records_give_no_rows():
    rows, missing = cb.cash_balance_rows(cb.daily_balances(cb.cash_records(BATCH1.slice(0, 0))), VERSIONS)
    assert rows.num_rows == 0 and missing.num_rows == 0
