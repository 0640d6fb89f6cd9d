"""The report's charts, drawn by matplotlib as SVG and inlined in the pages (`streamdi.report.render`, `.windows`).

Where it sits in `streamdi.report`: the templates get each chart as one `<svg>` element, built here from plain values
(`figures.BatchTrend` points, a window series' values per node); nothing here reads the lake or writes a file.

matplotlib draws on an Agg canvas (never pyplot: no global figure state, no GUI backend) and writes SVG with its
text as `<text>` (`svg.fonttype` none, selectable, in the page's font), a fixed `svg.hashsalt` and no date in the
metadata, so the same data gives the same page. The SVG is then finished with ElementTree: every id gets the
chart's prefix (several charts live in one HTML document), the metadata and matplotlib's global `*` style go, each
bar becomes an SVG `<rect>` and each bar or point gets a `<title>`, the tooltip a browser shows on hover (found by
the `gid` matplotlib writes as the id of the artist's group).
"""

from __future__ import annotations

import datetime as dt
import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from streamdi.report.figures import LABELS, BatchTrend

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SVG = "http://www.w3.org/2000/svg"
XLINK = "http://www.w3.org/1999/xlink"
ET.register_namespace("", SVG)
ET.register_namespace("xlink", XLINK)

_RC = {
    "svg.hashsalt": "streamdi",  # ids of clip paths and markers derive from it: fixed, so the output is too
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.size": 8,
    "axes.edgecolor": "#d0d7de",
    "axes.linewidth": 0.8,
    "xtick.color": "#57606a",
    "ytick.color": "#57606a",
    "xtick.major.size": 0,
    "ytick.major.size": 0,
}
_DPI = 72  # 1 inch = 72 SVG points: sizes below are in inches
BAR_COLOURS = {
    "passed": "#2da44e",
    "warned": "#d4a72c",
    "overridden": "#8250df",
    "quarantined": "#e16f24",
    "halted": "#cf222e",
}
_LINE = "#0969da"


# ------------------------------------------------------------------------------------------------ numbers
def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 x 10^k (as a fraction, at most 1) that is >= value, so the axis reads well."""
    if value <= 0:
        return 0.01
    for ceiling in (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0):
        if value <= ceiling:
            return ceiling
    return 1.0


def percent(fraction: float) -> str:
    pct = 100 * fraction
    return f"{pct:.0f}%" if pct >= 10 or pct == 0 else f"{pct:.2g}%"


def number(value: float) -> str:
    """3.1k, 12.5M, 0.25."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


# ------------------------------------------------------------------------------------------------ trend
def trend_bars(panels: Sequence[tuple[str, Callable[[BatchTrend], float], Callable[[BatchTrend], str]]],
               points: Sequence[BatchTrend]) -> str:  # fmt: skip
    """One SVG with a bar panel per (title, rate, counts text): a bar per micro-batch, coloured by its worst action,
    on a 1-2-5 scale; each bar is a `<rect>` whose tooltip gives the rate, the counts and the worst action."""
    tips: dict[str, str] = {}
    with _rc():
        height = 1.9 * len(panels)
        fig = _figure(10.0, height, left=0.055, right=0.99, top=1 - 0.25 / height, bottom=0.2 / height, hspace=0.45)
        axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
        label_every = max(1, round(len(points) / 30))
        for n, (ax, (title, rate, text)) in enumerate(zip(axes, panels, strict=True)):
            scale = nice_ceiling(max((rate(p) for p in points), default=0.0))
            ax.set_title(title, loc="left", fontsize=9, fontweight="bold", color="#1f2328")
            for frac in (0.0, 0.5, 1.0):
                ax.axhline(frac * scale, color="#d0d7de", linewidth=0.8, zorder=0, clip_on=False)
            for i, p in enumerate(points):
                value = rate(p)
                gid = f"bar-{n}-{i}"
                ax.bar(i, max(value, scale / 130), width=0.7, color=BAR_COLOURS.get(p.worst, "#57606a"),
                       gid=gid, clip_on=False)  # fmt: skip
                worst = LABELS.get(p.worst, p.worst)
                tips[gid] = f"micro-batch {p.batch_id}: {percent(value)} ({text(p)}); worst: {worst}"
            ax.set_ylim(0, scale)
            ax.set_yticks([0, scale / 2, scale], [percent(f * scale) for f in (0.0, 0.5, 1.0)])
            shown = range(0, len(points), label_every)
            ax.set_xticks(list(shown), [str(points[i].batch_id) for i in shown])
            ax.set_xlim(-0.6, max(len(points), 8) - 0.4)
            for side in ("top", "right", "left"):
                ax.spines[side].set_visible(False)
        return _finish(fig, "trend", tips, bars=True)


# ------------------------------------------------------------------------------------------------ windows
def window_panels(
    prefix: str,
    starts: Sequence[dt.datetime],
    nodes: dict[str, list[float | None]],
    step: dt.timedelta,
    top: float,
) -> str:
    """A small SVG panel per node (`svg.panel`, labelled with the node's name): its values at the windows' starts, x
    by event time, every panel on one shared scale (`top`) so they compare at a glance; a line joins neighbouring
    windows only, so a stretch without records shows as a gap. Each point's tooltip gives the node, the window's
    start and the value."""
    span = (starts[-1] - starts[0]) or step
    panels = []
    with _rc():
        for k, (node, values) in enumerate(nodes.items()):
            fig = _figure(2.45, 1.2, left=0.17, right=0.95, top=0.8, bottom=0.2)
            ax = fig.add_subplot()
            points = [(i, v) for i, v in enumerate(values) if v is not None]
            runs: list[list[tuple[int, float]]] = []
            for i, v in points:
                if runs and starts[i] - starts[runs[-1][-1][0]] <= step:
                    runs[-1].append((i, v))
                else:
                    runs.append([(i, v)])
            for run in runs:
                if len(run) > 1:
                    ax.plot([starts[i] for i, _ in run], [v for _, v in run], color=_LINE, linewidth=1.0)
            ax.scatter([starts[i] for i, _ in points], [v for _, v in points], s=5, color=_LINE, gid="points",
                       clip_on=False, zorder=3)  # fmt: skip
            tips = {"points": [f"{node} {starts[i]:%Y-%m-%d %H:%M}: {number(v)}" for i, v in points]}
            ax.set_title(node, loc="left", fontsize=8.5, fontweight="bold", color="#1f2328", pad=3)
            ax.set_title(f"total {number(sum(v for _, v in points))}", loc="right", fontsize=7.5, pad=3)
            pad = span * 0.03
            ax.set_xlim(starts[0] - pad, starts[0] + span + pad)
            ax.set_ylim(0, top * 1.05 if top else 1)
            ax.set_xticks([starts[0], starts[-1]], [f"{starts[0]:%Y-%m-%d}", f"{starts[-1]:%Y-%m-%d}"], fontsize=7)
            first, last = ax.get_xticklabels()
            first.set_horizontalalignment("left")  # the dates stay inside their panel
            last.set_horizontalalignment("right")
            ax.set_yticks([0, top] if top else [0], ["0", number(top)] if top else ["0"], fontsize=7)
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
            panels.append(_finish(fig, f"{prefix}-{k}", tips, css_class="panel", label=node))
    return "".join(panels)


# ------------------------------------------------------------------------------------------------ svg
def _rc():
    """matplotlib's settings for these charts (imported here: a page without a chart, or the Airflow plugin that
    only serves the pages, never loads matplotlib and its font cache)."""
    import matplotlib

    return matplotlib.rc_context(_RC)


def _figure(width: float, height: float, **margins: float) -> Figure:
    """A figure on an Agg canvas with fixed margins (fractions of its size; no constrained layout: it measures every
    text of every panel again, which costs seconds for the window panels)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=_DPI)
    fig.subplots_adjust(**margins)
    FigureCanvasAgg(fig)
    return fig


def _finish(
    fig: Figure,
    prefix: str,
    tips: dict[str, str | list[str]],
    *,
    bars: bool = False,
    css_class: str = "chart",
    label: str | None = None,
) -> str:
    """The figure as one `<svg>` element for an HTML page: ids prefixed, no metadata or global style, a `<title>` in
    each artist group named in `tips` (one per drawn element for a list), bars as `<rect>`s when `bars`; the element
    has the class `css_class` and, with `label`, that accessible name."""
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
    root = ET.fromstring(out.getvalue())
    for parent in list(root.iter()):
        for child in list(parent):
            if child.tag in (f"{{{SVG}}}metadata", f"{{{SVG}}}style"):
                parent.remove(child)
    for defs in root.findall(f"{{{SVG}}}defs"):
        if not len(defs):
            root.remove(defs)
    groups = {e.get("id"): e for e in root.iter() if e.get("id") in tips}
    for gid, tip in tips.items():
        group = groups.get(gid)
        if group is None:
            continue
        if isinstance(tip, str):
            if bars:
                _as_rect(group)
            _titled(group, tip)
        else:
            for element, text in zip(_drawn(group), tip, strict=False):
                _titled(element, text)
    _prefix_ids(root, prefix)
    root.set("role", "img")
    root.set("class", css_class)
    if label is not None:
        root.set("aria-label", label)
    return ET.tostring(root, encoding="unicode")


def _titled(element: ET.Element, text: str) -> None:
    title = ET.Element(f"{{{SVG}}}title")
    title.text = text
    element.insert(0, title)


def _drawn(group: ET.Element) -> list[ET.Element]:
    """The marks a collection drew, in order (`<use>` of a shared marker, or a `<path>` each), outside `<defs>`."""
    out: list[ET.Element] = []

    def walk(e: ET.Element) -> None:
        for child in e:
            if child.tag == f"{{{SVG}}}defs":
                continue
            if child.tag in (f"{{{SVG}}}use", f"{{{SVG}}}path"):
                out.append(child)
            else:
                walk(child)

    walk(group)
    # each mark in a group of its own, which holds its title
    parents = {child: parent for parent in group.iter() for child in parent}
    wrapped = []
    for mark in out:
        parent = parents[mark]
        g = ET.Element(f"{{{SVG}}}g")
        parent.insert(list(parent).index(mark), g)
        parent.remove(mark)
        g.append(mark)
        wrapped.append(g)
    return wrapped


def _as_rect(group: ET.Element) -> None:
    """A bar's rectangle path (`M x y L ... z`) as the `<rect>` it is."""
    path = group.find(f"{{{SVG}}}path")
    if path is None:
        return
    values = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", path.get("d", ""))]
    xs, ys = values[0::2], values[1::2]
    rect = ET.Element(f"{{{SVG}}}rect", {k: v for k, v in path.attrib.items() if k != "d"})
    rect.set("x", f"{min(xs):g}")
    rect.set("y", f"{min(ys):g}")
    rect.set("width", f"{max(xs) - min(xs):g}")
    rect.set("height", f"{max(ys) - min(ys):g}")
    group.insert(list(group).index(path), rect)
    group.remove(path)


_REF = re.compile(r"url\(#([^)]+)\)")


def _prefix_ids(root: ET.Element, prefix: str) -> None:
    """`id` -> `prefix-id`, and every reference to it (`url(#id)`, `xlink:href="#id"`)."""
    ids = {e.get("id") for e in root.iter() if e.get("id")}
    href = f"{{{XLINK}}}href"
    for e in root.iter():
        if e.get("id"):
            e.set("id", f"{prefix}-{e.get('id')}")
        for name, value in e.attrib.items():
            if "url(#" in value:
                e.set(name, _REF.sub(lambda m: f"url(#{prefix}-{m[1]})" if m[1] in ids else m[0], value))
        ref = e.get(href)
        if ref and ref.startswith("#") and ref[1:] in ids:
            e.set(href, f"#{prefix}-{ref[1:]}")
