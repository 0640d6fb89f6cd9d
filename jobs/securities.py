"""DimSecurity (part of step T1, CreateSecurities): its change records, its versions cut at the company versions,
and the alerts of the SEC records left out.

Pure Arrow transforms in the driver (tables in, tables out) on the staged SEC records; the T1 step
(`jobs.create_securities`) reads, chooses the symbols to rebuild and commits. A record's company is resolved
through `jobs.companies`; record order and rejection rules are in `jobs.finwire_records`.

**DimSecurity** (SCD2 on symbol): one version per symbol per day as for companies; effective date = PTS
date; status via StatusType; `sk_companyid` = the company version valid on the version's effective date. A
new version of the referenced company during a security version starts a new security version that day with
the new `sk_companyid` (same attributes, `batchid` of the company version), so every security row lies
inside the validity of its company row (the audit's "DimSecurity SK_CompanyID" check).
`sk_securityid = jobs.scd2_arrow.hashed_surrogate_keys("dimsecurity", symbol, effective date)`.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from jobs.arrow_ops import lookup, sort
from jobs.companies import company_reference, resolve_company, unknown_company_detail
from jobs.fields import join
from jobs.finwire_records import (
    MISSING_FIELD,
    ORDER,
    SOURCE_OF,
    UNKNOWN_COMPANY,
    UNKNOWN_STATUS,
    first_reason,
    lineage,
    missing_required,
    rejection_alerts,
)
from jobs.scd2 import END_OF_TIME
from jobs.scd2_arrow import build_versions, hashed_surrogate_keys
from schemas import warehouse as wh

SECURITY_VALUES = (
    "issue",
    "status",
    "name",
    "exchangeid",
    "sharesoutstanding",
    "firsttrade",
    "firsttradeonexchange",
    "dividend",
)


def security_changes(sec: pa.Table, status_type: pa.Table, references: pa.Table) -> pa.Table:
    """One change record per SEC record: `symbol`, the DimSecurity values, `_companyid` (the company its
    reference resolves to on the PTS date), lineage, `_ref`, `_reason`/`_detail`."""
    rows = pa.table(
        {
            "symbol": sec["symbol"],
            **lineage(sec),
            "co_name_or_cik": sec["co_name_or_cik"],
            "_ref": company_reference(sec["cik"], sec["company_name"]),
            "issue": sec["issue_type"],
            "status": lookup(sec["status"], status_type, "st_id", "st_name"),
            "name": sec["name"],
            "exchangeid": sec["ex_id"],
            "sharesoutstanding": sec["sh_out"],
            "firsttrade": sec["first_trade_date"],
            "firsttradeonexchange": sec["first_trade_exchg"],
            "dividend": sec["dividend"],
        }
    )
    companyid, _ = resolve_company(rows, references)
    rows = rows.append_column("_companyid", companyid)
    missing = missing_required(wh.DIM_SECURITY, rows, ("symbol", *SECURITY_VALUES))
    reason, detail = first_reason(
        rows.num_rows,
        (pc.is_null(rows["status"]), UNKNOWN_STATUS, join("ST_ID = ", sec["status"])),
        (pc.not_equal(missing, ""), MISSING_FIELD, lambda at: join("FIELDS = ", missing.take(at))),
        (pc.is_null(companyid), UNKNOWN_COMPANY, lambda at: unknown_company_detail(rows.take(at))),
    )
    return rows.append_column("_reason", reason).append_column("_detail", detail)


def security_versions(changes: pa.Table, companies: pa.Table) -> pa.Table:
    """DimSecurity rows (every declared column) of the symbols in `changes`: SCD2 versions of the loadable
    records, each cut where a new version of its company starts (`split_by_company`)."""
    loadable = changes.filter(pc.is_null(changes["_reason"]))
    versions = build_versions(loadable, "symbol", ORDER, [*SECURITY_VALUES, "_companyid"])
    return split_by_company(versions, companies)


def split_by_company(versions: pa.Table, companies: pa.Table) -> pa.Table:
    """Security versions (`_companyid` valid at their effective date) cut by the company's versions: one row
    per overlap of a security version and a version of its company, with that company version's key, sorted by
    symbol and effective date.

    The first piece keeps the security version's `batchid`; a piece the company change starts takes the
    company version's `batchid` (the change that made it).
    """
    comp = pa.table(
        {
            "_companyid": companies["companyid"],
            "sk_companyid": companies["sk_companyid"],
            "_ceff": companies["effectivedate"],
            "_cend": companies["enddate"],
            "_cbatch": companies["batchid"].cast(pa.int32()),
        }
    )
    pieces = versions.join(comp, "_companyid", join_type="inner")
    overlap = pc.and_(pc.less(pieces["_ceff"], pieces["enddate"]), pc.greater(pieces["_cend"], pieces["effectivedate"]))
    pieces = pieces.filter(overlap)
    start = pc.max_element_wise(pieces["effectivedate"], pieces["_ceff"])
    end = pc.min_element_wise(pieces["enddate"], pieces["_cend"])
    out = pa.table(
        {
            "symbol": pieces["symbol"],
            **{v: pieces[v] for v in SECURITY_VALUES},
            "sk_companyid": pieces["sk_companyid"],
            "effectivedate": start,
            "enddate": end,
            "iscurrent": pc.equal(end, pa.scalar(END_OF_TIME, pa.date32())),
            "batchid": pc.if_else(pc.equal(start, pieces["effectivedate"]), pieces["batchid"], pieces["_cbatch"]),
        }
    )
    out = sort(out, ["symbol", "effectivedate"])
    return out.append_column("sk_securityid", hashed_surrogate_keys("dimsecurity", out["symbol"], out["effectivedate"]))


def security_alerts(changes: pa.Table) -> pa.Table:
    return rejection_alerts(changes, SOURCE_OF[wh.DIM_SECURITY.name], join("S_SYMB = ", changes["symbol"]))
