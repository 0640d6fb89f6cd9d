"""The windows answered when queried (`stored=False`): the PostgreSQL views over the slices
(`streamdi.window_views`) on hand-written slices, with the answers worked out by hand.

Each test writes its slices and its own window declarations inside one admin transaction and rolls it back, so
the shared warehouse keeps its tables as they were.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from schemas import warehouse as wh
from schemas import windows as ws
from streamdi.window_views import view_sql

pytestmark = pytest.mark.integration

H = dt.timedelta(hours=1)
D = dt.timedelta(days=1)


def stamp(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


@pytest.fixture
def conn(warehouse):
    warehouse.ensure_objects(wh.WAREHOUSE_TABLES)
    with warehouse.connect("admin") as c:
        c.execute(
            "DELETE FROM dw.trade_window_slices; DELETE FROM dw.market_window_slices; DELETE FROM dw.window_latest"
        )
        yield c
        c.rollback()


def trade_slice(conn, level: str, node: str, start: str, trades: int, quantity: int, value: str) -> None:
    conn.execute(
        "INSERT INTO dw.trade_window_slices VALUES (%s, %s, %s, %s, %s, %s, 0, 0)",
        (level, node, stamp(start), trades, quantity, Decimal(value)),
    )


def answers(conn, view: str) -> list[tuple]:
    rows = conn.execute(
        f"SELECT window_name, level, node, window_start, window_end, * FROM dw.{view} "
        "ORDER BY window_name, level, node, window_start"
    ).fetchall()
    return [(r[0], r[1], r[2], str(r[3])[:16], str(r[4])[:16], *r[10:13]) for r in rows]


def test_sliding_and_tumbling_windows_combine_the_slices_they_cover_and_age_with_the_latest_record(conn):
    declared = (
        ws.Window("slide3h", ws.TRADES, ws.SLIDING, 3 * H, (ws.SECTOR,), slide=2 * H, keep=10 * D, stored=False),
        ws.Window("day", ws.TRADES, ws.TUMBLING, D, (ws.SECTOR,), keep=D, stored=False),
        ws.Window("stored_day", ws.TRADES, ws.TUMBLING, D, (ws.SECTOR,)),  # stored: not in the view
    )
    conn.execute(view_sql(ws.TRADES, declared))
    trade_slice(conn, "sector", "TC", "2017-07-03 00:00", 1, 10, "100.00")
    trade_slice(conn, "sector", "TC", "2017-07-03 01:00", 2, 20, "250.00")
    trade_slice(conn, "sector", "TC", "2017-07-03 02:00", 1, 5, "50.00")
    trade_slice(conn, "sector", "TC", "2017-07-05 23:00", 1, 1, "1.00")
    trade_slice(conn, "industry", "SW", "2017-07-03 00:00", 9, 9, "9.00")  # no window here is at this level
    assert answers(conn, "trade_window_answers") == []  # no latest record: nothing to answer
    conn.execute("INSERT INTO dw.window_latest VALUES ('trades', %s)", (stamp("2017-07-05 23:30"),))
    # windows of 3 hours start every 2 hours from midnight (ALIGN is a Monday midnight); the day window of
    # 07-03 ends 07-04 00:00, not after 07-05 23:30 minus its day of keep: not answered
    assert answers(conn, "trade_window_answers") == [
        ("day", "sector", "TC", "2017-07-05 00:00", "2017-07-06 00:00", 1, 1, Decimal("1.00")),
        ("slide3h", "sector", "TC", "2017-07-02 22:00", "2017-07-03 01:00", 1, 10, Decimal("100.00")),
        ("slide3h", "sector", "TC", "2017-07-03 00:00", "2017-07-03 03:00", 4, 35, Decimal("400.00")),
        ("slide3h", "sector", "TC", "2017-07-03 02:00", "2017-07-03 05:00", 1, 5, Decimal("50.00")),
        ("slide3h", "sector", "TC", "2017-07-05 22:00", "2017-07-06 01:00", 1, 1, Decimal("1.00")),
    ]


def test_market_windows_take_the_highest_high_and_the_lowest_low(conn):
    week = ws.Window("week", ws.MARKET, ws.TUMBLING, 7 * D, (ws.SECTOR,), stored=False)
    conn.execute(view_sql(ws.MARKET, (week,)))
    for day, volume, high, low in (("2017-07-03", 100, "12.50", "9.00"), ("2017-07-04", 50, "13.00", "9.50")):
        conn.execute(
            "INSERT INTO dw.market_window_slices VALUES ('sector', 'TC', %s, 1, %s, %s, %s)",
            (stamp(day), volume, Decimal(high), Decimal(low)),
        )
    conn.execute("INSERT INTO dw.window_latest VALUES ('market', %s)", (stamp("2017-07-04"),))
    rows = conn.execute("SELECT * FROM dw.market_window_answers").fetchall()
    assert [(r[0], r[2], str(r[3])[:10], str(r[4])[:10], *r[5:]) for r in rows] == [
        ("week", "TC", "2017-07-03", "2017-07-10", 2, 150, Decimal("13.00"), Decimal("9.00"))
    ]


def test_the_views_have_the_columns_and_types_of_the_stored_windows(conn):
    def columns(name: str) -> list[tuple]:
        return conn.execute(
            "SELECT column_name, data_type, numeric_precision, numeric_scale FROM information_schema.columns "
            "WHERE table_schema = 'dw' AND table_name = %s ORDER BY ordinal_position",
            (name,),
        ).fetchall()

    assert columns("trade_window_answers") == columns("trade_windows")
    assert columns("market_window_answers") == columns("market_windows")
    assert len(columns("trade_windows")) == 10
