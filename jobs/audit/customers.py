"""The audit's checks of DimCustomer and Prospect (the customers from CustomerMgmt.xml and Customer.txt, and the
prospects whose demographics they share).

Run by `jobs.audit.run_audit` in the script's order on an `AuditRun` (`jobs.audit.state`); DimCustomer's SCD2
invariants are shared with the other dimensions (`jobs.audit.scd2`).
"""

from __future__ import annotations

from itertools import product
from typing import Any

from jobs.audit.figures import Term
from jobs.audit.report import FAILED, NOT_CHECKED, OK, Check
from jobs.audit.scan import Fragment, Join, Scan, compare, date_sql, format_sql, rows_text, texts_sql
from jobs.audit.scd2 import CUSTOMERS, scd2_checks, scd2_scan
from jobs.audit.state import AuditRun
from streamdi.warehouse import sql

NAMEPLATE_TAGS = ("HighValue", "Expenses", "Boomer", "MoneyAlert", "Spender", "Inherited")
# Below this scale factor a data set cannot reach the distinct tax-rate counts the script asks for.
DISTINCT_RATES_MIN_SCALE_FACTOR = 3


# -- DimCustomer
def customer(audit: AuditRun) -> None:
    t = CUSTOMERS
    person = sql.SQL(
        "upper({a}.firstname || {a}.lastname || {a}.addressline1 || coalesce({a}.addressline2, '') || {a}.postalcode)"
    )
    scan = scd2_scan(
        audit,
        t,
        [
            Join(
                "lt",
                "taxrate",
                "LEFT JOIN (SELECT tx_name, tx_rate, count(*) AS n FROM dw.taxrate GROUP BY 1, 2) lt "
                "ON lt.tx_name = v.localtaxratedesc AND lt.tx_rate = v.localtaxrate",
            ),
            Join(
                "nt",
                "taxrate",
                "LEFT JOIN (SELECT tx_name, tx_rate, count(*) AS n FROM dw.taxrate GROUP BY 1, 2) nt "
                "ON nt.tx_name = v.nationaltaxratedesc AND nt.tx_rate = v.nationaltaxrate",
            ),
            Join(
                "pr",
                "prospect",
                sql.SQL(
                    "LEFT JOIN (SELECT {prospect} AS person, coalesce(p.creditrating, 0) AS cr, "
                    "coalesce(p.networth, 0) AS nw, coalesce(p.marketingnameplate, '') AS mn, count(*) AS n "
                    "FROM dw.prospect p GROUP BY 1, 2, 3, 4) pr ON v.iscurrent "
                    "AND pr.person = {customer} AND pr.cr = coalesce(v.creditrating, 0) "
                    "AND pr.nw = coalesce(v.networth, 0) AND pr.mn = coalesce(v.marketingnameplate, '')"
                ).format(prospect=person.format(a=sql.Identifier("p")), customer=person.format(a=sql.Identifier("v"))),
            ),
        ],
    )
    for b in audit.batches:
        terms = [Term(1, "DimCustomer", a) for a in ("C_NEW", "C_INACT", "C_UPDCUST")]
        expected = audit.expected([*terms, Term(-1, "DimCustomer", "C_ID_HIST")], [b])
        scan.check(
            "DimCustomer row count",
            {"n": sql.SQL("count(*) FILTER (WHERE v.batchid = {})").format(sql.Literal(b))},
            lambda v, b=b, expected=expected: compare(
                "DimCustomer row count", v["n"], ">=", expected, f"rows of batch {b}", b
            ),
            batch=b,
        )
    scd2_checks(audit, scan, t, audit.batches)
    ident = sql.SQL("format('customerid=%s %s', v.customerid, {})")
    scan.rule(
        "DimCustomer Gender",
        "v.gender NOT IN ('M', 'F', 'U')",
        "with a Gender not in (M, F, U)",
        ident.format(audit.value("gender")),
    )
    scan.rule(
        "DimCustomer TaxID",
        "v.taxid NOT LIKE '___-__-____'",
        "with a TaxID not like ___-__-____",
        ident.format(audit.value("taxid")),
    )
    for phone in ("phone1", "phone2", "phone3"):
        column = sql.Identifier("v", phone)
        bad = sql.SQL(
            "{phone} NOT LIKE '+1 (___) ___-____%' AND {phone} NOT LIKE '(___) ___-____%' "
            "AND {phone} NOT LIKE '___-____%' AND {phone} <> '' AND {phone} IS NOT NULL"
        ).format(phone=column)
        scan.rule(
            f"DimCustomer {phone.capitalize()}",
            bad,
            f"with a badly formatted {phone.capitalize()}",
            ident.format(column),
        )
    scan.rule(
        "DimCustomer Email1",
        "v.email1 NOT LIKE '_%.%@%.%' AND v.email1 IS NOT NULL",
        "with an Email1 not like _%.%@%.%",
        ident.format(sql.Identifier("v", "email1")),
    )
    scan.rule(
        "DimCustomer Email2",
        "v.email2 NOT LIKE '_%.%@%.%' AND v.email2 <> '' AND v.email2 IS NOT NULL",
        "with an Email2 not like _%.%@%.%",
        ident.format(sql.Identifier("v", "email2")),
    )
    tax_rate_check(audit, scan, "DimCustomer LocalTaxRate", "lt", "localtaxrate", ">", 300)
    tax_rate_check(audit, scan, "DimCustomer NationalTaxRate", "nt", "nationaltaxrate", ">=", 9)

    def demographics(v: dict[str, Any]) -> Check:
        name = "DimCustomer demographic fields"
        if v["matched"] == v["agency"]:
            return Check(name, OK)
        bad = "v.iscurrent AND (v.agencyid IS NOT NULL) <> (coalesce(pr.n, 0) = 1)"
        shown = scan.examples(
            "format('customerid=%s agencyid=%s with %s matching prospect(s)', v.customerid, "
            "coalesce(v.agencyid, 'NULL'), coalesce(pr.n, 0))",
            bad,
            ["pr"],
        )
        detail = (
            f"{v['matched']} current version(s) match a Prospect with the same CreditRating, NetWorth and "
            f"MarketingNameplate, but {v['agency']} current version(s) have an AgencyID, e.g. {'; '.join(shown)}"
        )
        return Check(name, FAILED, detail)

    scan.check(
        "DimCustomer demographic fields",
        {
            "matched": "coalesce(sum(pr.n), 0)",
            "agency": "count(*) FILTER (WHERE v.agencyid IS NOT NULL AND v.iscurrent)",
        },
        demographics,
        joins=["pr"],
    )
    audit.add(*scan.run())
    # the checks that compare DImessages with the figures
    inactive = [Term(1, "DimCustomer", "C_INACT")]
    for b in audit.batches:
        audit.add(
            audit.message_vs_figures(
                "DimCustomer inactive customers", "DimCustomer", "Inactive customers", "==", inactive, b, b
            )
        )
    dob = [Term(1, "DimCustomer", "C_DOB_TO"), Term(1, "DimCustomer", "C_DOB_TY")]
    audit.alerts_vs_figure("DimCustomer age range alerts", "DOB out of range", dob, per_batch=True)
    tier = [Term(1, "DimCustomer", "C_TIER_INV")]
    audit.alerts_vs_figure("DimCustomer customer tier alerts", "Invalid customer tier", tier, per_batch=True)


def tax_rate_check(audit: AuditRun, scan: Scan, name: str, alias: str, column: str, op: str, distinct: int) -> None:
    """The official tax-rate check: every row joins TaxRate on (desc, rate), and enough distinct descs exist
    (a scale-dependent part, see the module docstring)."""
    desc = f"{column}desc"

    def judge(v: dict[str, Any]) -> Check:
        joined, rows, found = v["joined"], v["rows"], v["distinct"]
        enough = found > distinct if op == ">" else found >= distinct
        if joined == rows and enough:
            return Check(name, OK)
        parts = []
        if joined != rows:
            shown = scan.examples(
                format_sql(
                    "customerid=%s %s %s",
                    "v.customerid",
                    sql.SQL("coalesce({}, 'NULL')").format(sql.Identifier("v", desc)),
                    audit.value(column),
                ),
                sql.SQL("{} IS DISTINCT FROM 1").format(sql.Identifier(alias, "n")),
                [alias],
            )
            parts.append(
                f"{joined} TaxRate rows join {rows_text(rows)} on ({desc}, {column}) (must be equal), "
                f"e.g. {'; '.join(shown)}"
            )
        if not enough:
            parts.append(f"{found} distinct {desc}, the script asks for {op} {distinct}")
        sf = audit.figures.scale_factor
        if joined == rows and sf is not None and sf < DISTINCT_RATES_MIN_SCALE_FACTOR:
            detail = (
                f"the join holds; the distinct-count part failed: {parts[0]}, which a data set of scale factor "
                f"{sf:g} is too small to reach (checked from scale factor {DISTINCT_RATES_MIN_SCALE_FACTOR})"
            )
            return Check(name, NOT_CHECKED, detail)
        if joined == rows and sf is None:
            parts[-1] += " (scale factor unknown: no Generator SF figure)"
        return Check(name, FAILED, "; ".join(parts))

    aggregates: dict[str, Fragment] = {
        "joined": sql.SQL("coalesce(sum({}), 0)").format(sql.Identifier(alias, "n")),
        "rows": "count(*)",
        "distinct": sql.SQL("count(DISTINCT {})").format(sql.Identifier("v", desc)),
    }
    scan.check(name, aggregates, judge, joins=[alias])


# -- Prospect
def prospect(audit: AuditRun) -> None:
    scan = Scan(
        audit.db,
        "prospect",
        "p",
        [Join("rd", "dimdate", "LEFT JOIN dw.dimdate rd ON rd.sk_dateid = p.sk_recorddateid")],
    )
    scan.rule(
        "Prospect SK_UpdateDateID",
        "p.sk_recorddateid < p.sk_updatedateid",
        "with an SK_RecordDateID before their SK_UpdateDateID",
        "format('agencyid=%s record %s update %s', p.agencyid, p.sk_recorddateid, p.sk_updatedateid)",
    )
    for b in audit.batches:
        window = audit.figures.window(b)
        if window is None:
            scan.skip("Prospect SK_RecordDateID", f"no Batch FirstDay/LastDay figures for batch {b}", b)
            continue
        scan.rule(
            "Prospect SK_RecordDateID",
            sql.SQL("p.batchid = {} AND rd.datevalue < {}").format(sql.Literal(b), date_sql(window[0])),
            f"of batch {b} recorded before the batch's first day {window[0]}",
            "format('agencyid=%s recorded %s', p.agencyid, rd.datevalue)",
            b,
            ["rd"],
        )
    audit.batches_check(scan, "Prospect batches", audit.batches)
    scan.rule(
        "Prospect Country",
        "p.country NOT IN ('Canada', 'United States of America') AND p.country IS NOT NULL",
        "with a Country not in (Canada, United States of America)",
        format_sql("agencyid=%s %s", "p.agencyid", audit.value("country", "p")),
    )
    plate = sql.Identifier("p", "marketingnameplate")
    tag_rules = [
        ("HighValue", "(coalesce(p.networth, 0) > 1000000 OR coalesce(p.income, 0) > 200000)"),
        ("Expenses", "(coalesce(p.numberchildren, 0) > 3 OR coalesce(p.numbercreditcards, 0) > 5)"),
        ("Boomer", "coalesce(p.age, 0) > 45"),
        (
            "MoneyAlert",
            "(coalesce(p.income, 50000) < 50000 OR coalesce(p.creditrating, 600) < 600 "
            "OR coalesce(p.networth, 100000) < 100000)",
        ),
        ("Spender", "(coalesce(p.numbercars, 0) > 3 OR coalesce(p.numbercreditcards, 0) > 7)"),
        ("Inherited", "(coalesce(p.age, 25) < 25 AND coalesce(p.networth, 0) > 1000000)"),
    ]
    conditions = {
        f"without {tag}": sql.SQL("{} AND {} NOT LIKE {}").format(sql.SQL(when), plate, sql.Literal(f"%{tag}%"))
        for tag, when in tag_rules
    }
    conditions["not a combination of the tags"] = sql.SQL("coalesce({}, '') NOT IN ({})").format(
        plate, texts_sql(nameplates())
    )
    aggregates: dict[str, Fragment] = {
        f"r{i}": sql.SQL("count(*) FILTER (WHERE {})").format(c) for i, c in enumerate(conditions.values())
    }
    aggregates["rows"] = "count(*)"

    def nameplate(v: dict[str, Any]) -> Check:
        name = "Prospect MarketingNameplate"
        if v["rows"] == 0:
            return Check(name, FAILED, "Prospect is empty (the script's sum over no rows is NULL, which fails)")
        counts = [v[f"r{i}"] for i in range(len(conditions))]
        if not any(counts):
            return Check(name, OK)
        parts = []
        for (what, condition), n in zip(conditions.items(), counts, strict=True):
            if n:
                shown = scan.examples(
                    format_sql(
                        "agencyid=%s %s", "p.agencyid", sql.SQL("coalesce(quote_literal({}), 'NULL')").format(plate)
                    ),
                    condition,
                )
                parts.append(f"{rows_text(n)} {what} (e.g. {'; '.join(shown)})")
        return Check(name, FAILED, f"{sum(counts)} violation(s): {', '.join(parts)}")

    scan.check("Prospect MarketingNameplate", aggregates, nameplate)
    audit.add(*scan.run())


def nameplates() -> list[str]:
    """Every MarketingNameplate the script accepts: '' and each '+'-joined combination of the tags, in tag
    order."""
    return ["+".join(t for t, on in zip(NAMEPLATE_TAGS, mask, strict=True) if on) for mask in product((0, 1), repeat=6)]
