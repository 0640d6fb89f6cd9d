"""Routing of the live windows' records along the SCD2 hierarchies (step AG, `jobs.windows`).

A record's nodes (security, company, industry, sector; account, customer, broker) are those of the dimension
versions valid on its day (`security_routes`, `account_routes`; `route_securities` and `route_accounts` read the
versions from the lake). A micro-batch that changes a hierarchy dimension re-routes the records of the days on
which a key's parent differs before and after it (`routing_changes`, `rerouted`); any Industry change re-routes
every day. Where it sits: the sources (`jobs.windows_sources`) route the records they read; the step
(`jobs.windows`) adds the re-routed spans (`rerouted_spans`) to what it recomputes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import arrow_ops as ao
from jobs.scope import BatchScope
from jobs.valid_at import take, valid_versions
from jobs.windows_slices import US_PER_DAY
from schemas import warehouse as wh
from schemas import windows as ws
from schemas.model import Table
from streamdi.context import JobContext


def routing_changes(before: list[tuple], after: list[tuple]) -> list[tuple[int, int]]:
    """The spans of days [start, end) on which a key's parent differs between two sets of its versions, each
    `(key, effective day, end day, parent)`: the changed rows of an SCD2 dimension before and after a micro-batch
    (a version closed by a new one is in both, with its old and its new end day). Days outside every version of a
    set have no parent there."""
    keys: dict = {}
    for side, rows in ((0, before), (1, after)):
        for key, start, end, parent in rows:
            keys.setdefault(key, ([], []))[side].append((start, end, parent))
    spans = []
    for sides in keys.values():
        bounds = sorted({d for versions in sides for s, e, _ in versions for d in (s, e)})
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            parents = [next((p for s, e, p in versions if s <= lo < e), None) for versions in sides]
            if parents[0] != parents[1]:
                spans.append((lo, hi))
    return merge_spans(spans)


def merge_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def lookup(ctx: JobContext, table: Table, key: str, values: pa.ChunkedArray | pa.Array, column: str) -> pa.Array:
    """`column` of the `table` row whose unique `key` is each of `values` (NULL where none)."""
    values = ao.column(pa.table({"v": values}), "v")
    if not ctx.lake.exists(table) or len(values) == 0:
        return pa.nulls(len(values), table.arrow_schema().field(column).type)
    rows = ctx.lake.read_where(table, pc.field(key).isin(pc.unique(values)), [key, column])
    index = pc.index_in(values, value_set=rows[key].combine_chunks())
    return take(rows[column], pc.fill_null(index, -1).to_numpy(zero_copy_only=False).astype(np.int64))


def _versions(ctx: JobContext, table: Table, key: str, values: pa.Array, columns: list[str]) -> pa.Table:
    cols = [key, *columns, "effectivedate", "enddate"]
    if len(values) == 0:
        return table.arrow_schema().empty_table().select(cols)
    return ctx.lake.read_if_exists(table, cols, pc.field(key).isin(pc.unique(values.drop_null())))


def _valid(versions: pa.Table, key: str, values: pa.Array, days: np.ndarray) -> np.ndarray:
    return valid_versions(values, days, versions[key], versions["effectivedate"], versions["enddate"])


def route_securities(
    ctx: JobContext, symbols: pa.Array | pa.ChunkedArray, days: np.ndarray, fallback_company: pa.ChunkedArray
) -> dict[str, pa.Array]:
    """`security_routes` of records (symbol, day), with the versions of their symbols read from the lake."""
    symbols = ao.column(pa.table({"s": symbols}), "s").cast(pa.large_string())
    securities = _versions(ctx, wh.DIM_SECURITY, "symbol", symbols.cast(pa.string()), ["sk_companyid"])
    companies = ctx.lake.read_if_exists(
        wh.DIM_COMPANY, ["sk_companyid", "companyid", "industry", "effectivedate", "enddate"]
    )
    industries = ao.sort(ctx.lake.read_if_exists(wh.INDUSTRY, ["in_id", "in_name", "in_sc_id"]), ["in_id"])
    return security_routes(symbols, days, fallback_company, securities, companies, industries)


def security_routes(
    symbols: pa.Array,
    days: np.ndarray,
    fallback_company: pa.Array | pa.ChunkedArray,
    securities: pa.Table,
    companies: pa.Table,
    industries: pa.Table,
) -> dict[str, pa.Array]:
    """security, company, industry and sector of records (symbol, day): the DimSecurity version of the symbol
    valid that day gives the company (CIK), the DimCompany version of the CIK valid that day its industry, and the
    industry its sector. A symbol without a version that day takes the company version `fallback_company` names;
    a CIK without one, that company version's industry. DimCompany names its industry: a name that several
    Industry rows share (never in official data) is the first of `industries` (sorted by IN_ID: the lowest)."""
    v = _valid(securities, "symbol", symbols, days)
    sk_company = pc.coalesce(take(securities["sk_companyid"], v), ao.column(pa.table({"f": fallback_company}), "f"))
    own = pc.fill_null(pc.index_in(sk_company, value_set=companies["sk_companyid"].combine_chunks()), -1)
    own = own.to_numpy(zero_copy_only=False).astype(np.int64)
    cik = take(companies["companyid"], own)
    cv = _valid(companies, "companyid", cik, days)
    cv = np.where(cv >= 0, cv, own)
    industry_name = take(companies["industry"], cv)
    ind = pc.index_in(industry_name, value_set=industries["in_name"].combine_chunks())
    ind = pc.fill_null(ind, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return {
        ws.SECURITY: symbols,
        ws.COMPANY: cik.cast(pa.large_string()),
        ws.INDUSTRY: take(industries["in_id"], ind).cast(pa.large_string()),
        ws.SECTOR: take(industries["in_sc_id"], ind).cast(pa.large_string()),
    }


def route_accounts(
    ctx: JobContext,
    accounts: pa.Array,
    days: np.ndarray,
    fallback_customer: pa.ChunkedArray,
    fallback_broker: pa.ChunkedArray,
) -> dict[str, pa.Array]:
    """`account_routes` of records (account id, day), with the versions of their accounts read from the lake."""
    versions = _versions(ctx, wh.DIM_ACCOUNT, "accountid", accounts, ["sk_customerid", "sk_brokerid"])
    routes = account_routes(accounts, days, fallback_customer, fallback_broker, versions)
    return {
        ws.ACCOUNT: routes[ws.ACCOUNT],
        ws.CUSTOMER: lookup(ctx, wh.DIM_CUSTOMER, "sk_customerid", routes[ws.CUSTOMER], "customerid").cast(
            pa.large_string()
        ),
        ws.BROKER: lookup(ctx, wh.DIM_BROKER, "sk_brokerid", routes[ws.BROKER], "brokerid").cast(pa.large_string()),
    }


def account_routes(
    accounts: pa.Array,
    days: np.ndarray,
    fallback_customer: pa.Array | pa.ChunkedArray,
    fallback_broker: pa.Array | pa.ChunkedArray,
    versions: pa.Table,
) -> dict[str, pa.Array]:
    """account (its id) and the customer and broker versions (surrogate keys) of records (account id, day): those
    of the DimAccount version valid that day, or the versions the record names when the account has none."""
    v = _valid(versions, "accountid", accounts, days)
    fc = ao.column(pa.table({"f": fallback_customer}), "f")
    fb = ao.column(pa.table({"f": fallback_broker}), "f")
    return {
        ws.ACCOUNT: ao.column(pa.table({"a": accounts}), "a").cast(pa.large_string()),
        ws.CUSTOMER: pc.coalesce(take(versions["sk_customerid"], v), fc),
        ws.BROKER: pc.coalesce(take(versions["sk_brokerid"], v), fb),
    }


HIERARCHIES: dict[str, tuple[tuple[Table, str, tuple[str, ...]], ...]] = {
    # (dimension, natural key, parent columns) whose versions route a source's records
    ws.TRADES: (
        (wh.DIM_SECURITY, "symbol", ("sk_companyid",)),
        (wh.DIM_COMPANY, "companyid", ("industry",)),
        (wh.DIM_ACCOUNT, "accountid", ("sk_customerid", "sk_brokerid")),
    ),
    ws.MARKET: ((wh.DIM_SECURITY, "symbol", ("sk_companyid",)), (wh.DIM_COMPANY, "companyid", ("industry",))),
}


def rerouted(ctx: JobContext, scope: BatchScope) -> dict[str, list[tuple[int, int]]]:
    """Per hierarchy dimension this micro-batch changed, the spans of days [start, end) whose records it re-routes
    (`routing_changes`); a changed Industry re-routes every day."""
    out: dict[str, list[tuple[int, int]]] = {}
    if scope.changed(ctx, wh.INDUSTRY, ["in_id"]) is not None:
        out[wh.INDUSTRY.name] = [(0, np.iinfo(np.int32).max)]
    dimensions = {
        table.name: (table, key, parents) for hierarchy in HIERARCHIES.values() for table, key, parents in hierarchy
    }
    for table, key, parents in dimensions.values():
        feed = scope.changed(ctx, table, [key, *parents, "effectivedate", "enddate", "_change_type"])
        if feed is None or feed.num_rows == 0:
            continue
        after = np.asarray(pc.is_in(feed["_change_type"], value_set=pa.array(["insert", "update_postimage"])))
        eff, end = ao.days(feed["effectivedate"]), ao.days(feed["enddate"])
        keys = feed[key].to_pylist()
        values = list(zip(*(feed[p].to_pylist() for p in parents), strict=True))
        rows = [(k, int(s), int(e), p) for k, s, e, p in zip(keys, eff, end, values, strict=True)]
        before_rows = [r for r, a in zip(rows, after, strict=True) if not a]
        after_rows = [r for r, a in zip(rows, after, strict=True) if a]
        out[table.name] = routing_changes(before_rows, after_rows)
    return out


def rerouted_spans(days: dict[str, list[tuple[int, int]]], source: str, end: int) -> list[tuple[int, int]]:
    """The spans of event time (µs) of `source`'s records that `rerouted` days re-route, clamped to [0, end)."""
    tables = [wh.INDUSTRY.name, *(t.name for t, _, _ in HIERARCHIES[source])]
    spans = [(max(lo * US_PER_DAY, 0), min(hi * US_PER_DAY, end)) for t in tables for lo, hi in days.get(t, [])]
    return [(lo, hi) for lo, hi in spans if lo < hi]
