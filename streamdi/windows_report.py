"""The live-windows page of the report folder: `windows.html`, next to the quality summary (`index.html`).

Plots where people would rather look than read: per declared plot (`PLOTS`), one small panel per node (sector,
industry, ...) with the measure over the latest windows, on one shared scale so panels compare at a glance; and the
late records (DImessages Alerts "Late record past grace") per source and TPC-DI batch, which count in no window.
Plain HTML with inline SVG, nothing fetched, like the summary page. Read from the Delta lake (`gather`), drawn
without I/O (`render`), written atomically by `streamdi.quality_report.write_report`.
"""

from __future__ import annotations

import datetime as dt
import html
from dataclasses import dataclass, field
from decimal import Decimal

import pyarrow.compute as pc

from schemas import warehouse as wh
from schemas import windows as ws
from streamdi.lake import Lake

LATE = "Late record past grace"  # = jobs.windows_lateness.LATE (the report does not import the jobs)
ALERT_SOURCES = ("TradeWindows", "MarketWindows")


@dataclass(frozen=True)
class Plot:
    title: str
    table: str  # trade_windows or market_windows
    window: str
    level: str
    measure: str
    latest: int  # windows shown (the latest that hold data)


PLOTS: tuple[Plot, ...] = (
    Plot("Value traded per sector per day", "trade_windows", "trades_day", ws.SECTOR, "value", 60),
    Plot("Completed trades per sector per hour", "trade_windows", "trades_hour", ws.SECTOR, "trades", 72),
    Plot("Market volume per sector per week", "market_windows", "market_week", ws.SECTOR, "volume", 26),
)


@dataclass
class Series:
    plot: Plot
    starts: list[dt.datetime]  # the windows shown, oldest first
    nodes: dict[str, list[float | None]] = field(default_factory=dict)  # node -> value per window (None: no data)


@dataclass
class WindowsData:
    series: list[Series]
    late: dict[tuple[str, int], int]  # (alert source, TPC-DI batch) -> late records


def gather(lake: Lake) -> WindowsData:
    tables = {t.name: t for t in ws.WINDOW_TABLES.values()}
    declared = {w.name: w for w in ws.WINDOWS}
    series = []
    for plot in PLOTS:
        table = tables[plot.table]
        if plot.window not in declared or not lake.exists(table):
            continue
        rows = lake.read_where(
            table,
            (pc.field("window_name") == plot.window) & (pc.field("level") == plot.level),
            ["node", "window_start", plot.measure],
        ).to_pylist()
        starts = sorted({r["window_start"] for r in rows})[-plot.latest :]
        index = {s: i for i, s in enumerate(starts)}
        s = Series(plot, starts)
        for r in sorted(rows, key=lambda r: (r["node"], r["window_start"])):
            if r["window_start"] in index:
                values = s.nodes.setdefault(r["node"], [None] * len(starts))
                v = r[plot.measure]
                values[index[r["window_start"]]] = float(v) if isinstance(v, Decimal) else v
        series.append(s)
    late: dict[tuple[str, int], int] = {}
    if lake.exists(wh.DI_MESSAGES):
        alerts = lake.read_where(
            wh.DI_MESSAGES,
            pc.field("messagesource").isin(list(ALERT_SOURCES)) & (pc.field("messagetext") == LATE),
            ["messagesource", "batchid"],
        ).to_pylist()
        for a in alerts:
            key = (a["messagesource"], a["batchid"])
            late[key] = late.get(key, 0) + 1
    return WindowsData(series, dict(sorted(late.items())))


def late_total(data: WindowsData) -> int:
    return sum(data.late.values())


_PANEL_W, _PANEL_H, _PAD = 230, 70, 4


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _number(value: float) -> str:
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


def _panel(node: str, values: list[float | None], starts: list[dt.datetime], top: float, step: dt.timedelta) -> str:
    """One node's values at their windows' starts (x by event time); a line joins neighbouring windows only, so a
    stretch without records shows as a gap."""
    span = (starts[-1] - starts[0]) or step
    y0 = _PANEL_H - 16

    def x(i: int) -> float:
        return _PAD + (starts[i] - starts[0]) / span * (_PANEL_W - 2 * _PAD)

    def y(v: float) -> float:
        return y0 - (v / top) * (y0 - 14) if top else y0

    points = [(i, v) for i, v in enumerate(values) if v is not None]
    runs: list[list[tuple[int, float]]] = []
    for i, v in points:
        if runs and starts[i] - starts[runs[-1][-1][0]] <= step:
            runs[-1].append((i, v))
        else:
            runs.append([(i, v)])
    lines = "".join(
        '<polyline points="'
        + " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in run)
        + '" fill="none" stroke="#0969da" stroke-width="1.2"/>'
        for run in runs
        if len(run) > 1
    )
    dots = "".join(
        f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="1.8" fill="#0969da">'
        f"<title>{_e(node)} {starts[i]:%Y-%m-%d %H:%M}: {_number(v)}</title></circle>"
        for i, v in points
    )
    total = sum(v for _, v in points)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_PANEL_W}" height="{_PANEL_H}" role="img" '
        f'aria-label="{_e(node)}" class="panel">'
        f'<text x="{_PAD}" y="11" font-size="11" font-weight="600">{_e(node)}</text>'
        f'<text x="{_PANEL_W - _PAD}" y="11" font-size="10" text-anchor="end">total {_number(total)}</text>'
        f'<line x1="{_PAD}" x2="{_PANEL_W - _PAD}" y1="{y0}" y2="{y0}" stroke="#d0d7de"/>{lines}{dots}'
        f'<text x="{_PAD}" y="{_PANEL_H - 3}" font-size="9">{starts[0]:%Y-%m-%d}</text>'
        f'<text x="{_PANEL_W - _PAD}" y="{_PANEL_H - 3}" font-size="9" text-anchor="end">{starts[-1]:%Y-%m-%d}</text>'
        "</svg>"
    )


def duration(value: dt.timedelta) -> str:
    """'1 hour', '7 days', '90 minutes'."""
    for unit, seconds in (("day", 86400), ("hour", 3600), ("minute", 60)):
        n, rest = divmod(int(value.total_seconds()), seconds)
        if not rest and n:
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return str(value)


def render_series(s: Series) -> str:
    anchor = f"{s.plot.window}-{s.plot.level}"
    head = f'<h2 id="{_e(anchor)}">{_e(s.plot.title)}</h2>'
    if not s.nodes:
        return head + "<p>No window holds a record yet.</p>"
    top = max((v for values in s.nodes.values() for v in values if v is not None), default=0.0)
    note = (
        f'<p class="small muted">Window <code>{_e(s.plot.window)}</code>, level <code>{_e(s.plot.level)}</code>, '
        f"measure <code>{_e(s.plot.measure)}</code>: the latest {len(s.starts)} windows that hold data "
        f"({s.starts[0]:%Y-%m-%d %H:%M} to {s.starts[-1]:%Y-%m-%d %H:%M}, event time), one shared scale (top "
        f"{_number(top)}); a line joins neighbouring windows, a gap is a stretch without records. Hover a point for "
        "its value.</p>"
    )
    declared = next(w for w in ws.WINDOWS if w.name == s.plot.window)
    step = declared.slide or declared.size
    panels = "".join(_panel(node, values, s.starts, top, step) for node, values in s.nodes.items())
    return head + note + f'<div class="panels">{panels}</div>'


def render_late(data: WindowsData) -> str:
    head = '<h2 id="late">Late records</h2>'
    if not data.late:
        return head + '<p id="late-count">No late record: every record arrived within its grace.</p>'
    body = "".join(f"<tr><td>{_e(src)}</td><td>{b}</td><td>{n:,}</td></tr>" for (src, b), n in data.late.items())
    grace = ", ".join(f"{k} {v}" for k, v in ws.GRACE.items())
    return (
        head + f'<p id="late-count">{late_total(data):,} late record(s): earlier than their batch\'s watermark '
        f"minus the grace ({_e(grace)}); they count in no window and each has a DImessages Alert "
        f"<q>{_e(LATE)}</q>.</p>"
        f'<table id="late-table"><thead><tr><th>source</th><th>TPC-DI batch</th><th>late records</th></tr></thead>'
        f"<tbody>{body}</tbody></table>"
    )


def render(data: WindowsData, now: dt.datetime) -> str:
    sections = "".join(render_series(s) for s in data.series) + render_late(data)
    declared = "".join(
        f"<tr><td><code>{_e(w.name)}</code></td><td>{_e(w.source)}</td><td>{_e(w.kind)}</td>"
        f"<td>{_e(duration(w.size))}{' every ' + _e(duration(w.slide)) if w.slide else ''}"
        f"{' gap' if w.kind == ws.SESSION else ''}</td><td>{_e(duration(w.keep))}</td>"
        f"<td>{_e(', '.join(w.levels))}</td><td>{_e(w.doc)}</td></tr>"
        for w in ws.WINDOWS
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>streamdi live windows</title>'
        "<style>body{font:14px system-ui,sans-serif;margin:24px;color:#1f2328}"
        ".panels{display:flex;flex-wrap:wrap;gap:6px}.panel{border:1px solid #d0d7de;border-radius:4px}"
        "table{border-collapse:collapse}td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left}"
        ".small{font-size:12px}.muted{color:#57606a}</style></head><body>"
        '<h1>Live windows</h1><p class="small muted"><a href="index.html">Quality summary</a> · generated '
        f"{now:%Y-%m-%d %H:%M:%S} UTC from <code>warehouse.trade_windows</code> and "
        "<code>warehouse.market_windows</code> (also in PostgreSQL, <code>dw.*</code>).</p>"
        f"{sections}<h2>Declared windows</h2><table><thead><tr><th>window</th><th>source</th><th>kind</th>"
        f"<th>size</th><th>kept</th><th>levels</th><th>what</th></tr></thead><tbody>{declared}</tbody></table></body></html>"
    )
