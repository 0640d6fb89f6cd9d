"""Live windows on hand-written records: each window kind at its edges, out-of-order and late records, sessions that
fuse, a hierarchy change inside a window, two hierarchies over the same records, and the shared slices against a
brute-force combination. Expected values are written out by hand (or brute-forced in plain Python)."""

from __future__ import annotations

import datetime as dt
import itertools
import random

import numpy as np
import pyarrow as pa
import pytest

from jobs import slicing
from jobs import windows_lateness as lateness
from jobs import windows_routing as routing
from jobs import windows_slices as wslices
from schemas import windows as ws

H = dt.timedelta(hours=1)
D = dt.timedelta(days=1)


def t(text: str) -> int:
    """µs since 1970 of 'YYYY-MM-DD HH:MM[:SS]' (UTC)."""
    return (dt.datetime.fromisoformat(text) - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)


def trades(rows: list[tuple], batch: int = 2) -> wslices.Records:
    """Trade records (time, sector, broker, quantity, price in cents[, batch])."""
    n = len(rows)
    quantity = np.array([r[3] for r in rows], np.int64)
    return wslices.Records(
        ts=np.array([t(r[0]) for r in rows], np.int64),
        batch=np.array([r[5] if len(r) > 5 else batch for r in rows], np.int64),
        ident=pa.array([f"T_ID={i}" for i in range(n)], pa.large_string()),
        nodes={
            ws.SECTOR: pa.array([r[1] for r in rows], pa.large_string()),
            ws.BROKER: pa.array([r[2] for r in rows], pa.large_string()),
            ws.ACCOUNT: pa.array([r[2] for r in rows], pa.large_string()),
        },
        measures={
            "trades": np.ones(n, np.int64),
            "quantity": quantity,
            "value": quantity * np.array([r[4] for r in rows], np.int64),
            "commission": np.full(n, 100, np.int64),
            "fee": np.zeros(n, np.int64),
        },
    )


def rows_of(
    windows: tuple[ws.Window, ...], records: wslices.Records, span: tuple[int, int] | None = None
) -> list[tuple]:
    """(window, level, node, start, trades, value in cents) of the rows of `windows` over `span` (all time)."""
    span = span or (0, t("2100-01-01"))
    out = wslices.results(ws.TRADES, records, windows, span, ws.TRADE_WINDOWS)
    return [
        (
            r["window_name"],
            r["level"],
            r["node"],
            r["window_start"].strftime("%Y-%m-%d %H:%M"),
            r["trades"],
            int(r["value"] * 100),
        )
        for r in out.to_pylist()
    ]


HOURLY = ws.Window("hourly", ws.TRADES, ws.TUMBLING, H, (ws.SECTOR,))
DAILY = ws.Window("daily", ws.TRADES, ws.TUMBLING, D, (ws.SECTOR,))
WEEKLY = ws.Window("weekly", ws.TRADES, ws.TUMBLING, 7 * D, (ws.SECTOR,))
SLIDING = ws.Window("last3days", ws.TRADES, ws.SLIDING, 3 * D, (ws.SECTOR,), slide=D)
SESSIONS = ws.Window("sessions", ws.TRADES, ws.SESSION, H, (ws.ACCOUNT,))


def test_tumbling_windows_at_their_edges():
    records = trades(
        [
            ("2017-07-03 09:59:59.999999", "TC", "b1", 1, 1000),  # Monday, the last instant of 09:00-10:00
            ("2017-07-03 10:00", "TC", "b1", 2, 1000),  # the first instant of 10:00-11:00
            ("2017-07-09 23:59:59", "TC", "b1", 3, 1000),  # Sunday: the Monday week still
            ("2017-07-10 00:00", "TC", "b1", 4, 1000),  # Monday midnight: the next day and week
        ]
    )
    assert rows_of((HOURLY,), records) == [
        ("hourly", "sector", "TC", "2017-07-03 09:00", 1, 1000),
        ("hourly", "sector", "TC", "2017-07-03 10:00", 1, 2000),
        ("hourly", "sector", "TC", "2017-07-09 23:00", 1, 3000),
        ("hourly", "sector", "TC", "2017-07-10 00:00", 1, 4000),
    ]
    assert rows_of((DAILY,), records) == [
        ("daily", "sector", "TC", "2017-07-03 00:00", 2, 3000),
        ("daily", "sector", "TC", "2017-07-09 00:00", 1, 3000),
        ("daily", "sector", "TC", "2017-07-10 00:00", 1, 4000),
    ]
    assert rows_of((WEEKLY,), records) == [
        ("weekly", "sector", "TC", "2017-07-03 00:00", 3, 6000),
        ("weekly", "sector", "TC", "2017-07-10 00:00", 1, 4000),
    ]
    out = wslices.results(ws.TRADES, records, (WEEKLY,), (0, t("2100-01-01")), ws.TRADE_WINDOWS).to_pylist()
    assert [r["window_end"].strftime("%Y-%m-%d %H:%M") for r in out] == ["2017-07-10 00:00", "2017-07-17 00:00"]


def test_a_sliding_window_holds_a_record_in_every_window_that_covers_it():
    records = trades([("2017-07-05 12:00", "TC", "b1", 1, 500), ("2017-07-07 00:00", "TC", "b1", 1, 700)])
    # 3-day windows every day: the first record is in the windows starting 07-03, 07-04, 07-05; the second in
    # those starting 07-05, 07-06, 07-07
    assert rows_of((SLIDING,), records) == [
        ("last3days", "sector", "TC", "2017-07-03 00:00", 1, 500),
        ("last3days", "sector", "TC", "2017-07-04 00:00", 1, 500),
        ("last3days", "sector", "TC", "2017-07-05 00:00", 2, 1200),
        ("last3days", "sector", "TC", "2017-07-06 00:00", 1, 700),
        ("last3days", "sector", "TC", "2017-07-07 00:00", 1, 700),
    ]


def test_only_the_windows_of_the_span_are_recomputed():
    records = trades([("2017-07-05 12:00", "TC", "b1", 1, 500), ("2017-07-07 00:00", "TC", "b1", 1, 700)])
    span = (t("2017-07-07 00:00"), t("2017-07-07 00:00") + 1)  # the second record's instant
    assert rows_of((SLIDING,), records, span) == [
        ("last3days", "sector", "TC", "2017-07-05 00:00", 2, 1200),
        ("last3days", "sector", "TC", "2017-07-06 00:00", 1, 700),
        ("last3days", "sector", "TC", "2017-07-07 00:00", 1, 700),
    ]


def test_records_in_any_order_give_the_same_windows():
    rows = [
        ("2017-07-03 09:10", "TC", "b1", 1, 100),
        ("2017-07-03 09:50", "FN", "b2", 2, 200),
        ("2017-07-04 23:59", "TC", "b1", 3, 300),
        ("2017-07-03 09:10", "TC", "b2", 4, 400),
        ("2017-07-06 01:00", "FN", "b1", 5, 500),
    ]
    expected = rows_of((HOURLY, DAILY, SLIDING, SESSIONS), trades(rows))
    for order in itertools.permutations(range(len(rows))):
        assert rows_of((HOURLY, DAILY, SLIDING, SESSIONS), trades([rows[i] for i in order])) == expected


def test_records_sliced_in_pieces_give_the_windows_and_slices_of_the_whole():
    """A first load's read is sliced a piece at a time (`jobs.windows`); a piece may hold any records, in any order,
    and a slice's records may fall into several pieces."""
    rows = [
        ("2017-07-03 09:10", "TC", "b1", 1, 100),
        ("2017-07-03 09:50", "FN", "b2", 2, 200),
        ("2017-07-03 09:55", "TC", "b1", 7, 150),  # the same slice as the first, node and level
        ("2017-07-04 23:59", "TC", "b1", 3, 300),
        ("2017-07-03 09:10", "TC", "b2", 4, 400),
        ("2017-07-06 01:00", "FN", "b1", 5, 500),
        ("2017-07-06 01:40", "ZZ", "b3", 6, 600),  # a node only one piece has
    ]
    windows = (HOURLY, DAILY, SLIDING, SESSIONS)
    levels = [ws.SECTOR, ws.ACCOUNT]
    span, keeps = (0, t("2100-01-01")), {ws.SECTOR: wslices.us(7 * D)}
    whole = wslices.results(ws.TRADES, trades(rows), windows, span, ws.TRADE_WINDOWS)
    slices = wslices.slice_rows(ws.TRADES, trades(rows), keeps, span, t("2017-07-06 02:00"), ws.TRADE_WINDOW_SLICES)
    # by hand: hourly 5, daily 5, 3-day sliding 4 + 6 + 3, sessions 3 + 1 + 1; hourly sector slices 5
    assert whole.num_rows == 28 and slices.num_rows == 5
    draw = random.Random(7)
    for _ in range(30):
        order = draw.sample(range(len(rows)), len(rows))
        cuts = sorted(draw.sample(range(1, len(rows)), draw.randint(1, 3)))
        pieces = [order[a:b] for a, b in itertools.pairwise([0, *cuts, len(rows)])]
        merged = wslices.merged([wslices.sliced(ws.TRADES, trades([rows[i] for i in p]), levels) for p in pieces])
        assert wslices.results_of(ws.TRADES, merged, windows, span, ws.TRADE_WINDOWS).equals(whole)
        latest = t("2017-07-06 02:00")
        assert wslices.slice_rows_of(ws.TRADES, merged, keeps, span, latest, ws.TRADE_WINDOW_SLICES).equals(slices)
    none = wslices.no_slices(ws.TRADES, levels)
    assert wslices.results_of(ws.TRADES, none, windows, span, ws.TRADE_WINDOWS).num_rows == 0


def test_a_late_record_is_reported_and_counts_in_no_window():
    latest = {1: t("2017-07-07 22:00"), 2: t("2017-07-08 21:00")}
    grace = wslices.us(D)
    rows = [
        ("2017-07-08 10:00", "TC", "b1", 1, 100, 2),  # batch 2, after batch 1's latest: on time
        ("2017-07-06 22:00", "TC", "b1", 1, 200, 2),  # exactly the watermark minus the grace: on time (inside it)
        ("2017-07-06 21:59", "TC", "b1", 1, 400, 2),  # a minute past the grace: late
        ("2017-07-01 00:00", "TC", "b1", 1, 800, 1),  # batch 1 has no watermark: never late
    ]
    records = trades(rows)
    late = lateness.late_mask(records.ts, records.batch, latest, grace)
    assert late.tolist() == [False, False, True, False]
    assert rows_of((WEEKLY,), records.filter(~late)) == [
        ("weekly", "sector", "TC", "2017-06-26 00:00", 1, 800),
        ("weekly", "sector", "TC", "2017-07-03 00:00", 2, 300),
    ]
    alerts = lateness.late_alerts(ws.TRADES, records.filter(late), latest).to_pylist()
    assert [(a["batchid"], a["messagesource"], a["messagetext"], a["messagekey"]) for a in alerts] == [
        (2, "TradeWindows", "Late record past grace", "T_ID=2")
    ]
    assert alerts[0]["messagedata"] == (
        "event time 2017-07-06 21:59:00 is before the watermark of batch 2 (2017-07-07 22:00:00) minus the grace "
        "(1 day, 0:00:00)"
    )


def test_watermarks_come_from_earlier_batches_and_their_moves_are_spans():
    latest = {1: 100, 2: 50, 3: 300}
    assert lateness.watermarks(latest)(np.array([1, 2, 3, 4])).tolist() == [lateness.NO_TIME, 100, 100, 300]
    # batch 1 grows from 100 to 150: the watermarks of batches 2 and 3 move from 100 to 150
    assert lateness.watermark_moves(latest, {1: 150, 2: 50, 3: 300}, 10) == [(90, 141), (90, 141)]
    # a first record of batch 1 makes the watermark of batch 2 appear: lateness may change from the start of time
    assert lateness.watermark_moves({2: 50}, {1: 100, 2: 50}, 10) == [(0, 91)]
    assert lateness.watermark_moves(latest, dict(latest), 10) == []


def sessions_of(rows: list[tuple]) -> list[tuple]:
    out = wslices.results(ws.TRADES, trades(rows), (SESSIONS,), (0, t("2100-01-01")), ws.TRADE_WINDOWS).to_pylist()
    return [(r["node"], str(r["window_start"])[11:16], str(r["window_end"])[11:16], r["trades"]) for r in out]


def test_sessions_fuse_when_a_record_closes_the_gap():
    apart = [("2017-07-03 09:00", "TC", "a1", 1, 100), ("2017-07-03 10:45", "TC", "a1", 1, 100)]
    assert sessions_of(apart) == [("a1", "09:00", "10:00", 1), ("a1", "10:45", "11:45", 1)]
    # a record exactly the gap after the first closes that session, and joins the second
    exact = [*apart, ("2017-07-03 10:00", "TC", "a1", 1, 100)]
    assert sessions_of(exact) == [("a1", "09:00", "10:00", 1), ("a1", "10:00", "11:45", 2)]
    # a record less than the gap from both closes the gap: one session
    closer = [*apart, ("2017-07-03 09:50", "TC", "a1", 1, 100)]
    assert sessions_of(closer) == [("a1", "09:00", "11:45", 3)]
    # another account's records never join
    other = [*closer, ("2017-07-03 10:15", "TC", "a2", 1, 100)]
    assert sessions_of(other) == [("a1", "09:00", "11:45", 3), ("a2", "10:15", "11:15", 1)]


def test_a_session_reaching_into_the_span_is_recomputed_whole():
    records = trades([("2017-07-03 09:00", "TC", "a1", 1, 100), ("2017-07-03 09:40", "TC", "a1", 1, 100)])
    span = (t("2017-07-03 09:40"), t("2017-07-03 09:40") + 1)
    out = wslices.results(ws.TRADES, records, (SESSIONS,), span, ws.TRADE_WINDOWS).to_pylist()
    assert [(str(r["window_start"])[:16], r["trades"]) for r in out] == [("2017-07-03 09:00", 2)]
    # a stored session that reaches into the widened span widens the span to read
    stored = pa.table(
        {
            "window_start": pa.array([t("2017-07-03 05:00")], pa.timestamp("us", tz="UTC")),
            "window_end": pa.array([t("2017-07-03 09:00")], pa.timestamp("us", tz="UTC")),
        }
    )
    assert wslices.session_span(stored, span, wslices.us(H)) == (t("2017-07-03 05:00"), t("2017-07-03 10:40") + 1)


def test_a_hierarchy_change_inside_a_window_rolls_each_side_up_to_its_parent():
    # company 7 is in industry Software (sector TC) until 2017-07-05 and in Banks (sector FN) from then on
    securities = pa.table(
        {
            "symbol": pa.array(["AAA"], pa.large_string()),
            "sk_companyid": pa.array([1], pa.int64()),
            "effectivedate": pa.array([dt.date(2010, 1, 1)]),
            "enddate": pa.array([dt.date(9999, 12, 31)]),
        }
    )
    companies = pa.table(
        {
            "sk_companyid": pa.array([1, 2], pa.int64()),
            "companyid": pa.array([7, 7], pa.int64()),
            "industry": pa.array(["Software", "Banks"], pa.large_string()),
            "effectivedate": pa.array([dt.date(2010, 1, 1), dt.date(2017, 7, 5)]),
            "enddate": pa.array([dt.date(2017, 7, 5), dt.date(9999, 12, 31)]),
        }
    )
    industries = pa.table(
        {
            "in_id": pa.array(["SW", "BK"], pa.large_string()),
            "in_name": pa.array(["Software", "Banks"], pa.large_string()),
            "in_sc_id": pa.array(["TC", "FN"], pa.large_string()),
        }
    )
    when = ["2017-07-03 10:00", "2017-07-04 23:59", "2017-07-05 00:00", "2017-07-06 12:00"]
    ts = np.array([t(w) for w in when], np.int64)
    routes = routing.security_routes(
        pa.array(["AAA"] * 4, pa.large_string()),
        ts // wslices.US_PER_DAY,
        pa.array([1] * 4, pa.int64()),
        securities,
        companies,
        industries,
    )
    assert routes[ws.COMPANY].to_pylist() == ["7"] * 4
    assert routes[ws.INDUSTRY].to_pylist() == ["SW", "SW", "BK", "BK"]
    assert routes[ws.SECTOR].to_pylist() == ["TC", "TC", "FN", "FN"]
    records = wslices.Records(
        ts=ts,
        batch=np.full(4, 2, np.int64),
        ident=pa.array([f"T_ID={i}" for i in range(4)], pa.large_string()),
        nodes=routes,
        measures={m: np.ones(4, np.int64) for m in wslices.MEASURES[ws.TRADES]},
    )
    week = ws.Window("w", ws.TRADES, ws.TUMBLING, 7 * D, (ws.COMPANY, ws.INDUSTRY, ws.SECTOR))
    out = wslices.results(ws.TRADES, records, (week,), (0, t("2100-01-01")), ws.TRADE_WINDOWS).to_pylist()
    assert [(r["level"], r["node"], r["trades"]) for r in out] == [
        ("company", "7", 4),
        ("industry", "BK", 2),
        ("industry", "SW", 2),
        ("sector", "FN", 2),
        ("sector", "TC", 2),
    ]


def test_an_account_version_without_a_parent_change_reroutes_nothing():
    before = [(45, 100, 99999, (3, 8))]  # account 45: broker version 3, customer version 8, from day 100 on
    same = [(45, 100, 200, (3, 8)), (45, 200, 99999, (3, 8))]  # closed at day 200 by a version with the same parents
    assert routing.routing_changes(before, same) == []
    moved = [(45, 100, 200, (3, 8)), (45, 200, 99999, (4, 8))]  # the new version moves it to broker version 4
    assert routing.routing_changes(before, moved) == [(200, 99999)]
    assert routing.routing_changes([], [(46, 10, 20, (1, 1))]) == [(10, 20)]  # a new account: its days
    assert routing.routing_changes(before, []) == [(100, 99999)]  # a version that goes away


def test_two_hierarchies_over_the_same_records():
    rows = [
        ("2017-07-03 09:10", "TC", "b1", 1, 100),
        ("2017-07-03 12:00", "FN", "b1", 2, 200),
        ("2017-07-04 09:00", "TC", "b2", 3, 300),
    ]
    both = ws.Window("day", ws.TRADES, ws.TUMBLING, D, (ws.SECTOR, ws.BROKER))
    out = rows_of((both,), trades(rows))
    assert out == [
        ("day", "broker", "b1", "2017-07-03 00:00", 2, 500),
        ("day", "sector", "FN", "2017-07-03 00:00", 1, 400),
        ("day", "sector", "TC", "2017-07-03 00:00", 1, 100),
        ("day", "broker", "b2", "2017-07-04 00:00", 1, 900),
        ("day", "sector", "TC", "2017-07-04 00:00", 1, 900),
    ]
    by_level: dict[str, int] = {}
    for _, level, _, _, n, _ in out:
        by_level[level] = by_level.get(level, 0) + n
    assert by_level == {"broker": 3, "sector": 3}


@pytest.mark.parametrize("op", slicing.OPS)
def test_windows_combined_from_shared_blocks_equal_brute_force(op):
    rng = random.Random(7)
    cells = {(rng.randrange(3), rng.randrange(-40, 200)): rng.randrange(-500, 500) for _ in range(150)}
    keys = slicing.block_keys(np.array([c for c, _ in cells]), 0, np.array([s for _, s in cells]))
    slices = slicing.Partials.of(keys, {"v": np.array(list(cells.values()))}, {"v": op})
    tree = slicing.build_blocks(slices, 8)
    queries = [
        (rng.randrange(3), lo, lo + rng.randrange(1, 200)) for lo in (rng.randrange(-60, 220) for _ in range(300))
    ]
    got = slicing.combine(
        np.array([q[0] for q in queries]), np.array([q[1] for q in queries]), np.array([q[2] for q in queries]), tree, 8
    )["v"]
    fold = {"sum": sum, "max": max, "min": min}[op]
    for (code, lo, hi), value in zip(queries, got.tolist(), strict=True):
        inside = [v for (c, s), v in cells.items() if c == code and lo <= s < hi]
        assert value == (fold(inside) if inside else slicing.identity(op))


def test_declarations_are_checked():
    with pytest.raises(ValueError, match="not a positive multiple"):
        ws.Window("x", ws.TRADES, ws.TUMBLING, dt.timedelta(minutes=30), (ws.SECTOR,))
    with pytest.raises(ValueError, match="slide is declared"):
        ws.Window("x", ws.TRADES, ws.SLIDING, D, (ws.SECTOR,))
    with pytest.raises(ValueError, match="not levels of market"):
        ws.Window("x", ws.MARKET, ws.TUMBLING, D, (ws.BROKER,))
    with pytest.raises(ValueError, match="shorter than the window"):
        ws.Window("x", ws.TRADES, ws.TUMBLING, 7 * D, (ws.SECTOR,), keep=D)
    with pytest.raises(ValueError, match="duplicate window names"):
        ws.check_windows((HOURLY, HOURLY))
