"""Data quality: suites of Great Expectations checks per table, kept as data in `expectations/`, and the
policies that decide what a failed check does to a batch.

A suite is one YAML file per table (`expectations/<layer>/<table>.yml`, see `expectations/README.md`):

    table: staging.trade
    checks:
      - id: status_is_known
        expectation: expect_column_values_to_be_in_set     # any Great Expectations expectation type
        kwargs: {column: t_st_id, value_set: [CMPT, SBMT, PNDG, CNCL]}
        policy: quarantine                                 # warn | quarantine | halt
        why: T_ST_ID is a StatusType code

Policies: `warn` records the failure and goes on; `quarantine` moves the failing rows to
`quality.quarantine` (with the checks they failed) and goes on with the rest (only for row-level
expectations, which name the failing rows); `halt` keeps the table's rows out and halts the batch in the batch
log (`streamdi batch resume K` lets it go on; the halting checks then only warn for that batch, action
`overridden`).

`load_suites` (`streamdi.suites`) reads and checks every suite once (unknown expectation types, arguments,
columns or policies are errors that name the file and the check). `Validator` builds the Great Expectations
context, suites and batch definitions once per process and validates a table's rows with all its checks in one
run (for the verdicts; the failed checks run once more for their counts and failing values). The rows arrive as
Arrow (staging holds each parsed source in the driver before its commit) and are validated with Great
Expectations' pandas engine: on a 1,000-row micro-batch its Spark engine costs seconds per suite (one or more
Spark jobs per metric), this one about 0.1 s. A table of more than `PIECE_ROWS` rows is checked in pieces by the
checks that judge each row alone (`row_wise`), with the outcomes of one whole-table check (`merged_outcome`).

Long because one validation has three places to run (`Validator` here, `RemoteValidator` on the warm server, and the
piecewise split both share in `Validating`), and all three must give the same outcomes from the same findings.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from schemas.model import Table
from schemas.quality import QUALITY_RESULTS, QUARANTINE
from streamdi import gx_remote
from streamdi.gx_import import import_great_expectations
from streamdi.settings import load_settings
from streamdi.suites import MAX_DETAIL_VALUES, Check, Suite, check_columns, condition_columns, load_suites

log = logging.getLogger(__name__)

# A suite's row-wise checks (`row_wise`) see at most this many rows at once: the pandas frame of a large table's
# checked columns (with its Python date objects) costs several times its Arrow size.
PIECE_ROWS = 1_000_000
# Expectations on each row's own values (Great Expectations' map expectations) ...
ROW_WISE_PREFIXES = ("expect_column_values_to_", "expect_column_pair_values_", "expect_multicolumn_sum_values_")
# ... except those that judge a row by other rows: a piece alone cannot tell.
CROSS_ROW = frozenset(
    {
        "expect_column_values_to_be_unique",
        "expect_compound_columns_to_be_unique",
        "expect_multicolumn_values_to_be_unique",
        "expect_select_column_values_to_be_unique_within_record",
        "expect_column_values_to_be_increasing",
        "expect_column_values_to_be_decreasing",
    }
)


# ------------------------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class CheckOutcome:
    check: Check
    success: bool
    element_count: int
    unexpected_count: int
    action: str  # passed, warned, quarantined, halted, overridden
    failing_values: tuple = ()
    error: str | None = None  # the expectation raised (counts as a failure)

    def describe(self, table: str) -> str:
        what = f"{self.unexpected_count} of {self.element_count} rows" if self.unexpected_count else "the table"
        if self.error:
            what = f"error: {self.error}"
        return f"{table}: check {self.check.id} ({self.check.expectation}) failed on {what}"


@dataclass
class Validated:
    """A table's rows after its suite ran: the rows to keep, the quarantined ones, and every check's outcome."""

    suite: Suite
    kept: pa.Table
    quarantined: pa.Table  # QUARANTINE rows
    outcomes: list[CheckOutcome] = field(default_factory=list)

    @property
    def halts(self) -> list[CheckOutcome]:
        return [o for o in self.outcomes if o.action == "halted"]

    def result_rows(self, batch_id: int, attempt: int) -> pa.Table:
        rows = [
            {
                "batch_id": batch_id,
                "attempt": attempt,
                "table_name": self.suite.name,
                "check_id": o.check.id,
                "expectation": o.check.expectation,
                "column_name": o.check.column,
                "policy": o.check.policy,
                "action": o.action,
                "success": o.success,
                "element_count": o.element_count,
                "unexpected_count": o.unexpected_count,
                "detail": _json(
                    {
                        "kwargs": o.check.kwargs,
                        **({"failing_values": list(o.failing_values)} if o.failing_values else {}),
                        **({"error": o.error} if o.error else {}),
                    }
                ),
            }
            for o in self.outcomes
        ]
        return pa.Table.from_pylist(rows, schema=QUALITY_RESULTS.arrow_schema())


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


# ------------------------------------------------------------------------------------------------ running
CHECK_META = "streamdi_check"  # the `meta` key of a Great Expectations expectation that names its check


class Validating:
    """What every validator does with `check`'s findings: `validate` runs a whole suite on a table's rows and applies
    the policies (`Validator` checks in this process, `RemoteValidator` on the warm server)."""

    suites: dict[str, Suite]

    def suite_for(self, table: Table) -> Suite | None:
        return self.suites.get(table.qualified_name)

    def validate(
        self,
        suite: Suite,
        rows: pa.Table,
        batch_id: int,
        *,
        resumed: bool = False,
        parameters: dict[str, list] | None = None,
    ) -> Validated:
        """Run every check of `suite` on `rows` and apply the policies. With `resumed` (an operator resumed the
        batch) a failed halt check is `overridden`: recorded, and the rows stay."""
        if not suite.checks:
            return Validated(suite, rows, QUARANTINE.arrow_schema().empty_table())
        outcomes, failing_rows = self._check_in_pieces(suite, rows, batch_id, resumed=resumed, parameters=parameters)
        kept, quarantined = _split(suite, rows, batch_id, failing_rows)
        return Validated(suite, kept, quarantined, outcomes)

    def _check_in_pieces(self, suite, rows, batch_id, *, resumed, parameters):
        """`check` with the same findings, run so that no frame of more than `PIECE_ROWS` rows is ever built for
        the checks that judge each row alone (`row_wise`): those see consecutive pieces of the rows and their
        outcomes are merged (`merged_outcome`, row positions shifted by the piece's start); the others see all
        rows at once, but only the columns they name (`frame_columns`). A large table (FactMarketHistory in a
        first load) thereby never becomes one pandas frame of all its checked columns."""
        if rows.num_rows <= PIECE_ROWS:
            return self.check(suite, rows, batch_id, resumed=resumed, parameters=parameters)
        pieces = tuple(c for c in suite.checks if row_wise(c))
        whole = tuple(c for c in suite.checks if not row_wise(c))
        found: dict[str, CheckOutcome] = {}
        failing: dict[int, list[str]] = {}
        if whole:
            outcomes, positions = self.check(
                replace(suite, checks=whole), rows, batch_id, resumed=resumed, parameters=parameters
            )
            found.update((o.check.id, o) for o in outcomes)
            for position, ids in positions.items():
                failing.setdefault(position, []).extend(ids)
        if pieces:
            part = replace(suite, checks=pieces)
            parts: dict[str, list[CheckOutcome]] = {c.id: [] for c in pieces}
            for start in range(0, rows.num_rows, PIECE_ROWS):
                piece = rows.slice(start, PIECE_ROWS)
                outcomes, positions = self.check(part, piece, batch_id, resumed=resumed, parameters=parameters)
                for o in outcomes:
                    parts[o.check.id].append(o)
                for position, ids in positions.items():
                    failing.setdefault(start + position, []).extend(ids)
            found.update((c.id, merged_outcome(c, parts[c.id], resumed=resumed)) for c in pieces)
        order = {c.id: i for i, c in enumerate(suite.checks)}  # a row's failed checks in suite order, as `check`
        in_order = {position: sorted(ids, key=order.__getitem__) for position, ids in failing.items()}
        return [found[c.id] for c in suite.checks], in_order

    def check(self, suite, rows, batch_id, *, resumed=False, parameters=None):
        """`validate`'s findings, before the split: every check's outcome (a list of CheckOutcome, in suite order),
        and the row positions that failed quarantine checks with those checks' ids (dict[int, list[str]])."""
        raise NotImplementedError


class Validator(Validating):
    """Great Expectations objects built once per process; `check` runs a whole suite on a table's rows here."""

    def __init__(self, suites: dict[str, Suite]) -> None:
        gx = import_great_expectations()
        from great_expectations.data_context.types.base import ProgressBarsConfig

        # that module pins its logger at INFO ("Created temporary directory ... for ephemeral docs site" on every
        # run); let it follow the application's level like every other logger
        logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.NOTSET)

        # Its pandas engine fingerprints every batch below 1 GB (a hash of every row, `pandas_data_fingerprint`, a
        # batch marker of the results nobody reads: `quality.results` is the record) when it is made, twice per
        # validation: 0.25 s of 1.2 s for FactMarketHistory's 1.27 M rows at SF 3. The threshold 0 hashes none.
        from great_expectations.execution_engine import pandas_execution_engine

        pandas_execution_engine.HASH_THRESHOLD = 0
        self.suites = suites
        self._gx = gx
        self._context = gx.get_context(mode="ephemeral")
        self._context.variables.progress_bars = ProgressBarsConfig(globally=False)
        self._source = self._context.data_sources.add_pandas("streamdi")
        self._definitions: dict[tuple[str, tuple[str, ...]], Any] = {}  # (suite, its checks' ids) -> definition
        self._lock = threading.Lock()

    def _definition(self, suite: Suite):
        """(batch definition, expectation suite) of `suite`, built on first use. The suite stays out of the
        context's store (each check's id rides in its expectation's `meta`): adding it there serialized every
        expectation, ~12 ms per suite of the process's start (0.45 -> 0.15 s for all suites). Batches are validated
        directly: a ValidationDefinition run would also serialize every result into the context's results store,
        which nobody reads (`quality.results` is the record) and which cost about a fifth of each run."""
        key = (suite.name, tuple(check.id for check in suite.checks))  # a part of a suite is its own
        if key not in self._definitions:
            from great_expectations.expectations.registry import get_expectation_impl

            asset = self._source.add_dataframe_asset(f"{suite.name}#{len(self._definitions)}")
            batch = asset.add_batch_definition_whole_dataframe("micro-batch")
            expectations = [
                get_expectation_impl(check.expectation)(**check.kwargs, meta={CHECK_META: check.id})
                for check in suite.checks
            ]
            self._definitions[key] = (
                batch,
                self._gx.ExpectationSuite(name=suite.name, expectations=expectations),
            )
        return self._definitions[key]

    def check(self, suite, rows, batch_id, *, resumed=False, parameters=None):
        with self._lock:
            batch_definition, gx_suite = self._definition(suite)
            frame = _frame(suite, rows)
            batch = batch_definition.get_batch(batch_parameters={"dataframe": frame})
            # Two passes: every check for its verdict only (BOOLEAN_ONLY computes no counts and no failing values,
            # about a quarter cheaper), then only the failed ones again for their details. A micro-batch usually
            # fails none or a few of its checks, and Great Expectations' cost is per check, not per row.
            verdicts = batch.validate(
                gx_suite, expectation_parameters=parameters or None, result_format={"result_format": "BOOLEAN_ONLY"}
            )
            by_check = {r.expectation_config.meta[CHECK_META]: r for r in verdicts.results}
            failed = [e for e in gx_suite.expectations if not _passed(by_check[e.meta[CHECK_META]])]
            detail = {
                # the row positions (COMPLETE) only where a quarantine check needs them; BASIC still gives the
                # counts and up to 20 failing values, and costs about a fifth less per check
                "result_format": "COMPLETE" if any(c.policy == "quarantine" for c in suite.checks) else "BASIC",
                "partial_unexpected_count": MAX_DETAIL_VALUES,
                "return_unexpected_index_query": False,
            }
            for expectation in failed:
                again = batch.validate(expectation, expectation_parameters=parameters or None, result_format=detail)
                by_check[expectation.meta[CHECK_META]] = again
        domains: dict[str, int] = {}  # row condition -> rows it selects (the element count of a passed check)
        outcomes: list[CheckOutcome] = []
        failing_rows: dict[int, list[str]] = {}  # row position -> quarantine checks it failed
        for check in suite.checks:  # in suite order, whatever order GX returns them in
            r = by_check[check.id]
            success = _passed(r)
            error = None
            if (r.exception_info or {}).get("raised_exception"):
                error = str(r.exception_info.get("exception_message") or "the expectation raised")
            info = r.result or {}
            unexpected = int(info.get("unexpected_count") or 0)
            elements = info.get("element_count")
            if elements is None:  # a passed check (no details asked): the rows of its domain, as GX counts them
                condition = check.kwargs.get("row_condition")
                if condition and condition not in domains:
                    domains[condition] = len(frame.query(condition, parser="pandas"))
                elements = domains[condition] if condition else rows.num_rows
            action = action_of(check, success, resumed=resumed)
            if not success and check.policy == "quarantine":
                for position in info.get("unexpected_index_list") or []:
                    failing_rows.setdefault(int(position), []).append(check.id)
            outcomes.append(
                CheckOutcome(
                    check=check,
                    success=success,
                    element_count=int(elements),
                    unexpected_count=unexpected,
                    action=action,
                    failing_values=tuple(plain(v) for v in (info.get("partial_unexpected_list") or [])),
                    error=error,
                )
            )
        return outcomes, failing_rows


def action_of(check: Check, success: bool, *, resumed: bool) -> str:
    """What a check's outcome does: `passed`, or its policy's action (a halt is `overridden` once resumed)."""
    if success:
        return "passed"
    if check.policy == "halt" and resumed:
        return "overridden"
    return {"warn": "warned", "quarantine": "quarantined", "halt": "halted"}[check.policy]


def merged_outcome(check: Check, parts: list[CheckOutcome], *, resumed: bool) -> CheckOutcome:
    """One row-wise check's outcome on a table from its outcomes on consecutive pieces of it, as `validate` would
    give on the whole: it holds where it held on every piece; the counts add up; the failing values are the pieces'
    in order, at most `MAX_DETAIL_VALUES`; the first error is kept. Only for checks that judge each row alone
    (without `mostly`): a uniqueness check, for one, needs the whole column."""
    success = all(p.success for p in parts)
    values = tuple(v for p in parts for v in p.failing_values)[:MAX_DETAIL_VALUES]
    return CheckOutcome(
        check=check,
        success=success,
        element_count=sum(p.element_count for p in parts),
        unexpected_count=sum(p.unexpected_count for p in parts),
        action=action_of(check, success, resumed=resumed),
        failing_values=values,
        error=next((p.error for p in parts if p.error), None),
    )


def row_wise(check: Check) -> bool:
    """Whether `check` judges each row alone, so that its outcome on a table is `merged_outcome` of its outcomes on
    pieces of it: an expectation on each row's values (not an aggregate, not uniqueness or order across rows), with
    no `mostly` (a share of the whole table)."""
    return (
        check.expectation.startswith(ROW_WISE_PREFIXES)
        and check.expectation not in CROSS_ROW
        and "mostly" not in check.kwargs
    )


def _passed(result) -> bool:
    """The check held: Great Expectations says so and its evaluation raised nothing."""
    return bool(result.success) and not (result.exception_info or {}).get("raised_exception")


def _frame(suite: Suite, rows: pa.Table):
    """The pandas frame the checks see: only the columns they name (all of them for table-level expectations
    that look at the whole schema), decimals as float64 (Python Decimal objects make pandas 10x slower; the
    bounds in suites are plain numbers, and a decimal(p,s) with p <= 15 converts exactly enough to compare).
    Dates stay Python dates (pandas timestamps end in 2262; SCD2 versions end in 9999): compare them with
    between bounds, not value sets (a date in a value set cannot be saved in a Great Expectations suite)."""
    names = frame_columns(suite, rows)
    columns = []
    for name in names:
        col = rows.column(name)
        if pa.types.is_decimal(col.type):
            col = col.cast(pa.float64())
        columns.append(col)
    return pa.table(columns, names=names).to_pandas()


def frame_columns(suite: Suite, rows: pa.Table) -> list[str]:
    """The columns of `rows` the checks of `suite` see (`_frame`)."""
    used = {
        c for check in suite.checks for c in check_columns(check.kwargs) + condition_columns(check.kwargs, suite.table)
    }
    whole = any(not check_columns(check.kwargs) for check in suite.checks)
    return rows.column_names if whole or not used else [c for c in rows.column_names if c in used]


def plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


def _split(suite: Suite, rows: pa.Table, batch_id: int, failing: dict[int, list[str]]) -> tuple[pa.Table, pa.Table]:
    if not failing:
        return rows, QUARANTINE.arrow_schema().empty_table()
    positions = sorted(failing)
    bad = rows.take(pa.array(positions, pa.int64()))
    mask = pc.invert(pc.is_in(pa.array(range(rows.num_rows), pa.int64()), value_set=pa.array(positions, pa.int64())))
    records = bad.to_pylist()
    quarantined = pa.Table.from_pylist(
        [
            {
                "batch_id": batch_id,
                "table_name": suite.name,
                "row_key": _json({k: record[k] for k in suite.key}),
                "check_ids": ",".join(failing[p]),
                "row": _json(record),
            }
            for p, record in zip(positions, records, strict=True)
        ],
        schema=QUARANTINE.arrow_schema(),
    )
    return rows.filter(mask), quarantined


# ------------------------------------------------------------------------------------------------ remote
ASK_ATTEMPTS = 3  # a request whose server dies is sent again to a new one this many times in all


class RemoteValidator(Validating):
    """`Validator.check` run by the warm Great Expectations server (`streamdi.gx_remote`), with the same outcomes:
    the server checks the rows against the same suites (its fingerprint covers them), this process splits them. The
    suites are read here without Great Expectations (its registry checks ran in the server, which refuses to start
    on a bad suite). When no server can be reached or started, it validates in this process and says so once."""

    def __init__(self, suites: dict[str, Suite], idle_timeout: float) -> None:
        self.suites = suites
        self.idle_timeout = idle_timeout
        self.fingerprint = gx_remote.fingerprint()
        self._conn = None
        self._local: Validator | None = None
        self._lock = threading.Lock()

    def wait_ready(self) -> None:
        """Connected to a server (started now when none runs), or fallen back to this process."""
        with self._lock:
            self._connected()

    def check(self, suite, rows, batch_id, *, resumed=False, parameters=None):
        request = ("validate", suite.name, tuple(c.id for c in suite.checks), batch_id, resumed, parameters)
        with self._lock:
            answer = self._ask(request, rows.select(frame_columns(suite, rows)))
        if answer is None:  # no server: this process validates
            return self._local.check(suite, rows, batch_id, resumed=resumed, parameters=parameters)
        if answer[0] != "ok":
            raise RuntimeError(f"the Great Expectations server could not validate {suite.name}: {answer[1]}")
        checks = {c.id: c for c in suite.checks}
        outcomes = [
            CheckOutcome(checks[i], success, elements, unexpected, action, tuple(values), error)
            for i, success, elements, unexpected, action, values, error in answer[1]
        ]
        return outcomes, answer[2]

    def _connected(self) -> bool:
        """A connection to the server (False: validating in this process)."""
        if self._local is not None:
            return False
        if self._conn is None:
            try:
                self._conn = gx_remote.connect(self.fingerprint, self.idle_timeout)
            except gx_remote.Unavailable as exc:
                log.warning("validating in this process: %s", exc)
                self._local = local_validator()
                return False
        return True

    def _ask(self, request: tuple, rows: pa.Table | None = None) -> tuple | None:
        for attempt in range(1, ASK_ATTEMPTS + 1):
            if not self._connected():
                return None
            try:
                gx_remote.send(self._conn, request)
                if rows is not None:
                    gx_remote.send_table(self._conn, rows)
                return gx_remote.recv(self._conn)
            except (OSError, EOFError) as exc:  # the server died: again, on a server started again
                self._conn.close()
                self._conn = None
                if attempt == ASK_ATTEMPTS:
                    raise RuntimeError(f"the Great Expectations server failed {attempt} times: {exc}") from exc
                log.warning("the Great Expectations server went away (%s): starting it again", exc)
                time.sleep(0.1 * attempt)  # a killed server's socket may take a moment to refuse connections
        return None


# ------------------------------------------------------------------------------------------------ process
_validator: Validator | RemoteValidator | None = None
_local: Validator | None = None
_building = threading.Lock()
_building_local = threading.Lock()
_warming: threading.Thread | None = None  # the one warm-up thread, once started
_warm_lock = threading.Lock()


def validator() -> Validator | RemoteValidator:
    """The process's validator: on the warm server (`STREAMDI_GX_SERVER`, the default), else in this process."""
    global _validator
    with _building:
        if _validator is None:
            settings = load_settings()
            if settings.gx_server:
                _validator = RemoteValidator(load_suites(registry=False), settings.gx_server_idle_timeout)
            else:
                _validator = local_validator()
        return _validator


def local_validator() -> Validator:
    """The process's own Validator (Great Expectations imported here; suites loaded and checked on first use): the
    server's, a Spark executor's, and a process's whose server is off or unavailable."""
    global _local
    with _building_local:
        if _local is None:
            _local = Validator(load_suites())
        return _local


def warm_up() -> None:
    """Make the process's validator ready in a background thread: connect to the warm server (started now when none
    runs), or, in this process, import Great Expectations (seconds of pure Python). Started when the stage step starts
    (or when `streamdi load` starts delivering a batch), it overlaps the delivery and the parse (and the JVM's start,
    begun in the background by a run that will transform) instead of adding to them. Starts one thread per process
    at most. `validator()` waits for it (a failure surfaces there, raised again by the build)."""
    global _warming
    with _warm_lock:
        if _validator is not None or _warming is not None:
            return
        _warming = threading.Thread(target=_build_quietly, name="gx-warm-up", daemon=True)
    _warming.start()


def _build_quietly() -> None:
    with contextlib.suppress(Exception):  # the caller's own validator() call raises it again, where it is handled
        ready = validator()
        if isinstance(ready, RemoteValidator):
            ready.wait_ready()


def summarize(outcomes: Iterable[CheckOutcome]) -> dict[str, int]:
    """Counts per action, for logs and the CLI."""
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.action] = counts.get(o.action, 0) + 1
    return counts
