"""The live-windows page of the report folder: `windows.html`, next to the quality summary (`index.html`).

Plots where people would rather look than read: per declared plot (`PLOTS`), one small panel per node (sector,
industry, ...) with the measure over the latest windows, on one shared scale so panels compare at a glance; and the
late records (DImessages Alerts "Late record past grace") per source and TPC-DI batch, which count in no window.
Plain HTML with inline SVG (matplotlib, `streamdi.report.charts`), nothing fetched, like the summary page. Read from
the Delta lake (`gather`), rendered without I/O from `templates/windows.html` (`render`), written atomically by
`streamdi.report.write.write_report`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal

import pyarrow.compute as pc
from markupsafe import Markup

from schemas import warehouse as wh
from schemas import windows as ws
from streamdi.lake import Lake
from streamdi.report.charts import number, window_panels
from streamdi.report.render import render as render_page

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


def duration(value: dt.timedelta) -> str:
    """'1 hour', '7 days', '90 minutes'."""
    for unit, seconds in (("day", 86400), ("hour", 3600), ("minute", 60)):
        n, rest = divmod(int(value.total_seconds()), seconds)
        if not rest and n:
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return str(value)


def _series(s: Series) -> dict:
    """A plot's section: its anchor, title, the note on what it shows and its panels (None without data)."""
    section = {"anchor": f"{s.plot.window}-{s.plot.level}", "plot": s.plot, "chart": None}
    if not s.nodes:
        return section
    top = max((v for values in s.nodes.values() for v in values if v is not None), default=0.0)
    declared = next(w for w in ws.WINDOWS if w.name == s.plot.window)
    chart = window_panels(section["anchor"], s.starts, s.nodes, declared.slide or declared.size, top)
    return section | {
        "windows": len(s.starts),
        "first": f"{s.starts[0]:%Y-%m-%d %H:%M}",
        "last": f"{s.starts[-1]:%Y-%m-%d %H:%M}",
        "top": number(top),
        "chart": Markup(chart),
    }


def render(data: WindowsData, now: dt.datetime) -> str:
    return render_page(
        "windows.html",
        generated=f"{now:%Y-%m-%d %H:%M:%S}",
        sections=[_series(s) for s in data.series],
        late=data.late,
        late_total=late_total(data),
        grace=", ".join(f"{k} {v}" for k, v in ws.GRACE.items()),
        late_text=LATE,
        windows=[
            {
                "window": w,
                "size": duration(w.size)
                + (f" every {duration(w.slide)}" if w.slide else "")
                + (" gap" if w.kind == ws.SESSION else ""),
                "keep": duration(w.keep),
                "levels": ", ".join(w.levels),
            }
            for w in ws.WINDOWS
        ],
    )
