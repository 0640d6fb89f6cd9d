"""The audit's checks of the fact tables FactWatches, FactMarketHistory, FactHoldings and FactCashBalances.

Run by `jobs.audit.run_audit` in the script's order on an `AuditRun` (`jobs.audit.state`).
"""

from __future__ import annotations

import datetime as dt

from jobs.audit.figures import Term
from jobs.audit.report import FAILED, Check
from jobs.audit.scan import Join, Scan, compare, date_sql, version_join
from jobs.audit.state import ROW_COUNT, AuditRun, official_sk
from streamdi.warehouse import sql


# -- FactWatches
def watches(audit: AuditRun) -> None:
    placed = sql.Identifier("dp", "datevalue")
    scan = Scan(
        audit.db,
        "factwatches",
        "w",
        [
            Join("dp", "dimdate", "LEFT JOIN dw.dimdate dp ON dp.sk_dateid = w.sk_dateid_dateplaced"),
            Join("dr", "dimdate", "LEFT JOIN dw.dimdate dr ON dr.sk_dateid = w.sk_dateid_dateremoved"),
            Join("cu", "dimcustomer", version_join("dimcustomer", "cu", "sk_customerid", "w", placed), ("dp",)),
            Join("se", "dimsecurity", version_join("dimsecurity", "se", "sk_securityid", "w", placed), ("dp",)),
        ],
    )
    audit.message_increase_vs_figure("FactWatches row count", "FactWatches", "WH_ACTIVE")
    audit.batches_check(scan, "FactWatches batches", audit.batches)
    for b in audit.batches:
        if "dimessages" not in audit.db.tables:
            audit.add(Check("FactWatches active watches", FAILED, "table dw.dimessages does not exist", b))
            continue
        active, p1 = audit.reported(b, "FactWatches", ROW_COUNT)
        inactive, p2 = audit.reported(b, "FactWatches", "Inactive watches")
        if active is None or inactive is None:
            audit.add(Check("FactWatches active watches", FAILED, p1 or p2, b))
            continue
        expected = audit.expected([Term(1, "FactWatches", "WH_RECORDS")], audit.upto(b))
        what = f"'Row count' + 'Inactive watches' of batch {b} ({active} + {inactive})"
        audit.add(compare("FactWatches active watches", active + inactive, "==", expected, what, b))
    ident = "format('sk_customerid=%s sk_securityid=%s placed %s', w.sk_customerid, w.sk_securityid, dp.datevalue)"
    audit.foreign_key(
        scan,
        "FactWatches SK_CustomerID",
        "cu",
        "sk_customerid",
        "without a DimCustomer version valid on the day placed",
        ident,
    )
    audit.foreign_key(
        scan,
        "FactWatches SK_SecurityID",
        "se",
        "sk_securityid",
        "without a DimSecurity version valid on the day placed",
        ident,
    )
    audit.window_rules(
        scan,
        "FactWatches date check",
        lambda b, first, last: sql.SQL(
            "w.batchid = {b} AND ((w.sk_dateid_dateremoved IS NULL AND (dp.datevalue > {last} "
            "OR dp.datevalue < {first})) OR (w.sk_dateid_dateremoved IS NOT NULL AND "
            "(dr.datevalue > {last} OR dr.datevalue < {first} "
            "OR w.sk_dateid_dateplaced > w.sk_dateid_dateremoved)))"
        ).format(b=sql.Literal(b), first=date_sql(first), last=date_sql(last)),
        "of the batch placed (removed, for removed watches) outside {window}, or removed before placed",
        "format('sk_customerid=%s sk_securityid=%s placed %s removed %s', w.sk_customerid, w.sk_securityid, "
        "dp.datevalue, coalesce(dr.datevalue::text, '-'))",
        ["dp", "dr"],
    )
    audit.add(*scan.run())


# -- FactMarketHistory
def market_history(audit: AuditRun) -> None:
    day = sql.Identifier("d", "datevalue")
    scan = Scan(
        audit.db,
        "factmarkethistory",
        "m",
        [
            Join("d", "dimdate", "LEFT JOIN dw.dimdate d ON d.sk_dateid = m.sk_dateid"),
            *(
                Join(alias, table, version_join(table, alias, sk, "m", day), ("d",))
                for alias, table, sk in (
                    ("co", "dimcompany", "sk_companyid"),
                    ("se", "dimsecurity", "sk_securityid"),
                )
            ),
        ],
    )
    audit.message_increase_vs_figure("FactMarketHistory row count", "FactMarketHistory", "DM_RECORDS")
    audit.batches_check(scan, "FactMarketHistory batches", audit.batches)
    ident = "format('sk_securityid=%s on %s', m.sk_securityid, d.datevalue)"
    audit.foreign_key(
        scan,
        "FactMarketHistory SK_CompanyID",
        "co",
        "sk_companyid",
        "without a DimCompany version valid on the day",
        ident,
    )
    audit.foreign_key(
        scan,
        "FactMarketHistory SK_SecurityID",
        "se",
        "sk_securityid",
        "without a DimSecurity version valid on the day",
        ident,
    )
    for b in audit.batches:
        window = audit.figures.window(b)
        if window is None:
            scan.skip("FactMarketHistory SK_DateID", f"no Batch FirstDay/LastDay figures for batch {b}", b)
            continue
        low, high = window[0] - dt.timedelta(days=1), window[1]
        scan.rule(
            "FactMarketHistory SK_DateID",
            sql.SQL("m.batchid = {} AND (d.datevalue < {} OR d.datevalue >= {})").format(
                sql.Literal(b), date_sql(low), date_sql(high)
            ),
            f"of batch {b} dated outside [{low}, {high}) (the script's window: FirstDay - 1 day to LastDay)",
            ident,
            b,
            ["d"],
        )
    scan.rule(
        "FactMarketHistory relative dates",
        "m.fiftytwoweeklow > m.daylow OR m.daylow > m.closeprice OR m.closeprice > m.dayhigh "
        "OR m.dayhigh > m.fiftytwoweekhigh",
        "not ordered 52-week low <= day low <= close <= day high <= 52-week high",
        "format('sk_securityid=%s sk_dateid=%s: %s <= %s <= %s <= %s <= %s', m.sk_securityid, m.sk_dateid, "
        "m.fiftytwoweeklow, m.daylow, m.closeprice, m.dayhigh, m.fiftytwoweekhigh)",
    )
    audit.add(*scan.run())


# -- FactHoldings
def holdings(audit: AuditRun) -> None:
    day = sql.Identifier("d", "datevalue")
    dimensions = [
        ("cu", "dimcustomer", "sk_customerid", "DimCustomer"),
        ("ac", "dimaccount", "sk_accountid", "DimAccount"),
        ("co", "dimcompany", "sk_companyid", "DimCompany"),
        ("se", "dimsecurity", "sk_securityid", "DimSecurity"),
    ]
    joins = [Join("d", "dimdate", "LEFT JOIN dw.dimdate d ON d.sk_dateid = h.sk_dateid")]
    for alias, table, sk, _ in dimensions:
        # The script only asks the version to be effective by the holding's day: the dimension may have
        # changed between the trade's creation and its completion.
        clause = version_join(table, alias, sk, "h", day, valid_until=False)
        joins.append(Join(alias, table, clause, ("d",)))
    joins.append(
        Join(
            "tr",
            "dimtrade",
            "LEFT JOIN dw.dimtrade tr ON tr.tradeid = h.currenttradeid AND h.sk_dateid = tr.sk_closedateid "
            "AND h.sk_timeid = tr.sk_closetimeid",
        )
    )
    scan = Scan(audit.db, "factholdings", "h", joins)
    audit.message_increase_vs_figure("FactHoldings row count", "FactHoldings", "HH_RECORDS")
    audit.batches_check(scan, "FactHoldings batches", audit.batches)
    ident = "format('currenttradeid=%s on %s', h.currenttradeid, d.datevalue)"
    for alias, _, sk, label in dimensions:
        audit.foreign_key(
            scan,
            f"FactHoldings {official_sk(sk)}",
            alias,
            sk,
            f"without a {label} version effective by the day",
            ident,
        )
    scan.rule(
        "FactHoldings CurrentTradeID",
        "tr.tradeid IS NULL",
        "whose CurrentTradeID is no DimTrade row closed on their SK_DateID and SK_TimeID",
        "format('currenttradeid=%s sk_dateid=%s sk_timeid=%s', h.currenttradeid, h.sk_dateid, h.sk_timeid)",
        joins=["tr"],
    )
    audit.window_rules(
        scan,
        "FactHoldings SK_DateID",
        lambda b, first, last: sql.SQL("h.batchid = {} AND (d.datevalue < {} OR d.datevalue > {})").format(
            sql.Literal(b), date_sql(first), date_sql(last)
        ),
        "of the batch dated outside {window}",
        ident,
        ["d"],
    )
    audit.add(*scan.run())


# -- FactCashBalances
def cash_balances(audit: AuditRun) -> None:
    day = sql.Identifier("d", "datevalue")
    joins = [Join("d", "dimdate", "LEFT JOIN dw.dimdate d ON d.sk_dateid = f.sk_dateid")]
    dimensions = [
        ("cu", "dimcustomer", "sk_customerid", "DimCustomer"),
        ("ac", "dimaccount", "sk_accountid", "DimAccount"),
    ]
    for alias, table, sk, _ in dimensions:
        joins.append(Join(alias, table, version_join(table, alias, sk, "f", day), ("d",)))
    scan = Scan(audit.db, "factcashbalances", "f", joins)
    audit.batches_check(scan, "FactCashBalances batches", audit.batches)
    ident = "format('sk_customerid=%s on %s', f.sk_customerid, d.datevalue)"
    for alias, _, sk, label in dimensions:
        audit.foreign_key(
            scan,
            f"FactCashBalances {official_sk(sk)}",
            alias,
            sk,
            f"without a {label} version valid on the day",
            ident,
        )
    audit.window_rules(
        scan,
        "FactCashBalances SK_DateID",
        lambda b, first, last: sql.SQL("f.batchid = {} AND (d.datevalue < {} OR d.datevalue > {})").format(
            sql.Literal(b), date_sql(first), date_sql(last)
        ),
        "of the batch dated outside {window}",
        ident,
        ["d"],
    )
    audit.add(*scan.run())
