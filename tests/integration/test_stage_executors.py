"""A large source parsed, checked and written by Spark's executors (`jobs.stage_executors`) gives exactly what the
driver's parse gives: the same staged rows, rejects (with their line numbers and reasons), quarantined rows, quality
results and per-file counts, for a delimited source and for FINWIRE (three tables from one file), also when a halt
check holds the rows back. Real SparkSession, real Delta tables; the pieces are a few lines each, so every rule is
exercised across piece boundaries."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pytest
from builders import SHARED_SAMPLE, source_line, write_landing_file

from jobs import stage
from schemas import sources as src
from schemas.quality import QUALITY_RESULTS, QUARANTINE
from schemas.staging import FINWIRE_TABLES, REJECTS
from streamdi.batchlog import BatchLog
from streamdi.collector import collect
from streamdi.context import JobContext
from streamdi.lake import SCRATCH_DIR, Lake
from streamdi.settings import Settings

pytestmark = pytest.mark.integration

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def trade(t_id: int, **fields: str) -> str:
    return source_line(src.TRADE, t_id=str(t_id), **fields)


TRADE_LINES = [
    *(trade(i) for i in range(1, 9)),
    trade(9, t_qty="0"),  # quarantined: quantity_is_positive
    "10|wrong width",  # rejected
    trade(11, t_qty="many"),  # rejected: not an integer
    trade(12, t_trade_price="-1.00"),  # warned: trade_price_not_negative
    trade(4),  # t_id 4 again: one_line_per_trade warns on both lines
    *(trade(i) for i in range(13, 30)),
    trade(30, t_st_id="XXXX", t_qty="-3"),  # quarantined by two checks
    *(trade(i) for i in range(31, 40)),
]


def landing(home: Path, settings: Settings) -> None:
    lines = "".join(line + "\r\n" for line in TRADE_LINES).encode()
    lines = lines.replace(b"|Broker Name|", b"|Broker \xff|", 1)  # line 1 is not valid UTF-8
    path = settings.landing_dir / "Batch1" / "Trade.txt"
    path.parent.mkdir(parents=True)
    path.write_bytes(lines + trade(40).encode())  # the last line has no line ending: cut short
    write_landing_file(settings.landing_dir / "Batch1" / "Date.txt", [source_line(src.DATE_FILE)] * 3)
    # an official quarter's CMP and SEC records and its first 30 FIN records, in their order
    official = (SHARED_SAMPLE / "Batch1" / "FINWIRE2000Q1").read_bytes().split(b"\r\n")[:-1]
    fin = [i for i, line in enumerate(official) if line[15:18] == b"FIN"][:30]
    kept = [line for i, line in enumerate(official) if line[15:18] != b"FIN" or i in fin]
    (settings.landing_dir / "Batch1" / "FINWIRE2000Q1").write_bytes(b"".join(line + b"\r\n" for line in kept))
    first = official[0]
    bad = [first, first[:15] + b"XYZ" + first[18:], first[:100], first]  # a FIN record; another type; too short
    (settings.landing_dir / "Batch1" / "FINWIRE1999Q4").write_bytes(b"".join(line + b"\r\n" for line in bad))


def staged(spark, home: Path, on_executors: bool, taxes: list[str] | None = None):
    settings = Settings(
        home=home,
        spark_master="local[2]",
        **({"executor_parse_bytes": 0, "executor_parse_chunk_bytes": 600} if on_executors else {}),
    )
    landing(home, settings)
    if taxes:
        write_landing_file(settings.landing_dir / "Batch1" / "TaxRate.txt", taxes)
    ctx = JobContext(settings=settings, spark=spark, lake=Lake(settings.lake_root, spark))
    batch_log = BatchLog(ctx.lake)
    batch_id = collect(batch_log, settings.landing_dir, now=NOW).batch_id
    report = stage.run(ctx, batch_id, batch_log.files(batch_id))
    tables = {}
    for table in (
        src.TRADE.staging,
        src.DATE_FILE.staging,
        src.TAX_RATE.staging,
        *FINWIRE_TABLES.values(),
        REJECTS,
        QUALITY_RESULTS,
        QUARANTINE,
    ):
        rows = ctx.lake.read_arrow(table) if ctx.lake.exists(table) else pa.table({})
        tables[table.qualified_name] = sorted(rows.to_pylist(), key=json.dumps_key) if rows.num_rows else []
    return report, tables, settings


json.dumps_key = lambda row: json.dumps(row, sort_keys=True, default=str)  # noqa: E731


def file_counts(report) -> list[tuple]:
    return [(f.file, f.source, f.read, f.staged, f.rejected, f.quarantined, f.held) for f in report.files]


def test_the_executors_parse_gives_the_drivers_rows_rejects_checks_and_counts(spark, tmp_path):
    driver, driver_tables, _ = staged(spark, tmp_path / "driver", on_executors=False)
    executors, tables, settings = staged(spark, tmp_path / "executors", on_executors=True)

    assert file_counts(executors) == file_counts(driver)
    # the figures themselves: 41 lines, 4 rejected (UTF-8, width, type, cut short), 2 quarantined
    assert ("Batch1/Trade.txt", "Trade", 41, 35, 4, 2, 0) in file_counts(executors)
    assert tables == driver_tables
    trade_rejects = [r for r in tables["staging.rejects"] if r["source_file"] == "Batch1/Trade.txt"]
    rejects = [(r["line_no"], r["reason"]) for r in sorted(trade_rejects, key=lambda r: r["line_no"])]
    assert [n for n, _ in rejects] == [1, 10, 11, 41]
    assert rejects[0][1].startswith("not valid UTF-8: byte 0xff")
    assert rejects[3][1].startswith("the file ends inside this line")
    assert sorted((r["check_ids"], json.loads(r["row_key"])) for r in tables["quality.quarantine"]) == [
        ("quantity_is_positive", {"line_no": 9, "source_file": "Batch1/Trade.txt"}),
        ("status_is_a_status_code,quantity_is_positive", {"line_no": 31, "source_file": "Batch1/Trade.txt"}),
    ]
    results = {r["check_id"]: r for r in tables["quality.results"]}
    assert (results["one_line_per_trade"]["action"], results["one_line_per_trade"]["unexpected_count"]) == ("warned", 2)
    assert json.loads(results["one_line_per_trade"]["detail"])["failing_values"] == [4, 4]
    assert results["trade_price_not_negative"]["action"] == "warned"
    assert results["quantity_is_positive"]["element_count"] == 37  # every parsed line, before the quarantine
    # FINWIRE: the official file's 48 records and the damaged file's 2 good ones, in their three tables
    assert ("Batch1/FINWIRE2000Q1", "FINWIRE", 48, 48, 0, 0, 0) in file_counts(executors)
    assert ("Batch1/FINWIRE1999Q4", "FINWIRE", 4, 2, 2, 0, 0) in file_counts(executors)
    assert [len(tables[t.qualified_name]) for t in FINWIRE_TABLES.values()] == [7, 11, 32]
    assert sorted(r["line_no"] for r in tables["staging.rejects"] if r["source"] == "FINWIRE") == [2, 3]
    # the pieces were many, and nothing is left in the scratch directories
    trade_dir = settings.lake_root / "staging" / "trade"
    assert len(list(trade_dir.glob("stage-trade-v1-*.snappy.parquet"))) > 3
    assert not (trade_dir / SCRATCH_DIR).exists()


def test_a_halt_check_holds_the_rows_back_on_the_executors_as_in_the_driver(spark, tmp_path):
    taxes = [source_line(src.TAX_RATE, tx_id="US1"), source_line(src.TAX_RATE, tx_id="US2", tx_rate="2.00000")]
    driver, driver_tables, _ = staged(spark, tmp_path / "driver", on_executors=False, taxes=taxes)
    executors, tables, settings = staged(spark, tmp_path / "executors", on_executors=True, taxes=taxes)

    assert executors.halts == driver.halts
    assert [h.split(":")[0] for h in executors.halts] == ["staging.taxrate"]
    assert file_counts(executors) == file_counts(driver)
    assert ("Batch1/TaxRate.txt", "TaxRate", 2, 0, 0, 0, 2) in file_counts(executors)
    assert tables == driver_tables
    assert tables["staging.taxrate"] == []
    assert not (settings.lake_root / "staging" / "taxrate" / SCRATCH_DIR).exists()
    assert not list((settings.lake_root / "staging" / "taxrate").rglob("*.parquet"))


def test_a_landing_file_changed_under_the_executors_is_the_drivers_landing_file_error(spark, tmp_path):
    """The driver planned the pieces of a file, then its bytes changed before an executor read its piece: the stage
    fails with the same error as the driver's parse gives (what changed, and what to do), not a Spark traceback."""
    from dataclasses import replace

    from jobs import stage_executors
    from jobs.landing_chunks import plan_chunks
    from streamdi.errors import LandingFileError

    settings = Settings(home=tmp_path, spark_master="local[2]", executor_parse_bytes=0)
    landing(tmp_path, settings)
    ctx = JobContext(settings=settings, spark=spark, lake=Lake(settings.lake_root, spark))
    batch_log = BatchLog(ctx.lake)
    files = batch_log.files(collect(batch_log, settings.landing_dir, now=NOW).batch_id)
    trade_file = next(f for f in files if f.file.endswith("Trade.txt"))
    chunks = plan_chunks(settings.landing_dir, 1, [trade_file], 10_000)
    stale = [replace(chunks[0], crc32=chunks[0].crc32 ^ 1)]  # as if other bytes were there when the task read
    job = stage_executors._TaskJob(str(settings.landing_dir), 1, lambda *a: ({}, None), (), False)
    with pytest.raises(LandingFileError, match="Batch1/Trade.txt of micro-batch 1 changed after it was collected"):
        stage_executors._run_tasks(ctx, [stale], job)
