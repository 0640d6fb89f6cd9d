"""The whole data set in one call: `generate(params, out_dir)` writes every batch's files and audit files in the
order of `STEPS` (see the package docstring)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from streamdi.generator import customers, finwire, market, reference
from streamdi.generator.output import AuditRow, Output, WrittenFile
from streamdi.generator.params import DATE_BEGIN, Params

# Steps in the order they run, for progress reporting (name, share of the work).
STEPS = ("reference", "finwire", "customers", "market")


def generate(
    params: Params,
    out_dir: Path,
    on_file: Callable[[WrittenFile], None] | None = None,
    on_step: Callable[[str], None] | None = None,
) -> Output:
    """Write the whole data set under `out_dir`; return the record of every file written."""
    out = Output(Path(out_dir), on_file)
    step = on_step or (lambda _name: None)

    step("reference")
    for batch in range(1, params.batches + 1):
        out.write_lines(f"Batch{batch}/BatchDate.txt", [params.batch_date(batch).isoformat()])
    reference.write_static(out, "Batch1")
    reference.write_calendar(out, "Batch1")
    hr = reference.generate_hr(params)
    reference.write_hr(out, params, hr, "Batch1")

    step("finwire")
    fw = finwire.generate(params, out, "Batch1")

    step("customers")
    brokers = hr["id"][hr["job"] == reference.BROKER_JOB_CODE]
    people = customers.generate(params, out, brokers)
    customers.write_prospects(params, out, people)

    step("market")
    market.generate(params, out, fw, people)

    for batch in range(1, params.batches + 1):
        first = DATE_BEGIN if batch == 1 else params.batch_date(batch)
        out.write_audit(
            f"Batch{batch}_audit.csv",
            [
                AuditRow("Batch", batch, "FirstDay", date=first),
                AuditRow("Batch", batch, "LastDay", date=params.batch_date(batch)),
            ],
        )
    out.write_audit(
        "Generator_audit.csv",
        [
            AuditRow("Generator", 1, "SF", dvalue=repr(float(params.scale_factor * 1000))),
            AuditRow("Generator", 1, "Seed", dvalue=str(params.seed)),
            AuditRow("Generator", 1, "FIRST_BATCH_DATE_START", date=params.batch_date(1)),
            AuditRow("Generator", 1, "NUMBER_OF_INCREMENTAL_BATCHES", dvalue=repr(float(params.batches - 1))),
        ],
    )
    return out
