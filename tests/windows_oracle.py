"""The live windows computed from scratch, in plain Python, from a finished warehouse: the oracle the tests hold
`warehouse.trade_windows` and `warehouse.market_windows` against (it shares no code with `jobs.windows`).

Every record is routed through the dimension versions valid on its event day by dictionary lookups, every
tumbling and sliding window that contains it gets it, sessions are formed by walking each node's sorted records,
a record earlier than its batch's watermark (the latest record of the earlier batches) minus the grace counts
nowhere, and a window ending `keep` or more before the latest record is not kept. Money is summed in Decimal.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from decimal import Decimal

from deltalake import DeltaTable

from schemas import windows as ws

ZERO = Decimal("0.00")


def _rows(lake, layer: str, name: str) -> list[dict]:
    path = lake / layer / name
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist() if (path / "_delta_log").is_dir() else []


def _valid(versions: dict, key, day: dt.date):
    for v in versions.get(key, ()):
        if v["effectivedate"] <= day < v["enddate"]:
            return v
    return None


def _day(date_id: int) -> dt.date:
    return dt.date(date_id // 10000, date_id // 100 % 100, date_id % 100)


def _group(rows: list[dict], key: str) -> dict:
    out: dict = defaultdict(list)
    for r in rows:
        out[r[key]].append(r)
    return out


def expected_windows(lake, stored: bool = True) -> dict[str, list[dict]]:
    """The rows of trade_windows and market_windows, sorted by their key, from the lake's dimensions and facts
    (`stored=False`: the rows of the windows answered when queried, what the views over the slices return)."""
    securities = _rows(lake, "warehouse", "dimsecurity")
    companies = _rows(lake, "warehouse", "dimcompany")
    # an industry name several Industry rows share (generated data) names the one with the lowest IN_ID
    industries = {r["in_name"]: r for r in sorted(_rows(lake, "warehouse", "industry"), key=lambda r: r["in_id"])[::-1]}
    accounts = _rows(lake, "warehouse", "dimaccount")
    customer_of = {r["sk_customerid"]: r["customerid"] for r in _rows(lake, "warehouse", "dimcustomer")}
    broker_of = {r["sk_brokerid"]: r["brokerid"] for r in _rows(lake, "warehouse", "dimbroker")}
    symbol_of = {r["sk_securityid"]: r["symbol"] for r in securities}
    account_of = {r["sk_accountid"]: r["accountid"] for r in accounts}
    company_row = {r["sk_companyid"]: r for r in companies}
    sec_versions, com_versions, acc_versions = (
        _group(securities, "symbol"),
        _group(companies, "companyid"),
        _group(accounts, "accountid"),
    )

    def security_nodes(symbol: str, day: dt.date, sk_company: int) -> dict:
        sec = _valid(sec_versions, symbol, day)
        company = company_row[sec["sk_companyid"] if sec else sk_company]
        version = _valid(com_versions, company["companyid"], day) or company
        industry = industries[version["industry"]]
        return {
            "security": symbol,
            "company": str(company["companyid"]),
            "industry": industry["in_id"],
            "sector": industry["in_sc_id"],
        }

    trades = []
    for r in _rows(lake, "warehouse", "dimtrade"):
        if r["status"] != "Completed":
            continue
        day = _day(r["sk_closedateid"])
        t = r["sk_closetimeid"]
        when = dt.datetime.combine(day, dt.time(t // 10000, t // 100 % 100, t % 100), tzinfo=dt.UTC)
        account = account_of[r["sk_accountid"]]
        version = _valid(acc_versions, account, day)
        nodes = security_nodes(symbol_of[r["sk_securityid"]], day, r["sk_companyid"])
        nodes |= {
            "account": str(account),
            "customer": str(customer_of[version["sk_customerid"] if version else r["sk_customerid"]]),
            "broker": str(broker_of[version["sk_brokerid"] if version else r["sk_brokerid"]]),
        }
        price = r["tradeprice"] or ZERO
        measures = {
            "trades": 1,
            "quantity": r["quantity"],
            "value": price * r["quantity"],
            "commission": r["commission"] or ZERO,
            "fee": r["fee"] or ZERO,
        }
        trades.append((when, r["batchid"], nodes, measures))
    market = []
    for r in _rows(lake, "warehouse", "factmarkethistory"):
        day = _day(r["sk_dateid"])
        when = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
        measures = {"days": 1, "volume": r["volume"], "high": r["dayhigh"], "low": r["daylow"]}
        market.append((when, r["batchid"], security_nodes(r["symbol"], day, r["sk_companyid"]), measures))
    return {
        "trade_windows": _windows(ws.TRADES, _on_time(trades, ws.GRACE[ws.TRADES]), _latest(trades), stored),
        "market_windows": _windows(ws.MARKET, _on_time(market, ws.GRACE[ws.MARKET]), _latest(market), stored),
    }


def late_records(lake) -> int:
    """DImessages Alerts of late records."""
    return sum(1 for r in _rows(lake, "warehouse", "dimessages") if r["messagetext"] == "Late record past grace")


def _latest(records: list[tuple]) -> dt.datetime | None:
    """The latest event time of all records, late ones included."""
    return max((r[0] for r in records), default=None)


def _on_time(records: list[tuple], grace: dt.timedelta) -> list[tuple]:
    latest: dict[int, dt.datetime] = {}
    for when, batch, _, _ in records:
        latest[batch] = max(latest.get(batch, when), when)

    def watermark(batch: int):
        earlier = [t for b, t in latest.items() if b < batch]
        return max(earlier) if earlier else None

    return [r for r in records if watermark(r[1]) is None or r[0] >= watermark(r[1]) - grace]


def _combine(acc: dict, measures: dict) -> None:
    for name, value in measures.items():
        if name not in acc:
            acc[name] = value
        elif name == "high":
            acc[name] = max(acc[name], value)
        elif name == "low":
            acc[name] = min(acc[name], value)
        else:
            acc[name] += value


def _windows(source: str, records: list[tuple], latest: dt.datetime | None, stored: bool) -> list[dict]:
    """Every window of `source` (the stored ones, or those answered when queried) holding an on-time record and
    ending after `latest` minus its `keep`."""
    out = []
    for w in ws.windows_of(source):
        if w.stored != stored:
            continue
        for level in w.levels:
            if w.kind == ws.SESSION:
                by_node: dict = defaultdict(list)
                for when, _, nodes, measures in records:
                    by_node[nodes[level]].append((when, measures))
                for node, items in by_node.items():
                    items.sort(key=lambda x: x[0])
                    session: list = []
                    for when, measures in items:
                        if session and when - session[-1][0] >= w.size:
                            out.append(_session_row(w, level, node, session))
                            session = []
                        session.append((when, measures))
                    out.append(_session_row(w, level, node, session))
                continue
            acc: dict = defaultdict(dict)
            slide = w.slide or w.size
            for when, _, nodes, measures in records:
                # every window start `ALIGN + k * slide` with start <= when < start + size
                k = (when - ws.ALIGN) // slide
                while ws.ALIGN + k * slide + w.size > when:
                    _combine(acc[(nodes[level], ws.ALIGN + k * slide)], measures)
                    k -= 1
            for (node, start), measures in acc.items():
                out.append({"window_name": w.name, "level": level, "node": node, "window_start": start} | measures)
                out[-1]["window_end"] = start + w.size
    keep = {w.name: w.keep for w in ws.windows_of(source)}
    out = [r for r in out if latest is None or r["window_end"] > latest - keep[r["window_name"]]]
    return sorted(out, key=lambda r: (r["window_name"], r["level"], r["node"], r["window_start"]))


def _session_row(w: ws.Window, level: str, node: str, session: list) -> dict:
    acc: dict = {}
    for _, measures in session:
        _combine(acc, measures)
    start, last = session[0][0], session[-1][0]
    return {
        "window_name": w.name,
        "level": level,
        "node": node,
        "window_start": start,
        "window_end": last + w.size,
    } | acc


def stored_windows(lake) -> dict[str, list[dict]]:
    """The lake's window rows in the oracle's shape and order."""
    out = {}
    for name in ("trade_windows", "market_windows"):
        rows = _rows(lake, "warehouse", name)
        out[name] = sorted(rows, key=lambda r: (r["window_name"], r["level"], r["node"], r["window_start"]))
    return out


def answered_rows(answers: dict[str, list[dict]]) -> dict[str, list[tuple]]:
    """The oracle's windows answered when queried (`expected_windows(lake, stored=False)`) as the views'
    rows: (window_name, level, node, window_start, window_end, measures...) in key order, and what the named
    query `sector_24h` returns."""

    def naive(value):  # PostgreSQL's timestamp (without time zone) holds UTC
        return value.replace(tzinfo=None) if isinstance(value, dt.datetime) else value

    out = {}
    for view, table in (("trade_window_answers", ws.TRADE_WINDOWS), ("market_window_answers", ws.MARKET_WINDOWS)):
        out[view] = [tuple(naive(r[c]) for c in table.column_names) for r in answers[table.name]]
    rows = [r for r in answers["trade_windows"] if r["window_name"] == "trades_24h_hourly" and r["level"] == "sector"]
    last = max((r["window_end"] for r in rows), default=None)
    latest = sorted((r for r in rows if r["window_end"] == last), key=lambda r: (-r["value"], r["node"]))
    out["sector_24h"] = [
        (r["node"], naive(r["window_start"]), naive(r["window_end"]), r["trades"], r["quantity"], r["value"])
        for r in latest
    ]
    return out


def named_query_rows(expected: dict[str, list[dict]]) -> dict[str, list[tuple]]:
    """What the named queries `sector_day` and `broker_week` (streamdi.queries) return, from the oracle's rows."""

    def latest(window: str, level: str) -> list[dict]:
        rows = [r for r in expected["trade_windows"] if r["window_name"] == window and r["level"] == level]
        last = max((r["window_start"] for r in rows), default=None)
        return [r for r in rows if r["window_start"] == last]

    days = sorted(latest("trades_day", "sector"), key=lambda r: (-r["value"], r["node"]))
    weeks = sorted(latest("trades_week", "broker"), key=lambda r: (-r["commission"], r["node"]))[:10]
    return {
        "sector_day": [
            (r["node"], r["window_start"].date(), r["trades"], r["quantity"], r["value"], r["commission"]) for r in days
        ],
        "broker_week": [(r["node"], r["window_start"].date(), r["trades"], r["value"], r["commission"]) for r in weeks],
    }
