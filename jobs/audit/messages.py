"""The audit's checks of the DImessages table itself: the Audit table, DImessages, and the batch validation and data
visibility queries' row counts.

In the audit's flow (`jobs.audit.run_audit`): `audit_table` and `messages` run first (after `read_messages` has
read `dw.dimessages` into the `AuditRun`, for every later check comparing a message with the figures);
`batch_validation` and `data_visibility` run last, as in the script.
"""

from __future__ import annotations

from jobs.audit.report import FAILED, NOT_CHECKED, OK, SKIPPED, Check
from jobs.audit.state import ROW_COUNT, ROW_COUNT_JOINED, AuditRun

# The data sets the script's "Audit table sources" asks figures for.
AUDIT_DATASETS = (
    "Batch",
    "DimAccount",
    "DimBroker",
    "DimCompany",
    "DimCustomer",
    "DimSecurity",
    "DimTrade",
    "FactHoldings",
    "FactMarketHistory",
    "FactWatches",
    "Financial",
    "Generator",
    "Prospect",
)
# "DImessages sources": the validated tables that must have messages (the script's list has no DimCompany).
MESSAGE_SOURCES = (
    "DimAccount",
    "DimBroker",
    "DimCustomer",
    "DimDate",
    "DimSecurity",
    "DimTime",
    "DimTrade",
    "FactCashBalances",
    "FactHoldings",
    "FactMarketHistory",
    "FactWatches",
    "Financial",
    "Industry",
    "Prospect",
    "StatusType",
    "TaxRate",
    "TradeType",
)
# The spec's batch validation query: 18 'Row count', 4 'Row count joined' and 2 more rows per batch.
SPEC_VALIDATION_ROWS = (
    *((s, ROW_COUNT) for s in sorted((*MESSAGE_SOURCES, "DimCompany"))),
    *((s, ROW_COUNT_JOINED) for s in ("FactCashBalances", "FactHoldings", "FactMarketHistory", "FactWatches")),
    ("DimCustomer", "Inactive customers"),
    ("FactWatches", "Inactive watches"),
)
VALIDATION_ROWS_PER_BATCH = len(SPEC_VALIDATION_ROWS)  # 24


# -- Audit table
def audit_table(audit: AuditRun) -> None:
    if not audit.figures:
        reason = f"no audit figures {audit.figures.where}"
        audit.add(Check("Audit table batches", SKIPPED, reason), Check("Audit table sources", SKIPPED, reason))
        return
    found = list(audit.figures.batches)
    wanted = list(range(1, max(found) + 1))
    detail = f"figures for batches {found}, expected every batch 1..{max(found)}"
    audit.add(Check("Audit table batches", OK if found == wanted else FAILED, "" if found == wanted else detail))
    missing = [d for d in AUDIT_DATASETS if d not in audit.figures.datasets]
    detail = f"no figures for data set(s) {', '.join(missing)} {audit.figures.where}"
    audit.add(Check("Audit table sources", FAILED if missing else OK, detail if missing else ""))


# -- DImessages
def read_messages(audit: AuditRun) -> None:
    if "dimessages" not in audit.db.tables:
        return
    rows = audit.db.rows(
        "SELECT batchid, messagetype, messagesource, messagetext, messagedata, messagedateandtime "
        "FROM dw.dimessages WHERE messagetype IN ('Validation', 'PCR', 'Visibility_1', 'Visibility_2')"
    )
    counts = audit.db.rows(
        "SELECT batchid, messagetype, messagetext, count(*) FROM dw.dimessages "
        "WHERE messagetype NOT IN ('Validation', 'PCR', 'Visibility_1', 'Visibility_2') GROUP BY 1, 2, 3"
    )
    audit.validation = {(b, s, t): d for b, kind, s, t, d, _ in rows if kind == "Validation"}
    audit.validation_rows = [(b, s, t, d) for b, kind, s, t, d, _ in rows if kind == "Validation"]
    audit.pcr_batches = sorted({r[0] for r in rows if r[1] == "PCR"})
    audit.visibility = [r for r in rows if r[1] in ("Visibility_1", "Visibility_2")]
    audit.alerts = {(b, t): n for b, kind, t, n in counts if kind == "Alert"}
    audit.message_batches = sorted({r[0] for r in rows} | {r[0] for r in counts})


def messages(audit: AuditRun) -> None:
    names = ["DImessages batches", "DImessages Phase complete records", "DImessages sources"]
    names.append("DImessages initial condition")
    if "dimessages" not in audit.db.tables:
        for b in [0, *audit.batches]:
            audit.add(Check("DImessages validation reports", FAILED, "table dw.dimessages does not exist", b))
        audit.add(*(Check(n, FAILED, "table dw.dimessages does not exist") for n in names))
        return
    wanted = [0, *audit.batches]
    for b in sorted(set(audit.message_batches) | set(wanted)):
        got = [(s, t) for (mb, s, t, _) in audit.validation_rows if mb == b]
        if len(got) == VALIDATION_ROWS_PER_BATCH:
            audit.add(Check("DImessages validation reports", OK, batch=b))
            continue
        missing = [f"{s}/{t}" for s, t in SPEC_VALIDATION_ROWS if (s, t) not in got]
        extra = sorted(f"{s}/{t}" for s, t in got if (s, t) not in SPEC_VALIDATION_ROWS)
        detail = f"{len(got)} 'Validation' rows, expected {VALIDATION_ROWS_PER_BATCH}"
        if not got:
            missing = []  # listing all 24 says nothing more
        detail += f"; missing {', '.join(missing)}" if missing else ""
        detail += f"; unexpected {', '.join(extra)}" if extra else ""
        audit.add(Check("DImessages validation reports", FAILED, detail, b))
    if not audit.batches:
        reason = f"no audit figures {audit.figures.where}: the batches are unknown"
        audit.add(Check(names[0], SKIPPED, reason), Check(names[1], SKIPPED, reason))
    else:
        for name, found, what in (
            (names[0], audit.message_batches, "BatchID values are"),
            (names[1], audit.pcr_batches, "'PCR' rows are for batches"),
        ):
            ok = found == wanted
            audit.add(Check(name, OK if ok else FAILED, "" if ok else f"{what} {found}, expected {wanted}"))
    present = {s for (_, s, _, _) in audit.validation_rows}
    missing = [s for s in MESSAGE_SOURCES if s not in present]
    detail = f"no 'Validation' messages from {', '.join(missing)}"
    audit.add(Check(names[2], FAILED if missing else OK, detail if missing else ""))
    nonzero = sorted(
        f"{s}/{t} = {d}" for (b, s, t, d) in audit.validation_rows if b == 0 and d is not None and d != "0"
    )
    detail = f"batch 0 reports {', '.join(nonzero)} (every table must be empty before Batch1)"
    audit.add(Check(names[3], FAILED if nonzero else OK, detail if nonzero else ""))


# -- the batch validation query's row counts
def batch_validation(audit: AuditRun) -> None:
    if "dimessages" not in audit.db.tables:
        for name in ("Batch row count", "Batch joined row count"):
            audit.add(Check(name, FAILED, "table dw.dimessages does not exist"))
        return
    sources = sorted({s for (b, s, t, _) in audit.validation_rows if b == 0 and t == ROW_COUNT})
    for source in sources:
        for b in audit.batches:
            now, p1 = audit.reported(b, source, ROW_COUNT)
            before, p2 = audit.reported(b - 1, source, ROW_COUNT)
            name = f"Batch row count: {source}"
            if now is None or before is None:
                audit.add(Check(name, FAILED, p1 or p2, b))
            elif before > now:
                audit.add(Check(name, FAILED, f"row count decreased from {before} (batch {b - 1}) to {now}", b))
            else:
                audit.add(Check(name, OK, batch=b))
    joined = sorted({s for (_, s, t, _) in audit.validation_rows if t == ROW_COUNT_JOINED} & set(sources))
    for source in joined:
        for b in audit.batches:
            rows, p1 = audit.reported(b, source, ROW_COUNT)
            matched, p2 = audit.reported(b, source, ROW_COUNT_JOINED)
            name = f"Batch joined row count: {source}"
            if rows is None or matched is None:
                audit.add(Check(name, FAILED, p1 or p2, b))
            elif rows != matched:
                detail = f"'Row count' is {rows} but '{ROW_COUNT_JOINED}' (rows joined to the dimensions) is {matched}"
                audit.add(Check(name, FAILED, detail, b))
            else:
                audit.add(Check(name, OK, batch=b))


# -- the data visibility query's row counts
def data_visibility(audit: AuditRun) -> None:
    counts = [r for r in audit.visibility if r[3] == ROW_COUNT]
    if not counts:
        reason = (
            "streamdi writes no Visibility_1/Visibility_2 messages (taking them would need the wall clock "
            "while a batch runs)"
        )
        audit.add(
            Check("Data visibility row counts", NOT_CHECKED, reason),
            Check("Data visibility joined row counts", NOT_CHECKED, reason),
        )
        return

    def number(data: str | None) -> int | None:
        try:
            return int(str(data).strip())
        except ValueError:
            return None

    # rows: (batchid, type, source, text, data, time)
    for source in sorted({r[2] for r in counts}):
        mine = [r for r in counts if r[2] == source]
        regressions = sum(
            1
            for a in mine
            for b in mine
            if a[5] is not None and b[5] is not None and b[5] > a[5] and (number(a[4]) or 0) > (number(b[4]) or 0)
        )
        name = f"Data visibility row counts: {source}"
        detail = f"{regressions} later 'Row count' message(s) smaller than an earlier one"
        audit.add(Check(name, FAILED if regressions else OK, detail if regressions else ""))
    joined = [r for r in audit.visibility if r[1] == "Visibility_1" and r[3] == ROW_COUNT_JOINED]
    for source in sorted({r[2] for r in counts if r[1] == "Visibility_1"}):
        mismatches = sum(
            1
            for a in counts
            if a[1] == "Visibility_1" and a[2] == source
            for b in joined
            if b[2] == source and b[5] == a[5] and (number(a[4]) or 0) > (number(b[4]) or 0)
        )
        name = f"Data visibility joined row counts: {source}"
        detail = f"{mismatches} 'Row count' message(s) larger than the 'Row count joined' taken with them"
        audit.add(Check(name, FAILED if mismatches else OK, detail if mismatches else ""))
