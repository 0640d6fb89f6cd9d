"""Prospect (step T2, after DimCustomer) and the demographic columns of DimCustomer.

Implements TPC-DI 1.1.0 clause 4.5 for Prospect (historical and incremental) and the DimCustomer fields AgencyID,
CreditRating, NetWorth and MarketingNameplate. Prospect.csv is a full snapshot of the marketing agency's prospects
in every TPC-DI batch (no CDC columns); a prospect is identified by its AgencyID.

**Prospect**, one row per AgencyID, from the prospect's lines in the snapshots staged so far (batches whose
BatchDate is known):
- the fields LastName .. NetWorth: those of its latest line; Gender, MaritalStatus and OwnOrRentFlag are
  upper-cased and, when not one of the table's values (M/F; S/M/D/W; O/R), `U`;
- SK_RecordDateID: the DimDate id (yyyymmdd) of the BatchDate of the latest batch whose snapshot lists it;
- SK_UpdateDateID and BatchID: the BatchDate's DimDate id and the number of the batch that last inserted or changed
  it, i.e. the first snapshot whose line differs, in any field, from the line of the snapshot before it that
  listed the prospect (its first snapshot when it never changed). A prospect missing from a later snapshot keeps
  its row (nothing in the specification deletes one) and, listed again unchanged, its update date;
- IsCustomer: whether a current DimCustomer version with status Active matches it, once the customer records of
  its latest batch are in. A prospect and a customer match when FirstName, LastName, AddressLine1, AddressLine2
  and PostalCode are equal upper-cased (`match_key`; an absent AddressLine2 equals an empty one, as in the
  official audit's join; any other absent part never matches);
- MarketingNameplate: the '+'-joined tags, in this order, whose condition holds -- HighValue (NetWorth > 1,000,000
  or Income > 200,000), Expenses (NumberChildren > 3 or NumberCreditCards > 5), Boomer (Age > 45), MoneyAlert
  (Income < 50,000 or CreditRating < 600 or NetWorth < 100,000), Spender (NumberCars > 3 or NumberCreditCards > 7),
  Inherited (Age < 25 and NetWorth > 1,000,000) -- with SQL's three-valued logic (an absent figure satisfies no
  comparison); NULL when no tag applies.
A snapshot that lists an AgencyID twice keeps one line for it: the greatest by its fields (so the choice does not
depend on how the file was cut into pieces).

**DimCustomer demographics** (`with_demographics`): a DimCustomer version takes AgencyID, CreditRating, NetWorth and
MarketingNameplate from the prospect line that matches it (`match_key`) in the snapshot of the version's batch
(`batchid`), the smallest AgencyID when several match; NULL when none does.

Incrementality and micro-batch splits. A Prospect row depends on the prospect's lines and, through IsCustomer, on
DimCustomer at the end of its latest batch. Each T2 run recomputes every prospect whose latest line belongs to the
micro-batch's TPC-DI batch (`current`), and only those: a prospect whose line of that batch has not arrived yet
(or that the batch's snapshot drops) keeps the row the end of its latest batch gave it, exactly as a load of the
whole batch leaves it, and a later micro-batch of the batch that changes a customer recomputes the prospects it may
match. Only the batch's own lines are read: the earlier batches stand in as the Prospect rows they left
(`earlier_lines`), so a batch costs the size of its snapshot, not the number of batches before it. The MERGE leaves
equal rows alone. DimCustomer versions take their demographics when T2 rebuilds them; a
prospect line that arrives after the versions it matches were written rebuilds those customers
(`customers_matching_new_lines`), so a split batch ends with the demographics of a whole one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs import arrow_ops as ao
from jobs.scope import BatchScope
from schemas import sources as src
from schemas import warehouse as wh
from streamdi.context import JobContext

log = logging.getLogger(__name__)

STEP = "T2"
LINES = src.PROSPECT.staging
FIELDS: tuple[str, ...] = tuple(c.name for c in src.PROSPECT.columns if c.name != "agencyid")
# column -> (values kept, upper-cased); anything else becomes "U"
DOMAINS: dict[str, tuple[str, ...]] = {
    "gender": ("M", "F"),
    "maritalstatus": ("S", "M", "D", "W"),
    "ownorrentflag": ("O", "R"),
}
UNKNOWN = "U"
MATCH_PARTS = ("firstname", "lastname", "addressline1", "addressline2", "postalcode")
_SEP = "\x1f"  # joins the parts of a match key; it cannot occur in a parsed field


# ------------------------------------------------------------------------------------------------ rules
def normalized(lines: pa.Table) -> pa.Table:
    """`lines` with Gender, MaritalStatus and OwnOrRentFlag upper-cased, and `U` where not a declared value."""
    out = lines
    for name, allowed in DOMAINS.items():
        value = ao.upper(out[name])
        known = pc.fill_null(pc.is_in(value, value_set=pa.array(allowed, pa.large_string())), False)
        fixed = pc.if_else(known, value, pa.scalar(UNKNOWN, pa.large_string()))
        out = out.set_column(out.schema.get_field_index(name), name, fixed)
    return out


def marketing_nameplate(lines: pa.Table) -> pa.Array:
    """The MarketingNameplate of every line (module doc), NULL where no tag applies."""

    def num(name: str) -> pa.Array:
        return ao.column(lines, name).cast(pa.int64())

    def gt(name: str, limit: int) -> pa.Array:
        return pc.greater(num(name), limit)

    def lt(name: str, limit: int) -> pa.Array:
        return pc.less(num(name), limit)

    tags = {
        "HighValue": pc.or_kleene(gt("networth", 1_000_000), gt("income", 200_000)),
        "Expenses": pc.or_kleene(gt("numberchildren", 3), gt("numbercreditcards", 5)),
        "Boomer": gt("age", 45),
        "MoneyAlert": pc.or_kleene(
            pc.or_kleene(lt("income", 50_000), lt("creditrating", 600)), lt("networth", 100_000)
        ),
        "Spender": pc.or_kleene(gt("numbercars", 3), gt("numbercreditcards", 7)),
        "Inherited": pc.and_kleene(lt("age", 25), gt("networth", 1_000_000)),
    }
    parts = [
        pc.if_else(
            pc.fill_null(holds, False), pa.scalar(f"{tag}+", pa.large_string()), pa.scalar("", pa.large_string())
        )
        for tag, holds in tags.items()
    ]
    joined = pc.binary_join_element_wise(*parts, pa.scalar("", pa.large_string()))
    trimmed = pc.utf8_rtrim(joined, characters="+")
    return pc.if_else(pc.equal(trimmed, ""), pa.scalar(None, pa.large_string()), trimmed)


def match_key(rows: pa.Table) -> pa.Array:
    """The customer/prospect match key of every row (columns `MATCH_PARTS`): the upper-cased parts joined; NULL
    where FirstName, LastName, AddressLine1 or PostalCode is absent (AddressLine2 absent counts as empty)."""
    parts = []
    for name in MATCH_PARTS:
        part = ao.upper(rows[name])
        if name == "addressline2":
            part = pc.fill_null(part, "")
        parts.append(part)
    return pc.binary_join_element_wise(*parts, pa.scalar(_SEP, pa.large_string()))


def effective_lines(lines: pa.Table) -> pa.Table:
    """One line per (agencyid, source_batch), in that order: the greatest of the snapshot's lines of the prospect,
    normalized. Only the prospects a snapshot lists more than once are ordered by every field (a snapshot lists
    nearly every prospect once: sorting all of its ~30,000 lines per SF 6 batch by 21 columns cost ~0.1 s)."""
    group = ["agencyid", "source_batch"]
    ordered = ao.sort(normalized(lines.select([*group, *FIELDS])), group)
    starts = ao.group_starts(ordered, group)
    sizes = np.diff(np.r_[starts, ordered.num_rows])
    if ordered.num_rows == 0 or sizes.max() == 1:
        return ordered
    repeated = np.repeat(sizes > 1, sizes)
    greatest = ao.last_of_groups(ao.sort(ordered.filter(repeated), [*group, *FIELDS]), group)
    return ao.sort(pa.concat_tables([ordered.filter(~repeated), greatest]), group)


def prospect_rows(
    lines: pa.Table, batch_dates: Mapping[int, object], customer_keys: pa.Array, current: int
) -> pa.Table:
    """Prospect rows (the table's columns) of the prospects whose latest line is of batch `current`.

    `lines`: every staged line of those prospects in dated batches (at least `agencyid`, `source_batch` and the
    fields); `batch_dates`: TPC-DI batch -> BatchDate; `customer_keys`: the match keys of the current, active
    DimCustomer versions."""
    eff = effective_lines(lines)
    if eff.num_rows == 0:
        return wh.PROSPECT.arrow_schema().empty_table()
    # a line that starts a prospect or differs from its previous snapshot's line is an insert or a change
    same_agency = ao.same_as_previous(eff, ["agencyid"])
    unchanged = same_agency & ao.same_as_previous(eff, ["agencyid", *FIELDS])
    batch = ao.column(eff, "source_batch").to_numpy(zero_copy_only=False).astype(np.int64)
    changed_at = np.where(unchanged, np.iinfo(np.int64).min, batch)
    group = np.cumsum(~same_agency) - 1
    update_batch = np.maximum.reduceat(changed_at, np.flatnonzero(~same_agency))[group]
    last = np.r_[~same_agency[1:], True]  # the latest line of each prospect
    latest = eff.filter(pa.array(last & (batch == current)))
    updated = update_batch[last & (batch == current)]
    if latest.num_rows == 0:
        return wh.PROSPECT.arrow_schema().empty_table()
    ids = {b: ao.date_id(d) for b, d in batch_dates.items()}
    is_customer = pc.fill_null(pc.is_in(match_key(latest), value_set=customer_keys), False)
    columns = {
        "agencyid": latest["agencyid"],
        "sk_recorddateid": pa.array([ids[current]] * latest.num_rows, pa.int32()),
        "sk_updatedateid": pa.array([ids[int(b)] for b in updated], pa.int32()),
        "batchid": pa.array(updated, pa.int32()),
        "iscustomer": is_customer,
        **{name: latest[name] for name in FIELDS},
        "marketingnameplate": marketing_nameplate(latest),
    }
    return pa.table(columns).select(wh.PROSPECT.column_names).cast(wh.PROSPECT.arrow_schema())


def customer_keys(customers: pa.Table) -> pa.Array:
    """The distinct match keys of the current DimCustomer versions with status Active in `customers`."""
    active = customers.filter(pc.and_(customers["iscurrent"], pc.equal(customers["status"], "Active")))
    keys = match_key(active)
    return pc.unique(keys.filter(pc.is_valid(keys)))


def demographic_lines(lines: pa.Table) -> pa.Table:
    """Per (source_batch, match key) of the prospect lines: the line with the smallest AgencyID, as
    `batchid, _key, agencyid, creditrating, networth, marketingnameplate`."""
    eff = effective_lines(lines)
    table = pa.table(
        {
            "batchid": eff["source_batch"].cast(pa.int32()),
            "_key": match_key(eff),
            "agencyid": eff["agencyid"],
            "creditrating": eff["creditrating"],
            "networth": eff["networth"],
            "marketingnameplate": marketing_nameplate(eff),
        }
    )
    table = table.filter(pc.is_valid(table["_key"]))
    return ao.first_of_groups(ao.sort(table, ["batchid", "_key", "agencyid"]), ["batchid", "_key"])


DEMOGRAPHICS = ("agencyid", "creditrating", "networth", "marketingnameplate")


def with_demographics(versions: pa.Table, lines: pa.Table) -> pa.Table:
    """DimCustomer `versions` (with `batchid` and the match parts) with AgencyID, CreditRating, NetWorth and
    MarketingNameplate of the prospect line that matches each (module doc), in the same row order."""
    if versions.num_rows == 0:
        return versions
    found = demographic_lines(lines)
    left = pa.table(
        {
            "_row": pa.array(np.arange(versions.num_rows), pa.int64()),
            "batchid": versions["batchid"].cast(pa.int32()),
            "_key": match_key(versions),
        }
    )
    joined = left.join(found, keys=["batchid", "_key"], join_type="left outer")
    joined = ao.sort(joined, ["_row"])
    out = versions
    for name in DEMOGRAPHICS:
        field = wh.DIM_CUSTOMER.arrow_schema().field(name)
        value = joined[name].cast(field.type)
        index = out.schema.get_field_index(name)
        out = out.set_column(index, name, value) if index >= 0 else out.append_column(name, value)
    return out


# ------------------------------------------------------------------------------------------------ edges
def _dated(scope: BatchScope) -> pc.Expression:
    return pc.field("source_batch").isin(pa.array(sorted(scope.batch_dates), pa.int32()))


def staged_lines(ctx: JobContext, scope: BatchScope, batches: list[int] | None = None) -> pa.Table:
    """Staged Prospect.csv lines up to this micro-batch (of `batches` only, when given)."""
    cond = pc.scalar(True) if batches is None else pc.field("source_batch").isin(pa.array(batches, pa.int32()))
    return scope.staged_where(ctx, LINES, cond)


def rebuilt_demographics(ctx: JobContext, scope: BatchScope, versions: pa.Table) -> pa.Table:
    """`with_demographics` of the DimCustomer `versions` T2 rebuilt, reading only the snapshots that can give
    a version other demographics than it has: a rebuilt version equal to a stored one in its key, batch and match
    key keeps the stored demographics, unless its batch has prospect lines new to this micro-batch; the others
    are looked up in their batch's staged lines.

    Exact because a stored version's demographics are those of every line of its batch staged when it was written,
    and a later line that can change them matches it (`customers_matching_new_lines`), so its customer is rebuilt
    in the micro-batch that stages the line, and its batch is then looked up. Without the reuse, every rebuilt
    customer's versions read the whole snapshot of each of their batches (31,764 lines per batch at SF 6): the cost
    grew with the number of batches a customer's history spans."""
    if versions.num_rows == 0:
        return versions
    key = list(wh.DIM_CUSTOMER.key)
    stored = ctx.lake.read_if_exists(
        wh.DIM_CUSTOMER,
        [*key, "batchid", *MATCH_PARTS, *DEMOGRAPHICS],
        pc.field("customerid").isin(pc.unique(versions["customerid"].combine_chunks())),
    )
    fresh = scope.staged_where(ctx, LINES, pc.field("batch_id") == scope.batch_id, ["source_batch"])
    fresh_batches = pc.unique(fresh["source_batch"].combine_chunks()).cast(pa.int32())
    left = pa.table(
        {
            "_row": pa.array(np.arange(versions.num_rows), pa.int64()),
            **{k: versions[k] for k in key},
            "batchid": versions["batchid"].cast(pa.int32()),
            "_key": match_key(versions),
        }
    )
    right = pa.table(
        {
            **{k: stored[k] for k in key},
            "_stored_batch": stored["batchid"].cast(pa.int32()),
            "_stored_key": match_key(stored),
            **{f"_stored_{d}": stored[d] for d in DEMOGRAPHICS},
        }
    )
    joined = ao.sort(left.join(right, keys=key, join_type="left outer"), ["_row"])
    same = pc.and_(
        pc.equal(joined["batchid"], joined["_stored_batch"]), pc.equal(joined["_key"], joined["_stored_key"])
    )
    reuse = pc.and_(pc.fill_null(same, False), pc.invert(pc.is_in(joined["batchid"], value_set=fresh_batches)))
    wanted = pc.unique(pc.filter(joined["batchid"], pc.invert(reuse)).combine_chunks())
    lines = staged_lines(ctx, scope, wanted.to_pylist()) if len(wanted) else LINES.arrow_schema().empty_table()
    looked = with_demographics(versions, lines)
    out = looked
    for name in DEMOGRAPHICS:
        index = out.schema.get_field_index(name)
        kind = out.schema.field(name).type
        value = pc.if_else(reuse, joined[f"_stored_{name}"].cast(kind), out[name])
        out = out.set_column(index, name, value)
    return out


def customers_matching_new_lines(ctx: JobContext, scope: BatchScope) -> pa.Array:
    """Customer ids whose DimCustomer versions (as committed before this micro-batch) match a prospect line new to
    this micro-batch, in the snapshot of the version's batch, or an earlier line of the same prospect in that
    snapshot (a snapshot that lists a prospect twice keeps the greatest line, so a new line can take the prospect
    away from the customers the earlier one matched): their demographics may change, so T2 rebuilds them."""
    empty = pa.array([], pa.int64())
    if not ctx.lake.exists(LINES) or not ctx.lake.exists(wh.DIM_CUSTOMER):
        return empty
    columns = ["source_batch", "agencyid", *MATCH_PARTS]
    new = scope.staged_where(ctx, LINES, pc.field("batch_id") == scope.batch_id, columns)
    if new.num_rows == 0:
        return empty
    listed_before = scope.staged_where(
        ctx,
        LINES,
        (pc.field("batch_id") < scope.batch_id)
        & pc.field("source_batch").isin(pc.unique(new["source_batch"].combine_chunks()))
        & pc.field("agencyid").isin(pc.unique(new["agencyid"].combine_chunks())),
        columns,
    )
    if listed_before.num_rows:  # only the same prospect in the same snapshot
        pairs = new.select(["source_batch", "agencyid"]).group_by(["source_batch", "agencyid"]).aggregate([])
        earlier = listed_before.join(pairs, keys=["source_batch", "agencyid"]).select(columns)
        new = pa.concat_tables([new.select(columns), earlier.cast(new.select(columns).schema)])
    new_keys = pa.table({"batchid": new["source_batch"].cast(pa.int32()), "_key": match_key(new)})
    batches = pc.unique(new_keys["batchid"])
    versions = ctx.lake.read_where(
        wh.DIM_CUSTOMER, pc.field("batchid").isin(batches), ["customerid", "batchid", *MATCH_PARTS]
    )
    if versions.num_rows == 0:
        return empty
    mine = pa.table({"customerid": versions["customerid"], "batchid": versions["batchid"], "_key": match_key(versions)})
    distinct_keys = new_keys.group_by(["batchid", "_key"], use_threads=False).aggregate([])
    hits = mine.join(distinct_keys, keys=["batchid", "_key"], join_type="inner")
    return pc.unique(hits["customerid"].combine_chunks()).cast(pa.int64())


def _changeable(ctx: JobContext, scope: BatchScope, lines: pa.Table) -> pa.Array:
    """The AgencyIDs whose Prospect row this micro-batch can change when it dates no batch: those with a line it
    staged, and those whose lines match (`match_key`) a DimCustomer row its commits inserted, updated (before and
    after images) or deleted, whose IsCustomer may flip. Every other row's inputs (its lines, the batch dates, the
    customers it matches) are as the micro-batch before left them, and so is the row."""
    new = lines.filter(pc.equal(lines["batch_id"], scope.batch_id))["agencyid"]
    parts = [new.combine_chunks()]
    changed = scope.changed(ctx, wh.DIM_CUSTOMER, list(MATCH_PARTS))
    if changed is not None and changed.num_rows:
        keys = pc.unique(pc.drop_null(match_key(changed)))
        hit = pc.fill_null(pc.is_in(match_key(lines), value_set=keys), False)
        parts.append(lines.filter(hit)["agencyid"].combine_chunks())
    kind = lines.schema.field("agencyid").type
    return pc.unique(pa.concat_arrays([p.cast(kind) for p in parts]))


def _line_columns(lines: pa.Table) -> pa.Table:
    return lines.select(["agencyid", "source_batch", *FIELDS])


def earlier_lines(ctx: JobContext, scope: BatchScope, ids: pa.Array, current: int) -> pa.Table:
    """What `prospect_rows` needs of the prospects `ids` before TPC-DI batch `current`, read at a cost that does not
    grow with the number of batches: a prospect whose Prospect row an earlier batch wrote is one line made of that
    row -- its fields (normalized, as the lines were) at the batch that last changed it (`batchid`) -- which gives
    the same update batch as all of its earlier lines (the row's fields are those of the latest earlier snapshot
    listing it, and its `batchid` the update batch that snapshot had); a prospect whose row a micro-batch of
    `current` already rewrote gets its staged lines of the earlier dated batches."""
    columns = ["agencyid", "source_batch", *FIELDS]
    kept = ["agencyid", "sk_recorddateid", "batchid", *FIELDS]
    if ctx.lake.exists(wh.PROSPECT):
        rows = ctx.lake.read_where(wh.PROSPECT, pc.field("agencyid").isin(ids), kept)
        rewritten = pc.equal(rows["sk_recorddateid"], ao.date_id(scope.batch_dates[current]))
        before, again = rows.filter(pc.invert(rewritten)), rows.filter(rewritten)["agencyid"].combine_chunks()
    else:  # no row yet: every earlier line, if there is any
        before, again = wh.PROSPECT.arrow_schema().empty_table().select(kept), ids
    earlier = scope.staged_where(
        ctx, LINES, _dated(scope) & (pc.field("source_batch") != current) & pc.field("agencyid").isin(again), columns
    )
    stand_ins = pa.table(
        {"agencyid": before["agencyid"], "source_batch": before["batchid"], **{f: before[f] for f in FIELDS}}
    )
    return pa.concat_tables([earlier.select(columns), stand_ins.cast(earlier.select(columns).schema)])


def run(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Recompute the prospects whose latest line is of this micro-batch's TPC-DI batch and upsert them (app
    transaction `T2/prospect`, committed even when empty). Called by T2 after its DimCustomer commit. A micro-batch
    that dates no batch recomputes only the prospects it can change (`_changeable`): a drip's micro-batch without
    Prospect lines or customer changes costs a read, not a recomputation and MERGE of the whole snapshot."""
    if scope.committed(ctx, STEP, wh.PROSPECT) or not ctx.lake.exists(LINES) or not scope.source_batches:
        return {}
    current = max(scope.source_batches)
    rows = wh.PROSPECT.arrow_schema().empty_table()
    if current in scope.batch_dates:
        # every prospect of the batch when the micro-batch dates one, else only those it can change (a narrow read
        # finds them; the lines of those few are then read whole); only the batch's own lines are read, the earlier
        # ones stand in as `earlier_lines` gives them
        narrow = None if scope.newly_dated else ["agencyid", "source_batch", "batch_id", *MATCH_PARTS]
        in_batch = pc.field("source_batch") == current
        lines = scope.staged_where(ctx, LINES, in_batch, narrow)
        ids = pc.unique(lines["agencyid"].combine_chunks())
        if narrow is not None:
            ids = pc.filter(ids, pc.is_in(ids, value_set=_changeable(ctx, scope, lines)))
            if len(ids):
                lines = scope.staged_where(ctx, LINES, in_batch & pc.field("agencyid").isin(ids))
        if len(ids):
            mine = pa.concat_tables([_line_columns(lines), earlier_lines(ctx, scope, ids, current)])
            keys = pa.array([], pa.large_string())
            if ctx.lake.exists(wh.DIM_CUSTOMER):
                is_current = pc.field("iscurrent") == True  # noqa: E712 - a pyarrow expression, not a Python test
                current_rows = ctx.lake.read_where(wh.DIM_CUSTOMER, is_current, ["iscurrent", "status", *MATCH_PARTS])
                keys = customer_keys(current_rows)
            rows = prospect_rows(mine, scope.batch_dates, keys, current)
    ctx.lake.upsert(wh.PROSPECT, rows, app_id=scope.app_id(STEP, wh.PROSPECT), version=scope.batch_id)
    log.info("T2 micro-batch %s: prospect: %s upserted", scope.batch_id, rows.num_rows)
    return {wh.PROSPECT.name: rows.num_rows}
