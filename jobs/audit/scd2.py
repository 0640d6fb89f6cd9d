"""The SCD2 invariants the script checks on DimAccount, DimCustomer, DimSecurity and DimCompany: distinct keys,
EndDate, Overlap, End of Time, consolidation, batches, IsCurrent, EffectiveDate, Status.

Used by the dimension checks (`jobs.audit.dimensions`, `jobs.audit.customers`): `scd2_scan` opens the scan of one
SCD2 table (with the self-join the EndDate check needs), `scd2_checks` registers the shared checks on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobs.audit.report import FAILED, OK, Check
from jobs.audit.scan import EOT, EXAMPLES, Fragment, Join, Scan, date_sql, format_sql, rows_text
from jobs.audit.state import AuditRun
from streamdi.warehouse import sql


@dataclass(frozen=True)
class Scd2:
    """An SCD2 table: `label` (the spec's name), PostgreSQL table, natural key and surrogate key."""

    label: str
    table: str
    natural: str
    sk: str


ACCOUNTS = Scd2("DimAccount", "dimaccount", "accountid", "sk_accountid")
CUSTOMERS = Scd2("DimCustomer", "dimcustomer", "customerid", "sk_customerid")
SECURITIES = Scd2("DimSecurity", "dimsecurity", "symbol", "sk_securityid")
COMPANIES = Scd2("DimCompany", "dimcompany", "companyid", "sk_companyid")


# -- the SCD2 invariants shared by DimAccount, DimCustomer, DimSecurity, DimCompany
def scd2_scan(audit: AuditRun, t: Scd2, joins: Sequence[Join] = ()) -> Scan:
    chain = Join(
        "nx",
        t.table,
        sql.SQL(
            "LEFT JOIN (SELECT {natural} AS nk, effectivedate AS eff, count(*) AS n FROM {table} "
            "GROUP BY 1, 2) nx ON nx.nk = {version_natural} AND nx.eff = v.enddate"
        ).format(
            natural=sql.Identifier(t.natural),
            table=sql.Identifier("dw", t.table),
            version_natural=sql.Identifier("v", t.natural),
        ),
    )
    return Scan(audit.db, t.table, "v", [chain, *joins])


def version_example(t: Scd2) -> sql.Composable:
    return format_sql(f"{t.natural}=%s %s..%s", sql.Identifier("v", t.natural), "v.effectivedate", "v.enddate")


def scd2_checks(audit: AuditRun, scan: Scan, t: Scd2, batches: Sequence[int], is_current: bool = True) -> None:
    """distinct keys, EndDate, Overlap, End of Time, consolidation, batches, IsCurrent, EffectiveDate."""
    label, example = t.label, version_example(t)
    table, natural, sk = sql.Identifier("dw", t.table), sql.Identifier(t.natural), sql.Identifier(t.sk)
    version_natural = sql.Identifier("v", t.natural)
    ends_eot = sql.SQL("count(*) FILTER (WHERE v.enddate = {})").format(EOT)

    def distinct(v: dict[str, Any]) -> Check:
        if v["keys"] == v["rows"]:
            return Check(f"{label} distinct keys", OK)
        dupes = scan.db.strings(
            sql.SQL("SELECT {} FROM {} GROUP BY 1 HAVING count(*) > 1 ORDER BY 1 LIMIT {}").format(
                sk, table, sql.Literal(EXAMPLES)
            )
        )
        detail = f"{v['keys']} distinct {t.sk} for {rows_text(v['rows'])}, e.g. {t.sk}={', '.join(dupes)}"
        return Check(f"{label} distinct keys", FAILED, detail)

    keys = sql.SQL("count(DISTINCT {})").format(sql.Identifier("v", t.sk))
    scan.check(f"{label} distinct keys", {"keys": keys, "rows": "count(*)"}, distinct)

    def end_date(v: dict[str, Any]) -> Check:
        if v["rows"] == v["chained"] + v["eot"]:
            return Check(f"{label} EndDate", OK)
        bad = sql.SQL("coalesce(nx.n, 0) + (v.enddate = {})::int <> 1").format(EOT)
        detail = (
            f"{rows_text(v['rows'])}, but {v['chained']} end on another version's EffectiveDate and {v['eot']} on "
            f"9999-12-31 (they must add up), e.g. {'; '.join(scan.examples(example, bad, ['nx']))}"
        )
        return Check(f"{label} EndDate", FAILED, detail)

    aggregates: dict[str, Fragment] = {"rows": "count(*)", "chained": "coalesce(sum(nx.n), 0)", "eot": ends_eot}
    scan.check(f"{label} EndDate", aggregates, end_date, joins=["nx"])

    pairs = sql.SQL(
        "FROM {table} a JOIN {table} b ON {a_natural} = {b_natural} AND {a_sk} <> {b_sk} "
        "AND a.effectivedate >= b.effectivedate AND a.effectivedate < b.enddate"
    ).format(
        table=table,
        a_natural=sql.Identifier("a", t.natural),
        b_natural=sql.Identifier("b", t.natural),
        a_sk=sql.Identifier("a", t.sk),
        b_sk=sql.Identifier("b", t.sk),
    )

    def overlap(v: dict[str, Any]) -> Check:
        if v["pairs"] == 0:
            return Check(f"{label} Overlap", OK)
        pair = format_sql(
            f"{t.natural}=%s: %s..%s starts inside %s..%s",
            sql.Identifier("a", t.natural),
            "a.effectivedate",
            "a.enddate",
            "b.effectivedate",
            "b.enddate",
        )
        shown = scan.db.strings(
            sql.SQL("SELECT DISTINCT {} {} ORDER BY 1 LIMIT {}").format(pair, pairs, sql.Literal(EXAMPLES))
        )
        detail = f"{v['pairs']} pair(s) of versions of one {t.natural} overlap, e.g. {'; '.join(shown)}"
        return Check(f"{label} Overlap", FAILED, detail)

    scan.check(f"{label} Overlap", {"pairs": sql.SQL("(SELECT count(*) {})").format(pairs)}, overlap)

    def end_of_time(v: dict[str, Any]) -> Check:
        if v["keys"] == v["eot"]:
            return Check(f"{label} End of Time", OK)
        open_versions = sql.SQL("count(*) FILTER (WHERE enddate = {})").format(EOT)
        shown = scan.db.strings(
            sql.SQL("SELECT {} FROM {} GROUP BY {} HAVING {} <> 1 ORDER BY {} LIMIT {}").format(
                format_sql(f"{t.natural}=%s (%s)", natural, open_versions),
                table,
                natural,
                open_versions,
                natural,
                sql.Literal(EXAMPLES),
            )
        )
        detail = (
            f"{v['keys']} distinct {t.natural} but {v['eot']} versions end on 9999-12-31, e.g. (versions "
            f"open to the end of time) {'; '.join(shown)}"
        )
        return Check(f"{label} End of Time", FAILED, detail)

    aggregates = {"keys": sql.SQL("count(DISTINCT {})").format(version_natural), "eot": ends_eot}
    scan.check(f"{label} End of Time", aggregates, end_of_time)
    scan.rule(f"{label} consolidation", "v.effectivedate = v.enddate", "starting and ending on the same day", example)
    audit.batches_check(scan, f"{label} batches", batches)
    if is_current:
        scan.rule(
            f"{label} IsCurrent",
            sql.SQL(
                "NOT coalesce((v.enddate = {eot} AND v.iscurrent) OR (v.enddate < {eot} AND NOT v.iscurrent), false)"
            ).format(eot=EOT),
            "whose IsCurrent disagrees with an EndDate of 9999-12-31",
            format_sql(
                f"{t.natural}=%s %s..%s iscurrent=%s",
                version_natural,
                "v.effectivedate",
                "v.enddate",
                "v.iscurrent::text",
            ),
        )
    audit.window_rules(
        scan,
        f"{label} EffectiveDate",
        lambda b, first, last: sql.SQL("v.batchid = {} AND (v.effectivedate < {} OR v.effectivedate > {})").format(
            sql.Literal(b), date_sql(first), date_sql(last)
        ),
        "of the batch with an EffectiveDate outside {window}",
        example,
    )
    scan.rule(
        f"{label} Status",
        "v.status NOT IN ('Active', 'Inactive')",
        "with a Status not in (Active, Inactive)",
        format_sql(f"{t.natural}=%s %s", version_natural, audit.value("status")),
    )
