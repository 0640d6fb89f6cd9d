"""`streamdi audit`: the TPC-DI 1.1.0 automated audit (`tpcdi_audit.sql`) as an independent judge of the PostgreSQL
warehouse (`dw.*`, what users query) -- the last step of the data flow, after migration.

`run_audit(ctx, data_dir=None)` reads the generator's audit figures -- the `*_audit.csv` files of a data set
directory (`DIR/*_audit.csv` and `DIR/BatchK/*_audit.csv`) when `data_dir` is given, else the figures staged from
the landing zone (`staging.audit_figures`, one delivery per TPC-DI batch and file name: the one staged last) -- and
runs every check of the official script against PostgreSQL as the read-only role, in one REPEATABLE READ snapshot
(a migration running meanwhile is seen whole or not at all). It returns an `AuditReport`: one `Check` per result
row of the official script, named as the script's "Test" column, with `batch` where the script gives one result
per batch; `ok` is true when nothing failed or was skipped.

Independence: the audit shares no code with what it audits. Its modules (`jobs.audit.*`) import none of the jobs
that build the warehouse and not `schemas.warehouse`; their SQL spells the specification's table and column names
(lower case, schema `dw`). The one other job they import is `jobs.audit_figures`, which splits the audit files and
types their fields with `jobs.fields` (the figures are the audit's input, not what it judges). They use
`streamdi.warehouse` only to connect and for psycopg's `sql` module, and `schemas.audit`/`streamdi.lake` to read
staged figures. Every statement is composed with `psycopg.sql` (see `jobs.audit.scan`).

The modules, in the order of the data flow:
- `figures`: the expected values (`read_figures`, `staged_figures`, `Figures`);
- `scan`: the read-only `Snapshot` of PostgreSQL and the one-query `Scan` of a table;
- `state`: one run's `AuditRun` and the checks shared by the tables;
- the checks, grouped as the script's tables: `messages` (the Audit table, DImessages, the batch validation and
  data visibility row counts), `scd2` (the SCD2 invariants), `dimensions` (DimBroker, DimAccount, DimSecurity,
  DimCompany, Financial), `customers` (DimCustomer, Prospect), `trade` (DimTrade), `facts` (FactWatches,
  FactMarketHistory, FactHoldings, FactCashBalances);
- `report`: the results (`Check`, `AuditReport`).

The checks, as in the script (B = the batches of the audit figures, 1..N; 3 in the official data set):
- Audit table batches, Audit table sources (the 13 data sets).
- DImessages validation reports (per batch 0..N: 24 'Validation' rows), batches, Phase complete records, sources
  (the 17 validated sources), initial condition (batch 0 all '0').
- DimBroker row count, distinct keys (= HR_BROKERS), BatchID (batch 1), IsCurrent, EffectiveDate (= Batch1's
  FirstDay, which the script hard-codes as 1950-01-01), EndDate.
- The SCD2 tables DimAccount, DimCustomer, DimSecurity, DimCompany: distinct keys, EndDate (every end date is
  another version's effective date or 9999-12-31, counted through the script's self-join), Overlap, End of Time,
  consolidation, batches, IsCurrent (not for DimCompany, as in the script), EffectiveDate (per batch), Status.
- DimAccount row count (batch 1: `>` the customer and account figures; later batches: `>=` the account figures),
  TaxStatus, SK_CustomerID, SK_BrokerID, inactive customers. DimCustomer row count (per batch), inactive
  customers, age range alerts and customer tier alerts (per batch), Gender, TaxID, Phone1-3, Email1-2,
  LocalTaxRate, NationalTaxRate, demographic fields. DimSecurity row count (batch 1, from its message),
  SK_CompanyID, ExchangeID, Issue. DimCompany row count (per batch, from its message, `<=` FW_CMP), distinct
  names, Industry, SPrating, Country.
- Prospect SK_UpdateDateID, SK_RecordDateID (per batch), batches, Country, MarketingNameplate.
- FactWatches row count and active watches (per batch, from the messages), batches, SK_CustomerID,
  SK_SecurityID, date check (per batch).
- DimTrade row count (per batch, from its message), canceled trades, commission alerts, charge alerts (all
  batches together, as in the script), batches, distinct keys, SK_BrokerID/CompanyID/SecurityID/CustomerID/
  AccountID (a version valid on the create date), date check (per batch), Status, Type.
- Financial row count (batch 1's message), SK_CompanyID, FI_YEAR, FI_QTR, FI_QTR_START_DATE, EPS.
- FactMarketHistory row count (per batch, from the messages), batches, SK_CompanyID, SK_SecurityID, SK_DateID
  (per batch; the script's window is [FirstDay - 1 day, LastDay)), relative dates.
- FactHoldings row count (per batch), batches, SK_CustomerID/AccountID/CompanyID/SecurityID (effective on or
  before the holding's day), CurrentTradeID, SK_DateID (per batch). FactCashBalances batches, SK_CustomerID,
  SK_AccountID, SK_DateID (per batch).
- "Batch row count: <source>" and "Batch joined row count: <source>" per batch and source, the sources being
  those of batch 0's 'Row count' messages; "Data visibility row counts/joined row counts: <source>".
For three batches that is 238 results when every table and message is there (see docs/audit.md).

Semantics kept from the script, quirks included: `x NOT IN (...)` and `x NOT LIKE ...` never count a NULL (e.g. a
NULL Gender passes); foreign keys count the joined rows (every dimension surrogate key is the primary key of its
`dw` table, so a left join counts each row at most once, as the script's inner join does, and a single pass over a
fact table can check all of its keys); a message compared with figures must exist; an empty Prospect fails
MarketingNameplate (the script's sum over no rows is NULL); "DimAccount inactive customers" can never fail (the
script's WHERE keeps only inactive accounts, so no group has "fewer than one" row) -- it is run as written.

Decisions where the script does not fit streamdi:
- Batches: the script hard-codes 3 batches; here every "batches" check expects exactly the batches of the audit
  figures (B), per-batch checks run for each batch of B, and DImessages expects batches 0..N.
- A figure of -1 (not counted by the generator) is left out of a sum (the detail says so); a check resting only
  on such figures is "not checked". A figure that is absent makes its check "skipped", as does a window check
  of a batch without Batch FirstDay/LastDay figures (they are in `BatchK_audit.csv` at the data set's root).
- A check whose table is missing in PostgreSQL fails with "table dw.<name> does not exist".
- The scale-dependent parts: "DimCustomer LocalTaxRate" also asks for more than 300 distinct LocalTaxRateDesc and
  "DimCustomer NationalTaxRate" for at least 9 distinct NationalTaxRateDesc. Both are always evaluated. When the
  join part holds and only the distinct count falls short on a data set below scale factor 3 (the official
  generator's smallest; from the Generator SF figure, which is 1000 x the scale factor), the check is "not
  checked" with a detail saying the distinct-count part failed and why; with scale factor 3 or more, or when it
  is unknown, it fails.
- Visibility: streamdi writes no Visibility_1/Visibility_2 messages (they would need the wall clock during a
  batch), so "Data visibility row counts" and "Data visibility joined row counts" are reported once each as "not
  checked"; if such messages exist they are checked per source as in the script.
- Where the script reports nothing for a missing message ("Batch row count", "DImessages validation reports" of a
  batch absent from DImessages), this audit reports a failure naming the missing message.
- Financial EPS: a zero denominator gives no ratio (NULL, not counted) instead of the script's division error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from jobs.audit import customers, dimensions, facts, messages, trade
from jobs.audit.figures import Figure, Figures, parse_figures, read_figures, staged_figures
from jobs.audit.report import FAILED, NOT_CHECKED, OK, SKIPPED, AuditReport, Check
from jobs.audit.scan import Snapshot
from jobs.audit.state import AuditRun
from streamdi.context import JobContext

__all__ = [
    "FAILED",
    "NOT_CHECKED",
    "OK",
    "SKIPPED",
    "AuditReport",
    "Check",
    "Figure",
    "Figures",
    "parse_figures",
    "read_figures",
    "run_audit",
    "staged_figures",
]

# Every part of the script, in its order (`messages.read_messages` reads DImessages for the checks after it).
STEPS: tuple[Callable[[AuditRun], None], ...] = (
    messages.audit_table,
    messages.read_messages,
    messages.messages,
    dimensions.broker,
    dimensions.account,
    customers.customer,
    dimensions.security,
    dimensions.company,
    customers.prospect,
    facts.watches,
    trade.trade,
    dimensions.financial,
    facts.market_history,
    facts.holdings,
    facts.cash_balances,
    messages.batch_validation,
    messages.data_visibility,
)


def run_audit(ctx: JobContext, data_dir: Path | None = None) -> AuditReport:
    """Audit the PostgreSQL warehouse against the figures of `data_dir` (a TPC-DI data set directory), or
    against the staged figures when `data_dir` is None. Every check reads one snapshot as the read-only role;
    nothing is written. Raises ValueError when an audit file does not parse."""
    figures = read_figures(Path(data_dir)) if data_dir is not None else staged_figures(ctx)
    with ctx.warehouse.connect("reader") as conn:
        audit = AuditRun(Snapshot(conn), figures)
        for step in STEPS:
            step(audit)
    return AuditReport(audit.checks)
