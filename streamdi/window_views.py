"""The windows answered when queried (`schemas.windows`, `stored=False`): one PostgreSQL view per source,
`dw.trade_window_answers` and `dw.market_window_answers`, with the columns of `trade_windows` and
`market_windows`.

Each view combines, per declared window and level, the slices in `dw.<source>_window_slices` that every window
covers: slice `s` (its start, in slices since `schemas.windows.ALIGN`) lies in windows `k` with
`k * slide <= s < k * slide + size`, so each slice row is spread over those windows and summed (the highest and
lowest for the market's high and low). A window is answered while it ends after the source's latest record
(`dw.window_latest`) minus the window's `keep`, the same rule as the stored windows; the step keeps the slices of
a level for the longest `keep + size` of its windows, so every window answered is whole.

Views cost nothing until queried: a filter on `window_name` drops the other windows' branches at plan time.
`Warehouse.ensure_objects` creates them (`CREATE OR REPLACE`) after the tables they read.
"""

from __future__ import annotations

from psycopg import sql

from schemas import windows as ws
from schemas.model import Table
from streamdi.warehouse_ddl import pg_name, pg_schema, pg_type

VIEW_NAMES: dict[str, str] = {ws.TRADES: "trade_window_answers", ws.MARKET: "market_window_answers"}


def _qualified(table: Table) -> sql.Composable:
    return sql.SQL("{}.{}").format(sql.SQL(pg_schema(table)), sql.Identifier(pg_name(table)))


def _seconds(value) -> sql.Composable:
    return sql.Literal(int(value.total_seconds()))


def _window_select(window: ws.Window, stored: Table, slices: Table) -> sql.Composable:
    align = sql.SQL("TIMESTAMP {}").format(sql.Literal(ws.ALIGN.strftime("%Y-%m-%d %H:%M:%S")))
    size, slide = _seconds(window.size), _seconds(window.slide or window.size)
    offset = sql.SQL("extract(epoch FROM s.slice_start - {})").format(align)
    start = sql.SQL("{} + k * make_interval(secs => {})").format(align, slide)
    measures = [
        sql.SQL("{}(s.{})::{} AS {}").format(
            sql.SQL(ws.MEASURES[window.source][c.name]),  # sum, max, min: SQL's aggregates of the same names
            sql.Identifier(c.name),
            sql.SQL(pg_type(c.type)),
            sql.Identifier(c.name),
        )
        for c in stored.columns[5:]
    ]
    return sql.SQL(
        "SELECT {name}::text AS window_name, s.level, s.node,\n"
        "       {start} AS window_start, {start} + make_interval(secs => {size}) AS window_end,\n"
        "       {measures}\n"
        "FROM {slices} s\n"
        "CROSS JOIN LATERAL generate_series(floor(({offset} - {size}) / {slide})::bigint + 1,\n"
        "                                   floor({offset} / {slide})::bigint) AS k\n"
        "WHERE s.level IN ({levels})\n"
        "GROUP BY s.level, s.node, k\n"
        "HAVING {start} + make_interval(secs => {size}) >\n"
        "       (SELECT l.latest FROM {latest} l WHERE l.source = {source}) - make_interval(secs => {keep})"
    ).format(
        name=sql.Literal(window.name),
        start=start,
        size=size,
        slide=slide,
        offset=offset,
        measures=sql.SQL(",\n       ").join(measures),
        slices=_qualified(slices),
        levels=sql.SQL(", ").join(sql.Literal(level) for level in window.levels),
        latest=_qualified(ws.WINDOW_LATEST),
        source=sql.Literal(window.source),
        keep=_seconds(window.keep),
    )


def view_sql(source: str, windows: tuple[ws.Window, ...] | None = None) -> sql.Composed:
    """`CREATE OR REPLACE VIEW` of `source`'s windows answered when queried (none declared: a view with no rows and
    the same columns)."""
    stored, slices = ws.WINDOW_TABLES[source], ws.SLICE_TABLES[source]
    asked = [w for w in (ws.windows_of(source) if windows is None else windows) if not w.stored]
    if asked:
        body = sql.SQL("\nUNION ALL\n").join(_window_select(w, stored, slices) for w in asked)
    else:
        nothing = [
            sql.SQL("NULL::{} AS {}").format(sql.SQL(pg_type(c.type)), sql.Identifier(c.name)) for c in stored.columns
        ]
        body = sql.SQL("SELECT {} WHERE false").format(sql.SQL(", ").join(nothing))
    return sql.SQL("CREATE OR REPLACE VIEW {} AS\n{};").format(view_name(source), body)


def view_name(source: str) -> sql.Composed:
    """The qualified name of `source`'s view of answered windows."""
    return sql.SQL("{}.{}").format(sql.SQL(pg_schema(ws.WINDOW_TABLES[source])), sql.Identifier(VIEW_NAMES[source]))


def views_over(tables: list[Table]) -> list[tuple[sql.Composed, sql.Composed]]:
    """(name, statement) of the views whose tables are all among `tables` (the tables being ensured)."""
    names = {t.name for t in tables}
    return [
        (view_name(source), view_sql(source))
        for source in VIEW_NAMES
        if {ws.SLICE_TABLES[source].name, ws.WINDOW_LATEST.name} <= names
    ]
