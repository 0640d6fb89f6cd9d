"""Checking arriving data against its ordering contract (`schemas.ordering`): parts and their predecessors, and the
declared order of a totally ordered source across its parts.

Pure functions on file names and Arrow tables, plus `check_staged`, which the stage calls for each staging table
of a micro-batch and which reads the neighbouring parts' keys already staged. Its outcomes are data-quality
outcomes like a suite's (`streamdi.quality.CheckOutcome`), so they land in `quality.results`, the quality report
and DImessages (`Quality` rows) like any failed check, and a `halt` keeps the table's rows out of staging until an
operator resumes the batch (then it only warns).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from schemas.model import Table
from schemas.ordering import Ordering
from schemas.quality import QUARANTINE
from streamdi.parts import Part, missing_predecessors, part_of
from streamdi.quality import CheckOutcome, Validated
from streamdi.suites import Check, Suite

__all__ = ["Part", "check_staged", "missing_predecessors", "order_violations", "part_of"]

CONTRACTS_FILE = Path(__file__).resolve().parents[1] / "schemas" / "ordering.py"
MAX_SHOWN = 20  # failing values kept per check


@dataclass(frozen=True)
class Violation:
    """Two records out of the declared order: `file` line `line_no` comes after `after_file` line `after_line` in
    part order, yet its key is not above that one's (the highest key before it)."""

    file: str
    line_no: int
    key: int
    after_file: str
    after_line: int
    after_key: int

    def describe(self) -> str:
        return (
            f"{self.file} line {self.line_no}: {self.key} is not above {self.after_key} "
            f"({self.after_file} line {self.after_line})"
        )


def order_violations(rows: pa.Table, key: str, earlier: pa.Table | None = None) -> list[Violation]:
    """Records that break a total order, for `rows` (source_file, line_no, `key`): in each group of parts (the whole
    file, or the parts of one source, TPC-DI batch and channel) sorted by part number and line, each key must be
    above every key before it. `earlier` holds the same columns for the groups' parts staged before; a violation is
    reported when one of its two records is in `rows` (pairs of earlier records were checked when they came)."""
    columns = ["source_file", "line_no", key]
    tables = [rows.select(columns).append_column("new", pa.array([True] * rows.num_rows))]
    if earlier is not None and earlier.num_rows:
        tables.append(earlier.select(columns).append_column("new", pa.array([False] * earlier.num_rows)))
    data: dict[str, list] = {name: [] for name in (*columns, "new")}
    for table in tables:
        for name, values in table.to_pydict().items():
            data[name].extend(values)
    groups: dict[tuple, list[tuple]] = {}
    for file, line, value, new in zip(data["source_file"], data["line_no"], data[key], data["new"], strict=True):
        part = part_of(file)
        group, number = (part.group, part.number) if part is not None else (("", file, 0), 0)
        groups.setdefault(group, []).append((number, file, line, value, new))
    violations = []
    for records in groups.values():
        records.sort(key=lambda r: (r[0], r[1], r[2]))
        top = None  # (key, file, line, new) of the highest key so far
        for _, file, line, value, new in records:
            if top is not None and value <= top[0]:
                if new or top[3]:
                    violations.append(Violation(file, line, value, top[1], top[2], top[0]))
                continue
            top = (value, file, line, new)
    return sorted(violations, key=lambda v: (v.file, v.line_no))


ORDER_CHECK = "declared_order"
PREDECESSOR_CHECK = "predecessor_present"


def check_staged(
    table: Table,
    rows: pa.Table,
    contract: Ordering,
    earlier: pa.Table | None,
    missing: dict[str, str],
    *,
    missing_policy: str,
    resumed: bool,
    files: set[str] | None = None,
) -> Validated:
    """The contract's checks on a staging table's rows of one micro-batch: `declared_order` (a total order; policy
    halt) and, when the rows come from parts, `predecessor_present` (parts whose predecessor has not arrived,
    `missing`, limited to this table's files; policy `missing_policy`). `earlier`: the rows of the same parts'
    groups staged before; `files`: the files with rows in `rows`, when the caller knows them (a bag's rows written
    elsewhere: `rows` may then be empty). A bag whose files are whole has nothing to check (no outcome)."""
    checks: list[CheckOutcome] = []
    if files is None:
        files = set(pc.unique(rows["source_file"]).to_pylist()) if rows.num_rows else set()
    if contract.kind == "total":
        found = order_violations(rows, contract.key, earlier)
        check = Check(
            ORDER_CHECK,
            "streamdi_ordering_contract",
            {"column": contract.key, "order": "increasing within the TPC-DI batch, across parts in part order"},
            "halt",
            contract.doc,
        )
        checks.append(_outcome(check, rows.num_rows, [v.describe() for v in found], resumed))
    gaps = {f: before for f, before in missing.items() if f in files}
    if any(part_of(f) is not None for f in files):
        check = Check(
            PREDECESSOR_CHECK,
            "streamdi_parts_in_order",
            {"column": "source_file", "needs": "the part before each part (same source, TPC-DI batch and channel)"},
            missing_policy,
            "a part staged before its predecessor arrived (STREAMDI_MISSING_PART_POLICY)",
        )
        checks.append(_outcome(check, len(files), [f"{f} (missing {b})" for f, b in sorted(gaps.items())], resumed))
    suite = Suite(table, tuple(o.check for o in checks), ("source_file", "line_no"), CONTRACTS_FILE)
    return Validated(suite, rows, QUARANTINE.arrow_schema().empty_table(), checks)


def _outcome(check: Check, elements: int, failing: list[str], resumed: bool) -> CheckOutcome:
    action = "passed"
    if failing:
        action = {"warn": "warned", "halt": "halted"}[check.policy]
        if action == "halted" and resumed:
            action = "overridden"
    return CheckOutcome(
        check=check,
        success=not failing,
        element_count=elements,
        unexpected_count=len(failing),
        action=action,
        failing_values=tuple(failing[:MAX_SHOWN]),
    )
