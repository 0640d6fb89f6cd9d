"""The records of the live windows (step AG, `jobs.windows`): completed trades (DimTrade) and daily market rows
(FactMarketHistory), as the warehouse holds them after T3 and T4.

Per source (`SOURCES`): what a micro-batch changed (`changes`, from the table's change feed, as `Changes`), the
event times and batches of the records of a span (`stamps`, to judge lateness), the latest event time of a TPC-DI
batch (`latest_of`), and the records of a span routed along the hierarchies (`read`, as
`jobs.windows_slices.Records`, routed by `jobs.windows_routing`). The step (`jobs.windows`) drives them; reads
only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import arrow_ops as ao
from jobs.scope import BatchScope
from jobs.windows_routing import lookup, route_accounts, route_securities
from jobs.windows_slices import US_PER_DAY, Records
from schemas import warehouse as wh
from schemas import windows as ws
from streamdi.context import JobContext


def date_id_days(ids: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of DimDate ids (yyyymmdd), computed once per distinct id (a few thousand days; a
    first load's records are tens of millions)."""
    encoded = pc.dictionary_encode(pa.array(np.asarray(ids)))
    distinct = np.asarray(encoded.dictionary, np.int64)
    months = (distinct // 10000 - 1970) * 12 + (distinct // 100 % 100 - 1)
    days = months.astype("datetime64[M]").astype("datetime64[D]").astype(np.int64) + distinct % 100 - 1
    return days[np.asarray(encoded.indices)]


def time_id_us(ids: np.ndarray) -> np.ndarray:
    """Microseconds since midnight of DimTime ids (hhmmss)."""
    ids = np.asarray(ids, np.int64)
    return ((ids // 10000) * 3600 + (ids // 100 % 100) * 60 + ids % 100) * 1_000_000


@dataclass(frozen=True)
class Changes:
    """The records a micro-batch changed (before and after images that differ), as event times and batches; their
    message keys are made only when asked for (most micro-batches raise and clear no Alert)."""

    ts: np.ndarray  # event time of each changed record that counts (completed trades, market rows)
    batch: np.ndarray  # its TPC-DI batch
    after: np.ndarray  # True for an after image (the record now), False for a before image
    batches: np.ndarray  # TPC-DI batches of every changed record
    # every changed record (counting or not): the columns of its message key only; or how to read them again (a
    # first load's market feed: SF 100's 42 M symbols, which only a late record's Alert would need)
    rows: pa.Table | Callable[[], pa.Table]
    counting: np.ndarray  # which of `rows` count (ts, batch and after are theirs, in order)
    key_of: Callable[[pa.Table], pa.Array]  # message keys of rows

    @property
    def ident(self) -> pa.Array:
        """Message keys of every changed record."""
        return self.key_of(self._rows())

    def counted(self, which: np.ndarray) -> pa.Array:
        """Message keys of the counting records selected by `which` (parallel to ts); only those rows are copied."""
        chosen = np.zeros(len(self.counting), dtype=bool)
        chosen[np.flatnonzero(self.counting)] = which
        if not chosen.any():  # (the usual case: no late record; keys read again only for those asked)
            return _no_keys(pa.table({}))
        return self.key_of(self._rows().filter(pa.array(chosen)))

    def _rows(self) -> pa.Table:
        return self.rows if isinstance(self.rows, pa.Table) else self.rows()

    @classmethod
    def none(cls) -> Changes:
        nothing = np.array([], np.int64)
        return cls(nothing, nothing, np.array([], bool), nothing, pa.table({}), np.array([], bool), _no_keys)


@dataclass(frozen=True)
class Stamps:
    """The records of a span whose lateness is judged: event time and TPC-DI batch of each, and the columns of their
    message keys, made into keys only when asked (`keys`: a first load judges every record, SF 100's 42 M market rows,
    and raises an Alert for few or none)."""

    ts: np.ndarray
    batch: np.ndarray
    rows: pa.Table
    key_of: Callable[[pa.Table], pa.Array]

    def keys(self, which: np.ndarray | None = None) -> pa.Array:
        """Message keys of the records (those selected by `which`, parallel to ts, when given)."""
        return self.key_of(self.rows if which is None else self.rows.filter(pa.array(which)))


def _no_keys(rows: pa.Table) -> pa.Array:
    return pa.array([], pa.large_string())


def _net_changes(feed: pa.Table | None, columns: list[str]) -> pa.Table | None:
    """The rows of a change feed that are not cancelled by an equal row of the other side, with `_after` (a feed of
    inserts only, the usual case, is taken as it is)."""
    if feed is None or feed.num_rows == 0:
        return None
    after = pc.is_in(feed["_change_type"], value_set=pa.array(["insert", "update_postimage"]))
    if pc.all(after).as_py():
        return feed.select(columns).append_column("_after", after)
    signed = feed.select(columns).append_column("_sign", pc.if_else(after, 1, -1).cast(pa.int64()))
    net = signed.group_by(columns, use_threads=False).aggregate([("_sign", "sum")])
    net = net.filter(pc.not_equal(net["_sign_sum"], 0))
    if net.num_rows == 0:
        return None
    return net.append_column("_after", pc.greater(net["_sign_sum"], 0))


class TradeSource:
    """Completed trades (DimTrade) at their completion time."""

    name = ws.TRADES
    table = wh.DIM_TRADE
    _FEED = ["tradeid", "status", "sk_closedateid", "sk_closetimeid", "batchid", "quantity", "tradeprice"]
    _FEED += ["fee", "commission", "sk_securityid", "sk_accountid"]

    _KEYS = ["tradeid", "status", "sk_closedateid", "sk_closetimeid", "batchid"]  # an insert-only feed's columns

    def changes(self, ctx: JobContext, scope: BatchScope) -> Changes | None:
        # the measures only where updates are netted (a first load's feed is the whole table: SF 100's 12.7 M trades)
        feed = self._KEYS if scope.inserted_only(ctx, self.table) else self._FEED
        net = _net_changes(scope.changed(ctx, self.table, [*feed, "_change_type"]), feed)
        if net is None:
            return None
        counts = np.asarray(pc.equal(net["status"], "Completed").fill_null(False), dtype=bool)
        done = net.filter(pa.array(counts))
        return Changes(
            ts=self._ts(done),
            batch=ao.column(done, "batchid").to_numpy(zero_copy_only=False).astype(np.int64),
            after=np.asarray(done["_after"], dtype=bool),
            batches=ao.column(net, "batchid").to_numpy(zero_copy_only=False).astype(np.int64),
            rows=net.select(["tradeid"]),
            counting=counts,
            key_of=self._ident,
        )

    @staticmethod
    def _ts(rows: pa.Table) -> np.ndarray:
        day = date_id_days(ao.column(rows, "sk_closedateid").to_numpy(zero_copy_only=False))
        return day * US_PER_DAY + time_id_us(ao.column(rows, "sk_closetimeid").to_numpy(zero_copy_only=False))

    @staticmethod
    def _ident(rows: pa.Table) -> pa.Array:
        return _joined("T_ID=", rows["tradeid"])

    def _completed(self, ctx: JobContext, cond: pc.Expression, columns: list[str]) -> pa.Table:
        """The completed trades where `cond` holds. The scan gets `cond` alone: a condition on a string column
        cannot be pushed into a scan of MERGE-written files (`Lake._scan` then reads the whole table), and the
        status is filtered after it (DimTrade at SF 6: ~120 ms -> ~10 ms per read)."""
        wanted = list(dict.fromkeys([*columns, "status"]))
        rows = ctx.lake.read_if_exists(self.table, wanted, cond)
        return rows.filter(pc.equal(rows["status"], "Completed")).select(columns)

    def stamps(self, ctx: JobContext, span: tuple[int, int]) -> Stamps:
        """The records in `span`, without routing them."""
        rows = self._completed(ctx, _date_range("sk_closedateid", span), _STAMP_COLUMNS)
        ts = self._ts(rows)
        keep = (ts >= span[0]) & (ts < span[1])
        rows = rows.filter(pa.array(keep))
        batch = ao.column(rows, "batchid").to_numpy(zero_copy_only=False).astype(np.int64)
        return Stamps(ts[keep], batch, rows.select(["tradeid"]), self._ident)

    def latest_of(self, ctx: JobContext, batch: int) -> int | None:
        rows = self._completed(ctx, pc.field("batchid") == batch, ["sk_closedateid", "sk_closetimeid"])
        return int(self._ts(rows).max()) if rows.num_rows else None

    _RECORD = [*_FEED, "sk_companyid", "sk_customerid", "sk_brokerid"]

    def read(self, ctx: JobContext, span: tuple[int, int]) -> Records:
        """The completed trades of `span` in trade order, routed."""
        rows = self._completed(ctx, _date_range("sk_closedateid", span), self._RECORD)
        return self._records(ctx, rows.take(pc.sort_indices(rows["tradeid"])), span)

    def read_pieces(self, ctx: JobContext, span: tuple[int, int], rows: int) -> Iterator[Records]:
        """`read` a piece of about `rows` trades at a time, in no particular order."""
        wanted = list(dict.fromkeys([*self._RECORD, "status"]))
        for piece in ctx.lake.read_in_pieces(self.table, wanted, _date_range("sk_closedateid", span), rows):
            yield self._records(ctx, piece.filter(pc.equal(piece["status"], "Completed")).select(self._RECORD), span)

    def _records(self, ctx: JobContext, rows: pa.Table, span: tuple[int, int]) -> Records:
        """The completed trades `rows` within `span`, routed along the hierarchies."""
        ts = self._ts(rows)
        keep = (ts >= span[0]) & (ts < span[1])
        if not keep.all():
            rows, ts = rows.filter(pa.array(keep)), ts[keep]
        day = np.floor_divide(ts, US_PER_DAY)
        symbol = lookup(ctx, wh.DIM_SECURITY, "sk_securityid", rows["sk_securityid"], "symbol")
        nodes = route_securities(ctx, symbol, day, rows["sk_companyid"])
        account = lookup(ctx, wh.DIM_ACCOUNT, "sk_accountid", rows["sk_accountid"], "accountid")
        nodes |= route_accounts(ctx, account, day, rows["sk_customerid"], rows["sk_brokerid"])
        quantity = ao.column(rows, "quantity").to_numpy(zero_copy_only=False).astype(np.int64)
        return Records(
            ts=ts,
            batch=ao.column(rows, "batchid").to_numpy(zero_copy_only=False).astype(np.int64),
            ident=None,
            nodes=nodes,
            measures={
                "trades": np.ones(rows.num_rows, np.int64),
                "quantity": quantity,
                "value": quantity * ao.cents(rows["tradeprice"]),
                "commission": ao.cents(rows["commission"]),
                "fee": ao.cents(rows["fee"]),
            },
        )


class MarketSource:
    """Daily market rows (FactMarketHistory) on their market date."""

    name = ws.MARKET
    table = wh.FACT_MARKET_HISTORY
    _FEED = ["symbol", "sk_dateid", "volume", "dayhigh", "daylow", "batchid"]

    def changes(self, ctx: JobContext, scope: BatchScope) -> Changes | None:
        # A feed of inserts only (a first load's: the whole table, SF 100's 42 M rows) is read for its days and
        # batches alone, and its symbols again only if a message key is asked for (a late record's Alert); the whole
        # feed only when updates or deletes are to be netted.
        key = ["symbol", "sk_dateid"]
        if scope.inserted_only(ctx, self.table):  # the feed's rows as they are: their symbols read again if asked
            stamps = ["sk_dateid", "batchid"]
            net = _net_changes(scope.changed(ctx, self.table, [*stamps, "_change_type"]), stamps)
            keys: pa.Table | Callable[[], pa.Table] = lambda: scope.changed(ctx, self.table, key)  # noqa: E731
        else:
            net = _net_changes(scope.changed(ctx, self.table, [*self._FEED, "_change_type"]), self._FEED)
            keys = net.select(key) if net is not None else None
        if net is None:
            return None
        batches = ao.column(net, "batchid").to_numpy(zero_copy_only=False).astype(np.int64)
        every = np.ones(net.num_rows, dtype=bool)
        return Changes(self._ts(net), batches, np.asarray(net["_after"], dtype=bool), batches, keys, every, self._ident)

    @staticmethod
    def _ts(rows: pa.Table) -> np.ndarray:
        return date_id_days(ao.column(rows, "sk_dateid").to_numpy(zero_copy_only=False)) * US_PER_DAY

    @staticmethod
    def _ident(rows: pa.Table) -> pa.Array:
        return _joined("SYMB=", rows["symbol"], ":DATE=", rows["sk_dateid"])

    def stamps(self, ctx: JobContext, span: tuple[int, int]) -> Stamps:
        """The records in `span`."""
        rows = ctx.lake.read_if_exists(self.table, ["symbol", "sk_dateid", "batchid"], _date_range("sk_dateid", span))
        batch = ao.column(rows, "batchid").to_numpy(zero_copy_only=False).astype(np.int64)
        return Stamps(self._ts(rows), batch, rows.select(["symbol", "sk_dateid"]), self._ident)

    def latest_of(self, ctx: JobContext, batch: int) -> int | None:
        if not ctx.lake.exists(self.table):
            return None
        rows = ctx.lake.read_where(self.table, pc.field("batchid") == batch, ["sk_dateid"])
        return int(self._ts(rows).max()) if rows.num_rows else None

    _RECORD = [*_FEED, "sk_companyid"]

    def read(self, ctx: JobContext, span: tuple[int, int]) -> Records:
        """The market rows of `span` by symbol and day, routed."""
        rows = ctx.lake.read_if_exists(self.table, self._RECORD, _date_range("sk_dateid", span))
        return self._records(ctx, ao.sort(rows, ["symbol", "sk_dateid"]))

    def read_pieces(self, ctx: JobContext, span: tuple[int, int], rows: int) -> Iterator[Records]:
        """`read` a piece of about `rows` market rows at a time, in no particular order."""
        for piece in ctx.lake.read_in_pieces(self.table, self._RECORD, _date_range("sk_dateid", span), rows):
            yield self._records(ctx, piece)

    def _records(self, ctx: JobContext, rows: pa.Table) -> Records:
        """Market rows, routed along the hierarchies (whole days: every row of the span's days is in it)."""
        ts = self._ts(rows)
        return Records(
            ts=ts,
            batch=ao.column(rows, "batchid").to_numpy(zero_copy_only=False).astype(np.int64),
            ident=None,
            nodes=route_securities(ctx, rows["symbol"], np.floor_divide(ts, US_PER_DAY), rows["sk_companyid"]),
            measures={
                "days": np.ones(rows.num_rows, np.int64),
                "volume": ao.column(rows, "volume").to_numpy(zero_copy_only=False).astype(np.int64),
                "high": ao.cents(rows["dayhigh"]),
                "low": ao.cents(rows["daylow"]),
            },
        )


SOURCES = {ws.TRADES: TradeSource(), ws.MARKET: MarketSource()}
_STAMP_COLUMNS = ["tradeid", "sk_closedateid", "sk_closetimeid", "batchid"]


def _date_range(column: str, span: tuple[int, int]) -> pc.Expression:
    """`column` (a DimDate id) within the days of the span [lo, hi) of µs."""
    first, last = (int(ao.date_ids(np.array([t // US_PER_DAY]))[0]) for t in (span[0], span[1] - 1))
    return (pc.field(column) >= first) & (pc.field(column) <= last)


def _joined(*parts: str | pa.ChunkedArray) -> pa.Array:
    """Text columns and literals joined element-wise (message keys such as `T_ID=5`)."""
    values = [
        pa.scalar(p, pa.large_string())
        if isinstance(p, str)
        else ao.column(pa.table({"p": p}), "p").cast(pa.large_string())
        for p in parts
    ]
    lengths = [len(v) for v in values if isinstance(v, pa.Array)]
    if lengths and lengths[0] == 0:
        return pa.array([], pa.large_string())
    return pc.binary_join_element_wise(*values, pa.scalar("", pa.large_string()))
