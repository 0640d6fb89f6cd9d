"""DimCompany (part of step T1, CreateSecurities) and the company references of SEC and FIN records.

Pure Arrow transforms in the driver (tables in, tables out) on the staged CMP records (`schemas.finwire`, FINWIRE
layouts in TPC-DI 1.1.0 clause 2.2.2.8, DimCompany rules in clause 4.5 with 4.5.3.3, the "Invalid SPRating"
alert); the T1 step (`jobs.create_securities`) reads, chooses the keys to rebuild and commits. DimSecurity
(`jobs.securities`) and Financial (`jobs.financials`) resolve their records' company through the references
declared here. The record order, lineage and rejection rules shared by all three are in `jobs.finwire_records`.

**DimCompany** (SCD2 on CIK): one version per CIK per day, the day's last record winning; effective date =
PTS date; `batchid` = the record's TPC-DI batch; status = StatusType name of the status code, industry =
Industry name of the industry id (warehouse tables `statustype`, `industry`); `sprating` = the rating when it
is one of AAA, AA[+/-], A[+/-], BBB[+/-], BB[+/-], B[+/-], CCC[+/-], CC, C, D, and `islowgrade` = false when
it begins with "A" or "BBB", else true. Otherwise both are NULL and an Alert "Invalid SPRating" with
`CO_ID = <CIK>, CO_SP_RATE = <rating>` is raised, once per DimCompany row (the version's record). A blank
rating is not a valid one either (spec silent; it gets the alert with an empty rating).
`sk_companyid = jobs.scd2_arrow.surrogate_keys(CIK, effective date)` (`CIK * 100000 + days since 1900-01-01`).

**Company reference** (last field of SEC and FIN): a CIK when it is 10 digits, else a company name. It
resolves to the DimCompany version valid on the record's PTS date (effectivedate <= day < enddate), by CIK
or by the name that version has. Spec silent on two companies bearing the referenced name that day: the
smallest CIK is taken.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.arrow_ops import column, lookup, same_as_previous, sort
from jobs.fields import join
from jobs.finwire_records import (
    INVALID_SP_RATING,
    MISSING_FIELD,
    ORDER,
    SOURCE_OF,
    STRING,
    UNKNOWN_INDUSTRY,
    UNKNOWN_STATUS,
    first_reason,
    lineage,
    missing_required,
    rejection_alerts,
)
from jobs.messages import alert_rows
from jobs.scd2 import DAY_SLOTS
from jobs.scd2_arrow import build_versions, surrogate_keys
from schemas import warehouse as wh

VALID_SP_RATINGS = (
    *("AAA", "AA+", "AA", "AA-", "A+", "A", "A-", "BBB+", "BBB", "BBB-"),
    *("BB+", "BB", "BB-", "B+", "B", "B-", "CCC+", "CCC", "CCC-", "CC", "C", "D"),
)

COMPANY_VALUES = (
    "status",
    "name",
    "industry",
    "sprating",
    "islowgrade",
    "ceo",
    "addressline1",
    "addressline2",
    "postalcode",
    "city",
    "stateprov",
    "country",
    "description",
    "foundingdate",
)

_CIK_PATTERN = r"^[0-9]{10}$"
_REFERENCE_COLUMNS = ("companyid", "sk_companyid", "effectivedate", "enddate")


# ------------------------------------------------------------------------------------------- references
def company_reference(cik: pa.Array | pa.ChunkedArray, name: pa.Array | pa.ChunkedArray) -> pa.Array:
    """`C<CIK>` (the CIK as a number) when the reference is a 10-digit CIK, else `N<name>`: the join key of
    `company_references`."""
    by_name = pc.if_else(pc.match_substring_regex(name, _CIK_PATTERN), name, pa.scalar(None, name.type))
    as_cik = pc.coalesce(cik, by_name)
    return pc.if_else(pc.is_valid(as_cik), join("C", pc.cast(as_cik, pa.int64())), join("N", name))


def cik_references(companyid: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The reference `C<CIK>` of each CIK."""
    return join("C", companyid)


def name_references(name: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The reference `N<name>` of each company name."""
    return join("N", name)


def company_references(companies: pa.Table) -> pa.Table:
    """Every DimCompany version under the two references that reach it: `C<CIK>` and `N<name>`."""
    cols = {c: companies[c] for c in _REFERENCE_COLUMNS}
    by_cik = pa.table({"_ref": cik_references(companies["companyid"]), **cols})
    by_name = pa.table({"_ref": name_references(companies["name"]), **cols})
    return pa.concat_tables([by_cik, by_name])


def company_of_key(sk_companyid: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The CIK of a DimCompany surrogate key (`surrogate_key` is `CIK * 100000 + days since 1900-01-01`)."""
    return pc.divide(sk_companyid, DAY_SLOTS)


def resolve_company(records: pa.Table, references: pa.Table) -> tuple[pa.Array, pa.Array]:
    """(`_companyid`, `sk_companyid`) of the company version each record's reference (`_ref`) names on its day
    (`_pdate`); NULL when there is none. Of several companies bearing the referenced name that day, the smallest
    CIK."""
    n = records.num_rows
    asked = pa.table(
        {
            "_row": pa.array(np.arange(n, dtype=np.int64)),
            "_ref": pc.cast(records["_ref"], STRING),
            "_day": records["_pdate"],
        }
    )
    pairs = asked.join(references.cast(references.schema.set(0, pa.field("_ref", STRING))), "_ref", join_type="inner")
    pairs = pairs.select(["_row", "_day", *_REFERENCE_COLUMNS])  # not the joined text, as long as the records
    valid = pc.and_(pc.less_equal(pairs["effectivedate"], pairs["_day"]), pc.less(pairs["_day"], pairs["enddate"]))
    pairs = sort(pairs.filter(valid), ["_row", "companyid"])
    chosen = pairs.filter(pa.array(~same_as_previous(pairs, ["_row"]), pa.bool_()))
    index = np.full(n, -1, dtype=np.int64)
    index[np.asarray(column(chosen, "_row"), dtype=np.int64)] = np.arange(chosen.num_rows)
    found = index >= 0
    take = pa.array(np.where(found, index, 0), pa.int64(), mask=~found)
    return column(chosen, "companyid").take(take), column(chosen, "sk_companyid").take(take)


def unknown_company_detail(records: pa.Table) -> pa.Array:
    return join("CO_NAME_OR_CIK = ", records["co_name_or_cik"], ", DAY = ", records["_pdate"])


def references_to(cmp: pa.Table, ciks: pa.Array) -> pa.Array:
    """`_ref` values that can reach the companies `ciks`: their CIKs and every name their CMP records (`cmp`,
    with `companyid`) carry."""
    names = cmp.filter(pc.is_in(cmp["companyid"], value_set=ciks))["company_name"]
    return pc.unique(pa.chunked_array([cik_references(ciks), name_references(names)], STRING))


def companies_reached(references: pa.Table, refs: pa.Array) -> pa.Array:
    """`companyid` of every company that one of `refs` (`_ref`) names on some day (`company_references`)."""
    return pc.unique(references.filter(pc.is_in(references["_ref"], value_set=refs))["companyid"])


# ------------------------------------------------------------------------------------------- DimCompany
def company_changes(cmp: pa.Table, status_type: pa.Table, industry: pa.Table) -> pa.Table:
    """One change record per CMP record: `companyid`, the DimCompany values, lineage (`_ts`, `_pdate`, `_batch`,
    file, line, `_rec`), `_sp_raw` (the rating as filed), `_reason`/`_detail` (why it cannot be loaded)."""
    st_id, industry_id, rating = cmp["status"], cmp["industry_id"], cmp["sp_rating"]
    valid = pc.fill_null(pc.is_in(rating, value_set=pa.array(VALID_SP_RATINGS, rating.type)), False)
    high = pc.or_(pc.starts_with(rating, "A"), pc.starts_with(rating, "BBB"))
    null_bool = pa.scalar(None, pa.bool_())
    rows = pa.table(
        {
            "companyid": pc.cast(cmp["cik"], pa.int64()),
            **lineage(cmp),
            "status": lookup(st_id, status_type, "st_id", "st_name"),
            "name": cmp["company_name"],
            "industry": lookup(industry_id, industry, "in_id", "in_name"),
            "sprating": pc.if_else(valid, rating, pa.scalar(None, rating.type)),
            "islowgrade": pc.if_else(valid, pc.invert(high), null_bool),
            "ceo": cmp["ceo_name"],
            "addressline1": cmp["addr_line1"],
            "addressline2": cmp["addr_line2"],
            "postalcode": cmp["postal_code"],
            "city": cmp["city"],
            "stateprov": cmp["state_province"],
            "country": cmp["country"],
            "description": cmp["description"],
            "foundingdate": cmp["founding_date"],
            "_sp_raw": rating,
        }
    )
    missing = missing_required(wh.DIM_COMPANY, rows, ("companyid", *COMPANY_VALUES))
    reason, detail = first_reason(
        rows.num_rows,
        (pc.is_null(rows["status"]), UNKNOWN_STATUS, join("ST_ID = ", pc.fill_null(st_id, ""))),
        (pc.is_null(rows["industry"]), UNKNOWN_INDUSTRY, join("IN_ID = ", pc.fill_null(industry_id, ""))),
        (pc.not_equal(missing, ""), MISSING_FIELD, join("FIELDS = ", missing)),
    )
    return rows.append_column("_reason", reason).append_column("_detail", detail)


def company_versions(changes: pa.Table) -> pa.Table:
    """DimCompany rows (every declared column) of the CIKs in `changes`, from their loadable records; plus
    `_sp_raw` and `_rec`, the rating as filed and the identity of the record that made each version."""
    loadable = changes.filter(pc.is_null(changes["_reason"]))
    versions = build_versions(loadable, "companyid", ORDER, [*COMPANY_VALUES, "_sp_raw", "_rec"])
    return versions.append_column("sk_companyid", surrogate_keys(versions["companyid"], versions["effectivedate"]))


def company_ident(companyid: pa.Array | pa.ChunkedArray) -> pa.Array:
    return join("CO_ID = ", companyid)


def company_alerts(changes: pa.Table, versions: pa.Table) -> pa.Table:
    """Alerts of DimCompany: records left out (`rejection_alerts`) and rows with an invalid S&P rating."""
    source = SOURCE_OF[wh.DIM_COMPANY.name]
    invalid = versions.filter(pc.is_null(versions["sprating"]))
    rating = alert_rows(
        column(invalid, "batchid"),
        source=source,
        text=INVALID_SP_RATING,
        data=join(
            company_ident(column(invalid, "companyid")), ", CO_SP_RATE = ", pc.fill_null(column(invalid, "_sp_raw"), "")
        ),
        key=column(invalid, "_rec"),
    )
    return pa.concat_tables([rejection_alerts(changes, source, company_ident(changes["companyid"])), rating])
