"""Financial (part of step T1, CreateSecurities): one row per company and quarter from the staged FIN records.

Pure Arrow transforms in the driver (tables in, tables out); the T1 step (`jobs.create_securities`) reads, chooses
the companies to rebuild and commits. A record's company is resolved through `jobs.companies`; record order and
rejection rules are in `jobs.finwire_records`.

**Financial**: one row per FIN record, `sk_companyid` = the company version valid on the PTS date; when a
(CIK, year, quarter) repeats, the last record in declared order wins (the table key is
`sk_companyid, fi_year, fi_qtr`, so a company may not have two rows for a quarter).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from jobs.arrow_ops import ROW, same_as_next, sort, with_row_numbers
from jobs.companies import company_reference, resolve_company, unknown_company_detail
from jobs.fields import join
from jobs.finwire_records import (
    MISSING_FIELD,
    ORDER,
    SOURCE_OF,
    UNKNOWN_COMPANY,
    first_reason,
    lineage,
    missing_required,
    rejection_alerts,
)
from schemas import warehouse as wh

FINANCIAL_VALUES = tuple(c for c in wh.FINANCIAL.column_names if c != "sk_companyid")

# FIN record field -> Financial column
_FIELDS = {
    "year": "fi_year",
    "quarter": "fi_qtr",
    "qtr_start_date": "fi_qtr_start_date",
    "revenue": "fi_revenue",
    "earnings": "fi_net_earn",
    "eps": "fi_basic_eps",
    "diluted_eps": "fi_dilut_eps",
    "margin": "fi_margin",
    "inventory": "fi_inventory",
    "assets": "fi_assets",
    "liabilities": "fi_liability",
    "sh_out": "fi_out_basic",
    "diluted_sh_out": "fi_out_dilut",
}

# The staged FIN columns `financial_records` reads (not the record type or the posting date)
STAGED_COLUMNS = (
    *("pts", "source_batch", "source_file", "line_no", "batch_id", "co_name_or_cik", "cik", "company_name"),
    *_FIELDS,
)


def financial_records(fin: pa.Table, references: pa.Table) -> pa.Table:
    """One record per FIN record: the Financial values, `_companyid`/`sk_companyid` of the company version
    valid on the PTS date, lineage, `_ref`, `_reason`/`_detail`."""
    rows = pa.table(
        {
            **lineage(fin),
            "co_name_or_cik": fin["co_name_or_cik"],
            "_ref": fin["_ref"] if "_ref" in fin.column_names else company_reference(fin["cik"], fin["company_name"]),
            **{column: fin[field] for field, column in _FIELDS.items()},
        }
    )
    companyid, sk = resolve_company(rows, references)
    rows = rows.append_column("_companyid", companyid).append_column("sk_companyid", sk)
    missing = missing_required(wh.FINANCIAL, rows, FINANCIAL_VALUES)
    reason, detail = first_reason(
        rows.num_rows,
        (pc.not_equal(missing, ""), MISSING_FIELD, lambda at: join("FIELDS = ", missing.take(at))),
        (pc.is_null(companyid), UNKNOWN_COMPANY, lambda at: unknown_company_detail(rows.take(at))),
    )
    return rows.append_column("_reason", reason).append_column("_detail", detail)


_GROUP = ("_companyid", "fi_year", "fi_qtr")


def loadable_records(records: pa.Table) -> pa.Table:
    """The records (`financial_records`) that can be loaded, with only what `financial_rows` takes of them: a first
    load's pieces of records are reduced to this before the next piece is built."""
    return records.filter(pc.is_null(records["_reason"])).select(
        list(dict.fromkeys([*wh.FINANCIAL.column_names, *_GROUP, *ORDER]))
    )


def financial_rows(loadable: pa.Table) -> pa.Table:
    """Financial rows of the loadable records (`loadable_records`): per (CIK, year, quarter) the last record in
    declared order, in the order of that key."""
    group = list(_GROUP)
    # ranked by the key columns alone; only the rows kept are taken, and only Financial's columns of them
    ranked = sort(with_row_numbers(loadable.select([*group, *ORDER])), [*group, *ORDER])
    kept = ranked[ROW].filter(pa.array(~same_as_next(ranked, group), pa.bool_()))
    return loadable.select(list(wh.FINANCIAL.column_names)).take(kept)


def financial_alerts(records: pa.Table) -> pa.Table:
    ident = join("FI_YEAR = ", records["fi_year"], ", FI_QTR = ", records["fi_qtr"])
    return rejection_alerts(records, SOURCE_OF[wh.FINANCIAL.name], ident)
