"""A deliberately bad batch from the generator's fault options: generated Batch2 dripped with damaged lines and
duplicated pieces (`streamdi generate drip --malformed --duplicates`), all landed in one micro-batch, staged.

Expected figures come from the drip manifest (which lines were damaged, which pieces were sent twice) and from
counting the landed files' lines, never from the code under test: every damaged line is rejected with its line
number, every piece sent twice is named as a duplicate and not staged (so no change is repeated), and for every other
landed file the lines read = rows staged + rejected + quarantined (nothing silently lost)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from jobs.landing import source_for_file
from schemas.quality import QUALITY_RESULTS, QUARANTINE
from schemas.staging import REJECTS
from streamdi.batchlog import BatchLog
from streamdi.batchlog import wall_clock as _now
from streamdi.collector import collect
from streamdi.context import JobContext
from streamdi.generator import Params, generate
from streamdi.generator.drip import DripOptions, drip
from streamdi.lake import Lake
from streamdi.run.pipeline import stage_job
from streamdi.settings import Settings

pytestmark = pytest.mark.integration

CDC_TABLES = {"Trade.txt": "staging.trade_cdc", "Customer.txt": "staging.customer", "Account.txt": "staging.account"}


@pytest.fixture(scope="module")
def staged(spark, tmp_path_factory):
    data = tmp_path_factory.mktemp("faulty-data")
    generate(Params(scale_factor=0.02, batches=2), data)
    home = tmp_path_factory.mktemp("faulty-home")
    settings = Settings(home=home, spark_master="local[2]")
    ctx = JobContext(settings=settings, spark=spark, lake=Lake(settings.lake_root, spark))
    options = DripOptions(parts=4, duplicates=0.4, malformed=0.4, seed=11)
    deliveries = drip(data / "Batch2", settings.landing_dir, options)
    assert collect(BatchLog(ctx.lake), settings.landing_dir, now=_now()).batch_id == 1  # one micro-batch
    detail = stage_job(ctx, 1)
    return ctx, deliveries, detail


def landed_lines(path: Path) -> int:
    return len([line for line in path.read_bytes().split(b"\n") if line.strip(b"\r")])


def test_the_fault_options_really_made_a_bad_batch(staged):
    _, deliveries, detail = staged
    assert sum(len(d.malformed) for d in deliveries) >= 5
    assert sum(d.kind == "duplicate" for d in deliveries if d.source_file in CDC_TABLES) >= 2
    assert "halted" not in detail


def test_every_damaged_line_is_rejected_with_its_file_and_line_number(staged):
    ctx, deliveries, _ = staged
    # a duplicated piece is not staged (its copy repeats it byte for byte): its damaged lines are rejected once
    damaged = sorted((d.file, m["line"]) for d in deliveries if d.kind != "duplicate" for m in d.malformed)
    rejects = ctx.lake.read_arrow(REJECTS).to_pylist()
    assert sorted((r["source_file"], r["line_no"]) for r in rejects) == damaged
    assert all(r["reason"] for r in rejects)


def test_duplicated_pieces_are_named_and_not_staged_so_no_change_is_repeated(staged):
    """Each piece delivered twice is named in the stage's detail with the piece it repeats (the manifest says which
    were sent twice); nothing of it is staged, so the one_line_per_change checks find no repeated change."""
    ctx, deliveries, detail = staged
    expected = {
        d.file: d.file.replace("_dup", "")
        for d in deliveries
        if d.kind == "duplicate" and source_for_file(d.file, 2) is not None
    }
    assert detail["duplicates"] == expected
    results = [r for r in ctx.lake.read_arrow(QUALITY_RESULTS).to_pylist() if r["check_id"] == "one_line_per_change"]
    assert {r["table_name"] for r in results} >= set(CDC_TABLES.values())
    assert all(r["unexpected_count"] == 0 and r["action"] == "passed" for r in results)


def test_every_landed_line_is_staged_rejected_or_quarantined(staged):
    ctx, deliveries, detail = staged
    landing = ctx.settings.landing_dir
    rejected = Counter(r["source_file"] for r in ctx.lake.read_arrow(REJECTS).to_pylist())
    held_out = ctx.lake.read_arrow(QUARANTINE).to_pylist() if ctx.lake.exists(QUARANTINE) else []
    quarantined = Counter(json.loads(r["row_key"])["source_file"] for r in held_out)
    checked = 0
    for d in deliveries:
        source = source_for_file(d.file, 2)
        if source is None:
            continue  # no declared source (reported as not staged)
        rows = ctx.lake.read_arrow(source.staging)
        staged_rows = sum(1 for f in rows["source_file"].to_pylist() if f == d.file)
        lines = landed_lines(landing / d.file)
        assert lines == d.lines
        if d.kind == "duplicate":  # named in the detail instead (the test above)
            assert staged_rows + rejected[d.file] + quarantined[d.file] == 0 and d.file in detail["duplicates"]
            continue
        assert staged_rows + rejected[d.file] + quarantined[d.file] == lines, d.file
        checked += 1
    assert checked >= 20
    assert detail["read"] == detail["staged"] + detail["rejected"] + detail["quarantined"] + detail["held"]
