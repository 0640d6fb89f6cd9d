"""The live windows, declared once: what the stream aggregates, over which windows, rolled up to which levels.

Two sources of records, each on its own **event time**:
- `trades`: every completed trade (a DimTrade row with status Completed) at its completion time (the close date
  and time), measuring count, quantity, value (quantity x trade price), commission and fee; cut into slices of
  one hour;
- `market`: every FactMarketHistory row (one DailyMarket record per security and day) on its market date,
  measuring volume (summed) and the day's high and low (the highest and the lowest); cut into slices of one day.

Records roll up along **hierarchies** taken from the SCD2 dimensions at the record's event time: security ->
company -> industry -> sector (DimSecurity by symbol, DimCompany by CIK, Industry), and account -> customer,
account -> broker (DimAccount by account id). A record goes to the parent of the version valid on its event day,
so a company that moves to another industry, or an account to another broker, sends the records from that
version's effective date on to the new parent (a record whose key has no version that day falls back to the
versions its row names).

**Windows** (`WINDOWS`): tumbling (`size`), sliding (`size` every `slide`) and session (a gap of `size` with no
record of the key closes it), all over the same slices of their source: a window is combined from the slices
it covers (`jobs.slicing`). Tumbling and sliding windows are aligned to 1970-01-05, a Monday, so that weeks start
on Mondays and days at midnight. Only windows that hold a record are written.

**Stored or answered when queried** (`Window.stored`): a stored window's rows are kept in `trade_windows` or
`market_windows` and refreshed every micro-batch its records touch, so they cost the stream rows written per
window. A window declared `stored=False` costs the stream nothing of its own: the step keeps the **slices** of its
levels (`trade_window_slices`, `market_window_slices`: per level, node and slice the partial aggregate) and the
latest event time per source (`window_latest`), and PostgreSQL answers the window when it is queried, combining the
slices each window covers (the views `dw.trade_window_answers` and `dw.market_window_answers`, same columns as the
stored tables). Many concurrent windows over the same levels then share one set of slices; only tumbling and
sliding windows can be answered this way (a session is a chain of records, stored).

**Retention** (`Window.keep`, 92 days unless declared): live windows answer what is happening now, so a window's
rows are kept while they end less than `keep` before the latest event time of the source's records (a week of
hourly windows, a year of weekly ones); older rows are deleted as the data moves on. Like the watermark, this is a
property of the data: any split into micro-batches ends with the same rows.

**Watermark and grace** (`GRACE`), per source and TPC-DI batch, so that they are a property of the data and not
of how it was cut into micro-batches: the watermark of TPC-DI batch b is the latest event time of the source's
records of the batches before b; a record of batch b whose event time is earlier than that watermark minus the
grace is **late**. A late record counts in no window; it is reported as a DImessages Alert ("Late record past
grace", source `TradeWindows` or `MarketWindows`) and counted in the quality report, never silently dropped.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from schemas.model import Column as C
from schemas.model import Table

TUMBLING = "tumbling"
SLIDING = "sliding"
SESSION = "session"
KINDS = (TUMBLING, SLIDING, SESSION)

TRADES = "trades"
MARKET = "market"

# hierarchy levels: the leaf of each hierarchy first
SECURITY, COMPANY, INDUSTRY, SECTOR = "security", "company", "industry", "sector"
ACCOUNT, CUSTOMER, BROKER = "account", "customer", "broker"
LEVELS: dict[str, tuple[str, ...]] = {
    TRADES: (SECURITY, COMPANY, INDUSTRY, SECTOR, ACCOUNT, CUSTOMER, BROKER),
    MARKET: (SECURITY, COMPANY, INDUSTRY, SECTOR),
}

# measure -> how slices and windows combine it, per source (`trades`: money in cents while combined)
MEASURES: dict[str, dict[str, str]] = {
    TRADES: {"trades": "sum", "quantity": "sum", "value": "sum", "commission": "sum", "fee": "sum"},
    MARKET: {"days": "sum", "volume": "sum", "high": "max", "low": "min"},
}
SLICE: dict[str, dt.timedelta] = {TRADES: dt.timedelta(hours=1), MARKET: dt.timedelta(days=1)}
GRACE: dict[str, dt.timedelta] = {TRADES: dt.timedelta(days=1), MARKET: dt.timedelta(days=7)}
ALIGN = dt.datetime(1970, 1, 5, tzinfo=dt.UTC)  # a Monday: weeks start on Mondays


@dataclass(frozen=True)
class Window:
    """One declared window: `size` (a session's gap) and, when sliding, `slide`, both whole slices of its source;
    its rows are kept while they end less than `keep` before the source's latest record (`RETENTION`)."""

    name: str
    source: str
    kind: str
    size: dt.timedelta
    levels: tuple[str, ...]
    slide: dt.timedelta | None = None
    keep: dt.timedelta = dt.timedelta(days=92)
    doc: str = ""
    stored: bool = True

    def __post_init__(self) -> None:
        if self.source not in SLICE:
            raise ValueError(f"window {self.name}: unknown source {self.source!r}; expected one of {list(SLICE)}")
        if self.kind not in KINDS:
            raise ValueError(f"window {self.name}: unknown kind {self.kind!r}; expected one of {KINDS}")
        unit = SLICE[self.source]
        if self.size <= dt.timedelta(0) or self.size % unit:
            raise ValueError(f"window {self.name}: size {self.size} is not a positive multiple of the slice {unit}")
        if (self.kind == SLIDING) != (self.slide is not None):
            raise ValueError(f"window {self.name}: a slide is declared for sliding windows, and only for them")
        if self.slide is not None and (self.slide <= dt.timedelta(0) or self.slide % unit):
            raise ValueError(f"window {self.name}: slide {self.slide} is not a positive multiple of the slice {unit}")
        if self.keep < self.size:
            raise ValueError(f"window {self.name}: keep {self.keep} is shorter than the window")
        if not self.stored and self.kind == SESSION:
            raise ValueError(
                f"window {self.name}: a session window is stored (stored=False is for tumbling and sliding)"
            )
        unknown = set(self.levels) - set(LEVELS[self.source])
        if not self.levels or unknown:
            raise ValueError(f"window {self.name}: levels {sorted(unknown)} are not levels of {self.source}")

    @property
    def size_slices(self) -> int:
        return self.size // SLICE[self.source]

    @property
    def slide_slices(self) -> int:
        """Slices between the starts of consecutive windows (a tumbling window slides by its size)."""
        return (self.slide or self.size) // SLICE[self.source]


WINDOWS: tuple[Window, ...] = (
    Window(
        "trades_hour",
        TRADES,
        TUMBLING,
        dt.timedelta(hours=1),
        (SECTOR,),
        keep=dt.timedelta(days=7),
        doc="trade volume per sector per hour",
    ),
    Window(
        "trades_day",
        TRADES,
        TUMBLING,
        dt.timedelta(days=1),
        (COMPANY, INDUSTRY, SECTOR),
        doc="value traded per company, industry and sector per day",
    ),
    Window(
        "trades_week",
        TRADES,
        TUMBLING,
        dt.timedelta(days=7),
        (CUSTOMER, BROKER),
        keep=dt.timedelta(days=364),
        doc="commissions per broker and trading per customer per week (Monday to Sunday)",
    ),
    Window(
        "trades_7d_daily",
        TRADES,
        SLIDING,
        dt.timedelta(days=7),
        (SECTOR,),
        slide=dt.timedelta(days=1),
        doc="the last 7 days per sector, every day",
    ),
    Window(
        "trades_24h_hourly",
        TRADES,
        SLIDING,
        dt.timedelta(hours=24),
        (INDUSTRY, SECTOR),
        slide=dt.timedelta(hours=1),
        keep=dt.timedelta(days=7),
        stored=False,
        doc="the last 24 hours per industry and sector, every hour (answered when queried, from the slices)",
    ),
    Window(
        "account_sessions",
        TRADES,
        SESSION,
        dt.timedelta(hours=1),
        (ACCOUNT,),
        doc="an account's trading sessions: trades less than an hour apart",
    ),
    Window(
        "market_week",
        MARKET,
        TUMBLING,
        dt.timedelta(days=7),
        (INDUSTRY, SECTOR),
        keep=dt.timedelta(days=364),
        doc="market volume, high and low per industry and sector per week",
    ),
)


def windows_of(source: str, windows: tuple[Window, ...] = WINDOWS) -> tuple[Window, ...]:
    return tuple(w for w in windows if w.source == source)


def stored_of(source: str, windows: tuple[Window, ...] | None = None) -> tuple[Window, ...]:
    """The windows of `source` whose rows are stored (`Window.stored`)."""
    return tuple(w for w in (windows_of(source) if windows is None else windows) if w.stored)


def slice_keep(source: str, windows: tuple[Window, ...] | None = None) -> dict[str, dt.timedelta]:
    """Per level of `source` that a window answered when queried uses: how long before the source's latest record
    its slices are kept (the longest `keep + size` of those windows, so that every window they answer is whole)."""
    out: dict[str, dt.timedelta] = {}
    for w in windows_of(source) if windows is None else windows:
        if w.source == source and not w.stored:
            for level in w.levels:
                out[level] = max(out.get(level, dt.timedelta(0)), w.keep + w.size)
    return out


def check_windows(windows: tuple[Window, ...]) -> None:
    names = [w.name for w in windows]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate window names in {names}")
    for w in windows:
        if w.kind == SESSION and w.size < SLICE[w.source]:
            raise ValueError(f"window {w.name}: a session gap is at least one slice")


check_windows(WINDOWS)

_KEY = (
    C("window_name", "string", False, "the declared window (schemas.windows.WINDOWS)"),
    C("level", "string", False, "hierarchy level: security, company, industry, sector, account, customer, broker"),
    C(
        "node",
        "string",
        False,
        "the level's natural key: symbol, CIK, industry id, sector id, account/customer/broker id",
    ),
    C("window_start", "timestamp", False, "first instant of the window (a session: its first record)"),
    C("window_end", "timestamp", False, "first instant after the window (a session: its last record + the gap)"),
)

TRADE_WINDOWS = Table(
    name="trade_windows",
    layer="warehouse",
    columns=(
        *_KEY,
        C("trades", "bigint", False, "completed trades"),
        C("quantity", "bigint", False, "shares traded"),
        C("value", "decimal(18,2)", False, "sum of quantity x trade price"),
        C("commission", "decimal(18,2)", False),
        C("fee", "decimal(18,2)", False),
    ),
    key=("window_name", "level", "node", "window_start"),
    order_by=("window_name", "window_start", "level", "node"),
    pg_indexes=(("window_name", "level", "window_start"),),
    file_bytes=2 * 1024 * 1024,  # new windows come at the end of the start order: a MERGE rewrites the last files
    resident=True,  # step AG reads one version of it once per declared window
    doc="Live windows over completed trades (schemas.windows), rolled up along the security and account hierarchies.",
)

MARKET_WINDOWS = Table(
    name="market_windows",
    layer="warehouse",
    columns=(
        *_KEY,
        C("days", "bigint", False, "DailyMarket records"),
        C("volume", "bigint", False, "sum of DM_VOL"),
        C("high", "decimal(8,2)", False, "highest DM_HIGH"),
        C("low", "decimal(8,2)", False, "lowest DM_LOW"),
    ),
    key=("window_name", "level", "node", "window_start"),
    order_by=("window_name", "window_start", "level", "node"),
    pg_indexes=(("window_name", "level", "window_start"),),
    file_bytes=2 * 1024 * 1024,
    doc="Live windows over daily market data (schemas.windows), rolled up along the security hierarchy.",
)

# Per source and TPC-DI batch, the latest event time of its records: the watermarks that judge lateness.
WINDOW_WATERMARKS = Table(
    name="window_watermarks",
    layer="staging",
    columns=(
        C("source", "string", False, "trades or market"),
        C("source_batch", "int", False, "TPC-DI batch"),
        C("latest", "timestamp", False, "latest event time of the batch's records"),
    ),
    key=("source", "source_batch"),
    order_by=("source", "source_batch"),
    doc="Latest event time per source and TPC-DI batch: the watermarks of the live windows.",
)

WINDOW_TABLES: dict[str, Table] = {TRADES: TRADE_WINDOWS, MARKET: MARKET_WINDOWS}

_SLICE_KEY = (
    C("level", "string", False, "hierarchy level, as in the window tables"),
    C("node", "string", False, "the level's natural key, as in the window tables"),
    C("slice_start", "timestamp", False, "first instant of the slice (an hour of trades, a day of market data)"),
)


def _slices(source: str, stored: Table) -> Table:
    return Table(
        name=f"{source.removesuffix('s')}_window_slices",
        layer="warehouse",
        columns=(*_SLICE_KEY, *stored.columns[len(_KEY) :]),
        key=("level", "node", "slice_start"),
        order_by=("slice_start", "level", "node"),
        doc=(
            f"Per level, node and slice, the partial aggregate of the on-time {source} records: what the windows "
            "declared stored=False are answered from when queried (schemas.windows)."
        ),
    )


TRADE_WINDOW_SLICES = _slices(TRADES, TRADE_WINDOWS)
MARKET_WINDOW_SLICES = _slices(MARKET, MARKET_WINDOWS)
SLICE_TABLES: dict[str, Table] = {TRADES: TRADE_WINDOW_SLICES, MARKET: MARKET_WINDOW_SLICES}

WINDOW_LATEST = Table(
    name="window_latest",
    layer="warehouse",
    columns=(
        C("source", "string", False, "trades or market"),
        C("latest", "timestamp", False, "latest event time of the source's records, late ones included"),
    ),
    key=("source",),
    order_by=("source",),
    doc=(
        "The latest event time per source with windows answered when queried: a window ending `keep` or more before "
        "it is not answered (schemas.windows)."
    ),
)
