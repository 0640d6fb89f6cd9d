"""T4's FactWatches step (`jobs.watches.run`) on a real lake: hand-written staged WatchHistory records and dimension
versions, the rows expected written by hand from the rules (TPC-DI 4.5 for FactWatches, the module docstring), and
the same load with its customers recomputed a few at a time (`CUSTOMERS_PER_PIECE`), as a big load is."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from jobs import watches
from jobs.scope import BatchScope
from schemas import sources as src
from schemas import warehouse as wh
from schemas.model import Table
from streamdi.context import JobContext
from streamdi.lake import Lake
from streamdi.settings import Settings

pytestmark = pytest.mark.integration

OPEN = dt.date(9999, 12, 31)
BATCH_DATES = {1: dt.date(2016, 12, 31), 2: dt.date(2017, 1, 2)}
DEFAULTS = {pa.int64(): 0, pa.int32(): 0, pa.large_string(): "x", pa.bool_(): True, pa.date32(): dt.date(1950, 1, 1)}


def ts(day: str) -> dt.datetime:
    return dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC)


def dimension_row(table: Table, **values) -> dict:
    """A row of `table` with `values`, NULL in the other nullable columns and a placeholder in the rest."""
    return {f.name: values.get(f.name, None if f.nullable else placeholder(f.type)) for f in table.arrow_schema()}


def placeholder(kind: pa.DataType):
    return 0 if pa.types.is_decimal(kind) else DEFAULTS[kind]


def version(table: Table, eff: str, end: dt.date = OPEN, **keys) -> dict:
    """A version of a dimension row: its keys, valid from `eff` to `end`."""
    day = dt.date.fromisoformat(eff)
    return dimension_row(table, iscurrent=end == OPEN, effectivedate=day, enddate=end, **keys)


def customer(customerid: int, sk: int, eff: str) -> dict:
    return version(wh.DIM_CUSTOMER, eff, customerid=customerid, sk_customerid=sk)


def security(symbol: str, sk: int, eff: str, end: dt.date = OPEN) -> dict:
    return version(wh.DIM_SECURITY, eff, end, symbol=symbol, sk_securityid=sk)


CUSTOMERS = [customer(c, 100 + c, "2000-01-01") for c in (1, 2, 3, 4, 5)]  # customer 6 has no version
SECURITIES = [
    security("AAA", 11, "2000-01-01"),
    security("BBB", 12, "2000-01-01", dt.date(2015, 1, 1)),
    security("BBB", 13, "2015-01-01"),
]
BATCH1 = [  # (customer, symbol, W_DTS, action)
    (1, "AAA", "2014-01-02", "ACTV"),
    (1, "AAA", "2014-02-01", "CNCL"),
    (1, "AAA", "2014-03-01", "ACTV"),
    (2, "BBB", "2014-06-01", "ACTV"),
    (2, "BBB", "2015-06-01", "ACTV"),  # a second ACTV while the first is active: two watches
    (3, "AAA", "2014-01-05", "CNCL"),  # removes nothing
    (4, "BBB", "2016-01-01", "ACTV"),
    (5, "AAA", "2014-01-01", "ACTV"),
    (5, "AAA", "2014-01-10", "CNCL"),
    (6, "AAA", "2014-01-01", "ACTV"),  # no DimCustomer version: not loaded
]
BATCH2 = [  # CDC lines of Batch2: (customer, symbol, W_DTS, action, CDC_DSN)
    (1, "AAA", "2016-12-31", "CNCL", 1),
    (2, "BBB", "2016-12-31", "CNCL", 2),  # removes the latest active watch of the pair
    (4, "AAA", "2016-12-31", "ACTV", 3),
]


class World:
    """A lake with the dimensions committed in micro-batch 1, WatchHistory staged per micro-batch, and T4's
    FactWatches step run one micro-batch at a time."""

    def __init__(self, spark, root) -> None:
        settings = Settings(home=root, spark_master="local[2]")
        self.ctx = JobContext(settings, spark=spark, lake=Lake(root / "lake", spark))
        lake = self.ctx.lake
        lake.upsert(wh.DIM_CUSTOMER, self._arrow(wh.DIM_CUSTOMER, CUSTOMERS), app_id="T2/dimcustomer", version=1)
        lake.upsert(wh.DIM_SECURITY, self._arrow(wh.DIM_SECURITY, SECURITIES), app_id="T1/dimsecurity", version=1)

    @staticmethod
    def _arrow(table: Table, rows: list[dict]) -> pa.Table:
        return pa.Table.from_pylist(rows, schema=table.arrow_schema())

    def stage(self, micro_batch: int, source_batch: int, records: list[tuple]) -> None:
        cdc = source_batch > 1
        table = (src.WATCH_HISTORY_CDC if cdc else src.WATCH_HISTORY).staging
        file = f"Batch{source_batch}/WatchHistory.txt"
        rows = [
            {
                **({"cdc_flag": "I", "cdc_dsn": r[4]} if cdc else {}),
                "w_c_id": r[0],
                "w_s_symb": r[1],
                "w_dts": ts(r[2]),
                "w_action": r[3],
                "batch_id": micro_batch,
                "source_batch": source_batch,
                "source_file": file,
                "line_no": i + 1,
            }
            for i, r in enumerate(records)
        ]
        self.ctx.lake.append(table, self._arrow(table, rows), app_id=f"test/{file}", version=micro_batch)

    def run(self, micro_batch: int, source_batch: int) -> dict[str, int]:
        scope = BatchScope(batch_id=micro_batch, source_batches=(source_batch,), batch_dates=BATCH_DATES)
        return watches.run(self.ctx, scope)

    def rows(self) -> list[tuple]:
        return [
            (
                r["customerid"],
                r["symbol"],
                r["placed"].date().isoformat(),
                r["sk_customerid"],
                r["sk_securityid"],
                r["sk_dateid_dateplaced"],
                r["sk_dateid_dateremoved"],
                r["batchid"],
            )
            for r in self.ctx.lake.read_arrow(wh.FACT_WATCHES).to_pylist()
        ]

    def alerts(self) -> list[tuple]:
        return sorted(
            (m["batchid"], m["messagetext"], m["messagekey"], m["messagedata"])
            for m in self.ctx.lake.read_arrow(wh.DI_MESSAGES).to_pylist()
            if m["messagesource"] == "FactWatches"
        )


def load(spark, root, monkeypatch=None) -> tuple[World, list[tuple], list[tuple]]:
    """Batch1 in micro-batch 1 and Batch2 in micro-batch 2: (world, rows and alerts after 1, after 2)."""
    w = World(spark, root)
    w.stage(1, 1, BATCH1)
    w.run(1, 1)
    first = (w.rows(), w.alerts())
    w.stage(2, 2, BATCH2)
    w.run(2, 2)
    return w, first, (w.rows(), w.alerts())


AFTER_BATCH1 = [  # in the declared order: placed, customer, symbol
    (5, "AAA", "2014-01-01", 105, 11, 20140101, 20140110, 1),
    (1, "AAA", "2014-01-02", 101, 11, 20140102, 20140201, 1),
    (1, "AAA", "2014-03-01", 101, 11, 20140301, None, 1),
    (2, "BBB", "2014-06-01", 102, 12, 20140601, None, 1),
    (2, "BBB", "2015-06-01", 102, 13, 20150601, None, 1),
    (4, "BBB", "2016-01-01", 104, 13, 20160101, None, 1),
]
AFTER_BATCH2 = [
    (5, "AAA", "2014-01-01", 105, 11, 20140101, 20140110, 1),
    (1, "AAA", "2014-01-02", 101, 11, 20140102, 20140201, 1),
    (1, "AAA", "2014-03-01", 101, 11, 20140301, 20161231, 2),
    (2, "BBB", "2014-06-01", 102, 12, 20140601, None, 1),
    (2, "BBB", "2015-06-01", 102, 13, 20150601, 20161231, 2),
    (4, "BBB", "2016-01-01", 104, 13, 20160101, None, 1),
    (4, "AAA", "2016-12-31", 104, 11, 20161231, None, 2),
]
ALERTS = [
    (
        1,
        "Watch cancel without watch",
        "C_ID=3 SYMB=AAA DTS=2014-01-05 00:00:00",
        "W_C_ID = 3, W_S_SYMB = AAA, W_DTS = 2014-01-05 00:00:00: no active watch of the pair",
    ),
    (
        1,
        "Watch not loaded",
        "C_ID=6 SYMB=AAA DTS=2014-01-01 00:00:00",
        "W_C_ID = 6, W_S_SYMB = AAA, W_DTS = 2014-01-01 00:00:00: the customer has no DimCustomer version on that day",
    ),
]


@pytest.fixture(scope="module")
def whole(spark, tmp_path_factory):
    return load(spark, tmp_path_factory.mktemp("watches-whole"))


@pytest.fixture(scope="module")
def in_pieces(spark, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(watches, "CUSTOMERS_PER_PIECE", 2)
        return load(spark, tmp_path_factory.mktemp("watches-pieces"))


def test_watches_rows_and_alerts_follow_the_rules(whole):
    _, first, second = whole
    assert first == (AFTER_BATCH1, ALERTS)
    assert second == (AFTER_BATCH2, ALERTS)


def test_customers_recomputed_a_few_at_a_time_give_the_same_table_and_alerts(whole, in_pieces):
    assert in_pieces[1:] == whole[1:]
    # the first load of three pieces (customers 1-2, 3-4, 5-6) was written a piece at a time, the second as a MERGE
    w = in_pieces[0]
    commits = [c for c in w.ctx.lake.history(wh.FACT_WATCHES) if c.app_id == "T4/factwatches"]
    assert [(c.txn_version, w.ctx.lake.written_in_pieces(wh.FACT_WATCHES, c)) for c in commits] == [
        (1, True),
        (2, False),
    ]
    assert not whole[0].ctx.lake.written_in_pieces(wh.FACT_WATCHES, whole[0].ctx.lake.history(wh.FACT_WATCHES)[-2])


def test_a_rerun_of_a_pieced_micro_batch_changes_nothing(in_pieces):
    w = in_pieces[0]
    version = w.ctx.lake.version(wh.FACT_WATCHES)
    assert w.run(1, 1) == {} and w.run(2, 2) == {}
    assert w.ctx.lake.version(wh.FACT_WATCHES) == version
    assert (w.rows(), w.alerts()) == in_pieces[2]
