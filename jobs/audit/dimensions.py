"""The audit's checks of DimBroker, DimAccount, DimSecurity, DimCompany and Financial (the dimensions from HR.csv,
CustomerMgmt.xml and FINWIRE, DimCustomer aside: see `jobs.audit.customers`).

Each function is one table's part of the script, run by `jobs.audit.run_audit` in the script's order on an
`AuditRun` (`jobs.audit.state`); the SCD2 tables share their invariants (`jobs.audit.scd2`).
"""

from __future__ import annotations

from typing import Any

from jobs.audit.figures import Term
from jobs.audit.report import FAILED, OK, Check
from jobs.audit.scan import EOT, EXAMPLES, Join, Scan, compare, date_sql, format_sql, texts_sql
from jobs.audit.scd2 import ACCOUNTS, COMPANIES, SECURITIES, scd2_checks, scd2_scan
from jobs.audit.state import ROW_COUNT, AuditRun
from streamdi.warehouse import sql


# -- DimBroker
def broker(audit: AuditRun) -> None:
    scan = Scan(audit.db, "dimbroker", "v")
    brokers = audit.expected([Term(1, "DimBroker", "HR_BROKERS")])
    scan.check(
        "DimBroker row count",
        {"n": "count(*)"},
        lambda v: compare("DimBroker row count", v["n"], "==", brokers, "row count"),
    )
    scan.check(
        "DimBroker distinct keys",
        {"n": "count(DISTINCT v.sk_brokerid)"},
        lambda v: compare("DimBroker distinct keys", v["n"], "==", brokers, "distinct SK_BrokerID"),
    )
    example = "format('brokerid=%s %s..%s batch %s', v.brokerid, v.effectivedate, v.enddate, v.batchid)"
    scan.rule("DimBroker BatchID", "v.batchid <> 1", "with a BatchID other than 1", example, batch=1)
    scan.rule("DimBroker IsCurrent", "NOT v.iscurrent", "not current", example)
    first = audit.figures.day("FirstDay", 1)
    if first is None:
        scan.skip("DimBroker EffectiveDate", "no Batch FirstDay figure for batch 1")
    else:
        what = f"with an EffectiveDate other than Batch1's first day {first}"
        scan.rule("DimBroker EffectiveDate", sql.SQL("v.effectivedate <> {}").format(date_sql(first)), what, example)
    not_eot = sql.SQL("v.enddate <> {}").format(EOT)
    scan.rule("DimBroker EndDate", not_eot, "with an EndDate other than 9999-12-31", example)
    audit.add(*scan.run())


# -- DimAccount
def account(audit: AuditRun) -> None:
    t = ACCOUNTS
    scan = scd2_scan(
        audit,
        t,
        [
            Join(
                "cu",
                "dimcustomer",
                "LEFT JOIN dw.dimcustomer cu ON cu.sk_customerid = v.sk_customerid "
                "AND cu.effectivedate <= v.effectivedate AND v.enddate <= cu.enddate",
            ),
            Join(
                "br",
                "dimbroker",
                "LEFT JOIN dw.dimbroker br ON br.sk_brokerid = v.sk_brokerid "
                "AND br.effectivedate <= v.effectivedate AND v.enddate <= br.enddate",
            ),
        ],
    )
    customer_terms = [Term(1, "DimCustomer", a) for a in ("C_NEW", "C_UPDCUST", "C_INACT")]
    account_terms = [Term(1, "DimAccount", a) for a in ("CA_ADDACCT", "CA_CLOSEACCT", "CA_UPDACCT")]
    for b in audit.batches:
        if b == 1:
            op = ">"
            terms = [customer_terms[0], *account_terms, *customer_terms[1:]]
            terms += [Term(-1, "DimCustomer", "C_ID_HIST"), Term(-1, "DimAccount", "CA_ID_HIST")]
        else:
            op, terms = ">=", [*account_terms, Term(-1, "DimAccount", "CA_ID_HIST")]
        expected = audit.expected(terms, [b])
        scan.check(
            "DimAccount row count",
            {"n": sql.SQL("count(*) FILTER (WHERE v.batchid = {})").format(sql.Literal(b))},
            lambda v, b=b, op=op, expected=expected: compare(
                "DimAccount row count", v["n"], op, expected, f"rows of batch {b}", b
            ),
            batch=b,
        )
    scd2_checks(audit, scan, t, audit.batches)
    scan.rule(
        "DimAccount TaxStatus",
        "v.batchid = 1 AND v.taxstatus NOT IN (0, 1, 2)",
        "of batch 1 with a TaxStatus not in (0, 1, 2)",
        format_sql("accountid=%s taxstatus=%s", "v.accountid", audit.value("taxstatus")),
    )
    ident = "format('accountid=%s %s..%s', v.accountid, v.effectivedate, v.enddate)"
    audit.foreign_key(
        scan,
        "DimAccount SK_CustomerID",
        "cu",
        "sk_customerid",
        "without a DimCustomer version over their dates",
        ident,
    )
    audit.foreign_key(
        scan, "DimAccount SK_BrokerID", "br", "sk_brokerid", "without a DimBroker version over their dates", ident
    )
    # As written in the script: its WHERE keeps only inactive accounts, so no group has fewer than one row.
    inactive = (
        "(SELECT count(*) FROM (SELECT c.sk_customerid FROM dw.dimcustomer c "
        "LEFT JOIN dw.dimaccount a ON a.sk_customerid = c.sk_customerid "
        "WHERE c.status = 'Inactive' AND a.status = 'Inactive' GROUP BY c.sk_customerid "
        "HAVING count(*) < 1) z)"
    )
    scan.check(
        "DimAccount inactive customers",
        {"n": inactive},
        lambda v: (
            Check("DimAccount inactive customers", OK)
            if v["n"] == 0
            else Check("DimAccount inactive customers", FAILED, f"{v['n']} inactive customer version(s)")
        ),
        tables=["dimcustomer"],
    )
    audit.add(*scan.run())


# -- DimSecurity
def security(audit: AuditRun) -> None:
    t = SECURITIES
    scan = scd2_scan(
        audit,
        t,
        [
            Join(
                "co",
                "dimcompany",
                "LEFT JOIN dw.dimcompany co ON co.sk_companyid = v.sk_companyid AND "
                "co.effectivedate <= v.effectivedate AND v.enddate <= co.enddate",
            )
        ],
    )
    if 1 in audit.batches:  # the script checks batch 1 only
        audit.add(
            audit.message_vs_figures(
                "DimSecurity row count", "DimSecurity", ROW_COUNT, ">=", [Term(1, "DimSecurity", "FW_SEC")], 1, 1
            )
        )
    scd2_checks(audit, scan, t, [1])
    ident = "format('symbol=%s %s..%s', v.symbol, v.effectivedate, v.enddate)"
    audit.foreign_key(
        scan,
        "DimSecurity SK_CompanyID",
        "co",
        "sk_companyid",
        "without a DimCompany version over their dates",
        ident,
    )
    scan.rule(
        "DimSecurity ExchangeID",
        "v.exchangeid NOT IN ('NYSE', 'NASDAQ', 'AMEX', 'PCX')",
        "with an ExchangeID not in (NYSE, NASDAQ, AMEX, PCX)",
        format_sql("symbol=%s %s", "v.symbol", audit.value("exchangeid")),
    )
    scan.rule(
        "DimSecurity Issue",
        "v.issue NOT IN ('COMMON', 'PREF_A', 'PREF_B', 'PREF_C', 'PREF_D')",
        "with an Issue not in (COMMON, PREF_A..PREF_D)",
        format_sql("symbol=%s %s", "v.symbol", audit.value("issue")),
    )
    audit.add(*scan.run())


# -- DimCompany
def company(audit: AuditRun) -> None:
    t = COMPANIES
    scan = scd2_scan(
        audit,
        t,
        [
            Join(
                "ind",
                "industry",
                "LEFT JOIN (SELECT DISTINCT in_name FROM dw.industry) ind ON ind.in_name = v.industry",
            )
        ],
    )
    for b in audit.batches:
        audit.add(
            audit.message_vs_figures(
                "DimCompany row count", "DimCompany", ROW_COUNT, "<=", [Term(1, "DimCompany", "FW_CMP")], b, b
            )
        )
    scd2_checks(audit, scan, t, [1], is_current=False)
    names = sql.SQL("FROM dw.dimcompany a JOIN dw.dimcompany b ON a.name = b.name AND a.companyid <> b.companyid")

    def distinct_names(v: dict[str, Any]) -> Check:
        if v["pairs"] == 0:
            return Check("DimCompany distinct names", OK)
        shown = scan.db.strings(
            sql.SQL(
                "SELECT DISTINCT format('%s: companyid %s and %s', a.name, least(a.companyid, b.companyid), "
                "greatest(a.companyid, b.companyid)) {} ORDER BY 1 LIMIT {}"
            ).format(names, sql.Literal(EXAMPLES))
        )
        detail = f"{v['pairs']} pair(s) of rows of different companies share a name, e.g. {'; '.join(shown)}"
        return Check("DimCompany distinct names", FAILED, detail)

    pairs = sql.SQL("(SELECT count(*) {})").format(names)
    scan.check("DimCompany distinct names", {"pairs": pairs}, distinct_names)
    ident = sql.SQL("format('companyid=%s %s', v.companyid, {})")
    scan.rule(
        "DimCompany Industry",
        "ind.in_name IS NULL",
        "with an Industry that is no Industry's IN_NAME",
        ident.format(audit.value("industry")),
        joins=["ind"],
    )
    ratings = "AAA AA A BBB BB B CCC CC C D AA+ A+ BBB+ BB+ B+ CCC+ AA- A- BBB- BB- B- CCC-".split()
    scan.rule(
        "DimCompany SPrating",
        sql.SQL("v.sprating NOT IN ({}) AND v.sprating IS NOT NULL").format(texts_sql(ratings)),
        "with an SPRating that is no S&P rating",
        ident.format(sql.Identifier("v", "sprating")),
    )
    scan.rule(
        "DimCompany Country",
        "v.country NOT IN ('Canada', 'United States of America', '') AND v.country IS NOT NULL",
        "with a Country not in (Canada, United States of America, '')",
        ident.format(sql.Identifier("v", "country")),
    )
    audit.add(*scan.run())


# -- Financial
def financial(audit: AuditRun) -> None:
    scan = Scan(
        audit.db,
        "financial",
        "f",
        [Join("co", "dimcompany", "LEFT JOIN dw.dimcompany co ON co.sk_companyid = f.sk_companyid")],
    )
    if "dimessages" not in audit.db.tables:
        audit.add(Check("Financial row count", FAILED, "table dw.dimessages does not exist"))
    else:
        value, problem = audit.reported(1, "Financial", ROW_COUNT)
        terms = [Term(1, "Financial", "FW_FIN")]
        audit.add(
            Check("Financial row count", FAILED, problem)
            if value is None
            else compare("Financial row count", value, "==", audit.expected(terms), "'Row count' of batch 1")
        )
    ident = sql.SQL("format('sk_companyid=%s %s Q%s', f.sk_companyid, f.fi_year, f.fi_qtr)")
    scan.rule("Financial SK_CompanyID", "co.sk_companyid IS NULL", "without a DimCompany row", ident, joins=["co"])
    window = audit.figures.window(1)
    if window is None:
        scan.skip("Financial FI_YEAR", "no Batch FirstDay/LastDay figures for batch 1")
    else:
        first, last = window[0].year, window[1].year
        scan.rule(
            "Financial FI_YEAR",
            sql.SQL("f.fi_year < {} OR f.fi_year > {}").format(sql.Literal(first), sql.Literal(last)),
            f"with an FI_YEAR outside Batch1's years {first}-{last}",
            ident,
        )
    scan.rule("Financial FI_QTR", "f.fi_qtr NOT IN (1, 2, 3, 4)", "with an FI_QTR not in (1, 2, 3, 4)", ident)
    scan.rule(
        "Financial FI_QTR_START_DATE",
        "f.fi_year <> extract(year FROM f.fi_qtr_start_date) "
        "OR extract(month FROM f.fi_qtr_start_date) <> (f.fi_qtr - 1) * 3 + 1 "
        "OR extract(day FROM f.fi_qtr_start_date) <> 1",
        "whose FI_QTR_START_DATE is not the first day of their quarter",
        format_sql("%s starts %s", ident, "f.fi_qtr_start_date"),
    )

    def off(numerator: str, denominator: str, reported: str) -> sql.Composable:
        return sql.SQL("round({} / nullif({}, 0), 2) - {} NOT BETWEEN -0.4 AND 0.4").format(
            sql.Identifier("f", numerator), sql.Identifier("f", denominator), sql.Identifier("f", reported)
        )

    scan.rule(
        "Financial EPS",
        sql.SQL(" OR ").join(
            (
                off("fi_net_earn", "fi_out_basic", "fi_basic_eps"),
                off("fi_net_earn", "fi_out_dilut", "fi_dilut_eps"),
                off("fi_net_earn", "fi_revenue", "fi_margin"),
            )
        ),
        "whose EPS, diluted EPS or margin is more than 0.4 off the computed ratio",
        format_sql("%s eps %s dilut %s margin %s", ident, "f.fi_basic_eps", "f.fi_dilut_eps", "f.fi_margin"),
    )
    audit.add(*scan.run())
