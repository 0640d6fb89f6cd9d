"""The audit's checks of DimTrade (the trades from Trade.txt and TradeHistory.txt).

Run by `jobs.audit.run_audit` in the script's order on an `AuditRun` (`jobs.audit.state`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from jobs.audit.figures import Term
from jobs.audit.report import FAILED, OK, Check
from jobs.audit.scan import Join, Scan, compare, date_sql, rows_text, texts_sql, version_join
from jobs.audit.state import ROW_COUNT, AuditRun, official_sk
from streamdi.warehouse import sql


# -- DimTrade
def trade(audit: AuditRun) -> None:
    created = sql.Identifier("cd", "datevalue")
    joins = [
        Join("cd", "dimdate", "LEFT JOIN dw.dimdate cd ON cd.sk_dateid = t.sk_createdateid"),
        Join("xd", "dimdate", "LEFT JOIN dw.dimdate xd ON xd.sk_dateid = t.sk_closedateid"),
    ]
    dimensions = [
        ("br", "dimbroker", "sk_brokerid", "DimBroker"),
        ("co", "dimcompany", "sk_companyid", "DimCompany"),
        ("se", "dimsecurity", "sk_securityid", "DimSecurity"),
        ("cu", "dimcustomer", "sk_customerid", "DimCustomer"),
        ("ac", "dimaccount", "sk_accountid", "DimAccount"),
    ]
    for alias, table, sk, _ in dimensions:
        joins.append(Join(alias, table, version_join(table, alias, sk, "t", created), ("cd",)))
    scan = Scan(audit.db, "dimtrade", "t", joins)
    for b in audit.batches:
        audit.add(
            audit.message_vs_figures(
                "DimTrade row count", "DimTrade", ROW_COUNT, "==", [Term(1, "DimTrade", "T_NEW")], b, b
            )
        )
    canceled = audit.expected([Term(1, "DimTrade", "T_CanceledTrades")])
    scan.check(
        "DimTrade canceled trades",
        {"n": "count(*) FILTER (WHERE t.status = 'Canceled')"},
        lambda v: compare("DimTrade canceled trades", v["n"], "==", canceled, "Canceled trades"),
    )
    commission = [Term(1, "DimTrade", "T_InvalidCommision")]
    charge = [Term(1, "DimTrade", "T_InvalidCharge")]
    audit.batches_check(scan, "DimTrade batches", audit.batches)

    def distinct(v: dict[str, Any]) -> Check:
        if v["keys"] == v["rows"]:
            return Check("DimTrade distinct keys", OK)
        return Check("DimTrade distinct keys", FAILED, f"{v['keys']} distinct TradeID for {rows_text(v['rows'])}")

    scan.check("DimTrade distinct keys", {"keys": "count(DISTINCT t.tradeid)", "rows": "count(*)"}, distinct)
    ident = "format('tradeid=%s created %s', t.tradeid, cd.datevalue)"
    for alias, _, sk, label in dimensions:
        audit.foreign_key(
            scan,
            f"DimTrade {official_sk(sk)}",
            alias,
            sk,
            f"without a {label} version valid on the create date",
            ident,
        )

    def date_check(b: int, first: dt.date, last: dt.date) -> sql.Composable:
        first1 = (audit.figures.window(1) or (None, None))[0]
        return sql.SQL(
            "t.batchid = {b} AND ((t.sk_closedateid IS NULL AND (cd.datevalue > {last} OR cd.datevalue < "
            "CASE WHEN t.type LIKE 'Limit%' THEN {first1} ELSE {first} END)) OR "
            "(t.sk_closedateid IS NOT NULL AND (xd.datevalue > {last} OR xd.datevalue < {first} "
            "OR t.sk_closedateid < t.sk_createdateid)))"
        ).format(b=sql.Literal(b), first1=date_sql(first1), first=date_sql(first), last=date_sql(last))

    audit.window_rules(
        scan,
        "DimTrade date check",
        date_check,
        "of the batch created (open trades; open limit orders may start on Batch1's first day) or closed "
        "outside {window}, or closed before created",
        "format('tradeid=%s %s created %s closed %s', t.tradeid, t.type, cd.datevalue, "
        "coalesce(xd.datevalue::text, '-'))",
        ["cd", "xd"],
    )
    statuses = ("Canceled", "Pending", "Submitted", "Active", "Completed")
    scan.rule(
        "DimTrade Status",
        sql.SQL("t.status NOT IN ({})").format(texts_sql(statuses)),
        f"with a Status not in ({', '.join(statuses)})",
        "format('tradeid=%s %s', t.tradeid, t.status)",
    )
    types = ("Market Buy", "Market Sell", "Stop Loss", "Limit Sell", "Limit Buy")
    scan.rule(
        "DimTrade Type",
        sql.SQL("t.type NOT IN ({})").format(texts_sql(types)),
        f"with a Type not in ({', '.join(types)})",
        "format('tradeid=%s %s', t.tradeid, t.type)",
    )
    audit.add(*scan.run())
    audit.alerts_vs_figure("DimTrade commission alerts", "Invalid trade commission", commission, per_batch=False)
    audit.alerts_vs_figure("DimTrade charge alerts", "Invalid trade fee", charge, per_batch=False)
