"""What the quality report shows, read into plain dataclasses: the first half of `streamdi.report`.

Where it sits: validation runs in the batch dataflow and records one row per (micro-batch, attempt, table, check) in
the Delta table `quality.results` (`streamdi.quality`). At report time, `gather` reads those rows, the quarantined
rows (`quality.quarantine`, two columns) and the batch log (`streamdi.batchlog.BatchLog`: stage states, halts, skip
reasons, resumes, arrival and done times) into a `QualityData`. Everything after it (`streamdi.report.figures`,
`.render`, `.data_docs`) works on those dataclasses without touching the lake, so tests build them by hand.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass, field

from schemas.quality import QUALITY_RESULTS, QUARANTINE
from streamdi.batchlog import STAGES, BatchLog
from streamdi.lake import Lake

log = logging.getLogger(__name__)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class CheckResult:
    """One row of `quality.results`, with its `detail` JSON unpacked."""

    batch_id: int
    attempt: int
    table_name: str
    check_id: str
    expectation: str
    column_name: str | None
    policy: str
    action: str
    success: bool
    element_count: int
    unexpected_count: int
    kwargs: dict = field(default_factory=dict, hash=False, compare=False)
    failing_values: tuple = ()
    error: str | None = None

    @classmethod
    def from_row(cls, row: dict) -> CheckResult:
        detail = json.loads(row.get("detail") or "{}")
        return cls(
            batch_id=int(row["batch_id"]),
            attempt=int(row["attempt"]),
            table_name=row["table_name"],
            check_id=row["check_id"],
            expectation=row["expectation"],
            column_name=row.get("column_name"),
            policy=row["policy"],
            action=row["action"],
            success=bool(row["success"]),
            element_count=int(row["element_count"] or 0),
            unexpected_count=int(row["unexpected_count"] or 0),
            kwargs=dict(detail.get("kwargs") or {}),
            failing_values=tuple(detail.get("failing_values") or ()),
            error=detail.get("error"),
        )

    @property
    def failed(self) -> bool:
        return self.action != "passed"

    @property
    def columns(self) -> str:
        """The column(s) the check is about, for display (`column`, or both columns of a pair expectation)."""
        if self.column_name:
            return self.column_name
        names = [str(self.kwargs[a]) for a in ("column_A", "column_B") if a in self.kwargs]
        names += [str(c) for c in self.kwargs.get("column_list") or ()]
        return ", ".join(names)


@dataclass(frozen=True)
class BatchState:
    """What the batch log knows about one micro-batch."""

    batch_id: int
    tpcdi_batches: tuple[int, ...] = ()
    arrived_at: dt.datetime | None = None
    stages: tuple[tuple[str, str], ...] = ()  # (stage, state) in stage order
    halted_stage: str | None = None
    halt_reason: str = ""
    halted_at: dt.datetime | None = None
    skip_reason: str | None = None
    resumed: bool = False
    done_at: tuple[tuple[str, dt.datetime | None], ...] = ()  # (stage, when it was marked done) in stage order

    def after_arrival(self, stage: str) -> float | None:
        """Seconds from the arrival of the micro-batch's newest file until `stage` was done (None if it is not)."""
        at = dict(self.done_at).get(stage)
        if at is None or self.arrived_at is None:
            return None
        return (at - self.arrived_at).total_seconds()

    @property
    def state(self) -> str:
        """halted, skipped, done, pending, or in progress; a resumed batch that went on says so."""
        if self.halted_stage:
            return "halted"
        states = [s for _, s in self.stages]
        if "skipped" in states:
            return "skipped"
        if states and all(s == "done" for s in states):
            return "resumed, done" if self.resumed else "done"
        if not any(s in ("done", "resumed") for s in states):
            return "pending"
        return "resumed, in progress" if self.resumed else "in progress"

    @property
    def run_time(self) -> dt.datetime:
        """The time GX shows as a validation's Run Time: the micro-batch's arrival (its newest file). The results
        table records no validation time; the arrival is fixed, so page names stay the same from run to run."""
        if self.arrived_at is None:
            return _EPOCH + dt.timedelta(seconds=self.batch_id)
        at = self.arrived_at
        return at.replace(tzinfo=dt.UTC) if at.tzinfo is None else at.astimezone(dt.UTC)


@dataclass(frozen=True)
class QualityData:
    """Everything the report shows, read once (`gather`); hand-made in tests."""

    results: tuple[CheckResult, ...]
    batches: tuple[BatchState, ...] = ()
    quarantined: tuple[tuple[str, int, int], ...] = ()  # (table, micro-batch, rows in quality.quarantine)
    why: dict[tuple[str, str], str] = field(default_factory=dict)  # (table, check id) -> the suite's `why`
    lake_root: str = ""

    def batch(self, batch_id: int) -> BatchState:
        return next((b for b in self.batches if b.batch_id == batch_id), BatchState(batch_id))


def gather(lake: Lake) -> QualityData:
    """Read `quality.results`, `quality.quarantine` (two columns) and the batch log. No Spark: delta-rs only."""
    results: list[CheckResult] = []
    if lake.exists(QUALITY_RESULTS):
        results = [CheckResult.from_row(r) for r in lake.read_arrow(QUALITY_RESULTS).to_pylist()]
    counts: dict[tuple[str, int], int] = {}
    if lake.exists(QUARANTINE):
        for r in lake.read_columns(QUARANTINE, ["table_name", "batch_id"]).to_pylist():
            key = (r["table_name"], int(r["batch_id"]))
            counts[key] = counts.get(key, 0) + 1
    batch_log = BatchLog(lake)
    halts = {h.batch_id: h for h in batch_log.halted()}
    skip_reasons = batch_log.skip_reasons()
    resumed = batch_log.resumed_batches()
    batches = []
    for s in batch_log.summary():
        b = s["batch_id"]
        halt = halts.get(b)
        batches.append(
            BatchState(
                batch_id=b,
                tpcdi_batches=tuple(s["source_batches"]),
                arrived_at=s["arrived_at"],
                stages=tuple((stage, s[stage]) for stage in STAGES),
                halted_stage=halt.stage if halt else None,
                halt_reason=halt.reason if halt else "",
                halted_at=halt.at if halt else None,
                skip_reason=skip_reasons.get(b),
                resumed=b in resumed,
                done_at=tuple((stage, s[f"{stage}_at"]) for stage in STAGES),
            )
        )
    return QualityData(
        results=tuple(sorted(results, key=lambda r: (r.batch_id, r.attempt, r.table_name, r.check_id))),
        batches=tuple(batches),
        quarantined=tuple((t, b, n) for (t, b), n in sorted(counts.items())),
        why=_suite_reasons(),
        lake_root=str(lake.root),
    )


def _suite_reasons() -> dict[tuple[str, str], str]:
    """The `why` of every check in `expectations/` (results do not store it). A suite that does not load (someone
    is editing it) costs the report its reasons, not the report itself."""
    from streamdi.suites import SuiteError, load_suites

    try:
        suites = load_suites()
    except (SuiteError, OSError) as exc:
        log.warning("quality report without the checks' reasons: %s", exc)
        return {}
    return {(name, c.id): c.why for name, suite in suites.items() for c in suite.checks if c.why}
