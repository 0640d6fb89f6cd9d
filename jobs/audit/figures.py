"""The audit's expected values: the figures the TPC-DI generator writes next to the data (`*_audit.csv`).

The first input of the audit (`jobs.audit`): `read_figures(data_dir)` reads them from a data set directory
(`DIR/*_audit.csv` and `DIR/BatchK/*_audit.csv`), `staged_figures(ctx)` from `staging.audit_figures` (what the stage
job staged from the landing zone). `Figures` looks them up by data set, attribute and batch, and sums them into the
expected value of a check (`Figures.expected`, a formula of `Term`s).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from jobs import audit_figures
from schemas.audit import AUDIT_FIGURES, FIGURE_FIELDS, NOT_COUNTED
from streamdi.context import JobContext

AUDIT_FILE_GLOB = "*_audit.csv"


@dataclass(frozen=True)
class Figure:
    """One line of an audit file: a count (`value`, -1 when not counted), a day (`date`) or a parameter
    (`dvalue`) of a data set in a TPC-DI batch."""

    dataset: str
    batch: int
    attribute: str
    value: int | None = None
    date: dt.date | None = None
    dvalue: float | None = None


def parse_figures(text: str, source: str) -> list[Figure]:
    """The figures of one audit file's text (header `DataSet, BatchID, Date, Attribute, Value, DValue`, names
    compared without spaces and case; fields trimmed, empty = NULL; blank lines skipped), typed as staging types
    them (`jobs.audit_figures.type_lines`). Raises ValueError naming `source` and the line of anything that does
    not parse: a bad figure must not pass silently."""
    header, numbered = audit_figures.split_text(text)
    if header is None:
        return []
    if not audit_figures.is_header(header):
        raise ValueError(f"{source}: not an audit file, its header is {header!r}")
    typed = audit_figures.type_lines(numbered)
    texts = {name: values.to_pylist() for name, values in typed.texts.items()}
    values = {name: values.to_pylist() for name, values in typed.values.items()}
    bad = {name: flags.to_pylist() for name, flags in typed.bad.items()}
    figures = []
    for i, (number, line) in enumerate(numbered):
        problem = None
        if not typed.right_width(i):
            problem = f"expected {len(FIGURE_FIELDS)} fields, found {typed.width[i]}"
        elif bad["dataset"][i] or bad["attribute"][i]:
            problem = "DataSet and Attribute must not be empty"
        else:
            wrong = next((name for name in ("batchid", "value", "date", "dvalue") if bad[name][i]), None)
            if wrong is not None:
                what = "a date" if wrong == "date" else "a number"
                problem = f"{audit_figures.LABELS[wrong]} {texts[wrong][i]!r} is not {what}"
        if problem is not None:
            raise ValueError(f"{source}:{number}: {problem} in {line!r}")
        figures.append(
            Figure(
                dataset=values["dataset"][i],
                batch=values["batchid"][i],
                attribute=values["attribute"][i],
                value=values["value"][i],
                date=values["date"][i],
                dvalue=values["dvalue"][i],
            )
        )
    return figures


def read_figures(data_dir: Path) -> Figures:
    """Every figure of a data set directory: `DIR/*_audit.csv` (BatchK_audit.csv, Generator_audit.csv) and
    `DIR/BatchK/*_audit.csv`."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"{data_dir} is not a directory")
    files = sorted([*data_dir.glob(AUDIT_FILE_GLOB), *data_dir.glob(f"Batch*/{AUDIT_FILE_GLOB}")])
    figures = [f for path in files if path.is_file() for f in parse_figures(path.read_text("utf-8"), str(path))]
    return Figures(figures, f"in {data_dir}")


def staged_figures(ctx: JobContext) -> Figures:
    """The figures staged from the landing zone (`staging.audit_figures`). A file delivered again (same TPC-DI
    batch and file name, e.g. under another folder) counts once: the delivery staged last (highest micro-batch,
    then greatest landing path) wins."""
    where = "staged (staging.audit_figures)"
    if not ctx.lake.exists(AUDIT_FIGURES):
        return Figures([], where)
    rows = ctx.lake.read_arrow(AUDIT_FIGURES).to_pylist()
    latest: dict[tuple[int, str], tuple[int, str]] = {}
    for r in rows:
        ident = (r["source_batch"], PurePosixPath(r["source_file"]).name)
        latest[ident] = max(latest.get(ident, (r["batch_id"], r["source_file"])), (r["batch_id"], r["source_file"]))
    figures = [
        Figure(r["dataset"], r["batchid"], r["attribute"], r["value"], r["date"], r["dvalue"])
        for r in rows
        if latest[(r["source_batch"], PurePosixPath(r["source_file"]).name)] == (r["batch_id"], r["source_file"])
    ]
    return Figures(figures, where)


@dataclass(frozen=True)
class Term:
    """One figure in a formula: `sign` * Value of (`dataset`, `attribute`)."""

    sign: int
    dataset: str
    attribute: str


@dataclass(frozen=True)
class Expected:
    """The value of a formula of figures over some batches, and what went into it."""

    value: int | None  # None when a figure is absent
    formula: str
    missing: tuple[str, ...] = ()
    not_counted: tuple[str, ...] = ()
    counted: int = 0  # figures that went into `value`

    def note(self) -> str:
        if not self.not_counted:
            return ""
        return f"; {', '.join(self.not_counted)} not counted by the generator (-1), left out"


class Figures:
    """The audit figures, looked up by data set, attribute and batch. `where` says where they were read."""

    def __init__(self, figures: Iterable[Figure], where: str) -> None:
        self.figures = list(figures)
        self.where = where

    def __bool__(self) -> bool:
        return bool(self.figures)

    @property
    def batches(self) -> tuple[int, ...]:
        """Every BatchID of the figures (the script's `Audit` table: all data sets)."""
        return tuple(sorted({f.batch for f in self.figures}))

    @property
    def datasets(self) -> set[str]:
        return {f.dataset for f in self.figures}

    def value(self, dataset: str, attribute: str, batch: int) -> int | None:
        """The figure summed over its files (FINWIRE has one per quarter); -1 if any file says -1; None if absent."""
        values = [
            f.value
            for f in self.figures
            if f.dataset == dataset and f.attribute == attribute and f.batch == batch and f.value is not None
        ]
        if not values:
            return None
        return NOT_COUNTED if NOT_COUNTED in values else sum(values)

    def day(self, attribute: str, batch: int) -> dt.date | None:
        days = [f.date for f in self.figures if f.dataset == "Batch" and f.attribute == attribute and f.batch == batch]
        return days[0] if days else None

    def window(self, batch: int) -> tuple[dt.date, dt.date] | None:
        """(FirstDay, LastDay) of a batch, None unless both figures are there."""
        first, last = self.day("FirstDay", batch), self.day("LastDay", batch)
        return (first, last) if first is not None and last is not None else None

    @property
    def scale_factor(self) -> float | None:
        """The Generator's SF figure divided by 1000 (the generator writes 1000 x the scale factor)."""
        sf = [f.dvalue for f in self.figures if f.dataset == "Generator" and f.attribute == "SF" and f.dvalue]
        return sf[0] / 1000 if sf else None

    def expected(self, terms: Sequence[Term], batches: Sequence[int]) -> Expected:
        """A sum of figures over `batches` (as the script's `sum(Value) ... BatchID <= b`: a figure of one batch
        only adds nothing in the others). A term is missing when no batch of `batches` has it."""
        formula = " ".join(f"{'-' if t.sign < 0 else '+'} {t.attribute}" for t in terms).removeprefix("+ ")
        span = _span(batches)
        total, counted, missing, not_counted = 0, 0, [], []
        for t in terms:
            found = {b: v for b in batches if (v := self.value(t.dataset, t.attribute, b)) is not None}
            if not found:
                missing.append(f"{t.dataset} {t.attribute}" + (f" ({span})" if batches else ""))
            for b, v in found.items():
                if v == NOT_COUNTED:
                    not_counted.append(f"{t.attribute} of batch {b}")
                else:
                    total += t.sign * v
                    counted += 1
        return Expected(None if missing else total, f"{formula} of {span}", tuple(missing), tuple(not_counted), counted)


def _span(batches: Sequence[int]) -> str:
    """`batch 2`, `batches 1-3` or `batches [1, 3]`."""
    if not batches:
        return "no batch"
    if len(batches) == 1:
        return f"batch {batches[0]}"
    if list(batches) == list(range(batches[0], batches[-1] + 1)):
        return f"batches {batches[0]}-{batches[-1]}"
    return f"batches {list(batches)}"
