"""T1 (CreateSecurities): the step that rebuilds DimCompany, DimSecurity and Financial from staged FINWIRE records.

Implements the historical-load rules of TPC-DI 1.1.0, clause 4.5, for DimCompany (with 4.5.3.3, the "Invalid
SPRating" alert), DimSecurity and Financial, on the staged tables `staging.finwire_cmp|sec|fin`
(`schemas.finwire`; FINWIRE layouts in clause 2.2.2.8). Every micro-batch recomputes the full history of every
natural key it touches from all records staged so far and replaces that key's rows (`jobs.scd2`), so a Batch1
whose FINWIRE files arrive over several micro-batches, in any quarter order, ends exactly where a single load
ends.

The rules of the tables are elsewhere: DimCompany and the company references in `jobs.companies`, DimSecurity
in `jobs.securities`, Financial in `jobs.financials`, what they share about FINWIRE records (declared order,
latest delivery, rejections and their withdrawal) in `jobs.finwire_records`. This module decides what a
micro-batch touches, reads, and commits.

Incrementality (what a micro-batch recomputes):
- companies: the CIKs with CMP records in this micro-batch;
- securities: the symbols with SEC records in this micro-batch, plus every symbol with a SEC record referring
  to a touched company (by its CIK or by any name in its CMP records);
- financials: the touched companies plus every company named (on any day) by the reference of a FIN record
  that may have changed resolution -- this micro-batch's FIN records and those referring to a touched company
  -- so the companies a record moves from and to are both rebuilt; their rows are rebuilt from every FIN
  record referring to them;
- when a StatusType or Industry file arrives, everything is recomputed (names and flags depend on them).
What arrived is read from the names of the micro-batch's landing files (`scope.file_seq`): a micro-batch
without FINWIRE, StatusType or Industry files does nothing. Rows of recomputed keys that
no longer exist are deleted in the same commit. Financial has no CIK column: the CIK of a row is recovered from
its `sk_companyid` (`company_of_key`, the inverse of `surrogate_key`).

Each table is committed once per micro-batch (`T1/<table>`, micro-batch id; DImessages as `T1/dimessages`,
upserts and withdrawals in one MERGE, stamped like `jobs.messages.commit_messages`), and a table already
committed for this micro-batch is skipped, so a rerun changes nothing.

The work runs on Arrow tables in the driver, with no Spark job, like T2 and T3: FINWIRE holds companies, securities
and quarterly results (SF 10: ~575,000 FIN records, the largest kind), and Spark's fixed cost per query and action
(planning, `localCheckpoint`s of the intermediate results, collecting them) made T1 Batch1's longest step at SF 3
(11-13 s of the ~45 s process; the Arrow way takes about a second). The FIN records are read and built into
Financial's rows a piece at a time (`PIECE_RECORDS`, `BatchScope.staged_pieces`), each piece reduced to its alerts
and its loadable rows before the next is read: a first load at SF 100 stages 5.77 M of them, whose columns and
company resolution held at once made T1 the largest step of the load's memory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from jobs.companies import (
    companies_reached,
    company_alerts,
    company_changes,
    company_of_key,
    company_reference,
    company_references,
    company_versions,
    references_to,
)
from jobs.financials import STAGED_COLUMNS, financial_alerts, financial_records, financial_rows, loadable_records
from jobs.finwire_records import (
    DELIVERY,
    SOURCE_OF,
    STRING,
    latest_delivery,
    redelivered,
    withdrawn_alerts,
    without_redelivered,
)
from jobs.landing import FINWIRE as FINWIRE_SOURCE
from jobs.landing import nondelimited_source_for_file, source_for_file
from jobs.messages import ALERT_COLUMNS, dated_messages
from jobs.scd2_arrow import version_changes
from jobs.scope import BatchScope
from jobs.securities import security_alerts, security_changes, security_versions
from schemas import sources as src
from schemas import warehouse as wh
from schemas.model import Table
from schemas.staging import FINWIRE_TABLES
from streamdi.context import JobContext

log = logging.getLogger(__name__)

STEP = "T1"
CMP, SEC, FIN = FINWIRE_TABLES["CMP"], FINWIRE_TABLES["SEC"], FINWIRE_TABLES["FIN"]
PIECE_RECORDS = 1_000_000  # FIN records built into Financial rows at a time (a first load's at SF 100: 5.77 M)


def arrived_sources(files: list[str]) -> set[str]:
    """Which of FINWIRE, StatusType and Industry the landing `files` of a micro-batch belong to (by name)."""
    found = set()
    for file in files:
        if nondelimited_source_for_file(file) == FINWIRE_SOURCE:
            found.add(FINWIRE_SOURCE)
        elif (source := source_for_file(file, 1, (src.STATUS_TYPE, src.INDUSTRY))) is not None:
            found.add(source.name)
    return found


def run(ctx: JobContext, scope: BatchScope) -> dict[str, int]:
    """Recompute the companies, securities and financials this micro-batch touches; one commit per table.

    Returns the rows written (upserted) per table name; tables already committed for this micro-batch are
    skipped and absent from the result.
    """
    targets = (wh.DIM_COMPANY, wh.DIM_SECURITY, wh.FINANCIAL, wh.DI_MESSAGES)
    if all(scope.committed(ctx, STEP, t) for t in targets):
        return {}
    arrived = arrived_sources(sorted(scope.file_seq))
    everything = bool(arrived & {src.STATUS_TYPE.name, src.INDUSTRY.name})
    if not arrived:
        return {}
    return _run(ctx, scope, everything)


def _staged(ctx: JobContext, scope: BatchScope, table: Table) -> pa.Table:
    """Every record staged up to this micro-batch, the latest delivery of each line, in file, line order
    (`latest_delivery`)."""
    return latest_delivery(scope.staged_where(ctx, table, pc.scalar(True)))


def _with_reference(staged: pa.Table) -> pa.Table:
    return staged.append_column("_ref", company_reference(staged["cik"], staged["company_name"]))


def _fin_pieces(ctx: JobContext, scope: BatchScope, stale: pa.Table, columns: list[str]) -> Iterator[pa.Table]:
    """The FIN records `_staged` would read, as staged, in consecutive pieces of `PIECE_RECORDS`: their `columns`
    (with a line's delivery, `DELIVERY`) and `_ref`, without the lines a later micro-batch delivered again (`stale`,
    `redelivered`); one empty piece when there are none."""
    found = False
    for piece in scope.staged_pieces(ctx, FIN, columns, PIECE_RECORDS):
        found = True
        yield _with_reference(without_redelivered(piece, stale))
    if not found:
        yield _with_reference(FIN.arrow_schema().empty_table().select(columns))


def _alerted(records: pa.Table, table: Table, alerted: pa.Array) -> pa.Table:
    """The examined keys (`withdrawn_alerts`) of the `records` of `table` whose `_rec` an existing alert names."""
    rows = records.filter(pc.is_in(records["_rec"].cast(STRING), value_set=alerted))
    return pa.table(
        {
            "batchid": rows["_batch"].cast(pa.int32()),
            "messagesource": pa.array([SOURCE_OF[table.name]] * rows.num_rows, STRING),
            "messagekey": rows["_rec"].cast(STRING),
        }
    )


def _of(rows: pa.Table, column: str, keys: pa.Array | None) -> pa.Table:
    """The rows whose `column` is in `keys`; all of them when `keys` is None (everything recomputed)."""
    return rows if keys is None else rows.filter(pc.is_in(rows[column], value_set=keys))


def _stale(current: pa.Table, rows: pa.Table, table: Table, natural: str, keys: pa.Array | None) -> pa.Table:
    """Keys of the rows of `current` (of the natural keys `keys`; all when None) that `rows` no longer holds."""
    sk = table.key[0]
    if keys is not None:
        gone = version_changes(current, rows, table.column_names, natural, sk, keys)[1]
    else:
        gone = current[sk].filter(pc.invert(pc.is_in(current[sk], value_set=rows[sk].combine_chunks())))
    return pa.table({sk: gone})


def _run(ctx: JobContext, scope: BatchScope, everything: bool) -> dict[str, int]:
    """The recomputation; with `everything`, of every key (StatusType or Industry arrived)."""
    status_type = ctx.lake.read_if_exists(wh.STATUS_TYPE)
    industry = ctx.lake.read_if_exists(wh.INDUSTRY)

    def this_batch(rows: pa.Table) -> pa.Array:
        return pc.equal(rows["batch_id"], scope.batch_id)

    # DimCompany: the CIKs with CMP records in this micro-batch (None: all)
    cmp_all = _staged(ctx, scope, CMP)
    cmp_all = cmp_all.append_column("companyid", pc.cast(cmp_all["cik"], pa.int64()))
    touched = None if everything else pc.unique(cmp_all.filter(this_batch(cmp_all))["companyid"].combine_chunks())
    changes = company_changes(_of(cmp_all, "companyid", touched), status_type, industry)
    versions = company_versions(changes)
    new_companies = ctx.lake.to_arrow(wh.DIM_COMPANY, versions)
    current_companies = ctx.lake.read_if_exists(wh.DIM_COMPANY)
    company_deletes = _stale(current_companies, versions, wh.DIM_COMPANY, "companyid", touched)
    companies = new_companies
    if touched is not None:
        kept = current_companies.filter(pc.invert(pc.is_in(current_companies["companyid"], value_set=touched)))
        companies = pa.concat_tables([kept.cast(new_companies.schema), new_companies])
    references = company_references(companies)

    # DimSecurity: symbols with SEC records in this micro-batch or referring to a touched company
    sec_all = _with_reference(_staged(ctx, scope, SEC))
    symbols = None
    if touched is not None:
        reaching = pc.is_in(sec_all["_ref"], value_set=references_to(cmp_all, touched))
        symbols = pc.unique(sec_all.filter(pc.or_(this_batch(sec_all), reaching))["symbol"].combine_chunks())
    sec_changes = security_changes(_of(sec_all, "symbol", symbols), status_type, references)
    securities = security_versions(sec_changes, companies)
    current_securities = ctx.lake.read_if_exists(wh.DIM_SECURITY, ["sk_securityid", "symbol"])
    security_deletes = _stale(current_securities, securities, wh.DIM_SECURITY, "symbol", symbols)

    # DImessages: the alerts of every examined record replace the ones it raised before; only the records an
    # existing alert names can have one to withdraw (a first load: none)
    existing = ctx.lake.read_if_exists(wh.DI_MESSAGES, [*wh.DI_MESSAGES.key, "messagetext"])
    alerted = pc.unique(existing["messagekey"].combine_chunks()).cast(STRING)

    # Financial: the companies a FIN record may have moved to or from (see the module docstring). The FIN records
    # are read and built a piece at a time, in the staged order (SF 100's first load: 5.77 M), each piece reduced
    # to its alerts and its loadable rows before the next; Financial's rows are ordered by their own key.
    current_fin = ctx.lake.read_if_exists(wh.FINANCIAL, list(wh.FINANCIAL.key))
    stale = redelivered(scope.staged_where(ctx, FIN, pc.scalar(True), DELIVERY))
    fin_ciks, examined = None, None
    if touched is not None:
        to_touched = references_to(cmp_all, touched)
        moved = [
            piece["_ref"].filter(pc.or_(pc.is_in(piece["_ref"], value_set=to_touched), this_batch(piece)))
            for piece in _fin_pieces(ctx, scope, stale, ["cik", "company_name", *DELIVERY])
        ]
        reached = companies_reached(references, pc.unique(pa.chunked_array(moved).combine_chunks()))
        fin_ciks = pc.unique(pa.concat_arrays([touched, reached.cast(pa.int64())]))
        examined = references_to(cmp_all, fin_ciks)
        current_fin = current_fin.filter(pc.is_in(company_of_key(current_fin["sk_companyid"]), value_set=fin_ciks))
    fin_alerts, fin_alerted, loadable = [], [], []
    for piece in _fin_pieces(ctx, scope, stale, list(STAGED_COLUMNS)):
        if examined is not None:
            piece = piece.filter(pc.or_(pc.is_in(piece["_ref"], value_set=examined), this_batch(piece)))
        records = financial_records(piece, references)
        del piece
        fin_alerts.append(financial_alerts(records))
        fin_alerted.append(_alerted(records, wh.FINANCIAL, alerted))
        loadable.append(loadable_records(_of(records, "_companyid", fin_ciks)))
        del records
    financials = financial_rows(pa.concat_tables(loadable))
    del loadable
    fin_key = list(wh.FINANCIAL.key)
    financial_deletes = (
        current_fin.select(fin_key).join(financials.select(fin_key), fin_key, join_type="left anti").select(fin_key)
    )

    raised = pa.concat_tables([company_alerts(changes, versions), security_alerts(sec_changes), *fin_alerts])
    examined_keys = pa.concat_tables(
        [_alerted(changes, wh.DIM_COMPANY, alerted), _alerted(sec_changes, wh.DIM_SECURITY, alerted), *fin_alerted]
    )
    withdrawn = withdrawn_alerts(existing, examined_keys, raised)

    written: dict[str, int] = {}
    for table, rows, deletes in (
        (wh.DIM_COMPANY, new_companies, company_deletes),
        (wh.DIM_SECURITY, securities, security_deletes),
        (wh.FINANCIAL, financials, financial_deletes),
        (wh.DI_MESSAGES, dated_messages(scope, raised.cast(ALERT_COLUMNS)), withdrawn),
    ):
        if scope.committed(ctx, STEP, table):
            continue
        data = ctx.lake.to_arrow(table, rows)
        ctx.lake.upsert(table, data, app_id=scope.app_id(STEP, table), version=scope.batch_id, deletes=deletes)
        written[table.name] = data.num_rows
        log.info(
            "T1 micro-batch %s: %s: %s upserted, %s deleted",
            scope.batch_id,
            table.name,
            data.num_rows,
            deletes.num_rows,
        )
    return written
